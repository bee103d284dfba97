"""``python -m harness calibrate DIR [DIR ...]``: fit the simulator's constants to measured vLLM runs.

What it fits (the structure is :mod:`harness.engines.sim.step_time`'s; the constants land in a
``conf/calibration/<name>.yaml`` that ``calibration=<name>`` selects):

- per graph mode (vLLM's default FULL + PIECEWISE, PIECEWISE, eager; each from the runs in that mode): the fixed
  cost of a decode-only step (``overhead.<mode>.base``) and of a step that carries prompt tokens (``mixed``);
- the MTP drafter's cost per pass (``per_draft_pass``), where the runs have more than one draft depth;
- the weight / MoE, KV-read and FLOP terms, as scales of the roofline's (``scales``);
- each strategy's GDN term: its op's measured per-layer profile (``layer=``, ``bench kernels``' layer section, for
  the strategies the runs ran) times a fitted ``gdn_scale``, or without a profile its bytes times a fitted
  ``gdn_bytes_scale``;
- the non-KV memory reserve, from the KV pools vLLM planned at startup (``num_blocks`` of every run).

How: a closed-loop point's schedule (which requests run in which step, what each step computes) does not depend on
how long a step takes, so the simulator plays each measured point once on the measured pool (its ``num_blocks``)
and its requests, recording every step's inputs (:attr:`PointSimulation.trace`). Any candidate constants then
re-time those steps at once, and each request's TTFT, TPOT and E2E follow from the steps it spans. Least squares
on the log error of the fitted metrics (``metrics``: output throughput, mean TPOT, p99 TTFT), with a weak pull of
each scale toward 1 (``prior_weight``) so that terms the data cannot tell apart stay at their estimates. A term the
runs cannot fit is named in the output with the reason, and keeps the starting value.

Held-out errors (``split=workload``): for each value of the split axis, a fit on the other points, its error on
those; a fold whose points need a term the other points cannot fit (a strategy or mode only they ran) is reported
apart and left out of the held-out summary. The written calibration is fitted on all points. Open-loop points are
skipped (their schedule depends on the step times), as are failed points, tensor-parallel ones and points of
another model or GPU than the first. ``calibration=NAME`` starts the fit from that calibration (its profile too,
when no ``layer=`` is given).
"""

from __future__ import annotations

import copy
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np
from omegaconf import DictConfig, OmegaConf

import workloads
from analysis.metrics import point_metrics

from .config import conf_dir, parse_draft
from .engines.base import GPUSpec, Point
from .engines.sim.engine import PointSimulation
from .engines.sim.memory import build_pool
from .engines.sim.stale import op_version
from .engines.sim.step_time import build_step_model
from .model import ModelSpec
from .store import Store

#: graph modes as a run's telemetry names them (server.graph_mode) -> the calibration's mode
MODES = {"FULL (decode) + PIECEWISE (mixed prefill-decode)": "default", "PIECEWISE": "piecewise",
         "none (eager)": "eager"}


#: the metrics a fit may weigh (``metrics`` in conf/calibrate.yaml): every fitted point must have them
FITTED = ("output_throughput", "tpot_mean", "ttft_p99")
#: the axes a held-out split can hold a value of out
AXES = ("workload", "strategy", "gmu", "concurrency", "draft", "folder", "mode")


@dataclass
class Measured:
    """One measured point: where it is, its mode, its stored summary (with metrics) and its requests."""

    folder: str
    point_id: str
    mode: str
    summary: dict[str, Any]
    requests: list[dict[str, Any]]

    @property
    def config(self) -> dict[str, Any]:
        return self.summary["config"]

    def axis(self, name: str) -> Any:
        c = self.config
        return {"workload": c.get("workload_name"), "strategy": c.get("strategy"), "gmu": c.get("gmu"),
                "concurrency": (c.get("load") or {}).get("concurrency"), "draft": c.get("draft") or "none",
                "folder": self.folder, "mode": self.mode}[name]


def graph_mode(summary: Mapping[str, Any]) -> str | None:
    """The calibration mode a run ran in (None: not recorded)."""
    server = (summary.get("telemetry") or {}).get("server") or {}
    if server.get("graph_mode") in MODES:
        return MODES[server["graph_mode"]]
    eng = (summary.get("config") or {}).get("engine") or {}
    if eng.get("enforce_eager"):
        return "eager"
    return None


