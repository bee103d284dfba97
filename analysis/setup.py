"""What ran, as a reader checks it before believing a number: engine, GPUs and tensor parallelism, weights, where
acceptance came from, CUDA-graph mode, the GDN code path, the tokenizer and (simulator) the calibration.

:func:`setup` reads it from the points' summaries (what each point recorded, not what the sweep asked for);
:func:`setup_line` says it in one line for the console and the reports' first page. A fact the points disagree on
is listed with each value; one they did not record reads "not recorded".
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any, Iterable

NOT_RECORDED = "not recorded"


def _join(values: Iterable[str]) -> str:
    seen = list(dict.fromkeys(v for v in values if v))
    return " / ".join(seen) if seen else NOT_RECORDED


def _gpu(s: dict[str, Any]) -> str:
    cfg = s.get("config") or {}
    eng = cfg.get("engine") or {}
    tp = int(eng.get("tensor_parallel_size") or 1)
    t = s.get("telemetry") or {}
    name = t.get("device") if s.get("engine") == "vllm" and t.get("device") else (cfg.get("gpu") or {}).get("name", "?")
    name = str(name).upper() if name and name.islower() else str(name)
    name = name.removesuffix(f" x{tp}")        # vLLM's device string may count the GPUs already
    simulated = "simulated " if s.get("engine") == "sim" else ""
    return f"{tp}x {simulated}{name} (TP {tp})"


def _weights(s: dict[str, Any]) -> str:
    if s.get("engine") == "sim":
        return "none (simulated)"
    w = (s.get("telemetry") or {}).get("weights") or ((s.get("config") or {}).get("engine") or {}).get("load_format")
    if not w:
        return NOT_RECORDED
    return "dummy (random: outputs meaningless, timings real)" if "dummy" in str(w) else str(w)


def _acceptance(s: dict[str, Any]) -> str | None:
    """Where the accepted counts came from; None for speculation off (nothing to accept)."""
    cfg = s.get("config") or {}
    if not cfg.get("draft"):
        return None
    if s.get("engine") == "vllm":
        a = (s.get("telemetry") or {}).get("acceptance")
        return f"{a} (imposed)" if a and str(a).startswith("synthetic") else (a or NOT_RECORDED)
    rates = ((cfg.get("engine") or {}).get("acceptance") or {}).get(str(cfg["draft"]))
    return f"synthetic {json.dumps(rates)} (imposed)" if rates else "synthetic (imposed, conf/acceptance)"


def _graphs(s: dict[str, Any]) -> str:
    if s.get("engine") == "sim":
        mode = ((s.get("config") or {}).get("engine") or {}).get("mode")
        return f"simulated {mode} step overhead" if mode else NOT_RECORDED
    server = (s.get("telemetry") or {}).get("server") or {}
    ran = server.get("graph_mode")           # read from vLLM's log: what ran, not what was asked
    if ran:
        return str(ran)
    asked = ((s.get("config") or {}).get("engine") or {})
    if asked.get("enforce_eager"):
        return "eager (requested; the log was not read)"
    return f"{asked.get('cudagraph_mode') or 'default'} (requested; the log was not read)"


def _gdn(s: dict[str, Any]) -> str:
    if s.get("engine") == "sim":
        from harness.config import parse_draft
        from harness.engines.sim.step_time import gdn_profile

        cfg = s.get("config") or {}
        eng = cfg.get("engine") or {}
        tree = parse_draft(cfg["draft"], root=True) if cfg.get("draft") else None
        if gdn_profile(eng, str(eng.get("mode")), cfg.get("strategy", ""), tree, num_layers=1)[0]:   # as it ran
            return "modelled (its op's measured per-layer time, fitted scale)"
        return "modelled (state bytes moved per step)"
    said = ((s.get("telemetry") or {}).get("server") or {}).get("gdn_commit")
    if not said and (s.get("config") or {}).get("strategy") == "store_all":
        return "vLLM's own kernel (store_all)"     # the plugin leaves store_all to vLLM
    return said or NOT_RECORDED


def _tokenizer(s: dict[str, Any]) -> str:
    w = (s.get("config") or {}).get("workload") or {}
    tok = w.get("tokenizer") or (w.get("replay_of") or {}).get("tokenizer")
    if tok:
        return str(tok)
    return "none (synthetic lengths)" if w.get("source") in ("synthetic", None) else NOT_RECORDED


def _calibration(s: dict[str, Any]) -> str | None:
    if s.get("engine") != "sim":
        return None
    line = ((s.get("config") or {}).get("engine") or {}).get("calibration") or NOT_RECORDED
    why = (s.get("telemetry") or {}).get("calibration_stale")
    return f"{line} [STALE: {why}]" if why else line


def _by_value(pairs: dict[str, list[str]]) -> str:
    """``{key: [values]}`` as one value where every key has the same, else ``key, key: value; key: value``."""
    keys: dict[str, list[str]] = defaultdict(list)
    for k, values in sorted(pairs.items()):
        keys[_join(values)].append(k)
    if len(keys) == 1:
        return next(iter(keys))
    return "; ".join(f"{', '.join(ks)}: {v}" for v, ks in keys.items()) if keys else NOT_RECORDED


def setup(summaries: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The setup of the points in ``summaries`` (their summary.json dicts): each fact as one string; the GDN code
    path by strategy (speculation off has none) and the tokenizer by workload, where they differ."""
    facts: dict[str, list[str]] = defaultdict(list)
    gdn: dict[str, list[str]] = defaultdict(list)
    tokenizer: dict[str, list[str]] = defaultdict(list)
    engines = []
    for s in summaries:
        engine = s.get("engine") or "?"
        version = (s.get("telemetry") or {}).get("vllm_version") or (s.get("provenance") or {}).get("vllm")
        engines.append(f"vllm {version}" if engine == "vllm" and version else engine)
        facts["gpu"].append(_gpu(s))
        facts["weights"].append(_weights(s))
        if (a := _acceptance(s)) is not None:
            facts["acceptance"].append(a)
        facts["graphs"].append(_graphs(s))
        tokenizer[(s.get("config") or {}).get("workload_name", "?")].append(_tokenizer(s))
        if (c := _calibration(s)) is not None:
            facts["calibration"].append(c)
        cfg = s.get("config") or {}
        if cfg.get("draft"):
            gdn[cfg.get("strategy", "?")].append(_gdn(s))
    if not engines:
        return {}            # no point to read a setup from (all damaged, or none run yet)
    out = {"engine": _join(engines), **{k: _join(facts.get(k, [])) for k in ("gpu", "weights", "graphs")},
           **({"calibration": _join(facts["calibration"])} if facts.get("calibration") else {})}
    out["acceptance"] = _join(facts["acceptance"]) if facts.get("acceptance") else "none (no speculation)"
    out["gdn"] = _by_value(gdn) if gdn else "none (no speculation)"
    out["tokenizer"] = _by_value(tokenizer)
    return out


def setup_line(st: dict[str, Any] | None) -> str | None:
    """One line: ``setup: engine vllm 0.26.0; 1x NVIDIA H200 (TP 1); weights dummy ...``."""
    if not st:
        return None
    parts = [f"engine {st['engine']}", st["gpu"], f"weights {st['weights']}", f"acceptance {st['acceptance']}",
             f"CUDA graphs {st['graphs']}", f"GDN code path {st['gdn']}", f"tokenizer {st['tokenizer']}"]
    if st.get("calibration"):
        parts.append(f"calibration {st['calibration']}")
    return "setup: " + " | ".join(parts)
