// tests/cpp/torch_attention_test.cpp: the LibTorch layer (torch/) against PyTorch's own attention.
// Truth is at::scaled_dot_product_attention in float64 (math path), with the mask written out
// explicitly from the definition in include/strata/attention.h (causal is bottom-right, SDPA's
// is_causal is top-left, so it is never used when seq_q != seq_k), GQA by repeat_interleave of k
// and v, a query shared by heads by repeat_interleave of q (autograd then sums its copies' dq).
// Errors are normwise: max |got - want| / max |want|.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <gtest/gtest.h>
#include <torch/autograd.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "strata/error.h"
#include "strata/torch/attention.h"
#include "strata/torch/mlr.h"
#include "torch_test_util.h"

namespace {

namespace st = strata::torch;
using strata::test::message;
using strata::test::out_and_grads;
using strata::test::rel_err;

// Bool seq_q x seq_k: key j allowed for query i by causal / window / global (bottom-right).
at::Tensor allowed_mask(int64_t nq, int64_t nk, bool causal, int64_t wl = -1, int64_t wr = -1, int64_t g = 0) {
  const at::Tensor p = at::arange(nq).unsqueeze(1) + (nk - nq), j = at::arange(nk).unsqueeze(0);
  at::Tensor ok = at::ones({nq, nk}, at::kBool);
  if (causal) ok = ok & (j <= p);
  at::Tensor win = at::ones({nq, nk}, at::kBool);
  if (wl >= 0) win = win & (j >= p - wl);
  if (wr >= 0) win = win & (j <= p + wr);
  const at::Tensor global = (j < g) | ((p >= 0) & (p < g));
  return ok & (win | global);
}

// BSHD t with its heads repeated to h (each `h / heads` times in a row), as BHSD.
at::Tensor heads_to_bhsd(const at::Tensor& t, int64_t h) { return t.transpose(1, 2).repeat_interleave(h / t.size(2), 1); }

// SDPA on BSHD tensors (q: B x Nq x Hq x D, k/v: B x Nk x Hkv x D/Dv; H = max(Hq, Hkv) heads, each
// of q, k, v repeated to H); mask: bool (true = attend) or float (added), broadcastable to
// B x H x Nq x Nk, or undefined. Returns B x Nq x H x Dv.
at::Tensor sdpa_bshd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                     std::optional<double> scale = {}) {
  const int64_t h = std::max(q.size(2), k.size(2));
  std::optional<at::Tensor> m;
  if (mask.defined()) m = mask;
  return at::scaled_dot_product_attention(heads_to_bhsd(q, h), heads_to_bhsd(k, h), heads_to_bhsd(v, h), m, 0.0,
                                          false, scale)
      .transpose(1, 2);
}

// lse (B x H x Nq) from the explicit float64 logits of q, k (BSHD) under a bool mask.
at::Tensor lse_bshd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& mask, double scale) {
  const int64_t h = std::max(q.size(2), k.size(2));
  const at::Tensor kt = heads_to_bhsd(k.to(at::kDouble), h);
  at::Tensor s = at::matmul(heads_to_bhsd(q.to(at::kDouble), h), kt.transpose(2, 3)) * scale;
  s = s.masked_fill(mask.logical_not(), -std::numeric_limits<double>::infinity());
  return at::logsumexp(s, -1);
}

struct Shape {
  int64_t b, nq, nk, hq, hkv, d, dv;
};

// Random BSHD q, k, v of a shape, in dtype t.
std::tuple<at::Tensor, at::Tensor, at::Tensor> make_qkv(const Shape& s, at::ScalarType t) {
  const auto o = at::TensorOptions().dtype(t);
  return {at::randn({s.b, s.nq, s.hq, s.d}, o), at::randn({s.b, s.nk, s.hkv, s.d}, o),
          at::randn({s.b, s.nk, s.hkv, s.dv}, o)};
}

const std::vector<Shape> kShapes = {
    {2, 37, 53, 4, 4, 40, 40},   // awkward lengths, seq_q < seq_k
    {1, 64, 64, 4, 1, 64, 32},   // MQA, head_dim_v != head_dim
    {3, 1, 17, 2, 2, 16, 16},    // one query (decode)
    {1, 97, 61, 6, 2, 59, 59},   // GQA 3:1, seq_q > seq_k, odd head_dim
};

// Acceptance rule (FlashAttention's): strata's error against the float64 truth is at most twice
// PyTorch's own error computing the same thing in the same precision, plus a floor for draws on
// which PyTorch happens to be unusually exact. fp32 floor 1e-6: ~8 ulps of the largest output
// (both round every logit, exp and sum to fp32; measured errors of either are 2e-7..1.6e-6 on
// these sizes). A masking, indexing or scaling bug gives errors of order 1e-1.
constexpr double kFp32Floor = 1e-6;
// bf16 floor 2^-8: one unit roundoff of bf16, paid by the final rounding of every output.
constexpr double kBf16Floor = 0.00390625;

