"""The strategies over an engine's paged GDN state: one state page plus a stash per request.

An engine such as vLLM keeps every request's GDN state in a page of a shared pool. Under
``store_all`` a request holds ``1 + k`` pages and the kernel writes token t's state into page t.
Here a request holds one page, which also carries a stash (two extra state tensors, so vLLM's
memory planner counts them):

* ``stash [S, W]`` float32: S token slots of ``W = HV·V + H·K + HV`` floats each: a pseudo-value
  (u, which for a chain equals TreeWY's ṽ), the L2-normalised key, and a log decay (cumulative G
  from the page's state for ``treewy``, per-token g for the deferred strategies).
* ``header [4]`` int32: ``[staged nodes, history length, flushes, 0]``.

``treewy``: the page holds the state the last verify started from; slots ``[0, N)`` that verify's
nodes. ``replay``: the page is the checkpoint; slots ``[0, len)`` are the accepted history and the
last verify's nodes are staged right behind it. ``treewy_deferred``: as replay, but the verify's
nodes are staged in slots ``[L, L + N)`` and only the accepted path joins the ring. A step first
commits the previous verify with the engine's ``num_accepted`` (which counts the root token), then
verifies the new tokens. A page whose header says nothing is staged holds the committed state
(fresh from prefill, or committed by :meth:`PagedCommit.commit`).

:class:`PagedCommit` is the op an engine calls per GDN layer. Its inputs are vLLM's (raw q/k/v,
gates' inputs, the pool of V-major pages, a page index per row, ``num_accepted``, token offsets
``cu_seqlens``); ``backend="torch"`` runs the strategies' reference math here (host syncs, Python
per row: for CPUs and tests), ``triton`` the fused kernels of :mod:`strategies.kernels.paged` (two
launches, no host sync, CUDA-graph safe), ``auto`` Triton where the pool is on a CUDA device.
Both have the same semantics, padded rows (page ``<= 0``) and rows of no tokens included.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property

import torch

from . import history
from .base import Verified, get
from .history import History
from .inputs import StepShape
from .tree import DraftTree

HEADER = 4
STAGED, HISTORY, FLUSHES = 0, 1, 2
DEFERRED = ("replay", "treewy_deferred")
# The strategies with a paged stash layout, so vLLM can run them (store_all is vLLM's own path): the torch reference
# here and the Triton op (strategies/kernels/paged.py) implement exactly these.
PAGED = ("treewy", *DEFERRED)
BACKENDS = ("auto", "torch", "triton")
ALGOS = ("recurrence", "gluon")         # the Triton op's arithmetic (strategies.kernels.paged.ALGOS)
#: Value tile and warps per algorithm, the H200's picks at batch 256, k = 3 (results/h200-kernel-speed):
#: recurrence 64 x 2 for every strategy; gluon 32 x 2 (treewy 430 us, replay 435, treewy_deferred 442; 64 x 4
#: within 1%, 64 x 2 4-8% slower).
TILES = {"recurrence": (64, 2), "gluon": (32, 2)}


#: GPU architectures (compute capability major) where the Gluon kernel's layouts were run and checked.
GLUON_VALIDATED = (9,)        # sm_90: the H200 (results/h200-kernel-speed)


def default_algo(device: torch.device) -> str:
    """``algo="auto"``'s arithmetic for pages on ``device``: gluon on a CUDA GPU of an architecture it was
    validated on (:data:`GLUON_VALIDATED`; on the H200 0.44-0.72x vLLM's kernel where the Triton recurrence is
    0.73-1.0x), the recurrence elsewhere: CPU pages and Triton's interpreter (Gluon has none), and other GPUs,
    where Gluon's hand-set layouts are untested (ask for ``algo="gluon"`` to try them)."""
    if device.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        return "recurrence"
    return "gluon" if torch.cuda.get_device_capability(device)[0] in GLUON_VALIDATED else "recurrence"


