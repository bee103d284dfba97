"""Every point in the field names other tools read: ``bench_serve.json`` in ``vllm bench serve``'s result keys
(``request_throughput``, ``output_throughput``, ``mean_ttft_ms``, ``p99_tpot_ms``, ...), a list holding one such
object per point (vLLM writes one file per run) with its axes first, and ``points.csv``, the same rows flat, beside
the report (the per-request Parquet stays in each point's folder). With ``repeats=N`` a row is the design point's
mean over its runs (``repeats`` says how many).

Units follow vLLM: latencies in ms, throughputs per second, ``duration`` in s. Percentile keys are named as
``vllm bench serve --metric-percentiles`` names them (``p99_ttft_ms``, ``median_ttft_ms`` for p50).
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

from analysis.metrics import METRICS
from harness.store import atomic_write

AXES = ("point_id", "workload", "memory", "gmu", "load_kind", "load", "draft", "strategy", "series", "engine",
        "status", "memory_bound")


def bench_serve_record(p: dict[str, Any], percentiles: list[float]) -> dict[str, Any]:
    """One analysed point (analysis.sweep's row) in vllm bench serve's keys, after its axes."""
    out = {k: p.get(k) for k in AXES}
    ms = lambda v: None if v is None else v * 1e3
    out.update({
        "duration": p.get("duration_s"),
        "completed": p.get("completed"),
        "failed": p.get("failed"),
        "request_throughput": p.get("request_throughput"),
        "request_goodput": p.get("goodput"),
        "output_throughput": p.get("output_throughput"),
        "total_token_throughput": p.get("total_throughput"),
        "max_concurrency": p.get("load") if p.get("load_kind") == "concurrency" else None,
        "request_rate": p.get("load") if p.get("load_kind", "").endswith("rate") else "inf",   # vLLM: inf = closed
        "repeats": p.get("repeats", 1),
    })
    for name, (ours, _, _) in METRICS.items():
        out[f"mean_{name}_ms"] = ms(p.get(f"{ours}_mean"))
        out[f"median_{name}_ms"] = ms(p.get(f"{ours}_p50"))
        for q in percentiles:
            out[f"p{q:g}_{name}_ms"] = ms(p.get(f"{ours}_p{q:g}"))
    return out


def write_exports(root: Path, result: dict[str, Any], percentiles: list[float]) -> list[Path]:
    """``root``/bench_serve.json and ``root``/points.csv for every point of ``result`` (analysis.sweep.analyze's)."""
    rows = [bench_serve_record(p, percentiles) for p in result["points"]]
    root = Path(root)
    atomic_write(root / "bench_serve.json", json.dumps(rows, indent=1, default=str))
    buf = io.StringIO()
    if rows:
        w = csv.DictWriter(buf, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    atomic_write(root / "points.csv", buf.getvalue())
    return [root / "bench_serve.json", root / "points.csv"]
