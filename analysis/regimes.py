"""Memory-bound classification and regime-split ratios of each strategy to the baseline.

A (workload, load, memory budget) point is memory-bound when the *baseline's* KV pool bound its batch: a
preemption, or requests that waited for blocks (:func:`memory_bound`; thresholds from conf). Unknown where the
telemetry cannot say.
Ratios are strategy / baseline for throughput and baseline / strategy for latencies ("x lower").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np


@dataclass(frozen=True)
class Thresholds:
    """When a point is memory-bound (values: conf/thresholds/memory_bound.yaml, recorded in each sweep.json)."""
    peak_kv_usage: float                 # the pool's usage, in a sample where requests waited with seats free
    preemptions: int                     # at least this many

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any] | None) -> "Thresholds":
        if not cfg:
            raise ValueError("no memory-bound thresholds: a sweep records them in sweep.json; pass them "
                             "(conf/thresholds/memory_bound.yaml's, or analyze(store, thresholds))")
        # failed_requests (a sweep's too: when a point fails) decides at run time, not here; waited_fraction
        # (older sweeps record it) belonged to the TTFT proxy this classification replaced
        return cls(**{k: v for k, v in dict(cfg).items() if k not in ("failed_requests", "waited_fraction")})


def memory_bound(metrics: Mapping[str, Any], th: Thresholds) -> tuple[bool | None, str]:
    """(memory-bound?, the reason) from the baseline point's metrics: True when its KV pool bound the batch,
    False when it did not, None (unknown) when the telemetry cannot say. The pool bound the batch when a
    preemption happened, or requests waited for blocks: in the simulator, its scheduler refused a waiting request
    for want of blocks (``memory_refusals``); on vLLM, in one /metrics sample requests waited while fewer than
    max_num_seqs ran and the pool's usage was at or above ``th.peak_kv_usage`` (``blocked_kv_peak``, the highest
    such usage). Waiting for a batch slot (every seat taken) or for the step's token budget is not waiting for
    memory; the queue's waits by reason are in the ``wait_*_s`` metrics."""
    pre = metrics.get("preemptions")
    if pre is not None and pre >= th.preemptions:
        return True, f"{pre} preemptions"
    source = metrics.get("memory_evidence")
    if source == "admission":
        refusals = metrics.get("memory_refusals") or 0
        if refusals:
            return True, (f"waiting requests refused for blocks at {refusals} steps "
                          f"(peak KV usage {metrics.get('peak_kv_usage') or 0:.0%})")
        verdict = False
    elif source == "metrics":
        peak = metrics.get("blocked_kv_peak")
        if peak is not None and peak >= th.peak_kv_usage:
            return True, f"requests waited with seats free at {peak:.0%} KV usage (one /metrics sample)"
        verdict = False
    else:
        # no evidence recorded (a point stored before it was, or an engine that exported no samples): only a
        # point at which nothing ever waited with seats free is known not to be bound
        verdict = False if (metrics.get("waiting_for_memory_s") == 0 and pre is not None) else None
    if pre is None:
        return None, "unknown: no preemption counter"
    if verdict is None:
        return None, ("unknown: no memory-bound evidence recorded (stored before the same-sample rule, or no "
                      "/metrics samples)")
    slot = metrics.get("wait_batch_slot_s") or 0
    return False, "pool never bound the batch" + (f" (queued for a batch slot: {slot:.0f} request-s)" if slot else "")


RATIOS = {  # name: (metric, higher is better)
    "throughput": ("output_throughput", True),
    "p99_ttft": ("ttft_p99", False),
    "mean_e2e": ("e2e_mean", False),
    "tpot": ("tpot_mean", False),
}


def ratio(strategy: Mapping[str, Any], baseline: Mapping[str, Any], name: str) -> float | None:
    """>1 means the strategy is better: throughput s/b; latencies b/s ("x lower")."""
    metric, higher = RATIOS[name]
    s, b = strategy.get(metric), baseline.get(metric)
    if not s or not b:
        return None
    return s / b if higher else b / s


MIN_GROUPS_FOR_INTERVAL = 5     # fewer values: no interval (a bootstrap of 1-4 values says little; [0.29, 0.29]
#                                 for one group read as certainty)


def geomean(values, boot: int = 2000, seed: int = 0, ci: float = 0.95) -> dict[str, float | None]:
    """Geometric mean with a bootstrap confidence interval (scipy, percentile method, seeded) over the values,
    which are design points (groups), not repeated runs of one; ``lo``/``hi`` are None for fewer than
    MIN_GROUPS_FOR_INTERVAL values."""
    from scipy.stats import bootstrap

    x = np.log(np.array([v for v in values if v is not None and v > 0], dtype=float))
    if len(x) == 0:
        return {"geomean": None, "lo": None, "hi": None, "n": 0}
    g = float(np.exp(x.mean()))
    if len(x) < MIN_GROUPS_FOR_INTERVAL:
        return {"geomean": g, "lo": None, "hi": None, "n": int(len(x))}
    if np.ptp(x) == 0:
        return {"geomean": g, "lo": g, "hi": g, "n": int(len(x))}
    res = bootstrap((x,), np.mean, n_resamples=boot, confidence_level=ci, method="percentile",
                    random_state=np.random.default_rng(seed))
    lo, hi = res.confidence_interval
    return {"geomean": g, "lo": float(np.exp(lo)), "hi": float(np.exp(hi)), "n": int(len(x))}
