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

from analysis.metrics import METRICS, Percentiles
from analysis.sweep import fmt_ratio, interval_word, memory_order
from harness.store import atomic_file, atomic_write

from . import figures


def _fmt(kind: str, v) -> str:
    if v is None or (isinstance(v, float) and v != v):
        return ""
    if kind == "text":
        return "yes" if v is True else "no" if v is False else str(v)
    if kind == "regime":
        return {True: "mem-bound", False: "not", None: "unknown"}.get(v, str(v))
    if kind == "int":
        return f"{v:,.0f}"
    if kind == "ms":
        return f"{v * 1e3:,.1f}"
    if kind == "pct":
        return f"{v * 100:.0f}"
    if kind == "pct1":
        return f"{v * 100:.1f}"
    if kind == "mib":
        return f"{v / 2**20:,.1f}"
    if kind == "f1":
        return f"{v:,.1f}"
    return f"{v:,.2f}"      # f2, s


def columns(result: dict[str, Any], pct: Percentiles = Percentiles()) -> list[tuple[str, str, str]]:
    """The points table's columns: (row key, header with its unit, format kind)."""
    cols = [("point_id", "point", "text"), ("workload", "workload", "text"), ("memory", "memory", "text"),
            ("load", "load", "text"), ("draft", "draft", "text"), ("series", "strategy", "text"),
            ("status", "status", "text"),
            ("memory_bound", "group regime (baseline's pool)", "regime"),
            ("requests", "requests", "int"), ("failed", "failed", "int"), ("duration_s", "duration s", "f1"),
            ("output_throughput", "out tok/s", "int"), ("request_throughput", "req/s", "f2"),
            ("goodput", "goodput req/s", "f2")]
    for m in pct.metrics:
        prefix, label, unit = METRICS[m]
        cols.append((f"{prefix}_mean", f"{label} mean {unit}", "ms" if unit == "ms" else "f2"))
        cols += [(f"{prefix}_p{v:g}", f"{label} p{v:g} {unit}", "ms" if unit == "ms" else "f2") for v in pct.values]
    if any((p.get("repeats") or 1) > 1 for p in result["points"]):      # repeats=N: the mean and its spread
        cols[8:8] = [("repeats", "runs", "int"), ("runs_failed", "runs failed", "int"),
                     ("output_throughput_spread", "out tok/s spread %", "pct1"),
                     ("ttft_p99_spread", "p99 TTFT spread %", "pct1")]
    cols += [("acceptance_length", "acc. len", "f2"), ("peak_kv_usage", "peak KV %", "pct"),
             ("preemptions", "preempt", "int"), ("max_running", "max running", "int"),
             ("mean_running", "mean running", "f1"),
             ("queued_for_memory_s", "queued for memory, request-s", "f1")]
    if any(p.get("spec_state_bytes") for p in result["points"]):
        cols.append(("spec_state_bytes", "spec. state MiB", "mib"))
    return cols


#: kept for code that asks which columns exist (key, header)
COLUMNS = [(k, label) for k, label, _ in columns({"points": []})]

LATENCY_NOTE = ("Latencies as vllm bench serve defines them: TTFT = first streamed token - request sent; TPOT = "
                "(E2E - TTFT) / (output tokens - 1) per request, then averaged or ranked over requests; ITL = the gap "
                "between consecutive streamed chunks over every request's chunks (under speculative decoding one chunk "
                "can carry several accepted tokens, so ITL is one engine step, not one token); E2E = last token - "
                "request sent. Percentiles are over the requests of one run: with N requests, p99 is about the "
                "N/100-th worst one (with repeats=N, a point shows the mean over its runs of each run's "
                "percentile). Goodput: requests per second meeting every SLO, over the run's duration.")


