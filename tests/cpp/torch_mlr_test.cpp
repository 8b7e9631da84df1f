// tests/cpp/torch_mlr_test.cpp: the LibTorch layer of MLR attention (torch/mlr.cpp, ops_mlr.cpp,
// mlr_attention.cpp) against the double-precision reference (strata::reference, per-pair
// formula, reached through reference_mlr_attention_*), over awkward lengths (1, 7, 97, 1025),
// rank splits, GQA, both layouts, strided views and bf16 (and its compute option); the float64
// autograd path; one level against dense causal attention; segments (one list, and one list per
// sequence); errors; the dispatcher ops; the MLRAttention module.
//
// Tolerances (normwise: max |got - want| / max(max |want|, floor)), as core_mlr_test.cpp:
//   fp32: 2e-5 forward, 1e-4 gradients (round-off in dot products of length <= head_dim and sums
//   over <= 1025 keys ~ eps * sqrt(n); gradients subtract rowsum(dO * O) from dP, so 5x more).
//   bf16: the kernel rounds its outputs to bf16 (2^-9 relative): 1e-2 forward, 2e-2 gradients,
//   against the reference run on the same bf16 inputs.
//   Gradient errors are divided by max(max |ref|, 1e-2): rows with one allowed key have exactly
//   zero dq whose fp32 round-off must not be divided by ~0.
// A masking, level or scaling bug gives errors of order 1e-1.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <gtest/gtest.h>
#include <torch/autograd.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "strata/error.h"
#include "strata/torch/attention.h"
#include "strata/torch/mlr.h"
#include "strata/torch/mlr_attention.h"
#include "torch_test_util.h"

namespace {

namespace st = strata::torch;
using strata::test::message;
using strata::test::out_and_grads;
using strata::test::rel_err;

constexpr double kFwdTol = 2e-5, kGradTol = 1e-4, kBf16FwdTol = 1e-2, kBf16GradTol = 2e-2;

struct Case {
  int64_t b, nq, nk, hq, hkv, dv;
  std::vector<int64_t> ranks;
  bool causal = true;
  bool level_average = false, divide = false;
  std::string scale = "inv_rank";
  std::vector<int64_t> blocks = {};
  int64_t context = 0;
  int64_t d() const {
    int64_t s = 0;
    for (int64_t r : ranks) s += r;
    return s;
  }
  st::MlrArgs args() const {
    st::MlrArgs a;
    a.ranks = ranks;
    a.block_sizes = blocks;
    a.context = context;
    a.causal = causal;
    a.level_average = level_average;
    a.divide_by_num_levels = divide;
    a.scale = scale;
    return a;
  }
  std::string name() const {
    std::string r;
    for (int64_t x : ranks) r += std::to_string(x) + "|";
    return "b" + std::to_string(b) + " nq" + std::to_string(nq) + " nk" + std::to_string(nk) + " hq" +
           std::to_string(hq) + " hkv" + std::to_string(hkv) + " ranks " + r + (causal ? " causal" : " full") +
           (level_average ? " avg" : "") + (divide ? " div" : "") + " " + scale;
  }
};

// Random BSHD q, k, v of a case, in dtype t (drawn in float64, then rounded).
std::tuple<at::Tensor, at::Tensor, at::Tensor> make_qkv(const Case& c, at::ScalarType t) {
  const auto o = at::TensorOptions().dtype(at::kDouble);
  return {at::randn({c.b, c.nq, c.hq, c.d()}, o).to(t), at::randn({c.b, c.nk, c.hkv, c.d()}, o).to(t),
          at::randn({c.b, c.nk, c.hkv, c.dv}, o).to(t)};
}

// The reference's (out, dq, dk, dv) for inputs q, k, v (any accepted dtype) and dout g.
std::vector<at::Tensor> reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                                  const st::MlrArgs& a) {
  const at::Tensor out = std::get<0>(st::reference_mlr_attention_forward(q, k, v, a));
  auto [dq, dk, dv] = st::reference_mlr_attention_backward(q, k, v, g.to(q.scalar_type()), a);
  return {out, dq, dk, dv};
}

// Expects got[0] (out) within fwd_tol and got[1..3] (dq, dk, dv) within grad_tol of want.
void expect_close(const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& want, double fwd_tol,
                  double grad_tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].sizes(), want[i].sizes()) << what << ", tensor " << i;
    const double err = i == 0 ? rel_err(got[i], want[i]) : rel_err(got[i], want[i], 1e-2);
    EXPECT_LE(err, i == 0 ? fwd_tol : grad_tol) << what << ", tensor " << i << " (0 = out, 1..3 = dq, dk, dv)";
  }
}

const std::vector<Case> kCases = {
    {2, 1, 1, 2, 2, 16, {8, 8}},                      // T = 1
    {1, 7, 7, 3, 1, 8, {4, 2, 2}},                    // T = 7, GQA 3:1
    {2, 97, 97, 2, 2, 16, {8, 4, 2, 2}, true, true},  // T = 97 (context 104: blocks 104, 52, 26, 13)
    {1, 97, 97, 4, 2, 12, {5, 11}, true, false, true, "inv_sqrt_head_dim"},  // odd ranks, GQA, 1/L
    {1, 1025, 1025, 1, 1, 32, {16, 8, 4, 4}},                                // T = 1025
    {1, 1, 50, 2, 1, 8, {8, 4, 4}},                                          // decode: one query at position 49
    {2, 13, 29, 2, 2, 8, {2, 6}, false},                                     // not causal, seq_q < seq_k
    {1, 40, 40, 2, 2, 8, {6, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}},                 // 11 levels
};

