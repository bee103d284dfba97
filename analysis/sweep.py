"""Analysis of a result store: per-point metrics, memory-bound points, regime-split ratios.

:func:`analyze` only reads the store; :func:`write_analysis` stores its result as ``DIR/analysis.json`` (``python
-m harness analyze DIR``, a sweep's end and ``report`` do; ``compare`` reads two folders and writes neither). A
(workload, memory budget, load, draft) group is memory-bound when its *baseline* point's pool was exhausted
(see analysis.regimes); every other strategy's point in the group is compared with the baseline.
With a sweep ``anchor``, :func:`drift` lists its measurements over the sweep's commands (harness.anchor), and
:func:`side_by_side` puts each point beside its baseline with the command each ran in: where they ran in
different commands, the ratio carries the drift between them, and the anchor's measurement in each command gives
a drift-adjusted ratio beside the measured one.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from harness.anchor import CallLog
from harness.config import parse_draft
from harness.point import memory_budget

from .goodput import SLO, goodput, max_load_meeting
from .regimes import RATIOS, Thresholds, geomean, memory_bound, ratio
from .repeats import collapse, design_id
from .setup import setup

# the regimes ratios are split by: the baseline's memory_bound verdict (True, False, None: unknown)
REGIMES = (("memory-bound", True), ("not memory-bound", False), ("unknown", None))

NO_SPEC = "none"                     # a point's draft without speculation
NO_SPEC_SERIES = "no_spec"           # its line in figures and tables
#: The metrics a drift table shows per measurement of the anchor (summary.json ``metrics`` keys).
DRIFT_METRICS = ("output_throughput", "tpot_mean", "ttft_p99")


def _load_label(load: dict) -> tuple[str, float]:
    if load["kind"] == "closed":
        return "concurrency", float(load["concurrency"])
    return f"{load['kind']} rate", float(load["rate"])


def split_memory(memory: str) -> tuple[str, str]:
    """A row's ``memory`` (:func:`harness.point.memory_budget`: ``gmu0.9``, ``kv32MiB``, ``gmu0.6-piecewise``) as
    (budget, variant); the variant is "" for a grid's plain points."""
    budget, _, variant = memory.partition("-")
    return budget, variant


def memory_order(memory: str) -> tuple:
    """Sorts memory budgets (a row's ``memory``, :func:`harness.point.memory_budget`'s ``gmu0.9`` or ``kv32MiB``):
    gmu budgets by fraction, fixed KV pools by size; a variant after the plain points of its budget."""
    budget, variant = split_memory(memory)
    return (("kv", float(budget[2:-3])) if budget.startswith("kv") else ("gmu", float(budget[3:]))) + (variant,)


def load_text(kind: str, value: float) -> str:
    """A load as the summary, captions and tables say it: ``c128`` for a concurrency, ``4 req/s`` for a rate."""
    return f"c{value:g}" if kind == "concurrency" else f"{value:g} req/s"


def memory_title(memory: str) -> str:
    """A memory budget as a figure or table says it: ``gmu 0.9``, ``KV pool 32 MiB``, ``gmu 0.6 (piecewise)``."""
    budget, variant = split_memory(memory)
    title = f"KV pool {budget[2:-3]} MiB" if budget.startswith("kv") else f"gmu {budget[3:]}"
    return f"{title} ({variant})" if variant else title


def flatten(summary: dict[str, Any]) -> dict[str, Any]:
    """One row per point: its axes, status and metrics. ``memory`` is the memory budget as the point id
    spells it (``gmu0.9``; ``kv32MiB`` where ``engine.kv_cache_bytes`` sized the pool and gmu sized nothing):
    points are grouped by it, never by ``gmu`` alone."""
    cfg = summary["config"]
    kind, value = _load_label(cfg["load"])
    row = {"point_id": summary["point_id"], "workload": cfg["workload_name"], "memory": memory_budget(cfg),
           "gmu": cfg["gmu"], "variant": cfg.get("variant"),
           "load_kind": kind, "load": value, "draft": cfg.get("draft") or NO_SPEC, "strategy": cfg["strategy"],
           # what a figure's line is: the strategy, or speculation off (no strategy involved)
           "series": cfg["strategy"] if cfg.get("draft") else NO_SPEC_SERIES,
           "engine": summary.get("engine"), "status": summary["status"], "reason": summary.get("reason"),
           "model": cfg["model"]["name"], "gpu": cfg["gpu"]["name"],
           "repeat": int(cfg.get("repeat") or 1),
           "gpus": int((cfg.get("engine") or {}).get("tensor_parallel_size") or 1),   # GPUs of the point's engine
           "design_id": design_id(summary["point_id"], cfg.get("repeat"))}
    row.update(summary.get("metrics") or {})
    # request-seconds queued for memory, one unit on both engines: the simulator's refusals for blocks; on vLLM the
    # queue while seats were free (its gauges cannot tell blocks from the step's token budget)
    row["queued_for_memory_s"] = row.get("wait_memory_s", row.get("wait_free_seats_s"))
    cover = graph_coverage(summary)
    row["decode_past_graphs"] = cover["decode_past_graphs"] if cover else None
    row["largest_graph"] = cover["largest_graph"] if cover else None
    return row


