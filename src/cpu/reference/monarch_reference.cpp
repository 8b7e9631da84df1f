// src/cpu/reference/monarch_reference.cpp: naive double-precision MonarchAttention.
// Follows the algorithm of include/strata/monarch.h literally, in its un-normalised form
// (a, c and the division s = sc*a.k/c, as ma_torch.py writes it), stores every step's R and L,
// materialises the N x N Monarch matrix A = [L_j[l,k] R_k[j,i]] for the output O = A V and for
// the variational objective, and writes the backward as the plain adjoint of those loops
// (independently of the kernel's normalised, recomputing form). For tests only.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cpu/reference/views.h"
#include "strata/monarch.h"

namespace strata::reference {
namespace {

constexpr double kEps = 1e-12;  // ma_torch.py's eps (reference mode only)
constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// out[0..n) = softmax of x[0..n) whose maximum is mx (finite); -inf entries get 0.
void softmax_row(const double* x, int64_t n, double mx, double* out) {
  double Z = 0;
  for (int64_t i = 0; i < n; ++i) Z += (out[i] = x[i] == kNegInf ? 0.0 : std::exp(x[i] - mx));
  for (int64_t i = 0; i < n; ++i) out[i] /= Z;
}

struct Sizes {
  int64_t Bt, N, Hq, Hkv, D, Dv;
  int64_t B, M, P, front, T;  // block, blocks, padded length, pad_front, steps
  bool stable;
  double sc;
};

// The call's sizes, after the shared checks (strata/checks.h) and the options' validate(). v may be
// undefined (the objective trace needs no values).
Sizes sizes(const char* where, const TensorView& q, const TensorView& k, const TensorView& v, const MonarchOptions& o) {
  validate(where, o, check_qkv(where, q, k, given(v) ? v : k, o.layout, kReferenceDTypes, /*self_attention=*/true));
  const int s = o.layout == Layout::BSHD ? 1 : 2, h = 3 - s;
  Sizes z{};
  z.Bt = q.shape[0];
  z.N = q.shape[s];
  z.Hq = q.shape[h];
  z.Hkv = k.shape[h];
  z.D = q.shape[3];
  z.Dv = v.ndim == 4 ? v.shape[3] : 0;
  const MonarchGeometry g = monarch_geometry(z.N, o);
  z.B = g.block_size;
  z.M = g.num_blocks;
  z.P = g.padded_len;
  z.front = g.pad_front;
  z.T = o.num_steps;
  z.stable = o.mode == MonarchMode::stable;
  z.sc = std::isnan(o.scale) ? 1.0 / std::sqrt(double(z.D)) : double(o.scale);
  return z;
}

// One (batch, query head), padded to P = M*B positions p = block * B + offset, in double.
struct Head {
  std::vector<double> q, k, v;  // P x D, P x D, P x Dv (zero at padding)
  std::vector<double> w;        // P: 1 for a real, unmasked token
  std::vector<char> ok;         // M: block has at least one valid key
};

Head load_head(const TensorView& q, const TensorView& k, const TensorView& v, const MonarchOptions& o,
               const Sizes& z, int64_t b, int64_t h) {
  const View4 Q{q, o.layout}, K{k, o.layout}, V{v, o.layout};
  const int64_t hk = h / (z.Hq / z.Hkv);
  Head H;
  H.q.assign(size_t(z.P * z.D), 0.0);
  H.k.assign(size_t(z.P * z.D), 0.0);
  H.v.assign(size_t(z.P * z.Dv), 0.0);
  H.w.assign(size_t(z.P), 0.0);
  H.ok.assign(size_t(z.M), 0);
  for (int64_t n = 0; n < z.N; ++n) {
    const int64_t p = n + z.front;
    for (int64_t d = 0; d < z.D; ++d) {
      H.q[size_t(p * z.D + d)] = Q(b, n, h, d);
      H.k[size_t(p * z.D + d)] = K(b, n, hk, d);
    }
    for (int64_t d = 0; d < z.Dv; ++d) H.v[size_t(p * z.Dv + d)] = V(b, n, hk, d);
    bool keep = true;
    if (o.key_padding_mask.data) {
      int64_t idx[2] = {b, n};
      keep = o.key_padding_mask.get(idx) != 0;
    }
    H.w[size_t(p)] = keep ? 1.0 : 0.0;
    if (keep) H.ok[size_t(p / z.B)] = 1;
  }
  return H;
}

double dot(const double* a, const double* b, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// Everything the forward computes in step t (the backward reads it all back).
struct Step {
  std::vector<double> a, c;    // R-step input: a[p] (P x D), c[p] (P); p = k*B + j
  std::vector<double> R;       // [k][j][i]  (M x B x B)
  std::vector<double> al, cl;  // al[j][k] (B x M x D), cl[j][k] (B x M)
  std::vector<double> L;       // [j][l][k]  (B x M x M)
  std::vector<double> y;       // y[j][k] (B x M x Dv), last step only
};

// The R-step multiplier of a . k: 1/(c + eps) in reference mode, 1/c (0 where c = 0) in stable.
double inv_c(const Sizes& z, double c) { return z.stable ? (c > 0 ? 1.0 / c : 0.0) : 1.0 / (c + kEps); }

std::vector<Step> run_forward(const Sizes& z, const Head& H) {
  const int64_t B = z.B, M = z.M, P = z.P, D = z.D, Dv = z.Dv;
  std::vector<Step> steps(size_t(z.T));
  std::vector<double> a(static_cast<size_t>(P * D)), c(static_cast<size_t>(P));
  for (int64_t p = 0; p < P; ++p) {  // L = identity: a = q (stable: valid queries only)
    const double wq = z.stable ? H.w[size_t(p)] : 1.0;
    for (int64_t d = 0; d < D; ++d) a[size_t(p * D + d)] = wq * H.q[size_t(p * D + d)];
    c[size_t(p)] = wq;
  }
  for (int64_t t = 0; t < z.T; ++t) {
    Step& S = steps[size_t(t)];
    S.a = a;
    S.c = c;
    S.R.assign(size_t(M * B * B), 0.0);
    S.al.assign(size_t(B * M * D), 0.0);
    S.cl.assign(size_t(B * M), 0.0);
    S.L.assign(size_t(B * M * M), 0.0);
    if (t == z.T - 1) S.y.assign(size_t(B * M * Dv), 0.0);
    // R-step
    for (int64_t k = 0; k < M; ++k)
      for (int64_t j = 0; j < B; ++j) {
        const int64_t p = k * B + j;
        std::vector<double> s(size_t(B), kNegInf);
        double mx = kNegInf;
        for (int64_t i = 0; i < B; ++i) {
          const int64_t pk = k * B + i;
          if (H.w[size_t(pk)] == 0) continue;
          const double dk = z.sc * dot(&a[size_t(p * D)], &H.k[size_t(pk * D)], D);
          s[size_t(i)] = z.stable ? (c[size_t(p)] > 0 ? dk / c[size_t(p)] : 0.0) : dk / (c[size_t(p)] + kEps);
          mx = std::max(mx, s[size_t(i)]);
        }
        double* R = &S.R[size_t((k * B + j) * B)];
        if (z.stable) {
          if (mx == kNegInf) continue;  // no valid key in block k: R = 0
          softmax_row(s.data(), B, mx, R);
        } else {  // ma_torch.py: exp(s - max(rowmax, eps)) / (sum + eps)
          const double shift = std::max(mx, kEps);
          double Z = 0;
          for (int64_t i = 0; i < B; ++i) Z += (R[i] = std::exp(s[size_t(i)] - shift));
          for (int64_t i = 0; i < B; ++i) R[i] /= Z + kEps;
        }
        double cl = 0;
        for (int64_t i = 0; i < B; ++i) {
          if (R[i] > 0) cl += R[i] * std::log(R[i]);
          const int64_t pk = k * B + i;
          for (int64_t d = 0; d < D; ++d) S.al[size_t((j * M + k) * D + d)] += z.sc * R[i] * H.k[size_t(pk * D + d)];
          if (t == z.T - 1)
            for (int64_t d = 0; d < Dv; ++d) S.y[size_t((j * M + k) * Dv + d)] += R[i] * H.v[size_t(pk * Dv + d)];
        }
        S.cl[size_t(j * M + k)] = cl;
      }
    // L-step
    for (int64_t j = 0; j < B; ++j)
      for (int64_t l = 0; l < M; ++l) {
        const int64_t p = l * B + j;
        std::vector<double> u(size_t(M), kNegInf);
        double mx = kNegInf;
        for (int64_t k = 0; k < M; ++k) {
          if (z.stable && !H.ok[size_t(k)]) continue;
          u[size_t(k)] = dot(&H.q[size_t(p * D)], &S.al[size_t((j * M + k) * D)], D) - S.cl[size_t(j * M + k)];
          mx = std::max(mx, u[size_t(k)]);
        }
        double* Lr = &S.L[size_t((j * M + l) * M)];
        if (mx == kNegInf) continue;  // stable, no valid key anywhere: L = 0
        softmax_row(u.data(), M, mx, Lr);
      }
    if (t + 1 < z.T) {  // next R-step input: a[k,j] = sum_l w L_j[l,k] q_{l,j}, c[k,j] = sum_l w L_j[l,k]
      std::fill(a.begin(), a.end(), 0.0);
      std::fill(c.begin(), c.end(), 0.0);
      for (int64_t j = 0; j < B; ++j)
        for (int64_t l = 0; l < M; ++l) {
          const int64_t p = l * B + j;
          for (int64_t k = 0; k < M; ++k) {
            const double wl = H.w[size_t(p)] * S.L[size_t((j * M + l) * M + k)];
            c[size_t(k * B + j)] += wl;
            for (int64_t d = 0; d < D; ++d) a[size_t((k * B + j) * D + d)] += wl * H.q[size_t(p * D + d)];
          }
        }
    }
  }
  return steps;
}

// A (P x P): A[(l,j),(k,i)] = L_j[l,k] R_k[j,i]; L = null means L = identity.
std::vector<double> monarch_matrix(const Sizes& z, const std::vector<double>* L, const std::vector<double>& R) {
  const int64_t B = z.B, M = z.M, P = z.P;
  std::vector<double> A(size_t(P * P), 0.0);
  for (int64_t l = 0; l < M; ++l)
    for (int64_t j = 0; j < B; ++j)
      for (int64_t k = 0; k < M; ++k) {
        const double lw = L ? (*L)[size_t((j * M + l) * M + k)] : (l == k ? 1.0 : 0.0);
        for (int64_t i = 0; i < B; ++i) A[size_t((l * B + j) * P + k * B + i)] = lw * R[size_t((k * B + j) * B + i)];
      }
  return A;
}

double objective(const Sizes& z, const Head& H, const std::vector<double>& A) {
  double f = 0;
  for (int64_t n = 0; n < z.P; ++n) {
    if (H.w[size_t(n)] == 0) continue;
    for (int64_t m = 0; m < z.P; ++m) {
      if (H.w[size_t(m)] == 0) continue;
      const double x = A[size_t(n * z.P + m)];
      if (x > 0) f += x * (z.sc * dot(&H.q[size_t(n * z.D)], &H.k[size_t(m * z.D)], z.D) - std::log(x));
    }
  }
  return f;
}

}  // namespace

void monarch_attention_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                               const MonarchOptions& opt, double* o) {
  const Sizes z = sizes("reference::monarch_attention_forward", q, k, v, opt);
  for (int64_t b = 0; b < z.Bt; ++b)
    for (int64_t h = 0; h < z.Hq; ++h) {
      const Head H = load_head(q, k, v, opt, z, b, h);
      const std::vector<Step> steps = run_forward(z, H);
      const std::vector<double> A = monarch_matrix(z, &steps.back().L, steps.back().R);
      for (int64_t n = 0; n < z.N; ++n) {
        const int64_t p = n + z.front;
        const bool zero = z.stable && H.w[size_t(p)] == 0;  // stable: masked queries output 0
        for (int64_t d = 0; d < z.Dv; ++d) {
          double acc = 0;
          for (int64_t m = 0; m < z.P; ++m) acc += A[size_t(p * z.P + m)] * H.v[size_t(m * z.Dv + d)];
          o[((b * z.N + n) * z.Hq + h) * z.Dv + d] = zero ? 0.0 : acc;
        }
      }
    }
}

void monarch_objective_trace(const TensorView& q, const TensorView& k, const MonarchOptions& opt, double* f) {
  const Sizes z = sizes("reference::monarch_objective_trace", q, k, TensorView(), opt);
  for (int64_t b = 0; b < z.Bt; ++b)
    for (int64_t h = 0; h < z.Hq; ++h) {
      const Head H = load_head(q, k, TensorView(), opt, z, b, h);
      const std::vector<Step> steps = run_forward(z, H);
      for (int64_t t = 0; t < z.T; ++t) {
        const std::vector<double>* Lprev = t == 0 ? nullptr : &steps[size_t(t - 1)].L;
        double* out = f + ((b * z.Hq + h) * z.T + t) * 2;
        out[0] = objective(z, H, monarch_matrix(z, Lprev, steps[size_t(t)].R));
        out[1] = objective(z, H, monarch_matrix(z, &steps[size_t(t)].L, steps[size_t(t)].R));
      }
    }
}

// The adjoint of run_forward, loop by loop, in reverse. Per step: the L-step is a softmax over k
// of u = q.al - cl (du = L * (dL - sum_k L dL)); its outputs a = sum_l w L q and c = sum_l w L
// give dL = w (dc + da.q); the R-step is a softmax over i of s = sc * g * a.k with g = 1/(c + eps)
// (reference) or 1/c (stable; 0 and no gradient where c = 0), whose outputs al = sc sum R k,
// cl = sum R log R, y = sum R v give dR_i = sc dal.k_i + dy.v_i + dcl (log R_i + 1), and then
// ds = R * (dR - sum R dR), da = sc g sum ds k, dc = -sc g^2 sum ds (a.k).
// (The max(rowmax, eps) shift of reference mode is treated as a constant.)
void monarch_attention_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                                const TensorView& dout, const MonarchOptions& opt, double* dq, double* dk,
                                double* dv) {
  const char* where = "reference::monarch_attention_backward";
  const Sizes z = sizes(where, q, k, v, opt);
  check_4d(where, "dout", dout, opt.layout, q.dtype, z.Bt, z.N, z.Hq, z.Dv, "(same as o)");
  const int64_t B = z.B, M = z.M, P = z.P, D = z.D, Dv = z.Dv;
  std::fill(dq, dq + z.Bt * z.N * z.Hq * D, 0.0);
  std::fill(dk, dk + z.Bt * z.N * z.Hkv * D, 0.0);
  std::fill(dv, dv + z.Bt * z.N * z.Hkv * Dv, 0.0);
  const View4 G{dout, opt.layout};
  for (int64_t b = 0; b < z.Bt; ++b)
    for (int64_t h = 0; h < z.Hq; ++h) {
      const Head H = load_head(q, k, v, opt, z, b, h);
      const std::vector<Step> steps = run_forward(z, H);
      std::vector<double> g(size_t(P * Dv), 0.0);  // dO, padded (stable: masked rows dropped)
      for (int64_t n = 0; n < z.N; ++n) {
        const int64_t p = n + z.front;
        const double keep = z.stable ? H.w[size_t(p)] : 1.0;
        for (int64_t d = 0; d < Dv; ++d) g[size_t(p * Dv + d)] = keep * G(b, n, h, d);
      }
      std::vector<double> gq(size_t(P * D), 0.0), gk(size_t(P * D), 0.0), gv(size_t(P * Dv), 0.0);
      std::vector<double> da(size_t(P * D), 0.0), dc(size_t(P), 0.0);  // of the next R-step's input
      for (int64_t t = z.T - 1; t >= 0; --t) {
        const Step& S = steps[size_t(t)];
        const bool last = t == z.T - 1;
        std::vector<double> dal(size_t(B * M * D), 0.0), dcl(size_t(B * M), 0.0), dy(size_t(B * M * Dv), 0.0);
        // L-step adjoint
        for (int64_t j = 0; j < B; ++j)
          for (int64_t l = 0; l < M; ++l) {
            const int64_t p = l * B + j;
            const double* Lr = &S.L[size_t((j * M + l) * M)];
            std::vector<double> dL(size_t(M), 0.0);
            for (int64_t k2 = 0; k2 < M; ++k2) {
              const int64_t pk = k2 * B + j;
              if (last) {  // O_p = sum_k L y[j,k]
                dL[size_t(k2)] = dot(&g[size_t(p * Dv)], &S.y[size_t((j * M + k2) * Dv)], Dv);
                for (int64_t d = 0; d < Dv; ++d) dy[size_t((j * M + k2) * Dv + d)] += Lr[k2] * g[size_t(p * Dv + d)];
              } else {  // a[k,j] += w L q_p, c[k,j] += w L
                const double wp = H.w[size_t(p)];
                dL[size_t(k2)] = wp * (dc[size_t(pk)] + dot(&da[size_t(pk * D)], &H.q[size_t(p * D)], D));
                for (int64_t d = 0; d < D; ++d) gq[size_t(p * D + d)] += wp * Lr[k2] * da[size_t(pk * D + d)];
              }
            }
            double rd = 0;
            for (int64_t k2 = 0; k2 < M; ++k2) rd += Lr[k2] * dL[size_t(k2)];
            for (int64_t k2 = 0; k2 < M; ++k2) {
              const double du = Lr[k2] * (dL[size_t(k2)] - rd);
              for (int64_t d = 0; d < D; ++d) {
                gq[size_t(p * D + d)] += du * S.al[size_t((j * M + k2) * D + d)];
                dal[size_t((j * M + k2) * D + d)] += du * H.q[size_t(p * D + d)];
              }
              dcl[size_t(j * M + k2)] -= du;
            }
          }
        // R-step adjoint
        std::fill(da.begin(), da.end(), 0.0);
        std::fill(dc.begin(), dc.end(), 0.0);
        for (int64_t k2 = 0; k2 < M; ++k2)
          for (int64_t j = 0; j < B; ++j) {
            const int64_t p = k2 * B + j;
            const double* R = &S.R[size_t((k2 * B + j) * B)];
            const double* dalr = &dal[size_t((j * M + k2) * D)];
            const double* dyr = &dy[size_t((j * M + k2) * Dv)];
            const double dclr = dcl[size_t(j * M + k2)];
            std::vector<double> dR(size_t(B), 0.0);
            double rs = 0;
            for (int64_t i = 0; i < B; ++i) {
              const int64_t pk = k2 * B + i;
              if (R[i] == 0) continue;
              dR[size_t(i)] = z.sc * dot(dalr, &H.k[size_t(pk * D)], D) + dclr * (std::log(R[i]) + 1.0);
              if (last) dR[size_t(i)] += dot(dyr, &H.v[size_t(pk * Dv)], Dv);
              rs += R[i] * dR[size_t(i)];
            }
            const double gi = inv_c(z, S.c[size_t(p)]);
            for (int64_t i = 0; i < B; ++i) {
              const int64_t pk = k2 * B + i;
              const double ds = R[i] * (dR[size_t(i)] - rs);
              const double ak = dot(&S.a[size_t(p * D)], &H.k[size_t(pk * D)], D);
              for (int64_t d = 0; d < D; ++d) {
                da[size_t(p * D + d)] += z.sc * gi * ds * H.k[size_t(pk * D + d)];
                gk[size_t(pk * D + d)] += z.sc * gi * ds * S.a[size_t(p * D + d)] + z.sc * R[i] * dalr[d];
              }
              dc[size_t(p)] -= z.sc * gi * gi * ds * ak;
              if (last)
                for (int64_t d = 0; d < Dv; ++d) gv[size_t(pk * Dv + d)] += R[i] * dyr[d];
            }
          }
      }
      for (int64_t p = 0; p < P; ++p) {  // step 1's input: a = q (stable: w q); c is constant
        const double wq = z.stable ? H.w[size_t(p)] : 1.0;
        for (int64_t d = 0; d < D; ++d) gq[size_t(p * D + d)] += wq * da[size_t(p * D + d)];
      }
      const int64_t hk = h / (z.Hq / z.Hkv);
      for (int64_t n = 0; n < z.N; ++n) {
        const int64_t p = n + z.front;
        for (int64_t d = 0; d < D; ++d) {
          dq[((b * z.N + n) * z.Hq + h) * D + d] = gq[size_t(p * D + d)];
          dk[((b * z.N + n) * z.Hkv + hk) * D + d] += gk[size_t(p * D + d)];
        }
        for (int64_t d = 0; d < Dv; ++d) dv[((b * z.N + n) * z.Hkv + hk) * Dv + d] += gv[size_t(p * Dv + d)];
      }
    }
}

}  // namespace strata::reference
