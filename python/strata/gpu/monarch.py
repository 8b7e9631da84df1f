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
algorithm's O(N D) state, counted by :func:`state_bytes`.

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
    "state_bytes",
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
       interpreted. Every patch lives in the launch's patch scope (restored after each launch)."""
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
    # 4. Triton's device call patches triton.language for the callee's module and never restores it:
    # after one interpreted call of a tl.standard helper, tl.core kept the interpreter's builtins and
    # every later triton.compile in the process failed ("assert (0)" at tl.cdiv). The nested scopes
    # are restored with the launch's, last first.
    patched_globals = set()
    nested_scopes = []

    def patched_lang(fn):
        patched_globals.clear()  # a launch starts (nested calls do not come here: see device_call)
        patched_globals.add(id(fn.__globals__))
        scope = original_lang(fn)
        scope.set_attr(JITFunction, "__call__", call_interpreted)
        restore_launch = scope.restore

        def restore():
            while nested_scopes:
                nested_scopes.pop().restore()
            restore_launch()

        scope.restore = restore
        return scope

    def device_call(self, *args, **kwargs):
        if id(self.fn.__globals__) not in patched_globals:
            patched_globals.add(id(self.fn.__globals__))
            nested_scopes.append(original_lang(self.fn))  # restored when the launch ends
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
class KernelTiles:
    """One kernel's constexpr tiles: a, b = (rows, keys) of an R-step kernel's B x B tile or
    (queries, blocks) of an L-step kernel's M x M tile, powers of two >= 16 (tl.dot's minimum);
    one: an L-step kernel's whole M x M problem in one tile (M <= a = b); warps: num_warps."""

    a: int
    b: int
    warps: int
    one: bool = False


@dataclass(frozen=True)
class MonarchTiles:
    """The tiles of every launch of one call, and the padded head dims (powers of two >= 16).
    rf: R-step (forward and the backward's recompute), rq / rkv: the R-step adjoints for dabar and
    for dk / dv, lf / lb: the L-step and its adjoint."""

    rf: KernelTiles
    rq: KernelTiles
    rkv: KernelTiles
    lf: KernelTiles
    lb: KernelTiles
    dp: int
    dvp: int


# The largest tile of each kernel (and its num_warps) by product type and padded head dim, chosen
# from an sm_90 compile sweep here (triton.compile + cuobjdump -res-usage, tiles 16/32/64 x 4/8
# warps, each kernel's heaviest flags): the largest tile whose stack frame (spills) is 0 or small
# (<= 128 bytes; rkv at 128 / 256 and lb at 256: 64-664 bytes, the smallest tile there), registers
# <= 255, shared memory under sm_80's 163 KB. 16-bit products (lp) and fp32 "ieee" products (FMA
# dots, far more registers: 64 x 64 tiles spilled 10 KB a thread). Unmeasured on a GPU: the
# table is the first thing to tune there (strata.gpu.monarch.compile_report prints these numbers).
#   key: (lp, max padded head dim) -> {kernel: (tile, warps)}; "lb1": the L adjoint in one tile
_TILE_TABLE = {
    (True, 64): dict(rf=(64, 4), rq=(64, 8), rkv=(32, 8), lf=(64, 4), lb1=(64, 8), lb=(32, 8)),
    (True, 128): dict(rf=(32, 8), rq=(32, 8), rkv=(16, 8), lf=(32, 8), lb1=(32, 8), lb=(16, 8)),
    (True, 256): dict(rf=(16, 8), rq=(16, 8), rkv=(16, 8), lf=(16, 8), lb1=(16, 8), lb=(16, 8)),
    (False, 64): dict(rf=(32, 4), rq=(16, 8), rkv=(16, 8), lf=(32, 8), lb1=(32, 8), lb=(16, 8)),
    (False, 128): dict(rf=(16, 8), rq=(16, 8), rkv=(16, 8), lf=(32, 8), lb1=(16, 8), lb=(16, 8)),
    (False, 256): dict(rf=(16, 8), rq=(16, 8), rkv=(16, 8), lf=(16, 8), lb1=(16, 8), lb=(16, 8)),
}


def _dim_class(dp: int, dvp: int) -> int:
    return max(64, dp, dvp)