def graph_coverage(summary: dict[str, Any]) -> dict[str, Any] | None:
    """Whether vLLM's CUDA graphs covered a point's largest decode step: R running requests under a k-token draft
    make a decode step of R x (1 + k) tokens, and a step past vLLM's largest captured graph runs without graphs
    (vLLM 0.26 on the H200: a median step of 129-167 ms against ~30 within them, results/h200-kernel-speed/e2e/
    final). Mixed prefill-decode steps add their prompt tokens, which the samples do not show, so a point within
    the graphs may still have run some of those without. None where the point does not say what vLLM captured
    (the simulator, eager runs, points recorded before the capture sizes were). "Without graphs" means past every
    captured decode graph (FULL and PIECEWISE; a decode step between the two largest runs PIECEWISE); vLLM's
    encoder graphs, where a log lists them, are not the decoder's."""
    t = summary.get("telemetry") or {}
    capture = (t.get("server") or {}).get("graph_capture")
    if not capture or t.get("max_running") is None:
        return None
    draft = (summary.get("config") or {}).get("draft")
    per_request = 1 + (parse_draft(draft, root=True).num_drafts if draft else 0)
    decode = int(t["max_running"]) * per_request
    decoder = [capture[m]["largest"] for m in ("PIECEWISE", "FULL") if m in capture]
    if not decoder:
        return None
    largest = max(decoder)
    return {"decode_tokens_max": decode, "largest_graph": largest, "decode_past_graphs": decode > largest}


