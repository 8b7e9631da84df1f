"""Multi-level low-rank (MLR) attention (Kuang et al., ICML 2025) over ``torch.ops.strata.mlr_*``.

Per (batch, query head) the head dim of q and k is split into L contiguous slices of widths
r_1..r_L (``ranks``, sum = head_dim); level l partitions positions into contiguous blocks
([n*b_l, (n+1)*b_l) by absolute position; default b_l = context / 2^(l-1)), and

    S[i, j] = sum over levels l in which p_i and j share a block of  c_l * q_l[i] . k_l[j]

with c_l = 1/r_l ("inv_rank", the reference code's) or 1/sqrt(head_dim); then optional
``divide_by_num_levels`` (S /= L) and ``level_average`` (S /= number of levels shared), the causal
mask (key j allowed when j <= p_i = i + seq_k - seq_q), one softmax over keys and ``out = P v``
(dense v). Full semantics: ``include/strata/mlr.h``.

Shapes (layout "bshd"; "bhsd" swaps dims 1 and 2), CPU float32 / bfloat16 (kernel) or float64
(:func:`mlr_attention` only: the double-precision reference, exact gradients for gradcheck)::

    q    batch x seq_q x heads_q  x head_dim        head_dim = sum(ranks)
    k    batch x seq_k x heads_kv x head_dim        heads_q % heads_kv == 0 (GQA)
    v    batch x seq_k x heads_kv x head_dim_v
    out  batch x seq_q x heads_q  x head_dim_v      dtype and memory order of q
    lse  batch x heads_q x seq_q                    float32

Segments: ``segment_starts`` (increasing positions 0 < s < seq_k) replace the level-1 blocks by
variable-length segments; finer levels cut each segment from its own start. With
``segment_offsets`` (batch + 1 offsets into segment_starts) every sequence has its own list;
:func:`pack_segments` builds both from one list per sequence.

Context: the functional ops default to ``context=0``: the blocks come from the call's key length
(seq_k rounded up to a multiple of 2^(L-1)), as in the reference code, which requires
T == context. Causal outputs then depend on the total length; a model that runs shorter
sequences, prefills or decodes must pass its context (or block_sizes). :class:`MLRAttention`
requires one (L >= 2).

Types: options are checked without coercion (``strata._check``): bools only for the flags, ints
only for sizes (TypeError naming the argument otherwise).
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple, Union

import torch

from . import _check

__all__ = ["mlr_attention", "mlr_attention_forward", "mlr_attention_backward", "mlr_attention_qkvpacked",
           "pack_segments", "MLRAttention"]

Ranks = Union[Sequence[int], str]
IntList = Union[torch.Tensor, Sequence[int], None]


def _ranks(ranks: Ranks, where: str) -> list:
    """ranks as a list of ints: a sequence of ints (or 1-D int64 tensor), or the reference code's
    "32|8|6|..." string."""
    if isinstance(ranks, str):
        try:
            return [int(r) for r in ranks.split("|")]
        except ValueError:
            raise ValueError(f"{where}: argument 'ranks': expected integers separated by '|', got {ranks!r}") from None
    return _check.int_list(ranks, where, "ranks")


def pack_segments(lists: Sequence[Sequence[int]]) -> Tuple[torch.Tensor, torch.Tensor]:
    """One segment-start list per sequence -> (segment_starts, segment_offsets), int64.

    ``pack_segments([[5, 11], [], [9]])`` gives starts ``[5, 11, 9]`` and offsets ``[0, 2, 2, 3]``.
    ``lists`` holds one sequence of ints per sequence of the batch (TypeError otherwise).
    """
    where = "pack_segments"
    if isinstance(lists, (str, bytes, torch.Tensor)) or not isinstance(lists, Sequence):
        _check.fail(where, "lists", "one sequence of ints per sequence of the batch, e.g. [[5, 11], [], [9]]",
                    f"{lists!r} ({type(lists).__name__})", TypeError)
    per_seq = [_check.int_list(lst, where, f"lists[{i}]") for i, lst in enumerate(lists)]
    offsets = [0]
    for lst in per_seq:
        offsets.append(offsets[-1] + len(lst))
    starts = [s for lst in per_seq for s in lst]
    return torch.tensor(starts, dtype=torch.int64), torch.tensor(offsets, dtype=torch.int64)


def _options(where, ranks, block_sizes, context, segment_starts, segment_offsets, mask_cross_segment, scale,
             divide_by_num_levels, level_average, causal, layout, compute):
    """The schema's trailing option arguments, in order, checked (_check: exact types, errors
    naming `where` and the argument)."""
    return (
        _ranks(ranks, where),
        _check.int_list(block_sizes, where, "block_sizes"),
        _check.integer(context, where, "context"),
        _check.optional_int_tensor(segment_starts, where, "segment_starts"),
        _check.optional_int_tensor(segment_offsets, where, "segment_offsets"),
        _check.boolean(mask_cross_segment, where, "mask_cross_segment"),
        _check.string(scale, where, "scale"),
        _check.boolean(divide_by_num_levels, where, "divide_by_num_levels"),
        _check.boolean(level_average, where, "level_average"),
        _check.boolean(causal, where, "causal"),
        _check.string(layout, where, "layout"),
        _check.string(compute, where, "compute"),
    )


def mlr_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    ranks: Ranks,
    *,
    block_sizes: Sequence[int] = (),
    context: int = 0,
    segment_starts: IntList = None,
    segment_offsets: IntList = None,
    mask_cross_segment: bool = False,
    scale: str = "inv_rank",
    divide_by_num_levels: bool = False,
    level_average: bool = False,
    causal: bool = True,
    layout: str = "bshd",
    compute: str = "auto",
) -> torch.Tensor:
    """Differentiable MLR attention (shapes in the module docstring).

    Args:
        q, k, v: CPU float32 / bfloat16 (kernel) or float64 (double reference), one dtype.
        ranks: r_1..r_L (1..16 levels), sum = head_dim; a list or "r1|r2|..".
        block_sizes: b_1..b_L (ints); empty = context / 2^(l-1).
        context: the context length the blocks come from, a multiple of 2^(L-1) (an int).
            context=0 (default): the blocks come from this call's key length (seq_k rounded up
            to a multiple of 2^(L-1)), as in the reference code, which requires T == context.
            Causal outputs then depend on the total length; a model that runs shorter
            sequences, prefills or decodes must pass its context (or block_sizes).
        segment_starts: increasing positions that start new level-1 segments (int64 tensor or ints).
        segment_offsets: batch + 1 offsets giving each sequence its own slice of segment_starts.
        mask_cross_segment: pairs that share no level get -inf instead of score 0 (a bool).
        scale: "inv_rank" (c_l = 1/r_l) or "inv_sqrt_head_dim".
        divide_by_num_levels: S *= 1/L.  level_average: S /= number of levels shared (bools).
        causal: bottom-right aligned causal mask (a bool).  layout: "bshd" or "bhsd".
        compute: the products of bfloat16 inputs (forward: the scores of the leading levels
            that share c_1, and P v; backward: the same scores, dO v^T and P^T dO; the rest fp32,
            include/strata/mlr.h): "auto" (bf16 products with fp32 accumulation on AMX-BF16 or
            AVX512-BF16 where it outruns fp32 FMAs here, else fp32: ``strata.info()["bf16_auto"]``),
            "fp32", or one engine, "avx512_bf16" /
            "amx_bf16" (RuntimeError where the CPU lacks it). float32 inputs always compute in
            fp32.

    Returns:
        out: batch x seq_q x heads_q x head_dim_v (in ``layout``); rows with no allowed key are
        zeros with zero gradients.
    """
    where = "mlr_attention"
    return torch.ops.strata.mlr_attention(
        *_check.tensors(where, q=q, k=k, v=v),
        *_options(where, ranks, block_sizes, context, segment_starts, segment_offsets, mask_cross_segment, scale,
                  divide_by_num_levels, level_average, causal, layout, compute)
    )


def mlr_attention_qkvpacked(
    qkv: torch.Tensor,
    ranks: Ranks,
    *,
    block_sizes: Sequence[int] = (),
    context: int = 0,
    segment_starts: IntList = None,
    segment_offsets: IntList = None,
    mask_cross_segment: bool = False,
    scale: str = "inv_rank",
    divide_by_num_levels: bool = False,
    level_average: bool = False,
    causal: bool = True,
    compute: str = "auto",
) -> torch.Tensor:
    """:func:`mlr_attention` on q, k, v packed as ``qkv``: batch x seq x 3 x heads x head_dim
    (q, k, v = ``qkv[:, :, 0..2]``), differentiable, whose backward writes one gradient of qkv's
    shape (as ``strata.attention_qkvpacked``). The same results as mlr_attention on the three views
    (bitwise); options as :func:`mlr_attention` (layout "bshd").

    Returns:
        out: batch x seq x heads x head_dim.
    """
    where = "mlr_attention_qkvpacked"
    return torch.ops.strata.mlr_attention_qkvpacked(
        _check.tensor(qkv, where, "qkv"),
        *_options(where, ranks, block_sizes, context, segment_starts, segment_offsets, mask_cross_segment, scale,
                  divide_by_num_levels, level_average, causal, "bshd", compute)
    )


def mlr_attention_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    ranks: Ranks,
    *,
    block_sizes: Sequence[int] = (),
    context: int = 0,
    segment_starts: IntList = None,
    segment_offsets: IntList = None,
    mask_cross_segment: bool = False,
    scale: str = "inv_rank",
    divide_by_num_levels: bool = False,
    level_average: bool = False,
    causal: bool = True,
    layout: str = "bshd",
    compute: str = "auto",
) -> Tuple[torch.Tensor, torch.Tensor]:
    """The forward kernel alone; float32 / bfloat16. Options as :func:`mlr_attention` (its
    ``context`` paragraph applies: context=0 takes the blocks from this call's seq_k).

    Not differentiable: its outputs never require grad, whatever the inputs (for gradients use
    :func:`mlr_attention`).

    Returns:
        (out: batch x seq_q x heads_q x head_dim_v in ``layout``,
         lse: batch x heads_q x seq_q float32, -inf for rows with no allowed key)
    """
    where = "mlr_attention_forward"
    return torch.ops.strata.mlr_attention_forward(
        *_check.tensors(where, q=q, k=k, v=v),
        *_options(where, ranks, block_sizes, context, segment_starts, segment_offsets, mask_cross_segment, scale,
                  divide_by_num_levels, level_average, causal, layout, compute)
    )


def mlr_attention_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    dout: torch.Tensor,
    ranks: Ranks,
    *,
    block_sizes: Sequence[int] = (),
    context: int = 0,
    segment_starts: IntList = None,
    segment_offsets: IntList = None,
    mask_cross_segment: bool = False,
    scale: str = "inv_rank",
    divide_by_num_levels: bool = False,
    level_average: bool = False,
    causal: bool = True,
    layout: str = "bshd",
    compute: str = "auto",
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward kernel alone; float32 / bfloat16. Options must equal the forward's.

    Not differentiable (no double backward): its outputs never require grad.

    Args:
        out, lse: what :func:`mlr_attention_forward` returned for q, k, v.
        dout: gradient of the loss w.r.t. out (shape and dtype of out).

    Returns:
        (dq, dk, dv) with the shapes and dtype of q, k, v.
    """
    where = "mlr_attention_backward"
    return torch.ops.strata.mlr_attention_backward(
        *_check.tensors(where, q=q, k=k, v=v, out=out, lse=lse, dout=dout),
        *_options(where, ranks, block_sizes, context, segment_starts, segment_offsets, mask_cross_segment, scale,
                  divide_by_num_levels, level_average, causal, layout, compute)
    )


class MLRAttention(torch.nn.Module):
    """Multi-head self-attention with MLR scores (the reference code's AttentionMLR layer).

    q/k/v/out Linear projections; optional QK-LayerNorm over the whole head dim before the split
    into levels (weight shared by heads, bias with ``bias``, eps 1e-5); GQA with
    ``num_kv_heads`` < ``num_heads``. The same layer as the C++ ``strata::torch::MLRAttention``.

    The blocks come from a fixed context that the model owns: with L >= 2 levels, ``context``
    (the model's context length, a multiple of 2^(L-1)) or ``block_sizes`` is required, and the
    blocks are [n*b_l, (n+1)*b_l) by absolute position for every call (training, prefill and
    decoding alike; positions past the context continue the same blocks). So the output at a
    position never depends on the sequence's length: a causal forward over n tokens equals the
    first n rows of the forward over n + m tokens. With L = 1 the default (one block over all
    positions: dense attention) needs neither.

    Args:
        embed_dim: model width E; num_heads: H (dividing E); head_dim = E / H = sum(ranks).
        ranks: r_1..r_L, a list or "r1|r2|..".
        num_kv_heads: heads of k and v (dividing H); None = H.
        bias: biases in the projections (and the QK-LayerNorms).
        qk_layernorm: the reference code's do_qk_ln.
        context: the model's context length (> 0, a multiple of 2^(L-1)); b_l = context / 2^(l-1).
        block_sizes: b_1..b_L explicitly, instead of context.
        mask_cross_segment, scale, divide_by_num_levels, level_average, causal: as
        :func:`mlr_attention`.

    forward(x: batch x seq x E, segment_starts=None, segment_offsets=None) -> batch x seq x E,
    x of the module's dtype and device.

    Example::

        layer = MLRAttention(512, 8, "32|8|6|4|4|4|4|2", context=1024, qk_layernorm=True)
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        ranks: Ranks,
        *,
        num_kv_heads: Optional[int] = None,
        bias: bool = True,
        qk_layernorm: bool = False,
        block_sizes: Sequence[int] = (),
        context: int = 0,
        mask_cross_segment: bool = False,
        scale: str = "inv_rank",
        divide_by_num_levels: bool = False,
        level_average: bool = False,
        causal: bool = True,
        device=None,
        dtype=None,
    ):
        super().__init__()
        where = "MLRAttention"
        embed_dim, num_heads = _check.embed_and_heads(embed_dim, num_heads, where)
        ranks = _ranks(ranks, where)
        kv = num_heads if num_kv_heads is None else _check.integer(num_kv_heads, where, "num_kv_heads", minimum=1)
        if num_heads % kv != 0:
            _check.fail(where, "num_kv_heads", f"a divisor of num_heads = {num_heads}", repr(kv))
        head_dim = embed_dim // num_heads
        if sum(ranks) != head_dim:
            _check.fail(where, "ranks", f"r_1 + .. + r_L = head_dim = embed_dim / num_heads = {head_dim}",
                        f"{sum(ranks)} ({ranks})")
        self.embed_dim, self.num_heads, self.num_kv_heads, self.head_dim = embed_dim, num_heads, kv, head_dim
        self.ranks = ranks
        self.block_sizes = _check.int_list(block_sizes, where, "block_sizes")
        self.context = _check.integer(context, where, "context")
        if len(ranks) >= 2 and self.context <= 0 and not self.block_sizes:
            # Blocks from each call's length would make a position's output depend on how many
            # tokens follow it (and prefill / decode disagree with training).
            _check.fail(where, "context", "the model's context length (> 0) or block_sizes, so that a position's "
                        "output does not depend on the sequence's length", repr(self.context))
        self.mask_cross_segment = _check.boolean(mask_cross_segment, where, "mask_cross_segment")
        self.scale = _check.string(scale, where, "scale")
        self.divide_by_num_levels = _check.boolean(divide_by_num_levels, where, "divide_by_num_levels")
        self.level_average = _check.boolean(level_average, where, "level_average")
        self.causal = _check.boolean(causal, where, "causal")
        bias = _check.boolean(bias, where, "bias")
        self.qk_layernorm = _check.boolean(qk_layernorm, where, "qk_layernorm")
        # The remaining options (level count, ranks >= 1, blocks, context, scale) by the kernel's
        # own rules, once here rather than at the first forward: a 1-token dry run.
        probe = torch.zeros(1, 1, 1, head_dim)
        mlr_attention_forward(probe, probe, probe, ranks, block_sizes=self.block_sizes, context=self.context,
                              scale=self.scale, causal=self.causal)
        f = dict(device=device, dtype=dtype)
        self.q_proj = torch.nn.Linear(embed_dim, num_heads * head_dim, bias=bias, **f)
        self.k_proj = torch.nn.Linear(embed_dim, kv * head_dim, bias=bias, **f)
        self.v_proj = torch.nn.Linear(embed_dim, kv * head_dim, bias=bias, **f)
        self.out_proj = torch.nn.Linear(num_heads * head_dim, embed_dim, bias=bias, **f)
        if self.qk_layernorm:
            self.q_norm = torch.nn.LayerNorm(head_dim, eps=1e-5, bias=bias, **f)
            self.k_norm = torch.nn.LayerNorm(head_dim, eps=1e-5, bias=bias, **f)

    def extra_repr(self) -> str:
        return (
            f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, "
            f"ranks={self.ranks}, context={self.context}, block_sizes={self.block_sizes}, "
            f"qk_layernorm={self.qk_layernorm}, causal={self.causal}"
        )

    def forward(self, x: torch.Tensor, segment_starts: IntList = None, segment_offsets: IntList = None) -> torch.Tensor:
        where = "MLRAttention.forward"
        x = _check.tensor(x, where, "x")
        if x.dim() != 3 or x.shape[-1] != self.embed_dim:
            raise RuntimeError(
                f"{where}: argument 'x': expected a 3-D tensor (batch, seq, "
                f"embed_dim = {self.embed_dim}), got {x.dim()}-D {list(x.shape)}"
            )
        w = self.q_proj.weight
        if x.dtype != w.dtype or x.device != w.device:
            raise RuntimeError(
                f"{where}: argument 'x': expected a tensor of the module's dtype and device "
                f"({str(w.dtype).replace('torch.', '')} on {w.device}), got {str(x.dtype).replace('torch.', '')} "
                f"on {x.device}"
            )
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.num_heads, self.head_dim)  # batch x seq x heads x head_dim
        k = self.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim)
        if self.qk_layernorm:  # over the whole head dim, before the split into levels
            q, k = self.q_norm(q), self.k_norm(k)
        y = mlr_attention(
            q, k, v, self.ranks,
            block_sizes=self.block_sizes, context=self.context,
            segment_starts=_check.optional_int_tensor(segment_starts, where, "segment_starts"),
            segment_offsets=_check.optional_int_tensor(segment_offsets, where, "segment_offsets"),
            mask_cross_segment=self.mask_cross_segment, scale=self.scale,
            divide_by_num_levels=self.divide_by_num_levels, level_average=self.level_average, causal=self.causal,
        )
        return self.out_proj(y.reshape(b, t, self.num_heads * self.head_dim))
