// models/attention_zoo.h: the attention methods a pretrained encoder can be converted to
// (docs/methods.md, zero-shot conversion), named by a one-line spec, plus their attention FLOP counts.
//
// The spec grammar and its parser: models/attention_spec.h (torch-free).
//
// FLOPs (attention_flops): 2 x the multiply-accumulates of the attention matmuls, as ref counts
// them (the Q/K/V/output projections are not attention FLOPs). ref's plots show MACs, so their
// figures are half of ours (ViT-B/16 softmax: 7.15e8 there, 1.43e9 here).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "models/attention_spec.h"
#include "models/bert_encoder.h"

namespace strata::models {

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
