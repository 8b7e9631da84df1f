"""MonarchAttention as Triton kernels: launchers for the forward and the backward.

The same function as the CPU kernel (include/strata/monarch.h, docs/methods.md): any N (pre / post
zero padding to the block grid), B = 0 (floor(sqrt N)) or given, "stable" and "reference" modes,
key padding mask, GQA (heads_q % heads_kv == 0), Dv != D, scale, layouts "bshd" / "bhsd" with any
strides, float32 / float16 / bfloat16 inputs with fp32 accumulation. The saved state is the CPU
kernel's (batch x heads_q x (T-1) x M*B x head_dim float32: abar of every R-step after the first),
so a state from either device's forward feeds either backward.

Kernels (_monarch_kernels.py): per step an R-step launch (one program per block and row chunk)
and an L-step launch (one program per offset, and query chunk at the last step); the backward per
step recomputes the R-step, then the L-step adjoint, the R-step adjoint for dabar / dq and for
dk / dv (4 launches). The B x B and M x M tiles stay on chip; what crosses launches is the
algorithm's O(N D) state, counted by :func:`state_floats`.

CUDA tensors run the compiled kernels; CPU tensors run the same source under Triton's interpreter
(numpy, slow: for the tests). Coverage: head_dim and head_dim_v <= 256 (MAX_HEAD_DIM); every other
option of the CPU kernel. :func:`covers` says whether a call is covered and, if not, why.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import torch

__all__ = [
    "MonarchCall",
    "MonarchTiles",
    "forward",
    "backward",
    "covers",
    "state_floats",
    "launcher_configs",
    "kernels",
    "MAX_HEAD_DIM",
]

MAX_HEAD_DIM = 256  # larger head dims: the tiles' registers would spill (compile check); not covered
_KERNELS_FILE = Path(__file__).with_name("_monarch_kernels.py")
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_MAX_STEPS = 1024  # the CPU binding's bound (torch/monarch.cpp)


# ---- the kernels: compiled, or under the interpreter ------------------------------------------
_compiled = None
_interpreted = None


def _patch_interpreter() -> None:
    """Two fixes to Triton 3.6's interpreter, for the interpreted copy of the kernels:
    1. it turns a runtime scalar into a Python int with int(ndarray) on a 1-element array, which
       numpy >= 2.4 refuses ('only 0-dimensional arrays'), so every `for c in range(0, n, C)` over a
       runtime bound failed: read the one element instead;
    2. triton.language.standard's @jit helpers (tl.zeros, tl.max, tl.sum, tl.cdiv, ...) were
       decorated compiled when triton was imported without TRITON_INTERPRET, and a compiled
       JITFunction refuses to be called from Python: during an interpreted launch, run them
       interpreted. Both patches live in the launch's patch scope (restored after each launch)."""
    import numpy as np
    import triton.runtime.interpreter as interp
    from triton.runtime.jit import JITFunction

    if getattr(interp, "_strata_patched", False):
        return
    original_tensor, original_lang = interp._patch_lang_tensor, interp._patch_lang
    as_interpreted = {}

    def patched_tensor(tensor, scope):
        original_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(np.asarray(self.handle.data).reshape(-1)[0]))

    def call_interpreted(self, *args, **kwargs):
        f = as_interpreted.get(id(self))
        if f is None:
            f = as_interpreted[id(self)] = interp.InterpretedFunction(self.fn)
        return f(*args, **kwargs)

    # 3. (speed) a device-function call re-patches triton.language on every call (inspect.getmembers
    # over the modules: 90% of an interpreted backward); patch once per module per launch instead.
    patched_globals = set()

    def patched_lang(fn):
        patched_globals.clear()  # a launch starts (nested calls do not come here: see device_call)
        patched_globals.add(id(fn.__globals__))
        scope = original_lang(fn)
        scope.set_attr(JITFunction, "__call__", call_interpreted)
        return scope

    def device_call(self, *args, **kwargs):
        if id(self.fn.__globals__) not in patched_globals:
            patched_globals.add(id(self.fn.__globals__))
            original_lang(self.fn)  # as InterpretedFunction.__call__ does (its scope is not restored)
        fn = self.rewrite()
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise interp.InterpreterError(repr(e)) from e

    interp._patch_lang_tensor = patched_tensor
    interp._patch_lang = patched_lang
    interp.InterpretedFunction.__call__ = device_call
    interp._strata_patched = True


