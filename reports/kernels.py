"""The kernel benchmark's report: figures and tables of ``python -m harness bench kernels`` results.

``write_report(result, path)`` writes one self-contained HTML file (figures inlined as PNG);
``python -m harness report DIR`` builds it for every ``*.json`` kernel result in a folder.
"""

from __future__ import annotations

import html
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from harness.store import atomic_write

from .build import _png
from .figures import COLORS, _style, plt

OVER_COPY = ("Above 100%: the op moved its bytes faster than the copy measured in the same run (a read + write "
             "stream); a kernel that mostly writes, or whose reads hit L2, can. The fraction is against that copy, "
             "not against the datasheet.")


def _ticks(ax, values) -> None:
    """Log axis ticked at the values measured (no overlapping 10^k labels)."""
    v = sorted({x for x in values if x})
    ax.set_xticks(v, [f"{x:g}" for x in v], fontsize=7)
    ax.minorticks_off()


def _title(result, text: str) -> str:
    return f"{text}\n{result['device']} — engine: {result['engine']}"


def step_vs_nodes(result: dict[str, Any]) -> plt.Figure:
    """Verify + commit per layer against draft nodes N, one panel per batch, a line per strategy."""
    batches = sorted({r["batch"] for r in result["rows"]})
    fig, axes = plt.subplots(1, len(batches), figsize=(4.2 * len(batches), 3.4), squeeze=False)
    for ax, B in zip(axes.flat, batches):
        lines = defaultdict(list)
        for r in result["rows"]:
            if r["batch"] == B:
                lines[r["strategy"]].append((r["nodes"], 1e6 * r["step_s"]))
        for name, pts in lines.items():
            pts.sort()
            ax.plot(*zip(*pts), **_style(name))
        ax.set(xscale="log", yscale="log", xlabel="draft nodes N", ylabel="verify + commit, µs per layer",
               title=f"batch {B}")
        _ticks(ax, [r["nodes"] for r in result["rows"] if r["batch"] == B])
        ax.legend(fontsize=8)
    fig.suptitle(_title(result, "Time per speculative step"), fontsize=9)
    fig.tight_layout()
    return fig


def bandwidth_fraction(result: dict[str, Any]) -> plt.Figure:
    """Achieved / copy bandwidth of verify and commit at the largest batch, per draft and strategy."""
    B = max(r["batch"] for r in result["rows"])
    rows = [r for r in result["rows"] if r["batch"] == B]
    labels = sorted({(r["nodes"], r["draft"]) for r in rows})
    names = [n for n in COLORS if any(r["strategy"] == n for r in rows)]
    fig, axes = plt.subplots(1, 2, figsize=(9.5, 3.4))
    width = 0.8 / max(1, len(names))
    for ax, part in zip(axes, ("verify", "commit")):
        for j, name in enumerate(names):
            xs, ys = [], []
            for i, (_, d) in enumerate(labels):
                hit = [r for r in rows if r["strategy"] == name and r["draft"] == d]
                if hit and hit[0][f"{part}_bytes"] > 64:
                    xs.append(i + j * width)
                    ys.append(100 * hit[0][f"{part}_fraction_of_copy"])
            ax.bar(xs, ys, width, label=name, color=COLORS.get(name))
        ax.axhline(60, color="#999", lw=0.8, ls="--")
        ax.axhline(100, color="#c00", lw=0.8, ls=":")
        ax.set_xticks([i + width * (len(names) - 1) / 2 for i in range(len(labels))],
                      [f"N={n}" for n, _ in labels], fontsize=7)
        ax.set(ylabel="% of copy bandwidth", title=f"{part}, batch {B}")
        ax.legend(fontsize=7)
    fig.suptitle(_title(result, f"Achieved bandwidth (copy: {result['copy_bandwidth'] / 1e9:,.0f} GB/s)"), fontsize=9)
    fig.tight_layout()
    return fig


def solve_vs_nodes(result: dict[str, Any]) -> plt.Figure:
    """TreeWY's verify with and without the solve, store_all's verify, against N (chains)."""
    rows = sorted(result["solve"], key=lambda r: r["nodes"])
    n = [r["nodes"] for r in rows]
    fig, ax = plt.subplots(figsize=(5.2, 3.6))
    ax.plot(n, [1e6 * r["treewy_verify_s"] for r in rows], marker="o", color=COLORS["treewy"], label="treewy verify")
    ax.plot(n, [1e6 * r["treewy_verify_nosolve_s"] for r in rows], marker="o", ls="--", color=COLORS["treewy"],
            label="treewy verify without the solve")
    ax.plot(n, [1e6 * r["solve_s"] for r in rows], marker="s", color="#ff7f0e", label="the solve (substitution)")
    if all("solve_doubling_s" in r for r in rows):   # results of 598b26b's kernels, which had a doubling solve
        ax.plot(n, [1e6 * r["solve_doubling_s"] for r in rows], marker="s", ls=":", color="#ff7f0e",
                label="the solve (doubling)")
    ax.plot(n, [1e6 * r["store_all_verify_s"] for r in rows], marker="o", color=COLORS["store_all"],
            label="store_all verify")
    ax.set(xscale="log", yscale="log", xlabel="chain nodes N", ylabel="µs per layer",
           title=_title(result, f"TreeWY's triangular solve, batch {rows[0]['batch']}"))
    _ticks(ax, n)
    ax.title.set_fontsize(9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def layer_vs_batch(result: dict[str, Any]) -> plt.Figure:
    """One layer's speculative branch against batch, one panel per chain, a line per op: vLLM's own
    store_all kernel and each strategy's op as the plugin runs it (graph replays where captured)."""
    rows = result["layer"]["rows"]
    drafts = sorted({(r["nodes"], r["draft"]) for r in rows})
    fig, axes = plt.subplots(1, len(drafts), figsize=(4.2 * len(drafts), 3.4), squeeze=False)
    for ax, (N, d) in zip(axes.flat, drafts):
        lines = defaultdict(list)
        for r in rows:
            if r["draft"] == d:
                t = r["graph_s"] if r["graph_s"] is not None else r["eager_s"]
                lines[r["strategy"]].append((r["batch"], 1e6 * t))
        for name, pts in lines.items():
            pts.sort()
            st = _style("store_all" if name == "vllm_store_all" else name)
            st.update(label=name, ls="--" if name == "vllm_store_all" else st["ls"])
            ax.plot(*zip(*pts), **st)
        ax.set(xscale="log", yscale="log", xlabel="batch (requests)", ylabel="µs per layer and step",
               title=f"{d} (N={N})")
        _ticks(ax, [r["batch"] for r in rows if r["draft"] == d])
        ax.legend(fontsize=7)
    fig.suptitle(_title(result, "One layer's speculative branch as vLLM runs it"), fontsize=9)
    fig.tight_layout()
    return fig


def forks_vs_batch(result: dict[str, Any]) -> plt.Figure:
    """store_all's verify node by node and depth by depth against batch, one panel per tree; and the forks' share
    of the measured 35B step."""
    rows = result["forks"]["rows"]
    drafts = list(dict.fromkeys(r["draft"] for r in rows))
    fig, axes = plt.subplots(1, len(drafts) + 1, figsize=(3.8 * (len(drafts) + 1), 3.4), squeeze=False)
    for ax, d in zip(axes.flat, drafts):
        for fork, style in (("node", "-o"), ("depth", "--s")):
            pts = sorted((r["batch"], 1e6 * r["verify_s"]) for r in rows if r["draft"] == d and r["fork"] == fork)
            if pts:
                ax.plot(*zip(*pts), style, label=f"fork: {fork}")
        n = next(r["nodes"] for r in rows if r["draft"] == d)
        ax.set(xscale="log", yscale="log", xlabel="batch", ylabel="store_all verify, µs per layer",
               title=f"{d} (N={n})")
        _ticks(ax, [r["batch"] for r in rows if r["draft"] == d])
        ax.legend(fontsize=8)
    ax = axes.flat[-1]
    for d in drafts:
        for fork, style in (("node", "-o"), ("depth", "--s")):
            pts = sorted((r["batch"], 100 * r["fork_fraction_of_step"]) for r in rows
                         if r["draft"] == d and r["fork"] == fork and r.get("fork_fraction_of_step") is not None)
            if pts:
                ax.plot(*zip(*pts), style, label=f"{d} {fork}")
    ax.axhline(2, color="grey", lw=0.8)
    ax.text(1, 2.3, "write-up: < 2%", fontsize=7, color="grey")
    ax.set(xscale="log", yscale="log", xlabel="batch", ylabel="forks per step, % of the measured step",
           title="the forks' share of a step at its batch")
    _ticks(ax, [r["batch"] for r in rows])
    ax.legend(fontsize=6)
    fig.suptitle(_title(result, "store_all's forks: node by node vs depth by depth"), fontsize=9)
    fig.tight_layout()
    return fig


def _forks_table(result: dict[str, Any]) -> str:
    e = html.escape
    parts = []
    rows = (result.get("forks") or {}).get("rows") or []
    if rows:
        ref = result["forks"].get("step_reference") or {}
        head = ["draft", "N", "batch", "fork", "verify µs", "without snapshots µs", "forks µs", "forks per step ms",
                "µs per fork", "measured step ms (batch)", "% of step"]
        body = "".join("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in (
            r["draft"], r["nodes"], r["batch"], r["fork"], f"{1e6 * r['verify_s']:.1f}",
            f"{1e6 * r['verify_nostore_s']:.1f}", f"{1e6 * r['fork_s']:.1f}", f"{1e3 * r['fork_step_s']:.2f}",
            f"{r['fork_per_node_us']:.1f}" if r.get("fork_per_node_us") is not None else "–",
            "–" if r.get("step_s") is None else f"{1e3 * r['step_s']:.1f} ({r['step_running']:.0f})",
            "–" if r.get("fork_fraction_of_step") is None else f"{100 * r['fork_fraction_of_step']:.1f}"))
            + "</tr>" for r in rows)
        parts.append(f"<h2>store_all's forks</h2><p>Forks = verify minus the same kernel without its snapshot writes "
                     f"(their marginal cost); per step = x {result['num_layers']} GDN layers, against the measured "
                     f"store_all step of {e(str(ref.get('folder')))} at the same batch, within 1.5x (TPOT x "
                     "acceptance length); µs per fork: one node of one request, every GDN layer.</p>"
                     f"<table><tr>{''.join(f'<th>{h}</th>' for h in head)}</tr>{body}</table>")
    rows = (result.get("selective") or {}).get("rows") or []
    if rows:
        head = ["draft", "N", "batch", "kept %", "verify µs", "store_all verify µs", "commit µs",
                "store_all commit µs", "recoveries %", "redone", "step x store_all"]
        body = "".join("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in (
            r["draft"], r["nodes"], r["batch"], f"{100 * r['kept_fraction']:.0f}",
            f"{1e6 * r['store_selective_verify_s']:.1f}", f"{1e6 * r['store_all_verify_s']:.1f}",
            f"{1e6 * r['store_selective_commit_s']:.1f}", f"{1e6 * r['store_all_commit_s']:.1f}",
            f"{100 * r['recovery_fraction']:.0f}", f"{r['redone_per_recovery']:.2f}", f"{r['step_ratio']:.2f}"))
            + "</tr>" for r in rows)
        parts.append("<h2>store_selective's kernels</h2><p>Confidences and accepted nodes drawn from the measured "
                     f"profile ({e(str(rows[0].get('profile')))}), threshold {rows[0].get('threshold')}.</p>"
                     f"<table><tr>{''.join(f'<th>{h}</th>' for h in head)}</tr>{body}</table>")
    return "".join(parts)


