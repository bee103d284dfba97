"""The report's figures (matplotlib, Agg). Each is one function here, registered with ``@figure(title)``: it
takes the report's :class:`Inputs` and returns a Figure, a :class:`Drawn` (the figure and its takeaway caption),
or None where the store has nothing for it to draw. The report shows them in the order they are defined. Adding a
figure is adding one such function.

Every figure carries the engine and what it ran on in a footer (for the simulator, "engine: sim" and its
calibration), so a figure copied out of the report still says whether it was measured.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from analysis.sweep import load_text, memory_order, memory_title  # noqa: E402

#: each series' colour, marker and line style: strategies that draw on top of each other stay apart
STYLES = {"no_spec": ("#9e9e9e", "x", "-."), "store_all": ("#222222", "D", "-"), "replay": ("#1f77b4", "o", "-"),
          "treewy": ("#d62728", "s", "--"), "treewy_deferred": ("#2ca02c", "^", ":"),
          "treewy_fused": ("#9467bd", "v", "--")}   # the last: kernel benchmark only (TreeWY's commit + verify fused)
COLORS = {k: v[0] for k, v in STYLES.items()}


@dataclass(frozen=True)
class Inputs:
    """What a figure may draw from: ``result`` (analysis.sweep.analyze's), ``requests_of(point_id)`` (a point's
    request records), ``model`` (the points' model config; None where the store has no point),
    ``summary_of(point_id)`` (a point's summary.json: its telemetry timelines)."""
    result: dict[str, Any]
    requests_of: Callable[[str], list[dict[str, Any]]] = lambda point_id: []
    model: dict[str, Any] | None = None
    summary_of: Callable[[str], dict[str, Any]] = lambda point_id: {}


@dataclass(frozen=True)
class Drawn:
    """A figure with the one-sentence takeaway the report prints under it."""
    fig: "plt.Figure"
    caption: str = ""


#: (title, function) of every report figure, in the report's order
FIGURES: list[tuple[str, Callable[[Inputs], "plt.Figure | Drawn | None"]]] = []


def figure(title: str):
    """Registers ``fn(inputs) -> Figure | Drawn | None`` as a report figure titled ``title``."""
    def add(fn):
        FIGURES.append((title, fn))
        return fn
    return add


def draw(inputs: Inputs) -> list[tuple[str, "plt.Figure", str]]:
    """Every registered figure that has something to draw: (title, figure, caption), each figure footed with
    :func:`engine_label`."""
    out = []
    for title, fn in FIGURES:
        got = fn(inputs)
        if got is None:
            continue
        d = got if isinstance(got, Drawn) else Drawn(got)
        _footer(d.fig, inputs.result)
        out.append((title, d.fig, d.caption))
    return out


def engine_label(result: dict[str, Any]) -> str:
    """What every figure says it shows: the engine, and for the simulator its calibration; for vLLM the GPUs and
    where acceptance came from."""
    st = result.get("setup") or {}
    if result["engine"] == "sim":
        return ("engine: sim (simulated, not measured) - calibration: "
                + str(st.get("calibration") or "not recorded"))
    parts = [f"engine: {st.get('engine') or result['engine']}"]
    if st.get("gpu"):
        parts.append(st["gpu"])
    if st.get("weights", "").startswith("dummy"):
        parts.append("dummy weights")
    if "imposed" in st.get("acceptance", ""):
        parts.append("synthetic acceptance (imposed)")
    return ", ".join(parts)


def _footer(fig, result) -> None:
    text = engine_label(result)
    fig.text(0.01, 0.005, text if len(text) <= 190 else text[:187] + "...", fontsize=6.5, va="bottom",
             color="#a00" if result["engine"] == "sim" else "#555")


def _series(p) -> str:
    """A point's line: its strategy, or ``no_spec`` for speculation off (analysis.sweep.flatten)."""
    return p.get("series") or p["strategy"]


def _ok(result):
    return [p for p in result["points"] if p["status"] == "ok"]


def _strategies(result) -> list[str]:
    order = list(STYLES)
    names = {_series(p) for p in _ok(result)}
    return sorted(names, key=lambda s: (order.index(s) if s in order else 99, s))


def _style(s: str) -> dict[str, Any]:
    c, m, ls = STYLES.get(s, (None, "o", "-"))
    return {"color": c, "marker": m, "ls": ls, "markersize": 4.5, "lw": 1.4, "label": s,
            "markerfacecolor": "none" if m in ("o", "s", "D", "^", "v") else None}


def _grid(n: int, cols: int = 3, w: float = 4.2, h: float = 3.1, layout: str | None = None):
    cols = max(1, min(n, cols))
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(w * cols, h * rows + 0.5), squeeze=False, layout=layout)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat)