@dataclass(frozen=True)
class StashLayout:
    """Sizes of one layer's stash for a strategy and a chain of ``num_spec`` drafts (per TP rank)."""

    strategy: str
    num_key_heads: int      # H
    num_value_heads: int    # HV
    key_head_dim: int       # K
    value_head_dim: int     # V
    num_spec: int           # k drafts; a step verifies N = k + 1 tokens (the root too)
    buffer_len: int = history.DEFAULT_BUFFER_LEN

    def __post_init__(self) -> None:
        if self.strategy not in PAGED:
            raise ValueError(f"strategy={self.strategy!r}: a paged stash exists for {', '.join(PAGED)}")
        if self.num_spec < 1:
            raise ValueError(f"num_speculative_tokens={self.num_spec}: strategy={self.strategy} needs "
                             "speculative decoding (k >= 1)")
        if self.strategy in DEFERRED and self.buffer_len < self.nodes:
            raise ValueError(f"buffer_len={self.buffer_len}: strategy={self.strategy} buffers a whole step of "
                             f"{self.nodes} tokens (1 + {self.num_spec} drafts); use buffer_len >= {self.nodes}")

    @property
    def nodes(self) -> int:
        return self.num_spec + 1

    @cached_property
    def strategy_obj(self):
        opts = {"buffer_len": self.buffer_len} if self.strategy in DEFERRED else {}
        return get(self.strategy, **opts)

    @property
    def width(self) -> int:
        return (self.num_value_heads * self.value_head_dim + self.num_key_heads * self.key_head_dim
                + self.num_value_heads)

    @cached_property
    def slots(self) -> int:
        """Token slots, exactly as the strategy's memory accounting counts them."""
        return self.strategy_obj.footprint(DraftTree.chain(self.num_spec, root=True))[1]

    def shapes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        return (self.slots, self.width), (HEADER,)

    @staticmethod
    def dtypes() -> tuple[torch.dtype, torch.dtype]:
        return torch.float32, torch.int32

    @property
    def bytes(self) -> int:
        return self.slots * self.width * 4 + HEADER * 4

    def split(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``[..., W]`` → value part ``[..., HV, V]``, keys ``[..., H, K]``, decays ``[..., HV]``."""
        hv = self.num_value_heads * self.value_head_dim
        hk = self.num_key_heads * self.key_head_dim
        lead = rows.shape[:-1]
        return (rows[..., :hv].reshape(*lead, self.num_value_heads, self.value_head_dim),
                rows[..., hv:hv + hk].reshape(*lead, self.num_key_heads, self.key_head_dim),
                rows[..., hv + hk:])

    @staticmethod
    def join(u: torch.Tensor, k: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        lead = u.shape[:-2]
        return torch.cat([u.reshape(*lead, -1), k.reshape(*lead, -1), g.reshape(*lead, -1)], -1).float()


def gates(A_log: torch.Tensor, a: torch.Tensor, b: torch.Tensor, dt_bias: torch.Tensor, dtype=torch.float32):
    """Qwen3-Next / Qwen3.5 gating as vLLM's kernels compute it: ``g = −e^{A_log}·softplus(a + dt_bias)``
    (softplus with beta 1, threshold 20), ``beta = sigmoid(b)``; a, b ``[T, HV]`` → ``[T, HV]`` in ``dtype``."""
    g = -A_log.to(dtype).exp() * torch.nn.functional.softplus(a.to(dtype) + dt_bias.to(dtype), beta=1.0,
                                                              threshold=20.0)
    return g, b.to(dtype).sigmoid()


def l2norm(x: torch.Tensor, eps: float = 1e-6, dtype=torch.float32) -> torch.Tensor:
    """flash-linear-attention's ``l2norm_fwd``: ``x / sqrt(Σx² + eps)`` in ``dtype`` (float32 as vLLM)."""
    x = x.to(dtype)
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def compute_dtype(pool: torch.Tensor) -> torch.dtype:
    """The torch reference's arithmetic: float64 for a float64 pool (an exact reference for the kernels,
    which compute in float32), else float32 as vLLM's kernels. The stash stays float32 either way."""
    return torch.float64 if pool.dtype == torch.float64 else torch.float32


def pages_of(state_indices: torch.Tensor) -> torch.Tensor:
    """Each row's page: column 0 of vLLM's ``[rows, k + 1]`` index tensor (one page per request here), or the
    ``[rows]`` index itself."""
    return state_indices[:, 0] if state_indices.dim() == 2 else state_indices


class PagedCommit:
    """Run one strategy's commit + verify over a batch of speculative rows of an engine's pages."""

    def __init__(self, layout: StashLayout, backend: str = "auto", block_v: int | None = None,
                 num_warps: int | None = None, algo: str = "auto", launch: str = "direct"):
        """``backend``: ``torch`` (the strategies' reference math), ``triton`` (:mod:`strategies.kernels.paged`,
        also on CPU in Triton's interpreter), or ``auto``: Triton where the pages are on a CUDA device and
        Triton is installed. ``block_v``/``num_warps``: the Triton step's value tile and warps (None: the
        algorithm's default, :data:`TILES`); ``algo``: its arithmetic (:data:`ALGOS`: ``recurrence``, token by
        token in Triton; ``gluon``, the same in Gluon with the state tile's layout chosen, CUDA only; ``auto``:
        :func:`default_algo` of the pages' device, decided at the first call); ``launch``: how the Triton op's
        kernels are launched (``direct``: Triton's entry point once per specialisation, then the compiled kernel's
        launcher; ``jit``: the entry point every call; :data:`strategies.kernels.paged.LAUNCHES`)."""
        if backend not in BACKENDS:
            raise ValueError(f"backend={backend!r}: choose one of {', '.join(BACKENDS)} "
                             f"(the vLLM plugin reads it from COMMITBENCH_KERNELS)")
        if algo not in ALGOS + ("auto",):
            raise ValueError(f"algo={algo!r}: choose one of auto, {', '.join(ALGOS)} "
                             "(the vLLM plugin reads it from COMMITBENCH_PAGED_ALGO)")
        if launch not in ("direct", "jit"):
            raise ValueError(f"launch={launch!r}: choose direct or jit (the vLLM plugin reads it from "
                             "COMMITBENCH_PAGED_LAUNCH)")
        self.layout = layout
        self.launch = launch
        self.backend = backend
        self.strategy = layout.strategy_obj
        self._tiles = (block_v, num_warps)
        self.algo = self.block_v = self.num_warps = None    # set by resolve(): auto waits for the device
        if algo != "auto":
            self.resolve(algo)
        self._auto: bool | None = None

    def resolve(self, algo_or_device: str | torch.device) -> "PagedCommit":
        """Fix the arithmetic (a name, or :func:`default_algo` of a device) and its tiles; a no-op once fixed,
        so one op never changes arithmetic between steps."""
        if self.algo is None:
            algo = (algo_or_device if isinstance(algo_or_device, str)
                    else default_algo(torch.device(algo_or_device)))
            if algo not in ALGOS:
                raise ValueError(f"resolve({algo_or_device!r}): give one of {', '.join(ALGOS)} or a torch.device")
            self.algo = algo
            self.block_v = int(self._tiles[0] or TILES[algo][0])
            self.num_warps = int(self._tiles[1] or TILES[algo][1])
        return self

    def uses_triton(self, device: torch.device) -> bool:
        if self.backend != "auto":
            return self.backend == "triton"
        if self._auto is None:      # asked every step: decide once
            from . import kernels

            self._auto = kernels.available()
        return device.type == "cuda" and self._auto

    # -- the op ---------------------------------------------------------------------------------------
    def step(self, pool: torch.Tensor, stash: torch.Tensor, header: torch.Tensor, q: torch.Tensor,
             k: torch.Tensor, v: torch.Tensor, a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor,
             dt_bias: torch.Tensor, state_indices: torch.Tensor, num_accepted: torch.Tensor,
             cu_seqlens: torch.Tensor, scale: float | None = None, out: torch.Tensor | None = None,
             probe: torch.Tensor | None = None, commit_indices: torch.Tensor | None = None,
             commit_accepted: torch.Tensor | None = None) -> torch.Tensor:
        """Commit each row's last verify, then verify its new tokens; returns the outputs ``out``.

        pool ``[P, HV, V, K]`` (vLLM's V-major pages, any strides), stash ``[P, S, W]``, header ``[P, 4]``;
        q, k ``[T, H, K]`` and v ``[T, HV, V]`` raw (L2 norm inside), a, b ``[T', HV]`` (T' >= T: the gates'
        inputs, row-aligned with q), A_log, dt_bias ``[HV]``; state_indices ``[n]`` or ``[n, C]`` (a page
        per row, column 0; ``<= 0``: a padded row, skipped), num_accepted ``[n]`` (the engine's count,
        root included), cu_seqlens ``[n + 1]`` token offsets (a device tensor). out ``[T, HV, V]``
        (default: q's dtype); the outputs of skipped rows are left as they were. probe ``[n, HV, K, V]``
        float32, optional: each row's committed state (the one its new tokens were verified from).
        commit_indices ``[m]`` and commit_accepted ``[m]``, optional: further rows that only commit, as
        :meth:`commit` does, in the same launches (an engine's rows leaving the speculative path this step;
        their pages must be none of the verify rows')."""
        scale = self.layout.key_head_dim ** -0.5 if scale is None else float(scale)
        if (commit_indices is None) != (commit_accepted is None):
            raise ValueError("commit_indices and commit_accepted: give both (the rows that only commit and their "
                             "accepted counts) or neither")
        if out is None:
            out = q.new_empty(q.shape[0], v.shape[1], v.shape[2])
        if self.uses_triton(pool.device):
            from . import kernels

            self.resolve(pool.device)
            kernels.paged_ops().step(self.layout, pool, stash, header, q, k, v, a, b, A_log, dt_bias,
                                     state_indices, num_accepted, cu_seqlens, scale, out, probe, self.block_v,
                                     self.num_warps, self.algo, commit_indices, commit_accepted, self.launch)
            return out
        if commit_indices is not None:
            self._torch_commit(pool, stash, header, commit_indices, commit_accepted)
        self._torch_step(pool, stash, header, q, k, v, a, b, A_log, dt_bias, state_indices, num_accepted,
                         cu_seqlens, scale, out, probe)
        return out

    def commit(self, pool: torch.Tensor, stash: torch.Tensor, header: torch.Tensor,
               state_indices: torch.Tensor, num_accepted: torch.Tensor) -> None:
        """Commit-only step for rows that leave the speculative path (a decode without drafts, a prefill
        chunk): each row's page becomes its committed state and its header says nothing is staged, so an
        engine's own kernels may read and write the page. Rows of page ``<= 0`` are skipped. Also what
        to run before a prefill writes a page: it clears whatever header the page's last owner left."""
        if self.uses_triton(pool.device):
            from . import kernels

            self.resolve(pool.device)
            kernels.paged_ops().commit(self.layout, pool, stash, header, state_indices, num_accepted, self.block_v,
                                       self.num_warps, self.algo, self.launch)
            return
        self._torch_commit(pool, stash, header, state_indices, num_accepted)

    # -- the reference (torch) ------------------------------------------------------------------------
    def _plan(self, header: torch.Tensor, pages: torch.Tensor, num_accepted: torch.Tensor):
        """staged (clamped), accepted node of the last verify (-1: none), history length, as the kernels."""
        lay = self.layout
        hd = header[pages]
        staged = hd[:, STAGED].long().clamp(0, lay.nodes)
        accepted = torch.where(staged > 0, torch.minimum(num_accepted.long().clamp(min=1), staged) - 1, -1)
        if lay.strategy in DEFERRED:
            length = hd[:, HISTORY].long().clamp(0, lay.buffer_len - lay.nodes)
        else:
            length = torch.zeros_like(staged)
        return accepted, length

    def _torch_step(self, pool, stash, header, q, k, v, a, b, A_log, dt_bias, state_indices, num_accepted,
                    cu_seqlens, scale, out, probe) -> None:
        if pool.is_cuda and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("PagedCommit(backend='torch') syncs with the host and cannot run inside a CUDA graph "
                               "capture; use the Triton op (backend auto/triton, COMMITBENCH_KERNELS=auto) or run "
                               "vLLM with cudagraph_mode PIECEWISE or eager")
        T = q.shape[0]
        cdt = compute_dtype(pool)
        g, beta = gates(A_log, a[:T], b[:T], dt_bias, cdt)
        qn, kn, vf = l2norm(q, dtype=cdt), l2norm(k, dtype=cdt), v.to(cdt)
        ssm = pool.transpose(-1, -2)                        # [P, HV, K, V]: the strategies' layout
        cu = cu_seqlens.tolist()
        pages = pages_of(state_indices).tolist()
        lens = [cu[i + 1] - cu[i] for i in range(len(cu) - 1)]
        if max(lens, default=0) > self.layout.nodes:
            raise ValueError(f"cu_seqlens: a row of {max(lens)} tokens; a step holds at most {self.layout.nodes} "
                             f"(1 + num_spec={self.layout.num_spec})")
        live = [i for i in range(len(lens)) if lens[i] > 0 and pages[i] > 0]
        # One draft shape per call (the strategies' contract): group rows by tokens verified.
        for n_tok in sorted({lens[i] for i in live}):
            rows = [i for i in live if lens[i] == n_tok]
            tok = torch.cat([torch.arange(cu[i], cu[i] + n_tok) for i in rows]).to(q.device)
            rows_t = torch.tensor(rows, device=q.device)
            pg = torch.tensor([pages[i] for i in rows], device=q.device)
            B = len(rows)
            qkvgb = [x[tok].reshape(B, n_tok, *x.shape[1:]) for x in (qn, kn, vf, g, beta)]
            o, h = self._group(ssm, stash, header, pg, num_accepted[rows_t], *qkvgb,
                               DraftTree.chain(n_tok - 1, root=True), scale)
            out[tok] = o.reshape(B * n_tok, *out.shape[1:]).to(out.dtype)
            if probe is not None:
                probe[rows_t] = h.to(probe.dtype)

    def _group(self, ssm, stash, header, pages, n_acc, q, k, v, g, beta, tree, scale):
        lay = self.layout
        cdt = q.dtype
        accepted, length = self._plan(header, pages, n_acc)
        st = self._live(stash[pages].to(cdt), header, pages, length)
        B, N = len(pages), lay.nodes
        shape = StepShape(B, N, lay.num_key_heads, lay.num_value_heads, lay.key_head_dim, lay.value_head_dim)
        prev_tree = DraftTree.chain(lay.num_spec, root=True)
        if lay.strategy == "treewy":
            vt, kk, G = lay.split(st[:, :N])
            prev = Verified(ssm.new_empty(0), prev_tree, shape, {"v_tilde": vt, "k": kk, "G": G})
            h = self.strategy.commit(ssm[pages].to(cdt), prev, accepted)
            ver = self.strategy.verify(h, q, k, v, g, beta, tree, scale)
            ssm[pages] = h.to(ssm.dtype)  # TreeWY's one state write per step
            stash[pages, : tree.num_nodes] = lay.join(ver.stash["v_tilde"], ver.stash["k"], ver.stash["G"])
            header[pages, STAGED] = tree.num_nodes
            return ver.o, h
        hist, prev, key = self._history(ssm, st, pages, length, shape, prev_tree)
        hist = self.strategy.commit(hist, prev, accepted)
        if lay.strategy == "replay":
            hist.make_room(tree.num_nodes)  # the new draft is staged behind the history
        ver = self.strategy.verify(hist, q, k, v, g, beta, tree, scale)
        self._write_history(ssm, stash, header, pages, hist, length)
        new = lay.join(ver.stash[key], ver.stash["k"], ver.stash["g"])
        at = (hist.length[:, None] if lay.strategy == "replay" else lay.buffer_len) + \
            torch.arange(tree.num_nodes, device=pages.device)[None, :]
        stash[pages[:, None], at] = new
        header[pages, STAGED] = tree.num_nodes
        return ver.o, hist.current()

    def _live(self, st: torch.Tensor, header: torch.Tensor, pages: torch.Tensor, length: torch.Tensor) -> torch.Tensor:
        """The stash rows ``st [B, S, W]`` with every slot these pages do not use zeroed: the staged nodes of the
        last verify and the deferred ring's ``length`` tokens are live, the rest is whatever the page's last
        owner left. The strategies weigh unused slots by zero, and 0 x NaN is NaN: stale bytes that happen to be
        non-finite would otherwise poison the state."""
        lay = self.layout
        staged = header[pages, STAGED].long().clamp(0, lay.nodes)[:, None]
        slot = torch.arange(st.shape[1], device=st.device)[None, :]
        if lay.strategy == "treewy":
            live = slot < staged
        elif lay.strategy == "replay":                   # the ring, then the staged nodes right behind it
            live = slot < length[:, None] + staged
        else:                                            # treewy_deferred: the ring, the staged nodes at L
            L = lay.buffer_len
            live = (slot < length[:, None]) | ((slot >= L) & (slot < L + staged))
        return torch.where(live[..., None], st, torch.zeros((), dtype=st.dtype, device=st.device))

    def _history(self, ssm, st, pages, length, shape, prev_tree):
        """The deferred carry of these pages (checkpoint, ring) and their last verify's staged nodes."""
        lay = self.layout
        h0 = ssm[pages].to(st.dtype)
        L, B, N = lay.buffer_len, len(pages), lay.nodes
        u, kk, gg = lay.split(st[:, :L])
        hist = History(h0, L, length.clone(), torch.zeros_like(length), u.clone(), kk.clone(), gg.clone())
        if lay.strategy == "replay":
            at = (length[:, None] + torch.arange(N, device=h0.device)[None, :]).clamp(max=L - 1)
            prev_rows = st[torch.arange(B, device=h0.device)[:, None], at]
        else:
            prev_rows = st[:, L:L + N]
        pu, pk, pg = lay.split(prev_rows)
        key = "u" if lay.strategy == "replay" else "v_tilde"
        return hist, Verified(h0.new_empty(0), prev_tree, shape, {key: pu, "k": pk, "g": pg}), key

    def _write_history(self, ssm, stash, header, pages, hist: History, length) -> None:
        """Checkpoints of the rows that flushed, the ring, the history length and the flush count."""
        lay = self.layout
        flushed = hist.flushes > 0
        if bool(flushed.any()):
            ssm[pages[flushed]] = hist.checkpoint[flushed].to(ssm.dtype)
        stash[pages, :lay.buffer_len] = lay.join(hist.u, hist.k, hist.g)
        header[pages, HISTORY] = hist.length.to(header.dtype)
        header[pages, FLUSHES] += hist.flushes.to(header.dtype)

    def _torch_commit(self, pool, stash, header, state_indices, num_accepted) -> None:
        lay = self.layout
        ssm = pool.transpose(-1, -2)
        all_pages = pages_of(state_indices).long()
        keep = all_pages > 0
        pages, n_acc = all_pages[keep], num_accepted[keep]
        if not len(pages):
            return
        accepted, length = self._plan(header, pages, n_acc)
        B, N = len(pages), lay.nodes
        shape = StepShape(B, N, lay.num_key_heads, lay.num_value_heads, lay.key_head_dim, lay.value_head_dim)
        prev_tree = DraftTree.chain(lay.num_spec, root=True)
        st = self._live(stash[pages].to(compute_dtype(pool)), header, pages, length)
        if lay.strategy == "treewy":
            vt, kk, G = lay.split(st[:, :N])
            prev = Verified(ssm.new_empty(0), prev_tree, shape, {"v_tilde": vt, "k": kk, "G": G})
            h = self.strategy.commit(ssm[pages].to(st.dtype), prev, accepted)
            done = accepted >= 0
            ssm[pages[done]] = h[done].to(ssm.dtype)
        else:
            hist, prev, _ = self._history(ssm, st, pages, length, shape, prev_tree)
            hist = self.strategy.commit(hist, prev, accepted)
            # Materialise: whatever is still buffered goes into the checkpoint now.
            hist._flush(hist.length > 0)
            self._write_history(ssm, stash, header, pages, hist, length)
        header[pages, STAGED] = 0
