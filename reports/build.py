"""``python -m harness report DIR``: report.html (one self-contained file) and report.pdf.

Both hold the same content: the summary, the paper-style table of regime-split ratios, the
figures, the per-point table and the provenance. The HTML embeds its figures as PNG data and
sorts its table by clicking a header; the PDF is made with matplotlib's PDF backend (nothing but
what pip installs).
"""

from __future__ import annotations

import base64
import html
import io
import json
import textwrap
from pathlib import Path
from typing import Any

from analysis.sweep import fmt_ratio, memory_order
from harness.store import atomic_file, atomic_write

from . import figures

COLUMNS = [("point_id", "point"), ("workload", "workload"), ("memory", "memory"), ("load", "load"),
           ("draft", "draft"), ("series", "strategy"), ("status", "status"), ("memory_bound", "mem-bound"),
           ("output_throughput", "out tok/s"), ("ttft_p50", "TTFT p50 s"), ("ttft_p99", "TTFT p99 s"),
           ("tpot_mean", "TPOT s"), ("e2e_mean", "E2E mean s"), ("acceptance_length", "acc. len"),
           ("peak_kv_usage", "peak KV"), ("preemptions", "preempt"), ("max_running", "max running"),
           ("spec_state_bytes", "spec. state MiB")]


def paper_figures() -> list[str]:
    """The TreeWY paper's treewy-vs-store_all figures, one line per scale, from ``conf/scale/*.yaml`` (``paper``:
    the one place they are written; ``bench sim`` prints them beside its own)."""
    from omegaconf import OmegaConf

    from harness.config import conf_dir

    lines = []
    for path in sorted((conf_dir() / "scale").glob("*.yaml")):
        p = OmegaConf.load(path).get("paper")
        if p is None:
            continue
        parts = [f"{p.memory_bound} points memory-bound", f"treewy {p.throughput}x throughput",
                 f"{p.p99_ttft}x lower p99 TTFT"]
        parts += [f"{p.mean_e2e}x lower mean E2E"] if p.get("mean_e2e") else []
        parts += [f"TPOT {p.tpot}x"] if p.get("tpot") else []
        lines.append(f"{p.label}: " + ", ".join(parts))
    return lines


def load_figures() -> None:
    """Imports the module each ``conf/figures/<name>.yaml`` names, so its figures register themselves."""
    from omegaconf import OmegaConf

    from harness.config import conf_dir, import_named

    for path in sorted((conf_dir() / "figures").glob("*.yaml")):
        module = (OmegaConf.load(path) or {}).get("module")
        if not isinstance(module, str):
            raise ValueError(f"conf/figures/{path.name}: needs `module:`, the Python module whose "
                             "@reports.figures.figure functions it adds")
        import_named(module, f"conf/figures/{path.name}")


def make_figures(store, result) -> list[tuple[str, Any]]:
    """The registered figures (reports.figures.FIGURES, and those of conf/figures/) drawn for ``store``'s
    analysis ``result``."""
    load_figures()
    model_cfg = next((s["config"]["model"] for s in store.summaries()), None)
    return figures.draw(figures.Inputs(result, store.requests, model_cfg))


def build_report(store, result: dict[str, Any] | None = None) -> Path:
    if result is None:
        from analysis.sweep import analyze, write_analysis

        result = analyze(store)
        write_analysis(store, result)
    if not any(p["status"] == "ok" for p in result["points"]):
        raise ValueError(f"{store.root}: no finished points to report on; run the sweep first")
    figs = make_figures(store, result)
    prov = next((s.get("provenance") for s in store.summaries() if s.get("provenance")), {})
    # whole or not at all: a kill mid-report leaves the last good report, never half a new one
    atomic_write(store.root / "report.html", render_html(result, figs, prov))
    with atomic_file(store.root / "report.pdf") as tmp:
        write_pdf(tmp, result, figs, prov)
    import matplotlib.pyplot as plt

    for _, fig in figs:
        plt.close(fig)
    return store.root


# -- shared text ----------------------------------------------------------------------

def summary_lines(result: dict[str, Any]) -> list[str]:
    from analysis.sweep import VERDICT_NOTE, graph_line, schedule_line, slo_lines, slo_title, verdict_lines

    c, sweep = result["counts"], result["sweep"]
    return [
        f"engine: {result['engine']}"
        + ("  (simulator results, not GPU measurements)" if result["engine"] == "sim" else ""),
        f"model {sweep.get('model')}, GPU {sweep.get('gpu')}, sweep '{sweep.get('sweep_name')}', baseline "
        f"{result['baseline']}",
        f"{c['points']} points ({c['ok']} ok, {c['failed']} failed) in {c['groups']} (workload, memory budget, load, draft) "
        "groups",
        f"memory-bound ({result['baseline']}'s pool bound the batch: a preemption, or requests waiting for "
        f"blocks with seats free, on vLLM at >= {result['thresholds']['peak_kv_usage']:.0%} KV usage in the same "
        f"/metrics sample): {c['label']}" + (f", {c['unknown']} unknown (no evidence recorded)" if c.get("unknown")
                                             else ""),
    ] + ([line] if (line := graph_line(result)) else []) + [schedule_line(b)
                                                             for b in result.get("behind_schedule") or []] \
        + ([slo_title(result["slo"])] + [f"  {line}" for line in slo_lines(result)] if result.get("slo") else []) \
        + [f"verdict: {line}" for line in verdict_lines(result)] + ([f"({VERDICT_NOTE})"] if result["ratios"] else [])


def ratio_rows(result: dict[str, Any], key: str = "ratios") -> list[list[str]]:
    """The regime-split ratio table: to the baseline (``ratios``) or to speculation off (``vs_no_spec``)."""
    rows = []
    for s, regimes in (result.get(key) or {}).items():
        for regime, row in regimes.items():
            rows.append([s, regime, str(row["points"]), *[fmt_ratio(row[n]) for n in ("throughput", "p99_ttft",
                                                                                 "mean_e2e", "tpot")]])
    return rows


RATIO_HEAD = ["strategy", "regime", "groups", "throughput (x)", "p99 TTFT (x lower)", "mean E2E (x lower)",
              "TPOT (x lower)"]


def _cell(key: str, v) -> str:
    if v is None:
        return ""
    if key == "spec_state_bytes":
        return f"{v / 2**20:.1f}"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)


# -- HTML -------------------------------------------------------------------------------

def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    return base64.b64encode(buf.getvalue()).decode()