def capture_size(summary: Mapping[str, Any]) -> int | None:
    """The largest batch vLLM captured CUDA graphs for (None: eager): steps past it run without a graph."""
    if graph_mode(summary) == "eager":
        return None
    cap = ((summary.get("telemetry") or {}).get("server") or {}).get("graph_capture") or {}
    sizes = [int(v.get("largest") or 0) for v in cap.values() if isinstance(v, Mapping)]
    return max(sizes) if sizes else (summary.get("config") or {}).get("engine", {}).get("max_cudagraph_capture_size")


def load_runs(dirs: list[str]) -> tuple[list[Measured], list[tuple[str, str]]]:
    """The fittable points of ``dirs`` and, for every other point, why it was left out."""
    runs, skipped = [], []
    first: tuple[Any, Any] | None = None
    captures: dict[str, Any] = {}
    for d in dirs:
        store = Store(d)
        if not store.points.is_dir():
            raise ValueError(f"{d}: not a result folder (no points/); give folders that `python -m harness sweep "
                             "engine=vllm` wrote")
        for s in store.summaries():
            pid = s.get("point_id", "?")
            cfg = s.get("config") or {}
            mode, capture = graph_mode(s), capture_size(s)
            why = None
            if s.get("engine") != "vllm":
                why = f"engine {s.get('engine')}: only measured (vllm) runs calibrate the simulator"
            elif s.get("status") != "ok":
                why = f"status {s.get('status')}"
            elif (cfg.get("load") or {}).get("kind") != "closed":
                why = "open loop: its schedule depends on the step times (closed-loop points only)"
            elif int((cfg.get("engine") or {}).get("tensor_parallel_size") or 1) != 1:
                why = "tensor parallel: the fit's step model is one GPU's (calibrate one-GPU runs)"
            elif mode is None:
                why = "its graph mode is not recorded (telemetry.server.graph_mode)"
            elif mode != "eager" and capture is None:
                why = "its CUDA-graph capture sizes are not recorded (telemetry.server.graph_capture)"
            elif capture != captures.setdefault(mode, capture):
                why = (f"CUDA graphs captured up to {capture} tokens, not {captures[mode]} as the first {mode}-mode "
                       "point's: another mode in effect (calibrate them apart)")
            elif not (s.get("telemetry") or {}).get("num_blocks"):
                why = "no KV pool recorded (telemetry.num_blocks)"
            elif missing := [k for k in FITTED if not (s.get("metrics") or {}).get(k)]:
                why = f"a metric the fit needs is missing or 0 ({', '.join(missing)})"
            else:
                setup = ((cfg.get("model") or {}).get("name"), (cfg.get("gpu") or {}).get("name"))
                first = first or setup
                if setup != first:
                    why = f"model/gpu {setup[0]}/{setup[1]}, not the first point's {first[0]}/{first[1]}"
            if why:
                skipped.append((f"{d}:{pid}", why))
                continue
            runs.append(Measured(d, pid, mode, s, sorted(store.requests(pid), key=lambda r: r["id"])))
    return runs, skipped


