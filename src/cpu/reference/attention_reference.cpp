// src/cpu/reference/attention_reference.cpp: naive double-precision dense attention.
// Materialises the Nq x Nk score matrix per (batch, head) and follows the formulas of
// include/strata/attention.h literally (mask written out from its definition, independently of
// the kernel's tile logic). For tests and benchmark correctness checks only.
#include <cmath>
#include <limits>
#include <vector>

#include "cpu/reference/views.h"
#include "strata/attention.h"

namespace strata::reference {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

bool allowed(const AttentionOptions& o, int64_t nq, int64_t nk, int64_t i, int64_t j) {
  const int64_t pos = i + (nk - nq);
  if (o.causal && j > pos) return false;
  const bool global = j < o.num_global || (pos >= 0 && pos < o.num_global);
  if (global) return true;
  // (differences of positions: a window near 2^63 must not overflow pos - window)
  if (o.window_left >= 0 && pos - j > o.window_left) return false;
  if (o.window_right >= 0 && j - pos > o.window_right) return false;
  return true;
}

struct Shapes {
  int64_t B, Nq, Nk, Hq, Hkv, D, Dv;
  int64_t H;  // heads of o: max(Hq, Hkv); head h reads query head h / (H / Hq), kv head h / (H / Hkv)
  double scale;
  int64_t q_head(int64_t h) const { return h / (H / Hq); }
  int64_t kv_head(int64_t h) const { return h / (H / Hkv); }
};

// The call's sizes, after the shared checks (strata/checks.h) and the options' validate().
Shapes shapes(const char* where, const TensorView& q, const TensorView& k, const TensorView& v,
              const AttentionOptions& o) {
  const AttnDims d =
      check_qkv(where, q, k, v, o.layout, kReferenceDTypes, /*self_attention=*/false, HeadGroups::gqa_or_shared_q);
  validate(where, o, d);
  Shapes sh{d.batch, d.seqlen_q, d.seqlen_k, d.heads_q, d.heads_kv, d.head_dim, d.head_dim_v, d.heads(), 0};
  sh.scale = std::isnan(o.scale) ? 1.0 / std::sqrt(double(sh.D)) : double(o.scale);
  return sh;
}

// P (Nq x Nk) for one (b, h), h a head of o: softmax of the masked logits; also the lse per row.
void probs(const TensorView& q, const TensorView& k, const AttentionOptions& o, const Shapes& s,
           int64_t b, int64_t h, std::vector<double>& P, std::vector<double>& lse) {
  const View4 Q{q, o.layout}, K{k, o.layout};
  const int64_t hq = s.q_head(h), hk = s.kv_head(h);
  P.assign(size_t(s.Nq * s.Nk), kNegInf);
  lse.assign(size_t(s.Nq), kNegInf);
  for (int64_t i = 0; i < s.Nq; ++i) {
    double mx = kNegInf;
    for (int64_t j = 0; j < s.Nk; ++j) {
      if (!allowed(o, s.Nq, s.Nk, i, j)) continue;
      if (o.key_padding_mask.data) {
        int64_t idx[2] = {b, j};
        if (o.key_padding_mask.get(idx) == 0) continue;
      }
      double acc = 0;
      for (int64_t d = 0; d < s.D; ++d) acc += Q(b, i, hq, d) * K(b, j, hk, d);
      double x = s.scale * acc;
      if (o.bias.data) {
        int64_t idx[4] = {b, h, i, j};
        for (int a = 0; a < 4; ++a)
          if (o.bias.shape[a] == 1) idx[a] = 0;
        x += o.bias.get(idx);
      }
      P[size_t(i * s.Nk + j)] = x;
      mx = std::max(mx, x);
    }
    double sum = 0;
    for (int64_t j = 0; j < s.Nk; ++j) {
      double& x = P[size_t(i * s.Nk + j)];
      x = (mx == kNegInf || x == kNegInf) ? 0.0 : std::exp(x - mx);
      sum += x;
    }
    for (int64_t j = 0; j < s.Nk; ++j) P[size_t(i * s.Nk + j)] = sum > 0 ? P[size_t(i * s.Nk + j)] / sum : 0.0;
    lse[size_t(i)] = sum > 0 ? mx + std::log(sum) : kNegInf;
  }
}

}  // namespace

void attention_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                       const AttentionOptions& opt, double* o, double* lse) {
  const Shapes s = shapes("reference::attention_forward", q, k, v, opt);
  const View4 V{v, opt.layout};
  std::vector<double> P, L;
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h) {
      probs(q, k, opt, s, b, h, P, L);
      const int64_t hk = s.kv_head(h);
      for (int64_t i = 0; i < s.Nq; ++i) {
        lse[(b * s.H + h) * s.Nq + i] = L[size_t(i)];
        for (int64_t d = 0; d < s.Dv; ++d) {
          double acc = 0;
          for (int64_t j = 0; j < s.Nk; ++j) acc += P[size_t(i * s.Nk + j)] * V(b, j, hk, d);
          o[((b * s.Nq + i) * s.H + h) * s.Dv + d] = acc;
        }
      }
    }
}

void attention_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                        const TensorView& dout, const AttentionOptions& opt, double* dq,
                        double* dk, double* dv) {
  const char* where = "reference::attention_backward";
  const Shapes s = shapes(where, q, k, v, opt);
  check_4d(where, "dout", dout, opt.layout, q.dtype, s.B, s.Nq, s.H, s.Dv, "(same as o)");
  const View4 Q{q, opt.layout}, K{k, opt.layout}, V{v, opt.layout}, G{dout, opt.layout};
  std::fill(dq, dq + s.B * s.Nq * s.Hq * s.D, 0.0);
  std::fill(dk, dk + s.B * s.Nk * s.Hkv * s.D, 0.0);
  std::fill(dv, dv + s.B * s.Nk * s.Hkv * s.Dv, 0.0);
  std::vector<double> P, L, dS(size_t(s.Nq * s.Nk));
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h) {
      probs(q, k, opt, s, b, h, P, L);
      const int64_t hq = s.q_head(h), hk = s.kv_head(h);  // a shared query sums its heads' dq
      for (int64_t i = 0; i < s.Nq; ++i) {
        double rowdot = 0;  // sum_j P_ij dP_ij
        for (int64_t j = 0; j < s.Nk; ++j) {
          double dp = 0;
          for (int64_t d = 0; d < s.Dv; ++d) dp += G(b, i, h, d) * V(b, j, hk, d);
          dS[size_t(i * s.Nk + j)] = dp;
          rowdot += P[size_t(i * s.Nk + j)] * dp;
        }
        for (int64_t j = 0; j < s.Nk; ++j) {
          double& x = dS[size_t(i * s.Nk + j)];
          x = P[size_t(i * s.Nk + j)] * (x - rowdot);  // d loss / d logit
        }
      }
      for (int64_t i = 0; i < s.Nq; ++i)
        for (int64_t j = 0; j < s.Nk; ++j) {
          const double p = P[size_t(i * s.Nk + j)], g = dS[size_t(i * s.Nk + j)] * s.scale;
          if (p == 0 && g == 0) continue;
          for (int64_t d = 0; d < s.D; ++d) {
            dq[((b * s.Nq + i) * s.Hq + hq) * s.D + d] += g * K(b, j, hk, d);
            dk[((b * s.Nk + j) * s.Hkv + hk) * s.D + d] += g * Q(b, i, hq, d);
          }
          for (int64_t d = 0; d < s.Dv; ++d) dv[((b * s.Nk + j) * s.Hkv + hk) * s.Dv + d] += p * G(b, i, h, d);
        }
    }
}

}  // namespace strata::reference