def choose_tiles(B: int, M: int, D: int, Dv: int, lp: bool, override: Optional[Dict[str, int]] = None
                 ) -> MonarchTiles:
    """The launcher's tiles for a call: the table's, clipped to the problem (a block of B keys needs
    no tile wider than B rounded up to a power of two). ``override`` (tests) sets rc, kc (every
    R-step kernel's rows, keys) or lc, lk (every L-step kernel's queries, blocks) to force several
    chunks on small shapes."""
    dp, dvp = max(16, _np2(D)), max(16, _np2(Dv))
    tab = _TILE_TABLE[(lp, _dim_class(dp, dvp))]
    rb, mb = max(16, _np2(B)), max(16, _np2(M))
    ov = dict(override or {})
    for key, val in ov.items():
        if key not in ("rc", "kc", "lc", "lk") or val < 16 or val & (val - 1):
            raise ValueError(f"strata.gpu.monarch: tile {key}={val}: expected rc/kc/lc/lk, a power of 2 >= 16")

    def r(name):
        t, w = tab[name]
        return KernelTiles(ov.get("rc", min(t, rb)), ov.get("kc", min(t, rb)), w)

    def l(name, one_name=None):
        t, w = tab[name]
        if one_name is not None:  # the adjoint: one tile where M fits the one-tile kernel's size
            t1, w1 = tab[one_name]
            if mb <= t1 and not ov:
                return KernelTiles(mb, mb, w1, True)
        a, b = ov.get("lc", min(t, mb)), ov.get("lk", min(t, mb))
        return KernelTiles(a, b, w, M <= a and M <= b)

    return MonarchTiles(r("rf"), r("rq"), r("rkv"), l("lf"), l("lb", "lb1"), dp, dvp)


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


def state_bytes(call: MonarchCall, backward: bool = False, save_state: bool = True) -> int:
    """Bytes of device memory the launcher holds beside inputs and outputs: the algorithm's state,
    never an N x N, B x B or M x M matrix. Per (batch, query head), P = M*B padded positions,
    fp32 unless said:
      forward   al P*D, cl P, the L-step's per-query log-normaliser P, y P*Dv (in the input dtype
                with 16-bit products), abar (T-1)*P*D (the saved state) or P*D (one reused slab:
                inference, T > 1); per batch w (P) and blk (M).
      backward  the state (T-1)*P*D (recomputed when not given), al, dal, dabar, dq P*D each, y, dy
                P*Dv each, nine per-row vectors of P (cl, lse, sum R, dcl, rowdot, ls, rr, gk, ek);
                per kv head dk P*D and dv P*Dv; w, blk.
    In units of q's bytes (N = 4096, 12 heads, d = 64, bf16): forward 3.1 (T = 1), 5.1 (T = 2);
    backward 17.3 (T = 2) (tests/python/gpu: test_state_bytes_are_o_of_n_d)."""
    c = call
    bh, bk = c.batch * c.Hq, c.batch * c.Hkv
    ysz = 2 if c.lp else 4
    per_batch = 4 * (c.P + c.M)
    if not backward:
        abar = (c.T - 1) * c.P * c.D if save_state else (c.P * c.D if c.T > 1 else 0)
        return bh * (4 * (c.P * c.D + 2 * c.P + abar) + ysz * c.P * c.Dv) + c.batch * per_batch
    return (bh * (4 * ((c.T - 1) * c.P * c.D + 4 * c.P * c.D + c.P * c.Dv + 9 * c.P) + ysz * c.P * c.Dv)
            + bk * 4 * (c.P * c.D + c.P * c.Dv) + c.batch * per_batch)


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
    y: torch.Tensor  # BH x B x M x Dv (the input dtype with 16-bit products, else float32)
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
        # y feeds only products that round it to the input dtype (O = L y, dL = G y^T: as the CPU
        # kernel's bf16 path reads y): with 16-bit products it is stored so (a quarter of the
        # forward's bytes less)
        y=torch.empty(*rows, call.Dv, dtype=call.dtype if call.lp else torch.float32, device=device),
        ls=torch.empty(*rows, **f32),
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
    rf = tiles.rf
    grid = (call.M * triton_cdiv(call.B, rf.a), call.batch * call.Hq)
    dummy = bufs.cl
    K.rstep_fwd_kernel[grid](
        ql, kl, vl, bufs.w, slab if slab is not None else ql,
        bufs.al, bufs.cl, bufs.y, bufs.lse if stats else dummy, bufs.sumr if stats else dummy,
        *_s4(ql), *_s4(kl), *_s4(vl), *_slab_strides(slab), bufs.w.stride(0),
        call.N, call.Hq, call.G, call.B, call.M, call.front, call.D, call.Dv, call.scale,
        FIRST=first, LAST=last, STATS=stats, STABLE=call.stable, LP=call.lp, DT=_tl_dtype(call.dtype),
        RC=rf.a, KC=rf.b, DP=tiles.dp, DVP=tiles.dvp, num_warps=rf.warps,
    )