// Checks every got[i] against want[i] (float64 truth) with the rule above; torch[i] is PyTorch's
// result in the precision of got.
void expect_as_close_as_torch(const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& want,
                              const std::vector<at::Tensor>& torch, double floor, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  ASSERT_EQ(torch.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = rel_err(got[i], want[i]), err_torch = rel_err(torch[i], want[i]);
    ASSERT_TRUE(std::isfinite(err_torch)) << what << ", tensor " << i << ": PyTorch's own result is not finite";
    EXPECT_LE(err, 2 * err_torch + floor) << what << ", tensor " << i << " (0 = out, 1..3 = dq, dk, dv); "
                                          << "PyTorch's error " << err_torch;
  }
}

TEST(TorchAttention, ForwardMatchesSdpaFp32) {
  at::manual_seed(0);
  for (const Shape& s : kShapes)
    for (bool causal : {false, true}) {
      auto [q, k, v] = make_qkv(s, at::kFloat);
      st::AttentionArgs a;
      a.causal = causal;
      auto [out, lse] = st::attention_forward(q, k, v, a);
      ASSERT_EQ(out.sizes(), (at::IntArrayRef{s.b, s.nq, s.hq, s.dv}));
      ASSERT_EQ(lse.sizes(), (at::IntArrayRef{s.b, s.hq, s.nq}));
      ASSERT_EQ(lse.scalar_type(), at::kFloat);
      const at::Tensor mask = allowed_mask(s.nq, s.nk, causal);
      // Rows with no allowed key (causal, seq_q > seq_k) output zeros by strata's definition.
      const at::Tensor row_ok = mask.any(-1).view({1, s.nq, 1, 1});
      const at::Tensor want =
          sdpa_bshd(q.to(at::kDouble), k.to(at::kDouble), v.to(at::kDouble), mask).nan_to_num(0.0) * row_ok;
      const at::Tensor torch_out = sdpa_bshd(q, k, v, mask).nan_to_num(0.0) * row_ok;
      expect_as_close_as_torch({out}, {want}, {torch_out}, kFp32Floor,
                               "shape b=" + std::to_string(s.b) + " nq=" + std::to_string(s.nq) +
                                   " nk=" + std::to_string(s.nk) + " hq=" + std::to_string(s.hq) +
                                   " hkv=" + std::to_string(s.hkv) + " d=" + std::to_string(s.d) +
                                   " causal=" + std::to_string(causal));
      const at::Tensor want_lse = lse_bshd(q, k, mask, 1.0 / std::sqrt(double(s.d)));
      const at::Tensor finite = want_lse.isfinite();
      EXPECT_TRUE(at::equal(lse.isfinite(), finite));
      // lse is O(log seq_k + |logits|) and made of one fp32 max, exp-sum and log: a few ulps.
      EXPECT_LE(rel_err(lse.masked_select(finite), want_lse.masked_select(finite)), kFp32Floor);
    }
}

TEST(TorchAttention, BhsdLayoutAndStridedInputs) {
  at::manual_seed(1);
  const Shape s{2, 33, 45, 4, 2, 24, 16};
  auto [q, k, v] = make_qkv(s, at::kFloat);
  st::AttentionArgs a;
  a.causal = true;
  const at::Tensor want = std::get<0>(st::attention_forward(q, k, v, a));
  // The same data, stored head-major (BHSD memory) but passed as BSHD views: any strides work,
  // and out follows q's memory order (empty_like-style).
  const at::Tensor qh = q.transpose(1, 2).contiguous(), kh = k.transpose(1, 2).contiguous(),
                   vh = v.transpose(1, 2).contiguous();
  const at::Tensor out_view = std::get<0>(st::attention_forward(qh.transpose(1, 2), kh.transpose(1, 2),
                                                                vh.transpose(1, 2), a));
  EXPECT_EQ(rel_err(out_view, want), 0.0);
  EXPECT_TRUE(out_view.transpose(1, 2).is_contiguous());
  // layout "bhsd" on the head-major tensors: out is B x Hq x Nq x Dv.
  a.layout = "bhsd";
  auto [out_bhsd, lse] = st::attention_forward(qh, kh, vh, a);
  ASSERT_EQ(out_bhsd.sizes(), (at::IntArrayRef{s.b, s.hq, s.nq, s.dv}));
  EXPECT_TRUE(out_bhsd.is_contiguous());
  EXPECT_EQ(rel_err(out_bhsd.transpose(1, 2), want), 0.0);
  // A padded last dim (row stride > head_dim) reads the same values.
  const at::Tensor qp = at::zeros({s.b, s.nq, s.hq, s.d + 5}).narrow(3, 0, s.d).copy_(q);
  a.layout = "bshd";
  EXPECT_EQ(rel_err(std::get<0>(st::attention_forward(qp, k, v, a)), want), 0.0);
}

