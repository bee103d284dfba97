"""Memory-bound classification and regime-split ratios of each strategy to the baseline.

A (workload, load, memory budget) point is memory-bound when the *baseline's* KV pool was exhausted: peak
usage at the cap, any preemption, or requests that waited for memory (thresholds from conf).
Ratios are strategy / baseline for throughput and baseline / strategy for latencies ("x lower").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np


@dataclass(frozen=True)
class Thresholds:
    """When a point is memory-bound: any one of these (values: conf/thresholds/memory_bound.yaml, recorded in
    each sweep.json)."""
    peak_kv_usage: float                 # fraction of the pool
    preemptions: int                     # at least this many
    waited_fraction: float               # of the point's requests waited for memory

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any] | None) -> "Thresholds":
        if not cfg:
            raise ValueError("no memory-bound thresholds: a sweep records them in sweep.json; pass them "
                             "(conf/thresholds/memory_bound.yaml's, or analyze(store, thresholds))")
        # failed_requests (a sweep's too: when a point fails) decides at run time, not here
        return cls(**{k: v for k, v in dict(cfg).items() if k != "failed_requests"})


def memory_bound(metrics: Mapping[str, Any], th: Thresholds) -> tuple[bool, str]:
    """(memory-bound?, the reason) from the baseline point's metrics."""
    reasons = []
    if (metrics.get("peak_kv_usage") or 0) >= th.peak_kv_usage:
        reasons.append(f"peak KV usage {metrics['peak_kv_usage']:.0%}")
    if (metrics.get("preemptions") or 0) >= th.preemptions:
        reasons.append(f"{metrics['preemptions']} preemptions")
    waited = (metrics.get("requests_waited_for_memory") or 0) / max(metrics.get("requests") or 1, 1)
    if waited >= th.waited_fraction:
        reasons.append(f"{waited:.0%} of requests waited for memory")
    return bool(reasons), "; ".join(reasons) or "pool never exhausted"


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


def geomean(values, boot: int = 2000, seed: int = 0, ci: float = 0.95) -> dict[str, float | None]:
    """Geometric mean with a bootstrap confidence interval (scipy, percentile method, seeded)."""
    from scipy.stats import bootstrap

    x = np.log(np.array([v for v in values if v is not None and v > 0], dtype=float))
    if len(x) == 0:
        return {"geomean": None, "lo": None, "hi": None, "n": 0}
    g = float(np.exp(x.mean()))
    if len(x) == 1 or np.ptp(x) == 0:
        return {"geomean": g, "lo": g, "hi": g, "n": int(len(x))}
    res = bootstrap((x,), np.mean, n_resamples=boot, confidence_level=ci, method="percentile",
                    random_state=np.random.default_rng(seed))
    lo, hi = res.confidence_interval
    return {"geomean": g, "lo": float(np.exp(lo)), "hi": float(np.exp(hi)), "n": int(len(x))}
