"""One sweep point: its config, its identity, its run into the result store.

A point config is plain data (what ``summary.json`` records as the fully resolved config)::

    {"model": {...conf/model...}, "gpu": {...}, "engine": {...conf/engine...}, "workload": {...},
     "workload_name": "sharegpt", "strategy": "treewy", "draft": "chain:3" | None, "gmu": 0.6,
     "load": {"kind": "closed", "concurrency": 32} | {"kind": "poisson", "rate": 2.0},
     "requests": 500, "max_num_seqs": 256, "max_num_batched_tokens": 8192, "max_model_len": 4096,
     "seed": 0, "failed_requests": 0.01}

``python -m harness.point [--multirun] key=value ...`` runs points as Hydra jobs (conf/point.yaml),
so Hydra's launchers (joblib, submitit/Slurm) can fan a grid out; every job writes into the same
result store, which is safe for concurrent writers.
"""

from __future__ import annotations

import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import workloads
from analysis.metrics import point_metrics

from .engines.base import GPUSpec, Point, PointResult
from .identity import point_identity, sweep_identity, with_hash
from .model import ModelSpec
from .provenance import provenance
from .store import Store
from .config import parse_draft


def memory_budget(cfg: dict[str, Any]) -> str:
    """How a point's memory is budgeted, as its id spells it: ``gmu0.9``, or ``kv32MiB`` where
    ``engine.kv_cache_bytes`` sizes the KV pool outright (gmu then sizes nothing); a sub-grid's variant
    (harness.grid.sub_grids) follows it, ``gmu0.6-piecewise``: analysis groups points by this, so a variant's
    points are compared among themselves, never with the points whose settings they vary."""
    kv = (cfg.get("engine") or {}).get("kv_cache_bytes")
    budget = f"kv{int(kv) / 2**20:g}MiB" if kv else f"gmu{cfg['gmu']:g}"
    return f"{budget}-{cfg['variant']}" if cfg.get("variant") else budget


def point_id(cfg: dict[str, Any]) -> str:
    load = cfg["load"]
    ld = f"c{load['concurrency']}" if load["kind"] == "closed" else f"{load['kind'][0]}{load['rate']:g}"
    draft = "nospec" if not cfg.get("draft") else parse_draft(cfg["draft"], root=True).label.removesuffix("+root")
    rep = int(cfg.get("repeat") or 1)      # the first run keeps the plain id: folders from before repeats read alike
    return (f"{cfg['workload_name']}-{memory_budget(cfg)}-{ld}-{draft.replace(':', '').replace(',', 'x')}"
            f"-{cfg['strategy']}" + (f"-r{rep}" if rep > 1 else ""))


def run_seed(cfg: dict[str, Any]) -> int:
    """The seed a point's run draws with: the sweep's, plus repeat - 1 (each repeat draws its own arrivals and
    acceptance; the sweep's seed, which the folder's identity records, stays one number)."""
    return int(cfg["seed"]) + int(cfg.get("repeat") or 1) - 1


def arrival_of(cfg: dict[str, Any]) -> workloads.Arrival:
    load, seed = cfg["load"], run_seed(cfg)
    if load["kind"] == "closed":
        return workloads.Arrival(kind="closed", max_concurrency=int(load["concurrency"]), seed=seed)
    # the grid gives an open load its workload's burstiness (harness.grid.expand)
    return workloads.Arrival(kind=load["kind"], rate=float(load["rate"]), burstiness=float(load["burstiness"]),
                             seed=seed)


def build_point(cfg: dict[str, Any]) -> Point:
    wl = dict(cfg["workload"])
    wl["num_requests"] = int(cfg["requests"])
    arrival = arrival_of(cfg)
    wl["arrival"] = {"kind": arrival.kind, "max_concurrency": arrival.max_concurrency, "rate": arrival.rate,
                     "burstiness": arrival.burstiness}
    reqs, _ = workloads.build(wl).requests()
    tree = parse_draft(cfg["draft"], root=True) if cfg.get("draft") else None
    return Point(model=ModelSpec.from_config(cfg["model"]), gpu=GPUSpec.from_config(cfg["gpu"]),
                 strategy=cfg["strategy"], tree=tree, requests=tuple(reqs), arrival=arrival, gmu=float(cfg["gmu"]),
                 max_num_seqs=int(cfg["max_num_seqs"]), max_num_batched_tokens=int(cfg["max_num_batched_tokens"]),
                 max_model_len=int(cfg["max_model_len"]), seed=run_seed(cfg),
                 strategy_options=dict(cfg.get("strategy_options") or {}))


_ENGINES: dict[str, Any] = {}


def _reraise_signal() -> None:
    """A point that failed because the harness was interrupted (its server stopped by the signal
    handler) is not a failed point: re-raise the interruption instead of recording it."""
    if "harness.engines.vllm.server" not in sys.modules:
        return
    from .engines.vllm.server import signalled

    sig = signalled()
    if sig == signal.SIGINT:
        raise KeyboardInterrupt
    if sig:
        raise SystemExit(128 + sig)


