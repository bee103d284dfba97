"""Spec-Bench (Xia et al., 2024): 480 questions in 13 categories, the eight MT-Bench ones grouped.

Default file: the copy in ``workloads/data/spec_bench/question.jsonl`` (Apache-2.0, LICENSE beside
it). The first turn is the prompt by default; the output length is fixed (256 by default).
"""

from __future__ import annotations

import json
from pathlib import Path

from .base import LoadReport, Workload
from .request import Request
from .tokens import token_counter

DEFAULT_PATH = Path(__file__).with_name("data") / "spec_bench" / "question.jsonl"
MT_BENCH = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
GROUPS = {"mt_bench": MT_BENCH}


def group_of(category: str) -> str:
    return "mt_bench" if category in MT_BENCH else category


def read_questions(path: Path = DEFAULT_PATH) -> list[tuple[object, str, list[str]]]:
    """(question_id, category, turns) of every question in a Spec-Bench ``question.jsonl``, in file order."""
    if not path.is_file():
        raise FileNotFoundError(f"workload.path={path}: no such file; Spec-Bench's question.jsonl is "
                                f"bundled at {DEFAULT_PATH}")
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                rows.append((row["question_id"], row["category"], row["turns"]))
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise ValueError(f"{path}:{n}: not a Spec-Bench question ({type(e).__name__}: {e}); "
                                 'expected {"question_id", "category", "turns": [...]}') from None
    return rows


class SpecBench(Workload):
    name = "spec_bench"

    def load(self):
        path = Path(self.cfg["path"]) if self.cfg.get("path") else DEFAULT_PATH
        rows = read_questions(path)
        known = sorted({c for _, c, _ in rows} | set(GROUPS))
        wanted = self.cfg.get("categories") or self.cfg.get("category")
        if isinstance(wanted, str):
            wanted = [wanted]
        if wanted:
            bad = [c for c in wanted if c not in known]
            if bad:
                raise ValueError(f"workload.categories={bad}: unknown; choose from {', '.join(known)}")
            rows = [r for r in rows if r[1] in wanted or group_of(r[1]) in wanted]
        turn = int(self.cfg.get("turn", 0))
        picked = [(qid, cat, turns[turn]) for qid, cat, turns in rows if turn < len(turns)]
        counter = token_counter(self.cfg.get("tokenizer"))
        lens = counter.count([p for _, _, p in picked])
        out = int(self.cfg.get("output_len", 256))
        reqs = [Request(prompt_len=max(n, 1), output_len=out, prompt=p, category=group_of(cat),
                        source_id=str(qid)) for (qid, cat, p), n in zip(picked, lens, strict=True)]
        report = LoadReport(source=str(path), tokenizer=counter.name)
        report.counts["questions"] = len(rows)
        if len(picked) < len(rows):
            report.counts[f"dropped: no turn {turn}"] = len(rows) - len(picked)
        return reqs, report, None
