"""``store_all``: vLLM's default. A full state snapshot per draft node; commit picks one.

Verify walks the tree depth by depth: all nodes of one depth are one batched
delta-rule step, each from its parent's snapshot. The snapshots are what vLLM's
``num_speculative_blocks = k`` pages hold: ``1 + drafts`` states per request
(the committed one plus one per draft).
"""

from __future__ import annotations

import torch

from .base import CommittedState, Verified, register
from .inputs import StepShape, compute_dtype, expand_heads
from .recurrence import accepted_state, delta_rule_step
from .tree import DraftTree


@register("store_all")
class StoreAll(CommittedState):
    """Carry: the committed state ``[B, HV, K, V]``. Stash: ``states [B, N, HV, K, V]``."""

    def _verify(self, carry, q, k, v, g, beta, tree: DraftTree, s: StepShape, scale: float) -> Verified:
        dt = compute_dtype(carry.dtype)
        h0 = carry.to(dt)
        qh, kh = expand_heads(q, s.HV).to(dt), expand_heads(k, s.HV).to(dt)
        v, g, beta = v.to(dt), g.to(dt), beta.to(dt)
        states = h0.new_empty(s.B, s.N, s.HV, s.K, s.V)
        o = h0.new_empty(s.B, s.N, s.HV, s.V)
        parents = torch.tensor(tree.parents, device=carry.device)
        for level in tree.levels:
            idx = torch.tensor(level, device=carry.device)
            par = parents[idx]
            # Depth-0 nodes hang under the committed state, deeper ones under a snapshot.
            h_p = h0[:, None].expand(-1, len(level), -1, -1, -1) if par[0] < 0 else states[:, par]
            h, _ = delta_rule_step(h_p, kh[:, idx], v[:, idx], g[:, idx], beta[:, idx])
            states[:, idx] = h
            o[:, idx] = scale * torch.einsum("bnhkv,bnhk->bnhv", h, qh[:, idx])
        return Verified(o.to(carry.dtype), tree, s, {"states": states.to(carry.dtype)})

    def _commit(self, carry, verified: Verified, accepted: torch.Tensor) -> torch.Tensor:
        return accepted_state(carry, verified.stash["states"], accepted)

    def footprint(self, tree: DraftTree) -> tuple[int, int]:
        return tree.num_drafts + 1, 0

    def step_traffic(self, tree, state_bytes, token_stash_bytes, mean_tokens) -> float:
        return (1 + tree.num_nodes) * state_bytes      # the committed state read, a snapshot written per node