// mlr_attention_qkvpacked: the same outputs and gradients as mlr_attention on the three views of qkv
// (the same kernels: equal bits), its one gradient the three stacked; float64 through the reference.
TEST(TorchMlr, PackedQkvEqualsThreeViews) {
  at::manual_seed(9);
  for (bool avg : {false, true})
    for (int64_t T : {5, 64, 130})
      for (auto dt : {at::kFloat, at::kDouble}) {
        st::MlrArgs a;
        a.ranks = {8, 4, 4};
        a.context = (T + 3) / 4 * 4;  // a multiple of 2^(levels - 1); T itself need not be
        a.level_average = avg;
        const at::Tensor qkv0 = at::randn({2, T, 3, 2, 16}).to(dt), g = at::randn({2, T, 2, 16}).to(dt);
        const at::Tensor p = qkv0.detach().requires_grad_();
        const at::Tensor out_p = st::mlr_attention_qkvpacked(p, a);
        out_p.backward(g);
        const at::Tensor u = qkv0.detach().requires_grad_();
        const std::vector<at::Tensor> views = u.unbind(2);
        const at::Tensor out_u = st::mlr_attention(views[0], views[1], views[2], a);
        out_u.backward(g);
        EXPECT_TRUE(at::equal(out_p, out_u)) << "T " << T << " avg " << avg << " " << dt;
        EXPECT_TRUE(at::equal(p.grad(), u.grad())) << "T " << T << " avg " << avg << " " << dt;
      }
  EXPECT_NE(message([] { st::mlr_attention_qkvpacked(at::randn({2, 5, 2, 2, 16}), st::MlrArgs{}); })
                .find("argument 'qkv'"),
            std::string::npos);
}

TEST(TorchMlr, ForwardAndGradsMatchReferenceFp32) {
  at::manual_seed(0);
  for (const Case& c : kCases) {
    auto [q, k, v] = make_qkv(c, at::kFloat);
    const st::MlrArgs a = c.args();
    auto [out, lse] = st::mlr_attention_forward(q, k, v, a);
    ASSERT_EQ(out.sizes(), (at::IntArrayRef{c.b, c.nq, c.hq, c.dv})) << c.name();
    ASSERT_EQ(out.scalar_type(), at::kFloat);
    ASSERT_EQ(lse.sizes(), (at::IntArrayRef{c.b, c.hq, c.nq}));
    ASSERT_EQ(lse.scalar_type(), at::kFloat);
    auto [want_out, want_lse] = st::reference_mlr_attention_forward(q, k, v, a);
    EXPECT_LE(rel_err(out, want_out), kFwdTol) << c.name();
    EXPECT_LE(rel_err(lse, want_lse), kFwdTol) << c.name() << " (lse)";
    const at::Tensor g = at::randn({c.b, c.nq, c.hq, c.dv});
    const auto got =
        out_and_grads([&](auto& x, auto& y, auto& z) { return st::mlr_attention(x, y, z, a); }, q, k, v, g);
    expect_close(got, reference(q, k, v, g, a), kFwdTol, kGradTol, c.name());
  }
}

// MLR attention written with differentiable torch ops straight from the formula (strata/mlr.h),
// fixed blocks only (default rule, context or block_sizes): per level a same-block mask from the
// positions, S = sum_l c_l (q_l k_l^T) * same_l, then level average, masks, softmax, P V. Torch's
// autograd of this is an independent check of the reference's analytic backward.
at::Tensor mlr_by_torch_ops(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const st::MlrArgs& a) {
  const int64_t Nq = q.size(1), Nk = k.size(1), Hq = q.size(2), Hkv = k.size(2), D = q.size(3);
  const int64_t L = int64_t(a.ranks.size());
  std::vector<int64_t> block = a.block_sizes;
  if (block.empty()) {
    const int64_t pow = int64_t(1) << (L - 1);
    const int64_t ctx = a.context > 0 ? a.context : (std::max<int64_t>(Nk, 1) + pow - 1) / pow * pow;
    for (int64_t l = 0; l < L; ++l) block.push_back(ctx >> l);
  }
  const auto lopt = at::TensorOptions().dtype(at::kLong);
  const at::Tensor qpos = (at::arange(Nq, lopt) + (Nk - Nq)).unsqueeze(1), kpos = at::arange(Nk, lopt).unsqueeze(0);
  const at::Tensor kk = k.repeat_interleave(Hq / Hkv, 2), vv = v.repeat_interleave(Hq / Hkv, 2);
  at::Tensor S = at::zeros({q.size(0), Hq, Nq, Nk}, q.options()), cnt = at::zeros({Nq, Nk}, q.options());
  int64_t off = 0;
  for (int64_t l = 0; l < L; ++l) {
    const int64_t r = a.ranks[size_t(l)];
    double c = a.scale == "inv_rank" ? 1.0 / double(r) : 1.0 / std::sqrt(double(D));
    if (a.divide_by_num_levels) c /= double(L);
    const at::Tensor same =
        at::eq(at::div(qpos, block[size_t(l)], "floor"), at::div(kpos, block[size_t(l)], "floor")).to(q.scalar_type());
    S = S + c * at::einsum("bihd,bjhd->bhij", {q.narrow(3, off, r), kk.narrow(3, off, r)}) * same;
    cnt = cnt + same;
    off += r;
  }
  if (a.level_average) S = S / cnt.clamp_min(1);
  at::Tensor masked = at::zeros({Nq, Nk}, lopt).to(at::kBool);
  if (a.causal) masked = masked.logical_or(kpos > qpos);
  if (a.mask_cross_segment) masked = masked.logical_or(cnt == 0);
  S = S.masked_fill(masked, -std::numeric_limits<double>::infinity());
  return at::einsum("bhij,bjhd->bihd", {at::softmax(S, -1), vv});
}

