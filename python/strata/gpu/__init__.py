"""strata on NVIDIA GPUs: Triton kernels registered as the CUDA kernels of strata's ops.

Design: docs of the project, ../shared/design/gpu.md. Importing this package (``import strata``
does it when CUDA and Triton are usable; ``STRATA_GPU=0`` turns that off) registers, for CUDA
tensors:

* the Triton launchers of :mod:`strata.gpu.monarch` as the CUDA kernels of
  ``torch.ops.strata.monarch_attention_forward`` / ``_backward`` (the kernel ops);
* a CUDA and an AutogradCUDA kernel for the differentiable ``torch.ops.strata.monarch_attention``
  (what ``strata.monarch_attention``, ``strata.MonarchAttention`` and ``strata.convert_attention``
  call): an autograd Function over the two kernel ops, so eager, autograd and ``torch.compile``
  (the kernel ops have fake implementations) see the Triton kernels. Its C++ composite kernel
  would otherwise send every CUDA tensor to the ATen composition (torch/monarch.cpp,
  takes_torch_ops) before the kernel ops; a call the Triton kernels do not cover (float64, head
  dims above 256) still goes there (``OpOverload.decompose``), with a warning naming the reason
  once per reason and a count in :func:`fallbacks`.

:func:`paths` says which path each op family takes on the device (``strata.info()["gpu"]``).
Nothing here imports Triton unless a CUDA device of compute capability >= 8.0 is present (or
:func:`register` is called, as the tests do for the CPU under Triton's interpreter).
"""

from __future__ import annotations

import collections
import os
import threading
import warnings
from typing import Dict, Optional

import torch

__all__ = ["paths", "register", "registered", "fallbacks", "unavailable_reason"]

_lock = threading.Lock()
_registered: Dict[str, object] = {}  # dispatch key -> its torch.library.Library (kept alive)
_fallbacks: "collections.Counter[str]" = collections.Counter()
_warned = set()
_reason: Optional[str] = None  # why nothing is registered for CUDA (None once registered)


def unavailable_reason() -> Optional[str]:
    """None when the Triton kernels can serve CUDA tensors here, else why not."""
    if os.environ.get("STRATA_GPU", "1") == "0":
        return "STRATA_GPU=0"
    if not torch.cuda.is_available():
        return "no CUDA device"
    major, minor = torch.cuda.get_device_capability()
    if major < 8:
        return f"compute capability {major}.{minor} < 8.0 (the kernels are built and checked for sm_80 / sm_90)"
    try:
        import triton  # noqa: F401
    except Exception as e:  # pragma: no cover - triton ships with the CUDA torch wheels
        return f"triton not importable: {e}"
    return None


# ---- the kernels registered for the ops ---------------------------------------------------------
# strata::monarch_attention's options after q, k, v, with the schema's defaults (torch/library.cpp):
# the dispatcher hands a Python kernel only the arguments up to the last one not at its default.
_OPTION_DEFAULTS = (1, 0, "post", "stable", None, None, "bshd", "auto")


def _monarch_forward_kernel(q, k, v, num_steps=1, block_size=0, pad="post", mode="stable", scale=None,
                            key_padding_mask=None, layout="bshd", compute="auto", save_state=True):
    from . import monarch

    return monarch.forward(q, k, v, num_steps, block_size, pad, mode, scale, key_padding_mask, layout, compute,
                           save_state)


def _monarch_backward_kernel(q, k, v, state, dout, num_steps=1, block_size=0, pad="post", mode="stable",
                             scale=None, key_padding_mask=None, layout="bshd", compute="auto"):
    from . import monarch

    return monarch.backward(q, k, v, state, dout, num_steps, block_size, pad, mode, scale, key_padding_mask,
                            layout, compute)


class _MonarchFunction(torch.autograd.Function):
    """Differentiable MonarchAttention over the kernel ops (as torch/monarch.cpp's MonarchFunction):
    saves q, k, v, the mask and the state; the backward op recomputes every step from the state."""

    @staticmethod
    def forward(ctx, q, k, v, *options):
        out, state = torch.ops.strata.monarch_attention_forward(q, k, v, *options, True)
        ctx.options = options[:5] + (None,) + options[6:]  # the mask travels as a saved tensor
        mask = options[5]
        ctx.has_mask = mask is not None
        ctx.save_for_backward(q, k, v, state, *([mask] if mask is not None else []))
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout):
        saved = ctx.saved_tensors
        q, k, v, state = saved[:4]
        options = list(ctx.options)
        if ctx.has_mask:
            options[5] = saved[4]
        dq, dk, dv = torch.ops.strata.monarch_attention_backward(q, k, v, state, dout, *options)
        return (dq, dk, dv) + (None,) * len(options)


