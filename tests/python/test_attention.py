"""Tests of the Python package (python/strata) over libstrata_torch.so.

Run: STRATA_LIB=<build>/torch/libstrata_torch.so PYTHONPATH=python python -m pytest -q tests/python

Truth is PyTorch: torch.autograd.gradcheck in float64 (strata's float64 path is the double
reference), and scaled_dot_product_attention in float64 with the mask written out from the
definition in include/strata/attention.h. SDPA's is_causal is top-left aligned while strata's
causal is bottom-right (as FlashAttention), so the boolean mask is always built here. GQA:
k and v are expanded with repeat_interleave; a query shared by heads likewise (autograd then sums
its copies' gradients). Errors are normwise: max|got - want| / max|want|.
"""

from __future__ import annotations

import math
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import strata
from conftest import (assert_as_close_as_torch, assert_grads_as_close_as_torch, assert_raises_naming, bf16_engines,
                      natural_grad_sizes, out_and_grads, rand_qkv, rel_err, strided_view)

# Acceptance rule (FlashAttention's): strata's error against the float64 truth is at most twice
# PyTorch's own error for the same computation in the same precision, plus a floor for draws on
# which PyTorch happens to be unusually exact.
#   fp32 floor 1e-6: ~8 ulps of the largest output; both implementations round every logit, exp
#        and sum to fp32 and measure 2e-7..1.6e-6 on sizes up to 256 x 256 x 128.
#   bf16 floor 2^-8: one bf16 unit roundoff, paid by the final rounding of every output.
# A masking, indexing or scaling bug gives errors of order 1e-1.
FP32_FLOOR = 1e-6
BF16_FLOOR = 2.0**-8


def allowed_mask(nq: int, nk: int, causal=False, window=(-1, -1), num_global=0) -> torch.Tensor:
    """Bool nq x nk: key j allowed for query i (bottom-right alignment, Longformer globals)."""
    p = torch.arange(nq)[:, None] + (nk - nq)
    j = torch.arange(nk)[None, :]
    ok = (j <= p) if causal else torch.ones(nq, nk, dtype=torch.bool)
    win = torch.ones(nq, nk, dtype=torch.bool)
    if window[0] >= 0:
        win &= j >= p - window[0]
    if window[1] >= 0:
        win &= j <= p + window[1]
    glob = (j < num_global) | ((p >= 0) & (p < num_global))
    return ok & (win | glob)


