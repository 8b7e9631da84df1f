// torch/ops_attention.cpp: the kernels of strata's dense attention ops (torch.ops.strata.*; the
// schemas are in torch/library.cpp): CPU kernels for the forward/backward ops (Autograd: not differentiable, their outputs never
// require grad), CompositeImplicitAutograd kernels for the differentiable ones (they run the C++
// autograd Function, so torch.autograd works from Python).
// A strata::Error becomes a c10::Error with the same message (RuntimeError in Python).
#include <torch/library.h>

#include <string>

#include "binding_util.h"
#include "op_calls.h"
#include "strata/error.h"
#include "strata/torch/attention.h"

namespace strata::torch {
namespace {

using binding::rethrow_as_c10;

// The schema's option arguments as AttentionArgs.
AttentionArgs make_args(std::optional<double> scale, bool causal, int64_t window_left, int64_t window_right,
                        int64_t num_global, const std::optional<at::Tensor>& key_padding_mask,
                        const std::optional<at::Tensor>& bias, c10::string_view layout,
                        c10::string_view compute) {
  AttentionArgs a;
  a.scale = scale;
  a.causal = causal;
  a.window_left = window_left;
  a.window_right = window_right;
  a.num_global = num_global;
  a.key_padding_mask = key_padding_mask;
  a.bias = bias;
  a.layout = std::string(layout);
  a.compute = std::string(compute);
  return a;
}

// strata::attention_forward (CPU): q, k, v in `layout`; returns (out, lse f32 [B, H, Nq]), H = max(Hq, Hkv).
std::tuple<at::Tensor, at::Tensor> forward_op(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                              std::optional<double> scale, bool causal, int64_t window_left,
                                              int64_t window_right, int64_t num_global,
                                              const std::optional<at::Tensor>& key_padding_mask,
                                              const std::optional<at::Tensor>& bias, c10::string_view layout,
                                              c10::string_view compute) {
  return rethrow_as_c10([&] {
    return attention_forward(q, k, v,
                             make_args(scale, causal, window_left, window_right, num_global, key_padding_mask, bias,
                                       layout, compute));
  });
}

// strata::attention_backward (CPU): out, lse from the forward, dout shaped like out; returns (dq, dk, dv).
std::tuple<at::Tensor, at::Tensor, at::Tensor> backward_op(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
    const at::Tensor& dout, std::optional<double> scale, bool causal, int64_t window_left, int64_t window_right,
    int64_t num_global, const std::optional<at::Tensor>& key_padding_mask, const std::optional<at::Tensor>& bias,
    c10::string_view layout, c10::string_view compute) {
  return rethrow_as_c10([&] {
    return attention_backward(
        q, k, v, out, lse, dout,
        make_args(scale, causal, window_left, window_right, num_global, key_padding_mask, bias, layout, compute));
  });
}

// strata::attention (differentiable): returns out, batch x seq_q x H x head_dim_v in `layout`.
at::Tensor attention_op(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, std::optional<double> scale,
                        bool causal, int64_t window_left, int64_t window_right, int64_t num_global,
                        const std::optional<at::Tensor>& key_padding_mask, const std::optional<at::Tensor>& bias,
                        c10::string_view layout, c10::string_view compute) {
  return rethrow_as_c10([&] {
    return attention(q, k, v,
                     make_args(scale, causal, window_left, window_right, num_global, key_padding_mask, bias, layout,
                               compute));
  });
}

// strata::attention_qkvpacked (differentiable): qkv batch x seq x 3 x heads x head_dim; returns out.
at::Tensor qkvpacked_op(const at::Tensor& qkv, std::optional<double> scale, bool causal, int64_t window_left,
                        int64_t window_right, int64_t num_global, const std::optional<at::Tensor>& key_padding_mask,
                        const std::optional<at::Tensor>& bias, c10::string_view layout, c10::string_view compute) {
  return rethrow_as_c10([&] {
    return attention_qkvpacked(qkv, make_args(scale, causal, window_left, window_right, num_global, key_padding_mask,
                                              bias, layout, compute));
  });
}

// strata::attention_qkvpacked_backward (CPU): returns dqkv shaped as qkv.
at::Tensor qkvpacked_backward_op(const at::Tensor& qkv, const at::Tensor& out, const at::Tensor& lse,
                                 const at::Tensor& dout, std::optional<double> scale, bool causal, int64_t window_left,
                                 int64_t window_right, int64_t num_global,
                                 const std::optional<at::Tensor>& key_padding_mask,
                                 const std::optional<at::Tensor>& bias, c10::string_view layout,
                                 c10::string_view compute) {
  return rethrow_as_c10([&] {
    return attention_qkvpacked_backward(
        qkv, out, lse, dout,
        make_args(scale, causal, window_left, window_right, num_global, key_padding_mask, bias, layout, compute));
  });
}

// strata::paper_gswa_attention (differentiable): returns out, shaped like q with v's head_dim.
at::Tensor paper_gswa_op(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t split_a,
                         int64_t window, std::optional<double> scale_a, std::optional<double> scale_b,
                         c10::string_view layout) {
  return rethrow_as_c10(
      [&] { return paper_gswa_attention(q, k, v, split_a, window, scale_a, scale_b, std::string(layout)); });
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> op_calls::attention_forward(const at::Tensor& q, const at::Tensor& k,
                                                               const at::Tensor& v, const AttentionArgs& a) {
  static const auto op = binding::typed_op<decltype(forward_op)>("strata::attention_forward");
  return binding::rethrow_as_strata([&] {
    return op.call(q, k, v, a.scale, a.causal, a.window_left, a.window_right, a.num_global, a.key_padding_mask, a.bias,
                   a.layout, a.compute);
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> op_calls::attention_backward(const at::Tensor& q, const at::Tensor& k,
                                                                            const at::Tensor& v, const at::Tensor& out,
                                                                            const at::Tensor& lse,
                                                                            const at::Tensor& dout,
                                                                            const AttentionArgs& a) {
  static const auto op = binding::typed_op<decltype(backward_op)>("strata::attention_backward");
  return binding::rethrow_as_strata([&] {
    return op.call(q, k, v, out, lse, dout, a.scale, a.causal, a.window_left, a.window_right, a.num_global,
                   a.key_padding_mask, a.bias, a.layout, a.compute);
  });
}

at::Tensor op_calls::attention_qkvpacked_backward(const at::Tensor& qkv, const at::Tensor& out, const at::Tensor& lse,
                                                  const at::Tensor& dout, const AttentionArgs& a) {
  static const auto op = binding::typed_op<decltype(qkvpacked_backward_op)>("strata::attention_qkvpacked_backward");
  return binding::rethrow_as_strata([&] {
    return op.call(qkv, out, lse, dout, a.scale, a.causal, a.window_left, a.window_right, a.num_global,
                   a.key_padding_mask, a.bias, a.layout, a.compute);
  });
}

}  // namespace strata::torch

TORCH_LIBRARY_IMPL(strata, CPU, m) {
  m.impl("attention_forward", &strata::torch::forward_op);
  m.impl("attention_backward", &strata::torch::backward_op);
  m.impl("attention_qkvpacked_backward", &strata::torch::qkvpacked_backward_op);
}

// The kernels alone are not differentiable: their outputs never require grad (binding_util.h).
TORCH_LIBRARY_IMPL(strata, Autograd, m) {
  m.impl("attention_forward", strata::torch::binding::non_differentiable());
  m.impl("attention_backward", strata::torch::binding::non_differentiable());
  m.impl("attention_qkvpacked_backward", strata::torch::binding::non_differentiable());
}

TORCH_LIBRARY_IMPL(strata, CompositeImplicitAutograd, m) {
  m.impl("attention", &strata::torch::attention_op);
  m.impl("attention_qkvpacked", &strata::torch::qkvpacked_op);
  m.impl("paper_gswa_attention", &strata::torch::paper_gswa_op);
}
