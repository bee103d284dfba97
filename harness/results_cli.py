"""``python -m harness run|analyze|report|compare``: one point, and what comes after a sweep."""

from __future__ import annotations

import json
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from .store import Store


def _store(path: str) -> Store:
    store = Store(path)
    if not store.points.is_dir():
        raise FileNotFoundError(f"{path}: not a sweep folder (no points/) nor kernel benchmark results; run "
                                f"`python -m harness sweep out={path}` or "
                                f"`python -m harness bench kernels out={path}/NAME.json`")
    return store


def _analyze(store: Store, cfg: DictConfig) -> dict:
    """``store``'s analysis under the thresholds its sweep.json records; a folder that records none (a `run`
    before it recorded them) is classified with the config's (conf/thresholds/), said so."""
    from analysis.goodput import SLO
    from analysis.regimes import Thresholds
    from analysis.sweep import analyze

    th = None
    if not store.sweep_config().get("thresholds"):
        th = Thresholds.from_config(OmegaConf.to_container(cfg.thresholds, resolve=True))
        print(f"{store.root}: sweep.json records no memory-bound thresholds; using conf/thresholds/'s {th}")
    slo = SLO.from_config(OmegaConf.to_container(cfg.slo, resolve=True) if cfg.get("slo") else None)
    return analyze(store, th, slo=slo)


def run_one(cfg: DictConfig) -> int:
    """One point (the first of the composed grid) into ``out``, printed."""
    from .config import resolve_engine
    from .grid import point_configs

    c = OmegaConf.to_container(cfg, resolve=True)
    resolve_engine(c["engine"]["name"])
    points = point_configs(c)
    if len(points) != 1:
        raise ValueError(f"run: the overrides describe {len(points)} points; give one value per axis "
                         "(workload, gmu, concurrency or rate, strategy, draft)")
    from .point import run_point

    from .identity import sweep_identity, with_hash
    from .sweep import claim, grown

    identity = with_hash(sweep_identity(points, c["baseline"], c["thresholds"], c.get("requests")))
    store, stack = claim(Path(c["out"] or "results/runs"), identity, "refuse")
    with stack:
        # what analysis reads: the baseline and the thresholds
        store.init(grown(store.sweep_config(), {"sweep_name": "run", "model": c["model"]["name"],
                                                "gpu": c["gpu"]["name"], "baseline": c["baseline"],
                                                "thresholds": c["thresholds"], "identity": identity}))
        s = run_point(points[0], store)
    print(json.dumps({k: s.get(k) for k in ("point_id", "status", "reason", "metrics")}, indent=1, default=str))
    return 0 if s["status"] == "ok" else 1


def analyze_cmd(cfg: DictConfig) -> int:
    from analysis.sweep import write_analysis

    from .console import console
    from .summary import print_summary

    store = _store(cfg.dir)
    result = _analyze(store, cfg)
    print_summary(result, console())
    print(f"wrote {write_analysis(store, result)}")
    return 0


def report_cmd(cfg: DictConfig) -> int:
    from analysis.metrics import Percentiles
    from reports.build import build_report

    folder = Path(str(cfg.dir))
    more = [str(m) for m in (cfg.get("more") or [])]
    if not more and not (folder / "points").is_dir() and folder.is_dir():
        # A kernel benchmark folder (bench kernels out=DIR/NAME.json): one page per result.
        from reports.kernels import is_kernel_result, write_report

        found = [p for p in sorted(folder.glob("*.json")) if is_kernel_result(p)]
        for p in found:
            print(f"wrote {write_report(json.loads(p.read_text()), p.with_suffix('.html'))}")
        if found:
            return 0
    from analysis.sweep import write_analysis

    percentiles = Percentiles.from_config(OmegaConf.to_container(cfg.percentiles, resolve=True))
    out = cfg.get("out")
    if more:
        from .store import Merged

        if not out:
            raise ValueError(f"report {cfg.dir} {' '.join(more)}: several folders make one report in a folder of "
                             "its own; give out=DIR (a report never writes into its inputs)")
        inputs = [str(cfg.dir), *more]
        inside = [d for d in inputs if Path(out).resolve().is_relative_to(Path(d).resolve())]
        if inside:
            raise ValueError(f"out={out} is inside {inside[0]}, one of the folders reported (a report never writes "
                             "into its inputs); give a folder outside them")
        store = Merged(inputs, out, cfg.get("baseline"))
    else:
        store = _store(cfg.dir)
        if cfg.get("baseline") or out:
            raise ValueError("baseline= and out= are for a report of several folders (report DIR DIR ... "
                             "baseline=STRATEGY out=DIR); one folder's report uses its sweep's baseline, in place")
    result = _analyze(store, cfg)
    if more:
        Path(out).mkdir(parents=True, exist_ok=True)
        if store.renamed:
            print(f"points found in more than one folder, renamed: {', '.join(sorted(store.renamed))}")
    write_analysis(store, result)
    folder = build_report(store, result, percentiles)
    print(f"wrote {folder / 'report.html'}, {folder / 'report.pdf'}, {folder / 'bench_serve.json'} and "
          f"{folder / 'points.csv'}")
    return 0


