// src/cpu/mlr_kv_cache.cpp: the MLR decode cache (include/strata/mlr_kv_cache.h): per level only the
// current block's key slices (transposed, r_l x cap_l), a full V cache, per-sequence lengths and
// segments. The step itself is the per-ISA mlr_decode_row (src/cpu/kernels/mlr_decode.inc), parallel over
// (sequence, query head); it reads sum_l |block_l| r_l key floats and t * head_dim_v values.
#include "strata/mlr_kv_cache.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "cpu/mlr_params.h"
#include "cpu/views.h"
#include "strata/cpu.h"
#include "strata/threading.h"

namespace strata {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Logical dims (batch, seq, head, dim) and element strides of a 4-D view.
struct View4 {
  int64_t b, s, h, d;
  int64_t sb, ss, sh, sd;
};
View4 view4(const TensorView& t, Layout l) {
  const cpu::Dims4 d = cpu::dims(t, l);
  const cpu::Strided4 st = cpu::strided(t, l);
  return {d.b, d.s, d.h, d.d, st.sb, st.ss, st.sh, st.sd};
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
  int64_t D = 0;
  bool explicit_blocks = false;
  for (int l = 0; l < std::clamp(opt.num_levels, 0, MlrOptions::kMaxLevels); ++l) {
    D += opt.ranks[l];
    explicit_blocks |= opt.block_sizes[l] != 0;
  }
  AttnDims d;  // the options are validated against the longest sequence the cache holds
  d.batch = batch;
  d.seqlen_q = d.seqlen_k = max_seqlen;
  d.heads_q = d.heads_kv = heads_kv;
  d.head_dim = D;
  d.head_dim_v = head_dim_v;
  validate(where, opt, d);
  const cpu::MlrLevels lv = cpu::resolve_mlr_levels(where, opt, D, max_seqlen, batch);
  // The default rule derives blocks from the key length of a call: a cache holding n tokens
  // would then disagree with the forward over those n tokens. Decoding needs the model's blocks.
  STRATA_CHECK_ARG(opt.num_levels <= 1 || opt.context > 0 || explicit_blocks, where, "opt.context",
                   "the model's context length (> 0) or explicit block_sizes (the blocks the model was run "
                   "with: decoding must use the same ones)",
                   opt.context);
  segmented_ = lv.block[0] == 0;
  // Copy the segment lists (the options' pointers are the caller's).
  seg_list_.resize(size_t(batch));
  for (int64_t b = 0; b < batch && segmented_; ++b) {
    const cpu::MlrLevels lb = lv.for_batch(b);
    seg_list_[size_t(b)].assign(lb.seg, lb.seg + lb.num_seg);
  }
  opt_.segment_starts = nullptr;
  opt_.segment_offsets = nullptr;
  opt_.num_segment_starts = 0;
  head_dim_ = D;
  num_levels_ = lv.num_levels;
  int64_t off = 0;
  for (int l = 0; l < num_levels_; ++l) {
    block_.push_back(lv.block[l]);
    cap_.push_back(lv.block[l] == 0 ? max_seqlen : std::min(lv.block[l], max_seqlen));  // slots < block and < max_seqlen
    rank_.push_back(lv.rank[l]);
    slice_.push_back(lv.rank_end[l] - lv.rank[l]);
    key_off_.push_back(off);
    off += cap_.back() * lv.rank[l];
    scale_.push_back(float(mlr_level_scale(opt, l, D)));
  }
  keys_per_head_ = off;
  keys_.assign(size_t(batch * heads_kv * keys_per_head_), 0.f);
  values_.assign(size_t(batch * heads_kv * max_seqlen * head_dim_v), 0.f);
  len_.assign(size_t(batch), 0);
  seg_start_.assign(size_t(batch), 0);
  seg_next_.assign(size_t(batch), 0);
  seg_pending_.assign(size_t(batch), 0);
}

int64_t MlrKvCache::block_start(int64_t b, int l, int64_t t) const {
  const int64_t base = segmented_ ? seg_start_[size_t(b)] : 0, bl = block_[size_t(l)];
  if (bl == 0) return base;  // level 1 in segment mode: the segment
  return base + (t - base) / bl * bl;
}

void MlrKvCache::begin_segment(int64_t b) {
  const char* where = "MlrKvCache::begin_segment";
  STRATA_CHECK_ARG(segmented_, where, "this cache",
                   "segment mode (options with segment_starts or segment_offsets, an empty list is enough)",
                   "fixed level-1 blocks");
  STRATA_CHECK_ARG(b >= 0 && b < batch_, where, "b", detail::cat("a sequence in 0..", batch_ - 1), b);
  if (len_[size_t(b)] > 0) seg_pending_[size_t(b)] = 1;
}

void MlrKvCache::append(const TensorView& k, const TensorView& v, const int64_t* n_new) {
  const char* where = "MlrKvCache::append";
  const Layout L = opt_.layout;
  STRATA_CHECK_ARG(kKernelDTypes.has(k.dtype), where, "k", detail::cat("dtype ", kKernelDTypes.names()),
                   dtype_name(k.dtype));
  check_4d(where, "k", k, L, k.dtype, batch_, -1, heads_kv_, head_dim_, "(the cache's batch, heads_kv, head_dim)");
  const View4 kd = view4(k, L);
  check_4d(where, "v", v, L, k.dtype, batch_, kd.s, heads_kv_, head_dim_v_,
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
  // Segment starts among the new tokens, per sequence (positions, in order), decided up front so
  // that the (sequence, head) workers below only read them.
  std::vector<std::vector<int64_t>> starts(static_cast<size_t>(batch_));
  if (segmented_) {
    for (int64_t b = 0; b < batch_; ++b) {
      if (n_new[b] == 0) continue;
      const int64_t t0 = len_[size_t(b)], t1 = t0 + n_new[b];
      if (seg_pending_[size_t(b)]) starts[size_t(b)].push_back(t0);
      const std::vector<int64_t>& list = seg_list_[size_t(b)];
      size_t& nx = seg_next_[size_t(b)];
      while (nx < list.size() && list[nx] < t1) {
        if (list[nx] >= t0 && (starts[size_t(b)].empty() || starts[size_t(b)].back() != list[nx]))
          starts[size_t(b)].push_back(list[nx]);
        ++nx;
      }
      seg_pending_[size_t(b)] = 0;
    }
  }
  const std::vector<int64_t> seg0 = seg_start_;
  parallel_for(batch_ * heads_kv_, 1, [&](int64_t begin, int64_t end, int) {
    std::vector<float> row(size_t(std::max(head_dim_, head_dim_v_)));
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / heads_kv_, h = bh % heads_kv_;
      float* keys = keys_.data() + bh * keys_per_head_;
      float* vals = values_.data() + bh * max_seqlen_ * head_dim_v_;
      int64_t seg = seg0[size_t(b)];
      size_t next = 0;
      const std::vector<int64_t>& st = starts[size_t(b)];
      for (int64_t i = 0; i < n_new[b]; ++i) {
        const int64_t t = len_[size_t(b)] + i;
        if (next < st.size() && st[next] == t) seg = st[next++];
        read_row(k, b * kd.sb + i * kd.ss + h * kd.sh, kd.sd, head_dim_, row.data());
        for (int l = 0; l < num_levels_; ++l) {  // slot = t - (start of t's level-l block)
          const int64_t bl = block_[size_t(l)], base = segmented_ ? seg : 0;
          const int64_t slot = bl == 0 ? t - base : (t - base) % bl;
          float* dst = keys + key_off_[size_t(l)] + slot;
          const int64_t cap = cap_[size_t(l)];
          for (int64_t c = 0; c < rank_[size_t(l)]; ++c) dst[c * cap] = row[size_t(slice_[size_t(l)] + c)];
        }
        read_row(v, b * vd.sb + i * vd.ss + h * vd.sh, vd.sd, head_dim_v_, vals + t * head_dim_v_);
      }
    }
  });
  for (int64_t b = 0; b < batch_; ++b) {
    if (!starts[size_t(b)].empty()) seg_start_[size_t(b)] = starts[size_t(b)].back();
    len_[size_t(b)] += n_new[b];
  }
}

void MlrKvCache::attend(const TensorView& q, const TensorView& o, const TensorView& lse) const {
  const char* where = "MlrKvCache::attend";
  const Layout L = opt_.layout;
  STRATA_CHECK_ARG(q.ndim == 4, where, "q", "a 4-D tensor", detail::cat(q.ndim, "-D ", q.shape_str()));
  const int64_t Hq = view4(q, L).h;
  STRATA_CHECK_ARG(kKernelDTypes.has(q.dtype), where, "q", detail::cat("dtype ", kKernelDTypes.names()),
                   dtype_name(q.dtype));
  STRATA_CHECK_ARG(Hq >= 1 && Hq % heads_kv_ == 0, where, "q",
                   detail::cat("heads a multiple of heads_kv = ", heads_kv_), Hq);
  check_4d(where, "q", q, L, q.dtype, batch_, 1, Hq, head_dim_, "(one query per sequence)");
  AttnDims d;  // one query per sequence
  d.batch = batch_;
  d.seqlen_q = 1;
  d.heads_q = Hq;
  d.head_dim_v = head_dim_v_;
  d.dtype = q.dtype;
  check_out(where, o, L, d);
  check_lse(where, lse, d);
  check_no_overlap(where, "o", o);
  check_no_overlap(where, "lse", lse);
  const View4 qd = view4(q, L), od = view4(o, L);
  const int64_t group = Hq / heads_kv_;
  void (*const row_fn)(const cpu::MlrDecodeRow&) = STRATA_ACTIVE_KERNELS(kMlrKernels).decode_row;
  parallel_for(batch_ * Hq, 1, [&](int64_t begin, int64_t end, int) {
    std::vector<float> qs(static_cast<size_t>(head_dim_)), s(static_cast<size_t>(max_seqlen_ + 16));
    std::vector<float> out(static_cast<size_t>(head_dim_v_));
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / Hq, h = bh % Hq, t = len_[size_t(b)] - 1;
      const int64_t kvh = b * heads_kv_ + h / group;
      read_row(q, b * qd.sb + h * qd.sh, qd.sd, head_dim_, qs.data());
      cpu::MlrDecodeRow r;
      r.num_levels = num_levels_;
      r.q = qs.data();
      for (int l = 0; l < num_levels_; ++l) {
        r.keys[l] = keys_.data() + kvh * keys_per_head_ + key_off_[size_t(l)];
        r.cap[l] = cap_[size_t(l)];
        r.start[l] = t < 0 ? 0 : block_start(b, l, t);
        r.rank[l] = rank_[size_t(l)];
        r.slice[l] = slice_[size_t(l)];
        r.scale[l] = scale_[size_t(l)];
      }
      r.level_average = opt_.level_average;
      r.mask_cross_segment = opt_.mask_cross_segment;
      r.t = t;
      r.v = values_.data() + kvh * max_seqlen_ * head_dim_v_;
      r.ldv = head_dim_v_;
      r.head_dim_v = head_dim_v_;
      r.s = s.data();
      r.out = out.data();
      float lse_v = kNegInf;
      r.lse = &lse_v;
      if (t >= 0) row_fn(r);
      else std::fill(out.begin(), out.end(), 0.f);
      for (int64_t c = 0; c < head_dim_v_; ++c) {
        const int64_t off = b * od.sb + h * od.sh + c * od.sd;
        if (o.dtype == DType::f32) {
          static_cast<float*>(o.data)[off] = out[size_t(c)];
        } else {
          static_cast<uint16_t*>(o.data)[off] = f32_to_bf16(out[size_t(c)]);
        }
      }
      static_cast<float*>(lse.data)[b * lse.stride[0] + h * lse.stride[1]] = lse_v;
    }
  });
}

}  // namespace strata
