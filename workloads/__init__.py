"""Request sources and arrival processes: ShareGPT, Spec-Bench, BurstGPT, synthetic shapes.

Every source yields :class:`Request` (``vllm bench serve``'s conventions) through one interface::

    reqs, report = workloads.build(cfg).requests()

``cfg`` is a ``conf/workload/*.yaml`` node: ``source`` picks the loader, the rest are its options,
``filters`` the length filters and ``arrival`` the arrival process.
"""

from __future__ import annotations

from typing import Any, Mapping

from .arrivals import Arrival
from .base import LoadReport, Workload
from .burstgpt import BurstGPT
from .filters import LengthFilter
from .lengths import Lengths
from .request import Request
from .sharegpt import ShareGPT
from .spec_bench import SpecBench
from .synthetic import Synthetic

SOURCES: dict[str, type[Workload]] = {c.name: c for c in (ShareGPT, SpecBench, BurstGPT, Synthetic, Lengths)}


def build(cfg: Mapping[str, Any]) -> Workload:
    """The workload a config describes (``cfg["source"]``: sharegpt | spec_bench | burstgpt | synthetic |
    lengths)."""
    source = cfg.get("source")
    if source not in SOURCES:
        raise ValueError(f"workload.source={source!r}: unknown; use one of {', '.join(SOURCES)}")
    return SOURCES[source](cfg)


__all__ = ["Arrival", "LengthFilter", "LoadReport", "Request", "SOURCES", "Workload", "build"]
