"""Tests of strata.monarch (MonarchAttention and the Performer / Nystromformer baselines).

Run: STRATA_LIB=<build>/torch/libstrata_torch.so PYTHONPATH=python python -m pytest -q tests/python/test_monarch.py

Truth for MonarchAttention is ``monarch_materialised`` below: the algorithm of
include/strata/monarch.h (stable mode) written in float64 torch from the paper's formulas, with
the Monarch matrix A[(l,j),(k,i)] = L_j[l,k] R_k[j,i] built explicitly and out = A v; its
gradients are torch autograd's. The kernel's tolerances are the core test's
(tests/cpp/core_monarch_test.cpp): fp32 forward 2e-5, gradients 1e-4 with a 1e-2 floor.
"""

from __future__ import annotations

import math
import os
import random

import pytest
import torch

import strata
from conftest import bf16_engines, out_and_grads, rel_err, strided_view

FP32_FWD = 2e-5
FP32_GRAD = 1e-4


def monarch_materialised(q, k, v, num_steps=1, block_size=0, pad="post", mask=None, scale=None):
    """Stable-mode MonarchAttention in float64 (BSHD in and out), materialising A per head."""
    q, k, v = q.double(), k.double(), v.double()
    bt, n, hq, d = q.shape
    rep = hq // k.shape[2]
    k, v = k.repeat_interleave(rep, 2), v.repeat_interleave(rep, 2)
    dv = v.shape[3]
    b = math.isqrt(n) if block_size == 0 else block_size
    b = max(1, min(b, n))
    m = -(-n // b)
    p = m * b
    front = p - n if pad == "pre" else 0
    sc = 1 / math.sqrt(d) if scale is None else scale
    w = torch.ones(bt, n, dtype=torch.float64) if mask is None else mask.double()
    wp = torch.zeros(bt, p, dtype=torch.float64)
    wp[:, front : front + n] = w
    wp = wp.view(bt, 1, m, b)  # [batch, 1, block, offset]: 1 for a real unmasked token

    def padded(t):  # [batch, head, block, offset, dim]
        z = t.new_zeros(bt, p, hq, t.shape[-1])
        z[:, front : front + n] = t
        return z.permute(0, 2, 1, 3).reshape(bt, hq, m, b, -1)

    qp, kp, vp = padded(q), padded(k), padded(v)
    key_ok = wp > 0  # [batch, 1, block k, offset i]
    blk_ok = key_ok.any(-1)  # [batch, 1, block k]: has a valid key
    neg = -1e300
    a = qp * wp[..., None]  # stable init: masked queries excluded from the start
    c = wp.expand(bt, hq, m, b)
    for t in range(num_steps):
        cpos = c > 0
        abar = a / torch.where(cpos, c, torch.ones_like(c))[..., None] * cpos[..., None]
        s = sc * torch.einsum("bhkjd,bhkid->bhkji", abar, kp)  # R_k[j, i] logits
        s = s.masked_fill(~key_ok[:, :, :, None, :], neg)
        r = torch.softmax(s, -1) * blk_ok[..., None, None]  # no valid key in block k: R = 0
        al = sc * torch.einsum("bhkji,bhkid->bhjkd", r, kp)
        cl = (r * torch.log(r.clamp_min(1e-300))).sum(-1).transpose(-1, -2)  # [b, h, j, k]
        u = torch.einsum("bhljd,bhjkd->bhjlk", qp, al) - cl[:, :, :, None, :]  # L_j[l, k] logits
        u = u.masked_fill(~blk_ok[:, :, None, None, :], neg)
        lm = torch.softmax(u, -1)  # [b, h, j, l, k]
        if t < num_steps - 1:
            lw = lm * wp.transpose(-1, -2)[:, :, :, :, None]  # w of query (l, j)
            c = torch.einsum("bhjlk->bhkj", lw)
            a = torch.einsum("bhjlk,bhljd->bhkjd", lw, qp)
    big_a = torch.einsum("bhjlk,bhkji->bhljki", lm, r).reshape(bt, hq, p, p)
    o = big_a @ vp.reshape(bt, hq, p, dv) * wp.reshape(bt, 1, p, 1)  # masked queries: 0
    return o[:, :, front : front + n].permute(0, 2, 1, 3)


def make_qkv(bt, n, hq, hkv, d, dv, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = (torch.rand(bt, n, hq, d, generator=g, dtype=torch.float64) * 2 - 1).to(dtype)
    k = (torch.rand(bt, n, hkv, d, generator=g, dtype=torch.float64) * 2 - 1).to(dtype)
    v = (torch.rand(bt, n, hkv, dv, generator=g, dtype=torch.float64) * 2 - 1).to(dtype)
    return q, k, v


def make_mask(bt, n, seed=0):
    g = torch.Generator().manual_seed(seed + 100)
    mask = torch.rand(bt, n, generator=g) > 0.3
    mask[:, 0] = True
    return mask


CASES = [
    # bt, n, hq, hkv, d, dv, block, steps, pad, masked
    (1, 1, 1, 1, 8, 8, 0, 1, "post", False),
    (2, 7, 2, 1, 16, 16, 3, 2, "pre", True),
    (1, 29, 4, 2, 12, 20, 5, 3, "post", True),
    (2, 33, 3, 3, 8, 8, 0, 2, "pre", False),
    (1, 20, 2, 2, 8, 8, 64, 2, "post", True),
    (1, 16, 2, 1, 8, 8, 1, 3, "post", True),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "n{1}_B{6}_T{7}_{8}{9}".format(*c))
def test_op_matches_materialised_float64(case):
    bt, n, hq, hkv, d, dv, block, steps, pad, masked = case
    q, k, v = make_qkv(bt, n, hq, hkv, d, dv, seed=n)
    mask = make_mask(bt, n, seed=n) if masked else None
    opts = dict(num_steps=steps, block_size=block, pad=pad, key_padding_mask=mask)
    want = monarch_materialised(q, k, v, steps, block, pad, mask)
    out = strata.monarch_attention(q, k, v, **opts)
    assert out.dtype == torch.float32 and out.shape == (bt, n, hq, dv)
    assert rel_err(out, want) <= FP32_FWD
    # The float64 path (the C++ double reference) is the same math: agreement to rounding.
    out64 = strata.monarch_attention(q.double(), k.double(), v.double(), **opts)
    assert rel_err(out64, want) <= 1e-10
    # The forward op alone gives the same output and a state of the documented shape.
    out_f, state = strata.monarch_attention_forward(q, k, v, **opts)
    assert torch.equal(out_f, out)
    b_eff = max(1, min(math.isqrt(n) if block == 0 else block, n))
    assert state.shape == (bt, hq, steps - 1, -(-n // b_eff) * b_eff, d) and state.dtype == torch.float32


@pytest.mark.parametrize("case", CASES[1:4], ids=lambda c: "n{1}_B{6}_T{7}_{8}{9}".format(*c))
def test_gradients_match_autograd_of_materialised(case):
    bt, n, hq, hkv, d, dv, block, steps, pad, masked = case
    q, k, v = make_qkv(bt, n, hq, hkv, d, dv, seed=2 * n)
    mask = make_mask(bt, n, seed=n) if masked else None
    g = torch.rand(bt, n, hq, dv, dtype=torch.float64, generator=torch.Generator().manual_seed(5))

    def grads(fn, dtype):
        leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
        out = fn(*leaves)
        return torch.autograd.grad(out, leaves, g.to(out.dtype))

    got = grads(
        lambda a, b, c: strata.monarch_attention(
            a, b, c, num_steps=steps, block_size=block, pad=pad, key_padding_mask=mask
        ),
        torch.float32,
    )
    want = grads(lambda a, b, c: monarch_materialised(a, b, c, steps, block, pad, mask), torch.float64)
    for name, x, y in zip(("dq", "dk", "dv"), got, want):
        assert rel_err(x, y, floor=1e-2) <= FP32_GRAD, name
    # The backward op alone, with the saved state and recomputing it, agrees with autograd.
    opts = dict(num_steps=steps, block_size=block, pad=pad, key_padding_mask=mask)
    out, state = strata.monarch_attention_forward(q, k, v, **opts)
    for st in (state, None):
        dq, dk, dv_ = strata.monarch_attention_backward(q, k, v, st, g.float(), **opts)
        assert rel_err(dq, want[0], floor=1e-2) <= FP32_GRAD
        assert rel_err(dk, want[1], floor=1e-2) <= FP32_GRAD
        assert rel_err(dv_, want[2], floor=1e-2) <= FP32_GRAD


RANDOM_CASES = int(os.environ.get("STRATA_RANDOM_CASES", "120"))


@pytest.mark.parametrize("seed", range(RANDOM_CASES))
def test_random_option_combinations_match_materialised(seed):
    """Seeded draws of every option at once: lengths from 1, block sizes from 1 past the length, 1-3
    steps, both paddings, key padding masks, a scale, GQA, odd head dims, both layouts, strided q /
    k / v; the output and the three gradients against the float64 materialised truth, with the
    named cases' tolerances (gradients with a 1e-2 denominator floor)."""
    rng = random.Random(seed)
    bt, n = rng.randint(1, 2), rng.choice([1, 2, 5, rng.randint(1, 70)])
    hkv = rng.randint(1, 2)
    hq = hkv * rng.choice([1, 2])
    d = rng.choice([1, 7, 16, rng.randint(1, 40)])
    dv = rng.choice([d, rng.randint(1, 40)])
    block, steps, pad = rng.choice([0, 0, 1, 2, rng.randint(1, n + 2)]), rng.randint(1, 3), rng.choice(["post", "pre"])
    scale = rng.choice([None, 0.3])
    mask = make_mask(bt, n, seed=seed) if rng.random() < 0.4 else None
    layout = rng.choice(["bshd", "bhsd"])
    q, k, v = make_qkv(bt, n, hq, hkv, d, dv, seed=seed)
    g = torch.rand(bt, n, hq, dv, dtype=torch.float64, generator=torch.Generator().manual_seed(1000 + seed))

    def to_layout(t):  # BSHD -> the call's layout, possibly a strided view
        t = t.transpose(1, 2).contiguous() if layout == "bhsd" else t
        return strided_view(t, "swapped" if rng.random() < 0.3 else "as_is")

    def to_bshd(t):
        return t.transpose(1, 2) if layout == "bhsd" else t

    opts = dict(num_steps=steps, block_size=block, pad=pad, key_padding_mask=mask, scale=scale, layout=layout)
    got = [to_bshd(t) for t in out_and_grads(lambda a, b, c: strata.monarch_attention(a, b, c, **opts),
                                             *(to_layout(t) for t in (q, k, v)), to_layout(g.float()))]
    want = out_and_grads(lambda a, b, c: monarch_materialised(a, b, c, steps, block, pad, mask, scale),
                         q.double(), k.double(), v.double(), g)
    what = f"seed {seed}: bt {bt} n {n} hq {hq} hkv {hkv} d {d} dv {dv} masked {mask is not None} opts {opts}"
    assert rel_err(got[0], want[0]) <= FP32_FWD, what
    for name, x, y in zip(("dq", "dk", "dv"), got[1:], want[1:]):
        assert rel_err(x, y, floor=1e-2) <= FP32_GRAD, f"{what} {name}"


@pytest.mark.parametrize("mode", ["stable", "reference"])
def test_gradcheck_float64(mode):
    q, k, v = make_qkv(1, 9, 2, 1, 6, 5, dtype=torch.float64, seed=3)
    mask = make_mask(1, 9, seed=3)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]

    def fn(a, b, c):
        return strata.monarch_attention(a, b, c, num_steps=2, block_size=4, mode=mode, key_padding_mask=mask)

    assert torch.autograd.gradcheck(fn, leaves, eps=1e-6, atol=1e-7, rtol=1e-5)


def test_baselines_gradcheck_float64():
    q, k, v = make_qkv(2, 8, 2, 1, 4, 3, dtype=torch.float64, seed=4)
    mask = torch.ones(2, 8, dtype=torch.bool)
    mask[1, 6:] = False
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    # fast_mode: random projections of the Jacobian (the full one is ~40x slower for ATen
    # compositions of many small ops; torch's autograd of ATen ops needs no exhaustive check).
    assert torch.autograd.gradcheck(
        lambda a, b, c: strata.performer_attention(a, b, c, 16, seed=1, key_padding_mask=mask), leaves, fast_mode=True
    )
    assert torch.autograd.gradcheck(
        lambda a, b, c: strata.nystrom_attention(a, b, c, 3, key_padding_mask=mask), leaves, fast_mode=True
    )


def pinv_error_bound(s_mat: torch.Tensor, v: torch.Tensor, iters: int) -> float:
    """Bound on max |S Z S v - S v| after `iters` iterations (derivation in the C++ test):
    along singular value sigma the residual of I - S Z starts at 1 - sigma^2 / c and maps
    r -> r^3 (3 + r) / 4; the error is at most max(r sigma) * ||v||_2."""
    c = (s_mat.abs().sum(0).max() * s_mat.abs().sum(1).max()).item()
    worst = 0.0
    for sig in torch.linalg.svdvals(s_mat).tolist():
        r = 1 - sig * sig / c
        for _ in range(iters):
            r = r**3 * (3 + r) / 4
        worst = max(worst, r * sig)
    return worst * torch.linalg.matrix_norm(v, 2).item()


def test_nystrom_with_one_landmark_per_token_is_softmax():
    # One landmark per token: F = A = B = S = softmax(q k^T / sqrt(D)), out = S Z S v, equal to
    # softmax attention S v up to the pseudo-inverse iteration's error (bounded above) + rounding.
    g = torch.Generator().manual_seed(7)
    for amp in (1.2, 1.0):  # q = k, strongly diagonal S (converged); then generic q, k
        q = torch.randn(1, 24, 1, 16, generator=g, dtype=torch.float64) * amp
        k = q if amp > 1 else torch.randn(1, 24, 1, 16, generator=g, dtype=torch.float64)
        v = torch.randn(1, 24, 1, 8, generator=g, dtype=torch.float64)
        s_mat = torch.softmax(q[0, :, 0] @ k[0, :, 0].T / 4, -1)
        want = s_mat @ v[0, :, 0]
        bound = pinv_error_bound(s_mat, v[0, :, 0], 6)
        err = (strata.nystrom_attention(q, k, v, 24)[0, :, 0] - want).abs().max().item()
        assert err <= bound + 1e-10 * want.abs().max().item(), (amp, err, bound)


def test_performer_seed_reproducible():
    # Same seed, same features; the outputs are not bitwise equal in every process (a first call
    # was seen 2.5e-5 off, tests/cpp/encoder_convert_test.cpp), another seed moves them by O(1).
    q, k, v = make_qkv(1, 12, 2, 2, 8, 8, seed=5)
    a = strata.performer_attention(q, k, v, 32, seed=3)
    bound = 1e-4 * max(1.0, a.abs().max().item())
    assert (a - strata.performer_attention(q, k, v, 32, seed=3)).abs().max().item() <= bound
    assert (a - strata.performer_attention(q, k, v, 32, seed=4)).abs().max().item() > bound


def test_flops():
    # ViT-B/16 in the paper: N = 197, B = 14, 12 heads x 12 layers, T = 1: 1.39e8 MACs plotted.
    assert abs(12 * strata.monarch_attention_flops(197, 12, 64, 64, 1, 14) / 2 - 1.39e8) < 0.01e8
    assert strata.softmax_attention_flops(100, 16) == 4 * 100 * 100 * 16
    assert strata.performer_attention_flops(100, 16, 16, 8) == 2 * 100 * 8 * (4 * 16 + 1)
    assert strata.nystrom_attention_flops(100, 16, 16, 10) == 2 * (2 * 100 * 10 * 32 + 100 * 32 + 36 * 1000)
    with pytest.raises(RuntimeError, match="argument 'T'"):
        strata.monarch_attention_flops(10, 1, 8, 8, 0, 2)


# The compute option (as strata.attention's): "auto" and "fp32" compute in fp32 for Monarch (its
# bf16 products are opt in), bit for bit the same; each bf16 engine this CPU has runs the forward's
# products and the backward's gradient products (an output and gradients unlike fp32's) within the
# core sweep's bf16-products tolerance of the float64 path (2e-2, gradients with a 1e-2 floor:
# core_monarch_test.cpp), and the module and the ops carry it; a name that is no engine is an error
# naming 'compute'.
@pytest.mark.parametrize("compute", ["auto", "avx512_bf16", "amx_bf16"])
def test_bfloat16_compute_option(compute):
    if compute != "auto" and compute not in bf16_engines():
        pytest.skip(f"this CPU has no {compute}")
    q, k, v = make_qkv(2, 29, 4, 2, 16, 16, dtype=torch.bfloat16, seed=7)
    mask = make_mask(2, 29, seed=7)
    g = torch.rand(2, 29, 4, 16, generator=torch.Generator().manual_seed(8)).bfloat16()
    opts = dict(num_steps=2, block_size=5, key_padding_mask=mask)

    def run(compute_, dtype=torch.bfloat16):
        return out_and_grads(lambda a, b, c: strata.monarch_attention(a, b, c, **opts, compute=compute_),
                             q.to(dtype), k.to(dtype), v.to(dtype), g)

    got = run(compute)
    fp32 = run("fp32")
    want = run("auto", torch.float64)
    if compute == "auto":
        for a, b in zip(got, fp32):
            assert torch.equal(a, b), "compute auto is not Monarch's fp32 products"
    else:
        for name, a, b in zip(("o", "dq", "dk", "dv"), got, fp32):
            assert not torch.equal(a, b), f"compute={compute} gave the fp32 products' {name}"
    assert rel_err(got[0], want[0]) <= 2e-2
    for name, a, b in zip(("dq", "dk", "dv"), got[1:], want[1:]):
        assert rel_err(a, b, floor=1e-2) <= 2e-2, name
    out, state = strata.monarch_attention_forward(q, k, v, **opts, compute=compute)
    assert torch.equal(out, got[0])
    grads = strata.monarch_attention_backward(q, k, v, state, g, **opts, compute=compute)
    for name, a, b in zip(("dq", "dk", "dv"), grads, got[1:]):
        assert torch.equal(a, b), f"{name}: the backward op differs from autograd's"
    module = strata.MonarchAttention(2, 5, compute=compute)
    assert torch.equal(module(q, k, v, mask), got[0])
    with pytest.raises(RuntimeError, match="monarch_attention_forward: argument 'compute'"):
        strata.monarch_attention_forward(q, k, v, compute="bf16")


def test_errors_name_the_argument():
    q, k, v = make_qkv(1, 8, 2, 2, 8, 8)
    with pytest.raises(RuntimeError, match="monarch_attention: argument 'pad'"):
        strata.monarch_attention(q, k, v, pad="middle")
    with pytest.raises(RuntimeError, match="argument 'num_steps'"):
        strata.monarch_attention(q, k, v, num_steps=0)
    with pytest.raises(RuntimeError, match="argument 'key_padding_mask'"):
        strata.monarch_attention(q, k, v, key_padding_mask=torch.ones(1, 7, dtype=torch.bool))
    with pytest.raises(RuntimeError, match="nystrom_attention: argument 'num_landmarks'"):
        strata.nystrom_attention(q, k, v, 0)
    with pytest.raises(RuntimeError, match="performer_attention: argument 'num_features'"):
        strata.performer_attention(q, k, v, 0)


# ---- modules and the converter ------------------------------------------------------------------


class SelfAttention(torch.nn.Module):
    """A strata-aware block: its attention computation is the attribute ``attention``."""

    def __init__(self, dim, heads):
        super().__init__()
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.out = torch.nn.Linear(dim, dim)
        self.heads = heads
        self.attention = strata.SoftmaxAttention()

    def forward(self, x, mask=None):
        q, k, v = self.qkv(x).unflatten(-1, (3, self.heads, -1)).unbind(2)
        return x + self.out(self.attention(q, k, v, mask).flatten(2))


class Tiny(torch.nn.Module):
    def __init__(self, dim=32, heads=4, layers=3):
        super().__init__()
        self.blocks = torch.nn.ModuleList(SelfAttention(dim, heads) for _ in range(layers))

    def forward(self, x, mask=None):
        for blk in self.blocks:
            x = blk(x, mask)
        return x


def test_monarch_module_and_converter():
    torch.manual_seed(0)
    model = Tiny()
    x = torch.randn(2, 21, 32)
    mask = torch.ones(2, 21, dtype=torch.bool)
    mask[1, 15:] = False
    with torch.no_grad():
        ref = model(x, mask)
    # One block covering the sequence is exact softmax attention (on the valid tokens).
    names = strata.convert_attention(model, lambda i: strata.MonarchAttention(num_steps=2, block_size=64), [0, 2])
    assert names == ["blocks.0", "blocks.2"]
    assert isinstance(model.blocks[0].attention, strata.MonarchAttention)
    assert isinstance(model.blocks[1].attention, strata.SoftmaxAttention)
    with torch.no_grad():
        out = model(x, mask)
    assert rel_err(out[0], ref[0]) <= 1e-5 and rel_err(out[1, :15], ref[1, :15]) <= 1e-5
    # Small blocks approximate; the model still trains through it (autograd reaches the weights).
    strata.convert_attention(model, lambda i: strata.MonarchAttention(num_steps=1, block_size=4))
    out = model(x, mask)
    assert rel_err(out[0].detach(), ref[0]) > 1e-4
    out[0].sum().backward()
    assert model.blocks[0].qkv.weight.grad is not None and model.blocks[0].qkv.weight.grad.abs().sum() > 0
    # Any callable works, including a plain function replacing a registered module.
    strata.convert_attention(model, lambda i: (lambda q, k, v, m=None: strata.nystrom_attention(q, k, v, 21)), [1])
    assert not isinstance(model.blocks[1].attention, torch.nn.Module)
    with pytest.raises(ValueError, match="argument 'layers'"):
        strata.convert_attention(model, lambda i: strata.MonarchAttention(), [3])
    with pytest.raises(ValueError, match="distinct"):
        strata.convert_attention(model, lambda i: strata.MonarchAttention(), [0, 0])
    with pytest.raises(ValueError, match="no submodule"):
        strata.convert_attention(torch.nn.Linear(2, 2), lambda i: strata.MonarchAttention())


def test_baseline_modules():
    q, k, v = make_qkv(1, 12, 2, 2, 8, 8, seed=6)
    assert torch.equal(
        strata.PerformerAttention(16, seed=2)(q, k, v), strata.performer_attention(q, k, v, 16, seed=2)
    )
    assert torch.equal(strata.NystromAttention(4)(q, k, v), strata.nystrom_attention(q, k, v, 4))
