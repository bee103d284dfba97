"""Requests as bare lengths from a JSONL file: the exact requests of another workload, portable.

``python -m harness workloads export workload=sharegpt out=FILE`` writes one line per request
(``prompt_len``, ``output_len``, ``category``, ``source_id``) in the exported workload's own
order (filtered and shuffled), so a machine without the dataset, its tokenizer or network (the
GPU host) replays the very same requests: keep ``shuffle: false`` and no filters. Dataset
sources (ShareGPT, Spec-Bench, BurstGPT) replay exactly for any request count; a synthetic
shape draws its pool from ``num_requests``, so export it with the count the points use.
"""

from __future__ import annotations

import json
from pathlib import Path

from .base import LoadReport, Workload
from .request import Request


class Lengths(Workload):
    name = "lengths"

    def load(self):
        path = self.cfg.get("path")
        if not path:
            raise ValueError("workload.path: the lengths source needs a JSONL file; write one with "
                             "`python -m harness workloads export workload=<name> out=FILE`")
        path = Path(path).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"workload.path={path}: no such file; write it with "
                                    "`python -m harness workloads export workload=<name> out=FILE`")
        reqs, meta = [], {}
        for i, line in enumerate(path.read_text().splitlines()):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                if "exported_from" in row:
                    meta = row
                    continue
                reqs.append(Request(prompt_len=int(row["prompt_len"]), output_len=int(row["output_len"]),
                                    category=str(row.get("category", "")), source_id=str(row.get("source_id", i))))
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"workload.path={path}, line {i + 1}: {e}; each line needs prompt_len and "
                                 "output_len (whole numbers >= 1)") from None
        notes = [f"exported from {meta['exported_from']} ({meta.get('tokenizer') or 'lengths from the source'})"] \
            if meta else []
        report = LoadReport(source=f"lengths:{path.name}", tokenizer=meta.get("tokenizer"),
                            counts={"lines": len(reqs)}, notes=notes)
        return reqs, report, None
