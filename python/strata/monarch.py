"""MonarchAttention, and the conversion of a pretrained model's attention, from Python.

Thin wrappers over ``torch.ops.strata.*`` (registered by ``libstrata_torch.so``, see
``torch/ops_monarch.cpp``); the math and its exact semantics are documented in
``torch/include/strata/torch/monarch.h`` (MonarchAttention: steps, blocks, padding, the ``stable``
and ``reference`` modes, masks). The baselines it is compared with are in :mod:`strata.baselines`.

Shapes, layout "bshd" ("bhsd" swaps dims 1 and 2); self-attention only (q and k share seq)::

    q    batch x seq x heads_q  x head_dim
    k    batch x seq x heads_kv x head_dim       heads_q % heads_kv == 0 (GQA)
    v    batch x seq x heads_kv x head_dim_v
    out  batch x seq x heads_q  x head_dim_v     dtype of q
    key_padding_mask  batch x seq, bool (True = a real token: used as key AND as query)

Converting a model: a module is *strata-aware* when its forward calls an attribute that computes
attention from ``(q, k, v, key_padding_mask)`` (default name ``attention``), e.g.::

    class SelfAttention(torch.nn.Module):
        def __init__(self, dim, heads):
            super().__init__()
            self.qkv, self.heads = torch.nn.Linear(dim, 3 * dim), heads
            self.attention = SoftmaxAttention()          # the pluggable part
        def forward(self, x, mask=None):
            q, k, v = self.qkv(x).unflatten(-1, (3, self.heads, -1)).unbind(2)
            return self.attention(q, k, v, mask).flatten(2)

    convert_attention(model, lambda i: MonarchAttention(num_steps=2, block_size=16), layers=[0, 1])

replaces the ``attention`` attribute of the first two such modules (in ``model.modules()`` order).
"""

from __future__ import annotations

from typing import Callable, Iterable, List, Optional, Tuple

import torch

import strata as _strata  # noqa: F401  (loads libstrata_torch.so)

from . import _check

__all__ = [
    "monarch_attention",
    "monarch_attention_forward",
    "monarch_attention_backward",
    "monarch_attention_flops",
    "MonarchAttention",
    "convert_attention",
]

_ops = torch.ops.strata


def _monarch_options(where, num_steps, block_size, pad, mode, scale, key_padding_mask, layout, compute) -> tuple:
    """The monarch schemas' trailing option arguments, checked (_check: exact types)."""
    return (
        _check.integer(num_steps, where, "num_steps"),
        _check.integer(block_size, where, "block_size"),
        _check.string(pad, where, "pad"),
        _check.string(mode, where, "mode"),
        _check.optional_real(scale, where, "scale"),
        _check.optional_tensor(key_padding_mask, where, "key_padding_mask"),
        _check.string(layout, where, "layout"),
        _check.string(compute, where, "compute"),
    )


def monarch_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    num_steps: int = 1,
    block_size: int = 0,
    pad: str = "post",
    mode: str = "stable",
    scale: Optional[float] = None,
    key_padding_mask: Optional[torch.Tensor] = None,
    layout: str = "bshd",
    compute: str = "auto",
) -> torch.Tensor:
    """Differentiable MonarchAttention (an approximation of ``softmax(scale q k^T) v``).

    Args:
        q, k, v: CPU float32 / bfloat16 (the kernel) or float64 (the double reference: exact
            gradients for ``torch.autograd.gradcheck``; materialises seq x seq per head).
        num_steps: T >= 1 alternating-maximisation steps.
        block_size: B >= 1; 0 means floor(sqrt(seq)); B >= seq is exact softmax attention.
        pad: "post" or "pre": where seq is zero-padded to a multiple of B.
        mode: "stable" (default) or "reference" (the paper's code's arithmetic, eps included).
        scale: logit scale; None means 1/sqrt(head_dim).
        key_padding_mask: batch x seq bool; masked tokens are neither keys nor queries (stable
            mode: their output rows are zeros).
        layout: "bshd" or "bhsd".
        compute: the products of a bfloat16 forward and backward: "auto" and "fp32" compute in
            fp32 (Monarch's bf16 products are opt in: the forward's are not faster than fp32);
            "avx512_bf16" or "amx_bf16" run the forward's products and the backward's gradient
            products on that engine, bf16 operands with fp32 accumulation (RuntimeError where the
            CPU lacks it; strata/monarch.h says what is rounded). float32 inputs compute in fp32.

    Returns:
        out: batch x seq x heads_q x head_dim_v. Differentiable once.
    """
    where = "monarch_attention"
    return _ops.monarch_attention(*_check.tensors(where, q=q, k=k, v=v),
                                  *_monarch_options(where, num_steps, block_size, pad, mode, scale, key_padding_mask,
                                                    layout, compute))


def monarch_attention_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    num_steps: int = 1,
    block_size: int = 0,
    pad: str = "post",
    mode: str = "stable",
    scale: Optional[float] = None,
    key_padding_mask: Optional[torch.Tensor] = None,
    layout: str = "bshd",
    compute: str = "auto",
) -> Tuple[torch.Tensor, torch.Tensor]:
    """The forward kernel alone; float32 / bfloat16. Options as :func:`monarch_attention`.

    Not differentiable: its outputs never require grad, whatever the inputs (for gradients use
    :func:`monarch_attention`).

    Returns:
        (out, state): state is batch x heads_q x (T-1) x (M*B) x head_dim float32 (M = ceil(seq/B)),
        the input of every R-step after the first, for :func:`monarch_attention_backward`.
    """
    where = "monarch_attention_forward"
    return _ops.monarch_attention_forward(*_check.tensors(where, q=q, k=k, v=v),
                                          *_monarch_options(where, num_steps, block_size, pad, mode, scale,
                                                            key_padding_mask, layout, compute))


