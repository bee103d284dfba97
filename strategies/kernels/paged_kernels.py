"""Triton kernels of the paged step (:mod:`.paged`): one engine step of a GDN layer's speculative rows,
directly on vLLM-style pages. Imported only through :mod:`.paged` (needs Triton).

Row b of the batch owns page ``idx[b]`` (``<= 0``: a padded row, skipped, as vLLM's kernel skips its
NULL_BLOCK_ID) and tokens ``[cu[b], cu[b + 1])`` (none: skipped). Its page holds the state
``pool[page]`` (any strides: vLLM's V-major ``[HV, V, K]``), the stash ``stash[page] [S, W]`` float32
and the header ``header[page] [4]`` int32 = (staged nodes, history length, flushes, 0). A stash slot
is ``W = HV·V + H·K + HV`` floats: the pseudo-value u (= TreeWY's ṽ) ``[HV, V]``, the L2-normalised
key ``[H, K]``, and a log decay ``[HV]`` (cumulative G from the page's state for treewy, per token g
for the deferred strategies). ``STRAT``: 0 treewy, 1 replay, 2 treewy_deferred (see
:mod:`strategies.paged` for what each keeps where; the torch reference there has the same semantics).

A step is two launches. :func:`paged_step` (one program per row, value head and tile of ``BV`` value
columns) commits the row's last verify (``num_accepted`` tokens of it, the root included) into the
state tile in registers, writes it to the page where the strategy writes (treewy: always; deferred:
at a flush), then runs the new tokens' gated delta rule from it — gating and L2 norm from the raw
inputs, as vLLM's kernel does — writing the outputs and the tokens' u into the stash. Everything a
program writes is its own (its state tile, its u columns), so no program reads what another writes.
:func:`paged_finish` (one program per row) then writes what the row's programs share: the new
tokens' keys and decays, the deferred strategies' accepted path into the ring, and the header. Both
derive the row's plan (:func:`_plan`) from the header the same way, so they agree without talking.
The rows after the first ``n_verify`` only commit (an engine's rows leaving the speculative path: decodes
without drafts, prefill chunks), so a step that has both costs the host two launches, not four; a commit alone
is the same two launches with ``n_verify = 0``.
No host sync, no data-dependent shape: the step can be captured in a CUDA graph.
"""

from __future__ import annotations

import triton
import triton.language as tl

TREEWY, REPLAY, TREEWY_DEFERRED = 0, 1, 2


@triton.jit
def _plan(idx, s_idx, cu, nacc, cidx, s_cidx, cnacc, n_verify, header, s_hdr, b, N: tl.constexpr, L: tl.constexpr,
          STRAT: tl.constexpr):
    """Row b's page, tokens and what this step does with them (every program of the row computes the same).

    Rows ``b < n_verify`` verify: page ``idx[b]``, tokens ``[cu[b], cu[b + 1])``, count ``nacc[b]``. The rows
    after them only commit (rows leaving the speculative path, :meth:`strategies.paged.PagedCommit.commit`):
    page ``cidx[b - n_verify]`` (row stride ``s_cidx``: column 0 of a 2-D index), count ``cnacc[b - n_verify]``,
    no tokens. ``cnt``: tokens of the last verify to commit (the engine's num_accepted, clamped to what is
    staged; 0 when nothing is staged: the page is already the committed state). Deferred strategies: ``length``
    tokens are buffered after the checkpoint; ``flush``: the checkpoint is rewritten now (the next N tokens
    would not fit behind ``length + cnt``, or a commit-only row), leaving ``new_len`` buffered."""
    commit = b >= n_verify
    if commit:
        page = tl.load(cidx + (b - n_verify) * s_cidx).to(tl.int64)
        acc = tl.load(cnacc + (b - n_verify)).to(tl.int32)
        bos = (b * 0).to(tl.int64)
        n = (b * 0).to(tl.int32)
    else:
        page = tl.load(idx + b * s_idx).to(tl.int64)
        acc = tl.load(nacc + b).to(tl.int32)
        bos = tl.load(cu + b).to(tl.int64)
        # A step holds at most N tokens per row (the stash has N slots); more would overrun the page.
        n = tl.minimum(tl.load(cu + b + 1) - tl.load(cu + b), N).to(tl.int32)
    live = page > 0
    hdr = header + page * s_hdr
    staged = tl.minimum(tl.maximum(tl.load(hdr, mask=live, other=0), 0), N)
    if STRAT == 0:
        length = staged * 0
    else:  # clamped: a page that never ran this strategy may hold anything
        length = tl.minimum(tl.maximum(tl.load(hdr + 1, mask=live, other=0), 0), L - N)
    cnt = tl.where(staged > 0, tl.minimum(tl.maximum(acc, 1), staged), 0)
    if STRAT == 0:
        flush = cnt < 0
        new_len = length
    else:
        flush = commit | (length + cnt + N > L)
        new_len = tl.where(flush, 0, length + cnt)
    return page, bos, n, length, cnt, flush, new_len


