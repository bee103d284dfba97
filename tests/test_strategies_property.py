"""Property-based: random draft forests, head groupings, batch sizes and acceptances."""

from __future__ import annotations

import torch
from hypothesis import given, settings, strategies as st

import strategies
from strategies import DraftTree, accepted_state, tree_recurrence

from conftest import make_step, rel_err, strategy


@st.composite
def dfs_trees(draw, max_nodes: int = 24):
    """Any forest in DFS preorder: each node hangs under a node on the current path, or at the top."""
    n = draw(st.integers(1, max_nodes))
    parents, path = [], []
    for t in range(n):
        choice = draw(st.integers(0, len(path)))
        if choice == 0:
            parent, path = -1, []
        else:
            parent = path[choice - 1]
            path = path[:choice]
        parents.append(parent)
        path.append(t)
    return DraftTree(tuple(parents))


@settings(max_examples=40, deadline=None)
@given(tree=dfs_trees(), group=st.sampled_from([1, 2, 4]), B=st.integers(1, 3),
       seed=st.integers(0, 2 ** 16), data=st.data())
def test_random_trees_match_the_literal_recurrence(tree, group, B, seed, data):
    state, q, k, v, g, beta = make_step(tree, B=B, H=2, HV=2 * group, K=4, V=3, seed=seed)
    o_ref, states_ref = tree_recurrence(state, q, k, v, g, beta, tree)
    accepted = torch.tensor(data.draw(st.lists(st.integers(-1, tree.num_nodes - 1), min_size=B, max_size=B)))
    want = accepted_state(state, states_ref, accepted)
    for name in strategies.names():
        strat = strategy(name, seed, **({"buffer_len": 32} if name in ("replay", "treewy_deferred") else {}))
        if not strat.supports_trees and not tree.is_chain:
            continue
        ver = strat.verify(strat.start(state), q, k, v, g, beta, tree)
        assert rel_err(ver.o, o_ref) <= 1e-12, name
        got = strat.materialize(strat.commit(strat.start(state), ver, accepted))
        assert rel_err(got, want) <= 1e-12, name


@settings(max_examples=10, deadline=None)
@given(widths=st.lists(st.integers(1, 3), min_size=1, max_size=3), seed=st.integers(0, 2 ** 16))
def test_real_head_dims_in_float32(widths, seed):
    """Qwen3.5's head dims (K = V = 128) in float32, 1e-5 against the literal recurrence."""
    tree = DraftTree.from_widths(widths, root=True)
    state, q, k, v, g, beta = make_step(tree, B=2, H=2, HV=4, K=128, V=128, dtype=torch.float32,
                                        seed=seed, state_scale=0.1)
    o_ref, states_ref = tree_recurrence(state, q, k, v, g, beta, tree)
    accepted = torch.tensor([tree.num_nodes - 1, 0])
    for name in ("store_all", "treewy", "treewy_deferred", "store_selective", "store_delta"):
        strat = strategy(name, seed)
        ver = strat.verify(strat.start(state), q, k, v, g, beta, tree)
        assert rel_err(ver.o, o_ref) <= 1e-5, name
        got = strat.materialize(strat.commit(strat.start(state), ver, accepted))
        assert rel_err(got, accepted_state(state, states_ref, accepted)) <= 1e-5, name
