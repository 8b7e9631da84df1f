"""What every Python test of strata shares: the normwise error, random q / k / v, outputs and
gradients by autograd, and the acceptance rule against PyTorch (as fixtures and as plain functions:
``from conftest import rel_err`` in a test module, or the ``rel_err`` fixture).

Run: STRATA_LIB=<build>/torch/libstrata_torch.so PYTHONPATH=python python -m pytest -q tests/python
(the developers' build), or, with the package installed by pip, from any folder outside the clone:
python -m pytest -q <clone>/tests/python --strata-installed [--strata-wheel=<the wheel>]
(scripts/test_pip.sh: test_package.py then checks that the installed package was tested).
"""

from __future__ import annotations

import math

import pytest
import torch


def rel_err(got: torch.Tensor, want: torch.Tensor, floor: float = 1e-30) -> float:
    """max |got - want| / max(max |want|, floor) in float64; a NaN on either side is an infinite
    error (a test that expects NaN compares isnan itself)."""
    got, want = got.double(), want.double()
    if got.numel() == 0:
        return 0.0
    if torch.isnan(got).any() or torch.isnan(want).any():
        return math.inf
    return ((got - want).abs().max() / want.abs().max().clamp_min(floor)).item()


def rand_qkv(b, nq, nk, hq, hkv, d, dv, dtype, layout="bshd", seed=0):
    """Random normal q, k, v (drawn in float64, then rounded to dtype) in the given layout (BSHD
    shapes, dims 1 and 2 swapped for "bhsd")."""
    g = torch.Generator().manual_seed(seed)
    shapes = [(b, nq, hq, d), (b, nk, hkv, d), (b, nk, hkv, dv)]
    ts = [torch.randn(s, generator=g, dtype=torch.float64).to(dtype) for s in shapes]
    return [t.transpose(1, 2).contiguous() if layout == "bhsd" else t for t in ts]


def out_and_grads(fn, q, k, v, g):
    """[out, dq, dk, dv] of loss = sum(fn(q, k, v) * g), from detached copies of q, k, v."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = fn(*leaves)
    grads = torch.autograd.grad(out, leaves, g.to(out.dtype))
    return [out.detach(), *grads]


def bf16_engines():
    """The bf16 engines strata's compute option can name on this CPU (strata/cpu.h): avx512_bf16 where
    the CPU has AVX512-BF16 and the kernels run at avx512, then amx_bf16 where AMX-BF16 is granted."""
    import strata

    features = strata.info()["cpu_features"]
    engines = ["avx512_bf16"] if "avx512_bf16" in features and strata.info()["isa"] == "avx512" else []
    return engines + (["amx_bf16"] if engines and "amx_bf16" in features else [])


def assert_as_close_as_torch(got, want, torch_same_precision, floor, grad_floor=None, what=""):
    """The acceptance rule (FlashAttention's), for each of [out, dq, dk, dv]: strata's error
    against the float64 truth is at most twice PyTorch's own error for the same computation in
    the same precision, plus `floor` (`grad_floor` for the gradients, whose errors are divided by
    max(max |want|, 1e-2): rows with one allowed key have exactly zero dq / dk, and round-off
    must not be divided by ~0)."""
    for i, (a, w, t) in enumerate(zip(got, want, torch_same_precision)):
        den_floor = 1e-30 if i == 0 or grad_floor is None else 1e-2
        err, err_torch = rel_err(a, w, den_floor), rel_err(t, w, den_floor)
        assert math.isfinite(err_torch), f"{what} tensor {i}: PyTorch's own result is not finite"
        bound = 2 * err_torch + (floor if i == 0 or grad_floor is None else max(floor, grad_floor))
        assert err <= bound, f"{what} tensor {i} (0 = out, 1..3 = dq, dk, dv): {err:.3g} vs torch {err_torch:.3g}"


def strided_view(t: torch.Tensor, how: str) -> torch.Tensor:
    """t's values in another memory layout: "every_other" (every other element of a twice larger
    buffer, in every dim), "swapped" (dims 1 and 2 swapped in memory) or "as_is"."""
    if how == "every_other":
        big = torch.zeros([2 * n for n in t.shape], dtype=t.dtype)
        view = big[tuple(slice(None, None, 2) for _ in t.shape)]
        view.copy_(t)
        return view
    if how == "swapped":
        return t.transpose(1, 2).contiguous().transpose(1, 2)
    return t


def natural_grad_sizes(q, k, v, g, scale):
    """The size of one term of the sums that make dq, dk, dv of softmax(scale * q k^T) v, from BSHD
    q, k, v and the output gradient g (heads repeated to g's): scale * max|k| * max|g_i . v_j|,
    scale * max|q| * max|g_i . v_j|, max|g|."""
    h = g.shape[2]
    vr = v.double().repeat_interleave(h // v.shape[2], 2)
    dp = torch.einsum("bihd,bjhd->bhij", g.double(), vr).abs().max().item() if g.numel() and vr.numel() else 0.0
    return [scale * k.double().abs().max().item() * dp, scale * q.double().abs().max().item() * dp,
            g.double().abs().max().item()]


def assert_grads_as_close_as_torch(got, want, torch_same_precision, natural, floor, what=""):
    """The acceptance rule for [dq, dk, dv] in absolute terms: |strata - truth| <= 2 |PyTorch -
    truth| + floor * max(max|truth|, natural) (elementwise maxima; natural from natural_grad_sizes).
    Round-off of a sum is a few ulps of its terms; on a row with one allowed key the terms cancel
    exactly, which PyTorch's materialised softmax backward reproduces (dq = dk = 0 there) while the
    kernels, forming the row term D_i = dO_i . O_i from the output as FlashAttention does, keep
    round-off of that size (e.g. 6.5e-7 absolute at head_dim_v 22, three query heads per kv head)."""
    for name, a, w, t, n in zip(("dq", "dk", "dv"), got, want, torch_same_precision, natural):
        err = (a.double() - w).abs().max().item()
        err_torch = (t.double() - w).abs().max().item()
        bound = 2 * err_torch + floor * max(w.abs().max().item(), n)
        assert err <= bound, f"{what} {name}: error {err:.3g} vs torch {err_torch:.3g}, bound {bound:.3g}"


def assert_raises_naming(exc: type, fn, message: str) -> None:
    """fn() raises exc whose message contains `message` (the argument's name, what was expected)."""
    with pytest.raises(exc) as info:
        fn()
    assert message in str(info.value)


def pytest_addoption(parser):
    parser.addoption("--strata-installed", action="store_true",
                     help="strata must be the pip-installed package (test_package.py checks it)")
    parser.addoption("--strata-wheel", default=None, help="a wheel of strata-attention to check (test_package.py)")


@pytest.fixture(name="rel_err")
def rel_err_fixture():
    return rel_err


@pytest.fixture(name="out_and_grads")
def out_and_grads_fixture():
    return out_and_grads
