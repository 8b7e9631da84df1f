// src/cpu/views.h: reading a 4-D attention tensor of either layout in the logical (batch, seq,
// head, dim) order, and filling the kernels' AttnIO from checked views (the checks are
// strata/checks.h).
#pragma once
#include "cpu/attention_params.h"  // AttnIO, Strided4
#include "strata/checks.h"          // AttnDims
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

// The sizes and the q, k, v, o, lse views of an attention call, after the checks (strata/checks.h).
inline void fill_io(AttnIO& p, const AttnDims& d, const TensorView& q, const TensorView& k, const TensorView& v,
                    const TensorView& o, const TensorView& lse, Layout l) {
  p.dtype = d.dtype;
  p.batch = d.batch;
  p.seqlen_q = d.seqlen_q;
  p.seqlen_k = d.seqlen_k;
  p.heads_q = d.heads_q;
  p.heads_kv = d.heads_kv;
  p.head_dim = d.head_dim;
  p.head_dim_v = d.head_dim_v;
  p.q = strided(q, l);
  p.k = strided(k, l);
  p.v = strided(v, l);
  p.o = strided(o, l);
  p.lse = static_cast<float*>(lse.data);
  p.lse_sb = lse.stride[0];
  p.lse_sh = lse.stride[1];
  p.lse_ss = lse.stride[2];
}

// The gradient views of a backward, after check_grads.
inline void fill_grads(AttnIO& p, const TensorView& dout, const TensorView& dq, const TensorView& dk,
                       const TensorView& dv, Layout l) {
  p.dout = strided(dout, l);
  p.dq = strided(dq, l);
  p.dk = strided(dk, l);
  p.dv = strided(dv, l);
}

}  // namespace strata::cpu
