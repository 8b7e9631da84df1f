"""Tests of MLR attention from Python (python/strata/mlr.py over torch.ops.strata.mlr_*).

Run: STRATA_LIB=<build>/torch/libstrata_torch.so PYTHONPATH=python python -m pytest -q tests/python/test_mlr.py

Truth is ``dense_mlr`` below: a pure-torch materialised implementation of the formula in
include/strata/mlr.h, written here from the definition (independent of strata's references):
per level l a boolean "same level-l block" matrix from the positions, the scores summed over the
levels shared, the scales, the masks, one softmax. Run in float64 it is the truth; run in float32
it is "PyTorch's own error" for the acceptance rule of test_attention.py (FlashAttention's):
strata's error is at most 2x PyTorch's own error in the same precision plus a floor. float64
gradients are checked by torch.autograd.gradcheck (strata's float64 path is the double reference).
Errors are normwise: max|got - want| / max|want|.
"""

from __future__ import annotations

import math
import os
import random
from typing import List, Optional, Sequence

import pytest
import torch

import strata
from conftest import (assert_as_close_as_torch, assert_grads_as_close_as_torch, assert_raises_naming,
                      natural_grad_sizes, out_and_grads, rand_qkv, rel_err, strided_view)

FP32_FLOOR = 1e-6  # ~8 ulps of the largest output (see test_attention.py)
# Gradients: where the truth is exactly zero (T = 1: one key per row, so dq = dk = 0) the kernel
# keeps the fp32 cancellation of dP - rowsum(dO * O), ~1.5e-7 absolute for head_dim_v 16, which
# PyTorch's materialised softmax avoids; with the 1e-2 denominator floor below that is 1.5e-5.
FP32_GRAD_FLOOR = 5e-5
BF16_FLOOR = 2.0**-8  # one bf16 unit roundoff, paid by the final rounding of every output


# ---- the independent truth ------------------------------------------------------------------


def block_ids(pos: torch.Tensor, level: int, sizes: List[int], starts: Optional[Sequence[int]]) -> torch.Tensor:
    """An id per position of its level-`level` block (0-based level), as int64 of pos's shape.

    Without segments the level-l blocks are [n*b_l, (n+1)*b_l). With segment starts the level-1
    blocks are the segments [0, s_1), [s_1, s_2), ..., and a finer level cuts each segment into
    blocks of b_l counted from the segment's start. Ids are pairs folded into one int64.
    """
    if starts is None:
        return torch.div(pos, sizes[level], rounding_mode="floor")
    st = torch.tensor(sorted(starts), dtype=torch.int64)
    seg = torch.searchsorted(st, pos.contiguous(), right=True)  # number of starts <= pos
    if level == 0:
        return seg
    prev = st[(seg - 1).clamp_min(0)] if len(st) else torch.zeros_like(pos)
    seg_start = torch.where(seg > 0, prev, torch.zeros_like(pos))
    return seg * (1 << 40) + torch.div(pos - seg_start, sizes[level], rounding_mode="floor")


