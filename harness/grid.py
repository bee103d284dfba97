"""The grid a sweep runs: the command line's overrides normalised, the composed config validated, and expanded
into one config per point (workloads x memory budget x load x draft x strategy), each with its workload's
settings. Only configs: running them is harness.sweep's job (and harness.point's, one at a time).

A preset may be a union of sub-grids (``grids:``, a list of Cartesian products, e.g. the campaign's gmu 0.75 for
two strategies only, or its PIECEWISE points): each sub-grid gives some axes and takes the rest from the preset,
and the preset's own axes filter every sub-grid (``gmu=[0.6]`` on the command line runs the union's gmu-0.6
points). A sub-grid that changes engine settings is a *variant*: it has a name, which its points' ids carry in
their memory budget (``sharegpt-gmu0.6-piecewise-c128-chain3-store_all``), so its points never take the ids of
the points it varies and analysis compares them within their own groups.
"""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path
from typing import Any, Sequence

from omegaconf import DictConfig, OmegaConf

import strategies
from workloads.arrivals import POISSON_BURSTINESS

from . import strategy_configs
from .config import compose, conf_dir, engine_config, parse_draft, resolve_engine
from .engines.base import engine_class

AXES = ("workloads", "gmu", "concurrency", "rate", "strategy", "draft")
SUB_GRID_KEYS = AXES + ("variant", "engine")
VARIANT_NAME = re.compile(r"[a-z][a-z0-9_]*")
ALIASES = {"workload": "workloads", "strategies": "strategy", "drafts": "draft"}