def _load_kernels(interpret: bool):
    """The kernel module, loaded from its file under its own name: @triton.jit decides at
    decoration time whether a kernel is compiled or interpreted, so the interpreted copy is a
    second load with Triton's interpret knob on (no environment variable, nothing leaks)."""
    from triton import knobs

    name = "strata.gpu._monarch_kernels" + ("_interpreted" if interpret else "")
    spec = importlib.util.spec_from_file_location(name, _KERNELS_FILE)
    mod = importlib.util.module_from_spec(spec)
    before = knobs.runtime.interpret
    knobs.runtime.interpret = interpret
    try:
        spec.loader.exec_module(mod)
    finally:
        knobs.runtime.interpret = before
    sys.modules[name] = mod
    return mod


def kernels(device: torch.device):
    """The kernel module for tensors on ``device``: compiled for CUDA, interpreted for the CPU."""
    global _compiled, _interpreted
    if device.type == "cuda":
        if _compiled is None:
            _compiled = _load_kernels(False)
        return _compiled
    if device.type == "cpu":
        if _interpreted is None:
            _patch_interpreter()
            _interpreted = _load_kernels(True)
        return _interpreted
    raise RuntimeError(f"strata.gpu.monarch: no Triton kernels for device {device}")


# ---- the call and its tiles ------------------------------------------------------------------
def _np2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


@dataclass(frozen=True)
class MonarchTiles:
    """The constexpr tile sizes of one call (powers of two >= 16: tl.dot's minimum).

    rc, kc: R-step rows and keys per chunk (B x B tiles in pieces of rc x kc); lc, lk: L-step
    queries and blocks per chunk; one: the L-step of a non-last step in one tile (M <= lc = lk);
    dp, dvp: head_dim and head_dim_v padded. warps: num_warps of every launch."""

    rc: int
    kc: int
    lc: int
    lk: int
    one: bool
    dp: int
    dvp: int
    warps: int


def choose_tiles(B: int, M: int, D: int, Dv: int, override: Optional[Dict[str, int]] = None) -> MonarchTiles:
    """The launcher's tile choice. Chunks of up to 64 (a 64 x 64 fp32 score tile is 32 registers a
    thread at 4 warps), halved while a chunk x padded head dim tile exceeds 64 x 128 floats (keeps
    head dims to 256 below the register file: the compile check). ``override`` (tests) sets any
    of rc, kc, lc, lk to force several chunks on small shapes."""
    dp, dvp = max(16, _np2(D)), max(16, _np2(Dv))
    cap = 64
    while cap > 16 and cap * max(dp, dvp) > 64 * 128:
        cap //= 2
    rt = min(cap, max(16, _np2(B)))
    lt = min(cap, max(16, _np2(M)))
    t = dict(rc=rt, kc=rt, lc=lt, lk=lt)
    if override:
        for key, val in override.items():
            if key not in t or val < 16 or val & (val - 1):
                raise ValueError(f"strata.gpu.monarch: tile {key}={val}: expected rc/kc/lc/lk, a power of 2 >= 16")
            t[key] = val
    one = M <= t["lc"] and M <= t["lk"]
    warps = 8 if max(dp, dvp) >= 128 else 4
    return MonarchTiles(t["rc"], t["kc"], t["lc"], t["lk"], one, dp, dvp, warps)


@dataclass(frozen=True)
class MonarchCall:
    """Sizes and options of one call, checked; geometry as monarch_geometry (src/cpu/monarch.cpp)."""

    batch: int
    N: int
    Hq: int
    Hkv: int
    D: int
    Dv: int
    B: int  # block size
    M: int  # blocks
    P: int  # padded length M * B
    front: int  # padded positions before token 0
    T: int
    stable: bool
    scale: float
    layout: str
    dtype: torch.dtype
    lp: bool  # 16-bit products (16-bit inputs and compute != "fp32")

    @property
    def G(self) -> int:
        return self.Hq // self.Hkv


