"""strata.gelu_mlp / ln_linear / GeluMLP and the packed-q/k/v attention ops from Python.

The fused kernels (float32) against the same math in float64 ATen ops (the truth), judged by the
acceptance rule of the attention tests: strata's normwise error at most twice that of the same
ATen ops run in float32, plus a floor of 1e-6 (a few float32 ulps of the largest entry: both sides
sum tens to hundreds of products in a different order; a dropped term or a swapped operand is off
by O(1)). The packed attention ops run the same kernels as the unpacked ones on the three views:
bitwise equal results and gradients.
"""

from __future__ import annotations

import itertools

import pytest
import torch

import strata
from conftest import rel_err

F = torch.nn.functional


def _t(*shape, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(*shape, generator=g, dtype=torch.float64)).float()


def _mlp_params(D, H, bias, ln, ln_bias, seed=0):
    p = {"w1": _t(H, D, seed=seed + 1, scale=D**-0.5), "w2": _t(D, H, seed=seed + 2, scale=H**-0.5),
         "b1": _t(H, seed=seed + 3, scale=0.1) if bias else None, "b2": _t(D, seed=seed + 4, scale=0.1) if bias else None,
         "ln_weight": 1 + _t(D, seed=seed + 5, scale=0.2) if ln else None,
         "ln_bias": _t(D, seed=seed + 6, scale=0.2) if ln and ln_bias else None}
    return p


def _aten_mlp(x, w1, b1, w2, b2, ln_weight, ln_bias, residual, eps=1e-5):
    u = F.layer_norm(x, (x.shape[-1],), ln_weight, ln_bias, eps) if ln_weight is not None else x
    y = F.linear(F.gelu(F.linear(u, w1, b1)), w2, b2)
    return x + y if residual else y


def _aten_ln_linear(x, w, b, ln_weight, ln_bias, eps=1e-5):
    u = F.layer_norm(x, (x.shape[-1],), ln_weight, ln_bias, eps) if ln_weight is not None else x
    return F.linear(u, w, b)


def _run(fn, inputs: dict, g: torch.Tensor, dtype):
    """[y, grads of every defined input in `inputs`' order] of loss = sum(fn(...) * g) in `dtype`."""
    leaves = {k: None if v is None else v.detach().to(dtype).requires_grad_() for k, v in inputs.items()}
    y = fn(**leaves)
    defined = [v for v in leaves.values() if v is not None]
    return [y.detach(), *torch.autograd.grad(y, defined, g.to(dtype))]


def _check_rule(got, truth, torch32, what):
    for i, (a, t, p) in enumerate(zip(got, truth, torch32)):
        e, e_torch = rel_err(a, t), rel_err(p, t)
        assert e <= 2 * e_torch + 1e-6, f"{what} output {i}: strata {e:.3g}, ATen float32 {e_torch:.3g}"


MLP_CASES = [
    # rows shape, D, H, bias, ln, ln_bias, residual
    ((1,), 8, 32, True, False, False, False),
    ((7,), 13, 29, False, True, True, True),
    ((2, 97), 64, 256, True, True, False, True),
    ((3, 5), 33, 70, True, True, True, False),
    ((1025,), 16, 17, False, False, False, True),
]


@pytest.mark.parametrize("rows,D,H,bias,ln,ln_bias,residual", MLP_CASES)
def test_gelu_mlp_matches_float64_aten(rows, D, H, bias, ln, ln_bias, residual):
    p = _mlp_params(D, H, bias, ln, ln_bias)
    inputs = {"x": _t(*rows, D, seed=7), **p}
    g = _t(*rows, D, seed=8)

    def ours(x, w1, b1, w2, b2, ln_weight, ln_bias):
        return strata.gelu_mlp(x, w1, b1, w2, b2, ln_weight=ln_weight, ln_bias=ln_bias, residual=residual)

    def aten(**kw):
        return _aten_mlp(**kw, residual=residual)

    _check_rule(_run(ours, inputs, g, torch.float32), _run(aten, inputs, g, torch.float64),
                _run(aten, inputs, g, torch.float32), f"gelu_mlp rows={rows} D={D} H={H}")


@pytest.mark.parametrize("rows,D,H,bias,ln,ln_bias", [((1,), 8, 24, True, True, True), ((7, 3), 13, 39, False, True,
                                                                                         False),
                                                      ((97,), 64, 192, True, False, False), ((1025,), 5, 3, True, True,
                                                                                            True)])
def test_ln_linear_matches_float64_aten(rows, D, H, bias, ln, ln_bias):
    p = _mlp_params(D, H, bias, ln, ln_bias)
    inputs = {"x": _t(*rows, D, seed=9), "w": p["w1"], "b": p["b1"], "ln_weight": p["ln_weight"],
              "ln_bias": p["ln_bias"]}
    g = _t(*rows, H, seed=10)

    def ours(x, w, b, ln_weight, ln_bias):
        return strata.ln_linear(x, w, b, ln_weight=ln_weight, ln_bias=ln_bias)

    _check_rule(_run(ours, inputs, g, torch.float32), _run(_aten_ln_linear, inputs, g, torch.float64),
                _run(_aten_ln_linear, inputs, g, torch.float32), f"ln_linear rows={rows} D={D} H={H}")


