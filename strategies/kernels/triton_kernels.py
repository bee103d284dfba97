"""The Triton kernels themselves. Imported only through :mod:`strategies.kernels.ops` (needs Triton).

Layouts are the contract's, contiguous: state ``[B, HV, K, V]``, q/k ``[B, N, H, K]``,
v ``[B, N, HV, V]``, g/beta ``[B, N, HV]`` (``treewy_step`` reads its state through a page index
and strides, to work on vLLM's own pages). Grid: ``(B * HV, cdiv(V, BV))``; program
``(b·HV + hv, j)`` owns value columns ``[j·BV, (j+1)·BV)`` of request b's value head hv, which reads
key head ``hv // (HV // H)``. ``BN``/``BM``/``BK`` are the node, token and key extents padded to
powers of two >= 16 (``tl.dot``'s minimum).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _rebuild_tile(hh, k, u, G, path, e, b, hv, hk, om, ok, ov, mk, mv, M,
                  H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, CUMSUM: tl.constexpr):
    """``e^{G_e} hh + Σ_{i on path} e^{G_e - G_i} k_i ⊗ u_i`` for one state tile ``hh [BK, BV]``.

    Tokens ``om`` of request b in k ``[B, M, H, K]``, u ``[B, M, HV, V]``, G ``[B, M, HV]`` (cumulative
    log decays, or per-token ones summed here along a prefix path when ``CUMSUM``); e: the path's end.
    Off-path tokens are never read."""
    gl = tl.load(G + (b * M + om) * HV + hv, mask=path, other=0.).to(tl.float32)
    if CUMSUM:
        gl = tl.cumsum(gl, axis=0)
    Ge = tl.sum(tl.where(om == e, gl, 0.), axis=0)
    w = tl.where(path, tl.exp(Ge - tl.where(path, gl, 0.)), 0.)
    kk = tl.load(k + ((b * M + om[:, None]) * H + hk) * K + ok[None, :],
                 mask=path[:, None] & mk[None, :], other=0.).to(tl.float32)
    uu = tl.load(u + ((b * M + om[:, None]) * HV + hv) * V + ov[None, :],
                 mask=path[:, None] & mv[None, :], other=0.).to(tl.float32)
    return tl.exp(Ge) * hh + tl.dot(tl.trans(kk * w[:, None]), uu, input_precision="ieee")


@triton.jit
def _delta_token(h, q, k, v, g, beta, scale, r, hv, hk, ok, ov, mk, mv,
                 H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr):
    """One token of the gated delta rule on a state tile ``h [BK, BV]`` (token row ``r = b·N + t``):
    returns ``(h_t, u_t, o_t)`` with ``h_t = a h + k ⊗ u_t``, ``u_t = β (v − a hᵀk)``, ``o_t = scale h_tᵀq``."""
    kt = tl.load(k + (r * H + hk) * K + ok, mask=mk, other=0.).to(tl.float32)
    qt = tl.load(q + (r * H + hk) * K + ok, mask=mk, other=0.).to(tl.float32)
    vt = tl.load(v + (r * HV + hv) * V + ov, mask=mv, other=0.).to(tl.float32)
    gt = tl.load(g + r * HV + hv).to(tl.float32)
    bt = tl.load(beta + r * HV + hv).to(tl.float32)
    h = tl.exp(gt) * h
    u = bt * (vt - tl.sum(h * kt[:, None], axis=0))
    h = h + kt[:, None] * u[None, :]
    return h, u, scale * tl.sum(h * qt[:, None], axis=0)


@triton.jit
def _verify_tile(hh, q, k, v, g, beta, anc, o, vt, Gout, kst, scale, N, b, hv, hk, i_v, ok, ov, mk, mv,
                 H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                 BN: tl.constexpr, BV: tl.constexpr, SOLVE: tl.constexpr, LOG2BN: tl.constexpr):
    """TreeWY's verify of one value tile from the state tile ``hh [BK, BV]`` (float32, in registers):
    the outputs, Ṽ, G and k of every node (see :func:`treewy_verify`)."""
    on = tl.arange(0, BN)
    mn = on < N
    row = b * N + on
    ancm = tl.load(anc + on[:, None] * N + on[None, :], mask=mn[:, None] & mn[None, :], other=0) != 0
    strict = ancm & (on[:, None] != on[None, :])
    mnk = mn[:, None] & mk[None, :]
    mnv = mn[:, None] & mv[None, :]
    kk = tl.load(k + (row[:, None] * H + hk) * K + ok[None, :], mask=mnk, other=0.).to(tl.float32)
    qq = tl.load(q + (row[:, None] * H + hk) * K + ok[None, :], mask=mnk, other=0.).to(tl.float32)
    vv = tl.load(v + (row[:, None] * HV + hv) * V + ov[None, :], mask=mnv, other=0.).to(tl.float32)
    gg = tl.load(g + row * HV + hv, mask=mn, other=0.).to(tl.float32)
    bb = tl.load(beta + row * HV + hv, mask=mn, other=0.).to(tl.float32)

    G = tl.sum(tl.where(ancm, gg[None, :], 0.), axis=1)                 # [BN] cumulative log decay
    # Zero the exponent off the ancestor pattern first: e^{G_t - G_i} can overflow there.
    dec = tl.where(ancm, tl.exp(tl.where(ancm, G[:, None] - G[None, :], 0.)), 0.)
    gram = tl.dot(kk, tl.trans(kk), input_precision="ieee")
    A = bb[:, None] * tl.where(strict, dec, 0.) * gram                  # strictly lower triangular
    eG = tl.exp(G)
    R = bb[:, None] * (vv - eG[:, None] * tl.dot(kk, hh, input_precision="ieee"))
    if SOLVE == 1:
        # Forward substitution (I + A) Ṽ = R, one node per iteration: preorder puts ancestors first.
        x = tl.zeros([BN, BV], dtype=tl.float32)
        for t in range(N):
            sel = on[:, None] == t
            a_t = tl.sum(tl.where(sel, A, 0.), axis=0)                  # row t of A, over i
            r_t = tl.sum(tl.where(sel, R, 0.), axis=0)
            x = tl.where(sel, (r_t - tl.sum(a_t[:, None] * x, axis=0))[None, :], x)
    elif SOLVE == 2:
        # Doubling: A is nilpotent (A^BN = 0), so (I + A)^-1 = (I - A)(I + A^2)(I + A^4)...: log2(BN)
        # levels of two [BN, BN] products instead of N dependent steps; then one product with R.
        P = -A
        T = tl.where(on[:, None] == on[None, :], 1., 0.) + P
        for _ in tl.static_range(LOG2BN - 1):
            P = tl.dot(P, P, input_precision="ieee")
            T = T + tl.dot(T, P, input_precision="ieee")
        x = tl.dot(T, R, input_precision="ieee")
    else:
        x = R
    W = dec * tl.dot(qq, tl.trans(kk), input_precision="ieee")
    out = scale * (eG[:, None] * tl.dot(qq, hh, input_precision="ieee") + tl.dot(W, x, input_precision="ieee"))
    tl.store(o + (row[:, None] * HV + hv) * V + ov[None, :], out, mask=mnv)
    tl.store(vt + (row[:, None] * HV + hv) * V + ov[None, :], x, mask=mnv)
    if i_v == 0:
        tl.store(Gout + row * HV + hv, G, mask=mn)
        if hv % (HV // H) == 0:
            tl.store(kst + (row[:, None] * H + hk) * K + ok[None, :], kk.to(kst.dtype.element_ty), mask=mnk)


@triton.jit
def treewy_verify(h0, q, k, v, g, beta, anc, o, vt, Gout, kst, scale, N,
                  H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                  BN: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, SOLVE: tl.constexpr,
                  LOG2BN: tl.constexpr):
    """Outputs and pseudo-values of every node from ``h0`` (read once, never written).

    anc ``[N, N]`` int8: inclusive ancestor mask (``anc[t, i]``: i is on t's path). Writes o and
    vt (``Ṽ``) ``[B, N, HV, V]`` float32, Gout ``[B, N, HV]`` float32 (cumulative log decay), and
    kst ``[B, N, H, K]`` (the keys, kept for commit; written by one program per key head).
    ``SOLVE``: 1 forward substitution, 2 doubling (log-depth products), 0 none (``Ṽ = R``: the
    benchmark's measure of the solve's cost). ``LOG2BN = log2(BN)``.
    """
    i_bh = tl.program_id(0)
    i_v = tl.program_id(1)
    b = i_bh // HV
    hv = i_bh % HV
    hk = hv // (HV // H)
    ok = tl.arange(0, BK)
    ov = i_v * BV + tl.arange(0, BV)
    mk = ok < K
    mv = ov < V
    hh = tl.load(h0 + (i_bh * K + ok[:, None]) * V + ov[None, :],
                 mask=mk[:, None] & mv[None, :], other=0.).to(tl.float32)
    _verify_tile(hh, q, k, v, g, beta, anc, o, vt, Gout, kst, scale, N, b, hv, hk, i_v, ok, ov, mk, mv,
                 H, HV, K, V, BN, BV, SOLVE, LOG2BN)


@triton.jit
def treewy_step(h, pages, s_p, s_h, s_k, s_v, pk, pvt, pG, panc, acc, Np, q, k, v, g, beta, anc, o, vt, Gout,
                kst, scale, N, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                BNP: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, SOLVE: tl.constexpr,
                LOG2BN: tl.constexpr):
    """One engine step fused: commit the previous verify, then verify the new draft from the result.

    Request b's state is ``h[pages[b]]``, element (hv, k, v) at ``hv·s_h + k·s_k + v·s_v`` from the
    page (strides in elements: vLLM's pages are V-major, read here as [HV, K, V] without a copy).
    Reads h0 once and writes ``h_a`` over it once (rows with ``acc[b] = -1`` are left as they are): two
    states' worth of bytes per request and layer, plus the stashes. The previous stash pk
    ``[B, Np, H, K]``, pvt ``[B, Np, HV, V]``, pG ``[B, Np, HV]`` with inclusive ancestor mask panc
    ``[Np, Np]``; the new one goes to kst/vt/Gout, which must not alias it (other programs still read it).
    """
    i_bh = tl.program_id(0)
    i_v = tl.program_id(1)
    b = i_bh // HV
    hv = i_bh % HV
    hk = hv // (HV // H)
    ok = tl.arange(0, BK)
    ov = i_v * BV + tl.arange(0, BV)
    mk = ok < K
    mv = ov < V
    m2 = mk[:, None] & mv[None, :]
    page = tl.load(pages + b).to(tl.int64)
    tile = page * s_p + hv * s_h + ok[:, None] * s_k + ov[None, :] * s_v
    hh = tl.load(h + tile, mask=m2, other=0.).to(tl.float32)
    # -- commit: h_a = e^{G_a} h0 + Σ_{i ⪯ a} e^{G_a - G_i} k_i ⊗ ṽ_i over the previous tree --------
    op = tl.arange(0, BNP)
    a = tl.load(acc + b)
    path = (tl.load(panc + a * Np + op, mask=(op < Np) & ((op * 0 + a) >= 0), other=0) != 0)
    hh = _rebuild_tile(hh, pk, pvt, pG, path, a, b, hv, hk, op, ok, ov, mk, mv, Np, H, HV, K, V, False)
    tl.store(h + tile, hh.to(h.dtype.element_ty), mask=m2 & ((ok * 0 + a) >= 0)[:, None])
    # -- verify the new draft from h_a ----------------------------------------------------------------
    _verify_tile(hh, q, k, v, g, beta, anc, o, vt, Gout, kst, scale, N, b, hv, hk, i_v, ok, ov, mk, mv,
                 H, HV, K, V, BN, BV, SOLVE, LOG2BN)


@triton.jit
def rebuild(h0, out, k, u, G, onpath, end, M,
            H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
            BM: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
            CUMSUM: tl.constexpr, STORE_ALL: tl.constexpr):
    """``out = e^{G_e} h0 + Σ_{i on path} e^{G_e - G_i} k_i ⊗ u_i`` per request (TreeWY's commit,
    the deferred flush). ``out`` may be ``h0`` (in place).

    k ``[B, M, H, K]``, u ``[B, M, HV, V]``, G ``[B, M, HV]``: cumulative log decays, or per-token
    ones summed here along the path when ``CUMSUM`` (the path is then a prefix). onpath ``[B, M]``
    int8, end ``[B]`` int32: the path's last index, -1 = nothing (out = h0; with ``STORE_ALL=False``
    such rows are not written at all, nor are their k and u read).
    """
    i_bh = tl.program_id(0)
    i_v = tl.program_id(1)
    b = i_bh // HV
    hv = i_bh % HV
    hk = hv // (HV // H)
    om = tl.arange(0, BM)
    ok = tl.arange(0, BK)
    ov = i_v * BV + tl.arange(0, BV)
    mk = ok < K
    mv = ov < V
    e = tl.load(end + b)
    # Scalar conditions enter masks as vectors (Triton's interpreter rejects bool-tensor & bool-scalar).
    has_k = (ok * 0 + e) >= 0
    path = (tl.load(onpath + b * M + om, mask=om < M, other=0) != 0) & ((om * 0 + e) >= 0)
    m2 = mk[:, None] & mv[None, :]
    if not STORE_ALL:
        m2 = m2 & has_k[:, None]
    tile = (i_bh * K + ok[:, None]) * V + ov[None, :]
    hh = tl.load(h0 + tile, mask=m2, other=0.).to(tl.float32)
    hn = _rebuild_tile(hh, k, u, G, path, e, b, hv, hk, om, ok, ov, mk, mv, M, H, HV, K, V, CUMSUM)
    tl.store(out + tile, hn.to(out.dtype.element_ty), mask=m2)


@triton.jit
def store_all_verify(base, states, slot, S_src, dst, skip, S_dst, q, k, v, g, beta, par, o, scale, N,
                     H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                     BK: tl.constexpr, BV: tl.constexpr, IS_CHAIN: tl.constexpr, WRITE_BASE: tl.constexpr):
    """vLLM's store_all: a state snapshot per node, each from its parent's.

    The committed state is ``states[b, slot[b]]`` (``base[b]`` where slot < 0), both
    ``[B, S_src, HV, K, V]``/``[B, HV, K, V]``. Node t's state goes to ``dst[b, t + (t >= skip[b])]``
    (``[B, S_dst, HV, K, V]``): writing in place skips the committed state's own slot, so it
    survives a step that accepts nothing. ``WRITE_BASE`` also copies it to slot ``N`` (a fresh dst).
    A chain keeps the running state in registers; a tree reads each parent's snapshot back.
    """
    i_bh = tl.program_id(0).to(tl.int64)   # snapshot offsets pass 2^31 elements (256 requests x 65 slots)
    i_v = tl.program_id(1)
    b = i_bh // HV
    hv = i_bh % HV
    hk = hv // (HV // H)
    ok = tl.arange(0, BK)
    ov = i_v * BV + tl.arange(0, BV)
    mk = ok < K
    mv = ov < V
    m2 = mk[:, None] & mv[None, :]
    tile = ok[:, None] * V + ov[None, :]
    sl = tl.load(slot + b)
    src = tl.where(sl >= 0, states + ((b * S_src + sl) * HV + hv) * K * V, base + i_bh * K * V)
    h0 = tl.load(src + tile, mask=m2, other=0.).to(tl.float32)
    sk = tl.load(skip + b)
    if WRITE_BASE:
        tl.store(dst + ((b * S_dst + N) * HV + hv) * K * V + tile, h0.to(dst.dtype.element_ty), mask=m2)
    h = h0
    for t in range(N):
        if not IS_CHAIN:
            p = tl.load(par + t)
            ps = p + (p >= sk).to(tl.int32)
            hp = tl.load(dst + ((b * S_dst + ps) * HV + hv) * K * V + tile, mask=m2 & ((ok * 0 + p) >= 0)[:, None],
                         other=0.)
            h = tl.where(p >= 0, hp.to(tl.float32), h0)
        r = b * N + t
        h, u, ot = _delta_token(h, q, k, v, g, beta, scale, r, hv, hk, ok, ov, mk, mv, H, HV, K, V)
        ts = t + (t >= sk).to(tl.int32)
        tl.store(dst + ((b * S_dst + ts) * HV + hv) * K * V + tile, h.to(dst.dtype.element_ty), mask=m2)
        tl.store(o + (r * HV + hv) * V + ov, ot, mask=mv)
        if not IS_CHAIN:
            tl.debug_barrier()   # the next node may read this snapshot back


@triton.jit
def replay_verify(ckpt, ru, rk, rg, length, L, q, k, v, g, beta, o, ust, scale, N,
                  H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                  BL: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    """ReplaySSM's verify: rebuild the committed state from the checkpoint and the ring of the
    ``length[b]`` tokens accepted since (never written back), then run the draft chain from it.

    ckpt ``[B, HV, K, V]``; ring ru ``[B, L, HV, V]``, rk ``[B, L, H, K]``, rg ``[B, L, HV]``
    (per-token log decays). Writes o and ust (each node's pseudo-value u) ``[B, N, HV, V]``.
    """
    i_bh = tl.program_id(0)
    i_v = tl.program_id(1)
    b = i_bh // HV
    hv = i_bh % HV
    hk = hv // (HV // H)
    ol = tl.arange(0, BL)
    ok = tl.arange(0, BK)
    ov = i_v * BV + tl.arange(0, BV)
    mk = ok < K
    mv = ov < V
    m2 = mk[:, None] & mv[None, :]
    n = tl.load(length + b)
    h = tl.load(ckpt + (i_bh * K + ok[:, None]) * V + ov[None, :], mask=m2, other=0.).to(tl.float32)
    h = _rebuild_tile(h, rk, ru, rg, ol < n, n - 1, b, hv, hk, ol, ok, ov, mk, mv, L, H, HV, K, V, True)
    for t in range(N):
        r = b * N + t
        h, u, ot = _delta_token(h, q, k, v, g, beta, scale, r, hv, hk, ok, ov, mk, mv, H, HV, K, V)
        tl.store(ust + (r * HV + hv) * V + ov, u, mask=mv)
        tl.store(o + (r * HV + hv) * V + ov, ot, mask=mv)


def next_pow2(n: int, lo: int = 16) -> int:
    return max(lo, triton.next_power_of_2(int(n)))


@triton.jit
def stream_copy(src, dst, n, BLOCK: tl.constexpr):
    """``dst[:n] = src[:n]``: the roofline the benchmark divides by, next to torch's own copy."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(dst + offs, tl.load(src + offs, mask=m), mask=m)
