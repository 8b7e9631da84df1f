"""The Triton kernels of MonarchAttention (forward and backward). Launched by strata.gpu.monarch.

This file is loaded twice (strata.gpu.monarch): once as is (compiled kernels, CUDA tensors) and
once with Triton's interpreter switched on (the same source run through numpy, CPU tensors, for the
tests). It holds kernels and their @triton.jit helpers only.

Notation (include/strata/monarch.h, docs/methods.md): per (batch, query head) ``bh``, P = M*B
padded positions p = k*B + j (block k, offset j); token n = p - front. sc = scale.
Per step t the R-step of block k turns the rows abar[k*B + j] into R_k[j, :] = softmax over the
block's keys of sc * abar . k_i, and al[j, k] = sc sum_i R k_i, cl[j, k] = sum_i R log R,
y[j, k] = sum_i R v_i (last step). The L-step of offset j turns the queries q[l*B + j] into
L_j[l, :] = softmax over blocks k of q_l . al[j, k] - cl[j, k], then either the output
O[l*B + j] = sum_k L y[j, k] (last step) or the next step's rows abar[k*B + j] = sum_l w_l L q_l / c_k.
An R-step reads only rows of one block and an L-step only one offset, so each kernel below is one
program per block (row chunk) or per offset; what passes between them lives in device memory as the
algorithm's O(N D) state (al, cl, y, abar and a few per-row statistics), never an N x N, B x B or
M x M matrix: those tiles exist only in registers / shared memory.

Scratch layouts (float32, contiguous; bh = b * Hq + h):
    al, dal      [BH, B, M, D]     row (j, k) at (bh * B + j) * M + k
    y, dy        [BH, B, M, Dv]    (y in the input dtype with 16-bit products: only rounded reads)
    cl, lse_r, sumr, dcl, rowdot, ls, rr, gk, ek   [BH, B, M]
    abar (state) any strides (b, h, p, d): one slab of batch x heads_q x (T-1) x P x D
    dabar, dq    [BH, P, D];  dk [B*Hkv, P, D], dv [B*Hkv, P, Dv]
    w            [batch, P]  1.0 for a real unmasked token, 0.0 for padding or key_padding_mask == 0
    blk          [batch, M]  1.0 where block k has a valid key
Products (constexpr LP: 16-bit inputs with 16-bit products, fp32 accumulation): an input (q, k,
v, dO, and y, stored in the input dtype) enters exactly; probabilities and their gradients (R, L,
ds, du: what FlashAttention rounds as P and dS) are rounded to DT once; every other fp32
intermediate (abar, al, dal, dabar, dy; and R, w L where they feed a logit) enters as two DT parts
hi + lo (~2^-17 relative: the CPU kernel's rule for the operands that feed a logit, strata/monarch.h;
rounding them too doubled the gradients' error in fp16, 4.5e-4 -> 2.7e-4 with all split).
Not LP (float32 inputs, or compute="fp32"): every product in fp32 with input_precision="ieee".
"""

import triton
import triton.language as tl

EPS = tl.constexpr(1e-12)  # ma_torch.py's eps (reference mode)
NEG_BIG = tl.constexpr(-1e30)  # the running max's start: finite, so exp(m - m_new) never sees inf - inf


# ---- products ---------------------------------------------------------------------------------
@triton.jit
def _mm(a, b, LP: tl.constexpr, DT: tl.constexpr):
    """a @ b, fp32 accumulation; LP: both operands rounded to DT once (gradient products)."""
    if LP:
        return tl.dot(a.to(DT), b.to(DT))
    else:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")


@triton.jit
def _mm_sa(a, b, LP: tl.constexpr, DT: tl.constexpr):
    """a @ b with a fp32 split into hi + lo parts of DT (b exact in DT): ~2^-17 relative in a."""
    if LP:
        ah = a.to(DT)
        alo = (a - ah.to(tl.float32)).to(DT)
        bb = b.to(DT)
        return tl.dot(ah, bb) + tl.dot(alo, bb)
    else:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")


@triton.jit
def _mm_sb(a, b, LP: tl.constexpr, DT: tl.constexpr):
    """a @ b with b fp32 split into hi + lo parts of DT (a exact in DT)."""
    if LP:
        bh = b.to(DT)
        blo = (b - bh.to(tl.float32)).to(DT)
        aa = a.to(DT)
        return tl.dot(aa, bh) + tl.dot(aa, blo)
    else:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")


@triton.jit
def _inv0(x):
    """1/x where x > 0, else 0 (the where's other side never divides by zero: quiet interpreter)."""
    return tl.where(x > 0, 1.0 / tl.where(x > 0, x, 1.0), 0.0)


# ---- loads shared by the kernels ---------------------------------------------------------------
@triton.jit
def _load_a(q, abar, w, b, h, prow, rowok, N, front, D, q_sb, q_sn, q_sh, q_sd, a_sb, a_sh, a_sp, a_sd, w_sb,
            FIRST: tl.constexpr, STABLE: tl.constexpr, DP: tl.constexpr):
    """The R-step input rows at positions prow (RC): step 1 reads q (stable: valid queries only, c = w),
    later steps the saved abar slab (fp32). Returns RC x DP (q's dtype at step 1, else fp32)."""
    d = tl.arange(0, DP)
    dmask = d < D
    if FIRST:
        n = prow - front
        ok = rowok & (n >= 0) & (n < N)
        if STABLE:
            wr = tl.load(w + b * w_sb + prow, mask=rowok, other=0.0)
            ok = ok & (wr > 0)
        ptr = q + b * q_sb + h * q_sh + n.to(tl.int64)[:, None] * q_sn + d[None, :] * q_sd
        return tl.load(ptr, mask=ok[:, None] & dmask[None, :], other=0.0)
    else:
        ptr = abar + b * a_sb + h * a_sh + prow.to(tl.int64)[:, None] * a_sp + d[None, :] * a_sd
        return tl.load(ptr, mask=rowok[:, None] & dmask[None, :], other=0.0)