def analyze(store, thresholds: Thresholds | None = None, baseline: str | None = None,
            slo: SLO | None = None) -> dict[str, Any]:
    sweep = store.sweep_config()
    th = thresholds or Thresholds.from_config(sweep.get("thresholds"))
    base = baseline or sweep.get("baseline", "store_all")
    slo = slo or SLO.from_config(sweep.get("slo"))      # the command's SLOs, else the ones the sweep ran with
    summaries = list(store.summaries())
    rows = [flatten(s) for s in summaries]
    damaged = dict(getattr(store, "damaged", {}))     # left out above; a rerun of the sweep redoes them
    ok = [r for r in rows if r["status"] == "ok"]
    for r in ok:      # goodput under this analysis's SLOs, from the stored requests (SLOs are not the run's)
        r.update(goodput(store.requests(r["point_id"]), slo, r.get("duration_s")))
    failed_runs = [r for r in rows if r["status"] != "ok"]
    # repeats=N: one row per design point, the mean over its finished runs and their spread
    ok = collapse(ok, failed_runs)
    rows = ok + failed_runs
    groups: dict[tuple, dict[str, dict]] = defaultdict(dict)
    for r in ok:
        groups[(r["workload"], r["memory"], r["load_kind"], r["load"], r["draft"])][r["strategy"]] = r
    classified = []
    for key, by in sorted(groups.items(), key=lambda kv: tuple(map(str, kv[0]))):
        if base not in by or key[4] == NO_SPEC:   # speculation off is a baseline of its own (vs_no_spec)
            continue
        bound, why = memory_bound(by[base], th)
        classified.append({"workload": key[0], "memory": key[1], "load_kind": key[2], "load": key[3], "draft": key[4],
                           "memory_bound": bound, "reason": why})
        for r in by.values():
            r["memory_bound"], r["memory_bound_reason"] = bound, why
    ratios: dict[str, dict[str, Any]] = {}
    strategies = sorted({r["strategy"] for r in ok} - {base})
    for s in strategies:
        ratios[s] = {}
        for regime, want in REGIMES:
            sel = [k for k, by in groups.items() if base in by and s in by and k[4] != NO_SPEC
                   and by[base].get("memory_bound") is want]
            if want is None and not sel:      # the unknown regime only where a group is unknown
                continue
            ratios[s][regime] = {name: geomean([ratio(groups[k][s], groups[k][base], name) for k in sel])
                                 for name in RATIOS}
            ratios[s][regime]["points"] = len(sel)
    no_spec = vs_no_spec(groups, base)
    n_bound = sum(c["memory_bound"] is True for c in classified)
    n_unknown = sum(c["memory_bound"] is None for c in classified)
    engines = sorted({r["engine"] for r in rows if r["engine"]})
    result = {
        "engine": engines[0] if len(engines) == 1 else engines,
        "baseline": base, "thresholds": th.__dict__, "sweep": sweep,
        "counts": {"points": len(rows), "ok": len(ok), "failed": len(rows) - len(ok),
                   "runs": len(summaries), "repeats": max((r.get("repeats", 1) for r in ok), default=1),
                   "groups": len(classified), "memory_bound": n_bound, "unknown": n_unknown,
                   "label": f"{n_bound}/{len(classified)}" + (f" ({n_unknown} unknown)" if n_unknown else "")},
        "groups": classified, "ratios": ratios, "vs_no_spec": no_spec, "points": rows,
        "failed": [{"point_id": r["point_id"], "reason": r["reason"]} for r in rows if r["status"] != "ok"],
        "damaged": [{"point_id": k, "reason": v} for k, v in sorted(damaged.items())],
        # open-loop points whose load generator fell behind its arrival schedule: they measured a lighter load
        "behind_schedule": [{"point_id": r["point_id"], "lag_p99_s": r.get("schedule_lag_p99_s"),
                             "rate_error": r.get("rate_error")} for r in ok if r.get("on_schedule") is False],
        "graph_coverage": {"known": sum(r["decode_past_graphs"] is not None for r in ok),
                           "past": [r["point_id"] for r in ok if r["decode_past_graphs"]]},
        "anchor": (anchor := drift(store)),
        "side_by_side": side_by_side(groups, base, store, anchor),
        "slo": {**slo.__dict__, "label": slo.label(), "max_load": slo_max_load(ok, slo)},
        "setup": setup(summaries),
    }
    return result


def slo_max_load(ok: list[dict[str, Any]], slo: SLO) -> list[dict[str, Any]]:
    """Per curve (workload, memory budget, load kind, draft, strategy): the highest load whose good fraction
    reaches ``slo.attainment`` (None where no load does), the capacity under the SLOs as a serving engineer
    sizes it."""
    curves: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for r in ok:
        curves[(r["workload"], r["memory"], r["load_kind"], r["draft"], r["series"])].append(r)
    return [{"workload": k[0], "memory": k[1], "load_kind": k[2], "draft": k[3], "series": k[4],
             "loads": len(pts), "max": max_load_meeting(pts, slo)}
            for k, pts in sorted(curves.items(), key=lambda kv: tuple(map(str, kv[0])))]


def slo_title(slo: dict[str, Any]) -> str:
    """What the goodput lines below it measure (vllm bench serve's definition)."""
    return (f"goodput (a request is good when {slo['label']}; a load meets the SLOs when {slo['attainment']:.0%} "
            "of its requests are good): the highest load meeting them")


def slo_lines(result: dict[str, Any]) -> list[str]:
    """The highest load meeting the SLOs per curve, as the summary and the report say it."""
    slo = result.get("slo")
    if not slo:
        return []
    out = []
    for c in slo["max_load"]:
        where = f"{c['workload']} {memory_title(c['memory'])} {c['draft']} {c['series']}"
        m = c["max"]
        met = (f"up to {load_text(c['load_kind'], m['load'])} ({m['good_fraction']:.0%} good, goodput "
               f"{m['goodput']:.2f} req/s)") if m else f"no load of {c['loads']} meets them"
        out.append(f"{where}: {met}")
    return out


def schedule_line(b: dict[str, Any]) -> str:
    """One behind-schedule point as the summary and the report say it."""
    lag = b.get("lag_p99_s")
    rate = b.get("rate_error")
    return (f"{b['point_id']}: behind its arrival schedule (p99 lag {lag * 1e3:.0f} ms" if lag is not None else
            f"{b['point_id']}: behind its arrival schedule (") + \
        (f", achieved rate {rate:+.1%} of the schedule's)" if rate is not None else ")") + \
        "; it measured a lighter load than asked"


