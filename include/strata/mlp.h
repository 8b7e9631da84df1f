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
//
// A transformer block's MLP half can come in whole: MlpBlock's pre-LayerNorm (over D) and residual,
//   out = [x +] MLP(LN(x)),  LN(x) = (x - mean) / sqrt(var + eps) * ln_weight + ln_bias,
// so that a pre-LN block's ln2, MLP and residual add are one call each way.
#pragma once
#include "strata/tensor.h"

namespace strata {

// The optional parts of a block's MLP half around the MLP (default: none, out = MLP(x)).
struct MlpBlock {
  TensorView ln_weight;   // [D]: given, the MLP reads LN(x) (a LayerNorm over the width)
  TensorView ln_bias;     // [D] or none
  float eps = 1e-5f;      // the LayerNorm's
  TensorView stats;       // with ln_weight: [rows x 2] float32 (mean, rstd of each row), contiguous;
                          // written by the forward, read by the backward
  bool residual = false;  // out = x + MLP(...)
};

// y [rows x D] := the MLP of x (with `block`'s parts); h [rows x H] (optional) := the pre-activation
// u W1^T + b1 (u = LN(x) or x), which gelu_mlp_backward reads, as it reads block.stats.
void gelu_mlp_forward(const TensorView& x, const TensorView& w1, const TensorView& b1, const TensorView& w2,
                      const TensorView& b2, const TensorView& y, const TensorView& h, const MlpBlock& block = {});

// From dy [rows x D] and the forward's x, h and block (the same parts, stats as written): dx
// [rows x D], dw1 [H x D], db1 [H], dw2 [D x H], db2 [D], dln_weight, dln_bias [D] (with a
// LayerNorm), each optional (undefined: not computed) and overwritten (not accumulated into).
void gelu_mlp_backward(const TensorView& dy, const TensorView& x, const TensorView& w1, const TensorView& w2,
                       const TensorView& h, const TensorView& dx, const TensorView& dw1, const TensorView& db1,
                       const TensorView& dw2, const TensorView& db2, const MlpBlock& block = {},
                       const TensorView& dln_weight = {}, const TensorView& dln_bias = {});

// The first layer alone with the block's LayerNorm, y [rows x H] := LN(x) W^T + b (w [H x D], b [H]
// optional; block.residual must be false): a pre-LN block's ln1 and fused q/k/v projection in one
// call each way. The backward gives dx, dw, db, dln_weight, dln_bias (each optional) from dy
// [rows x H] and the forward's x and block.stats.
void ln_linear_forward(const TensorView& x, const TensorView& w, const TensorView& b, const TensorView& y,
                       const MlpBlock& block);
void ln_linear_backward(const TensorView& dy, const TensorView& x, const TensorView& w, const TensorView& dx,
                        const TensorView& dw, const TensorView& db, const MlpBlock& block,
                        const TensorView& dln_weight = {}, const TensorView& dln_bias = {});

// ---- Double-precision reference: the definition, one row at a time (erf from <cmath>) ---------
namespace reference {
// y: rows * D doubles, h: rows * H doubles (contiguous; h may be null). Inputs float32 or float64;
// block's stats unused (the reference recomputes everything).
void gelu_mlp_forward(const TensorView& x, const TensorView& w1, const TensorView& b1, const TensorView& w2,
                      const TensorView& b2, double* y, double* h, const MlpBlock& block = {});
// Every gradient (contiguous doubles, sizes as above; dln_weight, dln_bias: D each, zeros without a
// LayerNorm), from x, the weights and biases (h recomputed).
void gelu_mlp_backward(const TensorView& dy, const TensorView& x, const TensorView& w1, const TensorView& b1,
                       const TensorView& w2, double* dx, double* dw1, double* db1, double* dw2, double* db2,
                       const MlpBlock& block = {}, double* dln_weight = nullptr, double* dln_bias = nullptr);
// ln_linear: y rows * H; dx rows * D, dw H * D, db H, dln_weight, dln_bias D (zeros without a LayerNorm).
void ln_linear_forward(const TensorView& x, const TensorView& w, const TensorView& b, double* y, const MlpBlock& block);
void ln_linear_backward(const TensorView& dy, const TensorView& x, const TensorView& w, double* dx, double* dw,
                        double* db, const MlpBlock& block, double* dln_weight, double* dln_bias);
}  // namespace reference

}  // namespace strata
