"""MonarchAttention's Triton kernels (strata.gpu.monarch) against the float64 reference.

Run: STRATA_LIB=$PWD/build/release/torch/libstrata_torch.so PYTHONPATH=$PWD/python \
     python -m pytest -q tests/python/gpu

Where: with a CUDA device the kernels run compiled on it (float32, float16 and bfloat16); without
one the same launchers run on CPU tensors under Triton's interpreter (strata.gpu.monarch loads a
second, interpreted copy of the kernels for CPU tensors: no TRITON_INTERPRET in the environment,
so nothing leaks into other tests), float32 and float16 (the interpreter's bfloat16 dot is wrong:
../shared/design/gpu.md). The interpreter runs programs one by one in numpy, so the cases are a
covering subset of the option product (each option value appears, with the others varied), small
enough for the whole file to take about two minutes on 2 cores.

Truth: float64 inputs to strata.monarch_attention run the C++ double-precision reference
(src/cpu/reference/monarch_reference.cpp: the algorithm's loops, the N x N Monarch matrix
materialised) and its adjoint for the gradients; the same rounded inputs go to the kernels.
Error: ||got - ref|| / ||ref|| over the whole tensor (an all-zero reference: max |got| itself).
Tolerances (TOL below):
  float32: 1e-5. fp32 rounding is 6e-8 a value; each output sums O(T (B + M)) terms, measured
    worst 3.4e-7 over these cases (interpreter, products in fp32 "ieee"); 1e-5 leaves room for a
    GPU's other summation order while a semantic slip (a padding row, a mask, an eps) moves an
    error to 1e-3 or more.
  float16: outputs 2e-3, gradients 4e-3. Rounding the output to fp16 alone is 2^-11 = 4.9e-4 a value
    (rms ~2.8e-4); the gradient products round their fp32 operands to fp16 once (as FlashAttention
    rounds P and dS), the logit products split them (hi + lo); measured 4.6e-4 / 8.1e-4.
  bfloat16 (CUDA only): outputs 1e-2, gradients 2e-2: 2^-8 rounding, the CPU kernel's bf16 bounds
    (tests/python/test_monarch.py, attention's bf16 gradients).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Optional

import pytest
import torch

import strata
from strata.gpu import monarch as gm

CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if CUDA else "cpu")
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if CUDA else [])
TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 4e-3), torch.bfloat16: (1e-2, 2e-2)}  # (out, grads)


def rel(got: torch.Tensor, ref: torch.Tensor) -> float:
    got, ref = got.detach().double().cpu(), ref.detach().double().cpu()
    if torch.isnan(got).any():
        return float("inf")
    den = ref.norm().item()
    return (got - ref).norm().item() / den if den > 0 else got.abs().max().item() if got.numel() else 0.0


@dataclasses.dataclass
class Case:
    N: int
    B: int = 0
    T: int = 1
    mode: str = "stable"
    pad: str = "post"
    mask: Optional[str] = None  # None, "rand" (30% masked), "edge" (a whole block masked; batch 1 all masked)
    Hq: int = 2
    Hkv: int = 1
    D: int = 16
    Dv: int = 16
    layout: str = "bshd"
    strided: bool = False  # q, k, v as non-contiguous views of larger tensors
    batch: int = 1
    scale: Optional[float] = None
    tiles: Optional[dict] = None  # force chunk sizes (several chunks on small shapes)
    state: bool = True  # backward given the forward's state (False: recomputed)

    def id(self) -> str:
        return "-".join(f"{k}={v}" for k, v in dataclasses.asdict(self).items()
                        if v != Case.__dataclass_fields__[k].default)


# A covering subset: every N of {1, 7, 50, 97, 256}, B = 0 and given (B = 1, B > N, B not dividing
# N), T = 1..3, both modes, both pads, masks (random, a fully masked block, a fully masked
# sequence), GQA 2:1, 3:1, 4:2 and MHA, Dv != D, both layouts, strided views, a given scale,
# several chunks in the R-step (B > 16 with 16-wide tiles) and in the L-step (M > 16), the state
# given and recomputed. Each runs for every dtype of DTYPES.
CASES = [
    Case(N=1),
    Case(N=7, T=2, Hq=1, Hkv=1),
    Case(N=7, B=3, T=3, mode="reference", pad="pre", mask="rand", batch=2, state=False),
    Case(N=7, B=1, T=2, mask="rand", Hq=2, Hkv=2),
    Case(N=7, B=9, T=1, mode="reference", layout="bhsd"),
    Case(N=50, T=1, mask="edge", batch=2, Hq=4, Hkv=2, Dv=24, layout="bhsd", strided=True),
    Case(N=50, B=16, T=2, mode="reference", pad="pre", mask="edge", batch=2, scale=0.3),
    Case(N=50, B=6, T=3, pad="pre", Hq=3, Hkv=1, D=32, Dv=16, strided=True, state=False),
    Case(N=97, T=2, mask="rand", pad="pre", D=24, Dv=40),
    Case(N=97, B=4, T=2, mode="reference", mask="rand", tiles=dict(lc=16, lk=16)),
    Case(N=97, B=40, T=2, mask="edge", batch=2, pad="pre", tiles=dict(rc=16, kc=16), Hq=1, Hkv=1),
    Case(N=97, B=5, T=3, mask="rand", tiles=dict(lc=16, lk=16), Hq=1, state=False),
    Case(N=256, T=1, mask="rand"),
    Case(N=256, B=32, T=2, mode="reference", pad="pre", layout="bhsd"),
]
# The interpreter's float16 runs are a subset (they exercise the 16-bit product paths: hi / lo
# splits, single roundings), the rest of the options being dtype-independent code.
HALF_CASES = [0, 2, 5, 7, 9, 12]


def make_inputs(c: Case, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)

    def one(h, d):
        t = torch.randn(c.batch, c.N, h, d + (5 if c.strided else 0), generator=g, dtype=torch.float64)
        if c.strided:
            t = t[..., 2:2 + d]  # a view: last-dim offset, row stride d + 5
        return t

    q, k, v = one(c.Hq, c.D), one(c.Hkv, c.D), one(c.Hkv, c.Dv)
    if c.layout == "bhsd":
        q, k, v = (t.transpose(1, 2) if c.strided else t.transpose(1, 2).contiguous() for t in (q, k, v))
    q, k, v = (t.to(dtype) for t in (q, k, v))
    mask = None
    if c.mask == "rand":
        mask = torch.rand(c.batch, c.N, generator=g) > 0.3
    elif c.mask == "edge":
        mask = torch.rand(c.batch, c.N, generator=g) > 0.3
        B = c.B if c.B else max(1, int(c.N ** 0.5))
        mask[0, : min(B, c.N)] = False  # a block (or with pre padding, part of one) with no valid key
        if c.batch > 1:
            mask[1] = False  # no valid token at all
    return q, k, v, mask


def to_device(*ts):
    return [t.to(DEVICE) if t is not None else None for t in ts]


def options(c: Case, mask):
    return dict(num_steps=c.T, block_size=c.B, pad=c.pad, mode=c.mode, scale=c.scale, key_padding_mask=mask,
                layout=c.layout)


def reference(c: Case, q, k, v, mask, dout):
    """float64 out and gradients from the C++ reference (CPU)."""
    qd, kd, vd = (t.detach().double().cpu().requires_grad_() for t in (q, k, v))
    out = strata.monarch_attention(qd, kd, vd, **options(c, mask))
    dq, dk, dv = torch.autograd.grad(out, (qd, kd, vd), dout.double().cpu())
    return out.detach(), dq, dk, dv


def positional(c: Case, mask):
    return (c.T, c.B, c.pad, c.mode, c.scale, mask, c.layout, "auto")


def params():
    for dtype in DTYPES:
        for i, c in enumerate(CASES):
            if dtype == torch.float16 and not CUDA and i not in HALF_CASES:
                continue
            yield pytest.param(c, dtype, id=f"{str(dtype)[6:]}-{c.id()}")


@pytest.mark.parametrize("c,dtype", list(params()))
def test_forward_backward_against_float64(c: Case, dtype):
    q, k, v, mask = make_inputs(c, dtype)
    gen = torch.Generator().manual_seed(1)
    out_shape = [c.batch, c.N, c.Hq, c.Dv] if c.layout == "bshd" else [c.batch, c.Hq, c.N, c.Dv]
    dout = torch.randn(out_shape, generator=gen, dtype=torch.float64).to(dtype)
    ref_out, ref_dq, ref_dk, ref_dv = reference(c, q, k, v, mask, dout)
    qd, kd, vd, md, gd = to_device(q, k, v, mask, dout)
    out, state = gm.forward(qd, kd, vd, *positional(c, md), True, tiles=c.tiles)
    tol_out, tol_grad = TOL[dtype]
    assert out.dtype == dtype and list(out.shape) == out_shape
    assert state.shape == (c.batch, c.Hq, c.T - 1, out_state_len(c), c.D) and state.dtype == torch.float32
    assert rel(out, ref_out) <= tol_out, rel(out, ref_out)
    dq, dk, dv = gm.backward(qd, kd, vd, state if c.state else None, gd, *positional(c, md), tiles=c.tiles)
    for name, got, want, like in (("dq", dq, ref_dq, qd), ("dk", dk, ref_dk, kd), ("dv", dv, ref_dv, vd)):
        assert got.shape == like.shape and got.dtype == dtype, name
        assert rel(got, want) <= tol_grad, (name, rel(got, want))
    if c.mask == "edge" and c.batch > 1 and c.mode == "stable":  # no valid token: zeros, zero gradients
        assert out.select(0, 1).abs().max() == 0 and dq.select(0, 1).abs().max() == 0


def out_state_len(c: Case) -> int:
    B = max(1, min(c.B if c.B else int(c.N ** 0.5), c.N))
    return -(-c.N // B) * B


def test_state_is_the_cpu_kernels():
    """The saved state has the CPU kernel's format and values: the forward's state fed to the CPU
    backward op gives the CPU's gradients (and the CPU's state gives ours)."""
    c = Case(N=50, B=7, T=3, mode="reference", pad="pre", mask="rand", batch=2, Hq=2, Hkv=1)
    q, k, v, mask = make_inputs(c, torch.float32)
    dout = torch.randn(c.batch, c.N, c.Hq, c.Dv, dtype=torch.float32)
    opts = options(c, mask)
    cpu_out, cpu_state = strata.monarch_attention_forward(q, k, v, **opts)
    qd, kd, vd, md, gd = to_device(q, k, v, mask, dout)
    out, state = gm.forward(qd, kd, vd, *positional(c, md), True)
    assert rel(state, cpu_state) <= 1e-5 and rel(out, cpu_out) <= 1e-5
    cpu_grads = strata.monarch_attention_backward(q, k, v, cpu_state, dout, **opts)
    cross_cpu = strata.monarch_attention_backward(q, k, v, state.cpu(), dout, **opts)
    cross_ours = gm.backward(qd, kd, vd, cpu_state.to(DEVICE), gd, *positional(c, md))
    for a, b, o in zip(cpu_grads, cross_cpu, cross_ours):
        assert rel(b, a) <= 1e-5 and rel(o, a) <= 1e-5


def test_output_memory_order_and_no_state():
    c = Case(N=20, B=4, T=2, layout="bhsd", Hq=2, Hkv=2, Dv=8)
    q, k, v, _ = make_inputs(c, torch.float32)
    qd, kd, vd = to_device(q, k, v)
    out, state = gm.forward(qd, kd, vd, *positional(c, None), False)
    assert state.numel() == 0 and state.dtype == torch.float32
    assert out.shape == (1, 2, 20, 8) and out.is_contiguous()  # q's (bhsd, contiguous) order
    with_state, _ = gm.forward(qd, kd, vd, *positional(c, None), True)
    assert torch.equal(out, with_state)  # the scratch slab and the saved state compute the same


def test_interpreted_launch_leaves_triton_language_as_it_was():
    """An interpreted launch patches triton.language with the interpreter's builtins for its
    duration only: a patch left behind broke every later triton.compile in the process (the sm_80 /
    sm_90 check below, run after the interpreter cases). Meaningful only where the interpreter runs."""
    import triton.language as tl

    mods = (tl, tl.core, tl.math, tl.core.tensor, tl.standard)
    snap = lambda: {(m.__name__ if hasattr(m, "__name__") else str(m), n): id(getattr(m, n)) for m in mods
                    for n in dir(m) if not n.startswith("__")}
    before = snap()
    q, k, v = (torch.randn(1, 20, 2, 16, generator=torch.Generator().manual_seed(i)) for i in range(3))
    out, st = gm.forward(q, k, v, 2)
    gm.backward(q, k, v, st, torch.ones_like(out), 2)
    after = snap()
    changed = sorted(k for k in before if after.get(k) != before[k])  # (names it adds are harmless)
    assert not changed, changed[:10]


def test_empty_sequence():
    q = torch.randn(2, 0, 2, 8, device=DEVICE)
    out, state = gm.forward(q, q, q, 2)
    assert out.shape == (2, 0, 2, 8) and state.shape == (2, 2, 1, 0, 8)
    dq, dk, dv = gm.backward(q, q, q, state, out, 2)
    assert dq.shape == q.shape


@pytest.mark.parametrize("bad,arg", [
    (dict(mode="fast"), "mode"), (dict(pad="middle"), "pad"), (dict(layout="bsd"), "layout"),
    (dict(num_steps=0), "num_steps"), (dict(block_size=-1), "block_size"), (dict(heads_kv=3), "k"),
    (dict(scale=float("inf")), "scale"), (dict(mask_shape=(1, 5)), "key_padding_mask"),
])
def test_errors_name_the_argument(bad, arg):
    hkv = bad.pop("heads_kv", 2)
    mask_shape = bad.pop("mask_shape", None)
    q = torch.randn(1, 9, 4, 8, device=DEVICE)
    k = torch.randn(1, 9, hkv, 8, device=DEVICE)
    mask = torch.ones(mask_shape, dtype=torch.bool, device=DEVICE) if mask_shape else None
    kw = dict(num_steps=1, block_size=0, pad="post", mode="stable", scale=None, key_padding_mask=mask,
              layout="bshd", compute="auto")
    kw.update(bad)
    with pytest.raises(RuntimeError, match=f"argument '{arg}'"):
        gm.forward(q, k, k, **kw)


def test_state_bytes_are_o_of_n_d():
    """The device-memory state of N = 4096, 12 heads, d = 64, bf16, in units of q's bytes
    (N * 12 * 64 * 2): forward T = 1 3.1 (al fp32 2, y bf16 1, per-row vectors), T = 2 5.1 with
    the saved state or its one reused slab (fp32 abar 2 more); backward T = 2 17.3. Never an
    N x N matrix (12 * 4096 * 4096 fp32 would be 128 of these units)."""
    q = torch.empty(1, 4096, 12, 64, device="meta", dtype=torch.bfloat16)
    unit = q.numel() * 2

    def state(T, **kw):
        return gm.state_bytes(gm.make_call("t", q, q, q, T, 0, "post", "stable", None, None, "bshd", "auto"), **kw)

    got = [state(1) / unit, state(2, save_state=False) / unit, state(2) / unit, state(2, backward=True) / unit]
    assert [round(x, 1) for x in got] == [3.1, 5.1, 5.1, 17.3], got


def test_info_names_monarchs_gpu_path():
    paths = strata.info()["gpu"]
    assert set(paths) >= {"monarch", "attention", "mlr", "structured_linear"}
    assert paths["monarch"].startswith("triton" if CUDA and torch.cuda.get_device_capability()[0] >= 8
                                       else "torch-ops")


# ---- the registered path: strata.monarch_attention / MonarchAttention / torch.compile ----------
REGISTERED = textwrap.dedent("""
    import json, sys, torch, strata, strata.gpu as sg
    device = sys.argv[1]
    if device == "cpu":
        sg.register("cpu")  # the launchers (interpreted) as the CPU kernels, this process only
    torch.manual_seed(0)
    res = {}
    mask = torch.rand(2, 20, device=device) > 0.2
    q, k, v = (torch.randn(2, 20, 2, 16, device=device, requires_grad=True) for _ in range(3))
    kw = dict(num_steps=2, block_size=4, mode="reference", pad="pre", key_padding_mask=mask)
    out = strata.monarch_attention(q, k, v, **kw)
    res["grad_fn"] = type(out.grad_fn).__name__
    out.backward(torch.ones_like(out))
    g = [t.grad.clone() for t in (q, k, v)]
    res["fallbacks"] = sg.fallbacks()  # before the float64 reference (which falls back on purpose)
    ref = strata.monarch_attention(*(t.detach().cpu().double().requires_grad_() for t in (q, k, v)),
                                   **{**kw, "key_padding_mask": mask.cpu()})
    ref.backward(torch.ones_like(ref))
    res["err_out"] = ((out.detach().cpu().double() - ref.detach()).norm() / ref.norm()).item()
    for t in (q, k, v):
        t.grad = None
    f = torch.compile(lambda q, k, v: strata.monarch_attention(q, k, v, **kw), fullgraph=True, backend="aot_eager")
    o2 = f(q, k, v)
    o2.backward(torch.ones_like(o2))
    res["compile_out"] = (o2 - out).abs().max().item()
    res["compile_grad"] = max((t.grad - gg).abs().max().item() for t, gg in zip((q, k, v), g))
    with torch.inference_mode():
        o3 = strata.MonarchAttention(num_steps=2, block_size=4, mode="reference", pad="pre")(q, k, v, mask)
    res["module_out"] = (o3 - out).abs().max().item()
    res["fallbacks_after"] = sg.fallbacks()
    print(json.dumps(res))
