// strata/mlr.h: multi-level low-rank (MLR) softmax attention on the CPU (Kuang et al., ICML 2025,
// section "MLR attention"), flash-style: forward (O + log-sum-exp) and backward (dq, dk, dv),
// never an Nq x Nk buffer.
//
// Per (batch, query head) the head dim of q and k is split into L contiguous slices of widths
// r_1..r_L (sum = head_dim); slice l (q_l, k_l) is level l. Level l partitions positions into
// contiguous blocks (see "Blocks").
//
//   S[i, j] = sum over levels l with block_l(p_i) == block_l(j) of  c_l * q_l[i] . k_l[j]
//   S      *= 1/L                      if divide_by_num_levels
//   S      /= m(p_i, j)                if level_average (m = number of levels shared; m = 0 -> 0)
//   masked -> -inf: j > p_i if causal;  m(p_i, j) == 0 if mask_cross_segment
//   O = softmax_j(S) V   (dense V, head_dim_v may differ),  lse[i] = log sum_j exp(S[i, j])
//
// Positions: keys are at 0..seqlen_k-1; query i is at p_i = seqlen_k - seqlen_q + i (bottom-right,
// as attention.h: prefill / decode with seqlen_q < seqlen_k).
// Scale: c_l = 1/r_l (the reference code's, default) or 1/sqrt(head_dim) for every level.
// A pair that shares no level has score 0 (the formula's empty sum) unless mask_cross_segment.
//
// Blocks, by ABSOLUTE position:
//   fixed sizes b_1, ..., b_L (any b_l >= 1); the level-l blocks are [n*b_l, (n+1)*b_l), each
//   level on its own. Nested lists (each b_l dividing b_{l-1}) take the fast path (the levels two
//   positions share are then a prefix 1..m of the head dim); other lists, e.g. 64|16|32 or
//   96|32|24 (the reference code accepts any sizes dividing its context), take a general path
//   that adds each level on its own rectangles.
//   Where the sizes come from: `block_sizes` explicitly (then context must stay 0), or
//   b_l = context / 2^(l-1) from `context` (a multiple of 2^(L-1)).
//   DEFAULT (context = 0, no block_sizes): context = THIS CALL's seqlen_k rounded up to a multiple
//   of 2^(L-1) (T = 97 with L = 3 gives blocks 100, 50, 25), as the reference code does (it
//   requires T == context). The geometry then depends on the sequence's length: a causal
//   output row changes when tokens are appended (T = 100 -> 101 moves 100/50/25 to 104/52/26).
//   A model that runs sequences shorter than its context, prefills or decodes must pass its
//   context (or block_sizes): the modules (strata/torch/mlr_attention.h, Python MLRAttention)
//   and MlrKvCache require it for L >= 2. With it, the output at a position never depends on
//   later tokens, and positions past the context continue the blocks by absolute position.
//   Segments: `segment_starts` s_1 < s_2 < ... (0 < s < seqlen_k) replace the level-1 blocks by
//   the variable-length segments [0, s_1), [s_1, s_2), ..., [s_n, inf); a finer level l >= 2 cuts
//   each segment into blocks of b_l counted from the SEGMENT's start (the last one clipped at the
//   segment's end). b_1 is then unused.
//   Per sequence: with `segment_offsets` (and num_segment_offsets = batch + 1), each sequence of
//   the batch has its own list (packed documents of different lengths); a sequence with an empty
//   list is one segment. Segments take b_l (l >= 2) from block_sizes or context as above.
//
// Shapes (layout BSHD; with Layout::BHSD dims 1 and 2 are swapped; any strides):
//   q    batch x seqlen_q x heads_q  x head_dim          head_dim = r_1 + ... + r_L
//   k    batch x seqlen_k x heads_kv x head_dim          heads_q % heads_kv == 0 (GQA, no copies)
//   v    batch x seqlen_k x heads_kv x head_dim_v
//   o    batch x seqlen_q x heads_q  x head_dim_v        same dtype as q
//   lse  batch x heads_q  x seqlen_q                     float32, natural log, any strides
// q, k, v, o and the gradients are float32 or bfloat16, all one dtype; the softmax, its statistics
// and every accumulation are fp32. A bfloat16 forward runs its products on a bf16 engine
// where the CPU has AVX512-BF16 or AMX-BF16 (MlrOptions::compute, strata/cpu.h;
// mlr_attention_compute says which), as attention.h's: P is rounded to bf16 (relative 2^-9) for
// P V, its row sums stay fp32; the leading levels 1..m that share c_1 (all levels with equal
// ranks or c_l = 1/sqrt(head_dim); level 1 alone for 32|8|6|..) form c_1 sum_l q_l . k_l as one
// product of the bf16 inputs (exact in fp32 before the accumulation) scaled by c_1 in fp32, while
// deeper slices (their own c_l) stay fp32 products of the widened inputs. The backward runs on the
// same engine dP = dO V^T of the bf16 inputs, dV = P^T dO with P rounded to bf16, S's leading
// levels as the forward does, and dK, dQ from G = P (dP - D_i) / m rounded to bf16 (as
// attention.h's dS); S's deeper slices (their own c_l) stay fp32.
// compute = fp32 keeps every product fp32.
// A query row with no allowed key gives zeros, lse = -inf, zero gradients (as attention.h).
// Non-finite inputs propagate and finite inputs give finite outputs exactly as attention.h says,
// with the logit bound taken over the levels a pair shares: log2(e) * sum_l c_l sum_{d in level l}
// |q_id k_jd| < FLT_MAX forward, < 2^26 backward (the 1/L and 1/m factors only shrink it).
// Beyond: a strata::Error naming 'q' (or 'dout'), as attention.h's, checked the same way (one pass
// over lse or dq, dk, dv; q and k read again only when one is not finite) against the sufficient
// form max_l |c_l| max_i ||q_i|| max_j ||k_j||.
//
// Cost: the kernel visits (64-query x 128-key) tiles; on a tile where every pair shares the levels
// 1..m it forms scores with a prefix dot product of length R_m = r_1+..+r_m; deeper levels are
// added only on the rectangles (level-l block x level-l block) that need them. Score FLOPs are
// 2 * sum over allowed pairs of the ranks of the levels they share (R_m with nested blocks),
// i.e. 2 * T^2 * sum_l r_l / 2^(l-1) for
// dyadic blocks, non-causal, against 2 * T^2 * head_dim dense (see mlr_attention_flops); P V stays
// dense (2 * pairs * head_dim_v).
// Backward: about 2.5x the forward, recomputing P from lse.
// L = 1 with one block holding every key and query (no segments; causal, or seqlen_q <= seqlen_k)
// is dense attention with scale c_1: both passes then run the dense kernel (strata/attention.h),
// so the numbers are exactly that kernel's.
// Threads: parallel over (batch, head, query tile) forward, (batch, kv head, range of key tiles)
// backward; repeated calls give the same bits for the same thread count (src/core/key_splits.inc).
#pragma once
#include <cstdint>
#include <initializer_list>

