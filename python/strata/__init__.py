"""strata: structured softmax attention kernels, from Python.

A thin layer over the ops that ``libstrata_torch.so`` registers as ``torch.ops.strata.*``
(the same library the C++ API and the ``strata`` CLI use); no math happens in Python.
Semantics (masks, lse, the fully-masked-row convention) are those of
``include/strata/attention.h``.

Shapes, layout "bshd" ("bhsd" swaps dims 1 and 2)::

    q    batch x seq_q x heads_q  x head_dim
    k    batch x seq_k x heads_kv x head_dim       one of heads_q, heads_kv divides the other
    v    batch x seq_k x heads_kv x head_dim_v
    out  batch x seq_q x H        x head_dim_v     H = max(heads_q, heads_kv); dtype and memory order of q
    lse  batch x H x seq_q                         float32, natural log

Heads: output head h attends with query head ``h // (H // heads_q)`` and kv head
``h // (H // heads_kv)``. ``heads_q % heads_kv == 0`` is GQA / MQA; ``heads_kv % heads_q == 0`` is
its mirror, a query shared by groups of kv heads (``heads_q = 1``: one q for every head, as in
Bilinear BTT attention), read in place for each head and never copied; its gradient has q's shape
and sums the heads' contributions. (``q.expand(...)`` to H heads also works, at an H-fold cost in
the backward.) head_dim is any size >= 1 (tested up to 1024).

Tensors are CPU float32 or bfloat16, any strides; :func:`attention` and
:func:`paper_gswa_attention` also take float64, computed by the double-precision reference
(exact gradients, for ``torch.autograd.gradcheck``).

Errors name the function and the argument, say what was expected and what came, e.g.
``attention_forward: argument 'k': expected ..., got ...``. The wrappers check argument types
first, without coercion (``strata._check``): bool options take only bools, integer options only
ints (not bools, floats or strings), tensors only tensors; a wrong type raises ``TypeError``, a
wrong value found in Python ``ValueError``; what the ops check (shapes, dtypes, ranges) raises
``RuntimeError``.

Autograd: :func:`attention`, :func:`paper_gswa_attention`, ``mlr_attention`` and
``monarch_attention`` are differentiable (once). The kernels alone (``*_forward`` and
``*_backward``, as functions here and as ``torch.ops.strata.*``) are NOT differentiable: their
outputs never require grad, whatever the inputs (as if detached): ``out.sum().backward()``
raises "does not require grad", and in a larger graph they carry no gradient back to q, k, v.
Use the differentiable functions for training.

Installed with pip (``pip install --no-build-isolation .``, distribution ``strata-attention``), the
shared library sits in the package folder and nothing needs setting. It is found in this order: the
file named by the environment variable ``STRATA_LIB``; ``libstrata_torch.so`` in the package folder
(each of ``strata.__path__``: an editable install, ``pip install -e``, adds site-packages/strata to
the source folder, which never holds one); in a source checkout (``python/strata``),
``<repo>/build/release/torch/libstrata_torch.so`` (the developers' build, ``PYTHONPATH=python``).
:func:`info` says which one was loaded, ``__version__`` is the library's (the project version).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional, Tuple

import torch

from . import _check

__all__ = [
    "__version__",
    "info",
    "thread_pool",
    "set_thread_pool",
    "attention",
    "attention_forward",
    "attention_backward",
    "attention_qkvpacked",
    "library_path",
    # MLR attention (strata.mlr)
    "mlr_attention",
    "mlr_attention_forward",
    "mlr_attention_backward",
    "mlr_attention_qkvpacked",
    "pack_segments",
    "MLRAttention",
    # MonarchAttention and the model converter (strata.monarch)
    "monarch_attention",
    "monarch_attention_forward",
    "monarch_attention_backward",
    "monarch_attention_flops",
    "MonarchAttention",
    "convert_attention",
    # the baselines (strata.baselines)
    "paper_gswa_attention",
    "performer_attention",
    "nystrom_attention",
    "softmax_attention_flops",
    "performer_attention_flops",
    "nystrom_attention_flops",
    "SoftmaxAttention",
    "PerformerAttention",
    "NystromAttention",
    # structured operators (strata.structured)
    "structured",
    "StructuredLinear",
    "StructuredSpec",
    "structured_linear",
    # bilinear BTT / MLR scoring (strata.bilinear) and muP training support (strata.mup)
    "BilinearBTTAttention",
    "BilinearMLRAttention",
    "btt_factorize",
    "btt_key_transform",
    "block_diag_transform",
    "mup",
    # the fused block pieces (strata.blocks)
    "gelu_mlp",
    "ln_linear",
    "GeluMLP",
    # the converted sentence encoder (strata.encoder)
    "SentenceEncoder",
]

_LIB_NAME = "libstrata_torch.so"


def _find_library() -> Path:
    """Returns the path of libstrata_torch.so (search order in the module docstring)."""
    env = os.environ.get("STRATA_LIB")
    if env:
        path = Path(env)
        if not path.is_file():
            raise ImportError(f"strata: STRATA_LIB={env!r} is not a file (expected the path of {_LIB_NAME})")
        return path
    candidates = [Path(folder) / _LIB_NAME for folder in __path__]  # noqa: F821 (the package's own)
    here = Path(__file__).resolve().parent
    repo = here.parent.parent
    if here.parent.name == "python" and (repo / "CMakeLists.txt").is_file():  # a source checkout
        candidates.append(repo / "build" / "release" / "torch" / _LIB_NAME)
    for path in candidates:
        if path.is_file():
            return path
    tried = ", ".join(str(p) for p in candidates)
    raise ImportError(
        f"strata: {_LIB_NAME} not found (tried {tried}); install the package with "
        "pip install --no-build-isolation . , build it with scripts/build.sh release, "
        "or set STRATA_LIB to its path"
    )


def _load_library(path: Path) -> None:
    """Loads the op library into this torch; a library built for another torch is an ImportError
    that names both versions (its symbols would not resolve, or worse, resolve to another ABI)."""
    try:
        torch.ops.load_library(str(path))
    except OSError as e:
        raise ImportError(
            f"strata: cannot load {path} into torch {torch.__version__}: {e}. It must be built against "
            "the torch it runs with: reinstall with pip install --no-build-isolation in this environment"
        ) from e
    built = torch.ops.strata.info()[1]
    if built.split(".")[:2] != torch.__version__.split("+")[0].split(".")[:2]:
        raise ImportError(
            f"strata: {path} was built against torch {built}, but this is torch {torch.__version__}; "
            "reinstall strata-attention with pip install --no-build-isolation in this environment"
        )


library_path: Path = _find_library()
_load_library(library_path)
_ops = torch.ops.strata
# The kernel ops' fake implementations (torch.compile / torch.export), once the ops exist.
from . import _fake  # noqa: E402,F401
__version__: str = _ops.info()[0]


def info() -> dict:
    """What this strata is and runs on.

    Returns:
        dict with ``version`` (strata's, = ``__version__``), ``library`` (path of the loaded
        libstrata_torch.so), ``isa`` (what the kernels dispatch to: "avx512", "avx2" or "scalar";
        the environment variable STRATA_ISA lowers it), ``threads`` (strata's thread pool:
        STRATA_NUM_THREADS, else all cores), ``cpu_features``, ``torch`` (the running torch's
        version), ``torch_built_with`` (the LibTorch the library was compiled against) and
        ``torch_threads`` (torch.get_num_threads()), ``thread_pool`` (where strata's parallel
        regions run: see :func:`set_thread_pool`), ``bf16_auto`` (the engine ``compute="auto"``
        gives bfloat16 inputs here: "amx_bf16", "avx512_bf16" or "fp32") and ``bf16_dot_rates``
        (this core's vdpbf16ps and fp32 FMA rates in GMAC/s on one thread, measured once per
        process, which decided it: avx512_bf16 only where the first is at least 1.25x the second),
        ``gpu`` (per op family, the path CUDA tensors take in this process: "triton ..." where
        strata.gpu registered its kernels, else "torch-ops (<why>)"; see strata.gpu.paths).
    """
    from . import gpu as _gpu  # imports Triton only where a usable CUDA device is present

    version, torch_built_with, isa, threads, cpu_features = _ops.info()
    bf16_auto, dot_rate, fma_rate = _ops.bf16_auto()
    return {
        "version": version,
        "library": str(library_path),
        "isa": isa,
        "threads": threads,
        "cpu_features": cpu_features,
        "torch": torch.__version__,
        "torch_built_with": torch_built_with,
        "torch_threads": torch.get_num_threads(),
        "thread_pool": thread_pool(),
        "bf16_auto": bf16_auto,
        "bf16_dot_rates": (dot_rate, fma_rate),
        "gpu": _gpu.paths(),
    }


def thread_pool() -> str:
    """Where strata's kernels run their parallel regions: ``"torch"`` or ``"own"``.

    See :func:`set_thread_pool`.
    """
    return _ops.thread_pool(None)


def set_thread_pool(name: str) -> None:
    """Chooses the threads strata's kernels run their parallel regions on.

    Args:
        name: ``"torch"``: torch's own intra-op threads, so strata and torch share one team of
            threads; a region then uses min(``info()["threads"]``, ``torch.get_num_threads()``)
            threads (the default). ``"own"``: strata's own pool, whose workers sleep
            between regions; torch's OpenMP workers spin for a while after every torch op
            (libgomp's default policy) and then take the cores from it: with ``"own"``, set
            ``OMP_WAIT_POLICY=PASSIVE`` before torch is imported. The environment variable
            STRATA_THREAD_POOL sets the default at import.

    Raises:
        TypeError: name is not a str.
        ValueError: name is neither ``"torch"`` nor ``"own"`` (the message names 'name').

    Fork: libgomp's threads do not survive fork, so a child forked after strata ran a region on
    torch's threads starts with ``torch.get_num_threads() == 1`` (as torch's DataLoader workers do;
    otherwise torch's own parallel ops would hang there), and strata's regions in any forked child
    run on a fresh pool of strata's own.

    Not thread-safe against strata kernels running in other threads at the same moment.
    """
    where = "strata.set_thread_pool"
    if _check.string(name, where, "name") not in ("torch", "own"):
        _check.fail(where, "name", '"torch" or "own"', _check._got(name))
    _ops.thread_pool(name)


def _attention_options(where, scale, causal, window, num_global, key_padding_mask, bias, layout, compute) -> tuple:
    """The schema's trailing option arguments, checked (_check: exact types, errors naming the argument)."""
    left, right = _check.int_pair(window, where, "window")
    return (
        _check.optional_real(scale, where, "scale"),
        _check.boolean(causal, where, "causal"),
        left,
        right,
        _check.integer(num_global, where, "num_global"),
        _check.optional_tensor(key_padding_mask, where, "key_padding_mask"),
        _check.optional_tensor(bias, where, "bias"),
        _check.string(layout, where, "layout"),
        _check.string(compute, where, "compute"),
    )


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: Optional[float] = None,
    causal: bool = False,
    window: Tuple[int, int] = (-1, -1),
    num_global: int = 0,
    key_padding_mask: Optional[torch.Tensor] = None,
    bias: Optional[torch.Tensor] = None,
    layout: str = "bshd",
    compute: str = "auto",
) -> torch.Tensor:
    """Differentiable attention: ``softmax(scale * q k^T + bias + mask) v`` per (batch, head of out).

    Args (shapes in the module docstring):
        q, k, v: CPU float32 / bfloat16 (kernel) or float64 (double reference), one dtype.
        scale: logit scale; None means 1/sqrt(head_dim).
        causal: key j allowed for query i when j <= i + seq_k - seq_q (bottom-right aligned).
        window: (left, right) ints; key j allowed when p - left <= j <= p + right,
            p = i + seq_k - seq_q; -1 leaves that side unbounded.
        num_global: the first G positions are Longformer-style global tokens (window waived).
        key_padding_mask: batch x seq_k, bool or uint8, True / nonzero = attend.
        bias: added to the logits, broadcastable to batch x H x seq_q x seq_k (float32 or
            q's dtype); it gets no gradient, so it must not require grad.
        layout: "bshd" or "bhsd".
        compute: the products of bfloat16 inputs: "auto" (bf16 products with fp32 accumulation on
            AMX-BF16, or AVX512-BF16 where it outruns fp32 FMAs here, else fp32:
            ``info()["bf16_auto"]``), "fp32", or one engine, "avx512_bf16" / "amx_bf16"
            (RuntimeError where the CPU lacks it); the autograd backward computes as the forward
            was asked. float32 inputs and decoding (<= 4 queries) always compute in fp32.

    Returns:
        out: batch x seq_q x H x head_dim_v (in ``layout``), H = max(heads_q, heads_kv). Query
        rows with no allowed key are zeros and get zero gradients.
    """
    where = "attention"
    return _ops.attention(*_check.tensors(where, q=q, k=k, v=v),
                          *_attention_options(where, scale, causal, window, num_global, key_padding_mask, bias, layout,
                                              compute))


