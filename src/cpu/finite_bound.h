// src/cpu/finite_bound.h: the finite-input bound of the attention families (strata/attention.h,
// mlr.h, monarch.h), checked after a kernel: finite inputs beyond it gave NaN with no error (issue
// 48 item 6). A check costs one pass over an output (the forward's lse or o; the backward's dq,
// dk, dv) and reads q and k again only when an output is not finite.
#pragma once
#include <cstdint>

#include "strata/tensor.h"

namespace strata::cpu {

// The logits' sufficient bound |logit_ij| <= |scale| max ||q_i|| max ||k_j|| + extra (Cauchy-Schwarz
// bounds sum_d |q_id k_jd| by ||q_i|| ||k_j||); `extra`: max |bias| (dense), ln B (Monarch), 0 (MLR).
struct LogitBound {
  double scale = 1;               // |scale| (MLR: the largest level's c_l)
  const TensorView* bias = nullptr;  // dense: its max |entry| joins `extra`
  double extra = 0;
  const char* contract = "strata/attention.h";  // the header that states the bound, for the message
  double backward_limit = double(int64_t(1) << 26);  // the backward's bound on the logits (Monarch's: the forward's)
};

// After a forward: `out` (lse, or Monarch's o) not finite from finite q and k means the bound was
// exceeded when the logits reach log2(e) * bound >= FLT_MAX: throws naming 'q' with the bound
// reached; otherwise returns (an lse of -inf is also a row with no allowed key).
void check_forward_bound(const char* where, const TensorView& q, const TensorView& k, const TensorView& out,
                         const LogitBound& b);

// After a backward: dq, dk or dv not finite while q, k, v, dout (and o, when given) are: throws,
// naming 'q' when the logits reach b.backward_limit, else 'dout' (gradient sums that
// overflow float32).
void check_backward_bound(const char* where, const TensorView& q, const TensorView& k, const TensorView& v,
                          const TensorView* o, const TensorView& dout, const TensorView& dq, const TensorView& dk,
                          const TensorView& dv, const LogitBound& b);

}  // namespace strata::cpu
