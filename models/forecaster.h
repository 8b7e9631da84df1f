// models/forecaster.h: the long-horizon forecasting encoders of the ETT experiment
// (experiments.md section 3), with the non-causal attention of every layer from a pattern
// (models/layer_attention.h: mha, swa (two-sided window), longformer, mlr, btt, bmlr, monarch, sdpa;
// gswa is causal only). x: batch x L x C (input_len steps of C channels) -> batch x H x C.
//
// kind "point" (the paper's setting): every time step is a token.
//   [revin] -> embed Linear(C -> width) + pos_emb(0..L-1) (ADDED: the reference's time-series model
//   forgets its position embedding, structured-attention.md section 8) -> dropout -> encoder blocks
//   -> ln_f -> flatten (L x width) -> head Linear(L width -> H C) -> [de-normalise].
// kind "patch" (PatchTST-style, channel independent; Nie et al. 2023): each channel on its own:
//   [revin] -> pad the end with `stride` copies of the last value (PatchTST's padding_patch="end")
//   -> patches of patch_len with step stride: N = (L + stride - patch_len) / stride + 1 tokens
//   (336 / 16 / 8: 42) -> embed Linear(patch_len -> width) + pos_emb(0..N-1) -> dropout -> encoder
//   blocks -> ln_f -> flatten (N x width) -> head Linear(N width -> H) -> [de-normalise].
// revin: instance normalisation WITHOUT the affine parameters (PatchTST's revin with affine=False,
// its ETTh1 setting): per sample and channel, subtract the mean over the L steps and divide by
// sqrt(var + 1e-5) (biased var); the outputs are multiplied back and the mean added.
// Encoder blocks: the decoder's pre-LN blocks (models/decoder.h BlockImpl), non-causal, MLP hidden
// `ffn`, GELU (PatchTST uses post-norm BatchNorm; pre-LN keeps one block for both models).
// MLR's blocks: the token count rounded up to a multiple of 2^(levels-1) (layer_attention.h).
// Init: strata::torch::mup_init_ (embed N(0, 1/fan_in), pos_emb 0, attention out / MLP proj
// N(0, 1/fan_in), head N(0, 1/fan_in^2)), every parameter with a declared muP role.
#pragma once
#include <ATen/ATen.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <string>
#include <utility>
#include <vector>

#include "models/decoder.h"
#include "models/layer_attention.h"
#include "strata/torch/mup.h"

namespace strata::models {

struct ForecasterConfig {
  std::string kind = "patch";  // "point" | "patch"
  int64_t input_len = 336, horizon = 96, channels = 7, width = 128, layers = 3, heads = 16, ffn = 256;
  int64_t patch_len = 16, stride = 8;
  bool revin = true;
  bool bias = true, qk_layernorm = false;
  bool fused = true;  // BlockImpl::fused of every block
  double dropout = 0.2;
  std::string attention = "mha";  // non-causal pattern
};

class ForecasterImpl : public ::torch::nn::Cloneable<ForecasterImpl>, public strata::torch::MupDeclaring {
 public:
  // Throws strata::Error naming the config field (or the attention spec and key) that does not fit.
  explicit ForecasterImpl(ForecasterConfig cfg);
  void reset() override;
  void pretty_print(std::ostream& stream) const override;

  // x: batch x input_len x channels (float) -> batch x horizon x channels.
  at::Tensor forward(const at::Tensor& x);
  // FLOPs of one forward over one sample (all its channels): every matmul (embed, attention with
  // its projections, MLP, head).
  double forward_flops() const;
  // Tokens per sequence the encoder sees: input_len (point) or the patch count N (patch).
  int64_t tokens() const;
  std::vector<std::pair<std::string, strata::torch::MupRole>> mup_roles() const override;

  ForecasterConfig config;
  std::vector<LayerAttentionSpec> layer_specs;
  ::torch::nn::Linear embed{nullptr};        // C -> width (point) or patch_len -> width (patch)
  ::torch::nn::Embedding pos_emb{nullptr};   // tokens() x width
  ::torch::nn::Dropout drop{nullptr};
  ::torch::nn::ModuleList blocks;            // of Block (models/decoder.h)
  Norm ln_f{nullptr};
  ::torch::nn::Linear head{nullptr};         // tokens() width -> horizon C (point) or -> horizon (patch)
  BlockImpl& block(size_t l) const { return *blocks->ptr(l)->as<BlockImpl>(); }
};
class Forecaster : public ::torch::nn::ModuleHolder<ForecasterImpl> {
 public:
  using ::torch::nn::ModuleHolder<ForecasterImpl>::ModuleHolder;
  using Impl = ForecasterImpl;
};

}  // namespace strata::models
