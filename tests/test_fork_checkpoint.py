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
        want = (conf <= threshold) | torch.tensor([bool(tree.children(t)) and not tree.is_chain for t in range(N)])
        assert kept == int(want.sum()) == ver.stash["checkpoints"].shape[0]
        got = strat.commit(state, ver, accepted)
        assert rel_err(got, accepted_state(state, states_ref, accepted)) <= TOL[dtype]
    if threshold == 0.0 and tree.is_chain:        # no checkpoint at all: every commit redoes its whole path
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
    then keeps 0 + 1/2 + 1 checkpoints of its drafts (the root never: confidence 1); on a tree the nodes with
    children always keep theirs (their children fork from them), and so do the non-top children at 0.95
    (probability <= 1/2). Recoveries: step 1 accepts 2 drafts whose last (0.99) has no
    checkpoint and neither have the ones above it: 3 nodes from the committed state; step 2 accepts 3, the last
    (0.2) is checkpointed."""
    prof = _profile(tmp_path, [{"confidence": [0.99, 0.97, 0.3], "accepted": 2},
                               {"confidence": [0.98, 0.6, 0.2], "accepted": 3}])
    chain = DraftTree.chain(3, root=True)
    assert prof.checkpoint_probabilities(chain, 0.95) == [0.0, 0.0, 0.5, 1.0]
    tree = DraftTree.from_widths((2, 2), root=True)         # root, a(top), a1, a2, b, b1, b2
    assert prof.checkpoint_probabilities(tree, 0.95) == [1.0, 1.0, 0.5, 1.0, 1.0, 0.5, 1.0]
    assert prof.expected_recovery(chain, 0.95) == {"probability": 0.5, "tokens": 3.0}
    strat = strategies.get("store_selective", confidences=str(tmp_path / "conf.json"))
    assert strat.expected_footprint(chain) == (2.5, 2.5)
    # at threshold 1 every checkpoint is kept: store_all's pages (the root's in the committed state's page)
    every = strategies.get("store_selective", threshold=1.0, confidences=str(tmp_path / "conf.json"))
    assert every.expected_footprint(chain) == (store := strategies.get("store_all").footprint(chain)[0], 0.0)
    assert store == 4
    with pytest.raises(ValueError, match="rank 1.*threshold of 0.3 < 0.5"):
        prof.checkpoint_probabilities(DraftTree.from_widths((1, 2), root=True), 0.3)
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
    assert strat.lossless(dtype) and (opts["codec"] == "exact") == strat.lossless(torch.bfloat16)
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
    assert not strat.lossless(torch.float64)
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
    # the in-engine gate refuses them before any engine starts
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-m", "harness", "acceptance", "vllm", "strategy=[store_all,store_delta]"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 2 and "strategy=store_delta: the in-engine gate runs what vLLM runs" in run.stderr


# -- the acceptance gate -----------------------------------------------------------------------------

def _small_gate(**over):
    import copy

    import yaml

    cfg = yaml.safe_load(open("conf/check_acceptance.yaml"))
    cfg = copy.deepcopy(cfg)
    cfg.update(prompts={"count": 2, "max_tokens": 24, "seed": 0, "categories": None}, max_new_tokens=24,
               dtypes=["float64", "float32"], drafts=["chain:3", "2,2,2"], tree_sweep=None, tree_sweep_out=None,
               baseline=None)
    cfg.update(over)
    return cfg


@pytest.mark.parametrize("strategy", [{"name": "store_selective", "threshold": 0.2}], ids=["selective-0.2"])
def test_the_gate_passes_selective_fork_with_most_commits_recovered(strategy):
    """Beside .ci/run's gate (the configured options: threshold 0.95, the exact codec): the toy drafter is rarely
    sure (its drafts above 0.95 are ~2%), so at 0.2 most checkpoints are skipped and most commits are recoveries,
    which must decode the reference's tokens all the same. (Sparse deltas at threshold 0 are exact to rounding in
    test_lossless_deltas_restore_every_node.)"""
    from harness.acceptance.gate import run_gate

    opts = {k: v for k, v in strategy.items() if k != "name"}
    made = []

    def factory(name, widths):
        made.append(strategies.get(strategy["name"], **opts))
        return made[-1]

    res = run_gate(_small_gate(strategy=[strategy["name"]]), strategy_factory=factory)
    assert res.passed, res.failures
    assert {r.draft for r in res.rows} == {"chain:3", "2,2,2"} and all(r.agree == 1.0 for r in res.rows)


class RecoverWithoutRedo(strategies.store_selective.StoreSelective):
    """A recovery that takes the nearest checkpoint (or the committed state) as the accepted node's state."""

    def _commit(self, carry, verified, accepted):
        st = verified.stash
        out = carry.clone()
        for b, a in enumerate(accepted.tolist()):
            if a >= 0:
                base, _ = strategies.store_selective.recovery_plan(st["slot"][b].tolist(), verified.tree, a)
                if base >= 0:
                    out[b] = st["checkpoints"][int(st["slot"][b, base])]
        return out


