"""The literal gated delta rule over a draft tree: the oracle every strategy is tested against.

Node by node, each from its parent's state (``p = -1``: the committed state ``h0``)::

    a_t = exp(g_t)
    h_t = a_t h_p + k_t ⊗ β_t (v_t − a_t h_pᵀ k_t)
    o_t = scale · h_tᵀ q_t

No batching across nodes, no algebra: slow on purpose, and exact in float64.
"""

from __future__ import annotations

import torch

from .inputs import check_step, expand_heads
from .tree import DraftTree


def delta_rule_step(h_p: torch.Tensor, k_t: torch.Tensor, v_t: torch.Tensor,
                    g_t: torch.Tensor, beta_t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One token of the gated delta rule.

    h_p ``[..., HV, K, V]``, k_t ``[..., HV, K]``, v_t ``[..., HV, V]``, g_t/beta_t ``[..., HV]``.
    Returns ``(h_t, u_t)``, ``u_t = β_t (v_t − a_t h_pᵀ k_t)`` ``[..., HV, V]``: the
    pseudo-value, so that ``h_t = a_t h_p + k_t ⊗ u_t``.
    """
    a = g_t.exp()[..., None, None]
    h_decayed = a * h_p
    u = beta_t[..., None] * (v_t - torch.einsum("...kv,...k->...v", h_decayed, k_t))
    return h_decayed + k_t[..., :, None] * u[..., None, :], u


def tree_recurrence(state: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    g: torch.Tensor, beta: torch.Tensor, tree: DraftTree,
                    scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Every node's output and state, evaluated one node at a time.

    state ``[B, HV, K, V]``; q, k ``[B, N, H, K]``; v ``[B, N, HV, V]``; g, beta ``[B, N, HV]``.
    Returns ``o [B, N, HV, V]`` and ``states [B, N, HV, K, V]`` (node t's state after it).
    """
    s = check_step(state, q, k, v, g, beta, tree)
    scale = s.K ** -0.5 if scale is None else scale
    qh, kh = expand_heads(q, s.HV), expand_heads(k, s.HV)
    states = state.new_empty(s.B, s.N, s.HV, s.K, s.V)
    o = state.new_empty(s.B, s.N, s.HV, s.V)
    for t, p in enumerate(tree.parents):
        h_p = state if p < 0 else states[:, p]
        h_t, _ = delta_rule_step(h_p, kh[:, t], v[:, t], g[:, t], beta[:, t])
        states[:, t] = h_t
        o[:, t] = scale * torch.einsum("bhkv,bhk->bhv", h_t, qh[:, t])
    return o, states


def accepted_state(state: torch.Tensor, states: torch.Tensor, accepted: torch.Tensor) -> torch.Tensor:
    """Pick each request's committed state: ``states[b, accepted[b]]``, or ``state[b]`` for -1.

    state ``[B, HV, K, V]``, states ``[B, N, HV, K, V]``, accepted ``[B]`` (long).
    """
    out = state.clone()
    rows = (accepted >= 0).nonzero().flatten()
    out[rows] = states[rows, accepted[rows]]
    return out
