"""torch.compile / torch.export / torch.library.opcheck with strata's ops.

- opcheck (schema, fake tensor, autograd registration, AOT dispatch with static and dynamic
  shapes) for every op of ``torch.ops.strata`` that takes a tensor: a new op without a case here
  fails test_every_tensor_op_has_an_opcheck_case;
- ``torch.compile(fullgraph=True)`` of a model with MLR, Monarch, dense, structured and bilinear
  layers and the fused block pieces (ln_linear, packed attention, GeluMLP): no graph break, forward and backward equal to eager (inductor and aot_eager; static and
  dynamic shapes);
- torch.export of the same model, run.

Tolerances: the strata ops run the same kernels compiled or not (bitwise the same for the same
inputs); what differs is inductor's own fusion of the surrounding ATen ops (LayerNorm, Linear,
adds), whose float32 round-off is a few ulps per op: 1e-5 relative (about 80 ulps) bounds it with
room, and a wrong gradient (a dropped term, a swapped operand) is off by O(1).
"""

from __future__ import annotations

import contextlib
import functools

import pytest
import torch

import strata
from conftest import rel_err

ops = torch.ops.strata
TOL = 1e-5


def _randn(*shape, grad=False, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed + sum(shape))
    return torch.randn(*shape, generator=g, dtype=dtype).requires_grad_(grad)


def _qkv(b, n, hq, hkv, d, dv, grad, layout="bshd", seed=0):
    shapes = [(b, n, hq, d), (b, n, hkv, d), (b, n, hkv, dv)]
    ts = [_randn(*s, seed=seed + i) for i, s in enumerate(shapes)]
    if layout == "bhsd":
        ts = [t.transpose(1, 2).contiguous() for t in ts]
    return [t.requires_grad_(grad) for t in ts]


@contextlib.contextmanager
def _recording(module_name: str):
    """Replaces strata.<module_name>._ops with a recorder of the (op name, args) it is called with."""
    import importlib

    mod = importlib.import_module(f"strata.{module_name}")
    calls = []

    class Recorder:
        def __getattr__(self, name):
            def call(*args):
                calls.append((name, args))
                return getattr(ops, name)(*args)
            return call

    saved, mod._ops = mod._ops, Recorder()
    try:
        yield calls
    finally:
        mod._ops = saved


def _module_call_args(module, x, module_name: str, op_name: str):
    """The arguments ``module(x)`` passes to torch.ops.strata.<op_name>."""
    with _recording(module_name) as calls:
        module(x)
    return next(args for name, args in calls if name == op_name)


# ---- opcheck cases: op name -> list of functions returning (args, kwargs) -------------------------


def _structured_case(spec, rows_shape, grad):
    lin = strata.StructuredLinear(spec, bias=False)
    x = _randn(*rows_shape, spec.in_features, grad=grad)
    return x, [f.detach().requires_grad_(grad) for f in lin.factors], spec.ints, spec.alpha


