// torch/mlr_attention.cpp: the MLRAttention module (strata/torch/mlr_attention.h): projections,
// optional QK-LayerNorm, MLR attention through the differentiable strata::torch::mlr_attention.
#include "strata/torch/mlr_attention.h"

#include <ATen/ATen.h>

#include "binding_util.h"
#include "strata/error.h"

namespace strata::torch {

using binding::cat;

MLRAttentionImpl::MLRAttentionImpl(MLRAttentionOptions options_) : options(std::move(options_)) {
  const char* where = "MLRAttention";
  const int64_t E = options.embed_dim(), H = options.num_heads(), Hkv = options.num_kv_heads();
  STRATA_CHECK_ARG(E >= 1, where, "embed_dim", ">= 1", E);
  STRATA_CHECK_ARG(H >= 1 && E % H == 0, where, "num_heads", cat("a divisor of embed_dim = ", E), H);
  STRATA_CHECK_ARG(Hkv == 0 || (Hkv >= 1 && H % Hkv == 0), where, "num_kv_heads",
                   cat("0 (= num_heads) or a divisor of num_heads = ", H), Hkv);
  head_dim = E / H;
  int64_t sum = 0;
  for (int64_t r : options.ranks()) sum += r;
  STRATA_CHECK_ARG(sum == head_dim, where, "ranks",
                   cat("r_1 + .. + r_L = head_dim = embed_dim / num_heads = ", head_dim), sum);
  // The blocks come from the model's context (strata/mlr.h, "Blocks"), never from the length of
  // one call: otherwise a position's output would depend on how many tokens follow it.
  STRATA_CHECK_ARG(options.ranks().size() <= 1 || options.context() > 0 || !options.block_sizes().empty(), where,
                   "context",
                   "the model's context length (> 0) or block_sizes, so that a position's output does not "
                   "depend on the sequence's length",
                   options.context());
  // The remaining level options (counts, ranks >= 1, nested blocks, context, scale) by the rules
  // the kernel applies, once here rather than at the first forward.
  try {
    mlr_attention_flops(1, H, 1, 1, head_dim, mlr_args());
  } catch (const Error& e) {
    throw binding::readdressed(e, "mlr_attention_flops", where);
  }
  reset();
}

void MLRAttentionImpl::reset() {
  const int64_t E = options.embed_dim(), H = options.num_heads();
  const int64_t Hkv = options.num_kv_heads() == 0 ? H : options.num_kv_heads();
  const bool bias = options.bias();
  q_proj = register_module("q_proj", ::torch::nn::Linear(::torch::nn::LinearOptions(E, H * head_dim).bias(bias)));
  k_proj = register_module("k_proj", ::torch::nn::Linear(::torch::nn::LinearOptions(E, Hkv * head_dim).bias(bias)));
  v_proj = register_module("v_proj", ::torch::nn::Linear(::torch::nn::LinearOptions(E, Hkv * head_dim).bias(bias)));
  out_proj = register_module("out_proj", ::torch::nn::Linear(::torch::nn::LinearOptions(H * head_dim, E).bias(bias)));
  q_norm_weight = q_norm_bias = k_norm_weight = k_norm_bias = at::Tensor();
  if (options.qk_layernorm()) {
    q_norm_weight = register_parameter("q_norm_weight", at::ones({head_dim}));
    k_norm_weight = register_parameter("k_norm_weight", at::ones({head_dim}));
    if (bias) {
      q_norm_bias = register_parameter("q_norm_bias", at::zeros({head_dim}));
      k_norm_bias = register_parameter("k_norm_bias", at::zeros({head_dim}));
    }
  }
}

void MLRAttentionImpl::pretty_print(std::ostream& stream) const {
  stream << "strata::torch::MLRAttention(embed_dim=" << options.embed_dim() << ", num_heads=" << options.num_heads()
         << ", num_kv_heads=" << (options.num_kv_heads() == 0 ? options.num_heads() : options.num_kv_heads())
         << ", ranks=[";
  for (size_t i = 0; i < options.ranks().size(); ++i) stream << (i ? ", " : "") << options.ranks()[i];
  stream << "], qk_layernorm=" << options.qk_layernorm() << ", bias=" << options.bias() << ", scale=" << options.scale()
         << ", causal=" << options.causal() << ")";
}

MlrArgs MLRAttentionImpl::mlr_args() const {
  MlrArgs a;
  a.ranks = options.ranks();
  a.block_sizes = options.block_sizes();
  a.context = options.context();
  a.mask_cross_segment = options.mask_cross_segment();
  a.scale = options.scale();
  a.divide_by_num_levels = options.divide_by_num_levels();
  a.level_average = options.level_average();
  a.causal = options.causal();
  a.layout = "bshd";
  return a;
}

at::Tensor MLRAttentionImpl::forward(const at::Tensor& x, const std::optional<at::Tensor>& segment_starts,
                                     const std::optional<at::Tensor>& segment_offsets) {
  const char* where = "MLRAttention::forward";
  const int64_t E = options.embed_dim(), H = options.num_heads();
  const int64_t Hkv = options.num_kv_heads() == 0 ? H : options.num_kv_heads();
  STRATA_CHECK_ARG(x.defined() && x.dim() == 3 && x.size(2) == E, where, "x",
                   cat("a 3-D tensor (batch, seq, embed_dim = ", E, ")"),
                   x.defined() ? cat(x.dim(), "-D ", x.sizes()) : std::string("an undefined tensor"));
  const int64_t B = x.size(0), T = x.size(1);
  at::Tensor q = q_proj(x).view({B, T, H, head_dim});    // batch x seq x heads x head_dim
  at::Tensor k = k_proj(x).view({B, T, Hkv, head_dim});  // batch x seq x kv_heads x head_dim
  at::Tensor v = v_proj(x).view({B, T, Hkv, head_dim});
  if (options.qk_layernorm()) {  // over the whole head dim, before the split into levels
    q = at::layer_norm(q, {head_dim}, q_norm_weight, q_norm_bias, 1e-5);
    k = at::layer_norm(k, {head_dim}, k_norm_weight, k_norm_bias, 1e-5);
  }
  MlrArgs a = mlr_args();
  a.segment_starts = segment_starts;
  a.segment_offsets = segment_offsets;
  const at::Tensor y = mlr_attention(q, k, v, a);  // batch x seq x heads x head_dim
  return out_proj(y.reshape({B, T, H * head_dim}));
}

}  // namespace strata::torch