TEST(TorchMlr, Float64MatchesAutogradOfTheFormulaInTorchOps) {
  // The op in float64 runs the double reference (forward and analytic backward); compare it with
  // torch autograd through mlr_by_torch_ops. Both are float64: 1e-10 is summation order only.
  at::manual_seed(1);
  std::vector<Case> cases = {kCases[1], kCases[2], kCases[3], kCases[5], kCases[6]};
  Case nn{1, 50, 50, 2, 1, 8, {4, 2, 2}, true, true};  // not nested, level average
  nn.blocks = {32, 8, 12};
  cases.push_back(nn);
  nn.causal = false;
  nn.context = 0;
  nn.blocks = {16, 24, 6};
  cases.push_back(nn);
  for (const Case& c : cases) {
    auto [q, k, v] = make_qkv(c, at::kDouble);
    const st::MlrArgs a = c.args();
    const at::Tensor g = at::randn({c.b, c.nq, c.hq, c.dv}, at::kDouble);
    const auto got =
        out_and_grads([&](auto& x, auto& y, auto& z) { return st::mlr_attention(x, y, z, a); }, q, k, v, g);
    const auto want = out_and_grads([&](auto& x, auto& y, auto& z) { return mlr_by_torch_ops(x, y, z, a); }, q, k, v, g);
    for (size_t i = 0; i < 4; ++i) {
      EXPECT_EQ(got[i].scalar_type(), at::kDouble);
      EXPECT_LE(rel_err(got[i], want[i], 1e-2), 1e-10) << c.name() << ", tensor " << i;
    }
  }
}

TEST(TorchMlr, OneLevelEqualsDenseCausalAttention) {
  at::manual_seed(2);
  for (const Case& c :
       {Case{2, 37, 37, 4, 2, 24, {32}}, Case{1, 97, 97, 2, 2, 16, {16}}, Case{1, 5, 19, 2, 1, 8, {8}}}) {
    auto [q, k, v] = make_qkv(c, at::kFloat);
    st::MlrArgs a = c.args();
    a.scale = "inv_sqrt_head_dim";  // = attention's default 1/sqrt(head_dim)
    st::AttentionArgs dense;
    dense.causal = true;
    const at::Tensor g = at::randn({c.b, c.nq, c.hq, c.dv});
    const auto got =
        out_and_grads([&](auto& x, auto& y, auto& z) { return st::mlr_attention(x, y, z, a); }, q, k, v, g);
    const auto want =
        out_and_grads([&](auto& x, auto& y, auto& z) { return st::attention(x, y, z, dense); }, q, k, v, g);
    // Two fp32 kernels (bitwise equal where they sum in the same order): a few ulps apart.
    for (size_t i = 0; i < 4; ++i)
      EXPECT_LE(rel_err(got[i], want[i], i == 0 ? 1e-30 : 1e-2), i == 0 ? 2e-6 : 1e-5) << c.name() << ", tensor " << i;
    // L = 1 with the reference code's scale 1/r_1 is dense attention with scale 1/head_dim.
    a.scale = "inv_rank";
    dense.scale = 1.0 / double(c.d());
    EXPECT_LE(
        rel_err(std::get<0>(st::mlr_attention_forward(q, k, v, a)), std::get<0>(st::attention_forward(q, k, v, dense))),
        2e-6)
        << c.name();
  }
}

TEST(TorchMlr, BhsdLayoutAndStridedInputs) {
  at::manual_seed(3);
  const Case c{2, 33, 45, 4, 2, 16, {12, 8, 4}};
  auto [q, k, v] = make_qkv(c, at::kFloat);
  const st::MlrArgs a = c.args();
  const at::Tensor want = std::get<0>(st::mlr_attention_forward(q, k, v, a));
  // The same data stored head-major (BHSD memory) passed as BSHD views: out follows q's memory order.
  const at::Tensor qh = q.transpose(1, 2).contiguous(), kh = k.transpose(1, 2).contiguous(),
                   vh = v.transpose(1, 2).contiguous();
  const at::Tensor out_view =
      std::get<0>(st::mlr_attention_forward(qh.transpose(1, 2), kh.transpose(1, 2), vh.transpose(1, 2), a));
  EXPECT_LE(rel_err(out_view, want), 1e-6);
  EXPECT_TRUE(out_view.transpose(1, 2).is_contiguous());
  // layout "bhsd" on the head-major tensors: out is B x Hq x Nq x Dv, grads match the reference.
  st::MlrArgs ah = a;
  ah.layout = "bhsd";
  auto [out_bhsd, lse] = st::mlr_attention_forward(qh, kh, vh, ah);
  ASSERT_EQ(out_bhsd.sizes(), (at::IntArrayRef{c.b, c.hq, c.nq, c.dv}));
  EXPECT_TRUE(out_bhsd.is_contiguous());
  EXPECT_LE(rel_err(out_bhsd.transpose(1, 2), want), 1e-6);
  const at::Tensor g = at::randn({c.b, c.hq, c.nq, c.dv});
  const auto got =
      out_and_grads([&](auto& x, auto& y, auto& z) { return st::mlr_attention(x, y, z, ah); }, qh, kh, vh, g);
  expect_close(got, reference(qh, kh, vh, g, ah), kFwdTol, kGradTol, "bhsd");
  // Padded last dims (row stride > head_dim) and an interleaved v read the same values.
  const at::Tensor qp = at::zeros({c.b, c.nq, c.hq, c.d() + 5}).narrow(3, 0, c.d()).copy_(q);
  const at::Tensor kp = at::zeros({c.b, c.nk, c.hkv, c.d() + 3}).narrow(3, 1, c.d()).copy_(k);
  const at::Tensor vp = at::zeros({c.b, c.nk, c.hkv, 2 * c.dv}).slice(3, 0, 2 * c.dv, 2).copy_(v);
  EXPECT_LE(rel_err(std::get<0>(st::mlr_attention_forward(qp, kp, vp, a)), want), 1e-6);
  const at::Tensor g2 = at::randn({c.b, c.nq, c.hq, c.dv});
  const auto got_p =
      out_and_grads([&](auto& x, auto& y, auto& z) { return st::mlr_attention(x, y, z, a); }, qp, kp, vp, g2);
  expect_close(got_p, reference(q, k, v, g2, a), kFwdTol, kGradTol, "strided");
}