def _cases():
    c = {}
    add = lambda name, fn: c.setdefault(name, []).append(fn)  # noqa: E731
    for grad in (False, True):
        for layout in ("bshd", "bhsd"):
            g, lay = grad, layout
            # dense: GQA (4 query heads, 2 kv heads), odd sizes, each mask kind
            add("attention_forward", lambda g=g, lay=lay: (_qkv(2, 7, 4, 2, 8, 5, g, lay), dict(causal=True, layout=lay)))
            add("attention", lambda g=g, lay=lay: (_qkv(2, 7, 4, 2, 8, 5, g, lay),
                                                   dict(window_left=2, window_right=1, num_global=1, layout=lay)))
            add("attention", lambda g=g, lay=lay: (_qkv(1, 9, 1, 3, 6, 6, g, lay),
                                                   dict(causal=True, key_padding_mask=torch.rand(1, 9) > 0.3,
                                                        layout=lay)))
            add("paper_gswa_attention", lambda g=g, lay=lay: (_qkv(2, 9, 2, 2, 8, 8, g, lay),
                                                              dict(split_a=3, window=2, layout=lay)))
            add("mlr_attention", lambda g=g, lay=lay: (_qkv(2, 9, 4, 2, 8, 8, g, lay),
                                                       dict(ranks=[4, 2, 2], level_average=True, layout=lay)))
            add("mlr_attention_forward", lambda g=g, lay=lay: (_qkv(2, 9, 4, 4, 8, 8, g, lay),
                                                               dict(ranks=[4, 4], context=16, layout=lay)))
            add("monarch_attention", lambda g=g, lay=lay: (_qkv(2, 10, 2, 2, 8, 8, g, lay),
                                                           dict(num_steps=2, layout=lay)))
            add("monarch_attention_forward", lambda g=g, lay=lay: (_qkv(2, 10, 2, 2, 8, 8, g, lay),
                                                                   dict(num_steps=3, block_size=4, pad="pre",
                                                                        layout=lay)))
            add("performer_attention", lambda g=g, lay=lay: (_qkv(2, 9, 2, 2, 8, 8, g, lay),
                                                             dict(num_features=16, seed=3, layout=lay)))
            add("nystrom_attention", lambda g=g, lay=lay: (_qkv(2, 9, 2, 2, 8, 8, g, lay),
                                                           dict(num_landmarks=3, layout=lay)))
        # bfloat16 through the bf16 engines (or the fp32 path where the CPU has none), and the
        # compute option
        add("attention", lambda g=g: ([t.detach().bfloat16().requires_grad_(g) for t in _qkv(1, 9, 2, 2, 16, 16, g)],
                                      dict(causal=True)))
        add("attention_forward", lambda g=g: ([t.bfloat16() for t in _qkv(1, 9, 2, 2, 16, 16, False)],
                                              dict(compute="fp32")))
        add("mlr_attention_forward", lambda g=g: ([t.bfloat16() for t in _qkv(1, 9, 2, 2, 16, 16, False)],
                                                  dict(ranks=[8, 4, 4], compute="fp32")))
        S = strata.structured
        add("structured_forward", lambda g=g: (_structured_case(S.btt(64, 48), (2, 5), g), {}))
        add("structured_forward_saving", lambda g=g: (_structured_case(S.mlr(64, [16, 8, 8]), (7,), g), {}))
        add("structured_linear", lambda g=g: (_structured_case(S.monarch(64), (3, 5), g), {}))
        add("structured_linear", lambda g=g: (_structured_case(S.low_rank(40, 24, 6), (9,), g), {}))
        add("structured_to_dense", lambda g=g: (_structured_case(S.kronecker(4, 3, 5, 2), (1,), g)[1:], {}))
        add("btt_key_transform", lambda g=g: (
            _module_call_args(strata.BilinearBTTAttention(64, 4), _randn(2, 9, 64, grad=g), "bilinear",
                              "bilinear_btt_attention")[:3] + (4,), {}))
        add("block_diag_transform", lambda g=g: ((_randn(2, 9, 64, grad=g), _randn(4, 16, 8, grad=g), 2), {}))
        add("bilinear_btt_attention", lambda g=g: (
            _module_call_args(strata.BilinearBTTAttention(64, 4), _randn(2, 9, 64, grad=g), "bilinear",
                              "bilinear_btt_attention"), {}))
        add("bilinear_mlr_attention", lambda g=g: (
            _module_call_args(strata.BilinearMLRAttention(64, 4, [8, 4, 4]), _randn(2, 9, 64, grad=g), "bilinear",
                              "bilinear_mlr_attention"), {}))
        add("mup_rms_cap", lambda g=g: ((_randn(16, 24, grad=g), 16, 24), {}))
        # packed q/k/v (batch x seq x 3 x heads x head_dim)
        add("attention_qkvpacked", lambda g=g: ((_randn(2, 7, 3, 2, 8, grad=g),), dict(causal=True)))
        add("mlr_attention_qkvpacked", lambda g=g: ((_randn(2, 9, 3, 2, 8, grad=g), [4, 2, 2]),
                                                    dict(context=16, level_average=True)))
        # the fused block pieces: odd widths, with and without biases / LayerNorm / residual
        add("gelu_mlp", lambda g=g: ((_randn(2, 5, 12, grad=g), _randn(20, 12, grad=g), _randn(20, grad=g),
                                      _randn(12, 20, grad=g), None),
                                     dict(ln_weight=_randn(12, grad=g), ln_bias=_randn(12, grad=g), residual=True)))
        add("gelu_mlp", lambda g=g: ((_randn(7, 9, grad=g), _randn(5, 9, grad=g), None, _randn(9, 5, grad=g),
                                      _randn(9, grad=g)), {}))
        add("gelu_mlp_forward", lambda g=g: ((_randn(3, 4, 12, grad=g), _randn(20, 12), _randn(20), _randn(12, 20),
                                              _randn(12)), dict(ln_weight=_randn(12), residual=True)))
        add("ln_linear", lambda g=g: ((_randn(2, 5, 12, grad=g), _randn(36, 12, grad=g), _randn(36, grad=g)),
                                      dict(ln_weight=_randn(12, grad=g), ln_bias=_randn(12, grad=g))))
        add("ln_linear", lambda g=g: ((_randn(7, 9, grad=g), _randn(5, 9, grad=g), None), {}))
        add("ln_linear_forward", lambda g=g: ((_randn(3, 4, 12, grad=g), _randn(20, 12), None),
                                              dict(ln_weight=_randn(12), ln_bias=_randn(12))))

    # The kernels' backward ops, on a forward's outputs.
    def attention_backward():
        q, k, v = _qkv(2, 7, 4, 2, 8, 5, False)
        out, lse = ops.attention_forward(q, k, v, causal=True)
        return (q, k, v, out, lse, torch.randn_like(out)), dict(causal=True)

    def mlr_attention_backward():
        q, k, v = _qkv(2, 9, 4, 4, 8, 8, False)
        out, lse = ops.mlr_attention_forward(q, k, v, [4, 2, 2])
        return (q, k, v, out, lse, torch.randn_like(out), [4, 2, 2]), {}

    def monarch_attention_backward():
        q, k, v = _qkv(2, 10, 2, 2, 8, 8, False)
        out, state = ops.monarch_attention_forward(q, k, v, 2)
        return (q, k, v, state, torch.randn_like(out), 2), {}

    def structured_backward():
        x, f, spec, alpha = _structured_case(strata.structured.btt(64, 64, rank=2), (2, 5), False)
        y, saved = ops.structured_forward_saving(x, f, spec, alpha)
        return (x, f, spec, alpha, torch.randn_like(y)), dict(saved=saved)

    def attention_qkvpacked_backward():
        qkv = _randn(2, 7, 3, 2, 8)
        out, lse = ops.attention_forward(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], causal=True)
        return (qkv, out, lse, torch.randn_like(out)), dict(causal=True)

    def mlr_attention_qkvpacked_backward():
        qkv = _randn(2, 9, 3, 2, 8)
        out, lse = ops.mlr_attention_forward(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], [4, 2, 2], context=16)
        return (qkv, out, lse, torch.randn_like(out), [4, 2, 2]), dict(context=16)

    def gelu_mlp_backward():
        x, w1, b1, w2, lw = _randn(3, 4, 12), _randn(20, 12), _randn(20), _randn(12, 20), _randn(12)
        y, h, stats = ops.gelu_mlp_forward(x, w1, b1, w2, None, lw, None, residual=True)
        return (torch.randn_like(y), x, w1, w2, h, stats, lw, None, 1e-5, True,
                [True, True, True, False, False, True, False]), {}

    def ln_linear_backward():
        x, w, lw, lb = _randn(7, 9), _randn(5, 9), _randn(9), _randn(9)
        y, stats = ops.ln_linear_forward(x, w, None, lw, lb)
        return (torch.randn_like(y), x, w, stats, lw, lb, 1e-5, [True, True, False, True, True]), {}

    for fn in (attention_backward, mlr_attention_backward, monarch_attention_backward, structured_backward,
               attention_qkvpacked_backward, mlr_attention_qkvpacked_backward, gelu_mlp_backward, ln_linear_backward):
        add(fn.__name__, fn)
    return c