def normalize_overrides(overrides: Sequence[str]) -> list[str]:
    """``gmu=0.6,0.75`` (Hydra's sweep syntax) → ``gmu=[0.6,0.75]`` for the grid's axes; aliases."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    out = []
    parser = OverridesParser.create()
    for text in overrides:
        key, sep, value = text.partition("=")
        if not sep:
            out.append(text)
            continue
        key = ALIASES.get(key, key)
        if key.lstrip("+").startswith("workload."):    # a setting of the swept workloads (workload_configs)
            if "," in value and not value.lstrip().startswith(("[", "{", "'", '"')):
                raise ValueError(f"{text}: only the grid's axes take several values ({', '.join(AXES)}); a "
                                 "workload setting takes one (quote a value that holds a comma)")
            out.append(f"++{key.lstrip('+')}={value}")
            continue
        if key == "draft" and value.startswith("parents:"):   # Hydra's grammar reads no ':[' inside a value
            if "]," in value:
                raise ValueError(f"{text}: several shapes with a parents list need a list of quoted shapes, "
                                 f"quoted again for the shell: 'draft=[\"parents:[-1,0,0]\",chain:3]'")
            out.append(f"draft=['{value}']")
            continue
        try:
            ov = parser.parse_override(f"{key}={value}")
        except Exception as e:
            raise ValueError(f"{text}: not a valid override ({e})") from None
        if ov.is_sweep_override():
            if key not in AXES:
                raise ValueError(f"{text}: only the grid's axes take several values ({', '.join(AXES)}); "
                                 "run one sweep per model, GPU, engine and seed")
            values = [str(v) for v in ov.sweep_string_iterator()]
            if key == "draft" and all(v.isdigit() for v in values):
                raise ValueError(f"{text}: Hydra reads this as {len(values)} drafts, one level of width "
                                 f"{' and '.join(dict.fromkeys(values))}; write draft=[{value}] for the ({value}) "
                                 f"tree, or draft=[chain:3,'{value}'] for an axis of several shapes")
            out.append(f"{key}=[{','.join(values)}]")
        else:
            out.append(f"{key}={value}")
    return out


def draft_axis(value: Any) -> list[str | None]:
    """The draft shapes a grid's ``draft`` names, one per point: a flat list of integers is one tree (``[3,3,3]``:
    the (3,3,3) tree), a list of strings or lists is an axis (``[chain:3,'3,3,3',[2,2]]``), a single shape is
    an axis of one; ``none`` (or null) is speculation off. Each shape as a string (``"3,3,3"``)."""
    if isinstance(value, (list, tuple)):
        if value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return [",".join(map(str, value))]
        out = []
        for v in value:
            if isinstance(v, (list, tuple)):
                out.append(",".join(map(str, v)))
            elif v is None or isinstance(v, str):
                out.append(v)
            else:
                raise ValueError(f"draft={list(value)}: {v!r} is neither a shape nor a list of widths; a list of "
                                 "integers alone is one tree (draft=[3,3,3]), an axis lists shapes "
                                 "(draft=[chain:3,'3,3,3'], quoted whole for the shell: \"draft=[chain:3,'3,3,3']\", "
                                 "or the inner quotes are lost)")
        return out
    return [value if value is None or isinstance(value, str) else str(value)]


def compose_sweep(overrides: Sequence[str]) -> DictConfig:
    return compose("sweep", normalize_overrides(overrides))


def as_list(x) -> list:
    if x is None:
        return []
    return list(x) if isinstance(x, (list, tuple)) else [x]


def validate(cfg: dict[str, Any]) -> None:
    """Clear errors, naming the input and the valid choices, before anything runs."""
    known_wl = sorted(p.stem for p in (conf_dir() / "workload").glob("*.yaml"))
    for w in as_list(cfg.get("workloads")):
        if w not in known_wl:
            raise ValueError(f"workload={w}: unknown; choose from {', '.join(known_wl)} (conf/workload/)")
    for g in as_list(cfg.get("gmu")):
        if not isinstance(g, (int, float)) or not 0 < float(g) <= 1:
            raise ValueError(f"gmu={g}: must be in (0, 1]")
    kv = (cfg.get("engine") or {}).get("kv_cache_bytes")
    if kv is not None and (not isinstance(kv, int) or isinstance(kv, bool) or kv <= 0):  # True is an int
        raise ValueError(f"engine.kv_cache_bytes={kv}: must be a whole number of bytes > 0 (or null to size the "
                         "pool from gmu)")
    if kv and len(as_list(cfg.get("gmu"))) > 1:
        raise ValueError(f"gmu={as_list(cfg.get('gmu'))} with engine.kv_cache_bytes={kv}: the pool is sized by "
                         "kv_cache_bytes, so every gmu would run the same point; give one gmu, or "
                         "engine.kv_cache_bytes=null to sweep gmu")
    for s in as_list(cfg.get("strategy")):
        if s not in strategies.names():
            raise ValueError(f"strategy={s}: unknown; choose from {', '.join(strategies.names())}")
    for c in as_list(cfg.get("concurrency")):
        if not isinstance(c, int) or c < 1:
            raise ValueError(f"concurrency={c}: must be a whole number >= 1")
    for r in as_list(cfg.get("rate")):
        if not isinstance(r, (int, float)) or r <= 0:
            raise ValueError(f"rate={r}: must be > 0 requests/s")
    for d in draft_axis(cfg.get("draft")):
        if d not in (None, "none"):
            tree = parse_draft(d, root=True)
            if tree.num_drafts < 1:
                raise ValueError(f"draft={d}: a draft needs at least one token; draft=none is speculation off")
            # a step verifies every node of the tree for a request at once: they must fit the request's length
            # and the step's token budget, or no request can ever run (every point would fail)
            fit = min(int(cfg["max_model_len"]), int(cfg["max_num_batched_tokens"]))
            if tree.num_nodes > fit:
                raise ValueError(f"draft={d}: a step verifies {tree.num_nodes} tokens per request, more than "
                                 f"max_model_len={cfg['max_model_len']} or max_num_batched_tokens="
                                 f"{cfg['max_num_batched_tokens']} allow ({fit}); use a smaller draft or raise them")
    if "slo" in cfg:                                     # goodput's objectives: checked before the first point
        from analysis.goodput import SLO

        SLO.from_config(cfg["slo"])
    if "percentiles" in cfg:                             # the report's percentiles: checked before the first point
        from analysis.metrics import Percentiles

        Percentiles.from_config(cfg["percentiles"])
    failed = (cfg.get("thresholds") or {}).get("failed_requests")
    if "thresholds" in cfg and (not isinstance(failed, (int, float)) or isinstance(failed, bool)
                                or not 0 <= failed < 1):
        raise ValueError(f"thresholds.failed_requests={failed}: the fraction of a point's requests that may fail "
                         "before the point does; give a number in [0, 1), e.g. 0.01")
    th = cfg.get("thresholds") or {}
    peak, pre = th.get("peak_kv_usage"), th.get("preemptions")
    if "thresholds" in cfg and (not isinstance(peak, (int, float)) or isinstance(peak, bool) or not 0 < peak <= 1):
        raise ValueError(f"thresholds.peak_kv_usage={peak}: the KV pool's usage (a fraction) at which requests "
                         "waiting with seats free count as waiting for memory; give a number in (0, 1], e.g. 0.95")
    if "thresholds" in cfg and (not isinstance(pre, int) or isinstance(pre, bool) or pre < 1):
        raise ValueError(f"thresholds.preemptions={pre}: the preemptions that make a point memory-bound; give a "
                         "whole number >= 1")
    at = (cfg.get("requests") or {}).get("at_concurrency")
    if at is not None and (not isinstance(at, dict) or not all(
            isinstance(c, int) and not isinstance(c, bool) and c >= 1 and isinstance(n, int)
            and not isinstance(n, bool) and n >= 1 for c, n in at.items())):
        raise ValueError(f"requests.at_concurrency={at}: requests per point at given concurrencies, a mapping of "
                         "whole numbers >= 1 (requests.at_concurrency={1: 64}); the rule sizes the others")
    for axis in AXES:
        if axis in cfg and isinstance(cfg[axis], (list, tuple)) and not cfg[axis]:
            raise ValueError(f"{axis}=[]: the grid needs at least one value on every axis")
    seed = cfg["seed"]
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed={seed}: one whole number per sweep; run one sweep per seed (out=DIR each)")
    reps = cfg.get("repeats", 1)
    if isinstance(reps, bool) or not isinstance(reps, int) or reps < 1:
        raise ValueError(f"repeats={reps}: the runs of every design point, a whole number >= 1 (e.g. repeats=3)")
    jobs = cfg.get("jobs", 1)    # a sweep's setting (conf/sweep.yaml); python -m harness.point has none
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs={jobs}: must be a whole number >= 1 (points run in parallel on this machine)")


def _axis_values(axis: str, value: Any) -> list:
    """An axis' values in one comparable form: drafts as :func:`draft_axis` spells them (speculation off as
    None), gmu and rates as floats, the rest as given."""
    if axis == "draft":
        return [None if d in (None, "none") else d for d in draft_axis(value)]
    vals = as_list(value)
    return [float(v) if axis in ("gmu", "rate") and isinstance(v, (int, float)) and not isinstance(v, bool) else v
            for v in vals]


def sub_grids(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """The Cartesian products a config's grid is the union of: the config itself, or with ``grids`` one config per
    sub-grid (its axes, restricted to the config's own values of each axis; its ``variant`` and ``engine``
    settings merged in). Raises ValueError naming the input: a sub-grid key that is not an axis, ``variant`` or
    ``engine``; engine settings without a variant name, or a setting the engine does not have; one variant name
    with two settings; a value of the config's axes that no sub-grid has (it would select nothing); a filter
    that leaves no point."""
    grids = cfg.get("grids")
    if grids is None:
        return [cfg]
    name = cfg.get("sweep_name", "this sweep")
    if not isinstance(grids, (list, tuple)) or not grids or not all(isinstance(g, dict) for g in grids):
        raise ValueError(f"grids={grids!r} (sweep={name}): a list of sub-grids, each a mapping of axes "
                         f"({', '.join(AXES)}) and optionally variant: NAME with engine: {{...}} settings; or "
                         "grids=null for the preset's axes as one Cartesian product")
    engine = dict(cfg.get("engine") or {})
    wanted = {axis: _axis_values(axis, cfg.get(axis)) for axis in AXES if axis in cfg}   # the filter, once
    out, variants, seen = [], {}, {axis: [] for axis in AXES}
    for i, g in enumerate(grids):
        where = f"grids[{i}] of sweep={name}"
        bad = sorted(set(g) - set(SUB_GRID_KEYS))
        if bad:
            raise ValueError(f"{where}: {', '.join(bad)} is not a sub-grid key; a sub-grid gives axes "
                             f"({', '.join(AXES)}), a variant name and its engine settings")
        variant, settings = g.get("variant"), dict(g.get("engine") or {})
        if settings and variant is None:
            raise ValueError(f"{where}: engine settings {settings} need a variant name (variant: piecewise), which "
                             "the points' ids carry, or they would take the ids of the same points without them")
        if variant is not None:
            if not isinstance(variant, str) or not VARIANT_NAME.fullmatch(variant):
                raise ValueError(f"{where}: variant={variant!r}: a lower-case name of letters, digits and _ "
                                 "(it becomes part of the point ids), e.g. variant: piecewise")
            unknown = sorted(set(settings) - set(engine))
            if unknown:
                raise ValueError(f"{where}: engine.{', engine.'.join(unknown)} is not a setting of "
                                 f"engine={engine.get('name')} (its settings: {', '.join(sorted(engine))}); the "
                                 f"variant {variant} was written for another engine: run the preset with that "
                                 "engine, or give grids=null for its axes as one product without variants")
            if variants.setdefault(variant, settings) != settings:
                raise ValueError(f"{where}: variant {variant} with engine settings {settings}, another sub-grid "
                                 f"gives it {variants[variant]}; one name per set of settings")
        sub = {k: v for k, v in cfg.items() if k != "grids"}
        empty = False
        for axis in AXES:
            if axis not in g:           # the sub-grid takes the config's values: each is had
                seen[axis] += wanted.get(axis, [])
                continue
            mine = _axis_values(axis, g[axis])
            seen[axis] += mine
            keep = [v for v in mine if v in wanted.get(axis, [])]
            if axis == "draft":
                keep = ["none" if v is None else v for v in keep]
            sub[axis], empty = keep, empty or not keep
        if empty:
            continue
        if variant is not None:
            sub["variant"] = variant
            sub["engine"] = {**engine, **settings}
        out.append(sub)
    for axis, values in wanted.items():   # the config's axes select: a value no sub-grid has selects nothing
        missing = [v for v in values if v not in seen[axis]]
        if missing:
            shown = ", ".join("none" if v is None else str(v) for v in missing)
            have = ", ".join(dict.fromkeys("none" if v is None else str(v) for v in seen[axis]))
            raise ValueError(f"{axis}={shown}: no sub-grid of sweep={name} has it (they have {have}); choose "
                             f"among those, or give grids=null to run the preset's axes as one Cartesian product")
    if not out:
        raise ValueError(f"the axes given ({', '.join(f'{a}={cfg.get(a)}' for a in AXES if a in cfg)}) select no "
                         f"point of sweep={name}'s sub-grids: each sub-grid lacks one of them")
    return out


def point_configs(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """Every point of the grid as a plain, fully resolved config (see harness.point); a union of sub-grids
    (``grids``) in the order of its sub-grids, each point once."""
    cfg = dict(cfg)
    if cfg.get("workload") and isinstance(cfg["workload"], str):   # a point job's scalar axes
        cfg["workloads"] = [cfg["workload"]]
    out: dict[tuple, dict[str, Any]] = {}
    for sub in sub_grids(cfg):
        for p in _product(sub):
            # the point's place, as its id (harness.point.point_id) spells it: sub-grids may overlap
            place = (p["workload_name"], p["gmu"], (p["engine"] or {}).get("kv_cache_bytes"), p.get("variant"),
                     json.dumps(p["load"], sort_keys=True), p["draft"], p["strategy"], p.get("repeat"))
            if place in out and out[place] != p:
                raise ValueError(f"the point {place[:2] + place[3:]}: two sub-grids of sweep={cfg.get('sweep_name')} "
                                 "give it different settings; a sub-grid that changes settings needs its own "
                                 "variant name")
            out.setdefault(place, p)
    return list(out.values())


def _product(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """The points of one Cartesian product (a sub-grid) as resolved configs."""
    validate(cfg)
    engine = dict(cfg["engine"])
    engine_name = resolve_engine(engine["name"], quiet=True)
    if engine_name != engine["name"]:     # a config composed without harness.config.compose (which resolves auto)
        if set(engine) != {"name"}:
            raise ValueError(f"engine=auto with engine.{', engine.'.join(sorted(set(engine) - {'name'}))} set: auto "
                             f"has no settings of its own; name the engine (engine={engine_name}) or compose the "
                             "config with harness.config.compose, which resolves auto first")
        engine = engine_config(engine_name)
    rule = cfg["requests"]
    reps = int(cfg.get("repeats", 1))
    names = as_list(cfg["workloads"])
    settings = cfg.get("workload") if isinstance(cfg.get("workload"), dict) else {}
    out = []
    for wname, wl in zip(names, workload_configs(names, settings)):
        if (cfg.get("requests_from") or {}).get(wname):
            wl = exported(wl, cfg["requests_from"][wname], wname)
        given = wl.get("path")
        if given and not Path(str(given)).expanduser().exists():   # every point of it would fail on the file
            raise ValueError(f"workload.path={given} (workload={wname}): no such file; point it at the data, or "
                             "leave it null for the workload's default source")
        kind = (wl.get("arrival") or {}).get("kind", "closed")
        if kind == "trace":
            raise ValueError(f"workload={wname} with arrival.kind=trace: a sweep offers open-loop load at the rates "
                             f"of its rate axis, and a trace's timestamps set their own; use arrival.kind=poisson or "
                             f"gamma (workload.arrival.kind=poisson), or see the trace with `python -m harness "
                             f"workloads describe workload={wname} workload.arrival.kind=trace`")
        if kind == "closed":
            fixed = {int(c): int(n) for c, n in (rule.get("at_concurrency") or {}).items()}
            loads = [({"kind": "closed", "concurrency": int(c)},
                      fixed.get(int(c), max(int(rule["min"]), int(rule["per_concurrency"]) * int(c))))
                     for c in as_list(cfg["concurrency"])]
        else:
            shape = (wl.get("arrival") or {}).get("burstiness")
            burst = float(shape) if shape is not None else POISSON_BURSTINESS
            loads = [({"kind": kind, "rate": float(r), "burstiness": burst},
                      max(int(rule["min"]), int(float(rule["per_rate"]) * float(r))))
                     for r in as_list(cfg["rate"])]
        for gmu in as_list(cfg["gmu"]):
            for load, n in loads:
                for draft in draft_axis(cfg["draft"]):
                    no_spec = draft in (None, "none")
                    # Speculation off is one baseline per (workload, gmu, load): no strategy is involved (vLLM
                    # runs its own path, the plugin stays inert), so it runs once, recorded under store_all.
                    for strategy, repeat in itertools.product(
                            ["store_all"] if no_spec else as_list(cfg["strategy"]), range(1, reps + 1)):
                        out.append({
                            "model": cfg["model"], "gpu": cfg["gpu"], "engine": engine, "workload": wl,
                            "workload_name": wname, "strategy": strategy,
                            "strategy_options": strategy_configs.of(cfg, strategy),
                            "draft": None if no_spec else draft, "gmu": float(gmu), "load": load,
                            "requests": n, "max_num_seqs": cfg["max_num_seqs"],
                            "max_num_batched_tokens": cfg["max_num_batched_tokens"],
                            "max_model_len": cfg["max_model_len"], "seed": cfg["seed"],
                            "failed_requests": float(cfg["thresholds"]["failed_requests"]),
                            **({"variant": cfg["variant"]} if cfg.get("variant") else {}),
                            **({"repeat": repeat} if reps > 1 else {})})
    _refuse_what_the_engine_cannot_run(engine, out)
    return out


def _refuse_what_the_engine_cannot_run(engine: dict[str, Any], points: list[dict[str, Any]]) -> None:
    """Before the first point: a strategy the (resolved) engine cannot run under speculation is an error naming
    it, when the engine says why (``runs_strategy``); speculation-off points run no strategy."""
    why_not = getattr(engine_class(engine), "runs_strategy", None)
    if why_not is None:
        return
    for strategy in dict.fromkeys(p["strategy"] for p in points if p["draft"] is not None):
        reason = why_not(strategy)
        if reason:
            raise ValueError(f"strategy={strategy} with engine={engine['name']}: {reason}")


def workload_configs(names: Sequence[str], settings: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Each swept workload's config (``conf/workload/<name>.yaml``) with the ``workload.`` settings merged in:
    ``workload.<name>.<key>=`` sets that workload (``workload.burstgpt.path=FILE`` in a grid of several),
    ``workload.<key>=`` every swept workload that has the key (``workload.seed=3``). A key its workloads do not
    have is an error naming the closest keys, never dropped; the points record the merged configs."""
    import difflib

    loaded = [OmegaConf.load(conf_dir() / "workload" / f"{n}.yaml") for n in names]
    settings = dict(settings or {})
    scoped = [(names.index(n), settings.pop(n)) for n in list(settings) if n in names]
    for i, given in scoped:
        if not isinstance(given, dict):
            raise ValueError(f"workload.{names[i]}={given}: set that workload's keys, e.g. "
                             f"workload.{names[i]}.path=FILE")
    for targets, given, label in [(range(len(names)), settings, "")] + \
            [([i], given, f"{names[i]}.") for i, given in scoped]:
        for key, value in _flat(given):
            took = False
            for i in targets:
                if _settable(loaded[i], key):
                    loaded[i], took = OmegaConf.merge(loaded[i], _nested(key, value)), True
            if not took:
                keys = sorted({k for i in targets for k, _ in _flat(OmegaConf.to_container(loaded[i]))})
                near = difflib.get_close_matches(key, keys, n=3) or keys[:8]
                whose = f"{names[targets[0]]} has no" if label else \
                    f"none of the swept workloads ({', '.join(names)}) has"
                raise ValueError(f"workload.{label}{key}={value}: {whose} {key}; "
                                 f"did you mean {' or '.join(f'workload.{label}{k}' for k in near)}?")
    return [OmegaConf.to_container(w, resolve=True) for w in loaded]