def _panels(result) -> list[tuple[str, str, str]]:
    """Every (workload, memory budget, load kind) of the result, memory budgets in order: small multiples, none
    dropped (a concurrency and a rate of the same number are different loads)."""
    return sorted({(p["workload"], p["memory"], p["load_kind"]) for p in _ok(result)},
                  key=lambda wmk: (wmk[0], memory_order(wmk[1]), wmk[2]))


def _panel_title(result, w: str, g: str, kind: str) -> str:
    kinds = {p["load_kind"] for p in _ok(result)}
    return f"{w}, {memory_title(g)}" + (f", {kind}" if len(kinds) > 1 else "")


def _in(p, w: str, g: str, kind: str) -> bool:
    return p["workload"] == w and p["memory"] == g and p["load_kind"] == kind


def _load_name(pts) -> str:
    kinds = {p["load_kind"] for p in pts}
    return kinds.pop() if len(kinds) == 1 else "load"


def _load_unit(pts) -> Callable[[float], str]:
    kind = _load_name(pts)
    return lambda v: load_text(kind, v)


def _load_axis(ax, loads) -> None:
    """A log2 load axis ticked at the loads measured (1, 8, 32, ...), not at powers of two."""
    loads = sorted({float(v) for v in loads if v and v > 0})
    if not loads:
        return
    if loads[-1] / loads[0] >= 4:
        ax.set_xscale("log", base=2)
    ax.set_xticks(loads, [f"{v:g}" for v in loads], fontsize=7)
    ax.minorticks_off()


def _plain_log(axis, lim) -> None:
    """A log axis labelled 0.5, 2, 10 rather than 6x10^0; within about a decade its minor ticks are labelled too
    (the only labels there), over several not (they would crowd)."""
    plain = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")
    axis.set_major_formatter(plain)
    lo, hi = lim
    axis.set_minor_formatter(plain if hi / max(lo, 1e-12) < 20 else matplotlib.ticker.NullFormatter())
    axis.set_tick_params(which="minor", labelsize=6)


def _finish(fig, title: str) -> None:
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.03, 1, 1))


def _metric_vs_load(result, value, ylabel: str, title: str, ylog: bool = False, ylim=None,
                    extra: Callable | None = None) -> plt.Figure:
    """One panel per (workload, memory budget, load kind), every one of them, a line per series: ``value(point)``
    against the load (None: skipped). ``extra(ax, workload, memory, load kind)`` adds to a panel."""
    pts = _ok(result)
    panels = _panels(result)
    fig, axes = _grid(len(panels))
    for ax, (w, g, kind) in zip(axes, panels):
        for s in _strategies(result):
            sel = sorted((p["load"], v) for p in pts
                         if _in(p, w, g, kind) and _series(p) == s and (v := value(p)) is not None)
            if sel:
                ax.plot(*zip(*sel), **_style(s))
        if extra:
            extra(ax, w, g, kind)
        ax.set_title(_panel_title(result, w, g, kind), fontsize=9)
        _load_axis(ax, [p["load"] for p in pts if _in(p, w, g, kind)])
        if ylog:
            ax.set_yscale("log")
            _plain_log(ax.yaxis, ax.get_ylim())
        elif ylim:
            ax.set_ylim(*ylim)
        else:
            ax.set_ylim(bottom=0)
        ax.set_xlabel("concurrency" if kind == "concurrency" else f"{kind} (req/s)", fontsize=8)
        ax.set_ylabel(ylabel, fontsize=8)
        ax.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    if handles:
        axes[0].legend(fontsize=7)
    _finish(fig, title)
    return fig


def _groups(result) -> dict[tuple, dict[str, dict]]:
    """(workload, memory, load, draft, load kind) -> series -> point; speculation off joins every draft of its
    load. The load kind is last so that key[:3] reads (workload, memory, load) where one kind is swept."""
    out: dict[tuple, dict[str, dict]] = defaultdict(dict)
    pts = _ok(result)
    drafts = {p["draft"] for p in pts if _series(p) != "no_spec"}
    for p in pts:
        if _series(p) == "no_spec":
            for d in drafts:
                out[(p["workload"], p["memory"], p["load"], d, p["load_kind"])]["no_spec"] = p
        else:
            out[(p["workload"], p["memory"], p["load"], p["draft"], p["load_kind"])][_series(p)] = p
    return out


