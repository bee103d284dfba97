"""The Triton kernels against the torch strategies and the literal recurrence.

On a CUDA GPU they run compiled, at the real head shapes too; elsewhere in Triton's interpreter
(tests/conftest.py switches it on before anything imports Triton), at small shapes: slow, exact.
"""

from __future__ import annotations

import pytest
import torch

import strategies
from strategies import DraftTree, accepted_state, kernels, tree_recurrence

from conftest import WithConfidence, make_step, rel_err

pytestmark = pytest.mark.skipif(not kernels.available(), reason="Triton not installed (pip install triton)")

GPU = torch.cuda.is_available()
DEV = "cuda" if GPU else "cpu"
FP32_TOL = 1e-5
BF16_TOL = 2e-2     # bf16 inputs: 8 mantissa bits; outputs compared with the fp32 reference on the same inputs

SHAPES = {
    "chain1+root": DraftTree.chain(1, root=True),
    "chain3+root": DraftTree.chain(3, root=True),
    "chain7+root": DraftTree.chain(7, root=True),
    "tree222+root": DraftTree.from_widths((2, 2, 2), root=True),
    "forest": DraftTree((-1, 0, 1, 0, -1, 4, -1)),
}
# The benchmark's big shapes; on the CPU interpreter only where they stay cheap.
BIG = {
    "tree333+root": DraftTree.from_widths((3, 3, 3), root=True),       # N = 40
    "tree22222+root": DraftTree.from_widths((2,) * 5, root=True),      # N = 63
    "chain63+root": DraftTree.chain(63, root=True),                    # N = 64
}
HEADS = dict(H=2, HV=4, K=16, V=32) if not GPU else dict(H=16, HV=32, K=128, V=128)


def applicable(name, tree):
    return name != "replay" or tree.is_chain


def kget(name, **kw):
    """``kernels.get``, with seeded draft confidences for a strategy that needs them (conftest.WithConfidence)."""
    strat = kernels.get(name, **kw)
    return WithConfidence(strat) if strat.uses_confidence else strat


def pair(name, tree, **kw):
    """(Triton strategy, torch reference strategy) with the same options (and the same seeded confidences)."""
    opts = {"buffer_len": max(16, tree.num_nodes)} if name == "replay" else {}
    ref = strategies.get(name, **opts)
    return kget(name, **opts, **kw), (WithConfidence(ref) if ref.uses_confidence else ref)


def step(tree, B, dtype=torch.float32, seed=0, **heads):
    return [t.to(DEV) for t in make_step(tree, B=B, dtype=dtype, seed=seed, **(heads or HEADS))]


# store_selective's kernel is store_all's with a keep mask: on the CPU interpreter (slow) it runs on the shapes
# that take each of its paths (a chain: the state in registers; a tree: snapshots read back; a forest)
CASES = [(n, s) for s in SHAPES for n in kernels.NAMES if applicable(n, SHAPES[s])
         and (GPU or n != "store_selective" or s in ("chain3+root", "tree222+root", "forest"))]


@pytest.mark.parametrize("name, shape", CASES)
def test_one_step_matches_the_recurrence(name, shape):
    """Outputs of every node, and the committed state for every accepted node incl. -1."""
    tree = SHAPES[shape]
    N = tree.num_nodes
    state, q, k, v, g, beta = step(tree, B=N + 1, seed=5)
    o_ref, states_ref = tree_recurrence(state, q, k, v, g, beta, tree)
    strat, _ = pair(name, tree, block_v=16)
    ver = strat.verify(strat.start(state), q, k, v, g, beta, tree)
    assert ver.o.shape == o_ref.shape and ver.o.dtype == torch.float32
    assert rel_err(ver.o, o_ref) <= FP32_TOL
    accepted = torch.arange(-1, N, device=DEV)
    committed = strat.materialize(strat.commit(strat.start(state), ver, accepted))
    assert rel_err(committed, accepted_state(state, states_ref, accepted)) <= FP32_TOL


