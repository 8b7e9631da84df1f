// tests/cpp/torch_monarch_test.cpp: the LibTorch layer of MonarchAttention (torch/monarch.cpp)
// and the low-rank baselines (torch/baselines.cpp).
//
// Monarch: the kernel behind the binding against the float64 reference (strata::reference) over
// lengths 1, 7, 97, 1025, block sizes 1 .. > N, steps 1..3, both paddings, masks, GQA, bhsd,
// strided views and bf16; autograd (fp32 kernel) against autograd of the float64 path (the
// reference); finite differences on the float64 path; the saved state; errors; the ops.
// Tolerances are the core test's (tests/cpp/core_monarch_test.cpp, justified there; the binding
// adds no arithmetic): fp32 forward 2e-5, fp32 gradients 1e-4 with a 1e-2 floor, bf16 1e-2;
// normwise: max |got - want| / max(max |want|, floor).
//
// Baselines: each against an independent float64 implementation written here from the formulas
// (loops over segments, exact exponentials), each against softmax attention where it must agree
// (Nystrom with one landmark per token; Performer with 20000 features, tolerance from the
// estimator's variance), padding invariance, reproducibility, finite differences, errors.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <gtest/gtest.h>
#include <torch/autograd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "torch_test_util.h"
#include "strata/error.h"
#include "strata/torch/baselines.h"
#include "strata/torch/monarch.h"

