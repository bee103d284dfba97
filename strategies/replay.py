"""``replay``: ReplaySSM-style deferred flush, for chains.

Keep a checkpoint state and a ring buffer of the accepted tokens' (u, k, g).
Verify replays the buffer from the checkpoint (without writing the result) and
runs the draft chain token by token from there; commit appends the accepted
prefix and rewrites the checkpoint only when the buffer could not hold another
step: history + N > buffer_len, N the nodes verified per step (the engine's
root token included, so N = 1 + k for a chain of k drafts).
"""

from __future__ import annotations

import torch

from .base import Verified, register
from .history import DeferredFlush, History
from .inputs import StepShape, compute_dtype, expand_heads
from .recurrence import delta_rule_step
from .tree import DraftTree


@register("replay")
class Replay(DeferredFlush):
    """Carry: :class:`History`. Stash: ``u [B, N, HV, V]``, ``k [B, N, H, K]``, ``g [B, N, HV]``."""

    supports_trees = False

    def _verify(self, carry: History, q, k, v, g, beta, tree: DraftTree, s: StepShape, scale: float) -> Verified:
        # The draft is staged in the ring behind the history, so it must fit there.
        carry.check_fits(tree.num_nodes, self.name)
        dt = compute_dtype(carry.checkpoint.dtype)
        h = carry.current()
        qh, kh = expand_heads(q, s.HV).to(dt), expand_heads(k, s.HV).to(dt)
        v, g, beta = v.to(dt), g.to(dt), beta.to(dt)
        o = h.new_empty(s.B, s.N, s.HV, s.V)
        u = h.new_empty(s.B, s.N, s.HV, s.V)
        for t in range(s.N):
            h, u[:, t] = delta_rule_step(h, kh[:, t], v[:, t], g[:, t], beta[:, t])
            o[:, t] = scale * torch.einsum("bhkv,bhk->bhv", h, qh[:, t])
        return Verified(o.to(q.dtype), tree, s, {"u": u, "k": k, "g": g})

    def _commit(self, carry: History, verified: Verified, accepted: torch.Tensor) -> History:
        N = verified.shape.N
        path = torch.arange(N, device=accepted.device).expand(len(accepted), N)
        st = verified.stash
        return carry.commit_path(path, accepted + 1, st["u"], st["k"], st["g"], reserve=N)

    def footprint(self, tree: DraftTree) -> tuple[int, int]:
        return 1, self.buffer_len

    def buffer_needed(self, tree: DraftTree) -> int:
        return tree.num_nodes                       # a step's verified chain goes through the buffer whole
