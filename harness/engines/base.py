"""The engine contract: one sweep point in, per-request records and telemetry out.

``sim`` and ``vllm`` return the same :class:`PointResult`, so analysis and reports never know
which engine ran. Times are seconds from the start of the measured run.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Protocol

from strategies import DraftTree
from workloads import Arrival, Request

from ..model import ModelSpec


@dataclass(frozen=True)
class GPUSpec:
    """One accelerator: memory (bytes), achievable HBM bandwidth (B/s) and dense bf16 rate (FLOP/s)."""

    name: str
    memory_bytes: int
    bandwidth: float
    bf16_flops: float
    block_alignment: int = 16   # vLLM's attention kernel block alignment on it

    @classmethod
    def from_config(cls, cfg) -> "GPUSpec":
        fields = cls.__dataclass_fields__
        unknown = set(cfg) - set(fields) - {"source", "datasheet"}
        if unknown:
            raise ValueError(f"gpu config: unknown keys {sorted(unknown)}; known: {sorted(fields)}")
        spec = cls(**{k: cfg[k] for k in fields if k in cfg})
        if spec.memory_bytes <= 0 or spec.bandwidth <= 0 or spec.bf16_flops <= 0:
            raise ValueError(f"gpu={spec.name}: memory_bytes, bandwidth and bf16_flops must be > 0")
        return spec


@dataclass(frozen=True)
class Point:
    """Everything one run needs, fully resolved. Its values come from the composed config (``conf/``; built by
    ``harness.point.build_point``): no field repeats a setting as a default, only "absent" has one."""

    model: ModelSpec
    gpu: GPUSpec
    strategy: str
    tree: DraftTree | None          # None: no speculation
    requests: tuple[Request, ...]
    arrival: Arrival
    gmu: float
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    seed: int
    kv_cache_bytes: int | None = None   # the KV pool's size outright (vLLM's kv_cache_memory_bytes; CPU)
    strategy_options: Mapping[str, Any] = field(default_factory=dict)   # its run options (conf/strategies/)

    def __post_init__(self) -> None:
        if not 0 < self.gmu <= 1:
            raise ValueError(f"gmu={self.gmu}: must be in (0, 1]")
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1 or self.max_model_len < 1:
            raise ValueError("max_num_seqs, max_num_batched_tokens and max_model_len must be >= 1")


@dataclass
class RequestRecord:
    id: int
    arrival_s: float
    prompt_len: int
    output_len: int
    first_token_s: float | None = None
    finish_s: float | None = None
    output_tokens: int = 0
    preemptions: int = 0
    error: str | None = None


@dataclass
class PointResult:
    engine: str                                   # "sim" | "vllm"
    requests: list[RequestRecord]
    telemetry: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"engine": self.engine, "requests": [asdict(r) for r in self.requests], "telemetry": self.telemetry}


class Engine(Protocol):
    """An engine runs points. ``cls(cfg, log_dir=None)``: ``cfg`` its composed ``conf/engine/<name>.yaml``,
    ``log_dir`` where a server it starts logs (engines without one ignore it)."""
    name: str

    def run(self, point: Point) -> PointResult: ...

    # Optional, a classmethod: ``runs_strategy(name) -> str | None``, why this engine cannot run the registered
    # strategy ``name`` (None: it can). harness.grid.point_configs asks it before the first point; an engine without
    # it runs every registered strategy.


#: name -> engine class, filled by :func:`register_engine` when the module ``conf/engine/<name>.yaml``'s
#: ``module:`` names is imported (:func:`engine_class` imports it)
ENGINES: dict[str, type] = {}


def register_engine(name: str):
    """Class decorator: the engine ``engine=<name>`` runs."""
    def deco(cls):
        cls.name = name
        ENGINES[name] = cls
        return cls
    return deco


def engine_class(ecfg: Mapping[str, Any]) -> type:
    """The class that runs engine config ``ecfg`` (conf/engine/<name>.yaml), its module imported: the point runs
    an instance, the grid asks the class what it can run (``runs_strategy``)."""
    from ..config import import_named

    # the engine's module registers it (@register_engine); a config without one (built in code, or stored before
    # engines named their module) means the built-in engine of that name
    name = ecfg["name"]
    module = ecfg.get("module") or (f"harness.engines.{name}.engine" if name in ("sim", "vllm") else None)
    if module:
        import_named(module, f"engine={name} (conf/engine/{name}.yaml)")
    if name not in ENGINES:
        raise ValueError(f"engine={name}: no engine registers that name"
                         f"{f' (module {module} registers none)' if module else ''}; conf/engine/{name}.yaml "
                         "names the module that does (module:), or choose sim, vllm or auto")
    return ENGINES[name]