CASES = _cases()


def _tensor_ops():
    """The ops of the strata namespace with a Tensor (or Tensor list) argument."""
    names = sorted(n.split("::")[1] for n in torch._C._dispatch_get_all_op_names() if n.startswith("strata::"))
    return [n for n in names if any("Tensor" in str(a.type) for a in getattr(ops, n).default._schema.arguments)]


def test_every_tensor_op_has_an_opcheck_case():
    missing = [n for n in _tensor_ops() if n not in CASES]
    assert not missing, f"ops without an opcheck case in test_compile.py: {missing}"
    assert len(_tensor_ops()) >= 20  # the enumeration itself works


@pytest.mark.parametrize("name,i", [(n, i) for n in sorted(CASES) for i in range(len(CASES[n]))])
def test_opcheck(name, i):
    args, kwargs = CASES[name][i]()
    result = torch.library.opcheck(getattr(ops, name).default, tuple(args), kwargs)
    assert all(v == "SUCCESS" for v in result.values()), result


# ---- torch.compile of a model ---------------------------------------------------------------------


class Block(torch.nn.Module):
    """x -> x + attention(LN(x)) -> x + StructuredLinear(GELU(...)) with the attention named by ``kind``."""

    def __init__(self, kind: str, dim: int = 32, heads: int = 4):
        super().__init__()
        self.kind, self.heads = kind, heads
        self.norm = torch.nn.LayerNorm(dim)
        if kind == "mlr":
            self.attn = strata.MLRAttention(dim, heads, [4, 2, 2], context=16)
        elif kind == "bilinear_btt":
            self.attn = strata.BilinearBTTAttention(dim, heads)
        elif kind == "fused":  # strata's fused block pieces: ln_linear, packed attention, GeluMLP
            self.qkv = torch.nn.Linear(dim, 3 * dim)
            self.out = torch.nn.Linear(dim, dim)
            self.fused_mlp = strata.GeluMLP(dim, 2 * dim, norm=True, residual=True)
        else:  # monarch / dense: q, k, v projections around the functional op
            self.qkv = torch.nn.Linear(dim, 3 * dim)
            self.out = torch.nn.Linear(dim, dim)
            self.attn = strata.MonarchAttention(num_steps=2) if kind == "monarch" else None
        if kind != "fused":
            self.mlp = strata.StructuredLinear(strata.structured.btt(dim, dim))

    def forward(self, x):
        if self.kind == "fused":
            qkv = strata.ln_linear(x, self.qkv.weight, self.qkv.bias, ln_weight=self.norm.weight,
                                   ln_bias=self.norm.bias).unflatten(-1, (3, self.heads, -1))
            x = x + self.out(strata.attention_qkvpacked(qkv, causal=True).flatten(2))
            return self.fused_mlp(x)
        h = self.norm(x)
        if self.kind in ("mlr", "bilinear_btt"):
            a = self.attn(h)
        else:
            q, k, v = self.qkv(h).unflatten(-1, (3, self.heads, -1)).unbind(2)
            o = self.attn(q, k, v) if self.attn is not None else strata.attention(q, k, v, causal=True)
            a = self.out(o.flatten(2))
        x = x + a
        return x + self.mlp(torch.nn.functional.gelu(x))


