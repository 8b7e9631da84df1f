// strata/torch/mlp.h: the fused GELU MLP (strata/mlp.h) for LibTorch tensors, differentiable:
//   gelu_mlp(x, w1, b1, w2, b2) = linear(gelu(linear(x, w1, b1)), w2, b2)   (exact erf GELU)
// x (..., D) with any leading dims; w1 [H x D], w2 [D x H] (a Linear(D, H)'s and a Linear(H, D)'s
// weights), b1 [H] and b2 [D] undefined for none; optionally a pre-LayerNorm and the residual
// (MlpBlockArgs: a pre-LN transformer block's ln2, MLP and residual add in one call). float32 CPU tensors run the fused
// kernels (one call each way, the pre-activation saved for the backward); float64 and tensors on other devices run the
// same math as ATen ops (the reference for gradient checks; any device). Other dtypes are an error naming the argument.
// The backward is differentiable once.
#pragma once
#include <ATen/ATen.h>

namespace strata::torch {

// A block's MLP half around the MLP (strata::MlpBlock): out = [x +] MLP(LN(x)) with the LayerNorm
// over D when ln_weight is defined (ln_bias optional; both get gradients).
struct MlpBlockArgs {
  at::Tensor ln_weight, ln_bias;
  double eps = 1e-5;
  bool residual = false;
};

at::Tensor gelu_mlp(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& b1, const at::Tensor& w2,
                    const at::Tensor& b2, const MlpBlockArgs& block = {});

// linear(LN(x), w, b) (strata::ln_linear_forward): x (..., D) -> (..., H), w [H x D], b [H] or
// undefined, block's LayerNorm optional, block.residual false: a pre-LN block's ln1 and fused
// q/k/v projection, one call each way. Devices and dtypes as gelu_mlp.
at::Tensor ln_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, const MlpBlockArgs& block);

}  // namespace strata::torch