namespace {

namespace st = strata::torch;
using strata::detail::cat;
using strata::test::out_and_grads;
using strata::test::rel_err;

// Logical BSHD view of a tensor stored in `layout`.
at::Tensor as_bshd(const at::Tensor& t, const std::string& layout) { return layout == "bshd" ? t : t.transpose(1, 2); }

struct MonCase {
  int64_t b = 1, n = 7, hq = 2, hkv = 1, d = 16, dv = 16, block = 0, steps = 1;
  std::string pad = "post", mode = "stable", layout = "bshd";
  bool mask = false, strided = false, grads = true;
  at::ScalarType dtype = at::kFloat;
  std::string name() const {
    return cat("b", b, " n", n, " hq", hq, " hkv", hkv, " d", d, " dv", dv, " B", block, " T", steps, " ", pad, " ",
               mode, " ", layout, mask ? " mask" : "", strided ? " strided" : "", " ", c10::toString(dtype));
  }
};

// Random q, k, v of a case in its layout and dtype (strided: views into wider buffers, so no
// tensor is contiguous), and the mask (batch x seq bool, >= 1 token kept per sequence).
struct MonInputs {
  at::Tensor q, k, v, mask;
};
MonInputs make_inputs(const MonCase& c) {
  const auto make = [&](int64_t h, int64_t d) {
    const bool bshd = c.layout == "bshd";
    std::vector<int64_t> sz = bshd ? std::vector<int64_t>{c.b, c.n, h, d} : std::vector<int64_t>{c.b, h, c.n, d};
    if (!c.strided) return (at::rand(sz, at::kDouble) * 2 - 1).to(c.dtype);
    std::vector<int64_t> big = sz;
    big[3] = 2 * d + 3;
    return (at::rand(big, at::kDouble) * 2 - 1).to(c.dtype).narrow(3, 1, d);
  };
  MonInputs in{make(c.hq, c.d), make(c.hkv, c.d), make(c.hkv, c.dv), at::Tensor()};
  if (c.mask) {
    in.mask = at::rand({c.b, c.n}) > 0.3;
    in.mask.select(1, 0).fill_(true);
  }
  return in;
}

st::MonarchArgs args_of(const MonCase& c, const at::Tensor& mask) {
  st::MonarchArgs a;
  a.num_steps = c.steps;
  a.block_size = c.block;
  a.pad = st::parse_monarch_pad("args_of", c.pad);
  a.mode = st::parse_monarch_mode("args_of", c.mode);
  a.layout = c.layout;
  if (mask.defined()) a.key_padding_mask = mask;
  return a;
}

std::vector<MonCase> monarch_cases() {
  std::vector<MonCase> cs;
  // Lengths and block sizes (1, default floor(sqrt(N)), one that does not divide N, >= N).
  for (int64_t n : {1, 7, 97})
    for (int64_t block : {int64_t(1), int64_t(0), int64_t(5), n, n + 3})
      for (int64_t steps : {1, 2, 3}) {
        MonCase c;
        c.n = n;
        c.block = block;
        c.steps = steps;
        c.pad = steps == 2 ? "pre" : "post";
        c.mask = block == 5;
        cs.push_back(c);
      }
  MonCase big;  // one long sequence; forward only (the reference backward is O(N^2 D) per step)
  big.n = 1025;
  big.hq = 1;
  big.block = 32;
  big.steps = 2;
  big.mask = true;
  big.grads = false;
  cs.push_back(big);
  MonCase gqa;  // GQA 3:1, head_dim_v != head_dim, bhsd, strided, pre, reference mode
  gqa.b = 2;
  gqa.n = 41;
  gqa.hq = 6;
  gqa.hkv = 2;
  gqa.d = 24;
  gqa.dv = 8;
  gqa.block = 6;
  gqa.steps = 2;
  gqa.pad = "pre";
  gqa.layout = "bhsd";
  gqa.strided = true;
  gqa.mask = true;
  cs.push_back(gqa);
  MonCase ref = gqa;
  ref.mode = "reference";
  ref.layout = "bshd";
  cs.push_back(ref);
  for (const char* layout : {"bshd", "bhsd"}) {
    MonCase bf;  // bf16
    bf.b = 2;
    bf.n = 37;
    bf.hq = 4;
    bf.hkv = 2;
    bf.block = 6;
    bf.steps = 3;
    bf.mask = true;
    bf.layout = layout;
    bf.dtype = at::kBFloat16;
    cs.push_back(bf);
  }
  return cs;
}

TEST(TorchMonarch, KernelMatchesReference) {
  at::manual_seed(0);
  for (const MonCase& c : monarch_cases()) {
    SCOPED_TRACE(c.name());
    const MonInputs in = make_inputs(c);
    const st::MonarchArgs a = args_of(c, in.mask);
    const bool bf = c.dtype == at::kBFloat16;
    auto [out, state] = st::monarch_attention_forward(in.q, in.k, in.v, a);
    ASSERT_EQ(out.scalar_type(), c.dtype);
    ASSERT_EQ(as_bshd(out, c.layout).sizes(), (at::IntArrayRef{c.b, c.n, c.hq, c.dv}));
    const strata::MonarchGeometry g = strata::monarch_geometry(c.n, [&] {
      strata::MonarchOptions o;
      o.block_size = c.block;
      return o;
    }());
    ASSERT_EQ(state.sizes(), (at::IntArrayRef{c.b, c.hq, c.steps - 1, g.padded_len, c.d}));
    const at::Tensor want = st::reference_monarch_attention_forward(in.q, in.k, in.v, a);
    EXPECT_LE(rel_err(out, want), bf ? 1e-2 : 2e-5) << "out";
    if (!c.grads) continue;
    const at::Tensor g_out = at::rand_like(out.to(at::kFloat)).to(c.dtype);
    auto [rq, rk, rv] = st::reference_monarch_attention_backward(in.q, in.k, in.v, g_out, a);
    const double tol = bf ? 1e-2 : 1e-4;
    for (bool with_state : {true, false}) {
      SCOPED_TRACE(with_state ? "saved state" : "recomputed state");
      auto [dq, dk, dv] =
          st::monarch_attention_backward(in.q, in.k, in.v, with_state ? state : at::Tensor(), g_out, a);
      ASSERT_EQ(dq.sizes(), in.q.sizes());
      ASSERT_EQ(dk.sizes(), in.k.sizes());
      ASSERT_EQ(dv.sizes(), in.v.sizes());
      EXPECT_LE(rel_err(dq, rq, 1e-2), tol) << "dq";
      EXPECT_LE(rel_err(dk, rk, 1e-2), tol) << "dk";
      EXPECT_LE(rel_err(dv, rv, 1e-2), tol) << "dv";
    }
  }
}

TEST(TorchMonarch, AutogradFp32MatchesFloat64Reference) {
  at::manual_seed(1);
  MonCase c;
  c.b = 2;
  c.n = 23;
  c.hq = 4;
  c.hkv = 2;
  c.d = 12;
  c.dv = 20;
  c.block = 4;
  c.steps = 3;
  c.mask = true;
  const MonInputs in = make_inputs(c);
  const st::MonarchArgs a = args_of(c, in.mask);
  const at::Tensor g = at::rand({c.b, c.n, c.hq, c.dv}, at::kDouble);
  const auto fn = [&](const at::Tensor& x, const at::Tensor& y, const at::Tensor& z) {
    return st::monarch_attention(x, y, z, a);
  };
  const auto got = out_and_grads(fn, in.q, in.k, in.v, g);
  const auto want =
      out_and_grads(fn, in.q.to(at::kDouble), in.k.to(at::kDouble), in.v.to(at::kDouble), g);  // reference
  ASSERT_EQ(want[0].scalar_type(), at::kDouble);
  EXPECT_LE(rel_err(got[0], want[0]), 2e-5) << "out";
  const char* names[] = {"out", "dq", "dk", "dv"};
  for (int i = 1; i < 4; ++i) EXPECT_LE(rel_err(got[size_t(i)], want[size_t(i)], 1e-2), 1e-4) << names[i];
  // Stable mode: masked queries output zeros.
  const at::Tensor masked_rows = got[0].masked_select(in.mask.logical_not().view({c.b, c.n, 1, 1}));
  EXPECT_EQ(masked_rows.abs().max().item<double>(), 0.0);
}

// Inference (no grad needed) skips the saved state: the same output, bitwise, as the autograd path.
TEST(TorchMonarch, InferenceSkipsStateWithTheSameOutput) {
  at::manual_seed(3);
  MonCase c;
  c.n = 50;
  c.block = 7;
  c.steps = 3;
  const MonInputs in = make_inputs(c);
  const st::MonarchArgs a = args_of(c, in.mask);
  const auto [out_state, state] = st::monarch_attention_forward(in.q, in.k, in.v, a);
  const auto [out_plain, none] = st::monarch_attention_forward(in.q, in.k, in.v, a, /*save_state=*/false);
  EXPECT_TRUE(state.defined());
  EXPECT_FALSE(none.defined());
  EXPECT_TRUE(at::equal(out_state, out_plain));
  at::Tensor inference;
  {
    at::NoGradGuard no_grad;
    inference = st::monarch_attention(in.q.clone().requires_grad_(), in.k, in.v, a);
  }
  const at::Tensor training = st::monarch_attention(in.q.clone().requires_grad_(), in.k, in.v, a);
  EXPECT_FALSE(inference.requires_grad());
  EXPECT_TRUE(training.requires_grad());
  EXPECT_TRUE(at::equal(inference, training.detach()));
}

// The float64 path's gradients against central finite differences of its forward, along random
// directions (C++ has no gradcheck; tests/python/test_monarch.py runs torch.autograd.gradcheck).
// h = 1e-6: truncation ~h^2 |f'''| ~ 1e-12, cancellation ~1e-16 / h = 1e-10 relative.
template <class F>
void expect_directional_derivatives(F fn, const std::vector<at::Tensor>& inputs, double tol) {
  std::vector<at::Tensor> leaves;
  for (const at::Tensor& t : inputs) leaves.push_back(t.detach().clone().requires_grad_());
  const at::Tensor out = fn(leaves);
  const at::Tensor g = at::randn_like(out);
  const auto grads = torch::autograd::grad({out}, leaves, {g});
  for (int dir = 0; dir < 2; ++dir) {
    std::vector<at::Tensor> u, plus, minus;
    for (const at::Tensor& t : inputs) u.push_back(at::randn_like(t));
    const double h = 1e-6;
    for (size_t i = 0; i < inputs.size(); ++i) {
      plus.push_back(inputs[i] + h * u[i]);
      minus.push_back(inputs[i] - h * u[i]);
    }
    at::NoGradGuard ng;
    const at::Tensor diff = fn(plus) - fn(minus);
    const double fd = (diff * g).sum().item<double>() / (2 * h);
    double an = 0;
    for (size_t i = 0; i < inputs.size(); ++i) an += (grads[i] * u[i]).sum().item<double>();
    EXPECT_NEAR(an, fd, tol * std::max(1.0, std::fabs(fd))) << "direction " << dir;
  }
}

TEST(TorchMonarch, Float64PathMatchesFiniteDifferences) {
  at::manual_seed(2);
  for (const char* mode : {"stable", "reference"}) {
    SCOPED_TRACE(mode);
    MonCase c;
    c.n = 13;
    c.block = 4;
    c.steps = 2;
    c.mask = true;
    c.mode = mode;
    c.dtype = at::kDouble;
    const MonInputs in = make_inputs(c);
    const st::MonarchArgs a = args_of(c, in.mask);
    expect_directional_derivatives(
        [&](const std::vector<at::Tensor>& t) { return st::monarch_attention(t[0], t[1], t[2], a); },
        {in.q, in.k, in.v}, 1e-7);
  }
}

TEST(TorchMonarch, ExactCasesAreSoftmaxAttention) {
  // B = 1 and B >= N are softmax attention for every T (core header), here through the binding.
  at::manual_seed(3);
  const at::Tensor q = at::randn({2, 19, 3, 16}), k = at::randn({2, 19, 3, 16}), v = at::randn({2, 19, 3, 8});
  const at::Tensor want =
      at::scaled_dot_product_attention(q.transpose(1, 2).to(at::kDouble), k.transpose(1, 2).to(at::kDouble),
                                       v.transpose(1, 2).to(at::kDouble))
          .transpose(1, 2);
  for (int64_t block : {1, 19, 64})
    for (int64_t steps : {1, 3}) {
      st::MonarchArgs a;
      a.block_size = block;
      a.num_steps = steps;
      EXPECT_LE(rel_err(st::monarch_attention(q, k, v, a), want), 2e-5) << "B " << block << " T " << steps;
    }
}

TEST(TorchMonarch, DoubleBackwardRaises) {
  at::manual_seed(4);
  const at::Tensor q = at::randn({1, 9, 2, 8}).requires_grad_(), k = at::randn({1, 9, 2, 8}).requires_grad_(),
                   v = at::randn({1, 9, 2, 8}).requires_grad_();
  st::MonarchArgs a;
  a.block_size = 3;
  const at::Tensor out = st::monarch_attention(q, k, v, a);
  const auto g = torch::autograd::grad({out.square().sum()}, {q}, {}, /*retain_graph=*/true, /*create_graph=*/true);
  EXPECT_THROW(torch::autograd::grad({g[0].sum()}, {k}), c10::Error);
}

// Runs f, expects a strata::Error whose message contains every piece of `want`.
template <class F>
void expect_error(F f, std::initializer_list<const char*> want) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning " << *want.begin();
  } catch (const strata::Error& e) {
    for (const char* w : want) EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << e.what();
  }
}