def monarch_attention_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    state: Optional[torch.Tensor],
    dout: torch.Tensor,
    *,
    num_steps: int = 1,
    block_size: int = 0,
    pad: str = "post",
    mode: str = "stable",
    scale: Optional[float] = None,
    key_padding_mask: Optional[torch.Tensor] = None,
    layout: str = "bshd",
    compute: str = "auto",
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward kernel alone; options must equal the forward's. state None: recomputed.

    Not differentiable (no double backward): its outputs never require grad.

    Returns:
        (dq, dk, dv) with the shapes and dtype of q, k, v.
    """
    where = "monarch_attention_backward"
    return _ops.monarch_attention_backward(
        *_check.tensors(where, q=q, k=k, v=v), _check.optional_tensor(state, where, "state"),
        _check.tensor(dout, where, "dout"),
        *_monarch_options(where, num_steps, block_size, pad, mode, scale, key_padding_mask, layout, compute))


def monarch_attention_flops(N: int, heads: int, D: int, Dv: int, T: int, B: int) -> float:
    """FLOPs (2 x matmul MACs, the paper's count) of one sequence, all heads. B = 0: floor(sqrt(N))."""
    where = "monarch_attention_flops"
    return _ops.monarch_attention_flops(*_check.integers(where, N=N, heads=heads, D=D, Dv=Dv, T=T, B=B))


class MonarchAttention(torch.nn.Module):
    """MonarchAttention as a drop-in attention computation: ``forward(q, k, v, key_padding_mask=None)``.

    No parameters (zero-shot: it replaces softmax attention in a pretrained model as is). Options
    as :func:`monarch_attention`.
    """

    def __init__(
        self,
        num_steps: int = 1,
        block_size: int = 0,
        *,
        pad: str = "post",
        mode: str = "stable",
        scale: Optional[float] = None,
        layout: str = "bshd",
        compute: str = "auto",
    ):
        super().__init__()
        (self.num_steps, self.block_size, self.pad, self.mode, self.scale, _, self.layout,
         self.compute) = _monarch_options("MonarchAttention", num_steps, block_size, pad, mode, scale, None, layout,
                                          compute)

    def forward(self, q, k, v, key_padding_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        return monarch_attention(
            q,
            k,
            v,
            num_steps=self.num_steps,
            block_size=self.block_size,
            pad=self.pad,
            mode=self.mode,
            scale=self.scale,
            key_padding_mask=key_padding_mask,
            layout=self.layout,
            compute=self.compute,
        )

    def extra_repr(self) -> str:
        return (f"num_steps={self.num_steps}, block_size={self.block_size}, pad={self.pad!r}, mode={self.mode!r}, "
                f"compute={self.compute!r}")


def convert_attention(
    model: torch.nn.Module,
    make_attention: Callable[[int], Callable],
    layers: Optional[Iterable[int]] = None,
    *,
    attr: str = "attention",
) -> List[str]:
    """Replaces the attention computation of a strata-aware model (see the module docstring).

    The attention sites are the submodules of ``model`` (itself included) that have a callable
    attribute ``attr``, numbered 0, 1, ... in ``model.modules()`` order; a site's own attention
    module (e.g. a :class:`MonarchAttention` already installed) is not a site itself.

    Args:
        model: the model; changed in place.
        make_attention: called as ``make_attention(i)`` for site i; returns the new attention (an
            ``nn.Module`` or any callable ``(q, k, v, key_padding_mask) -> out``).
        layers: the site indices to convert; None converts every site.
        attr: the attribute name of the attention computation.

    Returns:
        The qualified names of the converted modules, in order.

    Raises:
        ValueError: no site found, or an index out of range / repeated.
        TypeError: ``make_attention`` not callable or returning something not callable (the model
            is then left unchanged), an index that is not an int.
    """
    where = "convert_attention"
    if not isinstance(model, torch.nn.Module):
        _check.fail(where, "model", "a torch.nn.Module", f"{type(model).__name__}", TypeError)
    if not callable(make_attention):
        _check.fail(where, "make_attention", "a callable i -> attention", f"{type(make_attention).__name__}", TypeError)
    attr = _check.string(attr, where, "attr")
    sites = [(name, mod) for name, mod in model.named_modules() if callable(getattr(mod, attr, None))]
    if not sites:
        raise ValueError(f"convert_attention: no submodule of {type(model).__name__} has a callable attribute {attr!r}")
    if layers is None:
        chosen = list(range(len(sites)))
    else:
        if isinstance(layers, (str, bytes)) or not hasattr(layers, "__iter__"):
            _check.fail(where, "layers", "an iterable of site indices (ints)", f"{layers!r}", TypeError)
        chosen = [_check.integer(i, where, "layers") for i in layers]
    if len(set(chosen)) != len(chosen):
        raise ValueError(f"convert_attention: argument 'layers': expected distinct indices, got {chosen}")
    for i in chosen:
        if not 0 <= i < len(sites):
            raise ValueError(f"convert_attention: argument 'layers': expected indices in [0, {len(sites)}), got {i}")
    # Build every replacement before installing any: a bad one leaves the model unchanged.
    made = []
    for i in chosen:
        new = make_attention(i)
        if not callable(new):
            _check.fail(where, "make_attention", f"a callable (q, k, v, key_padding_mask) -> out for site {i}",
                        f"{new!r} ({type(new).__name__})", TypeError)
        made.append(new)
    converted = []
    for i, new in zip(chosen, made):
        name, mod = sites[i]
        if attr in mod._modules and not isinstance(new, torch.nn.Module):
            delattr(mod, attr)  # a registered submodule cannot be overwritten by a plain callable
        setattr(mod, attr, new)
        converted.append(name)
    return converted
