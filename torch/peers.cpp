// torch/peers.cpp: the torch-op peers of the benches (strata/torch/peers.h).
#include "strata/torch/peers.h"

#include <cmath>
#include <limits>

#include "strata/checks.h"
#include "strata/error.h"
#include "strata/mlr.h"
#include "strata/monarch.h"
#include "strata/torch/attention.h"  // view_of
#include "strata/torch/torch_ops.h"

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
  check_inputs(where, q, k, v);
  STRATA_CHECK_ARG(num_steps >= 1, where, "num_steps", ">= 1", num_steps);
  STRATA_CHECK_ARG(block_size >= 0, where, "block_size", ">= 1, or 0 for floor(sqrt(seq))", block_size);
  MonarchArgs a;  // stable mode, post-padding, 1/sqrt(head_dim), no mask: the published algorithm
  a.num_steps = num_steps;
  a.block_size = block_size;
  a.layout = "bhsd";
  return torch_ops::monarch_attention(q, k, v, a);
}

}  // namespace strata::torch::peers
