"""Shape and dtype checks for one verify step, shared by every strategy.

Layout (flash-linear-attention's, state ``[B, HV, K, V]``):
``q, k [B, N, H, K]``, ``v [B, N, HV, V]``, ``g, beta [B, N, HV]``; ``HV % H == 0``
and value head ``hv`` reads key/query head ``hv // (HV // H)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .tree import DraftTree


@dataclass(frozen=True)
class StepShape:
    B: int
    N: int
    H: int
    HV: int
    K: int
    V: int

    @property
    def group(self) -> int:
        """Value heads per key head."""
        return self.HV // self.H


def check_step(state: torch.Tensor, q, k, v, g, beta, tree: DraftTree, same_dtype: bool = True) -> StepShape:
    """Validate one step's tensors against each other and the tree; return the sizes.
    ``same_dtype=False`` lets the inputs differ from the state's dtype (the kernels: fp32 state, bf16 inputs)."""
    if state.dim() != 4:
        raise ValueError(f"state: shape {tuple(state.shape)}; expected [B, HV, K, V] (4 dims)")
    B, HV, K, V = state.shape
    if q.dim() != 4:
        raise ValueError(f"q: shape {tuple(q.shape)}; expected [B, N, H, K] (4 dims)")
    N, H = q.shape[1], q.shape[2]
    expected = {
        "q": (B, N, H, K),
        "k": (B, N, H, K),
        "v": (B, N, HV, V),
        "g": (B, N, HV),
        "beta": (B, N, HV),
    }
    for name, t in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
        if tuple(t.shape) != expected[name]:
            raise ValueError(f"{name}: shape {tuple(t.shape)}; expected {expected[name]} "
                             f"from state {tuple(state.shape)} and q {tuple(q.shape)}")
        if same_dtype and t.dtype != state.dtype:
            raise ValueError(f"{name}: dtype {t.dtype} differs from state's {state.dtype}; "
                             "pass every tensor in one dtype")
    if HV % H:
        raise ValueError(f"HV={HV} value heads is not a multiple of H={H} key heads; "
                         "grouped value heads need HV % H == 0")
    if N != tree.num_nodes:
        raise ValueError(f"q: {N} tokens but the tree has {tree.num_nodes} nodes; pass one token per node")
    return StepShape(B, N, H, HV, K, V)


def expand_heads(x: torch.Tensor, HV: int) -> torch.Tensor:
    """``[B, N, H, K] -> [B, N, HV, K]``: value head hv reads head hv // (HV // H)."""
    H = x.shape[2]
    return x if H == HV else x.repeat_interleave(HV // H, dim=2)


def check_accepted(accepted, B: int, N: int) -> torch.Tensor:
    """``accepted[b]`` in [-1, N-1] (-1: nothing accepted); returns a long tensor [B]."""
    acc = torch.as_tensor(accepted)
    if acc.dtype.is_floating_point or acc.dtype == torch.bool:
        raise ValueError(f"accepted: dtype {acc.dtype}; pass integer node indices")
    acc = acc.long().reshape(1) if acc.dim() == 0 else acc.long()
    if tuple(acc.shape) != (B,):
        raise ValueError(f"accepted: shape {tuple(acc.shape)}; expected ({B},), one node index per request")
    bad = (acc < -1) | (acc >= N)
    if bad.any():
        b = int(bad.nonzero()[0, 0])
        raise ValueError(f"accepted[{b}]={int(acc[b])}: must be in [-1, {N - 1}] "
                         f"(-1 = none accepted) for a {N}-node tree")
    return acc


def check_confidence(confidence, B: int, N: int) -> torch.Tensor:
    """Each node's draft confidence, ``[B, N]`` in [0, 1] (a probability); returns it as float64."""
    c = torch.as_tensor(confidence)
    if not c.dtype.is_floating_point:
        raise ValueError(f"confidence: dtype {c.dtype}; pass each node's draft probability as floats in [0, 1]")
    if tuple(c.shape) != (B, N):
        raise ValueError(f"confidence: shape {tuple(c.shape)}; expected ({B}, {N}), one probability per request "
                         "and node")
    bad = ~((c >= 0) & (c <= 1))                    # NaN fails both
    if bad.any():
        b, t = (int(x) for x in bad.nonzero()[0])
        raise ValueError(f"confidence[{b}, {t}]={float(c[b, t])}: a draft probability must be in [0, 1]")
    return c.double()


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Arithmetic stays in the input dtype; half types go through float32 because
    CPU linear algebra (triangular solve) has no bf16/fp16 kernels."""
    return torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype
