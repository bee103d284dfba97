"""The deferred-flush carry: a checkpoint state plus a buffer of accepted tokens.

Each accepted token is kept as its pseudo-value ``u`` (the delta rule's correction
``β (v − a h_pᵀ k)``), key ``k`` and log decay ``g``: with those, the tokens after
the checkpoint are a linear recurrence ``h ← e^{g} h + k ⊗ u``, so the committed
state can be recomputed whenever it is needed without having been written. The
checkpoint is written (flushed) only when the buffer cannot take another step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import Strategy
from .inputs import compute_dtype, expand_heads
from .treewy import rebuild

#: ReplaySSM's default buffer length (vLLM's ``replayssm_buffer_len``), in tokens.
DEFAULT_BUFFER_LEN = 16


@dataclass
class History:
    """Per request: ``checkpoint [B, HV, K, V]``, buffers ``u [B, L, HV, V]``,
    ``k [B, L, H, K]``, ``g [B, L, HV]`` filled up to ``length [B]``; ``L = capacity``.
    ``flushes [B]`` counts how often each request's checkpoint was rewritten."""

    checkpoint: torch.Tensor
    capacity: int
    length: torch.Tensor
    flushes: torch.Tensor
    u: torch.Tensor | None = None
    k: torch.Tensor | None = None
    g: torch.Tensor | None = None

    @classmethod
    def start(cls, state: torch.Tensor, capacity: int) -> "History":
        B = state.shape[0]
        zeros = torch.zeros(B, dtype=torch.long, device=state.device)
        return cls(state, capacity, zeros, zeros.clone())

    def current(self) -> torch.Tensor:
        """The committed state (checkpoint + buffered tokens), in the compute dtype."""
        dt = compute_dtype(self.checkpoint.dtype)
        h0 = self.checkpoint.to(dt)
        if self.u is None or int(self.length.max()) == 0:
            return h0
        return self._replay(h0, torch.ones_like(self.length, dtype=torch.bool))

    def _replay(self, h0: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        dt = h0.dtype
        L = self.capacity
        on_path = torch.arange(L, device=h0.device)[None, :] < self.length[:, None]
        g = torch.where(on_path[..., None], self.g.to(dt), 0)
        G = g.cumsum(1)
        h = rebuild(h0, expand_heads(self.k, h0.shape[1]).to(dt), self.u.to(dt), G, G[:, -1], on_path)
        return torch.where(rows[:, None, None, None], h, h0)

    def check_fits(self, tokens: int, strategy: str) -> None:
        if tokens > self.capacity:
            raise ValueError(f"strategy={strategy}: a step stages {tokens} tokens but buffer_len={self.capacity}; "
                             f"pass buffer_len >= {tokens}")

    def commit_path(self, path: torch.Tensor, count: torch.Tensor, u: torch.Tensor, k: torch.Tensor,
                    g: torch.Tensor, reserve: int) -> "History":
        """Append each row's accepted path; flush rows that then lack room for ``reserve`` tokens.

        path ``[B, P]``: node indices into the verified step's ``u [B, N, HV, V]``,
        ``k [B, N, H, K]``, ``g [B, N, HV]``; row b uses its first ``count[b]`` entries.
        """
        if self.u is None:
            B, L = self.length.shape[0], self.capacity
            self.u = u.new_zeros(B, L, *u.shape[2:]).to(self.checkpoint.dtype)
            self.k = k.new_zeros(B, L, *k.shape[2:]).to(self.checkpoint.dtype)
            self.g = g.new_zeros(B, L, *g.shape[2:]).to(self.checkpoint.dtype)
        # A step bigger than the last one may not fit behind the buffered tokens.
        self._flush(self.length + count > self.capacity)
        for j in range(path.shape[1]):
            rows = (count > j).nonzero().flatten()
            if len(rows) == 0:
                break
            pos, node = self.length[rows] + j, path[rows, j]
            self.u[rows, pos] = u[rows, node].to(self.u.dtype)
            self.k[rows, pos] = k[rows, node].to(self.k.dtype)
            self.g[rows, pos] = g[rows, node].to(self.g.dtype)
        self.length = self.length + count
        self._flush(self.length + reserve > self.capacity)
        return self

    def make_room(self, tokens: int) -> "History":
        """Flush the rows whose buffer cannot take ``tokens`` more (a bigger step than planned for)."""
        self._flush(self.length + tokens > self.capacity)
        return self

    def _flush(self, rows: torch.Tensor) -> None:
        """Write the checkpoint of ``rows`` (bool ``[B]``) and empty their buffers."""
        if not bool(rows.any()):
            return
        dt = compute_dtype(self.checkpoint.dtype)
        h = self._replay(self.checkpoint.to(dt), rows)
        self.checkpoint = torch.where(rows[:, None, None, None], h.to(self.checkpoint.dtype), self.checkpoint)
        for buf in (self.u, self.k, self.g):
            buf[rows] = 0
        self.length = torch.where(rows, 0, self.length)
        self.flushes = self.flushes + rows.long()


class DeferredFlush(Strategy):
    """A strategy whose carry is a :class:`History` of ``buffer_len`` tokens."""

    options = ("buffer_len",)

    def __init__(self, buffer_len: int = DEFAULT_BUFFER_LEN):
        if int(buffer_len) < 1:
            raise ValueError(f"buffer_len={buffer_len}: must be >= 1 token")
        self.buffer_len = int(buffer_len)

    def fitting(self, tree) -> "DeferredFlush":
        need = self.buffer_needed(tree)
        return self if need <= self.buffer_len else type(self)(buffer_len=need)

    def step_traffic(self, tree, state_bytes, token_stash_bytes, mean_tokens) -> float:
        # the checkpoint read, a flush (one state written) every buffer_len / mean_tokens steps, the buffer and the
        # verified nodes' stash
        return (state_bytes + state_bytes * mean_tokens / self.buffer_len
                + (self.buffer_len + tree.num_nodes) * token_stash_bytes)

    def start(self, state: torch.Tensor) -> History:
        return History.start(state, self.buffer_len)

    def _base(self, carry: History) -> torch.Tensor:
        return carry.checkpoint

    def materialize(self, carry: History) -> torch.Tensor:
        return carry.current().to(carry.checkpoint.dtype)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(buffer_len={self.buffer_len})"