// The compute option (MonarchArgs::compute, strata/cpu.h) through the binding. "auto" and "fp32"
// run the same fp32 products (Monarch's auto keeps fp32: strata/monarch.h), so their outputs and
// gradients are the same bits, and the ops' forward / backward give the autograd Function's bits.
// Each bf16 engine this CPU has runs the forward's products and the backward's gradient products:
// its output and gradients differ from fp32's (the option reached both kernels) and hold the core
// sweep's bf16-products tolerances against the float64 reference (2e-2, gradients with a 1e-2
// floor: MonarchBf16ComputeSweep, core_monarch_test.cpp), and its autograd backward is the
// backward op's, bit for bit. A name that is no engine is an error naming 'compute', on the kernel
// path and on the torch-ops path (meta tensors).
TEST(TorchMonarch, Bfloat16ComputeOption) {
  at::manual_seed(9);
  MonCase c;
  c.b = 2;
  c.n = 37;
  c.hq = 4;
  c.hkv = 2;
  c.block = 6;
  c.steps = 2;
  c.mask = true;
  c.dtype = at::kBFloat16;
  const MonInputs in = make_inputs(c);
  st::MonarchArgs a = args_of(c, in.mask);
  const at::Tensor g = at::randn({c.b, c.n, c.hq, c.dv}).to(at::kBFloat16);
  const char* names[] = {"out", "dq", "dk", "dv"};
  // autograd's out and gradients with `compute`, and the same from the ops alone.
  const auto run = [&](const std::string& compute) {
    a.compute = compute;
    const auto got = out_and_grads(
        [&](const at::Tensor& x, const at::Tensor& y, const at::Tensor& z) { return st::monarch_attention(x, y, z, a); },
        in.q, in.k, in.v, g);
    auto [out, state] = st::monarch_attention_forward(in.q, in.k, in.v, a);
    auto [dq, dk, dv] = st::monarch_attention_backward(in.q, in.k, in.v, state, g, a);
    const at::Tensor ops[] = {out, dq, dk, dv};
    for (int i = 0; i < 4; ++i)
      EXPECT_TRUE(at::equal(got[size_t(i)], ops[i])) << compute << ": " << names[i] << " differs from the ops'";
    return got;
  };
  const auto fp32 = run("fp32");
  const auto autos = run("auto");
  for (int i = 0; i < 4; ++i)
    EXPECT_TRUE(at::equal(fp32[size_t(i)], autos[size_t(i)])) << "auto vs fp32: " << names[i];
  a.compute = "auto";
  const at::Tensor want = st::reference_monarch_attention_forward(in.q, in.k, in.v, a);
  const auto [rq, rk, rv] = st::reference_monarch_attention_backward(in.q, in.k, in.v, g, a);
  EXPECT_LE(rel_err(fp32[0], want), 1e-2) << "fp32 products: out";
  int engines = 0;
  for (const char* engine : {"avx512_bf16", "amx_bf16"}) {
    try {
      strata::resolve_compute("test", strata::parse_compute("test", engine), /*bf16_inputs=*/true);
    } catch (const strata::Error&) {
      continue;  // not on this CPU
    }
    ++engines;
    SCOPED_TRACE(engine);
    const auto got = run(engine);
    for (int i = 0; i < 4; ++i)
      EXPECT_FALSE(at::equal(got[size_t(i)], fp32[size_t(i)])) << "fp32 products' " << names[i] << ": no engine ran";
    EXPECT_LE(rel_err(got[0], want), 2e-2) << "out";
    EXPECT_LE(rel_err(got[1], rq, 1e-2), 2e-2) << "dq";
    EXPECT_LE(rel_err(got[2], rk, 1e-2), 2e-2) << "dk";
    EXPECT_LE(rel_err(got[3], rv, 1e-2), 2e-2) << "dv";
  }
  std::printf("TorchMonarch.Bfloat16ComputeOption: %d bf16 engine(s) on this CPU\n", engines);
  a.compute = "bf16";
  expect_error([&] { st::monarch_attention_forward(in.q, in.k, in.v, a); },
               {"monarch_attention_forward", "'compute'", "amx_bf16", "bf16"});
  expect_error([&] { st::monarch_attention(in.q, in.k, in.v, a); }, {"monarch_attention_forward", "'compute'"});
  a.key_padding_mask.reset();  // the torch-ops path takes no mask; compute is checked before anything runs
  expect_error([&] { st::monarch_attention(in.q.to(at::kMeta), in.k.to(at::kMeta), in.v.to(at::kMeta), a); },
               {"monarch_attention", "'compute'"});
}

