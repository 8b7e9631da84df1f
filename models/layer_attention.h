// models/layer_attention.h: the attention of one layer of a trained model (the decoder of
// models/decoder.h, the forecasting encoders of models/forecaster.h), chosen per layer by a spec
// string: every attention of the project (structured-attention.md sections 2-4 and 7).
//
// One spec: "<kind>" or "<kind>:<key>=<value>,<key>=<value>,..." (no spaces); keys per kind, with
// their defaults:
//   mha         scale=8/d|1/sqrt(d) (8/d)   standard attention (strata::torch::attention); 8/d is the
//                                           reference code's muP logit scale (d = head dim)
//   swa         w=<int >= 0> (required), scale (8/d)
//                                           sliding window: keys t-w..t (causal); t-w..t+w in an encoder
//   gswa        split=<a>|<b> (required, a + b = d), w=<int >= 0> (required)
//                                           the paper's global + SWA (strata::torch::paper_gswa_attention):
//                                           causal softmax on the a dims (logit scale 8/a) PLUS windowed
//                                           softmax on the b dims (8/b), probabilities summed (rows sum
//                                           to 2). Causal models only (the reference's).
//   longformer  global=<int >= 0> (required), w=<int >= 0> (required), scale (8/d)
//                                           the usual global + SWA: the first `global` positions are
//                                           global tokens, plus the window; ONE softmax
//   mlr         ranks=<r1>|<r2>|... (required, sum = d), avg=0|1 (0), div=0|1 (0),
//               scale=inv_rank|inv_sqrt_head_dim (inv_rank)
//                                           MLR attention (strata::torch::MLRAttention): avg = level
//                                           averaging (ref mlr_block_divide_by_num_levels), div = S/L;
//                                           blocks from the model's context (b_l = context / 2^(l-1))
//   btt         s=<int >= 1> (1), rule=ref|balanced (ref), logit=sp|mup (sp)
//                                           Bilinear BTT (strata::torch::BilinearBTTAttention)
//   bmlr        ranks=<r1>|<r2>|... (required, sum = d), logit=sp|mup (sp), div=0|1 (0)
//                                           Bilinear MLR (strata::torch::BilinearMLRAttention)
//   monarch     T=<int >= 1> (1), B=<int >= 0> (0 = floor(sqrt(seq))), scale (8/d)
//                                           MonarchAttention: encoders only (an error in a causal model)
//   sdpa        scale (8/d)                 plain LibTorch at::scaled_dot_product_attention (the peer of
//                                           `strata bench train`), causal as the model
// e.g. "mha", "mha:scale=1/sqrt(d)", "swa:w=512", "gswa:split=32|32,w=512", "longformer:global=16,w=64",
// "mlr:ranks=32|8|6|4|4|4|4|2,avg=1", "btt:s=1,logit=mup", "bmlr:ranks=8|8|8|8", "monarch:T=2,B=8".
//
// A PATTERN lists per-layer specs joined by '|', repeated cyclically over the layers (the layer
// count must be a multiple of the pattern's length): "mha|swa:w=64|swa:w=64" on 6 layers is
// mha, swa, swa, mha, swa, swa. List values use '|' too (the papers' notation): in a pattern a '|'
// followed by a digit continues a list value, a '|' followed by a letter starts the next layer's
// spec (kinds start with a letter, list items are integers, so the reading is unambiguous):
// "mlr:ranks=48|16|mha" is an mlr layer (ranks 48, 16) then an mha layer.
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

#include "strata/torch/attention.h"
#include "strata/torch/bilinear_attention.h"
#include "strata/torch/mlr.h"
#include "strata/torch/mup.h"

namespace strata::models {

enum class LayerAttentionKind { mha, swa, gswa, longformer, mlr, btt, bmlr, monarch, sdpa };

// "mha", "swa", ... (the spec's kind names).
const char* layer_attention_kind_name(LayerAttentionKind kind);

// The logit scale of the q.k kinds (mha, swa, longformer, monarch, sdpa).
enum class LogitScale { eight_over_d, inv_sqrt_d };  // spec "8/d" | "1/sqrt(d)"
const char* logit_scale_name(LogitScale s);
double logit_scale_value(LogitScale s, int64_t head_dim);  // 8/d or 1/sqrt(d)

struct LayerAttentionSpec {
  LayerAttentionKind kind = LayerAttentionKind::mha;
  LogitScale scale = LogitScale::eight_over_d;  // mha, swa, longformer, monarch, sdpa
  int64_t window = -1;                          // swa, gswa, longformer: w (-1: not given)
  int64_t split_a = 0, split_b = 0;             // gswa: a|b
  int64_t num_global = -1;                      // longformer (-1: not given)
  std::vector<int64_t> ranks;                   // mlr, bmlr: r_1..r_L
  bool level_average = false;                   // mlr avg
  bool divide_by_num_levels = false;            // mlr, bmlr div
  std::string mlr_scale = "inv_rank";           // mlr scale: "inv_rank" | "inv_sqrt_head_dim"
  int64_t btt_rank = 1;                         // btt s
  std::string btt_rule = "ref";                 // btt rule: "ref" | "balanced"
  std::string logit = "sp";                     // btt, bmlr: "sp" | "mup"
  int64_t monarch_steps = 1, monarch_block = 0;  // monarch T, B

  bool operator==(const LayerAttentionSpec&) const = default;
};

// One spec (grammar above; a single layer, no pattern). Throws strata::Error naming the bad part:
//   attention spec "flash": unknown kind 'flash' (expected one of: mha, swa, ...)
//   attention spec "swa:x=1": unknown key 'x' for swa (expected one of: w, scale)
//   attention spec "swa": key 'w' is required for swa
LayerAttentionSpec parse_layer_attention(const std::string& spec);

// The canonical spec: every key of the kind in the grammar's order, so that
// parse_layer_attention(to_string(s)) == s.
std::string to_string(const LayerAttentionSpec& spec);

// The per-layer specs of a pattern (grammar above) for a model of num_layers layers: element l is
// layer l's. Throws naming the spec at fault, or 'attention pattern ... has N specs: the layer
// count M must be a multiple of N'.
std::vector<LayerAttentionSpec> parse_attention_pattern(const std::string& pattern, int64_t num_layers);
// The shortest pattern string of the per-layer specs (specs joined by '|').
std::string pattern_to_string(const std::vector<LayerAttentionSpec>& specs);

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
