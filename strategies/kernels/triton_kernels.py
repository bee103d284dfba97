"""The Triton kernels themselves. Imported only through :mod:`strategies.kernels.ops` (needs Triton).

Layouts are the contract's, contiguous: state ``[B, HV, K, V]``, q/k ``[B, N, H, K]``,
v ``[B, N, HV, V]``, g/beta ``[B, N, HV]`` (``treewy_step`` reads its state through a page index
and strides, to work on vLLM's own pages). Grid: ``(B * HV, cdiv(V, BV))``; program
``(b·HV + hv, j)`` owns value columns ``[j·BV, (j+1)·BV)`` of request b's value head hv, which reads
key head ``hv // (HV // H)``. ``BN``/``BK`` are the node and key extents padded to powers of two.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

# Paired reductions (one tl.reduce over two operands, one shared-memory round trip) on the GPU; two
# plain sums in Triton's CPU interpreter, which runs a tuple reduction's combine in Python, 5x slower.
PAIRED = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") != "1")


@triton.jit
def _tile(H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr,
          BV: tl.constexpr, WIDE: tl.constexpr):
    """This program's place in the grid (see the module docstring): ``i_bh = b·HV + hv``, the value
    tile ``i_v``, request b, value head hv, its key head hk, the key and value offsets ok/ov and their
    masks mk/mv. ``WIDE``: 64-bit indices, for offsets past 2^31 elements."""
    i_bh = tl.program_id(0)
    if WIDE:
        i_bh = i_bh.to(tl.int64)
    i_v = tl.program_id(1)
    b = i_bh // HV
    hv = i_bh % HV
    ok = tl.arange(0, BK)
    ov = i_v * BV + tl.arange(0, BV)
    return i_bh, i_v, b, hv, hv // (HV // H), ok, ov, ok < K, ov < V


@triton.jit
def _rebuild_tile(hh, k, u, G, par, e, b, hv, hk, ok, ov, mk, mv, M,
                  H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, CUMSUM: tl.constexpr):
    """``e^{G_e} hh + Σ_{i on path} e^{G_e - G_i} k_i ⊗ u_i`` for one state tile ``hh [BK, BV]``.

    Tokens of request b in k ``[B, M, H, K]``, u ``[B, M, HV, V]``, G ``[B, M, HV]``. ``CUMSUM``: G
    holds per-token log decays and the path is the prefix ``0..e`` (replay's ring), applied as the
    recurrence ``h = e^{g_i} h + k_i ⊗ u_i``; otherwise G is cumulative and the path is e and its
    ancestors, walked up the parents ``par [M]`` (TreeWY's commit). One rank-1 update per path token:
    a state tile and one token in registers, nothing else (no [M, K] tiles, no dots, no spills).
    Off-path tokens are never read; ``e = -1`` leaves hh as it is."""
    if CUMSUM:
        for i in range(e + 1):
            r = b * M + i
            kt = tl.load(k + (r * H + hk) * K + ok, mask=mk, other=0.).to(tl.float32)
            ut = tl.load(u + (r * HV + hv) * V + ov, mask=mv, other=0.).to(tl.float32)
            hh = tl.exp(tl.load(G + r * HV + hv).to(tl.float32)) * hh + kt[:, None] * ut[None, :]
    else:
        if e >= 0:
            Ge = tl.load(G + (b * M + e) * HV + hv).to(tl.float32)
            hh = tl.exp(Ge) * hh
            i = e
            while i >= 0:
                r = b * M + i
                kt = tl.load(k + (r * H + hk) * K + ok, mask=mk, other=0.).to(tl.float32)
                ut = tl.load(u + (r * HV + hv) * V + ov, mask=mv, other=0.).to(tl.float32)
                w = tl.exp(Ge - tl.load(G + r * HV + hv).to(tl.float32))
                hh = hh + (w * kt)[:, None] * ut[None, :]
                i = tl.load(par + i)
    return hh


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
def _add2(a0, b0, a1, b1):
    return a0 + a1, b0 + b1


@triton.jit
def _verify_tile(hh, q, k, v, g, beta, anc, gram, qk, o, vt, Gout, kst, scale, N, b, hv, hk, i_v, ok, ov, mk, mv,
                 H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                 BN: tl.constexpr, BV: tl.constexpr, SOLVE: tl.constexpr):
    """TreeWY's verify of one value tile from the state tile ``hh [BK, BV]`` (float32, in registers):
    the outputs, Ṽ, G and k of every node (see :func:`treewy_verify`).

    One pass over the nodes in preorder (ancestors first), node t:
    ``R_t = β_t (v_t - e^{G_t} hᵀk_t)``, the solve row ``Ṽ_t = R_t - Σ_{i ≺ t} A_ti Ṽ_i`` with
    ``A_ti = β_t e^{G_t - G_i} k_tᵀk_i``, and ``o_t = scale (e^{G_t} hᵀq_t + Σ_{i ⪯ t} e^{G_t - G_i} q_tᵀk_i Ṽ_i)``.
    The Gram rows k_tᵀk_i and q_tᵀk_i come precomputed (``gram``, ``qk`` ``[B, H, N, N]`` float32);
    per node, two paired reductions: ``(hᵀk_t, hᵀq_t)`` over the state tile and the two sums over the
    Ṽ rows ``[BN, BV]`` kept in registers. No dots: Triton's fp32 dots of these shapes spill hundreds
    of registers per thread, and the per-node loop is what an H200 runs fastest here."""
    on = tl.arange(0, BN)
    mn = on < N
    row = b * N + on
    gg = tl.load(g + row * HV + hv, mask=mn, other=0.).to(tl.float32)
    Gv = tl.zeros([BN], dtype=tl.float32)               # cumulative log decays, filled in preorder
    x = tl.zeros([BN, BV], dtype=tl.float32)            # Ṽ of the nodes done so far
    keep_k = (i_v == 0) & (hv % (HV // H) == 0)        # one program per key head writes the k stash
    for t in range(N):
        r = b * N + t
        kt = tl.load(k + (r * H + hk) * K + ok, mask=mk, other=0.)
        qt = tl.load(q + (r * H + hk) * K + ok, mask=mk, other=0.).to(tl.float32)
        if keep_k:
            tl.store(kst + (r * H + hk) * K + ok, kt.to(kst.dtype.element_ty), mask=mk)
        kt = kt.to(tl.float32)
        vv = tl.load(v + (r * HV + hv) * V + ov, mask=mv, other=0.).to(tl.float32)
        bt = tl.load(beta + r * HV + hv).to(tl.float32)
        grow = ((b * H + hk) * N + t) * N + on
        anc_t = (tl.load(anc + t * N + on, mask=mn, other=0) != 0)
        Gt = tl.sum(tl.where(anc_t, gg, 0.), axis=0)
        Gv = tl.where(on == t, Gt, Gv)
        strict = anc_t & (on != t)
        # Zero the exponent off the ancestors first: e^{G_t - G_i} can overflow there.
        dec = tl.where(strict, tl.exp(tl.where(strict, Gt - Gv, 0.)), 0.)
        eG = tl.exp(Gt)
        if PAIRED:
            kh, qh = tl.reduce((hh * kt[:, None], hh * qt[:, None]), 0, _add2)
        else:
            kh, qh = tl.sum(hh * kt[:, None], axis=0), tl.sum(hh * qt[:, None], axis=0)
        R = bt * (vv - eG * kh)
        w_t = dec * tl.load(qk + grow, mask=mn, other=0.)
        if SOLVE == 1:
            a_t = bt * dec * tl.load(gram + grow, mask=mn, other=0.)
            if PAIRED:
                ax, wx = tl.reduce((a_t[:, None] * x, w_t[:, None] * x), 0, _add2)
            else:
                ax, wx = tl.sum(a_t[:, None] * x, axis=0), tl.sum(w_t[:, None] * x, axis=0)
            xt = R - ax
        else:
            xt = R
            wx = tl.sum(w_t[:, None] * x, axis=0)
        qk_tt = tl.load(qk + ((b * H + hk) * N + t) * N + t)
        ot = scale * (eG * qh + wx + qk_tt * xt)
        x = tl.where(on[:, None] == t, xt[None, :], x)
        tl.store(o + (r * HV + hv) * V + ov, ot, mask=mv)
        tl.store(vt + (r * HV + hv) * V + ov, xt, mask=mv)
    if i_v == 0:
        tl.store(Gout + row * HV + hv, Gv, mask=mn)


@triton.jit
def treewy_verify(h0, q, k, v, g, beta, anc, gram, qk, o, vt, Gout, kst, scale, N,
                  H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                  BN: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, SOLVE: tl.constexpr):
    """Outputs and pseudo-values of every node from ``h0`` (read once, never written).

    anc ``[N, N]`` int8: inclusive ancestor mask (``anc[t, i]``: i is on t's path); gram and qk
    ``[B, H, N, N]`` float32: ``k_tᵀk_i`` and ``q_tᵀk_i`` per key head (see ``ops.grams``). Writes o and
    vt (``Ṽ``) ``[B, N, HV, V]`` float32, Gout ``[B, N, HV]`` float32 (cumulative log decay), and
    kst ``[B, N, H, K]`` (the keys, kept for commit; written by one program per key head).
    ``SOLVE``: 1 forward substitution, 0 none (``Ṽ = R``: the benchmark's measure of the solve's cost).
    """
    i_bh, i_v, b, hv, hk, ok, ov, mk, mv = _tile(H, HV, K, V, BK, BV, False)
    hh = tl.load(h0 + (i_bh * K + ok[:, None]) * V + ov[None, :],
                 mask=mk[:, None] & mv[None, :], other=0.).to(tl.float32)
    _verify_tile(hh, q, k, v, g, beta, anc, gram, qk, o, vt, Gout, kst, scale, N, b, hv, hk, i_v, ok, ov, mk, mv,
                 H, HV, K, V, BN, BV, SOLVE)


@triton.jit
def treewy_step(h, pages, s_p, s_h, s_k, s_v, pk, pvt, pG, ppar, acc, Np, q, k, v, g, beta, anc, gram, qk, o, vt, Gout,
                kst, scale, N, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                BN: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, SOLVE: tl.constexpr):
    """One engine step fused: commit the previous verify, then verify the new draft from the result.

    Request b's state is ``h[pages[b]]``, element (hv, k, v) at ``hv·s_h + k·s_k + v·s_v`` from the
    page (strides in elements: vLLM's pages are V-major, read here as [HV, K, V] without a copy).
    Reads h0 once and writes ``h_a`` over it once (rows with ``acc[b] = -1`` are left as they are): two
    states' worth of bytes per request and layer, plus the stashes. The previous stash pk
    ``[B, Np, H, K]``, pvt ``[B, Np, HV, V]``, pG ``[B, Np, HV]`` with the previous tree's parents ppar
    ``[Np]``; the new one goes to kst/vt/Gout, which must not alias it (other programs still read it).
    """
    i_bh, i_v, b, hv, hk, ok, ov, mk, mv = _tile(H, HV, K, V, BK, BV, False)
    m2 = mk[:, None] & mv[None, :]
    page = tl.load(pages + b).to(tl.int64)
    tile = page * s_p + hv * s_h + ok[:, None] * s_k + ov[None, :] * s_v
    hh = tl.load(h + tile, mask=m2, other=0.).to(tl.float32)
    # -- commit: h_a = e^{G_a} h0 + Σ_{i ⪯ a} e^{G_a - G_i} k_i ⊗ ṽ_i over the previous tree --------
    a = tl.load(acc + b)
    hh = _rebuild_tile(hh, pk, pvt, pG, ppar, a, b, hv, hk, ok, ov, mk, mv, Np, H, HV, K, V, False)
    tl.store(h + tile, hh.to(h.dtype.element_ty), mask=m2 & ((ok * 0 + a) >= 0)[:, None])
    # -- verify the new draft from h_a ----------------------------------------------------------------
    _verify_tile(hh, q, k, v, g, beta, anc, gram, qk, o, vt, Gout, kst, scale, N, b, hv, hk, i_v, ok, ov, mk, mv,
                 H, HV, K, V, BN, BV, SOLVE)


@triton.jit
def rebuild(h0, out, k, u, G, par, end, M,
            H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
            BK: tl.constexpr, BV: tl.constexpr,
            CUMSUM: tl.constexpr, STORE_ALL: tl.constexpr):
    """``out = e^{G_e} h0 + Σ_{i on path} e^{G_e - G_i} k_i ⊗ u_i`` per request (TreeWY's commit,
    the deferred flush). ``out`` may be ``h0`` (in place).

    k ``[B, M, H, K]``, u ``[B, M, HV, V]``, G ``[B, M, HV]``: cumulative log decays with the tree's
    parents par ``[M]`` int32 (the path: end and its ancestors), or with ``CUMSUM`` per-token ones
    over the prefix ``0..end`` (par unused). end ``[B]`` int32: the path's last index, -1 = nothing
    (out = h0; with ``STORE_ALL=False`` such rows are not written at all, nor are their k and u read).
    """
    i_bh, i_v, b, hv, hk, ok, ov, mk, mv = _tile(H, HV, K, V, BK, BV, False)
    e = tl.load(end + b)
    # Scalar conditions enter masks as vectors (Triton's interpreter rejects bool-tensor & bool-scalar).
    has_k = (ok * 0 + e) >= 0
    m2 = mk[:, None] & mv[None, :]
    if not STORE_ALL:
        m2 = m2 & has_k[:, None]
    tile = (i_bh * K + ok[:, None]) * V + ov[None, :]
    hh = tl.load(h0 + tile, mask=m2, other=0.).to(tl.float32)
    hn = _rebuild_tile(hh, k, u, G, par, e, b, hv, hk, ok, ov, mk, mv, M, H, HV, K, V, CUMSUM)
    tl.store(out + tile, hn.to(out.dtype.element_ty), mask=m2)


@triton.jit
def store_all_verify(base, states, slot, S_src, dst, skip, S_dst, q, k, v, g, beta, par, o, scale, N,
                     H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                     BK: tl.constexpr, BV: tl.constexpr, IS_CHAIN: tl.constexpr, WRITE_BASE: tl.constexpr,
                     STORE: tl.constexpr, keep=None, ust=None, SELECT: tl.constexpr = False):
    """vLLM's store_all, node by node (``fork: node``): a state snapshot per node, each from its parent's.

    The committed state is ``states[b, slot[b]]`` (``base[b]`` where slot < 0), both
    ``[B, S_src, HV, K, V]``/``[B, HV, K, V]``. Node t's state goes to ``dst[b, t + (t >= skip[b])]``
    (``[B, S_dst, HV, K, V]``): writing in place skips the committed state's own slot, so it
    survives a step that accepts nothing. ``WRITE_BASE`` also copies it to slot ``N`` (a fresh dst).
    A chain keeps the running state in registers; a tree reads each parent's snapshot back, so one
    program walks all N nodes of its tile in turn. ``STORE=False`` writes no snapshot (wrong states:
    the benchmark's measure of what the forks cost). ``SELECT`` (store_selective): node t's snapshot only
    where ``keep [B, N]`` (int8) is set, its pseudo-value u to ``ust [B, N, HV, V]`` (fp32) where not.
    """
    # 64-bit: snapshot offsets pass 2^31 elements (256 requests x 65 slots)
    i_bh, i_v, b, hv, hk, ok, ov, mk, mv = _tile(H, HV, K, V, BK, BV, True)
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
        if STORE:
            ts = t + (t >= sk).to(tl.int32)
            m_st = m2
            if SELECT:
                kp = tl.load(keep + r)
                m_st = m2 & ((ok * 0 + kp) != 0)[:, None]
                tl.store(ust + (r * HV + hv) * V + ov, u, mask=mv & ((ov * 0 + kp) == 0))
            tl.store(dst + ((b * S_dst + ts) * HV + hv) * K * V + tile, h.to(dst.dtype.element_ty), mask=m_st)
        tl.store(o + (r * HV + hv) * V + ov, ot, mask=mv)
        if not IS_CHAIN:
            tl.debug_barrier()   # the next node may read this snapshot back


@triton.jit
def store_all_level(base, states, slot, S_src, dst, skip, S_dst, q, k, v, g, beta, par, nodes, o, scale, N,
                    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                    BK: tl.constexpr, BV: tl.constexpr, WRITE_BASE: tl.constexpr, STORE: tl.constexpr):
    """store_all's verify of one tree depth (``fork: depth``): every node of the depth at once, each from its
    parent's snapshot (written by the previous depth's launch) or, at depth 0, from the committed state.

    Grid ``(B·HV, cdiv(V, BV), len(nodes))``: program ``(·, ·, j)`` runs node ``nodes[j]``, one token of the
    recurrence on one state tile; one launch per depth, so the depths are ordered by the launches and no
    program waits on another. Slots, ``skip`` and ``WRITE_BASE`` (done by the depth's first node) as in
    :func:`store_all_verify`; ``STORE=False`` writes no snapshot (timing only)."""
    i_bh, i_v, b, hv, hk, ok, ov, mk, mv = _tile(H, HV, K, V, BK, BV, True)
    t = tl.load(nodes + tl.program_id(2))
    m2 = mk[:, None] & mv[None, :]
    tile = ok[:, None] * V + ov[None, :]
    sk = tl.load(skip + b)
    p = tl.load(par + t)
    if p >= 0:
        ps = p + (p >= sk).to(tl.int32)
        h = tl.load(dst + ((b * S_dst + ps) * HV + hv) * K * V + tile, mask=m2, other=0.).to(tl.float32)
    else:
        sl = tl.load(slot + b)
        src = tl.where(sl >= 0, states + ((b * S_src + sl) * HV + hv) * K * V, base + i_bh * K * V)
        h = tl.load(src + tile, mask=m2, other=0.).to(tl.float32)
        if WRITE_BASE:
            if tl.program_id(2) == 0:
                tl.store(dst + ((b * S_dst + N) * HV + hv) * K * V + tile, h.to(dst.dtype.element_ty), mask=m2)
    r = b * N + t
    h, u, ot = _delta_token(h, q, k, v, g, beta, scale, r, hv, hk, ok, ov, mk, mv, H, HV, K, V)
    if STORE:
        ts = t + (t >= sk).to(tl.int32)
        tl.store(dst + ((b * S_dst + ts) * HV + hv) * K * V + tile, h.to(dst.dtype.element_ty), mask=m2)
    tl.store(o + (r * HV + hv) * V + ov, ot, mask=mv)


@triton.jit
def selective_recover(base, states, slot, S_src, dst, skip, S_dst, start, redo, nredo, R, k, u, g, N,
                      H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                      BK: tl.constexpr, BV: tl.constexpr):
    """store_selective's recovery: request b's accepted node had no checkpoint, so redo the ``nredo[b]`` nodes
    ``redo[b, :nredo[b]]`` (``[B, R]`` int32, parents first) from its nearest checkpointed ancestor's snapshot
    (node ``start[b]``, in dst as :func:`store_all_verify` laid it out) or, with start -1, from the committed
    state (``states[b, slot[b]]`` or ``base[b]``): ``h = e^{g_t} h + k_t ⊗ u_t`` per node, u from the verify's
    ``u [B, N, HV, V]``; the result goes to the accepted (last redone) node's own slot. Rows with nothing to redo
    read and write nothing."""
    i_bh, i_v, b, hv, hk, ok, ov, mk, mv = _tile(H, HV, K, V, BK, BV, True)
    n = tl.load(nredo + b)
    if n > 0:
        m2 = mk[:, None] & mv[None, :]
        tile = ok[:, None] * V + ov[None, :]
        sk = tl.load(skip + b)
        s0 = tl.load(start + b)
        sl = tl.load(slot + b)
        committed = tl.where(sl >= 0, states + ((b * S_src + sl) * HV + hv) * K * V, base + i_bh * K * V)
        ps = s0 + (s0 >= sk).to(tl.int32)
        src = tl.where(s0 >= 0, dst + ((b * S_dst + ps) * HV + hv) * K * V, committed)
        h = tl.load(src + tile, mask=m2, other=0.).to(tl.float32)
        t = s0
        for i in range(n):
            t = tl.load(redo + b * R + i)
            r = b * N + t
            kt = tl.load(k + (r * H + hk) * K + ok, mask=mk, other=0.).to(tl.float32)
            ut = tl.load(u + (r * HV + hv) * V + ov, mask=mv, other=0.)
            h = tl.exp(tl.load(g + r * HV + hv).to(tl.float32)) * h + kt[:, None] * ut[None, :]
        ts = t + (t >= sk).to(tl.int32)
        tl.store(dst + ((b * S_dst + ts) * HV + hv) * K * V + tile, h.to(dst.dtype.element_ty), mask=m2)


@triton.jit
def replay_verify(ckpt, ru, rk, rg, length, L, q, k, v, g, beta, o, ust, scale, N,
                  H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                  BK: tl.constexpr, BV: tl.constexpr):
    """ReplaySSM's verify: rebuild the committed state from the checkpoint and the ring of the
    ``length[b]`` tokens accepted since (never written back), then run the draft chain from it.

    ckpt ``[B, HV, K, V]``; ring ru ``[B, L, HV, V]``, rk ``[B, L, H, K]``, rg ``[B, L, HV]``
    (per-token log decays). Writes o and ust (each node's pseudo-value u) ``[B, N, HV, V]``.
    """
    i_bh, i_v, b, hv, hk, ok, ov, mk, mv = _tile(H, HV, K, V, BK, BV, False)
    m2 = mk[:, None] & mv[None, :]
    n = tl.load(length + b)
    h = tl.load(ckpt + (i_bh * K + ok[:, None]) * V + ov[None, :], mask=m2, other=0.).to(tl.float32)
    h = _rebuild_tile(h, rk, ru, rg, length, n - 1, b, hv, hk, ok, ov, mk, mv, L, H, HV, K, V, True)
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
