// src/cpu/reference/mlp_reference.cpp: the fused GELU MLP in double precision, the definition in
// strata/mlp.h taken literally (std::erf, one row at a time): what the kernels are compared with.
#include <cmath>
#include <vector>

#include "strata/mlp.h"

namespace strata::reference {
namespace {

double at2(const TensorView& t, int64_t i, int64_t j) {
  const int64_t idx[2] = {i, j};
  return t.get(idx);
}
double at1(const TensorView& t, int64_t i) {
  if (t.data == nullptr && t.ndim == 0) return 0.0;  // an omitted bias
  const int64_t idx[1] = {i};
  return t.get(idx);
}
double phi_cdf(double v) { return 0.5 * (1.0 + std::erf(v / std::sqrt(2.0))); }
double phi_pdf(double v) { return std::exp(-0.5 * v * v) / std::sqrt(2.0 * M_PI); }

// Row r of h = x W1^T + b1.
void pre_activation(const TensorView& x, const TensorView& w1, const TensorView& b1, int64_t r, int64_t D, int64_t H,
                    double* h) {
  for (int64_t j = 0; j < H; ++j) {
    double s = at1(b1, j);
    for (int64_t c = 0; c < D; ++c) s += at2(x, r, c) * at2(w1, j, c);
    h[j] = s;
  }
}

}  // namespace

void gelu_mlp_forward(const TensorView& x, const TensorView& w1, const TensorView& b1, const TensorView& w2,
                      const TensorView& b2, double* y, double* h) {
  const int64_t rows = x.shape[0], D = x.shape[1], H = w1.shape[0];
  std::vector<double> hr(size_t(H), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    pre_activation(x, w1, b1, r, D, H, hr.data());
    if (h)
      for (int64_t j = 0; j < H; ++j) h[r * H + j] = hr[size_t(j)];
    for (int64_t c = 0; c < D; ++c) {
      double s = at1(b2, c);
      for (int64_t j = 0; j < H; ++j) s += hr[size_t(j)] * phi_cdf(hr[size_t(j)]) * at2(w2, c, j);
      y[r * D + c] = s;
    }
  }
}

void gelu_mlp_backward(const TensorView& dy, const TensorView& x, const TensorView& w1, const TensorView& b1,
                       const TensorView& w2, double* dx, double* dw1, double* db1, double* dw2, double* db2) {
  const int64_t rows = x.shape[0], D = x.shape[1], H = w1.shape[0];
  for (int64_t i = 0; i < H * D; ++i) dw1[i] = dw2[i] = 0.0;
  for (int64_t j = 0; j < H; ++j) db1[j] = 0.0;
  for (int64_t c = 0; c < D; ++c) db2[c] = 0.0;
  std::vector<double> h(size_t(H), 0.0), dh(size_t(H), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    pre_activation(x, w1, b1, r, D, H, h.data());
    for (int64_t j = 0; j < H; ++j) {
      double da = 0.0;  // d loss / d gelu(h_j)
      for (int64_t c = 0; c < D; ++c) da += at2(dy, r, c) * at2(w2, c, j);
      const double v = h[size_t(j)];
      dh[size_t(j)] = da * (phi_cdf(v) + v * phi_pdf(v));
      for (int64_t c = 0; c < D; ++c) dw2[c * H + j] += at2(dy, r, c) * v * phi_cdf(v);
      db1[j] += dh[size_t(j)];
    }
    for (int64_t c = 0; c < D; ++c) {
      db2[c] += at2(dy, r, c);
      double s = 0.0;
      for (int64_t j = 0; j < H; ++j) {
        s += dh[size_t(j)] * at2(w1, j, c);
        dw1[j * D + c] += dh[size_t(j)] * at2(x, r, c);
      }
      dx[r * D + c] = s;
    }
  }
}

}  // namespace strata::reference
