"""``python -m harness bench sim``: the paper's 35B or 397B grid (``scale``) on the simulator, every strategy, timed.

Points run in parallel processes (``processes``); the wall time printed is this machine's.
Memory-bound points are classified from the baseline's telemetry; the ratios are split by regime
(geometric means with bootstrap 95% intervals) and printed beside the TreeWY paper's figures.
Simulator results: ``engine: sim``.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

import workloads
from analysis.metrics import point_metrics
from analysis.regimes import RATIOS, Thresholds, geomean, memory_bound, ratio
from analysis.sweep import fmt_ratio

from .. import strategy_configs
from ..config import compose, load_model, parse_draft
from ..engines.base import GPUSpec, Point
from ..engines.sim.engine import SimEngine

_STATE: dict[str, Any] = {}


def requests_for(c: int, rule) -> int:
    return max(int(rule["min"]), int(rule["per_concurrency"]) * c)


def _load_pools(cfg) -> dict[str, list]:
    """Each workload's requests, enough for the biggest point (seeded, shuffled)."""
    need = max(requests_for(c, cfg.requests) for c in cfg.concurrency)
    pools = {}
    for name in cfg.workloads:
        wl = OmegaConf.to_container(compose("workloads_describe", [f"workload={name}"]).workload, resolve=True)
        wl["num_requests"] = need
        pools[name] = workloads.build(wl).requests()[0]
    return pools


def _run_point(key):
    wl, gmu, c, strategy = key
    cfg = _STATE["cfg"]
    n = requests_for(c, cfg["requests"])
    tree = None if cfg["draft"] in (None, "none") else parse_draft(cfg["draft"], root=True)
    point = Point(model=_STATE["model"], gpu=_STATE["gpu"], strategy=strategy, tree=tree,
                  requests=tuple(_STATE["pools"][wl][:n]),
                  arrival=workloads.Arrival(kind="closed", max_concurrency=c), gmu=gmu,
                  max_num_seqs=cfg["max_num_seqs"], max_num_batched_tokens=cfg["max_num_batched_tokens"],
                  max_model_len=cfg["max_model_len"], seed=cfg["seed"],
                  strategy_options=strategy_configs.of(cfg, strategy))
    res = SimEngine(cfg["engine"]).run(point)
    return key, point_metrics(res.requests, res.telemetry)


def run(cfg: DictConfig) -> int:
    from ..console import console as make_console, table as make_table

    console = make_console()
    t0 = time.perf_counter()
    _STATE.update(cfg=OmegaConf.to_container(cfg, resolve=True), model=load_model(cfg.model),
                  gpu=GPUSpec.from_config(OmegaConf.to_container(cfg.gpu, resolve=True)), pools=_load_pools(cfg))
    keys = [(w, g, c, s) for w in cfg.workloads for g in cfg.gmu for c in cfg.concurrency for s in cfg.strategy]
    tp = int(cfg.engine.tensor_parallel_size)
    gpus = f"{tp} x {cfg.gpu.name}" if tp > 1 else cfg.gpu.name
    console.print(f"[bold]bench sim[/] (engine: sim, mode {cfg.engine.mode}): {cfg.model.display_name} on {gpus}, "
                  f"{len(keys) // len(cfg.strategy)} points x {len(cfg.strategy)} strategies, "
                  f"{cfg.processes} processes")
    results: dict[tuple, dict] = {}
    with mp.get_context("fork").Pool(int(cfg.processes)) as pool:
        for i, (key, m) in enumerate(pool.imap_unordered(_run_point, keys, chunksize=4), 1):
            results[key] = m
            if i % max(len(keys) // 10, 1) == 0:
                console.print(f"  {i}/{len(keys)} runs, {time.perf_counter() - t0:.0f} s")
    wall = time.perf_counter() - t0
    th = Thresholds.from_config(cfg.thresholds)
    points = sorted({k[:3] for k in keys})
    bound = {p: memory_bound(results[(*p, cfg.baseline)], th) for p in points}
    n_bound = sum(b for b, _ in bound.values())
    table = make_table(f"ratios to {cfg.baseline} (geomean [95% CI]); engine: sim",
                       ["strategy", "regime", "points", *RATIOS], left=2)
    summary: dict[str, Any] = {}
    for s in cfg.strategy:
        if s == cfg.baseline:
            continue
        for regime, want in (("memory-bound", True), ("not memory-bound", False)):
            sel = [p for p in points if bound[p][0] == want]
            row = {}
            for name in RATIOS:
                row[name] = geomean([ratio(results[(*p, s)], results[(*p, cfg.baseline)], name) for p in sel])
            summary[f"{s}/{regime}"] = row
            table.add_row(s, regime, str(len(sel)), *[fmt_ratio(row[n]) for n in RATIOS])
    console.print(table)
    paper = cfg.paper
    theirs = [f"throughput {paper.throughput}x", f"p99 TTFT {paper.p99_ttft}x lower"]
    theirs += [f"mean E2E {paper.mean_e2e}x lower"] if paper.get("mean_e2e") else []
    theirs += [f"TPOT {paper.tpot}x"] if paper.get("tpot") else []
    console.print(f"memory-bound points ({cfg.baseline}): {n_bound}/{len(points)} (paper, {paper.label}: "
                  f"{paper.memory_bound}); paper's treewy ratios there: {', '.join(theirs)}")
    console.print(f"wall time: {wall:.1f} s for {len(keys)} simulated runs on this machine")
    if cfg.out:
        out = Path(str(cfg.out))
        out.parent.mkdir(parents=True, exist_ok=True)
        from ..provenance import provenance

        out.write_text(json.dumps({
            "engine": "sim", "config": OmegaConf.to_container(cfg, resolve=True), "wall_s": wall,
            "provenance": provenance(),
            "memory_bound": {"/".join(map(str, p)): {"bound": b, "reason": r} for p, (b, r) in bound.items()},
            "summary": summary,
            "points": [{"workload": k[0], "gmu": k[1], "concurrency": k[2], "strategy": k[3], **v}
                       for k, v in sorted(results.items())]}, indent=1))
        console.print(f"wrote {out}")
    return 0


def grid(cfg_overrides=()) -> DictConfig:
    return compose("bench_sim", list(cfg_overrides))