TEST(TorchMonarch, ErrorsNameTheArgument) {
  const at::Tensor q = at::randn({2, 10, 4, 8}), k = at::randn({2, 10, 2, 8}), v = at::randn({2, 10, 2, 8});
  const auto fwd = [&](st::MonarchArgs a) { return [=] { st::monarch_attention_forward(q, k, v, a); }; };
  // pad and mode: by name where the op schema and Python pass them; as enums, the core's check.
  expect_error([] { st::parse_monarch_pad("monarch_attention_forward", "middle"); },
               {"monarch_attention_forward", "'pad'", "\"middle\""});
  expect_error([] { st::parse_monarch_mode("monarch_attention_forward", "fast"); }, {"'mode'", "\"fast\""});
  st::MonarchArgs a;
  a.pad = strata::MonarchPad(7);
  expect_error(fwd(a), {"monarch_attention_forward", "'pad'"});
  a = {};
  a.mode = strata::MonarchMode(7);
  expect_error(fwd(a), {"'mode'"});
  a = {};
  a.layout = "sbhd";
  expect_error(fwd(a), {"'layout'"});
  a = {};
  a.num_steps = 0;
  expect_error(fwd(a), {"'num_steps'", ">= 1"});
  a = {};
  a.block_size = -2;
  expect_error(fwd(a), {"'block_size'"});
  a = {};
  a.scale = std::numeric_limits<double>::infinity();
  expect_error(fwd(a), {"'scale'"});
  a = {};
  a.key_padding_mask = at::ones({2, 9}, at::kBool);
  expect_error(fwd(a), {"'key_padding_mask'", "[2, 10]"});
  expect_error([&] { st::monarch_attention_forward(q, at::randn({2, 12, 2, 8}), at::randn({2, 12, 2, 8}), {}); },
               {"'k'", "self-attention only"});
  expect_error([&] { st::monarch_attention_forward(q, at::randn({2, 10, 3, 8}), at::randn({2, 10, 3, 8}), {}); },
               {"'k'", "heads dividing"});
  expect_error([&] { st::monarch_attention_forward(q.to(at::kDouble), k, v, {}); }, {"'q'", "float32 or bfloat16"});
  expect_error([&] { st::monarch_attention_forward(q, k.to(at::kBFloat16), v, {}); }, {"'k'", "dtype"});
  expect_error([&] { st::monarch_attention_forward(q.flatten(2), k, v, {}); }, {"'q'", "4-D"});
  a = {};
  a.num_steps = 2;
  const at::Tensor g = at::randn({2, 10, 4, 8});
  expect_error([&] { st::monarch_attention_backward(q, k, v, at::zeros({2, 4, 1, 9, 8}), g, a); }, {"'state'"});
  expect_error([&] { st::monarch_attention_backward(q, k, v, at::Tensor(), g.narrow(1, 0, 9), a); }, {"'dout'"});
  expect_error([&] { st::reference_monarch_attention_forward(q, k.to(at::kDouble), v, {}); }, {"'k'", "same as q"});
  expect_error([&] { st::monarch_attention_flops(10, 1, 8, 8, 0, 3); }, {"'T'"});
}

TEST(TorchMonarch, OpsCallableThroughDispatcher) {
  at::manual_seed(5);
  const at::Tensor q = at::randn({1, 12, 2, 8}), k = at::randn({1, 12, 2, 8}), v = at::randn({1, 12, 2, 8});
  const at::Tensor mask = at::rand({1, 12}) > 0.2;
  using Fwd = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t,
                                                 int64_t, c10::string_view, c10::string_view, std::optional<double>,
                                                 const std::optional<at::Tensor>&, c10::string_view, c10::string_view,
                                                 bool);
  auto& disp = c10::Dispatcher::singleton();
  const auto fwd = disp.findSchemaOrThrow("strata::monarch_attention_forward", "").typed<Fwd>();
  auto [out, state] = fwd.call(q, k, v, 2, 4, "pre", "stable", 0.4, mask, "bshd", "auto", /*save_state=*/true);
  // Without save_state: the same out and a 0-element state (inference needs none).
  auto [out_only, no_state] = fwd.call(q, k, v, 2, 4, "pre", "stable", 0.4, mask, "bshd", "auto", /*save_state=*/false);
  EXPECT_TRUE(at::equal(out_only, out));
  EXPECT_EQ(no_state.numel(), 0);
  st::MonarchArgs a;
  a.num_steps = 2;
  a.block_size = 4;
  a.pad = strata::MonarchPad::pre;
  a.scale = 0.4;
  a.key_padding_mask = mask;
  EXPECT_TRUE(at::equal(out, std::get<0>(st::monarch_attention_forward(q, k, v, a))));
  using Bwd = std::tuple<at::Tensor, at::Tensor, at::Tensor>(
      const at::Tensor&, const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, const at::Tensor&,
      int64_t, int64_t, c10::string_view, c10::string_view, std::optional<double>, const std::optional<at::Tensor>&,
      c10::string_view, c10::string_view);
  const auto bwd = disp.findSchemaOrThrow("strata::monarch_attention_backward", "").typed<Bwd>();
  auto [dq, dk, dv] = bwd.call(q, k, v, state, at::ones_like(out), 2, 4, "pre", "stable", 0.4, mask, "bshd", "auto");
  auto [eq, ek, ev] = st::monarch_attention_backward(q, k, v, state, at::ones_like(out), a);
  EXPECT_TRUE(at::equal(dq, eq) && at::equal(dk, ek) && at::equal(dv, ev));
  for (const char* name : {"strata::monarch_attention", "strata::performer_attention", "strata::nystrom_attention",
                           "strata::monarch_attention_flops", "strata::softmax_attention_flops",
                           "strata::performer_attention_flops", "strata::nystrom_attention_flops"})
    EXPECT_NO_THROW(disp.findSchemaOrThrow(name, "")) << name;
  try {  // a strata::Error arrives as a c10::Error with the same message
    fwd.call(q, k, v, 0, 4, "pre", "stable", std::nullopt, std::nullopt, "bshd", "auto", true);
    ADD_FAILURE() << "no error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("argument 'num_steps'"), std::string::npos) << e.what();
  }
  try {  // pad / mode names become enums at the op, with the op's name in the error
    bwd.call(q, k, v, state, at::ones_like(out), 2, 4, "pre", "fast", 0.4, mask, "bshd", "auto");
    ADD_FAILURE() << "no error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("monarch_attention_backward: argument 'mode'"), std::string::npos)
        << e.what();
  }
}

