"""``store_all``: vLLM's default. A full state snapshot per draft node; commit picks one.

The snapshots are what vLLM's ``num_speculative_blocks = k`` pages hold: ``1 + drafts`` states per
request (the committed one plus one per draft). The fork/checkpoint write-up's name for a snapshot is a
checkpoint, and for making one, a fork. Two orders of the same arithmetic (the ``fork`` option):

- ``node``: node by node in preorder, each from its parent's snapshot read back (what vLLM's kernel and
  the project's node-by-node Triton kernel do);
- ``depth``: depth by depth, all nodes of one depth one batched delta-rule step, each from its parent's
  snapshot (the write-up's depth-by-depth fork: depth 0 from S0, depth 1 from the depth-0 snapshots, ...).

On a chain the two are the same steps. Every node's state is the same either way, bit for bit.
"""

from __future__ import annotations

import torch

from .base import CommittedState, Verified, register
from .inputs import StepShape, compute_dtype, expand_heads
from .recurrence import accepted_state, delta_rule_step
from .tree import DraftTree


FORKS = ("node", "depth")


def check_fork(fork: str, name: str = "store_all") -> str:
    if fork not in FORKS:
        raise ValueError(f"strategies.{name}.fork={fork!r}: choose node (one node at a time, each from its "
                         "parent's snapshot) or depth (all nodes of a depth in one batch)")
    return fork


def fork_states(h0: torch.Tensor, qh: torch.Tensor, kh: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                beta: torch.Tensor, tree: DraftTree, scale: float,
                fork: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every node's state and output, each forked from its parent's (``fork``: ``node`` or ``depth`` order).

    h0 ``[B, HV, K, V]``; qh, kh ``[B, N, HV, K]`` (expanded to value heads); v ``[B, N, HV, V]``; g, beta
    ``[B, N, HV]``. Returns ``states [B, N, HV, K, V]``, ``o [B, N, HV, V]`` and the pseudo-values ``u [B, N, HV,
    V]`` (``states[t] = e^{g_t} states[parent] + k_t ⊗ u_t``) in h0's dtype."""
    B, N, HV, K = kh.shape
    states = h0.new_empty(B, N, HV, K, h0.shape[-1])
    o = h0.new_empty(B, N, HV, h0.shape[-1])
    u = h0.new_empty(B, N, HV, h0.shape[-1])
    if fork == "node":
        for t, p in enumerate(tree.parents):
            h, u[:, t] = delta_rule_step(h0 if p < 0 else states[:, p], kh[:, t], v[:, t], g[:, t], beta[:, t])
            states[:, t] = h
            o[:, t] = scale * torch.einsum("bhkv,bhk->bhv", h, qh[:, t])
        return states, o, u
    parents = torch.tensor(tree.parents, device=h0.device)
    for level in tree.levels:
        idx = torch.tensor(level, device=h0.device)
        par = parents[idx]
        # Depth-0 nodes hang under the committed state, deeper ones under a snapshot.
        h_p = h0[:, None].expand(-1, len(level), -1, -1, -1) if par[0] < 0 else states[:, par]
        h, u[:, idx] = delta_rule_step(h_p, kh[:, idx], v[:, idx], g[:, idx], beta[:, idx])
        states[:, idx] = h
        o[:, idx] = scale * torch.einsum("bnhkv,bnhk->bnhv", h, qh[:, idx])
    return states, o, u


@register("store_all")
class StoreAll(CommittedState):
    """Carry: the committed state ``[B, HV, K, V]``. Stash: ``states [B, N, HV, K, V]``."""

    options = ("fork",)
    fork = "node"          # a subclass with its own __init__ keeps today's order

    def __init__(self, fork: str = "node"):
        self.fork = check_fork(fork, self.name)

    def _verify(self, carry, q, k, v, g, beta, tree: DraftTree, s: StepShape, scale: float) -> Verified:
        dt = compute_dtype(carry.dtype)
        states, o, _ = fork_states(carry.to(dt), expand_heads(q, s.HV).to(dt), expand_heads(k, s.HV).to(dt),
                                v.to(dt), g.to(dt), beta.to(dt), tree, scale, self.fork)
        return Verified(o.to(carry.dtype), tree, s, {"states": states.to(carry.dtype)})

    def _commit(self, carry, verified: Verified, accepted: torch.Tensor) -> torch.Tensor:
        return accepted_state(carry, verified.stash["states"], accepted)

    def footprint(self, tree: DraftTree) -> tuple[int, int]:
        return tree.num_drafts + 1, 0

    def step_traffic(self, tree, state_bytes, token_stash_bytes, mean_tokens) -> float:
        # the committed state read, a snapshot written per node (either fork order moves the same bytes)
        return (1 + tree.num_nodes) * state_bytes

    def __repr__(self) -> str:
        return f"{type(self).__name__}(fork={self.fork!r})"
