"""strata.structured: the MLBTC operators and StructuredLinear from Python.

float64 gradients by torch.autograd.gradcheck (the double reference's backward against finite
differences of its forward), the fp32 / bf16 kernels against the float64 path through autograd,
the named constructors against their definitions in torch ops, StructuredLinear as a drop-in for
nn.Linear, and bad input.
"""

from __future__ import annotations

import os
import random

import pytest
import torch

import strata
from strata import structured as st
from conftest import assert_raises_naming, rel_err, strided_view

SPECS = {
    "low_rank": lambda: st.low_rank(13, 11, 3),
    "block_diagonal_uneven": lambda: st.block_diagonal(13, 11, 4),
    "mlr_3lev": lambda: st.mlr(24, [4, 3, 2]),
    "mlr_uneven_6lev": lambda: st.mlr(37, [2, 1, 1, 1, 1, 1]),
    "mlr_multiplied_out": lambda: st.mlr(24, [8, 8], [1, 4]),
    "btt_s2_heads2": lambda: st.btt(24, 48, rank=2, heads=2),
    "btt_shape": lambda: st.btt(35, 24, rank=2, heads=2, shape=[3, 4, 5, 7]),
    "monarch": lambda: st.monarch(36),
    "kronecker": lambda: st.kronecker(3, 5, 4, 2),
}


def factors_for(spec, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(s, generator=g, dtype=torch.float64) / s[1] ** 0.5).to(dtype) for s in spec.factor_shapes()]


@pytest.mark.parametrize("name", sorted(SPECS))
def test_gradcheck_float64(name):
    spec = SPECS[name]()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 2, spec.in_features, generator=g, dtype=torch.float64, requires_grad=True)
    fs = [f.requires_grad_() for f in factors_for(spec, torch.float64)]
    assert torch.autograd.gradcheck(lambda x, *f: st.structured_linear(x, spec, f), (x, *fs), eps=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", sorted(SPECS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernels_match_float64(name, dtype):
    """y, dx, dfactors of the kernels vs the float64 reference, on the same (dtype-rounded) values.
    fp32: 1e-5 (a few hundred fp32 products per entry); bf16: outputs rounded once, 1e-2."""
    spec = SPECS[name]()
    g = torch.Generator().manual_seed(2)
    x = torch.randn(97, spec.in_features, generator=g).to(dtype)
    dy = torch.randn(97, spec.out_features, generator=g).to(dtype)
    fs = factors_for(spec, dtype)

    def run(x, fs, dt):
        leaves = [t.detach().to(dt).requires_grad_() for t in (x, *fs)]
        y = st.structured_linear(leaves[0], spec, leaves[1:])
        grads = torch.autograd.grad(y, leaves, dy.to(dt))
        return [y.detach(), *grads]

    got, want = run(x, fs, dtype), run(x, fs, torch.float64)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    for i, (a, w) in enumerate(zip(got, want)):
        assert a.dtype == dtype
        assert rel_err(a, w) < tol, f"{name} tensor {i} (0 = y, 1 = dx, 2.. = factors)"


RANDOM_CASES = int(os.environ.get("STRATA_RANDOM_CASES", "60"))


def random_spec(rng: random.Random):
    """One operator of a random kind and size, small and odd or wide enough for the kernels'
    token-major path (BTT s = 1 with b a multiple of 16, Monarch and Kronecker with 16 | sqrt(D))."""
    kind = rng.choice(["low_rank", "block_diagonal", "mlr", "btt", "btt_shape", "monarch", "kronecker"])
    if kind == "low_rank":
        return st.low_rank(rng.randint(1, 300), rng.randint(1, 300), rng.randint(1, 20))
    if kind == "block_diagonal":
        blocks = rng.randint(1, 8)
        return st.block_diagonal(blocks * rng.randint(1, 40), blocks * rng.randint(1, 40), blocks)
    if kind == "mlr":
        ranks = [rng.randint(1, 8) for _ in range(rng.randint(1, 4))]
        return st.mlr(rng.choice([48, 64, 96, 256]), ranks)
    if kind == "btt":
        return st.btt(*[rng.choice([64, 96, 256, 384, 512, 1024])] * 2, rank=rng.randint(1, 3))
    if kind == "btt_shape":
        a, b, c, d = (rng.randint(1, 20) for _ in range(4))
        return st.btt(c * d, a * b, rank=rng.randint(1, 3), shape=[a, b, c, d])
    if kind == "monarch":
        return st.monarch(rng.choice([16, 49, 256, 1024, rng.randint(1, 40) ** 2]))
    return st.kronecker(*(rng.choice([1, 3, 16, rng.randint(1, 20)]) for _ in range(4)))


@pytest.mark.parametrize("seed", range(RANDOM_CASES))
def test_random_operators_match_float64(seed):
    """Seeded draws of operator kinds, widths (odd, and wide enough for the token-major forward),
    row counts over several 64-row tiles, and x as a strided view: y, dx and every factor gradient
    of the fp32 kernels against the float64 path on the same values. 1e-5 as the named cases: the
    kernels' sums are at most a few thousand fp32 products (rows x chunk), normwise."""
    rng = random.Random(seed)
    spec = random_spec(rng)
    rows = rng.choice([1, 7, 64, 65, 97, rng.randint(1, 300)])
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, spec.in_features, generator=g)
    dy = torch.randn(rows, spec.out_features, generator=g)
    fs = factors_for(spec, torch.float32, seed)

    def run(dt, strided):
        xd = strided_view(x.to(dt), "every_other" if strided else "as_is")
        leaves = [xd.requires_grad_()] + [f.detach().to(dt).requires_grad_() for f in fs]
        y = st.structured_linear(leaves[0], spec, leaves[1:])
        return [y.detach(), *torch.autograd.grad(y, leaves, dy.to(dt))]

    got, want = run(torch.float32, rng.random() < 0.3), run(torch.float64, False)
    for i, (a, w) in enumerate(zip(got, want)):
        assert rel_err(a, w) < 1e-5, f"seed {seed}: {spec} rows {rows}: tensor {i} (0 = y, 1 = dx, 2.. = factors)"


