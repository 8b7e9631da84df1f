// src/cpu/views.h: reading 4-D attention tensors in either layout, and the argument checks every
// kernel family's entry point shares (attention.cpp, mlr.cpp, monarch.cpp). Errors name the
// argument, the expected and the actual value.
#pragma once
#include <string>

#include "cpu/attention_params.h"  // Strided4
#include "strata/error.h"
#include "strata/tensor.h"

namespace strata::cpu {

// Logical dims (batch, seq, head, dim) of a 4-D view in the given layout.
struct Dims4 {
  int64_t b, s, h, d;
};
inline constexpr int kSeqDim[2] = {1, 2}, kHeadDim[2] = {2, 1};

inline Dims4 dims(const TensorView& t, Layout l) {
  return {t.shape[0], t.shape[kSeqDim[int(l)]], t.shape[kHeadDim[int(l)]], t.shape[3]};
}
// The view's pointer and strides in the logical (batch, seq, head, dim) order.
inline Strided4 strided(const TensorView& t, Layout l) {
  return {t.data, t.stride[0], t.stride[kSeqDim[int(l)]], t.stride[kHeadDim[int(l)]], t.stride[3]};
}
inline std::string dims_str(const Dims4& d) {
  return detail::cat("(batch=", d.b, ", seq=", d.s, ", heads=", d.h, ", dim=", d.d, ")");
}
inline const char* layout_str(Layout l) { return l == Layout::BSHD ? "BSHD" : "BHSD"; }

// Throws unless t is a 4-D view of `dtype` with sizes >= 0 and data (or empty).
inline void check_4d(const char* where, const char* arg, const TensorView& t, DType dtype, Layout l) {
  STRATA_CHECK_ARG(t.ndim == 4, where, arg, detail::cat("a 4-D tensor in layout ", layout_str(l)),
                   detail::cat(t.ndim, "-D ", t.shape_str()));
  STRATA_CHECK_ARG(t.dtype == dtype, where, arg, detail::cat("dtype ", dtype_name(dtype), " (same as q)"),
                   dtype_name(t.dtype));
  const bool sizes_ok = t.shape[0] >= 0 && t.shape[1] >= 0 && t.shape[2] >= 0 && t.shape[3] >= 0;
  STRATA_CHECK_ARG(sizes_ok, where, arg, "sizes >= 0", t.shape_str());
  STRATA_CHECK_ARG(t.data != nullptr || t.numel() == 0, where, arg, "a non-null data pointer", "null");
}

// Sequence lengths below 2^24: the kernels compare positions in fp32 lanes, exact up to there.
inline constexpr int64_t kMaxSeqLen = int64_t(1) << 24;
inline void check_seq_len(const char* where, const char* arg, int64_t seq) {
  STRATA_CHECK_ARG(seq < kMaxSeqLen, where, arg, detail::cat("seq < 2^24 = ", kMaxSeqLen, " (positions exact in fp32)"),
                   seq);
}

// Throws unless got == want; `why` says where the expected dims come from.
inline void check_shape(const char* where, const char* arg, const Dims4& got, const Dims4& want,
                        const char* why) {
  const bool ok = got.b == want.b && got.s == want.s && got.h == want.h && got.d == want.d;
  STRATA_CHECK_ARG(ok, where, arg, detail::cat(dims_str(want), " ", why), dims_str(got));
}

}  // namespace strata::cpu