@triton.jit
def _committed(h, st, hv, hk, ok, ov, mk, mv, length, cnt, flush, K: tl.constexpr, V: tl.constexpr,
               W: tl.constexpr, OKEY: tl.constexpr, ODEC: tl.constexpr, L: tl.constexpr, STRAT: tl.constexpr):
    """The row's committed state tile from the page's ``h`` ``[BV, BK]`` and the stash (the last verify's
    ``cnt`` accepted tokens; the deferred strategies' ring too). treewy_deferred's accepted path joins the
    ring on the way (this program's u columns; keys and decays: paged_finish)."""
    if STRAT == 0:
        # h_a = e^{G_a} h0 + Σ_{i<cnt} e^{G_a - G_i} k_i ⊗ ṽ_i, the chain's accepted prefix. A loop, not
        # unrolled: an unrolled one holds every slot's ṽ columns in registers at once (each thread keeps all
        # BV of them) and halves the programs per SM.
        Ga = tl.load(st + (cnt - 1) * W + ODEC + hv, mask=cnt > 0, other=0.)
        h = h * tl.exp(Ga)
        for i in range(0, cnt):
            wi = tl.exp(Ga - tl.load(st + i * W + ODEC + hv))
            ki = tl.load(st + i * W + OKEY + hk * K + ok, mask=mk, other=0.)
            ui = tl.load(st + i * W + hv * V + ov, mask=mv, other=0.)
            h += (wi * ui)[:, None] * ki[None, :]
    else:
        # The committed state: the checkpoint, then the buffered tokens, then the accepted ones of the
        # last verify (replay stages them in the ring right behind the history; treewy_deferred at L).
        if STRAT == 1:
            n_ring = length + cnt
        else:
            n_ring = length
        for i in range(0, n_ring):
            gi = tl.load(st + i * W + ODEC + hv)
            ki = tl.load(st + i * W + OKEY + hk * K + ok, mask=mk, other=0.)
            ui = tl.load(st + i * W + hv * V + ov, mask=mv, other=0.)
            h = h * tl.exp(gi) + ui[:, None] * ki[None, :]
        if STRAT == 2:
            keep = tl.where(flush, 0, cnt)        # accepted tokens that join the ring (none at a flush)
            for i in range(0, cnt):
                gi = tl.load(st + (L + i) * W + ODEC + hv)
                ki = tl.load(st + (L + i) * W + OKEY + hk * K + ok, mask=mk, other=0.)
                ui = tl.load(st + (L + i) * W + hv * V + ov, mask=mv, other=0.)
                h = h * tl.exp(gi) + ui[:, None] * ki[None, :]
                tl.store(st + (length + i) * W + hv * V + ov, ui, mask=mv & (ov * 0 + i < keep))
    return h