TEST(TorchAttention, AutogradMatchesSdpaFloat64) {
  at::manual_seed(2);
  for (const Shape& s : {Shape{2, 9, 13, 4, 2, 8, 6}, Shape{1, 12, 12, 2, 2, 5, 5}})
    for (bool causal : {false, true}) {
      auto [q, k, v] = make_qkv(s, at::kDouble);
      const at::Tensor g = at::randn({s.b, s.nq, s.hq, s.dv}, at::kDouble);
      st::AttentionArgs a;
      a.causal = causal;
      const auto got = out_and_grads([&](auto& x, auto& y, auto& z) { return st::attention(x, y, z, a); }, q, k, v, g);
      const at::Tensor mask = allowed_mask(s.nq, s.nk, causal);
      const auto want =
          out_and_grads([&](auto& x, auto& y, auto& z) { return sdpa_bshd(x, y, z, mask); }, q, k, v, g);
      // float64 reference vs float64 SDPA: identical math up to summation order (~1e-15).
      for (size_t i = 0; i < 4; ++i) EXPECT_LE(rel_err(got[i], want[i]), 1e-12) << "tensor " << i;
    }
}

TEST(TorchAttention, AutogradMatchesSdpaFloat32) {
  at::manual_seed(3);
  for (const Shape& s : {Shape{2, 37, 53, 4, 4, 40, 40}, Shape{1, 64, 48, 6, 2, 32, 24}})
    for (bool causal : {false, true}) {
      auto [q, k, v] = make_qkv(s, at::kFloat);
      const at::Tensor g = at::randn({s.b, s.nq, s.hq, s.dv});
      st::AttentionArgs a;
      a.causal = causal;
      const auto got = out_and_grads([&](auto& x, auto& y, auto& z) { return st::attention(x, y, z, a); }, q, k, v, g);
      const at::Tensor mask = allowed_mask(s.nq, s.nk, causal);
      const auto want = out_and_grads([&](auto& x, auto& y, auto& z) { return sdpa_bshd(x, y, z, mask); },
                                      q.to(at::kDouble), k.to(at::kDouble), v.to(at::kDouble), g);
      const auto torch32 =
          out_and_grads([&](auto& x, auto& y, auto& z) { return sdpa_bshd(x, y, z, mask); }, q, k, v, g);
      expect_as_close_as_torch(got, want, torch32, kFp32Floor, "causal=" + std::to_string(causal));
    }
}

// attention_qkvpacked: the same outputs and gradients as attention() on the three views of qkv (the
// same kernels: equal bits), its one gradient the three stacked; float64 through the reference;
// errors name qkv / layout.
TEST(TorchAttention, PackedQkvEqualsThreeViews) {
  at::manual_seed(4);
  for (bool causal : {false, true})
    for (int64_t T : {1, 37, 130}) {
      for (auto dt : {at::kFloat, at::kDouble}) {
        const at::Tensor qkv0 = at::randn({3, T, 3, 2, 24}).to(dt), g = at::randn({3, T, 2, 24}).to(dt);
        st::AttentionArgs a;
        a.causal = causal;
        const at::Tensor p = qkv0.detach().requires_grad_();
        const at::Tensor out_p = st::attention_qkvpacked(p, a);
        out_p.backward(g);
        const at::Tensor u = qkv0.detach().requires_grad_();
        const std::vector<at::Tensor> views = u.unbind(2);
        const at::Tensor out_u = st::attention(views[0], views[1], views[2], a);
        out_u.backward(g);
        EXPECT_TRUE(at::equal(out_p, out_u)) << "T " << T << " causal " << causal << " " << dt;
        EXPECT_TRUE(at::equal(p.grad(), u.grad())) << "T " << T << " causal " << causal << " " << dt;
      }
    }
  EXPECT_NE(message([] { st::attention_qkvpacked(at::randn({2, 5, 2, 2, 8})); }).find("argument 'qkv'"),
            std::string::npos);
  st::AttentionArgs bhsd;
  bhsd.layout = "bhsd";
  EXPECT_NE(message([&] { st::attention_qkvpacked(at::randn({2, 5, 3, 2, 8}), bhsd); }).find("argument 'layout'"),
            std::string::npos);
}