def _fail(where: str, arg: str, expected: str, got) -> None:
    raise RuntimeError(f"{where}: argument '{arg}': expected {expected}, got {got}")


def _logical(x: torch.Tensor, layout: str) -> torch.Tensor:
    """x as a (batch, seq, head, dim) view (no copy): its strides are the kernels' logical ones."""
    return x if layout == "bshd" else x.transpose(1, 2)


def make_call(where: str, q, k, v, num_steps, block_size, pad, mode, scale, key_padding_mask, layout,
              compute) -> MonarchCall:
    """Checks a call's tensors and options (errors name the argument, as the CPU op's do)."""
    if layout not in ("bshd", "bhsd"):
        _fail(where, "layout", '"bshd" or "bhsd"', f'"{layout}"')
    if pad not in ("post", "pre"):
        _fail(where, "pad", '"post" or "pre"', f'"{pad}"')
    if mode not in ("stable", "reference"):
        _fail(where, "mode", '"stable" or "reference"', f'"{mode}"')
    if compute not in ("auto", "fp32", "avx512_bf16", "amx_bf16"):
        _fail(where, "compute", '"auto", "fp32", "avx512_bf16" or "amx_bf16"', f'"{compute}"')
    if not 1 <= num_steps <= _MAX_STEPS:
        _fail(where, "num_steps", f">= 1 and <= {_MAX_STEPS}", num_steps)
    if block_size < 0:
        _fail(where, "block_size", ">= 1, or 0 for floor(sqrt(seq))", block_size)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            _fail(where, name, "a 4-d tensor", f"{t.dim()}-d")
        if t.dtype not in _DTYPES:
            _fail(where, name, "dtype float32, float16 or bfloat16", t.dtype)
        if t.dtype != q.dtype:
            _fail(where, name, f"dtype {q.dtype} (q's)", t.dtype)
        if t.device != q.device:
            _fail(where, name, f"device {q.device} (q's)", t.device)
    ql, kl, vl = _logical(q, layout), _logical(k, layout), _logical(v, layout)
    batch, N, Hq, D = ql.shape
    if kl.shape[0] != batch or vl.shape[0] != batch:
        _fail(where, "k", f"batch {batch}", kl.shape[0])
    if kl.shape[1] != N:
        _fail(where, "k", f"seq {N} (q's: self-attention only)", kl.shape[1])
    if vl.shape[1] != N:
        _fail(where, "v", f"seq {N}", vl.shape[1])
    Hkv = kl.shape[2]
    if vl.shape[2] != Hkv:
        _fail(where, "v", f"heads {Hkv} (k's)", vl.shape[2])
    if Hkv == 0 or Hq % Hkv:
        _fail(where, "k", f"heads dividing heads_q = {Hq}", Hkv)
    if kl.shape[3] != D:
        _fail(where, "k", f"head_dim {D} (q's)", kl.shape[3])
    Dv = vl.shape[3]
    if scale is not None and not (math.isfinite(scale) and math.isfinite(float(torch.tensor(scale, dtype=torch.float32)))):
        _fail(where, "scale", "a finite float32 value (or None for 1/sqrt(head_dim))", scale)
    if key_padding_mask is not None:
        m = key_padding_mask
        if m.dtype not in (torch.bool, torch.uint8) or tuple(m.shape) != (batch, N):
            _fail(where, "key_padding_mask", f"a bool or uint8 tensor [{batch}, {N}]", f"{m.dtype} {list(m.shape)}")
        if m.device != q.device:
            _fail(where, "key_padding_mask", f"device {q.device} (q's)", m.device)
    # geometry: monarch_geometry (src/cpu/monarch.cpp)
    bsz = math.isqrt(N) if block_size == 0 else block_size
    B = max(1, min(bsz, N))
    M = (N + B - 1) // B
    P = M * B
    front = P - N if pad == "pre" else 0
    sc = float(torch.tensor(1.0 / math.sqrt(D) if scale is None else scale, dtype=torch.float32)) if D else 1.0
    lp = q.dtype != torch.float32 and compute != "fp32"
    return MonarchCall(batch, N, Hq, Hkv, D, Dv, B, M, P, front, num_steps, mode == "stable", sc, layout, q.dtype, lp)


