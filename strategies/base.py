"""The state-commit strategy interface and its registry.

One speculative step, for a batch that shares a draft shape::

    carry = strategy.start(state)                  # state [B, HV, K, V]
    ver = strategy.verify(carry, q, k, v, g, beta, tree[, confidence=c])   # c [B, N]: selective strategies
    ver.o                                          # [B, N, HV, V], every node's output
    carry = strategy.commit(carry, ver, accepted)  # accepted[b]: last accepted node, -1 = none
    strategy.materialize(carry)                    # the committed state [B, HV, K, V]

``commit`` may reuse the carry's buffers: treat the carry passed in as consumed.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch

from .inputs import StepShape, check_accepted, check_confidence, check_step
from .memory import GDNShape, StateMemory, account
from .tree import DraftTree


@dataclass
class Verified:
    """What a verify pass hands to commit.

    ``o [B, N, HV, V]``: outputs of every node. ``stash``: the strategy's own
    tensors (snapshots, pseudo-values, keys, decays), named in each strategy.
    """

    o: torch.Tensor
    tree: DraftTree
    shape: StepShape
    stash: dict[str, torch.Tensor] = field(default_factory=dict)


class Strategy(ABC):
    """A way to keep the recurrent state rollback-able across a verify step."""

    name: str = ""
    #: True when the strategy accepts branching trees (replay needs a chain).
    supports_trees: bool = True
    #: True when q/k/v/g/beta may come in another dtype than the state (the Triton kernels).
    mixed_dtypes: bool = False
    #: The keyword options a run's settings may set (:func:`configured` takes them from those settings).
    options: tuple[str, ...] = ()
    #: True when verify needs each node's draft confidence (``confidence [B, N]``, the drafter's probability of
    #: the node's token given its parent): what a selective strategy decides its checkpoints by.
    uses_confidence: bool = False

    # -- the contract -------------------------------------------------------
    @abstractmethod
    def start(self, state: torch.Tensor) -> Any:
        """Wrap a committed state ``[B, HV, K, V]`` into this strategy's carry."""

    def verify(self, carry: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               g: torch.Tensor, beta: torch.Tensor, tree: DraftTree,
               scale: float | None = None, confidence: torch.Tensor | None = None) -> Verified:
        """Outputs of every node of ``tree`` from the committed state in ``carry``.

        q, k ``[B, N, H, K]`` (L2-normalised), v ``[B, N, HV, V]``, g (log decay) and
        beta ``[B, N, HV]``; ``scale`` defaults to ``K ** -0.5``. ``confidence [B, N]`` in [0, 1]: each
        node's draft probability (1 for the engine's root), which only a strategy that ``uses_confidence``
        reads (the others ignore it) and which such a strategy cannot do without.
        """
        if not self.supports_trees and not tree.is_chain:
            raise ValueError(f"strategy={self.name}: needs a chain, got a branching {tree.describe()}; "
                             "its history buffer replays one contiguous token sequence. "
                             "Use treewy or treewy_deferred for trees")
        s = check_step(self._base(carry), q, k, v, g, beta, tree, same_dtype=not self.mixed_dtypes)
        scale = s.K ** -0.5 if scale is None else float(scale)
        if not self.uses_confidence:
            return self._verify(carry, q, k, v, g, beta, tree, s, scale)
        if confidence is None:
            raise ValueError(f"strategy={self.name}: decides its checkpoints by each node's draft confidence; "
                             "pass confidence=[B, N] (the drafter's probability of each node's token, 1 for the "
                             "root) to verify")
        conf = check_confidence(confidence, s.B, s.N).to(q.device)
        return self._verify(carry, q, k, v, g, beta, tree, s, scale, confidence=conf)

    def commit(self, carry: Any, verified: Verified, accepted) -> Any:
        """Advance the carry to each request's last accepted node (-1: none)."""
        acc = check_accepted(accepted, verified.shape.B, verified.shape.N).to(verified.o.device)
        return self._commit(carry, verified, acc)

    @abstractmethod
    def materialize(self, carry: Any) -> torch.Tensor:
        """The committed recurrent state ``[B, HV, K, V]`` (computed if deferred)."""

    # -- memory accounting --------------------------------------------------
    def memory(self, shape: GDNShape, tree: DraftTree, state_dtype="bfloat16",
               stash_dtype=None, conv_dtype="bfloat16") -> StateMemory:
        """Bytes of GDN state one request holds while verifying ``tree``."""
        pages, stash = self.footprint(tree)
        return account(self.name, shape, tree, state_pages=pages, stash_tokens=stash,
                       state_dtype=state_dtype, stash_dtype=stash_dtype, conv_dtype=conv_dtype)

    def held_memory(self, shape: GDNShape, tree: DraftTree, state_dtype="bfloat16",
                    stash_dtype=None, conv_dtype="bfloat16") -> StateMemory:
        """Bytes of GDN state one request actually holds while verifying ``tree``, where that differs from what it
        must reserve (:meth:`memory`): a selective strategy's expected checkpoints, a compressed one's encoding."""
        return self.memory(shape, tree, state_dtype, stash_dtype, conv_dtype)

    def step_traffic(self, tree: DraftTree, state_bytes: float, token_stash_bytes: float,
                     mean_tokens: float) -> float:
        """Bytes of GDN state one decoding request moves per GDN layer in one verify step (reads and writes):
        what a step costs a strategy in memory traffic, which the simulator charges. ``tree``: the verified draft
        (root included); ``state_bytes``: one recurrent state; ``token_stash_bytes``: one token's stash slot
        (pseudo-value, key, decay); ``mean_tokens``: tokens accepted per step (how fast a buffer fills)."""
        raise NotImplementedError(f"strategy={self.name}: says nothing of the state bytes it moves per step "
                                  "(Strategy.step_traffic), which the simulator charges")

    def buffer_needed(self, tree: DraftTree) -> int:
        """Fewest buffered tokens a verify of ``tree`` needs (0: the strategy keeps no buffer)."""
        return 0

    def fitting(self, tree: DraftTree) -> "Strategy":
        """This strategy, or one like it whose buffer holds a verify of ``tree`` where one step would overflow
        this one's (for tables and benchmarks that show every draft shape)."""
        return self

    # -- what each strategy fills in ----------------------------------------
    @abstractmethod
    def _base(self, carry: Any) -> torch.Tensor:
        """A tensor shaped like the state, used to check the step's shapes."""

    @abstractmethod
    def _verify(self, carry, q, k, v, g, beta, tree: DraftTree, s: StepShape, scale: float) -> Verified: ...

    @abstractmethod
    def _commit(self, carry, verified: Verified, accepted: torch.Tensor) -> Any: ...

    @abstractmethod
    def footprint(self, tree: DraftTree) -> tuple[int, int]:
        """(full state pages, stash token slots) held per layer per request."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class CommittedState(Strategy):
    """A strategy whose carry is the committed state ``[B, HV, K, V]`` itself."""

    def start(self, state: torch.Tensor) -> torch.Tensor:
        return state

    def _base(self, carry: torch.Tensor) -> torch.Tensor:
        return carry

    def materialize(self, carry: torch.Tensor) -> torch.Tensor:
        return carry


_REGISTRY: dict[str, Callable[..., Strategy]] = {}


def register(name: str):
    def deco(cls):
        cls.name = name
        _REGISTRY[name] = cls
        return cls
    return deco


#: Display order: the baseline first, then as ARCHITECTURE.md's table lists them.
_ORDER = ("store_all", "replay", "treewy", "treewy_deferred", "store_selective", "store_delta")


def names() -> list[str]:
    """Registered strategy names, baseline first."""
    return sorted(_REGISTRY, key=lambda n: (_ORDER.index(n) if n in _ORDER else len(_ORDER), n))


def configured(name: str, settings: Mapping[str, Any] | None = None, **overrides) -> Strategy:
    """:func:`get` with the options the strategy takes (``options``) from a run's ``settings`` (e.g. an engine
    config holding ``buffer_len``); keys it does not take are not its business, a None value keeps its default.
    ``overrides`` win over ``settings``."""
    cls = _REGISTRY.get(name)
    if cls is None:
        return get(name)                          # the error that names the strategies there are
    merged = {**(settings or {}), **overrides}
    return get(name, **{k: merged[k] for k in cls.options if merged.get(k) is not None})


def get(name: str, **options) -> Strategy:
    """A ready strategy instance; ``options`` are its keyword arguments (e.g. ``buffer_len``)."""
    try:
        cls = _REGISTRY[name]
    except KeyError:
        raise ValueError(f"strategy={name!r}: unknown; choose one of {', '.join(names())}") from None
    try:
        return cls(**options)
    except TypeError as e:
        raise ValueError(f"strategy={name}: bad options {options}: {e}") from None
