"""The fork/checkpoint write-up's refinements as strategies: selective fork (store_selective) and delta checkpoints
(store_delta); their exactness against the literal recurrence sits with every strategy's in test_strategies.py."""

from __future__ import annotations

import json

import pytest
import torch

import strategies
from strategies import DraftTree, accepted_state, tree_recurrence
from strategies.confidence import ConfidenceProfile
from strategies.store_all import fork_states
from strategies.inputs import expand_heads

from conftest import make_step, rel_err

TOL = {torch.float64: 1e-12, torch.float32: 1e-5}


# -- store_selective ---------------------------------------------------------------------------------

def test_selective_keeps_the_unsure_checkpoints_and_recovers_the_others_exactly():
    """Chain of 3 under a root, confidences root 1, then 0.99, 0.5, 0.99 at 0.95: checkpoints only at node 2.
    Accepting node 3 redoes one node from node 2's checkpoint; node 1 redoes two from the committed state;
    node 2 reads its own checkpoint; the states are store_all's bit for bit (the same arithmetic)."""
    tree = DraftTree.chain(3, root=True)
    state, q, k, v, g, beta = make_step(tree, B=5, dtype=torch.float64, seed=2)
    conf = torch.tensor([[1.0, 0.99, 0.5, 0.99]] * 5, dtype=torch.float64)
    strat = strategies.get("store_selective")
    ver = strat.verify(state, q, k, v, g, beta, tree, confidence=conf)
    assert ver.stash["checkpoints"].shape[0] == 5 and (ver.stash["slot"] >= 0).sum(1).tolist() == [1] * 5
    accepted = torch.tensor([-1, 0, 1, 2, 3])
    rec = strat.recovery(ver, accepted)
    assert rec["recovered_per_request"] == [0, 1, 2, 0, 1]
    # several checkpoints on one path: the nearest one, the fewest nodes redone
    conf2 = torch.tensor([[0.5, 0.5, 0.99, 0.99]] * 5, dtype=torch.float64)
    ver2 = strat.verify(state, q, k, v, g, beta, tree, confidence=conf2)
    assert strat.recovery(ver2, accepted)["recovered_per_request"] == [0, 0, 0, 1, 2]
    assert (rec["checkpoints"], rec["skipped"], rec["recoveries"], rec["recovered_tokens"]) == (5, 15, 3, 4)
    store = strategies.get("store_all")
    want = store.commit(state, store.verify(state, q, k, v, g, beta, tree), accepted)
    assert torch.equal(strat.commit(state, ver, accepted), want)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["fp64", "fp32"])