def covers(call: MonarchCall) -> Optional[str]:
    """None when the Triton kernels cover the call, else the reason (the fallback's message)."""
    if call.D > MAX_HEAD_DIM or call.Dv > MAX_HEAD_DIM:
        return f"head_dim {call.D} / head_dim_v {call.Dv} above {MAX_HEAD_DIM} (the kernels' tiles)"
    return None


def state_floats(call: MonarchCall, backward: bool = False, save_state: bool = True) -> int:
    """The float32 values the launcher keeps in device memory beside inputs and outputs (the
    algorithm's state; never an N x N, B x B or M x M matrix). Per (batch, query head), P = M*B:
    forward al P*D, cl P, y P*Dv, the L-step's per-query log-normaliser P, abar (T-1)*P*D (the saved
    state) or P*D (one slab, inference, T > 1), w / blk per batch. Backward: the state (T-1)*P*D
    (recomputed when not given), al, y, dal, dy (2 P*D + 2 P*Dv), dabar and dq P*D each, nine
    per-row vectors of P (cl, lse, sum R, dcl, rowdot, ls, rr, gk, ek), dk / dv (P*D + P*Dv per
    kv head)."""
    c = call
    bh, bk = c.batch * c.Hq, c.batch * c.Hkv
    per_batch = c.P + c.M
    if not backward:
        abar = (c.T - 1) * c.P * c.D if save_state else (c.P * c.D if c.T > 1 else 0)
        return bh * (c.P * c.D + c.P * c.Dv + 2 * c.P + abar) + c.batch * per_batch
    return (bh * ((c.T - 1) * c.P * c.D + 2 * c.P * c.D + 2 * c.P * c.Dv + 2 * c.P * c.D + 9 * c.P)
            + bk * (c.P * c.D + c.P * c.Dv) + c.batch * per_batch)


def _tl_dtype(dtype: torch.dtype):
    import triton.language as tl

    return {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}[dtype]


# ---- launches ------------------------------------------------------------------------------------
@dataclass
class _Bufs:
    """The device-memory state of one call (float32, see _monarch_kernels.py for the layouts)."""

    w: torch.Tensor  # batch x P
    blk: torch.Tensor  # batch x M
    al: torch.Tensor  # BH x B x M x D
    cl: torch.Tensor  # BH x B x M
    y: torch.Tensor  # BH x B x M x Dv
    ls: torch.Tensor  # BH x B x M
    lse: Optional[torch.Tensor] = None  # backward: BH x B x M
    sumr: Optional[torch.Tensor] = None


def _weights(call: MonarchCall, key_padding_mask, device) -> Tuple[torch.Tensor, torch.Tensor]:
    """w (batch x P): 1 for a real unmasked token; blk (batch x M): 1 where a block has a valid key."""
    w = torch.zeros(call.batch, call.P, dtype=torch.float32, device=device)
    real = w.narrow(1, call.front, call.N)
    if key_padding_mask is None:
        real.fill_(1.0)
    else:
        real.copy_(key_padding_mask != 0)
    blk = w.view(call.batch, call.M, call.B).amax(dim=2).contiguous()
    return w, blk


def _bufs(call: MonarchCall, key_padding_mask, device, stats: bool) -> _Bufs:
    f32 = dict(dtype=torch.float32, device=device)
    bh = call.batch * call.Hq
    w, blk = _weights(call, key_padding_mask, device)
    rows = (bh, call.B, call.M)
    return _Bufs(
        w=w, blk=blk,
        al=torch.empty(*rows, call.D, **f32), cl=torch.empty(*rows, **f32),
        y=torch.empty(*rows, call.Dv, **f32), ls=torch.empty(*rows, **f32),
        lse=torch.empty(*rows, **f32) if stats else None, sumr=torch.empty(*rows, **f32) if stats else None,
    )


def _s4(x: torch.Tensor) -> Tuple[int, int, int, int]:
    return tuple(x.stride())


