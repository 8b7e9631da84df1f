// models/decoder.h: the GPT-style decoder the structured-attention paper trains (ref src/model.py
// GPT; structured-attention.md sections 6-7, experiments.md sections 1-2), for character language
// modelling (token ids in, logits out) and in-context regression (vectors in, a scalar out), with
// the attention of every layer from a pattern (models/layer_attention.h).
//
//   x = tok_emb(ids) + pos_emb(0..T-1)          char LM   (or read_in(x) + pos_emb: regression)
//   x = dropout(x)
//   per block: x = x + dropout(attn(ln1(x)));  x = x + dropout(mlp(ln2(x)))      (pre-LN)
//              mlp(x) = proj(GELU(fc(x))), fc: width -> 4 width, proj: 4 width -> width
//   out = head(ln_f(x))                          head: width -> vocab (untied, no bias, as ref's
//                                                lm_head) or width -> output_dim (the read-out)
// LayerNorms: weight, and a bias only with `bias` (ref's LayerNorm(bias=config.bias)), eps 1e-5.
// Linears: a bias only with `bias` (the LM head never). GELU: the exact (erf) form, as nn.GELU().
// No attention-probability dropout (see layer_attention.h); `dropout` applies to the embeddings,
// the attention output and the MLP output, as ref's drop / resid_dropout / MLP dropout.
//
// Init (the constructor, through strata::torch::mup_init_ with torch's default generator: seed it
// with torch::manual_seed first): token embedding and read-in N(0, 0.02^2), the position table 0,
// q/k/v, MLP fc, the attention out projections and MLP proj N(0, 1/fan_in), the head / read-out
// N(0, 1/width^2), LN weights 1, biases 0, structured cores by their modules' rules (the trainer
// re-initialises by train.param and train.zero_init). Every parameter has a declared muP role, so
// strata::torch::mup_param_groups / mup_adamw work on the whole model.
#pragma once
#include <ATen/ATen.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <string>
#include <utility>
#include <vector>

#include "models/layer_attention.h"
#include "strata/torch/mup.h"

namespace strata::models {

// LayerNorm over the last dim with an optional bias (LibTorch's has none without its weight):
// y = (x - mean) / sqrt(var + eps) * weight (+ bias). Roles: weight gain, bias bias.
class NormImpl : public ::torch::nn::Cloneable<NormImpl>, public strata::torch::MupDeclaring {
 public:
  NormImpl(int64_t dim, bool bias, double eps = 1e-5);
  void reset() override;
  at::Tensor forward(const at::Tensor& x) const;  // ... x dim -> ... x dim
  std::vector<std::pair<std::string, strata::torch::MupRole>> mup_roles() const override;
  int64_t dim;
  bool has_bias;
  double eps;
  at::Tensor weight, bias;  // bias undefined without has_bias
};
class Norm : public ::torch::nn::ModuleHolder<NormImpl> {
 public:
  using ::torch::nn::ModuleHolder<NormImpl>::ModuleHolder;
  using Impl = NormImpl;
};

// The MLP of a block: proj(GELU(fc(x))) (exact erf GELU), width -> hidden -> width. Roles: fc
// hidden, proj output.
class MlpImpl : public ::torch::nn::Cloneable<MlpImpl>, public strata::torch::MupDeclaring {
 public:
  MlpImpl(int64_t width, int64_t hidden, bool bias);
  void reset() override;
  at::Tensor forward(const at::Tensor& x);  // ... x width -> ... x width
  // A pre-LN block's MLP half, x + forward(ln(x)): with `fused`, one kernel call each way (the
  // LayerNorm, the MLP and the residual add); else those three ops.
  at::Tensor forward_block(const at::Tensor& x, const NormImpl& ln);
  std::vector<std::pair<std::string, strata::torch::MupRole>> mup_roles() const override;
  double forward_flops(int64_t T) const;    // 2 T (width hidden) x 2
  int64_t width, hidden;
  bool bias;
  // The fused kernel (strata::torch::gelu_mlp: one call each way, the hidden activations in cache)
  // or, false, the three ATen ops (Linear, GELU, Linear: bench train's plain-LibTorch peer). The same
  // parameters and math either way.
  bool fused = true;
  ::torch::nn::Linear fc{nullptr}, proj{nullptr};
};
class Mlp : public ::torch::nn::ModuleHolder<MlpImpl> {
 public:
  using ::torch::nn::ModuleHolder<MlpImpl>::ModuleHolder;
  using Impl = MlpImpl;
};

// One pre-LN transformer block: x + drop(attn(ln1(x))), then + drop(mlp(ln2(x))). The decoder's
// (causal) and the forecasting encoders' (non-causal) blocks.
class BlockImpl : public ::torch::nn::Cloneable<BlockImpl> {
 public:
  BlockImpl(LayerAttentionSpec spec, AttentionGeometry g, int64_t mlp_hidden, double dropout);
  void reset() override;
  at::Tensor forward(const at::Tensor& x);  // batch x T x width -> batch x T x width
  double forward_flops(int64_t T) const;    // attention (with projections) + MLP
  LayerAttentionSpec spec;
  AttentionGeometry geometry;
  int64_t mlp_hidden;
  double dropout_p;
  // strata's fused kernels for ln1 + the q/k/v projection and ln2 + MLP + residual (false: ATen
  // ops, as bench train's plain-LibTorch peer); set_fused sets the MLP's too.
  bool fused = true;
  void set_fused(bool on) {
    fused = on;
    mlp->fused = on;
  }
  Norm ln1{nullptr}, ln2{nullptr};
  SelfAttention attn{nullptr};
  Mlp mlp{nullptr};
  ::torch::nn::Dropout drop{nullptr};
};
class Block : public ::torch::nn::ModuleHolder<BlockImpl> {
 public:
  using ::torch::nn::ModuleHolder<BlockImpl>::ModuleHolder;
  using Impl = BlockImpl;
};

struct DecoderConfig {
  int64_t vocab_size = 0;                  // > 0: token ids in, logits out (char LM); 0: regression
  int64_t input_dim = 0, output_dim = 1;   // regression: read_in Linear(input_dim -> width), head width -> output_dim
  int64_t width = 128, layers = 4, heads = 4, context = 256;
  bool bias = false, qk_layernorm = false;
  bool fused = true;                       // BlockImpl::fused of every block
  double dropout = 0;
  std::string attention = "mha";           // pattern (models/layer_attention.h)
};

class DecoderImpl : public ::torch::nn::Cloneable<DecoderImpl>, public strata::torch::MupDeclaring {
 public:
  // Throws strata::Error naming the config field (or the attention spec and key) that does not fit.
  explicit DecoderImpl(DecoderConfig cfg);
  void reset() override;
  void pretty_print(std::ostream& stream) const override;

