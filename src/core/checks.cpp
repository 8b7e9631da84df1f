// src/core/checks.cpp: the shared argument checks (strata/checks.h).
#include "strata/checks.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

namespace strata {
namespace {

const char* layout_str(Layout l) { return l == Layout::BSHD ? "BSHD" : "BHSD"; }

struct Dims {
  int64_t b, s, h, d;
};
Dims dims_of(const TensorView& t, Layout l) {
  const int si = l == Layout::BSHD ? 1 : 2, hi = 3 - si;
  return {t.shape[0], t.shape[si], t.shape[hi], t.shape[3]};
}
std::string dims_str(int64_t b, int64_t s, int64_t h, int64_t d) {
  return detail::cat("(batch=", b, ", seq=", s < 0 ? std::string("any") : std::to_string(s), ", heads=", h,
                     ", dim=", d, ")");
}

// 4-D, sizes >= 0, data (or empty): what every tensor argument must be before its dims are read.
void check_tensor(const char* where, const char* arg, const TensorView& t, Layout l) {
  STRATA_CHECK_ARG(t.ndim == 4, where, arg, detail::cat("a 4-D tensor in layout ", layout_str(l)),
                   detail::cat(t.ndim, "-D ", t.shape_str()));
  const bool sizes_ok = t.shape[0] >= 0 && t.shape[1] >= 0 && t.shape[2] >= 0 && t.shape[3] >= 0;
  STRATA_CHECK_ARG(sizes_ok, where, arg, "sizes >= 0", t.shape_str());
  STRATA_CHECK_ARG(t.data != nullptr || t.numel() == 0, where, arg, "a non-null data pointer", "null");
}

}  // namespace

std::string DTypes::names() const {
  std::string out;
  int n = 0, total = 0;
  for (unsigned t = 0; t < 32; ++t) total += (bits_ >> t) & 1u;
  for (unsigned t = 0; t < 32; ++t) {
    if (!((bits_ >> t) & 1u)) continue;
    out += (n == 0 ? "" : (n + 1 == total ? " or " : ", "));
    out += dtype_name(DType(t));
    ++n;
  }
  return out;
}

void check_4d(const char* where, const char* arg, const TensorView& t, Layout l, DType dtype, int64_t b, int64_t s,
              int64_t h, int64_t d, const char* why) {
  check_tensor(where, arg, t, l);
  STRATA_CHECK_ARG(t.dtype == dtype, where, arg, detail::cat("dtype ", dtype_name(dtype), " (same as q)"),
                   dtype_name(t.dtype));
  const Dims g = dims_of(t, l);
  const bool ok = g.b == b && (s < 0 || g.s == s) && g.h == h && g.d == d;
  STRATA_CHECK_ARG(ok, where, arg, detail::cat(dims_str(b, s, h, d), " ", why), dims_str(g.b, g.s, g.h, g.d));
}

AttnDims check_qkv(const char* where, const TensorView& q, const TensorView& k, const TensorView& v, Layout l,
                   const DTypes& dtypes, bool self_attention, HeadGroups groups) {
  STRATA_CHECK_ARG(l == Layout::BSHD || l == Layout::BHSD, where, "layout", "BSHD or BHSD", int(l));
  check_tensor(where, "q", q, l);
  STRATA_CHECK_ARG(dtypes.has(q.dtype), where, "q", detail::cat("dtype ", dtypes.names()), dtype_name(q.dtype));
  const Dims dq = dims_of(q, l);
  STRATA_CHECK_ARG(dq.d >= 1, where, "q", "head_dim >= 1", dq.d);
  STRATA_CHECK_ARG(dq.h >= 1, where, "q", "heads >= 1", dq.h);
  check_tensor(where, "k", k, l);
  const Dims dk = dims_of(k, l);
  STRATA_CHECK_ARG(dk.h >= 1, where, "k", "heads >= 1", dk.h);
  check_4d(where, "k", k, l, q.dtype, dq.b, self_attention ? dq.s : dk.s, dk.h, dq.d,
           self_attention ? "(batch, seq and head_dim of q: self-attention only)" : "(batch and head_dim of q)");
  if (groups == HeadGroups::gqa_or_shared_q) {
    STRATA_CHECK_ARG(dq.h % dk.h == 0 || dk.h % dq.h == 0, where, "k",
                     detail::cat("heads dividing q's heads (", dq.h, ") (GQA) or a multiple of them (a query shared ",
                                 "by groups of kv heads)"),
                     dk.h);
  } else {
    STRATA_CHECK_ARG(dq.h % dk.h == 0, where, "k", detail::cat("heads dividing q's heads (", dq.h, ")"), dk.h);
  }
  check_tensor(where, "v", v, l);
  const Dims dv = dims_of(v, l);
  STRATA_CHECK_ARG(dv.d >= 1, where, "v", "head_dim_v >= 1", dv.d);
  check_4d(where, "v", v, l, q.dtype, dq.b, dk.s, dk.h, dv.d, "(batch of q, seq and heads of k)");
  return {dq.b, dq.s, dk.s, dq.h, dk.h, dq.d, dv.d, q.dtype};
}

void check_positions(const char* where, int64_t seqlen_q, int64_t seqlen_k, const char* keys_note) {
  STRATA_CHECK_ARG(seqlen_q < kMaxSeqLen, where, "q",
                   detail::cat("seq < 2^24 = ", kMaxSeqLen, " (positions are exact in the kernel's fp32 lanes)"),
                   seqlen_q);
  STRATA_CHECK_ARG(seqlen_k < kMaxSeqLen, where, "k",
                   detail::cat("seq < 2^24 = ", kMaxSeqLen, " (positions are exact in the kernel's fp32 lanes)",
                               keys_note),
                   seqlen_k);
}

void check_no_overlap(const char* where, const char* arg, const TensorView& t) {
  if (t.numel() == 0) return;
  // Dims of size > 1 by increasing |stride|: each stride must step past everything the smaller
  // ones span (sufficient for no overlap; every dense or row-padded layout passes).
  int order[TensorView::kMaxDims], n = 0;
  for (int i = 0; i < t.ndim; ++i) {  // insertion by |stride| (std::sort on 6 ints trips -Warray-bounds)
    if (t.shape[i] <= 1) continue;
    int j = n++;
    for (; j > 0 && std::abs(t.stride[order[j - 1]]) > std::abs(t.stride[i]); --j) order[j] = order[j - 1];
    order[j] = i;
  }
  int64_t span = 0;  // elements spanned by the dims so far, minus one
  for (int i = 0; i < n; ++i) {
    const int64_t s = std::abs(t.stride[order[i]]);
    STRATA_CHECK_ARG(s > span, where, arg,
                     "a view whose elements do not overlap (it is written; a stride-0 dim, e.g. from expand(), "
                     "would have its rows written over one another)",
                     detail::cat("shape ", t.shape_str(), " with stride ", s, " on dim ", order[i]));
    span += s * (t.shape[order[i]] - 1);
  }
}

void check_out(const char* where, const TensorView& o, Layout l, const AttnDims& d) {
  check_4d(where, "o", o, l, d.dtype, d.batch, d.seqlen_q, d.heads(), d.head_dim_v,
           "(q's batch and seq, the larger of q's and k's heads, v's head_dim)");
}

void check_lse(const char* where, const TensorView& lse, const AttnDims& d) {
  const bool shape_ok =
      lse.ndim == 3 && lse.shape[0] == d.batch && lse.shape[1] == d.heads() && lse.shape[2] == d.seqlen_q;
  STRATA_CHECK_ARG(shape_ok, where, "lse",
                   detail::cat("shape [", d.batch, ", ", d.heads(), ", ", d.seqlen_q, "] (batch, heads of o, seq_q)"),
                   lse.shape_str());
  STRATA_CHECK_ARG(lse.dtype == DType::f32, where, "lse", "dtype float32", dtype_name(lse.dtype));
  STRATA_CHECK_ARG(lse.data != nullptr || lse.numel() == 0, where, "lse", "a non-null data pointer", "null");
}

void check_grads(const char* where, const TensorView& dout, const TensorView& dq, const TensorView& dk,
                 const TensorView& dv, Layout l, const AttnDims& d) {
  const DType dtype = d.dtype;
  check_4d(where, "dout", dout, l, dtype, d.batch, d.seqlen_q, d.heads(), d.head_dim_v, "(same as o)");
  check_4d(where, "dq", dq, l, dtype, d.batch, d.seqlen_q, d.heads_q, d.head_dim, "(same as q)");
  check_4d(where, "dk", dk, l, dtype, d.batch, d.seqlen_k, d.heads_kv, d.head_dim, "(same as k)");
  check_4d(where, "dv", dv, l, dtype, d.batch, d.seqlen_k, d.heads_kv, d.head_dim_v, "(same as v)");
  for (const auto& [t, arg] : {std::pair{&dq, "dq"}, std::pair{&dk, "dk"}, std::pair{&dv, "dv"}})
    check_no_overlap(where, arg, *t);
}

void check_key_padding_mask(const char* where, const TensorView& m, int64_t batch, int64_t seq) {
  if (!given(m)) return;
  STRATA_CHECK_ARG(m.ndim == 2 && m.shape[0] == batch && m.shape[1] == seq, where, "key_padding_mask",
                   detail::cat("shape [", batch, ", ", seq, "] (batch, seq_k)"), m.shape_str());
  STRATA_CHECK_ARG(m.dtype == DType::u8, where, "key_padding_mask", "dtype uint8 (bool)", dtype_name(m.dtype));
  STRATA_CHECK_ARG(m.data != nullptr || m.numel() == 0, where, "key_padding_mask", "a non-null data pointer", "null");
}

namespace {

// Calls f(row, n, step) for every row along the last dim of a float32 / bf16 view: `row` points at
// its first element, n elements `step` apart. f returns false to stop early.
template <class F>
void for_each_row(const char* where, const TensorView& t, const F& f) {
  STRATA_CHECK_ARG(t.dtype == DType::f32 || t.dtype == DType::bf16, where, "t", "dtype float32 or bfloat16",
                   dtype_name(t.dtype));
  if (t.ndim == 0 || t.numel() == 0) return;
  const int last = t.ndim - 1;
  const int64_t esize = dtype_size(t.dtype);
  int64_t rows = 1;
  for (int i = 0; i < last; ++i) rows *= t.shape[i];
  for (int64_t r = 0; r < rows; ++r) {
    int64_t off = 0, rest = r;
    for (int i = last - 1; i >= 0; --i) {
      off += (rest % t.shape[i]) * t.stride[i];
      rest /= t.shape[i];
    }
    if (!f(static_cast<const char*>(t.data) + off * esize, t.shape[last], t.stride[last])) return;
  }
}

float value_at(const char* row, int64_t i, int64_t step, bool bf16) {
  if (bf16) {
    uint16_t h;
    std::memcpy(&h, row + 2 * i * step, 2);
    return bf16_to_f32(h);
  }
  float x;
  std::memcpy(&x, row + 4 * i * step, 4);
  return x;
}

}  // namespace

// Calls f(x) for every element of a float32 / bf16 view; f returns false to stop early.
template <class F>
void for_each_value(const char* where, const TensorView& t, const F& f) {
  const bool bf16 = t.dtype == DType::bf16;
  for_each_row(where, t, [&](const char* row, int64_t n, int64_t step) {
    for (int64_t i = 0; i < n; ++i)
      if (!f(value_at(row, i, step, bf16))) return false;
    return true;
  });
}

bool all_finite(const TensorView& t) {
  bool ok = true;
  for_each_value("all_finite", t, [&](float x) { return ok = std::isfinite(x); });
  return ok;
}

double max_row_norm(const TensorView& t) {
  const bool bf16 = t.dtype == DType::bf16;
  double best = 0;
  for_each_row("max_row_norm", t, [&](const char* row, int64_t n, int64_t step) {
    double s = 0;
    for (int64_t i = 0; i < n; ++i) s += double(value_at(row, i, step, bf16)) * double(value_at(row, i, step, bf16));
    best = std::max(best, std::sqrt(s));
    return true;
  });
  return best;
}

double max_finite_abs(const TensorView& t) {
  double best = 0;
  for_each_value("max_finite_abs", t, [&](float x) {
    if (std::isfinite(x)) best = std::max(best, std::fabs(double(x)));
    return true;
  });
  return best;
}

}  // namespace strata