// A query shared by heads (heads_kv % heads_q == 0), up to head dim 1024: against the float64
// autograd of the formula with q repeated to the kv heads (SDPA; autograd sums the copies' dq), by
// the acceptance rule in float32 and bfloat16, and to round-off through the float64 reference.
TEST(TorchAttention, SharedQueryMatchesSdpaOnRepeatedQuery) {
  at::manual_seed(10);
  const std::vector<Shape> shapes = {
      {2, 37, 53, 1, 3, 40, 40},     // one query for 3 heads, seq_q < seq_k
      {1, 33, 33, 2, 8, 257, 100},   // 2 query heads, each shared by 4 kv heads, odd dims
      {1, 70, 70, 1, 8, 1024, 1024}, // Bilinear BTT's width: two query tiles
      {2, 1, 17, 1, 4, 64, 64},      // decode
  };
  for (const Shape& s : shapes)
    for (bool causal : {false, true}) {
      const std::string what = "nq=" + std::to_string(s.nq) + " hq=" + std::to_string(s.hq) +
                               " hkv=" + std::to_string(s.hkv) + " d=" + std::to_string(s.d) +
                               " causal=" + std::to_string(causal);
      st::AttentionArgs a;
      a.causal = causal;
      const at::Tensor mask = allowed_mask(s.nq, s.nk, causal);
      const auto truth = [&](auto& x, auto& y, auto& z) { return sdpa_bshd(x, y, z, mask); };
      const at::Tensor g = at::randn({s.b, s.nq, s.hkv, s.dv});
      for (at::ScalarType t : {at::kFloat, at::kBFloat16}) {
        auto [q, k, v] = make_qkv(s, t);
        const auto got =
            out_and_grads([&](auto& x, auto& y, auto& z) { return st::attention(x, y, z, a); }, q, k, v, g);
        ASSERT_EQ(got[0].sizes(), (at::IntArrayRef{s.b, s.nq, s.hkv, s.dv})) << what;
        ASSERT_EQ(got[1].sizes(), q.sizes()) << what;
        const auto want = out_and_grads(truth, q.to(at::kDouble), k.to(at::kDouble), v.to(at::kDouble), g);
        // fp32: the kernel sums its dot products of length d (and dv) in order, so their round-off
        // grows like eps * sqrt(length); kFp32Floor was measured at d <= 128: scaled by
        // sqrt(d / 64) beyond (4e-6 at d = 1024; torch's GEMMs sum in blocks and come out lower).
        const double fp32_floor = kFp32Floor * std::max(1.0, std::sqrt(double(std::max(s.d, s.dv)) / 64));
        expect_as_close_as_torch(got, want, out_and_grads(truth, q, k, v, g),
                                 t == at::kFloat ? fp32_floor : kBf16Floor, what + " " + c10::toString(t));
        if (t == at::kFloat) {
          const at::Tensor lse = std::get<1>(st::attention_forward(q, k, v, a));
          EXPECT_LE(rel_err(lse, lse_bshd(q, k, mask, 1.0 / std::sqrt(double(s.d)))), kFp32Floor) << what;
        }
      }
      if (s.d > 64) continue;  // the float64 reference materialises everything: small shapes only
      auto [q, k, v] = make_qkv(s, at::kDouble);
      const auto got = out_and_grads([&](auto& x, auto& y, auto& z) { return st::attention(x, y, z, a); }, q, k, v, g);
      const auto want = out_and_grads(truth, q, k, v, g);
      for (size_t i = 0; i < 4; ++i) EXPECT_LE(rel_err(got[i], want[i]), 1e-12) << what << " tensor " << i;
    }
}

// A q expand()ed over heads (stride 0) passed with heads_q = H: the same output as the shared
// query (bit for bit: every head reads the same row), and autograd's sum over the expanded heads'
// dq equals the shared query's dq (fp32 sums in another order).
TEST(TorchAttention, ExpandedQueryEqualsSharedQuery) {
  at::manual_seed(11);
  const Shape s{2, 45, 45, 1, 4, 96, 64};
  auto [q, k, v] = make_qkv(s, at::kFloat);
  const at::Tensor g = at::randn({s.b, s.nq, s.hkv, s.dv});
  st::AttentionArgs a;
  a.causal = true;
  const auto shared = out_and_grads([&](auto& x, auto& y, auto& z) { return st::attention(x, y, z, a); }, q, k, v, g);
  const auto expanded = out_and_grads(
      [&](auto& x, auto& y, auto& z) { return st::attention(x.expand({s.b, s.nq, s.hkv, s.d}), y, z, a); }, q, k, v, g);
  EXPECT_TRUE(at::equal(shared[0], expanded[0]));
  EXPECT_LE(rel_err(expanded[1], shared[1]), 1e-6);
  EXPECT_TRUE(at::equal(shared[2], expanded[2]));
  EXPECT_TRUE(at::equal(shared[3], expanded[3]));
}

