// strata/mlp.h: the fused GELU MLP, the feed-forward of a transformer block:
//
//   h = x W1^T + b1,   y = gelu(h) W2^T + b2,   gelu(h) = h Phi(h)  (exact: the erf form)
//
// for x [rows x D] (tokens x width), W1 [H x D] and W2 [D x H] (the fc and proj weights of a
// Linear(D, H) and a Linear(H, D): out x in), b1 [H] and b2 [D] optional. One call runs both
// products and the activation per tile of tokens with the hidden activations in cache (a training
// step of the char-LM spends half its time here as three framework ops); the backward reads the
// saved pre-activation h, recomputes gelu(h) and gelu'(h) in the same pass, and writes every
// gradient in one call. Phi comes from erf's rational-exponential approximation (Abramowitz &
// Stegun 7.1.26, |error| <= 1.5e-7, as LibTorch's vectorised erf): outputs agree with the exact
// definition (the double reference below) to fp32 round-off.
//
// Views: float32, 2-D (1-D for the biases), any row stride but unit column stride (the last dim
// contiguous); an optional argument is an undefined view (TensorView{}). Errors (strata::Error)
// name the argument, what was expected and what came. Threads: strata's (strata/threading.h). The
// backward's weight gradients are per-thread partial sums added in a fixed order: the same bits for
// the same inputs and thread count.
#pragma once
#include "strata/tensor.h"

namespace strata {

// y [rows x D] := the MLP of x; h [rows x H] (optional) := the pre-activation x W1^T + b1, which
// gelu_mlp_backward reads.
void gelu_mlp_forward(const TensorView& x, const TensorView& w1, const TensorView& b1, const TensorView& w2,
                      const TensorView& b2, const TensorView& y, const TensorView& h);

// From dy [rows x D] and the forward's x and h: dx [rows x D], dw1 [H x D], db1 [H], dw2 [D x H],
// db2 [D], each optional (undefined: not computed) and overwritten (not accumulated into).
void gelu_mlp_backward(const TensorView& dy, const TensorView& x, const TensorView& w1, const TensorView& w2,
                       const TensorView& h, const TensorView& dx, const TensorView& dw1, const TensorView& db1,
                       const TensorView& dw2, const TensorView& db2);

// ---- Double-precision reference: the definition, one row at a time (erf from <cmath>) ---------
namespace reference {
// y: rows * D doubles, h: rows * H doubles (contiguous). Inputs float32 or float64.
void gelu_mlp_forward(const TensorView& x, const TensorView& w1, const TensorView& b1, const TensorView& w2,
                      const TensorView& b2, double* y, double* h);
// Every gradient (contiguous doubles, sizes as above), from x, the weights and biases (h recomputed).
void gelu_mlp_backward(const TensorView& dy, const TensorView& x, const TensorView& w1, const TensorView& b1,
                       const TensorView& w2, double* dx, double* dw1, double* db1, double* dw2, double* db2);
}  // namespace reference

}  // namespace strata