#include "strata/checks.h"
#include "strata/cpu.h"
#include "strata/tensor.h"

namespace strata {

enum class MlrScale : uint8_t {
  inv_rank = 0,           // c_l = 1 / r_l (the reference code)
  inv_sqrt_head_dim = 1,  // c_l = 1 / sqrt(head_dim)
};

struct MlrOptions {
  static constexpr int kMaxLevels = 16;
  int num_levels = 0;                     // L, 1..kMaxLevels
  int64_t ranks[kMaxLevels] = {};         // r_l >= 1, l < L; sum = head_dim
  int64_t block_sizes[kMaxLevels] = {};   // b_l; all 0 = default (context / 2^(l-1))
  int64_t context = 0;                    // 0 = seqlen_k rounded up to a multiple of 2^(L-1)
  const int64_t* segment_starts = nullptr;  // optional: num_segment_starts positions, increasing
  int64_t num_segment_starts = 0;
  // Optional per-sequence segment lists: batch + 1 non-decreasing offsets into segment_starts,
  // sequence b's starts being segment_starts[segment_offsets[b] .. segment_offsets[b+1]) (each
  // list increasing; an empty list = one segment). null: every sequence uses the whole list.
  const int64_t* segment_offsets = nullptr;
  int64_t num_segment_offsets = 0;        // the length of segment_offsets: batch + 1 when given
  bool mask_cross_segment = false;        // pairs sharing no level: -inf instead of score 0
  MlrScale scale = MlrScale::inv_rank;
  bool divide_by_num_levels = false;      // S *= 1/L           (ref mlr_divide_by_num_levels)
  bool level_average = false;             // S /= m(i, j)       (ref mlr_block_divide_by_num_levels)
  bool causal = true;                     // the reference code is always causal
  Layout layout = Layout::BSHD;
  Compute compute = Compute::automatic;   // products of a bf16 forward (strata/cpu.h; see above)
};

// Options with the given ranks r_1..r_L and every other field at its default.
inline MlrOptions mlr_options(std::initializer_list<int64_t> ranks) {
  MlrOptions o;
  for (int64_t r : ranks) {
    if (o.num_levels == MlrOptions::kMaxLevels) throw Error("mlr_options: more than 16 levels");
    o.ranks[o.num_levels++] = r;
  }
  return o;
}

// Throws strata::Error naming the option unless opt fits a call of sizes d (strata/checks.h):
// levels 1..16, ranks >= 1 summing to head_dim, block sizes or context, segment lists, scale.
void validate(const char* where, const MlrOptions& opt, const AttnDims& d);

// c_l of level l (0-based): 1/r_l or 1/sqrt(head_dim), times 1/L with divide_by_num_levels.
double mlr_level_scale(const MlrOptions& opt, int l, int64_t head_dim);

// The block geometry as data (for code that forms the scores from it, e.g. the LibTorch layer's
// torch-ops path): the start of the level-l block (strata/mlr.h "Blocks") holding each position
// first .. first + count - 1, per sequence, as the kernel resolves it:
//   starts[(s * num_levels + l) * count + i],  l = 0..L-1, s < the returned number of sequences
// (batch with per-sequence segment lists, else 1: the geometry is the batch's). Two positions share
// level l iff their starts agree (each level's blocks are disjoint intervals). Positions below 0
// (queries when seqlen_q > seqlen_k) share no level with any key in segment mode. Validates opt for
// (head_dim, seqlen_k, batch) as validate() does; `starts` holds batch * num_levels * count values.
int64_t mlr_block_starts(const char* where, const MlrOptions& opt, int64_t head_dim, int64_t seqlen_k,
                         int64_t batch, int64_t first, int64_t count, int64_t* starts);

// The engine a forward of sizes d with opt runs its products on (strata/cpu.h): fp32, avx512_bf16
// or amx_bf16 (the file comment says when; L = 1 dense cases: attention_compute's). Throws
// strata::Error naming 'compute' as the forward would.
Compute mlr_attention_compute(const AttnDims& d, const MlrOptions& opt);

// Forward: writes o and lse.
void mlr_attention_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                           const TensorView& o, const TensorView& lse, const MlrOptions& opt);