@triton.jit(do_not_specialize=["n_verify"], do_not_specialize_on_alignment=["cidx", "cnacc"])
def paged_step(pool, s_p, s_h, s_v, s_k, stash, s_st, header, s_hdr, idx, s_idx, nacc, cu, cidx, s_cidx, cnacc,
               n_verify, q, k, v, a, bg, A_log, dt_bias, out, probe, scale,
               H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
               BK: tl.constexpr, BV: tl.constexpr, N: tl.constexpr, L: tl.constexpr,
               STRAT: tl.constexpr, PROBE: tl.constexpr):
    """Commit + verify for program (row b · HV + value head, value tile); see the module docstring. The
    verify is the gated delta rule token by token on the state tile in registers (never written back).
    Rows from ``n_verify`` on only commit (:func:`_plan`). Neither ``n_verify`` nor the commit rows' tensors'
    alignment is specialised on: they change from step to step (how many rows speculate, which slice of vLLM's
    index buffer leaves), and a compile in the middle of a measured run would stall it.

    q, k ``[T, H, K]`` and v ``[T, HV, V]`` raw (bf16), a, bg ``[T, HV]`` (the gates' inputs), A_log and
    dt_bias ``[HV]``: ``g = -e^{A_log} softplus(a + dt_bias)``, ``β = sigmoid(bg)``. out ``[T, HV, V]``
    (any float dtype); probe (``PROBE``) ``[rows, HV, K, V]`` float32 gets each row's committed state."""
    i_bh = tl.program_id(0)
    j = tl.program_id(1)
    b = i_bh // HV
    hv = i_bh % HV
    hk = hv // (HV // H)
    page, bos, n, length, cnt, flush, new_len = _plan(idx, s_idx, cu, nacc, cidx, s_cidx, cnacc, n_verify, header,
                                                      s_hdr, b, N, L, STRAT)
    if page <= 0:
        return
    if (n <= 0) & (b < n_verify):     # a verify row without tokens
        return
    W: tl.constexpr = HV * V + H * K + HV
    OKEY: tl.constexpr = HV * V
    ODEC: tl.constexpr = HV * V + H * K
    ok = tl.arange(0, BK)
    ov = j * BV + tl.arange(0, BV)
    mk = ok < K
    mv = ov < V
    m2 = mv[:, None] & mk[None, :]
    tile = pool + page * s_p + hv * s_h + ov[:, None] * s_v + ok[None, :] * s_k
    h = tl.load(tile, mask=m2, other=0.).to(tl.float32)              # [BV, BK]: state^T, V-major like vLLM's
    st = stash + page * s_st
    if STRAT == 0:
        write = cnt > 0
    else:
        write = flush & (length + cnt > 0)
    # -- commit the last verify -----------------------------------------------------------------------
    h = _committed(h, st, hv, hk, ok, ov, mk, mv, length, cnt, flush, K, V, W, OKEY, ODEC, L, STRAT)
    if write:
        tl.store(tile, h.to(pool.dtype.element_ty), mask=m2)
    if b >= n_verify:     # a commit-only row: done (the probe has the verify rows only)
        return
    if PROBE:
        tl.store(probe + ((b.to(tl.int64) * HV + hv) * K + ok[None, :]) * V + ov[:, None], h, mask=m2)
    # -- verify the new tokens from the committed state, in registers (never written back) -----------
    if STRAT == 0:
        base = new_len * 0
    elif STRAT == 1:
        base = new_len
    else:
        base = new_len * 0 + L
    A = -tl.exp(tl.load(A_log + hv).to(tl.float32))
    dtb = tl.load(dt_bias + hv).to(tl.float32)
    p_q = q + (bos * H + hk) * K + ok
    p_k = k + (bos * H + hk) * K + ok
    p_v = v + (bos * HV + hv) * V + ov
    p_a = a + bos * HV + hv
    p_b = bg + bos * HV + hv
    p_o = out + (bos * HV + hv) * V + ov
    p_u = st + base * W + hv * V + ov
    for _ in range(0, n):
        bq = tl.load(p_q, mask=mk, other=0.).to(tl.float32)
        bk = tl.load(p_k, mask=mk, other=0.).to(tl.float32)
        bv = tl.load(p_v, mask=mv, other=0.).to(tl.float32)
        x = tl.load(p_a).to(tl.float32) + dtb
        gt = A * tl.where(x <= 20., tl.log(1. + tl.exp(x)), x)      # softplus, threshold 20 (vLLM's)
        bt = tl.sigmoid(tl.load(p_b).to(tl.float32))
        bq = bq * tl.rsqrt(tl.sum(bq * bq) + 1e-6) * scale
        bk = bk * tl.rsqrt(tl.sum(bk * bk) + 1e-6)
        h *= tl.exp(gt)
        u = bt * (bv - tl.sum(h * bk[None, :], 1))              # the delta rule's correction = TreeWY's ṽ
        h += u[:, None] * bk[None, :]
        tl.store(p_o, tl.sum(h * bq[None, :], 1).to(out.dtype.element_ty), mask=mv)
        tl.store(p_u, u, mask=mv)
        p_q += H * K
        p_k += H * K
        p_v += HV * V
        p_a += HV
        p_b += HV
        p_o += HV * V
        p_u += W