def _largest_gap(result, metric: str, higher: bool) -> tuple[tuple, str, float] | None:
    """The group and strategy farthest from the baseline on ``metric`` (by the factor, either way)."""
    base = result["baseline"]
    best = None
    for key, by in _groups(result).items():
        b = (by.get(base) or {}).get(metric)
        if not b:
            continue
        for s, p in by.items():
            v = p.get(metric)
            if s in (base, "no_spec") or not v:
                continue
            x = v / b if higher else b / v
            if best is None or abs(np.log(x)) > abs(np.log(best[2])):
                best = (key, s, x)
    return best


def _where(key, pts) -> str:
    """A group or point as a caption says it: workload, memory budget, load (c128, or 4 req/s)."""
    kind = key[4] if len(key) > 4 else _load_name(pts)
    return f"{key[0]}, {memory_title(key[1])}, {load_text(kind, key[2])}"


def _gap_caption(result, metric: str, higher: bool, what: str, fmt: Callable[[float], str]) -> str:
    g = _largest_gap(result, metric, higher)
    if g is None:
        return ""
    key, s, x = g
    by = _groups(result)[key]
    base = result["baseline"]
    a, b = by[s][metric], by[base][metric]
    rel = (f"{x:.2f}x {base}'s" if higher else (f"{x:.2f}x lower than {base}'s" if x >= 1
                                               else f"{1 / x:.2f}x higher than {base}'s"))
    return f"Largest gap at {_where(key, _ok(result))}: {s}'s {what} is {rel} ({fmt(a)} against {fmt(b)})."


# -- the views -----------------------------------------------------------------------------------

@figure("Output throughput vs load")
def throughput_vs_load(inp: Inputs) -> Drawn:
    r = inp.result
    fig = _metric_vs_load(r, lambda p: p.get("output_throughput"), "output tok/s", "Output throughput vs load")
    return Drawn(fig, _gap_caption(r, "output_throughput", True, "output throughput", lambda v: f"{v:,.0f} tok/s"))


@figure("Mean TPOT vs load")
def tpot_vs_load(inp: Inputs) -> Drawn:
    r = inp.result
    fig = _metric_vs_load(r, lambda p: p["tpot_mean"] * 1e3 if p.get("tpot_mean") else None, "mean TPOT (ms)",
                          "Mean time per output token vs load (TPOT = (E2E - TTFT) / (output tokens - 1))")
    return Drawn(fig, _gap_caption(r, "tpot_mean", False, "mean TPOT", lambda v: f"{v * 1e3:.1f} ms"))


@figure("Mean ITL vs load")
def itl_vs_load(inp: Inputs) -> Drawn | None:
    r = inp.result
    if not any(p.get("itl_mean") for p in _ok(r)):
        return None
    fig = _metric_vs_load(r, lambda p: p["itl_mean"] * 1e3 if p.get("itl_mean") else None, "mean ITL (ms)",
                          "Mean inter-token latency vs load (per streamed chunk; one chunk may carry several "
                          "accepted tokens)")
    return Drawn(fig, _gap_caption(r, "itl_mean", False, "mean ITL", lambda v: f"{v * 1e3:.1f} ms")
                 + " Under speculation ITL is one engine step, not one token: compare TPOT for tokens.")


@figure("p99 TTFT vs load")
def p99_ttft_vs_load(inp: Inputs) -> Drawn:
    r = inp.result
    fig = _metric_vs_load(r, lambda p: p.get("ttft_p99") or None, "p99 TTFT (s)",
                          "p99 time to first token vs load", ylog=True)
    cap = _gap_caption(r, "ttft_p99", False, "p99 TTFT", lambda v: f"{v:.2f} s")
    n = {p.get("requests") for p in _ok(r) if p.get("requests")}
    reps = max((p.get("repeats") or 1) for p in _ok(r)) if _ok(r) else 1
    if n and reps > 1:
        cap += f" Each point is the mean of up to {reps} runs' p99s (the points table gives their spread)."
    elif n:
        span = lambda a, b: f"{a}" if a == b else f"{a}-{b}"
        cap += (f" Each point is one run of {span(min(n), max(n))} requests: its p99 is about the "
                f"{span(max(1, round(min(n) / 100)), max(1, round(max(n) / 100)))} worst.")
    return Drawn(fig, cap)


