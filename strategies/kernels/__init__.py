"""Triton kernels for the strategies' verify and commit, batched over requests and value heads.

Same contract as the torch strategies (``strategies.get``), which are their reference in the tests::

    from strategies import kernels
    strat = kernels.get("treewy")          # store_all, replay, treewy
    ver = strat.verify(strat.start(state), q, k, v, g, beta, tree)
    carry = strat.commit(strat.start(state), ver, accepted)

Triton is optional: importing :mod:`strategies` never needs it, and ``kernels.get`` raises a clear
error where it is missing. Without a CUDA GPU the kernels run in Triton's interpreter on CPU
tensors: slow, exact, what the CPU tests use. Triton fixes that mode when it is imported, so
loading the kernels there sets ``TRITON_INTERPRET=1`` first (and says so if something imported
Triton before).

Every kernel runs one program per (request, value head, tile of ``BV`` value columns): a value
column's pseudo-values, outputs and state depend on the other columns only through the keys,
so tiling V splits the work without communication. The state tile ``[K, BV]`` lives in registers.
Arithmetic is float32 on CUDA cores, per node or per token (reductions and rank-1 updates, no
``tl.dot``: TF32 would miss the 1e-5 bound, and Triton's fp32 "ieee" dots of these shapes spill — see
results/kernels/README.md); TreeWY's Gram rows come from fp32 batched matmuls. The state keeps its
dtype in memory (fp32 as vLLM holds it for Qwen3.5, or bf16).
"""

from __future__ import annotations

import importlib.util
import os

NAMES = ("store_all", "replay", "treewy", "store_selective")


def available() -> bool:
    """True where Triton is importable (a GPU build, or the interpreter on CPU)."""
    return importlib.util.find_spec("triton") is not None


def get(name: str, **options):
    """The Triton implementation of strategy ``name`` (``store_all``, ``replay``, ``treewy`` or
    ``store_selective``)."""
    if name not in NAMES:
        raise ValueError(f"strategy={name!r}: no Triton kernels; choose one of {', '.join(NAMES)} "
                         "(treewy_deferred and store_delta run on the torch reference only)")
    if not available():
        raise ImportError("the strategies' GPU kernels need Triton: pip install 'commitbench[gpu]' on a CUDA "
                          "machine (CUDA builds of torch ship it), or pip install triton and set "
                          "TRITON_INTERPRET=1 to run them on the CPU")
    return _ops().STRATEGIES[name](**options)


def paged_ops():
    """:mod:`.paged`: the engine's paged step (commit + verify on vLLM-style pages) on Triton."""
    _ops()
    from . import paged

    return paged


def _ops():
    import sys

    if __name__ + ".ops" not in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        import torch

        if not torch.cuda.is_available():
            # Triton decides interpreter or compiler for every jit function (its own tl.sum included)
            # when it is imported, so the switch must be on before that.
            if "triton" in sys.modules:
                raise ImportError("the kernels run in Triton's interpreter on a machine without a CUDA GPU, but "
                                  "Triton was already imported in compiler mode (vLLM imports it); set "
                                  "TRITON_INTERPRET=1 in the environment before starting Python")
            os.environ["TRITON_INTERPRET"] = "1"
    from . import ops

    return ops