@pytest.mark.parametrize("name", kernels.NAMES)
def test_many_steps_follow_the_torch_strategy(name):
    """Twelve steps with random acceptance and a draft shape that changes midway: the carries
    (store_all's slots written in place, replay's ring and its flushes) stay on the reference."""
    gen = torch.Generator().manual_seed(3)
    trees = [DraftTree.chain(3, root=True)] * 6 + [DraftTree.chain(1, root=True)] * 3 \
        + [DraftTree.chain(5, root=True)] * 3
    opts = {"buffer_len": 8} if name == "replay" else {}
    kern, ref = kget(name, block_v=16, **opts), strategies.get(name, **opts)
    ref = WithConfidence(ref) if ref.uses_confidence else ref
    B = 5
    state = step(trees[0], B=B, seed=0)[0]
    ck, cr = kern.start(state.clone()), ref.start(state.clone())
    for i, tree in enumerate(trees):
        _, q, k, v, g, beta = step(tree, B=B, seed=100 + i)
        vk, vr = kern.verify(ck, q, k, v, g, beta, tree), ref.verify(cr, q, k, v, g, beta, tree)
        assert rel_err(vk.o, vr.o) <= FP32_TOL, f"step {i}"
        accepted = torch.randint(0, tree.num_nodes, (B,), generator=gen).to(DEV)
        accepted[i % B] = -1
        ck, cr = kern.commit(ck, vk, accepted), ref.commit(cr, vr, accepted)
        assert rel_err(kern.materialize(ck), ref.materialize(cr)) <= FP32_TOL, f"step {i}"
    if name == "replay":
        assert int(ck.flushes.sum()) > 0 and torch.equal(ck.flushes, cr.flushes)


