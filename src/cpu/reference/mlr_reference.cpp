// src/cpu/reference/mlr_reference.cpp: two naive double-precision MLR attention references, so
// the semantics of include/strata/mlr.h are pinned twice, independently of the kernel's tiles:
//   (a) mlr_attention_*: the formula per (query, key) pair; each level's block membership is
//       tested on its own (no prefix assumption), S summed over the levels found shared.
//   (b) mlr_attention_*_blockwise: the reference code's construction (AttentionMLR.forward):
//       per level, the product Q_blk K_blk^T * c_l of every block placed on its diagonal block
//       of an Nq x Nk buffer, summed over levels; a level-count buffer built the same way
//       (precompute_MLR_block_wise_division_mask); then scale, mask, softmax, P V. Gradients
//       are scattered back per level and block.
// Both take the options as given (the caller validated them) and materialise Nq x Nk per head.
// For tests and benchmark correctness checks only.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cpu/reference/views.h"
#include "strata/mlr.h"

namespace strata::reference {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// The level structure as the options spell it out (mlr.h, "Blocks").
struct Levels {
  int L = 0;
  std::vector<int64_t> rank, offset, size;  // r_l, first column of slice l, b_l
  std::vector<double> c;                    // c_l (times 1/L if divide_by_num_levels)
  bool seg = false;                         // level-1 blocks are segments
  std::vector<int64_t> starts;              // segment starts of this sequence (seg only)
};

// The levels of sequence b (per-sequence segment lists differ between sequences).
Levels levels(const MlrOptions& o, int64_t D, int64_t nk, int64_t b) {
  Levels v;
  v.L = o.num_levels;
  const bool seg = o.num_segment_starts > 0 || o.segment_offsets != nullptr;
  v.seg = seg;
  bool given = false;
  for (int l = seg ? 1 : 0; l < v.L; ++l) given |= o.block_sizes[l] != 0;
  int64_t ctx = o.context;
  if (ctx == 0) {
    const int64_t pow = int64_t(1) << (v.L - 1);
    ctx = pow;
    while (ctx < nk) ctx += pow;
  }
  int64_t off = 0;
  for (int l = 0; l < v.L; ++l) {
    v.rank.push_back(o.ranks[l]);
    v.offset.push_back(off);
    off += o.ranks[l];
    v.size.push_back(given ? o.block_sizes[l] : ctx / (int64_t(1) << l));
    double c = o.scale == MlrScale::inv_sqrt_head_dim ? 1.0 / std::sqrt(double(D)) : 1.0 / double(o.ranks[l]);
    v.c.push_back(o.divide_by_num_levels ? c / v.L : c);
  }
  if (o.segment_offsets != nullptr)
    v.starts.assign(o.segment_starts + o.segment_offsets[b], o.segment_starts + o.segment_offsets[b + 1]);
  else if (seg)
    v.starts.assign(o.segment_starts, o.segment_starts + o.num_segment_starts);
  return v;
}

int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

// ---- (a): per pair -----------------------------------------------------------------------------

// Level-1 block of position t: its index and start.
void top_block(const Levels& v, int64_t t, int64_t* id, int64_t* start) {
  if (!v.seg) {
    *id = floor_div(t, v.size[0]);
    *start = *id * v.size[0];
    return;
  }
  if (t < 0) {
    *id = -1;
    *start = 0;
    return;
  }
  int64_t n = 0;
  while (n < int64_t(v.starts.size()) && v.starts[size_t(n)] <= t) ++n;
  *id = n;
  *start = n == 0 ? 0 : v.starts[size_t(n - 1)];
}

// True when positions t and u lie in the same level-l block (l = 0..L-1), tested on its own:
// fixed blocks [n*b_l, (n+1)*b_l) per level; with segments, blocks of b_l from the segment's start.
bool same_block(const Levels& v, int l, int64_t t, int64_t u) {
  if (!v.seg) return floor_div(t, v.size[size_t(l)]) == floor_div(u, v.size[size_t(l)]);
  int64_t it, st, iu, su;
  top_block(v, t, &it, &st);
  top_block(v, u, &iu, &su);
  if (it != iu) return false;
  if (l == 0) return true;
  return floor_div(t - st, v.size[size_t(l)]) == floor_div(u - st, v.size[size_t(l)]);
}

struct Problem {
  Dense4 q, k, v;
  std::vector<Levels> lvb;  // per sequence
  int64_t B, Nq, Nk, Hq, Hkv, D, Dv, off;
  // After the shared checks (strata/checks.h) and the options' validate().
  Problem(const char* where, const TensorView& tq, const TensorView& tk, const TensorView& tv, const MlrOptions& o)
      : q((validate(where, o, check_qkv(where, tq, tk, tv, o.layout, kReferenceDTypes)), tq), o.layout),
        k(tk, o.layout),
        v(tv, o.layout) {
    B = q.B;
    Nq = q.S;
    Nk = k.S;
    Hq = q.H;
    Hkv = k.H;
    D = q.D;
    Dv = v.D;
    off = Nk - Nq;
    for (int64_t b = 0; b < B; ++b) lvb.push_back(levels(o, D, Nk, b));
  }
  int64_t kv_head(int64_t h) const { return h / (Hq / Hkv); }
};

// Logits (Nq x Nk, -inf = masked) of one (b, h) by the per-pair formula; also the per-pair
// factor d S / d (sum of level products) in `gain` and the shared-level flags in `shared`.
void logits_pairwise(const Problem& P, const MlrOptions& o, int64_t b, int64_t h, std::vector<double>& S,
                     std::vector<double>& gain, std::vector<uint8_t>& shared) {
  const int L = o.num_levels;
  const Levels& lv = P.lvb[size_t(b)];
  const int64_t hk = P.kv_head(h);
  S.assign(size_t(P.Nq * P.Nk), kNegInf);
  gain.assign(size_t(P.Nq * P.Nk), 0.0);
  shared.assign(size_t(P.Nq * P.Nk * L), 0);
  for (int64_t i = 0; i < P.Nq; ++i) {
    const int64_t t = P.off + i;
    const double* qi = P.q.row(b, i, h);
    for (int64_t j = 0; j < P.Nk; ++j) {
      if (o.causal && j > t) continue;
      const double* kj = P.k.row(b, j, hk);
      double s = 0;
      int m = 0;
      for (int l = 0; l < L; ++l) {
        if (!same_block(lv, l, t, j)) continue;
        shared[size_t((i * P.Nk + j) * L + l)] = 1;
        ++m;
        double dot = 0;
        for (int64_t d = lv.offset[size_t(l)]; d < lv.offset[size_t(l)] + lv.rank[size_t(l)]; ++d)
          dot += qi[d] * kj[d];
        s += lv.c[size_t(l)] * dot;
      }
      if (m == 0 && o.mask_cross_segment) continue;
      const double g = (o.level_average && m > 0) ? 1.0 / m : 1.0;
      S[size_t(i * P.Nk + j)] = s * g;
      gain[size_t(i * P.Nk + j)] = g;
    }
  }
}

// Row-wise softmax of logits in place (-inf -> 0; an all -inf row stays 0, lse = -inf).
void softmax_rows(std::vector<double>& S, int64_t nq, int64_t nk, double* lse) {
  for (int64_t i = 0; i < nq; ++i) {
    double* s = S.data() + i * nk;
    double mx = kNegInf;
    for (int64_t j = 0; j < nk; ++j) mx = std::max(mx, s[j]);
    double sum = 0;
    for (int64_t j = 0; j < nk; ++j) {
      s[j] = (mx == kNegInf || s[j] == kNegInf) ? 0.0 : std::exp(s[j] - mx);
      sum += s[j];
    }
    for (int64_t j = 0; j < nk; ++j) s[j] = sum > 0 ? s[j] / sum : 0.0;
    lse[i] = sum > 0 ? mx + std::log(sum) : kNegInf;
  }
}

// o (B, Nq, Hq, Dv) for one (b, h) from P.
void apply_v(const Problem& P, int64_t b, int64_t h, const std::vector<double>& prob, double* o) {
  const int64_t hk = P.kv_head(h);
  std::vector<double> acc(size_t(P.Dv));
  for (int64_t i = 0; i < P.Nq; ++i) {  // (i, j, d): V rows read contiguously
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t j = 0; j < P.Nk; ++j) {
      const double pij = prob[size_t(i * P.Nk + j)];  // (no skip of 0: 0 * NaN in V is NaN, as in the kernel)
      const double* vj = P.v.row(b, j, hk);
      for (int64_t d = 0; d < P.Dv; ++d) acc[size_t(d)] += pij * vj[d];
    }
    std::copy(acc.begin(), acc.end(), o + ((b * P.Nq + i) * P.Hq + h) * P.Dv);
  }
}