@figure("Running requests vs load, with the KV-plan caps")
def running_vs_load(inp: Inputs) -> Drawn:
    r = inp.result
    pts = _ok(r)

    def caps(ax, w, g, kind):
        for s in _strategies(r):
            c = [p.get("max_concurrency") for p in pts if _in(p, w, g, kind) and _series(p) == s
                 and p.get("max_concurrency")]
            if c:
                ax.axhline(float(np.median(c)), color=STYLES.get(s, ("#777",))[0], lw=0.8, ls=(0, (2, 2)), alpha=0.8)

    fig = _metric_vs_load(r, lambda p: p.get("mean_running"), "mean running requests",
                          "Running requests vs load (dotted: the KV plan's cap, requests of max_model_len the pool "
                          "holds)", extra=caps)
    cap = ""
    flat = [(p, p["mean_running"] / p["load"]) for p in pts if p.get("mean_running") and p["load"] and
            p["load_kind"] == "concurrency"]
    if flat:
        p, f = min(flat, key=lambda t: t[1])
        where = _where((p["workload"], p["memory"], p["load"], None, p["load_kind"]), pts)
        cap = (f"Fewest running for the load at {where}: "
               f"{_series(p)} ran {p['mean_running']:.0f} requests on average of {p['load']:g} offered"
               + (f", against a KV-plan cap of {p['max_concurrency']:.0f}" if p.get("max_concurrency") else "") + ".")
    return Drawn(fig, cap)


@figure("Peak KV-pool usage vs load")
def peak_kv_vs_load(inp: Inputs) -> Drawn:
    r = inp.result
    fig = _metric_vs_load(r, lambda p: p.get("peak_kv_usage") or 0, "peak KV-pool usage", "Peak KV-pool usage vs load",
                          ylim=(0, 1.05))
    th = r["thresholds"]["peak_kv_usage"]
    return Drawn(fig, f"A pool near full ({th:.0%} and up, with requests waiting and seats free) is the memory-bound "
                      "evidence on vLLM; the simulator's own admission refusals are its evidence.")


@figure("Goodput vs load")
def goodput_vs_load(inp: Inputs) -> Drawn | None:
    r = inp.result
    slo = r.get("slo")
    if not slo or not any(p.get("goodput") is not None for p in _ok(r)):
        return None
    fig = _metric_vs_load(r, lambda p: p.get("goodput"), "goodput (good req/s)",
                          f"Goodput vs load (a request is good when {slo['label']})")
    best = [c for c in slo["max_load"] if c["max"]]
    cap = f"vllm bench serve --goodput's definition. A load meets the SLOs when {slo['attainment']:.0%} of its " \
          "requests are good"
    if best:
        top = max(best, key=lambda c: c["max"]["load"])
        cap += f"; the highest load meeting them: {top['series']} at {_load_unit(_ok(r))(top['max']['load'])} " \
               f"({top['workload']}, {memory_title(top['memory'])})"
    else:
        cap += "; no load of any series meets them"
    return Drawn(fig, cap + ".")


@figure("Latency-throughput Pareto")
def pareto(inp: Inputs) -> Drawn:
    """vllm bench sweep plot_pareto's axes: output tokens/s per user (1 / mean TPOT) against output tokens/s per
    GPU, one point per load, each series' Pareto frontier drawn as its line."""
    r = inp.result
    pts = _ok(r)
    panels = _panels(r)
    fig, axes = _grid(len(panels))
    unit = _load_unit(pts)
    for ax, (w, g, kind) in zip(axes, panels):
        for s in _strategies(r):
            # per GPU of each point's own engine (a report of several folders may mix tensor-parallel sizes)
            sel = [(1 / p["tpot_mean"], p["output_throughput"] / (p.get("gpus") or 1), p["load"]) for p in pts
                   if _in(p, w, g, kind) and _series(p) == s and p.get("tpot_mean") and p.get("output_throughput")]
            if not sel:
                continue
            st = _style(s)
            ax.scatter([x for x, _, _ in sel], [y for _, y, _ in sel], color=st["color"], marker=st["marker"], s=14,
                       facecolors="none" if st["markerfacecolor"] == "none" else st["color"], label=s)
            front = _frontier([(x, y) for x, y, _ in sel])
            ax.plot(*zip(*front), color=st["color"], ls=st["ls"], lw=1.2)
            for x, y, load in sel:
                ax.annotate(unit(load), (x, y), fontsize=5.5, color=st["color"], xytext=(2, 2),
                            textcoords="offset points")
        ax.set_title(_panel_title(r, w, g, kind), fontsize=9)
        ax.set_xlabel("output tok/s per user (1 / mean TPOT)", fontsize=8)
        ax.set_ylabel("output tok/s per GPU", fontsize=8)
        ax.grid(alpha=0.3)
    if axes and axes[0].get_legend_handles_labels()[0]:
        axes[0].legend(fontsize=7)
    _finish(fig, "Latency-throughput Pareto (up and right is better; the line: each series' frontier)")
    return Drawn(fig, "A series whose frontier lies above another's serves more tokens per GPU at the same per-user "
                      "speed; points are labelled with their load.")


def _frontier(xy: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The points no other beats on both axes (higher is better on both), by x."""
    out = [p for p in xy if not any(q[0] >= p[0] and q[1] >= p[1] and q != p for q in xy)]
    return sorted(out)


@figure("Throughput ratio heatmap")
def ratio_heatmap(inp: Inputs) -> Drawn | None:
    """Per strategy, its output throughput over the baseline's in every (workload, memory budget) x load cell; a
    memory-bound group's cell is outlined, an unknown one hatched."""
    r = inp.result
    base = r["baseline"]
    by = _groups(r)
    others = [s for s in _strategies(r) if s not in (base, "no_spec")]
    rows = sorted({(k[0], k[1], k[3], k[4]) for k in by}, key=lambda t: (t[0], memory_order(t[1]), t[2], t[3]))
    loads = sorted({k[2] for k in by})
    if not others or not rows:
        return None
    fig, axes = _grid(len(others), cols=2, w=0.75 * len(loads) + 3.6, h=0.38 * len(rows) + 1.4, layout="constrained")
    norm = matplotlib.colors.TwoSlopeNorm(vmin=-1.5, vcenter=0.0, vmax=1.5)      # log2 of the ratio
    unit = _load_unit(_ok(r))
    im = None
    for ax, s in zip(axes, others):
        m = np.full((len(rows), len(loads)), np.nan)
        for i, (w, g, d, kind) in enumerate(rows):
            for j, load in enumerate(loads):
                pair = by.get((w, g, load, d, kind), {})
                a, b = (pair.get(s) or {}).get("output_throughput"), (pair.get(base) or {}).get("output_throughput")
                if a and b:
                    m[i, j] = a / b
                    ax.text(j, i, f"{a / b:.2f}", ha="center", va="center", fontsize=6.5,
                            color="white" if abs(np.log2(a / b)) > 0.9 else "black")
                    bound = pair[base].get("memory_bound")
                    if bound is True:
                        ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, ec="black", lw=1.8))
                    elif bound is None:
                        ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, ec="#777", hatch="///", lw=0))
        im = ax.imshow(np.log2(m), cmap="RdBu", norm=norm, aspect="auto")
        kinds = {x[3] for x in rows}
        ax.set_xticks(range(len(loads)), [f"{v:g}" if len(kinds) > 1 else unit(v) for v in loads], fontsize=7)
        drafts = {x[2] for x in rows}
        ax.set_yticks(range(len(rows)), [f"{w}, {memory_title(g)}" + ("" if len(drafts) == 1 else f", {d}")
                                         + ("" if len(kinds) == 1 else f", {kind}") for w, g, d, kind in rows],
                      fontsize=7)
        ax.set_title(f"{s} / {base}, output throughput", fontsize=9)
    if im is not None:
        cb = fig.colorbar(im, ax=[a for a in axes if a.get_visible()], shrink=0.8)
        ticks = [-1.5, -1, -0.5, 0, 0.5, 1, 1.5]
        cb.set_ticks(ticks, labels=[f"{2 ** t:.2g}x" for t in ticks])
    fig.suptitle(f"Throughput ratio to {base} (blue: better; outlined: memory-bound group; hatched: unknown)",
                 fontsize=10)
    tput = lambda pair, s: (pair.get(s) or {}).get("output_throughput")
    cells = [(a / b, s, key) for key, pair in by.items() for s in others
             if (a := tput(pair, s)) and (b := tput(pair, base))]
    cap = ""
    if len(cells) == 1:
        cap = f"One cell: {cells[0][1]} {cells[0][0]:.2f}x at {_where(cells[0][2], _ok(r))}."
    elif cells:
        hi, lo = max(cells), min(cells)
        cap = (f"Best: {hi[1]} {hi[0]:.2f}x at {_where(hi[2], _ok(r))}; worst: {lo[1]} {lo[0]:.2f}x at "
               f"{_where(lo[2], _ok(r))}.")
    return Drawn(fig, cap)


