"""Tests of the muP training support from Python (python/strata/mup.py): the RMS cap and its
gradient against the formula written out, role resolution (declared by modules, torch defaults,
errors), the init statistics, the learning-rate groups and the AdamW settings on a small model.

Run: STRATA_LIB=<build>/torch/libstrata_torch.so PYTHONPATH=python python -m pytest -q tests/python/test_mup.py
"""

from __future__ import annotations

import math

import pytest
import torch

import strata
from strata.mup import MupRole, mup_adamw, mup_init_, mup_param_groups, mup_params, rms_cap, rms_cap_sigma
from conftest import assert_raises_naming, rel_err

F64_TOL = 1e-11  # exact math in double on both sides


def capped_by_hand(w, d_in, d_out):
    ratio = (w.square().mean() + 1e-8).sqrt() / (math.sqrt(min(d_in, d_out)) / d_in)
    return w / ratio if ratio.item() > 1 else w


@pytest.mark.parametrize("d_in, d_out, scale", [(16, 64, 3.0), (16, 64, 0.5), (24, 6, 2.0), (24, 6, 0.9)])
def test_rms_cap_and_its_gradient(d_in, d_out, scale):
    sigma = rms_cap_sigma(d_in, d_out)
    assert sigma == math.sqrt(min(d_in, d_out)) / d_in
    g = torch.Generator().manual_seed(d_in + d_out)
    z = torch.randn(3, d_in, d_out, generator=g, dtype=torch.float64)
    w0 = z / z.square().mean().sqrt() * (scale * sigma)  # RMS = scale * sigma*
    w, wr = w0.clone().requires_grad_(), w0.clone().requires_grad_()
    got, want = rms_cap(w, d_in, d_out), capped_by_hand(wr, d_in, d_out)
    assert rel_err(got, want) <= F64_TOL
    if scale > 1:
        assert abs(got.square().mean().sqrt().item() - sigma) <= 1e-6 * sigma
    else:
        assert torch.equal(got, w0)
    gout = torch.randn(w0.shape, generator=g, dtype=torch.float64)
    dg, = torch.autograd.grad((got * gout).sum(), [w])
    dw, = torch.autograd.grad((want * gout).sum(), [wr])
    assert rel_err(dg, dw) <= F64_TOL
    if scale > 1:
        assert rel_err(dg, gout) > 1e-3  # the gradient goes through RMS(w)
    assert_raises_naming(ValueError, lambda: rms_cap_sigma(0, 2), "rms_cap: argument 'd_in'")


class TinyLM(torch.nn.Module):
    """Embeddings, the two bilinear layers, an MLP, an LN, a raw gain and an LM head (readout),
    the last three declared by the model itself."""

    D, V = 64, 100

    def __init__(self):
        super().__init__()
        D, V = self.D, self.V
        self.wte = torch.nn.Embedding(V, D)
        self.btt = strata.BilinearBTTAttention(D, 4, btt_rank=2)
        self.mlr = strata.BilinearMLRAttention(D, 4, [8, 4, 4])
        self.ln = torch.nn.LayerNorm(D)
        self.fc = torch.nn.Linear(D, 4 * D)
        self.proj = torch.nn.Linear(4 * D, D, bias=False)
        self.lm_head = torch.nn.Linear(D, V, bias=False)
        self.scale = torch.nn.Parameter(torch.ones(D))

    def forward(self, idx):
        h = self.wte(idx)
        h = h + self.btt(h) + self.mlr(h)
        h = h + self.proj(torch.nn.functional.gelu(self.fc(self.ln(h))))
        return self.lm_head(h * self.scale)

    def mup_roles(self):
        return {"proj.weight": MupRole.output(4 * self.D), "lm_head.weight": MupRole.readout(self.D),
                "scale": MupRole.gain()}


