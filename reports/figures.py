"""The report's figures (matplotlib, Agg). Each is one function here, registered with ``@figure(title)``: it
takes the report's :class:`Inputs` and returns a Figure, or None where the store has nothing for it to draw.
The report shows them in the order they are defined. Adding a figure is adding one such function.

Every figure carries the engine in its title ("engine: sim" for simulator results).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from analysis.sweep import memory_order, memory_title  # noqa: E402

COLORS = {"no_spec": "#9e9e9e", "store_all": "#444444", "replay": "#1f77b4", "treewy": "#d62728",
          "treewy_deferred": "#2ca02c",
          "treewy_fused": "#ff9896"}   # the last: kernel benchmark only (TreeWY's commit + verify in one kernel)


@dataclass(frozen=True)
class Inputs:
    """What a figure may draw from: ``result`` (analysis.sweep.analyze's), ``requests_of(point_id)`` (a point's
    request records), ``model`` (the points' model config; None where the store has no point)."""
    result: dict[str, Any]
    requests_of: Callable[[str], list[dict[str, Any]]] = lambda point_id: []
    model: dict[str, Any] | None = None


#: (title, function) of every report figure, in the report's order
FIGURES: list[tuple[str, Callable[[Inputs], "plt.Figure | None"]]] = []


def figure(title: str):
    """Registers ``fn(inputs) -> Figure | None`` as a report figure titled ``title``."""
    def add(fn):
        FIGURES.append((title, fn))
        return fn
    return add


def draw(inputs: Inputs) -> list[tuple[str, "plt.Figure"]]:
    """Every registered figure that has something to draw, with its title."""
    return [(title, f) for title, fn in FIGURES if (f := fn(inputs)) is not None]


def _series(p) -> str:
    """A point's line: its strategy, or ``no_spec`` for speculation off (analysis.sweep.flatten)."""
    return p.get("series") or p["strategy"]


def _ok(result):
    return [p for p in result["points"] if p["status"] == "ok"]


def _engine(result) -> str:
    return f"engine: {result['engine']}"


def _strategies(result) -> list[str]:
    order = list(COLORS)
    names = {_series(p) for p in _ok(result)}
    return sorted(names, key=lambda s: (order.index(s) if s in order else 99, s))


def _grid(n: int):
    cols = min(n, 3)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, axes.flat


def _metric_vs_load(result, panels, value, ylabel: str, title: str, ylog: bool = False) -> plt.Figure:
    """One panel per (workload, memory budget), a line per strategy: ``value(point)`` against the load (None:
    skipped)."""
    pts = _ok(result)
    fig, axes = _grid(len(panels))
    for ax, (w, g) in zip(axes, panels):
        for s in _strategies(result):
            sel = sorted((p["load"], v) for p in pts
                         if p["workload"] == w and p["memory"] == g and _series(p) == s and (v := value(p)) is not None)
            if sel:
                ax.plot(*zip(*sel), marker="o", label=s, color=COLORS.get(s), ls="--" if s == "no_spec" else "-")
        ax.set_title(f"{w}, {memory_title(g)}", fontsize=9)
        ax.set_xscale("log", base=2)
        if ylog:
            ax.set_yscale("log")
        else:
            ax.set_ylim(0, 1.05)
        ax.set_xlabel(_load_name(pts))
        ax.set_ylabel(ylabel)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{title} ({_engine(result)})")
    fig.tight_layout()
    return fig


@figure("Peak KV-pool usage vs load")
def peak_kv_vs_load(inp: Inputs) -> plt.Figure:
    result = inp.result
    panels = sorted({(p["workload"], p["memory"]) for p in _ok(result)},
                    key=lambda wm: (wm[0], memory_order(wm[1])))[:9]
    return _metric_vs_load(result, panels, lambda p: p.get("peak_kv_usage") or 0, "peak KV-pool usage",
                           "Peak KV-pool usage vs load")


@figure("p99 TTFT vs load")
def p99_ttft_vs_load(inp: Inputs) -> plt.Figure:
    result = inp.result
    pts = _ok(result)
    g_min = min((p["memory"] for p in pts), key=memory_order)      # the tightest budget: where TTFT differs most
    panels = [(w, g_min) for w in sorted({p["workload"] for p in pts})[:6]]
    return _metric_vs_load(result, panels, lambda p: p.get("ttft_p99") or None, "p99 TTFT (s)",
                           "p99 time to first token vs load", ylog=True)


@figure("Ratio distributions by regime")
def ratio_distributions(inp: Inputs) -> plt.Figure:
    result = inp.result
    pts = _ok(result)
    base = result["baseline"]
    groups = defaultdict(dict)
    for p in pts:
        groups[(p["workload"], p["memory"], p["load"], p["draft"])][p["strategy"]] = p
    others = [s for s in _strategies(result) if s != base]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, (metric, higher, title) in zip(axes, (("output_throughput", True, "throughput (x)"),
                                                 ("ttft_p99", False, "p99 TTFT (x lower)"))):
        data, labels = [], []
        for s in others:
            for regime in (True, False):
                vals = []
                for by in groups.values():
                    if base in by and s in by and by[base].get("memory_bound") == regime:
                        a, b = by[s].get(metric), by[base].get(metric)
                        if a and b:
                            vals.append(a / b if higher else b / a)
                data.append(vals or [np.nan])
                labels.append(f"{s}\n{'mem-bound' if regime else 'not'}")
        ax.boxplot(data, showfliers=True)
        ax.set_xticks(range(1, len(labels) + 1), labels, fontsize=7, rotation=30)
        ax.axhline(1.0, color="gray", lw=0.8, ls="--")
        ax.set_yscale("log")
        ax.set_title(f"{title} vs {base}", fontsize=9)
    fig.suptitle(f"Ratios to {base} by regime ({_engine(result)})")
    fig.tight_layout()
    return fig


@figure("TTFT CDF at the most memory-bound point")
def ttft_cdf(inp: Inputs) -> plt.Figure:
    """TTFT CDF per strategy at the most memory-bound group (the baseline's most preemptions, then waits)."""
    result, requests_of = inp.result, inp.requests_of
    pts = _ok(result)
    base = result["baseline"]
    cands = [p for p in pts if p["strategy"] == base and _series(p) != "no_spec"]
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    if not cands:
        return fig
    worst = max(cands, key=lambda p: ((p.get("preemptions") or 0), p.get("requests_waited_for_memory") or 0,
                                      p.get("peak_kv_usage") or 0))
    key = (worst["workload"], worst["memory"], worst["load"], worst["draft"])
    for p in pts:
        if (p["workload"], p["memory"], p["load"], p["draft"]) != key:
            continue
        reqs = requests_of(p["point_id"])
        ttft = np.sort([r["first_token_s"] - r["arrival_s"] for r in reqs if r.get("first_token_s") is not None])
        if len(ttft):
            ax.plot(ttft, np.arange(1, len(ttft) + 1) / len(ttft), label=p["strategy"], color=COLORS.get(p["strategy"]))
    ax.set_xscale("log")
    ax.set_xlabel("TTFT (s)")
    ax.set_ylabel("fraction of requests")
    ax.legend(fontsize=8)
    ax.set_title(f"TTFT CDF, most memory-bound point: {key[0]}, {memory_title(key[1])}, {_load_name(pts)} {key[2]:g}\n"
                 f"({_engine(result)})", fontsize=9)
    fig.tight_layout()
    return fig


@figure("Acceptance length per workload")
def acceptance_per_workload(inp: Inputs) -> plt.Figure:
    result = inp.result
    pts = _ok(result)
    workloads_ = sorted({p["workload"] for p in pts})
    strats = [s for s in _strategies(result) if s != "no_spec"]    # no drafts, no acceptance length
    fig, ax = plt.subplots(figsize=(7, 3.4))
    width = 0.8 / max(len(strats), 1)
    for i, s in enumerate(strats):
        vals = [np.nanmean([p.get("acceptance_length") or np.nan for p in pts
                            if p["workload"] == w and _series(p) == s] or [np.nan]) for w in workloads_]
        ax.bar(np.arange(len(workloads_)) + i * width, vals, width, label=s, color=COLORS.get(s))
    ax.set_xticks(np.arange(len(workloads_)) + width * (len(strats) - 1) / 2, workloads_, fontsize=8)
    ax.set_ylabel("mean acceptance length")
    ax.legend(fontsize=7)
    ax.set_title(f"Acceptance length per workload ({_engine(result)})", fontsize=9)
    fig.tight_layout()
    return fig


@figure("Speculative state vs draft-tree size")
def spec_memory_vs_tree(inp: Inputs) -> plt.Figure | None:
    """Speculative GDN state per request vs draft-tree size, from the strategies' memory accounting."""
    if inp.model is None:
        return None
    model_cfg, engine = inp.model, inp.result["engine"]
    import strategies
    from strategies import DraftTree, GDNShape, MiB

    shape = GDNShape.from_config(model_cfg["gdn"])
    dtype = model_cfg["gdn"]["state_dtype"]
    shapes = [(1, 1, 1), (2, 1, 1), (2, 2, 1), (2, 2, 2), (3, 2, 2), (3, 3, 2), (3, 3, 3)]
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    for name in strategies.names():
        xs, ys = [], []
        for w in shapes:
            tree = DraftTree.from_widths(w, root=True)
            strat = strategies.configured(name).fitting(tree)   # its own defaults; a ring one step overflows grown
            if not strat.supports_trees and not tree.is_chain:
                continue
            xs.append(tree.num_drafts)
            ys.append(strat.memory(shape, tree, state_dtype=dtype).speculative_bytes / MiB)
        ax.plot(xs, ys, marker="o", label=name, color=COLORS.get(name))
    ax.set_xlabel("draft nodes (widths (1,1,1) ... (3,3,3))")
    ax.set_ylabel("speculative state per request (MiB)")
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    ax.set_title(f"Speculative GDN state vs draft-tree size, {model_cfg.get('display_name', '')} "
                 f"({dtype}; accounting, not {engine} runs)", fontsize=9)
    fig.tight_layout()
    return fig


def _load_name(pts) -> str:
    kinds = {p["load_kind"] for p in pts}
    return kinds.pop() if len(kinds) == 1 else "load"


#: the acceptance gate's tree-width sweep, where `check-acceptance tree_sweep_out=...` (README) records it
TREE_WIDTHS = Path(__file__).resolve().parents[1] / "results" / "acceptance" / "tree_widths.json"


@figure("Acceptance length vs draft tree (the acceptance gate's tiny hybrid)")
def acceptance_vs_tree(inp: Inputs, path: Path = TREE_WIDTHS) -> plt.Figure | None:
    """The acceptance gate's tree-width sweep (results/acceptance/tree_widths.json), if recorded."""
    import json

    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    trees = data["trees"]
    fig, ax = plt.subplots(figsize=(6.5, 3.4))
    ax.plot([t["drafts"] for t in trees], [t["acceptance_length"] for t in trees], marker="o", color=COLORS["treewy"])
    for t in trees:
        ax.annotate(f"({t['widths']})", (t["drafts"], t["acceptance_length"]), fontsize=7, textcoords="offset points",
                    xytext=(3, -10))
    ax.set_xlabel("draft nodes")
    ax.set_ylabel("acceptance length")
    ax.set_title(f"Acceptance length vs draft tree ({data['engine']})", fontsize=9)
    fig.tight_layout()
    return fig
