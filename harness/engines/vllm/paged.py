"""A commit strategy over vLLM's paged GDN state: one state page plus a stash per request.

vLLM keeps every request's GDN state in a page of the shared block pool. Under
``store_all`` a request holds ``1 + k`` pages and the kernel writes token t's state
into page t. Here a request holds one page, and the page also carries a stash
(two extra state tensors, so vLLM's memory planner counts them):

* ``stash [S, W]`` float32: S token slots of ``W = HV·V + H·K + HV`` floats each:
  a pseudo-value (ṽ or u), the L2-normalised key, and a log decay (cumulative G
  for ``treewy``, per-token g for the deferred strategies).
* ``header [4]`` int32: ``[staged nodes, history length, flushes, 0]``.

``treewy``: the page holds the state the last verify started from; the stash holds
that verify's N nodes. ``replay``: the page is the checkpoint; slots ``[0, len)``
are the accepted history and the last verify's nodes are staged right behind it.
``treewy_deferred``: as replay, but the verify's nodes are staged in slots
``[L, L + N)``. A step first commits the previous verify with vLLM's
``num_accepted_tokens`` (which counts the root token), then verifies the new
tokens. A request fresh from prefill has nothing staged: its page already holds
the committed state. No vLLM import here: it is plain torch, tested on its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

import strategies
from strategies import DraftTree, History, Verified
from strategies.inputs import StepShape

HEADER = 4
STAGED, HISTORY, FLUSHES = 0, 1, 2
DEFERRED = ("replay", "treewy_deferred")
BACKENDS = ("auto", "torch", "triton")


@dataclass(frozen=True)
class StashLayout:
    """Sizes of one layer's stash for a strategy and a chain of ``num_spec`` drafts (per TP rank)."""

    strategy: str
    num_key_heads: int      # H
    num_value_heads: int    # HV
    key_head_dim: int       # K
    value_head_dim: int     # V
    num_spec: int           # k drafts; a step verifies N = k + 1 tokens (the root too)
    buffer_len: int = strategies.history.DEFAULT_BUFFER_LEN

    def __post_init__(self) -> None:
        if self.strategy not in strategies.names() or self.strategy == "store_all":
            raise ValueError(f"strategy={self.strategy!r}: a paged stash exists for "
                             f"{', '.join(n for n in strategies.names() if n != 'store_all')}")
        if self.num_spec < 1:
            raise ValueError(f"num_speculative_tokens={self.num_spec}: strategy={self.strategy} needs "
                             "speculative decoding (k >= 1)")

    @property
    def nodes(self) -> int:
        return self.num_spec + 1

    @cached_property
    def strategy_obj(self) -> strategies.Strategy:
        opts = {"buffer_len": self.buffer_len} if self.strategy in DEFERRED else {}
        return strategies.get(self.strategy, **opts)

    @property
    def width(self) -> int:
        return (self.num_value_heads * self.value_head_dim + self.num_key_heads * self.key_head_dim
                + self.num_value_heads)

    @property
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


def gates(A_log: torch.Tensor, a: torch.Tensor, b: torch.Tensor, dt_bias: torch.Tensor):
    """Qwen3-Next / Qwen3.5 gating as vLLM's kernels compute it: ``g = −e^{A_log}·softplus(a + dt_bias)``
    (softplus with beta 1, threshold 20), ``beta = sigmoid(b)``; a, b ``[T, HV]`` → float32 ``[T, HV]``."""
    g = -A_log.float().exp() * torch.nn.functional.softplus(a.float() + dt_bias.float(), beta=1.0, threshold=20.0)
    return g, b.float().sigmoid()


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """flash-linear-attention's ``l2norm_fwd``: ``x / sqrt(Σx² + eps)`` in float32."""
    x = x.float()
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


