"""``treewy``: one triangular solve for every draft-tree node, then rebuild only the accepted state.

With ``G_t`` the cumulative log decay along node t's ancestor chain (t included),
the pseudo-values ``Ṽ`` solve ``(I + A) Ṽ = R`` with, for strict ancestors i of t::

    A[t, i] = β_t e^{G_t − G_i} k_tᵀ k_i          R_t = β_t (v_t − e^{G_t} h_0ᵀ k_t)

``A`` is strictly lower triangular (preorder puts ancestors first). Then::

    o_t = scale (e^{G_t} h_0ᵀ q_t + Σ_{i⪯t} e^{G_t−G_i} (k_iᵀ q_t) ṽ_i)
    h_a = e^{G_a} h_0 + Σ_{i⪯a} e^{G_a−G_i} k_i ⊗ ṽ_i          (commit: the accepted path only)

``ṽ_t`` equals the delta rule's own correction ``β_t (v_t − a_t h_pᵀ k_t)``, so a
stash of (ṽ, k, g) can rebuild any state on the path, from any earlier base.
"""

from __future__ import annotations

import torch

from .base import CommittedState, Verified, register
from .inputs import StepShape, compute_dtype, expand_heads
from .tree import DraftTree


def tree_wy(h0: torch.Tensor, qh: torch.Tensor, kh: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
            beta: torch.Tensor, tree: DraftTree, scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Outputs and pseudo-values of every node from base state ``h0``.

    h0 ``[B, HV, K, V]``; qh, kh ``[B, N, HV, K]`` (already expanded to value heads);
    v ``[B, N, HV, V]``; g, beta ``[B, N, HV]``.
    Returns ``o [B, N, HV, V]``, ``v_tilde [B, N, HV, V]``, ``G [B, N, HV]`` (cumulative log decay).
    """
    incl = tree.ancestor_mask(inclusive=True, device=h0.device)
    strict = incl & ~torch.eye(tree.num_nodes, dtype=torch.bool, device=h0.device)
    G = torch.einsum("ti,bih->bth", incl.to(g.dtype), g)
    Gh = G.transpose(1, 2)                                   # [B, HV, N]
    diff = Gh[..., :, None] - Gh[..., None, :]               # [B, HV, N(t), N(i)]: G_t − G_i
    # Zero the exponent off the ancestor pattern first: e^{G_t − G_i} can overflow there.
    decay_incl = torch.where(incl, torch.where(incl, diff, 0).exp(), 0)
    decay_strict = torch.where(strict, decay_incl, 0)
    bh = beta.transpose(1, 2)                                # [B, HV, N]
    gram = torch.einsum("bthk,bihk->bhti", kh, kh)
    A = bh[..., None] * decay_strict * gram                  # strictly lower
    eG = Gh.exp()[..., None]                                 # [B, HV, N, 1]
    R = bh[..., None] * (v.transpose(1, 2) - eG * torch.einsum("bhkv,bnhk->bhnv", h0, kh))
    v_tilde = torch.linalg.solve_triangular(A, R, upper=False, unitriangular=True)
    qk = torch.einsum("bthk,bihk->bhti", qh, kh)
    o = scale * (eG * torch.einsum("bhkv,bnhk->bhnv", h0, qh) + (decay_incl * qk) @ v_tilde)
    return o.transpose(1, 2), v_tilde.transpose(1, 2), G


def rebuild(h0: torch.Tensor, kh: torch.Tensor, u: torch.Tensor, G: torch.Tensor,
            G_end: torch.Tensor, on_path: torch.Tensor) -> torch.Tensor:
    """State after a path of tokens with known pseudo-values, from base ``h0``.

    ``h = e^{G_end} h0 + Σ_i on_path[b, i] e^{G_end − G_i} k_i ⊗ u_i``.
    h0 ``[B, HV, K, V]``; kh ``[B, M, HV, K]``; u ``[B, M, HV, V]``; G ``[B, M, HV]``
    (cumulative log decay of each token from h0); G_end ``[B, HV]``; on_path ``[B, M]`` bool.
    """
    w = torch.where(on_path[..., None], (G_end[:, None] - torch.where(on_path[..., None], G, 0)).exp(), 0)
    return G_end.exp()[..., None, None] * h0 + torch.einsum("bih,bihk,bihv->bhkv", w, kh, u)


def rebuild_accepted(h0: torch.Tensor, kh: torch.Tensor, v_tilde: torch.Tensor, G: torch.Tensor,
                     tree: DraftTree, accepted: torch.Tensor) -> torch.Tensor:
    """``h_a`` for each row's accepted node (``h0`` where accepted = -1), from the tree stash."""
    incl = tree.ancestor_mask(inclusive=True, device=h0.device)
    none = accepted < 0
    a = accepted.clamp(min=0)
    on_path = incl[a] & ~none[:, None]                                  # [B, N]
    G_end = torch.where(none[:, None], 0, G[torch.arange(len(a), device=a.device), a])
    return rebuild(h0, kh, v_tilde, G, G_end, on_path)


@register("treewy")
class TreeWY(CommittedState):
    """Carry: the committed state ``[B, HV, K, V]``.
    Stash: ``v_tilde [B, N, HV, V]``, ``k [B, N, H, K]``, ``G [B, N, HV]``."""

    def _verify(self, carry, q, k, v, g, beta, tree: DraftTree, s: StepShape, scale: float) -> Verified:
        dt = compute_dtype(carry.dtype)
        o, v_tilde, G = tree_wy(carry.to(dt), expand_heads(q, s.HV).to(dt), expand_heads(k, s.HV).to(dt),
                                v.to(dt), g.to(dt), beta.to(dt), tree, scale)
        return Verified(o.to(carry.dtype), tree, s, {"v_tilde": v_tilde, "k": k, "G": G})

    def _commit(self, carry, verified: Verified, accepted: torch.Tensor) -> torch.Tensor:
        st = verified.stash
        dt = st["v_tilde"].dtype
        h = rebuild_accepted(carry.to(dt), expand_heads(st["k"], verified.shape.HV).to(dt),
                             st["v_tilde"], st["G"], verified.tree, accepted)
        return h.to(carry.dtype)

    def footprint(self, tree: DraftTree) -> tuple[int, int]:
        return 1, tree.num_nodes

    def step_traffic(self, tree, state_bytes, token_stash_bytes, mean_tokens) -> float:
        # the state read and the accepted one written; the nodes' stash written by verify, read by commit
        return 2 * state_bytes + 2 * tree.num_nodes * token_stash_bytes
