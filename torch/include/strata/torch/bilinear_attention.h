// strata/torch/bilinear_attention.h: the structured-attention paper's bilinear scoring layers
// (Kuang et al., ICML 2025, sections 3.3-3.4; the reference code's BilinearBTTAttention and
// BilinearMLRAttention in src/model.py), whose query-key bilinear form is a high-rank structured
// matrix instead of the per-head low-rank W_Q W_K^T. Semantics are the reference's; the attention
// itself runs through strata's dense attention (strata/torch/attention.h), causal by default.
//
// Notation: x batch x T x D (the block input), H heads, V per head D / H wide.
//
// Bilinear BTT. Per head h a full-rank D x D BTT matrix M_h, D = a*b = c*d, BTT rank s:
//   W_K: c x d x (H*b*s)   (the first core, applied to the key-side token)
//   W_Q: (H*b) x a x (c*s) (the second core)
//   M_h[(i_a*b + j_b), (i_c*d + i_d)] = sum_{sigma<s} W_Q[h*b + j_b, i_a, i_c*s + sigma]
//                                                     * W_K[i_c, i_d, (h*b + j_b)*s + sigma]
//   score_h(t, t') = x_t . LN(M_h x_t') * c,  c = 1/sqrt(D) ("sp") or 1/D ("mup"),
// LN over the D features with one weight shared by the heads (bias with `bias`), eps 1e-5; the
// query is the raw input x, shared by all heads; each head attends with head dim D.
//
// Bilinear MLR. Ranks r_1..r_L summing to D / H; level l (1-based) has p_l = 2^(l-1) blocks over
// the FEATURES: W_l: p_l x (D/p_l) x (H*r_l), one for queries and one for keys. x is split into p_l
// contiguous chunks of D/p_l features, chunk k times block k, giving per head r_l*p_l features with
// index rho*p_l + k (rho < r_l); LN over those (per level, weight shared by heads) on each side;
// S = sum_l c_l q_l . k_l, c_l = 1/sqrt(r_l p_l) ("sp") or 8/(r_l p_l) ("mup"), also divided by L
// with divide_by_num_levels: standard attention on the concatenated features.
//
// Both: V = x W_V^T (+ b_V) split into H heads, softmax(causal mask(S)) V, then the out projection.
// The structured cores pass through the forward-time RMS cap (strata/torch/mup.h) unless rms_cap
// is off. The modules declare their parameters' muP roles (MupDeclaring).
#pragma once
#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "strata/structured.h"
#include "strata/torch/mup.h"

namespace strata::torch {

// A BTT factorisation D = a*b = c*d (the core's, strata/structured.h).
using BttShape = ::strata::BttShape;

// The factorisation of dim by `rule`:
//   "ref": the reference's: b = d = the smallest divisor of dim strictly greater than sqrt(dim),
//          a = c = dim / b (64 -> (4, 16), 384 -> (16, 24), 1024 -> (16, 64); a prime -> (1, dim));
//   "balanced": the divisor pair closest to sqrt(dim), a <= b (a = b = c = d = sqrt(dim) for a square).
// Both are strata::btt_factorize's rules. Throws naming 'dim' for dim < 2 ("ref") or dim < 1, 'rule'
// for an unknown rule.
BttShape btt_factorize(int64_t dim, const std::string& rule = "ref");

// The BTT transform of the key side, per head: y[..., h, i_a*b + j_b] = sum over (i_c, i_d) of
// M_h[(i_a*b + j_b), (i_c*d + i_d)] x[..., i_c*d + i_d] (M_h as in the file comment).
//   x: ... x (c*d);  w_k: c x d x (heads*b*s);  w_q: (heads*b) x a x (c*s)  ->  ... x heads x (a*b)
// The core's structured operator (strata/structured.h: btt_spec(shape, s, heads), whose factors are
// exactly W_K and W_Q) through strata::torch::structured_linear: the fused CPU kernel for float32 /
// bfloat16, the double reference for float64; differentiable. Throws naming the argument whose shape
// does not fit.
at::Tensor btt_key_transform(const at::Tensor& x, const at::Tensor& w_k, const at::Tensor& w_q, int64_t heads);

// The block-diagonal transform of one bilinear-MLR level: x split into p chunks of m features,
// chunk k times w[k]: y[..., h, rho*p + k] = sum_j x[..., k*m + j] * w[k, j, h*r + rho].
//   x: ... x (p*m);  w: p x m x (heads*r)  ->  ... x heads x (r*p)
// One batched GEMM, differentiable. Throws naming the argument whose shape does not fit.
at::Tensor block_diag_transform(const at::Tensor& x, const at::Tensor& w, int64_t heads);

// The logit scales: "sp" or "mup" (throws naming 'logit_scale' otherwise).
double bilinear_btt_logit_scale(int64_t dim, const std::string& logit_scale);           // 1/sqrt(D), 1/D
double bilinear_mlr_logit_scale(int64_t r, int64_t p, const std::string& logit_scale);  // 1/sqrt(rp), 8/(rp)

// The attention of both layers: q shared by all heads of k (q: batch x T x Dqk; k: batch x T x
// heads x Dqk; v: batch x T x heads x Dv) -> batch x T x heads x Dv, through strata's dense
// attention with `scale` (float64: its double reference).
at::Tensor shared_query_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                                  bool causal);