def write_analysis(store, result: dict[str, Any]) -> Path:
    """Store ``result`` (:func:`analyze`'s) beside the points it was computed from, as ``analysis.json``."""
    from harness.store import atomic_write

    path = Path(store.root) / "analysis.json"
    atomic_write(path, json.dumps(result, indent=1, default=str))
    return path


def vs_no_spec(groups: dict[tuple, dict[str, dict]], base: str) -> dict[str, dict[str, Any]]:
    """Each strategy under speculation (the baseline included) against speculation off (``draft=none``) at the
    same (workload, memory budget, load): whether to speculate at all comes first for a vLLM user. Split by the
    speculative group's regime (its baseline's pool exhausted or not); empty without draft=none points."""
    off = {k[:4]: next(iter(by.values())) for k, by in groups.items() if k[4] == NO_SPEC and by}
    out: dict[str, dict[str, Any]] = {}
    if not off:
        return out
    pairs: dict[str, dict[str, list]] = defaultdict(lambda: {"memory-bound": [], "not memory-bound": [],
                                                             "unknown": []})
    for k, by in groups.items():
        if k[4] == NO_SPEC or k[:4] not in off:
            continue
        for s, row in by.items():
            regime = dict((w, r) for r, w in REGIMES)[row.get("memory_bound")]
            pairs[s][regime].append((row, off[k[:4]]))
    for s in sorted(pairs, key=lambda n: (n != base, n)):
        out[s] = {}
        for regime, pts in pairs[s].items():
            if regime == "unknown" and not pts:
                continue
            out[s][regime] = {name: geomean([ratio(a, b, name) for a, b in pts]) for name in RATIOS}
            out[s][regime]["points"] = len(pts)
    return out


def drift(store) -> dict[str, Any] | None:
    """Every measurement of the sweep's anchor, in call order (the grid's own first), and each metric's spread
    (max / min - 1) over them; None without an anchor. Only the anchor's own re-measurements count: a folder
    whose anchor was changed keeps the old one's under anchors/, listed as ``other_points``."""
    anchor = store.sweep_config().get("anchor")
    if not anchor:
        return None
    calls = CallLog.read(store.root)
    # The grid's copy is the last one written as a grid point: by the last command that ran the anchor without
    # re-measuring it (a failed first try is overwritten by the retry); None: before the call log existed.
    grid_call = None
    for c in calls:
        if anchor in c["points"] and not c.get("anchor_remeasured"):
            grid_call = c["call"]
    found: list[tuple[int | None, str, dict[str, Any]]] = []
    grid = store.points / anchor / "summary.json"
    if grid.is_file():
        found.append((grid_call, "grid point", json.loads(grid.read_text())))
    anchors = store.root / "anchors"
    for d in sorted(anchors.glob(f"call-*/points/{anchor}/summary.json")):
        found.append((int(d.parents[2].name.removeprefix("call-")), "re-measured", json.loads(d.read_text())))
    others = sorted({d.name for d in anchors.glob("call-*/points/*") if d.is_dir() and d.name != anchor})
    rows = []
    for call, what, s in sorted(found, key=lambda f: (f[0] or 0, f[1] != "grid point")):
        m = s.get("metrics") or {}
        rows.append({"call": call, "what": what, "status": s.get("status"), "reason": s.get("reason"),
                     "time_utc": (s.get("provenance") or {}).get("time_utc"),
                     "host": (s.get("provenance") or {}).get("host"),
                     "points_in_call": len(next((c["points"] for c in calls if c["call"] == call), [])),
                     **{k: m.get(k) for k in DRIFT_METRICS}})
    spread = {}
    for k in DRIFT_METRICS:
        vals = [r[k] for r in rows if r["status"] == "ok" and isinstance(r[k], (int, float)) and r[k] > 0]
        spread[k] = max(vals) / min(vals) - 1 if len(vals) >= 2 else None
    return {"point_id": anchor, "measurements": rows, "spread": spread, "calls": len(calls), "other_points": others}


