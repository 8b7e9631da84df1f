"""Structured linear operators (the MLBTC family) and StructuredLinear, from Python.

Semantics: ``include/strata/structured.h``. An operator maps ``x (..., in)`` to ``y (..., out)``::

    M = sum_l alpha_l P_L,l blockdiag_k'(L_l,k') P_R,l blockdiag_k(R_l,k^T)

with the special cases as named constructors (each returns a :class:`StructuredSpec`)::

    low_rank(in, out, rank)                 M = L R^T
    block_diagonal(in, out, blocks)         M = blockdiag(W_k)
    mlr(dim, ranks, blocks=None)            M = sum_l blockdiag_{k < p_l}(L_lk R_lk^T), p_l = 2^l by default
    btt(in, out, rank=1, heads=1, factorize="reference", shape=None)
                                            the structured-attention paper's BTT (W_K, W_Q cores)
    monarch(n, blocks=0)                    Dao et al.'s Monarch, sqrt(n) blocks by default
    kronecker(a_out, a_in, b_out, b_in)     A (x) B

Factors: ``spec.factor_shapes()`` lists them (per level: right then left; float32 / bfloat16 for the
kernels, float64 for the double reference, which ``torch.autograd.gradcheck`` can check).

Example::

    spec = strata.structured.btt(1024, 1024)              # (a, b, c, d) = (16, 64, 16, 64)
    layer = strata.StructuredLinear(spec)                   # drop-in for nn.Linear(1024, 1024)
    y = layer(torch.randn(8, 128, 1024))
    print(spec.params(), spec.flops(rows=1), spec.rank())  # 163840, 163840.0, 1024
"""

from __future__ import annotations

import math
from typing import List, Optional, Sequence

import torch

from . import _check

_ops = torch.ops.strata


class StructuredSpec:
    """An MLBTC operator's structure (no weights): the ops' (int[] spec, float[] alpha) pair.

    Build one with the constructors of this module; ``alpha`` (one float per level) may be replaced.
    """

    def __init__(self, ints: Sequence[int], alpha: Optional[Sequence[float]] = None, name: str = "mlbtc"):
        where = "StructuredSpec"
        self.ints: List[int] = _check.int_list(ints, where, "ints")
        if len(self.ints) < 3:
            _check.fail(where, "ints", "an encoded spec (from a constructor)", f"{len(self.ints)} integers")
        levels = self.ints[2]
        if alpha is None:
            alpha = [1.0] * levels
        if isinstance(alpha, (str, bytes)) or not isinstance(alpha, Sequence):
            _check.fail(where, "alpha", "a sequence of floats, one per level", _check._got(alpha), TypeError)
        self.alpha: List[float] = [_check.real(a, where, f"alpha[{i}]") for i, a in enumerate(alpha)]
        if len(self.alpha) != levels:
            _check.fail(where, "alpha", f"one value per level ({levels})", f"{len(self.alpha)} values")
        self.name = name
        _ops.structured_factor_shapes(self.ints, self.alpha)  # the op validates the whole spec

    @property
    def in_features(self) -> int:
        return self.ints[0]

    @property
    def out_features(self) -> int:
        return self.ints[1]

    @property
    def levels(self) -> int:
        return self.ints[2]

    def factor_shapes(self) -> List[List[int]]:
        flat = _ops.structured_factor_shapes(self.ints, self.alpha)
        return [list(flat[i:i + 3]) for i in range(0, len(flat), 3)]

    def _stats(self, rows: int = 1):
        return _ops.structured_stats(self.ints, self.alpha, rows)

    def params(self) -> int:
        """Number of weights (padding of uneven chunks excluded)."""
        return int(self._stats()[0])

    def flops(self, rows: int = 1) -> float:
        """FLOPs of one forward over ``rows`` rows (the backward: twice that)."""
        return float(self._stats(_check.integer(rows, "StructuredSpec.flops", "rows", minimum=0))[1])

    def rank(self) -> int:
        """Generic rank (what random factors give)."""
        return int(self._stats()[2])

    def plan(self) -> List[bool]:
        """Per level: True when it runs multiplied out (cheaper as one block-diagonal stage)."""
        return [bool(b) for b in self._stats()[3]]

    def __repr__(self) -> str:
        return (f"StructuredSpec({self.name}, in={self.in_features}, out={self.out_features}, "
                f"levels={self.levels}, params={self.params()}, rank={self.rank()})")


def low_rank(in_features: int, out_features: int, rank: int) -> StructuredSpec:
    w = "structured.low_rank"
    return StructuredSpec(_ops.structured_low_rank_spec(*_check.integers(w, in_features=in_features,
                                                                          out_features=out_features, rank=rank)),
                          name="low_rank")


def block_diagonal(in_features: int, out_features: int, blocks: int) -> StructuredSpec:
    w = "structured.block_diagonal"
    return StructuredSpec(_ops.structured_block_diagonal_spec(*_check.integers(w, in_features=in_features,
                                                                                out_features=out_features,
                                                                                blocks=blocks)),
                          name="block_diagonal")