// Backward: given dout (shape and dtype of o) and the forward's o and lse, writes dq, dk, dv
// (shapes and dtype of q, k, v). Recomputes the probabilities from lse; no Nq x Nk buffer.
void mlr_attention_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                            const TensorView& o, const TensorView& lse, const TensorView& dout,
                            const TensorView& dq, const TensorView& dk, const TensorView& dv,
                            const MlrOptions& opt);

// FLOPs of one forward under the project's convention (docs/methods.md), counted exactly over allowed pairs.
//   scores = 2 * B * Hq * sum over allowed pairs of the shared-prefix length R_m
//   total  = scores + 2 * B * Hq * pairs * head_dim_v
//   dense_scores / dense_total: the same for dense attention (R = head_dim) with the same mask
//   (causal or not; mask_cross_segment restricts both).
// Backward (backward / dense_backward): 3x the score part (S recomputed, dQ and dK over the shared
// levels) + 2x the P V part (dP = dO V^T and dV = P^T dO).
struct MlrFlops {
  double scores = 0, total = 0, dense_scores = 0, dense_total = 0;
  double backward = 0, dense_backward = 0;
};
MlrFlops mlr_attention_flops(int64_t batch, int64_t heads_q, int64_t seqlen_q, int64_t seqlen_k,
                             int64_t head_dim_v, const MlrOptions& opt);

// --- Naive double-precision references (materialise Nq x Nk; tests and benchmarks only).
// Same arguments and semantics; outputs double, contiguous, BSHD order (as attention.h's):
//   o: B*Nq*Hq*Dv, lse: B*Hq*Nq, dq: B*Nq*Hq*D, dk: B*Nk*Hkv*D, dv: B*Nk*Hkv*Dv.
// mlr_attention_*: the formula, per pair (each level's block membership tested on its own).
// mlr_attention_*_blockwise: the reference code's construction: per level, the per-block
// products Q_blk K_blk^T placed on the block diagonal of an Nq x Nk buffer, summed over levels,
// then scaled / masked / softmaxed; gradients scattered back per level and block.
namespace reference {
void mlr_attention_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                           const MlrOptions& opt, double* o, double* lse);
void mlr_attention_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                            const TensorView& dout, const MlrOptions& opt, double* dq,
                            double* dk, double* dv);
void mlr_attention_forward_blockwise(const TensorView& q, const TensorView& k, const TensorView& v,
                                     const MlrOptions& opt, double* o, double* lse);
void mlr_attention_backward_blockwise(const TensorView& q, const TensorView& k,
                                      const TensorView& v, const TensorView& dout,
                                      const MlrOptions& opt, double* dq, double* dk, double* dv);
}  // namespace reference

}  // namespace strata
