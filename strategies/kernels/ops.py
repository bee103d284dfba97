"""The strategies on Triton kernels: the torch classes' contract, memory accounting and checks,
with verify and commit launched as the kernels in :mod:`.triton_kernels`.

``block_v`` is the value-column tile (16/32/64/128; 64, the fastest for every strategy on the H200 at
batch 256, is the default); ``inplace`` lets commit overwrite the state it is given, as an engine does
(off by default: the contract's callers may still hold that tensor).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch
import triton

from .. import replay as replay_mod
from .. import store_all as store_all_mod
from .. import store_selective as store_selective_mod
from .. import treewy as treewy_mod
from ..base import Verified
from ..history import DEFAULT_BUFFER_LEN, History
from ..inputs import StepShape
from ..tree import DraftTree
from . import triton_kernels as tk

KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
NO_SKIP = 1 << 30
SOLVES = {"none": 0, "substitution": 1}   # TreeWY's triangular solve, as the kernel's SOLVE


@lru_cache(maxsize=256)
def _tree_meta(tree: DraftTree, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(inclusive ancestor mask ``[N, N]`` int8, parents ``[N]`` int32) on ``device``, made once per tree."""
    anc = tree.ancestor_mask(inclusive=True).to(torch.int8).to(device)
    par = torch.tensor(tree.parents, dtype=torch.int32, device=device)
    return anc, par


@lru_cache(maxsize=256)
def _levels(tree: DraftTree, device: str) -> tuple[torch.Tensor, ...]:
    """The node indices of each depth (``tree.levels``) as int32 tensors on ``device``, made once per tree."""
    return tuple(torch.tensor(level, dtype=torch.int32, device=device) for level in tree.levels)


def _check_dtype(x: torch.Tensor, name: str) -> None:
    if x.dtype not in KERNEL_DTYPES:
        raise ValueError(f"strategy={name} (Triton): dtype {x.dtype}; the kernels compute in float32 from "
                         "float32/bfloat16/float16 inputs. Use strategies.get(...) (torch) for float64")


class Tiling:
    """How a kernel's launch tiles the value dimension: ``block_v`` columns per program, ``num_warps``."""

    mixed_dtypes = True   # an fp32 state with bf16 inputs, as vLLM runs Qwen3.5

    def __init__(self, block_v: int = 64, num_warps: int = 4):
        if block_v not in (16, 32, 64, 128):
            raise ValueError(f"block_v={block_v}: use 16, 32, 64 or 128 value columns per program")
        self.block_v, self.num_warps = int(block_v), int(num_warps)

    def grid(self, s: StepShape) -> tuple[int, int]:
        return s.B * s.HV, triton.cdiv(s.V, self.bv(s))

    def bv(self, s: StepShape) -> int:
        return min(self.block_v, tk.next_pow2(s.V))


def contiguous(*xs: torch.Tensor) -> list[torch.Tensor]:
    return [x.contiguous() for x in xs]