def _uncovered(q, k, v, options) -> Optional[str]:
    """Why the Triton kernels do not take this call (None: they do)."""
    from . import monarch

    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            return f"{name} dtype {t.dtype}"
    if q.dim() != 4 or v.dim() != 4:
        return None  # the kernel op's own checks name the argument
    d, dv = q.shape[3], v.shape[3]
    if max(d, dv) > monarch.MAX_HEAD_DIM:
        return f"head_dim {d} / head_dim_v {dv} above {monarch.MAX_HEAD_DIM}"
    return None


def _note_fallback(reason: str) -> None:
    with _lock:
        _fallbacks[reason] += 1
        first = reason not in _warned
        _warned.add(reason)
    if first:
        warnings.warn(f"strata.monarch_attention on CUDA: the Triton kernels do not cover this call ({reason}); "
                      "it runs on the torch-ops path (an ATen composition)", RuntimeWarning, stacklevel=3)


def _monarch_attention_kernel(q, k, v, *options):
    """strata::monarch_attention for CUDA tensors (AutogradCUDA and CUDA keys)."""
    options = tuple(options) + _OPTION_DEFAULTS[len(options):]
    reason = _uncovered(q, k, v, options)
    if reason is not None:
        _note_fallback(reason)
        return torch.ops.strata.monarch_attention.default.decompose(q, k, v, *options)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return _MonarchFunction.apply(q, k, v, *options)
    # inference: the forward alone, without the saved state (as the C++ path)
    return torch.ops.strata.monarch_attention_forward(q, k, v, *options, False)[0]


def register(device_type: str = "cuda") -> None:
    """Registers the Triton kernels for ``device_type``'s dispatch keys (idempotent).

    ``"cuda"`` is what importing this package does. ``"cpu"`` is for tests only: it replaces the
    CPU kernels of the kernel ops with the Triton launchers under the interpreter (torch warns that
    it overrides a kernel), in a process of their own."""
    key = {"cuda": "CUDA", "cpu": "CPU"}[device_type]
    with _lock:
        if key in _registered:
            return
        lib = torch.library.Library("strata", "IMPL")
        with warnings.catch_warnings():
            if key == "CPU":  # "Overriding a previously registered kernel": intended (tests)
                warnings.simplefilter("ignore")
            lib.impl("monarch_attention_forward", _monarch_forward_kernel, key)
            lib.impl("monarch_attention_backward", _monarch_backward_kernel, key)
            lib.impl("monarch_attention", _monarch_attention_kernel, "Autograd" + key)
            lib.impl("monarch_attention", _monarch_attention_kernel, key)
        _registered[key] = lib


def registered(device_type: str = "cuda") -> bool:
    return {"cuda": "CUDA", "cpu": "CPU"}[device_type] in _registered


def fallbacks() -> Dict[str, int]:
    """Calls of strata::monarch_attention on CUDA that went to the torch-ops path, by reason."""
    with _lock:
        return dict(_fallbacks)


def paths() -> Dict[str, str]:
    """Which path each op family takes on CUDA tensors in this process."""
    torch_ops = "torch-ops (ATen composition; no Triton kernel for this family yet)"
    if registered("cuda"):
        fb = fallbacks()
        monarch = ("triton (strata.gpu.monarch: CUDA kernels of torch.ops.strata.monarch_attention_forward / "
                   "_backward; float64 and head dims > 256 fall back to torch-ops")
        monarch += f"; fallbacks so far: {fb})" if fb else ")"
    else:
        monarch = f"torch-ops ({_reason or 'strata.gpu not registered'})"
    return {"monarch": monarch, "attention": torch_ops, "mlr": torch_ops, "structured_linear": torch_ops}


_reason = unavailable_reason()
if _reason is None:
    register("cuda")