def test_roles_init_and_groups():
    model = TinyLM()
    roles = {name: role for name, _, role in mup_params(model)}
    assert len(roles) == len(list(model.parameters()))
    kinds = {n: r.kind for n, r in roles.items()}
    assert kinds["wte.weight"] == "embedding"
    assert roles["btt.w_k"] == MupRole.structured_core(16, 0.25)  # d of (4, 16)
    assert roles["btt.w_q"].fan_in == 4 * 2  # c*s
    assert roles["mlr.w_k_3"].fan_in == 16  # D / p_3
    assert kinds["btt.key_norm_weight"] == kinds["mlr.q_norm_weight_2"] == kinds["ln.weight"] == "gain"
    assert kinds["btt.v_proj.weight"] == kinds["fc.weight"] == "hidden" and roles["fc.weight"].fan_in == 64
    assert kinds["btt.out_proj.weight"] == kinds["mlr.out_proj.weight"] == "output"
    assert roles["proj.weight"] == MupRole.output(256)  # declared by the model over the Linear default
    assert kinds["lm_head.weight"] == "readout" and kinds["scale"] == "gain"
    assert kinds["fc.bias"] == kinds["ln.bias"] == "bias"

    # Init statistics: seeded; each tensor has >= 1024 entries, so the sample std is within 4.5
    # standard errors (1/sqrt(2n) <= 2.2%) of the rule's at 10%.
    mup_init_(model, generator=torch.Generator().manual_seed(7))
    p = dict(model.named_parameters())
    stds = {"wte.weight": 0.02, "btt.w_k": 0.25, "btt.w_q": 1 / math.sqrt(8), "btt.v_proj.weight": 0.125,
            "mlr.w_q_1": 0.125, "mlr.w_k_2": 1 / math.sqrt(32), "mlr.w_q_3": 0.25, "fc.weight": 0.125}
    for n, s in stds.items():
        assert abs(p[n].std().item() - s) <= 0.1 * s, n
        assert abs(p[n].mean().item()) <= 5 * s / math.sqrt(p[n].numel()), n
    # output projections N(0, 1/fan_in) and the readout N(0, 1/fan_in^2): muP's table written out
    for n, s in {"btt.out_proj.weight": 0.125, "mlr.out_proj.weight": 0.125, "proj.weight": 1 / 16,
                 "lm_head.weight": 1 / 64}.items():
        assert abs(p[n].std().item() - s) <= 0.1 * s, n
    for n in ("fc.bias", "ln.bias"):
        assert torch.all(p[n] == 0), n
    mup_init_(model, generator=torch.Generator().manual_seed(7), zero_outputs=True)  # the reference's
    for n in ("btt.out_proj.weight", "mlr.out_proj.weight", "proj.weight", "lm_head.weight", "fc.bias", "ln.bias"):
        assert torch.all(p[n] == 0), n
    assert_raises_naming(TypeError, lambda: mup_init_(model, zero_outputs=1), "mup_init_: argument 'zero_outputs'")
    for n in ("btt.key_norm_weight", "mlr.k_norm_weight_3", "ln.weight", "scale"):
        assert torch.all(p[n] == 1), n

    eta = 1e-3
    groups = mup_param_groups(model, eta)
    lr_of = {}
    for g in groups:
        assert len(g["names"]) == len(g["params"]) and g["weight_decay"] == 0.0
        for n in g["names"]:
            assert n not in lr_of, f"{n} in two groups"
            lr_of[n] = g["lr"]
    assert set(lr_of) == set(roles)
    # The reference's table (src/muP.py) at strata's default base width 128: eta * 128 / fan_in for
    # the width-fed matrices (fc / lm_head fan_in 64, proj 256, the BTT cores 16 and 8), eta else.
    want = {"wte.weight": eta, "btt.w_k": eta * 8, "btt.w_q": eta * 16, "mlr.w_q_3": eta * 8,
            "fc.weight": eta * 2, "proj.weight": eta / 2, "lm_head.weight": eta * 2, "ln.weight": eta,
            "fc.bias": eta, "btt.key_norm_weight": eta}
    for n, lr in want.items():
        assert lr_of[n] == pytest.approx(lr, rel=1e-15), n
    # the reference's own base width, when asked for: 768 / 64 = 12 eta on fc
    assert {n: g["lr"] for g in mup_param_groups(model, eta, base_width=768) for n in g["names"]}["fc.weight"] == \
        pytest.approx(eta * 12, rel=1e-15)
    for g in mup_param_groups(model, eta, weight_decay=0.1):  # decay on >= 2-D parameters only
        assert all(g["weight_decay"] == (0.1 if q.dim() >= 2 else 0.0) for q in g["params"])


