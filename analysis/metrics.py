"""Per-point serving metrics from per-request records, as ``vllm bench serve`` reports them.

Input: the records of one point (dicts or objects with ``arrival_s``, ``first_token_s``,
``finish_s``, ``prompt_len``, ``output_tokens``, ``error``). Seconds and tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import numpy as np

from harness.telemetry import PERCENTILES  # the percentiles every point records (one definition)


def _get(r, key):
    return r[key] if isinstance(r, Mapping) else getattr(r, key)


def point_metrics(records: Iterable, telemetry: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Throughput (output, total, requests/s), TTFT, TPOT and E2E mean and :data:`PERCENTILES` (TPOT = (E2E - TTFT)
    / (output tokens - 1) per request, vllm bench serve's), ITL from the telemetry (None where a point recorded
    fewer percentiles),
    plus what the telemetry says (acceptance length, peak KV usage, preemptions, ...)."""
    recs = list(records)
    ok = [r for r in recs if _get(r, "error") is None and _get(r, "finish_s") is not None]
    # a request that finished with fewer tokens than it asked for did not do the work the point measures
    short = sum(1 for r in ok if (_get(r, "output_tokens") or 0) < _get(r, "output_len"))
    errored = sum(1 for r in recs if _get(r, "error") is not None)
    out: dict[str, Any] = {"requests": len(recs), "completed": len(ok) - short, "failed": len(recs) - len(ok) + short,
                           "errored": errored, "unfinished": len(recs) - len(ok) - errored, "short": short}
    if ok:
        arrival = np.array([_get(r, "arrival_s") for r in ok])
        first = np.array([np.nan if _get(r, "first_token_s") is None else _get(r, "first_token_s") for r in ok])
        finish = np.array([_get(r, "finish_s") for r in ok])
        n_out = np.array([_get(r, "output_tokens") for r in ok])
        n_in = np.array([_get(r, "prompt_len") for r in ok])
        span = float(finish.max() - arrival.min())
        ttft = first - arrival
        e2e = finish - arrival
        tpot = np.where(n_out > 1, (finish - first) / np.maximum(n_out - 1, 1), np.nan)
        out.update({
            "duration_s": span,
            "output_throughput": float(n_out.sum() / span) if span > 0 else None,
            "total_throughput": float((n_out.sum() + n_in.sum()) / span) if span > 0 else None,
            "request_throughput": float(len(ok) / span) if span > 0 else None,
            **_dist("ttft", ttft), **_dist("tpot", tpot), **_dist("e2e", e2e),
        })
    if telemetry:
        spec = telemetry.get("spec_decode") or {}
        out.update({
            "acceptance_length": spec.get("acceptance_length"),
            "peak_kv_usage": telemetry.get("peak_kv_usage"),
            "preemptions": telemetry.get("preemptions"),
            "max_running": telemetry.get("max_running"),
            "mean_running": telemetry.get("mean_running"),
            "waiting_for_memory_s": telemetry.get("waiting_for_memory_s"),
            "requests_waited_for_memory": telemetry.get("requests_waited_for_memory"),
            **_evidence(telemetry),
            **_schedule(telemetry.get("loadgen")),
            "num_blocks": telemetry.get("num_blocks"),
            "max_concurrency": telemetry.get("max_concurrency_max_len"),
            "spec_state_bytes": telemetry.get("spec_state_bytes"),
            # per streamed chunk, as vllm bench serve counts it (a chunk may carry several tokens)
            "itl_mean": (telemetry.get("itl_s") or {}).get("mean"),
            **{f"itl_p{p}": (telemetry.get("itl_s") or {}).get(f"p{p}") for p in PERCENTILES},
        })
    return out


def _evidence(telemetry: Mapping[str, Any]) -> dict[str, Any]:
    """The memory-bound evidence (analysis.regimes.memory_bound reads it) and the queue's waits by reason, flat:
    ``memory_evidence`` is its source ('admission': the simulator's decisions; 'metrics': vLLM's samples;
    None: no evidence recorded, e.g. a point stored before it was)."""
    ev = telemetry.get("memory_evidence")
    waits = telemetry.get("waiting_s") or {}
    return {"memory_evidence": ev.get("source") if isinstance(ev, Mapping) else None,
            "memory_refusals": ev.get("refusals") if isinstance(ev, Mapping) else None,
            "blocked_kv_peak": ev.get("blocked_kv_peak") if isinstance(ev, Mapping) else None,
            "blocked_samples": ev.get("blocked_samples") if isinstance(ev, Mapping) else None,
            **{f"wait_{k}_s": v for k, v in waits.items()}}


def _schedule(check: Mapping[str, Any] | None) -> dict[str, Any]:
    """Whether the load generator offered the load it was asked to (harness.engines.vllm.loadgen.self_check:
    p99 lag under 10 ms, achieved rate within 5% of the schedule's); None where nothing checked it (a closed
    loop, the simulator, whose arrivals are exact)."""
    check = check if isinstance(check, Mapping) else {}
    return {"on_schedule": check.get("on_schedule"), "schedule_lag_p99_s": check.get("lag_p99_s"),
            "rate_error": check.get("rate_error")}


def _dist(name: str, x: np.ndarray) -> dict[str, float | None]:
    x = x[~np.isnan(x)]
    if len(x) == 0:
        return {f"{name}_mean": None, **{f"{name}_p{p}": None for p in PERCENTILES}}
    return {f"{name}_mean": float(x.mean()), **{f"{name}_p{p}": float(np.percentile(x, p)) for p in PERCENTILES}}


#: vllm bench serve's --percentile-metrics names -> (this project's metric prefix, label, unit the report shows)
METRICS = {"ttft": ("ttft", "TTFT", "ms"), "tpot": ("tpot", "TPOT", "ms"), "itl": ("itl", "ITL", "ms"),
           "e2el": ("e2e", "E2E", "s")}


@dataclass(frozen=True)
class Percentiles:
    """The latency percentiles the points table and the export show (conf/percentiles/): ``values`` among those
    every point records (analysis.metrics.PERCENTILES), ``metrics`` in vllm bench serve's names."""
    values: tuple[float, ...] = (50, 99)
    metrics: tuple[str, ...] = ("ttft", "tpot", "itl", "e2el")

    @classmethod
    def from_config(cls, cfg: dict[str, Any] | None) -> "Percentiles":
        cfg = dict(cfg or {})
        values = tuple(cfg.get("values", cls.values))
        metrics = tuple(cfg.get("metrics", cls.metrics))
        bad = [v for v in values if isinstance(v, bool) or v not in PERCENTILES]
        if bad or not values:
            raise ValueError(f"percentiles.values={list(values)}: every point records p"
                             f"{'/p'.join(map(str, PERCENTILES))} only; choose among those, e.g. "
                             "percentiles.values=[50,90,99]")
        bad = [m for m in metrics if m not in METRICS]
        if bad:
            raise ValueError(f"percentiles.metrics: {bad[0]!r} is not one of {', '.join(METRICS)} (vllm bench serve's "
                             "--percentile-metrics names)")
        return cls(tuple(values), tuple(metrics))
