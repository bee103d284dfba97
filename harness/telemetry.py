"""What an engine's telemetry holds (a point's ``summary.json`` ``telemetry``): the keys analysis, the reports and
the sweep's time budget read, with their types, and the engine's own. :func:`problems` lists where a telemetry
dict differs; the tests hold every engine to it, so an engine that renames or drops a key fails there instead of
leaving a report's column empty.

Units: seconds (``*_s``), bytes (``*_bytes``), fractions of the pool (``*kv_usage``), requests (``*running``,
``*waiting``), tokens (``block_size``, ``kv_cache_tokens``).
"""
from __future__ import annotations

from typing import Any

NUMBER = (int, float)
#: the percentiles every point records of its latencies (ITL in ``itl_s``; TTFT, TPOT and E2E from its requests,
#: analysis.metrics): the report shows a choice of them (conf/percentiles/)
PERCENTILES = (50, 90, 95, 99)
OPTIONAL_INT = (int, type(None))

#: every engine's telemetry (analysis.metrics, analysis.sweep, harness.budget read these)
COMMON: dict[str, type | tuple[type, ...]] = {
    "engine": str,
    "num_blocks": int, "block_size": int, "blocks_per_request_max_len": int,
    "max_concurrency_max_len": NUMBER,     # requests of max_model_len the pool holds at once
    "kv_usage": list,                      # the pool's usage over the run, sampled
    "timeline": dict,                      # t_s, kv_usage, running, waiting: the same samples, side by side
    "peak_kv_usage": NUMBER, "max_running": int, "mean_running": NUMBER,
    "preemptions": OPTIONAL_INT,           # None: the engine exported no counter (unknown, not zero)
    "waiting_for_memory_s": NUMBER,        # sim: waiting for blocks; vLLM: waiting with seats free
    "requests_waited_for_memory": OPTIONAL_INT,   # None on vLLM: it exports no per-request wait
    "waiting_s": dict,                     # request-seconds queued, by why (batch_slot, memory, ...)
    "memory_evidence": (dict, type(None)),  # what classifies the point (analysis.regimes); None: no samples
    "spec_decode": dict,                   # drafts and accepted tokens per position
    "spec_state_bytes": OPTIONAL_INT,      # the strategy's speculative state per request (None: not known)
    "itl_s": dict,                         # inter-token gaps: mean, p50, p99, ...
    "duration_s": NUMBER,                  # the measured run
}

#: each engine's own keys
BY_ENGINE: dict[str, dict[str, type | tuple[type, ...]]] = {
    "sim": {"steps": int, "pool": dict, "max_concurrency_mean_request": NUMBER,
            "calibration_stale": (str, type(None))},   # why the calibration no longer fits this op (None: it does)
    "vllm": {"vllm_version": str, "device": str, "weights": str, "acceptance": str,
             "server": dict,                # argv, start time, graph mode and capture, the GDN code path
             "kv_cache_tokens": int, "max_waiting": int, "metrics_samples": int, "metrics_hz": NUMBER,
             "metrics_missed": int, "counters": dict, "prefix_caching": str, "loadgen": dict, "warmup": dict,
             "jit_compiles_during_run": dict},
}


#: keys added after points were committed under results/: such a point lacks them, and analysis reads the gap as
#: "not recorded" (analysis.regimes.memory_bound: unknown unless its queue never waited)
ADDED = frozenset({"waiting_s", "memory_evidence", "timeline", "calibration_stale"})


def problems(telemetry: dict[str, Any], stored: bool = False) -> list[str]:
    """Where ``telemetry`` differs from its engine's keys and types: missing keys, wrong types, an unknown
    engine. Empty when it matches. Keys beyond the schema are allowed (an engine may say more). ``stored``: a
    point stored earlier, which may lack the keys in :data:`ADDED`."""
    engine = telemetry.get("engine")
    if engine not in BY_ENGINE:
        return [f"engine={engine!r}: not one of {sorted(BY_ENGINE)}"]
    out = []
    for key, want in {**COMMON, **BY_ENGINE[engine]}.items():
        if stored and key in ADDED and key not in telemetry:
            continue
        if key not in telemetry:
            out.append(f"{key}: missing")
            continue
        v = telemetry[key]
        if isinstance(v, bool) or not isinstance(v, want):
            names = "/".join(t.__name__ for t in (want if isinstance(want, tuple) else (want,)))
            out.append(f"{key}: {type(v).__name__} {v!r:.40}, not {names}")
    return out
