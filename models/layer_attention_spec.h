// models/layer_attention_spec.h: the spec strings that choose the attention of each layer of a
// trained model (models/layer_attention.h builds the layers), and their parser. Torch-free, so
// that the grammar is fuzzed (tests/fuzz/) and tested under ASan with the other readers of user
// input.
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
#pragma once
#include <cstdint>
#include <string>
#include <vector>

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

}  // namespace strata::models
