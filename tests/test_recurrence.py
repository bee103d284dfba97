"""The oracle itself: checked against an independent time-loop and a hand-computed case."""

import math

import torch

from strategies import DraftTree, tree_recurrence

from conftest import make_step, rel_err


def naive_sequence(state, q, k, v, g, beta, scale):
    """flash-linear-attention's naive recurrent gated delta rule, written from its definition
    (one sequence, [B, T, H, K] layout, value heads grouped over key heads)."""
    B, T, H, K = q.shape
    HV = v.shape[2]
    h = state.clone()
    out = torch.empty_like(v)
    for t in range(T):
        for hv in range(HV):
            kh = k[:, t, hv // (HV // H)]
            qh = q[:, t, hv // (HV // H)]
            a = g[:, t, hv].exp()[:, None, None]
            h_hv = h[:, hv] * a
            delta = v[:, t, hv] - torch.einsum("bkv,bk->bv", h_hv, kh)
            h_hv = h_hv + torch.einsum("bk,bv->bkv", kh, beta[:, t, hv, None] * delta)
            h[:, hv] = h_hv
            out[:, t, hv] = torch.einsum("bkv,bk->bv", h_hv, qh * scale)
    return out, h


def test_chain_matches_a_plain_time_loop():
    tree = DraftTree.chain(9)
    state, q, k, v, g, beta = make_step(tree, B=3, H=2, HV=4, K=8, V=6, seed=1)
    o, states = tree_recurrence(state, q, k, v, g, beta, tree)
    o_ref, h_ref = naive_sequence(state, q, k, v, g, beta, 8 ** -0.5)
    assert rel_err(o, o_ref) < 1e-14
    assert rel_err(states[:, -1], h_ref) < 1e-14


def test_every_tree_path_is_the_chain_of_its_tokens():
    tree = DraftTree.from_widths((2, 3, 2))
    state, q, k, v, g, beta = make_step(tree, B=2, seed=2)
    o, states = tree_recurrence(state, q, k, v, g, beta, tree)
    for node in range(tree.num_nodes):
        path = tree.path_to(node)
        chain = DraftTree.chain(len(path))
        o_c, s_c = tree_recurrence(state, q[:, path], k[:, path], v[:, path], g[:, path], beta[:, path], chain)
        assert rel_err(o[:, path], o_c) < 1e-14
        assert rel_err(states[:, node], s_c[:, -1]) < 1e-14


def test_scalar_case_by_hand():
    # K = V = 1, one head: h1 = a h0 + k β (v − a h0 k), o = scale h1 q with scale = 1.
    tree = DraftTree.chain(1)
    h0, k, v, g, b, q = 2.0, 1.0, 3.0, -0.5, 0.25, 1.0
    a = math.exp(g)
    expected = a * h0 + k * b * (v - a * h0 * k)
    t = lambda x, *s: torch.full(s, x, dtype=torch.float64)  # noqa: E731
    o, states = tree_recurrence(t(h0, 1, 1, 1, 1), t(q, 1, 1, 1, 1), t(k, 1, 1, 1, 1), t(v, 1, 1, 1, 1),
                                t(g, 1, 1, 1), t(b, 1, 1, 1), tree)
    assert abs(states.item() - expected) < 1e-15
    assert abs(o.item() - expected) < 1e-15


def test_float32_literal_tracks_float64():
    tree = DraftTree.chain(64)
    args64 = make_step(tree, B=2, seed=3)
    o64, s64 = tree_recurrence(*args64, tree)
    o32, s32 = tree_recurrence(*(a.float() for a in args64), tree)
    assert rel_err(o32, o64) < 1e-5 and rel_err(s32, s64) < 1e-5
