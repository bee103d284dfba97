"""The console's view of a store's analysis (``sweep``'s end, ``analyze``): counts, the regime-split ratio
tables, each point beside its baseline, the CUDA-graph and anchor-drift lines, failures. Printing only: the
numbers and sentences are analysis.sweep's, which the reports share."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from analysis.regimes import RATIOS
from analysis.setup import setup_line
from analysis.sweep import (VERDICT_NOTE, anchor_line, fmt_ratio, graph_line, schedule_line, side_by_side_cells,
                            slo_lines, slo_title, verdict_lines)

from .console import table as make_table


def print_summary(result: dict[str, Any], console, report: Path | None = None) -> None:
    """``result``: :func:`analysis.sweep.analyze`'s. ``report``: the folder whose report.html/pdf to name."""
    c = result["counts"]
    console.print(f"[bold]{c['points']} points[/] ({c['failed']} failed), engine: {result['engine']}; "
                  f"memory-bound ({result['baseline']}'s pool bound the batch): {c['label']}")
    if line := setup_line(result.get("setup")):
        console.print(line, highlight=False)
    tables = [(f"ratios to {result['baseline']} (geomean [95% CI]; latencies: x lower)", result["ratios"])]
    if result.get("vs_no_spec"):
        tables.append(("ratios to speculation off (draft=none, same workload, memory budget and load; geomean [95% CI])",
                       result["vs_no_spec"]))
    for title, ratios in tables:
        t = make_table(title, ["strategy", "regime", "points", *RATIOS], left=2)
        for s, regimes in ratios.items():
            for regime, row in regimes.items():
                t.add_row(s, regime, str(row["points"]), *[fmt_ratio(row[n]) for n in RATIOS])
        console.print(t)
    for line in verdict_lines(result):
        console.print(f"[bold]verdict[/]: {line}", highlight=False)
    if result["ratios"]:
        console.print(f"  ({VERDICT_NOTE})")
    if pairs := result.get("side_by_side"):
        t = make_table(f"each point beside {result['baseline']} at its settings (throughput x; p99 TTFT x lower; "
                       "adjusted: each point scaled by its command's anchor measurement; running requests and "
                       "engine step (mean inter-token gap): x the baseline's)",
                       ["point", "vs call", "throughput", "adjusted", "p99 TTFT", "running", "step"], left=1)
        for row in pairs:
            t.add_row(*side_by_side_cells(row))
        console.print(t)
    if line := graph_line(result):
        console.print(line)
    a = result.get("anchor")
    if a:
        console.print(anchor_line(a))
    by_reason: dict[str, list[str]] = {}
    for f in result["failed"]:       # every failed point, once per reason (a bad setting fails many alike)
        by_reason.setdefault(str(f["reason"]), []).append(f["point_id"])
    for reason, ids in by_reason.items():
        who = ids[0] if len(ids) == 1 else f"{len(ids)} points ({', '.join(ids)})"
        console.print(f"  [red]failed[/]: {who}: {reason}")
    for b in result.get("behind_schedule") or []:
        console.print(f"  [yellow]behind schedule[/]: {schedule_line(b)}")
    if result.get("slo"):
        console.print(slo_title(result["slo"]))
        for line in slo_lines(result):
            console.print(f"  {line}", highlight=False)
    for d in result.get("damaged") or []:
        console.print(f"  [yellow]damaged[/] (left out; rerun the sweep to redo it): {d['point_id']}: {d['reason']}")
    if report:
        console.print(f"report: {report}/report.html, {report}/report.pdf")