// dS (gradient wrt the logits) of one (b, h) in place of prob's copy; also accumulates dv.
void logit_grads(const Problem& P, const Dense4& g, int64_t b, int64_t h, const std::vector<double>& prob,
                 std::vector<double>& dS, double* dv) {
  const int64_t hk = P.kv_head(h);
  dS.assign(size_t(P.Nq * P.Nk), 0.0);
  for (int64_t i = 0; i < P.Nq; ++i) {
    const double* gi = g.row(b, i, h);
    double rowdot = 0;
    for (int64_t j = 0; j < P.Nk; ++j) {
      double dp = 0;
      const double* vj = P.v.row(b, j, hk);
      for (int64_t d = 0; d < P.Dv; ++d) dp += gi[d] * vj[d];
      dS[size_t(i * P.Nk + j)] = dp;
      rowdot += prob[size_t(i * P.Nk + j)] * dp;
    }
    for (int64_t j = 0; j < P.Nk; ++j) {
      const double p = prob[size_t(i * P.Nk + j)];
      dS[size_t(i * P.Nk + j)] = p * (dS[size_t(i * P.Nk + j)] - rowdot);
      if (p != 0)
        for (int64_t d = 0; d < P.Dv; ++d) dv[((b * P.Nk + j) * P.Hkv + hk) * P.Dv + d] += p * gi[d];
    }
  }
}