class Replay:
    """One measured point's schedule, played once by the simulator on the measured pool: every step's inputs,
    and for every request the steps before its arrival, first token and finish. :meth:`metrics` re-times it under
    other constants."""

    def __init__(self, m: Measured, engine: Mapping[str, Any]):
        self.m = m
        c = m.config
        self.model = ModelSpec.from_config(c["model"])
        self.gpu = GPUSpec.from_config(c["gpu"])
        self.tree = parse_draft(c["draft"], root=True) if c.get("draft") else None
        self.strategy = c["strategy"]
        self.options = dict(c.get("strategy_options") or {})
        reqs = tuple(workloads.Request(prompt_len=int(r["prompt_len"]), output_len=int(r["output_len"]))
                     for r in m.requests)
        tel = m.summary["telemetry"]
        # the measured pool: vLLM's num_blocks of the simulator's page (the plan's arithmetic is vLLM's)
        self.pool = build_pool(self.model, self.gpu, self.strategy, self.tree, float(c["gmu"]), engine, self.options)
        kv_bytes = int((int(tel["num_blocks"]) + 0.5) * self.pool.plan.bytes_per_block)
        self.point = Point(model=self.model, gpu=self.gpu, strategy=self.strategy, tree=self.tree, requests=reqs,
                           arrival=workloads.Arrival(kind="closed", max_concurrency=int(c["load"]["concurrency"]),
                                                     seed=int(c.get("seed") or 0)),
                           gmu=float(c["gmu"]), max_num_seqs=int(c["max_num_seqs"]),
                           max_num_batched_tokens=int(c["max_num_batched_tokens"]),
                           max_model_len=int(c["max_model_len"]), seed=int(c.get("seed") or 0),
                           kv_cache_bytes=kv_bytes, strategy_options=self.options)
        sim = PointSimulation(self.point, {**engine, "mode": m.mode})
        sim.trace = []
        result = sim.go()
        cols = [np.concatenate([t[i] for t in sim.trace]) for i in range(6)]
        self.n, self.ctx, self.pre_tokens, self.pre_reqs, self.pre_attn, dt = cols
        self.mean_tokens = sim.acc.mean_length
        end = np.cumsum(dt)

        def steps_before(t: float | None) -> int:   # steps that ended at or before time t
            return -1 if t is None else int(np.searchsorted(end, t + 1e-9 * max(1.0, t), side="right"))

        self.records = result.requests
        self.idx = np.array([[steps_before(r.arrival_s), steps_before(r.first_token_s), steps_before(r.finish_s)]
                             for r in result.requests])

    def times(self, engine: Mapping[str, Any]) -> np.ndarray:
        step = build_step_model(self.model, self.gpu, self.strategy, self.tree, self.mean_tokens,
                                {**engine, "mode": self.m.mode}, self.options)
        return np.asarray(step.time(self.n, self.ctx, self.pre_tokens, self.pre_reqs, self.pre_attn), dtype=float)

    def metrics(self, engine: Mapping[str, Any]) -> dict[str, Any]:
        """The point's metrics with its steps timed by ``engine``'s constants."""
        clock = np.concatenate([[0.0], np.cumsum(self.times(engine))])
        recs = []
        for r, (a, f, e) in zip(self.records, self.idx):
            recs.append({"arrival_s": clock[a], "first_token_s": None if f < 0 else clock[f],
                         "finish_s": None if e < 0 else clock[e], "prompt_len": r.prompt_len,
                         "output_len": r.output_len, "output_tokens": r.output_tokens, "error": r.error})
        return point_metrics(recs)


# -- the parameters ----------------------------------------------------------------------------------------------

@dataclass
class Param:
    path: tuple[str, ...]          # where in the engine config
    start: float
    prior: bool                    # a scale pulled toward 1 (the estimates' value)


def parameters(runs: list[Measured], engine: Mapping[str, Any], profiled: set[str]) -> tuple[list[Param],
                                                                                             list[dict[str, str]]]:
    """The terms these runs can fit, and the ones they cannot (with why)."""
    params: list[Param] = []
    unfitted: list[dict[str, str]] = []
    over = engine["overhead"]
    for mode in sorted({m.mode for m in runs}):
        start = over[mode]
        params.append(Param(("overhead", mode, "base"), float(start["base"]), False))
        params.append(Param(("overhead", mode, "mixed"), float(start.get("mixed", start["base"])), False))
        depths = {parse_draft(m.config["draft"]).draft_depth if m.config.get("draft") else 0
                  for m in runs if m.mode == mode}
        if len(depths) > 1:
            params.append(Param(("overhead", mode, "per_draft_pass"), float(start["per_draft_pass"]), False))
        else:
            unfitted.append({"term": f"overhead.{mode}.per_draft_pass",
                             "why": f"every {mode}-mode run drafts to depth {depths.pop()}: a pass's cost cannot be "
                                    "told from the step's fixed cost (runs with speculation off or another depth "
                                    "would fit it); kept at the estimate"})
    scales = engine.get("scales") or {}
    for term in ("weights", "kv", "flops"):
        params.append(Param(("scales", term), float(scales.get(term, 1.0)), True))
    unfitted.append({"term": "scales.drafter", "why": "the drafter's bytes are one term with per_draft_pass; "
                                                       "kept at the start"})
    for strategy in sorted({m.config["strategy"] for m in runs if m.config.get("draft")}):
        if strategy in profiled:
            params.append(Param(("gdn_scale", strategy), float((engine.get("gdn_scale") or {}).get(strategy, 1.0)),
                                True))
        else:
            params.append(Param(("gdn_bytes_scale", strategy),
                                float((engine.get("gdn_bytes_scale") or {}).get(strategy, 1.0)), True))
            unfitted.append({"term": f"gdn_profile.{strategy}",
                             "why": "no per-layer profile of its op (layer=): its GDN term is its bytes, scaled"})
    return params, unfitted


