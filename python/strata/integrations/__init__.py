"""strata's attentions in other libraries' models (the ``hf`` extra: transformers and timm).

- :mod:`strata.integrations.transformers`: ``register(name, spec, layers=..., **options)`` puts a
  strata attention into ``transformers.AttentionInterface`` (and its mask into
  ``AttentionMaskInterface``), for ``from_pretrained(..., attn_implementation=name)``.
- :mod:`strata.integrations.timm`: ``convert(model, spec, layers=None)`` for timm ViT-family models.

The methods and their options are named as ``strata convert --method`` names them
(``"softmax"``, ``"monarch:T=2,B=8"``, ``"nystrom:landmarks=32"``, ``"performer:features=128,seed=0"``);
:func:`parse_spec` reads one. Importing this package imports neither library.
"""

from ._method import KINDS, Method, parse_spec

__all__ = ["KINDS", "Method", "parse_spec"]