// ---- (b): the reference code's block-diagonal construction ---------------------------------------

struct Block {
  int64_t start, end;
};

// Every level-l block (l = 0..L-1) meeting the positions [lo, hi), in order.
std::vector<Block> level_blocks(const Levels& v, int l, int64_t lo, int64_t hi) {
  std::vector<Block> out;
  if (!v.seg) {  // fixed blocks: every level on its own
    const int64_t bl = v.size[size_t(l)];
    for (int64_t s = floor_div(lo, bl) * bl; s < hi; s += bl) out.push_back({s, s + bl});
    return out;
  }
  std::vector<Block> segments;
  if (lo < 0) segments.push_back({lo, 0});
  int64_t s = 0;
  for (int64_t b : v.starts) {
    segments.push_back({s, b});
    s = b;
  }
  segments.push_back({s, std::max(hi, s + 1)});
  if (l == 0) return segments;
  const int64_t bl = v.size[size_t(l)];
  for (const Block& t : segments)
    for (int64_t s0 = t.start; s0 < t.end; s0 += bl) out.push_back({s0, std::min(s0 + bl, t.end)});
  return out;
}

// For one (b, h): the summed level products (Nq x Nk) and the level-count buffer, built level by
// level from per-block products placed on the block diagonal.
void level_sum_blockwise(const Problem& P, int64_t b, int64_t h, std::vector<double>& S, std::vector<double>& cnt) {
  const Levels& lv = P.lvb[size_t(b)];
  const int64_t hk = P.kv_head(h);
  const int64_t lo = std::min<int64_t>(0, P.off), hi = std::max(P.Nk, P.off + P.Nq);
  S.assign(size_t(P.Nq * P.Nk), 0.0);
  cnt.assign(size_t(P.Nq * P.Nk), 0.0);
  std::vector<double> prod;
  for (int l = 0; l < lv.L; ++l) {
    const int64_t c0 = lv.offset[size_t(l)], r = lv.rank[size_t(l)];
    for (const Block& blk : level_blocks(lv, l, lo, hi)) {
      // rows: queries whose position is in the block; cols: keys in the block
      const int64_t i0 = std::clamp<int64_t>(blk.start - P.off, 0, P.Nq);
      const int64_t i1 = std::clamp<int64_t>(blk.end - P.off, 0, P.Nq);
      const int64_t j0 = std::clamp<int64_t>(blk.start, 0, P.Nk), j1 = std::clamp<int64_t>(blk.end, 0, P.Nk);
      if (i0 >= i1 || j0 >= j1) continue;
      const int64_t ni = i1 - i0, nj = j1 - j0;
      prod.assign(size_t(ni * nj), 0.0);  // Q_blk K_blk^T * c_l
      for (int64_t a = 0; a < ni; ++a)
        for (int64_t e = 0; e < nj; ++e) {
          double dot = 0;
          for (int64_t d = 0; d < r; ++d) dot += P.q.row(b, i0 + a, h)[c0 + d] * P.k.row(b, j0 + e, hk)[c0 + d];
          prod[size_t(a * nj + e)] = dot * lv.c[size_t(l)];
        }
      for (int64_t a = 0; a < ni; ++a)
        for (int64_t e = 0; e < nj; ++e) {
          S[size_t((i0 + a) * P.Nk + j0 + e)] += prod[size_t(a * nj + e)];
          cnt[size_t((i0 + a) * P.Nk + j0 + e)] += 1;
        }
    }
  }
}