def attention_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: Optional[float] = None,
    causal: bool = False,
    window: Tuple[int, int] = (-1, -1),
    num_global: int = 0,
    key_padding_mask: Optional[torch.Tensor] = None,
    bias: Optional[torch.Tensor] = None,
    layout: str = "bshd",
    compute: str = "auto",
) -> Tuple[torch.Tensor, torch.Tensor]:
    """The forward kernel alone; float32 / bfloat16 only. Options as :func:`attention`.

    Not differentiable: its outputs never require grad, whatever the inputs (for gradients use
    :func:`attention`, which runs this kernel and :func:`attention_backward`).

    Returns:
        (out: batch x seq_q x H x head_dim_v in ``layout``, H = max(heads_q, heads_kv),
         lse: batch x H x seq_q float32, log-sum-exp of the allowed logits, -inf for empty rows)
    """
    where = "attention_forward"
    return _ops.attention_forward(
        *_check.tensors(where, q=q, k=k, v=v),
        *_attention_options(where, scale, causal, window, num_global, key_padding_mask, bias, layout, compute))


def attention_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    dout: torch.Tensor,
    *,
    scale: Optional[float] = None,
    causal: bool = False,
    window: Tuple[int, int] = (-1, -1),
    num_global: int = 0,
    key_padding_mask: Optional[torch.Tensor] = None,
    bias: Optional[torch.Tensor] = None,
    layout: str = "bshd",
    compute: str = "auto",
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward kernel alone; float32 / bfloat16 only. Options must equal the forward's.

    Not differentiable (no double backward): its outputs never require grad.

    Args:
        out, lse: what :func:`attention_forward` returned for q, k, v.
        dout: gradient of the loss w.r.t. out (shape and dtype of out).

    Returns:
        (dq, dk, dv) with the shapes and dtype of q, k, v (the bias gets no gradient).
    """
    where = "attention_backward"
    return _ops.attention_backward(
        *_check.tensors(where, q=q, k=k, v=v, out=out, lse=lse, dout=dout),
        *_attention_options(where, scale, causal, window, num_global, key_padding_mask, bias, layout, compute))


def attention_qkvpacked(
    qkv: torch.Tensor,
    *,
    scale: Optional[float] = None,
    causal: bool = False,
    window: Tuple[int, int] = (-1, -1),
    num_global: int = 0,
    key_padding_mask: Optional[torch.Tensor] = None,
    bias: Optional[torch.Tensor] = None,
    compute: str = "auto",
) -> torch.Tensor:
    """:func:`attention` on q, k, v packed in one tensor, differentiable.

    ``qkv``: batch x seq x 3 x heads x head_dim (a fused q/k/v projection's output viewed as such,
    ``x @ w_qkv.T`` unflattened to (3, heads, head_dim)); q, k, v are ``qkv[:, :, 0..2]``. The same
    kernels and results as ``attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], ...)`` (bitwise),
    but the backward writes dq, dk and dv into one gradient of qkv's shape, where autograd through
    the three views would add three gradients into a zero tensor. Options as :func:`attention`
    (layout "bshd").

    Returns:
        out: batch x seq x heads x head_dim.
    """
    where = "attention_qkvpacked"
    return _ops.attention_qkvpacked(_check.tensor(qkv, where, "qkv"),
                                    *_attention_options(where, scale, causal, window, num_global, key_padding_mask,
                                                        bias, "bshd", compute))


# MLR attention: after the library is loaded (strata.mlr calls torch.ops.strata.mlr_*).
from .mlr import (  # noqa: E402
    MLRAttention,
    mlr_attention,
    mlr_attention_backward,
    mlr_attention_forward,
    mlr_attention_qkvpacked,
    pack_segments,
)
# MonarchAttention and the model converter (strata.monarch calls torch.ops.strata.monarch_*).
from .monarch import (  # noqa: E402
    MonarchAttention,
    convert_attention,
    monarch_attention,
    monarch_attention_backward,
    monarch_attention_flops,
    monarch_attention_forward,
)
# The baselines (strata.baselines: GSWA, Performer, Nystromformer, softmax as a module).
from .baselines import (  # noqa: E402
    NystromAttention,
    PerformerAttention,
    SoftmaxAttention,
    nystrom_attention,
    nystrom_attention_flops,
    paper_gswa_attention,
    performer_attention,
    performer_attention_flops,
    softmax_attention_flops,
)
# Structured operators (strata.structured: the MLBTC family, StructuredLinear).
from . import structured  # noqa: E402
from .structured import StructuredLinear, StructuredSpec, structured_linear  # noqa: E402
# Bilinear BTT / MLR scoring (strata.bilinear, over torch.ops.strata.bilinear_*) and muP training
# support (strata.mup: roles, init, parameter groups, AdamW, the RMS cap).
from . import mup  # noqa: E402
from .bilinear import (  # noqa: E402
    BilinearBTTAttention,
    BilinearMLRAttention,
    block_diag_transform,
    btt_factorize,
    btt_key_transform,
)
# The converted sentence encoder on your own text (strata.encoder, over torch.classes.strata.SentenceEncoder).
from .blocks import GeluMLP, gelu_mlp, ln_linear  # noqa: E402
from .encoder import SentenceEncoder  # noqa: E402
# The Triton kernels as the CUDA kernels of the ops (strata.gpu), where a CUDA device is present
# (no Triton import otherwise); STRATA_GPU=0 keeps the torch-ops path.
if os.environ.get("STRATA_GPU", "1") != "0" and torch.cuda.is_available():
    from . import gpu  # noqa: E402,F401