def _layer_table(result: dict[str, Any]) -> str:
    e = html.escape
    rows = result.get("layer", {}).get("rows", [])
    if not rows:
        return ""
    head = ["draft", "N", "batch", "op", "eager µs", "graph µs", "x vLLM eager", "x vLLM graph", "states moved",
            "% of copy"]

    def f(x, fmt):
        return "–" if x is None else format(x, fmt)

    body = "".join("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in (
        r["draft"], r["nodes"], r["batch"], r["strategy"], f(1e6 * r["eager_s"], ".1f"),
        f(None if r["graph_s"] is None else 1e6 * r["graph_s"], ".1f"), f(r.get("eager_vs_vllm"), ".2f"),
        f(r.get("graph_vs_vllm"), ".2f"), f(r["states_moved"], ".2f"), f(100 * r["fraction_of_copy"], ".0f")))
        + "</tr>" for r in rows)
    where = result["layer"].get("vllm_kernel") or {}
    src = (f"vLLM's kernel: {where['module']} (vLLM {where.get('vllm')})" if "module" in where
           else f"vLLM's kernel not measured: {where.get('missing', 'unknown')}")
    return (f"<h2>One layer's speculative branch as vLLM runs it</h2><p>{e(src)}. Eager: CUDA events around "
            "each call (host syncs and launch gaps included); graph: replays of a CUDA graph of one call, where "
            "the op can be captured.</p>"
            f"<table><tr>{''.join(f'<th>{h}</th>' for h in head)}</tr>{body}</table>")


