"""The paged step's commit + verify (:func:`.paged_kernels.paged_step`) in Gluon, with the state tile's layout
chosen rather than inferred (``algo="gluon"`` of :mod:`.paged`; CUDA only: Gluon has no interpreter).

Why: Triton lays the ``[BV, K]`` fp32 tile of vLLM's K-contiguous pages with 4 K-values per thread and a warp's
32 lanes along K, so each of the verify's two K-reductions per token is a five-round shuffle tree for every
row a thread holds; on the H200 those reductions are 41-54% of the op (results/h200-kernel-speed,
``stages-a3390f2``). Here a warp is 8 lanes along K by 4 along V and each thread holds 16 K-values of a row (4
chunks of 4, so every load instruction still reads 128 contiguous bytes per row): three rounds per row and a
quarter of the rows per thread to reduce, with the same registers for the tile. Same arithmetic, same stash
and header semantics, same grid; :func:`.paged_kernels.paged_finish` runs after it as before.

On the H200 (results/h200-kernel-speed, ``gluon-d96148b`` and ``layer-3c14ee8``) it is the default on sm_90:
within 2.9e-6 of float64 for every strategy, and at 32 value columns x 2 warps (128 registers, no spills)
0.70x the Triton kernel's time at batch 256, k = 3 (treewy 430 against 607 us), 0.55x vLLM's own store_all kernel.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl


@gluon.jit
def _plan(idx, s_idx, cu, nacc, cidx, s_cidx, cnacc, n_verify, header, s_hdr, b, N: gl.constexpr, L: gl.constexpr,
          STRAT: gl.constexpr):
    """:func:`.paged_kernels._plan`, scalar for scalar (rows from ``n_verify`` on only commit)."""
    commit = b >= n_verify
    if commit:
        page = gl.load(cidx + (b - n_verify) * s_cidx).to(gl.int64)
        acc = gl.load(cnacc + (b - n_verify)).to(gl.int32)
        bos = (b * 0).to(gl.int64)
        n = (b * 0).to(gl.int32)
    else:
        page = gl.load(idx + b * s_idx).to(gl.int64)
        acc = gl.load(nacc + b).to(gl.int32)
        bos = gl.load(cu + b).to(gl.int64)
        n = gl.minimum(gl.load(cu + b + 1) - gl.load(cu + b), N).to(gl.int32)
    live = page > 0
    hdr = header + page * s_hdr
    staged = gl.minimum(gl.maximum(gl.load(hdr, mask=live, other=0), 0), N)
    if STRAT == 0:
        length = staged * 0
    else:
        length = gl.minimum(gl.maximum(gl.load(hdr + 1, mask=live, other=0), 0), L - N)
    cnt = gl.where(staged > 0, gl.minimum(gl.maximum(acc, 1), staged), 0)
    if STRAT == 0:
        flush = cnt < 0
        new_len = length
    else:
        flush = commit | (length + cnt + N > L)
        new_len = gl.where(flush, 0, length + cnt)
    return page, bos, n, length, cnt, flush, new_len


@gluon.jit(do_not_specialize=["n_verify"], do_not_specialize_on_alignment=["cidx", "cnacc"])
def paged_step(pool, s_p, s_h, s_v, s_k, stash, s_st, header, s_hdr, idx, s_idx, nacc, cu, cidx, s_cidx, cnacc,
               n_verify, q, k, v, a, bg, A_log, dt_bias, out, probe, scale,
               H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr,
               BK: gl.constexpr, BV: gl.constexpr, N: gl.constexpr, L: gl.constexpr,
               STRAT: gl.constexpr, PROBE: gl.constexpr, NW: gl.constexpr):
    """Commit + verify for program (row b · HV + value head, value tile): the arguments and the semantics of
    :func:`.paged_kernels.paged_step` (rows from ``n_verify`` on only commit); ``NW``: the launch's warps."""
    LH: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [NW, 1], [1, 0])     # the [BV, BK] state tile
    LK: gl.constexpr = gl.SliceLayout(0, LH)                                # vectors along K (keys, queries)
    LV: gl.constexpr = gl.SliceLayout(1, LH)                                # vectors along V (values, outputs)
    i_bh = gl.program_id(0)
    j = gl.program_id(1)
    b = i_bh // HV
    hv = i_bh % HV
    hk = hv // (HV // H)
    page, bos, n, length, cnt, flush, new_len = _plan(idx, s_idx, cu, nacc, cidx, s_cidx, cnacc, n_verify, header,
                                                      s_hdr, b, N, L, STRAT)
    if page <= 0:
        return
    if (n <= 0) & (b < n_verify):     # a verify row without tokens
        return
    W: gl.constexpr = HV * V + H * K + HV
    OKEY: gl.constexpr = HV * V
    ODEC: gl.constexpr = HV * V + H * K
    ok = gl.arange(0, BK, layout=LK)
    ov = j * BV + gl.arange(0, BV, layout=LV)
    mk = ok < K
    mv = ov < V
    m2 = mv[:, None] & mk[None, :]
    tile = pool + page * s_p + hv * s_h + ov[:, None] * s_v + ok[None, :] * s_k
    h = gl.load(tile, mask=m2, other=0.).to(gl.float32)
    st = stash + page * s_st
    # -- commit the last verify (as paged_kernels._committed) ------------------------------------------
    if STRAT == 0:
        Ga = gl.load(st + (cnt - 1) * W + ODEC + hv, mask=cnt > 0, other=0.)
        h = h * gl.exp(Ga)
        for i in range(0, cnt):
            wi = gl.exp(Ga - gl.load(st + i * W + ODEC + hv))
            ki = gl.load(st + i * W + OKEY + hk * K + ok, mask=mk, other=0.)
            ui = gl.load(st + i * W + hv * V + ov, mask=mv, other=0.)
            h += (wi * ui)[:, None] * ki[None, :]
        write = cnt > 0
    else:
        if STRAT == 1:
            n_ring = length + cnt
        else:
            n_ring = length
        for i in range(0, n_ring):
            gi = gl.load(st + i * W + ODEC + hv)
            ki = gl.load(st + i * W + OKEY + hk * K + ok, mask=mk, other=0.)
            ui = gl.load(st + i * W + hv * V + ov, mask=mv, other=0.)
            h = h * gl.exp(gi) + ui[:, None] * ki[None, :]
        if STRAT == 2:
            keep = gl.where(flush, 0, cnt)
            for i in range(0, cnt):
                gi = gl.load(st + (L + i) * W + ODEC + hv)
                ki = gl.load(st + (L + i) * W + OKEY + hk * K + ok, mask=mk, other=0.)
                ui = gl.load(st + (L + i) * W + hv * V + ov, mask=mv, other=0.)
                h = h * gl.exp(gi) + ui[:, None] * ki[None, :]
                gl.store(st + (length + i) * W + hv * V + ov, ui, mask=mv & (ov * 0 + i < keep))
        write = flush & (length + cnt > 0)
    if write:
        gl.store(tile, h.to(pool.dtype.element_ty), mask=m2)
    if b >= n_verify:     # a commit-only row: done (the probe has the verify rows only)
        return
    if PROBE:
        gl.store(probe + ((b.to(gl.int64) * HV + hv) * K + ok[None, :]) * V + ov[:, None], h, mask=m2)
    # -- verify the new tokens from the committed state -----------------------------------------------
    if STRAT == 0:
        base = new_len * 0
    elif STRAT == 1:
        base = new_len
    else:
        base = new_len * 0 + L
    A = -gl.exp(gl.load(A_log + hv).to(gl.float32))
    dtb = gl.load(dt_bias + hv).to(gl.float32)
    p_q = q + (bos * H + hk) * K + ok
    p_k = k + (bos * H + hk) * K + ok
    p_v = v + (bos * HV + hv) * V + ov
    p_a = a + bos * HV + hv
    p_b = bg + bos * HV + hv
    p_o = out + (bos * HV + hv) * V + ov
    p_u = st + base * W + hv * V + ov
    for _ in range(0, n):
        bq = gl.load(p_q, mask=mk, other=0.).to(gl.float32)
        bk = gl.load(p_k, mask=mk, other=0.).to(gl.float32)
        bv = gl.load(p_v, mask=mv, other=0.).to(gl.float32)
        x = gl.load(p_a).to(gl.float32) + dtb
        gt = A * gl.where(x <= 20., gl.log(1. + gl.exp(x)), x)      # softplus, threshold 20 (vLLM's)
        bt = 1. / (1. + gl.exp(-gl.load(p_b).to(gl.float32)))       # sigmoid
        bq = bq * gl.rsqrt(gl.sum(bq * bq, 0) + 1e-6) * scale
        bk = bk * gl.rsqrt(gl.sum(bk * bk, 0) + 1e-6)
        h = h * gl.exp(gt)
        u = bt * (bv - gl.sum(h * bk[None, :], 1))
        h = h + u[:, None] * bk[None, :]
        gl.store(p_o, gl.sum(h * bq[None, :], 1).to(out.dtype.element_ty), mask=mv)
        gl.store(p_u, u, mask=mv)
        p_q += H * K
        p_k += H * K
        p_v += HV * V
        p_a += HV
        p_b += HV
        p_o += HV * V
        p_u += W
