"""Fake (meta) implementations of strata's kernel ops, for torch.compile and torch.export.

A fake implementation returns outputs with the shapes, strides, dtypes and devices the CPU kernel
returns (``torch/*.cpp``), computing nothing; torch.compile traces with these, so that the kernel ops
stay opaque nodes of the graph (no graph break) and the shapes may be symbolic (dynamic shapes).
The differentiable ops (``attention``, ``mlr_attention``, ``monarch_attention``, ``structured_linear``,
...) are CompositeImplicitAutograd: they have no fake of their own, their C++ autograd Functions
call the kernel ops below through the dispatcher (``torch/op_calls.h``), which reaches these.

Argument checks are the kernels' (they run on real tensors, also inside a compiled graph); the
checks here are the ones without which a shape could not be computed, with the kernels' wording.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import torch


def _seq_dim(layout: str) -> int:
    """The sequence dim of q, k, v in ``layout`` (heads are the other one of dims 1 and 2)."""
    torch._check(layout in ("bshd", "bhsd"), lambda: f'argument \'layout\': expected "bshd" or "bhsd", got "{layout}"')
    return 1 if layout == "bshd" else 2


def _sizes_in(layout: str, b, s, h, d) -> List:
    """The sizes of a tensor with logical dims (b, s, h, d) in ``layout``."""
    return [b, s, h, d] if layout == "bshd" else [b, h, s, d]


def _check_4d(where: str, **tensors: torch.Tensor) -> None:
    for name, t in tensors.items():
        torch._check(t.dim() == 4, lambda: f"{where}: argument '{name}': expected a 4-D tensor, got {t.dim()}-D")


def _empty_in_order_of(like: torch.Tensor, sizes: Sequence, dtype: torch.dtype) -> torch.Tensor:
    """As binding::empty_in_order_of (torch/binding_util.h): ``sizes`` laid out in the dim order of
    ``like`` (strides descending, ties in dim order) when ``like`` is non-overlapping and dense,
    else contiguous."""
    # Guards like a plain test on the (backed) symbolic sizes of dynamic shapes; only data-dependent
    # (unbacked) sizes could make it answer False where the kernel's test says True.
    from torch._prims_common import is_non_overlapping_and_dense_or_false

    if like.dim() != len(sizes) or not is_non_overlapping_and_dense_or_false(like):
        return like.new_empty(sizes, dtype=dtype)
    strides_like = like.stride()
    order = sorted(range(len(sizes)), key=lambda i: -strides_like[i])  # stable: ties keep dim order
    strides = [0] * len(sizes)
    step = 1
    for i in reversed(order):
        strides[i] = step
        step = step * torch.sym_max(sizes[i], 1)
    return torch.empty_strided(sizes, strides, dtype=dtype, device=like.device)


def _lse(q: torch.Tensor, batch, heads, seq) -> torch.Tensor:
    """lse: batch x heads x seq float32, contiguous."""
    return q.new_empty((batch, heads, seq), dtype=torch.float32)


# ---- dense attention ---------------------------------------------------------------------------


@torch.library.register_fake("strata::attention_forward")
def _attention_forward(q, k, v, scale=None, causal=False, window_left=-1, window_right=-1, num_global=0,
                       key_padding_mask=None, bias=None, layout="bshd", compute="auto"):
    _check_4d("attention_forward", q=q, k=k, v=v)
    s = _seq_dim(layout)
    h = 3 - s
    heads = torch.sym_max(q.shape[h], k.shape[h])
    out = _empty_in_order_of(q, _sizes_in(layout, q.shape[0], q.shape[s], heads, v.shape[3]), q.dtype)
    return out, _lse(q, q.shape[0], heads, q.shape[s])


@torch.library.register_fake("strata::attention_backward")
def _attention_backward(q, k, v, out, lse, dout, scale=None, causal=False, window_left=-1, window_right=-1,
                        num_global=0, key_padding_mask=None, bias=None, layout="bshd", compute="auto"):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


@torch.library.register_fake("strata::attention_qkvpacked_backward")
def _attention_qkvpacked_backward(qkv, out, lse, dout, *options):
    return qkv.new_empty(qkv.shape)  # contiguous (dq, dk, dv: its three views)


# ---- MLR attention -----------------------------------------------------------------------------


@torch.library.register_fake("strata::mlr_attention_forward")
def _mlr_attention_forward(q, k, v, ranks, block_sizes=(), context=0, segment_starts=None, segment_offsets=None,
                           mask_cross_segment=False, scale="inv_rank", divide_by_num_levels=False,
                           level_average=False, causal=True, layout="bshd", compute="auto"):
    _check_4d("mlr_attention_forward", q=q, k=k, v=v)
    s = _seq_dim(layout)
    heads = q.shape[3 - s]
    out = _empty_in_order_of(q, _sizes_in(layout, q.shape[0], q.shape[s], heads, v.shape[3]), q.dtype)
    return out, _lse(q, q.shape[0], heads, q.shape[s])


@torch.library.register_fake("strata::mlr_attention_backward")
def _mlr_attention_backward(q, k, v, out, lse, dout, *options):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


@torch.library.register_fake("strata::mlr_attention_qkvpacked_backward")
def _mlr_attention_qkvpacked_backward(qkv, out, lse, dout, *options):
    return qkv.new_empty(qkv.shape)


# ---- the fused block pieces (gelu_mlp, ln_linear) ----------------------------------------------
# Outputs contiguous (torch/mlp.cpp); rows = the product of x's leading dims.


def _rows(x: torch.Tensor):
    rows = 1
    for s in x.shape[:-1]:
        rows = rows * s
    return rows


def _check_weight_width(where: str, x: torch.Tensor, w: torch.Tensor, wname: str) -> None:
    torch._check(w.dim() == 2, lambda: f"{where}: argument '{wname}': expected a 2-D tensor, got {list(w.shape)}")
    torch._check(x.dim() >= 1 and x.shape[-1] == w.shape[1],
                 lambda: f"{where}: argument 'x': expected a tensor (..., {w.shape[1]}) ({wname}'s width), "
                 f"got {list(x.shape)}")


def _stats(x: torch.Tensor, ln_weight) -> torch.Tensor:
    return x.new_empty((_rows(x), 2)) if ln_weight is not None else x.new_empty((0,))


@torch.library.register_fake("strata::gelu_mlp_forward")
def _gelu_mlp_forward(x, w1, b1, w2, b2, ln_weight=None, ln_bias=None, eps=1e-5, residual=False):
    _check_weight_width("gelu_mlp_forward", x, w1, "w1")
    return x.new_empty(x.shape), x.new_empty((_rows(x), w1.shape[0])), _stats(x, ln_weight)


@torch.library.register_fake("strata::gelu_mlp_backward")
def _gelu_mlp_backward(dy, x, w1, w2, h, stats, ln_weight, ln_bias, eps, residual, output_mask):
    H, D = w1.shape
    shapes = [x.shape, (H, D), (H,), (D, H), (D,), (D,) if ln_weight is not None else None,
              (D,) if ln_bias is not None else None]
    return tuple(x.new_empty(s) if m and s is not None else None for s, m in zip(shapes, output_mask))


@torch.library.register_fake("strata::ln_linear_forward")
def _ln_linear_forward(x, w, b, ln_weight=None, ln_bias=None, eps=1e-5):
    _check_weight_width("ln_linear_forward", x, w, "w")
    return x.new_empty((*x.shape[:-1], w.shape[0])), _stats(x, ln_weight)


@torch.library.register_fake("strata::ln_linear_backward")
def _ln_linear_backward(dy, x, w, stats, ln_weight, ln_bias, eps, output_mask):
    H, D = w.shape
    shapes = [x.shape, (H, D), (H,), (D,) if ln_weight is not None else None, (D,) if ln_bias is not None else None]
    return tuple(x.new_empty(s) if m and s is not None else None for s, m in zip(shapes, output_mask))


# ---- MonarchAttention --------------------------------------------------------------------------


def _monarch_padded_len(seq, block_size: int):
    """M*B, the sequence padded to whole blocks (monarch_geometry, src/cpu/monarch.cpp). The
    default block floor(sqrt(seq)) needs seq's value: it specialises a symbolic seq."""
    if block_size == 0:
        import math

        block_size = math.isqrt(int(seq))
    block = torch.sym_max(1, torch.sym_min(block_size, seq))
    return (seq + block - 1) // block * block