// The parameters of a bilinear layer, for the functional forms (undefined = absent).
struct BilinearBTTWeights {
  at::Tensor w_k, w_q;                                // the cores (shapes above)
  at::Tensor key_norm_weight, key_norm_bias;          // D each; the bias optional
  at::Tensor x_norm_weight, x_norm_bias;              // D each, optional: LN of x before everything
  at::Tensor v_weight, v_bias, out_weight, out_bias;  // D x D, D (optional), D x D, D (optional)
};
struct BilinearMLRWeights {
  std::vector<at::Tensor> w_q, w_k;                    // level l: p_l x (D/p_l) x (H*r_l)
  std::vector<at::Tensor> q_norm_weight, q_norm_bias;  // level l: r_l*p_l; empty = no LN / no bias
  std::vector<at::Tensor> k_norm_weight, k_norm_bias;
  at::Tensor v_weight, v_bias, out_weight, out_bias;
};

// What the layers compute before their attention (the forwards below run attention(q, k, v) with
// scale 1, then the out projection; incremental decoding caches k and v). The logit scale is
// folded into q:
//   btt: q batch x T x D (the shared query), k batch x T x heads x D, v batch x T x heads x D/H
//        (attention through shared_query_attention)
//   mlr: q, k batch x T x heads x (sum_l r_l p_l), v batch x T x heads x D/H
struct BilinearQkv {
  at::Tensor q, k, v;
};
BilinearQkv bilinear_btt_qkv(const at::Tensor& x, const BilinearBTTWeights& w, int64_t num_heads,
                             const std::string& logit_scale = "sp", bool rms_cap = true);
BilinearQkv bilinear_mlr_qkv(const at::Tensor& x, const BilinearMLRWeights& w, int64_t num_heads,
                             const std::string& logit_scale = "sp", bool divide_by_num_levels = false,
                             bool rms_cap = true);

// The layers' forwards as functions of their weights (what the modules and the torch.ops.strata
// ops run). x: batch x T x D -> batch x T x D. Throw naming the argument whose shape does not fit.
at::Tensor bilinear_btt_attention(const at::Tensor& x, const BilinearBTTWeights& w, int64_t num_heads,
                                  const std::string& logit_scale = "sp", bool causal = true, bool rms_cap = true);
at::Tensor bilinear_mlr_attention(const at::Tensor& x, const BilinearMLRWeights& w, int64_t num_heads,
                                  const std::string& logit_scale = "sp", bool divide_by_num_levels = false,
                                  bool causal = true, bool rms_cap = true);

struct BilinearBTTAttentionOptions {
  BilinearBTTAttentionOptions(int64_t embed_dim, int64_t num_heads) : embed_dim_(embed_dim), num_heads_(num_heads) {}
  TORCH_ARG(int64_t, embed_dim);                                 // D
  TORCH_ARG(int64_t, num_heads);                                 // H, dividing D
  TORCH_ARG(int64_t, btt_rank) = 1;                              // s
  TORCH_ARG(std::string, factorization) = "ref";                 // btt_factorize's rule
  TORCH_ARG(std::optional<BttShape>, btt_shape) = std::nullopt;  // explicit (a, b, c, d) instead
  TORCH_ARG(std::string, logit_scale) = "sp";                    // "sp": 1/sqrt(D); "mup": 1/D
  TORCH_ARG(bool, bias) = false;         // biases of V, out and the LayerNorms (ref config.bias)
  TORCH_ARG(bool, x_layernorm) = false;  // ref bilinearBTT_use_extra_LN_on_X
  TORCH_ARG(bool, causal) = true;
  TORCH_ARG(bool, rms_cap) = true;  // the forward-time RMS cap of W_K, W_Q
};