def grams(q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """TreeWY's per-key-head Gram matrices ``k_tᵀk_i`` and ``q_tᵀk_i``, ``[B, H, N, N]`` float32, from
    q, k ``[B, N, H, K]``: two batched matmuls (bf16 products are exact in fp32), so the verify kernel
    spends no registers or reductions on them, and its value tiles do not each recompute them."""
    # An engine may allow TF32 matmuls (10-bit mantissas): then take the products in float64.
    exact = torch.get_float32_matmul_precision() == "highest" and not torch.backends.cuda.matmul.allow_tf32
    dt = torch.float32 if exact else torch.float64
    kf, qf = k.to(dt).transpose(1, 2), q.to(dt).transpose(1, 2)      # [B, H, N, K]
    kT = kf.transpose(-1, -2)
    return (torch.matmul(kf, kT).float().contiguous(), torch.matmul(qf, kT).float().contiguous())


class TreeWYKernel(Tiling, treewy_mod.TreeWY):
    """``treewy`` on Triton. Stash: ``v_tilde [B, N, HV, V]`` and ``G [B, N, HV]`` float32, ``k``."""

    def __init__(self, block_v: int = 64, num_warps: int = 4, inplace: bool = False,
                 solve: str | bool = "substitution"):
        """``solve``: ``substitution`` (node by node, over each node's ancestors), or ``none``/False
        (skip it: wrong results, for timing the solve)."""
        Tiling.__init__(self, block_v, num_warps)
        self.inplace = bool(inplace)
        if isinstance(solve, bool):
            solve = "substitution" if solve else "none"
        if solve not in SOLVES:
            raise ValueError(f"solve={solve!r}: choose one of {', '.join(SOLVES)}")
        self.solve = solve

    def _solve_args(self, N: int) -> dict[str, int]:
        return {"BN": tk.next_pow2(N), "SOLVE": SOLVES[self.solve]}

    @staticmethod
    def _outputs(s: StepShape, k: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """What a verify writes: o and Ṽ ``[B, N, HV, V]``, G ``[B, N, HV]`` (float32), the keys' stash."""
        o = torch.empty(s.B, s.N, s.HV, s.V, dtype=torch.float32, device=k.device)
        G = torch.empty(s.B, s.N, s.HV, dtype=torch.float32, device=k.device)
        return o, torch.empty_like(o), G, torch.empty_like(k)

    def _verify(self, carry, q, k, v, g, beta, tree: DraftTree, s: StepShape, scale: float) -> Verified:
        _check_dtype(carry, self.name)
        anc, _ = _tree_meta(tree, str(carry.device))
        h0, q, k, v, g, beta = contiguous(carry, q, k, v, g, beta)
        o, vt, G, kst = self._outputs(s, k)
        tk.treewy_verify[self.grid(s)](
            h0, q, k, v, g, beta, anc, *grams(q, k), o, vt, G, kst, scale, s.N, H=s.H, HV=s.HV, K=s.K, V=s.V,
            BK=tk.next_pow2(s.K), BV=self.bv(s), num_warps=self.num_warps, **self._solve_args(s.N))
        return Verified(o.to(q.dtype), tree, s, {"v_tilde": vt, "k": kst, "G": G})

    def _commit(self, carry, verified: Verified, accepted: torch.Tensor) -> torch.Tensor:
        s, st = verified.shape, verified.stash
        _, par = _tree_meta(verified.tree, str(carry.device))
        h0 = carry.contiguous()
        out = h0 if self.inplace else torch.empty_like(h0)
        launch_rebuild(h0, out, st["k"], st["v_tilde"], st["G"], par, accepted, s, self, cumsum=False,
                       store_all=not self.inplace)
        return out

    def step(self, state: torch.Tensor, prev: Verified, accepted: torch.Tensor, q, k, v, g, beta,
             tree: DraftTree, scale: float | None = None) -> Verified:
        """What an engine does each step, in one kernel: ``commit(state, prev, accepted)`` written into
        ``state`` (in place, whatever ``inplace`` says; any strides), then ``verify`` of the new draft
        from it. Reads and writes each request's state once. Returns the new draft's Verified."""
        from ..inputs import check_accepted, check_step

        s = check_step(state, q, k, v, g, beta, tree, same_dtype=False)
        _check_dtype(state, self.name)
        if prev.shape.B != s.B:
            raise ValueError(f"prev: a verify of {prev.shape.B} requests, this step has {s.B}")
        acc = check_accepted(accepted, s.B, prev.shape.N).to(state.device)
        return self._step(state, prev, acc, q, k, v, g, beta, tree, s, s.K ** -0.5 if scale is None else scale)

    def _step(self, state, prev: Verified, acc, q, k, v, g, beta, tree, s: StepShape, scale: float,
              pages: torch.Tensor | None = None) -> Verified:
        """``state``: ``[B, HV, K, V]``, or with ``pages [B]`` a pool ``[P, HV, K, V]`` of any strides
        (vLLM's V-major pages viewed as K-major), updated in place at those pages."""
        if pages is None:
            pages = torch.arange(s.B, dtype=torch.int32, device=state.device)
        anc, _ = _tree_meta(tree, str(state.device))
        _, ppar = _tree_meta(prev.tree, str(state.device))
        q, k, v, g, beta = contiguous(q, k, v, g, beta)
        pk, pvt, pG = contiguous(prev.stash["k"], prev.stash["v_tilde"], prev.stash["G"])
        o, vt, G, kst = self._outputs(s, k)
        tk.treewy_step[self.grid(s)](
            state, pages.to(torch.int32), *state.stride(), pk, pvt, pG, ppar, acc.to(torch.int32), prev.shape.N,
            q, k, v, g, beta, anc, *grams(q, k), o, vt, G, kst,
            scale, s.N, H=s.H, HV=s.HV, K=s.K, V=s.V, BK=tk.next_pow2(s.K), BV=self.bv(s),
            num_warps=self.num_warps, **self._solve_args(s.N))
        return Verified(o.to(q.dtype), tree, s, {"v_tilde": vt, "k": kst, "G": G})


def launch_rebuild(h0, out, k, u, G, par, end, s: StepShape, tiles: Tiling, cumsum: bool, store_all: bool) -> None:
    """Launch :func:`.triton_kernels.rebuild` over the ``M = k.shape[1]`` stashed tokens (see there):
    along a tree's parents ``par [M]`` (int32) to ``end [B]``, or with ``cumsum`` the prefix to it."""
    M = k.shape[1]
    k, u, G = contiguous(k, u, G)   # stash views (a paged stash split into Ṽ, k, G) arrive strided
    tk.rebuild[tiles.grid(s)](
        h0, out, k, u, G, par.to(torch.int32).contiguous(), end.to(torch.int32).contiguous(), M,
        H=s.H, HV=s.HV, K=s.K, V=s.V, BK=tk.next_pow2(s.K), BV=tiles.bv(s),
        CUMSUM=cumsum, STORE_ALL=store_all, num_warps=tiles.num_warps)


@dataclass
class Snapshots:
    """store_all's carry: the committed state is ``states[b, slot[b]]``, or ``base[b]`` before the
    first step. Commit only moves ``slot`` (vLLM's commit picks a page by index; nothing is copied)."""

    base: torch.Tensor
    states: torch.Tensor | None = None
    slot: torch.Tensor | None = None


class StoreAllKernel(Tiling, store_all_mod.StoreAll):
    """``store_all`` on Triton: verify writes a snapshot per node into ``N + 1`` slots per request
    (one more than vLLM's ``1 + k`` pages, so a step that accepts nothing keeps its state in place).

    ``fork``: ``node`` (:func:`.triton_kernels.store_all_verify`, one launch, each program walks the nodes in
    preorder) or ``depth`` (:func:`.triton_kernels.store_all_level`, one launch per depth, a program per node
    of it). ``store=False`` writes no snapshot: wrong states, for timing what the forks cost."""

    def __init__(self, block_v: int = 64, num_warps: int = 4, fork: str = "node", store: bool = True):
        Tiling.__init__(self, block_v, num_warps)
        store_all_mod.StoreAll.__init__(self, fork)
        self.store = bool(store)

    def start(self, state: torch.Tensor) -> Snapshots:
        return Snapshots(state)

    def _base(self, carry: Snapshots) -> torch.Tensor:
        return carry.base

    def materialize(self, carry: Snapshots) -> torch.Tensor:
        if carry.states is None:
            return carry.base
        return carry.states[torch.arange(carry.states.shape[0], device=carry.slot.device), carry.slot]

    def _verify(self, carry: Snapshots, q, k, v, g, beta, tree: DraftTree, s: StepShape, scale: float) -> Verified:
        return self._launch(carry, q, k, v, g, beta, tree, s, scale)

    def _launch(self, carry: Snapshots, q, k, v, g, beta, tree: DraftTree, s: StepShape, scale: float,
                select: tuple[torch.Tensor, torch.Tensor] | None = None) -> Verified:
        """The verify's launch; ``select`` (keep ``[B, N]`` int8, u ``[B, N, HV, V]``): store_selective's mask."""
        _check_dtype(carry.base, self.name)
        _, par = _tree_meta(tree, str(carry.base.device))
        base = carry.base.contiguous()
        q, k, v, g, beta = contiguous(q, k, v, g, beta)
        dev = base.device
        in_place = carry.states is not None and carry.states.shape[1] >= s.N + 1
        if carry.states is None:
            src, slot = base, torch.full((s.B,), -1, dtype=torch.int32, device=dev)
        else:
            src, slot = carry.states, carry.slot.to(torch.int32)
        if in_place:
            dst, skip, h0_slot = carry.states, slot, slot
        else:
            dst = torch.empty(s.B, s.N + 1, s.HV, s.K, s.V, dtype=base.dtype, device=dev)
            skip = torch.full((s.B,), NO_SKIP, dtype=torch.int32, device=dev)
            h0_slot = torch.full((s.B,), s.N, dtype=torch.int32, device=dev)
        o = torch.empty(s.B, s.N, s.HV, s.V, dtype=torch.float32, device=dev)
        common = (base, src, slot, src.shape[1] if src.dim() == 5 else 1, dst, skip, dst.shape[1], q, k, v, g, beta,
                  par)
        consts = dict(H=s.H, HV=s.HV, K=s.K, V=s.V, BK=tk.next_pow2(s.K), BV=self.bv(s), STORE=self.store,
                      num_warps=self.num_warps)
        if select is not None:
            tk.store_all_verify[self.grid(s)](*common, o, scale, s.N, IS_CHAIN=tree.is_chain,
                                              WRITE_BASE=not in_place, keep=select[0], ust=select[1], SELECT=True,
                                              **consts)
        elif self.fork == "node" or tree.is_chain:      # a chain's depths are its nodes: one launch walks them
            tk.store_all_verify[self.grid(s)](*common, o, scale, s.N, IS_CHAIN=tree.is_chain,
                                              WRITE_BASE=not in_place, **consts)
        else:
            for d, nodes in enumerate(_levels(tree, str(dev))):
                tk.store_all_level[(*self.grid(s), nodes.numel())](*common, nodes, o, scale, s.N,
                                                                     WRITE_BASE=not in_place and d == 0, **consts)
        return Verified(o.to(q.dtype), tree, s, {"states": dst, "skip": skip, "h0_slot": h0_slot,
                                                 "base": base})

    def _commit(self, carry, verified: Verified, accepted: torch.Tensor) -> Snapshots:
        st = verified.stash
        a = accepted.to(torch.int32)
        slot = torch.where(a >= 0, a + (a >= st["skip"]).to(torch.int32), st["h0_slot"])
        return Snapshots(st["base"], st["states"], slot.long())


class StoreSelectiveKernel(StoreAllKernel):
    """``store_selective`` on Triton: store_all's node-by-node kernel writing a snapshot only for the nodes at or
    under the confidence threshold, the others' pseudo-values u instead; commit moves the slot where the accepted
    node has its snapshot and launches :func:`.triton_kernels.selective_recover` for the rows that need a
    recovery. Which nodes keep their snapshot is the torch strategy's rule (``store_selective.keep_mask``)."""

    uses_confidence = True
    options = ("threshold",)

    def __init__(self, threshold: float = 0.95, block_v: int = 64, num_warps: int = 4):
        StoreAllKernel.__init__(self, block_v, num_warps)
        self.threshold = store_selective_mod.StoreSelective(threshold=threshold).threshold

    def __repr__(self) -> str:
        return f"{type(self).__name__}(threshold={self.threshold})"

    def _verify(self, carry: Snapshots, q, k, v, g, beta, tree: DraftTree, s: StepShape, scale: float,
                confidence: torch.Tensor | None = None) -> Verified:
        keep = store_selective_mod.keep_mask(tree, confidence.to(carry.base.device), self.threshold)
        u = torch.empty(s.B, s.N, s.HV, s.V, dtype=torch.float32, device=carry.base.device)
        ver = self._launch(carry, q, k, v, g, beta, tree, s, scale,
                           select=(keep.to(torch.int8).contiguous(), u))
        ver.stash.update(keep=keep, u=u, k=k.contiguous(), g=g.contiguous(),
                         src=carry.states if carry.states is not None else carry.base,
                         slot=(carry.slot if carry.slot is not None else
                               torch.full((s.B,), -1, device=k.device)).to(torch.int32))
        return ver

    def recovery_args(self, verified: Verified, accepted: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(start [B], redo [B, R], nredo [B]) int32 on the state's device, R = the tree's path length: each row's
        nearest checkpointed node on its accepted node's path (-1: the committed state) and the nodes to redo."""
        keep = verified.stash["keep"].cpu()
        tree = verified.tree
        R = tree.path_length
        start, redo, n = [], [], []
        for b, a in enumerate(accepted.tolist()):
            if a < 0 or bool(keep[b, a]):
                start.append(-1), redo.append([0] * R), n.append(0)
                continue
            slot = [0 if bool(x) else -1 for x in keep[b]]
            base, nodes = store_selective_mod.recovery_plan(slot, tree, a)
            start.append(base), redo.append(nodes + [0] * (R - len(nodes))), n.append(len(nodes))
        dev = accepted.device
        return (torch.tensor(start, dtype=torch.int32, device=dev), torch.tensor(redo, dtype=torch.int32, device=dev),
                torch.tensor(n, dtype=torch.int32, device=dev))

    def _commit(self, carry, verified: Verified, accepted: torch.Tensor) -> Snapshots:
        return self.commit_with(verified, accepted, *self.recovery_args(verified, accepted))

    def commit_with(self, verified: Verified, accepted: torch.Tensor, start, redo, nredo) -> Snapshots:
        """The commit, its recovery plan given (:meth:`recovery_args`): what an engine would launch each step."""
        st, s = verified.stash, verified.shape
        src = st["src"]
        tk.selective_recover[self.grid(s)](
            st["base"], src, st["slot"], src.shape[1] if src.dim() == 5 else 1, st["states"], st["skip"],
            st["states"].shape[1], start, redo, nredo, redo.shape[1], st["k"], st["u"], st["g"], s.N,
            H=s.H, HV=s.HV, K=s.K, V=s.V, BK=tk.next_pow2(s.K), BV=self.bv(s), num_warps=self.num_warps)
        return StoreAllKernel._commit(self, None, verified, accepted)


class KernelHistory(History):
    """The deferred-flush carry with the flush (rebuild the checkpoint from the ring) on Triton."""

    tiles: Tiling = Tiling()

    def _replay(self, h0: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        return self._rebuild_from_ring(h0.contiguous(), torch.empty_like(h0), rows, store_all=True)

    def _flush(self, rows: torch.Tensor) -> None:
        if not bool(rows.any()):
            return
        self.checkpoint = self.checkpoint.contiguous()
        self._rebuild_from_ring(self.checkpoint, self.checkpoint, rows, store_all=False)
        for buf in (self.u, self.k, self.g):
            buf[rows] = 0
        self.length = torch.where(rows, 0, self.length)
        self.flushes = self.flushes + rows.long()

    def _rebuild_from_ring(self, h0, out, rows, store_all: bool) -> torch.Tensor:
        B, HV, K, V = self.checkpoint.shape
        s = StepShape(B, 0, self.k.shape[2], HV, K, V)
        end = torch.where(rows & (self.length > 0), self.length - 1, -1)
        launch_rebuild(h0, out, self.k.contiguous(), self.u.contiguous(), self.g.contiguous(),
                       end, end, s, self.tiles, cumsum=True, store_all=store_all)     # par (= end): unused
        return out


class ReplayKernel(Tiling, replay_mod.Replay):
    """``replay`` on Triton: verify rebuilds the committed state from checkpoint + ring in registers
    and runs the draft chain from it; the flush rewrites the checkpoint with the same rebuild."""

    def __init__(self, buffer_len: int = DEFAULT_BUFFER_LEN, block_v: int = 64, num_warps: int = 4):
        replay_mod.Replay.__init__(self, buffer_len)
        Tiling.__init__(self, block_v, num_warps)

    def start(self, state: torch.Tensor) -> KernelHistory:
        h = KernelHistory.start(state, self.buffer_len)
        h.tiles = self
        return h

    def _verify(self, carry: History, q, k, v, g, beta, tree: DraftTree, s: StepShape, scale: float) -> Verified:
        carry.check_fits(tree.num_nodes, self.name)
        _check_dtype(carry.checkpoint, self.name)
        if carry.u is None:  # nothing buffered yet: an empty ring in the checkpoint's dtype
            L, dt, dev = carry.capacity, carry.checkpoint.dtype, carry.checkpoint.device
            carry.u = torch.zeros(s.B, L, s.HV, s.V, dtype=dt, device=dev)
            carry.k = torch.zeros(s.B, L, s.H, s.K, dtype=dt, device=dev)
            carry.g = torch.zeros(s.B, L, s.HV, dtype=dt, device=dev)
        ckpt, q, k, v, g, beta = contiguous(carry.checkpoint, q, k, v, g, beta)
        carry.checkpoint = ckpt
        o = torch.empty(s.B, s.N, s.HV, s.V, dtype=torch.float32, device=ckpt.device)
        u = torch.empty_like(o)
        L = carry.capacity
        tk.replay_verify[self.grid(s)](
            ckpt, carry.u.contiguous(), carry.k.contiguous(), carry.g.contiguous(), carry.length.to(torch.int32),
            L, q, k, v, g, beta, o, u, scale, s.N, H=s.H, HV=s.HV, K=s.K, V=s.V,
            BK=tk.next_pow2(s.K), BV=self.bv(s), num_warps=self.num_warps)
        return Verified(o.to(q.dtype), tree, s, {"u": u, "k": k, "g": g})


STRATEGIES = {"store_all": StoreAllKernel, "replay": ReplayKernel, "treewy": TreeWYKernel,
              "store_selective": StoreSelectiveKernel}


def stream_copy(src: torch.Tensor, dst: torch.Tensor, block: int = 8192) -> None:
    """Copy one contiguous buffer into another with a plain streaming Triton kernel."""
    n = src.numel()
    tk.stream_copy[(triton.cdiv(n, block),)](src, dst, n, BLOCK=block, num_warps=8)
