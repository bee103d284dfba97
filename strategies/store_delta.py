"""``store_delta``: store_all whose checkpoints are differences from the parent's, compressed.

The fork/checkpoint write-up's delta checkpoints: node t's checkpoint is stored as ``Δ_t = S_t - Ŝ_parent``
(``Ŝ``: the state as restored from the checkpoints, ``Ŝ`` of a depth-0 node's parent the committed state), in
one of four codecs (``codec``):

- ``exact``: Δ in the arithmetic's precision (float32 for bf16/fp32 states, float64 for fp64): lossless, and
  no smaller than a checkpoint (the write-up's "one addition on restore" is all it changes);
- ``sparse``: the entries of Δ above ``threshold`` x max|S_t| (1e-3 by default; 0 keeps every nonzero entry,
  lossless on a float32/float64 state), values in the state's dtype (so a bf16 state's deltas round), counted as the smaller of a coordinate list (value + int32 index per
  entry) and a bitmap (one bit per entry) plus the values;
- ``bf16`` and ``fp8_e4m3``: Δ rounded to bfloat16, or to float8 e4m3 with a float32 scale per value head
  (max|Δ| / 448) — lossy.

Restoring node a sums the path's decoded deltas onto the committed state. Verify encodes each Δ against the
*restored* parent (closed loop), so a lossy codec's error is one rounding per restored state, not one per
depth; commit redoes the same sums, so the restored state is the verify's own.

What the algebra says (ARCHITECTURE.md): for the gated delta rule ``S_t = a_t S_p + k_t ⊗ ṽ_t`` with
``a_t = e^{g_t}``, so the exact delta is ``(a_t - 1) S_p + k_t ⊗ ṽ_t``: dense wherever S_p is, unless the decay
a_t is 1 to within the threshold. Its exact low-rank form — a scale per head and a rank-1 term, HV·(1 + K + V)
numbers — is TreeWY's stash of (ṽ, k, g) per node: the compression the write-up hopes for exists, as TreeWY.

Memory: vLLM's planner fixes a request's pages at ``1 + k`` whole states, so a compressed checkpoint saves
nothing there (the plugin refuses the strategy); ``footprint`` and ``memory`` are store_all's reservation. What
the codec holds is :meth:`StoreDelta.held_memory` (``harness memory`` shows both).
"""

from __future__ import annotations

import torch

from .base import CommittedState, StateMemory, Verified, register
from .inputs import StepShape, compute_dtype, expand_heads
from .memory import GDNShape, account, as_dtype, dtype_bytes
from .store_all import check_fork, fork_states
from .tree import DraftTree

CODECS = ("exact", "sparse", "bf16", "fp8_e4m3")
LOSSLESS = ("exact",)          # and sparse with threshold 0
FP8_MAX = 448.0                # float8 e4m3's largest finite value