def measured_in(store) -> dict[str, int]:
    """For each point in the call log, the sweep command whose measurement the grid keeps: the last one that ran
    it as a grid point (an anchor measured again goes to anchors/, not the grid). A point missing from it ran
    before the call log existed."""
    last: dict[str, int] = {}
    for c in CallLog.read(store.root):
        for point in c["points"]:
            if not (c.get("anchor_remeasured") and point == c.get("anchor")):
                last[point] = c["call"]
    return last


def side_by_side(groups: dict[tuple, dict[str, dict]], base: str, store, anchor: dict[str, Any] | None
                 ) -> list[dict[str, Any]]:
    """Each strategy's point, and speculation off at the same (workload, memory budget, load), beside the baseline's point
    of its group, with the sweep command each was measured in; empty without an anchor (one command: every
    ratio is side by side). ``adjusted`` divides each point's output throughput by the anchor's in its own
    command before the ratio: equal to the measured ratio where both ran in one command, and None where a
    command has no good anchor measurement. It assumes that the drift scales
    every point of a command alike, which nothing here checks: it is shown beside the measured ratio, never in
    place of it."""
    if not anchor:
        return []
    by_call = {m["call"]: m["output_throughput"] for m in anchor["measurements"]
               if m["status"] == "ok" and m.get("output_throughput")}
    off = {k[:4]: next(iter(by.values())) for k, by in groups.items() if k[4] == NO_SPEC and by}
    calls = measured_in(store)
    rows = []
    for key, by in sorted(groups.items(), key=lambda kv: tuple(map(str, kv[0]))):
        if key[4] == NO_SPEC or base not in by:
            continue
        b = by[base]
        others = [r for s, r in sorted(by.items()) if s != base] + ([off[key[:4]]] if key[:4] in off else [])
        for r in others:
            call, base_call = calls.get(r["point_id"]), calls.get(b["point_id"])
            raw = ratio(r, b, "throughput")
            adj = None
            # a point outside the call log (before it existed) has no call to take an anchor from
            if raw is not None and None not in (call, base_call) and call in by_call and base_call in by_call:
                adj = raw * by_call[base_call] / by_call[call]
            rows.append({"workload": key[0], "memory": key[1], "load_kind": key[2], "load": key[3], "draft": key[4],
                         "series": r["series"], "point_id": r["point_id"], "baseline_point": b["point_id"],
                         "call": call, "baseline_call": base_call, "same_call": call is not None and call == base_call,
                         "output_throughput": r.get("output_throughput"),
                         "baseline_output_throughput": b.get("output_throughput"),
                         "throughput_ratio": raw, "adjusted_throughput_ratio": adj,
                         "p99_ttft_ratio": ratio(r, b, "p99_ttft"),
                         # why the throughput ratio is what it is: output throughput ~ running requests x tokens
                         # per step / step time, and the inter-token gap is one engine step per request
                         "running_ratio": _over(r, b, "mean_running"), "step_ratio": _over(r, b, "itl_mean")})
    return rows


def _over(r: dict[str, Any], b: dict[str, Any], metric: str) -> float | None:
    """``r``'s ``metric`` over ``b``'s (plain, whatever is better); None where either is missing or zero."""
    x, y = r.get(metric), b.get(metric)
    return x / y if x and y else None


def graph_line(result: dict[str, Any]) -> str | None:
    """One sentence on the points whose decode steps passed vLLM's largest CUDA graph (the report's and the
    console's), or None where every point that says stayed within them."""
    g = result.get("graph_coverage") or {}
    past = g.get("past") or []
    if not past:
        return None
    sizes = sorted({r["largest_graph"] for r in result["points"] if r["point_id"] in past})
    return (f"{len(past)} of {g['known']} points had decode steps past vLLM's largest CUDA graph "
            f"({'/'.join(map(str, sizes))} tokens; running requests x (1 + k) tokens each), which ran without "
            f"graphs: {', '.join(past)}. engine.max_cudagraph_capture_size raises the limit")


def anchor_line(a: dict[str, Any]) -> str:
    """One sentence on the anchor's drift over the sweep's commands (the report's and the console's)."""
    ok = [m for m in a["measurements"] if m["status"] == "ok" and m.get("output_throughput")]
    if not ok:
        if a["measurements"]:
            last = a["measurements"][-1]
            return f"anchor {a['point_id']}: every measurement failed (last: {last.get('reason')})"
        return f"anchor {a['point_id']}: not measured yet"
    tput = [m["output_throughput"] for m in ok]
    spread = a["spread"].get("output_throughput")
    return (f"anchor {a['point_id']}: measured {len(ok)}x over {a['calls']} sweep commands, output throughput "
            f"{min(tput):.0f}-{max(tput):.0f} tok/s"
            + (f" (spread {spread:.1%}: ratios between points of different commands carry it)" if spread is not None
               else " (one measurement: no drift to show yet)"))