TEST(TorchAttention, MasksAndBiasMatchExplicitSdpaMask) {
  at::manual_seed(4);
  const Shape s{2, 29, 41, 4, 2, 16, 16};
  auto [q, k, v] = make_qkv(s, at::kFloat);
  st::AttentionArgs a;
  a.causal = true;
  a.window_left = 7;
  a.window_right = 2;
  a.num_global = 3;
  at::Tensor kpm = at::ones({s.b, s.nk}, at::kBool);
  kpm.index_put_({1, at::indexing::Slice(30, at::indexing::None)}, false);  // batch 1: last 11 keys padded
  a.key_padding_mask = kpm;
  a.bias = at::randn({s.nq, s.nk});  // 2-D: broadcast over batch and heads
  const at::Tensor allowed = allowed_mask(s.nq, s.nk, true, 7, 2, 3).view({1, 1, s.nq, s.nk}) &
                             kpm.view({s.b, 1, 1, s.nk});
  const at::Tensor fmask = a.bias->to(at::kDouble).masked_fill(allowed.logical_not(),
                                                               -std::numeric_limits<double>::infinity());
  const at::Tensor g = at::randn({s.b, s.nq, s.hq, s.dv});
  const auto got = out_and_grads([&](auto& x, auto& y, auto& z) { return st::attention(x, y, z, a); }, q, k, v, g);
  const auto want = out_and_grads([&](auto& x, auto& y, auto& z) { return sdpa_bshd(x, y, z, fmask); },
                                  q.to(at::kDouble), k.to(at::kDouble), v.to(at::kDouble), g);
  const auto torch32 = out_and_grads([&](auto& x, auto& y, auto& z) { return sdpa_bshd(x, y, z, fmask.to(at::kFloat)); },
                                     q, k, v, g);
  expect_as_close_as_torch(got, want, torch32, kFp32Floor, "causal + window + global + padding + bias");
}

TEST(TorchAttention, FullyMaskedRowsAreZeroWithZeroGrad) {
  at::manual_seed(5);
  const Shape s{2, 6, 8, 2, 2, 4, 4};
  for (at::ScalarType t : {at::kFloat, at::kDouble}) {
    auto [q, k, v] = make_qkv(s, t);
    at::Tensor kpm = at::ones({s.b, s.nk}, at::kBool);
    kpm[1].fill_(false);  // batch 1 sees no key at all
    st::AttentionArgs a;
    a.key_padding_mask = kpm;
    const auto got = out_and_grads([&](auto& x, auto& y, auto& z) { return st::attention(x, y, z, a); }, q, k, v,
                                   at::ones({s.b, s.nq, s.hq, s.dv}));
    for (size_t i = 0; i < 4; ++i) {
      EXPECT_FALSE(got[i].isnan().any().item<bool>()) << "tensor " << i;
      EXPECT_EQ(got[i][1].abs().max().item<double>(), 0.0) << "tensor " << i;
      EXPECT_GT(got[i][0].abs().max().item<double>(), 0.0) << "tensor " << i;
    }
    if (t == at::kFloat) {
      const at::Tensor lse = std::get<1>(st::attention_forward(q, k, v, a));
      EXPECT_TRUE((lse[1] == -std::numeric_limits<float>::infinity()).all().item<bool>());
    }
  }
}

// No keys at all (seq_k = 0), dense and MLR, through autograd: zeros out, zero dq, empty dk / dv.
// (The backward's work-item split once computed 0 splits here and asked for a buffer of -1 dQ
// sizes: "cannot create std::vector larger than max_size()".)
TEST(TorchAttention, NoKeysGiveZerosAndZeroGradients) {
  at::manual_seed(9);
  const at::Tensor q = at::randn({2, 5, 3, 8}), k = at::randn({2, 0, 3, 8}), v = at::randn({2, 0, 3, 8});
  st::MlrArgs m;
  m.ranks = {4, 4};
  m.causal = false;
  m.context = 8;
  const std::vector<std::function<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&)>> ops = {
      [](const at::Tensor& x, const at::Tensor& y, const at::Tensor& z) { return st::attention(x, y, z, {}); },
      [&m](const at::Tensor& x, const at::Tensor& y, const at::Tensor& z) { return st::mlr_attention(x, y, z, m); }};
  for (size_t i = 0; i < ops.size(); ++i) {
    SCOPED_TRACE(i == 0 ? "attention" : "mlr_attention");
    const auto got = out_and_grads([&](auto& x, auto& y, auto& z) { return ops[i](x, y, z); }, q, k, v,
                                   at::ones({2, 5, 3, 8}));
    EXPECT_EQ(got[0].abs().max().item<double>(), 0.0);
    EXPECT_EQ(got[1].abs().max().item<double>(), 0.0);
    EXPECT_EQ(got[2].numel(), 0);
    EXPECT_EQ(got[3].numel(), 0);
  }
}

