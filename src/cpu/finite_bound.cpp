// src/cpu/finite_bound.cpp: see finite_bound.h.
#include "cpu/finite_bound.h"

#include <cmath>
#include <limits>

#include "strata/checks.h"
#include "strata/error.h"

namespace strata::cpu {
namespace {

constexpr double kLog2e = 1.4426950408889634;

double logit_bound(const TensorView& q, const TensorView& k, const LogitBound& b) {
  const double bias = b.bias != nullptr && given(*b.bias) ? max_finite_abs(*b.bias) : 0.0;
  return std::fabs(b.scale) * max_row_norm(q) * max_row_norm(k) + b.extra + bias;
}

[[noreturn]] void throw_bound(const char* where, double logit, double limit, const char* which, const LogitBound& b) {
  throw Error(detail::cat(where, ": argument 'q': expected q and k within the ", which, "'s finite-input bound (",
                          b.contract, ": |scale| max ||q_i|| max ||k_j||", b.bias != nullptr && given(*b.bias) ? " + max |bias|" : "",
                          b.extra > 0 ? " + ln B" : "", " < ", limit, "), got finite inputs whose logits reach ", logit,
                          ": fp32 logits overflow, the outputs were not finite; scale q or k down"));
}

}  // namespace

void check_forward_bound(const char* where, const TensorView& q, const TensorView& k, const TensorView& out,
                         const LogitBound& b) {
  if (all_finite(out) || !all_finite(q) || !all_finite(k)) return;  // (non-finite inputs: IEEE, documented)
  const double logit = logit_bound(q, k, b), limit = double(std::numeric_limits<float>::max()) / kLog2e;
  if (logit >= limit) throw_bound(where, logit, limit, "forward", b);
}

void check_backward_bound(const char* where, const TensorView& q, const TensorView& k, const TensorView& v,
                          const TensorView* o, const TensorView& dout, const TensorView& dq, const TensorView& dk,
                          const TensorView& dv, const LogitBound& b) {
  if (all_finite(dq) && all_finite(dk) && all_finite(dv)) return;
  for (const TensorView* t : {&q, &k, &v, o, &dout})
    if (t != nullptr && !all_finite(*t)) return;
  const double logit = logit_bound(q, k, b), limit = b.backward_limit;
  if (logit >= limit) throw_bound(where, logit, limit, "backward", b);
  throw Error(detail::cat(where, ": argument 'dout': expected dout, q, k and v within the backward's finite-input "
                          "bound on its gradient sums (", b.contract, "), got finite inputs whose gradients overflow "
                          "float32 (max |dout| = ", max_finite_abs(dout), ", max |v| = ", max_finite_abs(v),
                          "); scale them down"));
}

}  // namespace strata::cpu