def sdpa_bshd(q, k, v, mask=None, scale=None):
    """SDPA on B x N x H x D tensors with H = max(Hq, Hkv) heads: q, k, v each repeated to H by
    repeat_interleave (GQA, or a shared query); mask bool (True = attend) or float (added),
    broadcastable to B x H x Nq x Nk. Returns B x Nq x H x Dv."""
    h = max(q.shape[2], k.shape[2])
    qt, kt, vt = (t.transpose(1, 2).repeat_interleave(h // t.shape[2], 1) for t in (q, k, v))
    return F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, scale=scale).transpose(1, 2)


def masked_sdpa(allowed, additive, scale=None):
    """sdpa_bshd on BSHD tensors under the bool mask `allowed` (True = attend) and the float logits
    `additive`, both broadcastable to B x H x Nq x Nk; rows with no allowed key give zeros, as
    strata's do (documented choice), where SDPA's would be NaN."""
    float_mask = additive.masked_fill(~allowed, -math.inf)
    row_ok = allowed.any(-1).transpose(1, 2)[..., None]  # B x Nq x 1 x 1
    return lambda q, k, v: sdpa_bshd(q, k, v, float_mask.to(q.dtype), scale) * row_ok


# ---- gradcheck (float64 = the double reference) ---------------------------------------------

GRADCHECK_CASES = {
    "plain": dict(shape=(2, 5, 7, 2, 2, 3, 4), opts={}),
    "causal_nq_gt_nk": dict(shape=(1, 6, 4, 2, 2, 3, 3), opts=dict(causal=True)),
    "causal_window": dict(shape=(1, 6, 8, 2, 2, 3, 3), opts=dict(causal=True, window=(2, 0))),
    "window_global": dict(shape=(1, 7, 7, 2, 1, 3, 2), opts=dict(window=(1, 1), num_global=2)),
    "key_padding_mask": dict(shape=(2, 4, 6, 2, 2, 3, 3), opts=dict(mask=True)),
    "bias": dict(shape=(2, 4, 5, 2, 2, 3, 3), opts=dict(bias=True)),
    "gqa": dict(shape=(1, 5, 6, 4, 2, 3, 3), opts=dict(causal=True)),
    "bhsd": dict(shape=(2, 5, 6, 2, 1, 3, 2), opts=dict(causal=True, window=(2, 1), layout="bhsd")),
    # a query shared by heads (heads_kv a multiple of heads_q): dq sums its heads' contributions
    "shared_query": dict(shape=(2, 5, 6, 1, 3, 3, 4), opts=dict(causal=True)),
    "shared_query_2_of_4_bias_bhsd": dict(shape=(2, 4, 5, 2, 4, 3, 2), opts=dict(bias=True, layout="bhsd")),
    "shared_query_window_mask": dict(shape=(2, 6, 6, 1, 2, 4, 3), opts=dict(window=(2, 1), mask=True)),
}


@pytest.mark.parametrize("name", list(GRADCHECK_CASES))
def test_gradcheck_float64(name):
    case = GRADCHECK_CASES[name]
    b, nq, nk, hq, hkv, d, dv = case["shape"]
    opts = dict(case["opts"])
    layout = opts.get("layout", "bshd")
    q, k, v = rand_qkv(b, nq, nk, hq, hkv, d, dv, torch.float64, layout, seed=1)
    if opts.pop("mask", False):
        mask = torch.ones(b, nk, dtype=torch.bool)
        mask[1, 2:4] = False
        opts["key_padding_mask"] = mask
    if opts.pop("bias", False):
        opts["bias"] = torch.randn(b, 1, nq, nk, dtype=torch.float64)  # broadcast over heads
    inputs = tuple(t.requires_grad_() for t in (q, k, v))
    assert torch.autograd.gradcheck(lambda q, k, v: strata.attention(q, k, v, **opts), inputs)


def test_gradcheck_paper_gswa_float64():
    q, k, v = rand_qkv(2, 7, 7, 2, 2, 5, 3, torch.float64, seed=2)
    inputs = tuple(t.requires_grad_() for t in (q, k, v))
    assert torch.autograd.gradcheck(lambda q, k, v: strata.paper_gswa_attention(q, k, v, 2, 3), inputs)


# ---- fp32 kernel vs SDPA --------------------------------------------------------------------

FP32_CASES = {
    "plain": dict(shape=(2, 37, 53, 4, 4, 40, 40), opts={}),
    "causal_square": dict(shape=(2, 64, 64, 2, 2, 32, 32), opts=dict(causal=True)),
    "causal_nq_lt_nk": dict(shape=(1, 29, 70, 3, 3, 24, 16), opts=dict(causal=True)),
    "causal_nq_gt_nk": dict(shape=(1, 50, 31, 2, 2, 16, 16), opts=dict(causal=True)),
    "gqa_window": dict(shape=(2, 41, 41, 6, 2, 59, 59), opts=dict(causal=True, window=(8, 0))),
    "mqa_global_window": dict(shape=(1, 45, 45, 4, 1, 32, 48), opts=dict(window=(5, 5), num_global=3)),
    "padding_bias": dict(shape=(2, 33, 47, 4, 2, 16, 16), opts=dict(causal=True, mask=True, bias=True)),
    "bhsd": dict(shape=(2, 30, 38, 4, 2, 24, 24), opts=dict(causal=True, window=(9, 3), layout="bhsd")),
    # A window shorter than the prefix (seq_k - seq_q > left): the kernels run on the keys the
    # window reaches only (src/cpu/attention.cpp, first_reachable_key); the others get zero dk, dv.
    "decode_window_prefix": dict(shape=(2, 3, 70, 2, 2, 16, 16), opts=dict(causal=True, window=(9, 0))),
    "prefill_window_prefix_mask_bias": dict(shape=(2, 20, 150, 4, 2, 24, 20),
                                            opts=dict(causal=True, window=(7, 2), mask=True, bias=True)),
    "window_prefix_not_causal_bhsd": dict(shape=(1, 33, 160, 2, 1, 16, 16),
                                          opts=dict(window=(30, 4), layout="bhsd")),
}


@pytest.mark.parametrize("name", list(FP32_CASES))
def test_float32_forward_and_grads_match_sdpa(name):
    case = FP32_CASES[name]
    b, nq, nk, hq, hkv, d, dv = case["shape"]
    opts = dict(case["opts"])
    layout = opts.get("layout", "bshd")
    q, k, v = rand_qkv(b, nq, nk, hq, hkv, d, dv, torch.float32, layout, seed=3)
    allowed = allowed_mask(nq, nk, opts.get("causal", False), opts.get("window", (-1, -1)), opts.get("num_global", 0))
    allowed = allowed[None, None]  # 1 x 1 x Nq x Nk
    additive = torch.zeros(1, 1, nq, nk, dtype=torch.float64)
    if opts.pop("mask", False):
        mask = torch.ones(b, nk, dtype=torch.bool)
        mask[-1, nk // 2 :] = False
        opts["key_padding_mask"] = mask
        allowed = allowed & mask[:, None, None, :]
    if opts.pop("bias", False):
        bias = torch.randn(1, hq, nq, nk)  # broadcast over batch
        opts["bias"] = bias
        additive = additive + bias.double()
    run_sdpa = masked_sdpa(allowed, additive)

    def to_bshd(t):
        return t.transpose(1, 2) if layout == "bhsd" else t

    g = torch.randn(to_bshd(q).shape[:3] + (dv,), generator=torch.Generator().manual_seed(4))
    g = g.transpose(1, 2) if layout == "bhsd" else g
    got = out_and_grads(lambda q, k, v: strata.attention(q, k, v, **opts), q, k, v, g)
    assert got[0].shape == (q.shape[:3] + (dv,))
    got = [to_bshd(t) for t in got]
    qs, ks, vs = to_bshd(q), to_bshd(k), to_bshd(v)
    want = out_and_grads(run_sdpa, qs.double(), ks.double(), vs.double(), to_bshd(g))
    torch32 = out_and_grads(run_sdpa, qs, ks, vs, to_bshd(g))
    assert_as_close_as_torch(got, want, torch32, FP32_FLOOR, what=name)


RANDOM_CASES = int(os.environ.get("STRATA_RANDOM_CASES", "200"))


RANDOM_CASES = int(os.environ.get("STRATA_RANDOM_CASES", "200"))


def _assert_grads_close(got, want, torch32, natural, what):
    """[dq, dk, dv]: |strata - truth| <= 2 |PyTorch fp32 - truth| + FP32_FLOOR * max(max|truth|,
    natural), elementwise maxima; natural = the size of one term of each gradient's sums (for dq,
    scale * max|k| * max|dO . v|; dk, scale * max|q| * max|dO . v|; dv, max|dO|): fp32 round-off
    of a sum is a few ulps of its terms, and a row with one allowed key cancels its terms exactly."""
    for name, a, w, t, n in zip(("dq", "dk", "dv"), got, want, torch32, natural):
        err = (a.double() - w).abs().max().item()
        err_torch = (t.double() - w).abs().max().item()
        bound = 2 * err_torch + FP32_FLOOR * max(w.abs().max().item(), n)
        assert err <= bound, f"{what} {name}: error {err:.3g} vs torch {err_torch:.3g}, bound {bound:.3g}"


class RandomDraw:
    """One seeded draw of every option of attention at once: sizes from 1, odd head dims, GQA / MQA
    and a query shared by kv heads, causal, windows, globals, key padding with fully masked rows, a
    bias broadcast over any dims, an explicit scale, both layouts, strided q / k / v."""

    def __init__(self, seed: int, dtype: torch.dtype):
        rng = random.Random(seed)
        self.b = b = rng.randint(1, 3)
        self.nq = nq = rng.choice([1, 2, 7, rng.randint(1, 97)])
        self.nk = nk = rng.choice([nq, 1, rng.randint(1, 97)])
        base, group = rng.randint(1, 3), rng.choice([1, 2, 3])
        self.hq, self.hkv = hq, hkv = (base, base * group) if rng.random() < 0.3 else (base * group, base)
        self.h = h = max(hq, hkv)
        self.d = d = rng.choice([1, 3, 17, 64, rng.randint(1, 80)])
        self.dv = dv = rng.choice([d, rng.randint(1, 80)])
        causal = rng.random() < 0.5
        window = (rng.choice([-1, 0, 3, rng.randint(0, 40)]), rng.choice([-1, 0, 2, rng.randint(0, 40)]))
        window = window if rng.random() < 0.5 else (-1, -1)
        num_global = rng.choice([0, 1, 3]) if window != (-1, -1) else 0
        self.scale = scale = rng.choice([None, 0.1, 1.0 / math.sqrt(d) * 0.7])
        self.layout = layout = rng.choice(["bshd", "bhsd"])
        g_cpu = torch.Generator().manual_seed(1000 + seed)
        self.q, self.k, self.v = rand_qkv(b, nq, nk, hq, hkv, d, dv, dtype, layout, seed=seed)
        self.opts = dict(scale=scale, causal=causal, window=window, num_global=num_global, layout=layout)
        allowed = allowed_mask(nq, nk, causal, window, num_global)[None, None]
        additive = torch.zeros(1, 1, nq, nk, dtype=torch.float64)
        if rng.random() < 0.35:
            mask = torch.rand(b, nk, generator=g_cpu) < rng.choice([0.3, 0.8])
            self.opts["key_padding_mask"] = mask
            allowed = allowed & mask[:, None, None, :]
        if rng.random() < 0.35:
            bias = torch.randn(rng.choice([1, b]), rng.choice([1, h]), rng.choice([1, nq]), nk, generator=g_cpu)
            self.opts["bias"] = bias
            additive = additive + bias.double()
        self.run_sdpa = masked_sdpa(allowed, additive, scale)
        g = torch.randn(b, nq, h, dv, generator=g_cpu)
        self.g = g.transpose(1, 2) if layout == "bhsd" else g
        self.views = [strided_view(t, rng.choice(["every_other", "swapped", "as_is"]))
                      for t in (self.q, self.k, self.v)]
        self.what = f"seed {seed}: b {b} nq {nq} nk {nk} hq {hq} hkv {hkv} d {d} dv {dv} opts {self.opts}"

    def to_bshd(self, t):
        return t.transpose(1, 2) if self.layout == "bhsd" else t


@pytest.mark.parametrize("seed", range(RANDOM_CASES))
def test_random_option_combinations_match_sdpa(seed):
    """fp32 forward and gradients of a RandomDraw against SDPA in float64: the acceptance rule of the
    named cases; gradients divided by the size of one term of their sums
    (conftest.assert_grads_as_close_as_torch: a row with one allowed key has exactly zero dq and dk,
    and strata leaves round-off of that size there)."""
    r = RandomDraw(seed, torch.float32)
    got = [r.to_bshd(t) for t in out_and_grads(lambda q, k, v: strata.attention(q, k, v, **r.opts), *r.views, r.g)]
    qs, ks, vs, gs = (r.to_bshd(t) for t in (r.q, r.k, r.v, r.g))
    want = out_and_grads(r.run_sdpa, qs.double(), ks.double(), vs.double(), gs)
    torch32 = out_and_grads(r.run_sdpa, qs, ks, vs, gs)
    assert_as_close_as_torch(got[:1], want[:1], torch32[:1], FP32_FLOOR, what=r.what)
    natural = natural_grad_sizes(qs, ks, vs, gs, r.scale if r.scale is not None else 1.0 / math.sqrt(r.d))
    assert_grads_as_close_as_torch(got[1:], want[1:], torch32[1:], natural, FP32_FLOOR, r.what)


@pytest.mark.parametrize("seed", range(RANDOM_CASES // 2))
def test_random_option_combinations_bfloat16_forward(seed):
    """The bf16 forward of a RandomDraw on each compute choice (bf16 products on this CPU's engines,
    or fp32) against SDPA in float64: at most twice SDPA bf16's own error plus one bf16 unit
    roundoff, as the named bf16 cases."""
    r = RandomDraw(seed, torch.bfloat16)
    qs, ks, vs = (r.to_bshd(t) for t in (r.q, r.k, r.v))
    want = r.run_sdpa(qs.double(), ks.double(), vs.double())
    err_torch = rel_err(r.run_sdpa(qs, ks, vs), want)
    for compute in ["auto", "fp32", *bf16_engines()]:
        out = r.to_bshd(strata.attention_forward(*r.views, **r.opts, compute=compute)[0])
        assert rel_err(out, want) <= 2 * err_torch + BF16_FLOOR, f"{r.what} compute {compute}"


def test_forward_lse_and_backward_ops_are_consistent():
    q, k, v = rand_qkv(2, 19, 27, 4, 2, 16, 12, torch.float32, seed=5)
    opts = dict(causal=True, window=(6, 0), scale=0.2)
    out, lse = strata.attention_forward(q, k, v, **opts)
    assert lse.shape == (2, 4, 19) and lse.dtype == torch.float32
    logits = torch.einsum("bihd,bjhd->bhij", q.double(), k.double().repeat_interleave(2, 2)) * 0.2
    logits = logits.masked_fill(~allowed_mask(19, 27, True, (6, 0)), -math.inf)
    # lse is one fp32 max + exp-sum + log over <= 7 keys: a few ulps of |lse| ~ 5.
    assert rel_err(lse, torch.logsumexp(logits, -1)) <= FP32_FLOOR
    dout = torch.randn_like(out)
    dq, dk, dv = strata.attention_backward(q, k, v, out, lse, dout, **opts)
    got = out_and_grads(lambda q, k, v: strata.attention(q, k, v, **opts), q, k, v, dout)
    # The autograd Function runs exactly these two ops: bitwise equal.
    for a, b in zip(got, [out, dq, dk, dv]):
        assert torch.equal(a, b)


def test_window_over_a_huge_expanded_key_tensor_needs_only_the_window():
    """2^31 keys (an expanded tensor: no memory) and a causal window of 16: the forward touches 16
    + seq_q keys, so its workspace is that size (it was 2^31 x head_dim floats: an allocation error).
    Every key is the same row, so each query's probabilities are uniform over its window:
    out = v's row and lse = log(17) + scale * q . k (exact up to fp32 roundoff)."""
    n, d, w = 2**31, 16, 16
    g = torch.Generator().manual_seed(15)
    q = torch.randn(1, 8, 2, d, generator=g)
    k_row, v_row = torch.randn(1, 1, 2, d, generator=g), torch.randn(1, 1, 2, d, generator=g)
    k, v = k_row.expand(1, n, 2, d), v_row.expand(1, n, 2, d)
    out, lse = strata.attention_forward(q, k, v, causal=True, window=(w, 0))
    want_lse = math.log(w + 1) + torch.einsum("bihd,bjhd->bhi", q.double(), k_row.double()) / math.sqrt(d)
    assert rel_err(out, v_row.expand_as(out)) <= FP32_FLOOR
    assert rel_err(lse, want_lse) <= FP32_FLOOR


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("huge", [2**63 - 1, 2**63 - 8, 2**62, 12])
def test_a_window_past_every_key_is_unbounded(causal, huge):
    """Issue 48 item 1: window=(0, 2**63 - 1) was a segmentation fault (pos + window_right overflowed
    int64 in the kernels; the torch-op path's mask wrapped to 'no key'). A window reaching every key
    (>= seq_q + seq_k) is the unbounded one: equal to -1 on that side, forward and backward, in the
    kernels and the float64 reference (tests/cpp/torch_ops_test.cpp: the ATen path). Run in a child
    process: a crash fails the test instead of ending pytest."""
    code = f"""
import torch, strata
g = torch.Generator().manual_seed(3)
q, k, v = (torch.randn(2, n, 3, 8, generator=g, requires_grad=True) for n in (5, 7, 7))
for w in [(0, {huge}), ({huge}, 0), ({huge}, {huge})]:
    want = tuple(-1 if x >= 12 else x for x in w)
    for dt in [torch.float32, torch.float64]:  # the kernels, the double reference
        qq, kk, vv = (t.detach().to(dt).requires_grad_() for t in (q, k, v))
        a = strata.attention(qq, kk, vv, causal={causal}, window=w)
        b = strata.attention(qq, kk, vv, causal={causal}, window=want)
        assert torch.isfinite(a).all(), (w, dt)
        assert torch.equal(a, b), (w, dt)
        ga = torch.autograd.grad(a.sum(), (qq, kk, vv))
        gb = torch.autograd.grad(b.sum(), (qq, kk, vv))
        assert all(torch.equal(x, y) for x, y in zip(ga, gb)), (w, dt)
print("ok")
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and res.stdout.strip().endswith("ok"), (res.returncode, res.stderr[-2000:])


def test_finite_input_bound_inside_is_exact_and_beyond_is_an_error():
    """Issue 48 item 6 at the boundary: logits up to ~1e37 (inputs ~1e18) give the float64
    reference's one-hot softmax, forward and backward finite; inputs ~1e20 (logits ~1e40, past
    fp32) raise naming 'q' and the bound instead of returning NaN."""
    g = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(1, 9, 2, 8, generator=g) for _ in range(3))
    for c in [1e18, 3e18]:  # |scale| max||q|| max||k|| about c^2 * 8 * 0.35: 3e36 .. 3e37 < 2.4e38
        qq, kk = (q * c).requires_grad_(), (k * c).requires_grad_()
        out = strata.attention(qq, kk, v)
        want = strata.attention(qq.detach().double(), kk.detach().double(), v.double())
        assert torch.isfinite(out).all()
        assert rel_err(out, want) <= FP32_FLOOR * 10
    with pytest.raises(RuntimeError, match=r"argument 'q'.*finite-input bound"):
        strata.attention(q * 1e20, k * 1e20, v)
    with pytest.raises(RuntimeError, match=r"argument 'q'.*finite-input bound"):
        strata.attention_forward(-q.abs() * 1e20, k.abs() * 1e20, v)  # every logit -> -inf: was a row of zeros


def test_output_follows_memory_order_of_q():
    q, k, v = rand_qkv(2, 9, 11, 3, 3, 8, 8, torch.float32, seed=6)
    out = strata.attention(q, k, v)
    qh = q.transpose(1, 2).contiguous().transpose(1, 2)  # BSHD view of head-major memory
    out_h = strata.attention(qh, k, v)
    assert torch.equal(out, out_h)
    assert out_h.transpose(1, 2).is_contiguous()


def test_double_backward_raises_instead_of_silently_dropping_terms():
    q, k, v = (t.requires_grad_() for t in rand_qkv(1, 5, 6, 2, 2, 4, 4, torch.float64, seed=12))
    dq, dk = torch.autograd.grad(strata.attention(q, k, v, causal=True).sum(), (q, k), create_graph=True)
    with pytest.raises(RuntimeError, match="double backward is not supported"):
        (dq.square().sum() + dk.sum()).backward()


def test_fully_masked_rows_are_zero_with_zero_grads():
    q, k, v = rand_qkv(2, 5, 6, 2, 2, 4, 4, torch.float32, seed=7)
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[1] = False
    got = out_and_grads(lambda q, k, v: strata.attention(q, k, v, key_padding_mask=mask), q, k, v, torch.ones(2, 5, 2, 4))
    for t in got:
        assert not torch.isnan(t).any()
        assert (t[1] == 0).all() and (t[0] != 0).any()
    _, lse = strata.attention_forward(q, k, v, key_padding_mask=mask)
    assert torch.isneginf(lse[1]).all() and torch.isfinite(lse[0]).all()


# ---- a query shared by heads ------------------------------------------------------------------
# heads_q = 1 (or dividing heads_kv): Bilinear BTT attention's raw block input, shared by all heads,
# with head dim = the model width (up to 1024). Truth: the formula in float64 with q repeated to
# the kv heads (autograd sums the copies' dq); torch's own error: the same in the tested dtype.
SHARED_QUERY_CASES = {
    "h1_d64": dict(shape=(2, 33, 33, 1, 1, 64, 64), opts=dict(causal=True)),
    "h3_d257": dict(shape=(1, 29, 40, 1, 3, 257, 96), opts={}),
    "h8_d1024_causal": dict(shape=(1, 70, 70, 1, 8, 1024, 1024), opts=dict(causal=True)),
    "2_of_6_d63_window": dict(shape=(2, 41, 41, 2, 6, 63, 63), opts=dict(causal=True, window=(9, 0))),
    "h3_d1000_decode": dict(shape=(2, 1, 50, 1, 3, 1000, 769), opts={}),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", list(SHARED_QUERY_CASES))
def test_shared_query_matches_float64_autograd_of_the_formula(name, dtype):
    case = SHARED_QUERY_CASES[name]
    b, nq, nk, hq, hkv, d, dv = case["shape"]
    opts = case["opts"]
    q, k, v = rand_qkv(b, nq, nk, hq, hkv, d, dv, dtype, seed=16)
    mask = allowed_mask(nq, nk, opts.get("causal", False), opts.get("window", (-1, -1)))
    g = torch.randn(b, nq, hkv, dv, generator=torch.Generator().manual_seed(17))
    got = out_and_grads(lambda q, k, v: strata.attention(q, k, v, **opts), q, k, v, g)
    assert got[0].shape == (b, nq, hkv, dv) and got[1].shape == q.shape

    def formula(q, k, v):
        return sdpa_bshd(q, k, v, mask)

    want = out_and_grads(formula, q.double(), k.double(), v.double(), g)
    # fp32: the kernel sums its dot products of length d (and dv) in order, so their round-off
    # grows like eps * sqrt(length); FP32_FLOOR was measured at d <= 128: scaled by sqrt(d / 64)
    # beyond (4e-6 at d = 1024; measured 2.1e-6 on dk at d = 1000 against torch's 3e-7, whose
    # GEMMs sum in blocks). A masking or indexing bug still gives errors of order 1e-1.
    fp32_floor = FP32_FLOOR * max(1.0, math.sqrt(max(d, dv) / 64))
    floor = fp32_floor if dtype == torch.float32 else BF16_FLOOR
    assert_as_close_as_torch(got, want, out_and_grads(formula, q, k, v, g), floor, what=f"{name} {dtype}")


def test_expanded_query_equals_shared_query():
    """q.expand(...) to the kv heads (stride 0) through the op that takes heads_q = H: the output of
    the shared query bit for bit, and autograd's sum of the expanded heads' dq equals its dq."""
    b, n, h, d = 2, 45, 4, 96
    q, k, v = rand_qkv(b, n, n, 1, h, d, 64, torch.float32, seed=18)
    g = torch.randn(b, n, h, 64, generator=torch.Generator().manual_seed(19))
    shared = out_and_grads(lambda q, k, v: strata.attention(q, k, v, causal=True), q, k, v, g)
    expanded = out_and_grads(lambda q, k, v: strata.attention(q.expand(b, n, h, d), k, v, causal=True), q, k, v, g)
    assert torch.equal(shared[0], expanded[0])
    assert rel_err(expanded[1], shared[1]) <= 1e-6
    assert torch.equal(shared[2], expanded[2]) and torch.equal(shared[3], expanded[3])
    out, lse = strata.attention_forward(q.expand(b, n, h, d), k, v)
    assert lse.shape == (b, h, n) and torch.equal(out, strata.attention_forward(q, k, v)[0])


# ---- bf16 -----------------------------------------------------------------------------------


@pytest.mark.parametrize("causal", [False, True])
def test_bfloat16_forward_matches_sdpa(causal):
    q, k, v = rand_qkv(2, 48, 64, 4, 2, 64, 64, torch.bfloat16, seed=8)
    mask = allowed_mask(48, 64, causal)
    out = strata.attention(q, k, v, causal=causal)
    assert out.dtype == torch.bfloat16
    want = sdpa_bshd(q.double(), k.double(), v.double(), mask)
    assert_as_close_as_torch([out], [want], [sdpa_bshd(q, k, v, mask)], BF16_FLOOR, what=f"bf16 causal={causal}")


# The compute option: every engine this CPU has holds the bf16 forward (and the fp32 backward fed
# by it) to SDPA's own bf16 error; "fp32" is the fp32 kernel on the widened inputs, rounded, bit
# for bit; a name that is no engine is an error naming 'compute'.
@pytest.mark.parametrize("compute", ["auto", "fp32", "avx512_bf16", "amx_bf16"])
def test_bfloat16_compute_options(compute):
    if compute.endswith("bf16") and compute not in bf16_engines():
        pytest.skip(f"this CPU has no {compute}")
    q, k, v = rand_qkv(2, 97, 97, 2, 2, 64, 64, torch.bfloat16, seed=9)
    g = torch.randn(2, 97, 2, 64, generator=torch.Generator().manual_seed(3)).bfloat16()
    mask = allowed_mask(97, 97, True)
    got = out_and_grads(lambda q_, k_, v_: strata.attention(q_, k_, v_, causal=True, compute=compute), q, k, v, g)
    want = out_and_grads(lambda q_, k_, v_: sdpa_bshd(q_, k_, v_, mask), q.double(), k.double(), v.double(), g)
    peer = out_and_grads(lambda q_, k_, v_: sdpa_bshd(q_, k_, v_, mask), q, k, v, g)
    assert_as_close_as_torch(got, want, peer, BF16_FLOOR, what=f"bf16 compute={compute}")
    out_fp32 = strata.attention_forward(q, k, v, causal=True, compute="fp32")[0]
    if compute == "fp32":
        assert torch.equal(out_fp32, strata.attention_forward(q.float(), k.float(), v.float(), causal=True)[0].bfloat16())
    elif compute != "auto" or strata.info()["bf16_auto"] != "fp32":
        assert not torch.equal(got[0], out_fp32), f"compute={compute} gave the fp32 path's output: no bf16 products ran"
    else:  # auto where vdpbf16ps does not pay (strata/cpu.h): the fp32 path, bit for bit
        assert torch.equal(got[0], out_fp32), "compute=auto did not take fp32 products where strata.info() says it does"


def test_backward_computes_as_the_forward_was_asked():
    # attention(compute=...)'s autograd backward runs the backward kernel with the same compute: the
    # gradients equal the kernel's own for that compute, bit for bit (the backward lost it once and
    # ran "auto", i.e. bf16 products, for a forward asked to compute in fp32).
    q, k, v = rand_qkv(1, 97, 97, 2, 2, 32, 32, torch.bfloat16, seed=4)
    g = torch.randn(1, 97, 2, 32, generator=torch.Generator().manual_seed(5)).bfloat16()
    for compute in ["fp32", "auto"]:
        got = out_and_grads(lambda q_, k_, v_: strata.attention(q_, k_, v_, causal=True, compute=compute), q, k, v, g)
        out, lse = strata.attention_forward(q, k, v, causal=True, compute=compute)
        want = strata.attention_backward(q, k, v, out, lse, g, causal=True, compute=compute)
        assert torch.equal(got[0], out), compute
        for name, a, b in zip(["dq", "dk", "dv"], got[1:], want):
            assert torch.equal(a, b), f"compute={compute}: {name} differs from the kernel's backward"


def test_compute_names_the_argument():
    q, k, v = rand_qkv(1, 8, 8, 1, 1, 16, 16, torch.bfloat16, seed=1)
    with pytest.raises(RuntimeError, match="attention_forward: argument 'compute': expected one of auto, fp32"):
        strata.attention_forward(q, k, v, compute="bf16")


# ---- paper GSWA -----------------------------------------------------------------------------


# (scale_a, scale_b) passed (None: the default) -> the scales the composition must use. The
# defaults are the reference code's 8/a and 8/b (CausalSelfGlobalSlidingWindowAttention); a = 5,
# b = 12 - 5 = 7 below. A given scale overrides its own branch only.
GSWA_SCALES = {
    "reference_defaults": ((None, None), (8 / 5, 8 / 7)),
    "scale_a_given": ((0.3, None), (0.3, 8 / 7)),
    "scale_b_given": ((None, 0.45), (8 / 5, 0.45)),
    "both_given": ((1 / math.sqrt(12), 1 / math.sqrt(12)), (1 / math.sqrt(12), 1 / math.sqrt(12))),
}


@pytest.mark.parametrize("scales", list(GSWA_SCALES))
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_paper_gswa_matches_explicit_composition(dtype, scales):
    b, n, h, d, dv, a, w = 2, 23, 3, 12, 10, 5, 4
    q, k, v = rand_qkv(b, n, n, h, h, d, dv, dtype, seed=9)
    (scale_a, scale_b), want_scales = GSWA_SCALES[scales]
    # Rounded to float32 as the core stores them (AttentionOptions::scale is a float).
    sa, sb = (float(torch.tensor(s, dtype=torch.float32)) for s in want_scales)

    def composition(q, k, v):
        """P_a V + P_b V with explicit softmaxes (no renormalisation of the sum)."""
        out = 0
        for dims, mask, scale in ((slice(0, a), allowed_mask(n, n, True), sa),
                                  (slice(a, d), allowed_mask(n, n, True, (w, 0)), sb)):
            s = torch.einsum("bihd,bjhd->bhij", q[..., dims], k[..., dims]) * scale
            p = torch.softmax(s.masked_fill(~mask, -math.inf), -1)
            out = out + torch.einsum("bhij,bjhd->bihd", p, v)
        return out

    g = torch.randn(b, n, h, dv, generator=torch.Generator().manual_seed(10))
    got = out_and_grads(lambda q, k, v: strata.paper_gswa_attention(q, k, v, a, w, scale_a=scale_a, scale_b=scale_b),
                        q, k, v, g)
    want = out_and_grads(composition, q.double(), k.double(), v.double(), g)
    if dtype == torch.float64:
        # the double reference vs the same math in another order: roundoff only
        for i, (x, y) in enumerate(zip(got, want)):
            assert rel_err(x, y) <= 1e-12, f"tensor {i}"
    else:
        assert_as_close_as_torch(got, want, out_and_grads(composition, q, k, v, g), FP32_FLOOR, what="gswa fp32")


def test_gradcheck_paper_gswa_float64_given_scales():
    q, k, v = rand_qkv(1, 6, 6, 2, 2, 5, 3, torch.float64, seed=13)
    inputs = tuple(t.requires_grad_() for t in (q, k, v))
    assert torch.autograd.gradcheck(
        lambda q, k, v: strata.paper_gswa_attention(q, k, v, 3, 2, scale_a=0.7, scale_b=1.3), inputs)


# ---- the kernels alone are not differentiable -------------------------------------------------


def _kernel_calls():
    """name -> a call of each *_forward / *_backward op on inputs that require grad, returning its outputs."""
    def qkv():
        return [t.requires_grad_() for t in rand_qkv(1, 8, 8, 2, 2, 4, 4, torch.float32, seed=14)]

    def attn_bwd():
        q, k, v = qkv()
        out, lse = strata.attention_forward(q, k, v)
        return strata.attention_backward(q, k, v, out, lse, torch.ones_like(out).requires_grad_())

    def mlr_bwd():
        q, k, v = qkv()
        out, lse = strata.mlr_attention_forward(q, k, v, [2, 2])
        return strata.mlr_attention_backward(q, k, v, out, lse, torch.ones_like(out).requires_grad_(), [2, 2])

    def monarch_bwd():
        q, k, v = qkv()
        out, state = strata.monarch_attention_forward(q, k, v, num_steps=2, block_size=2)
        return strata.monarch_attention_backward(q, k, v, state, torch.ones_like(out).requires_grad_(), num_steps=2,
                                                 block_size=2)

    return {
        "attention_forward": lambda: strata.attention_forward(*qkv()),
        "attention_backward": attn_bwd,
        "mlr_attention_forward": lambda: strata.mlr_attention_forward(*qkv(), [2, 2]),
        "mlr_attention_backward": mlr_bwd,
        "monarch_attention_forward": lambda: strata.monarch_attention_forward(*qkv(), num_steps=2, block_size=2),
        "monarch_attention_backward": monarch_bwd,
    }


@pytest.mark.parametrize("name", list(_kernel_calls()))
def test_kernel_ops_are_not_differentiable(name):
    """Outputs never require grad (documented in the package docstring): backward through them
    raises instead of silently leaving q.grad None, as it did with torch's autograd fallback."""
    outs = _kernel_calls()[name]()
    for t in outs:
        assert not t.requires_grad and t.grad_fn is None, name
    with pytest.raises(RuntimeError, match="does not require grad"):
        outs[0].sum().backward()


# ---- errors ---------------------------------------------------------------------------------


def _qkv():
    return rand_qkv(1, 4, 5, 2, 2, 8, 8, torch.float32, seed=11)


ERROR_CASES = {
    "q_dtype": (lambda q, k, v: strata.attention(q.int(), k, v), "argument 'q': expected dtype float32"),
    "k_head_dim": (lambda q, k, v: strata.attention(q, k[..., :7], v), "argument 'k': expected"),
    "v_dtype": (lambda q, k, v: strata.attention_forward(q, k, v.bfloat16()), "argument 'v': expected dtype float32"),
    "q_3d": (lambda q, k, v: strata.attention(q[0], k, v), "argument 'q': expected a 4-D tensor"),
    # q off the CPU takes the torch-ops path (strata/torch/torch_ops.h), which wants k, v on q's device
    "q_device": (lambda q, k, v: strata.attention(q.to("meta"), k, v), "argument 'k': expected a tensor on meta (as q)"),
    "gqa_heads": (lambda q, k, v: strata.attention(q, k.repeat(1, 1, 3, 1)[:, :, :3], v.repeat(1, 1, 3, 1)[:, :, :3]),
                  "argument 'k': expected heads dividing q's heads (2) (GQA) or a multiple of them"),
    "gqa_heads_float64": (lambda q, k, v: strata.attention(q.double(), k.repeat(1, 1, 3, 1)[:, :, :3].double(),
                                                           v.repeat(1, 1, 3, 1)[:, :, :3].double()),
                          "argument 'k': expected heads dividing"),
    "shared_query_dout_heads": (lambda q, k, v: strata.attention_backward(
        q[:, :, :1], k, v, *strata.attention_forward(q[:, :, :1], k, v), torch.zeros(1, 4, 1, 8)),
        "argument 'dout': expected (batch=1, seq=4, heads=2, dim=8)"),
    "layout": (lambda q, k, v: strata.attention(q, k, v, layout="sbhd"), "argument 'layout': expected \"bshd\" or \"bhsd\""),
    "mask_shape": (lambda q, k, v: strata.attention(q, k, v, key_padding_mask=torch.ones(1, 4, dtype=torch.bool)),
                   "argument 'key_padding_mask': expected shape [1, 5]"),
    "mask_dtype": (lambda q, k, v: strata.attention(q, k, v, key_padding_mask=torch.ones(1, 5)),
                   "argument 'key_padding_mask': expected dtype bool or uint8"),
    "bias_shape": (lambda q, k, v: strata.attention(q, k, v, bias=torch.zeros(3, 4, 5)),
                   "argument 'bias': expected 4-D, broadcastable"),
    "bias_requires_grad": (lambda q, k, v: strata.attention(q, k, v, bias=torch.zeros(4, 5, requires_grad=True)),
                           "argument 'bias': expected a tensor that does not require grad"),
    "window": (lambda q, k, v: strata.attention(q, k, v, window=(-2, 0)), "argument 'window_left'"),
    "num_global": (lambda q, k, v: strata.attention(q, k, v, num_global=-1), "argument 'num_global'"),
    "float64_forward_op": (lambda q, k, v: strata.attention_forward(q.double(), k.double(), v.double()),
                           "argument 'q': expected dtype float32 or bfloat16, got float64"),
    "float64_k_dtype": (lambda q, k, v: strata.attention(q.double(), k, v.double()), "argument 'k': expected dtype float64"),
    "gswa_split": (lambda q, k, v: strata.paper_gswa_attention(q, k, v, 8, 2), "argument 'split_a': expected 1..7"),
    "gswa_window": (lambda q, k, v: strata.paper_gswa_attention(q, k, v, 3, -1), "argument 'window': expected >= 0"),
    "backward_dout": (lambda q, k, v: strata.attention_backward(q, k, v, *strata.attention_forward(q, k, v), torch.zeros(1, 4, 2, 7)),
                      "argument 'dout'"),
}


@pytest.mark.parametrize("name", list(ERROR_CASES))
def test_bad_input_raises_runtime_error_naming_the_argument(name):
    fn, message = ERROR_CASES[name]
    assert_raises_naming(RuntimeError, lambda: fn(*_qkv()), message)


def test_window_must_be_a_pair():
    with pytest.raises(TypeError, match="argument 'window'"):
        strata.attention(*_qkv(), window=3)


def test_missing_library_is_a_clear_import_error(tmp_path: Path):
    env = dict(os.environ, STRATA_LIB=str(tmp_path / "nope.so"))
    proc = subprocess.run([sys.executable, "-c", "import strata"], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "STRATA_LIB" in proc.stderr and "nope.so" in proc.stderr


def test_library_path_comes_from_strata_lib():
    if "STRATA_LIB" not in os.environ:
        pytest.skip("STRATA_LIB not set: the package found the library by its fallback search")
    assert strata.library_path == Path(os.environ["STRATA_LIB"])