// GSWA against its definition: softmax_causal(s_a q_a k_a^T) V + softmax_window(s_b q_b k_b^T) V.
// scales: (s_a, s_b) passed to paper_gswa_attention (nullopt = the default); want: the values the
// truth uses, rounded to float32 as the core stores AttentionOptions::scale.
void expect_gswa_matches_composition(std::optional<double> scale_a, std::optional<double> scale_b, double want_a,
                                     double want_b) {
  at::manual_seed(6);
  const Shape s{2, 21, 21, 3, 3, 12, 10};
  const int64_t split = 5, window = 4;
  const double sa = double(float(want_a)), sb = double(float(want_b));
  for (at::ScalarType t : {at::kDouble, at::kFloat}) {
    auto [q, k, v] = make_qkv(s, t);
    const at::Tensor g = at::randn({s.b, s.nq, s.hq, s.dv});
    const auto got = out_and_grads(
        [&](auto& x, auto& y, auto& z) { return st::paper_gswa_attention(x, y, z, split, window, scale_a, scale_b); },
        q, k, v, g);
    const at::Tensor ma = allowed_mask(s.nq, s.nk, true), mb = allowed_mask(s.nq, s.nk, true, window, 0);
    const auto composition = [&](auto& x, auto& y, auto& z) {
      return sdpa_bshd(x.narrow(3, 0, split), y.narrow(3, 0, split), z, ma, sa) +
             sdpa_bshd(x.narrow(3, split, s.d - split), y.narrow(3, split, s.d - split), z, mb, sb);
    };
    const auto want = out_and_grads(composition, q.to(at::kDouble), k.to(at::kDouble), v.to(at::kDouble), g);
    if (t == at::kDouble) {
      // float64 reference vs float64 SDPA: same math up to summation order.
      for (size_t i = 0; i < 4; ++i) EXPECT_LE(rel_err(got[i], want[i]), 1e-12) << "tensor " << i;
    } else {
      expect_as_close_as_torch(got, want, out_and_grads(composition, q, k, v, g), kFp32Floor, "paper GSWA fp32");
    }
  }
}

// Default scales: the reference code's 8/a for the global branch and 8/b for the windowed one
// (CausalSelfGlobalSlidingWindowAttention; a = 5, b = 12 - 5 = 7).
TEST(TorchAttention, PaperGswaDefaultScalesAreTheReferenceCodes) {
  expect_gswa_matches_composition(std::nullopt, std::nullopt, 8.0 / 5, 8.0 / 7);
}

// A given scale overrides its own branch only.
TEST(TorchAttention, PaperGswaPerBranchScalesOverride) {
  expect_gswa_matches_composition(0.3, std::nullopt, 0.3, 8.0 / 7);
  expect_gswa_matches_composition(std::nullopt, 0.45, 8.0 / 5, 0.45);
  expect_gswa_matches_composition(1.0 / std::sqrt(12.0), 1.0 / std::sqrt(12.0), 1.0 / std::sqrt(12.0),
                                  1.0 / std::sqrt(12.0));
}