def _slab_strides(slab: Optional[torch.Tensor]) -> Tuple[int, int, int, int]:
    """(b, h, p, d) strides of an abar slab (batch x heads_q x P x D view of the state)."""
    return tuple(slab.stride()) if slab is not None else (0, 0, 0, 0)


def _rstep(K, call: MonarchCall, tiles: MonarchTiles, ql, kl, vl, bufs: _Bufs, slab, first: bool, last: bool,
           stats: bool) -> None:
    """R-step of one step: al, cl (y at the last step; lse and sum R with stats) from abar rows."""
    grid = (call.M * triton_cdiv(call.B, tiles.rc), call.batch * call.Hq)
    dummy = bufs.cl
    K.rstep_fwd_kernel[grid](
        ql, kl, vl, bufs.w, slab if slab is not None else ql,
        bufs.al, bufs.cl, bufs.y, bufs.lse if stats else dummy, bufs.sumr if stats else dummy,
        *_s4(ql), *_s4(kl), *_s4(vl), *_slab_strides(slab), bufs.w.stride(0),
        call.N, call.Hq, call.G, call.B, call.M, call.front, call.D, call.Dv, call.scale,
        FIRST=first, LAST=last, STATS=stats, STABLE=call.stable, LP=call.lp, DT=_tl_dtype(call.dtype),
        RC=tiles.rc, KC=tiles.kc, DP=tiles.dp, DVP=tiles.dvp, num_warps=tiles.warps,
    )


def _lstep(K, call: MonarchCall, tiles: MonarchTiles, ql, bufs: _Bufs, out_l, slab_out, last: bool) -> None:
    """L-step of one step: the output rows (last) or the next step's abar slab."""
    grid = (call.B * (triton_cdiv(call.M, tiles.lc) if last else 1), call.batch * call.Hq)
    o = out_l if last else ql
    a = slab_out if not last else bufs.al
    K.lstep_fwd_kernel[grid](
        ql, bufs.w, bufs.blk, bufs.al, bufs.cl, bufs.y, o, a, bufs.ls,
        *_s4(ql), *_s4(o), *(_slab_strides(slab_out) if not last else (0, 0, 0, 0)), bufs.w.stride(0),
        bufs.blk.stride(0), call.N, call.Hq, call.B, call.M, call.front, call.D, call.Dv,
        LAST=last, STABLE=call.stable, LP=call.lp, DT=_tl_dtype(call.dtype),
        LC=tiles.lc, LK=tiles.lk, ONE=tiles.one, DP=tiles.dp, DVP=tiles.dvp, num_warps=tiles.warps,
    )


def triton_cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


def _run_steps(K, call, tiles, ql, kl, vl, bufs, state, steps: int, out_l=None, scratch_slab=None) -> None:
    """Steps 1..steps of the forward. state (batch x Hq x (T-1) x P x D) receives abar of steps
    2..steps+1 (slab s = step s+2); or, state None, one scratch slab is reused. out_l: the output
    (logical view) when the last of these steps is step T."""
    for t in range(1, steps + 1):
        last = t == call.T
        slab_in = None if t == 1 else (state[:, :, t - 2] if state is not None else scratch_slab)
        _rstep(K, call, tiles, ql, kl, vl, bufs, slab_in, first=t == 1, last=last, stats=False)
        slab_out = None if last else (state[:, :, t - 1] if state is not None else scratch_slab)
        _lstep(K, call, tiles, ql, bufs, out_l, slab_out, last)