def published_rows() -> list[dict[str, Any]]:
    """Published ratios to print beside the report's own, as rows of its ratio table: the TreeWY paper's per scale
    (conf/scale/*.yaml ``paper``) and every conf/published/*.yaml (ReplaySSM's vLLM PR, ...)."""
    from omegaconf import OmegaConf

    from harness.config import conf_dir

    rows = []
    for path in sorted((conf_dir() / "scale").glob("*.yaml")):
        p = OmegaConf.load(path).get("paper")
        if p is not None:
            rows.append({"strategy": "treewy", "source": f"TreeWY paper: {p.label}, measured",
                         "regime": f"memory-bound ({p.memory_bound} points)", "throughput": p.throughput,
                         "p99_ttft": p.p99_ttft, "mean_e2e": p.get("mean_e2e"), "tpot": p.get("tpot")})
    pub = conf_dir() / "published"
    for path in sorted(pub.glob("*.yaml")) if pub.is_dir() else []:
        p = OmegaConf.to_container(OmegaConf.load(path))
        rows.append({"strategy": p["strategy"], "source": p["label"], "regime": p["regime"],
                     **{k: p.get(k) for k in ("throughput", "p99_ttft", "mean_e2e", "tpot")}})
    return rows


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


def make_figures(store, result) -> list[tuple[str, Any, str]]:
    """The registered figures (reports.figures.FIGURES, and those of conf/figures/) drawn for ``store``'s
    analysis ``result``: (title, figure, caption)."""
    load_figures()
    model_cfg = next((s["config"]["model"] for s in store.summaries()), None)
    summary_of = getattr(store, "summary", lambda pid: {})
    return figures.draw(figures.Inputs(result, store.requests, model_cfg, summary_of))


def build_report(store, result: dict[str, Any] | None = None, percentiles: Percentiles | None = None) -> Path:
    """report.html, report.pdf, bench_serve.json and points.csv in ``store.root`` (a sweep folder, or the ``out``
    of a report of several folders)."""
    from .export import write_exports

    pct = percentiles or Percentiles()
    if result is None:
        from analysis.sweep import analyze, write_analysis

        result = analyze(store)
        write_analysis(store, result)
    if not any(p["status"] == "ok" for p in result["points"]):
        raise ValueError(f"{store.root}: no finished points to report on; run the sweep first")
    figs = make_figures(store, result)
    prov = next((s.get("provenance") for s in store.summaries() if s.get("provenance")), {})
    # whole or not at all: a kill mid-report leaves the last good report, never half a new one
    atomic_write(store.root / "report.html", render_html(result, figs, prov, pct))
    with atomic_file(store.root / "report.pdf") as tmp:
        write_pdf(tmp, result, figs, prov, pct)
    write_exports(store.root, result, list(pct.values))
    import matplotlib.pyplot as plt

    for _, fig, _ in figs:
        plt.close(fig)
    return store.root


# -- shared text ----------------------------------------------------------------------

def summary_lines(result: dict[str, Any]) -> list[str]:
    from analysis.setup import setup_line
    from analysis.sweep import VERDICT_NOTE, graph_line, schedule_line, slo_lines, slo_title, verdict_lines

    c, sweep = result["counts"], result["sweep"]
    folders = sweep.get("folders")
    return [
        f"engine: {result['engine']}"
        + ("  (simulator results, not GPU measurements)" if result["engine"] == "sim" else ""),
    ] + ([line] if (line := setup_line(result.get("setup"))) else []) + [
        f"model {sweep.get('model')}, sweep '{sweep.get('sweep_name')}', baseline {result['baseline']}"
        + (f"; points of {len(folders)} folders: {', '.join(folders)}" if folders else ""),
        (f"{c['points']} points ({c['ok']} ok, {c['failed']} failed)" if c.get("repeats", 1) == 1 else
         f"{c['ok']} design points, each the mean of up to {c['repeats']} repeated runs ({c['runs']} runs, "
         f"{c['failed']} failed; the points table gives each one's spread (max - min) / mean)")
        + f" in {c['groups']} (workload, memory budget, load, draft) groups",
        f"memory-bound ({result['baseline']}'s pool bound the batch: a preemption, or requests waiting for "
        f"blocks with seats free, on vLLM at >= {result['thresholds']['peak_kv_usage']:.0%} KV usage in the same "
        f"/metrics sample): {c['memory_bound']}/{c['groups']}" + (f" ({c['unknown']} unknown: no evidence recorded)"
                                                                 if c.get("unknown") else ""),
    ] + ([line] if (line := graph_line(result)) else []) + [schedule_line(b)
                                                             for b in result.get("behind_schedule") or []] \
        + [f"verdict: {line}" for line in verdict_lines(result)] + ([f"({VERDICT_NOTE})"] if result["ratios"] else []) \
        + ([slo_title(result["slo"])] + [f"  {line}" for line in slo_lines(result)] if result.get("slo") else [])


