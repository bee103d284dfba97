"""``treewy_deferred``: TreeWY verification with ReplaySSM's deferred flush.

Verify solves the tree's triangular system from the committed state, which is
recomputed from a checkpoint plus the buffered accepted tokens instead of read
from a written page; commit appends the accepted path's (ṽ, k, g) to the buffer
and rewrites the checkpoint only when the next path could not fit. No published
system has it: the TreeWY paper names it as the hypothesis for its throughput
gap to ReplaySSM.
"""

from __future__ import annotations

import torch

from .base import Verified, register
from .history import DeferredFlush, History
from .inputs import StepShape, compute_dtype, expand_heads
from .tree import DraftTree
from .treewy import tree_wy


def path_table(tree: DraftTree, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``paths [N, P]``: the nodes from the top to each node (padded with 0), ``counts [N]``."""
    P = tree.path_length
    paths = torch.zeros(tree.num_nodes, P, dtype=torch.long)
    counts = torch.zeros(tree.num_nodes, dtype=torch.long)
    for t in range(tree.num_nodes):
        p = tree.path_to(t)
        paths[t, : len(p)] = torch.tensor(p)
        counts[t] = len(p)
    return paths.to(device), counts.to(device)


@register("treewy_deferred")
class TreeWYDeferred(DeferredFlush):
    """Carry: :class:`History`. Stash: ``v_tilde [B, N, HV, V]``, ``k [B, N, H, K]``, ``g [B, N, HV]``."""

    def _verify(self, carry: History, q, k, v, g, beta, tree: DraftTree, s: StepShape, scale: float) -> Verified:
        # Only the accepted path enters the buffer; the tree's own stash is separate.
        carry.check_fits(tree.path_length, self.name)
        dt = compute_dtype(carry.checkpoint.dtype)
        o, v_tilde, _ = tree_wy(carry.current(), expand_heads(q, s.HV).to(dt), expand_heads(k, s.HV).to(dt),
                                v.to(dt), g.to(dt), beta.to(dt), tree, scale)
        return Verified(o.to(q.dtype), tree, s, {"v_tilde": v_tilde, "k": k, "g": g})

    def _commit(self, carry: History, verified: Verified, accepted: torch.Tensor) -> History:
        tree = verified.tree
        paths, counts = path_table(tree, accepted.device)
        a = accepted.clamp(min=0)
        count = torch.where(accepted < 0, 0, counts[a])
        st = verified.stash
        return carry.commit_path(paths[a], count, st["v_tilde"], st["k"], st["g"], reserve=tree.path_length)

    def footprint(self, tree: DraftTree) -> tuple[int, int]:
        return 1, tree.num_nodes + self.buffer_len

    def buffer_needed(self, tree: DraftTree) -> int:
        return tree.path_length                     # only the accepted path is buffered