def test_strided_inputs_give_the_contiguous_results():
    D, H = 24, 40
    p = _mlp_params(D, H, True, True, True)
    base = _t(3, 2 * D, 5, seed=11)
    x = base[:, ::2, 1].unsqueeze(1).expand(3, 4, D)  # zero and odd strides
    w1t = p["w1"].t().contiguous().t()  # a transposed layout (column-major weights)
    kw = dict(ln_weight=p["ln_weight"], ln_bias=p["ln_bias"], residual=True)
    got = strata.gelu_mlp(x, w1t, p["b1"], p["w2"], p["b2"], **kw)
    want = strata.gelu_mlp(x.contiguous(), p["w1"], p["b1"], p["w2"], p["b2"], **kw)
    assert torch.equal(got, want)
    got = strata.ln_linear(x, w1t, p["b1"], ln_weight=p["ln_weight"])
    assert torch.equal(got, strata.ln_linear(x.contiguous(), p["w1"], p["b1"], ln_weight=p["ln_weight"]))


def test_float64_goes_through_aten_ops_and_passes_gradcheck():
    D, H = 6, 10
    p = {k: None if v is None else v.double().requires_grad_() for k, v in _mlp_params(D, H, True, True, True).items()}
    x = _t(2, 3, D, seed=12).double().requires_grad_()

    def f(x, w1, b1, w2, b2, lw, lb):
        return strata.gelu_mlp(x, w1, b1, w2, b2, ln_weight=lw, ln_bias=lb, residual=True)

    assert torch.autograd.gradcheck(f, (x, p["w1"], p["b1"], p["w2"], p["b2"], p["ln_weight"], p["ln_bias"]))


def test_gelu_mlp_module_equals_the_unfused_stack():
    torch.manual_seed(0)
    m = strata.GeluMLP(20, 52, norm=True, residual=True)
    with torch.no_grad():
        m.norm.weight.add_(0.2 * torch.randn(20))
        m.norm.bias.add_(0.2 * torch.randn(20))
    ref = torch.nn.Sequential(torch.nn.LayerNorm(20), torch.nn.Linear(20, 52), torch.nn.GELU(), torch.nn.Linear(52, 20))
    ref.load_state_dict({"0.weight": m.norm.weight, "0.bias": m.norm.bias, "1.weight": m.fc1.weight,
                         "1.bias": m.fc1.bias, "3.weight": m.fc2.weight, "3.bias": m.fc2.bias})
    x = torch.randn(4, 9, 20)
    assert rel_err(m(x), x + ref(x)) <= 1e-6
    assert set(dict(m.named_parameters())) == {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "norm.weight",
                                               "norm.bias"}


def test_kernel_ops_compute_only_the_asked_gradients():
    D, H = 16, 24
    p = _mlp_params(D, H, True, True, True)
    x, dy = _t(5, D, seed=13), _t(5, D, seed=14)
    ops = torch.ops.strata
    y, h, stats = ops.gelu_mlp_forward(x, p["w1"], p["b1"], p["w2"], p["b2"], p["ln_weight"], p["ln_bias"],
                                       residual=True)
    assert h.shape == (5, H) and stats.shape == (5, 2) and y.shape == x.shape
    full = ops.gelu_mlp_backward(dy, x, p["w1"], p["w2"], h, stats, p["ln_weight"], p["ln_bias"], 1e-5, True,
                                 [True] * 7)
    assert all(t is not None for t in full)
    for mask in itertools.product([False, True], repeat=7):
        if sum(mask) not in (1, 6):
            continue
        got = ops.gelu_mlp_backward(dy, x, p["w1"], p["w2"], h, stats, p["ln_weight"], p["ln_bias"], 1e-5, True,
                                    list(mask))
        for i, (m, a, b) in enumerate(zip(mask, got, full)):
            assert (a is not None) == m, (mask, i)
            if m:
                assert torch.equal(a, b), (mask, i)
    # without a LayerNorm: stats is empty and no LayerNorm gradient comes back
    y, h, stats = ops.gelu_mlp_forward(x, p["w1"], None, p["w2"], None)
    assert stats.numel() == 0
    got = ops.gelu_mlp_backward(dy, x, p["w1"], p["w2"], h, stats, None, None, 1e-5, False, [True] * 7)
    assert got[5] is None and got[6] is None and got[0] is not None
    y, stats = ops.ln_linear_forward(x, p["w1"], p["b1"], p["ln_weight"])
    got = ops.ln_linear_backward(_t(5, H, seed=15), x, p["w1"], stats, p["ln_weight"], None, 1e-5, [False, True] * 2 +
                                 [True])
    assert [t is not None for t in got] == [False, True, False, True, False]