def apply(engine: Mapping[str, Any], params: list[Param], x: np.ndarray) -> dict[str, Any]:
    out = copy.deepcopy(dict(engine))
    for p, v in zip(params, x):
        node = out
        for key in p.path[:-1]:
            node = node.setdefault(key, {})
        node[p.path[-1]] = float(v)
    return out


def fit(replays: list[Replay], engine: Mapping[str, Any], params: list[Param], weights: Mapping[str, float],
        prior_weight: float) -> tuple[dict[str, Any], str | None]:
    """Least squares over log parameters: the fitted engine config, and why the optimiser stopped short (None: it
    converged)."""
    from scipy.optimize import least_squares

    real = [r.m.summary["metrics"] for r in replays]

    def residuals(logx: np.ndarray) -> np.ndarray:
        cfg = apply(engine, params, np.exp(logx))
        res = []
        for rep, meas in zip(replays, real):
            sim = rep.metrics(cfg)
            for metric, w in weights.items():
                a, b = sim.get(metric), meas[metric]     # load_runs kept points that have every FITTED metric
                res.append(w * np.log(a / b) if a else w * 10.0)   # a simulated point with no value: far off
        res += [prior_weight * lx for p, lx in zip(params, logx) if p.prior]
        return np.asarray(res)

    x0 = np.log([max(p.start, 1e-6) for p in params])
    sol = least_squares(residuals, x0, method="trf", x_scale=1.0, diff_step=1e-3, max_nfev=400)
    return apply(engine, params, np.exp(sol.x)), None if sol.success else str(sol.message)


def errors(replays: list[Replay], cfg: Mapping[str, Any], metrics: list[str]) -> dict[str, Any]:
    """Per metric: median and max absolute relative error of the simulator against the runs, and per point."""
    per_point = []
    for rep in replays:
        sim, real = rep.metrics(cfg), rep.m.summary["metrics"]
        row = {"point": f"{rep.m.folder}:{rep.m.point_id}"}
        for metric in metrics:
            a, b = sim.get(metric), real.get(metric)
            row[metric] = None if not a or not b else round(a / b - 1.0, 4)
        per_point.append(row)
    return {"summary": _summary(per_point, metrics), "points": per_point}


# -- memory: the non-KV reserve from the startup KV plans ----------------------------------------------------------