TEST(TorchAttention, ErrorsNameTheArgument) {
  const at::Tensor q = at::randn({1, 4, 2, 8}), k = at::randn({1, 5, 2, 8}), v = at::randn({1, 5, 2, 8});
  st::AttentionArgs a;
  EXPECT_NE(message([&] { st::view_of(at::randn({2}, at::kMeta), "q"); }).find("argument 'q': expected a CPU tensor"),
            std::string::npos);
  // The dtypes the function accepts, not every dtype a view can hold.
  EXPECT_NE(message([&] { st::attention_forward(q.to(at::kInt), k, v, a); })
                .find("attention_forward: argument 'q': expected dtype float32 or bfloat16, got int32"),
            std::string::npos);
  EXPECT_NE(message([&] { st::attention(q.to(at::kInt), k, v, a); })
                .find("attention: argument 'q': expected dtype float32, bfloat16 or float64, got int32"),
            std::string::npos);
  st::AttentionArgs f64_bias;
  f64_bias.bias = at::zeros({4, 5}, at::kDouble);
  EXPECT_NE(message([&] { st::attention_forward(q, k, v, f64_bias); })
                .find("argument 'bias': expected dtype float32, got float64"),
            std::string::npos);
  EXPECT_NE(message([&] { st::attention_forward(q, at::randn({1, 5, 2, 7}), v, a); }).find("argument 'k'"),
            std::string::npos);
  EXPECT_NE(message([&] { st::attention_forward(q, k, v.to(at::kBFloat16), a); }).find("argument 'v'"),
            std::string::npos);
  EXPECT_NE(message([&] { st::attention_forward(q.view({4, 16}), k, v, a); })
                .find("argument 'q': expected a 4-D tensor"),
            std::string::npos);
  st::AttentionArgs bad_layout;
  bad_layout.layout = "bsdh";
  EXPECT_NE(message([&] { st::attention(q, k, v, bad_layout); }).find("argument 'layout'"), std::string::npos);
  st::AttentionArgs bad_mask;
  bad_mask.key_padding_mask = at::ones({1, 4}, at::kBool);
  EXPECT_NE(message([&] { st::attention(q, k, v, bad_mask); }).find("argument 'key_padding_mask'"),
            std::string::npos);
  EXPECT_NE(message([&] { st::attention(q.to(at::kDouble), k.to(at::kDouble), v.to(at::kDouble), bad_mask); })
                .find("argument 'key_padding_mask'"),
            std::string::npos);
  st::AttentionArgs grad_bias;
  grad_bias.bias = at::zeros({4, 5}).requires_grad_();
  EXPECT_NE(message([&] { st::attention(q, k, v, grad_bias); }).find("argument 'bias'"), std::string::npos);
  EXPECT_NE(message([&] { st::paper_gswa_attention(q, k, v, 8, 2); }).find("argument 'split_a'"),
            std::string::npos);
  EXPECT_NE(message([&] { st::paper_gswa_attention(q, k, v, 3, 2, std::nullopt, INFINITY); })
                .find("paper_gswa_attention: argument 'scale_b'"),
            std::string::npos);
  EXPECT_THROW(st::attention_forward(q.to(at::kDouble), k.to(at::kDouble), v.to(at::kDouble), a), strata::Error);
  // Heads: one of heads_q, heads_kv must divide the other.
  const at::Tensor k3 = at::randn({1, 5, 3, 8}), v3 = at::randn({1, 5, 3, 8});
  EXPECT_NE(message([&] { st::attention(q, k3, v3, a); })
                .find("attention_forward: argument 'k': expected heads dividing q's heads (2) (GQA) or a multiple of them"),
            std::string::npos);
  EXPECT_NE(message([&] { st::attention(q.to(at::kDouble), k3.to(at::kDouble), v3.to(at::kDouble), a); })
                .find("argument 'k': expected heads dividing"),
            std::string::npos);
  // A shared query's dout has the kv heads (those of out).
  const at::Tensor q1 = at::randn({1, 4, 1, 8});
  auto [o1, l1] = st::attention_forward(q1, k, v, a);
  EXPECT_NE(message([&] { st::attention_backward(q1, k, v, o1, l1, at::randn({1, 4, 1, 8}), a); })
                .find("attention_backward: argument 'dout'"),
            std::string::npos);
}

TEST(TorchAttention, OpsCallableThroughDispatcher) {
  at::manual_seed(7);
  const Shape s{2, 11, 19, 4, 2, 8, 8};
  auto [q, k, v] = make_qkv(s, at::kFloat);
  using Fwd = std::tuple<at::Tensor, at::Tensor>(
      const at::Tensor&, const at::Tensor&, const at::Tensor&, std::optional<double>, bool, int64_t, int64_t, int64_t,
      const std::optional<at::Tensor>&, const std::optional<at::Tensor>&, c10::string_view, c10::string_view);
  const auto handle = c10::Dispatcher::singleton().findSchemaOrThrow("strata::attention_forward", "");
  const auto& schema = handle.schema();
  ASSERT_EQ(schema.returns().size(), 2u);
  EXPECT_EQ(schema.returns()[0].name(), "out");
  EXPECT_EQ(schema.returns()[1].name(), "lse");
  const auto op = handle.typed<Fwd>();
  auto [out, lse] = op.call(q, k, v, 0.3, true, 5, -1, 1, std::nullopt, std::nullopt, "bshd", "auto");
  st::AttentionArgs a;
  a.scale = 0.3;
  a.causal = true;
  a.window_left = 5;
  a.num_global = 1;
  auto [want_out, want_lse] = st::attention_forward(q, k, v, a);
  EXPECT_TRUE(at::equal(out, want_out));
  EXPECT_TRUE(at::equal(lse, want_lse));

  // The backward op agrees with autograd through the differentiable op.
  using Bwd = std::tuple<at::Tensor, at::Tensor, at::Tensor>(
      const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
      std::optional<double>, bool, int64_t, int64_t, int64_t, const std::optional<at::Tensor>&,
      const std::optional<at::Tensor>&, c10::string_view, c10::string_view);
  const at::Tensor g = at::randn_like(out);
  auto [dq, dk, dv] = c10::Dispatcher::singleton()
                          .findSchemaOrThrow("strata::attention_backward", "")
                          .typed<Bwd>()
                          .call(q, k, v, out, lse, g, 0.3, true, 5, -1, 1, std::nullopt, std::nullopt, "bshd", "auto");
  using Attn = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, std::optional<double>, bool,
                          int64_t, int64_t, int64_t, const std::optional<at::Tensor>&,
                          const std::optional<at::Tensor>&, c10::string_view, c10::string_view);
  const auto attn = c10::Dispatcher::singleton().findSchemaOrThrow("strata::attention", "").typed<Attn>();
  const auto got = out_and_grads(
      [&](auto& x, auto& y, auto& z) {
        return attn.call(x, y, z, 0.3, true, 5, -1, 1, std::nullopt, std::nullopt, "bshd", "auto");
      },
      q, k, v, g);
  EXPECT_TRUE(at::equal(got[0], out));
  EXPECT_TRUE(at::equal(got[1], dq));
  EXPECT_TRUE(at::equal(got[2], dk));
  EXPECT_TRUE(at::equal(got[3], dv));
  EXPECT_NO_THROW(c10::Dispatcher::singleton().findSchemaOrThrow("strata::paper_gswa_attention", ""));

  // Through the dispatcher a strata::Error arrives as a c10::Error with the same message.
  try {
    op.call(q, k.narrow(3, 0, 7), v, std::nullopt, false, -1, -1, 0, std::nullopt, std::nullopt, "bshd", "auto");
    ADD_FAILURE() << "expected a c10::Error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("attention_forward: argument 'k'"), std::string::npos)
        << e.what_without_backtrace();
  }
}