  // int64 batch x T token ids in [0, vocab) -> batch x T x vocab logits (char LM), or
  // float batch x T x input_dim -> batch x T x output_dim (regression); T <= context.
  at::Tensor forward(const at::Tensor& input);
  // FLOPs of one forward over one sequence of T tokens, non-embedding: every matmul (q/k/v/out or
  // the structured transforms, attention, MLP, the head / read-out, the read-in), not the
  // embedding lookups, LayerNorms or softmax. A training step costs about 3x (forward + backward).
  double forward_flops(int64_t T) const;
  // Trainable parameters outside the token and position embeddings (the read-in counts).
  int64_t non_embedding_params() const;
  // tok_emb / read_in.weight, pos_emb embedding; attention / MLP out projections and head output.
  std::vector<std::pair<std::string, strata::torch::MupRole>> mup_roles() const override;

  DecoderConfig config;
  std::vector<LayerAttentionSpec> layer_specs;  // per layer, from config.attention
  ::torch::nn::Embedding tok_emb{nullptr};      // char LM: vocab x width (else empty)
  ::torch::nn::Linear read_in{nullptr};         // regression: input_dim -> width (else empty)
  ::torch::nn::Embedding pos_emb{nullptr};      // context x width
  ::torch::nn::Dropout drop{nullptr};
  ::torch::nn::ModuleList blocks;               // of Block, "blocks.<l>"; block(l) below
  // Layer l's block (a ModuleList rather than a vector of holders: clone() replaces the list's
  // modules, so typed holders kept beside it would go stale).
  BlockImpl& block(size_t l) const { return *blocks->ptr(l)->as<BlockImpl>(); }
  Norm ln_f{nullptr};
  ::torch::nn::Linear head{nullptr};            // width -> vocab (no bias) or width -> output_dim
};
class Decoder : public ::torch::nn::ModuleHolder<DecoderImpl> {
 public:
  using ::torch::nn::ModuleHolder<DecoderImpl>::ModuleHolder;
  using Impl = DecoderImpl;
};

}  // namespace strata::models