def _lstep(K, call: MonarchCall, tiles: MonarchTiles, ql, bufs: _Bufs, out_l, slab_out, last: bool) -> None:
    """L-step of one step: the output rows (last) or the next step's abar slab."""
    lf = tiles.lf
    grid = (call.B * (triton_cdiv(call.M, lf.a) if last else 1), call.batch * call.Hq)
    o = out_l if last else ql
    a = slab_out if not last else bufs.al
    K.lstep_fwd_kernel[grid](
        ql, bufs.w, bufs.blk, bufs.al, bufs.cl, bufs.y, o, a, bufs.ls,
        *_s4(ql), *_s4(o), *(_slab_strides(slab_out) if not last else (0, 0, 0, 0)), bufs.w.stride(0),
        bufs.blk.stride(0), call.N, call.Hq, call.B, call.M, call.front, call.D, call.Dv,
        LAST=last, STABLE=call.stable, LP=call.lp, DT=_tl_dtype(call.dtype),
        LC=lf.a, LK=lf.b, ONE=lf.one, DP=tiles.dp, DVP=tiles.dvp, num_warps=lf.warps,
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
    t = choose_tiles(call.B, call.M, call.D, call.Dv, call.lp, tiles)
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
    t = choose_tiles(call.B, call.M, call.D, call.Dv, call.lp, tiles)
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
    common = dict(STABLE=call.stable, LP=call.lp, DT=DT, DP=t.dp, DVP=t.dvp)
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
            LAST=last, LC=t.lb.a, LK=t.lb.b, ONE=t.lb.one, num_warps=t.lb.warps, **common,
        )
        a = slab if slab is not None else ql
        rgrid = call.M * triton_cdiv(call.B, t.rq.a)
        K.rstep_bwd_q_kernel[(rgrid, bh)](
            ql, kl, vl, bufs.w, a, dal, dcl, dy, rowdot, bufs.lse, dabar, dq_acc,
            *_s4(ql), *_s4(kl), *_s4(vl), *_slab_strides(slab), bufs.w.stride(0),
            call.N, call.Hq, call.G, call.B, call.M, call.front, call.D, call.Dv, P, call.scale,
            FIRST=first, LAST=last, RC=t.rq.a, KC=t.rq.b, num_warps=t.rq.warps, **common,
        )
        kgrid = call.M * triton_cdiv(call.B, t.rkv.b)
        K.rstep_bwd_kv_kernel[(kgrid, bk)](
            ql, kl, vl, bufs.w, a, dal, dcl, dy, rowdot, bufs.lse, dk_acc, dv_acc,
            *_s4(ql), *_s4(kl), *_s4(vl), *_slab_strides(slab), bufs.w.stride(0),
            call.N, call.Hq, call.Hkv, call.G, call.B, call.M, call.front, call.D, call.Dv, P, call.scale,
            FIRST=first, LAST=last, RC=t.rkv.a, KC=t.rkv.b, num_warps=t.rkv.warps, **common,
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


_PADDED_DIMS = (16, 32, 64, 128, 256)


def _flag_sets(kernel: str):
    """Every combination of a kernel's flags (besides STABLE, LP, DT and the tiles)."""
    tf = (True, False)
    if kernel == "rstep_fwd_kernel":
        return [dict(FIRST=f, LAST=l, STATS=s) for f in tf for l in tf for s in tf]
    if kernel in ("rstep_bwd_q_kernel", "rstep_bwd_kv_kernel"):
        return [dict(FIRST=f, LAST=l) for f in tf for l in tf]
    if kernel == "lstep_fwd_kernel":
        return [dict(LAST=True, ONE=False), dict(LAST=False, ONE=True), dict(LAST=False, ONE=False)]
    return [dict(LAST=l, ONE=o) for l in tf for o in tf]  # lstep_bwd_kernel


_KERNELS = ("rstep_fwd_kernel", "rstep_bwd_q_kernel", "rstep_bwd_kv_kernel", "lstep_fwd_kernel", "lstep_bwd_kernel")
_TABLE_KEY = {"rstep_fwd_kernel": "rf", "rstep_bwd_q_kernel": "rq", "rstep_bwd_kv_kernel": "rkv",
              "lstep_fwd_kernel": "lf", "lstep_bwd_kernel": "lb"}


def _tiles_of(kernel: str, lp: bool, dp: int, dvp: int, flags: dict):
    """The (tile, warps) pairs the launcher can give a kernel: every power of two from 16 to the
    table's tile (smaller problems clip it)."""
    tab = _TILE_TABLE[(lp, _dim_class(dp, dvp))]
    name = "lb1" if kernel == "lstep_bwd_kernel" and flags.get("ONE") else _TABLE_KEY[kernel]
    top, warps = tab[name]
    return [(t, warps) for t in (16, 32, 64) if t <= top]


def _config(kernel: str, lp: bool, DT, dp: int, dvp: int, stable: bool, flags: dict, tile: int, warps: int
            ) -> KernelConfig:
    t = dict(RC=tile, KC=tile) if kernel.startswith("rstep") else dict(LC=tile, LK=tile)
    cx = dict(flags, STABLE=stable, LP=lp, DT=DT, DP=dp, DVP=dvp, **t)
    return KernelConfig(kernel, tuple(sorted(cx.items(), key=lambda kv: kv[0])), warps)


def launcher_configs(full: bool = False) -> List[KernelConfig]:
    """The kernel variants the launchers can compile (choose_tiles, _TILE_TABLE).

    full=True: every one (5 dtype / product variants x padded head dims 16..256 for D and Dv x
    both modes x every flag combination x every tile up to the table's: thousands, hours to
    compile). Default, a covering subset (~80): (a) resources, which grow with the tile and the
    head dims: each kernel's heaviest flags at the table's largest tiles for head dims 64, 128 and
    256 (D = Dv), with 16-bit and with fp32 products; (b) structure: every flag combination of
    every kernel in reference mode with D != Dv (32 / 16) at 16-wide tiles, and the other dtype /
    product variants (fp16, bf16 and fp16 with fp32 products) at head dim 64."""
    import triton.language as tl

    variants = [("fp32", tl.float32, False), ("bf16", tl.bfloat16, True), ("fp16", tl.float16, True),
                ("bf16_fp32", tl.bfloat16, False), ("fp16_fp32", tl.float16, False)]
    out: List[KernelConfig] = []
    seen = set()

    def add(cfg: KernelConfig) -> None:
        key = (cfg.kernel, tuple((k, str(v)) for k, v in cfg.constexprs), cfg.num_warps)
        if key not in seen:
            seen.add(key)
            out.append(cfg)

    if full:
        for name, DT, lp in variants:
            for dp in _PADDED_DIMS:
                for dvp in _PADDED_DIMS:
                    for kernel in _KERNELS:
                        for flags in _flag_sets(kernel):
                            for tile, warps in _tiles_of(kernel, lp, dp, dvp, flags):
                                for stable in (True, False):
                                    add(_config(kernel, lp, DT, dp, dvp, stable, flags, tile, warps))
        return out
    heaviest = {
        "rstep_fwd_kernel": [dict(FIRST=False, LAST=True, STATS=True)],
        "rstep_bwd_q_kernel": [dict(FIRST=False, LAST=True)],
        "rstep_bwd_kv_kernel": [dict(FIRST=False, LAST=True)],
        "lstep_fwd_kernel": [dict(LAST=True, ONE=False), dict(LAST=False, ONE=True)],
        "lstep_bwd_kernel": [dict(LAST=True, ONE=True), dict(LAST=False, ONE=True), dict(LAST=False, ONE=False)],
    }
    for name, DT, lp in variants[:2]:
        for d in (64, 128, 256):
            for kernel, fl in heaviest.items():
                for flags in fl:
                    tile, warps = _tiles_of(kernel, lp, d, d, flags)[-1]
                    add(_config(kernel, lp, DT, d, d, True, flags, tile, warps))
    for kernel in _KERNELS:
        for flags in _flag_sets(kernel):
            warps = _tiles_of(kernel, True, 32, 16, flags)[0][1]
            add(_config(kernel, True, tl.bfloat16, 32, 16, False, flags, 16, warps))
    for name, DT, lp in variants[2:]:
        for kernel in ("rstep_fwd_kernel", "lstep_bwd_kernel"):
            flags = heaviest[kernel][0]
            tile, warps = _tiles_of(kernel, lp, 64, 64, flags)[-1]
            add(_config(kernel, lp, DT, 64, 64, True, flags, tile, warps))
    return out


def signature(kernel_name: str, dtype, lp: bool = False) -> Dict[str, str]:
    """The runtime-argument signature of a kernel for triton.compile (pointers to the input dtype
    for q, k, v, o, dout, and y with 16-bit products; float32 for the state and the other
    scratch; i32 for sizes and strides; fp32 scale)."""
    import triton.language as tl

    fn = getattr(compiled_kernels(), kernel_name)
    names = [p.name for p in fn.params if not p.is_constexpr]
    inp = {tl.float32: "*fp32", tl.float16: "*fp16", tl.bfloat16: "*bf16"}[dtype]
    typed = {"q": inp, "k": inp, "v": inp, "o": inp, "g": inp, "y": inp if lp else "*fp32"}
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


def compiled_kernels():
    """The compiled (not interpreted) kernel module, also where no GPU is (for triton.compile)."""
    global _compiled
    if _compiled is None:
        _compiled = _load_kernels(False)
    return _compiled


@dataclass(frozen=True)
class CompileResult:
    """One configuration compiled for one target: shared memory (bytes, Triton's metadata),
    registers and stack frame (bytes a thread: spills) from cuobjdump -res-usage (None if absent)."""

    config: KernelConfig
    arch: int
    shared: int
    registers: Optional[int]
    stack: Optional[int]


def compile_config(cfg: KernelConfig, arch: int) -> CompileResult:
    """triton.compile of one configuration for GPUTarget("cuda", arch, 32): no GPU needed. Raises
    the compiler's error."""
    import os
    import re
    import subprocess
    import tempfile

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    cx = dict(cfg.constexprs)
    fn = getattr(compiled_kernels(), cfg.kernel)
    k = triton.compile(ASTSource(fn, signature(cfg.kernel, cx["DT"], cx["LP"]), cx), target=GPUTarget("cuda", arch, 32),
                       options={"num_warps": cfg.num_warps})
    regs = stack = None
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if os.path.exists(tool):
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(k.asm["cubin"])
            f.flush()
            text = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True).stdout
        m = re.search(r"REG:(\d+) STACK:(\d+)", text)
        if m:
            regs, stack = int(m.group(1)), int(m.group(2))
    return CompileResult(cfg, arch, int(k.metadata.shared), regs, stack)


def compile_report(full: bool = False, archs=(80, 90)) -> None:
    """Prints every configuration's resources (python -c 'from strata.gpu import monarch as m;
    m.compile_report()')."""
    for cfg in launcher_configs(full):
        for arch in archs:
            r = compile_config(cfg, arch)
            cx = dict(cfg.constexprs)
            flags = " ".join(f"{k}={int(v)}" for k, v in cx.items() if isinstance(v, bool))
            print(f"sm_{arch} {cfg.kernel:20s} {str(cx['DT']):8s} DP={cx['DP']:3d} DVP={cx['DVP']:3d} "
                  f"tile={cx.get('RC', cx.get('LC'))} warps={cfg.num_warps} {flags}: shared {r.shared} "
                  f"regs {r.registers} stack {r.stack}", flush=True)