def side_by_side_cells(row: dict[str, Any]) -> list[str]:
    """A side-by-side row as text (the console's, the report's): point, calls, ratios."""
    num = lambda v: "-" if v is None else f"{v:.2f}"
    calls = f"{row['call'] or '-'} vs {row['baseline_call'] or '-'}" + (" (same)" if row["same_call"] else "")
    return [row["point_id"], calls, num(row["throughput_ratio"]), num(row["adjusted_throughput_ratio"]),
            num(row["p99_ttft_ratio"]), num(row.get("running_ratio")), num(row.get("step_ratio"))]


def fmt_ratio(g: dict | None) -> str:
    """A geomean with its 95% interval (regimes.geomean's), as the console and the reports print it; with fewer
    groups than an interval needs, the count instead."""
    if not g or g.get("geomean") is None:
        return "-"
    if g.get("lo") is None:
        return f"{g['geomean']:.2f} (n={g['n']})"
    return f"{g['geomean']:.2f} [{g['lo']:.2f}, {g['hi']:.2f}]"


VERDICT_METRICS = (("throughput", "output throughput"), ("p99_ttft", "p99 TTFT"))
#: an interval inside 1 +- this reads "equal within 2%": a significant 1.00x [1.00, 1.01] is no win to a reader
EQUAL_WITHIN = 0.02


def interval_word(g: dict | None) -> str | None:
    """What a ratio's 95% interval says (regimes.geomean's dict, > 1 better): 'equal within 2%' (inside
    [0.98, 1.02]), 'better' / 'worse' (clear of 1), 'indistinguishable' (it spans 1), 'too few' (no interval);
    None without a ratio. The verdict lines and the report's cell colours both read it."""
    if not g or g.get("geomean") is None:
        return None
    if g.get("lo") is None:
        return "too few"
    if g["lo"] >= 1 - EQUAL_WITHIN and g["hi"] <= 1 + EQUAL_WITHIN:
        return "equal within 2%"
    return "better" if g["lo"] > 1 else "worse" if g["hi"] < 1 else "indistinguishable"


def verdict_lines(result: dict[str, Any]) -> list[str]:
    """One sentence per strategy and regime that a reader can quote: per headline metric, equal within 2% (the 95%
    interval inside [0.98, 1.02]), better (clear of 1 on the good side), worse (clear on the other),
    indistinguishable (it spans 1), or too few groups for an interval (:func:`interval_word`); the interval is a
    bootstrap over the (workload, memory budget, load, draft) groups, not over repeated runs."""
    base, out = result["baseline"], []
    for s, regimes in result["ratios"].items():
        for regime, row in regimes.items():
            if not row.get("points"):
                continue
            parts = []
            for name, what in VERDICT_METRICS:
                g = row.get(name) or {}
                if g.get("geomean") is None:
                    continue
                x = g["geomean"]     # > 1: the strategy is better (throughput s/b; latency b/s)
                flip = name != "throughput" and x < 1          # a latency that went up reads "x higher"
                if name == "throughput":
                    amount = f"{x:.2f}x {base}'s"
                else:
                    amount = f"{1 / x:.2f}x higher" if flip else f"{x:.2f}x lower"
                word = interval_word(g)
                if word == "too few":
                    parts.append(f"{what} {amount} on {g['n']} group{'s' * (g['n'] != 1)} (too few for an interval)")
                    continue
                lo, hi = (1 / g["hi"], 1 / g["lo"]) if flip else (g["lo"], g["hi"])
                parts.append(f"{what} {word}: {amount} [{lo:.2f}, {hi:.2f}] over {g['n']} groups")
            if parts:
                out.append(f"{s} vs {base}, {regime}: " + "; ".join(parts))
    return out


VERDICT_NOTE = ("intervals: 95% bootstrap over the groups (design points), not over repeated runs; none below "
                "5 groups; 'equal within 2%': the whole interval lies inside [0.98, 1.02]")