def test_kernel_outputs_do_not_require_grad():
    p = _mlp_params(8, 16, True, False, False)
    x = _t(3, 8, seed=16).requires_grad_()
    y, h, stats = torch.ops.strata.gelu_mlp_forward(x, p["w1"], p["b1"], p["w2"], p["b2"])
    assert not y.requires_grad and not h.requires_grad


@pytest.mark.parametrize("call,arg,match", [
    (lambda p, x: strata.gelu_mlp(x[..., :7], p["w1"], p["b1"], p["w2"], p["b2"]), "x", "w1's width"),
    (lambda p, x: strata.gelu_mlp(x, p["w1"], p["b2"], p["w2"], p["b2"]), "b1", "w1's hidden"),
    (lambda p, x: strata.gelu_mlp(x, p["w1"], p["b1"], p["w2"], p["b1"]), "b2", "w1's width"),
    (lambda p, x: strata.gelu_mlp(x, p["w1"], p["b1"], p["w2"].t(), p["b2"]), "w2", ""),
    (lambda p, x: strata.gelu_mlp(x, p["w1"], None, p["w2"], None, ln_weight=p["b1"]), "ln_weight", "w1's width"),
    (lambda p, x: strata.gelu_mlp(x.bfloat16(), p["w1"], None, p["w2"], None), "x", "float32"),
    (lambda p, x: torch.ops.strata.gelu_mlp_forward(x.double(), p["w1"].double(), None, p["w2"].double(), None),
     "x", "float32"),
    (lambda p, x: strata.ln_linear(x, p["w1"][:, :7]), "x", "w's width"),
    (lambda p, x: strata.ln_linear(x, p["w1"], p["b2"]), "b", "w's out"),
    (lambda p, x: torch.ops.strata.gelu_mlp_backward(x[:2], x, p["w1"], p["w2"], x, x, None, None, 1e-5, False,
                                                     [True] * 7), "dy", "output's sizes"),
])
def test_bad_arguments_raise_naming_them(call, arg, match):
    p = _mlp_params(8, 12, True, False, False)
    x = _t(3, 8, seed=17)
    with pytest.raises(RuntimeError, match=f"argument '{arg}'.*{match}"):
        call(p, x)


def test_python_types_are_checked():
    p = _mlp_params(8, 12, True, False, False)
    with pytest.raises(TypeError, match="residual"):
        strata.gelu_mlp(_t(2, 8, seed=1), p["w1"], None, p["w2"], None, residual=1)
    with pytest.raises(TypeError, match="'w'"):
        strata.ln_linear(_t(2, 8, seed=1), [[1.0]])


# ---- packed q/k/v attention ----------------------------------------------------------------------


def _packed_and_views(fn_packed, fn_views, qkv, g):
    a = qkv.detach().clone().requires_grad_()
    out_p = fn_packed(a)
    (da,) = torch.autograd.grad(out_p, a, g)
    b = qkv.detach().clone().requires_grad_()
    out_v = fn_views(b[:, :, 0], b[:, :, 1], b[:, :, 2])
    (db,) = torch.autograd.grad(out_v, b, g)
    return out_p, da, out_v, db


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("opts", [dict(causal=True), dict(window=(3, 1), num_global=1), dict()])
def test_attention_qkvpacked_equals_attention_on_the_views(dtype, opts):
    qkv = _t(2, 13, 3, 2, 12, seed=20).to(dtype)
    g = _t(2, 13, 2, 12, seed=21).to(dtype)
    out_p, da, out_v, db = _packed_and_views(lambda t: strata.attention_qkvpacked(t, **opts),
                                             lambda q, k, v: strata.attention(q, k, v, **opts), qkv, g)
    assert torch.equal(out_p, out_v) and torch.equal(da, db)
    assert da.shape == qkv.shape and da.is_contiguous()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("opts", [dict(context=16), dict(context=16, level_average=True)])
def test_mlr_attention_qkvpacked_equals_mlr_attention_on_the_views(dtype, opts):
    qkv = _t(2, 11, 3, 2, 8, seed=22).to(dtype)
    g = _t(2, 11, 2, 8, seed=23).to(dtype)
    out_p, da, out_v, db = _packed_and_views(lambda t: strata.mlr_attention_qkvpacked(t, [4, 2, 2], **opts),
                                             lambda q, k, v: strata.mlr_attention(q, k, v, [4, 2, 2], **opts), qkv, g)
    assert torch.equal(out_p, out_v) and torch.equal(da, db)


def test_packed_ops_reject_a_wrong_packing():
    with pytest.raises(RuntimeError, match="argument 'qkv'.*5-D"):
        strata.attention_qkvpacked(torch.randn(2, 5, 2, 8))
    with pytest.raises(RuntimeError, match="argument 'qkv'.*5-D"):
        strata.mlr_attention_qkvpacked(torch.randn(2, 5, 2, 2, 8), [4, 4])
    with pytest.raises(TypeError, match="'causal'"):
        strata.attention_qkvpacked(torch.randn(2, 5, 3, 2, 8), causal=1)