def mlr(dim: int, ranks: Sequence[int], blocks: Optional[Sequence[int]] = None) -> StructuredSpec:
    w = "structured.mlr"
    return StructuredSpec(_ops.structured_mlr_spec(_check.integer(dim, w, "dim"), _check.int_list(ranks, w, "ranks"),
                                                   [] if blocks is None else _check.int_list(blocks, w, "blocks")),
                          name="mlr")


def btt(in_features: int, out_features: int, rank: int = 1, heads: int = 1, factorize: str = "reference",
        shape: Optional[Sequence[int]] = None) -> StructuredSpec:
    """BTT of rank s: ``factorize`` "reference" (the structured-attention code's rule) or "balanced";
    ``shape=[a, b, c, d]`` overrides it (a * b * heads = out_features, c * d = in_features)."""
    w = "structured.btt"
    return StructuredSpec(_ops.structured_btt_spec(
        *_check.integers(w, in_features=in_features, out_features=out_features, rank=rank, heads=heads),
        _check.string(factorize, w, "factorize"), [] if shape is None else _check.int_list(shape, w, "shape")),
        name="btt")


def monarch(n: int, blocks: int = 0) -> StructuredSpec:
    w = "structured.monarch"
    return StructuredSpec(_ops.structured_monarch_spec(*_check.integers(w, n=n, blocks=blocks)), name="monarch")


def kronecker(a_out: int, a_in: int, b_out: int, b_in: int) -> StructuredSpec:
    w = "structured.kronecker"
    return StructuredSpec(_ops.structured_kronecker_spec(*_check.integers(w, a_out=a_out, a_in=a_in, b_out=b_out,
                                                                           b_in=b_in)), name="kronecker")


def _spec(spec, where: str) -> StructuredSpec:
    if not isinstance(spec, StructuredSpec):
        _check.fail(where, "spec", "a strata.structured.StructuredSpec", _check._got(spec), TypeError)
    return spec


def _factors(factors, where: str) -> List[torch.Tensor]:
    if isinstance(factors, torch.Tensor) or not isinstance(factors, Sequence):
        _check.fail(where, "factors", "a sequence of tensors", _check._got(factors), TypeError)
    return [_check.tensor(f, where, f"factors[{i}]") for i, f in enumerate(factors)]


def structured_linear(x: torch.Tensor, spec: StructuredSpec, factors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Differentiable ``y = x M^T``: x (..., in) -> (..., out); float32 / bfloat16 (kernels) or float64
    (the double reference)."""
    where = "structured_linear"
    spec = _spec(spec, where)
    return _ops.structured_linear(_check.tensor(x, where, "x"), _factors(factors, where), spec.ints, spec.alpha)


def to_dense(spec: StructuredSpec, factors: Sequence[torch.Tensor]) -> torch.Tensor:
    """The dense ``out x in`` matrix (float64 factors: the double reference, else float32)."""
    where = "structured_to_dense"
    spec = _spec(spec, where)
    return _ops.structured_to_dense(_factors(factors, where), spec.ints, spec.alpha)


class StructuredLinear(torch.nn.Module):
    """``y = x M^T + bias`` with M any structured operator: a drop-in for ``nn.Linear(in, out)``.

    Parameters ``factor_<i>`` (``spec.factor_shapes()``) and ``bias``. Init as
    ``strata::torch::StructuredLinear``: each factor U(-1/sqrt(f), 1/sqrt(f)) with f its block's
    fan-in, divided by sqrt(levels); bias as nn.Linear's.
    """

    def __init__(self, spec: StructuredSpec, bias: bool = True, device=None, dtype=None):
        super().__init__()
        where = "StructuredLinear"
        self.spec = _spec(spec, where)
        bias = _check.boolean(bias, where, "bias")
        f = dict(device=device, dtype=dtype)
        self._names = []
        for i, shape in enumerate(self.spec.factor_shapes()):
            name = f"factor_{i}"
            self.register_parameter(name, torch.nn.Parameter(torch.empty(shape, **f)))
            self._names.append(name)
        self.bias = torch.nn.Parameter(torch.empty(self.spec.out_features, **f)) if bias else None
        self.reset_parameters()

    @property
    def factors(self) -> List[torch.Tensor]:
        return [getattr(self, n) for n in self._names]

    def reset_parameters(self) -> None:
        with torch.no_grad():
            # The right stage's factor rows index its input chunk, the left stage's columns its inner chunk.
            sides = []
            ints, i = self.spec.ints, 3
            for _ in range(self.spec.levels):
                right_kind, left_kind = ints[i + 1], ints[i + 3]
                if right_kind != 2:
                    sides.append(1)
                if left_kind != 2:
                    sides.append(2)
                i += 7 + ints[i + 5] + ints[i + 6]
            for f, side in zip(self.factors, sides):
                bound = 1.0 / math.sqrt(f.shape[side] * self.spec.levels)
                f.uniform_(-bound, bound)
            if self.bias is not None:
                b = 1.0 / math.sqrt(self.spec.in_features)
                self.bias.uniform_(-b, b)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = structured_linear(x, self.spec, self.factors)
        return y if self.bias is None else y + self.bias.to(y.dtype)

    def dense_weight(self) -> torch.Tensor:
        return to_dense(self.spec, self.factors)

    def extra_repr(self) -> str:
        return f"{self.spec}, bias={self.bias is not None}"
