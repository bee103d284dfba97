"""The paged adapter against the literal recurrence, step after step, as vLLM would drive it."""

from __future__ import annotations

import pytest
import torch

from harness.engines.vllm.paged import PagedCommit, StashLayout, gates, l2norm
from strategies import DraftTree, tree_recurrence

from conftest import rel_err

H, HV, K, V = 2, 4, 16, 8


def run_steps(strategy: str, num_spec: int, steps: int, buffer_len: int = 16, seed: int = 0, backend="auto"):
    """P pages, R requests on pages 3, 5, 1, ...; each step every request verifies 1 + d tokens
    (d <= num_spec drafts, varying) with random acceptance. Returns worst output / state errors."""
    gen = torch.Generator().manual_seed(seed)
    lay = StashLayout(strategy, H, HV, K, V, num_spec, buffer_len)
    P, pages = 8, torch.tensor([3, 5, 1])
    R = len(pages)
    # vLLM's pages are V-major [P, HV, V, K]; the adapter sees them as [P, HV, K, V] (a strided view).
    ssm = torch.zeros(P, HV, V, K, dtype=torch.float32).transpose(-1, -2)
    stash = torch.full((P, *lay.shapes()[0]), float("nan"))  # garbage a previous occupant left
    header = torch.randint(0, 9, (P, 4), dtype=torch.int32)
    truth = torch.randn(R, HV, K, V, generator=gen, dtype=torch.float64) * 0.3
    ssm[pages] = truth.float()                       # what prefill wrote
    paged = PagedCommit(lay, backend=backend)
    paged.reset(header, pages)
    n_acc = torch.ones(R, dtype=torch.long)           # vLLM's value after prefill
    worst_o = worst_h = 0.0
    for step in range(steps):
        drafts = torch.randint(0 if step % 3 else num_spec, num_spec + 1, (R,), generator=gen)
        lens = (drafts + 1).tolist()
        cu = [0]
        for n in lens:
            cu.append(cu[-1] + n)
        T = cu[-1]
        q = l2norm(torch.randn(T, H, K, generator=gen))
        k = l2norm(torch.randn(T, H, K, generator=gen))
        v = torch.randn(T, HV, V, generator=gen)
        g, beta = gates(torch.randn(HV, generator=gen), torch.randn(T, HV, generator=gen),
                        torch.randn(T, HV, generator=gen), torch.randn(HV, generator=gen))
        o, committed = paged.step(ssm, stash, header, pages, n_acc, q, k, v, g, beta, cu, probe=True)
        for r in range(R):
            sl = slice(cu[r], cu[r + 1])
            tree = DraftTree.chain(lens[r] - 1, root=True)
            args = [x[sl][None].double() for x in (q, k, v, g, beta)]
            o_ref, states = tree_recurrence(truth[r:r + 1], *args, tree)
            worst_o = max(worst_o, rel_err(o[sl], o_ref[0]))
            worst_h = max(worst_h, rel_err(committed[r], truth[r]))
            a = int(torch.randint(0, lens[r], (), generator=gen))  # root always accepted
            truth[r] = states[0, a]
            n_acc[r] = a + 1
    return worst_o, worst_h, header


@pytest.mark.parametrize("strategy", ["treewy", "replay", "treewy_deferred"])
@pytest.mark.parametrize("num_spec", [1, 3])
def test_paged_steps_follow_the_literal_recurrence(strategy, num_spec):
    worst_o, worst_h, header = run_steps(strategy, num_spec, steps=40)
    assert worst_o < 1e-4 and worst_h < 1e-4
    if strategy != "treewy":
        assert int(header[[3, 5, 1], 2].sum()) > 0  # the checkpoint was rewritten on the way


@pytest.mark.parametrize("num_spec", [1, 3])
def test_paged_treewy_on_the_triton_kernels(num_spec):
    """The backend the plugin picks on a GPU (here in Triton's interpreter): same pages, same stash."""
    from strategies import kernels

    if not kernels.available():
        pytest.skip("Triton not installed")
    worst_o, worst_h, _ = run_steps("treewy", num_spec, steps=12, backend="triton")
    assert worst_o < 1e-4 and worst_h < 1e-4


def test_backend_choice():
    lay = StashLayout("treewy", H, HV, K, V, num_spec=3)
    auto = PagedCommit(lay)
    auto._use(torch.device("cpu"))
    assert type(auto.strategy).__name__ == "TreeWY"                   # CPU pages: auto keeps torch
    with pytest.raises(ValueError, match="backend='cuda'"):
        PagedCommit(lay, backend="cuda")
    with pytest.raises(ValueError, match="not replay"):
        PagedCommit(StashLayout("replay", H, HV, K, V, num_spec=3), backend="triton")


def test_layout_matches_the_memory_accounting():
    from strategies import GDNShape

    shape = GDNShape(1, H, HV, K, V)
    chain = DraftTree.chain(3, root=True)
    for name, slots in (("treewy", 4), ("replay", 16), ("treewy_deferred", 20)):
        lay = StashLayout(name, H, HV, K, V, num_spec=3)
        assert lay.slots == slots
        mem = lay.strategy_obj.memory(shape, chain, state_dtype="float32")
        assert lay.bytes == mem.stash_bytes + 16  # + the 16-byte header


def test_layout_refuses_store_all_and_no_speculation():
    with pytest.raises(ValueError, match="strategy='store_all'"):
        StashLayout("store_all", H, HV, K, V, 3)
    with pytest.raises(ValueError, match="num_speculative_tokens=0"):
        StashLayout("treewy", H, HV, K, V, 0)
