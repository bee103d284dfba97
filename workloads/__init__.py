"""Request sources and arrival processes: ShareGPT, Spec-Bench, BurstGPT, synthetic shapes.

Every source yields :class:`Request` (``vllm bench serve``'s conventions) through one interface::

    reqs, report = workloads.build(cfg).requests()

``cfg`` is a ``conf/workload/*.yaml`` node: ``source`` picks the loader, the rest are its options,
``filters`` the length filters and ``arrival`` the arrival process. A source defined outside this package is a
:class:`Workload` subclass decorated with :func:`register` in a module the config names (``module:``), which
:func:`build` imports first: a new source is one module plus one config.
"""

from __future__ import annotations

import importlib
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


def register(cls: type[Workload]) -> type[Workload]:
    """Class decorator: ``cls.name`` becomes a ``source`` a workload config may name."""
    if not cls.name:
        raise ValueError(f"{cls.__qualname__}: a workload source needs a name (class attribute `name`)")
    SOURCES[cls.name] = cls
    return cls


def build(cfg: Mapping[str, Any]) -> Workload:
    """The workload a config describes (``cfg["source"]``: sharegpt | spec_bench | burstgpt | synthetic |
    lengths, or one that ``cfg["module"]`` registers)."""
    module = cfg.get("module")
    if module:
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise ValueError(f"workload.module={module}: does not import ({type(e).__name__}: {e}); put it on "
                             "PYTHONPATH or fix the name") from None
    source = cfg.get("source")
    if source not in SOURCES:
        where = f" (module {module} registers none of that name)" if module else ""
        raise ValueError(f"workload.source={source!r}: unknown{where}; use one of {', '.join(SOURCES)}")
    return SOURCES[source](cfg)


__all__ = ["Arrival", "LengthFilter", "LoadReport", "Request", "SOURCES", "Workload", "build", "register"]
