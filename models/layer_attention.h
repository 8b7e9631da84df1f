// models/layer_attention.h: the attention of one layer of a trained model (the decoder of
// models/decoder.h, the forecasting encoders of models/forecaster.h), chosen per layer by a spec
// string: every attention of the project (structured-attention.md sections 2-4 and 7).
//
// The spec grammar (one spec per layer, and patterns of them) and its parser:
// models/layer_attention_spec.h (torch-free).
//
// Sizes (ranks summing to the head dim, gswa's split, a causal model with monarch, the context
// fitting MLR's levels) are checked against the model by validate() below, which the modules call;
// the error names the key: 'attention spec "mlr:ranks=8|8": key 'ranks': expected ... = 32, got 16'.
//
// What the layers do not have: attention-probability dropout (the kernels have none; the models'
// residual dropout applies after the output projection).
#pragma once
#include <ATen/ATen.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "models/layer_attention_spec.h"
#include "strata/torch/attention.h"
#include "strata/torch/bilinear_attention.h"
#include "strata/torch/mlr.h"
#include "strata/torch/mup.h"

namespace strata::models {

// The model around one attention layer.
struct AttentionGeometry {
  int64_t width = 0;    // D, the model width
  int64_t heads = 1;    // H, dividing D; head dim d = D / H
  int64_t context = 0;  // the model's context (max tokens); MLR's blocks come from it
  bool causal = true;
  bool bias = false;          // biases of the projections and the QK-LayerNorms
  bool qk_layernorm = false;  // LayerNorm of q and k over the head dim (weight shared by heads)
  int64_t head_dim() const { return width / heads; }
};

// Throws strata::Error unless spec fits a layer of geometry g (the sizes the spec names: ranks
// summing to d, gswa's a + b = d, monarch only non-causal, gswa only causal, MLR's levels fitting
// the context, BTT's factorisation, bilinear MLR's blocks dividing D); the message names the key.
void validate(const LayerAttentionSpec& spec, const AttentionGeometry& g);

// The per-layer specs of a model's `attention` pattern, each validated against g; a model
// constructor's one call. Throws strata::Error "<where>: key 'attention': layer <l>: ..." (or the
// pattern's own error) naming the spec and key at fault.
std::vector<LayerAttentionSpec> model_layer_specs(const std::string& pattern, int64_t num_layers,
                                                  const AttentionGeometry& g, const char* where);

// The context MLR's blocks come from: g.context in a causal model (a multiple of 2^(L-1), else
// an error naming 'context'); in an encoder, which always sees its whole fixed-length input, the
// context rounded up to a multiple of 2^(L-1) (e.g. 42 patches with 4 levels: 48).
int64_t mlr_block_context(const LayerAttentionSpec& spec, const AttentionGeometry& g);

// FLOPs (2 x multiply-accumulates) of the attention proper of one forward over one sequence of T
// tokens, all heads: the score and value matmuls (the projections, BTT / bilinear-MLR transforms
// included, are SelfAttentionImpl::projection_flops). Conventions, reusing the core's counts:
//   mha, sdpa     strata::attention_flops (causal: half of 2 H T^2 (d + d), FlashAttention's convention)
//   swa           2 H (d + d) x the allowed (query, key) pairs, counted exactly (the window's saving)
//   longformer    the same over the pairs allowed by window or global tokens
//   gswa          branch a: strata::attention_flops with head dim a, value dim d (causal); branch b:
//                 2 H (b + d) x the window's pairs
//   mlr           strata::mlr_attention_flops(...).total (exact over pairs, shared-level prefix lengths)
//   btt           strata::attention_flops with one shared query of head dim D, H heads of key dim D,
//                 value dim d
//   bmlr          strata::attention_flops with head dim sum_l r_l p_l (the concatenated features), value d
//   monarch       strata::monarch_attention_flops
// context: the model's (MLR's blocks; 0 = T).
double attention_forward_flops(const LayerAttentionSpec& spec, int64_t T, int64_t width, int64_t heads, bool causal,
                               int64_t context = 0);

// The self-attention block of one layer: x (batch x T x D) -> batch x T x D.
// Kinds with q/k/v projections (all but btt and bmlr):
//   q, k, v = x W_q^T, x W_k^T, x W_v^T (+ biases), viewed batch x T x H x d;
//   QK-LayerNorm (option) over d on q and k (weight shared by heads, bias with `bias`, eps 1e-5);
//   the kind's attention; out = y W_o^T (+ b_o).
// mlr is strata::torch::MLRAttention's layer exactly (the same projections, QK-LayerNorm and
// strata::torch::mlr_attention with mlr_args(); a test loads one's weights into the other), held
// as the other projection kinds' so that every projection kind has the same parameters and
// qkv() / attend() / mlr_args() serve incremental decoding.
// btt / bmlr: the whole layer is the submodule `btt` / `bmlr` (strata::torch::BilinearBTTAttention /
// BilinearMLRAttention: their v_proj, out_proj); q_proj ... out_proj here are empty (the query and
// key are structured transforms of x). QK-LayerNorm: bmlr's per-level LayerNorms follow
// qk_layernorm; btt always normalises its key transform (ref asserts do_qk_ln).
// muP roles: projections hidden (fan-in D), out_proj output (zero-initialised by mup_init_), QK-LN
// weights gains, biases bias; btt / bmlr declare their own (structured cores).
class SelfAttentionImpl : public ::torch::nn::Cloneable<SelfAttentionImpl>, public strata::torch::MupDeclaring {
 public:
  // Throws strata::Error (validate above) when the spec does not fit g.
  SelfAttentionImpl(LayerAttentionSpec spec, AttentionGeometry g);

