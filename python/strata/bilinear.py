"""The structured-attention paper's bilinear scoring layers (Kuang et al., ICML 2025, sections
3.3-3.4; the reference code's BilinearBTTAttention and BilinearMLRAttention), over
``torch.ops.strata.bilinear_*`` (the same C++ functions as ``strata/torch/bilinear_attention.h``,
whose file comment has the full semantics; no math happens here).

x is ``batch x T x D`` (the block input), H heads, V split into H heads of D / H.

Bilinear BTT: per head a full-rank D x D BTT matrix M_h, D = a*b = c*d, BTT rank s, from the cores
``w_k`` (c x d x H*b*s) and ``w_q`` (H*b x a x c*s)::

    M_h[(i_a*b + j_b), (i_c*d + i_d)] = sum_sigma w_q[h*b + j_b, i_a, i_c*s + sigma]
                                                  * w_k[i_c, i_d, (h*b + j_b)*s + sigma]
    score_h(t, t') = x_t . LN(M_h x_t') * c,    c = 1/sqrt(D) ("sp") or 1/D ("mup")

(LN over D features, weight shared by heads; the query is x itself, shared by all heads).

Bilinear MLR: ranks r_1..r_L summing to D / H; level l has p_l = 2^(l-1) feature blocks,
``w_q_<l>``, ``w_k_<l>`` of shape p_l x D/p_l x H*r_l; per head r_l*p_l features (index
rho*p_l + k), a LayerNorm per level and side, ``S = sum_l c_l q_l . k_l`` with
c_l = 1/sqrt(r_l p_l) ("sp") or 8/(r_l p_l) ("mup").

Both: causal softmax (by default), dense V, an out projection; the structured cores pass through
the forward-time RMS cap (:func:`strata.mup.rms_cap`) unless ``rms_cap=False``. The modules
declare their parameters' muP roles (``mup_roles()``, read by :mod:`strata.mup`). Parameter names
are those of the C++ modules, so state dicts carry over.
"""

from __future__ import annotations

import math
from typing import Dict, Optional, Sequence, Tuple, Union

import torch

from . import _check
from .mup import MupRole

__all__ = [
    "btt_factorize",
    "btt_key_transform",
    "block_diag_transform",
    "BilinearBTTAttention",
    "BilinearMLRAttention",
]

_ops = torch.ops.strata


def btt_factorize(dim: int, rule: str = "ref") -> Tuple[int, int, int, int]:
    """(a, b, c, d) with a*b = c*d = dim. "ref": the reference's, b = d = the smallest divisor of
    dim strictly above sqrt(dim), a = c = dim / b (64 -> (4, 16, 4, 16), 384 -> (16, 24, ..));
    "balanced": the divisor pair closest to sqrt(dim) (a = b = c = d = sqrt(dim) for a square); both are
    the core's rules (strata/structured.h). RuntimeError naming 'dim' for dim < 2 ("ref") or < 1."""
    where = "btt_factorize"
    return tuple(_ops.btt_factorize(_check.integer(dim, where, "dim"), _check.string(rule, where, "rule")))


def btt_key_transform(x: torch.Tensor, w_k: torch.Tensor, w_q: torch.Tensor, heads: int) -> torch.Tensor:
    """The BTT transform of the key side: ``... x (c*d)`` -> ``... x heads x (a*b)``,
    out[..., h, i_a*b + j_b] = (M_h x)[i_a*b + j_b] (M_h above). Differentiable."""
    where = "btt_key_transform"
    return _ops.btt_key_transform(*_check.tensors(where, x=x, w_k=w_k, w_q=w_q), _check.integer(heads, where, "heads"))


def block_diag_transform(x: torch.Tensor, w: torch.Tensor, heads: int) -> torch.Tensor:
    """One bilinear-MLR level: x (``... x (p*m)``) in p chunks, chunk k times w[k] (``p x m x heads*r``)
    -> ``... x heads x (r*p)`` with feature index rho*p + k. Differentiable."""
    where = "block_diag_transform"
    return _ops.block_diag_transform(*_check.tensors(where, x=x, w=w), _check.integer(heads, where, "heads"))


def _logit_scale(value, where: str) -> str:
    value = _check.string(value, where, "logit_scale")
    if value not in ("sp", "mup"):
        _check.fail(where, "logit_scale", '"sp" or "mup"', repr(value))
    return value


