"""Repeated runs of one design point (``repeats=N``): one row per design point, each metric the mean over its
finished repeats, with the spread a reader needs to judge a ratio (min, max and the relative spread
(max - min) / mean of the headline metrics).

Input: :func:`analysis.sweep.flatten`'s rows (plus goodput), ``repeat`` 1..N and ``design_id`` (the point id
without its ``-r<N>``). A design point with one finished run passes through with ``repeats: 1``. Evidence that a
pool bound the batch is kept at its strongest over the repeats (a preemption in any run is a preemption), so a
design point is memory-bound when any of its runs was.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

#: metrics whose spread over repeats the report shows beside their mean
SPREAD = ("output_throughput", "ttft_p99", "tpot_mean", "goodput")
#: memory-bound evidence: the strongest run's, not the mean (analysis.regimes.memory_bound reads these)
STRONGEST = ("preemptions", "memory_refusals", "blocked_kv_peak", "blocked_samples", "peak_kv_usage",
             "max_running", "requests_waited_for_memory", "waiting_for_memory_s")


def design_id(point_id: str, repeat: int | None) -> str:
    """The point id without its repeat suffix ``-r<repeat>`` (repeat 1 has none)."""
    suffix = f"-r{repeat}"
    return point_id.removesuffix(suffix) if repeat and repeat > 1 and point_id.endswith(suffix) else point_id


def collapse(rows: list[dict[str, Any]], failed: list[dict[str, Any]] = ()) -> list[dict[str, Any]]:
    """One row per design point for the finished rows in ``rows`` (status ok), in their order; ``failed``: the
    runs that did not finish, counted per design point (``runs_failed``). A design point's ``point_id`` is its
    first finished run's (whose requests and telemetry the figures read); ``design_id`` names the design point."""
    by: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by[r["design_id"]].append(r)
    lost: dict[str, int] = defaultdict(int)
    for r in failed:
        lost[r["design_id"]] += 1
    out = []
    for did, runs in by.items():
        runs = sorted(runs, key=lambda r: r.get("repeat") or 1)
        row = dict(runs[0], repeats=len(runs), runs_failed=lost.get(did, 0),
                   repeat_ids=[r["point_id"] for r in runs])
        if len(runs) > 1:
            # a run behind its arrival schedule makes the design point so (it measured a lighter load)
            if any(r.get("on_schedule") is False for r in runs):
                row["on_schedule"] = False
            number = lambda x: isinstance(x, (int, float)) and not isinstance(x, bool)
            for k in STRONGEST:        # the strongest run's evidence; a run that recorded none does not erase it
                vals = [r.get(k) for r in runs if number(r.get(k))]
                if vals:
                    row[k] = float(max(vals))
            for k in runs[0]:
                vals = [r.get(k) for r in runs]
                if k == "repeat" or k in STRONGEST or not all(number(x) for x in vals):
                    continue
                row[k] = float(np.mean(vals))
            for k in SPREAD:
                vals = [r.get(k) for r in runs if number(r.get(k))]
                if len(vals) == len(runs) and np.mean(vals):
                    row[f"{k}_min"], row[f"{k}_max"] = float(min(vals)), float(max(vals))
                    row[f"{k}_spread"] = float((max(vals) - min(vals)) / np.mean(vals))
        out.append(row)
    return out
