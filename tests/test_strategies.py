"""Every strategy against the literal recurrence: outputs, committed states, many steps, edge gates."""

from __future__ import annotations

import pytest
import torch

import strategies
from strategies import DraftTree, accepted_state, tree_recurrence

from conftest import make_step, rel_err, strategy

TOL = {torch.float64: 1e-12, torch.float32: 1e-5}

SHAPES = {
    "chain3": DraftTree.from_widths((1, 1, 1)),
    "chain3+root": DraftTree.chain(3, root=True),
    "tree222": DraftTree.from_widths((2, 2, 2)),
    "tree333": DraftTree.from_widths((3, 3, 3)),
    "tree333+root": DraftTree.from_widths((3, 3, 3), root=True),
    "chain64": DraftTree.chain(64),
    "forest": DraftTree((-1, 0, 1, 0, -1, 4, -1)),
}


def applicable(name: str, tree: DraftTree) -> bool:
    return strategies.get(name).supports_trees or tree.is_chain


def get(name: str, tree: DraftTree):
    # Replay stages the whole draft in its buffer: give long chains the room they need.
    if name in ("replay", "treewy_deferred"):
        return strategies.get(name, buffer_len=max(16, tree.num_nodes))
    return strategy(name)


CASES = [(n, s) for s in SHAPES for n in strategies.names() if applicable(n, SHAPES[s])]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["fp64", "fp32"])
@pytest.mark.parametrize("shape", ["tree222", "tree333+root", "forest", "chain3+root"])
def test_store_all_forks_by_depth_or_by_node_to_the_same_states(shape, dtype):
    """fork=depth (a depth's nodes in one batch) and fork=node (one at a time) are the same arithmetic: the
    same outputs and snapshots bit for bit, within the tolerance of the literal recurrence."""
    tree = SHAPES[shape]
    state, q, k, v, g, beta = make_step(tree, B=3, H=2, HV=4, K=8, V=6, dtype=dtype, seed=12)
    o_ref, states_ref = tree_recurrence(state, q, k, v, g, beta, tree)
    by = {f: strategies.get("store_all", fork=f).verify(state, q, k, v, g, beta, tree) for f in ("node", "depth")}
    assert torch.equal(by["node"].o, by["depth"].o)
    assert torch.equal(by["node"].stash["states"], by["depth"].stash["states"])
    assert rel_err(by["depth"].o, o_ref) <= TOL[dtype] and rel_err(by["depth"].stash["states"], states_ref) <= TOL[dtype]
    with pytest.raises(ValueError, match="strategies.store_all.fork='breadth'"):
        strategies.get("store_all", fork="breadth")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["fp64", "fp32"])
@pytest.mark.parametrize("name, shape", CASES)
def test_one_step_every_accepted_node(name, shape, dtype):
    """Outputs of all nodes, and the committed state for every possible accepted node incl. -1."""
    tree = SHAPES[shape]
    N = tree.num_nodes
    B = N + 1  # one request per possible accepted node: -1 .. N-1
    state, q, k, v, g, beta = make_step(tree, B=B, H=2, HV=4, K=8, V=6, dtype=dtype, seed=11)
    o_ref, states_ref = tree_recurrence(state, q, k, v, g, beta, tree)
    strat = get(name, tree)
    ver = strat.verify(strat.start(state), q, k, v, g, beta, tree)
    assert ver.o.shape == (B, N, 4, 6) and ver.o.dtype == dtype
    assert rel_err(ver.o, o_ref) <= TOL[dtype]
    accepted = torch.arange(-1, N)
    committed = strat.materialize(strat.commit(strat.start(state), ver, accepted))
    assert committed.dtype == dtype
    assert rel_err(committed, accepted_state(state, states_ref, accepted)) <= TOL[dtype]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["fp64", "fp32"])
@pytest.mark.parametrize("name", strategies.names())
def test_fifty_steps_with_random_acceptance(name, dtype):
    """verify/commit repeated 50 times stays on the literal state; flushes happen on the way."""
    tree = DraftTree.chain(3, root=True) if name == "replay" else DraftTree.from_widths((2, 2), root=True)
    gen = torch.Generator().manual_seed(5)
    B = 3
    strat = get(name, tree)
    state = make_step(tree, B=B, dtype=dtype, seed=100)[0]
    literal = state.clone()
    carry = strat.start(state)
    for step in range(50):
        _, q, k, v, g, beta = make_step(tree, B=B, dtype=dtype, seed=step)
        o_ref, states_ref = tree_recurrence(literal, q, k, v, g, beta, tree)
        ver = strat.verify(carry, q, k, v, g, beta, tree)
        assert rel_err(ver.o, o_ref) <= TOL[dtype], f"step {step}"
        accepted = torch.randint(-1, tree.num_nodes, (B,), generator=gen)
        carry = strat.commit(carry, ver, accepted)
        literal = accepted_state(literal, states_ref, accepted)
        assert rel_err(strat.materialize(carry), literal) <= TOL[dtype], f"step {step}"
    if name in ("replay", "treewy_deferred"):
        assert int(carry.flushes.sum()) > 0  # the deferred path was exercised, not only the buffer