def compare_cmd(cfg: DictConfig) -> int:
    """Two sweeps point by point (e.g. sim against vllm): metric ratios B / A and regime agreement."""
    from analysis.sweep import memory_title

    from .console import console as make_console, table as make_table

    a, b = _analyze(_store(cfg.a), cfg), _analyze(_store(cfg.b), cfg)
    key = lambda p: (p["workload"], p["memory"], p.get("load_kind", ""), p["load"], p["draft"], p["strategy"])  # noqa: E731
    pa = {key(p): p for p in a["points"] if p["status"] == "ok"}
    pb = {key(p): p for p in b["points"] if p["status"] == "ok"}
    common = sorted(set(pa) & set(pb))
    console = make_console()
    if not common:
        raise ValueError(f"{cfg.a} and {cfg.b} share no points (workload, memory budget, load, draft, strategy)")
    t = make_table(f"B / A ({cfg.b} over {cfg.a}); engines {a['engine']} vs {b['engine']}",
                   ["point", "out tok/s", "p99 TTFT", "peak KV", "mem-bound A/B"], left=1)
    agree = 0
    for k in common:
        x, y = pa[k], pb[k]
        agree += x.get("memory_bound") == y.get("memory_bound")
        workload, memory, kind, load, draft, strategy = k
        where = f"c{load:g}" if kind == "concurrency" else f"{load:g} req/s"
        ratios = [_r(y.get(m), x.get(m)) for m in ("output_throughput", "ttft_p99", "peak_kv_usage")]
        t.add_row(f"{workload} {memory_title(memory)} {where} {draft} {strategy}", *ratios,
                  f"{_yn(x.get('memory_bound'))}/{_yn(y.get('memory_bound'))}")
    console.print(t)
    console.print(f"{len(common)} common points; memory-bound classification agrees on {agree}; "
                  f"A: {a['counts']['label']} memory-bound, B: {b['counts']['label']}")
    # the points match by workload, memory, load, draft and strategy alone: say where the setups differ
    differ = [f"{k} {a['sweep'].get(k)} vs {b['sweep'].get(k)}" for k in ("model", "gpu")
              if a["sweep"].get(k) != b["sweep"].get(k)]
    if differ:
        console.print(f"[bold]note[/]: A and B ran different setups ({'; '.join(differ)}): the ratios above compare "
                      "those setups, not only the engines")
    # and every other setting the two experiments' identities disagree on (harness.identity)
    from .identity import differences

    ia, ib = _store(cfg.a).identity(), _store(cfg.b).identity()
    rest = [d for d in differences(ia, ib) if not d.startswith(("model.name", "gpu.name"))] if ia and ib else []
    if rest:
        console.print(f"[bold]note[/]: their identities also differ in {len(rest)} settings: " + "; ".join(rest[:6])
                      + (" ..." if len(rest) > 6 else ""))
    return 0


def _r(b, a) -> str:
    return f"{b / a:.2f}" if a and b else "-"


def _yn(v) -> str:
    return "-" if v is None else ("yes" if v else "no")