def _settable(workload: DictConfig, key: str) -> bool:
    """Whether ``key`` names a setting of ``workload``: a key it has, or one below a key it leaves null (most
    workloads leave ``filters`` null; ``workload.filters.max_prompt_len=1024`` sets one)."""
    parts = key.split(".")
    for n in range(len(parts), 0, -1):
        found = OmegaConf.select(workload, ".".join(parts[:n]), throw_on_missing=False, default=_ABSENT)
        if found is not _ABSENT:
            return n == len(parts) or found is None
    return False


_ABSENT = object()


def _flat(d: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """``{"arrival": {"kind": "poisson"}}`` → ``[("arrival.kind", "poisson")]``; a leaf is a non-dict value."""
    items = []
    for k, v in d.items():
        if isinstance(v, dict) and v:
            items += _flat(v, f"{prefix}{k}.")
        else:
            items.append((f"{prefix}{k}", v))
    return items


def _nested(key: str, value: Any) -> dict[str, Any]:
    """``("arrival.kind", "poisson")`` → ``{"arrival": {"kind": "poisson"}}`` (the value as it is: no reparsing)."""
    *path, last = key.split(".")
    node: dict[str, Any] = {last: value}
    for part in reversed(path):
        node = {part: node}
    return node


def exported(wl: dict[str, Any], path: str, name: str) -> dict[str, Any]:
    """``requests_from.<workload>=FILE``: the same requests from an export (``workloads export``), e.g. on a
    host without the dataset; the point keeps the workload's name and says where they came from."""
    if not Path(path).expanduser().is_file():
        raise ValueError(f"requests_from.{name}={path}: no such file; write it with `python -m harness workloads "
                         f"export workload={name} out={path}` where the dataset is")
    return {"source": "lengths", "path": str(path), "shuffle": False, "filters": None, "seed": wl.get("seed", 0),
            "arrival": wl.get("arrival"), "num_requests": wl.get("num_requests"), "export_of": wl}
