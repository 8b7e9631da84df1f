// src/cpu/reference/mlp_reference.cpp: the fused GELU MLP in double precision, the definition in
// strata/mlp.h taken literally (std::erf, one row at a time, the LayerNorm and residual of MlpBlock
// when asked): what the kernels are compared with.
#include <cmath>
#include <vector>

#include "strata/checks.h"  // given
#include "strata/mlp.h"

namespace strata::reference {
namespace {

double at2(const TensorView& t, int64_t i, int64_t j) {
  const int64_t idx[2] = {i, j};
  return t.get(idx);
}
double at1(const TensorView& t, int64_t i) {
  if (!given(t)) return 0.0;  // an omitted bias
  const int64_t idx[1] = {i};
  return t.get(idx);
}
double phi_cdf(double v) { return 0.5 * (1.0 + std::erf(v / std::sqrt(2.0))); }
double phi_pdf(double v) { return std::exp(-0.5 * v * v) / std::sqrt(2.0 * M_PI); }

// Row r of the MLP's input u (LN(x) with block.ln_weight, else x); xhat and rstd of the LayerNorm.
void input_row(const TensorView& x, const MlpBlock& blk, int64_t r, int64_t D, double* u, double* xhat, double* rstd) {
  if (!given(blk.ln_weight)) {
    for (int64_t c = 0; c < D; ++c) u[c] = at2(x, r, c);
    return;
  }
  double mean = 0, var = 0;
  for (int64_t c = 0; c < D; ++c) mean += at2(x, r, c);
  mean /= double(D);
  for (int64_t c = 0; c < D; ++c) var += (at2(x, r, c) - mean) * (at2(x, r, c) - mean);
  *rstd = 1.0 / std::sqrt(var / double(D) + double(blk.eps));
  for (int64_t c = 0; c < D; ++c) {
    xhat[c] = (at2(x, r, c) - mean) * *rstd;
    u[c] = xhat[c] * at1(blk.ln_weight, c) + at1(blk.ln_bias, c);
  }
}

// Through the LayerNorm for one row: du := d loss / d x = rstd (g - mean(g) - xhat mean(g xhat)),
// g = du ln_weight; dln_weight += du xhat, dln_bias += du (each when given).
void ln_backward(const MlpBlock& blk, int64_t D, const double* xhat, double rstd, double* du, double* dln_weight,
                 double* dln_bias) {
  double mg = 0, mgx = 0;
  for (int64_t c = 0; c < D; ++c) {
    const double g = du[c] * at1(blk.ln_weight, c);
    mg += g;
    mgx += g * xhat[c];
    if (dln_weight) dln_weight[c] += du[c] * xhat[c];
    if (dln_bias) dln_bias[c] += du[c];
  }
  mg /= double(D);
  mgx /= double(D);
  for (int64_t c = 0; c < D; ++c) du[c] = rstd * (du[c] * at1(blk.ln_weight, c) - mg - xhat[c] * mgx);
}

// h = u W1^T + b1 for one row.
void pre_activation(const double* u, const TensorView& w1, const TensorView& b1, int64_t D, int64_t H, double* h) {
  for (int64_t j = 0; j < H; ++j) {
    double s = at1(b1, j);
    for (int64_t c = 0; c < D; ++c) s += u[c] * at2(w1, j, c);
    h[j] = s;
  }
}

}  // namespace

void gelu_mlp_forward(const TensorView& x, const TensorView& w1, const TensorView& b1, const TensorView& w2,
                      const TensorView& b2, double* y, double* h, const MlpBlock& block) {
  const int64_t rows = x.shape[0], D = x.shape[1], H = w1.shape[0];
  std::vector<double> u(static_cast<size_t>(D)), xhat(static_cast<size_t>(D)), hr(static_cast<size_t>(H));
  double rstd = 0;
  for (int64_t r = 0; r < rows; ++r) {
    input_row(x, block, r, D, u.data(), xhat.data(), &rstd);
    pre_activation(u.data(), w1, b1, D, H, hr.data());
    if (h)
      for (int64_t j = 0; j < H; ++j) h[r * H + j] = hr[size_t(j)];
    for (int64_t c = 0; c < D; ++c) {
      double s = at1(b2, c) + (block.residual ? at2(x, r, c) : 0.0);
      for (int64_t j = 0; j < H; ++j) s += hr[size_t(j)] * phi_cdf(hr[size_t(j)]) * at2(w2, c, j);
      y[r * D + c] = s;
    }
  }
}

void gelu_mlp_backward(const TensorView& dy, const TensorView& x, const TensorView& w1, const TensorView& b1,
                       const TensorView& w2, double* dx, double* dw1, double* db1, double* dw2, double* db2,
                       const MlpBlock& block, double* dln_weight, double* dln_bias) {
  const int64_t rows = x.shape[0], D = x.shape[1], H = w1.shape[0];
  const bool ln = given(block.ln_weight);
  for (int64_t i = 0; i < H * D; ++i) dw1[i] = dw2[i] = 0.0;
  for (int64_t j = 0; j < H; ++j) db1[j] = 0.0;
  for (int64_t c = 0; c < D; ++c) {
    db2[c] = 0.0;
    if (dln_weight) dln_weight[c] = 0.0;
    if (dln_bias) dln_bias[c] = 0.0;
  }
  std::vector<double> u(static_cast<size_t>(D)), xhat(u), du(u), h(static_cast<size_t>(H)), dh(h);
  double rstd = 0;
  for (int64_t r = 0; r < rows; ++r) {
    input_row(x, block, r, D, u.data(), xhat.data(), &rstd);
    pre_activation(u.data(), w1, b1, D, H, h.data());
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
        dw1[j * D + c] += dh[size_t(j)] * u[size_t(c)];
      }
      du[size_t(c)] = s;  // d loss / d u_c
    }
    if (ln) ln_backward(block, D, xhat.data(), rstd, du.data(), dln_weight, dln_bias);
    for (int64_t c = 0; c < D; ++c) dx[r * D + c] = du[size_t(c)] + (block.residual ? at2(dy, r, c) : 0.0);
  }
}