// The kernels alone are not differentiable: through the dispatcher (as from
// Python) their outputs do not require grad even when the inputs do, rather than requiring grad
// and leaving the inputs without a gradient at backward. The C++ functions behave the same.
TEST(TorchAttention, ForwardAndBackwardOpsAreNotDifferentiable) {
  at::manual_seed(9);
  const Shape s{1, 6, 6, 2, 2, 8, 8};
  auto [q, k, v] = make_qkv(s, at::kFloat);
  for (at::Tensor* t : {&q, &k, &v}) t->requires_grad_();
  ASSERT_TRUE(at::GradMode::is_enabled());
  auto& dispatcher = c10::Dispatcher::singleton();
  using Fwd = std::tuple<at::Tensor, at::Tensor>(
      const at::Tensor&, const at::Tensor&, const at::Tensor&, std::optional<double>, bool, int64_t, int64_t, int64_t,
      const std::optional<at::Tensor>&, const std::optional<at::Tensor>&, c10::string_view, c10::string_view);
  auto [out, lse] = dispatcher.findSchemaOrThrow("strata::attention_forward", "")
                        .typed<Fwd>()
                        .call(q, k, v, std::nullopt, true, -1, -1, 0, std::nullopt, std::nullopt, "bshd", "auto");
  EXPECT_FALSE(out.requires_grad());
  EXPECT_FALSE(lse.requires_grad());
  using Bwd = std::tuple<at::Tensor, at::Tensor, at::Tensor>(
      const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
      std::optional<double>, bool, int64_t, int64_t, int64_t, const std::optional<at::Tensor>&,
      const std::optional<at::Tensor>&, c10::string_view, c10::string_view);
  const at::Tensor g = at::randn_like(out).requires_grad_();
  auto [dq, dk, dv] =
      dispatcher.findSchemaOrThrow("strata::attention_backward", "")
          .typed<Bwd>()
          .call(q, k, v, out, lse, g, std::nullopt, true, -1, -1, 0, std::nullopt, std::nullopt, "bshd", "auto");
  for (const at::Tensor& t : {dq, dk, dv}) EXPECT_FALSE(t.requires_grad());
  st::AttentionArgs a;
  a.causal = true;
  EXPECT_FALSE(std::get<0>(st::attention_forward(q, k, v, a)).requires_grad());
  EXPECT_FALSE(std::get<0>(st::attention_backward(q, k, v, out, lse, g, a)).requires_grad());
  EXPECT_TRUE(st::attention(q, k, v, a).requires_grad());  // the differentiable one still is
}

TEST(TorchAttention, Bfloat16ForwardAndBackwardCloseToFloat64) {
  at::manual_seed(8);
  const Shape s{2, 40, 40, 4, 2, 32, 32};
  auto [q, k, v] = make_qkv(s, at::kBFloat16);
  const at::Tensor g = at::randn({s.b, s.nq, s.hq, s.dv}).to(at::kBFloat16);
  st::AttentionArgs a;
  a.causal = true;
  const auto got = out_and_grads([&](auto& x, auto& y, auto& z) { return st::attention(x, y, z, a); }, q, k, v, g);
  EXPECT_EQ(got[0].scalar_type(), at::kBFloat16);
  const at::Tensor mask = allowed_mask(s.nq, s.nk, true);
  const auto want = out_and_grads([&](auto& x, auto& y, auto& z) { return sdpa_bshd(x, y, z, mask); },
                                  q.to(at::kDouble), k.to(at::kDouble), v.to(at::kDouble), g);
  const auto torch_bf16 =
      out_and_grads([&](auto& x, auto& y, auto& z) { return sdpa_bshd(x, y, z, mask); }, q, k, v, g);
  expect_as_close_as_torch(got, want, torch_bf16, kBf16Floor, "bf16 causal");
}

}  // namespace