def encode_decode(delta: torch.Tensor, child: torch.Tensor, codec: str, threshold: float,
                  state_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The decoded delta and the bytes its encoding takes, per leading index.

    delta, child ``[..., HV, K, V]`` (in the arithmetic's precision; child: the state the delta leads to, whose
    max sets the sparse threshold). Returns ``(decoded [..., HV, K, V], bytes [...])``."""
    lead, (HV, K, V) = delta.shape[:-3], delta.shape[-3:]
    E = HV * K * V
    elems = torch.full(lead, E, dtype=torch.float64, device=delta.device)
    if codec == "exact":
        return delta, elems * delta.element_size()
    if codec == "sparse":
        scale = child.abs().amax(dim=(-3, -2, -1), keepdim=True)
        keep = delta.abs() > threshold * scale
        decoded = torch.where(keep, delta.to(state_dtype).to(delta.dtype), 0)
        nnz = keep.flatten(-3).sum(-1).double()
        vb = dtype_bytes(state_dtype)
        return decoded, torch.minimum(nnz * (vb + 4), elems / 8 + nnz * vb)
    if codec == "bf16":
        return delta.to(torch.bfloat16).to(delta.dtype), elems * 2
    if codec == "fp8_e4m3":
        amax = delta.abs().amax(dim=(-2, -1), keepdim=True)                  # per value head
        scale = torch.where(amax > 0, amax / FP8_MAX, 1.0)
        q = (delta / scale).to(torch.float8_e4m3fn)
        return q.to(delta.dtype) * scale, elems * 1 + HV * 4
    raise ValueError(f"strategies.store_delta.codec={codec!r}: choose one of {', '.join(CODECS)}")


@register("store_delta")
class StoreDelta(CommittedState):
    """Carry: the committed state ``[B, HV, K, V]``. Stash: ``delta [B, N, HV, K, V]`` (each node's decoded delta;
    the torch reference keeps a sparse delta dense, its dropped entries zero), ``bytes [B, N]`` (its encoding's
    size), ``restored [B, N, HV, K, V]`` is not kept: commit rebuilds the accepted state from the deltas."""

    options = ("codec", "threshold", "fork")

    def __init__(self, codec: str = "exact", threshold: float = 1e-3, fork: str = "node"):
        if codec not in CODECS:
            raise ValueError(f"strategies.store_delta.codec={codec!r}: choose one of {', '.join(CODECS)} (exact and "
                             "sparse with threshold 0 are lossless; bf16 and fp8_e4m3 round)")
        threshold = float(threshold)
        if not 0.0 <= threshold < 1.0:
            raise ValueError(f"strategies.store_delta.threshold={threshold}: a fraction of the state's max in "
                             "[0, 1) (sparse keeps the delta's entries above it; 0 keeps every nonzero one)")
        self.codec, self.threshold = codec, threshold
        self.fork = check_fork(fork, self.name)

    def lossless(self, state_dtype=torch.float32) -> bool:
        """Whether a restored state is the verify's own, to rounding, on states of ``state_dtype``: the exact codec
        always; sparse at threshold 0 where its values (in the state's dtype) hold the deltas exactly, fp32/fp64."""
        wide = as_dtype(state_dtype) in (torch.float32, torch.float64)
        return self.codec in LOSSLESS or (self.codec == "sparse" and self.threshold == 0.0 and wide)

    def _verify(self, carry, q, k, v, g, beta, tree: DraftTree, s: StepShape, scale: float) -> Verified:
        dt = compute_dtype(carry.dtype)
        h0 = carry.to(dt)
        states, o, _ = fork_states(h0, expand_heads(q, s.HV).to(dt), expand_heads(k, s.HV).to(dt), v.to(dt),
                                   g.to(dt), beta.to(dt), tree, scale, self.fork)
        delta = torch.empty_like(states)
        nbytes = torch.empty(s.B, s.N, dtype=torch.float64, device=carry.device)
        restored = torch.empty_like(states)
        for level in tree.levels:           # parents first: each delta against the parent as it will be restored
            idx = torch.tensor(level, device=carry.device)
            par = [tree.parents[t] for t in level]
            base = h0[:, None].expand(-1, len(level), -1, -1, -1) if par[0] < 0 else restored[:, par]
            d, nb = encode_decode(states[:, idx] - base, states[:, idx], self.codec, self.threshold, carry.dtype)
            delta[:, idx], nbytes[:, idx] = d, nb
            restored[:, idx] = base + d
        return Verified(o.to(carry.dtype), tree, s, {"delta": delta, "bytes": nbytes})

    def _commit(self, carry, verified: Verified, accepted: torch.Tensor) -> torch.Tensor:
        delta, tree = verified.stash["delta"], verified.tree
        out = carry.clone()
        for b, a in enumerate(accepted.tolist()):
            if a < 0:
                continue
            h = carry[b].to(delta.dtype)
            for n in tree.path_to(a):                 # one addition per depth, parents first, as verify restored
                h = h + delta[b, n]
            out[b] = h.to(carry.dtype)
        return out

    def compression(self, verified: Verified, state_dtype=None) -> torch.Tensor:
        """Per request and node ``[B, N]``: one checkpoint's bytes in ``state_dtype`` (default the state's) over
        its delta's encoding: the compression ratio."""
        sd = as_dtype(state_dtype) if state_dtype is not None else None
        s = verified.shape
        one = s.HV * s.K * s.V * (dtype_bytes(sd) if sd is not None else verified.o.element_size())
        return one / verified.stash["bytes"]

    # -- memory --------------------------------------------------------------------------------------
    def footprint(self, tree: DraftTree) -> tuple[int, int]:
        # vLLM's planner: whole pages, 1 + k per request, whatever the checkpoints compress to
        return tree.num_drafts + 1, 0

    def checkpoint_bytes(self, shape: GDNShape, state_dtype, density: float | None = None) -> float:
        """One node's delta in this codec, one layer: the dense codecs' fixed size; sparse's at ``density`` (the
        fraction of entries it keeps; None: the worst case, every entry, as a bitmap and the values)."""
        E, sd = shape.state_elems, as_dtype(state_dtype)
        if self.codec == "exact":
            return E * dtype_bytes(compute_dtype(sd))
        if self.codec == "bf16":
            return E * 2
        if self.codec == "fp8_e4m3":
            return E + shape.num_value_heads * 4
        d = 1.0 if density is None else float(density)
        return min(d * E * (dtype_bytes(sd) + 4), E / 8 + d * E * dtype_bytes(sd))

    def held_memory(self, shape: GDNShape, tree: DraftTree, state_dtype="bfloat16", stash_dtype=None,
                    conv_dtype="bfloat16", density: float | None = None) -> StateMemory:
        """What the checkpoints hold as encoded (sparse: at ``density``, None: its worst case, every entry): the
        committed state and one delta per node (``state_pages`` counts them as checkpoints, whatever their size)."""
        pages, _ = self.footprint(tree)
        mem = account(self.name, shape, tree, state_pages=1, stash_tokens=0, state_dtype=state_dtype,
                      conv_dtype=conv_dtype)
        held = mem.one_state_bytes + (pages - 1) * self.checkpoint_bytes(shape, state_dtype, density)
        return StateMemory(strategy=self.name, tree=tree, num_layers=mem.num_layers, state_pages=pages,
                           state_bytes=int(round(held)), stash_bytes=0, conv_bytes=mem.conv_bytes,
                           one_state_bytes=mem.one_state_bytes)

    def step_traffic(self, tree, state_bytes, token_stash_bytes, mean_tokens) -> float:
        # the committed state read, a delta written per node (the parent's restored state stays on chip as the
        # verify walks down), commit reads the state and the accepted path's deltas and writes the state. Deltas
        # against the fp32 state vLLM keeps Qwen3.5's in; sparse at its worst case (every entry)
        ratio = {"exact": 1.0, "bf16": 0.5, "fp8_e4m3": 0.25, "sparse": 1.0}[self.codec]
        path = min(mean_tokens, tree.path_length)
        return state_bytes * (1 + ratio * tree.num_nodes + 2 + ratio * path)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(codec={self.codec!r}, threshold={self.threshold}, fork={self.fork!r})"