RATIO_KEYS = ("throughput", "p99_ttft", "mean_e2e", "tpot")
RATIO_HEAD = ["strategy", "regime", "groups", "throughput (x)", "p99 TTFT (x lower)", "mean E2E (x lower)",
              "TPOT (x lower)"]


#: a ratio cell's class by what its interval says (analysis.sweep.interval_word): grey where it spans 1 or lies
#: within 2% of it, no colour where there is no interval or no ratio
DIRECTION = {"better": "better", "worse": "worse", "indistinguishable": "same", "equal within 2%": "same",
             "too few": "few", None: "none"}


def direction(g: dict | None) -> str:
    """A ratio cell's class: better / worse (the 95% interval clear of 1), same, few (no interval), none."""
    return DIRECTION[interval_word(g)]


def ratio_table(result: dict[str, Any], key: str = "ratios", published: bool = True
                ) -> list[list[tuple[str, str]]]:
    """The regime-split ratio table, to the baseline (``ratios``) or to speculation off (``vs_no_spec``): rows of
    (text, class) cells, class as :func:`direction` says or ``published`` for the published figures' rows (to the
    baseline only, and only for strategies this result has)."""
    rows = []
    for s, regimes in (result.get(key) or {}).items():
        for regime, row in regimes.items():
            rows.append([(s, ""), (regime, ""), (str(row["points"]), "")]
                        + [(fmt_ratio(row[n]), direction(row[n])) for n in RATIO_KEYS])
    if published and key == "ratios":
        have = {s.split("@")[0] for s in (result.get("ratios") or {})} | {result["baseline"]}
        for p in published_rows():
            if p["strategy"] in have:
                rows.append([(f"{p['strategy']} ({p['source']})", "published"), (p["regime"], "published"),
                             ("published", "published")]
                            + [("-" if p.get(n) is None else f"{p[n]}", "published") for n in RATIO_KEYS])
    return rows


CELL_COLORS = {"better": "#d4efd4", "worse": "#f6d2d2", "same": "#e4e4e4", "few": "#ffffff", "none": "#ffffff",
               "published": "#eef3fb", "": "#ffffff"}
RATIO_NOTE = ("Geometric means over (workload, memory budget, load, draft) groups with bootstrap 95% intervals over "
              "those groups, which are design points, not repeated runs (none below 5 groups: n= instead); latencies "
              "as 'x lower' (baseline / strategy), so above 1 is better throughout. Green: better (the interval clear "
              "of 1); red: worse; grey: indistinguishable (the interval spans 1) or equal within 2% (inside "
              "[0.98, 1.02]); white: too few groups. Blue rows: published figures (other hardware and models), for "
              "scale, not comparison.")


# -- HTML -------------------------------------------------------------------------------

def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=85)     # enough for a 1250 px page; committed reports stay small
    return base64.b64encode(buf.getvalue()).decode()


def render_html(result: dict[str, Any], figs, prov: dict[str, Any], pct: Percentiles | None = None) -> str:
    e = html.escape
    pct = pct or Percentiles()
    cols = columns(result, pct)
    pts = sorted(result["points"], key=lambda p: (p["workload"], memory_order(p["memory"]), p["load"], p["strategy"]))
    body = "".join("<tr>" + "".join(f"<td>{e(_fmt(kind, p.get(k)))}</td>" for k, _, kind in cols) + "</tr>"
                   for p in pts)
    head = "".join(f"<th onclick=\"sortTable({i})\">{e(label)}</th>" for i, (_, label, _) in enumerate(cols))
    figs_html = "".join(f"<figure><img alt=\"{e(t)}\" src=\"data:image/png;base64,{_png(f)}\"><figcaption><b>{e(t)}."
                        f"</b> {e(cap)}</figcaption></figure>" for t, f, cap in figs)
    fails = "".join(f"<li>{e(f['point_id'])}: {e(str(f['reason']))}</li>" for f in result["failed"])
    fails += "".join(f"<li>{e(d['point_id'])} (damaged, left out; a rerun of the sweep redoes it): "
                     f"{e(str(d['reason']))}</li>" for d in result.get("damaged") or [])
    first, *rest = summary_lines(result)
    setup = next((x for x in rest if x.startswith("setup: ")), None)
    lines = [x for x in rest if x is not setup]
    verdicts = [x for x in lines if x.startswith("verdict: ")]
    others = [x for x in lines if not x.startswith("verdict: ")]
    items = "".join(f"<li>{e(x.removeprefix('verdict: '))}</li>" for x in verdicts)
    verdict_html = (f'<ul class="verdict" id="verdict">{items}</ul>' if verdicts else
                    "<p>No verdict: no strategy beside the baseline (report this folder with another: report DIR "
                    "DIR baseline=STRATEGY out=DIR).</p>")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>CommitBench report</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1250px; color: #222; }}