def write_report(result: dict[str, Any], path: Path) -> Path:
    e = html.escape
    figs = []
    if result.get("layer", {}).get("rows"):
        figs.append(("One layer in vLLM", layer_vs_batch(result)))
    if result["rows"]:
        figs += [("Time per step", step_vs_nodes(result)), ("Bandwidth", bandwidth_fraction(result))]
    if result["solve"]:
        figs.append(("Solve", solve_vs_nodes(result)))
    if (result.get("forks") or {}).get("rows"):
        figs.append(("Forks", forks_vs_batch(result)))
    over = any(max(r.get("verify_fraction_of_copy") or 0, r.get("commit_fraction_of_copy") or 0) > 1
               for r in result["rows"]) or any((r.get("fraction_of_copy") or 0) > 1
                                               for r in result.get("layer", {}).get("rows", []))
    notes = {"Bandwidth": OVER_COPY} if over else {}
    imgs = "".join(f'<figure><img alt="{e(t)}" src="data:image/png;base64,{_png(f)}">'
                   + (f"<figcaption>{e(notes[t])}</figcaption>" if t in notes else "") + "</figure>" for t, f in figs)
    for _, f in figs:
        plt.close(f)
    head = ["draft", "N", "batch", "strategy", "verify µs", "commit µs", "states moved", "verify %", "commit %",
            "spec. MiB/req"]
    body = "".join(
        "<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in (
            r["draft"], r["nodes"], r["batch"], r["strategy"], f"{1e6 * r['verify_s']:.1f}",
            f"{1e6 * r['commit_s']:.1f}", f"{r.get('states_moved', float('nan')):.2f}",
            f"{100 * r['verify_fraction_of_copy']:.0f}",
            f"{100 * r['commit_fraction_of_copy']:.0f}",
            f"{r['speculative_bytes_per_request'] / 2 ** 20:.1f}")) + "</tr>"
        for r in result["rows"])
    n = result["crossover_nodes"]
    cross = ("" if not result["solve"] else f"TreeWY's verify costs more than store_all's from N = {n}." if n
             else "TreeWY's verify stays cheaper than store_all's at every N measured.")
    prov = result.get("provenance", {})
    tiles = result.get("tiles") or {}
    tiles_txt = ("Tiles (value columns per program / warps, tuned per strategy): "
                 + ", ".join(f"{n} {t['block_v']}/{t['num_warps']}" for n, t in tiles.items()) + ".") if tiles else ""
    body_rows = body
    doc = f"""<!doctype html><html><head><meta charset="utf-8"><title>CommitBench kernels</title>
<style>body{{font-family:sans-serif;max-width:1100px;margin:2em auto}}td,th{{padding:2px 8px;text-align:right}}
img{{max-width:100%}}</style></head><body>
<h1>Strategy kernels — engine: {e(result['engine'])}</h1>
<p>{e(result['device'])}; one GDN layer (H={result['shape']['H']}, HV={result['shape']['HV']},
K={result['shape']['K']}, V={result['shape']['V']}), x{result['num_layers']} for the model.
Copy bandwidth measured in the same run: {result['copy_bandwidth'] / 1e9:,.0f} GB/s (read + write).
{e(cross)} {e(tiles_txt)}
Triton {e(str(result.get('triton')))}, torch {e(str(prov.get('torch')))}, commit {e(str(prov.get('git_commit')))}.</p>
{imgs}
{f"<p>{e(OVER_COPY)}</p>" if over else ""}
{_layer_table(result)}
{_forks_table(result)}
{"<table><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>" + body_rows + "</table>" if body_rows else ""}
</body></html>"""
    atomic_write(path, doc)     # as the sweep's report: never half a page where a good one was
    return path


def is_kernel_result(path: Path) -> bool:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and "copy_bandwidth" in data and "solve" in data
