"""What the integrations share: an attention method with its options (from a spec string or from
keyword options), and the reading of a framework's attention mask as strata's options.

Spec strings are those of ``strata convert --method`` / ``strata embed`` / ``strata.SentenceEncoder``
(``models/attention_spec.h``): ``"<kind>[:<key>=<value>,...][@<layer>,<layer>,...]"``, kinds
``softmax`` (strata's dense exact kernel), ``monarch`` (T, B, pad, mode), ``nystrom`` (landmarks,
iters), ``performer`` (features, seed); plus ``mlr`` with the keys of the training grammar
(``models/layer_attention_spec.h``: ranks=r1|r2|..., avg=0|1, div=0|1, scale), for models trained
with MLR attention. The C++ parser has no Python binding, so :func:`parse_spec` reads the same
grammar here, key for key and with the same ranges (tests/python/test_integrations_transformers.py
checks it against the C++ parser's canonical form through ``strata.SentenceEncoder.spec``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

import strata
from strata import _check

__all__ = ["Method", "parse_spec", "make_method", "mask_to_strata", "KINDS"]

# kind -> {spec key: (python option, kind of value, minimum or choices)}
_SPEC_KEYS: Dict[str, Dict[str, Tuple[str, str, Any]]] = {
    "softmax": {},
    "monarch": {"T": ("num_steps", "int", 1), "B": ("block_size", "int", 0),
                "pad": ("pad", "choice", ("post", "pre")), "mode": ("mode", "choice", ("stable", "reference"))},
    "nystrom": {"landmarks": ("num_landmarks", "int", 1), "iters": ("pinv_iters", "int", 1)},
    "performer": {"features": ("num_features", "int", 1), "seed": ("seed", "int", 0)},
    "mlr": {"ranks": ("ranks", "ranks", None), "avg": ("level_average", "bool", None),
            "div": ("divide_by_num_levels", "bool", None),
            "scale": ("scale", "choice", ("inv_rank", "inv_sqrt_head_dim"))},
}
KINDS = tuple(_SPEC_KEYS)

# kind -> the keyword options it takes (those of the strata function it calls) and their defaults
# (the spec grammar's: strata convert's defaults).
_OPTIONS: Dict[str, Dict[str, Any]] = {
    "softmax": {"compute": "auto"},
    "monarch": {"num_steps": 1, "block_size": 0, "pad": "post", "mode": "stable", "compute": "auto"},
    "nystrom": {"num_landmarks": 16, "pinv_iters": 6},
    "performer": {"num_features": 64, "seed": None},
    "mlr": {"ranks": None, "block_sizes": (), "context": 0, "scale": "inv_rank", "divide_by_num_levels": False,
            "level_average": False, "compute": "auto"},
}
_INT_OPTIONS = {"num_steps", "block_size", "num_landmarks", "pinv_iters", "num_features", "context"}
_STR_OPTIONS = {"pad", "mode", "compute", "scale"}
_BOOL_OPTIONS = {"divide_by_num_levels", "level_average"}


def _bad_spec(where: str, spec: str, expected: str, got: str) -> None:
    raise ValueError(f"{where}: argument 'spec': attention spec {spec!r}: expected {expected}, got {got}")


def parse_spec(spec: str, where: str = "parse_spec") -> Tuple[str, Dict[str, Any], Optional[List[int]]]:
    """``"monarch:T=2,B=8@3,4,5"`` -> ``("monarch", {"num_steps": 2, "block_size": 8}, [3, 4, 5])``.

    Returns the kind, the options the spec sets (as keyword options of the strata function) and the
    layers after ``@`` (None: no ``@``). Raises ValueError naming 'spec' and the bad part.
    """
    text = _check.string(spec, where, "spec")
    body, at, layer_text = text.partition("@")
    kind, colon, rest = body.partition(":")
    if kind not in _SPEC_KEYS:
        _bad_spec(where, text, f"a kind, one of: {', '.join(KINDS)}", repr(kind))
    keys = _SPEC_KEYS[kind]
    options: Dict[str, Any] = {}
    if colon:
        if not keys:
            _bad_spec(where, text, f"no options ({kind} takes none)", repr(rest))
        for item in rest.split(","):
            key, eq, value = item.partition("=")
            if not eq or not key:
                _bad_spec(where, text, "key=value items separated by ','", repr(item))
            if key not in keys:
                _bad_spec(where, text, f"a key of {kind}, one of: {', '.join(keys)}", repr(key))
            name, typ, arg = keys[key]
            if name in options:
                _bad_spec(where, text, f"key {key!r} once", "it twice")
            if typ == "int":
                if not value.isdigit() or int(value) < arg:
                    _bad_spec(where, text, f"key {key!r}: an integer >= {arg}", repr(value))
                options[name] = int(value)
            elif typ == "choice":
                if value not in arg:
                    _bad_spec(where, text, f"key {key!r}: one of {', '.join(arg)}", repr(value))
                options[name] = value
            elif typ == "bool":
                if value not in ("0", "1"):
                    _bad_spec(where, text, f"key {key!r}: 0 or 1", repr(value))
                options[name] = value == "1"
            else:  # ranks: r1|r2|...
                parts = value.split("|")
                if not all(p.isdigit() and int(p) >= 1 for p in parts):
                    _bad_spec(where, text, f"key {key!r}: integers >= 1 separated by '|'", repr(value))
                options[name] = [int(p) for p in parts]
    layers: Optional[List[int]] = None
    if at:
        items = layer_text.split(",")
        if not all(i.isdigit() for i in items):
            raise ValueError(f"{where}: argument 'spec': expected layers after '@' as comma-separated integers >= 0 "
                             f"in {text!r}, got {layer_text!r}")
        layers = [int(i) for i in items]
    return kind, options, layers


def _check_option(where: str, kind: str, name: str, value: Any) -> Any:
    if name not in _OPTIONS[kind]:
        _check.fail(where, name, f"an option of {kind} attention, one of: {', '.join(_OPTIONS[kind]) or 'none'}",
                    _check._got(value))
    if name in _INT_OPTIONS:
        return _check.integer(value, where, name)
    if name in _STR_OPTIONS:
        return _check.string(value, where, name)
    if name in _BOOL_OPTIONS:
        return _check.boolean(value, where, name)
    if name == "seed":
        return _check.optional_integer(value, where, name)
    if name == "ranks":
        return strata.mlr._ranks(value, where)
    if name == "block_sizes":
        return _check.int_list(value, where, name)
    return value


def _layer_list(layers: Any, where: str) -> Optional[List[int]]:
    if layers is None:
        return None
    out = _check.int_list(layers, where, "layers")
    if not out:
        _check.fail(where, "layers", "None (every layer) or at least one layer index", "[]")
    if len(set(out)) != len(out) or min(out) < 0:
        _check.fail(where, "layers", "distinct layer indices >= 0", repr(out))
    return sorted(out)


@dataclass
class Method:
    """One strata attention with its options, called on q, k, v as a framework hands them over."""

    kind: str
    options: Dict[str, Any] = field(default_factory=dict)
    layers: Optional[List[int]] = None  # None: every layer
    where: str = "strata.integrations"

    def label(self) -> str:
        """A readable name, e.g. ``monarch(num_steps=2, block_size=8)@3,4,5``."""
        opts = ", ".join(f"{k}={v!r}" for k, v in self.options.items())
        at = "" if self.layers is None else "@" + ",".join(map(str, self.layers))
        return f"{self.kind}({opts}){at}"

    def applies_to(self, layer: Optional[int]) -> bool:
        return self.layers is None or (layer is not None and layer in self.layers)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, layout: str, scale: Optional[float],
                 key_padding_mask: Optional[torch.Tensor], causal: bool, bias: Optional[torch.Tensor],
                 layer: Optional[int]) -> torch.Tensor:
        """out (in ``layout``). key_padding_mask: batch x seq_k bool, True = token; bias: additive
        logits (only the dense kernel takes one)."""
        o, where = self.options, self.where
        if bias is not None and self.kind != "softmax":
            raise ValueError(f"{where}: argument 'attention_mask': expected a padding mask (or causal with padding) "
                             f"for {self.kind} attention, got a mask of another pattern or an additive bias "
                             "(sliding window, packed sequences, position bias): only the dense kernel "
                             "(strata_softmax / softmax) applies any mask")
        if causal and self.kind not in ("softmax", "mlr"):
            raise ValueError(f"{where}: argument 'attention_mask': expected bidirectional attention for {self.kind} "
                             "(it has no causal form: encoders only), got a causal model or mask")
        if self.kind == "softmax":
            return strata.attention(q, k, v, scale=scale, causal=causal, key_padding_mask=key_padding_mask, bias=bias,
                                    layout=layout, compute=o.get("compute", "auto"))
        if self.kind == "monarch":
            return strata.monarch_attention(q, k, v, scale=scale, key_padding_mask=key_padding_mask, layout=layout,
                                            **o)
        if self.kind == "nystrom":
            return strata.nystrom_attention(q, k, v, o.get("num_landmarks", 16), pinv_iters=o.get("pinv_iters", 6),
                                            key_padding_mask=key_padding_mask, scale=scale, layout=layout)
        if self.kind == "performer":
            seed = o.get("seed")
            if seed is not None and layer is not None:
                seed = seed + layer  # as strata convert: layer l draws with seed s + l (independent features)
            return strata.performer_attention(q, k, v, o.get("num_features", 64), seed=seed,
                                              key_padding_mask=key_padding_mask, scale=scale, layout=layout)
        # mlr: its own logit scale (the option 'scale'), no padding mask
        if key_padding_mask is not None:
            raise ValueError(f"{where}: argument 'attention_mask': expected no padding for mlr attention (it takes "
                             "no key padding mask: run unpadded or equal-length batches), got padded sequences")
        opts = dict(o)
        ranks = opts.pop("ranks")
        return strata.mlr_attention(q, k, v, ranks, causal=causal, layout=layout, **opts)


def make_method(where: str, spec: Any, options: Dict[str, Any], layers: Any, default_kind: Optional[str] = None
                ) -> Method:
    """A Method from a spec string (or None: ``default_kind``), keyword options and layers.

    Options given both in the spec and as keywords, or layers both after '@' and as ``layers``,
    are a ValueError naming the argument.
    """
    if spec is None:
        if default_kind is None:
            _check.fail(where, "spec", f"a spec string such as 'monarch:T=2,B=8' (kinds: {', '.join(KINDS)})", "None",
                        TypeError)
        kind, spec_options, spec_layers = default_kind, {}, None
    else:
        kind, spec_options, spec_layers = parse_spec(spec, where)
    for name in options:
        if name in spec_options:
            _check.fail(where, name, "an option given once (in the spec or as a keyword, not both)",
                        f"{name}={options[name]!r} and the spec {spec!r}")
    merged = {**spec_options, **{n: _check_option(where, kind, n, v) for n, v in options.items()}}
    if kind == "mlr" and merged.get("ranks") is None:
        _check.fail(where, "ranks", "the ranks of mlr attention (ranks=[...] or 'mlr:ranks=r1|r2|...')", "none")
    layer_list = _layer_list(layers, where)
    if layer_list is not None and spec_layers is not None:
        _check.fail(where, "layers", f"the layers either after '@' in the spec or as 'layers', not both (spec {spec!r})",
                    repr(layer_list))
    return Method(kind, merged, layer_list if layer_list is not None else spec_layers, where)


def mask_to_strata(where: str, mask: Optional[torch.Tensor], batch: int, q_len: int, k_len: int, causal: bool,
                   kind: str) -> Tuple[Optional[torch.Tensor], bool, Optional[torch.Tensor]]:
    """A framework's attention mask as strata's (key_padding_mask, causal, bias).

    ``mask``: None (then ``causal`` says), or broadcastable to batch x heads x q_len x k_len, bool
    (True = attend) or additive float (0 = attend, <= finfo.min / 2 or -inf = blocked, as
    transformers' eager masks). A mask that is a key padding mask, or a causal mask (bottom-right
    aligned) with key padding, becomes ``key_padding_mask`` (+ ``causal``); any other pattern, or
    an additive bias with other values, becomes ``bias`` for the dense kernel (kind "softmax") and
    is a ValueError naming 'attention_mask' for the other kinds.
    """
    if mask is None:
        return None, causal, None
    if not isinstance(mask, torch.Tensor) or mask.dim() != 4:
        _check.fail(where, "attention_mask", "None or a 4-D mask (batch, heads, q_len, k_len)",
                    f"{type(mask).__name__} of shape {list(getattr(mask, 'shape', []))}", TypeError)
    if mask.shape[-1] != k_len or mask.shape[-2] not in (1, q_len) or mask.shape[0] not in (1, batch):
        _check.fail(where, "attention_mask", f"a mask broadcastable to ({batch}, heads, {q_len}, {k_len})",
                    f"shape {list(mask.shape)}")
    if mask.dtype == torch.bool:
        allowed = mask
    elif mask.is_floating_point():
        blocked = mask <= torch.finfo(mask.dtype).min / 2
        if not bool(torch.all(blocked | (mask == 0))):  # a real additive bias
            return _irregular(where, kind, mask, "an additive bias with values other than 0 / -inf")
        allowed = ~blocked
    else:
        _check.fail(where, "attention_mask", "a bool or floating-point mask", f"dtype {mask.dtype}", TypeError)
    a = allowed.expand(batch, allowed.shape[1], q_len, k_len)
    if a.shape[1] > 1 and not bool(torch.all(a == a[:, :1])):
        return _irregular(where, kind, allowed, "a mask that differs between heads")
    a = a[:, 0]
    pad = a.any(dim=1)  # batch x k_len: keys some query may attend
    if bool(torch.equal(a, pad[:, None, :].expand_as(a))):
        return (None if bool(pad.all()) else pad), False, None
    tri = (torch.arange(k_len, device=a.device)[None, :]
           <= torch.arange(q_len, device=a.device)[:, None] + (k_len - q_len))
    if bool(torch.equal(a, pad[:, None, :] & tri)):
        return (None if bool(pad.all()) else pad), True, None
    return _irregular(where, kind, allowed, "a mask that is neither key padding nor causal with key padding "
                                            "(sliding window, chunked or packed sequences)")


def _irregular(where: str, kind: str, mask: torch.Tensor, what: str):
    if kind != "softmax":
        raise ValueError(f"{where}: argument 'attention_mask': expected a key padding mask (or causal with key "
                         f"padding) for {kind} attention, got {what}: only strata_softmax (softmax) applies any mask")
    if mask.requires_grad:
        raise ValueError(f"{where}: argument 'attention_mask': expected a mask or bias that needs no gradient "
                         "(strata's bias gets none), got one that requires grad (a learned bias)")
    if mask.dtype == torch.bool:
        bias = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device).masked_fill_(~mask, float("-inf"))
    else:
        bias = mask.float()
    return None, False, bias
