"""The baselines strata's methods are compared with, from Python: the structured-attention paper's
global + sliding-window attention (``paper_gswa_attention``), the MonarchAttention paper's
Performer and Nystromformer, exact softmax attention as a module, and their FLOP counts.

Thin wrappers over ``torch.ops.strata.*`` (registered by ``libstrata_torch.so``); the semantics and
how each differs from its paper's reference code are in ``torch/include/strata/torch/baselines.h``
and ``torch/include/strata/torch/attention.h`` (GSWA). Shapes as :func:`strata.attention`.
"""

from __future__ import annotations

from typing import Optional

import torch

import strata as _strata  # noqa: F401  (loads libstrata_torch.so)

from . import _check

__all__ = [
    "paper_gswa_attention",
    "performer_attention",
    "nystrom_attention",
    "softmax_attention_flops",
    "performer_attention_flops",
    "nystrom_attention_flops",
    "SoftmaxAttention",
    "PerformerAttention",
    "NystromAttention",
]

_ops = torch.ops.strata


def paper_gswa_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    split_a: int,
    window: int,
    *,
    scale_a: Optional[float] = None,
    scale_b: Optional[float] = None,
    layout: str = "bshd",
) -> torch.Tensor:
    """The structured-attention paper's global + sliding-window baseline (differentiable).

    Head dims of q and k are split at ``split_a`` (a = split_a, b = head_dim - a): a causal
    softmax over dims [0, a) with logits ``scale_a * q_a . k_a`` and a causal sliding-window
    softmax (keys p - window .. p) over dims [a, head_dim) with logits ``scale_b * q_b . k_b``;
    the two probability matrices are added without renormalising: ``out = P_a v + P_b v``
    (v shared, rows of P_a + P_b sum to 2).

    Args:
        q, k, v: as :func:`attention` (float32, bfloat16 or float64).
        split_a: a, 1 .. head_dim - 1.
        window: w >= 0.
        scale_a: the global branch's logit scale; None means 8 / a, the reference code's
            (``CausalSelfGlobalSlidingWindowAttention``: the muP-style 8/d logit scale per branch).
        scale_b: the windowed branch's logit scale; None means 8 / b, the reference code's.
        layout: "bshd" or "bhsd".

    Returns:
        out: batch x seq_q x heads_q x head_dim_v (in ``layout``).
    """
    where = "paper_gswa_attention"
    return _ops.paper_gswa_attention(
        *_check.tensors(where, q=q, k=k, v=v),
        _check.integer(split_a, where, "split_a"),
        _check.integer(window, where, "window"),
        _check.optional_real(scale_a, where, "scale_a"),
        _check.optional_real(scale_b, where, "scale_b"),
        _check.string(layout, where, "layout"),
    )


def performer_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    num_features: int,
    *,
    seed: Optional[int] = None,
    key_padding_mask: Optional[torch.Tensor] = None,
    scale: Optional[float] = None,
    layout: str = "bshd",
) -> torch.Tensor:
    """Performer (FAVOR+ positive random features), differentiable by torch autograd.

    ``num_features`` Gaussian features shared by all batches and heads; ``seed`` None draws them
    from torch's default generator on every call (as the paper's code), an int draws the same
    features every time (the output is close, not bitwise, from call to call). Masked tokens are not keys and output zeros.
    """
    where = "performer_attention"
    return _ops.performer_attention(
        *_check.tensors(where, q=q, k=k, v=v), _check.integer(num_features, where, "num_features"),
        _check.optional_integer(seed, where, "seed"),
        _check.optional_tensor(key_padding_mask, where, "key_padding_mask"),
        _check.optional_real(scale, where, "scale"), _check.string(layout, where, "layout"))


