// src/cpu/mlr.cpp: the public MLR-attention entry points: argument checks (every error names the
// argument), block sizes resolved from the options, TensorView -> MlrParams, ISA dispatch, and
// the FLOP count. Semantics: include/strata/mlr.h.
#include "strata/mlr.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "cpu/finite_bound.h"
#include "cpu/mlr_params.h"
#include "cpu/views.h"  // fill_io, fill_grads
#include "strata/attention.h"  // the dense shortcut of L = 1
#include "strata/cpu.h"

namespace strata {
namespace {

using cpu::MlrLevels;
using cpu::MlrParams;

std::string indexed(const char* name, int i) { return detail::cat(name, "[", i, "]"); }

// Validates every forward argument and fills the kernel params (o/lse included).
MlrParams make_params(const char* where, const TensorView& q, const TensorView& k, const TensorView& v,
                      const TensorView& o, const TensorView& lse, const MlrOptions& opt) {
  const Layout L = opt.layout;
  const AttnDims d = check_qkv(where, q, k, v, L, kKernelDTypes);
  check_out(where, o, L, d);
  check_lse(where, lse, d);
  validate(where, opt, d);
  check_no_overlap(where, "o", o);  // after the other checks: their errors come first
  check_no_overlap(where, "lse", lse);

  MlrParams p;
  p.lv = cpu::resolve_mlr_levels(where, opt, d.head_dim, d.seqlen_k, d.batch);
  cpu::fill_io(p, d, q, k, v, o, lse, L);
  for (int l = 0; l < opt.num_levels; ++l) p.level_scale[l] = float(mlr_level_scale(opt, l, d.head_dim));
  p.level_average = opt.level_average;
  p.mask_cross_segment = opt.mask_cross_segment;
  p.causal = opt.causal;
  p.bf16_gemms = cpu::bf16::engine(resolve_compute(where, opt.compute, d.dtype == DType::bf16));
  return p;
}

void run_forward(const MlrParams& p) { STRATA_ACTIVE_KERNELS(kMlrKernels).forward(p); }
void run_backward(const MlrParams& p) { STRATA_ACTIVE_KERNELS(kMlrKernels).backward(p); }

}  // namespace

double mlr_level_scale(const MlrOptions& opt, int l, int64_t head_dim) {
  double c = opt.scale == MlrScale::inv_sqrt_head_dim ? 1.0 / std::sqrt(double(head_dim)) : 1.0 / double(opt.ranks[l]);
  return opt.divide_by_num_levels ? c / opt.num_levels : c;
}

int64_t mlr_block_starts(const char* where, const MlrOptions& opt, int64_t head_dim, int64_t seqlen_k,
                         int64_t batch, int64_t first, int64_t count, int64_t* starts) {
  STRATA_CHECK_ARG(count >= 0, where, "count", ">= 0", count);
  const cpu::MlrLevels all = cpu::resolve_mlr_levels(where, opt, head_dim, seqlen_k, batch);
  const int64_t sequences = opt.segment_offsets != nullptr ? batch : 1;
  const int L = all.num_levels;
  for (int64_t s = 0; s < sequences; ++s) {
    const cpu::MlrLevels lv = all.for_batch(s);
    for (int l = 0; l < L; ++l)
      for (int64_t i = 0; i < count; ++i) starts[(s * L + l) * count + i] = lv.at(l + 1, first + i).start;
  }
  return sequences;
}

void validate(const char* where, const MlrOptions& opt, const AttnDims& d) {
  STRATA_CHECK_ARG(opt.scale == MlrScale::inv_rank || opt.scale == MlrScale::inv_sqrt_head_dim, where, "scale",
                   "inv_rank or inv_sqrt_head_dim", int(opt.scale));
  check_positions(where, d.seqlen_q, d.seqlen_k);  // the kernel's fp32 lanes hold positions
  cpu::resolve_mlr_levels(where, opt, d.head_dim, d.seqlen_k, d.batch);
}

namespace cpu {

MlrLevels resolve_mlr_levels(const char* where, const MlrOptions& o, int64_t D, int64_t nk, int64_t batch) {
  const int L = o.num_levels;
  STRATA_CHECK_ARG(L >= 1 && L <= MlrOptions::kMaxLevels, where, "num_levels",
                   detail::cat("1..", MlrOptions::kMaxLevels), L);
  MlrLevels lv;
  lv.num_levels = L;
  int64_t sum = 0;
  for (int l = 0; l < MlrOptions::kMaxLevels; ++l) {
    const std::string arg = indexed("ranks", l);
    if (l >= L) {
      STRATA_CHECK_ARG(o.ranks[l] == 0, where, arg.c_str(), detail::cat("0 (beyond num_levels = ", L, ")"), o.ranks[l]);
      continue;
    }
    STRATA_CHECK_ARG(o.ranks[l] >= 1, where, arg.c_str(), "a rank >= 1 (every level needs a slice of the head dim)",
                     o.ranks[l]);
    sum += o.ranks[l];
    lv.rank[l] = o.ranks[l];
    lv.rank_end[l] = sum;
  }
  STRATA_CHECK_ARG(sum == D, where, "ranks", detail::cat("r_1 + .. + r_L = head_dim ", D, " (q's last dim)"), sum);

  const bool segments = o.num_segment_starts > 0 || o.segment_offsets != nullptr;
  bool explicit_blocks = false;
  for (int l = 0; l < MlrOptions::kMaxLevels; ++l) {
    const std::string arg = indexed("block_sizes", l);
    if (l >= L) {
      STRATA_CHECK_ARG(o.block_sizes[l] == 0, where, arg.c_str(), detail::cat("0 (beyond num_levels = ", L, ")"),
                       o.block_sizes[l]);
    } else if (!(segments && l == 0)) {
      explicit_blocks |= o.block_sizes[l] != 0;
    }
  }
  const int first = segments ? 1 : 0;  // with segments, level 1's blocks are the segments
  if (explicit_blocks) {
    STRATA_CHECK_ARG(o.context == 0, where, "context", "0 when block_sizes are given", o.context);
    for (int l = first; l < L; ++l) {
      const std::string arg = indexed("block_sizes", l);
      STRATA_CHECK_ARG(o.block_sizes[l] >= 1, where, arg.c_str(),
                       detail::cat("a block size >= 1 (levels ", first + 1, "..", L, " all need one)"),
                       o.block_sizes[l]);
      lv.block[l] = o.block_sizes[l];
    }
    // Any sizes are valid (each level is a partition on its own); nested ones take the fast path.
    for (int l = first + 1; l < L; ++l)
      lv.nested = lv.nested && lv.block[l - 1] % lv.block[l] == 0;
  } else {
    const int64_t pow = int64_t(1) << (L - 1);
    STRATA_CHECK_ARG(o.context >= 0, where, "context", ">= 0 (0 = seqlen_k rounded up)", o.context);
    STRATA_CHECK_ARG(o.context % pow == 0, where, "context",
                     detail::cat("a multiple of 2^(num_levels-1) = ", pow), o.context);
    const int64_t ctx = o.context > 0 ? o.context : (std::max<int64_t>(nk, 1) + pow - 1) / pow * pow;
    for (int l = first; l < L; ++l) lv.block[l] = ctx >> l;
  }
  if (segments) {
    STRATA_CHECK_ARG(o.num_segment_starts >= 0, where, "num_segment_starts", ">= 0", o.num_segment_starts);
    STRATA_CHECK_ARG(o.segment_starts != nullptr || o.num_segment_starts == 0, where, "segment_starts",
                     detail::cat("a pointer to ", o.num_segment_starts, " positions"), "null");
    // One list per sequence [lo, hi) of segment_starts (or the whole list for every sequence).
    if (o.segment_offsets != nullptr)
      STRATA_CHECK_ARG(o.num_segment_offsets == batch + 1, where, "num_segment_offsets",
                       detail::cat("batch + 1 = ", batch + 1, " (the length of segment_offsets)"),
                       o.num_segment_offsets);
    const int64_t nb = o.segment_offsets != nullptr ? batch : 1;
    for (int64_t b = 0; b < nb; ++b) {
      int64_t lo = 0, hi = o.num_segment_starts;
      if (o.segment_offsets != nullptr) {
        lo = o.segment_offsets[b];
        hi = o.segment_offsets[b + 1];
        const std::string arg = detail::cat("segment_offsets[", b, "..", b + 1, "]");
        STRATA_CHECK_ARG(b > 0 || lo == 0, where, "segment_offsets[0]", "0", lo);
        STRATA_CHECK_ARG(lo <= hi && hi <= o.num_segment_starts, where, arg.c_str(),
                         detail::cat("non-decreasing offsets in 0..num_segment_starts = ", o.num_segment_starts),
                         detail::cat(lo, ", ", hi));
      }
      for (int64_t i = lo; i < hi; ++i) {
        const int64_t s = o.segment_starts[i];
        const std::string arg = detail::cat("segment_starts[", i, "]");
        STRATA_CHECK_ARG(s > 0 && s < nk, where, arg.c_str(),
                         detail::cat("a position in 1..", nk - 1, " (inside the keys, not 0)"), s);
        if (i > lo)
          STRATA_CHECK_ARG(s > o.segment_starts[i - 1], where, arg.c_str(),
                           detail::cat("> segment_starts[", i - 1, "] = ", o.segment_starts[i - 1], " (increasing)"),
                           s);
      }
    }
    if (o.segment_offsets != nullptr)
      STRATA_CHECK_ARG(o.segment_offsets[batch] == o.num_segment_starts, where,
                       detail::cat("segment_offsets[", batch, "]").c_str(),
                       detail::cat("num_segment_starts = ", o.num_segment_starts, " (every start in one list)"),
                       o.segment_offsets[batch]);
    lv.seg = o.segment_starts;
    lv.num_seg = o.num_segment_starts;
    lv.seg_offsets = o.segment_offsets;
  } else {
    STRATA_CHECK_ARG(o.num_segment_starts == 0, where, "num_segment_starts", ">= 0", o.num_segment_starts);
  }
  return lv;
}

}  // namespace cpu

namespace {

// One level whose single block holds every key and every query: every pair shares level 1, so
// the scores are c_1 q.k and MLR attention IS dense attention with scale c_1 (level_average
// divides by m = 1; mask_cross_segment masks nothing). Then the dense kernel runs, so that L = 1
// gives the same numbers as strata::attention_forward / backward, bit for bit. Not when queries
// sit at negative positions (seqlen_q > seqlen_k, not causal): those share no block with any key
// (score 0, or an empty row under mask_cross_segment), where dense attention would score q.k.
bool is_dense(const MlrParams& p) {
  const bool queries_inside = p.causal || p.seqlen_q <= p.seqlen_k;
  return p.lv.num_levels == 1 && p.lv.block[0] >= p.seqlen_k && p.lv.seg == nullptr &&
         p.lv.seg_offsets == nullptr && queries_inside;
}
AttentionOptions dense_options(const MlrParams& p, const MlrOptions& opt) {
  AttentionOptions a;
  a.scale = p.level_scale[0];
  a.causal = opt.causal;
  a.layout = opt.layout;
  a.compute = opt.compute;
  return a;
}

}  // namespace

namespace {

// The finite-input bound of strata/mlr.h in its sufficient form: sum_l c_l sum_{d in l} |q_id k_jd|
// <= max_l |c_l| ||q_i|| ||k_j||.
cpu::LogitBound mlr_bound(const MlrParams& p) {
  cpu::LogitBound b;
  b.scale = 0;
  for (float c : p.level_scale) b.scale = std::max(b.scale, std::fabs(double(c)));
  b.contract = "strata/mlr.h";
  return b;
}

// The public entry points' bodies; `shortcut`: take the dense kernel where it is exact.
void forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o, const TensorView& lse,
             const MlrOptions& opt, bool shortcut) {
  const MlrParams p = make_params("mlr_attention_forward", q, k, v, o, lse, opt);
  if (shortcut && is_dense(p)) return attention_forward(q, k, v, o, lse, dense_options(p, opt));
  run_forward(p);
  cpu::check_forward_bound("mlr_attention_forward", q, k, lse, mlr_bound(p));
}

void backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
              const TensorView& lse, const TensorView& dout, const TensorView& dq, const TensorView& dk,
              const TensorView& dv, const MlrOptions& opt, bool shortcut) {
  const char* where = "mlr_attention_backward";
  MlrParams p = make_params(where, q, k, v, o, lse, opt);
  const Layout L = opt.layout;
  check_grads(where, dout, dq, dk, dv, L, check_qkv(where, q, k, v, L, kKernelDTypes));
  cpu::fill_grads(p, dout, dq, dk, dv, L);
  if (shortcut && is_dense(p)) return attention_backward(q, k, v, o, lse, dout, dq, dk, dv, dense_options(p, opt));
  run_backward(p);
  cpu::check_backward_bound(where, q, k, v, &o, dout, dq, dk, dv, mlr_bound(p));
}

}  // namespace

