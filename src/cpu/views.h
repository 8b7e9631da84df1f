// src/cpu/views.h: reading a 4-D attention tensor of either layout in the logical (batch, seq,
// head, dim) order. The argument checks are strata/checks.h.
#pragma once
#include "cpu/attention_params.h"  // Strided4
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

}  // namespace strata::cpu