@pytest.mark.parametrize("widths", [(2, 2, 2), (3, 3, 3), (1,) * 6])
@pytest.mark.parametrize("threshold", [0.0, 0.5, 0.95, 1.0])
def test_selective_commits_every_node_at_every_threshold(widths, threshold, dtype):
    """Any threshold (0: no checkpoint at all, every commit a recovery from the committed state; 1: store_all's)
    and either fork order: every node's committed state within the recurrence's tolerance."""
    tree = DraftTree.from_widths(widths, root=True)
    N = tree.num_nodes
    state, q, k, v, g, beta = make_step(tree, B=N + 1, dtype=dtype, seed=4)
    _, states_ref = tree_recurrence(state, q, k, v, g, beta, tree)
    conf = torch.rand(N + 1, N, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    conf[:, 0] = 1.0
    accepted = torch.arange(-1, N)
    for fork in ("node", "depth"):
        strat = strategies.get("store_selective", threshold=threshold, fork=fork)
        ver = strat.verify(state, q, k, v, g, beta, tree, confidence=conf)
        kept = int((ver.stash["slot"] >= 0).sum())
        assert kept == int((conf <= threshold).sum()) == ver.stash["checkpoints"].shape[0]
        got = strat.commit(state, ver, accepted)
        assert rel_err(got, accepted_state(state, states_ref, accepted)) <= TOL[dtype]
    if threshold == 0.0:
        assert strat.recovery(ver, accepted)["recovered_tokens"] == sum(len(tree.path_to(a)) for a in range(N))


def test_selective_needs_confidences_and_names_bad_ones():
    tree = DraftTree.chain(2)
    state, q, k, v, g, beta = make_step(tree, B=2)
    strat = strategies.get("store_selective")
    with pytest.raises(ValueError, match="store_selective: decides its checkpoints.*confidence=\\[B, N\\]"):
        strat.verify(state, q, k, v, g, beta, tree)
    with pytest.raises(ValueError, match=r"confidence: shape \(2, 3\); expected \(2, 2\)"):
        strat.verify(state, q, k, v, g, beta, tree, confidence=torch.full((2, 3), 0.5))
    with pytest.raises(ValueError, match=r"confidence\[1, 0\]=1.5: a draft probability must be in \[0, 1\]"):
        strat.verify(state, q, k, v, g, beta, tree, confidence=torch.tensor([[0.5, 0.5], [1.5, 0.5]]))
    with pytest.raises(ValueError, match=r"confidence\[0, 1\]=nan"):
        strat.verify(state, q, k, v, g, beta, tree, confidence=torch.tensor([[0.5, float("nan")], [0.5, 0.5]]))
    with pytest.raises(ValueError, match="threshold=1.5: a probability"):
        strategies.get("store_selective", threshold=1.5)
    # the others take a confidence and ignore it
    o = strategies.get("treewy").verify(state, q, k, v, g, beta, tree, confidence=torch.full((2, 2), 0.5)).o
    assert torch.equal(o, strategies.get("treewy").verify(state, q, k, v, g, beta, tree).o)


def _profile(tmp_path, steps, ranks=None):
    p = tmp_path / "conf.json"
    p.write_text(json.dumps({"drafter": "test", "steps": steps, **({"ranks": ranks} if ranks else {})}))
    return ConfidenceProfile.load(p)


def test_a_confidence_profile_gives_expected_checkpoints_and_recoveries(tmp_path):
    """Two measured chain steps: depth 0 above 0.95 in both, depth 1 in one, depth 2 in none. A rooted chain of 3
    then keeps 0 + 1/2 + 1 checkpoints of its drafts (the root never: confidence 1); its non-top children of a tree
    always keep theirs at 0.95 (probability <= 1/2). Recoveries: step 1 accepts 2 drafts whose last (0.99) has no
    checkpoint and neither have the ones above it: 3 nodes from the committed state; step 2 accepts 3, the last
    (0.2) is checkpointed."""
    prof = _profile(tmp_path, [{"confidence": [0.99, 0.97, 0.3], "accepted": 2},
                               {"confidence": [0.98, 0.6, 0.2], "accepted": 3}])
    chain = DraftTree.chain(3, root=True)
    assert prof.checkpoint_probabilities(chain, 0.95) == [0.0, 0.0, 0.5, 1.0]
    tree = DraftTree.from_widths((2, 2), root=True)         # root, a(top), a1, a2, b, b1, b2
    assert prof.checkpoint_probabilities(tree, 0.95) == [0.0, 0.0, 0.5, 1.0, 1.0, 0.5, 1.0]
    assert prof.expected_recovery(chain, 0.95) == {"probability": 0.5, "tokens": 3.0}
    strat = strategies.get("store_selective", confidences=str(tmp_path / "conf.json"))
    assert strat.expected_footprint(chain) == (2.5, 2.5)
    with pytest.raises(ValueError, match="rank 1.*threshold of 0.3 < 0.5"):
        prof.checkpoint_probabilities(tree, 0.3)
    with pytest.raises(ValueError, match="confidences=.*nope.json: no such file"):
        ConfidenceProfile.load(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match="not a confidence profile"):
        ConfidenceProfile.load(tmp_path / "bad.json")


# -- store_delta -------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["fp64", "fp32"])
@pytest.mark.parametrize("opts", [{"codec": "exact"}, {"codec": "sparse", "threshold": 0.0},
                                  {"codec": "exact", "fork": "depth"}], ids=["exact", "sparse0", "exact-depth"])
@pytest.mark.parametrize("widths", [(1,) * 5, (2, 2, 2), (3, 3, 3)])
def test_lossless_deltas_restore_every_node(widths, opts, dtype):
    tree = DraftTree.from_widths(widths, root=True)
    N = tree.num_nodes
    state, q, k, v, g, beta = make_step(tree, B=N + 1, dtype=dtype, seed=6)
    _, states_ref = tree_recurrence(state, q, k, v, g, beta, tree)
    strat = strategies.get("store_delta", **opts)
    assert strat.lossless
    accepted = torch.arange(-1, N)
    got = strat.commit(state, strat.verify(state, q, k, v, g, beta, tree), accepted)
    assert rel_err(got, accepted_state(state, states_ref, accepted)) <= TOL[dtype]


@pytest.mark.parametrize("codec, bound", [("bf16", 1e-2), ("fp8_e4m3", 1e-1), ("sparse", 1e-2)])
def test_lossy_deltas_round_once_per_restore_not_once_per_depth(codec, bound):
    """A lossy codec's error 48 nodes deep is that of one rounding (the deltas are taken against the restored
    parent), within the codec's precision; against the exact parent it would add one rounding per depth (~7x)."""
    tree = DraftTree.chain(48)
    state, q, k, v, g, beta = make_step(tree, B=8, dtype=torch.float64, seed=8, g_range=(-0.05, 0.0))
    _, states_ref = tree_recurrence(state, q, k, v, g, beta, tree)
    strat = strategies.get("store_delta", codec=codec)
    assert not strat.lossless
    ver = strat.verify(state, q, k, v, g, beta, tree)
    err = [rel_err(strat.commit(state, ver, torch.full((8,), a)), states_ref[:, a]) for a in range(48)]
    assert 0 < max(err) <= bound and max(err[-8:]) <= 2 * max(err[:8])


def test_the_exact_delta_is_a_decay_scale_plus_a_rank_one_term():
    """S_t - S_p = (a_t - 1) S_p + k_t ⊗ ṽ_t: store_delta's exact delta equals the algebra's, whose low-rank form is
    TreeWY's stash (ṽ, k, g); dense: every entry moves unless a_t = 1."""
    tree = DraftTree.from_widths((2, 2), root=True)
    state, q, k, v, g, beta = make_step(tree, B=3, dtype=torch.float64, seed=9)
    ver = strategies.get("store_delta").verify(state, q, k, v, g, beta, tree)
    kh = expand_heads(k, 4)
    states, _, u = fork_states(state, expand_heads(q, 4), kh, v, g, beta, tree, 8 ** -0.5, "node")
    par = torch.tensor(tree.parents)
    parent = torch.where((par < 0)[None, :, None, None, None], state[:, None], states[:, par.clamp(min=0)])
    algebra = (g.exp() - 1)[..., None, None] * parent + kh[..., :, None] * u[..., None, :]
    assert rel_err(ver.stash["delta"], algebra) < 1e-12
    assert (ver.stash["delta"] != 0).double().mean() > 0.99


def test_delta_codecs_sizes_and_reservation():
    """Encoded sizes per checkpoint of Qwen3.5-9B's heads (a 4 MiB fp32 / 2 MiB bf16 state per layer): bf16 is a
    bf16 state's size (no compression of a bf16 checkpoint), fp8 half of it plus a scale per head, exact the fp32
    arithmetic's; the reservation (what vLLM's planner holds) is store_all's whatever the codec."""
    from strategies import GDNShape

    shape = GDNShape(24, 16, 32, 128, 128)
    E = 32 * 128 * 128
    get = lambda c: strategies.get("store_delta", codec=c)            # noqa: E731
    assert get("bf16").checkpoint_bytes(shape, "bfloat16") == 2 * E
    assert get("fp8_e4m3").checkpoint_bytes(shape, "bfloat16") == E + 32 * 4
    assert get("exact").checkpoint_bytes(shape, "bfloat16") == 4 * E
    assert get("sparse").checkpoint_bytes(shape, "bfloat16", density=0.01) == 0.01 * E * 6
    assert get("sparse").checkpoint_bytes(shape, "bfloat16", density=0.5) == E / 8 + 0.5 * E * 2
    tree = DraftTree.from_widths((2, 2, 2), root=True)
    assert get("fp8_e4m3").footprint(tree) == strategies.get("store_all").footprint(tree)
    held = get("fp8_e4m3").held_memory(shape, tree, "bfloat16")
    assert held.state_pages == 15 and held.state_bytes == 2 * E + 14 * (E + 128)
    with pytest.raises(ValueError, match="codec='zip'.*exact, sparse, bf16, fp8_e4m3"):
        strategies.get("store_delta", codec="zip")


def test_vllm_refuses_the_variants_its_planner_cannot_use():
    from harness.engines.vllm.engine import VLLMEngine

    for name in ("store_selective", "store_delta"):
        why = VLLMEngine.runs_strategy(name)
        assert why and "1 + k whole GDN state pages" in why and "engine=sim" in why
    assert VLLMEngine.runs_strategy("store_all") is None
