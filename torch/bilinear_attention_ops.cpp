// torch/bilinear_attention_ops.cpp: the kernels of the bilinear-scoring and muP ops
// (torch.ops.strata.btt_factorize, btt_key_transform, block_diag_transform, bilinear_btt_attention,
// bilinear_mlr_attention, mup_rms_cap; schemas in torch/library.cpp). The differentiable ones are
// CompositeImplicitAutograd: compositions of ATen ops and strata's differentiable attention, so
// autograd traces through them from Python too. A strata::Error becomes a c10::Error with the same
// message (RuntimeError in Python).
#include <torch/library.h>

#include <string>
#include <vector>

#include "binding_util.h"
#include "strata/torch/bilinear_attention.h"
#include "strata/torch/mup.h"

namespace strata::torch {
namespace {

using binding::rethrow_as_c10;

at::Tensor or_undefined(const std::optional<at::Tensor>& t) { return t.value_or(at::Tensor()); }

// strata::btt_factorize: [a, b, c, d].
std::vector<int64_t> btt_factorize_op(int64_t dim, c10::string_view rule) {
  return rethrow_as_c10([&] {
    const BttShape s = btt_factorize(dim, std::string(rule));
    return std::vector<int64_t>{s.a, s.b, s.c, s.d};
  });
}

at::Tensor btt_key_transform_op(const at::Tensor& x, const at::Tensor& w_k, const at::Tensor& w_q, int64_t heads) {
  return rethrow_as_c10([&] { return btt_key_transform(x, w_k, w_q, heads); });
}

at::Tensor block_diag_transform_op(const at::Tensor& x, const at::Tensor& w, int64_t heads) {
  return rethrow_as_c10([&] { return block_diag_transform(x, w, heads); });
}

at::Tensor bilinear_btt_attention_op(const at::Tensor& x, const at::Tensor& w_k, const at::Tensor& w_q,
                                     const at::Tensor& key_norm_weight, const std::optional<at::Tensor>& key_norm_bias,
                                     const std::optional<at::Tensor>& x_norm_weight,
                                     const std::optional<at::Tensor>& x_norm_bias, const at::Tensor& v_weight,
                                     const std::optional<at::Tensor>& v_bias, const at::Tensor& out_weight,
                                     const std::optional<at::Tensor>& out_bias, int64_t num_heads,
                                     c10::string_view logit_scale, bool causal, bool rms_cap) {
  return rethrow_as_c10([&] {
    const BilinearBTTWeights w{w_k,
                               w_q,
                               key_norm_weight,
                               or_undefined(key_norm_bias),
                               or_undefined(x_norm_weight),
                               or_undefined(x_norm_bias),
                               v_weight,
                               or_undefined(v_bias),
                               out_weight,
                               or_undefined(out_bias)};
    return bilinear_btt_attention(x, w, num_heads, std::string(logit_scale), causal, rms_cap);
  });
}

at::Tensor bilinear_mlr_attention_op(const at::Tensor& x, at::TensorList w_q, at::TensorList w_k,
                                     at::TensorList q_norm_weight, at::TensorList q_norm_bias,
                                     at::TensorList k_norm_weight, at::TensorList k_norm_bias,
                                     const at::Tensor& v_weight, const std::optional<at::Tensor>& v_bias,
                                     const at::Tensor& out_weight, const std::optional<at::Tensor>& out_bias,
                                     int64_t num_heads, c10::string_view logit_scale, bool divide_by_num_levels,
                                     bool causal, bool rms_cap) {
  return rethrow_as_c10([&] {
    const BilinearMLRWeights w{
        w_q.vec(),         w_k.vec(), q_norm_weight.vec(),  q_norm_bias.vec(), k_norm_weight.vec(),
        k_norm_bias.vec(), v_weight,  or_undefined(v_bias), out_weight,        or_undefined(out_bias)};
    return bilinear_mlr_attention(x, w, num_heads, std::string(logit_scale), divide_by_num_levels, causal, rms_cap);
  });
}

at::Tensor rms_cap_op(const at::Tensor& w, int64_t d_in, int64_t d_out) {
  return rethrow_as_c10([&] { return rms_cap(w, d_in, d_out); });
}

}  // namespace
}  // namespace strata::torch

TORCH_LIBRARY_IMPL(strata, CatchAll, m) { m.impl("btt_factorize", &strata::torch::btt_factorize_op); }

TORCH_LIBRARY_IMPL(strata, CompositeImplicitAutograd, m) {
  m.impl("btt_key_transform", &strata::torch::btt_key_transform_op);
  m.impl("block_diag_transform", &strata::torch::block_diag_transform_op);
  m.impl("bilinear_btt_attention", &strata::torch::bilinear_btt_attention_op);
  m.impl("bilinear_mlr_attention", &strata::torch::bilinear_mlr_attention_op);
  m.impl("mup_rms_cap", &strata::torch::rms_cap_op);
}