class PagedCommit:
    """Run one strategy's commit + verify over a batch of speculative rows of vLLM's pages."""

    def __init__(self, layout: StashLayout, backend: str = "auto"):
        """``backend``: ``torch`` (the strategies' reference math), ``triton`` (strategies.kernels:
        treewy only), or ``auto``: Triton for treewy on a CUDA device where Triton is installed."""
        if backend not in BACKENDS:
            raise ValueError(f"backend={backend!r}: choose one of {', '.join(BACKENDS)} "
                             f"(the plugin reads it from COMMITBENCH_KERNELS)")
        if backend == "triton" and layout.strategy != "treewy":
            raise ValueError(f"backend=triton: kernels exist for treewy here, not {layout.strategy}; use auto or torch")
        self.layout = layout
        self.backend = backend
        self.strategy = layout.strategy_obj
        self.fused = False      # treewy on the Triton kernels: commit + verify as one step on the pages
        self._chosen = False

    def _use(self, device: torch.device) -> None:
        """Pick the implementation at the first step, once the pages' device is known."""
        if self._chosen:
            return
        self._chosen = True
        if self.layout.strategy != "treewy" or self.backend == "torch":
            return
        from strategies import kernels

        if self.backend == "triton" or (device.type == "cuda" and kernels.available()):
            self.strategy = kernels.get("treewy")
            self.fused = True

    def reset(self, header: torch.Tensor, slots: torch.Tensor) -> None:
        """Prefill wrote these pages: nothing staged, no history (the page is the committed state)."""
        slots = slots[slots >= 0].long()
        if slots.numel():
            header[slots] = 0

    def step(self, ssm: torch.Tensor, stash: torch.Tensor, header: torch.Tensor, slots: torch.Tensor,
             num_accepted: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
             beta: torch.Tensor, cu_seqlens: list[int], scale: float | None = None,
             probe: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Commit each row's last verify, then verify its new tokens.

        ssm ``[P, HV, K, V]`` (a view of the pages in flash-linear-attention's layout),
        stash ``[P, S, W]``, header ``[P, 4]``; slots ``[n]`` (page per row);
        num_accepted ``[n]`` (vLLM's count, root included); q, k ``[T, H, K]``
        (L2-normalised), v ``[T, HV, V]``, g, beta ``[T, HV]`` float32; ``cu_seqlens``:
        n + 1 token offsets. Returns the outputs ``[T, HV, V]`` (float32) and, with
        ``probe``, each row's committed state ``[n, HV, K, V]`` (the one verified from).
        """
        self._use(ssm.device)
        T = q.shape[0]
        o = q.new_empty(T, v.shape[1], v.shape[2], dtype=torch.float32)
        committed = ssm.new_empty(len(slots), *ssm.shape[1:], dtype=torch.float32) if probe else None
        lens = [cu_seqlens[i + 1] - cu_seqlens[i] for i in range(len(slots))]
        # One draft shape per call (the strategies' contract): group rows by tokens verified.
        for n_tok in sorted(set(lens)):
            if n_tok == 0:
                continue
            rows = [i for i, n in enumerate(lens) if n == n_tok]
            if len(rows) == len(lens):  # the common case: every row verifies k + 1 tokens
                tok = torch.arange(cu_seqlens[0], cu_seqlens[-1], device=q.device)
            else:
                tok = torch.cat([torch.arange(cu_seqlens[i], cu_seqlens[i] + n_tok) for i in rows]).to(q.device)
            rows_t = torch.tensor(rows, device=q.device)
            pages = slots[rows_t].long()
            B = len(rows)

            qkvgb = [x[tok].reshape(B, n_tok, *x.shape[1:]) for x in (q, k, v, g, beta)]
            h = self._group(ssm, stash, header, pages, num_accepted[rows_t].long(), *qkvgb,
                            DraftTree.chain(n_tok - 1, root=True), scale, probe)
            o[tok] = h[0].reshape(B * n_tok, *o.shape[1:])
            if probe:
                committed[rows_t] = h[1]
        return o, committed

    def _group(self, ssm, stash, header, pages, n_acc, q, k, v, g, beta, tree, scale, probe=False):
        lay = self.layout
        hd = header[pages]
        st = stash[pages]
        staged = hd[:, STAGED].long()
        # Nothing staged (fresh from prefill): the page is already the committed state.
        accepted = torch.where(staged > 0, (n_acc - 1).clamp(min=0), -1)
        accepted = torch.minimum(accepted, staged - 1)
        B, N = len(pages), lay.nodes
        shape = StepShape(B, N, lay.num_key_heads, lay.num_value_heads, lay.key_head_dim, lay.value_head_dim)
        prev_tree = DraftTree.chain(lay.num_spec, root=True)
        if lay.strategy == "treewy":
            vt, kk, G = lay.split(st[:, :N])
            prev = Verified(ssm.new_empty(0), prev_tree, shape, {"v_tilde": vt, "k": kk, "G": G})
            if self.fused:
                # One kernel on vLLM's own pages: commit into them, verify from the result; no gather/scatter.
                now = StepShape(B, tree.num_nodes, shape.H, shape.HV, shape.K, shape.V)
                ver = self.strategy._step(ssm, prev, accepted, q, k, v, g, beta, tree, now,
                                          shape.K ** -0.5 if scale is None else scale, pages=pages)
                h = ssm[pages].float() if probe else None
            else:
                h = self.strategy.commit(ssm[pages].float(), prev, accepted)
                ver = self.strategy.verify(h, q, k, v, g, beta, tree, scale)
                ssm[pages] = h.to(ssm.dtype)  # TreeWY's one state write per step
            stash[pages, : tree.num_nodes] = lay.join(ver.stash["v_tilde"], ver.stash["k"], ver.stash["G"])
            header[pages, STAGED] = tree.num_nodes
            return ver.o, h
        # Deferred flush: the page is the checkpoint, the stash the ring buffer.
        h0 = ssm[pages].float()
        L = lay.buffer_len
        length = hd[:, HISTORY].long()
        u, kk, gg = lay.split(st[:, :L])
        hist = History(h0, L, length.clone(), torch.zeros_like(length), u.clone(), kk.clone(), gg.clone())
        if lay.strategy == "replay":
            at = (length[:, None] + torch.arange(N, device=h0.device)[None, :]).clamp(max=L - 1)
            prev_rows = st[torch.arange(B, device=h0.device)[:, None], at]
        else:
            prev_rows = st[:, L:L + N]
        pu, pk, pg = lay.split(prev_rows)
        key = "u" if lay.strategy == "replay" else "v_tilde"
        prev = Verified(h0.new_empty(0), prev_tree, shape, {key: pu, "k": pk, "g": pg})
        hist = self.strategy.commit(hist, prev, accepted)
        if lay.strategy == "replay":
            hist.make_room(tree.num_nodes)  # the new draft is staged behind the history
        ver = self.strategy.verify(hist, q, k, v, g, beta, tree, scale)
        flushed = hist.flushes > 0
        if bool(flushed.any()):
            ssm[pages[flushed]] = hist.checkpoint[flushed].to(ssm.dtype)
        ring = lay.join(hist.u, hist.k, hist.g)
        new = lay.join(ver.stash[key], ver.stash["k"], ver.stash["g"])
        if lay.strategy == "replay":
            at = hist.length[:, None] + torch.arange(tree.num_nodes, device=h0.device)[None, :]
            ring[torch.arange(B, device=h0.device)[:, None], at] = new
            stash[pages, :L] = ring
        else:
            stash[pages, :L] = ring
            stash[pages, L:L + tree.num_nodes] = new
        header[pages, STAGED] = tree.num_nodes
        header[pages, HISTORY] = hist.length.to(header.dtype)
        header[pages, FLUSHES] += hist.flushes.to(header.dtype)
        return ver.o, hist.current()
