// tests/cpp/torch_bilinear_test.cpp: the bilinear BTT / MLR scoring layers
// (torch/bilinear_attention.cpp) and the muP support (torch/mup.cpp), against direct
// transcriptions of the formulas of strata/torch/bilinear_attention.h written here element by
// element (the BTT matrix M_h and the block-diagonal level matrices built from index lists, the
// layer as einsums and an explicit softmax), in float64 with autograd of the transcription for the
// gradients; the reference's BTT factorisation; the shared-query view through the dense op; the RMS
// cap; muP roles, init statistics, learning-rate groups and the AdamW settings; errors.
//
// Tolerances (normwise: max |got - want| / max |want|):
//   float64: 1e-11. Both sides are exact math in double; they differ by summation order over at
//   most a few hundred terms (~1e-14); an index or scale error is of order 1.
//   float32 module vs the float64 transcription: 1e-4 forward, 5e-4 gradients. fp32 round-off
//   (6e-8) grows through two GEMMs, a LayerNorm, logits of magnitude up to ~5 and a softmax over
//   <= 7 keys to ~1e-5; gradients subtract rowsum(dO * O), so 5x more.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/autograd.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "strata/error.h"
#include "strata/torch/attention.h"
#include "strata/torch/bilinear_attention.h"
#include "strata/torch/mup.h"
#include "torch_test_util.h"

