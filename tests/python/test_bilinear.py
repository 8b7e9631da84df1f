"""Tests of the bilinear BTT / MLR scoring layers from Python (python/strata/bilinear.py over
torch.ops.strata.bilinear_*, btt_key_transform, block_diag_transform, btt_factorize).

Run: STRATA_LIB=<build>/torch/libstrata_torch.so PYTHONPATH=python python -m pytest -q tests/python/test_bilinear.py

Truth is written here from the formulas (strata/torch/bilinear_attention.h, the reference code's
src/model.py): the BTT matrix M_h and the block-diagonal level matrices gathered entry by entry from
index lists, the layer as einsums, an explicit LayerNorm and softmax, in float64 with autograd of
the transcription for the gradients.

Tolerances (normwise max|got - want| / max|want|): float64 1e-11 (both sides exact math in
double, differing by summation order over a few hundred terms, ~1e-14; an index or scale error is
of order 1). float32 module vs the float64 truth: 1e-4 forward, 5e-4 gradients (fp32 round-off
through two GEMMs, a LayerNorm, logits up to ~5 and a softmax over <= 7 keys; gradients subtract
rowsum(dO * O), 5x more).
"""

from __future__ import annotations

import math

import pytest
import torch

import strata
from conftest import assert_raises_naming, rel_err

F64_TOL, F32_FWD_TOL, F32_GRAD_TOL = 1e-11, 1e-4, 5e-4


# ---- the transcription ------------------------------------------------------------------------


def btt_dense(w_k, w_q, H, shape, s):
    """M: H x (a*b) x (c*d), M[h][(i_a*b + j_b)][(i_c*d + i_d)] =
    sum_sigma W_Q[h*b + j_b, i_a, i_c*s + sigma] * W_K[i_c, i_d, (h*b + j_b)*s + sigma]."""
    a, b, c, d = shape
    iq, ik = [], []
    for h in range(H):
        for row in range(a * b):
            for col in range(c * d):
                for sigma in range(s):
                    i_a, j_b, i_c, i_d = row // b, row % b, col // d, col % d
                    iq.append(((h * b + j_b) * a + i_a) * (c * s) + i_c * s + sigma)
                    ik.append((i_c * d + i_d) * (H * b * s) + (h * b + j_b) * s + sigma)
    prod = w_q.flatten()[torch.tensor(iq)] * w_k.flatten()[torch.tensor(ik)]
    return prod.view(H, a * b, c * d, s).sum(-1)


def block_diag_dense(w, H):
    """A: H x (r*p) x (p*m), A[h][rho*p + k][k*m + j] = w[k, j, h*r + rho], zero off the blocks."""
    p, m, hr = w.shape
    r = hr // H
    dst, src = [], []
    for h in range(H):
        for rho in range(r):
            for k in range(p):
                for j in range(m):
                    dst.append((h * r * p + rho * p + k) * (p * m) + k * m + j)
                    src.append((k * m + j) * (H * r) + h * r + rho)
    zeros = torch.zeros(H * r * p * p * m, dtype=w.dtype)
    return zeros.index_put((torch.tensor(dst),), w.flatten()[torch.tensor(src)]).view(H, r * p, p * m)


def layer_norm(z, w, b):
    mean = z.mean(-1, keepdim=True)
    var = (z - mean).square().mean(-1, keepdim=True)
    y = (z - mean) / (var + 1e-5).sqrt() * w
    return y if b is None else y + b


def capped(w, d_in, d_out, on=True):
    """W / (RMS / sigma*) when that ratio exceeds 1, else W."""
    if not on:
        return w
    ratio = (w.square().mean() + 1e-8).sqrt() / (math.sqrt(min(d_in, d_out)) / d_in)
    return w / ratio if ratio.item() > 1 else w


def linear(x, w, b):
    y = x @ w.t()
    return y if b is None else y + b


def attend(S, v, causal):
    """softmax over keys of S (B x H x T x T, causal mask) times v (B x T x H x V)."""
    if causal:
        T = S.shape[-1]
        S = S.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), -math.inf)
    return torch.einsum("bhts,bshv->bthv", torch.softmax(S, -1), v)


