"""Goodput: completed requests per second that meet every service-level objective, as ``vllm bench serve
--goodput`` counts them (vllm/benchmarks/serve.py: a request is good when its TTFT, TPOT and E2E latency are each
at most the SLO given for it; goodput = good requests / the run's duration).

Per request (seconds): TTFT = first token - arrival; TPOT = (E2E - TTFT) / (output tokens - 1), 0 for a
one-token answer (vLLM's convention); E2E = finish - arrival. SLOs are in milliseconds (conf/slo/).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from .metrics import _get  # a record as a dict or an object, as point_metrics reads it


@dataclass(frozen=True)
class SLO:
    """The objectives (ms; None: not one) and the attainment a load must reach to meet them."""
    ttft_ms: float | None = 2000.0
    tpot_ms: float | None = 50.0
    e2el_ms: float | None = None
    attainment: float = 0.9

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any] | None) -> "SLO":
        cfg = dict(cfg or {})
        unknown = set(cfg) - {"ttft_ms", "tpot_ms", "e2el_ms", "attainment"}
        if unknown:
            raise ValueError(f"slo.{sorted(unknown)[0]}: no such objective; the SLOs are slo.ttft_ms, slo.tpot_ms, "
                             "slo.e2el_ms (milliseconds, null for none) and slo.attainment")
        for key in ("ttft_ms", "tpot_ms", "e2el_ms"):
            v = cfg.get(key)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0):
                raise ValueError(f"slo.{key}={v!r}: give a time in milliseconds > 0, or null for no objective")
        att = cfg.get("attainment", 0.9)
        if isinstance(att, bool) or not isinstance(att, (int, float)) or not 0 < att <= 1:
            raise ValueError(f"slo.attainment={att!r}: the fraction of requests that must be good, in (0, 1]")
        if all(cfg.get(k) is None for k in ("ttft_ms", "tpot_ms", "e2el_ms")) and cfg:
            raise ValueError("slo: every objective is null, so every request would be good; give at least one of "
                             "slo.ttft_ms, slo.tpot_ms, slo.e2el_ms")
        return cls(**{k: (float(v) if v is not None else None) for k, v in cfg.items() if k != "attainment"},
                   attainment=float(att))

    def label(self) -> str:
        parts = [f"{name} <= {v:g} ms" for name, v in (("TTFT", self.ttft_ms), ("TPOT", self.tpot_ms),
                                                      ("E2E", self.e2el_ms)) if v is not None]
        return " and ".join(parts)


def is_good(record, slo: SLO) -> bool:
    """One request against every objective; a request that errored or did not finish is never good."""
    if _get(record, "error") is not None or _get(record, "finish_s") is None or _get(record, "first_token_s") is None:
        return False
    arrival, first, finish = _get(record, "arrival_s"), _get(record, "first_token_s"), _get(record, "finish_s")
    n = _get(record, "output_tokens") or 0
    ttft, e2e = first - arrival, finish - arrival
    tpot = (e2e - ttft) / (n - 1) if n > 1 else 0.0
    return all(v is None or x * 1e3 <= v for x, v in ((ttft, slo.ttft_ms), (tpot, slo.tpot_ms), (e2e, slo.e2el_ms)))


def goodput(records: Iterable, slo: SLO, duration_s: float | None) -> dict[str, Any]:
    """``goodput`` (good requests per second over the point's duration, as vLLM divides) and ``good_fraction``
    (good / all requests the point sent, errors included)."""
    recs = list(records)
    good = sum(is_good(r, slo) for r in recs)
    return {"goodput": good / duration_s if duration_s else None,
            "good_fraction": good / len(recs) if recs else None}


def max_load_meeting(points: list[dict[str, Any]], slo: SLO) -> dict[str, Any] | None:
    """The highest load (concurrency or rate) among ``points`` (one curve: one workload, memory budget, draft and
    strategy) whose good fraction reaches the attainment, with the goodput there; None when none does. A load
    above a failing one counts too: a curve need not be monotone, and the reader sees both."""
    ok = [p for p in points if p.get("good_fraction") is not None and not math.isnan(p["good_fraction"])]
    meeting = [p for p in ok if p["good_fraction"] >= slo.attainment]
    if not meeting:
        return None
    best = max(meeting, key=lambda p: p["load"])
    return {"load": best["load"], "load_kind": best.get("load_kind"), "goodput": best.get("goodput"),
            "good_fraction": best["good_fraction"]}
