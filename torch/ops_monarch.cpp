// torch/ops_monarch.cpp: the kernels of the MonarchAttention and low-rank baseline ops
// torch.ops.strata.* (their schemas are in torch/library.cpp). CPU kernels for the forward /
// backward ops (not differentiable: outputs never require grad); CompositeImplicitAutograd
// kernels for the differentiable ones (monarch_attention runs the C++ autograd Function; the
// baselines are ATen compositions that torch differentiates);
// the FLOP counts are plain functions (no tensors). A strata::Error becomes a c10::Error with the
// same message (RuntimeError in Python).
#include <torch/library.h>

#include <string>

#include "binding_util.h"
#include "op_calls.h"
#include "strata/torch/baselines.h"
#include "strata/torch/monarch.h"

namespace strata::torch {
namespace {

using binding::rethrow_as_c10;

// The schema's option arguments as MonarchArgs: pad and mode from their names to the enums here,
// once (errors name the op `where` and the argument).
MonarchArgs make_args(const char* where, int64_t num_steps, int64_t block_size, c10::string_view pad,
                      c10::string_view mode, std::optional<double> scale,
                      const std::optional<at::Tensor>& key_padding_mask, c10::string_view layout,
                      c10::string_view compute) {
  MonarchArgs a;
  a.num_steps = num_steps;
  a.block_size = block_size;
  a.pad = parse_monarch_pad(where, std::string_view(pad.data(), pad.size()));
  a.mode = parse_monarch_mode(where, std::string_view(mode.data(), mode.size()));
  a.scale = scale;
  a.key_padding_mask = key_padding_mask;
  a.layout = std::string(layout);
  a.compute = std::string(compute);
  return a;
}

// strata::monarch_attention_forward (CPU): returns (out, state); state is a 0-element float32
// tensor when not save_state.
std::tuple<at::Tensor, at::Tensor> forward_op(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                              int64_t num_steps, int64_t block_size, c10::string_view pad,
                                              c10::string_view mode, std::optional<double> scale,
                                              const std::optional<at::Tensor>& key_padding_mask,
                                              c10::string_view layout, c10::string_view compute,
                                              bool save_state) {
  return rethrow_as_c10([&] {
    auto [out, state] = monarch_attention_forward(q, k, v,
                                                  make_args("monarch_attention_forward", num_steps, block_size, pad,
                                                            mode, scale, key_padding_mask, layout, compute),
                                                  save_state);
    if (!state.defined()) state = at::empty({0}, at::TensorOptions().dtype(at::kFloat));
    return std::tuple<at::Tensor, at::Tensor>{out, state};
  });
}

// strata::monarch_attention_backward (CPU): state may be None (recomputed); returns (dq, dk, dv).
std::tuple<at::Tensor, at::Tensor, at::Tensor> backward_op(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const std::optional<at::Tensor>& state,
    const at::Tensor& dout, int64_t num_steps, int64_t block_size, c10::string_view pad, c10::string_view mode,
    std::optional<double> scale, const std::optional<at::Tensor>& key_padding_mask, c10::string_view layout,
    c10::string_view compute) {
  return rethrow_as_c10([&] {
    return monarch_attention_backward(q, k, v, state.value_or(at::Tensor()), dout,
                                      make_args("monarch_attention_backward", num_steps, block_size, pad, mode,
                                                scale, key_padding_mask, layout, compute));
  });
}

// strata::performer_omega (CompositeExplicitAutograd: no tensor inputs; a random draw).
at::Tensor omega_op(int64_t head_dim, int64_t num_features, std::optional<int64_t> seed) {
  return rethrow_as_c10([&] { return performer_omega(head_dim, num_features, seed); });
}

// strata::monarch_attention (differentiable; float64 -> the double reference).
at::Tensor monarch_op(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t num_steps,
                      int64_t block_size, c10::string_view pad, c10::string_view mode, std::optional<double> scale,
                      const std::optional<at::Tensor>& key_padding_mask, c10::string_view layout,
                      c10::string_view compute) {
  return rethrow_as_c10([&] {
    return monarch_attention(q, k, v,
                             make_args("monarch_attention", num_steps, block_size, pad, mode, scale, key_padding_mask,
                                       layout, compute));
  });
}

at::Tensor performer_op(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t num_features,
                        std::optional<int64_t> seed, const std::optional<at::Tensor>& key_padding_mask,
                        std::optional<double> scale, c10::string_view layout) {
  return rethrow_as_c10(
      [&] { return performer_attention(q, k, v, num_features, seed, key_padding_mask, scale, std::string(layout)); });
}

at::Tensor nystrom_op(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t num_landmarks,
                      int64_t pinv_iters, const std::optional<at::Tensor>& key_padding_mask,
                      std::optional<double> scale, c10::string_view layout) {
  return rethrow_as_c10([&] {
    return nystrom_attention(q, k, v, num_landmarks, pinv_iters, key_padding_mask, scale, std::string(layout));
  });
}

double monarch_flops_op(int64_t N, int64_t heads, int64_t D, int64_t Dv, int64_t T, int64_t B) {
  return rethrow_as_c10([&] { return monarch_attention_flops(N, heads, D, Dv, T, B); });
}
double softmax_flops_op(int64_t N, int64_t D, int64_t Dv) {
  return rethrow_as_c10([&] { return softmax_attention_flops(N, D, Dv); });
}
double performer_flops_op(int64_t N, int64_t D, int64_t Dv, int64_t r) {
  return rethrow_as_c10([&] { return performer_attention_flops(N, D, Dv, r); });
}
double nystrom_flops_op(int64_t N, int64_t D, int64_t Dv, int64_t m, int64_t iters) {
  return rethrow_as_c10([&] { return nystrom_attention_flops(N, D, Dv, m, iters); });
}

}  // namespace

at::Tensor op_calls::performer_omega(int64_t head_dim, int64_t num_features, std::optional<int64_t> seed) {
  static const auto op = binding::typed_op<decltype(omega_op)>("strata::performer_omega");
  return binding::rethrow_as_strata([&] {
    return op.call(head_dim, num_features, seed);
  });
}

std::tuple<at::Tensor, at::Tensor> op_calls::monarch_attention_forward(const at::Tensor& q, const at::Tensor& k,
                                                                       const at::Tensor& v, const MonarchArgs& a,
                                                                       bool save_state) {
  static const auto op = binding::typed_op<decltype(forward_op)>("strata::monarch_attention_forward");
  return binding::rethrow_as_strata([&] {
    return op.call(q, k, v, a.num_steps, a.block_size, monarch_pad_name(a.pad), monarch_mode_name(a.mode), a.scale,
                   a.key_padding_mask, a.layout, a.compute, save_state);
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> op_calls::monarch_attention_backward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& state, const at::Tensor& dout,
    const MonarchArgs& a) {
  static const auto op = binding::typed_op<decltype(backward_op)>("strata::monarch_attention_backward");
  return binding::rethrow_as_strata([&] {
    return op.call(q, k, v, state.defined() ? std::optional<at::Tensor>(state) : std::nullopt, dout, a.num_steps,
                   a.block_size, monarch_pad_name(a.pad), monarch_mode_name(a.mode), a.scale, a.key_padding_mask,
                   a.layout, a.compute);
  });
}

}  // namespace strata::torch

// FLOP counts (2 x matmul MACs, per sequence): no tensor arguments, so catch-all kernels.
TORCH_LIBRARY_IMPL(strata, CatchAll, m) {
  m.impl("monarch_attention_flops", &strata::torch::monarch_flops_op);
  m.impl("softmax_attention_flops", &strata::torch::softmax_flops_op);
  m.impl("performer_attention_flops", &strata::torch::performer_flops_op);
  m.impl("nystrom_attention_flops", &strata::torch::nystrom_flops_op);
}

TORCH_LIBRARY_IMPL(strata, CPU, m) {
  m.impl("monarch_attention_forward", &strata::torch::forward_op);
  m.impl("monarch_attention_backward", &strata::torch::backward_op);
}

// The kernels alone are not differentiable: their outputs never require grad (binding_util.h).
TORCH_LIBRARY_IMPL(strata, Autograd, m) {
  m.impl("monarch_attention_forward", strata::torch::binding::non_differentiable());
  m.impl("monarch_attention_backward", strata::torch::binding::non_differentiable());
}

TORCH_LIBRARY_IMPL(strata, CompositeExplicitAutograd, m) { m.impl("performer_omega", &strata::torch::omega_op); }

TORCH_LIBRARY_IMPL(strata, CompositeImplicitAutograd, m) {
  m.impl("monarch_attention", &strata::torch::monarch_op);
  m.impl("performer_attention", &strata::torch::performer_op);
  m.impl("nystrom_attention", &strata::torch::nystrom_op);
}
