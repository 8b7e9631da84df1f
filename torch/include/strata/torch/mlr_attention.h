// strata/torch/mlr_attention.h: MLRAttention, a torch::nn::Module: multi-head self-attention
// whose scores are multi-level low rank (strata/torch/mlr.h), with the reference code's layer
// around it (Kuang et al., src/model.py AttentionMLR): q/k/v/out Linear projections, optional
// QK-LayerNorm over the whole head dim (before the split into levels, weight shared by heads,
// bias with the `bias` option, eps 1e-5), then MLR attention, then the out projection.
// Grouped-query attention (num_kv_heads < num_heads) without copies of k and v.
//
//   x   batch x seq x embed_dim  ->  batch x seq x embed_dim
//   head_dim = embed_dim / num_heads = r_1 + ... + r_L; q has num_heads heads, k and v
//   num_kv_heads (dividing num_heads), all with head_dim.
#pragma once
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <optional>
#include <string>
#include <vector>

#include "strata/torch/mlr.h"

namespace strata::torch {

struct MLRAttentionOptions {
  MLRAttentionOptions(int64_t embed_dim, int64_t num_heads, std::vector<int64_t> ranks)
      : embed_dim_(embed_dim), num_heads_(num_heads), ranks_(std::move(ranks)) {}
  TORCH_ARG(int64_t, embed_dim);
  TORCH_ARG(int64_t, num_heads);
  TORCH_ARG(std::vector<int64_t>, ranks);  // r_1..r_L, sum = head_dim
  TORCH_ARG(int64_t, num_kv_heads) = 0;    // 0 = num_heads (no GQA)
  TORCH_ARG(bool, bias) = true;            // biases of the projections (and QK-LN)
  TORCH_ARG(bool, qk_layernorm) = false;   // ref do_qk_ln
  // The MlrArgs options (strata/torch/mlr.h); the module always works in layout "bshd".
  // With L >= 2 levels, context (the model's context length, a multiple of 2^(L-1)) or
  // block_sizes is REQUIRED: the blocks are the model's, the same for training, prefill and
  // decoding, and a position's output never depends on later tokens (strata/mlr.h, "Blocks").
  TORCH_ARG(std::vector<int64_t>, block_sizes) = {};
  TORCH_ARG(int64_t, context) = 0;
  TORCH_ARG(bool, mask_cross_segment) = false;
  TORCH_ARG(std::string, scale) = "inv_rank";
  TORCH_ARG(bool, divide_by_num_levels) = false;
  TORCH_ARG(bool, level_average) = false;
  TORCH_ARG(bool, causal) = true;
};

class MLRAttentionImpl : public ::torch::nn::Cloneable<MLRAttentionImpl> {
 public:
  // Throws strata::Error naming the option when the sizes do not fit together.
  explicit MLRAttentionImpl(MLRAttentionOptions options);
  MLRAttentionImpl(int64_t embed_dim, int64_t num_heads, std::vector<int64_t> ranks)
      : MLRAttentionImpl(MLRAttentionOptions(embed_dim, num_heads, std::move(ranks))) {}

  void reset() override;
  // "strata::torch::MLRAttention(embed_dim=64, num_heads=4, num_kv_heads=2, ranks=[8, 4, 4], ...)".
  void pretty_print(std::ostream& stream) const override;

  // x: batch x seq x embed_dim. segment_starts / segment_offsets: as MlrArgs (1-D int64; per
  // sequence lists need batch + 1 offsets). Returns batch x seq x embed_dim.
  at::Tensor forward(const at::Tensor& x, const std::optional<at::Tensor>& segment_starts = std::nullopt,
                     const std::optional<at::Tensor>& segment_offsets = std::nullopt);

  // The MlrArgs forward() passes (without segments).
  MlrArgs mlr_args() const;

  MLRAttentionOptions options;
  int64_t head_dim = 0;
  ::torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, out_proj{nullptr};
  // QK-LayerNorm affine parameters (head_dim each; undefined when off, the biases also when !bias).
  at::Tensor q_norm_weight, q_norm_bias, k_norm_weight, k_norm_bias;
};

// The module holder (what TORCH_MODULE(MLRAttention) declares; spelled out because the macro
// names torch::nn unqualified, which inside strata::torch means strata::torch::nn).
class MLRAttention : public ::torch::nn::ModuleHolder<MLRAttentionImpl> {
 public:
  using ::torch::nn::ModuleHolder<MLRAttentionImpl>::ModuleHolder;
  using Impl = MLRAttentionImpl;
};

}  // namespace strata::torch
