// torch/ops_mlp.cpp: the kernels of the fused block ops torch.ops.strata.gelu_mlp* and ln_linear*
// (schemas in torch/library.cpp): CPU kernels for the forward / backward ops (not differentiable:
// their outputs never require grad), CompositeImplicitAutograd kernels for the differentiable
// gelu_mlp and ln_linear (they run the C++ autograd Functions of torch/mlp.cpp, which call the
// forward / backward ops through the dispatcher: op_calls). A strata::Error becomes a c10::Error
// with the same message (RuntimeError in Python).
#include <torch/library.h>

#include <optional>

#include "binding_util.h"
#include "op_calls.h"
#include "strata/torch/mlp.h"

namespace strata::torch {
namespace {

using binding::rethrow_as_c10;
using OptTensor = std::optional<at::Tensor>;

at::Tensor or_undefined(const OptTensor& t) { return t.value_or(at::Tensor()); }
OptTensor or_none(const at::Tensor& t) { return t.defined() ? OptTensor(t) : std::nullopt; }

MlpBlockArgs make_block(const OptTensor& ln_weight, const OptTensor& ln_bias, double eps, bool residual) {
  return {or_undefined(ln_weight), or_undefined(ln_bias), eps, residual};
}

// strata::gelu_mlp_forward (CPU): returns (y: x's sizes, h: rows x H, stats: rows x 2 or [0]).
std::tuple<at::Tensor, at::Tensor, at::Tensor> mlp_forward_op(const at::Tensor& x, const at::Tensor& w1,
                                                              const OptTensor& b1, const at::Tensor& w2,
                                                              const OptTensor& b2, const OptTensor& ln_weight,
                                                              const OptTensor& ln_bias, double eps, bool residual) {
  return rethrow_as_c10([&] {
    return gelu_mlp_forward(x, w1, or_undefined(b1), w2, or_undefined(b2),
                            make_block(ln_weight, ln_bias, eps, residual));
  });
}

using Grads7 = std::tuple<OptTensor, OptTensor, OptTensor, OptTensor, OptTensor, OptTensor, OptTensor>;

// strata::gelu_mlp_backward (CPU): returns (dx, dw1, db1, dw2, db2, dln_weight, dln_bias), None
// where output_mask is false (or the LayerNorm absent).
Grads7 mlp_backward_op(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& w1, const at::Tensor& w2,
                       const at::Tensor& h, const at::Tensor& stats, const OptTensor& ln_weight,
                       const OptTensor& ln_bias, double eps, bool residual, std::array<bool, 7> output_mask) {
  return rethrow_as_c10([&] {
    const auto g =
        gelu_mlp_backward(dy, x, w1, w2, h, stats, make_block(ln_weight, ln_bias, eps, residual), output_mask);
    return Grads7(or_none(g[0]), or_none(g[1]), or_none(g[2]), or_none(g[3]), or_none(g[4]), or_none(g[5]),
                  or_none(g[6]));
  });
}

// strata::gelu_mlp (differentiable).
at::Tensor mlp_op(const at::Tensor& x, const at::Tensor& w1, const OptTensor& b1, const at::Tensor& w2,
                  const OptTensor& b2, const OptTensor& ln_weight, const OptTensor& ln_bias, double eps,
                  bool residual) {
  return rethrow_as_c10([&] {
    return gelu_mlp(x, w1, or_undefined(b1), w2, or_undefined(b2), make_block(ln_weight, ln_bias, eps, residual));
  });
}

// strata::ln_linear_forward (CPU): returns (y: x's sizes with the last one H, stats).
std::tuple<at::Tensor, at::Tensor> ln_linear_forward_op(const at::Tensor& x, const at::Tensor& w, const OptTensor& b,
                                                        const OptTensor& ln_weight, const OptTensor& ln_bias,
                                                        double eps) {
  return rethrow_as_c10(
      [&] { return ln_linear_forward(x, w, or_undefined(b), make_block(ln_weight, ln_bias, eps, false)); });
}

using Grads5 = std::tuple<OptTensor, OptTensor, OptTensor, OptTensor, OptTensor>;

// strata::ln_linear_backward (CPU): returns (dx, dw, db, dln_weight, dln_bias), None where not asked.
Grads5 ln_linear_backward_op(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& w, const at::Tensor& stats,
                             const OptTensor& ln_weight, const OptTensor& ln_bias, double eps,
                             std::array<bool, 5> output_mask) {
  return rethrow_as_c10([&] {
    const auto g = ln_linear_backward(dy, x, w, stats, make_block(ln_weight, ln_bias, eps, false), output_mask);
    return Grads5(or_none(g[0]), or_none(g[1]), or_none(g[2]), or_none(g[3]), or_none(g[4]));
  });
}

// strata::ln_linear (differentiable).
at::Tensor ln_linear_op(const at::Tensor& x, const at::Tensor& w, const OptTensor& b, const OptTensor& ln_weight,
                        const OptTensor& ln_bias, double eps) {
  return rethrow_as_c10([&] { return ln_linear(x, w, or_undefined(b), make_block(ln_weight, ln_bias, eps, false)); });
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> op_calls::gelu_mlp_forward(const at::Tensor& x, const at::Tensor& w1,
                                                                          const at::Tensor& b1, const at::Tensor& w2,
                                                                          const at::Tensor& b2,
                                                                          const MlpBlockArgs& block) {
  static const auto op = binding::typed_op<decltype(mlp_forward_op)>("strata::gelu_mlp_forward");
  return binding::rethrow_as_strata([&] {
    return op.call(x, w1, or_none(b1), w2, or_none(b2), or_none(block.ln_weight), or_none(block.ln_bias), block.eps,
                   block.residual);
  });
}

std::array<at::Tensor, 7> op_calls::gelu_mlp_backward(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& w1,
                                                      const at::Tensor& w2, const at::Tensor& h,
                                                      const at::Tensor& stats, const MlpBlockArgs& block,
                                                      std::array<bool, 7> output_mask) {
  static const auto op = binding::typed_op<decltype(mlp_backward_op)>("strata::gelu_mlp_backward");
  const Grads7 g = binding::rethrow_as_strata([&] {
    return op.call(dy, x, w1, w2, h, stats, or_none(block.ln_weight), or_none(block.ln_bias), block.eps, block.residual,
                   output_mask);
  });
  return {or_undefined(std::get<0>(g)), or_undefined(std::get<1>(g)), or_undefined(std::get<2>(g)),
          or_undefined(std::get<3>(g)), or_undefined(std::get<4>(g)), or_undefined(std::get<5>(g)),
          or_undefined(std::get<6>(g))};
}

std::tuple<at::Tensor, at::Tensor> op_calls::ln_linear_forward(const at::Tensor& x, const at::Tensor& w,
                                                               const at::Tensor& b, const MlpBlockArgs& block) {
  static const auto op = binding::typed_op<decltype(ln_linear_forward_op)>("strata::ln_linear_forward");
  return binding::rethrow_as_strata(
      [&] { return op.call(x, w, or_none(b), or_none(block.ln_weight), or_none(block.ln_bias), block.eps); });
}

std::array<at::Tensor, 5> op_calls::ln_linear_backward(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& w,
                                                       const at::Tensor& stats, const MlpBlockArgs& block,
                                                       std::array<bool, 5> output_mask) {
  static const auto op = binding::typed_op<decltype(ln_linear_backward_op)>("strata::ln_linear_backward");
  const Grads5 g = binding::rethrow_as_strata([&] {
    return op.call(dy, x, w, stats, or_none(block.ln_weight), or_none(block.ln_bias), block.eps, output_mask);
  });
  return {or_undefined(std::get<0>(g)), or_undefined(std::get<1>(g)), or_undefined(std::get<2>(g)),
          or_undefined(std::get<3>(g)), or_undefined(std::get<4>(g))};
}

}  // namespace strata::torch

TORCH_LIBRARY_IMPL(strata, CPU, m) {
  m.impl("gelu_mlp_forward", &strata::torch::mlp_forward_op);
  m.impl("gelu_mlp_backward", &strata::torch::mlp_backward_op);
  m.impl("ln_linear_forward", &strata::torch::ln_linear_forward_op);
  m.impl("ln_linear_backward", &strata::torch::ln_linear_backward_op);
}

// The kernels alone are not differentiable: their outputs never require grad (binding_util.h).
TORCH_LIBRARY_IMPL(strata, Autograd, m) {
  for (const char* name : {"gelu_mlp_forward", "gelu_mlp_backward", "ln_linear_forward", "ln_linear_backward"})
    m.impl(name, strata::torch::binding::non_differentiable());
}

TORCH_LIBRARY_IMPL(strata, CompositeImplicitAutograd, m) {
  m.impl("gelu_mlp", &strata::torch::mlp_op);
  m.impl("ln_linear", &strata::torch::ln_linear_op);
}