@torch.library.register_fake("strata::monarch_attention_forward")
def _monarch_attention_forward(q, k, v, num_steps=1, block_size=0, pad="post", mode="stable", scale=None,
                               key_padding_mask=None, layout="bshd", compute="auto", save_state=True):
    _check_4d("monarch_attention_forward", q=q, k=k, v=v)
    torch._check(1 <= num_steps <= 1024,
                 lambda: f"monarch_attention_forward: argument 'num_steps': expected 1..1024, got {num_steps}")
    torch._check(block_size >= 0,
                 lambda: f"monarch_attention_forward: argument 'block_size': expected >= 1, or 0 for "
                 f"floor(sqrt(seq)), got {block_size}")
    s = _seq_dim(layout)
    batch, seq, heads = q.shape[0], q.shape[s], q.shape[3 - s]
    out = _empty_in_order_of(q, _sizes_in(layout, batch, seq, heads, v.shape[3]), q.dtype)
    if not save_state:
        return out, q.new_empty((0,), dtype=torch.float32)
    state = q.new_empty((batch, heads, num_steps - 1, _monarch_padded_len(seq, block_size), q.shape[3]),
                        dtype=torch.float32)
    return out, state


@torch.library.register_fake("strata::monarch_attention_backward")
def _monarch_attention_backward(q, k, v, state, dout, *options):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