def fit_reserve(replays: list[Replay], engine: Mapping[str, Any]) -> tuple[dict[str, float], list[dict[str, Any]],
                                                                              list[dict[str, str]]]:
    """``non_kv_memory`` fitted to every distinct startup's ``num_blocks``: reserve = requested - weights - pool
    (the pool's midpoint between num_blocks and num_blocks + 1 pages). Returns the constants, the startups with
    their predicted blocks, and the terms left at their estimates."""
    start = dict(engine["non_kv_memory"])
    seen: dict[tuple, dict[str, Any]] = {}
    for rep in replays:          # each built its pool from ``engine``: the reserve is what vLLM's blocks leave
        c, tree = rep.m.config, rep.tree
        key = (c["gmu"], c["strategy"] if tree else "none", c.get("draft"))
        nb = int(rep.m.summary["telemetry"]["num_blocks"])
        requested = int(float(c["gmu"]) * rep.gpu.memory_bytes)
        reserve = requested - rep.pool.weight_bytes - (nb + 0.5) * rep.pool.plan.bytes_per_block
        seen[key] = {"gmu": c["gmu"], "strategy": key[1], "draft": c.get("draft"), "num_blocks": nb,
                     "requested": requested, "reserve": reserve, "spec": tree is not None, "rep": rep}
    rows = list(seen.values())
    unfitted = []
    cols = [("base_bytes", lambda r: 1.0)]
    if len({r["requested"] for r in rows}) > 1:
        cols.append(("fraction_of_requested", lambda r: float(r["requested"])))
    else:
        unfitted.append({"term": "non_kv_memory.fraction_of_requested",
                         "why": "every startup requested the same memory (one gmu): kept at the estimate"})
    if len({r["spec"] for r in rows}) > 1:
        cols.append(("spec_bytes", lambda r: float(r["spec"])))
    else:
        unfitted.append({"term": "non_kv_memory.spec_bytes",
                         "why": "every startup " + ("speculates" if rows and rows[0]["spec"] else "runs without "
                                                    "speculation") + ": the drafter's share cannot be told apart; "
                                "kept at the estimate"})
    fixed = {k: float(v) for k, v in start.items() if k not in dict(cols)}
    y = np.array([r["reserve"] - fixed.get("fraction_of_requested", 0.0) * r["requested"]
                  - (fixed.get("spec_bytes", 0.0) if r["spec"] else 0.0) for r in rows])
    A = np.array([[f(r) for _, f in cols] for r in rows])
    coef = np.linalg.lstsq(A, y, rcond=None)[0] if len(rows) >= len(cols) else None
    if coef is None:
        unfitted.append({"term": "non_kv_memory", "why": f"{len(rows)} startups for {len(cols)} terms"})
        out = start
    else:
        out = {**fixed, **{k: float(v) for (k, _), v in zip(cols, coef)}}
    table = []
    for r in rows:
        rep = r["rep"]
        pool = build_pool(rep.model, rep.gpu, rep.strategy, rep.tree, float(r["gmu"]),
                          {**engine, "non_kv_memory": out}, rep.options)
        table.append({"gmu": r["gmu"], "strategy": r["strategy"], "draft": r["draft"],
                      "num_blocks": r["num_blocks"], "predicted": pool.num_blocks})
    return {k: float(out[k]) for k in ("base_bytes", "fraction_of_requested", "spec_bytes")}, table, unfitted


# -- the GDN op profile ----------------------------------------------------------------------------------------

def read_profile(path: str | None, drafts: set[str], ran: set[str]) -> tuple[dict[str, dict[str, Any]], str | None]:
    """``bench kernels``' layer JSON -> ``gdn_profile`` per mode: for each strategy the runs ``ran`` (vLLM's own
    kernel is store_all's op; a strategy no run measured in the engine gets none, since its in-engine scale is
    unknown) the per-layer seconds at each batch, for the runs' draft (``graph_s`` for the graph modes,
    ``eager_s`` with the launch for eager); where a batch was timed twice (a tuned variant), its faster row."""
    if not path:
        return {}, None
    data = json.loads(Path(path).read_text())
    rows = (data.get("layer") or {}).get("rows") or []
    if not rows:
        raise ValueError(f"layer={path}: no layer rows (write one with python -m harness bench kernels "
                         "'sections=[layer]' on the GPU)")
    if len(drafts) != 1:
        raise ValueError(f"layer={path}: the runs verify {sorted(drafts)}; a profile is per draft shape, so "
                         "calibrate runs of one draft shape with it (or leave layer= out)")
    label = f"{next(iter(drafts))}+root"
    out: dict[str, dict[str, Any]] = {}
    for mode, key in (("default", "graph_s"), ("piecewise", "graph_s"), ("eager", "eager_s")):
        best: dict[tuple[str, int], float] = {}
        for r in rows:
            if r.get("draft") != label or r.get(key) is None:
                continue
            s = "store_all" if r["strategy"] == "vllm_store_all" else r["strategy"]
            if s not in ran:
                continue
            k = (s, int(r["batch"]))
            best[k] = min(best.get(k, float("inf")), float(r[key]))
        for s in sorted({s for s, _ in best}):
            batches = sorted(b for t, b in best if t == s)
            out.setdefault(mode, {})[s] = {"draft": next(iter(drafts)), "batch": batches,
                                           "per_layer_s": [best[(s, b)] for b in batches]}
    return out, f"{path} ({data.get('device', '?')}, {(data.get('provenance') or {}).get('git_commit', '?')[:7]})"