void mlr_attention_forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                           const TensorView& lse, const MlrOptions& opt) {
  forward(q, k, v, o, lse, opt, true);
}

Compute mlr_attention_compute(const AttnDims& d, const MlrOptions& opt) {
  const char* where = "mlr_attention_compute";
  validate(where, opt, d);
  MlrParams p;
  p.lv = cpu::resolve_mlr_levels(where, opt, d.head_dim, d.seqlen_k, d.batch);
  p.seqlen_q = d.seqlen_q;
  p.seqlen_k = d.seqlen_k;
  p.causal = opt.causal;
  if (is_dense(p)) return attention_compute(d, dense_options(p, opt));  // (its scale plays no part)
  return resolve_compute(where, opt.compute, d.dtype == DType::bf16);
}

void mlr_attention_backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                            const TensorView& lse, const TensorView& dout, const TensorView& dq,
                            const TensorView& dk, const TensorView& dv, const MlrOptions& opt) {
  backward(q, k, v, o, lse, dout, dq, dk, dv, opt, true);
}

namespace cpu {

void mlr_attention_forward_kernel(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                                  const TensorView& lse, const MlrOptions& opt) {
  forward(q, k, v, o, lse, opt, false);
}

void mlr_attention_backward_kernel(const TensorView& q, const TensorView& k, const TensorView& v,
                                   const TensorView& o, const TensorView& lse, const TensorView& dout,
                                   const TensorView& dq, const TensorView& dk, const TensorView& dv,
                                   const MlrOptions& opt) {
  backward(q, k, v, o, lse, dout, dq, dk, dv, opt, false);
}

}  // namespace cpu