def test_adamw_first_step_is_the_group_lr():
    """AdamW's first step moves each entry with |g| >> eps by exactly its group's lr
    (m / (sqrt(v) + eps) = sign(g) with eps 1e-20): the per-parameter lr reaches the optimizer."""
    torch.manual_seed(6)
    model = TinyLM().double()
    mup_init_(model)
    with torch.no_grad():  # non-zero output layers, so that every parameter gets a gradient
        for n, q in model.named_parameters():
            if "out_proj" in n or n in ("proj.weight", "lm_head.weight"):
                q.normal_(0, 0.05)
    eta = 1e-3
    opt = mup_adamw(model, eta)
    for g in opt.param_groups:
        assert g["betas"] == (0.9, 0.95) and g["eps"] == 1e-20 and g["weight_decay"] == 0.0
    lr_of = {n: g["lr"] for g in opt.param_groups for n in g["names"]}
    before = {n: q.detach().clone() for n, q in model.named_parameters()}
    model(torch.randint(0, TinyLM.V, (2, 6))).square().mean().backward()
    opt.step()
    for n, q in model.named_parameters():
        has_grad = q.grad.abs() > 1e-8
        assert has_grad.any(), n
        moved = (q.detach() - before[n]).abs()[has_grad]
        assert rel_err(moved, torch.full_like(moved, lr_of[n])) <= 1e-9, n


def test_undeclared_and_misdeclared_parameters_are_errors():
    class Raw(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.alpha = torch.nn.Parameter(torch.ones(3))

    assert_raises_naming(ValueError, lambda: mup_params(Raw()), "none for 'alpha'")

    class Wrong(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        def mup_roles(self):
            return {"fc.wieght": MupRole.output(4)}

    assert_raises_naming(ValueError, lambda: mup_params(Wrong()), "'fc.wieght', which is none")
    assert_raises_naming(ValueError, lambda: mup_param_groups(TinyLM(), -1.0), "mup_param_groups: argument 'base_lr'")
    assert_raises_naming(ValueError, lambda: MupRole("matrix"), "MupRole: argument 'kind'")
    assert_raises_naming(ValueError, lambda: MupRole.hidden(0), "MupRole: argument 'fan_in'")


def test_input_role_and_the_standard_parameterisation():
    """Issue 45: a read-in from data features is an input matrix (the reference's "_read_in":
    N(0, 0.02^2) at lr eta, whatever d is), and sp_init_ draws what PyTorch's own modules draw."""

    class ReadIn(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.read_in = torch.nn.Linear(8, 256, bias=False)
            self.fc = torch.nn.Linear(256, 256)
            self.emb = torch.nn.Embedding(64, 256)
            self.ln = torch.nn.LayerNorm(256)

        def mup_roles(self):
            return {"read_in.weight": MupRole.input(8)}

    m = ReadIn()
    mup_init_(m, generator=torch.Generator().manual_seed(1))
    assert abs(m.read_in.weight.std().item() - 0.02) <= 0.002  # 2048 draws: 1.6% standard error
    lr_of = {n: g["lr"] for g in mup_param_groups(m, 1e-3) for n in g["names"]}
    assert lr_of["read_in.weight"] == 1e-3 and lr_of["fc.weight"] == pytest.approx(1e-3 * 128 / 256)
    strata.mup.sp_init_(m, generator=torch.Generator().manual_seed(2))
    bound = 1 / math.sqrt(8)
    w = m.read_in.weight
    assert w.abs().max().item() <= bound and w.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.05)
    assert m.fc.weight.abs().max().item() <= 1 / 16 and torch.all(m.fc.bias == 0)
    assert m.emb.weight.std().item() == pytest.approx(1.0, rel=0.02)  # nn.Embedding's N(0, 1)
    assert torch.all(m.ln.weight == 1) and torch.all(m.ln.bias == 0)