def dense_mlr(q, k, v, ranks, *, block_sizes=(), context=0, segment_lists=None, mask_cross_segment=False,
              scale="inv_rank", divide_by_num_levels=False, level_average=False, causal=True):
    """MLR attention materialised (BSHD in, BSHD out). segment_lists: None, or one list of
    segment starts per sequence. Differentiable (plain torch ops) in the dtype of q."""
    b, nq, hq, d = q.shape
    nk, hkv = k.shape[1], k.shape[2]
    L = len(ranks)
    assert sum(ranks) == d
    if block_sizes:
        sizes = list(block_sizes)
    else:
        pow2 = 1 << (L - 1)
        ctx = context or -(-max(nk, 1) // pow2) * pow2
        sizes = [ctx >> l for l in range(L)]
    if scale == "inv_rank":
        c = [1.0 / r for r in ranks]
    else:
        c = [1.0 / math.sqrt(d)] * L
    if divide_by_num_levels:
        c = [x / L for x in c]
    kk = k.repeat_interleave(hq // hkv, dim=2)
    vv = v.repeat_interleave(hq // hkv, dim=2)
    p = torch.arange(nq)[:, None] + (nk - nq)  # query positions (bottom-right)
    j = torch.arange(nk)[None, :]
    outs = []
    for bi in range(b):
        starts = None if segment_lists is None else segment_lists[bi]
        S = torch.zeros(hq, nq, nk, dtype=q.dtype)
        m = torch.zeros(nq, nk, dtype=torch.int64)
        off = 0
        for l in range(L):
            same = block_ids(p.expand(nq, nk), l, sizes, starts) == block_ids(j.expand(nq, nk), l, sizes, starts)
            if starts is not None:
                same = same & (p >= 0)  # positions before the keys are in no segment
            ql, kl = q[bi, :, :, off:off + ranks[l]], kk[bi, :, :, off:off + ranks[l]]
            S = S + torch.einsum("ihr,jhr->hij", ql, kl) * c[l] * same
            m = m + same.long()
            off += ranks[l]
        if level_average:
            S = torch.where(m > 0, S / m.clamp_min(1), torch.zeros((), dtype=S.dtype))
        allowed = torch.ones(nq, nk, dtype=torch.bool)
        if causal:
            allowed &= j <= p
        if mask_cross_segment:
            allowed &= m > 0
        S = S.masked_fill(~allowed, -math.inf)
        P = torch.softmax(S, -1).nan_to_num(0.0)  # rows with no allowed key: zeros
        outs.append(torch.einsum("hij,jhd->ihd", P, vv[bi]))
    return torch.stack(outs)


def test_dense_truth_is_dense_attention_for_one_level():
    """The truth itself: L = 1 with scale 1/sqrt(d) is causal softmax attention."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 9, 3, 8, generator=g, dtype=torch.float64) for _ in range(3))
    want = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
    ).transpose(1, 2)
    assert rel_err(dense_mlr(q, k, v, [8], scale="inv_sqrt_head_dim"), want) < 1e-13


# ---- helpers --------------------------------------------------------------------------------


def strata_opts(opts):
    """The dense_mlr options as strata keyword arguments (segment lists packed)."""
    o = dict(opts)
    lists = o.pop("segment_lists", None)
    if lists is not None:
        if all(lst == lists[0] for lst in lists):
            o["segment_starts"] = list(lists[0])
        else:
            o["segment_starts"], o["segment_offsets"] = strata.pack_segments(lists)
    return o


# ---- fp32 kernel vs the truth ---------------------------------------------------------------

# name: (b, nq, nk, hq, hkv, d, dv), ranks, options
FP32_CASES = {
    "T1": ((2, 1, 1, 2, 2, 16, 16), [8, 8], {}),
    "T7_gqa": ((1, 7, 7, 3, 1, 8, 8), [4, 2, 2], {}),
    "T97_level_average": ((2, 97, 97, 2, 2, 16, 16), [8, 4, 2, 2], dict(level_average=True)),
    "T97_div_isqrt_gqa": (
        (1, 97, 97, 4, 2, 16, 12), [5, 11], dict(divide_by_num_levels=True, scale="inv_sqrt_head_dim")
    ),
    "T200_ref_split": ((1, 200, 200, 2, 2, 64, 32), [32, 8, 6, 4, 4, 4, 4, 2], dict(level_average=True)),
    "decode": ((2, 1, 50, 2, 1, 8, 8), [4, 2, 2], {}),
    "not_causal_nq_lt_nk": ((2, 13, 29, 2, 2, 8, 8), [2, 6], dict(causal=False)),
    "block_sizes": ((1, 45, 45, 2, 1, 8, 8), [4, 2, 2], dict(block_sizes=[24, 12, 3])),
    "context": ((1, 45, 45, 2, 2, 8, 8), [4, 4], dict(context=64)),
    "segments_mask_cross": (
        (2, 40, 40, 2, 2, 8, 8), [4, 2, 2], dict(segment_lists=[[10, 17, 30]] * 2, mask_cross_segment=True)
    ),
    "per_sequence_segments": (
        (3, 40, 40, 2, 2, 8, 8), [4, 2, 2], dict(segment_lists=[[5, 11], [], [9, 20, 33]], level_average=True)
    ),
    "bhsd": ((2, 30, 38, 4, 2, 16, 16), [8, 4, 4], dict(layout="bhsd")),
}


@pytest.mark.parametrize("name", list(FP32_CASES))
def test_float32_forward_and_grads_match_dense_truth(name):
    (b, nq, nk, hq, hkv, d, dv), ranks, opts = FP32_CASES[name]
    opts = dict(opts)
    layout = opts.pop("layout", "bshd")
    q, k, v = rand_qkv(b, nq, nk, hq, hkv, d, dv, torch.float32, layout, seed=1)

    def to_bshd(t):
        return t.transpose(1, 2) if layout == "bhsd" else t

    gs = torch.randn(b, nq, hq, dv, generator=torch.Generator().manual_seed(2))  # BSHD
    g = gs.transpose(1, 2).contiguous() if layout == "bhsd" else gs
    def run(q, k, v):
        return strata.mlr_attention(q, k, v, ranks, layout=layout, **strata_opts(opts))

    got = out_and_grads(run, q, k, v, g)
    assert got[0].shape == q.shape[:3] + (dv,)
    got = [to_bshd(t) for t in got]
    qs, ks, vs = (to_bshd(t) for t in (q, k, v))

    def truth(q, k, v):
        return dense_mlr(q, k, v, ranks, **opts)

    want = out_and_grads(truth, qs.double(), ks.double(), vs.double(), gs)
    torch32 = out_and_grads(truth, qs, ks, vs, gs)
    assert_as_close_as_torch(got, want, torch32, FP32_FLOOR, FP32_GRAD_FLOOR, what=name)


RANDOM_CASES = int(os.environ.get("STRATA_RANDOM_CASES", "120"))


@pytest.mark.parametrize("seed", range(RANDOM_CASES))
def test_random_option_combinations_match_dense_truth(seed):
    """Seeded draws of every option at once (the named cases above take one or two at a time):
    1-6 levels of ranks 1-9 (odd head dims), GQA, causal or not, seq_q < seq_k, both scales,
    divide_by_num_levels, level_average, the blocks from block_sizes, a context or the call,
    segments shared by the batch or per sequence, mask_cross_segment, both layouts, strided q / k /
    v. The output by the named cases' rule, the gradients by conftest.assert_grads_as_close_as_torch."""
    rng = random.Random(seed)
    levels = rng.randint(1, 6)
    ranks = [rng.randint(1, 9) for _ in range(levels)]
    d = sum(ranks)
    dv = rng.choice([d, rng.randint(1, 24)])
    b = rng.randint(1, 3)
    hkv = rng.randint(1, 2)
    hq = hkv * rng.choice([1, 2, 3])
    opts = dict(scale=rng.choice(["inv_rank", "inv_sqrt_head_dim"]), divide_by_num_levels=rng.random() < 0.3,
                level_average=rng.random() < 0.5, causal=rng.random() < 0.7)
    pow2 = 1 << (levels - 1)
    blocks = rng.random()
    if blocks < 0.25:
        opts["block_sizes"] = sorted(rng.sample(range(1, 60), levels), reverse=True)
        nk = rng.randint(1, 90)
    elif blocks < 0.5:
        opts["context"] = pow2 * rng.randint(1, max(1, 96 // pow2))
        nk = rng.randint(1, opts["context"])
    else:
        nk = rng.randint(1, 90)
    nq = rng.choice([nk, nk, 1, rng.randint(1, nk)])
    if rng.random() < 0.3:
        lists = [sorted(rng.sample(range(1, nk), min(3, nk - 1))) if nk > 1 else [] for _ in range(b)]
        opts["segment_lists"] = lists if rng.random() < 0.5 else [lists[0]] * b
        opts["mask_cross_segment"] = rng.random() < 0.5
    layout = rng.choice(["bshd", "bhsd"])
    q, k, v = rand_qkv(b, nq, nk, hq, hkv, d, dv, torch.float32, layout, seed=seed)
    gs = torch.randn(b, nq, hq, dv, generator=torch.Generator().manual_seed(1000 + seed))  # BSHD
    g = gs.transpose(1, 2).contiguous() if layout == "bhsd" else gs

    def to_bshd(t):
        return t.transpose(1, 2) if layout == "bhsd" else t

    def run(q, k, v):
        return strata.mlr_attention(q, k, v, ranks, layout=layout, **strata_opts(opts))

    views = [strided_view(t, "swapped" if rng.random() < 0.3 else "as_is") for t in (q, k, v)]
    got = [to_bshd(t) for t in out_and_grads(run, *views, g)]
    qs, ks, vs = (to_bshd(t) for t in (q, k, v))

    def truth(q, k, v):
        return dense_mlr(q, k, v, ranks, **opts)

    want = out_and_grads(truth, qs.double(), ks.double(), vs.double(), gs)
    torch32 = out_and_grads(truth, qs, ks, vs, gs)
    what = f"seed {seed}: b {b} nq {nq} nk {nk} hq {hq} hkv {hkv} ranks {ranks} dv {dv} {layout} opts {opts}"
    assert_as_close_as_torch(got[:1], want[:1], torch32[:1], FP32_FLOOR, what=what)
    c = [1.0 / r for r in ranks] if opts["scale"] == "inv_rank" else [1.0 / math.sqrt(d)] * levels
    natural = natural_grad_sizes(qs, ks, vs, gs, max(c) / (levels if opts["divide_by_num_levels"] else 1))
    assert_grads_as_close_as_torch(got[1:], want[1:], torch32[1:], natural, FP32_FLOOR, what)


def test_t1025_forward_matches_dense_truth():
    q, k, v = rand_qkv(1, 1025, 1025, 1, 1, 32, 32, torch.float32, seed=3)
    ranks = [16, 8, 4, 4]
    out, lse = strata.mlr_attention_forward(q, k, v, ranks)
    want = dense_mlr(q.double(), k.double(), v.double(), ranks)
    assert rel_err(out, want) <= 2 * rel_err(dense_mlr(q, k, v, ranks), want) + FP32_FLOOR
    assert lse.shape == (1, 1, 1025) and torch.isfinite(lse).all()


@pytest.mark.parametrize("causal", [False, True])
def test_bfloat16_forward_matches_dense_truth(causal):
    q, k, v = rand_qkv(2, 48, 64, 4, 2, 32, 32, torch.bfloat16, seed=4)
    ranks = [16, 8, 8]
    out = strata.mlr_attention(q, k, v, ranks, causal=causal, level_average=True)
    assert out.dtype == torch.bfloat16
    want = dense_mlr(q.double(), k.double(), v.double(), ranks, causal=causal, level_average=True)
    # PyTorch's own bf16 error here: the truth run on float32 copies, rounded to bf16 at the end.
    torch_bf16 = dense_mlr(q.float(), k.float(), v.float(), ranks, causal=causal, level_average=True).bfloat16()
    assert_as_close_as_torch([out], [want], [torch_bf16], BF16_FLOOR, what=f"bf16 causal={causal}")


# The compute option (as strata.attention's): "auto" (bf16 products where the CPU has an engine)
# and "fp32" both hold a bf16 call to PyTorch's own bf16 error, and the autograd backward is the
# backward op's with the forward's compute, bit for bit; "fp32" is the fp32 kernel on the widened
# inputs, rounded, bit for bit; a name that is no engine is an error naming 'compute' (ERROR_CASES
# below).
@pytest.mark.parametrize("compute", ["auto", "fp32"])
def test_bfloat16_compute_option(compute):
    q, k, v = rand_qkv(1, 37, 37, 2, 1, 16, 16, torch.bfloat16, seed=13)
    g = torch.randn(1, 37, 2, 16, generator=torch.Generator().manual_seed(14)).bfloat16()
    ranks = [8, 4, 4]
    got = out_and_grads(lambda q_, k_, v_: strata.mlr_attention(q_, k_, v_, ranks, compute=compute), q, k, v, g)
    want = out_and_grads(lambda q_, k_, v_: dense_mlr(q_, k_, v_, ranks), q.double(), k.double(), v.double(), g)
    peer = out_and_grads(lambda q_, k_, v_: dense_mlr(q_, k_, v_, ranks), q, k, v, g)
    assert_as_close_as_torch(got, want, peer, BF16_FLOOR, what=f"bf16 compute={compute}")
    out, lse = strata.mlr_attention_forward(q, k, v, ranks, compute=compute)
    grads = strata.mlr_attention_backward(q, k, v, out, lse, g, ranks, compute=compute)
    for name, a, b in zip(["out", "dq", "dk", "dv"], got, [out, *grads]):
        assert torch.equal(a, b), f"compute={compute}: {name} differs from the ops'"
    if compute == "fp32":
        assert torch.equal(out, strata.mlr_attention_forward(q.float(), k.float(), v.float(), ranks)[0].bfloat16())


def test_float64_path_matches_dense_truth():
    q, k, v = rand_qkv(2, 23, 23, 2, 1, 12, 6, torch.float64, seed=5)
    g = torch.randn(2, 23, 2, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    opts = dict(segment_lists=[[4, 15], [11]], level_average=True, mask_cross_segment=True)
    got = out_and_grads(lambda q, k, v: strata.mlr_attention(q, k, v, [6, 3, 3], **strata_opts(opts)), q, k, v, g)
    want = out_and_grads(lambda q, k, v: dense_mlr(q, k, v, [6, 3, 3], **opts), q, k, v, g)
    for i, (a, w) in enumerate(zip(got, want)):
        assert rel_err(a, w) <= 1e-12, f"tensor {i}"


# ---- gradcheck (float64 = the double reference) ---------------------------------------------

GRADCHECK_CASES = {
    "plain": ((2, 6, 6, 2, 2, 4, 3), [2, 2], {}),
    "three_levels_avg": ((1, 9, 9, 2, 1, 6, 3), [3, 2, 1], dict(level_average=True)),
    "not_causal_nq_ne_nk": ((1, 5, 8, 2, 2, 4, 2), [1, 3], dict(causal=False, divide_by_num_levels=True)),
    "segments": ((2, 8, 8, 2, 2, 4, 3), [2, 2], dict(segment_starts=[3, 6], mask_cross_segment=True)),
    "per_sequence": ((2, 8, 8, 2, 1, 4, 3), [2, 2], dict(segment_starts=[3, 2, 5], segment_offsets=[0, 1, 3])),
    "bhsd_isqrt": ((2, 7, 7, 2, 1, 4, 3), [3, 1], dict(layout="bhsd", scale="inv_sqrt_head_dim")),
}


@pytest.mark.parametrize("name", list(GRADCHECK_CASES))
def test_gradcheck_float64(name):
    (b, nq, nk, hq, hkv, d, dv), ranks, opts = GRADCHECK_CASES[name]
    q, k, v = rand_qkv(b, nq, nk, hq, hkv, d, dv, torch.float64, opts.get("layout", "bshd"), seed=7)
    inputs = tuple(t.requires_grad_() for t in (q, k, v))
    assert torch.autograd.gradcheck(lambda q, k, v: strata.mlr_attention(q, k, v, ranks, **opts), inputs)


# ---- the ops --------------------------------------------------------------------------------


def test_forward_lse_and_backward_ops_are_consistent():
    q, k, v = rand_qkv(2, 19, 27, 4, 2, 16, 12, torch.float32, seed=8)
    opts = dict(ranks="8|4|4", level_average=True, segment_starts=torch.tensor([9, 20]))
    out, lse = strata.mlr_attention_forward(q, k, v, **opts)
    assert lse.shape == (2, 4, 19) and lse.dtype == torch.float32
    dout = torch.randn_like(out)
    dq, dk, dv = strata.mlr_attention_backward(q, k, v, out, lse, dout, **opts)
    got = out_and_grads(lambda q, k, v: strata.mlr_attention(q, k, v, **opts), q, k, v, dout)
    # The autograd Function runs exactly these two ops: bitwise equal.
    for a, b in zip(got, [out, dq, dk, dv]):
        assert torch.equal(a, b)


def test_per_sequence_segments_equal_each_sequence_alone():
    lists = [[5, 11], [], [9, 20, 33]]
    q, k, v = rand_qkv(3, 40, 40, 2, 2, 8, 8, torch.float32, seed=9)
    g = torch.randn(3, 40, 2, 8, generator=torch.Generator().manual_seed(10))
    starts, offsets = strata.pack_segments(lists)
    assert starts.tolist() == [5, 11, 9, 20, 33] and offsets.tolist() == [0, 2, 2, 5]
    for mask_cross in (False, True):
        opts = dict(mask_cross_segment=mask_cross, level_average=True)
        packed = dict(segment_starts=starts, segment_offsets=offsets, **opts)
        got = out_and_grads(lambda q, k, v: strata.mlr_attention(q, k, v, [4, 2, 2], **packed), q, k, v, g)
        for b, lst in enumerate(lists):
            alone = out_and_grads(
                lambda q, k, v: strata.mlr_attention(q, k, v, [4, 2, 2], segment_starts=lst or None, **opts),
                q[b : b + 1], k[b : b + 1], v[b : b + 1], g[b : b + 1],
            )
            for i, (x, y) in enumerate(zip(got, alone)):
                assert rel_err(x[b : b + 1], y) <= 1e-6, f"sequence {b}, tensor {i}, mask_cross={mask_cross}"
    # ...and differ from every sequence using the whole list (the offsets are not ignored).
    whole = strata.mlr_attention(q, k, v, [4, 2, 2], segment_starts=[9, 20, 33], mask_cross_segment=True)
    per_seq = strata.mlr_attention(
        q, k, v, [4, 2, 2], segment_starts=starts, segment_offsets=offsets, mask_cross_segment=True
    )
    assert rel_err(per_seq[2], whole[2]) <= 1e-6 and rel_err(per_seq[0], whole[0]) > 1e-2


def test_double_backward_raises_instead_of_silently_dropping_terms():
    q, k, v = (t.requires_grad_() for t in rand_qkv(1, 5, 5, 2, 2, 4, 4, torch.float64, seed=11))
    dq, dk = torch.autograd.grad(strata.mlr_attention(q, k, v, [2, 2]).sum(), (q, k), create_graph=True)
    with pytest.raises(RuntimeError, match="double backward is not supported"):
        (dq.square().sum() + dk.sum()).backward()


# ---- the module -----------------------------------------------------------------------------


@pytest.mark.parametrize("qk_layernorm", [False, True])
def test_module_trains_one_sgd_step_and_loss_drops(qk_layernorm):
    torch.manual_seed(0)
    m = strata.MLRAttention(64, 4, [8, 4, 2, 2], num_kv_heads=2, qk_layernorm=qk_layernorm, level_average=True,
                            context=40)
    x = torch.randn(2, 33, 64)
    target = torch.randn(2, 33, 64)
    y = m(x)
    assert y.shape == x.shape
    loss = torch.nn.functional.mse_loss(y, target)
    loss.backward()
    for name, p in m.named_parameters():
        assert p.grad is not None and p.grad.abs().max() > 0, name
    if qk_layernorm:
        assert m.q_norm.weight.grad is not None and m.k_norm.weight.grad is not None
    with torch.no_grad():
        for p in m.parameters():
            p -= 0.5 * p.grad
    assert torch.nn.functional.mse_loss(m(x), target) < loss


def test_module_is_its_parts():
    """forward = out_proj(mlr_attention(LN(q_proj x), LN(k_proj x), v_proj x)) with the dense truth."""
    torch.manual_seed(1)
    m = strata.MLRAttention(24, 2, "6|4|2", qk_layernorm=True, bias=False, dtype=torch.float64,
                            mask_cross_segment=True, scale="inv_sqrt_head_dim", context=32)
    x = torch.randn(2, 30, 24, dtype=torch.float64)
    lists = [[7, 19], [12]]
    starts, offsets = strata.pack_segments(lists)
    b, t = 2, 30
    q = m.q_norm(m.q_proj(x).view(b, t, 2, 12))
    k = m.k_norm(m.k_proj(x).view(b, t, 2, 12))
    v = m.v_proj(x).view(b, t, 2, 12)
    assert m.q_norm.bias is None  # bias=False reaches the QK-LayerNorms too
    want = m.out_proj(dense_mlr(q, k, v, [6, 4, 2], context=32, segment_lists=lists, mask_cross_segment=True,
                                scale="inv_sqrt_head_dim").reshape(b, t, 24))
    assert rel_err(m(x, starts, offsets), want) <= 1e-12


# ---- errors ---------------------------------------------------------------------------------


def _qkv():
    return rand_qkv(1, 6, 6, 2, 2, 8, 4, torch.float32, seed=12)


def mlr(q, k, v, ranks=(4, 4), **opts):
    return strata.mlr_attention(q, k, v, ranks, **opts)


def bad_dout(q, k, v):
    out, lse = strata.mlr_attention_forward(q, k, v, [4, 4])
    return strata.mlr_attention_backward(q, k, v, out, lse, torch.zeros(1, 6, 2, 3), [4, 4])


ERROR_CASES = {
    "ranks_sum": (lambda q, k, v: mlr(q, k, v, [4, 3]),
                  "mlr_attention_forward: argument 'ranks': expected r_1 + .. + r_L = head_dim 8"),
    "ranks_sum_float64": (lambda q, k, v: mlr(q.double(), k.double(), v.double(), [4, 3]),
                          "reference_mlr_attention_forward: argument 'ranks': expected r_1 + .. + r_L = head_dim 8"),
    "ranks_empty": (lambda q, k, v: mlr(q, k, v, []), "argument 'ranks': expected 1..16 ranks"),
    "rank_zero": (lambda q, k, v: mlr(q, k, v, [8, 0]), "argument 'ranks[1]'"),
    "block_sizes_count": (lambda q, k, v: mlr(q, k, v, block_sizes=[8]), "argument 'block_sizes'"),
    "block_sizes_positive": (lambda q, k, v: mlr(q, k, v, block_sizes=[8, 0]), "argument 'block_sizes[1]'"),
    "context": (lambda q, k, v: mlr(q, k, v, context=7), "argument 'context'"),
    "scale": (lambda q, k, v: mlr(q, k, v, scale="sqrt"),
              "argument 'scale': expected \"inv_rank\" or \"inv_sqrt_head_dim\""),
    "layout": (lambda q, k, v: mlr(q, k, v, layout="sbhd"), "argument 'layout'"),
    "compute": (lambda q, k, v: mlr(q.bfloat16(), k.bfloat16(), v.bfloat16(), compute="bf16"),
                "mlr_attention_forward: argument 'compute': expected one of auto, fp32, avx512_bf16, amx_bf16"),
    "q_dtype": (lambda q, k, v: mlr(q.int(), k, v), "argument 'q': expected dtype float32"),
    "v_dtype": (lambda q, k, v: strata.mlr_attention_forward(q, k, v.bfloat16(), [4, 4]), "argument 'v'"),
    "float64_forward_op": (lambda q, k, v: strata.mlr_attention_forward(q.double(), k.double(), v.double(), [4, 4]),
                           "argument 'q': expected dtype float32 or bfloat16, got float64"),
    "q_3d": (lambda q, k, v: mlr(q[0], k, v), "argument 'q': expected a 4-D tensor"),
    # q off the CPU takes the torch-ops path (strata/torch/torch_ops.h), which wants k, v on q's device
    "q_device": (lambda q, k, v: mlr(q.to("meta"), k, v), "argument 'k': expected a tensor on meta (as q)"),
    "k_head_dim": (lambda q, k, v: mlr(q, k[..., :7], v), "argument 'k'"),
    "segment_dtype": (lambda q, k, v: mlr(q, k, v, segment_starts=torch.tensor([2.0])),
                      "argument 'segment_starts': expected dtype int64, got float32"),
    "segment_order": (lambda q, k, v: mlr(q, k, v, segment_starts=[4, 2]), "argument 'segment_starts[1]'"),
    "segment_range": (lambda q, k, v: mlr(q, k, v, segment_starts=[6]), "argument 'segment_starts[0]'"),
    "segment_offsets_length": (lambda q, k, v: mlr(q, k, v, segment_starts=[2, 3], segment_offsets=[0, 1, 2]),
                               "argument 'segment_offsets': expected 2 offsets (batch + 1), got 3"),
    "backward_dout": (bad_dout, "mlr_attention_backward: argument 'dout'"),
}


@pytest.mark.parametrize("name", list(ERROR_CASES))
def test_bad_input_raises_runtime_error_naming_the_argument(name):
    fn, message = ERROR_CASES[name]
    assert_raises_naming(RuntimeError, lambda: fn(*_qkv()), message)


def test_module_errors():
    with pytest.raises(ValueError, match="argument 'ranks': expected r_1 \\+ .. \\+ r_L = head_dim"):
        strata.MLRAttention(64, 4, [8, 4])
    with pytest.raises(ValueError, match="argument 'num_kv_heads'"):
        strata.MLRAttention(64, 4, [8, 8], num_kv_heads=3)
    with pytest.raises(ValueError, match="argument 'ranks': expected integers"):
        strata.MLRAttention(64, 4, "8|x")
    with pytest.raises(RuntimeError, match="argument 'scale'"):
        strata.MLRAttention(64, 4, [8, 8], scale="x", context=16)
    with pytest.raises(RuntimeError, match=r"argument 'block_sizes\[1\]'"):
        strata.MLRAttention(64, 4, [8, 8], block_sizes=[16, -5])
    with pytest.raises(RuntimeError, match="MLRAttention.forward: argument 'x'"):
        strata.MLRAttention(16, 2, [4, 4], context=8)(torch.randn(2, 5, 15))
    with pytest.raises(TypeError, match=r"argument 'segment_starts\[0\]'"):
        strata.mlr_attention(*_qkv(), [4, 4], segment_starts=["a"])


# ---- the module's blocks come from its context, not from the sequence's length ------------------


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_module_output_at_a_position_does_not_depend_on_later_tokens(dtype):
    """Causal forward over n tokens == the first n rows of the forward over n + m tokens: the blocks
    are the context's, by absolute position (n not a multiple of the blocks, and n + m past the
    context: blocks continue by absolute position)."""
    torch.manual_seed(2)
    m = strata.MLRAttention(32, 2, [8, 4, 2, 2], context=16, level_average=True, qk_layernorm=True, dtype=dtype)
    x = torch.randn(2, 45, 32, dtype=dtype)
    # float64 runs the double reference (roundoff only); float32 the kernel, whose rows of one
    # query tile see the same keys in the same order either way: a few ulps at most.
    tol = 1e-12 if dtype == torch.float64 else 1e-6
    with torch.no_grad():
        for n, total in [(5, 7), (5, 16), (13, 29), (16, 45), (30, 45), (1, 45)]:
            short, longer = m(x[:, :n]), m(x[:, :total])
            assert rel_err(short, longer[:, :n]) <= tol, f"n={n}, n+m={total}"


def test_module_with_levels_needs_a_context():
    with pytest.raises(ValueError, match="MLRAttention: argument 'context': expected the model's context length"):
        strata.MLRAttention(16, 2, [4, 4])
    strata.MLRAttention(16, 2, [4, 4], block_sizes=[8, 4])  # explicit blocks are a context too
    one_level = strata.MLRAttention(16, 2, [8], dtype=torch.float64)  # L = 1: dense, any length
    x = torch.randn(1, 9, 16, dtype=torch.float64)
    with torch.no_grad():
        assert rel_err(one_level(x[:, :4]), one_level(x)[:, :4]) <= 1e-12
