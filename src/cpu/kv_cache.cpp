// src/cpu/kv_cache.cpp: the MLR decode cache (include/strata/kv_cache.h): per level only the
// current block's key slices, a full V cache, per-sequence lengths. Plain fp32 loops, parallel
// over (sequence, head); a decode step reads sum_l b_l r_l key floats and t * head_dim_v values.
#include "strata/kv_cache.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "cpu/mlr_params.h"
#include "strata/threading.h"

namespace strata {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

const char* layout_str(Layout l) { return l == Layout::BSHD ? "BSHD" : "BHSD"; }

// Logical dims (batch, seq, head, dim) and element strides of a 4-D view.
struct View4 {
  int64_t b, s, h, d;
  int64_t sb, ss, sh, sd;
};
View4 view4(const TensorView& t, Layout l) {
  const int si = l == Layout::BSHD ? 1 : 2, hi = 3 - si;
  return {t.shape[0], t.shape[si], t.shape[hi], t.shape[3], t.stride[0], t.stride[si], t.stride[hi], t.stride[3]};
}

void check_view(const char* where, const char* arg, const TensorView& t, Layout l, DType dtype, int64_t b,
                int64_t s, int64_t h, int64_t d, const char* why) {
  STRATA_CHECK_ARG(t.ndim == 4, where, arg, detail::cat("a 4-D tensor in layout ", layout_str(l)),
                   detail::cat(t.ndim, "-D ", t.shape_str()));
  STRATA_CHECK_ARG(t.dtype == dtype, where, arg, detail::cat("dtype ", dtype_name(dtype)), dtype_name(t.dtype));
  STRATA_CHECK_ARG(t.data != nullptr || t.numel() == 0, where, arg, "a non-null data pointer", "null");
  const View4 v = view4(t, l);
  const bool ok = v.b == b && (s < 0 || v.s == s) && v.h == h && v.d == d;
  STRATA_CHECK_ARG(ok, where, arg,
                   detail::cat("(batch=", b, ", seq=", s < 0 ? std::string("any") : std::to_string(s), ", heads=", h,
                               ", dim=", d, ") ", why),
                   detail::cat("(batch=", v.b, ", seq=", v.s, ", heads=", v.h, ", dim=", v.d, ")"));
}

// Reads n strided elements of a f32/bf16 row as fp32.
void read_row(const TensorView& t, int64_t off, int64_t sd, int64_t n, float* dst) {
  if (t.dtype == DType::f32) {
    const float* s = static_cast<const float*>(t.data) + off;
    for (int64_t i = 0; i < n; ++i) dst[i] = s[i * sd];
  } else {
    const uint16_t* s = static_cast<const uint16_t*>(t.data) + off;
    for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i * sd]);
  }
}

}  // namespace

MlrKvCache::MlrKvCache(int64_t batch, int64_t heads_kv, int64_t head_dim_v, int64_t max_seqlen,
                       const MlrOptions& opt)
    : opt_(opt), batch_(batch), heads_kv_(heads_kv), head_dim_v_(head_dim_v), max_seqlen_(max_seqlen) {
  const char* where = "MlrKvCache";
  STRATA_CHECK_ARG(batch >= 0, where, "batch", ">= 0", batch);
  STRATA_CHECK_ARG(heads_kv >= 1, where, "heads_kv", ">= 1", heads_kv);
  STRATA_CHECK_ARG(head_dim_v >= 1, where, "head_dim_v", ">= 1", head_dim_v);
  STRATA_CHECK_ARG(max_seqlen >= 1, where, "max_seqlen", ">= 1", max_seqlen);
  STRATA_CHECK_ARG(opt.num_segment_starts == 0, where, "segment_starts",
                   "none (the decode cache supports fixed block sizes only)", opt.num_segment_starts);
  STRATA_CHECK_ARG(opt.causal, where, "causal", "true (decoding is causal)", "false");
  int64_t D = 0;
  for (int l = 0; l < std::clamp(opt.num_levels, 0, MlrOptions::kMaxLevels); ++l) D += opt.ranks[l];
  const cpu::MlrLevels lv = cpu::resolve_mlr_levels(where, opt, D, max_seqlen);
  head_dim_ = D;
  num_levels_ = lv.num_levels;
  int64_t off = 0;
  for (int l = 0; l < num_levels_; ++l) {
    block_.push_back(lv.block[l]);
    rank_.push_back(lv.rank[l]);
    slice_.push_back(lv.rank_end[l] - lv.rank[l]);
    key_off_.push_back(off);
    off += std::min(lv.block[l], max_seqlen) * lv.rank[l];  // slot t mod b_l < max_seqlen
    double c = opt.scale == MlrScale::inv_sqrt_head_dim ? 1.0 / std::sqrt(double(D)) : 1.0 / double(lv.rank[l]);
    if (opt.divide_by_num_levels) c /= num_levels_;
    scale_.push_back(float(c));
  }
  keys_per_head_ = off;
  keys_.assign(size_t(batch * heads_kv * keys_per_head_), 0.f);
  values_.assign(size_t(batch * heads_kv * max_seqlen * head_dim_v), 0.f);
  len_.assign(size_t(batch), 0);
}