def op_versions(runs: list[Measured]) -> tuple[dict[str, str], list[dict[str, str]]]:
    """What each strategy's GDN op was in the runs: vLLM's version for store_all (its own kernel), else the hash of
    the plugin's op code at the commit each run recorded (:mod:`harness.engines.sim.stale` marks the calibration
    stale when the code here differs). Where a strategy's runs ran several versions, or a commit cannot be read
    here, the second list says so and the strategy gets no version (never stale-checked)."""
    out, notes = {}, []
    for s in sorted({m.config["strategy"] for m in runs if m.config.get("draft")}):
        mine = [m for m in runs if m.config["strategy"] == s and m.config.get("draft")]
        if s == "store_all":
            versions = {"vllm " + str(m.summary["telemetry"].get("vllm_version") or "?") for m in mine}
        else:
            versions = {op_version(s, str((m.summary.get("provenance") or {}).get("git_commit") or "")) or "unknown"
                        for m in mine}
        if len(versions) == 1 and "unknown" not in versions:
            out[s] = versions.pop()
        else:
            notes.append({"strategy": s, "why": f"its runs ran op versions {sorted(versions)} ('unknown': a commit "
                                                "this checkout cannot read): no single version to check against"})
    return out, notes


def held_out(replays: list[Replay], engine: Mapping[str, Any], params: list[Param], weights: Mapping[str, float],
             prior_weight: float, axis: str, report: list[str]) -> dict[str, Any]:
    """For each value of ``axis``: fit without its points, errors on them, pooled over the values. A fold whose
    points need a term the others do not fit (a strategy's GDN term, a mode's step costs) is listed with those
    terms and kept out of the summary: its error would measure the starting value, not the fit."""
    values = sorted({str(r.m.axis(axis)) for r in replays})
    if len(values) < 2:
        return {"axis": axis, "why": f"every point has {axis} {values[0]}: nothing to hold out"}
    rows, folds = [], []
    for v in values:
        train = [r for r in replays if str(r.m.axis(axis)) != v]
        test = [r for r in replays if str(r.m.axis(axis)) == v]
        seen = {r.m.mode for r in train} | {r.m.config["strategy"] for r in train if r.m.config.get("draft")}
        untrained = sorted({".".join(p.path) for p in params
                            if p.path[0] in ("overhead", "gdn_scale", "gdn_bytes_scale") and p.path[1] not in seen
                            and any(p.path[1] in (r.m.mode, r.m.config["strategy"]) for r in test)})
        cfg, stopped = fit(train, engine, params, weights, prior_weight)
        e = errors(test, cfg, report)
        if not untrained:
            rows += e["points"]
        folds.append({axis: v, "trained_on": len(train), "tested_on": len(test), "error": e["summary"],
                      **({"untrained_terms": untrained} if untrained else {}),
                      **({"fit_stopped": stopped} if stopped else {})})
    if not rows:
        return {"axis": axis, "folds": folds,
                "why": f"every fold held out a term the others cannot fit (split by {axis}): no held-out error"}
    return {"axis": axis, "summary": _summary(rows, report), "folds": folds, "points": rows}


def _summary(rows: list[dict[str, Any]], metrics: list[str]) -> dict[str, Any]:
    out = {}
    for metric in metrics:
        x = np.abs([r[metric] for r in rows if r[metric] is not None])
        out[metric] = {"median_abs": round(float(np.median(x)), 4) if len(x) else None,
                       "max_abs": round(float(x.max()), 4) if len(x) else None, "points": int(len(x))}
    return out


# -- the command ---------------------------------------------------------------------------------------------------

