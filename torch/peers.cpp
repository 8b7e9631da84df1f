// torch/peers.cpp: the torch-op peers of the benches (strata/torch/peers.h).
#include "strata/torch/peers.h"

#include <cmath>
#include <limits>

#include "strata/checks.h"
#include "strata/error.h"
#include "strata/mlr.h"
#include "strata/monarch.h"
#include "strata/torch/attention.h"  // view_of

namespace strata::torch::peers {
namespace {

using detail::cat;

// q, k, v through the core's checks (4-D BHSD, one dtype, k and v shaped after q, k with q's seq),
// plus what the transcriptions need: as many key heads as query heads and a non-empty sequence.
AttnDims check_inputs(const char* where, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const AttnDims d = check_qkv(where, view_of(q, where, "q"), view_of(k, where, "k"), view_of(v, where, "v"),
                               Layout::BHSD, {DType::f32, DType::bf16, DType::f64}, /*self_attention=*/true);
  STRATA_CHECK_ARG(d.heads_kv == d.heads_q, where, "k", cat("q's heads (", d.heads_q, "; no GQA)"), d.heads_kv);
  STRATA_CHECK_ARG(d.seqlen_q >= 1, where, "q", "seq >= 1", d.seqlen_q);
  return d;
}

}  // namespace

at::Tensor mlr_blockwise_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const std::vector<int64_t>& ranks, bool causal) {
  const char* where = "mlr_blockwise_attention";
  const AttnDims d = check_inputs(where, q, k, v);
  const int64_t L = int64_t(ranks.size());
  STRATA_CHECK_ARG(L >= 1 && L <= MlrOptions::kMaxLevels, where, "ranks", cat("1..", MlrOptions::kMaxLevels, " levels"),
                   L);
  int64_t sum = 0;
  for (int64_t r : ranks) {
    STRATA_CHECK_ARG(r >= 1, where, "ranks", "every rank >= 1", r);
    sum += r;
  }
  STRATA_CHECK_ARG(sum == d.head_dim, where, "ranks", cat("ranks summing to q's head_dim (", d.head_dim, ")"), sum);
  const int64_t T = d.seqlen_q;
  STRATA_CHECK_ARG(T % (int64_t(1) << (L - 1)) == 0, where, "q",
                   cat("seq a multiple of 2^(L-1) = ", int64_t(1) << (L - 1), " (blocks of T / 2^l)"), T);

  const int64_t B = d.batch, H = d.heads_q;
  at::Tensor att;  // B x H x T x T: the sum over levels of the block-diagonal products
  int64_t off = 0;
  for (int64_t l = 0; l < L; ++l) {
    const int64_t r = ranks[size_t(l)], b = T >> l, nb = T / b;
    const at::Tensor cq = at::stack(q.narrow(-1, off, r).split(b, -2));  // nb x B x H x b x r
    const at::Tensor ck = at::stack(k.narrow(-1, off, r).split(b, -2));
    const at::Tensor prod = at::matmul(cq, ck.transpose(-2, -1)) * (1.0 / double(r));  // nb x B x H x b x b
    at::Tensor att_l = at::zeros({B, H, T, T}, q.options().requires_grad(false));
    for (int64_t j = 0; j < nb; ++j) att_l.slice(2, j * b, (j + 1) * b).slice(3, j * b, (j + 1) * b).copy_(prod[j]);
    att = att.defined() ? att + att_l : att_l;
    off += r;
  }
  if (causal) {
    const at::Tensor above_diag = at::ones({T, T}, q.options().dtype(at::kBool)).triu(1);
    att = att.masked_fill(above_diag, -std::numeric_limits<double>::infinity());
  }
  return at::matmul(at::softmax(att, -1), v);
}

at::Tensor monarch_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t num_steps,
                             int64_t block_size) {
  const char* where = "peers::monarch_attention";
  const AttnDims d = check_inputs(where, q, k, v);
  STRATA_CHECK_ARG(num_steps >= 1, where, "num_steps", ">= 1", num_steps);
  STRATA_CHECK_ARG(block_size >= 0, where, "block_size", ">= 1, or 0 for floor(sqrt(seq))", block_size);
  MonarchOptions opt;
  opt.block_size = block_size;
  const MonarchGeometry g = monarch_geometry(d.seqlen_q, opt);
  const int64_t BH = d.batch * d.heads_q, N = d.seqlen_q, B = g.block_size, M = g.num_blocks, P = g.padded_len;
  const double sc = 1.0 / std::sqrt(double(d.head_dim));
  const at::TensorOptions real = q.options().requires_grad(false);
  // Index names as strata/monarch.h: block k / l, offset j / i. a, c are indexed [k][j]; al, cl, L [j][...].
  const auto blocks = [&](const at::Tensor& x) {  // BH x M x B x dim, zero-padded at the end
    at::Tensor y = x.reshape({BH, N, x.size(3)});
    if (P > N) y = at::constant_pad_nd(y, {0, 0, 0, P - N});
    return y.reshape({BH, M, B, x.size(3)});
  };
  const at::Tensor qb = blocks(q), kb = blocks(k), vb = blocks(v);
  const at::Tensor valid = (at::arange(P, real.dtype(at::kLong)) < N).reshape({M, B});  // token m*B+j is real
  const at::Tensor key_ok = valid.reshape({1, M, 1, B});                                  // [k][.][i]
  const at::Tensor w = valid.to(q.scalar_type()).t().reshape({1, B, M, 1});              // query weight at [j][l]
  const at::Tensor qT = qb.transpose(1, 2);                                               // [j][l] x D
  at::Tensor a = qb, c = at::ones({BH, M, B}, real);
  for (int64_t t = 0;; ++t) {
    // R-step: R_k[j, i] = softmax_i(sc * a[k,j].k_{kB+i} / c[k,j]) over block k's real keys.
    const at::Tensor s = (at::matmul(a, kb.transpose(-1, -2)) * sc / c.unsqueeze(-1))
                             .masked_fill(key_ok.logical_not(), -std::numeric_limits<double>::infinity());
    const at::Tensor logR = at::log_softmax(s, -1), R = logR.exp();
    const at::Tensor al = (at::matmul(R, kb) * sc).transpose(1, 2);  // [j][k] x D
    // R log R with 0 log 0 = 0 (padded keys), without a NaN gradient through the -inf.
    const at::Tensor cl = (R * at::where(key_ok, logR, at::zeros_like(logR))).sum(-1).transpose(1, 2);  // [j][k]
    // L-step: L_j[l, k] = softmax_k(q_{lB+j}.al[j,k] - cl[j,k]).
    const at::Tensor L = at::softmax(at::matmul(qT, al.transpose(-1, -2)) - cl.unsqueeze(-2), -1);  // [j][l][k]
    if (t + 1 == num_steps) {
      const at::Tensor y = at::matmul(R, vb).transpose(1, 2);  // [j][k] x Dv
      return at::matmul(L, y).transpose(1, 2).reshape({d.batch, d.heads_q, P, d.head_dim_v}).narrow(2, 0, N);
    }
    const at::Tensor Lw = L * w;
    a = at::matmul(Lw.transpose(-1, -2), qT).transpose(1, 2);  // [k][j] x D
    c = Lw.sum(-2).transpose(1, 2);                            // [k][j]
  }
}

}  // namespace strata::torch::peers