void MlrKvCache::append(const TensorView& k, const TensorView& v, const int64_t* n_new) {
  const char* where = "MlrKvCache::append";
  const Layout L = opt_.layout;
  STRATA_CHECK_ARG(k.dtype == DType::f32 || k.dtype == DType::bf16, where, "k", "dtype float32 or bfloat16",
                   dtype_name(k.dtype));
  check_view(where, "k", k, L, k.dtype, batch_, -1, heads_kv_, head_dim_, "(the cache's batch, heads_kv, head_dim)");
  const View4 kd = view4(k, L);
  check_view(where, "v", v, L, k.dtype, batch_, kd.s, heads_kv_, head_dim_v_,
             "(k's batch and seq; the cache's heads_kv, head_dim_v)");
  if (batch_ == 0) return;
  STRATA_CHECK_ARG(n_new != nullptr, where, "n_new", detail::cat("a pointer to ", batch_, " counts"), "null");
  for (int64_t b = 0; b < batch_; ++b) {
    const std::string arg = detail::cat("n_new[", b, "]");
    STRATA_CHECK_ARG(n_new[b] >= 0 && n_new[b] <= kd.s, where, arg.c_str(), detail::cat("0..", kd.s, " (k's seq)"),
                     n_new[b]);
    STRATA_CHECK_ARG(len_[size_t(b)] + n_new[b] <= max_seqlen_, where, arg.c_str(),
                     detail::cat("at most ", max_seqlen_ - len_[size_t(b)], " (max_seqlen ", max_seqlen_, ", length ",
                                 len_[size_t(b)], ")"),
                     n_new[b]);
  }
  const View4 vd = view4(v, L);
  parallel_for(batch_ * heads_kv_, 1, [&](int64_t begin, int64_t end, int) {
    std::vector<float> row(size_t(std::max(head_dim_, head_dim_v_)));
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / heads_kv_, h = bh % heads_kv_;
      float* keys = keys_.data() + bh * keys_per_head_;
      float* vals = values_.data() + bh * max_seqlen_ * head_dim_v_;
      for (int64_t i = 0; i < n_new[b]; ++i) {
        const int64_t t = len_[size_t(b)] + i;
        read_row(k, b * kd.sb + i * kd.ss + h * kd.sh, kd.sd, head_dim_, row.data());
        for (int l = 0; l < num_levels_; ++l) {  // level l keeps its slice at slot t mod b_l
          float* dst = keys + key_off_[size_t(l)] + (t % block_[size_t(l)]) * rank_[size_t(l)];
          std::copy(row.begin() + slice_[size_t(l)], row.begin() + slice_[size_t(l)] + rank_[size_t(l)], dst);
        }
        read_row(v, b * vd.sb + i * vd.ss + h * vd.sh, vd.sd, head_dim_v_, vals + t * head_dim_v_);
      }
    }
  });
  for (int64_t b = 0; b < batch_; ++b) len_[size_t(b)] += n_new[b];
}