  void reset() override;
  void pretty_print(std::ostream& stream) const override;

  // x: batch x T x D -> batch x T x D (mlr: positions past the context continue the blocks).
  at::Tensor forward(const at::Tensor& x);
  // Projection kinds only (has_qkv()): q, k, v of x (batch x T x D), each batch x T x H x d, after
  // QK-LayerNorm. Throws for btt / bmlr.
  std::tuple<at::Tensor, at::Tensor, at::Tensor> qkv(const at::Tensor& x);
  // Projection kinds only: the attention of q, k, v (batch x T x H x d each, as qkv() gives)
  // -> batch x T x H x d (before out_proj).
  at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) const;
  // Projection kinds: x's q, k, v from one GEMM on the stacked weights, batch x T x 3 x H x d.
  at::Tensor packed_qkv(const at::Tensor& x) const;
  // The dense kinds (mha, swa, longformer): the AttentionArgs attend() passes; nullopt otherwise.
  std::optional<strata::torch::AttentionArgs> dense_args() const;
  // forward(layer_norm(x, ln_weight, ln_bias, eps)) with the LayerNorm fused into the q/k/v
  // projection (strata::torch::ln_linear) and the attention on the packed q/k/v: a pre-LN block's
  // ln1 + attention. Undefined where it does not apply (kinds other than the dense ones,
  // qk_layernorm, fewer than 16 tokens): the caller then runs the two separately.
  at::Tensor forward_ln(const at::Tensor& x, const at::Tensor& ln_weight, const at::Tensor& ln_bias, double eps);
  // True when forward(x) runs the attention on the packed q/k/v (the dense kinds and mlr, without
  // qk_layernorm, 16 tokens or more); attend_packed: that attention of qkv (batch x T x 3 x H x d).
  bool packs_qkv(const at::Tensor& x) const;
  at::Tensor attend_packed(const at::Tensor& qkv) const;
  bool has_qkv() const;
  // mlr only: the MlrArgs attend() passes (blocks from mlr_block_context), e.g. for MlrKvCache.
  strata::torch::MlrArgs mlr_args() const;

  // attention_forward_flops(spec, T, ...) + projection_flops(T).
  double forward_flops(int64_t T) const;
  // The projections' FLOPs over T tokens: q/k/v/out Linears, or the BTT / bilinear-MLR transforms
  // (strata::structured_flops of their operators) + v / out.
  double projection_flops(int64_t T) const;

  std::vector<std::pair<std::string, strata::torch::MupRole>> mup_roles() const override;

  LayerAttentionSpec spec;
  AttentionGeometry geometry;
  int64_t head_dim = 0;
  ::torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, out_proj{nullptr};  // empty for btt, bmlr
  at::Tensor q_norm_weight, q_norm_bias, k_norm_weight, k_norm_bias;  // d each; undefined when off
  strata::torch::BilinearBTTAttention btt{nullptr};
  strata::torch::BilinearMLRAttention bmlr{nullptr};
};

// The module holder (TORCH_MODULE(SelfAttention), spelled out as strata/torch's holders are).
class SelfAttention : public ::torch::nn::ModuleHolder<SelfAttentionImpl> {
 public:
  using ::torch::nn::ModuleHolder<SelfAttentionImpl>::ModuleHolder;
  using Impl = SelfAttentionImpl;
};

}  // namespace strata::models