@pytest.mark.parametrize("name", ["replay", "treewy_deferred"])
def test_deferred_flush_only_when_the_buffer_is_full(name):
    """Accepting everything on a chain of 3 + root (4 tokens/step) with buffer 16: the history
    holds 4, 8, 12 tokens, then 16 leaves no room for a 4-token step, so step 4 flushes."""
    tree = DraftTree.chain(3, root=True)
    strat = strategies.get(name, buffer_len=16)
    state, q, k, v, g, beta = make_step(tree, B=1, seed=0)
    carry = strat.start(state)
    flushes = []
    for _ in range(8):
        carry = strat.commit(carry, strat.verify(carry, q, k, v, g, beta, tree), torch.tensor([3]))
        flushes.append(int(carry.flushes[0]))
    reserve = tree.num_nodes if name == "replay" else tree.path_length
    assert reserve == 4
    assert flushes == [0, 0, 0, 1, 1, 1, 1, 2]


@pytest.mark.parametrize("name", strategies.names())
@pytest.mark.parametrize("gates", [
    {"g_range": (-1e-9, 0.0)},            # a ≈ 1: no decay
    {"g_range": (-60.0, -40.0)},          # a ≈ 1e-20: state wiped every token
    {"g_range": (-2000.0, -1000.0)},      # exp underflows to exactly 0
    {"beta_range": (0.0, 1e-9)},          # β ≈ 0: no write
    {"beta_range": (1 - 1e-9, 1.0)},      # β ≈ 1: full delta-rule write
], ids=["g~0", "g~-50", "g~-1000", "beta~0", "beta~1"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["fp64", "fp32"])
def test_extreme_gates_stay_finite_and_accurate(name, gates, dtype):
    tree = DraftTree.chain(7, root=True) if name == "replay" else DraftTree.from_widths((3, 3), root=True)
    B = tree.num_nodes
    state, q, k, v, g, beta = make_step(tree, B=B, dtype=dtype, seed=7, **gates)
    o_ref, states_ref = tree_recurrence(state, q, k, v, g, beta, tree)
    strat = get(name, tree)
    ver = strat.verify(strat.start(state), q, k, v, g, beta, tree)
    accepted = torch.arange(B)
    committed = strat.materialize(strat.commit(strat.start(state), ver, accepted))
    assert torch.isfinite(ver.o).all() and torch.isfinite(committed).all()
    assert rel_err(ver.o, o_ref) <= TOL[dtype]
    assert rel_err(committed, accepted_state(state, states_ref, accepted)) <= TOL[dtype]


def test_grouped_value_heads_read_their_key_head():
    """HV = 2H: value heads 2j and 2j+1 read key head j (repeat_interleave), not j % H."""
    tree = DraftTree.from_widths((2, 2))
    state, q, k, v, g, beta = make_step(tree, B=2, H=2, HV=4, dtype=torch.float64, seed=3)
    o, _ = tree_recurrence(state, q, k, v, g, beta, tree)
    o_exp, _ = tree_recurrence(state, q.repeat_interleave(2, 2), k.repeat_interleave(2, 2), v, g, beta, tree)
    assert rel_err(o, o_exp) < 1e-15
    o_wrong, _ = tree_recurrence(state, q.repeat(1, 1, 2, 1), k.repeat(1, 1, 2, 1), v, g, beta, tree)
    assert rel_err(o, o_wrong) > 1e-3
    for name in ("store_all", "treewy", "treewy_deferred", "store_selective", "store_delta"):
        strat = strategy(name)
        assert rel_err(strat.verify(strat.start(state), q, k, v, g, beta, tree).o, o_exp) < 1e-12


def test_rows_commit_independently():
    """Different accepted nodes per row of one batch, and a row that accepts nothing."""
    tree = DraftTree.from_widths((3, 3, 3))
    state, q, k, v, g, beta = make_step(tree, B=4, seed=9)
    _, states_ref = tree_recurrence(state, q, k, v, g, beta, tree)
    accepted = torch.tensor([38, -1, 0, 14])
    for name in ("store_all", "treewy", "treewy_deferred", "store_selective", "store_delta"):
        strat = strategy(name)
        carry = strat.commit(strat.start(state), strat.verify(strat.start(state), q, k, v, g, beta, tree), accepted)
        got = strat.materialize(carry)
        assert rel_err(got, accepted_state(state, states_ref, accepted)) < 1e-12
        assert torch.equal(got[1], state[1]) or rel_err(got[1], state[1]) < 1e-15


def test_treewy_stash_is_small_and_has_no_per_node_state():
    tree = DraftTree.from_widths((3, 3, 3), root=True)
    state, q, k, v, g, beta = make_step(tree, B=2, H=2, HV=4, K=8, V=6, seed=1)
    ver = strategies.get("treewy").verify(state, q, k, v, g, beta, tree)
    shapes = {name: tuple(t.shape) for name, t in ver.stash.items()}
    assert shapes == {"v_tilde": (2, 40, 4, 6), "k": (2, 40, 2, 8), "G": (2, 40, 4)}
    store = strategies.get("store_all").verify(state, q, k, v, g, beta, tree)
    assert tuple(store.stash["states"].shape) == (2, 40, 4, 8, 6)


def test_bfloat16_runs_and_stays_close():
    tree = DraftTree.chain(3, root=True)
    args = make_step(tree, B=2, seed=4)
    o_ref, _ = tree_recurrence(*args, tree)
    for name in strategies.names():
        strat = strategy(name)
        bf = [a.bfloat16() for a in args]
        ver = strat.verify(strat.start(bf[0]), *bf[1:], tree)
        assert ver.o.dtype == torch.bfloat16
        assert rel_err(ver.o, o_ref) < 3e-2


# -- bad inputs ----------------------------------------------------------------

def _args(tree, **kw):
    return list(make_step(tree, B=2, H=2, HV=4, K=8, V=6, **kw))


@pytest.mark.parametrize("name", strategies.names())
def test_shape_mismatch_names_the_tensor(name):
    tree = DraftTree.chain(3)
    state, q, k, v, g, beta = _args(tree)
    strat = strategy(name)
    with pytest.raises(ValueError, match=r"v: shape \(2, 3, 4, 5\); expected \(2, 3, 4, 6\)"):
        strat.verify(strat.start(state), q, k, v[..., :5], g, beta, tree)
    with pytest.raises(ValueError, match=r"beta: shape"):
        strat.verify(strat.start(state), q, k, v, g, beta[:1], tree)
    with pytest.raises(ValueError, match="3 tokens but the tree has 4 nodes"):
        strat.verify(strat.start(state), q, k, v, g, beta, DraftTree.chain(4))
    with pytest.raises(ValueError, match="dtype"):
        strat.verify(strat.start(state), q.float(), k, v, g, beta, tree)
    with pytest.raises(ValueError, match=r"state: shape"):
        strat.verify(strat.start(state[0]), q, k, v, g, beta, tree)


def test_value_heads_must_be_a_multiple_of_key_heads():
    tree = DraftTree.chain(2)
    state, q, k, v, g, beta = make_step(tree, B=1, H=2, HV=3, K=4, V=4)
    with pytest.raises(ValueError, match="HV=3 value heads is not a multiple of H=2"):
        strategies.get("treewy").verify(state, q, k, v, g, beta, tree)


@pytest.mark.parametrize("name", strategies.names())
@pytest.mark.parametrize("accepted, match", [
    ([0, 3], r"accepted\[1\]=3: must be in \[-1, 2\]"),
    ([-2, 0], r"accepted\[0\]=-2"),
    ([0], r"accepted: shape \(1,\); expected \(2,\)"),
    ([0.0, 1.0], "integer node indices"),
])
def test_accepted_out_of_range(name, accepted, match):
    tree = DraftTree.chain(3)
    state, q, k, v, g, beta = _args(tree)
    strat = strategy(name)
    ver = strat.verify(strat.start(state), q, k, v, g, beta, tree)
    with pytest.raises(ValueError, match=match):
        strat.commit(strat.start(state), ver, torch.tensor(accepted))


def test_replay_refuses_branching_trees_and_says_why():
    tree = DraftTree.from_widths((2, 2))
    state, q, k, v, g, beta = _args(tree)
    with pytest.raises(ValueError, match="replay: needs a chain.*contiguous.*treewy"):
        strategies.get("replay").verify(state, q, k, v, g, beta, tree)


def test_buffer_too_small_for_the_step():
    tree = DraftTree.chain(20)
    state, q, k, v, g, beta = _args(tree)
    strat = strategies.get("replay")
    with pytest.raises(ValueError, match="buffer_len=16; pass buffer_len >= 20"):
        strat.verify(strat.start(state), q, k, v, g, beta, tree)


def test_fitting_grows_only_a_buffer_one_step_would_overflow():
    """What the memory figure and bench strategies use to show every draft shape: a deferred strategy whose ring
    is too short for a step gets one that holds it (and then verifies it), any other strategy is itself."""
    tree = DraftTree.chain(20)
    short = strategies.get("replay")
    grown = short.fitting(tree)
    assert grown is not short and grown.buffer_len == short.buffer_needed(tree) > short.buffer_len
    state, q, k, v, g, beta = _args(tree)
    grown.verify(grown.start(state), q, k, v, g, beta, tree)             # the step that overflowed now fits
    roomy = strategies.get("treewy_deferred", buffer_len=64)
    assert roomy.fitting(tree) is roomy
    treewy = strategies.get("treewy")
    assert treewy.fitting(tree) is treewy


def test_unknown_strategy_and_bad_options():
    with pytest.raises(ValueError, match="strategy='nope': unknown; choose one of store_all, replay"):
        strategies.get("nope")
    with pytest.raises(ValueError, match="buffer_len=0"):
        strategies.get("replay", buffer_len=0)
    with pytest.raises(ValueError, match="bad options"):
        strategies.get("treewy", buffer_len=4)