void ln_linear_forward(const TensorView& x, const TensorView& w, const TensorView& b, double* y,
                       const MlpBlock& block) {
  const int64_t rows = x.shape[0], D = x.shape[1], H = w.shape[0];
  std::vector<double> u(static_cast<size_t>(D)), xhat(u);
  double rstd = 0;
  for (int64_t r = 0; r < rows; ++r) {
    input_row(x, block, r, D, u.data(), xhat.data(), &rstd);
    pre_activation(u.data(), w, b, D, H, y + r * H);
  }
}

void ln_linear_backward(const TensorView& dy, const TensorView& x, const TensorView& w, double* dx, double* dw,
                        double* db, const MlpBlock& block, double* dln_weight, double* dln_bias) {
  const int64_t rows = x.shape[0], D = x.shape[1], H = w.shape[0];
  for (int64_t i = 0; i < H * D; ++i) dw[i] = 0.0;
  for (int64_t j = 0; j < H; ++j) db[j] = 0.0;
  for (int64_t c = 0; c < D; ++c) {
    if (dln_weight) dln_weight[c] = 0.0;
    if (dln_bias) dln_bias[c] = 0.0;
  }
  std::vector<double> u(static_cast<size_t>(D)), xhat(u), du(u);
  double rstd = 0;
  for (int64_t r = 0; r < rows; ++r) {
    input_row(x, block, r, D, u.data(), xhat.data(), &rstd);
    for (int64_t j = 0; j < H; ++j) {
      db[j] += at2(dy, r, j);
      for (int64_t c = 0; c < D; ++c) dw[j * D + c] += at2(dy, r, j) * u[size_t(c)];
    }
    for (int64_t c = 0; c < D; ++c) {
      double s = 0;
      for (int64_t j = 0; j < H; ++j) s += at2(dy, r, j) * at2(w, j, c);
      du[size_t(c)] = s;
    }
    if (given(block.ln_weight)) ln_backward(block, D, xhat.data(), rstd, du.data(), dln_weight, dln_bias);
    for (int64_t c = 0; c < D; ++c) dx[r * D + c] = du[size_t(c)];
  }
}

}  // namespace strata::reference