def run(cfg: DictConfig) -> int:
    from .console import console as make_console, table as make_table

    console = make_console()
    dirs = [str(cfg.dir), *[str(d) for d in (cfg.get("more") or [])]]
    axis = str(cfg.split)
    if axis not in AXES:
        raise ValueError(f"split={axis}: not an axis of the runs; one of {', '.join(AXES)}")
    weights = {str(k): float(v) for k, v in cfg.metrics.items()}
    if unknown := sorted(set(weights) - set(FITTED)):
        raise ValueError(f"metrics: {', '.join(unknown)} cannot be fitted; the fit weighs {', '.join(FITTED)}")
    engine = OmegaConf.to_container(cfg.engine, resolve=True)
    runs, skipped = load_runs(dirs)
    for where, why in skipped:
        console.print(f"[dim]left out {where}: {why}[/]")
    if not runs:
        raise ValueError(f"{', '.join(dirs)}: no measured closed-loop point to fit (see above)")
    model, gpu = runs[0].config["model"]["name"], runs[0].config["gpu"]["name"]
    name = cfg.name or (Path(cfg.out).stem if cfg.out else f"{gpu}_{model}")
    report = [*weights, *[m for m in ("tpot_p50", "ttft_p50", "e2e_mean") if m not in weights]]
    # (max running is no metric of the fit: each run is replayed on its measured pool, where the simulator's
    # schedule reaches vLLM's maximum; the memory model is checked by the startups' pools below)
    modes = sorted({r.mode for r in runs})
    over = engine["overhead"]
    for mode in set(modes) - set(over):   # the estimates have eager | graphs: a mode starts from its kin
        over[mode] = dict(over["eager" if mode == "eager" else "graphs"])
    ran = {r.config["strategy"] for r in runs if r.config.get("draft")}
    profile, profile_source = read_profile(cfg.layer, {r.config["draft"] for r in runs if r.config.get("draft")}, ran)
    if not profile and engine.get("gdn_profile"):      # calibration=NAME without layer=: its profile, as it is
        profile = engine["gdn_profile"]
        profile_source = f"inherited from the starting calibration ({engine.get('calibration', '?')[:60]}...)"
    engine = {**engine, "gdn_profile": profile} if profile else {k: v for k, v in engine.items() if k != "gdn_profile"}
    profiled = {s for m in profile.values() for s in m} & ran if profile else set()
    t0 = time.perf_counter()
    console.print(f"calibrate: {len(runs)} points of {model} on {gpu} from {', '.join(dirs)} "
                  f"(modes {', '.join(modes)}); playing each schedule once ...")
    replays = [Replay(m, engine) for m in runs]
    params, unfitted = parameters(runs, engine, profiled)
    console.print(f"fitting {len(params)} terms to {len(runs)} points x {len(weights)} metrics "
                  f"({time.perf_counter() - t0:.0f} s so far) ...")
    fitted, stopped = fit(replays, engine, params, weights, float(cfg.prior_weight))
    if stopped:
        console.print(f"[yellow]the fit stopped before converging[/]: {stopped}")
    reserve, startups, mem_unfitted = fit_reserve(replays, engine)
    fitted["non_kv_memory"] = reserve
    unfitted += mem_unfitted
    all_err = errors(replays, fitted, report)
    held = held_out(replays, engine, params, weights, float(cfg.prior_weight), axis, report)
    before = errors(replays, engine, report)["summary"]
    console.print(f"fitted in {time.perf_counter() - t0:.0f} s")

    t = make_table(f"calibration {name}: |sim / measured - 1|, median (max)",
                   ["metric", "starting constants", "fitted (all points)", f"held out by {axis}"], left=1)
    for metric in report:
        t.add_row(metric, _fmt(before[metric]), _fmt(all_err["summary"][metric]),
                  _fmt((held.get("summary") or {}).get(metric)))
    console.print(t)
    if held.get("why"):
        console.print(f"[bold]held out[/]: {held['why']}")
    for f in held.get("folds", []):
        if f.get("untrained_terms"):
            console.print(f"[dim]held out {axis} {f[axis]}: left out of the summary, it needs "
                          f"{', '.join(f['untrained_terms'])}, which the other points do not fit[/]")
    mt = make_table("KV pool at startup: vLLM's blocks and the fitted reserve's", ["gmu", "strategy", "draft",
                                                                                   "vLLM", "simulator"], left=3)
    for r in startups:
        mt.add_row(f"{r['gmu']:g}", r["strategy"], str(r["draft"] or "none"), str(r["num_blocks"]),
                   str(r["predicted"]))
    console.print(mt)
    for u in unfitted:
        console.print(f"[yellow]not fitted[/] {u['term']}: {u['why']}")
    ops, op_notes = op_versions(runs)
    doc = {
        "calibration": _line(name, runs, dirs, weights, all_err["summary"], held),
        "non_kv_memory": reserve,
        "overhead": {m: fitted["overhead"][m] for m in modes},
        "efficiency": dict(engine["efficiency"]),
        "scales": fitted.get("scales", {}),
        "gdn_scale": fitted.get("gdn_scale", {}),
        "gdn_bytes_scale": fitted.get("gdn_bytes_scale", {}),
        **({"gdn_profile": profile} if profile else {}),
        "mode": "default" if "default" in modes else modes[0],
        "calibration_fit": {
            "name": name, "model": model, "gpu": gpu,
            "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "command": "python -m harness calibrate " + " ".join(dirs)
                       + (f" layer={cfg.layer}" if cfg.layer else "") + f" split={axis} name={name}",
            "sources": sorted({f"{r.folder}:{r.point_id}" for r in runs}),
            "git_commits": sorted({str((r.summary.get("provenance") or {}).get("git_commit", "?"))[:12]
                                   for r in runs}),
            "vllm": sorted({str(r.summary["telemetry"].get("vllm_version")) for r in runs}),
            "gdn_profile_source": profile_source,
            "gdn_ops": ops,
            "gdn_ops_notes": op_notes,
            "metrics_weights": weights, "prior_weight": float(cfg.prior_weight),
            **({"fit_stopped": stopped} if stopped else {}),
            "error_start": before, "error": all_err["summary"], "held_out": held,
            "points": all_err["points"], "startups": startups, "unfitted": unfitted,
            "domain": "dummy weights (MoE routing is not a trained model's); synthetic acceptance; closed loop; "
                      "the GDN ops in gdn_ops (a changed op marks the calibration stale)",
        },
    }
    out = Path(cfg.out) if cfg.out else conf_dir() / "calibration" / f"{name}.yaml"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(_yaml(doc, name, dirs))
    console.print(f"wrote {out}" + (f": use it with calibration={name} (engine=sim)"
                                    if out.parent == conf_dir() / "calibration" else
                                    f"; copy it to conf/calibration/{name}.yaml to use it (calibration={name})"))
    return 0