def _most_different(result) -> tuple | None:
    """The group where the series' p99 TTFTs are farthest apart (max / min): where a CDF shows most."""
    best = None
    for key, by in _groups(result).items():
        v = [p.get("ttft_p99") for s, p in by.items() if s != "no_spec" and p.get("ttft_p99")]
        if len(v) >= 2:
            spread = max(v) / min(v)
            if best is None or spread > best[1]:
                best = (key, spread)
    return best[0] if best else None


@figure("TTFT CDF where the strategies differ most")
def ttft_cdf(inp: Inputs) -> Drawn | None:
    """TTFT CDF per series at the group whose p99 TTFTs are farthest apart (not where all are saturated)."""
    result, requests_of = inp.result, inp.requests_of
    key = _most_different(result)
    if key is None:
        return None
    by = _groups(result)[key]
    fig, ax = plt.subplots(figsize=(7.5, 4.0))
    p99 = {}
    for s, p in sorted(by.items(), key=lambda kv: _strategies(result).index(kv[0])):
        reqs = requests_of(p["point_id"])
        ttft = np.sort([x["first_token_s"] - x["arrival_s"] for x in reqs if x.get("first_token_s") is not None])
        if len(ttft):
            st = _style(s)
            ax.plot(ttft, np.arange(1, len(ttft) + 1) / len(ttft), color=st["color"], ls=st["ls"], lw=1.4, label=s)
            p99[s] = float(np.percentile(ttft, 99))
    ax.set_xscale("log")
    _plain_log(ax.xaxis, ax.get_xlim())
    ax.set_xlabel("TTFT (s)")
    ax.set_ylabel("fraction of requests")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"TTFT CDF at {_where(key, _ok(result))}, where the p99s differ most", fontsize=9)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    cap = ""
    if len(p99) >= 2:
        hi, lo = max(p99, key=p99.get), min(p99, key=p99.get)
        cap = f"p99 TTFT {p99[hi]:.2f} s ({hi}) against {p99[lo]:.2f} s ({lo})."
    return Drawn(fig, cap)


@figure("KV usage, running and waiting over time")
def timelines(inp: Inputs) -> Drawn | None:
    """The recorded samples of each series at the group where they differ most: running and waiting requests
    (left axis) and the KV pool's usage (right axis, dotted)."""
    result = inp.result
    key = _most_different(result)
    if key is None:
        return None
    by = _groups(result)[key]
    series = [s for s in _strategies(result) if s in by]
    fig, axes = _grid(len(series), cols=3, w=4.4, h=3.0)
    lacking = []
    for ax, s in zip(axes, series):
        t = (inp.summary_of(by[s]["point_id"]).get("telemetry") or {})
        tl = t.get("timeline")
        if tl and tl.get("t_s"):
            ts = np.array(tl["t_s"], dtype=float)
            for name, color in (("running", "#1f77b4"), ("waiting", "#ff7f0e")):
                ax.plot(ts, [np.nan if v is None else v for v in tl[name]], color=color, lw=1, label=name)
            kv_t, kv = ts, [np.nan if v is None else v for v in tl["kv_usage"]]
        else:
            lacking.append(s)
            kv_t, kv = (np.array([x[0] for x in t.get("kv_usage") or []], dtype=float),
                        [x[1] for x in t.get("kv_usage") or []])
            ax.set_yticks([])      # no running/waiting recorded: no empty request axis
            ax.text(0.02, 0.96, "running/waiting not recorded", transform=ax.transAxes, fontsize=7, va="top",
                    color="#777")
        ax2 = ax.twinx()
        ax2.plot(kv_t, kv, color="#444", ls=":", lw=1, label="KV usage")
        ax2.set_ylim(0, 1.05)
        ax2.tick_params(labelsize=7)
        ax.set_title(s, fontsize=9)
        ax.set_xlabel("s into the run", fontsize=8)
        ax.set_ylabel("requests", fontsize=8)
        ax.tick_params(labelsize=7)
        if ax is axes[0]:
            h1, l1 = ax.get_legend_handles_labels()
            h2, l2 = ax2.get_legend_handles_labels()
            ax.legend(h1 + h2, l1 + l2, fontsize=6.5, loc="upper right")
    _finish(fig, "Running, waiting (left) and KV-pool usage (right, dotted) over the run at "
                 f"{_where(key, _ok(result))}")
    cap = "The queue and the pool together show where memory bound the batch."
    if lacking:
        cap += f" {', '.join(lacking)}: recorded before running/waiting were kept per sample (KV usage only)."
    return Drawn(fig, cap)