def _empty_in_order_of(like: torch.Tensor, sizes, dtype) -> torch.Tensor:
    from strata._fake import _empty_in_order_of as f  # the CPU op's output memory order (one rule)

    return f(like, sizes, dtype)


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_steps: int = 1, block_size: int = 0,
            pad: str = "post", mode: str = "stable", scale: Optional[float] = None,
            key_padding_mask: Optional[torch.Tensor] = None, layout: str = "bshd", compute: str = "auto",
            save_state: bool = True, *, tiles: Optional[Dict[str, int]] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """torch.ops.strata.monarch_attention_forward on the Triton kernels (same arguments).

    Returns (out, state): out batch x seq x heads_q x head_dim_v in q's layout and memory order,
    dtype of q; state batch x heads_q x (T-1) x (M*B) x head_dim float32 (a 0-element float32
    tensor when not save_state). ``tiles``: tile overrides (tests; see choose_tiles)."""
    where = "monarch_attention_forward"
    call = make_call(where, q, k, v, num_steps, block_size, pad, mode, scale, key_padding_mask, layout, compute)
    reason = covers(call)
    if reason:
        raise RuntimeError(f"{where}: the Triton kernel does not cover this call: {reason}")
    sizes = [call.batch, call.N, call.Hq, call.Dv] if layout == "bshd" else [call.batch, call.Hq, call.N, call.Dv]
    out = _empty_in_order_of(q, sizes, q.dtype)
    f32 = dict(dtype=torch.float32, device=q.device)
    state = (torch.empty(call.batch, call.Hq, call.T - 1, call.P, call.D, **f32) if save_state
             else torch.empty(0, **f32))
    if call.batch * call.Hq * call.N == 0 or call.Dv == 0:
        out.zero_()
        if save_state:
            state.zero_()
        return out, state
    K = kernels(q.device)
    t = choose_tiles(call.B, call.M, call.D, call.Dv, tiles)
    ql, kl, vl = _logical(q, layout), _logical(k, layout), _logical(v, layout)
    bufs = _bufs(call, key_padding_mask, q.device, stats=False)
    scratch = None
    if not save_state and call.T > 1:
        scratch = torch.empty(call.batch, call.Hq, call.P, call.D, **f32)
    _run_steps(K, call, t, ql, kl, vl, bufs, state if save_state else None, call.T, _logical(out, layout), scratch)
    return out, state


def backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state: Optional[torch.Tensor], dout: torch.Tensor,
             num_steps: int = 1, block_size: int = 0, pad: str = "post", mode: str = "stable",
             scale: Optional[float] = None, key_padding_mask: Optional[torch.Tensor] = None, layout: str = "bshd",
             compute: str = "auto", *, tiles: Optional[Dict[str, int]] = None
             ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """torch.ops.strata.monarch_attention_backward on the Triton kernels (same arguments): the
    exact gradients through all T steps, every step's R and L recomputed from the saved state
    (state None, or empty with T > 1: recomputed by T-1 forward steps first).

    Returns (dq, dk, dv) with the shapes, dtype and memory order of q, k, v."""
    where = "monarch_attention_backward"
    call = make_call(where, q, k, v, num_steps, block_size, pad, mode, scale, key_padding_mask, layout, compute)
    reason = covers(call)
    if reason:
        raise RuntimeError(f"{where}: the Triton kernel does not cover this call: {reason}")
    want_out = [call.batch, call.N, call.Hq, call.Dv] if layout == "bshd" else [call.batch, call.Hq, call.N, call.Dv]
    if list(dout.shape) != want_out or dout.dtype != q.dtype or dout.device != q.device:
        _fail(where, "dout", f"a {q.dtype} tensor {want_out} on {q.device} (shape of out)",
              f"{dout.dtype} {list(dout.shape)} on {dout.device}")
    want_state = [call.batch, call.Hq, call.T - 1, call.P, call.D]
    if state is not None and state.numel() == 0 and call.T > 1:
        state = None
    if state is not None and call.T > 1:
        if list(state.shape) != want_state or state.dtype != torch.float32 or state.device != q.device:
            _fail(where, "state", f"float32 {want_state} on {q.device} (batch, heads_q, num_steps - 1, padded "
                  "seq M*B, head_dim)", f"{state.dtype} {list(state.shape)} on {state.device}")
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    if call.batch * call.Hq * call.N == 0 or call.Dv == 0:
        return dq.zero_(), dk.zero_(), dv.zero_()
    K = kernels(q.device)
    t = choose_tiles(call.B, call.M, call.D, call.Dv, tiles)
    ql, kl, vl, gl = (_logical(x, layout) for x in (q, k, v, dout))
    f32 = dict(dtype=torch.float32, device=q.device)
    bufs = _bufs(call, key_padding_mask, q.device, stats=True)
    if call.T > 1 and state is None:
        state = torch.empty(*want_state, **f32)
        _run_steps(K, call, t, ql, kl, vl, bufs, state, call.T - 1)
    bh, bk, P = call.batch * call.Hq, call.batch * call.Hkv, call.P
    rows = (bh, call.B, call.M)
    dal = torch.empty(*rows, call.D, **f32)
    dy = torch.empty(*rows, call.Dv, **f32)
    dcl, rowdot, rr, gk, ek = (torch.empty(*rows, **f32) for _ in range(5))
    dabar = torch.empty(bh, P, call.D, **f32)
    dq_acc = torch.zeros(bh, P, call.D, **f32)
    dk_acc = torch.zeros(bk, P, call.D, **f32)
    dv_acc = torch.zeros(bk, P, call.Dv, **f32)
    DT = _tl_dtype(call.dtype)
    common = dict(STABLE=call.stable, LP=call.lp, DT=DT, DP=t.dp, DVP=t.dvp, num_warps=t.warps)
    for step in range(call.T, 0, -1):
        first, last = step == 1, step == call.T
        slab = None if first else state[:, :, step - 2]
        _rstep(K, call, t, ql, kl, vl, bufs, slab, first=first, last=last, stats=True)
        anext = None if last else state[:, :, step - 1]
        K.lstep_bwd_kernel[(call.B, bh)](
            ql, bufs.w, bufs.blk, bufs.al, bufs.cl, bufs.y, bufs.sumr,
            gl, dabar, anext if anext is not None else dabar, dq_acc,
            dal, dcl, dy, rowdot, bufs.ls, rr, gk, ek,
            *_s4(ql), *_s4(gl), *_slab_strides(anext), bufs.w.stride(0), bufs.blk.stride(0),
            call.N, call.Hq, call.B, call.M, call.front, call.D, call.Dv, P,
            LAST=last, LC=t.lc, LK=t.lk, ONE=t.one, **common,
        )
        a = slab if slab is not None else ql
        rgrid = call.M * triton_cdiv(call.B, t.rc)
        K.rstep_bwd_q_kernel[(rgrid, bh)](
            ql, kl, vl, bufs.w, a, dal, dcl, dy, rowdot, bufs.lse, dabar, dq_acc,
            *_s4(ql), *_s4(kl), *_s4(vl), *_slab_strides(slab), bufs.w.stride(0),
            call.N, call.Hq, call.G, call.B, call.M, call.front, call.D, call.Dv, P, call.scale,
            FIRST=first, LAST=last, RC=t.rc, KC=t.kc, **common,
        )
        kgrid = call.M * triton_cdiv(call.B, t.kc)
        K.rstep_bwd_kv_kernel[(kgrid, bk)](
            ql, kl, vl, bufs.w, a, dal, dcl, dy, rowdot, bufs.lse, dk_acc, dv_acc,
            *_s4(ql), *_s4(kl), *_s4(vl), *_slab_strides(slab), bufs.w.stride(0),
            call.N, call.Hq, call.Hkv, call.G, call.B, call.M, call.front, call.D, call.Dv, P, call.scale,
            FIRST=first, LAST=last, RC=t.rc, KC=t.kc, **common,
        )
    # padded fp32 accumulators -> the gradients (b, n, h, d) in the inputs' dtype, layout, strides
    for acc, grad, heads in ((dq_acc, dq, call.Hq), (dk_acc, dk, call.Hkv), (dv_acc, dv, call.Hkv)):
        src = acc.view(call.batch, heads, P, -1).narrow(2, call.front, call.N).transpose(1, 2)
        _logical(grad, layout).copy_(src)
    return dq, dk, dv


# ---- the compile check's configuration space ----------------------------------------------------
@dataclass(frozen=True)
class KernelConfig:
    """One compiled variant: a kernel, its constexprs and num_warps (see launcher_configs)."""

    kernel: str
    constexprs: Tuple[Tuple[str, object], ...]
    num_warps: int


def _head_dims() -> List[int]:
    return [16, 32, 64, 128, 256]