def btt_by_hand(x, p, m):
    """The BilinearBTTAttention layer m from its parameters p (a dict of m's parameter names)."""
    B, T, D = x.shape
    H, s = m.num_heads, m.btt_rank
    a, b, c, d = m.btt_shape
    h = layer_norm(x, p["x_norm_weight"], p.get("x_norm_bias")) if "x_norm_weight" in p else x
    M = btt_dense(capped(p["w_k"], d, H * b * s, m.rms_cap), capped(p["w_q"], c * s, a, m.rms_cap), H, m.btt_shape, s)
    keys = layer_norm(torch.einsum("hij,btj->bthi", M, h), p["key_norm_weight"], p.get("key_norm_bias"))
    scale = 1 / math.sqrt(D) if m.logit_scale == "sp" else 1 / D
    S = torch.einsum("bti,bshi->bhts", h, keys) * scale
    v = linear(h, p["v_proj.weight"], p.get("v_proj.bias")).view(B, T, H, D // H)
    return linear(attend(S, v, m.causal).reshape(B, T, D), p["out_proj.weight"], p.get("out_proj.bias"))


def mlr_by_hand(x, p, m):
    """The BilinearMLRAttention layer m from its parameters p."""
    B, T, D = x.shape
    H, L = m.num_heads, len(m.ranks)
    S = 0
    for i, r in enumerate(m.ranks):
        l, P = i + 1, 2**i

        def feats(w):
            return torch.einsum("hfi,bti->bthf", block_diag_dense(capped(w, D // P, H * r, m.rms_cap), H), x)

        q, k = feats(p[f"w_q_{l}"]), feats(p[f"w_k_{l}"])
        if m.qk_layernorm:
            q = layer_norm(q, p[f"q_norm_weight_{l}"], p.get(f"q_norm_bias_{l}"))
            k = layer_norm(k, p[f"k_norm_weight_{l}"], p.get(f"k_norm_bias_{l}"))
        c_l = 1 / math.sqrt(r * P) if m.logit_scale == "sp" else 8 / (r * P)
        S = S + torch.einsum("bthe,bshe->bhts", q, k) * c_l
    if m.divide_by_num_levels:
        S = S / L
    v = linear(x, p["v_proj.weight"], p.get("v_proj.bias")).view(B, T, H, D // H)
    return linear(attend(S, v, m.causal).reshape(B, T, D), p["out_proj.weight"], p.get("out_proj.bias"))


def randomise(m, core_scale, core_dims, seed):
    """Gains around 1, the rest around 0; cores at core_scale x sigma* of their cap."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in m.named_parameters():
            z = torch.randn(p.shape, generator=g, dtype=torch.float64)
            if name in core_dims:
                p.copy_(z / z.square().mean().sqrt() * core_scale * strata.mup.rms_cap_sigma(*core_dims[name]))
            elif "norm_weight" in name:
                p.copy_(1 + 0.3 * z)
            else:
                p.copy_(0.4 * z)


def btt_core_dims(m):
    a, b, c, d = m.btt_shape
    return {"w_k": (d, m.num_heads * b * m.btt_rank), "w_q": (c * m.btt_rank, a)}


def mlr_core_dims(m):
    dims = {}
    for i, r in enumerate(m.ranks):
        for side in ("w_q", "w_k"):
            dims[f"{side}_{i + 1}"] = (m.embed_dim // 2**i, m.num_heads * r)
    return dims


def check_against_truth(m, by_hand, x, seed):
    """m (float64) against by_hand: output and gradients w.r.t. x and every parameter; then m in
    float32 against the same float64 truth."""
    g = torch.randn(x.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    names = [n for n, _ in m.named_parameters()]
    leaves = {n: p.detach().clone().requires_grad_() for n, p in m.named_parameters()}
    xt = x.clone().requires_grad_()
    want_out = by_hand(xt, leaves, m)
    want = [want_out.detach(), *torch.autograd.grad((want_out * g).sum(), [xt, *leaves.values()])]
    # A gradient whose truth is zero up to float64 round-off (below 1e-8 of the largest) is compared
    # against the largest gradient: the key-side LayerNorm bias adds x_t . bias to every logit of
    # row t, which the softmax cancels, so its exact gradient is 0 and both sides hold round-off.
    gmax = max(w.abs().max().item() for w in want[1:])
    for dtype, fwd_tol, grad_tol in ((torch.float64, F64_TOL, F64_TOL), (torch.float32, F32_FWD_TOL, F32_GRAD_TOL)):
        m.to(dtype)
        xg = x.to(dtype).requires_grad_()
        out = m(xg)
        got = [out.detach(), *torch.autograd.grad((out * g.to(dtype)).sum(), [xg, *m.parameters()])]
        for i, (a, w) in enumerate(zip(got, want)):
            what = "out" if i == 0 else "d x" if i == 1 else f"d {names[i - 2]}"
            err = rel_err(a, w, gmax if i > 0 and w.abs().max().item() < 1e-8 * gmax else 1e-30)
            assert err <= (fwd_tol if i == 0 else grad_tol), f"{dtype} {what}: {err:.3g}"
        m.to(torch.float64)


# ---- factorisation ----------------------------------------------------------------------------


@pytest.mark.parametrize("D, ab", [(64, (4, 16)), (256, (8, 32)), (384, (16, 24)), (512, (16, 32)), (768, (24, 32)),
                                   (1024, (16, 64))])
def test_factorize_matches_the_reference(D, ab):
    assert strata.btt_factorize(D) == (*ab, *ab)
    assert strata.BilinearBTTAttention(D, 4).btt_shape == (*ab, *ab)


def test_factorize_rule_transcribed():
    # The reference: bigger = next(f for f in divisors(D) if f > sqrt(D)); (D // bigger, bigger).
    for D in range(2, 1100):
        bigger = next(f for f in range(1, D + 1) if D % f == 0 and f > math.sqrt(D))
        assert strata.btt_factorize(D) == (D // bigger, bigger, D // bigger, bigger), D
    assert strata.btt_factorize(1024, "balanced") == (32, 32, 32, 32)
    assert_raises_naming(RuntimeError, lambda: strata.btt_factorize(1), "btt_factorize: argument 'dim'")
    assert strata.btt_factorize(384, "balanced") == (16, 24, 16, 24)  # the core's rule: the closest divisor pair


# ---- transforms -------------------------------------------------------------------------------


@pytest.mark.parametrize("shape, s, H", [((3, 4, 3, 4), 2, 2), ((2, 6, 3, 4), 3, 2), ((1, 5, 5, 1), 2, 1)])
def test_btt_key_transform_is_the_index_formula(shape, s, H):
    a, b, c, d = shape
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, c * d, generator=g, dtype=torch.float64)
    w_k = torch.randn(c, d, H * b * s, generator=g, dtype=torch.float64, requires_grad=True)
    w_q = torch.randn(H * b, a, c * s, generator=g, dtype=torch.float64, requires_grad=True)
    want = torch.einsum("hij,btj->bthi", btt_dense(w_k, w_q, H, shape, s), x)
    assert rel_err(strata.btt_key_transform(x, w_k, w_q, H), want) <= F64_TOL
    torch.autograd.gradcheck(lambda wk, wq: strata.btt_key_transform(x, wk, wq, H), (w_k, w_q))


@pytest.mark.parametrize("p, m, r, H", [(1, 12, 3, 2), (2, 5, 2, 3), (32, 3, 2, 1)])
def test_block_diag_transform_is_the_index_formula(p, m, r, H):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(3, 2, p * m, generator=g, dtype=torch.float64)
    w = torch.randn(p, m, H * r, generator=g, dtype=torch.float64)
    want = torch.einsum("hfi,bti->bthf", block_diag_dense(w, H), x)
    assert rel_err(strata.block_diag_transform(x, w, H), want) <= F64_TOL


# ---- modules ----------------------------------------------------------------------------------

BTT_CASES = [
    dict(embed_dim=12, num_heads=2, btt_rank=2),
    dict(embed_dim=18, num_heads=3, logit_scale="mup", bias=True, core_scale=3.0),
    dict(embed_dim=12, num_heads=2, btt_rank=3, btt_shape=(2, 6, 3, 4), x_layernorm=True, causal=False, core_scale=3.0),
    dict(embed_dim=16, num_heads=4, btt_rank=2, factorization="balanced", bias=True, x_layernorm=True, rms_cap=False,
         core_scale=3.0),
    dict(embed_dim=20, num_heads=2, core_scale=0.3),
]


@pytest.mark.parametrize("case", range(len(BTT_CASES)))
def test_btt_module_matches_the_transcription(case):
    kw = dict(BTT_CASES[case])
    core_scale = kw.pop("core_scale", 1.0)
    torch.manual_seed(10 + case)
    m = strata.BilinearBTTAttention(**kw, dtype=torch.float64)
    randomise(m, core_scale, btt_core_dims(m), seed=case)
    x = torch.randn(2, 7, m.embed_dim, dtype=torch.float64)
    check_against_truth(m, btt_by_hand, x, seed=case)


MLR_CASES = [
    dict(embed_dim=24, num_heads=2, ranks=[8, 4]),
    dict(embed_dim=20, num_heads=2, ranks="6|4", logit_scale="mup", bias=True, core_scale=3.0),
    dict(embed_dim=96, num_heads=2, ranks=[8] * 6, divide_by_num_levels=True),
    dict(embed_dim=12, num_heads=1, ranks=[12], qk_layernorm=False, causal=False, rms_cap=False),
    dict(embed_dim=48, num_heads=3, ranks=[10, 3, 2, 1], logit_scale="mup", core_scale=0.3),
]


@pytest.mark.parametrize("case", range(len(MLR_CASES)))
def test_mlr_module_matches_the_transcription(case):
    kw = dict(MLR_CASES[case])
    core_scale = kw.pop("core_scale", 1.0)
    torch.manual_seed(20 + case)
    m = strata.BilinearMLRAttention(**kw, dtype=torch.float64)
    randomise(m, core_scale, mlr_core_dims(m), seed=case)
    x = torch.randn(2, 6, m.embed_dim, dtype=torch.float64)
    check_against_truth(m, mlr_by_hand, x, seed=case)


def test_module_parameters_match_the_cpp_names_and_shapes():
    btt = strata.BilinearBTTAttention(64, 4, btt_rank=2)
    assert btt.btt_shape == (4, 16, 4, 16)
    assert [n for n, _ in btt.named_parameters()] == ["w_k", "w_q", "key_norm_weight", "v_proj.weight",
                                                      "out_proj.weight"]
    assert btt.w_k.shape == (4, 16, 4 * 16 * 2) and btt.w_q.shape == (4 * 16, 4, 4 * 2)
    mlr = strata.BilinearMLRAttention(32, 2, [8, 4, 4], bias=True)
    assert mlr.w_q_3.shape == (4, 8, 2 * 4) and mlr.q_norm_weight_2.shape == (4 * 2,)
    assert len(list(mlr.parameters())) == 6 * 3 + 4


def test_bad_input_names_the_argument():
    B, M = strata.BilinearBTTAttention, strata.BilinearMLRAttention
    assert_raises_naming(ValueError, lambda: B(64, 5), "BilinearBTTAttention: argument 'num_heads'")
    assert_raises_naming(ValueError, lambda: B(1, 1),
                         "BilinearBTTAttention: argument 'embed_dim': expected an integer >= 2")
    assert_raises_naming(ValueError, lambda: B(64, 4, factorization="tall"), "argument 'factorization'")
    assert_raises_naming(ValueError, lambda: B(64, 4, btt_shape=(4, 16, 8, 4)), "argument 'btt_shape'")
    assert_raises_naming(ValueError, lambda: B(64, 4, btt_rank=0), "argument 'btt_rank'")
    assert_raises_naming(ValueError, lambda: B(64, 4, logit_scale="mu"), "argument 'logit_scale'")
    assert_raises_naming(TypeError, lambda: B(64, 4, causal=1), "argument 'causal'")
    assert_raises_naming(ValueError, lambda: M(64, 4, [8, 4]),
                         "BilinearMLRAttention: argument 'ranks': expected r_1 + .. + r_L = head_dim = embed_dim / "
                         "num_heads = 16")
    assert_raises_naming(ValueError, lambda: M(64, 4, [16, 0]), "argument 'ranks': expected r_l >= 1")
    assert_raises_naming(ValueError, lambda: M(18, 2, [3, 3, 3]),
                         "BilinearMLRAttention: argument 'embed_dim': expected a multiple of the block count "
                         "2^(L-1) = 4")
    m = B(16, 2)
    assert_raises_naming(RuntimeError, lambda: m(torch.randn(2, 3, 15)), "BilinearBTTAttention.forward: argument 'x'")
    assert_raises_naming(RuntimeError, lambda: m(torch.randn(2, 3, 16, dtype=torch.float64)), "argument 'x'")
    w_k, w_q = torch.randn(4, 4, 8), torch.randn(8, 4, 4)
    assert_raises_naming(RuntimeError, lambda: strata.btt_key_transform(torch.randn(3, 15), w_k, w_q, 2),
                         "btt_key_transform: argument 'x'")
    assert_raises_naming(RuntimeError, lambda: strata.btt_key_transform(torch.randn(3, 16), w_k, w_q, 3),
                         "btt_key_transform: argument 'w_q'")
    assert_raises_naming(RuntimeError, lambda: strata.block_diag_transform(torch.randn(3, 12), torch.randn(4, 3, 3), 2),
                         "block_diag_transform: argument 'w'")
    # The functional op checks the weights it is handed (a level of the wrong shape).
    mlr = M(24, 2, [8, 4])
    with torch.no_grad():
        ws = mlr._list("w_q")
    assert_raises_naming(RuntimeError, lambda: torch.ops.strata.bilinear_mlr_attention(
        torch.randn(1, 3, 24), [ws[0], ws[1][:, :, :4]], mlr._list("w_k"), [], [], [], [], mlr.v_proj.weight, None,
        mlr.out_proj.weight, None, 2), "bilinear_mlr_attention: argument 'w_k[1]'")