TEST(TorchMonarch, FlopsFollowThePaper) {
  // ViT-B/16 (design page section 6): N = 197, B = 14, pre-pad, D = 64, 12 heads x 12 layers;
  // the paper's plotted MACs 1.39e8 (T=1), 2.52e8 (T=2), 3.64e8 (T=3), softmax 7.15e8.
  const double macs[3] = {1.39e8, 2.52e8, 3.64e8};
  for (int64_t t = 1; t <= 3; ++t) {
    const double f = 12 * st::monarch_attention_flops(197, 12, 64, 64, t, 14);
    EXPECT_NEAR(f / 2, macs[t - 1], 0.01e8) << "T " << t;
    EXPECT_EQ(f / 2, 12.0 * 12 * 210 * 64 * (t * (2 * 14 + 2 * 15) + 14)) << "P*D*[T(2B+2M)+B]";
  }
  EXPECT_NEAR(12 * 12 * st::softmax_attention_flops(197, 64) / 2, 7.15e8, 0.01e8);
  // Dv != D: the last step's y and output products use Dv (P = 12, B = 3, M = 4, T = 2).
  EXPECT_EQ(st::monarch_attention_flops(12, 1, 8, 5, 2, 3), 2.0 * 12 * (8 * ((2 * 3 + 2 * 4) + 2 * 3 + 4) + 5 * 7));
  // B = 0: floor(sqrt(N)); B > N: one block of N.
  EXPECT_EQ(st::monarch_attention_flops(50, 2, 8, 8, 1, 0), st::monarch_attention_flops(50, 2, 8, 8, 1, 7));
  EXPECT_EQ(st::monarch_attention_flops(50, 2, 8, 8, 1, 80), st::monarch_attention_flops(50, 2, 8, 8, 1, 50));
  EXPECT_EQ(st::monarch_attention_flops(0, 2, 8, 8, 1, 0), 0.0);
  EXPECT_EQ(st::performer_attention_flops(100, 16, 8, 32), 2.0 * 100 * 32 * (32 + 16 + 1));
  EXPECT_EQ(st::nystrom_attention_flops(100, 16, 8, 10, 6), 2.0 * (2 * 100 * 10 * 24 + 100 * 24 + 36 * 1000));
  EXPECT_EQ(st::nystrom_attention_flops(5, 16, 16, 10, 6), st::nystrom_attention_flops(5, 16, 16, 5, 6));
}

// ---- baselines ------------------------------------------------------------------------------------

// float64 masked softmax attention of BHSD tensors (mask: batch x seq bool over keys).
at::Tensor softmax_bhsd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                        double scale) {
  at::Tensor s = at::matmul(q, k.transpose(-2, -1)) * scale;
  if (mask.defined())
    s = s.masked_fill(mask.logical_not().view({mask.size(0), 1, 1, mask.size(1)}),
                      -std::numeric_limits<double>::infinity());
  return at::matmul(at::softmax(s, -1), v);
}

// Naive float64 Performer from the header's formulas, BSHD in and out; omega D x r; mask may be
// undefined. No shifts: exp of the raw exponents (fine for the small inputs used here).
at::Tensor naive_performer(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& omega,
                           const at::Tensor& mask) {
  const int64_t B = q.size(0), N = q.size(1), Hq = q.size(2), Hkv = k.size(2), D = q.size(3), r = omega.size(1);
  const double c = std::pow(double(D), -0.25);
  at::Tensor out = at::zeros({B, N, Hq, v.size(3)}, at::kDouble);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t hk = h / (Hq / Hkv);
      const at::Tensor x = q.select(0, b).select(1, h).to(at::kDouble) * c;   // N x D
      const at::Tensor y = k.select(0, b).select(1, hk).to(at::kDouble) * c;  // N x D
      const at::Tensor vv = v.select(0, b).select(1, hk).to(at::kDouble);     // N x Dv
      const at::Tensor px = at::exp(at::mm(x, omega) - (x * x).sum(1, true) / 2) / std::sqrt(double(r));
      at::Tensor py = at::exp(at::mm(y, omega) - (y * y).sum(1, true) / 2) / std::sqrt(double(r));
      at::Tensor keep = at::ones({N}, at::kDouble);
      if (mask.defined()) keep = mask.select(0, b).to(at::kDouble);
      py = py * keep.unsqueeze(1);
      const at::Tensor kern = at::mm(px, py.t());  // N x N: phi(x_n).phi(y_m)
      const at::Tensor o = at::mm(kern, vv) / kern.sum(1, true);
      out.select(0, b).select(1, h).copy_(o * keep.unsqueeze(1));
    }
  return out;
}

TEST(TorchPerformer, MatchesNaiveFloat64Implementation) {
  at::manual_seed(10);
  for (const auto dtype : {at::kDouble, at::kFloat}) {
    const at::Tensor q = at::randn({2, 21, 4, 8}, dtype) * 0.5, k = at::randn({2, 21, 2, 8}, dtype) * 0.5,
                     v = at::randn({2, 21, 2, 6}, dtype);
    at::Tensor mask = at::rand({2, 21}) > 0.3;
    mask.select(1, 0).fill_(true);
    const at::Tensor omega = st::performer_omega(8, 40, 123);
    const at::Tensor want = naive_performer(q, k, v, omega, mask);
    const at::Tensor got = st::performer_attention(q, k, v, 40, 123, mask);
    ASSERT_EQ(got.scalar_type(), dtype);
    // float64: only the order of operations differs; float32: exp of exponents of size ~3 and two
    // matmuls over 21 keys / 40 features: ~10 ulps.
    EXPECT_LE(rel_err(got, want), dtype == at::kDouble ? 1e-12 : 1e-5) << c10::toString(dtype);
    // bhsd layout: same numbers.
    const at::Tensor got_h = st::performer_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), 40,
                                                     123, mask, std::nullopt, "bhsd");
    EXPECT_LE(rel_err(got_h.transpose(1, 2), want), dtype == at::kDouble ? 1e-12 : 1e-5);
  }
}

TEST(TorchPerformer, SeedMakesItReproducible) {
  // The features are bitwise reproducible; outputs are not (the first call of a process was seen
  // 2.5e-5 off later ones, tests/cpp/encoder_convert_test.cpp): bound 1e-4, while other features
  // move the output by O(1).
  const auto close = [](const at::Tensor& a, const at::Tensor& b) {
    return (a - b).abs().max().item<double>() <= 1e-4 * std::max(1.0, b.abs().max().item<double>());
  };
  EXPECT_TRUE(at::equal(st::performer_omega(8, 64, 7), st::performer_omega(8, 64, 7))) << "same seed, same features";
  EXPECT_FALSE(at::equal(st::performer_omega(8, 64, 7), st::performer_omega(8, 64, 8)));
  at::manual_seed(11);
  const at::Tensor q = at::randn({1, 16, 2, 8}), k = at::randn({1, 16, 2, 8}), v = at::randn({1, 16, 2, 8});
  const at::Tensor a = st::performer_attention(q, k, v, 64, 7), b = st::performer_attention(q, k, v, 64, 7);
  EXPECT_TRUE(close(a, b)) << "same seed, same output";
  EXPECT_FALSE(close(a, st::performer_attention(q, k, v, 64, 8))) << "another seed, other features";
  EXPECT_FALSE(close(st::performer_attention(q, k, v, 64), st::performer_attention(q, k, v, 64)))
      << "no seed: redrawn on every call";
  at::manual_seed(99);
  const at::Tensor c = st::performer_attention(q, k, v, 64);
  at::manual_seed(99);
  EXPECT_TRUE(close(c, st::performer_attention(q, k, v, 64))) << "no seed: ATen's default generator";
}