def launcher_configs(full: bool = False) -> Iterator[KernelConfig]:
    """Every constexpr combination the launchers can choose (full=True), or a covering subset
    (default: each kernel x each flag combination x each dtype at the largest tiles of each head
    dim, plus every tile size at head dim 64). Tiles follow choose_tiles over B, M in 1..2^16 and
    head dims up to MAX_HEAD_DIM (padded: 16..256)."""
    import triton.language as tl

    dtypes = [("fp32", tl.float32, False), ("fp16", tl.float16, True), ("bf16", tl.bfloat16, True),
              ("bf16_fp32", tl.bfloat16, False)]
    seen = set()
    out = []

    def add(kernel, warps, **cx):
        key = (kernel, tuple(sorted((k, str(v)) for k, v in cx.items())), warps)
        if key not in seen:
            seen.add(key)
            out.append(KernelConfig(kernel, tuple(sorted(cx.items(), key=lambda kv: kv[0])), warps))

    # the tile sets choose_tiles can return: per padded head dims, chunk sizes 16 .. cap
    tile_sets = []
    for dp in _head_dims():
        for dvp in _head_dims():
            base = choose_tiles(1 << 16, 1 << 16, dp, dvp)
            cap = base.rc
            sizes = [s for s in (16, 32, 64) if s <= cap]
            tile_sets.append((dp, dvp, sizes, base.warps))
    for dp, dvp, sizes, warps in tile_sets:
        for name, DT, LP in dtypes:
            if not full and name == "bf16_fp32" and dp != 64:
                continue
            for r in sizes if full or (dp == 64 and dvp == 64) else sizes[-1:]:
                for stable in (True, False) if full or r == sizes[-1] else (True,):
                    for first in (True, False):
                        for last in (True, False):
                            for stats in (True, False):
                                add("rstep_fwd_kernel", warps, FIRST=first, LAST=last, STATS=stats, STABLE=stable,
                                    LP=LP, DT=DT, RC=r, KC=r, DP=dp, DVP=dvp)
                            add("rstep_bwd_q_kernel", warps, FIRST=first, LAST=last, STABLE=stable, LP=LP, DT=DT,
                                RC=r, KC=r, DP=dp, DVP=dvp)
                            add("rstep_bwd_kv_kernel", warps, FIRST=first, LAST=last, STABLE=stable, LP=LP, DT=DT,
                                RC=r, KC=r, DP=dp, DVP=dvp)
                    for last in (True, False):
                        for one in ((False,) if last else (True, False)):
                            add("lstep_fwd_kernel", warps, LAST=last, STABLE=stable, LP=LP, DT=DT, LC=r, LK=r,
                                ONE=one, DP=dp, DVP=dvp)
                        for one in (True, False):
                            add("lstep_bwd_kernel", warps, LAST=last, STABLE=stable, LP=LP, DT=DT, LC=r, LK=r, ONE=one,
                                DP=dp, DVP=dvp)
    return iter(out)


def signature(kernel_name: str, dtype) -> Dict[str, str]:
    """The runtime-argument signature of a kernel for triton.compile (pointers to the input dtype
    for q, k, v, o, dout; float32 for the state; i32 for sizes and strides; fp32 scale)."""
    import triton.language as tl

    fn = getattr(_load_compiled_for_signature(), kernel_name)
    names = [p.name for p in fn.params if not p.is_constexpr]
    inp = {tl.float32: "*fp32", tl.float16: "*fp16", tl.bfloat16: "*bf16"}[dtype]
    typed = {"q": inp, "k": inp, "v": inp, "o": inp, "g": inp}
    sig = {}
    for n in names:
        if n in typed:
            sig[n] = typed[n]
        elif n in ("w", "abar", "al", "cl", "y", "lse", "sumr", "ls", "dabar", "anext", "dq", "dal", "dcl", "dy",
                   "rowdot", "rr", "gk", "ek", "dk", "dv", "blk"):
            sig[n] = "*fp32"
        elif n == "sc":
            sig[n] = "fp32"
        else:
            sig[n] = "i32"
    return sig


def _load_compiled_for_signature():
    global _compiled
    if _compiled is None:
        _compiled = _load_kernels(False)
    return _compiled