namespace {

namespace st = strata::torch;
using strata::test::message;
using strata::test::rel_err;

constexpr double kF64Tol = 1e-11, kF32FwdTol = 1e-4, kF32GradTol = 5e-4;

const auto kF64 = at::TensorOptions().dtype(at::kDouble);

at::Tensor index_tensor(const std::vector<int64_t>& v) { return at::tensor(v, at::TensorOptions().dtype(at::kLong)); }

// ---- transcriptions of the formulas ------------------------------------------------------------

// M: H x (a*b) x (c*d), M[h][(i_a*b + j_b)][(i_c*d + i_d)] =
//   sum_sigma W_Q[h*b + j_b, i_a, i_c*s + sigma] * W_K[i_c, i_d, (h*b + j_b)*s + sigma],
// gathered entry by entry from index lists (differentiable in the cores).
at::Tensor btt_dense(const at::Tensor& w_k, const at::Tensor& w_q, int64_t H, const st::BttShape& sh, int64_t s) {
  const auto [a, b, c, d] = sh;
  std::vector<int64_t> iq, ik;
  for (int64_t h = 0; h < H; ++h)
    for (int64_t row = 0; row < a * b; ++row)
      for (int64_t col = 0; col < c * d; ++col)
        for (int64_t sigma = 0; sigma < s; ++sigma) {
          const int64_t i_a = row / b, j_b = row % b, i_c = col / d, i_d = col % d;
          iq.push_back(((h * b + j_b) * a + i_a) * (c * s) + i_c * s + sigma);      // W_Q[h*b+j_b, i_a, i_c*s+sigma]
          ik.push_back((i_c * d + i_d) * (H * b * s) + (h * b + j_b) * s + sigma);  // W_K[i_c, i_d, (h*b+j_b)*s+sigma]
        }
  const at::Tensor prod =
      w_q.flatten().index_select(0, index_tensor(iq)) * w_k.flatten().index_select(0, index_tensor(ik));
  return prod.view({H, a * b, c * d, s}).sum(-1);
}

// A: H x (r*p) x (p*m), A[h][rho*p + k][k*m + j] = w[k, j, h*r + rho], zero off the blocks.
at::Tensor block_diag_dense(const at::Tensor& w, int64_t H) {
  const int64_t p = w.size(0), m = w.size(1), r = w.size(2) / H;
  std::vector<int64_t> dst, src;
  for (int64_t h = 0; h < H; ++h)
    for (int64_t rho = 0; rho < r; ++rho)
      for (int64_t k = 0; k < p; ++k)
        for (int64_t j = 0; j < m; ++j) {
          dst.push_back((h * r * p + rho * p + k) * (p * m) + k * m + j);
          src.push_back((k * m + j) * (H * r) + h * r + rho);
        }
  const at::Tensor zeros = at::zeros({H * r * p * p * m}, w.options());
  return at::index_put(zeros, {index_tensor(dst)}, w.flatten().index_select(0, index_tensor(src)))
      .view({H, r * p, p * m});
}

// LayerNorm over the last dim written out (biased variance, eps 1e-5); b may be undefined.
at::Tensor layer_norm_by_hand(const at::Tensor& z, const at::Tensor& w, const at::Tensor& b) {
  const at::Tensor mean = z.mean(-1, true), var = (z - mean).square().mean(-1, true);
  const at::Tensor y = (z - mean) / (var + 1e-5).sqrt() * w;
  return b.defined() ? y + b : y;
}

// The RMS cap written out: W / (RMS / sigma*) when that ratio exceeds 1, else W.
at::Tensor capped_by_hand(const at::Tensor& w, int64_t d_in, int64_t d_out, bool on = true) {
  if (!on) return w;
  const double sigma = std::sqrt(double(std::min(d_in, d_out))) / double(d_in);
  const at::Tensor ratio = (w.square().mean() + 1e-8).sqrt() / sigma;
  return ratio.item<double>() > 1 ? w / ratio : w;
}

// softmax(scale * q k^T, causal) v per (batch, head): q, k B x T x H x E, v B x T x H x V.
at::Tensor attend_by_hand(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale, bool causal) {
  at::Tensor S = at::einsum("bthe,bshe->bhts", {q, k}) * scale;
  if (causal) {
    const int64_t T = q.size(1);
    S = S.masked_fill(at::ones({T, T}, at::TensorOptions().dtype(at::kBool)).triu(1), -INFINITY);
  }
  return at::einsum("bhts,bshv->bthv", {at::softmax(S, -1), v});
}

at::Tensor linear_by_hand(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  const at::Tensor y = at::matmul(x, w.t());
  return b.defined() ? y + b : y;
}

struct BttCase {
  int64_t D, H, s;
  std::string factorization = "ref";
  std::optional<st::BttShape> shape = std::nullopt;
  std::string logit = "sp";
  bool bias = false, x_ln = false, causal = true, cap = true;
  double core_scale = 1.0;  // cores drawn at this multiple of sigma*: > 1 engages the cap
};

st::BilinearBTTAttentionOptions options_of(const BttCase& c) {
  return st::BilinearBTTAttentionOptions(c.D, c.H)
      .btt_rank(c.s)
      .factorization(c.factorization)
      .btt_shape(c.shape)
      .logit_scale(c.logit)
      .bias(c.bias)
      .x_layernorm(c.x_ln)
      .causal(c.causal)
      .rms_cap(c.cap);
}

// The layer of the header's file comment, from the transcriptions above.
at::Tensor btt_layer_by_hand(const at::Tensor& x, const st::BilinearBTTWeights& w, const BttCase& c,
                             const st::BttShape& sh) {
  const int64_t B = x.size(0), T = x.size(1), D = c.D, H = c.H;
  const at::Tensor h = w.x_norm_weight.defined() ? layer_norm_by_hand(x, w.x_norm_weight, w.x_norm_bias) : x;
  const at::Tensor M = btt_dense(capped_by_hand(w.w_k, sh.d, H * sh.b * c.s, c.cap),
                                 capped_by_hand(w.w_q, sh.c * c.s, sh.a, c.cap), H, sh, c.s);  // H x D x D
  const at::Tensor keys = layer_norm_by_hand(at::einsum("hij,btj->bthi", {M, h}), w.key_norm_weight, w.key_norm_bias);
  const at::Tensor v = linear_by_hand(h, w.v_weight, w.v_bias).view({B, T, H, D / H});
  const double scale = c.logit == "sp" ? 1.0 / std::sqrt(double(D)) : 1.0 / double(D);
  const at::Tensor y = attend_by_hand(h.unsqueeze(2).expand_as(keys), keys, v, scale, c.causal);
  return linear_by_hand(y.reshape({B, T, D}), w.out_weight, w.out_bias);
}

struct MlrCase {
  int64_t D, H;
  std::vector<int64_t> ranks;
  std::string logit = "sp";
  bool qk_ln = true, bias = false, divide = false, causal = true, cap = true;
  double core_scale = 1.0;
};

st::BilinearMLRAttentionOptions options_of(const MlrCase& c) {
  return st::BilinearMLRAttentionOptions(c.D, c.H, c.ranks)
      .logit_scale(c.logit)
      .qk_layernorm(c.qk_ln)
      .bias(c.bias)
      .divide_by_num_levels(c.divide)
      .causal(c.causal)
      .rms_cap(c.cap);
}

at::Tensor mlr_layer_by_hand(const at::Tensor& x, const st::BilinearMLRWeights& w, const MlrCase& c) {
  const int64_t B = x.size(0), T = x.size(1), D = c.D, H = c.H, L = int64_t(c.ranks.size());
  at::Tensor S;  // B x H x T x T, sum over levels
  for (int64_t l = 0; l < L; ++l) {
    const int64_t p = int64_t(1) << l, r = c.ranks[size_t(l)];
    const auto feats = [&](const at::Tensor& wl) {  // B x T x H x (r*p)
      return at::einsum("hfi,bti->bthf", {block_diag_dense(capped_by_hand(wl, D / p, H * r, c.cap), H), x});
    };
    at::Tensor q = feats(w.w_q[size_t(l)]), k = feats(w.w_k[size_t(l)]);
    if (c.qk_ln) {
      const auto bias_of = [&](const std::vector<at::Tensor>& v) { return v.empty() ? at::Tensor() : v[size_t(l)]; };
      q = layer_norm_by_hand(q, w.q_norm_weight[size_t(l)], bias_of(w.q_norm_bias));
      k = layer_norm_by_hand(k, w.k_norm_weight[size_t(l)], bias_of(w.k_norm_bias));
    }
    const double rp = double(r * p), c_l = c.logit == "sp" ? 1.0 / std::sqrt(rp) : 8.0 / rp;
    const at::Tensor S_l = at::einsum("bthe,bshe->bhts", {q, k}) * c_l;
    S = S.defined() ? S + S_l : S_l;
  }
  if (c.divide) S = S / double(L);
  if (c.causal) S = S.masked_fill(at::ones({T, T}, at::TensorOptions().dtype(at::kBool)).triu(1), -INFINITY);
  const at::Tensor v = linear_by_hand(x, w.v_weight, w.v_bias).view({B, T, H, D / H});
  const at::Tensor y = at::einsum("bhts,bshv->bthv", {at::softmax(S, -1), v});
  return linear_by_hand(y.reshape({B, T, D}), w.out_weight, w.out_bias);
}

// ---- helpers over the weights ----------------------------------------------------------------

std::vector<at::Tensor*> fields(st::BilinearBTTWeights& w) {
  return {&w.w_k,         &w.w_q,      &w.key_norm_weight, &w.key_norm_bias, &w.x_norm_weight,
          &w.x_norm_bias, &w.v_weight, &w.v_bias,          &w.out_weight,    &w.out_bias};
}
std::vector<at::Tensor*> fields(st::BilinearMLRWeights& w) {
  std::vector<at::Tensor*> f = {&w.v_weight, &w.v_bias, &w.out_weight, &w.out_bias};
  for (auto* v : {&w.w_q, &w.w_k, &w.q_norm_weight, &w.q_norm_bias, &w.k_norm_weight, &w.k_norm_bias})
    for (at::Tensor& t : *v) f.push_back(&t);
  return f;
}
// The defined weights, in fields() order.
template <class W>
std::vector<at::Tensor> leaves(W w) {
  std::vector<at::Tensor> out;
  for (at::Tensor* t : fields(w))
    if (t->defined()) out.push_back(*t);
  return out;
}
// A copy whose defined weights are fresh float64 leaves requiring grad.
template <class W>
W detached_f64(W w) {
  for (at::Tensor* t : fields(w))
    if (t->defined()) *t = t->detach().to(at::kDouble).clone().requires_grad_();
  return w;
}

// Random weights: gains around 1, the rest around 0; cores at core_scale x sigma* of their cap.
void randomise(::torch::nn::Module& m, double core_scale,
               const std::map<std::string, std::pair<int64_t, int64_t>>& core_dims) {
  ::torch::NoGradGuard no_grad;
  for (auto& item : m.named_parameters()) {
    at::Tensor& p = item.value();
    const std::string& name = item.key();
    const auto core = core_dims.find(name);
    if (core != core_dims.end()) {
      const at::Tensor z = at::randn(p.sizes(), kF64);
      p.copy_(z / z.square().mean().sqrt() * core_scale * st::rms_cap_sigma(core->second.first, core->second.second));
    } else if (name.find("norm_weight") != std::string::npos) {
      p.copy_(1 + 0.3 * at::randn(p.sizes(), kF64));
    } else {
      p.copy_(0.4 * at::randn(p.sizes(), kF64));
    }
  }
}

// Forward and gradients (x first, then the weights) of loss = sum(f(x, w) * g).
template <class W, class F>
std::vector<at::Tensor> out_and_grads(F f, const at::Tensor& x0, const W& w, const at::Tensor& g) {
  const at::Tensor x = x0.detach().clone().requires_grad_();
  const at::Tensor out = f(x, w);
  std::vector<at::Tensor> inputs{x};
  for (const at::Tensor& t : leaves(w)) inputs.push_back(t);
  const auto grads = ::torch::autograd::grad({(out * g.to(out.scalar_type())).sum()}, inputs);
  std::vector<at::Tensor> r{out.detach()};
  r.insert(r.end(), grads.begin(), grads.end());
  return r;
}

// A gradient whose truth is zero up to float64 round-off (below 1e-8 of the largest gradient) is
// compared normwise against the largest gradient instead of itself: the key-side LayerNorm bias
// adds x_t . bias to every logit of row t, which the softmax cancels, so its exact gradient is 0
// and both sides hold only round-off there.
void expect_close(const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& want, double fwd_tol,
                  double grad_tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double gmax = 0;
  for (size_t i = 1; i < want.size(); ++i) gmax = std::max(gmax, want[i].abs().max().item<double>());
  for (size_t i = 0; i < got.size(); ++i) {
    const bool zero_truth = i > 0 && want[i].abs().max().item<double>() < 1e-8 * gmax;
    EXPECT_LE(rel_err(got[i], want[i], zero_truth ? gmax : 1e-30), i == 0 ? fwd_tol : grad_tol)
        << what
        << (i == 0   ? ": output"
            : i == 1 ? ": d x"
                     : ": d weight #" + std::to_string(i - 2));
  }
}

// ---- factorisation -------------------------------------------------------------------------------

TEST(TorchBilinear, FactorizeMatchesTheReference) {
  // The reference: b = d = next(f for f in divisors(D) if f > sqrt(D)), a = c = D / b.
  const std::map<int64_t, std::pair<int64_t, int64_t>> want = {{64, {4, 16}},   {256, {8, 32}},  {384, {16, 24}},
                                                               {512, {16, 32}}, {768, {24, 32}}, {1024, {16, 64}}};
  for (const auto& [D, ab] : want)
    EXPECT_EQ(st::btt_factorize(D), (st::BttShape{ab.first, ab.second, ab.first, ab.second})) << "D = " << D;
  // The same rule transcribed (divisors in increasing order, the first strictly above sqrt(D)) over 2..2048.
  for (int64_t D = 2; D <= 2048; ++D) {
    int64_t bigger = 0;
    for (int64_t f = 1; f <= D && bigger == 0; ++f)
      if (D % f == 0 && double(f) > std::sqrt(double(D))) bigger = f;
    EXPECT_EQ(st::btt_factorize(D), (st::BttShape{D / bigger, bigger, D / bigger, bigger})) << "D = " << D;
  }
  EXPECT_EQ(st::btt_factorize(97), (st::BttShape{1, 97, 1, 97}));  // a prime: (1, D)
  EXPECT_EQ(st::btt_factorize(1024, "balanced"), (st::BttShape{32, 32, 32, 32}));
  EXPECT_EQ(st::btt_factorize(36, "balanced"), (st::BttShape{6, 6, 6, 6}));
  EXPECT_NE(message([] { st::btt_factorize(1); }).find("btt_factorize: argument 'dim': expected an integer >= 2"),
            std::string::npos);
  // "balanced" is the core's rule: the divisor pair closest to sqrt(dim) (384: 16 x 24)
  EXPECT_EQ(st::btt_factorize(384, "balanced"), (st::BttShape{16, 24, 16, 24}));
  EXPECT_NE(message([] {
              st::btt_factorize(0, "balanced");
            }).find("btt_factorize: argument 'dim': expected >= 1"),
            std::string::npos);
  EXPECT_NE(message([] { st::btt_factorize(64, "square"); }).find("btt_factorize: argument 'rule'"), std::string::npos);
}

// ---- the transforms ----------------------------------------------------------------------------

TEST(TorchBilinear, BttKeyTransformIsTheIndexFormula) {
  at::manual_seed(1);
  // (a, b, c, d, s, H): the reference's square shapes, a != c, s > 1, D not a power of two.
  for (const auto& [sh, s, H] : std::vector<std::tuple<st::BttShape, int64_t, int64_t>>{
           {{3, 4, 3, 4}, 2, 2}, {{2, 6, 3, 4}, 3, 2}, {{3, 6, 3, 6}, 1, 3}, {{1, 5, 5, 1}, 2, 1}}) {
    const at::Tensor x = at::randn({2, 3, sh.c * sh.d}, kF64);
    const at::Tensor w_k = at::randn({sh.c, sh.d, H * sh.b * s}, kF64),
                     w_q = at::randn({H * sh.b, sh.a, sh.c * s}, kF64);
    const at::Tensor got = st::btt_key_transform(x, w_k, w_q, H);  // 2 x 3 x H x (a*b)
    const at::Tensor want = at::einsum("hij,btj->bthi", {btt_dense(w_k, w_q, H, sh, s), x});
    EXPECT_LE(rel_err(got, want), kF64Tol) << "a b c d = " << sh.a << sh.b << sh.c << sh.d << " s " << s;
  }
}

TEST(TorchBilinear, BlockDiagTransformIsTheIndexFormula) {
  at::manual_seed(2);
  for (const auto& [p, m, r, H] : std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>>{
           {1, 12, 3, 2}, {2, 5, 2, 3}, {4, 3, 1, 2}, {32, 3, 2, 1}}) {
    const at::Tensor x = at::randn({3, 2, p * m}, kF64), w = at::randn({p, m, H * r}, kF64);
    const at::Tensor want = at::einsum("hfi,bti->bthf", {block_diag_dense(w, H), x});
    EXPECT_LE(rel_err(st::block_diag_transform(x, w, H), want), kF64Tol) << "p " << p << " m " << m;
  }
}

// ---- the dense op with one query shared by all heads ------------------------------------------

// The module passes q as a stride-0 expand over the heads; the op must read it as H equal copies
// (forward) and hand autograd a gradient per head that expand's backward sums.
TEST(TorchBilinear, DenseOpTakesTheSharedQueryView) {
  at::manual_seed(3);
  const int64_t B = 2, T = 7, H = 3, E = 24, V = 8;
  const at::Tensor q0 = at::randn({B, T, E}), k = at::randn({B, T, H, E}), v = at::randn({B, T, H, V});
  const at::Tensor g = at::randn({B, T, H, V});
  st::AttentionArgs a;
  a.causal = true;
  a.scale = 0.25;  // exact in float32, where the op keeps its scale
  for (bool f64 : {false, true}) {
    const auto dt = f64 ? at::kDouble : at::kFloat;
    const auto run = [&](bool materialise) {
      const at::Tensor q = q0.to(dt).detach().clone().requires_grad_();
      at::Tensor qh = q.unsqueeze(2).expand({B, T, H, E});
      if (materialise) qh = qh.contiguous();
      const at::Tensor out = st::attention(qh, k.to(dt), v.to(dt), a);
      const at::Tensor dq = ::torch::autograd::grad({(out * g.to(dt)).sum()}, {q})[0];
      return std::make_pair(out.detach(), dq);
    };
    const auto [out_view, dq_view] = run(false);
    const auto [out_copy, dq_copy] = run(true);
    const at::Tensor qd = q0.to(at::kDouble).requires_grad_();
    const at::Tensor ref =
        attend_by_hand(qd.unsqueeze(2).expand({B, T, H, E}), k.to(at::kDouble), v.to(at::kDouble), 0.25, true);
    const at::Tensor dq_ref = ::torch::autograd::grad({(ref * g.to(at::kDouble)).sum()}, {qd})[0];
    const double tol = f64 ? kF64Tol : 2e-5;
    EXPECT_LE(rel_err(out_view, out_copy), tol) << "f64 " << f64;
    EXPECT_LE(rel_err(dq_view, dq_copy), tol) << "f64 " << f64;
    EXPECT_LE(rel_err(out_view, ref), tol) << "f64 " << f64;
    EXPECT_LE(rel_err(dq_view, dq_ref), f64 ? kF64Tol : 1e-4) << "f64 " << f64;
  }
}

// ---- the modules against the transcription -----------------------------------------------------

std::map<std::string, std::pair<int64_t, int64_t>> core_dims(const st::BilinearBTTAttentionImpl& m) {
  const auto [a, b, c, d] = m.shape;
  const int64_t H = m.options.num_heads(), s = m.options.btt_rank();
  return {{"w_k", {d, H * b * s}}, {"w_q", {c * s, a}}};
}
std::map<std::string, std::pair<int64_t, int64_t>> core_dims(const st::BilinearMLRAttentionImpl& m) {
  std::map<std::string, std::pair<int64_t, int64_t>> r;
  const int64_t D = m.options.embed_dim(), H = m.options.num_heads();
  for (size_t l = 0; l < m.options.ranks().size(); ++l)
    for (const char* side : {"w_q_", "w_k_"}) r[side + std::to_string(l + 1)] = {D >> l, H * m.options.ranks()[l]};
  return r;
}

TEST(TorchBilinear, BttModuleMatchesTheTranscription) {
  const std::vector<BttCase> cases = {
      {12, 2, 2},                                                            // ref (3, 4), s = 2
      {18, 3, 1, "ref", std::nullopt, "mup", true, false, true, true, 3.0},  // (3, 6), muP scale, bias, capped
      {12, 2, 3, "ref", st::BttShape{2, 6, 3, 4}, "sp", false, true, false, true, 3.0},  // a != c, x LN, non-causal
      {16, 4, 2, "balanced", std::nullopt, "sp", true, true, true, false, 3.0},  // (4,4,4,4), no cap though large
      {20, 2, 1, "ref", std::nullopt, "sp", false, false, true, true, 0.3},      // (4, 5), below the cap
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const BttCase& c = cases[i];
    at::manual_seed(int64_t(10 + i));
    st::BilinearBTTAttention m(options_of(c));
    m->to(at::kDouble);
    randomise(*m, c.core_scale, core_dims(*m));
    const at::Tensor x = at::randn({2, 7, c.D}, kF64), g = at::randn({2, 7, c.D}, kF64);
    const auto by_hand = [&](const at::Tensor& xx, const st::BilinearBTTWeights& w) {
      return btt_layer_by_hand(xx, w, c, m->shape);
    };
    const auto want = out_and_grads(by_hand, x, detached_f64(m->weights()), g);
    const auto module = [&](const at::Tensor& xx, const st::BilinearBTTWeights&) { return m->forward(xx); };
    expect_close(out_and_grads(module, x, m->weights(), g), want, kF64Tol, kF64Tol, "case " + std::to_string(i));
    // float32 (the kernel) against the same float64 transcription.
    m->to(at::kFloat);
    expect_close(out_and_grads(module, x.to(at::kFloat), m->weights(), g), want, kF32FwdTol, kF32GradTol,
                 "fp32 case " + std::to_string(i));
  }
}

TEST(TorchBilinear, MlrModuleMatchesTheTranscription) {
  const std::vector<MlrCase> cases = {
      {24, 2, {8, 4}},
      {20, 2, {6, 4}, "mup", true, true, false, true, true, 3.0},          // D not a power of two, bias, capped
      {96, 2, {8, 8, 8, 8, 8, 8}, "sp", true, false, true, true, true},    // 6 levels (p up to 32), divide by L
      {12, 1, {12}, "sp", false, false, false, false, false},              // one level, no LN, non-causal, no cap
      {48, 3, {10, 3, 2, 1}, "mup", true, false, false, true, true, 0.3},  // 4 levels, below the cap
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const MlrCase& c = cases[i];
    at::manual_seed(int64_t(20 + i));
    st::BilinearMLRAttention m(options_of(c));
    m->to(at::kDouble);
    randomise(*m, c.core_scale, core_dims(*m));
    const at::Tensor x = at::randn({2, 6, c.D}, kF64), g = at::randn({2, 6, c.D}, kF64);
    const auto by_hand = [&](const at::Tensor& xx, const st::BilinearMLRWeights& w) {
      return mlr_layer_by_hand(xx, w, c);
    };
    const auto want = out_and_grads(by_hand, x, detached_f64(m->weights()), g);
    const auto module = [&](const at::Tensor& xx, const st::BilinearMLRWeights&) { return m->forward(xx); };
    expect_close(out_and_grads(module, x, m->weights(), g), want, kF64Tol, kF64Tol, "case " + std::to_string(i));
    m->to(at::kFloat);
    expect_close(out_and_grads(module, x.to(at::kFloat), m->weights(), g), want, kF32FwdTol, kF32GradTol,
                 "fp32 case " + std::to_string(i));
  }
}

// The modules at realistic widths: BTT attends with head dim D = 1024; the MLR split
// 32|8|6|4|4|4|4|2 (the reference's LM) gives 808 concatenated features per head. Forward in
// float32 against the float64 transcription.
TEST(TorchBilinear, WideHeadDims) {
  at::manual_seed(8);
  {
    const BttCase c{1024, 2, 1};
    st::BilinearBTTAttention m(options_of(c));
    EXPECT_EQ(m->shape, (st::BttShape{16, 64, 16, 64}));
    const at::Tensor x = at::randn({1, 5, c.D});
    const st::BilinearBTTWeights w = detached_f64(m->weights());
    EXPECT_LE(rel_err(m->forward(x), btt_layer_by_hand(x.to(at::kDouble), w, c, m->shape)), kF32FwdTol);
  }
  {
    const MlrCase c{512, 8, {32, 8, 6, 4, 4, 4, 4, 2}};
    st::BilinearMLRAttention m(options_of(c));
    const at::Tensor x = at::randn({1, 5, c.D});
    const st::BilinearMLRWeights w = detached_f64(m->weights());
    EXPECT_LE(rel_err(m->forward(x), mlr_layer_by_hand(x.to(at::kDouble), w, c)), kF32FwdTol);
  }
}

// bfloat16 modules (the kernel's bf16 path) against the float64 transcription run on the same
// bf16-rounded input and weights. Tolerance 2e-2: bf16 keeps 8 bits (2^-9 relative per rounding);
// the transforms, LN and attention round their outputs to bf16 a handful of times in sequence
// (observed ~5e-3); an index or scale error is of order 1. Gradients: finite, of the weights' dtype.
TEST(TorchBilinear, Bfloat16) {
  at::manual_seed(9);
  const auto check = [](auto& m, const auto& by_hand) {
    m->to(at::kBFloat16);
    {
      ::torch::NoGradGuard no_grad;
      m->out_proj->weight.normal_(0, 0.1);  // a non-zero out projection
    }
    const at::Tensor x = at::randn({2, 33, 64}).to(at::kBFloat16);
    const at::Tensor y = m->forward(x);
    EXPECT_EQ(y.scalar_type(), at::kBFloat16);
    EXPECT_LE(rel_err(y, by_hand(x.to(at::kDouble), detached_f64(m->weights()))), 2e-2);
    y.to(at::kFloat).square().mean().backward();
    for (const auto& p : m->named_parameters()) {
      const at::Tensor grad = p.value().grad();
      ASSERT_TRUE(grad.defined()) << p.key();
      EXPECT_EQ(grad.scalar_type(), at::kBFloat16) << p.key();
      EXPECT_TRUE(grad.isfinite().all().item<bool>()) << p.key();
    }
  };
  const BttCase bc{64, 4, 2};
  st::BilinearBTTAttention btt(options_of(bc));
  check(btt,
        [&](const at::Tensor& x, const st::BilinearBTTWeights& w) { return btt_layer_by_hand(x, w, bc, btt->shape); });
  const MlrCase mc{64, 4, {8, 4, 4}};
  st::BilinearMLRAttention mlr(options_of(mc));
  check(mlr, [&](const at::Tensor& x, const st::BilinearMLRWeights& w) { return mlr_layer_by_hand(x, w, mc); });
}

TEST(TorchBilinear, ModulesShapesNamesAndClone) {
  at::manual_seed(4);
  st::BilinearBTTAttention btt(st::BilinearBTTAttentionOptions(64, 4).btt_rank(2));
  EXPECT_EQ(btt->shape, (st::BttShape{4, 16, 4, 16}));
  EXPECT_EQ(btt->w_k.sizes(), (at::IntArrayRef{4, 16, 4 * 16 * 2}));  // c x d x (H*b*s)
  EXPECT_EQ(btt->w_q.sizes(), (at::IntArrayRef{4 * 16, 4, 4 * 2}));   // (H*b) x a x (c*s)
  std::vector<std::string> names;
  for (const auto& p : btt->named_parameters()) names.push_back(p.key());
  EXPECT_EQ(names, (std::vector<std::string>{"w_k", "w_q", "key_norm_weight", "v_proj.weight", "out_proj.weight"}));
  st::BilinearMLRAttention mlr(st::BilinearMLRAttentionOptions(32, 2, {8, 4, 4}).bias(true));
  EXPECT_EQ(mlr->w_q[2].sizes(), (at::IntArrayRef{4, 8, 2 * 4}));  // p_3 x (D/p_3) x (H*r_3)
  EXPECT_EQ(mlr->q_norm_weight[1].sizes(), (at::IntArrayRef{4 * 2}));
  EXPECT_EQ(mlr->parameters().size(), 6u * 3 + 4);
  const at::Tensor x = at::randn({1, 5, 32});
  const auto copy = std::dynamic_pointer_cast<st::BilinearMLRAttentionImpl>(mlr->clone());
  ASSERT_TRUE(copy);
  EXPECT_TRUE(at::equal(copy->forward(x), mlr->forward(x)));
  EXPECT_NE(copy->w_q[0].data_ptr(), mlr->w_q[0].data_ptr());
  const auto bcopy = std::dynamic_pointer_cast<st::BilinearBTTAttentionImpl>(btt->clone());
  ASSERT_TRUE(bcopy);
  const at::Tensor x64 = at::randn({1, 5, 64});
  EXPECT_TRUE(at::equal(bcopy->forward(x64), btt->forward(x64)));
}

// ---- errors ------------------------------------------------------------------------------------

void expect_error(const std::string& msg, const std::string& part) {
  EXPECT_NE(msg.find(part), std::string::npos) << "message: " << msg << "\nexpected to contain: " << part;
}

TEST(TorchBilinear, BadInputNamesTheArgument) {
  using BO = st::BilinearBTTAttentionOptions;
  using MO = st::BilinearMLRAttentionOptions;
  expect_error(message([] { st::BilinearBTTAttention(BO(64, 5)); }), "BilinearBTTAttention: argument 'num_heads'");
  expect_error(message([] { st::BilinearBTTAttention(BO(1, 1)); }),
               "BilinearBTTAttention: argument 'embed_dim': expected an integer >= 2");
  expect_error(message([] { st::BilinearBTTAttention(BO(64, 4).factorization("tall")); }),
               "BilinearBTTAttention: argument 'factorization'");
  expect_error(
      message([] {
        st::BilinearBTTAttention(BO(64, 4).btt_shape(st::BttShape{4, 16, 8, 4}));
      }),
      "BilinearBTTAttention: argument 'btt_shape': expected (a, b, c, d) >= 1 with a*b = c*d = embed_dim = 64");
  expect_error(message([] { st::BilinearBTTAttention(BO(64, 4).btt_rank(0)); }), "argument 'btt_rank'");
  expect_error(message([] { st::BilinearBTTAttention(BO(64, 4).logit_scale("mu")); }), "argument 'logit_scale'");
  expect_error(
      message([] {
        st::BilinearMLRAttention(MO(64, 4, {8, 4}));
      }),
      "BilinearMLRAttention: argument 'ranks': expected r_1 + .. + r_L = head_dim = embed_dim / num_heads = 16");
  expect_error(message([] { st::BilinearMLRAttention(MO(64, 4, {16, 0})); }), "argument 'ranks': expected r_l >= 1");
  // 3 levels need 2^2 = 4 feature blocks: 18 is not a multiple.
  expect_error(message([] {
                 st::BilinearMLRAttention(MO(18, 2, {3, 3, 3}));
               }),
               "BilinearMLRAttention: argument 'embed_dim': expected a multiple of the block count 2^(L-1) = 4");
  // The forward and the functions.
  st::BilinearBTTAttention m(BO(16, 2));
  expect_error(message([&] {
                 m->forward(at::randn({2, 3, 15}));
               }),
               "BilinearBTTAttention::forward: argument 'x': expected a 3-D tensor (batch, seq, embed_dim = 16)");
  expect_error(message([&] {
                 m->forward(at::randn({2, 3, 16}, kF64));
               }),
               "BilinearBTTAttention::forward: argument 'w_k': expected float64");
  const at::Tensor w_k = at::randn({4, 4, 8}), w_q = at::randn({8, 4, 4});
  expect_error(message([&] {
                 st::btt_key_transform(at::randn({3, 15}), w_k, w_q, 2);
               }),
               "btt_key_transform: argument 'x'");
  expect_error(message([&] {
                 st::btt_key_transform(at::randn({3, 16}), w_k, w_q, 3);
               }),
               "btt_key_transform: argument 'w_q'");
  expect_error(message([&] {
                 st::btt_key_transform(at::randn({3, 16}), w_k.narrow(2, 0, 6), w_q, 2);
               }),
               "btt_key_transform: argument 'w_k': expected dim 2 = heads*b*s = 8");
  expect_error(message([&] {
                 st::block_diag_transform(at::randn({3, 10}), at::randn({4, 3, 2}), 1);
               }),
               "block_diag_transform: argument 'x'");
  expect_error(message([&] {
                 st::block_diag_transform(at::randn({3, 12}), at::randn({4, 3, 3}), 2);
               }),
               "block_diag_transform: argument 'w'");
}

// ---- muP ---------------------------------------------------------------------------------------

TEST(TorchMup, RmsCapAndItsGradient) {
  at::manual_seed(5);
  for (const auto& [d_in, d_out, scale] :
       std::vector<std::tuple<int64_t, int64_t, double>>{{16, 64, 3.0}, {16, 64, 0.5}, {24, 6, 2.0}, {24, 6, 0.9}}) {
    const double sigma = st::rms_cap_sigma(d_in, d_out);
    EXPECT_DOUBLE_EQ(sigma, std::sqrt(double(std::min(d_in, d_out))) / double(d_in));
    const at::Tensor z = at::randn({3, d_in, d_out}, kF64);
    const at::Tensor w0 = z / z.square().mean().sqrt() * (scale * sigma);  // RMS = scale * sigma
    const at::Tensor g = at::randn(w0.sizes(), kF64);
    const at::Tensor w = w0.clone().requires_grad_(), wr = w0.clone().requires_grad_();
    const at::Tensor got = st::rms_cap(w, d_in, d_out), want = capped_by_hand(wr, d_in, d_out);
    EXPECT_LE(rel_err(got, want), kF64Tol);
    // Capped: RMS(W_eff) = sigma* (up to the 1e-8 under the root); else W itself.
    if (scale > 1) {
      EXPECT_NEAR(got.square().mean().sqrt().item<double>(), sigma, 1e-6 * sigma);
    } else {
      EXPECT_TRUE(at::equal(got, w0));
    }
    const at::Tensor dg = ::torch::autograd::grad({(got * g).sum()}, {w})[0];
    const at::Tensor dw = ::torch::autograd::grad({(want * g).sum()}, {wr})[0];
    EXPECT_LE(rel_err(dg, dw), kF64Tol);
    if (scale > 1) {
      EXPECT_GT(rel_err(dg, g), 1e-3);  // the cap's gradient goes through RMS(w)
    }
  }
  expect_error(message([] { st::rms_cap(at::randn({2, 2}), 0, 2); }), "rms_cap: argument 'd_in'");
}

// A small LM-like model: embeddings, the two bilinear layers, an MLP, an LN, an LM head (readout)
// declared by the model itself, and a raw parameter declared as a gain.
struct TinyLMImpl : ::torch::nn::Cloneable<TinyLMImpl>, st::MupDeclaring {
  static constexpr int64_t D = 64, V = 100;
  TinyLMImpl() { reset(); }
  void reset() override {
    wte = register_module("wte", ::torch::nn::Embedding(V, D));
    btt = register_module("btt", st::BilinearBTTAttention(st::BilinearBTTAttentionOptions(D, 4).btt_rank(2)));
    mlr = register_module("mlr", st::BilinearMLRAttention(st::BilinearMLRAttentionOptions(D, 4, {8, 4, 4})));
    ln = register_module("ln", ::torch::nn::LayerNorm(::torch::nn::LayerNormOptions({D})));
    fc = register_module("fc", ::torch::nn::Linear(D, 4 * D));
    proj = register_module("proj", ::torch::nn::Linear(::torch::nn::LinearOptions(4 * D, D).bias(false)));
    lm_head = register_module("lm_head", ::torch::nn::Linear(::torch::nn::LinearOptions(D, V).bias(false)));
    scale = register_parameter("scale", at::ones({D}));
  }
  at::Tensor forward(const at::Tensor& idx) {
    at::Tensor h = wte(idx);
    h = h + btt(h) + mlr(h);
    h = h + proj(at::gelu(fc(ln(h))));
    return lm_head(h * scale);
  }
  std::vector<std::pair<std::string, st::MupRole>> mup_roles() const override {
    return {{"proj.weight", st::MupRole::output(4 * D)},
            {"lm_head.weight", st::MupRole::readout(D)},
            {"scale", st::MupRole::gain()}};
  }
  ::torch::nn::Embedding wte{nullptr};
  st::BilinearBTTAttention btt{nullptr};
  st::BilinearMLRAttention mlr{nullptr};
  ::torch::nn::LayerNorm ln{nullptr};
  ::torch::nn::Linear fc{nullptr}, proj{nullptr}, lm_head{nullptr};
  at::Tensor scale;
};
TORCH_MODULE(TinyLM);

TEST(TorchMup, RolesInitAndGroups) {
  TinyLM model;
  std::map<std::string, st::MupRole> roles;
  for (const st::MupParam& p : st::mup_params(*model)) roles[p.name] = p.role;
  EXPECT_EQ(roles.size(), model->parameters().size());
  const auto kind = [&](const std::string& n) { return std::string(st::mup_kind_name(roles.at(n).kind)); };
  EXPECT_EQ(kind("wte.weight"), "embedding");
  EXPECT_EQ(kind("btt.w_k"), "structured_core");
  EXPECT_EQ(roles.at("btt.w_k").fan_in, 16);     // d of (4, 16)
  EXPECT_EQ(roles.at("btt.w_q").fan_in, 4 * 2);  // c*s
  EXPECT_EQ(roles.at("mlr.w_k_3").fan_in, 16);   // D / p_3
  EXPECT_EQ(kind("btt.key_norm_weight"), "gain");
  EXPECT_EQ(kind("btt.v_proj.weight"), "hidden");
  EXPECT_EQ(kind("btt.out_proj.weight"), "output");
  EXPECT_EQ(kind("mlr.q_norm_weight_2"), "gain");
  EXPECT_EQ(kind("ln.weight"), "gain");
  EXPECT_EQ(kind("ln.bias"), "bias");
  EXPECT_EQ(kind("fc.weight"), "hidden");
  EXPECT_EQ(roles.at("fc.weight").fan_in, 64);
  EXPECT_EQ(kind("fc.bias"), "bias");
  EXPECT_EQ(kind("proj.weight"), "output");  // declared by the model over the Linear default
  EXPECT_EQ(roles.at("proj.weight").fan_in, 256);
  EXPECT_EQ(kind("lm_head.weight"), "readout");
  EXPECT_EQ(kind("scale"), "gain");

  // Init statistics (a seeded generator; each tensor has >= 1024 entries, so the sample std is
  // within 4.5 standard errors (1/sqrt(2n) <= 2.2%) of the rule's at 10%). The stds are muP's
  // table written out (hidden and output projections 1/sqrt(fan_in), readout 1/fan_in, tables
  // 0.02), not read from the roles.
  auto gen = at::detail::createCPUGenerator(7);
  st::mup_init_(*model, gen);
  const std::map<std::string, double> output_stds = {{"btt.out_proj.weight", 0.125},
                                                     {"mlr.out_proj.weight", 0.125},
                                                     {"proj.weight", 1 / 16.0},
                                                     {"lm_head.weight", 1 / 64.0}};
  for (const auto& [n, sd] : output_stds)
    EXPECT_NEAR(model->named_parameters()[n].std().item<double>(), sd, 0.1 * sd) << n;
  st::mup_init_(*model, gen, st::MupInit{/*zero_outputs=*/true});
  const auto std_of = [&](const std::string& n) { return model->named_parameters()[n].std().item<double>(); };
  const auto all_equal = [&](const std::string& n, double v) {
    return model->named_parameters()[n].eq(v).all().item<bool>();
  };
  const std::map<std::string, double> stds = {{"wte.weight", 0.02},
                                              {"btt.w_k", 1 / std::sqrt(16.0)},
                                              {"btt.w_q", 1 / std::sqrt(8.0)},
                                              {"btt.v_proj.weight", 0.125},
                                              {"mlr.w_q_1", 0.125},
                                              {"mlr.w_k_2", 1 / std::sqrt(32.0)},
                                              {"mlr.w_q_3", 0.25},
                                              {"fc.weight", 0.125},
                                              {"mlr.v_proj.weight", 0.125}};
  for (const auto& [n, s] : stds) EXPECT_NEAR(std_of(n), s, 0.1 * s) << n;
  for (const char* n :
       {"btt.out_proj.weight", "mlr.out_proj.weight", "proj.weight", "lm_head.weight", "fc.bias", "ln.bias"})
    EXPECT_TRUE(all_equal(n, 0.0)) << n;
  for (const char* n : {"btt.key_norm_weight", "mlr.k_norm_weight_3", "ln.weight", "scale"})
    EXPECT_TRUE(all_equal(n, 1.0)) << n;

  // Groups: lr = eta * base_width / fan_in for matrices (the default base width), eta otherwise;
  // every parameter once.
  const double eta = 1e-3, base = st::kDefaultBaseWidth;
  const auto groups = st::mup_param_groups(*model, eta);
  std::map<std::string, double> lr_of;
  for (const auto& g : groups) {
    ASSERT_EQ(g.names.size(), g.params.size());
    EXPECT_EQ(g.weight_decay, 0.0);
    for (const auto& n : g.names) EXPECT_TRUE(lr_of.emplace(n, g.lr).second) << n << " in two groups";
  }
  EXPECT_EQ(lr_of.size(), roles.size());
  const std::map<std::string, double> want_lr = {
      {"wte.weight", eta},           {"btt.w_k", eta * base / 16},        {"btt.w_q", eta * base / 8},
      {"mlr.w_q_3", eta * base / 16}, {"fc.weight", eta * base / 64},     {"proj.weight", eta * base / 256},
      {"lm_head.weight", eta * base / 64}, {"ln.weight", eta},
      {"fc.bias", eta},        {"btt.key_norm_weight", eta}};
  for (const auto& [n, lr] : want_lr) EXPECT_DOUBLE_EQ(lr_of.at(n), lr) << n;
  // Weight decay, when asked, on the >= 2-D parameters only (the reference's rule).
  for (const auto& g : st::mup_param_groups(*model, eta, st::MupOptions{768, 0.1}))
    for (const auto& p : g.params) EXPECT_EQ(g.weight_decay, p.dim() >= 2 ? 0.1 : 0.0);
}

// AdamW's first step moves each entry with a nonzero gradient by exactly its group's lr
// (m / (sqrt(v) + eps) = g / |g| with eps 1e-20): the per-parameter lr reaches the optimizer.
TEST(TorchMup, AdamWFirstStepIsTheGroupLr) {
  at::manual_seed(6);
  TinyLM model;
  model->to(at::kDouble);
  st::mup_init_(*model);
  {  // non-zero outputs so that every parameter gets a gradient
    ::torch::NoGradGuard no_grad;
    for (auto& p : model->named_parameters())
      if (p.key().find("out_proj") != std::string::npos || p.key() == "proj.weight" || p.key() == "lm_head.weight")
        p.value().normal_(0, 0.05);
  }
  const double eta = 1e-3;
  auto opt = st::mup_adamw(*model, eta);
  for (auto& g : opt->param_groups()) {
    const auto& o = static_cast<const ::torch::optim::AdamWOptions&>(g.options());
    EXPECT_EQ(std::get<0>(o.betas()), 0.9);
    EXPECT_EQ(std::get<1>(o.betas()), 0.95);
    EXPECT_EQ(o.eps(), 1e-20);
    EXPECT_EQ(o.weight_decay(), 0.0);
  }
  std::map<std::string, double> lr_of;
  for (const auto& g : st::mup_param_groups(*model, eta))
    for (const auto& n : g.names) lr_of[n] = g.lr;
  std::map<std::string, at::Tensor> before;
  for (const auto& p : model->named_parameters()) before[p.key()] = p.value().detach().clone();
  const at::Tensor idx = at::randint(0, TinyLMImpl::V, {2, 6});
  opt->zero_grad();
  model->forward(idx).square().mean().backward();
  opt->step();
  for (const auto& p : model->named_parameters()) {
    const at::Tensor moved = (p.value().detach() - before[p.key()]).abs();
    // |g| >> eps = 1e-20, so that g / (|g| + eps) = sign(g) to 1e-12.
    const at::Tensor has_grad = p.value().grad().abs() > 1e-8;
    ASSERT_TRUE(has_grad.any().item<bool>()) << p.key();
    EXPECT_LE(rel_err(moved.masked_select(has_grad), at::full({has_grad.sum().item<int64_t>()}, lr_of[p.key()], kF64)),
              1e-9)
        << p.key();
  }
}

TEST(TorchMup, UndeclaredAndMisdeclaredParametersAreErrors) {
  struct Raw : ::torch::nn::Module {
    Raw() { register_parameter("alpha", at::ones({3})); }
  };
  expect_error(message([] { st::mup_params(Raw()); }), "mup_params: argument 'model'");
  expect_error(message([] { st::mup_params(Raw()); }), "none for 'alpha'");
  struct Wrong : ::torch::nn::Module, st::MupDeclaring {
    Wrong() { register_module("fc", ::torch::nn::Linear(4, 4)); }
    std::vector<std::pair<std::string, st::MupRole>> mup_roles() const override {
      return {{"fc.wieght", st::MupRole::output(4)}};
    }
  };
  expect_error(message([] { st::mup_params(Wrong()); }), "'fc.wieght', which is none");
  TinyLM model;
  expect_error(message([&] { st::mup_param_groups(*model, -1.0); }), "mup_param_groups: argument 'base_lr'");
}

}  // namespace