def _check_input(module: torch.nn.Module, x, where: str, embed_dim: int, like: torch.Tensor) -> torch.Tensor:
    """x: batch x T x embed_dim of the module's dtype and device (RuntimeError naming 'x')."""
    x = _check.tensor(x, where, "x")
    if x.dim() != 3 or x.shape[-1] != embed_dim:
        raise RuntimeError(f"{where}: argument 'x': expected a 3-D tensor (batch, seq, embed_dim = {embed_dim}), "
                           f"got {x.dim()}-D {list(x.shape)}")
    if x.dtype != like.dtype or x.device != like.device:
        raise RuntimeError(
            f"{where}: argument 'x': expected a tensor of the module's dtype and device "
            f"({str(like.dtype).replace('torch.', '')} on {like.device}), got "
            f"{str(x.dtype).replace('torch.', '')} on {x.device}")
    return x


class BilinearBTTAttention(torch.nn.Module):
    """Self-attention with bilinear BTT scores (the reference code's BilinearBTTAttention).

    Args:
        embed_dim: D; num_heads: H (dividing D); each head attends with head dim D.
        btt_rank: s >= 1.
        factorization: "ref" (default, the reference's rule) or "balanced" (the divisor pair closest to sqrt(D));
        btt_shape: an explicit (a, b, c, d) with a*b = c*d = D instead.
        logit_scale: "sp" (1/sqrt(D)) or "mup" (1/D).
        bias: biases of V, the out projection and the LayerNorms (the reference's config.bias).
        x_layernorm: a LayerNorm of x before everything (the reference's bilinearBTT_use_extra_LN_on_X).
        causal, rms_cap: the causal mask; the forward-time RMS cap of w_k and w_q.

    Parameters: ``w_k`` (c x d x H*b*s, init N(0, 1/d)), ``w_q`` (H*b x a x c*s, init N(0, 1/(c*s))),
    ``key_norm_weight`` (1) [, ``key_norm_bias``], [``x_norm_weight`` [, ``x_norm_bias``]],
    ``v_proj``, ``out_proj`` (torch.nn.Linear; :func:`strata.mup.mup_init_` re-initialises
    everything by role, the out projection to zero).

    forward(x: batch x T x D) -> batch x T x D.
    """

    def __init__(self, embed_dim: int, num_heads: int, *, btt_rank: int = 1, factorization: str = "ref",
                 btt_shape: Optional[Sequence[int]] = None, logit_scale: str = "sp", bias: bool = False,
                 x_layernorm: bool = False, causal: bool = True, rms_cap: bool = True, device=None, dtype=None):
        super().__init__()
        where = "BilinearBTTAttention"
        D, H = _check.embed_and_heads(embed_dim, num_heads, where)
        s = _check.integer(btt_rank, where, "btt_rank", minimum=1)
        factorization = _check.string(factorization, where, "factorization")
        if factorization not in ("ref", "balanced"):
            _check.fail(where, "factorization", '"ref" or "balanced"', repr(factorization))
        if btt_shape is not None:
            shape = tuple(_check.int_list(btt_shape, where, "btt_shape"))
            if len(shape) != 4 or min(shape) < 1 or shape[0] * shape[1] != D or shape[2] * shape[3] != D:
                _check.fail(where, "btt_shape", f"(a, b, c, d) >= 1 with a*b = c*d = embed_dim = {D}", repr(shape))
        else:
            try:
                shape = btt_factorize(D, factorization)
            except RuntimeError as e:  # the rule has no factorisation of D: name embed_dim
                expected = str(e).split("expected ", 1)[-1].split(", got")[0]
                _check.fail(where, "embed_dim", expected, repr(D))
        self.embed_dim, self.num_heads, self.btt_rank = D, H, s
        self.btt_shape = shape
        self.logit_scale = _logit_scale(logit_scale, where)
        bias = _check.boolean(bias, where, "bias")
        self.x_layernorm = _check.boolean(x_layernorm, where, "x_layernorm")
        self.causal = _check.boolean(causal, where, "causal")
        self.rms_cap = _check.boolean(rms_cap, where, "rms_cap")
        a, b, c, d = shape
        f = dict(device=device, dtype=dtype)
        self.w_k = torch.nn.Parameter(torch.randn(c, d, H * b * s, **f) / math.sqrt(d))
        self.w_q = torch.nn.Parameter(torch.randn(H * b, a, c * s, **f) / math.sqrt(c * s))
        self.key_norm_weight = torch.nn.Parameter(torch.ones(D, **f))
        self.key_norm_bias = torch.nn.Parameter(torch.zeros(D, **f)) if bias else None
        self.x_norm_weight = torch.nn.Parameter(torch.ones(D, **f)) if self.x_layernorm else None
        self.x_norm_bias = torch.nn.Parameter(torch.zeros(D, **f)) if self.x_layernorm and bias else None
        self.v_proj = torch.nn.Linear(D, D, bias=bias, **f)
        self.out_proj = torch.nn.Linear(D, D, bias=bias, **f)

    def extra_repr(self) -> str:
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, btt_shape={self.btt_shape}, "
                f"btt_rank={self.btt_rank}, logit_scale={self.logit_scale!r}, x_layernorm={self.x_layernorm}, "
                f"causal={self.causal}, rms_cap={self.rms_cap}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _check_input(self, x, "BilinearBTTAttention.forward", self.embed_dim, self.w_k)
        return _ops.bilinear_btt_attention(
            x, self.w_k, self.w_q, self.key_norm_weight, self.key_norm_bias, self.x_norm_weight, self.x_norm_bias,
            self.v_proj.weight, self.v_proj.bias, self.out_proj.weight, self.out_proj.bias, self.num_heads,
            self.logit_scale, self.causal, self.rms_cap)

    def mup_roles(self) -> Dict[str, MupRole]:
        """w_k, w_q: structured cores (fan-in d and c*s, the reference's); the LN weights gains;
        v_proj hidden; out_proj output (zero init)."""
        a, b, c, d = self.btt_shape
        cs = c * self.btt_rank
        roles = {
            "w_k": MupRole.structured_core(d, 1.0 / math.sqrt(d)),
            "w_q": MupRole.structured_core(cs, 1.0 / math.sqrt(cs)),
            "key_norm_weight": MupRole.gain(),
            "v_proj.weight": MupRole.hidden(self.embed_dim),
            "out_proj.weight": MupRole.output(self.embed_dim),
        }
        for name, role in (("key_norm_bias", MupRole.bias()), ("x_norm_weight", MupRole.gain()),
                           ("x_norm_bias", MupRole.bias())):
            if getattr(self, name) is not None:
                roles[name] = role
        if self.v_proj.bias is not None:
            roles["v_proj.bias"] = MupRole.bias()
            roles["out_proj.bias"] = MupRole.bias()
        return roles