def test_btt_is_the_index_formula():
    """M_h[(i_a b + j_b), (i_c d + i_d)] = sum_s W_Q[h b + j_b, i_a, i_c s + s'] W_K[i_c, i_d, (h b + j_b) s + s']."""
    a, b, c, d, s, heads = 3, 4, 5, 7, 2, 2
    spec = st.btt(c * d, heads * a * b, rank=s, heads=heads, shape=[a, b, c, d])
    wk, wq = factors_for(spec, torch.float64)
    assert list(wk.shape) == [c, d, heads * b * s] and list(wq.shape) == [heads * b, a, c * s]
    m = st.to_dense(spec, [wk, wq])
    wq5 = wq.reshape(heads, b, a, c, s)
    wk5 = wk.reshape(c, d, heads, b, s)
    want = torch.einsum("hbacs,cdhbs->habcd", wq5, wk5).reshape(heads * a * b, c * d)
    assert rel_err(m, want) < 1e-13


def test_monarch_and_kronecker_definitions():
    spec = st.monarch(16, 4)
    r, l = factors_for(spec, torch.float64)
    x = torch.eye(16, dtype=torch.float64)
    z = torch.einsum("kij,nki->nkj", r, x.reshape(16, 4, 4))             # blockdiag(R^T)
    z = z.transpose(1, 2)                                                # P
    w = torch.einsum("joi,nji->njo", l, z)                               # blockdiag(L)
    y = w.transpose(1, 2).reshape(16, 16)                                # P^T
    assert rel_err(st.to_dense(spec, [r, l]), y.T) < 1e-13
    spec = st.kronecker(3, 5, 4, 2)
    bt, a = factors_for(spec, torch.float64)
    assert rel_err(st.to_dense(spec, [bt, a]), torch.kron(a[0], bt[0].T.contiguous())) < 1e-13


