// models/layer_attention.cpp: see layer_attention.h.
#include "models/layer_attention.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <ostream>

#include "models/spec_util.h"
#include "strata/attention.h"
#include "strata/error.h"
#include "strata/torch/mlp.h"
#include "strata/monarch.h"
#include "strata/structured.h"
#include "strata/torch/attention.h"
#include "strata/torch/mlr.h"
#include "strata/torch/monarch.h"

namespace strata::models {
namespace {

using detail::cat;
using spec_syntax::bad_spec;
using Kind = LayerAttentionKind;

int64_t sum_of(const std::vector<int64_t>& v) {
  int64_t s = 0;
  for (int64_t x : v) s += x;
  return s;
}

// 2^(L-1): MLR's finest level splits the context into this many blocks.
int64_t finest_blocks(const LayerAttentionSpec& s) { return int64_t(1) << (std::max<size_t>(s.ranks.size(), 1) - 1); }

// Allowed (query, key) pairs of one sequence of T tokens under a window of w keys on the left (and
// on the right when !causal; w < 0: unbounded) with the first G positions global (a global query or
// key waives the window), causal or not: the exact count the windowed kinds' FLOPs use.
double allowed_pairs(int64_t T, int64_t w, bool causal, int64_t G) {
  double pairs = 0;
  for (int64_t p = 0; p < T; ++p) {
    if (p < G || w < 0) {  // every key (up to p when causal)
      pairs += double(causal ? p + 1 : T);
      continue;
    }
    const int64_t lo = std::max<int64_t>(0, p - w), hi = causal ? p : std::min(T - 1, p + w);
    pairs += double(hi - lo + 1) + double(std::min(G, lo));  // the window + global keys left of it
  }
  return pairs;
}

AttnDims self_dims(int64_t T, int64_t heads_q, int64_t heads_kv, int64_t head_dim, int64_t head_dim_v) {
  AttnDims d;
  d.batch = 1;
  d.seqlen_q = d.seqlen_k = T;
  d.heads_q = heads_q;
  d.heads_kv = heads_kv;
  d.head_dim = head_dim;
  d.head_dim_v = head_dim_v;
  return d;
}

// The MlrArgs of an mlr spec with blocks from `context`.
strata::torch::MlrArgs mlr_args_of(const LayerAttentionSpec& s, int64_t context, bool causal) {
  strata::torch::MlrArgs a;
  a.ranks = s.ranks;
  a.context = context;
  a.scale = s.mlr_scale;
  a.divide_by_num_levels = s.divide_by_num_levels;
  a.level_average = s.level_average;
  a.causal = causal;
  return a;
}

}  // namespace

std::vector<LayerAttentionSpec> model_layer_specs(const std::string& pattern, int64_t num_layers,
                                                  const AttentionGeometry& g, const char* where) {
  try {
    std::vector<LayerAttentionSpec> specs = parse_attention_pattern(pattern, num_layers);
    for (size_t l = 0; l < specs.size(); ++l) {
      try {
        validate(specs[l], g);
      } catch (const Error& e) {
        throw Error(cat("layer ", l, ": ", e.what()));
      }
    }
    return specs;
  } catch (const Error& e) {
    throw Error(cat(where, ": key 'attention': ", e.what()));
  }
}

int64_t mlr_block_context(const LayerAttentionSpec& spec, const AttentionGeometry& g) {
  const int64_t m = finest_blocks(spec);
  const std::string shown = to_string(spec);
  if (g.context < 1) bad_spec(shown, cat("mlr needs the model's context (>= 1 tokens), got ", g.context));
  if (!g.causal) return (g.context + m - 1) / m * m;
  if (g.context % m != 0)
    bad_spec(shown, cat("key 'ranks': ", spec.ranks.size(), " levels split the context into ", m,
                        " blocks: expected the model's context to be a multiple of ", m, ", got context ", g.context));
  return g.context;
}

void validate(const LayerAttentionSpec& s, const AttentionGeometry& g) {
  const char* where = "SelfAttention";
  STRATA_CHECK_ARG(g.width >= 1, where, "width", ">= 1", g.width);
  STRATA_CHECK_ARG(g.heads >= 1 && g.width % g.heads == 0, where, "heads", cat("a divisor of the width ", g.width),
                   g.heads);
  const std::string shown = to_string(s);
  const int64_t d = g.head_dim();
  if ((s.kind == Kind::swa || s.kind == Kind::gswa || s.kind == Kind::longformer) && s.window < 0)
    bad_spec(shown, cat("key 'w': expected an integer >= 0, got ", s.window));
  switch (s.kind) {
    case Kind::gswa:
      if (!g.causal) bad_spec(shown, "gswa (the paper's global + SWA) is causal only: not in an encoder");
      if (s.split_a < 1 || s.split_b < 1 || s.split_a + s.split_b != d)
        bad_spec(shown, cat("key 'split': expected a|b with a, b >= 1 and a + b = head dim = width / heads = ", d,
                            ", got ", s.split_a, "|", s.split_b));
      break;
    case Kind::longformer:
      if (s.num_global < 0) bad_spec(shown, cat("key 'global': expected an integer >= 0, got ", s.num_global));
      break;
    case Kind::mlr:
    case Kind::bmlr: {
      if (s.ranks.empty() || s.ranks.size() > size_t(MlrOptions::kMaxLevels))
        bad_spec(shown, cat("key 'ranks': expected 1..", MlrOptions::kMaxLevels, " levels, got ", s.ranks.size()));
      for (int64_t r : s.ranks)
        if (r < 1) bad_spec(shown, cat("key 'ranks': expected ranks >= 1, got ", r));
      if (sum_of(s.ranks) != d)
        bad_spec(shown, cat("key 'ranks': expected r_1 + .. + r_L = head dim = width / heads = ", d, ", got ",
                            sum_of(s.ranks)));
      if (s.kind == Kind::mlr) {  // the remaining level options by the kernel's own rules
        const int64_t context = mlr_block_context(s, g);
        try {
          strata::torch::mlr_attention_flops(1, g.heads, 1, 1, d, mlr_args_of(s, context, g.causal));
        } catch (const Error& e) {
          bad_spec(shown, e.what());
        }
      }
      if (s.kind == Kind::bmlr && g.width % finest_blocks(s) != 0)
        bad_spec(shown, cat("key 'ranks': ", s.ranks.size(), " levels split the width into ", finest_blocks(s),
                            " feature blocks: expected the width to be a multiple of ", finest_blocks(s), ", got ",
                            g.width));
      break;
    }
    case Kind::btt:
      if (s.btt_rank < 1) bad_spec(shown, cat("key 's': expected an integer >= 1, got ", s.btt_rank));
      try {
        strata::torch::btt_factorize(g.width, s.btt_rule);
      } catch (const Error& e) {
        bad_spec(shown, cat("key 'rule': ", e.what()));
      }
      break;
    case Kind::monarch:
      if (g.causal) bad_spec(shown, "monarch is non-causal (encoders only): not in a causal model");
      if (s.monarch_steps < 1) bad_spec(shown, cat("key 'T': expected an integer >= 1, got ", s.monarch_steps));
      if (s.monarch_block < 0) bad_spec(shown, cat("key 'B': expected an integer >= 0, got ", s.monarch_block));
      break;
    default: break;
  }
}

double attention_forward_flops(const LayerAttentionSpec& s, int64_t T, int64_t width, int64_t heads, bool causal,
                               int64_t context) {
  const char* where = "attention_forward_flops";
  STRATA_CHECK_ARG(T >= 0, where, "T", ">= 0", T);
  AttentionGeometry g;
  g.width = width, g.heads = heads, g.causal = causal, g.context = context > 0 ? context : std::max<int64_t>(T, 1);
  validate(s, g);
  if (T == 0) return 0.0;
  const int64_t d = g.head_dim(), H = heads;
  switch (s.kind) {
    case Kind::mha:
    case Kind::sdpa: return strata::attention_flops(self_dims(T, H, H, d, d), causal).forward;
    case Kind::swa: return 2.0 * double(H) * double(d + d) * allowed_pairs(T, s.window, causal, 0);
    case Kind::longformer: return 2.0 * double(H) * double(d + d) * allowed_pairs(T, s.window, causal, s.num_global);
    case Kind::gswa:
      return strata::attention_flops(self_dims(T, H, H, s.split_a, d), /*causal=*/true).forward +
             2.0 * double(H) * double(s.split_b + d) * allowed_pairs(T, s.window, /*causal=*/true, 0);
    case Kind::mlr:
      return strata::torch::mlr_attention_flops(1, H, T, T, d, mlr_args_of(s, mlr_block_context(s, g), causal)).total;
    case Kind::btt: return strata::attention_flops(self_dims(T, 1, H, width, d), causal).forward;
    case Kind::bmlr: {
      int64_t features = 0;  // sum_l r_l p_l: the per-head width of the concatenated level features
      for (size_t l = 0; l < s.ranks.size(); ++l) features += s.ranks[l] << l;
      return strata::attention_flops(self_dims(T, H, H, features, d), causal).forward;
    }
    case Kind::monarch: {
      MonarchOptions o;
      o.num_steps = s.monarch_steps;
      o.block_size = s.monarch_block;
      return strata::monarch_attention_flops(self_dims(T, H, H, d, d), o);
    }
  }
  return 0.0;
}

// ---- SelfAttentionImpl ----------------------------------------------------------------------

SelfAttentionImpl::SelfAttentionImpl(LayerAttentionSpec spec_, AttentionGeometry g)
    : spec(std::move(spec_)), geometry(g) {
  validate(spec, geometry);
  head_dim = geometry.head_dim();
  reset();
}

strata::torch::MlrArgs SelfAttentionImpl::mlr_args() const {
  STRATA_CHECK_ARG(spec.kind == Kind::mlr, "SelfAttention::mlr_args", "kind", "mlr", layer_attention_kind_name(spec.kind));
  return mlr_args_of(spec, mlr_block_context(spec, geometry), geometry.causal);
}

bool SelfAttentionImpl::has_qkv() const { return spec.kind != Kind::btt && spec.kind != Kind::bmlr; }

void SelfAttentionImpl::reset() {
  const int64_t D = geometry.width, H = geometry.heads;
  q_proj = k_proj = v_proj = out_proj = nullptr;
  q_norm_weight = q_norm_bias = k_norm_weight = k_norm_bias = at::Tensor();
  btt = nullptr;
  bmlr = nullptr;
  switch (spec.kind) {
    case Kind::btt: {
      // QK-LayerNorm does not apply: BTT always normalises its key transform (ref asserts do_qk_ln).
      auto o = strata::torch::BilinearBTTAttentionOptions(D, H)
                   .btt_rank(spec.btt_rank)
                   .factorization(spec.btt_rule)
                   .logit_scale(spec.logit)
                   .bias(geometry.bias)
                   .causal(geometry.causal);
      btt = register_module("btt", strata::torch::BilinearBTTAttention(o));
      return;
    }
    case Kind::bmlr: {
      // qk_layernorm: the per-level LayerNorms (ref do_qk_ln).
      auto o = strata::torch::BilinearMLRAttentionOptions(D, H, spec.ranks)
                   .logit_scale(spec.logit)
                   .qk_layernorm(geometry.qk_layernorm)
                   .bias(geometry.bias)
                   .divide_by_num_levels(spec.divide_by_num_levels)
                   .causal(geometry.causal);
      bmlr = register_module("bmlr", strata::torch::BilinearMLRAttention(o));
      return;
    }
    default: break;
  }
  const auto linear = [&](const char* name) {
    return register_module(name, ::torch::nn::Linear(::torch::nn::LinearOptions(D, D).bias(geometry.bias)));
  };
  q_proj = linear("q_proj");
  k_proj = linear("k_proj");
  v_proj = linear("v_proj");
  out_proj = linear("out_proj");
  if (geometry.qk_layernorm) {  // as MLRAttention's: over the head dim, weight shared by heads
    q_norm_weight = register_parameter("q_norm_weight", at::ones({head_dim}));
    k_norm_weight = register_parameter("k_norm_weight", at::ones({head_dim}));
    if (geometry.bias) {
      q_norm_bias = register_parameter("q_norm_bias", at::zeros({head_dim}));
      k_norm_bias = register_parameter("k_norm_bias", at::zeros({head_dim}));
    }
  }
}

void SelfAttentionImpl::pretty_print(std::ostream& stream) const {
  stream << "strata::models::SelfAttention(" << to_string(spec) << ", width=" << geometry.width
         << ", heads=" << geometry.heads << ", context=" << geometry.context << ", causal=" << geometry.causal
         << ", bias=" << geometry.bias << ", qk_layernorm=" << geometry.qk_layernorm << ")";
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> SelfAttentionImpl::qkv(const at::Tensor& x) {
  const char* where = "SelfAttention::qkv";
  STRATA_CHECK_ARG(has_qkv(), where, "kind", "a kind with q/k/v projections (not btt or bmlr)",
                   layer_attention_kind_name(spec.kind));
  STRATA_CHECK_ARG(x.defined() && x.dim() == 3 && x.size(2) == geometry.width, where, "x",
                   cat("a 3-D tensor (batch, T, width = ", geometry.width, ")"),
                   x.defined() ? cat(x.dim(), "-D ", x.sizes()) : std::string("an undefined tensor"));
  const int64_t B = x.size(0), T = x.size(1), H = geometry.heads;
  at::Tensor q, k, v;  // batch x T x H x d each
  if (B * T >= 16) {
    // One GEMM for the three projections, on their weights stacked per call (3 D x D; its copy is
    // at most 1/16 of the GEMM's multiply-adds at 16 tokens or more): x is read once, and the
    // backward runs one dX and one dW GEMM instead of three each plus the sum of three dX. q, k, v
    // are views into the batch x T x 3 x H x d output (token stride 3 D); unbind's backward stacks
    // their gradients. Measured (2026-12-04, AMD EPYC, 2 threads, batch 32, T = 256, D = 128, the
    // char-LM cpu size): the projections' forward + backward 29.4 -> 26.4 ms (medians of 200
    // interleaved calls). Decoding (a token or a few per call) keeps the three GEMMs.
    const std::vector<at::Tensor> qkv = packed_qkv(x).unbind(2);
    q = qkv[0], k = qkv[1], v = qkv[2];
  } else {
    q = q_proj(x).view({B, T, H, head_dim});
    k = k_proj(x).view({B, T, H, head_dim});
    v = v_proj(x).view({B, T, H, head_dim});
  }
  if (geometry.qk_layernorm) {
    q = at::layer_norm(q, {head_dim}, q_norm_weight, q_norm_bias, 1e-5);
    k = at::layer_norm(k, {head_dim}, k_norm_weight, k_norm_bias, 1e-5);
  }
  return {q, k, v};
}

at::Tensor SelfAttentionImpl::forward_ln(const at::Tensor& x, const at::Tensor& ln_weight, const at::Tensor& ln_bias,
                                         double eps) {
  if (!packs_qkv(x)) return {};
  const at::Tensor w = at::cat({q_proj->weight, k_proj->weight, v_proj->weight});  // 3 D x D, as packed_qkv
  const at::Tensor b = geometry.bias ? at::cat({q_proj->bias, k_proj->bias, v_proj->bias}) : at::Tensor();
  strata::torch::MlpBlockArgs ln;
  ln.ln_weight = ln_weight;
  ln.ln_bias = ln_bias;
  ln.eps = eps;
  const at::Tensor qkv =
      strata::torch::ln_linear(x, w, b, ln).view({x.size(0), x.size(1), 3, geometry.heads, head_dim});
  return out_proj(attend_packed(qkv).reshape({x.size(0), x.size(1), geometry.width}));
}

bool SelfAttentionImpl::packs_qkv(const at::Tensor& x) const {
  return (dense_args() || spec.kind == Kind::mlr) && !geometry.qk_layernorm && x.dim() == 3 &&
         x.size(2) == geometry.width && x.size(0) * x.size(1) >= 16;
}

at::Tensor SelfAttentionImpl::attend_packed(const at::Tensor& qkv) const {
  if (spec.kind == Kind::mlr) return strata::torch::mlr_attention_qkvpacked(qkv, mlr_args());
  return strata::torch::attention_qkvpacked(qkv, *dense_args());
}

at::Tensor SelfAttentionImpl::packed_qkv(const at::Tensor& x) const {
  const at::Tensor w = at::cat({q_proj->weight, k_proj->weight, v_proj->weight});  // 3 D x D
  const at::Tensor b = geometry.bias ? at::cat({q_proj->bias, k_proj->bias, v_proj->bias}) : at::Tensor();
  return at::linear(x, w, b).view({x.size(0), x.size(1), 3, geometry.heads, head_dim});
}

std::optional<strata::torch::AttentionArgs> SelfAttentionImpl::dense_args() const {
  strata::torch::AttentionArgs a;
  a.scale = logit_scale_value(spec.scale, head_dim);
  a.causal = geometry.causal;
  switch (spec.kind) {
    case Kind::mha: return a;
    case Kind::swa:
    case Kind::longformer:
      a.window_left = spec.window;
      a.window_right = geometry.causal ? -1 : spec.window;  // causal already bounds the right
      if (spec.kind == Kind::longformer) a.num_global = spec.num_global;
      return a;
    default: return std::nullopt;
  }
}

at::Tensor SelfAttentionImpl::attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) const {
  STRATA_CHECK_ARG(has_qkv(), "SelfAttention::attend", "kind", "a kind with q/k/v projections (not btt or bmlr)",
                   layer_attention_kind_name(spec.kind));
  const bool causal = geometry.causal;
  strata::torch::AttentionArgs a;
  a.scale = logit_scale_value(spec.scale, head_dim);
  a.causal = causal;
  if (const auto dense = dense_args()) return strata::torch::attention(q, k, v, *dense);
  switch (spec.kind) {
    case Kind::gswa: return strata::torch::paper_gswa_attention(q, k, v, spec.split_a, spec.window);
    case Kind::mlr: return strata::torch::mlr_attention(q, k, v, mlr_args());
    case Kind::monarch: {
      strata::torch::MonarchArgs m;
      m.num_steps = spec.monarch_steps;
      m.block_size = spec.monarch_block;
      m.scale = a.scale;
      return strata::torch::monarch_attention(q, k, v, m);
    }
    case Kind::sdpa:  // LibTorch's own, in its layout batch x H x T x d
      return at::scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), {}, 0.0, causal,
                                              a.scale)
          .transpose(1, 2);
    default: break;
  }
  throw Error("SelfAttention::attend: unreachable kind");
}