def _ranks(ranks, where: str) -> list:
    if isinstance(ranks, str):
        try:
            return [int(r) for r in ranks.split("|")]
        except ValueError:
            raise ValueError(f"{where}: argument 'ranks': expected integers separated by '|', got {ranks!r}") from None
    return _check.int_list(ranks, where, "ranks")


class BilinearMLRAttention(torch.nn.Module):
    """Self-attention with bilinear MLR scores (the reference code's BilinearMLRAttention).

    Args:
        embed_dim: D, a multiple of 2^(L-1); num_heads: H (dividing D).
        ranks: r_1..r_L >= 1 summing to D / H (a list or "r1|r2|..").
        logit_scale: "sp" (1/sqrt(r_l p_l)) or "mup" (8/(r_l p_l)).
        qk_layernorm: the per-level LayerNorms (the reference's do_qk_ln).
        bias: biases of V, the out projection and the LayerNorms.
        divide_by_num_levels: S *= 1/L (the reference's mlr_divide_by_num_levels).
        causal, rms_cap: the causal mask; the forward-time RMS cap of the level weights.

    Parameters, for l = 1..L: ``w_q_<l>``, ``w_k_<l>`` (p_l x D/p_l x H*r_l, init N(0, p_l/D));
    with qk_layernorm ``q_norm_weight_<l>``, ``k_norm_weight_<l>`` (1) and with bias too
    ``q_norm_bias_<l>``, ``k_norm_bias_<l>``; ``v_proj``, ``out_proj``.

    forward(x: batch x T x D) -> batch x T x D.
    """

    def __init__(self, embed_dim: int, num_heads: int, ranks: Union[Sequence[int], str], *, logit_scale: str = "sp",
                 qk_layernorm: bool = True, bias: bool = False, divide_by_num_levels: bool = False,
                 causal: bool = True, rms_cap: bool = True, device=None, dtype=None):
        super().__init__()
        where = "BilinearMLRAttention"
        D, H = _check.embed_and_heads(embed_dim, num_heads, where)
        ranks = _ranks(ranks, where)
        if not 1 <= len(ranks) <= 30:
            _check.fail(where, "ranks", "1 to 30 levels", f"{len(ranks)} ({ranks})")
        for i, r in enumerate(ranks):
            if r < 1:
                _check.fail(where, "ranks", f"r_l >= 1 (r_{i + 1})", repr(r))
        if sum(ranks) != D // H:
            _check.fail(where, "ranks", f"r_1 + .. + r_L = head_dim = embed_dim / num_heads = {D // H}",
                        f"{sum(ranks)} ({ranks})")
        p_last = 2 ** (len(ranks) - 1)
        if D % p_last != 0:
            _check.fail(where, "embed_dim",
                        f"a multiple of the block count 2^(L-1) = {p_last} of the last of L = {len(ranks)} levels",
                        repr(D))
        self.embed_dim, self.num_heads, self.ranks = D, H, ranks
        self.logit_scale = _logit_scale(logit_scale, where)
        self.qk_layernorm = _check.boolean(qk_layernorm, where, "qk_layernorm")
        bias = _check.boolean(bias, where, "bias")
        self.divide_by_num_levels = _check.boolean(divide_by_num_levels, where, "divide_by_num_levels")
        self.causal = _check.boolean(causal, where, "causal")
        self.rms_cap = _check.boolean(rms_cap, where, "rms_cap")
        self._names = {k: [] for k in ("w_q", "w_k", "q_norm_weight", "q_norm_bias", "k_norm_weight", "k_norm_bias")}
        f = dict(device=device, dtype=dtype)
        for i, r in enumerate(ranks):
            p, l = 2 ** i, i + 1
            std = 1.0 / math.sqrt(D // p)  # the muP std of W_l
            new = {"w_q": torch.randn(p, D // p, H * r, **f) * std, "w_k": torch.randn(p, D // p, H * r, **f) * std}
            if self.qk_layernorm:
                new.update(q_norm_weight=torch.ones(r * p, **f), k_norm_weight=torch.ones(r * p, **f))
                if bias:
                    new.update(q_norm_bias=torch.zeros(r * p, **f), k_norm_bias=torch.zeros(r * p, **f))
            for kind, t in new.items():
                self.register_parameter(f"{kind}_{l}", torch.nn.Parameter(t))
                self._names[kind].append(f"{kind}_{l}")
        self.v_proj = torch.nn.Linear(D, D, bias=bias, **f)
        self.out_proj = torch.nn.Linear(D, D, bias=bias, **f)

    def extra_repr(self) -> str:
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, ranks={self.ranks}, "
                f"logit_scale={self.logit_scale!r}, qk_layernorm={self.qk_layernorm}, "
                f"divide_by_num_levels={self.divide_by_num_levels}, causal={self.causal}, rms_cap={self.rms_cap}")

    def _list(self, kind: str) -> list:
        return [getattr(self, n) for n in self._names[kind]]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _check_input(self, x, "BilinearMLRAttention.forward", self.embed_dim, self.w_q_1)
        return _ops.bilinear_mlr_attention(
            x, self._list("w_q"), self._list("w_k"), self._list("q_norm_weight"), self._list("q_norm_bias"),
            self._list("k_norm_weight"), self._list("k_norm_bias"), self.v_proj.weight, self.v_proj.bias,
            self.out_proj.weight, self.out_proj.bias, self.num_heads, self.logit_scale, self.divide_by_num_levels,
            self.causal, self.rms_cap)

    def mup_roles(self) -> Dict[str, MupRole]:
        """The level weights: structured cores of fan-in D / p_l (the reference's); the LN weights
        gains; v_proj hidden; out_proj output (zero init)."""
        D = self.embed_dim
        roles = {"v_proj.weight": MupRole.hidden(D), "out_proj.weight": MupRole.output(D)}
        for kind, names in self._names.items():
            for i, name in enumerate(names):
                m = D // 2**i
                roles[name] = (MupRole.structured_core(m, 1.0 / math.sqrt(m)) if kind in ("w_q", "w_k")
                               else MupRole.gain() if kind.endswith("weight") else MupRole.bias())
        if self.v_proj.bias is not None:
            roles["v_proj.bias"] = MupRole.bias()
            roles["out_proj.bias"] = MupRole.bias()
        return roles