// Scale (level average), mask: logits in place; the gain d logit / d S_sum in `gain`.
void finish_logits(const Problem& P, const MlrOptions& o, std::vector<double>& S, const std::vector<double>& cnt,
                   std::vector<double>& gain) {
  gain.assign(S.size(), 0.0);
  for (int64_t i = 0; i < P.Nq; ++i)
    for (int64_t j = 0; j < P.Nk; ++j) {
      const size_t e = size_t(i * P.Nk + j);
      const double g = (o.level_average && cnt[e] > 0) ? 1.0 / cnt[e] : 1.0;
      const bool masked = (o.causal && j > P.off + i) || (o.mask_cross_segment && cnt[e] == 0);
      S[e] = masked ? kNegInf : S[e] * g;
      gain[e] = masked ? 0.0 : g;
    }
}

void zero_grads(const Problem& P, double* dq, double* dk, double* dv) {
  std::fill(dq, dq + P.B * P.Nq * P.Hq * P.D, 0.0);
  std::fill(dk, dk + P.B * P.Nk * P.Hkv * P.D, 0.0);
  std::fill(dv, dv + P.B * P.Nk * P.Hkv * P.Dv, 0.0);
}

}  // namespace

void mlr_attention_forward(const TensorView& q, const TensorView& k, const TensorView& v, const MlrOptions& opt,
                           double* o, double* lse) {
  const Problem P("reference::mlr_attention_forward", q, k, v, opt);
  std::vector<double> S, gain;
  std::vector<uint8_t> shared;
  for (int64_t b = 0; b < P.B; ++b)
    for (int64_t h = 0; h < P.Hq; ++h) {
      logits_pairwise(P, opt, b, h, S, gain, shared);
      softmax_rows(S, P.Nq, P.Nk, lse + (b * P.Hq + h) * P.Nq);
      apply_v(P, b, h, S, o);
    }
}

void mlr_attention_backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& dout,
                            const MlrOptions& opt, double* dq, double* dk, double* dv) {
  const Problem P("reference::mlr_attention_backward", q, k, v, opt);
  check_4d("reference::mlr_attention_backward", "dout", dout, opt.layout, q.dtype, P.B, P.Nq, P.Hq, P.Dv, "(same as o)");
  const Dense4 g(dout, opt.layout);
  zero_grads(P, dq, dk, dv);
  std::vector<double> S, gain, dS, lse(size_t(P.Nq));
  std::vector<uint8_t> shared;
  const int L = opt.num_levels;
  for (int64_t b = 0; b < P.B; ++b)
    for (int64_t h = 0; h < P.Hq; ++h) {
      const Levels& lv = P.lvb[size_t(b)];
      const int64_t hk = P.kv_head(h);
      logits_pairwise(P, opt, b, h, S, gain, shared);
      softmax_rows(S, P.Nq, P.Nk, lse.data());
      logit_grads(P, g, b, h, S, dS, dv);
      for (int64_t i = 0; i < P.Nq; ++i)
        for (int64_t j = 0; j < P.Nk; ++j) {
          const double x = dS[size_t(i * P.Nk + j)] * gain[size_t(i * P.Nk + j)];
          if (x == 0) continue;
          for (int l = 0; l < L; ++l) {
            if (!shared[size_t((i * P.Nk + j) * L + l)]) continue;
            const double cx = x * lv.c[size_t(l)];
            for (int64_t d = lv.offset[size_t(l)]; d < lv.offset[size_t(l)] + lv.rank[size_t(l)]; ++d) {
              dq[((b * P.Nq + i) * P.Hq + h) * P.D + d] += cx * P.k.row(b, j, hk)[d];
              dk[((b * P.Nk + j) * P.Hkv + hk) * P.D + d] += cx * P.q.row(b, i, h)[d];
            }
          }
        }
    }
}