@figure("Ratios to the baseline per group, by regime")
def ratio_distributions(inp: Inputs) -> Drawn | None:
    """Every group's ratio as a dot (few groups make a box plot meaningless), the geometric mean as a bar."""
    result = inp.result
    base = result["baseline"]
    groups = _groups(result)
    others = [s for s in _strategies(result) if s not in (base, "no_spec")]
    if not others:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.9))
    rng = np.random.default_rng(0)
    for ax, (metric, higher, title) in zip(axes, (("output_throughput", True, "throughput (x)"),
                                                 ("ttft_p99", False, "p99 TTFT (x lower)"))):
        labels = []
        for i, (s, regime) in enumerate((s, g) for s in others for g in (True, False, None)):
            vals = []
            for by in groups.values():
                if base in by and s in by and by[base].get("memory_bound") is regime:
                    a, b = by[s].get(metric), by[base].get(metric)
                    if a and b:
                        vals.append(a / b if higher else b / a)
            if not vals and regime is None:
                continue
            x = len(labels)
            labels.append(f"{s}\n{'mem-bound' if regime else 'not' if regime is False else 'unknown'} (n={len(vals)})")
            st = _style(s)
            if vals:
                ax.scatter(x + rng.uniform(-0.15, 0.15, len(vals)), vals, s=12, color=st["color"], marker=st["marker"],
                           alpha=0.7)
                gm = float(np.exp(np.mean(np.log(vals))))
                ax.hlines(gm, x - 0.3, x + 0.3, color=st["color"], lw=2)
        ax.set_xticks(range(len(labels)), labels, fontsize=6.5, rotation=30, ha="right")
        ax.axhline(1.0, color="gray", lw=0.8, ls="--")
        ax.set_yscale("log")
        ax.set_title(f"{title} vs {base}; bar: geometric mean", fontsize=9)
    _finish(fig, f"Ratios to {base} per (workload, memory budget, load) group, by the group's regime")
    return Drawn(fig, "Each dot is one group (one design point per strategy), not a repeat; the table on page 1 "
                      "gives the intervals where there are 5 groups or more.")


@figure("Acceptance length per workload")
def acceptance_per_workload(inp: Inputs) -> Drawn | None:
    result = inp.result
    pts = _ok(result)
    workloads_ = sorted({p["workload"] for p in pts})
    strats = [s for s in _strategies(result) if s != "no_spec"]    # no drafts, no acceptance length
    if not strats:
        return None
    imposed = "imposed" in (result.get("setup") or {}).get("acceptance", "")
    fig, ax = plt.subplots(figsize=(7.5, 3.6))
    width = 0.8 / max(len(strats), 1)
    for i, s in enumerate(strats):
        vals = [np.nanmean([p.get("acceptance_length") or np.nan for p in pts
                            if p["workload"] == w and _series(p) == s] or [np.nan]) for w in workloads_]
        ax.bar(np.arange(len(workloads_)) + i * width, vals, width, label=s, color=COLORS.get(s),
               hatch="//" if imposed else None, edgecolor="white")
    ax.set_xticks(np.arange(len(workloads_)) + width * (len(strats) - 1) / 2, workloads_, fontsize=8)
    ax.set_ylabel("mean acceptance length")
    ax.legend(fontsize=7)
    ax.set_title("Acceptance length per workload" + (" - IMPOSED by synthetic acceptance, not measured"
                                                     if imposed else " (measured)"), fontsize=9)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    return Drawn(fig, ("The accepted counts were drawn from fixed per-position rates "
                       f"({(result.get('setup') or {}).get('acceptance')}), so every strategy and workload shows "
                       "the same length by construction; only a run with real drafts measures it.") if imposed
                 else "Acceptance lengths as the engine counted them.")


