"""strata's attentions inside Hugging Face ``transformers`` models (transformers 5.25; the ``hf`` extra).

Three lines convert a pretrained model without training (zero-shot)::

    import strata.integrations.transformers as st
    st.register("strata_monarch", "monarch:T=2,B=8", layers=[3, 4, 5])
    model = AutoModel.from_pretrained(path, attn_implementation="strata_monarch")

(or ``model.set_attn_implementation("strata_monarch")`` on a loaded model). Importing the module
registers ``strata_softmax`` (strata's dense exact kernel, flash attention on CPU: the model's own
attention to fp32 round-off; not "strata_flash": transformers reads any name containing "flash" as
a FlashAttention kernel),
``strata_monarch``, ``strata_nystrom`` and ``strata_performer`` with their spec defaults;
:func:`register` (re)registers a name with options, as a spec string (the grammar of
``strata convert --method``, e.g. ``"monarch:T=2,B=8@3,4,5"``) and/or keywords
(``num_steps=2, block_size=8``; ``strata_mlr`` needs ``ranks=...``, for models trained with MLR
attention). Each name goes into ``transformers.AttentionInterface`` AND
``transformers.masking_utils.AttentionMaskInterface`` (the boolean masks of sdpa): without the
second, transformers builds no padding mask for the name, and a padded batch would silently attend
to its padding.

What the attention function honours (anything else is a ValueError naming the argument, never a
silently different result):

- ``attention_mask``: a key padding mask, or a causal mask with key padding (decoders; left or
  right padding), becomes strata's ``key_padding_mask`` / ``causal``; no mask: the module's
  ``is_causal``. Any other pattern (sliding window, packed sequences) or additive bias: only
  strata_softmax applies it (as the dense kernel's ``bias``); Monarch, Nystrom and Performer are
  bidirectional and refuse causal models. Padded query rows of Monarch / Nystrom / Performer output
  zeros (transformers' attend to the valid keys); every real token is computed as without padding.
- GQA / MQA (key and value with fewer heads): strata's kernels read the shared heads in place.
- ``scaling``: the logit scale (Monarch, Nystrom, Performer, flash); MLR uses its own (option ``scale``).
- ``dropout``: must be 0 (``model.eval()``, or the config's attention dropout 0): strata's attentions
  have no attention dropout.
- ``head_mask`` (where a model passes one): scales each head's output, as eager attention does.
- ``softcap``, ``sliding_window`` (outside strata_softmax), ``position_bias``, ``s_aux`` (sinks):
  ValueError naming them.
- ``layers``: the layers (``module.layer_idx``, or the numbering of :func:`number_layers`) that use
  the method; the others run transformers' own sdpa attention on the same masks.

The attention weights are not returned (``output_attentions`` gives None for these layers).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import torch

try:
    import transformers as _hf
    from transformers import AttentionInterface, PreTrainedModel
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
except ImportError as e:  # pragma: no cover - the hf extra is absent
    raise ImportError(f"strata.integrations.transformers needs transformers (pip install 'strata-attention[hf]', "
                      f"tested with transformers 5.25.0): {e}") from e

from strata import _check

from ._method import KINDS, Method, make_method, mask_to_strata

__all__ = ["register", "registered", "convert", "number_layers", "NAMES"]

# The names registered at import, and the kind each stands for.
NAMES: Dict[str, str] = {
    "strata_softmax": "softmax",
    "strata_monarch": "monarch",
    "strata_nystrom": "nystrom",
    "strata_performer": "performer",
    "strata_mlr": "mlr",
}
_registered: Dict[str, Method] = {}


def _layer_index(module: torch.nn.Module) -> Optional[int]:
    """The layer of an attention module: number_layers' numbering, else transformers' layer_idx."""
    for attr in ("strata_layer_idx", "layer_idx"):
        value = getattr(module, attr, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _attention_function(name: str, method: Method):
    where = f"strata.integrations.transformers[{name}]"

    def strata_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                 attention_mask: Optional[torch.Tensor], dropout: float = 0.0,
                                 scaling: Optional[float] = None, is_causal: Optional[bool] = None, **kwargs: Any):
        layer = _layer_index(module)
        if method.layers is not None:
            if layer is None:
                raise ValueError(f"{where}: argument 'layers': expected attention modules that know their layer "
                                 f"(layer_idx), got {type(module).__name__} without one: call "
                                 "strata.integrations.transformers.number_layers(model) (or convert(model, ...)) first")
            if layer not in method.layers:  # the model's own attention
                return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                              scaling=scaling, is_causal=is_causal, **kwargs)
        if dropout:
            raise ValueError(f"{where}: argument 'dropout': expected 0.0 (strata's attentions have no attention "
                             f"dropout: call model.eval() or set the config's attention dropout to 0), got {dropout}")
        for option in ("softcap", "s_aux", "position_bias"):
            if kwargs.get(option) is not None:
                raise ValueError(f"{where}: argument '{option}': expected None (strata cannot apply it), got "
                                 f"{_check._got(kwargs[option])}")
        if kwargs.get("sliding_window") is not None and method.kind != "softmax":
            raise ValueError(f"{where}: argument 'sliding_window': expected None for {method.kind} attention "
                             f"(only strata_softmax applies a window, through the mask), got {kwargs['sliding_window']}")
        batch, q_len, k_len = query.shape[0], query.shape[2], key.shape[2]
        causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
        causal = causal and q_len > 1
        if causal and attention_mask is None and k_len > q_len:
            # sdpa's reading of this case (prefill into an empty static cache): the first q_len keys
            key, value = key[:, :, :q_len], value[:, :, :q_len]
            k_len = q_len
        kpm, causal, bias = mask_to_strata(where, attention_mask, batch, q_len, k_len, causal, method.kind)
        out = method(query, key, value, layout="bhsd", scale=scaling, key_padding_mask=kpm, causal=causal, bias=bias,
                     layer=layer)
        head_mask = kwargs.get("head_mask")
        if head_mask is not None:
            head_mask = head_mask.to(out.dtype)
            out = out * (head_mask.view(1, -1, 1, 1) if head_mask.dim() == 1 else head_mask)
        return out.transpose(1, 2).contiguous(), None

    strata_attention_forward.__qualname__ = f"strata_attention_forward[{name}]"
    strata_attention_forward.strata_method = method
    return strata_attention_forward


def register(name: str, spec: Optional[str] = None, *, layers: Optional[List[int]] = None, **options: Any) -> str:
    """Registers (or re-registers) a strata attention with transformers under ``name``.

    Args:
        name: the ``attn_implementation`` name. One of :data:`NAMES` (``strata_softmax``,
            ``strata_monarch``, ``strata_nystrom``, ``strata_performer``, ``strata_mlr``) picks the
            kind by itself; any other name needs ``spec``.
        spec: a spec string as ``strata convert --method`` (``"monarch:T=2,B=8"``, ``"nystrom:landmarks=32"``,
            ``"performer:features=128,seed=0"``, ``"softmax"``; ``"mlr:ranks=32|32,avg=1"``), optionally
            with ``@layer,layer,...``; None: the kind of ``name`` with ``options``.
        layers: the layers (0-based ``layer_idx``) that use it; None: the spec's ``@...``, or every layer.
        options: keyword options of the strata function (``num_steps``, ``block_size``, ``pad``,
            ``mode``, ``compute`` for monarch; ``num_landmarks``, ``pinv_iters``; ``num_features``,
            ``seed``; ``ranks``, ``context``, ``block_sizes``, ``scale``, ``divide_by_num_levels``,
            ``level_average``, ``compute`` for mlr; ``compute`` for flash), not also in the spec.

    Returns:
        name. A model loaded with ``attn_implementation=name`` (or set to it) then runs it; a model
        already set to the name picks up the new options on its next forward.

    Raises:
        TypeError / ValueError naming the argument (a bad spec names the bad part).
    """
    where = "strata.integrations.transformers.register"
    name = _check.string(name, where, "name")
    if not name or name in ("eager", "sdpa") or name.startswith(("flex_attention", "paged")) or "flash" in name:
        # transformers 5.25 treats every name containing "flash" as a FlashAttention kernel
        # (is_flash_attention_requested: unpadded inputs, a kernel looked up on the Hub)
        _check.fail(where, "name", "a new attention name such as 'strata_monarch' (not one of transformers' own, "
                    "and without 'flash', which transformers reads as a FlashAttention kernel)", repr(name))
    default_kind = NAMES.get(name)
    method = make_method(where, spec, options, layers, default_kind)
    if default_kind is not None and method.kind != default_kind:
        _check.fail(where, "spec", f"a {default_kind} spec for the name {name!r} (or another name)", repr(spec))
    AttentionInterface.register(name, _attention_function(name, method))
    AttentionMaskInterface.register(name, sdpa_mask)  # the boolean masks (padding, causal) of sdpa
    _registered[name] = method
    return name


def registered(name: str) -> Method:
    """The method registered under ``name`` (KeyError naming it otherwise)."""
    if name not in _registered:
        raise KeyError(f"strata.integrations.transformers.registered: argument 'name': expected one of "
                       f"{', '.join(sorted(_registered))}, got {name!r}")
    return _registered[name]


def _attention_modules(model: torch.nn.Module):
    """transformers' attention modules: those that hand q, k, v to the AttentionInterface (every
    one carries config, scaling and is_causal), in model.modules() order."""
    return [(n, m) for n, m in model.named_modules()
            if hasattr(m, "config") and hasattr(m, "scaling") and hasattr(m, "is_causal")]


def number_layers(model: torch.nn.Module) -> List[str]:
    """Numbers the attention modules of ``model`` 0, 1, ... in ``model.modules()`` order (attribute
    ``strata_layer_idx``), for models whose modules carry no ``layer_idx`` (e.g. ViT), so that
    ``layers`` can name them. Returns their qualified names in order."""
    where = "strata.integrations.transformers.number_layers"
    if not isinstance(model, torch.nn.Module):
        _check.fail(where, "model", "a torch.nn.Module", _check._got(model), TypeError)
    sites = _attention_modules(model)
    if not sites:
        _check.fail(where, "model", "a transformers model with attention modules (config, scaling, is_causal)",
                    type(model).__name__)
    for i, (_, m) in enumerate(sites):
        m.strata_layer_idx = i
    return [n for n, _ in sites]


def convert(model: "PreTrainedModel", spec: str, layers: Optional[List[int]] = None, *, name: Optional[str] = None,
            **options: Any) -> str:
    """Converts a loaded model in place: registers ``spec`` (as :func:`register`) under ``name``
    (default ``strata_<kind>``), numbers the layers where its modules have no ``layer_idx``, and sets
    the model's attention implementation to it. Returns the name."""
    where = "strata.integrations.transformers.convert"
    if not isinstance(model, PreTrainedModel):
        _check.fail(where, "model", "a transformers PreTrainedModel", _check._got(model), TypeError)
    if name is None:
        kind = make_method(where, spec, {}, None).kind
        name = next(n for n, k in NAMES.items() if k == kind)
    register(name, spec, layers=layers, **options)
    sites = _attention_modules(model)
    if sites and any(_layer_index(m) is None for _, m in sites):
        number_layers(model)
    method = _registered[name]
    if method.layers is not None and sites and max(method.layers) >= len(sites):
        _check.fail(where, "layers", f"indices in [0, {len(sites)}) (the model's attention layers)",
                    repr(method.layers))
    model.set_attn_implementation(name)
    return name


for _name, _kind in NAMES.items():
    if _kind != "mlr":  # MLR has no default ranks: register("strata_mlr", ranks=...) first
        register(_name)
del _name, _kind
assert set(NAMES.values()) <= set(KINDS)
_ = _hf  # the transformers package this was tested with: 5.25.0
