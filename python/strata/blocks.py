"""The fused pieces of a pre-LN transformer block, over ``torch.ops.strata.{gelu_mlp,ln_linear}*``.

- :func:`gelu_mlp`: ``linear(gelu(linear(x, w1, b1)), w2, b2)`` with the exact (erf) GELU, optionally
  with its pre-LayerNorm and the residual, ``x + MLP(LN(x))``: a block's second half in one call
  each way (the hidden activations stay in cache, tile by tile; ``include/strata/mlp.h``).
- :func:`ln_linear`: ``linear(LN(x), w, b)``: a block's first LayerNorm and its fused q/k/v
  projection in one call each way.
- :class:`GeluMLP`: the module over :func:`gelu_mlp` (``fc1``, ``fc2`` and optionally ``norm`` are
  plain ``nn.Linear`` / ``nn.LayerNorm``, so a state dict of the unfused stack loads as is).

Shapes: x (..., D) with any leading dims; w1 H x D, b1 H, w2 D x H, b2 D (a ``Linear(D, H)``'s and
a ``Linear(H, D)``'s parameters); ln_weight / ln_bias D; w for ln_linear out x D. CPU float32 runs
the fused kernels (the forward saves the pre-activation and the LayerNorm's statistics for the
backward); float64 and tensors on other devices run the same math as ATen ops (the reference, for
``torch.autograd.gradcheck``). The kernels' results agree with the ATen ops to float32 round-off
(not bitwise: the kernels add in their own order). Differentiable once; every input (biases and
the LayerNorm's parameters included) gets its gradient.
"""

from __future__ import annotations

from typing import Optional

import torch

from . import _check

__all__ = ["gelu_mlp", "ln_linear", "GeluMLP"]

_ops = torch.ops.strata


def _ln_options(where: str, ln_weight, ln_bias, eps) -> tuple:
    return (_check.optional_tensor(ln_weight, where, "ln_weight"), _check.optional_tensor(ln_bias, where, "ln_bias"),
            _check.real(eps, where, "eps"))


def gelu_mlp(
    x: torch.Tensor,
    w1: torch.Tensor,
    b1: Optional[torch.Tensor],
    w2: torch.Tensor,
    b2: Optional[torch.Tensor],
    *,
    ln_weight: Optional[torch.Tensor] = None,
    ln_bias: Optional[torch.Tensor] = None,
    eps: float = 1e-5,
    residual: bool = False,
) -> torch.Tensor:
    """``[x +] linear(gelu(linear(LN(x), w1, b1)), w2, b2)``, differentiable (shapes above).

    Args:
        x: (..., D).  w1: H x D.  b1: H or None.  w2: D x H.  b2: D or None.
        ln_weight, ln_bias: the pre-LayerNorm's (D each; None: no LayerNorm; ln_bias needs ln_weight).
        eps: the LayerNorm's epsilon (a float).  residual: add x to the output (a bool).

    Returns:
        y: x's shape (contiguous).
    """
    where = "gelu_mlp"
    return _ops.gelu_mlp(_check.tensor(x, where, "x"), _check.tensor(w1, where, "w1"),
                         _check.optional_tensor(b1, where, "b1"), _check.tensor(w2, where, "w2"),
                         _check.optional_tensor(b2, where, "b2"), *_ln_options(where, ln_weight, ln_bias, eps),
                         _check.boolean(residual, where, "residual"))


def ln_linear(
    x: torch.Tensor,
    w: torch.Tensor,
    b: Optional[torch.Tensor] = None,
    *,
    ln_weight: Optional[torch.Tensor] = None,
    ln_bias: Optional[torch.Tensor] = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    """``linear(LN(x), w, b)``, differentiable: x (..., D), w out x D, b out or None -> (..., out)."""
    where = "ln_linear"
    return _ops.ln_linear(_check.tensor(x, where, "x"), _check.tensor(w, where, "w"),
                          _check.optional_tensor(b, where, "b"), *_ln_options(where, ln_weight, ln_bias, eps))


class GeluMLP(torch.nn.Module):
    """``[x +] fc2(gelu(fc1(norm(x))))`` in one fused call each way (:func:`gelu_mlp`).

    Args:
        width: D.  hidden: H (default 4 D).  bias: fc1 / fc2 with biases.
        norm: a pre-LayerNorm over D (``self.norm``; with ``norm_bias`` its bias).
        residual: return x + MLP(...) (a pre-LN block's second half).  eps: the LayerNorm's.
    """

    def __init__(self, width: int, hidden: Optional[int] = None, *, bias: bool = True, norm: bool = False,
                 norm_bias: bool = True, residual: bool = False, eps: float = 1e-5):
        super().__init__()
        where = "GeluMLP"
        width = _check.integer(width, where, "width", minimum=1)
        hidden = 4 * width if hidden is None else _check.integer(hidden, where, "hidden", minimum=1)
        self.fc1 = torch.nn.Linear(width, hidden, bias=_check.boolean(bias, where, "bias"))
        self.fc2 = torch.nn.Linear(hidden, width, bias=bias)
        self.norm = (torch.nn.LayerNorm(width, eps=_check.real(eps, where, "eps"),
                                        bias=_check.boolean(norm_bias, where, "norm_bias"))
                     if _check.boolean(norm, where, "norm") else None)
        self.residual = _check.boolean(residual, where, "residual")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = self.norm
        return gelu_mlp(x, self.fc1.weight, self.fc1.bias, self.fc2.weight, self.fc2.bias,
                        ln_weight=None if n is None else n.weight, ln_bias=None if n is None else n.bias,
                        eps=1e-5 if n is None else n.eps, residual=self.residual)