TEST(TorchMlr, Bfloat16CloseToReference) {
  at::manual_seed(4);
  for (const Case& c : {Case{2, 64, 64, 4, 2, 32, {16, 8, 8}}, Case{1, 97, 97, 2, 2, 16, {8, 4, 4}, true, true}}) {
    auto [q, k, v] = make_qkv(c, at::kBFloat16);
    const st::MlrArgs a = c.args();
    const at::Tensor g = at::randn({c.b, c.nq, c.hq, c.dv}).to(at::kBFloat16);
    const auto got =
        out_and_grads([&](auto& x, auto& y, auto& z) { return st::mlr_attention(x, y, z, a); }, q, k, v, g);
    for (const at::Tensor& t : got) EXPECT_EQ(t.scalar_type(), at::kBFloat16);
    expect_close(got, reference(q, k, v, g, a), kBf16FwdTol, kBf16GradTol, "bf16 " + c.name());
  }
}

// The compute option (MlrArgs::compute, strata/cpu.h): "fp32" and "auto" (bf16 products where the
// CPU has an engine, else fp32) both hold the bf16 tolerances against the reference on the same
// inputs, forward and gradients; the autograd Function's backward is the ops' own, bit for bit,
// with the forward's compute; where "auto" runs an engine its forward differs from "fp32"'s (else
// the option never reached the kernel). A name that is no engine is an error naming 'compute'.
TEST(TorchMlr, Bfloat16ComputeOptions) {
  at::manual_seed(5);
  const Case c{2, 97, 97, 4, 2, 16, {16, 8, 8}, true, true};
  auto [q, k, v] = make_qkv(c, at::kBFloat16);
  const at::Tensor g = at::randn({c.b, c.nq, c.hq, c.dv}).to(at::kBFloat16);
  st::MlrArgs a = c.args();
  const std::vector<at::Tensor> want = reference(q, k, v, g, a);
  std::vector<at::Tensor> outs;
  for (const char* compute : {"fp32", "auto"}) {
    a.compute = compute;
    const std::string what = c.name() + " compute " + compute;
    const auto got =
        out_and_grads([&](auto& x, auto& y, auto& z) { return st::mlr_attention(x, y, z, a); }, q, k, v, g);
    for (const at::Tensor& t : got) EXPECT_EQ(t.scalar_type(), at::kBFloat16) << what;
    expect_close(got, want, kBf16FwdTol, kBf16GradTol, what);
    auto [out, lse] = st::mlr_attention_forward(q, k, v, a);
    auto [dq, dk, dv] = st::mlr_attention_backward(q, k, v, out, lse, g, a);
    EXPECT_TRUE(at::equal(got[0], out)) << what;
    EXPECT_TRUE(at::equal(got[1], dq)) << what;
    EXPECT_TRUE(at::equal(got[2], dk)) << what;
    EXPECT_TRUE(at::equal(got[3], dv)) << what;
    outs.push_back(out);
  }
  strata::AttnDims d;
  d.batch = c.b;
  d.seqlen_q = c.nq;
  d.seqlen_k = c.nk;
  d.heads_q = c.hq;
  d.heads_kv = c.hkv;
  d.head_dim = c.d();
  d.head_dim_v = c.dv;
  d.dtype = strata::DType::bf16;
  strata::MlrOptions o;
  o.num_levels = int(c.ranks.size());
  std::copy(c.ranks.begin(), c.ranks.end(), o.ranks);
  o.level_average = c.level_average;
  if (strata::mlr_attention_compute(d, o) != strata::Compute::fp32) {
    EXPECT_FALSE(at::equal(outs[1], outs[0])) << "compute auto gave the fp32 path's output: no bf16 products ran";
  }

  auto expect_msg = [](const std::string& got, const std::string& want) {
    EXPECT_NE(got.find(want), std::string::npos) << "message: '" << got << "', expected to contain '" << want << "'";
  };
  a.compute = "bf16";
  expect_msg(message([&] { st::mlr_attention_forward(q, k, v, a); }),
             "mlr_attention_forward: argument 'compute': expected one of auto, fp32, avx512_bf16, amx_bf16, got bf16");
  expect_msg(message([&] { st::mlr_attention(q, k, v, a); }), "mlr_attention_forward: argument 'compute'");
  expect_msg(message([&] { st::mlr_attention(q.to(at::kMeta), k.to(at::kMeta), v.to(at::kMeta), a); }),
             "mlr_attention: argument 'compute'");  // the torch-ops path checks it too
}

TEST(TorchMlr, OptionsMatchReference) {
  at::manual_seed(5);
  const Case c{2, 45, 45, 2, 1, 8, {4, 2, 2}};
  auto [q, k, v] = make_qkv(c, at::kFloat);
  const at::Tensor g = at::randn({c.b, c.nq, c.hq, c.dv});
  std::vector<std::pair<std::string, st::MlrArgs>> variants;
  st::MlrArgs a = c.args();
  a.block_sizes = {24, 12, 3};
  variants.emplace_back("block_sizes", a);
  a = c.args();
  a.context = 64;
  variants.emplace_back("context", a);
  a = c.args();
  a.segment_starts = at::tensor(std::vector<int64_t>{10, 17, 30});
  variants.emplace_back("segment_starts", a);
  a.mask_cross_segment = true;
  a.level_average = true;
  variants.emplace_back("segments + mask_cross_segment + level_average", a);
  a = c.args();
  a.segment_starts = at::tensor(std::vector<int64_t>{3, 99, 29, 99, 40}).slice(0, 0, 5, 2);  // strided
  a.block_sizes = {0, 8, 2};  // with segments b_1 is unused
  a.causal = false;
  variants.emplace_back("segments + blocks, not causal", a);
  for (const auto& [name, args] : variants) {
    const auto got =
        out_and_grads([&](auto& x, auto& y, auto& z) { return st::mlr_attention(x, y, z, args); }, q, k, v, g);
    expect_close(got, reference(q, k, v, g, args), kFwdTol, kGradTol, name);
  }
}

