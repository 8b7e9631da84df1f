// tests/cpp/test_util.h: owned random tensors with chosen dtype / layout / strides, the
// normwise relative error used by every kernel-vs-reference comparison, and the ISA loop the
// kernel sweeps run each case under (kernel_harness.h); keys that grow with position for the
// tests of the forwards' lazily raised reference max; the bad-input tests' error check.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "strata/attention.h"
#include "strata/cpu.h"
#include "strata/error.h"

namespace strata::test {

// The ISAs this CPU runs, best first, to run a case under each (set_isa is left at the last one
// tried: call restore_best_isa after). The scalar ISA (W = 1, std::fma calls; very slow under
// ASan) is left out of cases with more than `scalar_max_work` multiply-adds unless it is the
// only ISA.
inline std::vector<Isa> isas_to_test(double work = 0, double scalar_max_work = 1e300) {
  std::vector<Isa> out;
  for (Isa isa : {Isa::avx512, Isa::avx2, Isa::scalar}) {
    try {
      set_isa(isa);
    } catch (const Error&) {
      continue;
    }
    if (isa == Isa::scalar && work > scalar_max_work && !out.empty()) continue;
    out.push_back(isa);
  }
  return out;
}

// Back to the best ISA this CPU runs (the default dispatch).
inline void restore_best_isa() {
  for (Isa isa : {Isa::avx512, Isa::avx2, Isa::scalar}) {
    try {
      set_isa(isa);
      return;
    } catch (const Error&) {
    }
  }
}

// A 4-D tensor with logical dims (b, s, h, d) stored in `layout`, optionally strided:
// gap > 0 pads every row of the last dim (row stride d + gap); dim_stride 2 interleaves.
struct Owned4 {
  std::vector<uint8_t> buf;
  TensorView view;
  Owned4() = default;
  Owned4(int64_t b, int64_t s, int64_t h, int64_t d, DType t, Layout l, int64_t gap = 0,
         int64_t dim_stride = 1) {
    const int64_t row = d * dim_stride + gap;
    int64_t n1 = l == Layout::BSHD ? s : h, n2 = l == Layout::BSHD ? h : s;
    const int64_t total = b * n1 * n2 * row;
    buf.assign(size_t(total * dtype_size(t)), 0);
    view.data = buf.data();
    view.dtype = t;
    view.ndim = 4;
    view.shape[0] = b;
    view.shape[1] = n1;
    view.shape[2] = n2;
    view.shape[3] = d;
    view.stride[3] = dim_stride;
    view.stride[2] = row;
    view.stride[1] = n2 * row;
    view.stride[0] = n1 * n2 * row;
  }
  void fill_random(std::mt19937& rng, double lo = -1, double hi = 1) {
    std::uniform_real_distribution<double> u(lo, hi);
    int64_t idx[4];
    for (idx[0] = 0; idx[0] < view.shape[0]; ++idx[0])
      for (idx[1] = 0; idx[1] < view.shape[1]; ++idx[1])
        for (idx[2] = 0; idx[2] < view.shape[2]; ++idx[2])
          for (idx[3] = 0; idx[3] < view.shape[3]; ++idx[3]) view.set(idx, u(rng));
  }
  // Value at logical (b, s, h, d).
  double at(int64_t b, int64_t s, int64_t h, int64_t d, Layout l) const {
    int64_t idx[4] = {b, s, h, d};
    if (l == Layout::BHSD) std::swap(idx[1], idx[2]);
    return view.get(idx);
  }
};

// Multiplies key row j of a BSHD tensor by 1 + j^2 / 3300 (x1 at j = 0, x ~150 at j = 700): later
// key tiles then beat a query's running max both by a little and by far more than 2^8, which
// exercises the forward kernels' lazily raised reference max (core/online_softmax.inc).
inline void grow_keys_with_position(Owned4& k) {
  int64_t idx[4];
  for (idx[0] = 0; idx[0] < k.view.shape[0]; ++idx[0])
    for (idx[1] = 0; idx[1] < k.view.shape[1]; ++idx[1])
      for (idx[2] = 0; idx[2] < k.view.shape[2]; ++idx[2])
        for (idx[3] = 0; idx[3] < k.view.shape[3]; ++idx[3])
          k.view.set(idx, k.view.get(idx) * (1.0 + double(idx[1] * idx[1]) / 3300.0));
}

// Adds one (got, want) pair to a normwise comparison; false when the pair cannot be compared by
// size: a NaN on either side (both NaN only counts as a match when nan_ok: a test that expects
// NaN there says so), or infinities that differ. std::max would silently drop a NaN instead.
inline bool add_pair(double got, double want, bool nan_ok, double& num, double& den) {
  if (std::isnan(got) || std::isnan(want)) return nan_ok && std::isnan(got) && std::isnan(want);
  if (std::isinf(got) || std::isinf(want)) return got == want;
  num = std::max(num, std::fabs(got - want));
  den = std::max(den, std::fabs(want));
  return true;
}

// max |got - want| / max(max |want|, floor): a normwise relative error (FlashAttention-style
// tests use the same idea); infinite when add_pair refuses a pair.
inline double rel_err(const Owned4& got, Layout l, const std::vector<double>& want, int64_t B,
                      int64_t S, int64_t H, int64_t D, double floor = 1e-6, bool nan_ok = false) {
  double num = 0, den = floor;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t d = 0; d < D; ++d) {
          const double w = want[size_t(((b * S + s) * H + h) * D + d)];
          if (!add_pair(got.at(b, s, h, d, l), w, nan_ok, num, den)) return INFINITY;
        }
  return num / den;
}

// The same over two flat vectors of equal length.
inline double rel_err(const std::vector<double>& got, const std::vector<double>& want, double floor = 1e-6,
                      bool nan_ok = false) {
  if (got.size() != want.size()) return INFINITY;
  double num = 0, den = floor;
  for (size_t i = 0; i < got.size(); ++i)
    if (!add_pair(got[i], want[i], nan_ok, num, den)) return INFINITY;
  return num / den;
}

// Expects fn to throw strata::Error whose message contains every needle (the bad-input tests: the
// argument's name, what was expected, what came).
inline void expect_error(const std::function<void()>& fn, const std::vector<std::string>& needles) {
  try {
    fn();
    ADD_FAILURE() << "no error thrown";
  } catch (const Error& e) {
    for (const auto& n : needles)
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << "'" << n << "' not in: " << e.what();
  }
}

}  // namespace strata::test
