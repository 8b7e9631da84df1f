// src/cpu/mlr_params.h: the POD parameter struct of the MLR attention kernels, and the block
// geometry every part (kernel, flop count) derives from it.
// Filled by src/cpu/mlr.cpp after validation (block sizes resolved, scales folded per level);
// read by every ISA variant of src/cpu/kernels/mlr.inc. Strides in elements, logical order
// (batch, seq, head, dim). Semantics: include/strata/mlr.h.
#pragma once
#include <algorithm>
#include <cstdint>

#include "core/dispatch.h"
#include "cpu/attention_params.h"  // AttnIO, Strided4
#include "strata/mlr.h"
#include "strata/tensor.h"

namespace strata::cpu {

constexpr int kMlrMaxLevels = 16;

// Level geometry. Fixed mode (block[0] > 0): the level-l blocks are [n*b_l, (n+1)*b_l) by absolute
// position, each level on its own. Segment mode (block[0] == 0): level 1's blocks are the
// segments; level l >= 2 cuts its segment into blocks of block[l-1] counted from the segment's
// start, the last one clipped at its end. Positions below 0 form one segment (-inf, 0).
// `nested`: every level-l block lies inside one level-(l-1) block (each b_l divides b_{l-1}; in
// segment mode from level 3 on), so the levels two positions share are a prefix 1..m.
struct MlrLevels {
  int num_levels = 0;                   // L
  int64_t rank[kMlrMaxLevels] = {};     // r_l
  int64_t rank_end[kMlrMaxLevels] = {}; // R_l = r_1 + .. + r_l  (slice l = [R_l - r_l, R_l))
  int64_t block[kMlrMaxLevels] = {};    // b_l; block[0] = 0 when segments define level 1
  bool nested = true;
  const int64_t* seg = nullptr;         // segment starts, strictly increasing, in (0, seqlen_k)
  int64_t num_seg = 0;
  const int64_t* seg_offsets = nullptr; // per-sequence lists: batch + 1 offsets into seg (or null)

  // The geometry of sequence b: with per-sequence lists, seg/num_seg narrowed to b's list.
  MlrLevels for_batch(int64_t b) const {
    MlrLevels r = *this;
    if (seg_offsets != nullptr) {
      r.seg = seg + seg_offsets[b];
      r.num_seg = seg_offsets[b + 1] - seg_offsets[b];
      r.seg_offsets = nullptr;
    }
    return r;
  }

  struct Block {
    int64_t start, end;  // [start, end)
  };
  static constexpr int64_t kFar = int64_t(1) << 60;

  static int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

  // The segment (segment mode) containing position x.
  Block segment(int64_t x) const {
    if (x < 0) return {-kFar, 0};
    const int64_t n = std::upper_bound(seg, seg + num_seg, x) - seg;  // segments starting <= x
    return {n == 0 ? 0 : seg[n - 1], n < num_seg ? seg[n] : kFar};
  }
  // The level-l block (l = 1..L) containing position x.
  Block at(int l, int64_t x) const {
    const int64_t b = block[l - 1];
    if (block[0] > 0) {  // fixed mode: absolute blocks
      const int64_t s = floor_div(x, b) * b;
      return {s, s + b};
    }
    const Block t = segment(x);
    if (l == 1) return t;
    const int64_t s = t.start + floor_div(x - t.start, b) * b;
    return {s, std::min(s + b, t.end)};
  }
  // Number of leading levels 1..m shared by EVERY pair of positions in [lo, hi] (lo <= hi): the
  // blocks are contiguous, so a level is shared by all such pairs iff its block holds both ends.
  // (Nested blocks: exactly the levels every pair shares; otherwise deeper levels may be too.)
  int shared(int64_t lo, int64_t hi) const {
    int m = 0;
    while (m < num_levels && at(m + 1, lo).end > hi) ++m;
    return m;
  }
};

struct MlrParams : AttnIO {
  MlrLevels lv;
  float level_scale[kMlrMaxLevels] = {};  // c_l, times 1/L if divide_by_num_levels
  bool level_average = false;
  bool mask_cross_segment = false;
  bool causal = true;
  // The bf16 engine of the forward's products (bf16 inputs, the resolved Compute), else null.
  const bf16::Gemms* bf16_gemms = nullptr;
};

// Validates the level options of `opt` (num_levels, ranks, block_sizes, context, segment_starts)
// against head_dim and seqlen_k (and batch, for per-sequence segment lists), throwing
// strata::Error that names the argument; returns the resolved geometry (block sizes from the
// default rule when not given). src/cpu/mlr.cpp.
MlrLevels resolve_mlr_levels(const char* where, const MlrOptions& opt, int64_t head_dim, int64_t seqlen_k,
                             int64_t batch);

// mlr_attention_forward / _backward (strata/mlr.h) that always run the MLR kernel body, never the
// dense shortcut of L = 1 (tests compare that body with the references on one-level cases too).
void mlr_attention_forward_kernel(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                                  const TensorView& lse, const MlrOptions& opt);
void mlr_attention_backward_kernel(const TensorView& q, const TensorView& k, const TensorView& v,
                                   const TensorView& o, const TensorView& lse, const TensorView& dout,
                                   const TensorView& dq, const TensorView& dk, const TensorView& dv,
                                   const MlrOptions& opt);

// One decode step of one (sequence, query head) over the MlrKvCache (src/cpu/kernels/mlr_decode.inc):
// the query at position t meets level l's keys at positions [start[l], t] (any order of the
// starts: non-nested blocks), stored transposed: keys[l][c * cap[l] + (j - start[l])] = k_l[j][c]; V rows j = 0..t.
struct MlrDecodeRow {
  int num_levels = 0;
  const float* q = nullptr;              // head_dim, fp32
  const float* keys[kMlrMaxLevels] = {}; // r_l x cap_l each
  int64_t cap[kMlrMaxLevels] = {}, start[kMlrMaxLevels] = {}, rank[kMlrMaxLevels] = {}, slice[kMlrMaxLevels] = {};
  float scale[kMlrMaxLevels] = {};       // c_l (times 1/L if divide_by_num_levels)
  bool level_average = false, mask_cross_segment = false;
  int64_t t = 0;                         // position of the query; keys 0..t
  const float* v = nullptr;              // (t + 1) x head_dim_v, row stride ldv
  int64_t ldv = 0, head_dim_v = 0;
  float* s = nullptr;                    // scratch, t + 1 floats
  float* out = nullptr;                  // head_dim_v, fp32
  float* lse = nullptr;                  // natural log
};

// The family's entry points, one table per ISA (src/cpu/kernels/mlr_decode.inc defines it, after
// both bodies; dispatch: src/core/dispatch.h).
struct MlrKernels {
  void (*forward)(const MlrParams& p);
  void (*backward)(const MlrParams& p);
  void (*decode_row)(const MlrDecodeRow& r);
};
STRATA_PER_ISA(extern const MlrKernels kMlrKernels;)

}  // namespace strata::cpu