TEST(TorchPerformer, ManyFeaturesApproachSoftmaxWithinTheEstimatorsSpread) {
  // Per query x (scaled by D^-1/4) and keys y_m: the output error is
  //   o^ - o = sum_m w^_m (v_m - o) / sum_m w^_m ~ U / W,  U = mean over r features of
  //   U_j = sum_m xi_j(y_m) (v_m - o),  xi_j(y) = exp(omega_j.(x + y) - |x|^2/2 - |y|^2/2),
  // with E[U_j] = 0, W = sum_m exp(x.y_m), and (Gaussian moment generating function)
  //   E[xi(y) xi(y')] = exp(|x|^2 + 2 x.y + 2 x.y' + y.y'),
  // so sd(o^ - o) = sqrt(exp(|x|^2) b^T G b / r) / W with b_m = (v_m - o) exp(2 x.y_m) and
  // G = [exp(y_m.y_m')], computed exactly below (float64). U is a mean of r = 20000 iid terms
  // (central limit): every entry must lie within 6 standard deviations (the ratio's O(1/r) bias,
  // ~sd^2, is far inside); a wrong scale, feature map or normalisation is off by many.
  at::manual_seed(12);
  const int64_t N = 32, D = 8, Dv = 4, r = 20000;
  const at::Tensor q = at::randn({1, N, 1, D}, at::kDouble) * 0.7, k = at::randn({1, N, 1, D}, at::kDouble) * 0.7,
                   v = at::randn({1, N, 1, Dv}, at::kDouble);
  const at::Tensor got = st::performer_attention(q, k, v, r, 2024).select(2, 0).select(0, 0);  // N x Dv
  const double c = std::pow(double(D), -0.25);
  const at::Tensor x = q.select(2, 0).select(0, 0) * c, y = k.select(2, 0).select(0, 0) * c, vv = v[0].select(1, 0);
  const at::Tensor w = at::exp(at::mm(x, y.t()));                   // N x N: exp(x_n.y_m)
  const at::Tensor o = at::mm(w, vv) / w.sum(1, true);              // softmax attention
  const at::Tensor G = at::exp(at::mm(y, y.t()));                   // exp(y_m.y_m')
  at::Tensor sd = at::empty({N, Dv}, at::kDouble);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t d = 0; d < Dv; ++d) {
      const at::Tensor b = (vv.select(1, d) - o[n][d]) * at::exp(2 * at::mv(y, x[n]));
      const double var = std::exp((x[n] * x[n]).sum().item<double>()) * at::dot(b, at::mv(G, b)).item<double>();
      sd[n][d] = std::sqrt(var / double(r)) / w[n].sum().item<double>();
    }
  const at::Tensor err = (got - o).abs();
  EXPECT_TRUE((err <= 6 * sd).all().item<bool>())
      << "max err / sd " << (err / sd).max().item<double>() << ", max sd " << sd.max().item<double>();
  std::printf("performer r=%lld: max |err| / sd = %.2f, max sd = %.2e, max |err| = %.2e\n", (long long)r,
              (err / sd).max().item<double>(), sd.max().item<double>(), err.max().item<double>());
  // The check has teeth: uniform attention (no logits) and a Performer with doubled logits (a
  // scaling bug) are far outside the band.
  const at::Tensor uniform = vv.mean(0, true).expand({N, Dv});
  EXPECT_GT(((uniform - o).abs() / sd).max().item<double>(), 18.0);
  const at::Tensor doubled =
      st::performer_attention(q, k, v, r, 2024, std::nullopt, 2 / std::sqrt(double(D))).select(2, 0).select(0, 0);
  EXPECT_GT(((doubled - o).abs() / sd).max().item<double>(), 18.0);
}

// Naive float64 Nystromformer from the header's formulas: landmarks by explicit loops over the
// valid tokens, the pseudo-inverse by the same iteration written per matrix (or at::linalg_pinv
// when exact_pinv). BSHD in and out; mask may be undefined.
at::Tensor naive_nystrom(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t landmarks,
                         int64_t iters, const at::Tensor& mask, bool exact_pinv = false) {
  const int64_t B = q.size(0), N = q.size(1), Hq = q.size(2), Hkv = k.size(2), D = q.size(3);
  const double s = 1.0 / std::sqrt(double(D));
  at::Tensor out = at::zeros({B, N, Hq, v.size(3)}, at::kDouble);
  for (int64_t b = 0; b < B; ++b) {
    std::vector<int64_t> idx;  // valid tokens, in order
    for (int64_t n = 0; n < N; ++n)
      if (!mask.defined() || mask[b][n].item<bool>()) idx.push_back(n);
    const int64_t nv = int64_t(idx.size()), m = std::min(landmarks, nv);
    if (nv == 0) continue;
    std::vector<std::vector<int64_t>> segs(size_t(std::min(landmarks, N)));
    for (int64_t r = 0; r < nv; ++r) segs[size_t(r * int64_t(segs.size()) / nv)].push_back(idx[size_t(r)]);
    std::vector<std::vector<int64_t>> nonempty;
    for (auto& sg : segs)
      if (!sg.empty()) nonempty.push_back(sg);
    EXPECT_EQ(int64_t(nonempty.size()), m);
    const at::Tensor idx_t = at::tensor(idx, at::kLong);
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t hk = h / (Hq / Hkv);
      const at::Tensor qq = q.select(0, b).select(1, h).to(at::kDouble), kk = k.select(0, b).select(1, hk).to(at::kDouble),
                       vv = v.select(0, b).select(1, hk).to(at::kDouble);
      at::Tensor ql = at::zeros({m, D}, at::kDouble), kl = at::zeros({m, D}, at::kDouble);
      for (int64_t j = 0; j < m; ++j) {
        const at::Tensor sj = at::tensor(nonempty[size_t(j)], at::kLong);
        ql[j] = qq.index_select(0, sj).mean(0);
        kl[j] = kk.index_select(0, sj).mean(0);
      }
      const at::Tensor kv = kk.index_select(0, idx_t), vvv = vv.index_select(0, idx_t);
      const at::Tensor F = at::softmax(at::mm(qq, kl.t()) * s, 1), A = at::softmax(at::mm(ql, kl.t()) * s, 1),
                       Bm = at::softmax(at::mm(ql, kv.t()) * s, 1);
      at::Tensor Z;
      if (exact_pinv) {
        Z = at::linalg_pinv(A);
      } else {
        const at::Tensor I = at::eye(m, at::kDouble);
        Z = A.t() / (A.abs().sum(0).max() * A.abs().sum(1).max());
        for (int64_t it = 0; it < iters; ++it) {
          const at::Tensor AZ = at::mm(A, Z);
          Z = 0.25 * at::mm(Z, 13 * I - at::mm(AZ, 15 * I - at::mm(AZ, 7 * I - AZ)));
        }
      }
      at::Tensor o = at::mm(F, at::mm(Z, at::mm(Bm, vvv)));
      for (int64_t n = 0; n < N; ++n)
        if (mask.defined() && !mask[b][n].item<bool>()) o[n].zero_();
      out.select(0, b).select(1, h).copy_(o);
    }
  }
  return out;
}

