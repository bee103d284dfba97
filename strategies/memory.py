"""Memory accounting: the GDN state a request holds under each commit strategy.

All sizes are bytes per request. The recurrent state of one GDN layer is
``HV × K × V`` elements; the conv state is ``conv_dim × (conv_kernel − 1 + k)``
elements with ``conv_dim = 2·H·K + HV·V`` (q, k and v channels), widened by the
``k`` draft tokens of one path as vLLM keeps it (``gated_delta_net_state_shape``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch

from .tree import DraftTree

MiB = 1024 ** 2

_DTYPES = {
    "float64": torch.float64, "fp64": torch.float64,
    "float32": torch.float32, "fp32": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16,
}


def as_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """``"bfloat16"``/``"bf16"``/``torch.bfloat16`` → ``torch.bfloat16``."""
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return _DTYPES[str(dtype).removeprefix("torch.")]
    except KeyError:
        raise ValueError(f"dtype={dtype!r}: unknown; use one of {sorted(_DTYPES)}") from None


def dtype_bytes(dtype: torch.dtype | str) -> int:
    return torch.empty((), dtype=as_dtype(dtype)).element_size()


@dataclass(frozen=True)
class GDNShape:
    """The Gated DeltaNet part of a model: what sizes its recurrent and conv state."""

    num_layers: int
    num_key_heads: int     # H (q and k heads)
    num_value_heads: int   # HV
    key_head_dim: int      # K
    value_head_dim: int    # V
    conv_kernel: int = 4

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_key_heads", "num_value_heads", "key_head_dim",
                     "value_head_dim", "conv_kernel"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: must be >= 1")
        if self.num_value_heads % self.num_key_heads:
            raise ValueError(f"num_value_heads={self.num_value_heads} is not a multiple of "
                             f"num_key_heads={self.num_key_heads}")

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> "GDNShape":
        """From a model config's ``gdn`` section (``conf/model/*.yaml``)."""
        fields = ("num_layers", "num_key_heads", "num_value_heads", "key_head_dim",
                  "value_head_dim", "conv_kernel")
        missing = [f for f in fields if f not in cfg]
        if missing:
            raise ValueError(f"model gdn section: missing {missing}; see conf/model/qwen35_35b.yaml")
        return cls(**{f: int(cfg[f]) for f in fields})

    @property
    def state_elems(self) -> int:
        """Recurrent-state elements of one layer: HV · K · V."""
        return self.num_value_heads * self.key_head_dim * self.value_head_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.num_key_heads * self.key_head_dim + self.num_value_heads * self.value_head_dim

    def token_stash_bytes(self, dtype: torch.dtype | str) -> int:
        """One token's stash per layer: pseudo-value (HV·V), key (H·K) and log decay (HV)."""
        elems = (self.num_value_heads * self.value_head_dim
                 + self.num_key_heads * self.key_head_dim + self.num_value_heads)
        return elems * dtype_bytes(dtype)

    def state_bytes(self, dtype: torch.dtype | str) -> int:
        """One recurrent state of one layer."""
        return self.state_elems * dtype_bytes(dtype)

    def conv_bytes(self, draft_depth: int, dtype: torch.dtype | str) -> int:
        """One layer's conv state, widened by ``draft_depth`` speculative tokens."""
        return self.conv_dim * (self.conv_kernel - 1 + draft_depth) * dtype_bytes(dtype)


@dataclass(frozen=True)
class StateMemory:
    """GDN state one request holds under a strategy, per layer and in total (bytes)."""

    strategy: str
    tree: DraftTree
    num_layers: int
    state_pages: int         # full recurrent states held per layer
    state_bytes: int         # per layer: state_pages × one state
    stash_bytes: int         # per layer: pseudo-values/keys/decays or the replay buffer
    conv_bytes: int          # per layer: conv state (same for every strategy)
    one_state_bytes: int     # per layer: a single recurrent state, the floor no strategy beats

    @property
    def per_layer_bytes(self) -> int:
        return self.state_bytes + self.stash_bytes + self.conv_bytes

    @property
    def total_bytes(self) -> int:
        """Every GDN layer: states, stash and conv state."""
        return self.num_layers * self.per_layer_bytes

    @property
    def recurrent_total_bytes(self) -> int:
        """The recurrent states alone, every layer (the paper's figures: 30 / 120 MiB)."""
        return self.num_layers * self.state_bytes

    @property
    def speculative_bytes(self) -> int:
        """What speculation adds on top of one committed state per layer (conv excluded)."""
        return self.num_layers * (self.state_bytes - self.one_state_bytes + self.stash_bytes)

    def as_dict(self) -> dict[str, Any]:
        return {
            "strategy": self.strategy,
            "draft": self.tree.describe(),
            "num_layers": self.num_layers,
            "state_pages": self.state_pages,
            "state_bytes_per_layer": self.state_bytes,
            "stash_bytes_per_layer": self.stash_bytes,
            "conv_bytes_per_layer": self.conv_bytes,
            "recurrent_total_bytes": self.recurrent_total_bytes,
            "speculative_bytes": self.speculative_bytes,
            "total_bytes": self.total_bytes,
        }


def account(strategy: str, shape: GDNShape, tree: DraftTree, *, state_pages: int, stash_tokens: int,
            state_dtype, stash_dtype=None, conv_dtype="bfloat16") -> StateMemory:
    """Build a StateMemory from a strategy's page and stash counts (what differs between them)."""
    stash_dtype = state_dtype if stash_dtype is None else stash_dtype
    one = shape.state_bytes(state_dtype)
    return StateMemory(
        strategy=strategy,
        tree=tree,
        num_layers=shape.num_layers,
        state_pages=state_pages,
        state_bytes=state_pages * one,
        stash_bytes=stash_tokens * shape.token_stash_bytes(stash_dtype),
        conv_bytes=shape.conv_bytes(tree.draft_depth, conv_dtype),
        one_state_bytes=one,
    )