// Each sequence of a batch with its own segment list gives what that sequence gives alone with
// its list (as one list for a batch of one), on the kernel and on the float64 path.
TEST(TorchMlr, PerSequenceSegmentsEqualEachSequenceAlone) {
  at::manual_seed(6);
  const Case c{3, 40, 40, 2, 2, 8, {4, 2, 2}};
  const std::vector<std::vector<int64_t>> lists = {{5, 11}, {}, {9, 20, 33}};
  std::vector<int64_t> starts, offsets = {0};
  for (const auto& l : lists) {
    starts.insert(starts.end(), l.begin(), l.end());
    offsets.push_back(int64_t(starts.size()));
  }
  for (at::ScalarType t : {at::kFloat, at::kDouble}) {
    for (bool mask_cross : {false, true}) {
      auto [q, k, v] = make_qkv(c, t);
      const at::Tensor g = at::randn({c.b, c.nq, c.hq, c.dv}, at::TensorOptions().dtype(t));
      st::MlrArgs a = c.args();
      a.mask_cross_segment = mask_cross;
      a.segment_starts = at::tensor(starts);
      a.segment_offsets = at::tensor(offsets);
      const auto got =
          out_and_grads([&](auto& x, auto& y, auto& z) { return st::mlr_attention(x, y, z, a); }, q, k, v, g);
      for (int64_t b = 0; b < c.b; ++b) {
        st::MlrArgs one = c.args();
        one.mask_cross_segment = mask_cross;
        if (!lists[size_t(b)].empty()) one.segment_starts = at::tensor(lists[size_t(b)]);
        const auto alone = out_and_grads([&](auto& x, auto& y, auto& z) { return st::mlr_attention(x, y, z, one); },
                                         q.narrow(0, b, 1), k.narrow(0, b, 1), v.narrow(0, b, 1), g.narrow(0, b, 1));
        for (size_t i = 0; i < 4; ++i)
          EXPECT_LE(rel_err(got[i].narrow(0, b, 1), alone[i], 1e-2), t == at::kDouble ? 1e-13 : 1e-6)
              << "sequence " << b << ", tensor " << i << ", " << at::toString(t) << ", mask_cross " << mask_cross;
      }
    }
  }
  // The FLOP count sums the sequences' own counts.
  st::MlrArgs a = c.args();
  a.segment_starts = at::tensor(starts);
  a.segment_offsets = at::tensor(offsets);
  a.mask_cross_segment = true;
  double sum = 0;
  for (int64_t b = 0; b < c.b; ++b) {
    st::MlrArgs one = c.args();
    one.mask_cross_segment = true;
    if (!lists[size_t(b)].empty()) one.segment_starts = at::tensor(lists[size_t(b)]);
    sum += st::mlr_attention_flops(1, c.hq, c.nq, c.nk, c.dv, one).total;
  }
  EXPECT_DOUBLE_EQ(st::mlr_attention_flops(c.b, c.hq, c.nq, c.nk, c.dv, a).total, sum);
}

TEST(TorchMlr, FlopCountIsTheDyadicFormula) {
  // Not causal, T = 64, blocks 64, 32, 16, 8: scores = 2 B H T^2 sum_l r_l / 2^(l-1).
  st::MlrArgs a;
  a.ranks = {8, 8, 8, 8};
  a.causal = false;
  const strata::MlrFlops f = st::mlr_attention_flops(2, 3, 64, 64, 16, a);
  EXPECT_DOUBLE_EQ(f.scores, 2.0 * 2 * 3 * 64 * 64 * (8 + 4 + 2 + 1));
  EXPECT_DOUBLE_EQ(f.dense_scores, 2.0 * 2 * 3 * 64 * 64 * 32);
  EXPECT_DOUBLE_EQ(f.total, f.scores + 2.0 * 2 * 3 * 64 * 64 * 16);
}

TEST(TorchMlr, EmptyRowsAreZeroWithZeroGrad) {
  at::manual_seed(7);
  // Causal with seq_q > seq_k: the first 3 queries (positions -3..-1) see no key.
  const Case c{1, 8, 5, 2, 2, 4, {2, 2}};
  auto [q, k, v] = make_qkv(c, at::kFloat);
  const st::MlrArgs a = c.args();
  const auto got = out_and_grads([&](auto& x, auto& y, auto& z) { return st::mlr_attention(x, y, z, a); }, q, k, v,
                                 at::ones({c.b, c.nq, c.hq, c.dv}));
  EXPECT_EQ(got[0].narrow(1, 0, 3).abs().max().item<double>(), 0.0);
  EXPECT_EQ(got[1].narrow(1, 0, 3).abs().max().item<double>(), 0.0);
  EXPECT_GT(got[0].narrow(1, 3, 5).abs().max().item<double>(), 0.0);
  const at::Tensor lse = std::get<1>(st::mlr_attention_forward(q, k, v, a));
  EXPECT_TRUE((lse.narrow(2, 0, 3) == -std::numeric_limits<float>::infinity()).all().item<bool>());
}

// Returns the message of the strata::Error fn throws ("" if none).