// Parameters: w_k, w_q (init N(0, 1/d) and N(0, 1/(c*s)), the muP stds), key_norm_weight (1),
// key_norm_bias (0, with bias), x_norm_weight / x_norm_bias (with x_layernorm), v_proj and
// out_proj (torch::nn::Linear, torch's init; mup_init_ re-initialises everything by role,
// out_proj to zero).
class BilinearBTTAttentionImpl : public ::torch::nn::Cloneable<BilinearBTTAttentionImpl>, public MupDeclaring {
 public:
  // Throws strata::Error naming the option when the sizes do not fit together.
  explicit BilinearBTTAttentionImpl(BilinearBTTAttentionOptions options);
  BilinearBTTAttentionImpl(int64_t embed_dim, int64_t num_heads)
      : BilinearBTTAttentionImpl(BilinearBTTAttentionOptions(embed_dim, num_heads)) {}

  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  // x: batch x T x embed_dim (the module's dtype) -> batch x T x embed_dim.
  at::Tensor forward(const at::Tensor& x);
  // bilinear_btt_qkv with this module's weights and options (x as forward's).
  BilinearQkv qkv(const at::Tensor& x);
  // w_k, w_q: structured cores (fan-in d and c*s); LN weights gains; v_proj hidden; out_proj output.
  std::vector<std::pair<std::string, MupRole>> mup_roles() const override;
  BilinearBTTWeights weights() const;

  BilinearBTTAttentionOptions options;
  BttShape shape;  // (a, b, c, d)
  at::Tensor w_k, w_q, key_norm_weight, key_norm_bias, x_norm_weight, x_norm_bias;
  ::torch::nn::Linear v_proj{nullptr}, out_proj{nullptr};
};

class BilinearBTTAttention : public ::torch::nn::ModuleHolder<BilinearBTTAttentionImpl> {
 public:
  using ::torch::nn::ModuleHolder<BilinearBTTAttentionImpl>::ModuleHolder;
  using Impl = BilinearBTTAttentionImpl;
};

struct BilinearMLRAttentionOptions {
  BilinearMLRAttentionOptions(int64_t embed_dim, int64_t num_heads, std::vector<int64_t> ranks)
      : embed_dim_(embed_dim), num_heads_(num_heads), ranks_(std::move(ranks)) {}
  TORCH_ARG(int64_t, embed_dim);                  // D, a multiple of 2^(L-1)
  TORCH_ARG(int64_t, num_heads);                  // H, dividing D
  TORCH_ARG(std::vector<int64_t>, ranks);         // r_1..r_L >= 1, sum = D / H
  TORCH_ARG(std::string, logit_scale) = "sp";     // "sp": 1/sqrt(r_l p_l); "mup": 8/(r_l p_l)
  TORCH_ARG(bool, qk_layernorm) = true;           // the per-level LNs (ref do_qk_ln)
  TORCH_ARG(bool, bias) = false;                  // biases of V, out and the LayerNorms
  TORCH_ARG(bool, divide_by_num_levels) = false;  // ref mlr_divide_by_num_levels: S *= 1/L
  TORCH_ARG(bool, causal) = true;
  TORCH_ARG(bool, rms_cap) = true;
};

// Parameters, for level l = 1..L: w_q_<l>, w_k_<l> (init N(0, p_l/D), the muP std); with
// qk_layernorm q_norm_weight_<l>, k_norm_weight_<l> (1) and, with bias too, q_norm_bias_<l>,
// k_norm_bias_<l> (0); v_proj, out_proj as BilinearBTTAttention's. (Flat names rather than a
// ParameterList: LibTorch cannot clone a module holding a non-empty ParameterList.)
class BilinearMLRAttentionImpl : public ::torch::nn::Cloneable<BilinearMLRAttentionImpl>, public MupDeclaring {
 public:
  explicit BilinearMLRAttentionImpl(BilinearMLRAttentionOptions options);
  BilinearMLRAttentionImpl(int64_t embed_dim, int64_t num_heads, std::vector<int64_t> ranks)
      : BilinearMLRAttentionImpl(BilinearMLRAttentionOptions(embed_dim, num_heads, std::move(ranks))) {}

  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  at::Tensor forward(const at::Tensor& x);
  // bilinear_mlr_qkv with this module's weights and options (x as forward's).
  BilinearQkv qkv(const at::Tensor& x);
  std::vector<std::pair<std::string, MupRole>> mup_roles() const override;
  BilinearMLRWeights weights() const;

  BilinearMLRAttentionOptions options;
  std::vector<at::Tensor> w_q, w_k, q_norm_weight, q_norm_bias, k_norm_weight, k_norm_bias;  // per level
  ::torch::nn::Linear v_proj{nullptr}, out_proj{nullptr};
};

class BilinearMLRAttention : public ::torch::nn::ModuleHolder<BilinearMLRAttentionImpl> {
 public:
  using ::torch::nn::ModuleHolder<BilinearMLRAttentionImpl>::ModuleHolder;
  using Impl = BilinearMLRAttentionImpl;
};

}  // namespace strata::torch