@functools.lru_cache(maxsize=None)
def _model():
    torch.manual_seed(0)
    m = torch.nn.Sequential(*(Block(k) for k in ("mlr", "monarch", "dense", "bilinear_btt", "fused")))
    with torch.no_grad():  # zero-initialised out projections would hide wrong gradients
        for p in m.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return m


def _loss_and_grads(model, x):
    model.zero_grad()
    x = x.detach().clone().requires_grad_()
    y = model(x)
    (y * torch.linspace(-1, 1, y.numel()).view_as(y)).sum().backward()
    return [y.detach(), x.grad] + [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("backend,dynamic", [("inductor", False), ("aot_eager", True)])
def test_compiled_model_matches_eager(backend, dynamic):
    model = _model()
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend=backend, dynamic=dynamic)
    for seq in (11, 16) if dynamic else (11,):  # dynamic: one graph for two lengths
        x = _randn(2, seq, 32, seed=seq)
        got, want = _loss_and_grads(compiled, x), _loss_and_grads(model, x)
        names = ["out", "dx"] + [n for n, _ in model.named_parameters()]
        for n, a, w in zip(names, got, want):
            assert rel_err(a, w) <= TOL, f"{backend} seq {seq}: {n} {rel_err(a, w):.3g}"


def test_compile_has_no_graph_break():
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(_model())(_randn(2, 11, 32))
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1


def test_export_runs_and_matches_eager():
    model = _model()
    x = _randn(2, 11, 32)
    exported = torch.export.export(model, (x,))
    assert rel_err(exported.module()(x), model(x)) <= TOL
    kernel_ops = {str(n.target) for n in exported.graph.nodes if str(n.target).startswith("strata.")}
    assert kernel_ops, "the exported graph holds no strata op"