TEST(TorchMlr, ErrorsNameTheArgument) {
  const at::Tensor q = at::randn({1, 6, 2, 8}), k = at::randn({1, 6, 2, 8}), v = at::randn({1, 6, 2, 4});
  const at::Tensor qd = q.to(at::kDouble), kd = k.to(at::kDouble), vd = v.to(at::kDouble);
  st::MlrArgs ok;
  ok.ranks = {4, 4};
  auto expect_msg = [](const std::string& got, const std::string& want) {
    EXPECT_NE(got.find(want), std::string::npos) << "message: '" << got << "', expected to contain '" << want << "'";
  };
  st::MlrArgs a = ok;
  a.ranks = {4, 3};
  expect_msg(message([&] { st::mlr_attention_forward(q, k, v, a); }),
             "mlr_attention_forward: argument 'ranks': expected r_1 + .. + r_L = head_dim 8");
  expect_msg(message([&] { st::mlr_attention(qd, kd, vd, a); }),
             "reference_mlr_attention_forward: argument 'ranks': expected r_1 + .. + r_L = head_dim 8");
  a.ranks = {};
  expect_msg(message([&] { st::mlr_attention(q, k, v, a); }), "argument 'ranks': expected 1..16 ranks");
  a.ranks = {4, 0, 4};
  expect_msg(message([&] { st::mlr_attention(q, k, v, a); }), "argument 'ranks[1]'");
  expect_msg(message([&] { st::mlr_attention(qd, kd, vd, a); }),
             "reference_mlr_attention_forward: argument 'ranks[1]'");
  a = ok;
  a.block_sizes = {8};
  expect_msg(message([&] { st::mlr_attention(q, k, v, a); }),
             "argument 'block_sizes': expected empty (default blocks) or 2");
  a.block_sizes = {8, 0};  // (non-nested sizes such as {8, 3} are valid)
  expect_msg(message([&] { st::mlr_attention(q, k, v, a); }), "argument 'block_sizes[1]'");
  expect_msg(message([&] { st::mlr_attention(qd, kd, vd, a); }),
             "reference_mlr_attention_forward: argument 'block_sizes[1]'");
  a = ok;
  a.context = 7;
  expect_msg(message([&] { st::mlr_attention(q, k, v, a); }), "argument 'context'");
  a = ok;
  a.scale = "sqrt";
  expect_msg(message([&] { st::mlr_attention(q, k, v, a); }),
             "argument 'scale': expected \"inv_rank\" or \"inv_sqrt_head_dim\"");
  a = ok;
  a.layout = "sbhd";
  expect_msg(message([&] { st::mlr_attention(q, k, v, a); }), "argument 'layout'");
  a = ok;
  a.segment_starts = at::tensor(std::vector<float>{2.f});
  expect_msg(message([&] { st::mlr_attention(q, k, v, a); }),
             "argument 'segment_starts': expected dtype int64, got float32");
  a.segment_starts = at::tensor(std::vector<int64_t>{4, 2});
  expect_msg(message([&] { st::mlr_attention(q, k, v, a); }), "argument 'segment_starts[1]'");
  a.segment_starts = at::tensor(std::vector<int64_t>{6});
  expect_msg(message([&] { st::mlr_attention(q, k, v, a); }), "argument 'segment_starts[0]'");
  a.segment_starts = at::tensor(std::vector<int64_t>{2, 3});
  a.segment_offsets = at::tensor(std::vector<int64_t>{0, 1, 2});
  expect_msg(message([&] { st::mlr_attention(q, k, v, a); }),
             "mlr_attention_forward: argument 'segment_offsets': expected 2 offsets (batch + 1), got 3");
  a.segment_offsets = at::tensor(std::vector<int64_t>{0, 1}).view({1, 2});
  expect_msg(message([&] { st::mlr_attention(q, k, v, a); }), "argument 'segment_offsets': expected a 1-D tensor");
  expect_msg(
      message([&] { st::mlr_attention_forward(q.to(at::kInt), k, v, ok); }),
      "mlr_attention_forward: argument 'q': expected dtype float32 or bfloat16, got int32");
  expect_msg(message([&] { st::mlr_attention_forward(qd, kd, vd, ok); }),
             "mlr_attention_forward: argument 'q': expected dtype float32 or bfloat16, got float64");
  expect_msg(message([&] { st::mlr_attention(q, k, v.to(at::kBFloat16), ok); }), "argument 'v'");
  expect_msg(message([&] { st::mlr_attention(qd, kd, vd.to(at::kFloat), ok); }),
             "reference_mlr_attention_forward: argument 'v': expected dtype float64");
  expect_msg(message([&] { st::mlr_attention(q, k.narrow(3, 0, 6), v, ok); }), "argument 'k'");
  expect_msg(message([&] { st::mlr_attention(q[0], k, v, ok); }), "argument 'q': expected a 4-D tensor");
  // q off the CPU takes the torch-ops path, which wants k and v on q's device
  expect_msg(message([&] { st::mlr_attention(q.to(at::kMeta), k, v, ok); }), "argument 'k': expected a tensor on meta (as q)");
  expect_msg(message([&] {
               st::mlr_attention(q, k.narrow(2, 0, 1).repeat({1, 1, 3, 1}), v.repeat({1, 1, 3, 1}).narrow(2, 0, 3), ok);
             }),
             "argument 'k': expected heads dividing q's heads (2)");
  auto [out, lse] = st::mlr_attention_forward(q, k, v, ok);
  expect_msg(message([&] {
               st::mlr_attention_backward(q, k, v, out, lse, at::zeros({1, 6, 2, 3}), ok);
             }),
             "mlr_attention_backward: argument 'dout'");
}