@triton.jit
def _load_tok(x, b, h, pos, ok, N, front, C, s_b, s_n, s_h, s_d, CP: tl.constexpr):
    """Rows of an input tensor (b, n, h, :C) at padded positions pos (0 outside the sequence)."""
    c = tl.arange(0, CP)
    n = pos - front
    ok = ok & (n >= 0) & (n < N)
    ptr = x + b * s_b + h * s_h + n.to(tl.int64)[:, None] * s_n + c[None, :] * s_d
    return tl.load(ptr, mask=ok[:, None] & (c[None, :] < C), other=0.0)


@triton.jit
def _r_scores(A, Kt, kval, sc, FIRST: tl.constexpr, LP: tl.constexpr, DT: tl.constexpr):
    """S = sc * A K^T (rows x keys), -inf at invalid keys. Step 1's A is q (exact in DT); later
    steps' A is fp32 abar and enters as hi + lo."""
    if FIRST:
        S = _mm(A, tl.trans(Kt), LP, DT)
    else:
        S = _mm_sa(A, tl.trans(Kt), LP, DT)
    S = S * sc
    return tl.where(kval[None, :], S, float("-inf"))


# ---- forward R-step ----------------------------------------------------------------------------
@triton.jit
def rstep_fwd_kernel(
    q, k, v, w, abar,            # q: batch x N x Hq x D (any strides), k: .. Hkv x D, v: .. Hkv x Dv; w: batch x P
    al, cl, y, lse, sumr,        # out: al [BH, B, M, D], cl [BH, B, M], y [BH, B, M, Dv], lse / sumr [BH, B, M]
    q_sb, q_sn, q_sh, q_sd, k_sb, k_sn, k_sh, k_sd, v_sb, v_sn, v_sh, v_sd,
    a_sb, a_sh, a_sp, a_sd, w_sb,
    N, Hq, G, B, M, front, D, Dv, sc,
    FIRST: tl.constexpr, LAST: tl.constexpr, STATS: tl.constexpr, STABLE: tl.constexpr,
    LP: tl.constexpr, DT: tl.constexpr, RC: tl.constexpr, KC: tl.constexpr, DP: tl.constexpr, DVP: tl.constexpr,
):
    """One program: block kb, rows j in [rc*RC, rc*RC + RC) of one (batch, query head); the block's
    keys in chunks of KC with an online softmax (any B). Writes al, cl (and y at the last step;
    the backward's recompute also lse (R = exp(S - lse)) and sum_i R)."""
    pid = tl.program_id(0)
    bh = tl.program_id(1)
    nrc = tl.cdiv(B, RC)
    kb = pid // nrc
    rc = pid % nrc
    b = (bh // Hq).to(tl.int64)
    h = bh % Hq
    hk = (h // G).to(tl.int64)
    h = h.to(tl.int64)
    j = rc * RC + tl.arange(0, RC)
    rowok = j < B
    prow = kb * B + j
    A = _load_a(q, abar, w, b, h, prow, rowok, N, front, D, q_sb, q_sn, q_sh, q_sd, a_sb, a_sh, a_sp, a_sd, w_sb,
                FIRST, STABLE, DP)
    m = tl.full([RC], NEG_BIG, tl.float32)
    Z = tl.zeros([RC], tl.float32)
    W = tl.zeros([RC], tl.float32)  # sum_i e^(s_i - m) (s_i - m): R log R's running numerator
    acc_al = tl.zeros([RC, DP], tl.float32)
    acc_y = tl.zeros([RC, DVP], tl.float32)
    for kc in range(0, B, KC):
        i = kc + tl.arange(0, KC)
        pk = kb * B + i
        kin = i < B
        kval = tl.load(w + b * w_sb + pk, mask=kin, other=0.0) > 0
        Kt = _load_tok(k, b, hk, pk, kin, N, front, D, k_sb, k_sn, k_sh, k_sd, DP)  # KC x DP
        S = _r_scores(A, Kt, kval, sc, FIRST, LP, DT)
        m_new = tl.maximum(m, tl.max(S, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(S - m_new[:, None])
        W = alpha * (W + (m - m_new) * Z) + tl.sum(tl.where(kval[None, :], S - m_new[:, None], 0.0) * p, axis=1)
        Z = alpha * Z + tl.sum(p, axis=1)
        acc_al = acc_al * alpha[:, None] + _mm_sa(p, Kt, LP, DT)
        if LAST:
            Vt = _load_tok(v, b, hk, pk, kin, N, front, Dv, v_sb, v_sn, v_sh, v_sd, DVP)  # KC x DVP
            acc_y = acc_y * alpha[:, None] + _mm(p, Vt, LP, DT)
        m = m_new
    # R_i = e^(s_i - m) rz. stable: rz = 1/Z (0 for a block with no valid key). reference
    # (ma_torch.py): R = e^(s - shift) / (sum e^(s - shift) + eps), shift = max(rowmax, eps).
    if STABLE:
        shift = m
        zs = Z
        rz = _inv0(Z)
        logz = tl.log(tl.where(Z > 0, Z, 1.0))
    else:
        shift = tl.maximum(m, EPS)
        zs = Z * tl.exp(m - shift)
        rz = tl.exp(m - shift) / (zs + EPS)
        logz = tl.log(zs + EPS)
    sR = Z * rz
    clv = rz * (W + Z * (m - shift)) - sR * logz  # sum R log R = sum R (s - shift) - sum R log(zs [+ eps])
    srow = (bh.to(tl.int64) * B + j) * M + kb  # scratch row (j, kb)
    d = tl.arange(0, DP)
    tl.store(al + srow[:, None] * D + d[None, :], acc_al * (sc * rz)[:, None], mask=rowok[:, None] & (d[None, :] < D))
    tl.store(cl + srow, clv, mask=rowok)
    if LAST:
        e = tl.arange(0, DVP)
        tl.store(y + srow[:, None] * Dv + e[None, :], (acc_y * rz[:, None]).to(y.dtype.element_ty),
                 mask=rowok[:, None] & (e[None, :] < Dv))
    if STATS:
        tl.store(lse + srow, tl.where(rz > 0, m - tl.log(tl.where(rz > 0, rz, 1.0)), float("inf")), mask=rowok)  # rz = 0: +inf, so R = exp(S - lse) = 0
        tl.store(sumr + srow, sR, mask=rowok)


# ---- L-step pieces -----------------------------------------------------------------------------
@triton.jit
def _l_scores(Q, al, cl, blk, srow0, b, kk, M, D, blk_sb, STABLE: tl.constexpr, LP: tl.constexpr,
              DT: tl.constexpr, DP: tl.constexpr):
    """U = Q al_k^T - cl_k for blocks kk (Q: rows x DP, exact in DT or fp32), -inf outside [0, M)
    and (stable) at blocks with no valid key. Returns (U, al_k) (al_k: len(kk) x DP fp32)."""
    d = tl.arange(0, DP)
    kin = kk < M
    al_k = tl.load(al + (srow0 + kk)[:, None] * D + d[None, :], mask=kin[:, None] & (d[None, :] < D), other=0.0)
    cl_k = tl.load(cl + srow0 + kk, mask=kin, other=0.0)
    U = _mm_sb(Q, tl.trans(al_k), LP, DT) - cl_k[None, :]
    ok = kin
    if STABLE:
        ok = ok & (tl.load(blk + b * blk_sb + kk, mask=kin, other=0.0) > 0)
    return tl.where(ok[None, :], U, float("-inf")), al_k


@triton.jit
def lstep_fwd_kernel(
    q, w, blk, al, cl, y,        # q: batch x N x Hq x D; w: batch x P; blk: batch x M; al/cl/y: scratch
    o, abar, ls,                 # last step: o (batch x N x Hq x Dv, any strides); else abar slab (b, h, p, d); ls [BH, B, M]
    q_sb, q_sn, q_sh, q_sd, o_sb, o_sn, o_sh, o_sd, a_sb, a_sh, a_sp, a_sd, w_sb, blk_sb,
    N, Hq, B, M, front, D, Dv,
    LAST: tl.constexpr, STABLE: tl.constexpr, LP: tl.constexpr, DT: tl.constexpr,
    LC: tl.constexpr, LK: tl.constexpr, ONE: tl.constexpr, DP: tl.constexpr, DVP: tl.constexpr,
):
    """Last step: program (offset j, query chunk), an online softmax over the blocks in chunks of LK
    (a FlashAttention forward over M "keys" al with values y). Earlier steps: program (offset j),
    the next step's abar[k*B + j] = sum_l w_l L[l, k] q_l / c_k; ONE (M <= LC = LK): one tile; else
    two passes (each query's log-normaliser into ls, then the blocks in chunks)."""
    pid = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // Hq).to(tl.int64)
    h = (bh % Hq).to(tl.int64)
    d = tl.arange(0, DP)
    if LAST:
        nlc = tl.cdiv(M, LC)
        jj = pid // nlc
        lc = (pid % nlc) * LC
    else:
        jj = pid
        lc = 0
    srow0 = (bh.to(tl.int64) * B + jj) * M  # scratch rows (jj, k) = srow0 + k
    if LAST:
        ll = lc + tl.arange(0, LC)
        lin = ll < M
        pos = ll * B + jj
        Q = _load_tok(q, b, h, pos, lin, N, front, D, q_sb, q_sn, q_sh, q_sd, DP)
        m = tl.full([LC], NEG_BIG, tl.float32)
        Z = tl.zeros([LC], tl.float32)
        acc = tl.zeros([LC, DVP], tl.float32)
        e = tl.arange(0, DVP)
        for kc in range(0, M, LK):
            kk = kc + tl.arange(0, LK)
            U, al_k = _l_scores(Q, al, cl, blk, srow0, b, kk, M, D, blk_sb, STABLE, LP, DT, DP)
            m_new = tl.maximum(m, tl.max(U, axis=1))
            alpha = tl.exp(m - m_new)
            p = tl.exp(U - m_new[:, None])
            Z = alpha * Z + tl.sum(p, axis=1)
            y_k = tl.load(y + (srow0 + kk)[:, None] * Dv + e[None, :], mask=(kk < M)[:, None] & (e[None, :] < Dv),
                          other=0.0)
            acc = acc * alpha[:, None] + _mm(p, y_k, LP, DT)
            m = m_new
        out = acc * _inv0(Z)[:, None]
        if STABLE:  # masked queries output zeros
            wl = tl.load(w + b * w_sb + pos, mask=lin, other=0.0)
            out = tl.where(wl[:, None] > 0, out, 0.0)
        n = pos - front
        ok = lin & (n >= 0) & (n < N)
        ptr = o + b * o_sb + h * o_sh + n.to(tl.int64)[:, None] * o_sn + e[None, :] * o_sd
        tl.store(ptr, out.to(o.dtype.element_ty), mask=ok[:, None] & (e[None, :] < Dv))
    elif ONE:
        ll = tl.arange(0, LC)
        lin = ll < M
        pos = ll * B + jj
        Q = _load_tok(q, b, h, pos, lin, N, front, D, q_sb, q_sn, q_sh, q_sd, DP)
        wl = tl.load(w + b * w_sb + pos, mask=lin, other=0.0)
        kk = tl.arange(0, LK)
        U, al_k = _l_scores(Q, al, cl, blk, srow0, b, kk, M, D, blk_sb, STABLE, LP, DT, DP)
        mx = tl.maximum(tl.max(U, axis=1), NEG_BIG)
        p = tl.exp(U - mx[:, None])
        Z = tl.sum(p, axis=1)
        Pw = p * (wl * _inv0(Z))[:, None]  # w_l L[l, k]
        _store_abar(abar, Pw, Q, b, h, kk, jj, B, M, D, a_sb, a_sh, a_sp, a_sd, STABLE, LP, DT, DP)
    else:
        # pass 1: each query's log-normaliser over all blocks
        for lc0 in range(0, M, LC):
            ll = lc0 + tl.arange(0, LC)
            lin = ll < M
            Q = _load_tok(q, b, h, ll * B + jj, lin, N, front, D, q_sb, q_sn, q_sh, q_sd, DP)
            m = tl.full([LC], NEG_BIG, tl.float32)
            Z = tl.zeros([LC], tl.float32)
            for kc in range(0, M, LK):
                kk = kc + tl.arange(0, LK)
                U, al_k = _l_scores(Q, al, cl, blk, srow0, b, kk, M, D, blk_sb, STABLE, LP, DT, DP)
                m_new = tl.maximum(m, tl.max(U, axis=1))
                Z = tl.exp(m - m_new) * Z + tl.sum(tl.exp(U - m_new[:, None]), axis=1)
                m = m_new
            tl.store(ls + srow0 + ll, tl.where(Z > 0, m + tl.log(tl.where(Z > 0, Z, 1.0)), float("inf")), mask=lin)
        tl.debug_barrier()  # ls written by other threads of this program
        # pass 2: per chunk of blocks, a = sum_l w L q_l and c = sum_l w L over all queries
        for kc in range(0, M, LK):
            kk = kc + tl.arange(0, LK)
            acc_a = tl.zeros([LK, DP], tl.float32)
            acc_c = tl.zeros([LK], tl.float32)
            for lc0 in range(0, M, LC):
                ll = lc0 + tl.arange(0, LC)
                lin = ll < M
                pos = ll * B + jj
                Q = _load_tok(q, b, h, pos, lin, N, front, D, q_sb, q_sn, q_sh, q_sd, DP)
                wl = tl.load(w + b * w_sb + pos, mask=lin, other=0.0)
                lsl = tl.load(ls + srow0 + ll, mask=lin, other=float("inf"))
                U, al_k = _l_scores(Q, al, cl, blk, srow0, b, kk, M, D, blk_sb, STABLE, LP, DT, DP)
                Pw = tl.exp(U - lsl[:, None]) * wl[:, None]
                acc_a += _mm_sa(tl.trans(Pw), Q, LP, DT)
                acc_c += tl.sum(Pw, axis=0)
            _put_abar(abar, acc_a, acc_c, b, h, kk, jj, B, M, D, a_sb, a_sh, a_sp, a_sd, STABLE, DP)


@triton.jit
def _store_abar(abar, Pw, Q, b, h, kk, jj, B, M, D, a_sb, a_sh, a_sp, a_sd, STABLE: tl.constexpr,
                LP: tl.constexpr, DT: tl.constexpr, DP: tl.constexpr):
    """abar[k*B + jj] from one tile: Pw (queries x blocks) = w_l L[l, k], Q the queries."""
    acc_a = _mm_sa(tl.trans(Pw), Q, LP, DT)
    acc_c = tl.sum(Pw, axis=0)
    _put_abar(abar, acc_a, acc_c, b, h, kk, jj, B, M, D, a_sb, a_sh, a_sp, a_sd, STABLE, DP)


@triton.jit
def _put_abar(abar, acc_a, acc_c, b, h, kk, jj, B, M, D, a_sb, a_sh, a_sp, a_sd, STABLE: tl.constexpr,
              DP: tl.constexpr):
    """abar = a / c (stable; 0 where c = 0) or a / (c + eps) (reference), at positions k*B + jj."""
    if STABLE:
        inv = _inv0(acc_c)
    else:
        inv = 1.0 / (acc_c + EPS)
    d = tl.arange(0, DP)
    pos = (kk * B + jj).to(tl.int64)
    ptr = abar + b * a_sb + h * a_sh + pos[:, None] * a_sp + d[None, :] * a_sd
    tl.store(ptr, acc_a * inv[:, None], mask=(kk < M)[:, None] & (d[None, :] < D))


# ---- backward L-step ---------------------------------------------------------------------------
@triton.jit
def lstep_bwd_kernel(
    q, w, blk, al, cl, y, sumr,  # inputs as the forward; sumr [BH, B, M] (the recompute's sum_i R)
    g, dabar, anext,             # last: g = dout (batch x N x Hq x Dv); else dabar [BH, P, D], anext = abar slab of step t+1
    dq,                          # [BH, P, D] fp32, accumulated (+=)
    dal, dcl, dy, rowdot,        # out: [BH, B, M, D], [BH, B, M], [BH, B, M, Dv], [BH, B, M]
    ls, rr, gk, ek,              # scratch [BH, B, M]: per query lse and r = sum_k L dL; per block 1/c', dabar . abar
    q_sb, q_sn, q_sh, q_sd, g_sb, g_sn, g_sh, g_sd, a_sb, a_sh, a_sp, a_sd, w_sb, blk_sb,
    N, Hq, B, M, front, D, Dv, P,
    LAST: tl.constexpr, STABLE: tl.constexpr, LP: tl.constexpr, DT: tl.constexpr,
    LC: tl.constexpr, LK: tl.constexpr, ONE: tl.constexpr, DP: tl.constexpr, DVP: tl.constexpr,
):
    """Program (offset jj): the adjoint of the L-step (derivation: src/cpu/kernels/monarch.inc).
    Last step: dL[l, k] = G_l . y_k; earlier: dL[l, k] = w_l / c'_k (dabar_k . q_l - dabar_k . abar_k),
    dq_l += w_l sum_k L / c'_k dabar_k. Then du = L (dL - r_l), r_l = sum_k L dL; dq_l += du al;
    dal_k = du^T q; dcl_k = -sum_l du; dy_k = L^T G; and the R-step's row term
    rowdot = dal . al + dy . y + dcl (cl + sum R). Passes over (query, block) chunks: 1 the
    log-normalisers (and, last step, r = G . O), 2 c (not last), 3 r and the dq term (not last),
    4 du and everything it feeds. ONE (M <= LC = LK): all in one tile, one pass, no scratch."""
    jj = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // Hq).to(tl.int64)
    h = (bh % Hq).to(tl.int64)
    d = tl.arange(0, DP)
    e = tl.arange(0, DVP)
    srow0 = (bh.to(tl.int64) * B + jj) * M
    prow0 = bh.to(tl.int64) * P  # dq / dabar rows
    if ONE:
        ll = tl.arange(0, LC)
        lin = ll < M
        pos = ll * B + jj
        kk = tl.arange(0, LK)
        kin = kk < M
        kpos = (kk * B + jj).to(tl.int64)
        Q = _load_tok(q, b, h, pos, lin, N, front, D, q_sb, q_sn, q_sh, q_sd, DP)
        U, al_k = _l_scores(Q, al, cl, blk, srow0, b, kk, M, D, blk_sb, STABLE, LP, DT, DP)
        mx = tl.maximum(tl.max(U, axis=1), NEG_BIG)
        p = tl.exp(U - mx[:, None])
        L = p * _inv0(tl.sum(p, axis=1))[:, None]
        if LAST:
            y_k = tl.load(y + (srow0 + kk)[:, None] * Dv + e[None, :], mask=kin[:, None] & (e[None, :] < Dv), other=0.0)
            G = _load_g(g, w, b, h, pos, lin, N, front, Dv, g_sb, g_sn, g_sh, g_sd, w_sb, STABLE, DVP)
            dL = _mm(G, tl.trans(y_k), LP, DT)
            r_l = tl.sum(L * dL, axis=1)
            dq_l = tl.zeros([LC, DP], tl.float32)
        else:
            wl = tl.load(w + b * w_sb + pos, mask=lin, other=0.0)
            c = tl.sum(L * wl[:, None], axis=0)
            if STABLE:
                g_k = _inv0(c)
            else:
                g_k = 1.0 / (c + EPS)
            da_k = tl.load(dabar + (prow0 + kpos)[:, None] * D + d[None, :], mask=kin[:, None] & (d[None, :] < D),
                           other=0.0)
            an_k = tl.load(anext + b * a_sb + h * a_sh + kpos[:, None] * a_sp + d[None, :] * a_sd,
                           mask=kin[:, None] & (d[None, :] < D), other=0.0)
            e_k = tl.sum(da_k * an_k, axis=1)
            X = _mm_sb(Q, tl.trans(da_k), LP, DT)
            dL = wl[:, None] * g_k[None, :] * (X - e_k[None, :])
            r_l = tl.sum(L * dL, axis=1)
            dq_l = _mm_sb(L * g_k[None, :], da_k, LP, DT) * wl[:, None]  # sum_k P[k, l] dabar_k
        du = L * (dL - r_l[:, None])
        dq_l += _mm_sb(du, al_k, LP, DT)
        qptr = dq + (prow0 + pos.to(tl.int64))[:, None] * D + d[None, :]
        qm = lin[:, None] & (d[None, :] < D)
        tl.store(qptr, tl.load(qptr, mask=qm, other=0.0) + dq_l, mask=qm)
        acc_dal = _mm(tl.trans(du), Q, LP, DT)
        acc_dcl = -tl.sum(du, axis=0)
        cl_k = tl.load(cl + srow0 + kk, mask=kin, other=0.0)
        sr_k = tl.load(sumr + srow0 + kk, mask=kin, other=0.0)
        rd = tl.sum(acc_dal * al_k, axis=1) + acc_dcl * (cl_k + sr_k)
        tl.store(dal + (srow0 + kk)[:, None] * D + d[None, :], acc_dal, mask=kin[:, None] & (d[None, :] < D))
        tl.store(dcl + srow0 + kk, acc_dcl, mask=kin)
        if LAST:
            acc_dy = _mm(tl.trans(L), G, LP, DT)
            rd += tl.sum(acc_dy * y_k, axis=1)
            tl.store(dy + (srow0 + kk)[:, None] * Dv + e[None, :], acc_dy, mask=kin[:, None] & (e[None, :] < Dv))
        tl.store(rowdot + srow0 + kk, rd, mask=kin)
    else:
        # pass 1
        for lc0 in range(0, M, LC):
            ll = lc0 + tl.arange(0, LC)
            lin = ll < M
            pos = ll * B + jj
            Q = _load_tok(q, b, h, pos, lin, N, front, D, q_sb, q_sn, q_sh, q_sd, DP)
            m = tl.full([LC], NEG_BIG, tl.float32)
            Z = tl.zeros([LC], tl.float32)
            acc = tl.zeros([LC, DVP], tl.float32)
            for kc in range(0, M, LK):
                kk = kc + tl.arange(0, LK)
                U, al_k = _l_scores(Q, al, cl, blk, srow0, b, kk, M, D, blk_sb, STABLE, LP, DT, DP)
                m_new = tl.maximum(m, tl.max(U, axis=1))
                alpha = tl.exp(m - m_new)
                p = tl.exp(U - m_new[:, None])
                Z = alpha * Z + tl.sum(p, axis=1)
                if LAST:
                    y_k = tl.load(y + (srow0 + kk)[:, None] * Dv + e[None, :],
                                  mask=(kk < M)[:, None] & (e[None, :] < Dv), other=0.0)
                    acc = acc * alpha[:, None] + _mm(p, y_k, LP, DT)
                m = m_new
            tl.store(ls + srow0 + ll, tl.where(Z > 0, m + tl.log(tl.where(Z > 0, Z, 1.0)), float("inf")), mask=lin)
            if LAST:
                G = _load_g(g, w, b, h, pos, lin, N, front, Dv, g_sb, g_sn, g_sh, g_sd, w_sb, STABLE, DVP)
                O = acc * _inv0(Z)[:, None]
                tl.store(rr + srow0 + ll, tl.sum(G.to(tl.float32) * O, axis=1), mask=lin)
        tl.debug_barrier()
        if not LAST:
            # pass 2: c_k = sum_l w_l L[l, k] -> 1/c'_k; e_k = dabar_k . abar_k
            for kc in range(0, M, LK):
                kk = kc + tl.arange(0, LK)
                kin = kk < M
                acc_c = tl.zeros([LK], tl.float32)
                for lc0 in range(0, M, LC):
                    ll = lc0 + tl.arange(0, LC)
                    lin = ll < M
                    pos = ll * B + jj
                    Q = _load_tok(q, b, h, pos, lin, N, front, D, q_sb, q_sn, q_sh, q_sd, DP)
                    wl = tl.load(w + b * w_sb + pos, mask=lin, other=0.0)
                    lsl = tl.load(ls + srow0 + ll, mask=lin, other=float("inf"))
                    U, al_k = _l_scores(Q, al, cl, blk, srow0, b, kk, M, D, blk_sb, STABLE, LP, DT, DP)
                    acc_c += tl.sum(tl.exp(U - lsl[:, None]) * wl[:, None], axis=0)
                if STABLE:
                    inv = _inv0(acc_c)
                else:
                    inv = 1.0 / (acc_c + EPS)
                kpos = (kk * B + jj).to(tl.int64)
                da_k = tl.load(dabar + (prow0 + kpos)[:, None] * D + d[None, :], mask=kin[:, None] & (d[None, :] < D),
                               other=0.0)
                an_k = tl.load(anext + b * a_sb + h * a_sh + kpos[:, None] * a_sp + d[None, :] * a_sd,
                               mask=kin[:, None] & (d[None, :] < D), other=0.0)
                tl.store(gk + srow0 + kk, inv, mask=kin)
                tl.store(ek + srow0 + kk, tl.sum(da_k * an_k, axis=1), mask=kin)
            tl.debug_barrier()
            # pass 3: V_l = sum_k L g_k dabar_k, r_l = w_l (q_l . V_l - sum_k L g_k e_k), dq_l += w_l V_l
            for lc0 in range(0, M, LC):
                ll = lc0 + tl.arange(0, LC)
                lin = ll < M
                pos = ll * B + jj
                Q = _load_tok(q, b, h, pos, lin, N, front, D, q_sb, q_sn, q_sh, q_sd, DP)
                wl = tl.load(w + b * w_sb + pos, mask=lin, other=0.0)
                lsl = tl.load(ls + srow0 + ll, mask=lin, other=float("inf"))
                V = tl.zeros([LC, DP], tl.float32)
                E = tl.zeros([LC], tl.float32)
                for kc in range(0, M, LK):
                    kk = kc + tl.arange(0, LK)
                    kin = kk < M
                    U, al_k = _l_scores(Q, al, cl, blk, srow0, b, kk, M, D, blk_sb, STABLE, LP, DT, DP)
                    Lg = tl.exp(U - lsl[:, None]) * tl.load(gk + srow0 + kk, mask=kin, other=0.0)[None, :]
                    kpos = (kk * B + jj).to(tl.int64)
                    da_k = tl.load(dabar + (prow0 + kpos)[:, None] * D + d[None, :],
                                   mask=kin[:, None] & (d[None, :] < D), other=0.0)
                    V += _mm_sb(Lg, da_k, LP, DT)
                    E += tl.sum(Lg * tl.load(ek + srow0 + kk, mask=kin, other=0.0)[None, :], axis=1)
                tl.store(rr + srow0 + ll, wl * (tl.sum(Q.to(tl.float32) * V, axis=1) - E), mask=lin)
                qptr = dq + (prow0 + pos.to(tl.int64))[:, None] * D + d[None, :]
                qm = lin[:, None] & (d[None, :] < D)
                tl.store(qptr, tl.load(qptr, mask=qm, other=0.0) + V * wl[:, None], mask=qm)
            tl.debug_barrier()
        # pass 4: per chunk of blocks, du over all queries
        for kc in range(0, M, LK):
            kk = kc + tl.arange(0, LK)
            kin = kk < M
            kpos = (kk * B + jj).to(tl.int64)
            acc_dal = tl.zeros([LK, DP], tl.float32)
            acc_dcl = tl.zeros([LK], tl.float32)
            acc_dy = tl.zeros([LK, DVP], tl.float32)
            if LAST:
                y_k = tl.load(y + (srow0 + kk)[:, None] * Dv + e[None, :], mask=kin[:, None] & (e[None, :] < Dv), other=0.0)
            else:
                da_k = tl.load(dabar + (prow0 + kpos)[:, None] * D + d[None, :], mask=kin[:, None] & (d[None, :] < D),
                               other=0.0)
                g_k = tl.load(gk + srow0 + kk, mask=kin, other=0.0)
                e_k = tl.load(ek + srow0 + kk, mask=kin, other=0.0)
            for lc0 in range(0, M, LC):
                ll = lc0 + tl.arange(0, LC)
                lin = ll < M
                pos = ll * B + jj
                Q = _load_tok(q, b, h, pos, lin, N, front, D, q_sb, q_sn, q_sh, q_sd, DP)
                lsl = tl.load(ls + srow0 + ll, mask=lin, other=float("inf"))
                r_l = tl.load(rr + srow0 + ll, mask=lin, other=0.0)
                U, al_k = _l_scores(Q, al, cl, blk, srow0, b, kk, M, D, blk_sb, STABLE, LP, DT, DP)
                L = tl.exp(U - lsl[:, None])
                if LAST:
                    G = _load_g(g, w, b, h, pos, lin, N, front, Dv, g_sb, g_sn, g_sh, g_sd, w_sb, STABLE, DVP)
                    dL = _mm(G, tl.trans(y_k), LP, DT)
                    acc_dy += _mm(tl.trans(L), G, LP, DT)
                else:
                    wl = tl.load(w + b * w_sb + pos, mask=lin, other=0.0)
                    X = _mm_sb(Q, tl.trans(da_k), LP, DT)
                    dL = wl[:, None] * g_k[None, :] * (X - e_k[None, :])
                du = L * (dL - r_l[:, None])
                acc_dal += _mm(tl.trans(du), Q, LP, DT)
                acc_dcl -= tl.sum(du, axis=0)
                qptr = dq + (prow0 + pos.to(tl.int64))[:, None] * D + d[None, :]
                qm = lin[:, None] & (d[None, :] < D)
                tl.store(qptr, tl.load(qptr, mask=qm, other=0.0) + _mm_sb(du, al_k, LP, DT), mask=qm)
            al_k = tl.load(al + (srow0 + kk)[:, None] * D + d[None, :], mask=kin[:, None] & (d[None, :] < D), other=0.0)
            cl_k = tl.load(cl + srow0 + kk, mask=kin, other=0.0)
            sr_k = tl.load(sumr + srow0 + kk, mask=kin, other=0.0)
            rd = tl.sum(acc_dal * al_k, axis=1) + acc_dcl * (cl_k + sr_k)
            tl.store(dal + (srow0 + kk)[:, None] * D + d[None, :], acc_dal, mask=kin[:, None] & (d[None, :] < D))
            tl.store(dcl + srow0 + kk, acc_dcl, mask=kin)
            if LAST:
                rd += tl.sum(acc_dy * y_k, axis=1)
                tl.store(dy + (srow0 + kk)[:, None] * Dv + e[None, :], acc_dy, mask=kin[:, None] & (e[None, :] < Dv))
            tl.store(rowdot + srow0 + kk, rd, mask=kin)
            tl.debug_barrier()  # the next chunk of blocks adds to the same dq rows


@triton.jit
def _load_g(g, w, b, h, pos, lin, N, front, Dv, g_sb, g_sn, g_sh, g_sd, w_sb, STABLE: tl.constexpr,
            DVP: tl.constexpr):
    """dO rows at positions pos (stable: masked queries' rows dropped: their outputs are constant 0)."""
    G = _load_tok(g, b, h, pos, lin, N, front, Dv, g_sb, g_sn, g_sh, g_sd, DVP)
    if STABLE:
        wl = tl.load(w + b * w_sb + pos, mask=lin, other=0.0)
        G = tl.where(wl[:, None] > 0, G, 0.0).to(G.dtype)
    return G


# ---- backward R-step ---------------------------------------------------------------------------
@triton.jit
def _r_grad(A, Kt, Vt, kval, dal_r, dcl_r, rd_r, lse_r, dy_r, sc, FIRST: tl.constexpr, LAST: tl.constexpr,
            LP: tl.constexpr, DT: tl.constexpr):
    """Rows x keys: R (recomputed from lse) and ds = R (dP + dcl (log R + 1) - rowdot),
    dP = sc dal . k + dy . v; zero where R = 0 (masked keys, underflow)."""
    S = _r_scores(A, Kt, kval, sc, FIRST, LP, DT)
    logR = S - lse_r[:, None]
    R = tl.exp(logR)
    logR = tl.where(R > 0, logR, 0.0)  # -inf at masked keys: keeps dcl * logR finite (R = 0 there)
    dP = _mm_sa(dal_r * sc, tl.trans(Kt), LP, DT)
    if LAST:
        dP += _mm_sa(dy_r, tl.trans(Vt), LP, DT)
    ds = tl.where(R > 0, R * (dP + dcl_r[:, None] * (logR + 1.0) - rd_r[:, None]), 0.0)
    return R, ds


@triton.jit
def rstep_bwd_q_kernel(
    q, k, v, w, abar,            # as rstep_fwd_kernel
    dal, dcl, dy, rowdot, lse,   # [BH, B, M, D], [BH, B, M], [BH, B, M, Dv], [BH, B, M], [BH, B, M]
    dabar, dq,                   # out: dabar [BH, P, D] (t > 1), or dq [BH, P, D] += (t = 1)
    q_sb, q_sn, q_sh, q_sd, k_sb, k_sn, k_sh, k_sd, v_sb, v_sn, v_sh, v_sd,
    a_sb, a_sh, a_sp, a_sd, w_sb,
    N, Hq, G, B, M, front, D, Dv, P, sc,
    FIRST: tl.constexpr, LAST: tl.constexpr, STABLE: tl.constexpr,
    LP: tl.constexpr, DT: tl.constexpr, RC: tl.constexpr, KC: tl.constexpr, DP: tl.constexpr, DVP: tl.constexpr,
):
    """Program (block kb, row chunk): dabar_j = sc sum_i ds_ji k_i over the block's keys."""
    pid = tl.program_id(0)
    bh = tl.program_id(1)
    nrc = tl.cdiv(B, RC)
    kb = pid // nrc
    rc = pid % nrc
    b = (bh // Hq).to(tl.int64)
    h = bh % Hq
    hk = (h // G).to(tl.int64)
    h = h.to(tl.int64)
    j = rc * RC + tl.arange(0, RC)
    rowok = j < B
    prow = kb * B + j
    d = tl.arange(0, DP)
    e = tl.arange(0, DVP)
    A = _load_a(q, abar, w, b, h, prow, rowok, N, front, D, q_sb, q_sn, q_sh, q_sd, a_sb, a_sh, a_sp, a_sd, w_sb,
                FIRST, STABLE, DP)
    srow = (bh.to(tl.int64) * B + j) * M + kb
    dal_r = tl.load(dal + srow[:, None] * D + d[None, :], mask=rowok[:, None] & (d[None, :] < D), other=0.0)
    dcl_r = tl.load(dcl + srow, mask=rowok, other=0.0)
    rd_r = tl.load(rowdot + srow, mask=rowok, other=0.0)
    lse_r = tl.load(lse + srow, mask=rowok, other=float("inf"))
    dy_r = tl.zeros([RC, DVP], tl.float32)
    if LAST:
        dy_r = tl.load(dy + srow[:, None] * Dv + e[None, :], mask=rowok[:, None] & (e[None, :] < Dv), other=0.0)
    acc = tl.zeros([RC, DP], tl.float32)
    for kc in range(0, B, KC):
        i = kc + tl.arange(0, KC)
        pk = kb * B + i
        kin = i < B
        kval = tl.load(w + b * w_sb + pk, mask=kin, other=0.0) > 0
        Kt = _load_tok(k, b, hk, pk, kin, N, front, D, k_sb, k_sn, k_sh, k_sd, DP)
        Vt = Kt
        if LAST:
            Vt = _load_tok(v, b, hk, pk, kin, N, front, Dv, v_sb, v_sn, v_sh, v_sd, DVP)
        R, ds = _r_grad(A, Kt, Vt, kval, dal_r, dcl_r, rd_r, lse_r, dy_r, sc, FIRST, LAST, LP, DT)
        acc += _mm(ds, Kt, LP, DT)
    acc = acc * sc
    ptr = (bh.to(tl.int64) * P + prow.to(tl.int64))[:, None] * D + d[None, :]
    msk = rowok[:, None] & (d[None, :] < D)
    if FIRST:  # a = q (stable: w q): dq += w dabar
        if STABLE:
            wr = tl.load(w + b * w_sb + prow, mask=rowok, other=0.0)
            acc = acc * wr[:, None]
        tl.store(dq + ptr, tl.load(dq + ptr, mask=msk, other=0.0) + acc, mask=msk)
    else:
        tl.store(dabar + ptr, acc, mask=msk)


@triton.jit
def rstep_bwd_kv_kernel(
    q, k, v, w, abar,            # as rstep_fwd_kernel
    dal, dcl, dy, rowdot, lse,   # as rstep_bwd_q_kernel
    dk, dv,                      # [batch*Hkv, P, D], [batch*Hkv, P, Dv] fp32, accumulated (+=)
    q_sb, q_sn, q_sh, q_sd, k_sb, k_sn, k_sh, k_sd, v_sb, v_sn, v_sh, v_sd,
    a_sb, a_sh, a_sp, a_sd, w_sb,
    N, Hq, Hkv, G, B, M, front, D, Dv, P, sc,
    FIRST: tl.constexpr, LAST: tl.constexpr, STABLE: tl.constexpr,
    LP: tl.constexpr, DT: tl.constexpr, RC: tl.constexpr, KC: tl.constexpr, DP: tl.constexpr, DVP: tl.constexpr,
):
    """Program (block kb, key chunk, kv head): dk_i += sc sum_j ds_ji abar_j + sc sum_j R_ji dal_j,
    dv_i += sum_j R_ji dy_j over the block's rows and the G query heads that share the kv head
    (one program owns its keys: no atomics, results independent of scheduling)."""
    pid = tl.program_id(0)
    bk = tl.program_id(1)
    nkc = tl.cdiv(B, KC)
    kb = pid // nkc
    kc = (pid % nkc) * KC
    b = (bk // Hkv).to(tl.int64)
    hk = (bk % Hkv).to(tl.int64)
    d = tl.arange(0, DP)
    e = tl.arange(0, DVP)
    i = kc + tl.arange(0, KC)
    pk = kb * B + i
    kin = i < B
    kval = tl.load(w + b * w_sb + pk, mask=kin, other=0.0) > 0
    Kt = _load_tok(k, b, hk, pk, kin, N, front, D, k_sb, k_sn, k_sh, k_sd, DP)
    Vt = Kt
    if LAST:
        Vt = _load_tok(v, b, hk, pk, kin, N, front, Dv, v_sb, v_sn, v_sh, v_sd, DVP)
    acc_k = tl.zeros([KC, DP], tl.float32)
    acc_v = tl.zeros([KC, DVP], tl.float32)
    for gg in range(0, G):
        h = hk * G + gg
        bh = b * Hq + h
        for rc in range(0, B, RC):
            j = rc + tl.arange(0, RC)
            rowok = j < B
            prow = kb * B + j
            A = _load_a(q, abar, w, b, h, prow, rowok, N, front, D, q_sb, q_sn, q_sh, q_sd, a_sb, a_sh, a_sp, a_sd,
                        w_sb, FIRST, STABLE, DP)
            srow = (bh * B + j) * M + kb
            dal_r = tl.load(dal + srow[:, None] * D + d[None, :], mask=rowok[:, None] & (d[None, :] < D), other=0.0)
            dcl_r = tl.load(dcl + srow, mask=rowok, other=0.0)
            rd_r = tl.load(rowdot + srow, mask=rowok, other=0.0)
            lse_r = tl.load(lse + srow, mask=rowok, other=float("inf"))
            dy_r = tl.zeros([RC, DVP], tl.float32)
            if LAST:
                dy_r = tl.load(dy + srow[:, None] * Dv + e[None, :], mask=rowok[:, None] & (e[None, :] < Dv),
                               other=0.0)
            R, ds = _r_grad(A, Kt, Vt, kval, dal_r, dcl_r, rd_r, lse_r, dy_r, sc, FIRST, LAST, LP, DT)
            if FIRST:
                acc_k += _mm(tl.trans(ds), A, LP, DT)
            else:
                acc_k += _mm_sb(tl.trans(ds), A, LP, DT)
            acc_k += _mm_sb(tl.trans(R), dal_r, LP, DT)
            if LAST:
                acc_v += _mm_sb(tl.trans(R), dy_r, LP, DT)
    row = bk.to(tl.int64) * P + pk.to(tl.int64)
    kp = dk + row[:, None] * D + d[None, :]
    km = kin[:, None] & (d[None, :] < D)
    tl.store(kp, tl.load(kp, mask=km, other=0.0) + acc_k * sc, mask=km)
    if LAST:
        vp = dv + row[:, None] * Dv + e[None, :]
        vm = kin[:, None] & (e[None, :] < Dv)
        tl.store(vp, tl.load(vp, mask=vm, other=0.0) + acc_v, mask=vm)