# ---- structured operators ----------------------------------------------------------------------
# A spec travels as (int[] spec, float[] alpha); spec[0] = in features, spec[1] = out features.


def _check_width(where: str, x: torch.Tensor, spec) -> None:
    torch._check(x.dim() >= 1 and x.shape[-1] == spec[0],
                 lambda: f"{where}: argument 'x': expected a tensor (..., {spec[0]}), got {list(x.shape)}")


@torch.library.register_fake("strata::structured_forward")
def _structured_forward(x, factors, spec, alpha):
    _check_width("structured_forward", x, spec)
    return x.new_empty((*x.shape[:-1], spec[1]))


@torch.library.register_fake("strata::structured_forward_saving")
def _structured_forward_saving(x, factors, spec, alpha):
    _check_width("structured_forward_saving", x, spec)
    tile_rows, per_tile = torch.ops.strata.structured_saved_layout(spec, alpha)
    rows = 1
    for s in x.shape[:-1]:
        rows = rows * s
    saved = x.new_empty(((rows + tile_rows - 1) // tile_rows * per_tile,), dtype=torch.float32)
    return x.new_empty((*x.shape[:-1], spec[1])), saved


@torch.library.register_fake("strata::structured_backward")
def _structured_backward(x, factors, spec, alpha, dy, input_grad=True, factor_grads=True, saved=None):
    dx = x.new_empty(x.shape) if input_grad else None
    return dx, [f.new_empty(f.shape) for f in factors] if factor_grads else []


# ---- baselines ---------------------------------------------------------------------------------


@torch.library.register_fake("strata::performer_omega")
def _performer_omega(head_dim, num_features, seed=None):
    return torch.empty((head_dim, num_features), dtype=torch.float64, device="cpu")


@torch.library.register_fake("strata::structured_to_dense")
def _structured_to_dense(factors, spec, alpha):
    torch._check(len(factors) > 0, lambda: "structured_to_dense: argument 'factors': expected the spec's factors, got none")
    dtype = torch.float64 if factors[0].dtype == torch.float64 else torch.float32
    return factors[0].new_empty((spec[1], spec[0]), dtype=dtype)