@pytest.mark.parametrize("shape", list(BIG) if GPU else ["tree333+root", "chain63+root"])
@pytest.mark.parametrize("name", ["treewy", "treewy_fused", "store_all"])
def test_big_trees(name, shape):
    """The benchmark's large shapes (N up to 64): the solve stays exact as the tree grows; the fused
    step commits a big tree and verifies the next one in one kernel."""
    tree = BIG[shape]
    heads = None if GPU else dict(H=1, HV=2, K=16, V=16)
    state, q, k, v, g, beta = step(tree, B=3, seed=7, **(heads or {}))
    o_ref, states_ref = tree_recurrence(state, q, k, v, g, beta, tree)
    strat = pair("treewy" if name == "treewy_fused" else name, tree)[0]
    ver = strat.verify(strat.start(state), q, k, v, g, beta, tree)
    assert rel_err(ver.o, o_ref) <= FP32_TOL
    accepted = torch.tensor([0, tree.num_nodes - 1, tree.num_nodes // 2], device=DEV)
    expected = accepted_state(state, states_ref, accepted)
    if name == "treewy_fused":
        h = state.clone()
        ins = step(tree, B=3, seed=8, **(heads or {}))[1:]
        nxt = strat.step(h, ver, accepted, *ins, tree)
        assert rel_err(h, expected) <= FP32_TOL
        assert rel_err(nxt.o, tree_recurrence(expected, *ins, tree)[0]) <= FP32_TOL
        return
    committed = strat.materialize(strat.commit(strat.start(state), ver, accepted))
    assert rel_err(committed, expected) <= FP32_TOL


@pytest.mark.parametrize("shape", [*SHAPES, "tree333+root"] if GPU else ["tree222+root", "forest"])
def test_store_all_depth_fork_matches_the_recurrence(shape):
    """fork=depth (one launch per depth, a program per node) writes the same snapshots and outputs as the
    recurrence, fresh and in place over steps: node t's snapshot in its slot, the committed slot kept."""
    tree = {**SHAPES, **BIG}[shape]
    heads = None if GPU or tree.num_nodes < 20 else dict(H=1, HV=2, K=16, V=16)
    B = min(tree.num_nodes + 1, 8)
    state, q, k, v, g, beta = step(tree, B=B, seed=11, **(heads or {}))
    o_ref, states_ref = tree_recurrence(state, q, k, v, g, beta, tree)
    depth, node = kernels.get("store_all", block_v=16, fork="depth"), kernels.get("store_all", block_v=16)
    vd = depth.verify(depth.start(state), q, k, v, g, beta, tree)
    assert rel_err(vd.o, o_ref) <= FP32_TOL
    accepted = torch.arange(-1, B - 1, device=DEV) % tree.num_nodes
    accepted[0] = -1
    cd = depth.commit(depth.start(state), vd, accepted)
    assert rel_err(depth.materialize(cd), accepted_state(state, states_ref, accepted)) <= FP32_TOL
    # a second step in place (the committed state in one of the slots): same as the node-by-node kernel
    cn = node.commit(node.start(state), node.verify(node.start(state), q, k, v, g, beta, tree), accepted)
    ins = step(tree, B=B, seed=12, **(heads or {}))[1:]
    vd2, vn2 = depth.verify(cd, *ins, tree), node.verify(cn, *ins, tree)
    assert torch.equal(vd2.o, vn2.o)
    last = torch.full((B,), tree.num_nodes - 1, device=DEV)
    assert torch.equal(depth.materialize(depth.commit(cd, vd2, last)), node.materialize(node.commit(cn, vn2, last)))


def test_store_all_without_stores_writes_no_snapshot():
    """store=False (the benchmark's way to time the forks) leaves the snapshot slots as they were: its outputs
    are right on a chain (the running state stays in registers), its snapshots are not written."""
    tree = DraftTree.chain(3, root=True)
    state, q, k, v, g, beta = step(tree, B=2, seed=4)
    o_ref, states_ref = tree_recurrence(state, q, k, v, g, beta, tree)
    ver = kernels.get("store_all", block_v=16, store=False).verify(kernels.get("store_all").start(state),
                                                                     q, k, v, g, beta, tree)
    assert rel_err(ver.o, o_ref) <= FP32_TOL
    assert rel_err(ver.stash["states"][:, : tree.num_nodes], states_ref) > 1e-3


@pytest.mark.parametrize("name", kernels.NAMES)
def test_bf16_inputs_within_bf16_tolerance(name):
    """bf16 q/k/v/g/beta and state: the kernels compute in fp32 and cast the state back."""
    tree = DraftTree.chain(3, root=True)
    ins = step(tree, B=4, seed=9)
    bf = [t.to(torch.bfloat16) for t in ins]
    o_ref, states_ref = tree_recurrence(*[t.float() for t in bf], tree)
    strat, _ = pair(name, tree, block_v=16)
    ver = strat.verify(strat.start(bf[0]), *bf[1:], tree)
    assert ver.o.dtype == torch.bfloat16 and rel_err(ver.o, o_ref) <= BF16_TOL
    accepted = torch.tensor([0, 1, 2, 3], device=DEV)
    committed = strat.materialize(strat.commit(strat.start(bf[0]), ver, accepted))
    assert committed.dtype == torch.bfloat16
    assert rel_err(committed, accepted_state(bf[0].float(), states_ref, accepted)) <= BF16_TOL


def test_byte_model_at_the_35b_heads():
    """States' worth of bytes per request and layer per step, at Qwen3.5-35B-A3B's heads (fp32 state,
    bf16 inputs): store_all's verify writes one state per node; TreeWY moves h0 and h_a (plus h0 again
    when commit and verify are separate kernels); the stashes and inputs add a few percent."""
    from harness.bench.kernels import traffic
    from strategies import GDNShape

    shape = GDNShape(30, 16, 32, 128, 128)
    S = shape.state_elems * 4
    chain3 = DraftTree.chain(3, root=True)

    def states(name, tree, **kw):
        t = traffic(name, tree, shape, 4, 2, 1, **kw)
        return (t["verify_bytes"] + t["commit_bytes"]) / S

    assert 5.0 < states("store_all", chain3) < 5.1                           # h0 + 4 snapshots
    assert 3.0 < states("treewy", chain3, path_nodes=3) < 3.2
    assert 2.0 < states("treewy_fused", chain3, path_nodes=3) < 2.2
    tree = DraftTree.from_widths((3, 3, 3), root=True)
    assert 79 < states("store_all", tree) < 81                               # 40 written + 39 parents read back
    assert states("treewy_fused", tree, path_nodes=4) < 3.5                  # + 40 nodes' outputs, stash, Grams: ~1.4


def test_treewy_fused_step_is_commit_then_verify():
    """The engine's step in one kernel (commit the last draft into the state, verify the next from it)
    over six steps whose draft shape changes, against the torch strategy's separate commit + verify."""
    gen = torch.Generator().manual_seed(8)
    trees = [DraftTree.chain(3, root=True), DraftTree.from_widths((2, 2), root=True), DraftTree.chain(1, root=True),
             DraftTree.chain(7, root=True), DraftTree((-1, 0, 1, 0)), DraftTree.chain(3, root=True)]
    kern, ref = kernels.get("treewy", block_v=16), strategies.get("treewy")
    B = 4
    state = step(trees[0], B=B)[0]
    h = state.clone()
    vk = kern.verify(h, *step(trees[0], B=B, seed=50)[1:], trees[0])
    hr, vr = state.clone(), ref.verify(state, *step(trees[0], B=B, seed=50)[1:], trees[0])
    for i, tree in enumerate(trees[1:], 1):
        prev_n = trees[i - 1].num_nodes
        accepted = torch.randint(-1, prev_n, (B,), generator=gen).to(DEV)
        ins = step(tree, B=B, seed=50 + i)[1:]
        vk = kern.step(h, vk, accepted, *ins, tree)
        hr = ref.commit(hr, vr, accepted)
        vr = ref.verify(hr, *ins, tree)
        assert rel_err(h, hr) <= FP32_TOL and rel_err(vk.o, vr.o) <= FP32_TOL, f"step {i}"
    with pytest.raises(ValueError, match="a verify of 4 requests"):
        kern.step(h[:2].contiguous(), vk, accepted[:2], *[x[:2] for x in ins], tree)


def test_treewy_commit_in_place_writes_the_given_state():
    tree = DraftTree.from_widths((2, 2), root=True)
    state, q, k, v, g, beta = step(tree, B=3, seed=2)
    accepted = torch.tensor([-1, 2, 6], device=DEV)
    outside = kernels.get("treewy", block_v=16)
    ver = outside.verify(state, q, k, v, g, beta, tree)
    expected = outside.commit(state, ver, accepted)
    h = state.clone()
    out = kernels.get("treewy", block_v=16, inplace=True).commit(h, ver, accepted)
    assert out.data_ptr() == h.data_ptr()
    assert rel_err(h, expected) <= FP32_TOL and torch.equal(h[0], state[0])


def test_solve_off_is_the_unsolved_system():
    """solve=False (the benchmark's way to time the solve) returns Ṽ = R: wrong unless A = 0."""
    tree = DraftTree.chain(3, root=True)
    state, q, k, v, g, beta = step(tree, B=2, seed=4)
    o_ref, _ = tree_recurrence(state, q, k, v, g, beta, tree)
    unsolved = kernels.get("treewy", block_v=16, solve=False).verify(state, q, k, v, g, beta, tree)
    assert rel_err(unsolved.o, o_ref) > 1e-3
    zero_beta = kernels.get("treewy", block_v=16, solve=False).verify(state, q, k, v, g, beta * 0, tree)
    o0, _ = tree_recurrence(state, q, k, v, g, beta * 0, tree)
    assert rel_err(zero_beta.o, o0) <= FP32_TOL


def test_clear_errors():
    tree = DraftTree.chain(3, root=True)
    state, q, k, v, g, beta = step(tree, B=2, dtype=torch.float64)
    with pytest.raises(ValueError, match="float64"):
        kernels.get("treewy").verify(state, q, k, v, g, beta, tree)
    with pytest.raises(ValueError, match="treewy_deferred and store_delta run on the torch reference"):
        kernels.get("treewy_deferred")
    with pytest.raises(ValueError, match="block_v=48"):
        kernels.get("store_all", block_v=48)
    with pytest.raises(ValueError, match="solve='lu'"):
        kernels.get("treewy", solve="lu")
    with pytest.raises(ValueError, match="fork='level'.*node.*depth"):
        kernels.get("store_all", fork="level")
    branching = DraftTree.from_widths((2, 2), root=True)
    s = step(branching, B=2)
    with pytest.raises(ValueError, match="needs a chain"):
        kernels.get("replay").verify(kernels.get("replay").start(s[0]), *s[1:], branching)


def test_bench_kernels_smoke_and_report(tmp_path):
    """The benchmark's code path end to end (tiny shapes; in the interpreter on CPU), and its report."""
    import json
    import subprocess
    import sys

    out = tmp_path / "k" / "smoke.json"
    run = subprocess.run([sys.executable, "-m", "harness", "bench", "kernels", "smoke=true", f"out={out}"],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["copy_bandwidth"] > 0 and res["solve"] and "engine" in res
    got = {(r["strategy"], r["draft"], r["batch"]) for r in res["rows"]}
    assert ("replay", "2,2+root", 1) not in got and ("treewy", "2,2+root", 1) in got  # replay: chains only
    for r in res["rows"]:
        assert r["verify_s"] > 0 and r["verify_bytes"] > 0 and r["step_s"] >= r["verify_s"]
    sa = {r["draft"]: r for r in res["rows"] if r["strategy"] == "store_all" and r["batch"] == 2}
    tw = {r["draft"]: r for r in res["rows"] if r["strategy"] == "treewy" and r["batch"] == 2}
    # The byte model: store_all's verify writes a state per node, treewy's commit moves about two.
    S = 2 * 16 * 32 * 4 * 2                          # HV*K*V*fp32, two requests
    assert sa["2,2+root"]["verify_bytes"] > 7 * S > tw["2,2+root"]["verify_bytes"]
    assert 2 * S <= tw["chain:3+root"]["commit_bytes"] < 3 * S
    fused = {r["draft"]: r for r in res["rows"] if r["strategy"] == "treewy_fused" and r["batch"] == 2}
    moved = [d["chain:3+root"]["states_moved"] for d in (fused, tw, sa)]
    assert moved == sorted(moved)
    # store_all's fork orders on the smoke tree, each against the measured 35B step nearest in batch
    forks = {r["fork"]: r for r in res["forks"]["rows"]}
    assert set(forks) == {"node", "depth"} and all(r["draft"] == "2,2+root" for r in forks.values())
    assert all(r["snapshot_bytes"] == 2 * 7 * 2 * 16 * 32 * 4 and r["fork_per_node_us"] >= 0
               and r["step_point"] is None and r["fork_fraction_of_step"] is None    # no measured step at batch 2
               for r in forks.values())
    # store_selective's kernels beside store_all's, confidences and accepted nodes from the measured profile
    sel = {r["draft"]: r for r in res["selective"]["rows"]}
    assert set(sel) == {"chain:3+root", "2,2+root"}
    assert all(0 < r["kept_fraction"] <= 1 and r["store_selective_commit_s"] > 0 for r in sel.values())
    # Each strategy's layer row names the code that ran (here the plugin's torch path: CPU pages, no Triton op).
    ops = [r for r in res["layer"]["rows"] if r["strategy"] != "vllm_store_all"]
    assert ops and all(r["code"] == "torch reference (strategies/paged)" for r in ops), {r.get("code") for r in ops}
    # A run cut short resumes: keep half the rows, drop the solve points, mark it unfinished.
    cut = dict(res, complete=False, rows=res["rows"][: len(res["rows"]) // 2], solve=[])
    out.write_text(json.dumps(cut))
    again = subprocess.run([sys.executable, "-m", "harness", "bench", "kernels", "smoke=true", f"out={out}"],
                           capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and "resuming" in again.stdout, again.stdout[-2000:] + again.stderr[-2000:]
    res2 = json.loads(out.read_text())
    assert res2["complete"] and len(res2["rows"]) == len(res["rows"]) and len(res2["solve"]) == len(res["solve"])
    assert res2["rows"][: len(cut["rows"])] == cut["rows"]
    (out.with_suffix(".html")).unlink()
    rep = subprocess.run([sys.executable, "-m", "harness", "report", str(out.parent)], capture_output=True,
                         text=True, timeout=300)
    assert rep.returncode == 0, rep.stderr[-2000:]
    assert "engine: triton-interpreter" in out.with_suffix(".html").read_text()
    if not GPU:
        real = subprocess.run([sys.executable, "-m", "harness", "bench", "kernels"], capture_output=True, text=True,
                              timeout=300)
        assert real.returncode == 2 and "no" in real.stderr and "smoke=true" in real.stderr
    # an unknown section is refused before anything is timed, with the choices
    bad = subprocess.run([sys.executable, "-m", "harness", "bench", "kernels", "smoke=true", "sections=[layer,nope]"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "unknown ['nope']" in bad.stderr and "copy bandwidth" not in bad.stdout


def test_the_forks_reference_step_is_the_campaigns_measured_store_all_step(tmp_path):
    """The 35B step a fork is compared with: TPOT x acceptance length of the committed vLLM sweep's store_all
    points (c16: 12.4 ms x 3.24 = 40 ms); a folder without such points is refused by name."""
    from pathlib import Path

    from harness.bench.kernels import campaign_steps

    steps = campaign_steps(Path(__file__).resolve().parents[1] / "results" / "h200-vllm-sweep")
    c16 = next(s for s in steps if "-c16-" in s["point"])
    assert len(steps) == 4 and 0.039 < c16["step_s"] < 0.041 and 10 < c16["mean_running"] <= 16
    # a fork row is set against the step at its own batch (within 1.5x), never one at another batch
    from harness.bench.kernels import attach_step

    at16 = attach_step({"batch": 16, "nodes": 15, "fork_step_s": 0.004}, steps)
    assert at16["step_point"] == c16["point"] and at16["fork_fraction_of_step"] == pytest.approx(0.004 / c16["step_s"])
    assert at16["fork_per_node_us"] == pytest.approx(1e6 * 0.004 / (16 * 15))
    at128 = attach_step({"batch": 128, "nodes": 15, "fork_step_s": 0.004}, steps)
    assert at128["step_point"] is None and at128["fork_fraction_of_step"] is None
    # ... and only against a step measured on the row's own GPU
    assert c16["device"] == "NVIDIA H200"
    assert attach_step({"batch": 16, "nodes": 15, "fork_step_s": 0.004}, steps,
                       device="NVIDIA H200")["step_point"] == c16["point"]
    assert attach_step({"batch": 16, "nodes": 15, "fork_step_s": 0.004}, steps,
                       device="NVIDIA H100 80GB HBM3")["step_point"] is None
    with pytest.raises(ValueError, match="forks.step_reference=.*no store_all point"):
        campaign_steps(tmp_path)


@pytest.mark.skipif(not GPU, reason="needs ~10 GB of GPU memory: 256 requests x 18 snapshots at the real heads")
def test_store_all_snapshot_offsets_past_2_31_elements():
    """256 requests x (17 + 1) slots x 32 x 128 x 128 fp32 states: offsets beyond int32 (the benchmark's size)."""
    tree = DraftTree.chain(16, root=True)
    state, q, k, v, g, beta = step(tree, B=256, seed=1)
    strat = kernels.get("store_all")
    ver = strat.verify(strat.start(state), q, k, v, g, beta, tree)
    assert ver.stash["states"].numel() > 2 ** 31
    last = torch.full((256,), tree.num_nodes - 1, device=DEV)
    got = strat.materialize(strat.commit(strat.start(state), ver, last))
    ref = kernels.get("treewy").commit(state, kernels.get("treewy").verify(state, q, k, v, g, beta, tree), last)
    assert rel_err(got[-8:], ref[-8:]) <= FP32_TOL


def test_layer_rows_ring_includes_vllms_own_kernel():
    """The layer section's job list starts with vLLM's own kernel (``vllm_store_all``), which is no strategy
    of the registry: asking whether its row runs must not end the benchmark (it did on the H200 after the
    registry change, before any row was timed), and a deferred strategy's ring is its configured buffer."""
    from harness.bench.kernels import _ring, _runs
    from harness.config import compose

    cfg = compose("bench_kernels")
    assert all(_runs(cfg, "vllm_store_all", DraftTree.chain(k, root=True)) for k in (1, 3, 7, 63))
    assert _ring(cfg, "treewy") == float("inf")
    assert _ring(cfg, "replay") == float(cfg.strategies.replay.buffer_len)


def test_the_kernel_rows_skip_what_a_strategy_cannot_verify():
    """Replay's kernel takes chains only, and only those whose step fits its ring; treewy, store_all and the fused
    variant take every shape."""
    from harness.bench.kernels import _runs
    from harness.config import compose

    cfg = compose("bench_kernels")
    ring = int(cfg.strategies.replay.buffer_len)
    tree, fits, too_long = DraftTree.from_widths([2, 2], root=True), DraftTree.chain(ring - 1, root=True), \
        DraftTree.chain(ring, root=True)
    assert not _runs(cfg, "replay", tree) and _runs(cfg, "replay", fits) and not _runs(cfg, "replay", too_long)
    assert all(_runs(cfg, n, t) for n in ("treewy", "store_all", "treewy_fused") for t in (tree, too_long))
