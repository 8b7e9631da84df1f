// src/cpu/mlp_params.h: the POD parameter struct of the fused GELU MLP kernels,
//   y = [x +] gelu(u W1^T + b1) W2^T + b2,  u = LN(x) or x   (a transformer block's feed-forward
//   half with its pre-LayerNorm and residual optional; exact erf GELU).
// Filled by src/cpu/mlp.cpp after validation; read by every ISA variant of the kernel. Rows are
// tokens; every matrix is fp32 with unit column stride and the row stride given (elements).
#pragma once
#include <cstdint>

#include "core/dispatch.h"
#include "cpu/attention_params.h"  // Strided4 (core/rows.inc reads it)
#include "strata/tensor.h"

namespace strata::cpu {

struct MlpParams {
  int64_t rows = 0, width = 0, hidden = 0;  // tokens, D (in = out features), H (hidden features)
  const float* x = nullptr;                 // rows x D
  int64_t x_rs = 0;
  const float* w1 = nullptr;  // H x D (fc.weight: out x in), rows w1_rs apart
  int64_t w1_rs = 0;
  const float* b1 = nullptr;  // H, or null
  const float* w2 = nullptr;  // D x H (proj.weight), rows w2_rs apart
  int64_t w2_rs = 0;
  const float* b2 = nullptr;  // D, or null
  // forward: y (rows x D), and the pre-activation h = x W1^T + b1 (rows x H) when h is given (the
  // backward's saved state); backward: h read, not written.
  float* y = nullptr;
  int64_t y_rs = 0;
  float* h = nullptr;
  int64_t h_rs = 0;
  // The block's optional pre-LayerNorm over D (the MLP reads LN(x)) and residual (out = x + MLP):
  // ln_w null: no LayerNorm. stats: rows x 2 (mean, rstd) per row, written by the forward and read
  // by the backward when the LayerNorm is on.
  const float* ln_w = nullptr;  // D
  const float* ln_b = nullptr;  // D, or null
  float ln_eps = 1e-5f;
  float* stats = nullptr;
  bool residual = false;
  // The first layer alone (ln_linear_forward / _backward): the forward writes h = u W1^T + b1 to h
  // and stops; the backward reads dy as dh (rows x H) and gives dx, dw1, db1, dln_w, dln_b.
  bool linear_only = false;
  float* dln_w = nullptr;  // D (backward, optional)
  float* dln_b = nullptr;  // D (backward, optional)
  // backward: dy in; each gradient out is optional (null: not computed) and overwritten.
  const float* dy = nullptr;  // rows x D
  int64_t dy_rs = 0;
  float* dx = nullptr;  // rows x D
  int64_t dx_rs = 0;
  float* dw1 = nullptr;  // H x D, contiguous
  float* db1 = nullptr;  // H
  float* dw2 = nullptr;  // D x H, contiguous
  float* db2 = nullptr;  // D
};

// The family's entry points, one table per ISA (src/cpu/kernels/mlp.inc defines it; dispatch:
// src/core/dispatch.h).
struct MlpKernels {
  void (*forward)(const MlpParams& p);
  void (*backward)(const MlpParams& p);
};
STRATA_PER_ISA(extern const MlpKernels kMlpKernels;)

}  // namespace strata::cpu