class DropLastDelta(strategies.store_delta.StoreDelta):
    """Restores the accepted node without its own delta (its parent's state)."""

    def _commit(self, carry, verified, accepted):
        v = verified.stash["delta"].clone()
        for b, a in enumerate(accepted.tolist()):
            if a >= 0:
                v[b, a] = 0
        import copy
        ver = copy.copy(verified)
        ver.stash = {**verified.stash, "delta": v}
        return super()._commit(carry, ver, accepted)


@pytest.mark.parametrize("mutant", [lambda: RecoverWithoutRedo(threshold=0.2), DropLastDelta],
                         ids=["selective-no-redo", "delta-drops-one"])
def test_the_gate_catches_a_wrong_recovery_or_restore(mutant):
    from harness.acceptance.gate import run_gate

    res = run_gate(_small_gate(strategy=["store_selective"], dtypes=["float64"]),
                   strategy_factory=lambda name, widths: mutant())
    assert not res.passed and any(r.verdict == "FAIL" for r in res.rows)


def test_the_memory_table_prints_the_write_ups_table_beside_the_measured_one():
    """The issue's command: 5 / 14 / 39 speculative checkpoints (the write-up's 5 / ~15 / ~40 and 60 / 180 / 480
    MB beside them), every strategy's row, the new ones included."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "harness", "memory", "model=qwen35_9b",
                          "drafts=[chain:5,[2,2,2],[3,3,3]]"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    table = out.stdout[out.stdout.index("write-up's table"):]
    rows = [line.split() for line in table.splitlines()]
    firsts = {r[0]: r for r in rows if r and r[0] in ("chain:5", "2,2,2", "3,3,3")}
    assert [firsts[d][2:7] for d in ("chain:5", "2,2,2", "3,3,3")] == [
        ["5", "60", "5", "60", "120"], ["~15", "180", "14", "168", "336"], ["~40", "480", "39", "468", "936"]]
    for name in strategies.names() + ["store_delta:fp8_e4m3"]:
        assert f" {name} " in table
    fp8 = [r for r in rows if "store_delta:fp8_e4m3" in r]
    assert [r[-1] for r in fp8] == ["60.0", "168.0", "468.1"]       # half a bf16 checkpoint each


def test_the_checkpoints_study_measures_real_states_and_drafts(tmp_path):
    """`python -m harness checkpoints` on a few prompts: the trained model's MTP profile (k = 3 confidences per step,
    the accepted counts), the toy drafter's (chain steps and the trees' lower-ranked children), per-layer delta
    compression in every codec with the dense ones at their fixed sizes, and a profile store_selective reads."""
    import subprocess
    import sys

    out = tmp_path / "fc"
    run = subprocess.run([sys.executable, "-m", "harness", "checkpoints", f"out={out}", "trained.prompts=2",
                          "trained.new_tokens=12", "gate.prompts.count=2", "gate.max_new_tokens=10",
                          "tiny_drafts=[chain:3,'2,2']"], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    res = json.loads((out / "checkpoints.json").read_text())
    trained = json.loads((out / "confidences" / "trained-qwen3next-mtp.json").read_text())
    assert trained["steps"] and all(len(s["confidence"]) == 3 and 0 <= s["accepted"] <= 3 for s in trained["steps"])
    toy = json.loads((out / "confidences" / "toy-drafter.json").read_text())
    assert toy["steps"] and toy["ranks"]["1"] and max(toy["ranks"]["1"]) <= 0.5
    for study in ("trained", "tiny"):
        layers = res[study]["deltas"]
        assert len(layers) == 3
        for d in layers:
            assert d["bf16"]["vs_bf16"]["median"] == 1.0 and d["exact"]["vs_fp32"]["median"] == 1.0
            assert d["exact"]["rel_error"]["max"] < 1e-6 < d["fp8_e4m3"]["rel_error"]["median"]
            assert 0 < d["sparse"]["kept_fraction"]["median"] <= 1
    assert all(0 <= d["one_minus_decay"]["median"] <= 1 for d in res["trained"]["deltas"])
    sel = res["trained"]["selective"]
    assert [s["threshold"] for s in sel] == [0.9, 0.95, 0.99]
    assert sel[0]["skipped_fraction"] >= sel[1]["skipped_fraction"] >= sel[2]["skipped_fraction"]
    strat = strategies.get("store_selective", confidences=str(out / "confidences" / "trained-qwen3next-mtp.json"))
    pages, slots = strat.expected_footprint(DraftTree.chain(3, root=True))
    assert 1.0 <= pages <= 4.0 and pages + slots == 5.0