TEST(TorchNystrom, MatchesNaiveFloat64Implementation) {
  at::manual_seed(20);
  // N not a multiple of the landmarks, a mask, GQA, and landmarks > valid tokens (empty segments).
  const at::Tensor q = at::randn({3, 23, 4, 8}, at::kDouble), k = at::randn({3, 23, 2, 8}, at::kDouble),
                   v = at::randn({3, 23, 2, 5}, at::kDouble);
  at::Tensor mask = at::rand({3, 23}) > 0.3;
  mask.select(1, 0).fill_(true);
  mask[2].fill_(false);
  mask[2].narrow(0, 3, 4).fill_(true);  // sequence 2: 4 valid tokens < 5 landmarks
  for (const bool with_mask : {false, true})
    for (int64_t m : {5, 7}) {
      SCOPED_TRACE(cat("landmarks ", m, with_mask ? " mask" : ""));
      const at::Tensor mk = with_mask ? mask : at::Tensor();
      const at::Tensor want = naive_nystrom(q, k, v, m, 6, mk);
      std::optional<at::Tensor> om;
      if (with_mask) om = mask;
      // float64: the same operations in another order; the iteration multiplies by 7, 15, 13 and
      // m x m products, so allow 1e-10 relative.
      EXPECT_LE(rel_err(st::nystrom_attention(q, k, v, m, 6, om), want), 1e-10);
      // float32: rounding of three softmaxes and 6 x 6 m x m products whose factors (7, 15, 13)
      // cost a few bits; the iteration leaves A's tiny singular values unconverged (regularised),
      // so they do not amplify it. Measured <= 1.1e-6; 2e-5 is an 18x margin.
      EXPECT_LE(rel_err(st::nystrom_attention(q.to(at::kFloat), k.to(at::kFloat), v.to(at::kFloat), m, 6, om), want),
                2e-5);
    }
}

TEST(TorchNystrom, ConvergedIterationIsThePseudoInverse) {
  // With well-separated landmarks (q, k large, so A is far from singular) and enough iterations,
  // the iterative inverse is pinv(A) (at::linalg_pinv, SVD-based) to float64 precision.
  at::manual_seed(21);
  const at::Tensor q = at::randn({1, 40, 2, 8}, at::kDouble) * 3, k = q.clone(), v = at::randn({1, 40, 2, 8}, at::kDouble);
  const at::Tensor want = naive_nystrom(q, k, v, 8, 0, at::Tensor(), /*exact_pinv=*/true);
  EXPECT_LE(rel_err(st::nystrom_attention(q, k, v, 8, 40), want), 1e-9);
}

// Bound on max |nystrom - softmax| with one landmark per token (F = A = B = S, out = S Z S V):
// S Z S - S = -R S with R = I - S Z, which shares S's left singular vectors; along singular value
// sigma_i its eigenvalue starts at r0 = 1 - sigma_i^2 / c (c = Z0's scale) and each iteration maps
// r -> r^3 (3 + r) / 4. So |out - S V| <= max_i(r_i sigma_i) * ||V||_2 (spectral norm).
double pinv_error_bound(const at::Tensor& S, const at::Tensor& V, int64_t iters) {
  const double c = (S.abs().sum(0).max() * S.abs().sum(1).max()).item<double>();
  const at::Tensor sig = at::linalg_svdvals(S);
  double worst = 0;
  for (int64_t i = 0; i < sig.size(0); ++i) {
    const double s = sig[i].item<double>();
    double r = 1 - s * s / c;
    for (int64_t t = 0; t < iters; ++t) r = r * r * r * (3 + r) / 4;
    worst = std::max(worst, r * s);
  }
  return worst * at::linalg_matrix_norm(V, 2).item<double>();
}