def nystrom_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    num_landmarks: int,
    *,
    pinv_iters: int = 6,
    key_padding_mask: Optional[torch.Tensor] = None,
    scale: Optional[float] = None,
    layout: str = "bshd",
) -> torch.Tensor:
    """Nystromformer (segment-mean landmarks, iterative pseudo-inverse), differentiable by torch.

    Landmarks average the valid tokens of contiguous segments (every token is in one; a padded
    sequence gives the result of the unpadded one); ``num_landmarks >= seq`` is softmax attention
    up to the pseudo-inverse iteration's error. Masked tokens are not keys and output zeros.
    """
    where = "nystrom_attention"
    return _ops.nystrom_attention(
        *_check.tensors(where, q=q, k=k, v=v), _check.integer(num_landmarks, where, "num_landmarks"),
        _check.integer(pinv_iters, where, "pinv_iters"),
        _check.optional_tensor(key_padding_mask, where, "key_padding_mask"),
        _check.optional_real(scale, where, "scale"), _check.string(layout, where, "layout"))


def softmax_attention_flops(N: int, D: int, Dv: int = -1) -> float:
    """FLOPs of dense attention per (sequence, head): 2 N^2 (D + Dv) = 4 N^2 D for Dv = D."""
    return _ops.softmax_attention_flops(*_check.integers("softmax_attention_flops", N=N, D=D, Dv=Dv))


def performer_attention_flops(N: int, D: int, Dv: int, num_features: int) -> float:
    """FLOPs per (sequence, head): 2 N r (2 D + 2 Dv + 1)."""
    where = "performer_attention_flops"
    return _ops.performer_attention_flops(*_check.integers(where, N=N, D=D, Dv=Dv, num_features=num_features))


def nystrom_attention_flops(N: int, D: int, Dv: int, num_landmarks: int, pinv_iters: int = 6) -> float:
    """FLOPs per (sequence, head), m = min(landmarks, N): 2 (2 N m (D + Dv) + m^2 (D + Dv) + 6 iters m^3)."""
    where = "nystrom_attention_flops"
    return _ops.nystrom_attention_flops(
        *_check.integers(where, N=N, D=D, Dv=Dv, num_landmarks=num_landmarks, pinv_iters=pinv_iters))


class SoftmaxAttention(torch.nn.Module):
    """Exact softmax attention by strata's dense kernel: ``forward(q, k, v, key_padding_mask=None)``."""

    def __init__(self, *, scale: Optional[float] = None, layout: str = "bshd"):
        super().__init__()
        where = "SoftmaxAttention"
        self.scale, self.layout = _check.optional_real(scale, where, "scale"), _check.string(layout, where, "layout")

    def forward(self, q, k, v, key_padding_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        return _strata.attention(q, k, v, scale=self.scale, key_padding_mask=key_padding_mask, layout=self.layout)


class PerformerAttention(torch.nn.Module):
    """:func:`performer_attention` as a module: ``forward(q, k, v, key_padding_mask=None)``."""

    def __init__(self, num_features: int, *, seed: Optional[int] = None, scale: Optional[float] = None,
                 layout: str = "bshd"):
        super().__init__()
        where = "PerformerAttention"
        self.num_features = _check.integer(num_features, where, "num_features")
        self.seed = _check.optional_integer(seed, where, "seed")
        self.scale, self.layout = _check.optional_real(scale, where, "scale"), _check.string(layout, where, "layout")

    def forward(self, q, k, v, key_padding_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        return performer_attention(q, k, v, self.num_features, seed=self.seed, key_padding_mask=key_padding_mask,
                                   scale=self.scale, layout=self.layout)


class NystromAttention(torch.nn.Module):
    """:func:`nystrom_attention` as a module: ``forward(q, k, v, key_padding_mask=None)``."""

    def __init__(self, num_landmarks: int, *, pinv_iters: int = 6, scale: Optional[float] = None,
                 layout: str = "bshd"):
        super().__init__()
        where = "NystromAttention"
        self.num_landmarks = _check.integer(num_landmarks, where, "num_landmarks")
        self.pinv_iters = _check.integer(pinv_iters, where, "pinv_iters")
        self.scale, self.layout = _check.optional_real(scale, where, "scale"), _check.string(layout, where, "layout")

    def forward(self, q, k, v, key_padding_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        return nystrom_attention(q, k, v, self.num_landmarks, pinv_iters=self.pinv_iters,
                                 key_padding_mask=key_padding_mask, scale=self.scale, layout=self.layout)