@triton.jit(do_not_specialize=["n_verify"], do_not_specialize_on_alignment=["cidx", "cnacc"])
def paged_finish(stash, s_st, header, s_hdr, idx, s_idx, nacc, cu, cidx, s_cidx, cnacc, n_verify, k, a, A_log, dt_bias,
                 H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BH: tl.constexpr,
                 BK: tl.constexpr, BHV: tl.constexpr, N: tl.constexpr, L: tl.constexpr, STRAT: tl.constexpr):
    """After :func:`paged_step`, one program per row: the stash parts a row's programs share (the new
    tokens' keys and decays; treewy_deferred's accepted path into the ring) and the header."""
    b = tl.program_id(0)
    page, bos, n, length, cnt, flush, new_len = _plan(idx, s_idx, cu, nacc, cidx, s_cidx, cnacc, n_verify, header,
                                                      s_hdr, b, N, L, STRAT)
    if page <= 0:
        return
    if (n <= 0) & (b < n_verify):     # a verify row without tokens
        return
    W: tl.constexpr = HV * V + H * K + HV
    OKEY: tl.constexpr = HV * V
    ODEC: tl.constexpr = HV * V + H * K
    st = stash + page * s_st
    oh = tl.arange(0, BH)
    ok = tl.arange(0, BK)
    ohv = tl.arange(0, BHV)
    m_hk = (oh < H)[:, None] & (ok < K)[None, :]
    m_hv = ohv < HV
    keys = oh[:, None] * K + ok[None, :]
    if b < n_verify:
        if STRAT == 2:
            keep = tl.where(flush, 0, cnt)
            for i in tl.static_range(N):      # the accepted path's keys and decays join the ring
                on_hk = m_hk & ((oh * 0 + i) < keep)[:, None]
                kk = tl.load(st + (L + i) * W + OKEY + keys, mask=on_hk, other=0.)
                tl.store(st + (length + i) * W + OKEY + keys, kk, mask=on_hk)
                on_hv = m_hv & ((ohv * 0 + i) < keep)
                gg = tl.load(st + (L + i) * W + ODEC + ohv, mask=on_hv, other=0.)
                tl.store(st + (length + i) * W + ODEC + ohv, gg, mask=on_hv)
        if STRAT == 0:
            base = new_len * 0
        elif STRAT == 1:
            base = new_len
        else:
            base = new_len * 0 + L
        A = -tl.exp(tl.load(A_log + ohv, mask=m_hv, other=0.).to(tl.float32))
        dtb = tl.load(dt_bias + ohv, mask=m_hv, other=0.).to(tl.float32)
        G = tl.zeros([BHV], dtype=tl.float32)
        p_k = k + bos * H * K + keys
        p_a = a + bos * HV + ohv
        p_s = st + base * W
        for _ in range(0, n):
            kr = tl.load(p_k, mask=m_hk, other=0.).to(tl.float32)
            kr = kr * tl.rsqrt(tl.sum(kr * kr, 1) + 1e-6)[:, None]
            tl.store(p_s + OKEY + keys, kr, mask=m_hk)
            x = tl.load(p_a, mask=m_hv, other=0.).to(tl.float32) + dtb
            gt = A * tl.where(x <= 20., tl.log(1. + tl.exp(x)), x)
            if STRAT == 0:
                G += gt                          # treewy keeps the decay from the page's state
                tl.store(p_s + ODEC + ohv, G, mask=m_hv)
            else:
                tl.store(p_s + ODEC + ohv, gt, mask=m_hv)
            p_k += H * K
            p_a += HV
            p_s += W
    hdr = header + page * s_hdr
    tl.store(hdr, n)                                 # staged: this step's tokens (0 after a commit-only step)
    if STRAT != 0:
        tl.store(hdr + 1, new_len)
        wrote = flush & (length + cnt > 0)
        tl.store(hdr + 2, tl.load(hdr + 2) + wrote.to(tl.int32))