h1 {{ margin-bottom: 0.2em; }} .engine {{ font-weight: bold; color: #a00; }}
.setup {{ background: #f5f5f5; border-left: 4px solid #888; padding: 0.4em 0.8em; font-size: 13px; }}
.verdict li {{ margin: 0.25em 0; }}
table {{ border-collapse: collapse; font-size: 12px; margin: 1em 0; }}
th, td {{ border: 1px solid #ccc; padding: 3px 6px; text-align: right; }}
th {{ background: #f3f3f3; cursor: pointer; position: sticky; top: 0; }}
td:first-child, th:first-child {{ text-align: left; }}
td.better {{ background: {CELL_COLORS['better']}; }} td.worse {{ background: {CELL_COLORS['worse']}; }}
td.same {{ background: {CELL_COLORS['same']}; }}
td.published {{ background: {CELL_COLORS['published']}; font-style: italic; }}
figure {{ display: inline-block; margin: 0.5em; max-width: 100%; }} img {{ max-width: 100%; }}
figcaption {{ font-size: 13px; max-width: 1100px; }}
.scroll {{ max-height: 600px; overflow: auto; }}
pre {{ background: #f7f7f7; padding: 0.5em; font-size: 11px; overflow: auto; }}
.note {{ font-size: 13px; color: #333; max-width: 1150px; }}
</style></head><body>
<h1>CommitBench: GDN state-commit strategies under speculative decoding</h1>
<p class="engine">{e(first)}</p>
{f'<p class="setup" id="setup">{e(setup)}</p>' if setup else ''}
<h2>Verdict</h2>
{verdict_html}
<ul>{''.join(f'<li>{e(x)}</li>' for x in others)}</ul>
<h2>Ratios to {e(result['baseline'])}, split by regime</h2>
<p class="note">{e(RATIO_NOTE)}</p>
{_cells_html(RATIO_HEAD, ratio_table(result))}
{_no_spec_html(result)}
{_anchor_html(result)}
{_side_html(result)}
<h2>Latency definitions</h2><p class="note" id="latency-definitions">{e(LATENCY_NOTE)}</p>
<h2>Figures</h2>{figs_html}
<h2>Points</h2><p class="note">Click a column header to sort. The regime column is the point's group's (its baseline's
pool), not the point's own. "Queued for memory" is request-seconds spent waiting while the pool held requests back
(the simulator: refused for blocks; vLLM: waiting with seats free, which its gauges cannot split from the step's
token budget). Every point is also in <a href="bench_serve.json">bench_serve.json</a> (vllm bench serve's
field names) and <a href="points.csv">points.csv</a>; each point's requests are in its folder's requests.parquet.</p>
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
  const num = s => parseFloat(s.replace(/,/g, ""));
  rows.sort((a, b) => {{
    const x = a.cells[col].textContent, y = b.cells[col].textContent;
    const nx = num(x), ny = num(y);
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


def _cells_html(head: list[str], rows: list[list[tuple[str, str]]]) -> str:
    """A table of escaped (text, class) cells (the HTML twin of the PDF's :func:`_table`)."""
    e = html.escape
    body = "".join("<tr>" + "".join(f'<td class="{c}">{e(t)}</td>' if c else f"<td>{e(t)}</td>" for t, c in r)
                   + "</tr>" for r in rows)
    return (f"<table><thead><tr>{''.join(f'<th>{e(h)}</th>' for h in head)}</tr></thead><tbody>{body}"
            "</tbody></table>")


def _html_table(head: list[str], rows: list[list[str]]) -> str:
    """A plain table of escaped cells."""
    return _cells_html(head, [[(c, "") for c in r] for r in rows])


def _no_spec_html(result: dict[str, Any]) -> str:
    rows = ratio_table(result, "vs_no_spec")
    if not rows:
        return ""
    return ("<h2>Ratios to speculation off</h2><p class=\"note\">Each strategy under speculation, store_all included, "
            "against the same (workload, memory budget, load) with speculation off (draft=none), split by the "
            "speculative group's regime: whether to speculate at all.</p>" + _cells_html(RATIO_HEAD, rows))


PAGE = (11.69, 8.27)      # A4 landscape, every page


class _Pages:
    """The PDF's pages, one size, each footed with its number and the engine."""

    def __init__(self, pdf, result: dict[str, Any]):
        self.pdf, self.n = pdf, 0
        self.foot = f"CommitBench report - engine: {result['engine']}"

    def page(self, title: str | None = None, note: str | None = None, red: bool = False):
        """A new page with a title and a wrapped note under it; returns (figure, the top of the free space)."""
        import matplotlib.pyplot as plt

        fig = plt.figure(figsize=PAGE)
        top = 0.95
        if title:
            fig.text(0.04, top, title, fontsize=13, weight="bold", va="top", color="#a00" if red else "black")
            top -= 0.045
        for line in textwrap.wrap(note or "", 175):
            fig.text(0.04, top, line, fontsize=8, va="top")
            top -= 0.02
        return fig, top - 0.01

    def save(self, fig) -> None:
        import matplotlib.pyplot as plt

        self.n += 1
        fig.text(0.04, 0.025, self.foot, fontsize=7, color="#555")
        fig.text(0.96, 0.025, f"page {self.n}", fontsize=7, color="#555", ha="right")
        self.pdf.savefig(fig)
        plt.close(fig)


def _table(pages: _Pages, title: str, rows: list[list[str]], head: list[str], note: str | None = None,
           colors: list[list[str]] | None = None, rows_per_page: int = 24, font: float = 8) -> None:
    """A table over as many pages as it needs (its header on each), optionally with cell colours."""
    for start in range(0, max(len(rows), 1), rows_per_page):
        chunk = rows[start:start + rows_per_page] or [["-"] * len(head)]
        more = f" (rows {start + 1}-{start + len(chunk)} of {len(rows)})" if len(rows) > rows_per_page else ""
        fig, top = pages.page(title + more, note if start == 0 else None)
        ax = fig.add_axes([0.04, 0.06, 0.92, top - 0.06])
        ax.axis("off")
        # each column as wide as its longest cell (headers wrap, so they count less), within reason
        need = [max([len(str(h)) * 0.6] + [len(str(r[i])) for r in chunk]) + 2 for i, h in enumerate(head)]
        widths = [n / sum(need) for n in need]
        cell_colours = None
        if colors:
            cell_colours = [[CELL_COLORS.get(c, "#ffffff") for c in r] for r in colors[start:start + len(chunk)]]
        tbl = ax.table(cellText=chunk, colLabels=head, loc="upper center", cellLoc="center", colWidths=widths,
                       cellColours=cell_colours)
        tbl.auto_set_font_size(False)
        tbl.set_fontsize(font)
        tbl.scale(1, 1.45)
        for (r, _), cell in tbl.get_celld().items():
            if r == 0:
                cell.set_facecolor("#eeeeee")
                cell.get_text().set_wrap(True)
        pages.save(fig)


def _figure_page(pages: _Pages, title: str, fig, caption: str) -> None:
    """A report figure on a page of its own, laid out again at the page's size (vector, as drawn), its title above
    and its takeaway below. Call after the HTML has its PNG: the figure is resized here."""
    cap = textwrap.wrap(caption or "", 170)
    fig.set_size_inches(*PAGE)
    bottom, top = 0.07 + 0.022 * len(cap), 0.89
    engine = fig.get_layout_engine()
    if engine is not None and type(engine).__name__ == "ConstrainedLayoutEngine":
        engine.set(rect=(0.02, bottom, 0.96, top - bottom))
    else:
        fig.tight_layout(rect=(0.02, bottom, 0.98, top))
    fig.text(0.04, 0.95, title, fontsize=13, weight="bold", va="top")
    sup = fig._suptitle            # the figure's own title says more than the page's: under it, out of the layout
    if sup is not None and sup.get_text():
        fig.text(0.04, 0.918, sup.get_text(), fontsize=9, va="top")
        sup.set_visible(False)
    for i, line in enumerate(cap):
        fig.text(0.04, bottom - 0.015 - 0.022 * i, line, fontsize=9, va="top")
    pages.save(fig)


def _points_tables(pages: _Pages, result: dict[str, Any], pct: Percentiles) -> None:
    """The points table, split into column groups that each fit a page (the point's id on every one)."""
    cols = columns(result, pct)
    pts = sorted(result["points"], key=lambda p: (p["workload"], memory_order(p["memory"]), p["load"], p["strategy"]))
    ident, rest = cols[:1], cols[1:]
    per = 12
    parts = [rest[i:i + per] for i in range(0, len(rest), per)]
    for n, part in enumerate(parts, 1):
        use = ident + part
        rows = [[_fmt(kind, p.get(k)) for k, _, kind in use] for p in pts]
        _table(pages, f"Points, columns {n} of {len(parts)} - engine: {result['engine']}", rows,
               [label for _, label, _ in use],
               note="The regime column is the point's group's (its baseline's pool). Latencies in the unit their "
                    "header names. Queued for memory: request-seconds waiting while the pool held requests back "
                    "(simulator: refused for blocks; vLLM: seats free). Every point is also in bench_serve.json and "
                    "points.csv beside this report."
               if n == 1 else None, rows_per_page=26, font=7.5)


def write_pdf(path: Path, result: dict[str, Any], figs, prov: dict[str, Any], pct: Percentiles | None = None) -> None:
    from matplotlib.backends.backend_pdf import PdfPages

    pct = pct or Percentiles()
    with PdfPages(path) as pdf:
        pages = _Pages(pdf, result)
        first, *rest = summary_lines(result)
        fig, top = pages.page("CommitBench: GDN state-commit strategies under speculative decoding")
        fig.text(0.04, top, first, fontsize=12, color="#a00", weight="bold", va="top")   # engine; "simulator" where so
        # every line of the summary (setup, memory-bound, verdicts, goodput), wrapped, spaced to fit the page
        lines = [part for line in rest for part in textwrap.wrap(line, 150, subsequent_indent="    ") or [""]]
        step = min(0.027, (top - 0.1) / max(len(lines) + 1, 1))
        for i, line in enumerate(lines):
            fig.text(0.04, top - 0.04 - step * i, line, fontsize=8.5 if step >= 0.022 else 6.5, va="top",
                     weight="bold" if line.startswith("verdict:") else "normal")
        pages.save(fig)
        table = ratio_table(result)
        keys = ("git_commit", "torch", "vllm", "gpu", "time_utc")
        _table(pages, f"Ratios to {result['baseline']}, split by regime - engine: {result['engine']}",
               [[t for t, _ in r] for r in table], RATIO_HEAD, colors=[[c for _, c in r] for r in table],
               note=RATIO_NOTE + " " + LATENCY_NOTE + f" Provenance: {json.dumps({k: prov.get(k) for k in keys})}")
        if no_spec := ratio_table(result, "vs_no_spec"):
            _table(pages, f"Ratios to speculation off (draft=none) - engine: {result['engine']}",
                   [[t for t, _ in r] for r in no_spec], RATIO_HEAD, colors=[[c for _, c in r] for r in no_spec])
        if drift_rows := anchor_rows(result):
            from analysis.sweep import anchor_line

            _table(pages, f"Drift between sweep commands - engine: {result['engine']}", drift_rows, ANCHOR_HEAD,
                   note=anchor_line(result["anchor"]))
        if pairs := side_rows(result):
            _table(pages, f"Each point beside {result['baseline']} - engine: {result['engine']}", pairs, SIDE_HEAD,
                   note=SIDE_NOTE)
        for title, f, cap in figs:
            _figure_page(pages, title, f, cap)
        _points_tables(pages, result, pct)
