"""BurstGPT (Wang et al., 2024): a two-month trace of Azure OpenAI GPT-3.5/GPT-4 requests.

Read by column name, in both layouts the trace ships: 6 columns (Timestamp, Model, Request
tokens, Response tokens, Total tokens, Log Type) and 8 (plus Session ID, Elapsed time). Filters:
model (vLLM's loader keeps GPT-4), log type, and failed requests (Response tokens = 0).
Arrivals: the trace's own timestamps (``arrival.kind=trace``, optionally rescaled to a rate) or
a Poisson process at a rate, which is how the TreeWY paper swept it. No copy can be downloaded
here: set ``workload.path`` to ``BurstGPT_1.csv`` (or ``BurstGPT_without_fails_*.csv``) from
https://github.com/HPMLL/BurstGPT.
"""

from __future__ import annotations

import csv
import io
import math
import os
from pathlib import Path

from .base import LoadReport, Workload, read_text
from .request import Request

REQUIRED = {"timestamp": "Timestamp", "model": "Model", "request tokens": "Request tokens",
            "response tokens": "Response tokens", "log type": "Log Type"}
OPTIONAL = {"total tokens": "Total tokens", "session id": "Session ID", "elapsed time": "Elapsed time"}
ENV_PATH = "COMMITBENCH_BURSTGPT"


def _norm(name: str) -> str:
    return " ".join(name.replace("_", " ").replace("ID", " id").split()).lower().replace("sessionid", "session id")


def where_to_put_it() -> str:
    return ("workload=burstgpt needs the BurstGPT trace, which can't be downloaded from here: get BurstGPT_1.csv "
            "(or BurstGPT_without_fails_1.csv) from https://github.com/HPMLL/BurstGPT/releases and set "
            f"workload.path=/path/to/BurstGPT_1.csv (or the {ENV_PATH} environment variable)")


class BurstGPT(Workload):
    name = "burstgpt"

    def load(self):
        raw = self.cfg.get("path") or os.environ.get(ENV_PATH)
        if not raw:
            raise FileNotFoundError(where_to_put_it())
        path = Path(raw)
        if not path.is_file():
            raise FileNotFoundError(f"workload.path={path}: no such file. " + where_to_put_it())
        model, log_type = self.cfg.get("model"), self.cfg.get("log_type")
        drop_failed = bool(self.cfg.get("drop_failed", True))
        reqs, times = [], []
        counts = {"rows": 0, "dropped: other model": 0, "dropped: other log type": 0,
                  "dropped: failed (Response tokens = 0)": 0, "dropped: Request tokens = 0": 0}
        with io.StringIO(read_text(path, "workload.path"), newline="") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            if header is None:
                raise ValueError(f"{path}: empty file; expected a BurstGPT CSV with a header row")
            cols = {_norm(h): i for i, h in enumerate(header)}
            missing = [name for key, name in REQUIRED.items() if key not in cols]
            if missing:
                raise ValueError(f"{path}: missing column(s) {missing}; header is {header}. BurstGPT CSVs have "
                                 "Timestamp, Model, Request tokens, Response tokens, Total tokens, Log Type "
                                 "(and Session ID, Elapsed time in the 8-column layout)")
            ix = {key: cols[key] for key in REQUIRED}
            for line, row in enumerate(reader, 2):
                if not row:
                    continue
                counts["rows"] += 1
                try:
                    ts = float(row[ix["timestamp"]])
                    p = int(float(row[ix["request tokens"]]))
                    o = int(float(row[ix["response tokens"]]))
                except (ValueError, IndexError):
                    raise ValueError(f"{path}:{line}: bad row {row[:6]}; Timestamp and the token columns "
                                     "must be numbers") from None
                if not math.isfinite(ts):      # float() reads "nan" and "inf": a trace time they would poison
                    raise ValueError(f"{path}:{line}: Timestamp is {row[ix['timestamp']]!r}; every row needs a "
                                     "finite time in seconds; drop or fix the row")
                if model and row[ix["model"]] != model:
                    counts["dropped: other model"] += 1
                    continue
                if log_type and row[ix["log type"]] != log_type:
                    counts["dropped: other log type"] += 1
                    continue
                if drop_failed and o <= 0:
                    counts["dropped: failed (Response tokens = 0)"] += 1
                    continue
                if p <= 0:
                    counts["dropped: Request tokens = 0"] += 1
                    continue
                reqs.append(Request(prompt_len=p, output_len=max(o, 1), category=row[ix["model"]],
                                    source_id=f"{path.name}:{line}"))
                times.append(ts)
        if counts["rows"] == 0:
            raise ValueError(f"{path}: no data rows under the header")
        order = sorted(range(len(reqs)), key=times.__getitem__)  # replay in time order
        reqs, times = [reqs[i] for i in order], [times[i] for i in order]
        if self.arrival.kind == "trace" and len(times) > 1 and times[0] == times[-1]:
            raise ValueError(f"workload.path={path}: every kept row has Timestamp {times[0]:g}, so "
                             "arrival.kind=trace has no arrival times to replay (a rate over no time); use "
                             "workload.arrival.kind=poisson with workload.arrival.rate=<req/s>")
        layout = "8-column" if {"session id", "elapsed time"} <= set(cols) else "6-column"
        report = LoadReport(source=str(path), tokenizer=None,
                            counts={k: v for k, v in counts.items() if v or k == "rows"},
                            notes=[f"{layout} layout; lengths are the trace's own token counts"])
        if model is None and log_type is None:
            report.notes.append("no model or log-type filter (vLLM's BurstGPT loader keeps Model == GPT-4)")
        return reqs, report, times
