// src/cpu/reference/views.h: how the double-precision references read their inputs: element by
// element in the logical (batch, seq, head, dim) order of either layout, or copied once into a
// contiguous double array. For the references only (slow by design).
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "strata/tensor.h"

namespace strata::reference {

// Reads element (b, s, h, d) of a 4-D view of any dtype in the given layout.
struct View4 {
  const TensorView& t;
  Layout l;
  double operator()(int64_t b, int64_t s, int64_t h, int64_t d) const {
    int64_t idx[4] = {b, s, h, d};
    if (l == Layout::BHSD) std::swap(idx[1], idx[2]);
    return t.get(idx);
  }
};

// A 4-D view copied into a contiguous double array in logical (b, s, h, d) order.
struct Dense4 {
  int64_t B = 0, S = 0, H = 0, D = 0;
  std::vector<double> x;
  Dense4(const TensorView& t, Layout l) {
    const View4 v{t, l};
    const int s = l == Layout::BSHD ? 1 : 2;
    B = t.shape[0];
    S = t.shape[s];
    H = t.shape[3 - s];
    D = t.shape[3];
    x.resize(size_t(B * S * H * D));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t si = 0; si < S; ++si)
        for (int64_t hi = 0; hi < H; ++hi)
          for (int64_t d = 0; d < D; ++d) x[size_t(((b * S + si) * H + hi) * D + d)] = v(b, si, hi, d);
  }
  const double* row(int64_t b, int64_t s, int64_t h) const { return x.data() + ((b * S + s) * H + h) * D; }
};

}  // namespace strata::reference
