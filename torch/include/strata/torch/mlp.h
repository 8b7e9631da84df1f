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

#include <array>
#include <tuple>

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

// ---- The kernels alone (torch.ops.strata.{gelu_mlp,ln_linear}_{forward,backward}) -------------
// NOT differentiable (their outputs never require grad): the autograd Functions behind gelu_mlp and
// ln_linear call them through the dispatcher, so that torch.compile traces them as opaque nodes.
// float32 CPU tensors only (other dtypes or devices: an error naming the argument). Undefined
// b1 / b2 / b / ln_weight / ln_bias: none.

// Returns (y: x's sizes, contiguous; h: rows x H, the pre-activation x W1^T + b1 for the backward;
// stats: rows x 2, the LayerNorm's (mean, 1/std) per row, or a [0] tensor without a LayerNorm).
// rows = x.numel() / D.
std::tuple<at::Tensor, at::Tensor, at::Tensor> gelu_mlp_forward(const at::Tensor& x, const at::Tensor& w1,
                                                                const at::Tensor& b1, const at::Tensor& w2,
                                                                const at::Tensor& b2, const MlpBlockArgs& block);
// dy: x's sizes; h, stats from the forward (same block). output_mask picks which of (dx, dw1, db1,
// dw2, db2, dln_weight, dln_bias) to compute; the others come back undefined (dln_* also without a
// LayerNorm). dx has x's sizes, the rest their parameter's.
std::array<at::Tensor, 7> gelu_mlp_backward(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& w1,
                                            const at::Tensor& w2, const at::Tensor& h, const at::Tensor& stats,
                                            const MlpBlockArgs& block, std::array<bool, 7> output_mask);

// Returns (y: x's sizes with the last one H, contiguous; stats as gelu_mlp_forward's).
std::tuple<at::Tensor, at::Tensor> ln_linear_forward(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                                                     const MlpBlockArgs& block);
// dy: y's sizes. output_mask: (dx, dw, db, dln_weight, dln_bias), as gelu_mlp_backward's.
std::array<at::Tensor, 5> ln_linear_backward(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& w,
                                             const at::Tensor& stats, const MlpBlockArgs& block,
                                             std::array<bool, 5> output_mask);

}  // namespace strata::torch