def engine_for(cfg: dict[str, Any], store: Store | None = None):
    """The engine for a point; one instance per engine config and process, so a vLLM server started
    for one point serves the next points that share its settings (close_engines() stops it)."""
    import json

    ecfg = cfg["engine"]
    key = json.dumps(ecfg, sort_keys=True, default=str)
    # A server the engine starts next logs beside the point it starts for (an anchor measured again runs into
    # anchors/call-NN/, the grid's points after it into the grid's folder)
    log_dir = ecfg.get("log_dir") or (store.root / "engine-logs" if store is not None else None)
    if key in _ENGINES:
        engine = _ENGINES[key]
        if log_dir is not None and hasattr(engine, "log_dir"):
            engine.log_dir = Path(log_dir)
        return engine
    from .engines.base import engine_class

    engine = engine_class(ecfg)(ecfg, log_dir=log_dir)
    _ENGINES[key] = engine
    return engine


def close_engines() -> None:
    """Stop every engine's server (a no-op for the simulator)."""
    for engine in list(_ENGINES.values()):
        close = getattr(engine, "close", None)
        if close:
            close()
    _ENGINES.clear()
    if "harness.engines.vllm.server" in sys.modules:   # only if a server could exist
        from .engines.vllm.server import stop_all

        stop_all()


def too_many_failed(metrics: dict[str, Any], records, limit: float) -> str | None:
    """Why a point that ran is still a failed point, or None: more than ``limit`` (a fraction,
    ``thresholds.failed_requests``) of its requests errored (the engine rejected them or they broke off), never
    finished, or returned fewer tokens than they asked for. Its numbers would describe other work than asked."""
    n, bad = metrics["requests"], metrics["failed"]
    if n and bad <= limit * n:
        return None
    parts = [f"{metrics[k]} {what}" for k, what in (("errored", "errored or were rejected"),
                                                     ("unfinished", "never finished"),
                                                     ("short", "returned fewer tokens than asked"))
             if metrics[k]]
    first = next((r.error for r in records if r.error), None)
    return (f"{bad} of {n} requests failed ({', '.join(parts) or 'no requests'}), more than "
            f"thresholds.failed_requests={limit:g} allows" + (f"; first error: {first[:300]}" if first else ""))


def run_point(cfg: dict[str, Any], store: Store) -> dict[str, Any]:
    """Run one point and store it; a failure is stored with its reason instead of raised."""
    pid = point_id(cfg)
    t0 = time.perf_counter()
    summary: dict[str, Any] = {"point_id": pid, "config": cfg, "engine": cfg["engine"]["name"],
                               "identity": with_hash(point_identity(cfg))}   # what the point measured (not where)
    try:
        result: PointResult = engine_for(cfg, store).run(build_point(cfg))
        recs = [r.__dict__ for r in result.requests]
        metrics = point_metrics(result.requests, result.telemetry)
        summary.update(status="ok", metrics=metrics, telemetry=result.telemetry)
        if why := too_many_failed(metrics, result.requests, cfg["failed_requests"]):
            summary.update(status="failed", reason=why)
    except KeyboardInterrupt:
        raise
    except Exception as e:  # recorded, and the sweep goes on
        _reraise_signal()
        recs = None
        summary.update(status="failed", reason=f"{type(e).__name__}: {e}",
                       traceback=traceback.format_exc(limit=6)[-4000:])
    summary["wall_s"] = time.perf_counter() - t0
    summary["provenance"] = provenance(engine=cfg["engine"]["name"], seed=run_seed(cfg))
    store.write(pid, summary, recs)
    return summary


def main() -> None:
    """``python -m harness.point``: one point as a Hydra job (``--multirun`` + launchers for grids)."""
    import hydra
    from omegaconf import OmegaConf

    from .config import conf_dir

    @hydra.main(config_path=str(conf_dir()), config_name="point", version_base=None)
    def job(cfg) -> None:
        from hydra.core.hydra_config import HydraConfig

        from .grid import point_configs

        c = OmegaConf.to_container(cfg, resolve=True)
        c["workloads"] = [HydraConfig.get().runtime.choices["workload"]]   # the group's choice; its composed
        # config (command-line workload.* overrides included) is merged onto it as the sweep's workload settings
        (pc,) = point_configs(c)
        store = Store(c["out"])
        identity = with_hash(sweep_identity([pc], c["baseline"], c["thresholds"], c.get("requests")))
        store.check_identity(identity)     # the jobs divide the grid between them; none may join another's
        if not (store.root / "sweep.json").exists():  # the first job describes the sweep (atomic; any may)
            store.init({"sweep_name": "hydra-multirun", "model": c["model"]["name"], "gpu": c["gpu"]["name"],
                        "baseline": c["baseline"], "thresholds": c["thresholds"], "identity": identity})
        try:
            s = run_point(pc, store)
        finally:
            close_engines()
        print(f"{s['point_id']}: {s['status']}{'' if s['status'] == 'ok' else ' (' + s['reason'] + ')'}")

    job()


if __name__ == "__main__":
    main()
