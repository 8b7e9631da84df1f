"""strata's attentions inside timm Vision Transformers (timm 1.0.31; the ``hf`` extra).

timm's ViT-family blocks (``timm.layers.Attention``: VisionTransformer, DeiT, ...) compute q, k, v
and call ``F.scaled_dot_product_attention``; :func:`convert` makes chosen blocks call a strata
attention instead, zero-shot (no new parameters: the weights and ``state_dict`` stay the model's)::

    import strata.integrations.timm as stimm
    model = timm.create_model("vit_base_patch16_224", pretrained=True)
    stimm.convert(model, "monarch:T=2,B=14", layers=[6, 7, 8, 9, 10, 11])

Forward and backward (autograd through strata's ops). The converted blocks become
:class:`StrataAttention` (a subclass of timm's ``Attention``, so ``isinstance`` and copying still
work); :func:`revert` puts timm's own forward back. ``attn_mask`` / ``is_causal`` as timm passes
them: a key padding or causal mask is applied by every method; any other mask only by ``softmax``
(strata's dense kernel), a ValueError naming 'attention_mask' otherwise. Attention dropout must be
off (``model.eval()`` or ``attn_drop=0``).
"""

from __future__ import annotations

from typing import Any, List, Optional

import torch

try:
    from timm.layers import Attention as _TimmAttention
except ImportError as e:  # pragma: no cover - the hf extra is absent
    raise ImportError(f"strata.integrations.timm needs timm (pip install 'strata-attention[hf]', tested with "
                      f"timm 1.0.31): {e}") from e

from strata import _check

from ._method import Method, make_method, mask_to_strata

__all__ = ["convert", "revert", "StrataAttention"]


class StrataAttention(_TimmAttention):
    """timm's ``Attention`` whose attention is ``self.strata_method`` (set by :func:`convert`);
    everything else (qkv, q/k norms, gate, norm, proj, dropouts) is timm's own computation."""

    strata_method: Method
    strata_layer_idx: int

    def forward(self, x: torch.Tensor, attn_mask: Optional[torch.Tensor] = None, is_causal: bool = False
                ) -> torch.Tensor:
        method = self.strata_method
        where = f"strata.integrations.timm[{method.label()}]"
        if self.training and self.attn_drop.p > 0:
            raise ValueError(f"{where}: argument 'attn_drop': expected 0.0 in training (strata's attentions have no "
                             f"attention dropout: model.eval() or attn_drop_rate=0), got {self.attn_drop.p}")
        B, N, _ = x.shape
        gate = self.gate(x).sigmoid() if getattr(self, "gate", None) is not None else None
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        q, k = self.q_norm(q), self.k_norm(k)
        if attn_mask is not None and attn_mask.dim() < 4:  # sdpa broadcasting: (N, N) or (B, N, N)
            attn_mask = attn_mask.reshape((1,) * (4 - attn_mask.dim()) + tuple(attn_mask.shape))
        kpm, causal, bias = mask_to_strata(where, None if is_causal else attn_mask, B, N, N, bool(is_causal),
                                           method.kind)
        out = method(q, k, v, layout="bhsd", scale=self.scale, key_padding_mask=kpm, causal=causal, bias=bias,
                     layer=self.strata_layer_idx)
        x = out.transpose(1, 2).reshape(B, N, self.attn_dim)
        x = self.norm(x)
        if gate is not None:
            x = x * gate
        return self.proj_drop(self.proj(x))

    def extra_repr(self) -> str:
        return f"strata={self.strata_method.label()}, layer={self.strata_layer_idx}"


def _sites(model: torch.nn.Module):
    return [(n, m) for n, m in model.named_modules() if type(m) in (_TimmAttention, StrataAttention)]


def convert(model: torch.nn.Module, spec: str, layers: Optional[List[int]] = None, **options: Any) -> List[str]:
    """Replaces the attention of timm ``Attention`` blocks in place.

    Args:
        model: a timm model (VisionTransformer and the other models built of ``timm.layers.Attention``).
        spec: a spec string as ``strata convert --method``: ``"softmax"`` (exact, strata's dense kernel),
            ``"monarch:T=2,B=8"``, ``"nystrom:landmarks=32"``, ``"performer:features=128,seed=0"``,
            optionally ``@layer,...``.
        layers: the block indices (0-based, the Attention modules in ``model.modules()`` order) to
            convert; None: the spec's ``@...``, or every block. The others keep timm's attention.
        options: keyword options of the strata function (as strata.integrations.transformers.register).

    Returns:
        The qualified names of the converted modules.

    Raises:
        TypeError / ValueError naming the argument: no Attention block, a layer out of range, a bad spec.
    """
    where = "strata.integrations.timm.convert"
    if not isinstance(model, torch.nn.Module):
        _check.fail(where, "model", "a torch.nn.Module (a timm model)", _check._got(model), TypeError)
    method = make_method(where, spec, options, layers)
    sites = _sites(model)
    if not sites:
        _check.fail(where, "model", "a model with timm.layers.Attention blocks (a ViT-family model)",
                    type(model).__name__)
    chosen = list(range(len(sites))) if method.layers is None else method.layers
    if chosen and max(chosen) >= len(sites):
        _check.fail(where, "layers", f"indices in [0, {len(sites)}) (the model's Attention blocks)", repr(chosen))
    for i in chosen:
        _, m = sites[i]
        m.__class__ = StrataAttention
        m.strata_method = method
        m.strata_layer_idx = i
    return [sites[i][0] for i in chosen]


def revert(model: torch.nn.Module) -> List[str]:
    """Gives every converted block timm's own attention back; returns their names."""
    names = []
    for n, m in _sites(model):
        if type(m) is StrataAttention:
            m.__class__ = _TimmAttention
            del m.strata_method, m.strata_layer_idx
            names.append(n)
    return names
