"""The converted sentence encoder on your own text: all-MiniLM-L6-v2 with any attention spec.

The encoder of the zero-shot conversion benchmark (``strata convert``, ``models/conversion.h``)
and of ``strata embed``, from Python::

    enc = strata.SentenceEncoder.load(spec="monarch:T=2,B=8", layers=[3, 4, 5])
    emb = enc.encode(["A man is playing a guitar.", "The new movie is awesome."])  # 2 x 384

It runs in C++ (``torch.classes.strata.SentenceEncoder``, compiled into
``libstrata_encoder.so`` beside ``libstrata_torch.so``): WordPiece tokenisation (lower case,
truncated to ``max_length`` tokens), the BERT encoder with the spec's attention in the chosen
layers (the others softmax), mean pooling over the tokens and L2 normalisation, exactly as the
benchmark. Sentences are sorted by token count and batched with others of EQUAL length (no
padding enters any attention, so a length-dependent method such as Monarch's default block size
sees each sentence as if alone); rows come back in input order and equal one-at-a-time
embeddings to fp32 round-off. No math happens in Python.

The model comes from ``scripts/setup_encoder.sh`` (or the folder in ``STRATA_MINILM_DIR``, or
``model_dir``): :meth:`SentenceEncoder.load` raises ``RuntimeError`` saying how to install it
when it is missing.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, List, Optional, Sequence, Union

import torch

from . import _check

__all__ = ["SentenceEncoder"]

_ENCODER_LIB_NAME = "libstrata_encoder.so"
_loaded: Optional[Path] = None


def _load_encoder_library() -> None:
    """Loads libstrata_encoder.so (which registers torch.classes.strata.SentenceEncoder)
    from beside the op library strata loaded, once."""
    global _loaded
    if _loaded is not None:
        return
    from . import library_path  # the op library found at import (strata/__init__.py)

    path = Path(library_path).parent / _ENCODER_LIB_NAME
    if not path.is_file():
        raise RuntimeError(
            f"strata.SentenceEncoder: {path} not found: this build of strata has no sentence encoder "
            "(it was built with STRATA_BUILD_ENCODER=OFF); rebuild with it ON (the default, needs "
            "nlohmann_json and utf8proc): scripts/build.sh release, or pip install --no-build-isolation ."
        )
    torch.ops.load_library(str(path))
    _loaded = path


def _sentences(value: Any, where: str) -> List[str]:
    """value as a list of str: a sequence (not a str itself) whose every element is a str that
    UTF-8 can encode (a lone surrogate cannot: ValueError, instead of torch's binding error)."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        _check.fail(where, "sentences", "a sequence of str (a list of sentences)", _check._got(value), TypeError)
    for i, s in enumerate(value):
        if not isinstance(s, str):
            _check.fail(where, f"sentences[{i}]", "a str", _check._got(s), TypeError)
        try:
            s.encode("utf-8")
        except UnicodeEncodeError as e:
            _check.fail(where, f"sentences[{i}]", "a str that UTF-8 can encode", f"{e.reason} at {e.start}")
    return list(value)


class SentenceEncoder:
    """all-MiniLM-L6-v2 with the attention of some layers replaced (the conversion benchmark's
    encoder). Make one with :meth:`load`; :meth:`encode` embeds sentences."""

    def __init__(self, handle: Any) -> None:
        """Wraps a ``torch.classes.strata.SentenceEncoder``; use :meth:`load`."""
        self._enc = handle

    @classmethod
    def load(
        cls,
        spec: str = "softmax",
        layers: Optional[Sequence[int]] = None,
        *,
        max_length: int = 256,
        model_dir: Optional[Union[str, "os.PathLike[str]"]] = None,
    ) -> "SentenceEncoder":
        """Loads the model and converts its attention.

        Args:
            spec: the attention spec, the syntax of ``strata convert --method``
                (``models/attention_zoo.h``): ``"softmax"``, ``"monarch:T=2,B=8"``,
                ``"nystrom:landmarks=32"``, ``"performer:features=128,seed=0"``, optionally with
                ``@layer,layer,...`` at the end.
            layers: the layers (0-based) that use ``spec``, the others softmax; ``None``: the
                spec's own ``@...``, or every layer. Not both.
            max_length: tokens per sentence including [CLS] and [SEP] (2..512); longer sentences
                are truncated. 256 is the model card's.
            model_dir: a folder with config.json, vocab.txt and model.safetensors; ``None``: the
                installed model (``STRATA_MINILM_DIR``, else scripts/setup_encoder.sh's).

        Raises:
            TypeError: an argument of the wrong type.
            RuntimeError: a bad spec, layers out of the model's range, a missing model (the
                message says how to install it); each names the argument.
        """
        where = "SentenceEncoder.load"
        spec = _check.string(spec, where, "spec")
        layer_list = [] if layers is None else _check.int_list(layers, where, "layers")
        max_length = _check.integer(max_length, where, "max_length")
        if model_dir is not None and not isinstance(model_dir, (str, os.PathLike)):
            _check.fail(where, "model_dir", "None, a str or an os.PathLike", _check._got(model_dir), TypeError)
        folder = "" if model_dir is None else os.fspath(model_dir)
        if not isinstance(folder, str):
            _check.fail(where, "model_dir", "a path as str", _check._got(folder), TypeError)
        _load_encoder_library()
        return cls(torch.classes.strata.SentenceEncoder(spec, layer_list, folder, max_length))

    def encode(self, sentences: Sequence[str], batch_size: int = 32, progress: bool = False) -> torch.Tensor:
        """Sentence embeddings.

        Args:
            sentences: n sentences (str).
            batch_size: sentences of equal token count per forward (>= 1); the result does not
                depend on it beyond fp32 round-off.
            progress: draw a progress bar on the process's stderr (file descriptor 2, written by
                the C++ encoder, as ``strata embed`` does).

        Returns:
            n x 384 float32 tensor (CPU), row i the L2-normalised embedding of ``sentences[i]``;
            0 x 384 for no sentences.
        """
        where = "SentenceEncoder.encode"
        texts = _sentences(sentences, where)
        batch_size = _check.integer(batch_size, where, "batch_size", minimum=1)
        progress = _check.boolean(progress, where, "progress")
        return self._enc.encode(texts, batch_size, progress)

    @property
    def method(self) -> str:
        """The spec with its layers as given, e.g. ``"monarch:T=2,B=8@3,4,5"`` (the row label of
        ``strata convert``)."""
        return self._enc.method()

    @property
    def spec(self) -> str:
        """The canonical spec, every key spelled out, e.g. ``"monarch:T=2,B=8,pad=post,mode=stable"``."""
        return self._enc.spec()

    @property
    def layers(self) -> Optional[List[int]]:
        """The converted layers; ``None``: every layer."""
        layers = list(self._enc.layers())
        return layers or None

    @property
    def dim(self) -> int:
        """The embedding size (384 for all-MiniLM-L6-v2)."""
        return int(self._enc.dim())

    @property
    def max_length(self) -> int:
        """Tokens per sentence including [CLS] and [SEP]; longer sentences are truncated."""
        return int(self._enc.max_length())

    def __repr__(self) -> str:
        return f"SentenceEncoder(method={self.method!r}, dim={self.dim}, max_length={self.max_length})"