at::Tensor SelfAttentionImpl::forward(const at::Tensor& x) {
  const char* where = "SelfAttention::forward";
  STRATA_CHECK_ARG(x.defined() && x.dim() == 3 && x.size(2) == geometry.width, where, "x",
                   cat("a 3-D tensor (batch, T, width = ", geometry.width, ")"),
                   x.defined() ? cat(x.dim(), "-D ", x.sizes()) : std::string("an undefined tensor"));
  if (spec.kind == Kind::btt) return btt(x);
  if (spec.kind == Kind::bmlr) return bmlr(x);
  // The dense kinds on a packed q/k/v (as qkv() projects them), so that the backward returns one
  // gradient for the projection's output instead of three for autograd to copy into one.
  if (packs_qkv(x)) return out_proj(attend_packed(packed_qkv(x)).reshape({x.size(0), x.size(1), geometry.width}));
  const auto [q, k, v] = qkv(x);
  return out_proj(attend(q, k, v).reshape({x.size(0), x.size(1), geometry.width}));
}

double SelfAttentionImpl::projection_flops(int64_t T) const {
  const double D = double(geometry.width), t = double(T);
  const double v_out = 2.0 * 2.0 * t * D * D;  // v_proj and out_proj
  switch (spec.kind) {
    case Kind::btt: return strata::structured_flops(strata::btt_spec(btt->shape, spec.btt_rank, geometry.heads), T) + v_out;
    case Kind::bmlr: {
      double f = v_out;
      for (size_t l = 0; l < spec.ranks.size(); ++l) {  // level l: q and k, p_l feature blocks -> H r_l each
        const int64_t p = int64_t(1) << l;
        f += 2.0 * strata::structured_flops(
                       strata::block_diagonal_spec(geometry.width, p * geometry.heads * spec.ranks[l], p), T);
      }
      return f;
    }
    default: return 2.0 * v_out;  // q, k, v, out
  }
}

double SelfAttentionImpl::forward_flops(int64_t T) const {
  return attention_forward_flops(spec, T, geometry.width, geometry.heads, geometry.causal,
                                 geometry.context) +
         projection_flops(T);
}

std::vector<std::pair<std::string, strata::torch::MupRole>> SelfAttentionImpl::mup_roles() const {
  using strata::torch::MupRole;
  if (!has_qkv()) return {};  // btt / bmlr declare their own
  std::vector<std::pair<std::string, MupRole>> roles{{"out_proj.weight", MupRole::output(geometry.width)}};
  if (q_norm_weight.defined()) {
    roles.emplace_back("q_norm_weight", MupRole::gain());
    roles.emplace_back("k_norm_weight", MupRole::gain());
  }
  if (q_norm_bias.defined()) {
    roles.emplace_back("q_norm_bias", MupRole::bias());
    roles.emplace_back("k_norm_bias", MupRole::bias());
  }
  return roles;
}

}  // namespace strata::models