void MlrKvCache::attend(const TensorView& q, const TensorView& o, const TensorView& lse) const {
  const char* where = "MlrKvCache::attend";
  const Layout L = opt_.layout;
  STRATA_CHECK_ARG(q.ndim == 4, where, "q", "a 4-D tensor", detail::cat(q.ndim, "-D ", q.shape_str()));
  const int64_t Hq = view4(q, L).h;
  STRATA_CHECK_ARG(q.dtype == DType::f32 || q.dtype == DType::bf16, where, "q", "dtype float32 or bfloat16",
                   dtype_name(q.dtype));
  STRATA_CHECK_ARG(Hq >= 1 && Hq % heads_kv_ == 0, where, "q",
                   detail::cat("heads a multiple of heads_kv = ", heads_kv_), Hq);
  check_view(where, "q", q, L, q.dtype, batch_, 1, Hq, head_dim_, "(one query per sequence)");
  check_view(where, "o", o, L, q.dtype, batch_, 1, Hq, head_dim_v_, "(q's batch and heads; head_dim_v)");
  STRATA_CHECK_ARG(lse.ndim == 3 && lse.shape[0] == batch_ && lse.shape[1] == Hq && lse.shape[2] == 1, where, "lse",
                   detail::cat("shape [", batch_, ", ", Hq, ", 1]"), lse.shape_str());
  STRATA_CHECK_ARG(lse.dtype == DType::f32, where, "lse", "dtype float32", dtype_name(lse.dtype));
  STRATA_CHECK_ARG(lse.data != nullptr || lse.numel() == 0, where, "lse", "a non-null data pointer", "null");
  const View4 qd = view4(q, L), od = view4(o, L);
  const int64_t group = Hq / heads_kv_;
  parallel_for(batch_ * Hq, 1, [&](int64_t begin, int64_t end, int) {
    std::vector<float> qs(static_cast<size_t>(head_dim_)), s(static_cast<size_t>(max_seqlen_));
    std::vector<float> out(static_cast<size_t>(head_dim_v_));
    std::vector<int> m(static_cast<size_t>(max_seqlen_));
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / Hq, h = bh % Hq, n = len_[size_t(b)], t = n - 1;
      const float* keys = keys_.data() + (b * heads_kv_ + h / group) * keys_per_head_;
      const float* vals = values_.data() + (b * heads_kv_ + h / group) * max_seqlen_ * head_dim_v_;
      read_row(q, b * qd.sb + h * qd.sh, qd.sd, head_dim_, qs.data());
      std::fill(s.begin(), s.begin() + n, 0.f);
      std::fill(m.begin(), m.begin() + n, 0);
      for (int l = 0; l < num_levels_ && n > 0; ++l) {  // keys of t's level-l block: [t - t mod b_l, t]
        const int64_t bl = block_[size_t(l)], r = rank_[size_t(l)], c0 = slice_[size_t(l)];
        const float* kl = keys + key_off_[size_t(l)];
        for (int64_t j = t - t % bl; j <= t; ++j) {
          const float* kj = kl + (j % bl) * r;
          float dot = 0.f;
          for (int64_t c = 0; c < r; ++c) dot += qs[size_t(c0 + c)] * kj[c];
          s[size_t(j)] += scale_[size_t(l)] * dot;
          ++m[size_t(j)];
        }
      }
      float mx = kNegInf;
      for (int64_t j = 0; j < n; ++j) {
        float& x = s[size_t(j)];
        if (m[size_t(j)] == 0) {
          x = opt_.mask_cross_segment ? kNegInf : 0.f;
        } else if (opt_.level_average) {
          x /= float(m[size_t(j)]);
        }
        mx = std::max(mx, x);
      }
      std::fill(out.begin(), out.end(), 0.f);
      float sum = 0.f;
      for (int64_t j = 0; j < n && mx != kNegInf; ++j) {
        const float p = std::exp(s[size_t(j)] - mx);
        sum += p;
        const float* vj = vals + j * head_dim_v_;
        for (int64_t c = 0; c < head_dim_v_; ++c) out[size_t(c)] += p * vj[c];
      }
      const bool empty = !(sum > 0.f);
      const float inv = empty ? 0.f : 1.f / sum;
      for (int64_t c = 0; c < head_dim_v_; ++c) {
        const int64_t off = b * od.sb + h * od.sh + c * od.sd;
        const float x = out[size_t(c)] * inv;
        if (o.dtype == DType::f32) {
          static_cast<float*>(o.data)[off] = x;
        } else {
          static_cast<uint16_t*>(o.data)[off] = f32_to_bf16(x);
        }
      }
      static_cast<float*>(lse.data)[b * lse.stride[0] + h * lse.stride[1]] = empty ? kNegInf : mx + std::log(sum);
    }
  });
}

}  // namespace strata