def render_html(result: dict[str, Any], figs, prov: dict[str, Any]) -> str:
    e = html.escape
    rows = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>" for r in ratio_rows(result))
    pts = sorted(result["points"], key=lambda p: (p["workload"], memory_order(p["memory"]), p["load"], p["strategy"]))
    body = "".join("<tr>" + "".join(f"<td>{e(_cell(k, p.get(k)))}</td>" for k, _ in COLUMNS) + "</tr>" for p in pts)
    head = "".join(f"<th onclick=\"sortTable({i})\">{e(label)}</th>" for i, (_, label) in enumerate(COLUMNS))
    figs_html = "".join(f"<figure><img alt=\"{e(t)}\" src=\"data:image/png;base64,{_png(f)}\"><figcaption>{e(t)}"
                        "</figcaption></figure>" for t, f in figs)
    paper = "".join(f"<li>{e(line)}</li>" for line in paper_figures())
    fails = "".join(f"<li>{e(f['point_id'])}: {e(str(f['reason']))}</li>" for f in result["failed"])
    fails += "".join(f"<li>{e(d['point_id'])} (damaged, left out; a rerun of the sweep redoes it): "
                     f"{e(str(d['reason']))}</li>" for d in result.get("damaged") or [])
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>CommitBench report</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }}
h1 {{ margin-bottom: 0.2em; }} .engine {{ font-weight: bold; color: #a00; }}
table {{ border-collapse: collapse; font-size: 12px; margin: 1em 0; }}
th, td {{ border: 1px solid #ccc; padding: 3px 6px; text-align: right; }}
th {{ background: #f3f3f3; cursor: pointer; position: sticky; top: 0; }}
td:first-child, th:first-child {{ text-align: left; }}
figure {{ display: inline-block; margin: 0.5em; }} img {{ max-width: 100%; }}
.scroll {{ max-height: 600px; overflow: auto; }}
pre {{ background: #f7f7f7; padding: 0.5em; font-size: 11px; overflow: auto; }}
</style></head><body>
<h1>CommitBench: GDN state-commit strategies under speculative decoding</h1>
<p class="engine">engine: {e(str(result['engine']))}</p>
<ul>{''.join(f'<li>{e(line)}</li>' for line in summary_lines(result))}</ul>
<h2>Ratios to {e(result['baseline'])}, split by regime</h2>
<p>Geometric means over (workload, memory budget, load, draft) groups with bootstrap 95% intervals over those
groups, which are design points, not repeated runs (none below 5 groups: the count instead); latencies as
"x lower" (baseline / strategy), so above 1 is better throughout.</p>
<table><thead><tr>{''.join(f'<th>{e(h)}</th>' for h in RATIO_HEAD)}</tr></thead><tbody>{rows}</tbody></table>
<p>The TreeWY paper's figures for treewy vs store_all in memory-bound points (B200, measured):</p><ul>{paper}</ul>
{_no_spec_html(result)}
{_anchor_html(result)}
{_side_html(result)}
<h2>Figures</h2>{figs_html}
<h2>Points</h2><p>Click a column header to sort.</p>
<div class="scroll"><table id="points"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>
{f'<h2>Failed points</h2><ul>{fails}</ul>' if fails else ''}
<h2>Provenance</h2><pre>{e(json.dumps(prov, indent=1))}</pre>
<h2>Sweep configuration</h2><pre>{e(json.dumps(result['sweep'], indent=1, default=str))}</pre>
<script>
function sortTable(col) {{
  const table = document.getElementById("points");
  const body = table.tBodies[0];
  const rows = Array.from(body.rows);
  const asc = table.dataset.col == col && table.dataset.dir != "asc";
  rows.sort((a, b) => {{
    const x = a.cells[col].textContent, y = b.cells[col].textContent;
    const nx = parseFloat(x), ny = parseFloat(y);
    const c = (!isNaN(nx) && !isNaN(ny)) ? nx - ny : x.localeCompare(y);
    return asc ? c : -c;
  }});
  rows.forEach(r => body.appendChild(r));
  table.dataset.col = col;
  table.dataset.dir = asc ? "asc" : "desc";
}}
</script>
</body></html>
"""


ANCHOR_HEAD = ["call", "measured as", "status", "time (UTC)", "host", "points in call", "output tok/s",
               "TPOT ms", "p99 TTFT s"]


def anchor_rows(result: dict[str, Any]) -> list[list[str]]:
    """One row per measurement of the sweep's anchor point (empty without one)."""
    a = result.get("anchor") or {}
    rows = []
    for m in a.get("measurements", []):
        num = lambda v, scale=1.0, f="{:.1f}": "" if v is None else f.format(v * scale)
        rows.append([str(m["call"] or "-"), m["what"], str(m["status"]), str(m["time_utc"] or ""), str(m["host"] or ""),
                     str(m["points_in_call"]), num(m.get("output_throughput"), f="{:.0f}"),
                     num(m.get("tpot_mean"), 1e3), num(m.get("ttft_p99"), f="{:.2f}")])
    return rows


def _anchor_html(result: dict[str, Any]) -> str:
    from analysis.sweep import anchor_line

    rows = anchor_rows(result)
    if not rows:
        return ""
    e = html.escape
    others = result["anchor"].get("other_points") or []
    note = (f" anchors/ also holds {', '.join(others)}, re-measured while another anchor was set; not counted."
            if others else "")
    return (f"<h2>Drift between sweep commands</h2><p>{e(anchor_line(result['anchor']))}. The anchor point runs "
            "first in every command of the campaign; from the second on it is measured again (anchors/ in the "
            f"result folder), and the grid keeps its first measurement.{e(note)}</p>" + _html_table(ANCHOR_HEAD, rows))


SIDE_HEAD = ["point", "its call vs the baseline's", "throughput (x)", "adjusted (x)", "p99 TTFT (x lower)",
             "running (x)", "step (x)"]
SIDE_NOTE = ("Each point beside the baseline's at the same workload, memory budget and load, with the sweep command each "
             "ran in. Where they differ, the measured ratio carries the drift between the two commands; "
             "'adjusted' divides each point's throughput by the anchor's in its own command first, which assumes "
             "that the drift scales every point of a command alike (not checked). The measured ratio is the result. "
             "'running' is the point's mean number of running requests over the baseline's, 'step' its mean "
             "inter-token gap (one engine step) over the baseline's: throughput follows running / step (times "
             "the tokens a step commits per request), so a strategy that runs more requests gains only as far as "
             "the step does not grow with them.")


def side_rows(result: dict[str, Any]) -> list[list[str]]:
    """The side-by-side table's rows (empty without an anchor)."""
    from analysis.sweep import side_by_side_cells

    return [side_by_side_cells(r) for r in result.get("side_by_side") or []]


def _side_html(result: dict[str, Any]) -> str:
    rows = side_rows(result)
    if not rows:
        return ""
    return (f"<h2>Each point beside {html.escape(result['baseline'])}</h2><p>{html.escape(SIDE_NOTE)}</p>"
            + _html_table(SIDE_HEAD, rows))


def _html_table(head: list[str], rows: list[list[str]]) -> str:
    """A plain table of escaped cells (the HTML twin of the PDF's :func:`_table_page`)."""
    e = html.escape
    body = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>" for r in rows)
    return (f"<table><thead><tr>{''.join(f'<th>{e(h)}</th>' for h in head)}</tr></thead><tbody>{body}"
            "</tbody></table>")


def _no_spec_html(result: dict[str, Any]) -> str:
    rows = ratio_rows(result, "vs_no_spec")
    if not rows:
        return ""
    return ("<h2>Ratios to speculation off</h2><p>Each strategy under speculation, store_all included, against "
            "the same (workload, memory budget, load) with speculation off (draft=none), split by the speculative group's "
            "regime: whether to speculate at all.</p>" + _html_table(RATIO_HEAD, rows))


# -- PDF -------------------------------------------------------------------------------

def _table_page(pdf, title: str, rows: list[list[str]], head: list[str], note: str | None = None) -> None:
    """One A4-landscape page: a title, an optional line under it, and a table."""
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(11.7, 8.3))
    fig.text(0.05, 0.93, title, fontsize=12, weight="bold")
    # wrapped here, hanging from under the title: matplotlib's wrap=True grows a long note upward into it
    lines = textwrap.wrap(note, 170) if note else []
    if lines:
        fig.text(0.05, 0.905, "\n".join(lines), fontsize=8, va="top")
    top = 0.885 - 0.017 * len(lines)
    ax = fig.add_axes([0.05, 0.08, 0.9, top - 0.08])
    ax.axis("off")
    # the first column (a point id) as wide as its longest cell, within reason; the rest share what is left
    first = min(0.4, max(0.12, 0.0062 * max(len(str(r[0])) for r in [head, *rows])))
    widths = [first] + [(1 - first) / (len(head) - 1)] * (len(head) - 1) if len(head) > 1 else None
    tbl = ax.table(cellText=rows, colLabels=head, loc="upper center", cellLoc="center", colWidths=widths)
    tbl.auto_set_font_size(False)
    tbl.set_fontsize(8)
    tbl.scale(1, 1.4)
    pdf.savefig(fig)
    plt.close(fig)


def write_pdf(path: Path, result: dict[str, Any], figs, prov: dict[str, Any]) -> None:
    import matplotlib.pyplot as plt
    from matplotlib.backends.backend_pdf import PdfPages

    with PdfPages(path) as pdf:
        import textwrap

        fig = plt.figure(figsize=(11.7, 8.3))
        fig.text(0.05, 0.93, "CommitBench: GDN state-commit strategies under speculative decoding", fontsize=15,
                 weight="bold")
        head, *rest = summary_lines(result)
        fig.text(0.05, 0.895, head, fontsize=12, color="#a00", weight="bold")   # engine, and "simulator" where so
        # every line of the summary (setup, memory-bound, goodput, verdicts), wrapped, spaced to fit the page
        lines = [part for line in rest for part in textwrap.wrap(line, 140, subsequent_indent="    ") or [""]]
        step = min(0.03, 0.8 / max(len(lines), 1))
        for i, line in enumerate(lines):
            fig.text(0.05, 0.86 - step * i, line, fontsize=9 if step >= 0.025 else 7)
        pdf.savefig(fig)
        plt.close(fig)
        fig = plt.figure(figsize=(11.7, 8.3))
        fig.text(0.05, 0.93, f"Ratios to {result['baseline']} — engine: {result['engine']}", fontsize=13, weight="bold")
        ax = fig.add_axes([0.05, 0.25, 0.9, 0.6])
        ax.axis("off")
        rows = ratio_rows(result) or [["-"] * len(RATIO_HEAD)]
        tbl = ax.table(cellText=rows, colLabels=RATIO_HEAD, loc="upper center", cellLoc="center")
        tbl.auto_set_font_size(False)
        tbl.set_fontsize(8)
        tbl.scale(1, 1.4)
        fig.text(0.05, 0.2, "Geometric means with bootstrap 95% intervals over the groups (design points, not "
                 "repeated runs; none below 5 groups: n= instead); latencies as 'x lower' (baseline / "
                 "strategy). The TreeWY paper (B200, measured): " + "; ".join(paper_figures()) + ".",
                 fontsize=8, wrap=True)
        keys = ("git_commit", "torch", "vllm", "gpu", "time_utc")
        fig.text(0.05, 0.12, f"provenance: {json.dumps({k: prov.get(k) for k in keys})}", fontsize=7)
        pdf.savefig(fig)
        plt.close(fig)
        if no_spec := ratio_rows(result, "vs_no_spec"):
            _table_page(pdf, f"Ratios to speculation off (draft=none) — engine: {result['engine']}", no_spec,
                        RATIO_HEAD)
        if drift_rows := anchor_rows(result):
            from analysis.sweep import anchor_line

            _table_page(pdf, f"Drift between sweep commands — engine: {result['engine']}", drift_rows,
                        ANCHOR_HEAD, note=anchor_line(result["anchor"]))
        if pairs := side_rows(result):
            _table_page(pdf, f"Each point beside {result['baseline']} — engine: {result['engine']}", pairs,
                        SIDE_HEAD, note=SIDE_NOTE)
        for _, f in figs:
            pdf.savefig(f)
        pts = sorted(result["points"], key=lambda p: (p["workload"], memory_order(p["memory"]), p["load"], p["strategy"]))
        keys = [k for k, _ in COLUMNS[1:]]
        for start in range(0, len(pts), 40):
            fig = plt.figure(figsize=(11.7, 8.3))
            ax = fig.add_axes([0.02, 0.02, 0.96, 0.93])
            ax.axis("off")
            ax.set_title(f"points {start + 1}-{min(start + 40, len(pts))} of {len(pts)} (engine: {result['engine']})",
                         fontsize=9)
            cells = [[_cell(k, p.get(k)) for k in keys] for p in pts[start:start + 40]]
            tbl = ax.table(cellText=cells, colLabels=[label for _, label in COLUMNS[1:]], loc="upper center")
            tbl.auto_set_font_size(False)
            tbl.set_fontsize(5.5)
            tbl.scale(1, 1.05)
            pdf.savefig(fig)
            plt.close(fig)
