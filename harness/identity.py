"""What a result folder holds: the identity of its experiment, checked before a sweep writes into it.

A point id (harness.point.point_id) names a point's place in the grid (workload, memory budget, load, draft,
strategy), not the experiment around it. Two commands that share point ids but not the model, GPU, engine
settings or the data behind a workload would otherwise write into one folder as if they were one experiment
(and the later sweep.json would relabel the earlier points). The identity is what changes a point's numbers:

    model        name and a hash of its shape (conf/model)
    gpu          name and a hash of its spec (conf/gpu)
    engine       name and every setting except the operational ones (:data:`OPERATIONAL`: timeouts, ports,
                 log folders, how often to sample)
    run          seed, max_num_seqs, max_model_len, max_num_batched_tokens; the request-count rule (a folder) or
                 count (a point)
    workloads    per swept workload: its settings and the sha256 of the file it reads (null for a generated one)
    strategies   per strategy of the grid: its run options (conf/strategies/), which its point id does not spell
    variants     per variant of a union of sub-grids (harness.grid.sub_grids): its engine settings, which differ
                 from the folder's ``engine`` in what the variant sets (its points' ids carry its name)
    analysis     the baseline and the thresholds (sweep.json only: they decide the verdicts, not the points)

Provenance (commit, host, versions, time) is not identity: a sweep resumes across hosts and commits. The grid's
axes are not identity either: a folder's grid grows when a command adds a gmu or a strategy with the same
identity (sweep.json records the union). A folder written before identities were recorded is read through its
stored points' configs (:func:`legacy`), without source hashes, which those never recorded.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Iterable

# engine settings that change how a run is watched or described, not what it measures (the simulator's
# `calibration` is a label of its constants and `calibration_fit` the record of their fit; the constants themselves
# are identity)
OPERATIONAL = frozenset({"module", "model_dir", "model_root", "port", "startup_timeout_s", "request_timeout_s",
                         "health_every_s", "health_timeout_s", "health_failures", "metrics_hz", "progress_s",
                         "log_dir", "env", "warmup_requests", "kv_usage_samples", "calibration",
                         "calibration_fit"})
RUN_KEYS = ("seed", "max_num_seqs", "max_model_len", "max_num_batched_tokens")
_SHA: dict[tuple[str, int, int], str] = {}      # (path, size, mtime_ns) -> sha256, per process


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def file_sha256(path: str | os.PathLike) -> str | None:
    """sha256 of a file's bytes (None when it cannot be read); cached per (path, size, mtime)."""
    try:
        p = Path(path).expanduser().resolve()
        st = p.stat()
    except OSError:
        return None
    key = (str(p), st.st_size, st.st_mtime_ns)
    if key not in _SHA:
        h = hashlib.sha256()
        try:
            with open(p, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
        except OSError:
            return None
        _SHA[key] = h.hexdigest()
    return _SHA[key]


def source_file(wl: dict[str, Any]) -> str | None:
    """The file a workload config reads (its path, or the source's default), or None for a generated one."""
    if wl.get("path"):
        return str(wl["path"])
    source = wl.get("source")
    if source == "sharegpt":
        try:
            from workloads.sharegpt import default_path

            return str(default_path())
        except Exception:       # the package is missing: the point fails on it and says so
            return None
    if source == "spec_bench":
        from workloads.spec_bench import DEFAULT_PATH

        return str(DEFAULT_PATH)
    if source == "burstgpt":
        from workloads.burstgpt import ENV_PATH

        return os.environ.get(ENV_PATH)
    return None


def workload_identity(wl: dict[str, Any], hash_source: bool = True) -> dict[str, Any]:
    """A workload's settings (the per-point request count and arrival, which the grid sets, left out) and the
    sha256 of its file."""
    settings = {k: v for k, v in wl.items() if k not in ("num_requests", "arrival")}
    if "export_of" in settings:
        settings["export_of"] = {k: v for k, v in settings["export_of"].items()
                                 if k not in ("num_requests", "arrival")}
    out: dict[str, Any] = {"settings": settings}
    if hash_source:
        f = source_file(wl)
        out["source_sha256"] = file_sha256(f) if f else None
    return out


def point_identity(p: dict[str, Any], hash_source: bool = True) -> dict[str, Any]:
    """The identity of one point's experiment (its own workload only), from its resolved config
    (harness.grid.point_configs); ``hash_source=False`` for a stored config whose file is not at hand."""
    engine = p["engine"]
    return {
        "model": {"name": p["model"]["name"], "config": _digest(p["model"])},
        "gpu": {"name": p["gpu"]["name"], "config": _digest(p["gpu"])},
        "engine": {"name": engine["name"],
                   "settings": {k: v for k, v in engine.items() if k not in OPERATIONAL and k != "name"}},
        "run": {k: p.get(k) for k in RUN_KEYS},
        "requests": p.get("requests"),
        "workloads": {p["workload_name"]: workload_identity(p["workload"], hash_source)},
        # a strategy's run options change its numbers (buffer_len, store_selective's threshold, store_delta's
        # codec) while its point id does not say them: a resume with other options is another experiment
        "strategies": {p["strategy"]: dict(p.get("strategy_options") or {})},
    }


def sweep_identity(points: Iterable[dict[str, Any]], baseline: str | None, thresholds: dict[str, Any] | None,
                   requests: Any = None) -> dict[str, Any]:
    """The folder's identity for a grid: the points' shared identity, every workload's, the request-count rule
    (``requests``: the sweep's ``requests``; each point's count follows from it and the load), the analysis
    settings. Raises ValueError if the grid's points disagree outside their axes (a bug in the grid)."""
    out: dict[str, Any] | None = None
    engines: dict[str, dict[str, Any]] = {}      # variant ("" for the plain points) -> its engine identity
    for p in points:
        one = point_identity(p)
        one.pop("requests")
        variant = p.get("variant") or ""
        engine = one.pop("engine")
        if engines.setdefault(variant, engine) != engine:
            raise ValueError(f"the grid's points{f' of variant {variant}' if variant else ''} differ in engine: "
                             f"{engine} vs {engines[variant]}")
        if out is None:
            out = one
            continue
        for k in ("model", "gpu", "run"):
            if one[k] != out[k]:
                raise ValueError(f"the grid's points differ in {k}: {one[k]} vs {out[k]}")
        out["workloads"].update(one["workloads"])
        out["strategies"].update(one["strategies"])
    out = out or {"workloads": {}}
    if "" in engines:
        out["engine"] = engines[""]
    if set(engines) - {""}:
        out["variants"] = {v: e for v, e in engines.items() if v}
    if requests is not None:
        out["run"] = {**out.get("run", {}), "requests": requests}
    out["analysis"] = {"baseline": baseline, "thresholds": thresholds}
    return out


def with_hash(identity: dict[str, Any]) -> dict[str, Any]:
    """``identity`` with ``hash``: a digest of everything but the workloads', the strategies' options, the variants'
    and the analysis' (which a folder may extend: a grid adds a workload, a strategy or a variant), for quick
    comparison in summaries;
    a resume compares the whole identity (:func:`differences`)."""
    return {**identity, "hash": _digest({k: v for k, v in identity.items()
                                         if k not in ("workloads", "analysis", "hash", "strategies", "variants")})}


def differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Where ``new`` disagrees with ``old``, as 'field: old -> new' lines; a key only one side has (a legacy
    folder has no source hashes; a grid adds a workload) is no disagreement."""
    out: list[str] = []

    def walk(a: Any, b: Any, where: str) -> None:
        if isinstance(a, dict) and isinstance(b, dict):
            for k in a.keys() & b.keys():
                if k == "hash":
                    continue
                walk(a[k], b[k], f"{where}.{k}" if where else str(k))
        elif a != b and not (a is None and where.endswith("source_sha256")):
            out.append(f"{where}: {_short(a)} -> {_short(b)}")

    walk(old, new, "")
    return sorted(out)


def _short(x: Any) -> str:
    s = json.dumps(x, sort_keys=True, default=str)
    return s if len(s) <= 80 else s[:77] + "..."


def legacy(summaries: Iterable[dict[str, Any]], sweep_cfg: dict[str, Any]) -> dict[str, Any] | None:
    """The identity of a folder written before identities were recorded: from its stored points' configs (no
    source hashes: the files they read are not known) and its sweep.json's baseline and thresholds. None for a
    folder without a stored config."""
    ident = None
    for s in summaries:
        cfg = s.get("config")
        if not isinstance(cfg, dict) or "engine" not in cfg or "workload" not in cfg:
            continue
        try:
            one = point_identity(cfg, hash_source=False)
        except KeyError:
            continue
        one.pop("requests")
        if ident is None:
            ident = one
        else:
            ident["workloads"].update(one["workloads"])
    if ident is not None:
        ident["analysis"] = {"baseline": sweep_cfg.get("baseline"), "thresholds": sweep_cfg.get("thresholds")}
    return ident
