"""Multi-level low-rank (MLR) attention (Kuang et al., ICML 2025) over ``torch.ops.strata.mlr_*``.

Per (batch, query head) the head dim of q and k is split into L contiguous slices of widths
r_1..r_L (``ranks``, sum = head_dim); level l partitions positions into contiguous blocks
(nested: default b_l = context / 2^(l-1), by absolute position), and

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
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple, Union

import torch

__all__ = ["mlr_attention", "mlr_attention_forward", "mlr_attention_backward", "pack_segments", "MLRAttention"]

Ranks = Union[Sequence[int], str]
IntList = Union[torch.Tensor, Sequence[int], None]


def _ranks(ranks: Ranks) -> list:
    """ranks as a list of ints; also accepts the reference code's "32|8|6|..." string."""
    if isinstance(ranks, str):
        try:
            return [int(r) for r in ranks.split("|")]
        except ValueError:
            raise ValueError(f"strata: argument 'ranks': expected integers separated by '|', got {ranks!r}") from None
    return [int(r) for r in ranks]


def _int64(t: IntList, arg: str) -> Optional[torch.Tensor]:
    """None, a tensor (checked by the op), or a sequence of ints as a 1-D int64 tensor."""
    if t is None or isinstance(t, torch.Tensor):
        return t
    try:
        return torch.tensor([int(x) for x in t], dtype=torch.int64)
    except (TypeError, ValueError):
        raise TypeError(
            f"strata: argument '{arg}': expected a 1-D int64 tensor or a sequence of ints, got {t!r}"
        ) from None


def pack_segments(lists: Sequence[Sequence[int]]) -> Tuple[torch.Tensor, torch.Tensor]:
    """One segment-start list per sequence -> (segment_starts, segment_offsets), int64.

    ``pack_segments([[5, 11], [], [9]])`` gives starts ``[5, 11, 9]`` and offsets ``[0, 2, 2, 3]``.
    """
    starts = [int(s) for lst in lists for s in lst]
    offsets = [0]
    for lst in lists:
        offsets.append(offsets[-1] + len(lst))
    return torch.tensor(starts, dtype=torch.int64), torch.tensor(offsets, dtype=torch.int64)