""")


def test_registered_op_path(tmp_path):
    """strata.monarch_attention (eager, autograd, torch.compile fullgraph, the module in inference
    mode) reaches the Triton launchers through the dispatcher. On the CPU: in a child process that
    registers the launchers for the CPU keys (the interpreter), so the rest of the suite keeps the
    CPU kernels."""
    script = tmp_path / "registered.py"
    script.write_text(REGISTERED)
    env = dict(os.environ)
    r = subprocess.run([sys.executable, str(script), DEVICE.type], capture_output=True, text=True, timeout=600,
                       env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["grad_fn"] == "_MonarchFunctionBackward", res
    assert res["err_out"] < 1e-5 and res["compile_out"] == 0 and res["compile_grad"] == 0, res
    assert res["module_out"] == 0 and res["fallbacks"] == {}, res
    assert res["fallbacks_after"] == {"q dtype torch.float64": 1}, res  # the reference, and only it


# ---- every launcher configuration compiled for sm_80 and sm_90 ----------------------------------
SHARED_LIMIT = {80: 163 * 1024, 90: 227 * 1024}  # bytes a block may use (the targets' opt-in maximum)


def test_every_launcher_configuration_compiles_for_sm80_and_sm90():
    """triton.compile for GPUTarget("cuda", 80 / 90, 32), no GPU needed: fails on a compile error
    or on more shared memory than the target has. The configurations: gm.launcher_configs() (a
    covering subset; STRATA_COMPILE_ALL=1: every one, hours); gm.compile_report() prints each
    one's shared memory, registers and stack frame."""
    full = os.environ.get("STRATA_COMPILE_ALL") == "1"
    failures, done = [], 0
    for cfg in gm.launcher_configs(full=full):
        for arch in (80, 90):
            try:
                r = gm.compile_config(cfg, arch)
            except Exception as e:  # a compile error names the configuration
                failures.append(f"sm_{arch} {cfg}: {type(e).__name__}: {str(e)[-300:]}")
                continue
            done += 1
            if r.shared > SHARED_LIMIT[arch]:
                failures.append(f"sm_{arch} {cfg}: shared memory {r.shared} > {SHARED_LIMIT[arch]}")
    assert done and not failures, "\n".join(failures[:20])