TEST(TorchMlr, OpsCallableThroughDispatcher) {
  at::manual_seed(8);
  const Case c{2, 11, 19, 4, 2, 8, {4, 2, 2}};
  auto [q, k, v] = make_qkv(c, at::kFloat);
  const at::Tensor seg = at::tensor(std::vector<int64_t>{7, 12});
  using Opt = std::optional<at::Tensor>;
  using Fwd = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                 c10::IntArrayRef, c10::IntArrayRef, int64_t, const Opt&, const Opt&,
                                                 bool, c10::string_view, bool, bool, bool, c10::string_view,
                                                 c10::string_view);
  const auto handle = c10::Dispatcher::singleton().findSchemaOrThrow("strata::mlr_attention_forward", "");
  ASSERT_EQ(handle.schema().returns().size(), 2u);
  EXPECT_EQ(handle.schema().returns()[0].name(), "out");
  EXPECT_EQ(handle.schema().returns()[1].name(), "lse");
  const auto fwd = handle.typed<Fwd>();
  const std::vector<int64_t> ranks = {4, 2, 2}, none = {};
  auto [out, lse] =
      fwd.call(q, k, v, ranks, none, 0, seg, std::nullopt, false, "inv_rank", false, true, true, "bshd", "auto");
  st::MlrArgs a = c.args();
  a.segment_starts = seg;
  a.level_average = true;
  auto [want_out, want_lse] = st::mlr_attention_forward(q, k, v, a);
  EXPECT_TRUE(at::equal(out, want_out));
  EXPECT_TRUE(at::equal(lse, want_lse));

  // The backward op agrees bitwise with autograd through the differentiable op.
  using Bwd = std::tuple<at::Tensor, at::Tensor, at::Tensor>(
      const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
      c10::IntArrayRef, c10::IntArrayRef, int64_t, const Opt&, const Opt&, bool, c10::string_view, bool, bool, bool,
      c10::string_view, c10::string_view);
  const at::Tensor g = at::randn_like(out);
  auto [dq, dk, dv] =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("strata::mlr_attention_backward", "")
          .typed<Bwd>()
          .call(q, k, v, out, lse, g, ranks, none, 0, seg, std::nullopt, false, "inv_rank", false, true, true, "bshd",
                "auto");
  using Attn = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, c10::IntArrayRef, c10::IntArrayRef,
                          int64_t, const Opt&, const Opt&, bool, c10::string_view, bool, bool, bool, c10::string_view,
                          c10::string_view);
  const auto attn = c10::Dispatcher::singleton().findSchemaOrThrow("strata::mlr_attention", "").typed<Attn>();
  const auto got = out_and_grads(
      [&](auto& x, auto& y, auto& z) {
        return attn.call(x, y, z, ranks, none, 0, seg, std::nullopt, false, "inv_rank", false, true, true, "bshd",
                         "auto");
      },
      q, k, v, g);
  EXPECT_TRUE(at::equal(got[0], out));
  EXPECT_TRUE(at::equal(got[1], dq));
  EXPECT_TRUE(at::equal(got[2], dk));
  EXPECT_TRUE(at::equal(got[3], dv));

  // Through the dispatcher a strata::Error arrives as a c10::Error with the same message.
  try {
    const std::vector<int64_t> bad = {4, 3};
    fwd.call(q, k, v, bad, none, 0, std::nullopt, std::nullopt, false, "inv_rank", false, false, true, "bshd", "auto");
    ADD_FAILURE() << "expected a c10::Error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("mlr_attention_forward: argument 'ranks'"),
              std::string::npos)
        << e.what_without_backtrace();
  }
}

TEST(TorchMlr, DoubleBackwardRaises) {
  at::manual_seed(9);
  const Case c{1, 5, 5, 2, 2, 4, {2, 2}};
  auto [q0, k0, v0] = make_qkv(c, at::kDouble);
  const at::Tensor q = q0.requires_grad_(), k = k0.requires_grad_(), v = v0.requires_grad_();
  const auto grads = ::torch::autograd::grad({st::mlr_attention(q, k, v, c.args()).sum()}, {q, k}, {}, true, true);
  EXPECT_THROW((grads[0].square().sum() + grads[1].sum()).backward(), c10::Error);
}

// ---- the module -------------------------------------------------------------------------------

// The module's forward written out from its parts (projections, QK-LN, mlr_attention, out proj).
at::Tensor module_by_hand(st::MLRAttention& m, const at::Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1), H = m->options.num_heads(), d = m->head_dim;
  const int64_t Hkv = m->options.num_kv_heads() == 0 ? H : m->options.num_kv_heads();
  at::Tensor q = at::linear(x, m->q_proj->weight, m->q_proj->bias).view({B, T, H, d});
  at::Tensor k = at::linear(x, m->k_proj->weight, m->k_proj->bias).view({B, T, Hkv, d});
  const at::Tensor v = at::linear(x, m->v_proj->weight, m->v_proj->bias).view({B, T, Hkv, d});
  if (m->options.qk_layernorm()) {
    q = at::layer_norm(q, {d}, m->q_norm_weight, m->q_norm_bias, 1e-5);
    k = at::layer_norm(k, {d}, m->k_norm_weight, m->k_norm_bias, 1e-5);
  }
  const at::Tensor y = st::mlr_attention(q, k, v, m->mlr_args());
  return at::linear(y.reshape({B, T, H * d}), m->out_proj->weight, m->out_proj->bias);
}