def _options(ranks, block_sizes, context, segment_starts, segment_offsets, mask_cross_segment, scale,
             divide_by_num_levels, level_average, causal, layout):
    """The schema's trailing option arguments, in order."""
    return (
        _ranks(ranks),
        [int(b) for b in block_sizes],
        int(context),
        _int64(segment_starts, "segment_starts"),
        _int64(segment_offsets, "segment_offsets"),
        bool(mask_cross_segment),
        scale,
        bool(divide_by_num_levels),
        bool(level_average),
        bool(causal),
        layout,
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
) -> torch.Tensor:
    """Differentiable MLR attention (shapes in the module docstring).

    Args:
        q, k, v: CPU float32 / bfloat16 (kernel) or float64 (double reference), one dtype.
        ranks: r_1..r_L (1..16 levels), sum = head_dim; a list or "r1|r2|..".
        block_sizes: b_1..b_L, each dividing the previous; empty = context / 2^(l-1).
        context: 0 = seq_k rounded up to a multiple of 2^(L-1); else a multiple of it.
        segment_starts: increasing positions that start new level-1 segments (int64 tensor or ints).
        segment_offsets: batch + 1 offsets giving each sequence its own slice of segment_starts.
        mask_cross_segment: pairs that share no level get -inf instead of score 0.
        scale: "inv_rank" (c_l = 1/r_l) or "inv_sqrt_head_dim".
        divide_by_num_levels: S *= 1/L.  level_average: S /= number of levels shared.
        causal: bottom-right aligned causal mask.  layout: "bshd" or "bhsd".

    Returns:
        out: batch x seq_q x heads_q x head_dim_v (in ``layout``); rows with no allowed key are
        zeros with zero gradients.
    """
    return torch.ops.strata.mlr_attention(
        q, k, v, *_options(ranks, block_sizes, context, segment_starts, segment_offsets, mask_cross_segment, scale,
                           divide_by_num_levels, level_average, causal, layout)
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
) -> Tuple[torch.Tensor, torch.Tensor]:
    """The forward kernel alone (no autograd); float32 / bfloat16. Options as :func:`mlr_attention`.

    Returns:
        (out: batch x seq_q x heads_q x head_dim_v in ``layout``,
         lse: batch x heads_q x seq_q float32, -inf for rows with no allowed key)
    """
    return torch.ops.strata.mlr_attention_forward(
        q, k, v, *_options(ranks, block_sizes, context, segment_starts, segment_offsets, mask_cross_segment, scale,
                           divide_by_num_levels, level_average, causal, layout)
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
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward kernel alone; float32 / bfloat16. Options must equal the forward's.

    Args:
        out, lse: what :func:`mlr_attention_forward` returned for q, k, v.
        dout: gradient of the loss w.r.t. out (shape and dtype of out).

    Returns:
        (dq, dk, dv) with the shapes and dtype of q, k, v.
    """
    return torch.ops.strata.mlr_attention_backward(
        q, k, v, out, lse, dout,
        *_options(ranks, block_sizes, context, segment_starts, segment_offsets, mask_cross_segment, scale,
                  divide_by_num_levels, level_average, causal, layout)
    )


class MLRAttention(torch.nn.Module):
    """Multi-head self-attention with MLR scores (the reference code's AttentionMLR layer).

    q/k/v/out Linear projections; optional QK-LayerNorm over the whole head dim before the split
    into levels (weight shared by heads, bias with ``bias``, eps 1e-5); GQA with
    ``num_kv_heads`` < ``num_heads``. The same layer as the C++ ``strata::torch::MLRAttention``.

    Args:
        embed_dim: model width E; num_heads: H (dividing E); head_dim = E / H = sum(ranks).
        ranks: r_1..r_L, a list or "r1|r2|..".
        num_kv_heads: heads of k and v (dividing H); None = H.
        bias: biases in the projections (and the QK-LayerNorms).
        qk_layernorm: the reference code's do_qk_ln.
        block_sizes, context, mask_cross_segment, scale, divide_by_num_levels, level_average,
        causal: as :func:`mlr_attention`.

    forward(x: batch x seq x E, segment_starts=None, segment_offsets=None) -> batch x seq x E.
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
        ranks = _ranks(ranks)
        if embed_dim < 1 or num_heads < 1 or embed_dim % num_heads != 0:
            raise ValueError(
                f"strata: MLRAttention: argument 'num_heads': expected a divisor of embed_dim = {embed_dim}, "
                f"got {num_heads}"
            )
        kv = num_heads if num_kv_heads is None else int(num_kv_heads)
        if kv < 1 or num_heads % kv != 0:
            raise ValueError(
                f"strata: MLRAttention: argument 'num_kv_heads': expected a divisor of num_heads = {num_heads}, "
                f"got {kv}"
            )
        head_dim = embed_dim // num_heads
        if sum(ranks) != head_dim:
            raise ValueError(
                f"strata: MLRAttention: argument 'ranks': expected r_1 + .. + r_L = head_dim = embed_dim / num_heads = "
                f"{head_dim}, got {sum(ranks)} ({ranks})"
            )
        self.embed_dim, self.num_heads, self.num_kv_heads, self.head_dim = embed_dim, num_heads, kv, head_dim
        self.ranks = ranks
        self.block_sizes = [int(b) for b in block_sizes]
        self.context = int(context)
        self.mask_cross_segment = bool(mask_cross_segment)
        self.scale = scale
        self.divide_by_num_levels = bool(divide_by_num_levels)
        self.level_average = bool(level_average)
        self.causal = bool(causal)
        # The remaining options (level count, ranks >= 1, nested blocks, context, scale) by the
        # kernel's own rules, once here rather than at the first forward: a 1-token dry run.
        probe = torch.zeros(1, 1, 1, head_dim)
        mlr_attention_forward(probe, probe, probe, ranks, block_sizes=self.block_sizes, context=self.context,
                              scale=scale, causal=causal)
        f = dict(device=device, dtype=dtype)
        self.q_proj = torch.nn.Linear(embed_dim, num_heads * head_dim, bias=bias, **f)
        self.k_proj = torch.nn.Linear(embed_dim, kv * head_dim, bias=bias, **f)
        self.v_proj = torch.nn.Linear(embed_dim, kv * head_dim, bias=bias, **f)
        self.out_proj = torch.nn.Linear(num_heads * head_dim, embed_dim, bias=bias, **f)
        self.qk_layernorm = bool(qk_layernorm)
        if self.qk_layernorm:
            self.q_norm = torch.nn.LayerNorm(head_dim, eps=1e-5, bias=bias, **f)
            self.k_norm = torch.nn.LayerNorm(head_dim, eps=1e-5, bias=bias, **f)

    def extra_repr(self) -> str:
        return (
            f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, "
            f"ranks={self.ranks}, qk_layernorm={self.qk_layernorm}, causal={self.causal}"
        )

    def forward(self, x: torch.Tensor, segment_starts: IntList = None, segment_offsets: IntList = None) -> torch.Tensor:
        if x.dim() != 3 or x.shape[-1] != self.embed_dim:
            raise RuntimeError(
                f"MLRAttention.forward: argument 'x': expected a 3-D tensor (batch, seq, "
                f"embed_dim = {self.embed_dim}), got {x.dim()}-D {list(x.shape)}"
            )
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.num_heads, self.head_dim)  # batch x seq x heads x head_dim
        k = self.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim)
        if self.qk_layernorm:  # over the whole head dim, before the split into levels
            q, k = self.q_norm(q), self.k_norm(k)
        y = mlr_attention(
            q, k, v, self.ranks,
            block_sizes=self.block_sizes, context=self.context, segment_starts=segment_starts,
            segment_offsets=segment_offsets, mask_cross_segment=self.mask_cross_segment, scale=self.scale,
            divide_by_num_levels=self.divide_by_num_levels, level_average=self.level_average, causal=self.causal,
        )
        return self.out_proj(y.reshape(b, t, self.num_heads * self.head_dim))