def test_queries_follow_the_table():
    spec = st.btt(1024, 1024)
    assert spec.factor_shapes() == [[16, 64, 64], [64, 16, 16]]
    assert spec.params() == 1024 * (64 + 16)
    assert spec.flops(rows=2) == 2 * 2 * 1024 * (64 + 16)
    assert spec.rank() == 1024
    assert st.mlr(64, [4, 3, 2]).rank() == 4 + 3 * 2 + 2 * 4
    assert st.mlr(24, [8, 8], [1, 4]).plan() == [False, True]
    g = torch.Generator().manual_seed(3)
    for name in ("low_rank", "mlr_3lev", "btt_s2_heads2", "monarch", "kronecker"):
        s = SPECS[name]()
        m = st.to_dense(s, factors_for(s, torch.float64, seed=4))
        assert torch.linalg.matrix_rank(m).item() == s.rank(), name
    del g


def test_structured_linear_is_a_drop_in_for_linear():
    torch.manual_seed(0)
    model = torch.nn.Sequential(strata.StructuredLinear(st.btt(64, 64)), torch.nn.GELU(), torch.nn.Linear(64, 1))
    x, target = torch.randn(32, 64), torch.randn(32, 1)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        loss = torch.nn.functional.mse_loss(model(x), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
    layer = model[0]
    w = layer.dense_weight()
    assert rel_err(layer(x), x @ w.T + layer.bias) < 1e-5
    assert layer.to(torch.bfloat16)(x.bfloat16()).dtype == torch.bfloat16


def test_bad_input_names_the_argument():
    assert_raises_naming(RuntimeError, lambda: st.monarch(10, 3), "argument 'blocks'")
    assert_raises_naming(RuntimeError, lambda: st.monarch(10), "0 = sqrt(n) needs n a perfect square")
    assert_raises_naming(RuntimeError, lambda: st.mlr(16, [4, 0]), "argument 'ranks[1]'")
    assert_raises_naming(RuntimeError, lambda: st.block_diagonal(10, 10, 11), "argument 'blocks'")
    assert_raises_naming(RuntimeError, lambda: st.btt(64, 64, shape=[4, 4, 4, 8]),
                         "argument 'shape': expected a factorisation a * b * heads = out_features (64)")
    assert_raises_naming(RuntimeError, lambda: st.btt(64, 63, heads=2), "argument 'out_features'")
    assert_raises_naming(RuntimeError, lambda: st.btt(64, 64, factorize="square"), "argument 'factorize'")
    spec = st.mlr(16, [4, 4])
    assert_raises_naming(ValueError, lambda: st.StructuredSpec(spec.ints, alpha=[1.0]),
                         "argument 'alpha': expected one value per level (2)")
    assert_raises_naming(RuntimeError, lambda: torch.ops.strata.structured_linear(
        torch.zeros(2, 16), factors_for(spec, torch.float32), spec.ints, [1.0, 2.0, 3.0]), "argument 'alpha'")
    fs = factors_for(spec, torch.float32)
    assert_raises_naming(RuntimeError, lambda: st.structured_linear(torch.zeros(2, 15), spec, fs),
                         "argument 'x': expected a tensor (..., 16)")
    assert_raises_naming(RuntimeError, lambda: st.structured_linear(torch.zeros(2, 16), spec, fs[:3]),
                         "argument 'factors': expected 4 tensors")
    assert_raises_naming(RuntimeError, lambda: st.structured_linear(torch.zeros(2, 16, dtype=torch.int32), spec, fs),
                         "argument 'x'")
    assert_raises_naming(TypeError, lambda: st.structured_linear(torch.zeros(2, 16), "mlr", fs), "argument 'spec'")
    bad = list(spec.ints)
    bad[3] = 0
    assert_raises_naming(RuntimeError, lambda: st.StructuredSpec(bad), "argument 'spec.levels[0].inner'")


def test_kernels_alone_are_not_differentiable():
    spec = st.low_rank(8, 8, 2)
    x = torch.randn(4, 8, requires_grad=True)
    y = torch.ops.strata.structured_forward(x, factors_for(spec, torch.float32), spec.ints, spec.alpha)
    assert not y.requires_grad
