// models/attention_zoo.h: the attention methods a pretrained encoder can be converted to
// (docs/methods.md, zero-shot conversion), named by a one-line spec, plus their attention FLOP counts.
//
// Spec strings: "<kind>" or "<kind>:<key>=<value>,<key>=<value>,..." (no spaces), keys per kind:
//   softmax                                   exact softmax attention (strata's dense kernel)
//   monarch    T=<int >= 1>       (1)         MonarchAttention, alternating-maximisation steps
//              B=<int >= 0>       (0)         block size; 0 = floor(sqrt(seq)) of each call
//              pad=post|pre       (post)      where N is zero-padded to a multiple of B
//              mode=stable|reference (stable) see include/strata/monarch.h
//   nystrom    landmarks=<int >= 1> (16)      Nystromformer, segment-mean landmarks
//              iters=<int >= 1>   (6)         iterations of the iterative pseudo-inverse
//   performer  features=<int >= 1> (64)       Performer, positive random features
//              seed=<int >= 0>    (none)      none: features redrawn on every call
// e.g. "softmax", "monarch:T=2,B=8,pad=post", "nystrom:landmarks=16", "performer:features=64,seed=0".
// Semantics of each method: torch/include/strata/torch/monarch.h and baselines.h.
//
// FLOPs (attention_flops): 2 x the multiply-accumulates of the attention matmuls, as ref counts
// them (the Q/K/V/output projections are not attention FLOPs). ref's plots show MACs, so their
// figures are half of ours (ViT-B/16 softmax: 7.15e8 there, 1.43e9 here).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "models/bert_encoder.h"
#include "strata/monarch.h"

namespace strata::models {

enum class AttentionKind { softmax, monarch, nystrom, performer };

struct AttentionSpec {
  AttentionKind kind = AttentionKind::softmax;
  // monarch
  int64_t num_steps = 1;         // T
  int64_t block_size = 0;        // B; 0 = floor(sqrt(seq)) per call
  MonarchPad pad = MonarchPad::post;       // spec "post" | "pre"
  MonarchMode mode = MonarchMode::stable;  // spec "stable" | "reference"
  // nystrom
  int64_t num_landmarks = 16;
  int64_t pinv_iters = 6;
  // performer
  int64_t num_features = 64;
  std::optional<int64_t> seed;   // none: redrawn on every call

  bool operator==(const AttentionSpec&) const = default;
};

// "softmax" | "monarch" | "nystrom" | "performer".
const char* kind_name(AttentionKind kind);

// Parses a spec string (grammar above), the one parse of a spec: pad and mode become the core's
// enums here. Throws strata::Error naming the bad part, e.g.
//   attention spec "monarch:T=0": key 'T': expected an integer >= 1, got "0"
//   attention spec "nystrom:B=4": unknown key 'B' for nystrom (expected one of: landmarks, iters)
AttentionSpec parse_attention_spec(const std::string& spec);

// The canonical spec string: every key of the kind, in the order of the grammar above, so that
// parse_attention_spec(to_string(s)) == s (fields of other kinds keep their defaults).
std::string to_string(const AttentionSpec& spec);

// The attention of one layer (bshd, float32; key_padding_mask from the encoder, true = token).
// softmax: dense_attention(). monarch: strata::torch::monarch_attention. nystrom, performer:
// strata::torch::nystrom_attention / performer_attention (with a seed, every call draws the
// same features). Throws strata::Error for an invalid spec (as parse_attention_spec would).
AttentionFn make_attention(const AttentionSpec& spec);

// Attention FLOPs of one sequence of `seqlen` tokens through one layer, all heads
// (q, k, v head dims = head_dim):
//   softmax    strata::attention_flops (non-causal forward) = heads * 4 N^2 D
//   monarch    strata::monarch_attention_flops (T, B; over the padded length M*B)
//   nystrom    heads * strata::torch::nystrom_attention_flops(N, D, D, landmarks, iters)
//   performer  heads * strata::torch::performer_attention_flops(N, D, D, features)
double attention_flops(const AttentionSpec& spec, int64_t seqlen, int64_t heads, int64_t head_dim);

// Attention FLOPs of one sequence through the whole encoder when `layers` (empty = all) use
// `spec` and the others softmax.
double encoder_attention_flops(const BertConfig& cfg, const AttentionSpec& spec,
                               const std::vector<int64_t>& layers, int64_t seqlen);

// Replaces the attention of `layers` (0-based; empty = every layer) with make_attention(spec).
// Performer with a seed s: layer l gets seed s + l, so the layers draw independent features (as
// ref, which redraws on every call) and the model stays reproducible. Throws strata::Error for a
// layer out of range or repeated (nothing is changed then).
void convert(BertEncoder& encoder, const AttentionSpec& spec, const std::vector<int64_t>& layers);

}  // namespace strata::models