@figure("Prompt and output lengths per workload")
def token_histograms(inp: Inputs) -> Drawn | None:
    """The workloads' prompt and output token counts (one point's requests per workload: every point of a
    workload draws the same requests)."""
    pts = _ok(inp.result)
    by_w: dict[str, dict] = {}
    for p in sorted(pts, key=lambda p: p["point_id"]):
        by_w.setdefault(p["workload"], p)
    data = {w: inp.requests_of(p["point_id"]) for w, p in sorted(by_w.items())}
    data = {w: r for w, r in data.items() if r}
    if not data:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    lines = []
    for (w, reqs), color in zip(data.items(), plt.get_cmap("tab10").colors):
        for ax, key in zip(axes, ("prompt_len", "output_len")):
            v = np.array([x[key] for x in reqs if x.get(key) is not None], dtype=float)
            if len(v):
                lo, hi = max(1.0, v.min()), max(v.max(), 2.0)
                if hi <= lo:                     # one length for every request (a fixed output length)
                    lo, hi = lo / 1.25, lo * 1.25
                ax.hist(v, bins=np.geomspace(lo, hi, 30), histtype="step", color=color, label=f"{w} (n={len(v)})")
        pl = np.array([x["prompt_len"] for x in reqs], dtype=float)
        ol = np.array([x["output_len"] for x in reqs], dtype=float)
        lines.append(f"{w}: median prompt {np.median(pl):.0f}, output {np.median(ol):.0f} tokens")
    for ax, what in zip(axes, ("prompt tokens", "output tokens (asked)")):
        ax.set_xscale("log")
        ax.set_xlabel(what, fontsize=8)
        ax.set_ylabel("requests", fontsize=8)
        ax.legend(fontsize=6.5)
    _finish(fig, "Prompt and output lengths per workload")
    return Drawn(fig, "; ".join(lines) + ".")


@figure("Speculative state vs draft-tree size")
def spec_memory_vs_tree(inp: Inputs) -> Drawn | None:
    """Speculative GDN state per request vs draft-tree size, from the strategies' memory accounting."""
    if inp.model is None:
        return None
    model_cfg, engine = inp.model, inp.result["engine"]
    import strategies
    from strategies import DraftTree, GDNShape, MiB

    shape = GDNShape.from_config(model_cfg["gdn"])
    dtype = model_cfg["gdn"]["state_dtype"]
    shapes = [(1, 1, 1), (2, 1, 1), (2, 2, 1), (2, 2, 2), (3, 2, 2), (3, 3, 2), (3, 3, 3)]
    fig, ax = plt.subplots(figsize=(7, 3.8))
    for name in strategies.names():
        xs, ys = [], []
        for w in shapes:
            tree = DraftTree.from_widths(w, root=True)
            strat = strategies.configured(name).fitting(tree)   # its own defaults; a ring one step overflows grown
            if not strat.supports_trees and not tree.is_chain:
                continue
            xs.append(tree.num_drafts)
            ys.append(strat.memory(shape, tree, state_dtype=dtype).speculative_bytes / MiB)
        ax.plot(xs, ys, **_style(name))
    ax.set_xlabel("draft nodes (widths (1,1,1) ... (3,3,3))")
    ax.set_ylabel("speculative state per request (MiB)")
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    ax.set_title(f"Speculative GDN state vs draft-tree size, {model_cfg.get('display_name', '')} "
                 f"({dtype}; the strategies' accounting, not {engine} runs)", fontsize=9)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    return Drawn(fig, "Computed from each strategy's memory accounting (strategies/), not measured in this sweep.")


#: the acceptance gate's tree-width sweep, where `check-acceptance tree_sweep_out=...` (README) records it
TREE_WIDTHS = Path(__file__).resolve().parents[1] / "results" / "acceptance" / "tree_widths.json"


@figure("Acceptance length vs draft tree (the acceptance gate's toy model, not this sweep)")
def acceptance_vs_tree(inp: Inputs, path: Path = TREE_WIDTHS) -> Drawn | None:
    """The acceptance gate's tree-width sweep (results/acceptance/tree_widths.json), if recorded."""
    import json

    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    trees = data["trees"]
    fig, ax = plt.subplots(figsize=(7, 3.6))
    ax.plot([t["drafts"] for t in trees], [t["acceptance_length"] for t in trees], **_style("treewy"))
    for t in trees:
        ax.annotate(f"({t['widths']})", (t["drafts"], t["acceptance_length"]), fontsize=7, textcoords="offset points",
                    xytext=(3, -10))
    ax.set_xlabel("draft nodes")
    ax.set_ylabel("acceptance length")
    ax.set_title(f"Acceptance length vs draft tree: the acceptance gate's tiny toy hybrid ({data['engine']}), "
                 "not this sweep's model", fontsize=9)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    return Drawn(fig, "From results/acceptance/tree_widths.json (python -m harness check-acceptance): a toy model "
                      "with a noisy drafter, shown for the shape of the curve, not for this sweep's numbers.")