def _line(name: str, runs: list[Measured], dirs: list[str], weights: Mapping[str, float],
          error: Mapping[str, Any], held: Mapping[str, Any]) -> str:
    """The line every simulator result on this calibration shows: what it was fitted to, how well, held out, and
    where it holds."""
    def pct(summary: Mapping[str, Any]) -> str:
        return ", ".join(f"{m} {summary[m]['median_abs']:.0%}" for m in weights
                         if summary.get(m) and summary[m].get("median_abs") is not None)

    held_txt = (f"held out by {held['axis']}: {pct(held['summary'])}" if held.get("summary")
                else f"no held-out error ({held.get('why')})")
    return (f"{name}: fitted to {len(runs)} measured vLLM points ({', '.join(sorted({r.mode for r in runs}))} mode) "
            f"in {', '.join(dirs)}; fit error (median |sim/measured - 1|) {pct(error)}; {held_txt}; valid for dummy "
            "weights (MoE routing not a trained model's), synthetic acceptance, the GDN ops hashed in "
            "calibration_fit.gdn_ops")


def _fmt(e: Mapping[str, Any] | None) -> str:
    if not e or e.get("median_abs") is None:
        return "-"
    return f"{e['median_abs']:.1%} ({e['max_abs']:.1%})"


def _yaml(doc: dict[str, Any], name: str, dirs: list[str]) -> str:
    import yaml

    head = (f"# @package engine\n# Written by python -m harness calibrate ({time.strftime('%Y-%m-%d')}) from "
            f"{', '.join(dirs)}:\n"
            "# the simulator's constants fitted to measured vLLM runs (harness/calibrate.py says how). Select it with\n"
            f"# calibration={name} (engine=sim). calibration_fit: what it was fitted to and how well (not read by the\n"
            "# simulator's step cost; its gdn_ops mark the calibration stale when an op changes).\n")
    return head + yaml.safe_dump(_rounded(json.loads(json.dumps(doc))), sort_keys=False, width=118)


def _rounded(x: Any) -> Any:
    """Floats to 6 significant digits (a fit is not more precise than that; the file stays readable)."""
    if isinstance(x, float):
        return float(f"{x:.6g}")
    if isinstance(x, dict):
        return {k: _rounded(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_rounded(v) for v in x]
    return x
