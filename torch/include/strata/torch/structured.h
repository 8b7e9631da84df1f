// strata/torch/structured.h: the structured operators (strata/structured.h) for LibTorch tensors:
// forward / backward kernels, a differentiable call, the dense matrix, and StructuredLinear, a
// drop-in for torch::nn::Linear whose weight is any MLBTC operator (low rank, block diagonal, MLR,
// BTT, Monarch, Kronecker, or a general spec).
//
// Shapes: x (..., in) -> y (..., out), any leading dims, any strides; factors as
// strata::structured_factor_shapes lists them. x and the factors: float32 or bfloat16 (the CPU
// kernels; one dtype), or float64 (the double reference, for gradient checks).
//
// The ops (torch.ops.strata.*) carry a spec as `int[] spec, float[] alpha`: encode_spec /
// decode_spec below (alpha: one per level).
#pragma once
#include <torch/nn/cloneable.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <string>
#include <tuple>
#include <vector>

#include "strata/structured.h"

namespace strata::torch {

// The spec as the ops' integer list: [in, out, levels, then per level: inner, right kind, right
// blocks, left kind, left blocks, len(inner_perm), len(out_perm), inner_perm..., out_perm...].
std::vector<int64_t> encode_spec(const StructuredSpec& spec);
// Its alphas, one per level.
std::vector<double> spec_alphas(const StructuredSpec& spec);
// The inverse of encode_spec + spec_alphas; throws strata::Error naming `spec` or `alpha` (e.g. an
// alpha list of the wrong length) for a malformed list, then validates the spec.
StructuredSpec decode_spec(const char* where, const std::vector<int64_t>& ints, const std::vector<double>& alpha);

// y = x M^T (CPU kernel; float32 / bfloat16).
at::Tensor structured_forward(const StructuredSpec& spec, const at::Tensor& x, const std::vector<at::Tensor>& factors);
// The training forward: (y, saved), saved = the right stages' outputs for structured_backward
// (float32, strata::structured_saved_size elements; empty when no level has a right stage).
std::tuple<at::Tensor, at::Tensor> structured_forward_saving(const StructuredSpec& spec, const at::Tensor& x,
                                                             const std::vector<at::Tensor>& factors);
// (dx, dfactors) for dy (x's shape with out): dx undefined unless input_grad, dfactors empty
// unless factor_grads. saved: from structured_forward_saving on the same x and factors, or
// undefined (the right stages are recomputed).
std::tuple<at::Tensor, std::vector<at::Tensor>> structured_backward(const StructuredSpec& spec, const at::Tensor& x,
                                                                    const std::vector<at::Tensor>& factors,
                                                                    const at::Tensor& dy, bool input_grad = true,
                                                                    bool factor_grads = true,
                                                                    const at::Tensor& saved = at::Tensor());
// Differentiable y = x M^T (autograd Function over the kernels; float64: the double reference,
// once differentiable). x off the CPU (e.g. CUDA), or use_torch_ops() on: torch_ops::structured_linear
// instead (ATen ops, differentiable by autograd; strata/torch/torch_ops.h).
at::Tensor structured_linear(const StructuredSpec& spec, const at::Tensor& x, const std::vector<at::Tensor>& factors);
// The dense out x in matrix (float64 factors: the double reference; else float32 from the kernel).
at::Tensor structured_to_dense(const StructuredSpec& spec, const std::vector<at::Tensor>& factors);

// ---- StructuredLinear -------------------------------------------------------------------------
struct StructuredLinearOptions {
  StructuredLinearOptions(StructuredSpec spec) : spec_(std::move(spec)) {}
  TORCH_ARG(StructuredSpec, spec);
  TORCH_ARG(bool, bias) = true;
};

// y = x M^T + bias. Parameters: "factor_<i>" (the factors in structured_factor_shapes' order) and
// "bias" (out). Init: each factor U(-1/sqrt(f), 1/sqrt(f)) with f its block's fan-in (a right
// block's input chunk, a left block's inner chunk), divided by sqrt(levels); bias U(-1/sqrt(in),
// 1/sqrt(in)) as torch::nn::Linear's.
class StructuredLinearImpl : public ::torch::nn::Cloneable<StructuredLinearImpl> {
 public:
  explicit StructuredLinearImpl(StructuredLinearOptions options);
  void reset() override;
  void reset_parameters();
  at::Tensor forward(const at::Tensor& x);
  void pretty_print(std::ostream& stream) const override;
  // The dense weight (out x in) of the current factors, e.g. to compare with a Linear.
  at::Tensor dense_weight() const;

  StructuredLinearOptions options;
  std::vector<at::Tensor> factors;
  at::Tensor bias;
};
// The module holder (TORCH_MODULE spelled out: the macro names torch::nn unqualified, which inside
// strata::torch means strata::torch::nn).
class StructuredLinear : public ::torch::nn::ModuleHolder<StructuredLinearImpl> {
 public:
  using ::torch::nn::ModuleHolder<StructuredLinearImpl>::ModuleHolder;
  using Impl = StructuredLinearImpl;
};

}  // namespace strata::torch
