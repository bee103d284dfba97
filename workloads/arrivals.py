"""Arrival processes: when each request is issued.

* ``closed``: closed loop with at most ``max_concurrency`` requests in flight; a new one is issued
  the moment one finishes (the engine or load generator drives it; ``issue_times`` replays it for
  given service times).
* ``poisson``: open loop at ``rate`` requests/s, exponential inter-arrivals (CV 1).
* ``gamma``: open loop at ``rate`` with gamma inter-arrivals of shape ``burstiness``
  (``vllm bench serve``'s parameter: 1 is Poisson, below 1 burstier, above 1 smoother; CV = 1/√shape).
* ``trace``: the source's own timestamps, optionally rescaled to a target ``rate``.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

KINDS = ("closed", "poisson", "gamma", "trace")
POISSON_BURSTINESS = 1.0   # a gamma process of shape 1 is Poisson: the shape where a config gives none


@dataclass(frozen=True)
class Arrival:
    kind: str = "closed"
    max_concurrency: int | None = None   # closed
    rate: float | None = None            # poisson / gamma / trace (target requests/s; trace: None keeps it)
    burstiness: float = POISSON_BURSTINESS   # gamma shape
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"arrival.kind={self.kind!r}: unknown; use one of {', '.join(KINDS)}")
        if self.kind == "closed" and (self.max_concurrency is None or self.max_concurrency < 1):
            raise ValueError(f"arrival.max_concurrency={self.max_concurrency}: a closed loop needs >= 1")
        if self.kind in ("poisson", "gamma") and (self.rate is None or self.rate <= 0):
            raise ValueError(f"arrival.rate={self.rate}: {self.kind} arrivals need a rate > 0 requests/s")
        if self.kind == "trace" and self.rate is not None and self.rate <= 0:
            raise ValueError(f"arrival.rate={self.rate}: must be > 0 (or null to keep the trace's own rate)")
        if self.burstiness <= 0:
            raise ValueError(f"arrival.burstiness={self.burstiness}: the gamma shape must be > 0")

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any] | None) -> "Arrival":
        cfg = dict(cfg or {})
        unknown = set(cfg) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"arrival: unknown keys {sorted(unknown)}; known: {sorted(cls.__dataclass_fields__)}")
        return cls(**cfg)

    @property
    def open_loop(self) -> bool:
        return self.kind != "closed"

    def offsets(self, n: int, trace_times: Sequence[float] | None = None) -> np.ndarray | None:
        """Issue times in seconds from the start for ``n`` requests; None for a closed loop."""
        rng = np.random.default_rng(self.seed)
        if self.kind == "closed":
            return None
        if self.kind == "poisson":
            return np.cumsum(rng.exponential(1.0 / self.rate, n))
        if self.kind == "gamma":
            return np.cumsum(rng.gamma(self.burstiness, 1.0 / (self.rate * self.burstiness), n))
        if trace_times is None:
            raise ValueError("arrival.kind=trace: this workload has no timestamps; use poisson or gamma")
        t = np.asarray(trace_times[:n], dtype=float)
        if len(t) == 0:
            return t
        if not np.isfinite(t).all():
            raise ValueError(f"arrival.kind=trace: timestamp {t[~np.isfinite(t)][0]} is not a finite time; fix the "
                             "trace or use arrival.kind=poisson")
        t = t - t[0]
        if len(t) > 1 and t[-1] <= 0:
            raise ValueError(f"arrival.kind=trace: the {len(t)} requests' timestamps are all equal, so there is no "
                             "arrival process to replay; use arrival.kind=poisson with a rate")
        if self.rate is not None and len(t) > 1:
            t = t * ((len(t) - 1) / t[-1]) / self.rate  # rescale the mean rate, keep the shape
        return t

    def issue_times(self, service_s: Sequence[float]) -> np.ndarray:
        """Closed loop: when each request is issued if request i takes ``service_s[i]`` seconds."""
        if self.kind != "closed":
            raise ValueError("issue_times: only for arrival.kind=closed")
        done: list[float] = []
        issued = np.empty(len(service_s))
        for i, s in enumerate(service_s):
            t = heapq.heappop(done) if len(done) >= self.max_concurrency else 0.0
            issued[i] = t
            heapq.heappush(done, t + float(s))
        return issued

    def describe(self) -> str:
        if self.kind == "closed":
            return f"closed loop, max concurrency {self.max_concurrency}"
        if self.kind == "poisson":
            return f"Poisson at {self.rate:g} req/s"
        if self.kind == "gamma":
            return f"gamma at {self.rate:g} req/s, burstiness {self.burstiness:g}"
        return "trace timestamps" + (f" rescaled to {self.rate:g} req/s" if self.rate else "")
