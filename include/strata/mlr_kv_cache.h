// strata/mlr_kv_cache.h: the decode (autoregressive) cache of MLR attention (strata/mlr.h).
//
// A query at position t meets level-l keys only inside its own level-l block, so the cache keeps,
// per level, only the level-l key slices (r_l dims) of the CURRENT level-l block: b_l * r_l floats
// per (sequence, kv head), T * sum_l r_l / 2^(l-1) for dyadic blocks over a context T (about 4x
// fewer than a dense key cache for 8 levels of 8). Position t goes to slot t mod b_l of level l, so
// entering a new level-l block simply starts overwriting that level's slots (blocks are aligned at
// multiples of b_l). The V cache is full (level 1 is global; pairs sharing no level still get
// score 0 and weight V).
//
// Use: per step, append the new token's k, v for each sequence, then attend with its q. A prompt
// is appended in one call (its own outputs come from mlr_attention_forward over the prompt). Each
// sequence of the batch has its own length; append n_new[b] = 0 tokens to leave one unchanged.
// attend's output for a sequence of length n equals row n-1 of mlr_attention_forward over its n
// tokens (same options, causal) to fp32 round-off.
//
// Blocks: fixed at construction from opt: block_sizes, or the default rule with opt.context (the
// model's context length). With L >= 2 levels one of the two is required (an error names
// opt.context otherwise): the forward's default (context = 0: blocks from the call's key length)
// would give the n tokens held a different geometry at every n. With them, attend after n tokens
// equals row n-1 of mlr_attention_forward over those n tokens with the same options, for every n
// (and positions past the context continue the blocks by absolute position, as the forward does).
// Segments (variable-length level-1 blocks, mlr.h "Blocks"): when opt has segment_starts (one
// list for every sequence) or segment_offsets (per-sequence lists), the cache is in SEGMENT mode:
// level 1 is the current segment (its keys are kept up to max_seqlen), level l >= 2 cuts it into
// blocks of b_l from its start. The listed positions start segments as the tokens arrive, and
// begin_segment(b) starts one at the next token of sequence b (a document end seen while
// generating). attend then equals the forward over the sequence with its segment list (the lists
// are copied; opt's pointers need not outlive the constructor).
// Non-causal options are accepted: the query at the last position sees only earlier keys either
// way, so decoding is always causal (it equals the LAST row of a non-causal forward over the
// tokens so far, not row t of one over the whole sequence).
// Storage is fp32 whatever the input dtype (f32 or bf16); math is fp32.
//
// Shapes (layout opt.layout; BSHD shown; any strides):
//   k      batch x n x heads_kv x head_dim       (rows >= n_new[b] are ignored)
//   v      batch x n x heads_kv x head_dim_v
//   q      batch x 1 x heads_q  x head_dim        heads_q % heads_kv == 0
//   o      batch x 1 x heads_q  x head_dim_v      dtype of q
//   lse    batch x heads_q x 1                    float32 (natural log; -inf for an empty sequence)
#pragma once
#include <cstdint>
#include <vector>

#include "strata/mlr.h"
#include "strata/tensor.h"

namespace strata {

class MlrKvCache {
 public:
  MlrKvCache(int64_t batch, int64_t heads_kv, int64_t head_dim_v, int64_t max_seqlen, const MlrOptions& opt);

  // Appends n_new[b] tokens (keys and values) to sequence b; throws if one would exceed max_seqlen.
  void append(const TensorView& k, const TensorView& v, const int64_t* n_new);
  // Segment mode only: the next token appended to sequence b starts a new segment (a no-op for
  // an empty sequence, whose first token starts one anyway).
  void begin_segment(int64_t b);
  // Attention of one query per sequence at its last position (length(b) - 1) over its cache.
  void attend(const TensorView& q, const TensorView& o, const TensorView& lse) const;

  int64_t length(int64_t b) const { return len_[size_t(b)]; }
  int64_t key_bytes() const { return int64_t(keys_.size() * sizeof(float)); }
  int64_t value_bytes() const { return int64_t(values_.size() * sizeof(float)); }
  int64_t memory_bytes() const { return key_bytes() + value_bytes(); }
  // Key bytes a dense cache of max_seqlen tokens would take (fp32), for comparison.
  int64_t dense_key_bytes() const { return batch_ * heads_kv_ * max_seqlen_ * head_dim_ * int64_t(sizeof(float)); }

 private:
  // First position of the level-l block (l = 0..L-1) holding position t of sequence b.
  int64_t block_start(int64_t b, int l, int64_t t) const;

  MlrOptions opt_;
  int64_t batch_, heads_kv_, head_dim_, head_dim_v_, max_seqlen_;
  int num_levels_;
  bool segmented_ = false;                                // level 1 = segments
  std::vector<int64_t> block_, cap_, rank_, slice_, key_off_;  // b_l (0: level 1 = segment), slots of
                                                          // level l, r_l, first dim of slice l, offset
  int64_t keys_per_head_ = 0;                             // sum_l cap_l r_l
  std::vector<float> scale_;                              // c_l (times 1/L if divide_by_num_levels)
  std::vector<float> keys_, values_;                      // [batch][kv head][...]; level l transposed r_l x cap_l
  std::vector<int64_t> len_;
  std::vector<int64_t> seg_start_;                        // start of sequence b's current segment
  std::vector<std::vector<int64_t>> seg_list_;            // sequence b's listed segment starts
  std::vector<size_t> seg_next_;                          // next unused entry of seg_list_[b]
  std::vector<uint8_t> seg_pending_;                      // begin_segment(b) called
};

}  // namespace strata