TEST(TorchMlr, ModuleForwardBackwardAndQkLayerNorm) {
  at::manual_seed(10);
  for (bool qk_ln : {false, true})
    for (bool bias : {true, false}) {
      // embed 64, 4 query heads of head_dim 16 = 8 + 4 + 4, 2 kv heads (GQA).
      st::MLRAttention m(st::MLRAttentionOptions(64, 4, {8, 4, 4}).context(64).num_kv_heads(2).qk_layernorm(qk_ln).bias(bias));
      EXPECT_EQ(m->head_dim, 16);
      EXPECT_EQ(m->k_proj->weight.sizes(), (at::IntArrayRef{32, 64}));
      const size_t want_params = 4 * (bias ? 2 : 1) + (qk_ln ? 2 * (bias ? 2 : 1) : 0);
      EXPECT_EQ(m->parameters().size(), want_params) << "qk_ln " << qk_ln << " bias " << bias;
      const at::Tensor x = at::randn({2, 37, 64});
      const at::Tensor y = m->forward(x);
      ASSERT_EQ(y.sizes(), x.sizes());
      EXPECT_LE(rel_err(y, module_by_hand(m, x)), 1e-6);
      // clone(): an independent copy computing the same function.
      const auto copy = std::dynamic_pointer_cast<st::MLRAttentionImpl>(m->clone());
      ASSERT_TRUE(copy);
      EXPECT_TRUE(at::equal(copy->forward(x), y));
      EXPECT_NE(copy->q_proj->weight.data_ptr(), m->q_proj->weight.data_ptr());
      y.square().mean().backward();
      for (const auto& p : m->named_parameters()) {
        ASSERT_TRUE(p.value().grad().defined()) << p.key();
        EXPECT_GT(p.value().grad().abs().max().item<double>(), 0.0) << p.key();
      }
    }
  // QK-LN changes the result (the norms are in the computation).
  at::manual_seed(11);
  st::MLRAttention plain(st::MLRAttentionOptions(32, 2, {8, 8}).context(32));
  at::manual_seed(11);
  st::MLRAttention normed(st::MLRAttentionOptions(32, 2, {8, 8}).context(32).qk_layernorm(true));
  const at::Tensor x = at::randn({1, 20, 32}) * 3;
  EXPECT_GT(rel_err(normed->forward(x), plain->forward(x)), 1e-3);
}

// A causal model's output at a position must not depend on later tokens: with the module's
// defaults (and the context it requires) the forward over n tokens equals the first n rows of
// the forward over n + m, also past the context (blocks continue by absolute position). The two
// calls may add a deeper level's rectangle in another order on a boundary tile: fp32 round-off.
TEST(TorchMlr, ModuleRowsDoNotDependOnLaterTokens) {
  at::manual_seed(13);
  at::NoGradGuard no_grad;
  st::MLRAttention m(st::MLRAttentionOptions(64, 4, {8, 4, 2, 2}).context(104));  // blocks 104/52/26/13
  for (auto [n, mm] : {std::pair<int64_t, int64_t>{25, 76}, {100, 1}, {1, 40}, {77, 150}, {130, 3}}) {
    const at::Tensor x = at::randn({2, n + mm, 64});
    const at::Tensor full = m->forward(x), part = m->forward(x.narrow(1, 0, n));
    EXPECT_LE(rel_err(part, full.narrow(1, 0, n)), 2e-6) << "n = " << n << ", m = " << mm;
  }
}

TEST(TorchMlr, ModuleOptionsSegmentsAndFloat64) {
  at::manual_seed(12);
  st::MLRAttention m(st::MLRAttentionOptions(24, 2, {6, 4, 2})
                         .level_average(true)
                         .mask_cross_segment(true)
                         .scale("inv_sqrt_head_dim")
                         .block_sizes({32, 8, 4}));
  const at::Tensor x = at::randn({2, 30, 24});
  const at::Tensor starts = at::tensor(std::vector<int64_t>{9, 14, 21}),
                   offsets = at::tensor(std::vector<int64_t>{0, 1, 3});
  const at::Tensor y = m->forward(x, starts, offsets);
  ASSERT_EQ(y.sizes(), x.sizes());
  // Sequence 1 alone with its own list [14, 21].
  const at::Tensor y1 = m->forward(x.narrow(0, 1, 1), at::tensor(std::vector<int64_t>{14, 21}));
  EXPECT_LE(rel_err(y.narrow(0, 1, 1), y1), 1e-6);
  // The module in float64 runs the reference: same result as float32 up to fp32 round-off.
  m->to(at::kDouble);
  const at::Tensor yd = m->forward(x.to(at::kDouble), starts, offsets);
  EXPECT_EQ(yd.scalar_type(), at::kDouble);
  EXPECT_LE(rel_err(y, yd), 1e-5);
}

TEST(TorchMlr, ModuleErrors) {
  EXPECT_NE(message([] {
              st::MLRAttention(st::MLRAttentionOptions(64, 4, {8, 4}));
            }).find("MLRAttention: argument 'ranks': expected r_1 + .. + r_L = head_dim = embed_dim / num_heads = 16"),
            std::string::npos);
  EXPECT_NE(message([] { st::MLRAttention(st::MLRAttentionOptions(64, 5, {8})); }).find("argument 'num_heads'"),
            std::string::npos);
  EXPECT_NE(message([] {
              st::MLRAttention(st::MLRAttentionOptions(64, 4, {8, 8}).context(64).num_kv_heads(3));
            }).find("argument 'num_kv_heads'"),
            std::string::npos);
  EXPECT_NE(message([] {
              st::MLRAttention(st::MLRAttentionOptions(64, 4, {8, 8}).context(64).scale("x"));
            }).find("MLRAttention: argument 'scale'"),
            std::string::npos);
  EXPECT_NE(message([] {
              st::MLRAttention(st::MLRAttentionOptions(64, 4, {8, 8}).block_sizes({16, -5}));
            }).find("MLRAttention: argument 'block_sizes[1]'"),
            std::string::npos);
  st::MLRAttention m(st::MLRAttentionOptions(16, 2, {4, 4}).context(16));
  EXPECT_NE(message([&] {
              m->forward(at::randn({2, 5, 15}));
            }).find("MLRAttention::forward: argument 'x'"),
            std::string::npos);
  // The blocks are the model's: two or more levels need the context (or block sizes).
  EXPECT_NE(message([] {
              st::MLRAttention(st::MLRAttentionOptions(64, 4, {8, 8}));
            }).find("MLRAttention: argument 'context': expected the model's context length"),
            std::string::npos);
  EXPECT_NO_THROW(st::MLRAttention(st::MLRAttentionOptions(64, 4, {16})));  // one level: dense
  std::ostringstream os;
  os << *m;
  EXPECT_NE(os.str().find("MLRAttention(embed_dim=16, num_heads=2, num_kv_heads=2, ranks=[4, 4]"), std::string::npos)
      << os.str();
}

}  // namespace