TEST(TorchNystrom, OneLandmarkPerTokenIsSoftmaxUpToThePinvError) {
  at::manual_seed(22);
  const int64_t N = 24, D = 16;
  // q = k with |q|^2 / sqrt(D) ~ 6 well above the cross logits (~N(0, 1.4)): S is diagonally
  // dominant and well conditioned, so after 6 iterations the bound is ~1e-20: the output must be
  // softmax attention to rounding: float64 1e-10 (6 iterations x 6 products of length 24 with
  // factors up to 15, and S's condition number ~10: ~1e-13 per product, measured up to 2.5e-11 on
  // other draws); float32 1e-5 (the same in fp32 rounding).
  const at::Tensor q = at::randn({1, N, 1, D}, at::kDouble) * 1.2, v = at::randn({1, N, 1, 8}, at::kDouble);
  const at::Tensor qh = q.transpose(1, 2), vh = v.transpose(1, 2);
  const at::Tensor S = at::softmax(at::mm(qh[0][0], qh[0][0].t()) / std::sqrt(double(D)), 1);
  const double bound = pinv_error_bound(S, vh[0][0], 6);
  ASSERT_LT(bound, 1e-12) << "test data should make the iteration converge";
  const at::Tensor want = softmax_bhsd(qh, qh, vh, at::Tensor(), 1 / std::sqrt(double(D))).transpose(1, 2);
  EXPECT_LE(rel_err(st::nystrom_attention(q, q, v, N, 6), want), 1e-10);
  EXPECT_LE(rel_err(st::nystrom_attention(q.to(at::kFloat), q.to(at::kFloat), v.to(at::kFloat), N, 6), want), 1e-5);
  // landmarks > N clamps to N: the same computation.
  EXPECT_TRUE(at::equal(st::nystrom_attention(q, q, v, N + 5, 6), st::nystrom_attention(q, q, v, N, 6)));

  // Generic random q, k: S is worse conditioned and the iteration has not converged along small
  // singular values; the error still obeys the bound (float64, + 1e-12 rounding).
  const at::Tensor q2 = at::randn({1, N, 1, D}, at::kDouble), k2 = at::randn({1, N, 1, D}, at::kDouble);
  const at::Tensor S2 = at::softmax(at::mm(q2[0].select(1, 0), k2[0].select(1, 0).t()) / 4.0, 1);
  const at::Tensor want2 = softmax_bhsd(q2.transpose(1, 2), k2.transpose(1, 2), vh, at::Tensor(), 0.25).transpose(1, 2);
  const double err2 = (st::nystrom_attention(q2, k2, v, N, 6) - want2).abs().max().item<double>();
  EXPECT_LE(err2, pinv_error_bound(S2, vh[0][0], 6) + 1e-12);

  // With a mask: landmarks = N > valid tokens; the empty landmarks drop out and the valid rows are
  // masked softmax attention (padding invariance, below, is the general statement).
  at::Tensor mask = at::ones({1, N}, at::kBool);
  mask.narrow(1, 17, N - 17).fill_(false);
  const at::Tensor got = st::nystrom_attention(q, q, v, N, 6, mask);
  const at::Tensor wantm = softmax_bhsd(qh, qh, vh, mask, 1 / std::sqrt(double(D))).transpose(1, 2);
  EXPECT_LE(rel_err(got.narrow(1, 0, 17), wantm.narrow(1, 0, 17)), 1e-10);
  EXPECT_EQ(got.narrow(1, 17, N - 17).abs().max().item<double>(), 0.0) << "masked queries output zeros";
}

TEST(TorchBaselines, PaddedBatchEqualsEachSequenceAlone) {
  at::manual_seed(30);
  const int64_t N = 19;
  const at::Tensor q = at::randn({2, N, 2, 8}, at::kDouble), k = at::randn({2, N, 2, 8}, at::kDouble),
                   v = at::randn({2, N, 2, 8}, at::kDouble);
  at::Tensor mask = at::ones({2, N}, at::kBool);
  mask[1].narrow(0, 11, N - 11).fill_(false);  // sequence 1 has 11 tokens, then padding
  const auto q1 = q.narrow(0, 1, 1).narrow(1, 0, 11), k1 = k.narrow(0, 1, 1).narrow(1, 0, 11),
             v1 = v.narrow(0, 1, 1).narrow(1, 0, 11);
  const at::Tensor ny = st::nystrom_attention(q, k, v, 4, 6, mask), ny1 = st::nystrom_attention(q1, k1, v1, 4, 6);
  EXPECT_LE(rel_err(ny.narrow(0, 1, 1).narrow(1, 0, 11), ny1), 1e-12) << "nystrom";
  EXPECT_LE(rel_err(ny.narrow(0, 0, 1), st::nystrom_attention(q.narrow(0, 0, 1), k.narrow(0, 0, 1), v.narrow(0, 0, 1), 4, 6)),
            1e-12)
      << "nystrom: a sequence does not depend on the others";
  const at::Tensor pf = st::performer_attention(q, k, v, 16, 3, mask), pf1 = st::performer_attention(q1, k1, v1, 16, 3);
  EXPECT_LE(rel_err(pf.narrow(0, 1, 1).narrow(1, 0, 11), pf1), 1e-12) << "performer";
  // Fully masked sequences output zeros, never NaN.
  const at::Tensor none = at::zeros({2, N}, at::kBool);
  EXPECT_EQ(st::nystrom_attention(q, k, v, 4, 6, none).abs().max().item<double>(), 0.0);
  EXPECT_EQ(st::performer_attention(q, k, v, 16, 3, none).abs().max().item<double>(), 0.0);
}

TEST(TorchBaselines, AutogradMatchesFiniteDifferences) {
  // Torch's own autograd through ATen ops; this checks it is wired (no detached pieces that
  // matter). h = 1e-6 central differences, float64.
  at::manual_seed(31);
  const at::Tensor q = at::randn({2, 11, 2, 6}, at::kDouble) * 0.6, k = at::randn({2, 11, 1, 6}, at::kDouble) * 0.6,
                   v = at::randn({2, 11, 1, 4}, at::kDouble);
  at::Tensor mask = at::ones({2, 11}, at::kBool);
  mask[1].narrow(0, 8, 3).fill_(false);
  expect_directional_derivatives(
      [&](const std::vector<at::Tensor>& t) { return st::performer_attention(t[0], t[1], t[2], 24, 5, mask); },
      {q, k, v}, 1e-6);
  expect_directional_derivatives(
      [&](const std::vector<at::Tensor>& t) { return st::nystrom_attention(t[0], t[1], t[2], 4, 6, mask); },
      {q, k, v}, 1e-6);
}

TEST(TorchBaselines, ErrorsNameTheArgument) {
  const at::Tensor q = at::randn({2, 10, 2, 8}), k = at::randn({2, 10, 2, 8}), v = at::randn({2, 10, 2, 8});
  expect_error([&] { st::performer_attention(q, k, v, 0); }, {"performer_attention", "'num_features'"});
  expect_error([&] { st::performer_attention(q, k, v, 8, -1); }, {"'seed'"});
  expect_error([&] { st::nystrom_attention(q, k, v, 0); }, {"nystrom_attention", "'num_landmarks'"});
  expect_error([&] { st::nystrom_attention(q, k, v, 4, -1); }, {"'pinv_iters'"});
  expect_error([&] { st::nystrom_attention(q, k.to(at::kDouble), v, 4); }, {"'k'", "same as q"});
  expect_error([&] { st::nystrom_attention(q, k.narrow(1, 0, 9), v, 4); }, {"'k'", "self-attention"});
  expect_error([&] { st::performer_attention(q, k, v, 8, {}, at::ones({2, 9}, at::kBool)); },
               {"'key_padding_mask'", "[2, 10]"});
  expect_error([&] { st::performer_attention(q, k, v, 8, {}, at::ones({2, 10}, at::kFloat)); },
               {"'key_padding_mask'", "bool or uint8"});
  expect_error([&] { st::nystrom_attention(q, k, v, 4, 6, {}, std::nullopt, "bsdh"); }, {"'layout'"});
  expect_error([&] { st::performer_attention(q.to(at::kInt), k.to(at::kInt), v.to(at::kInt), 8); },
               {"'q'", "floating-point"});
}

}  // namespace