void mlr_attention_forward_blockwise(const TensorView& q, const TensorView& k, const TensorView& v,
                                     const MlrOptions& opt, double* o, double* lse) {
  const Problem P("reference::mlr_attention_forward_blockwise", q, k, v, opt);
  std::vector<double> S, cnt, gain;
  for (int64_t b = 0; b < P.B; ++b)
    for (int64_t h = 0; h < P.Hq; ++h) {
      level_sum_blockwise(P, b, h, S, cnt);
      finish_logits(P, opt, S, cnt, gain);
      softmax_rows(S, P.Nq, P.Nk, lse + (b * P.Hq + h) * P.Nq);
      apply_v(P, b, h, S, o);
    }
}

void mlr_attention_backward_blockwise(const TensorView& q, const TensorView& k, const TensorView& v,
                                      const TensorView& dout, const MlrOptions& opt, double* dq, double* dk,
                                      double* dv) {
  const Problem P("reference::mlr_attention_backward_blockwise", q, k, v, opt);
  check_4d("reference::mlr_attention_backward_blockwise", "dout", dout, opt.layout, q.dtype, P.B, P.Nq, P.Hq, P.Dv, "(same as o)");
  const Dense4 g(dout, opt.layout);
  zero_grads(P, dq, dk, dv);
  const int64_t lo = std::min<int64_t>(0, P.off), hi = std::max(P.Nk, P.off + P.Nq);
  std::vector<double> S, cnt, gain, dS, lse(size_t(P.Nq));
  for (int64_t b = 0; b < P.B; ++b)
    for (int64_t h = 0; h < P.Hq; ++h) {
      const Levels& lv = P.lvb[size_t(b)];
      const int64_t hk = P.kv_head(h);
      level_sum_blockwise(P, b, h, S, cnt);
      finish_logits(P, opt, S, cnt, gain);
      softmax_rows(S, P.Nq, P.Nk, lse.data());
      logit_grads(P, g, b, h, S, dS, dv);
      for (size_t e = 0; e < dS.size(); ++e) dS[e] *= gain[e];  // gradient wrt the level sum
      // Per level and block: dQ_l[blk] += c_l dS[blk, blk] K_l[blk], dK_l[blk] += c_l dS^T Q_l[blk].
      for (int l = 0; l < lv.L; ++l) {
        const int64_t c0 = lv.offset[size_t(l)], r = lv.rank[size_t(l)];
        const double c = lv.c[size_t(l)];
        for (const Block& blk : level_blocks(lv, l, lo, hi)) {
          const int64_t i0 = std::clamp<int64_t>(blk.start - P.off, 0, P.Nq);
          const int64_t i1 = std::clamp<int64_t>(blk.end - P.off, 0, P.Nq);
          const int64_t j0 = std::clamp<int64_t>(blk.start, 0, P.Nk), j1 = std::clamp<int64_t>(blk.end, 0, P.Nk);
          for (int64_t i = i0; i < i1; ++i)
            for (int64_t j = j0; j < j1; ++j) {
              const double x = c * dS[size_t(i * P.Nk + j)];
              if (x == 0) continue;
              for (int64_t d = c0; d < c0 + r; ++d) {
                dq[((b * P.Nq + i) * P.Hq + h) * P.D + d] += x * P.k.row(b, j, hk)[d];
                dk[((b * P.Nk + j) * P.Hkv + hk) * P.D + d] += x * P.q.row(b, i, h)[d];
              }
            }
        }
      }
    }
}

}  // namespace strata::reference