MlrFlops mlr_attention_flops(int64_t batch, int64_t heads_q, int64_t seqlen_q, int64_t seqlen_k,
                             int64_t head_dim_v, const MlrOptions& opt) {
  const char* where = "mlr_attention_flops";
  STRATA_CHECK_ARG(batch >= 0 && heads_q >= 0 && seqlen_q >= 0 && seqlen_k >= 0 && head_dim_v >= 0, where,
                   "sizes", "batch, heads_q, seqlen_q, seqlen_k, head_dim_v >= 0",
                   detail::cat(batch, ", ", heads_q, ", ", seqlen_q, ", ", seqlen_k, ", ", head_dim_v));
  int64_t D = 0;
  for (int l = 0; l < std::clamp(opt.num_levels, 0, MlrOptions::kMaxLevels); ++l) D += opt.ranks[l];
  const MlrLevels all = cpu::resolve_mlr_levels(where, opt, D, seqlen_k, batch);
  // Per query row: pairs sharing level l = |level-l block of p  ∩  allowed keys|. Sequences
  // differ only with per-sequence segment lists.
  double prefix_sum = 0, pairs = 0;
  const int64_t distinct = opt.segment_offsets != nullptr ? batch : std::min<int64_t>(batch, 1);
  const double weight = opt.segment_offsets != nullptr ? 1.0 : double(batch);
  for (int64_t b = 0; b < distinct; ++b) {
    const MlrLevels lv = all.for_batch(b);
    for (int64_t i = 0; i < seqlen_q; ++i) {
      const int64_t pos = seqlen_k - seqlen_q + i;
      const int64_t hi = opt.causal ? std::min(pos, seqlen_k - 1) : seqlen_k - 1;  // keys [0, hi]
      if (hi < 0) continue;
      // The blocks holding pos all contain it, so the keys sharing some level are their union
      // [min start, max end): allowed pairs under mask_cross_segment.
      int64_t any_lo = MlrLevels::kFar, any_hi = -MlrLevels::kFar;
      auto keys_in = [&](int64_t lo, int64_t end) {  // |[lo, end) ∩ [0, hi]|
        return double(std::max<int64_t>(0, std::min(end - 1, hi) - std::max<int64_t>(lo, 0) + 1));
      };
      for (int l = 1; l <= lv.num_levels; ++l) {
        const MlrLevels::Block blk = lv.at(l, pos);
        any_lo = std::min(any_lo, blk.start);
        any_hi = std::max(any_hi, blk.end);
        prefix_sum += weight * keys_in(blk.start, blk.end) * double(lv.rank[l - 1]);
      }
      pairs += weight * (opt.mask_cross_segment ? keys_in(any_lo, any_hi) : double(hi + 1));
    }
  }
  const double bh = double(heads_q);  // batch is in the sums
  MlrFlops f;
  f.scores = 2 * bh * prefix_sum;
  f.total = f.scores + 2 * bh * pairs * double(head_dim_v);
  f.dense_scores = 2 * bh * pairs * double(D);
  f.dense_total = f.dense_scores + 2 * bh * pairs * double(head_dim_v);
  f.backward = 3 * f.scores + 2 * (f.total - f.scores);
  f.dense_backward = 3 * f.dense_scores + 2 * (f.dense_total - f.dense_scores);
  return f;
}

}  // namespace strata
