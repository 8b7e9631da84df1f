// src/cpu/mlp.cpp: the public fused GELU MLP entry points: argument checks (every error names the
// argument), TensorView -> MlpParams, ISA dispatch. Semantics: strata/mlp.h.
#include "strata/mlp.h"

#include <cmath>
#include <string>

#include "cpu/mlp_params.h"
#include "strata/checks.h"

namespace strata {
namespace {

using detail::cat;

// A float32 matrix argument [rows x cols] with a contiguous last dim (any row stride).
void check_matrix(const char* where, const char* arg, const TensorView& t, int64_t rows, int64_t cols,
                  const char* why) {
  STRATA_CHECK_ARG(t.ndim == 2 && t.shape[0] == rows && t.shape[1] == cols, where, arg,
                   cat("a 2-D tensor [", rows, ", ", cols, "] ", why), t.shape_str());
  STRATA_CHECK_ARG(t.dtype == DType::f32, where, arg, "dtype float32", dtype_name(t.dtype));
  STRATA_CHECK_ARG(t.stride[1] == 1 || cols <= 1, where, arg, "a contiguous last dim (column stride 1)",
                   cat("column stride ", t.stride[1]));
  STRATA_CHECK_ARG(t.data != nullptr || rows * cols == 0, where, arg, "data", "a null pointer");
}
// An optional float32 vector [n] (contiguous).
void check_vector(const char* where, const char* arg, const TensorView& t, int64_t n, const char* why) {
  STRATA_CHECK_ARG(t.ndim == 1 && t.shape[0] == n, where, arg, cat("a 1-D tensor [", n, "] ", why), t.shape_str());
  STRATA_CHECK_ARG(t.dtype == DType::f32, where, arg, "dtype float32", dtype_name(t.dtype));
  STRATA_CHECK_ARG(t.stride[0] == 1 || n <= 1, where, arg, "a contiguous tensor", cat("stride ", t.stride[0]));
  STRATA_CHECK_ARG(t.data != nullptr || n == 0, where, arg, "data", "a null pointer");
}
// An output: as check_matrix, and no two elements sharing memory.
void check_out_matrix(const char* where, const char* arg, const TensorView& t, int64_t rows, int64_t cols,
                      const char* why) {
  check_matrix(where, arg, t, rows, cols, why);
  check_no_overlap(where, arg, t);
}

// x's and the weights' sizes: rows, D (from x), H (from w1); w2 and the biases must agree.
struct MlpSizes {
  int64_t rows, D, H;
};
// x and the first layer's weight w (named `w_arg`; [H x D], H >= 1): their sizes.
MlpSizes check_first_layer(const char* where, const TensorView& x, const TensorView& w, const char* w_arg,
                           const char* w_why) {
  STRATA_CHECK_ARG(x.ndim == 2, where, "x", "a 2-D tensor [rows, width]", x.shape_str());
  STRATA_CHECK_ARG(x.shape[1] >= 1, where, "x", "width (last dim) >= 1", x.shape_str());
  STRATA_CHECK_ARG(w.ndim == 2 && w.shape[0] >= 1, where, w_arg, "a 2-D tensor [out >= 1, width]", w.shape_str());
  const MlpSizes s{x.shape[0], x.shape[1], w.shape[0]};
  check_matrix(where, "x", x, s.rows, s.D, "(rows, width)");
  check_matrix(where, w_arg, w, s.H, s.D, w_why);
  return s;
}
MlpSizes check_inputs(const char* where, const TensorView& x, const TensorView& w1, const TensorView& w2) {
  const MlpSizes s = check_first_layer(where, x, w1, "w1", "(hidden, x's width): fc.weight");
  check_matrix(where, "w2", w2, s.D, s.H, "(x's width, w1's hidden): proj.weight");
  return s;
}
// An optional weight gradient [rows x cols], contiguous.
void check_weight_grad(const char* where, const char* arg, const TensorView& t, int64_t rows, int64_t cols,
                       const char* why) {
  if (!given(t)) return;
  check_out_matrix(where, arg, t, rows, cols, why);
  STRATA_CHECK_ARG(t.stride[0] == cols, where, arg, "a contiguous tensor", cat("row stride ", t.stride[0]));
}

// The block's parts: checked, into p. `forward`: stats is written (else read).
void set_block(const char* where, const MlpSizes& s, const MlpBlock& blk, cpu::MlpParams& p) {
  p.residual = blk.residual;
  if (!given(blk.ln_weight)) {
    STRATA_CHECK_ARG(!given(blk.ln_bias), where, "block.ln_bias", "none without block.ln_weight", "a tensor");
    return;
  }
  check_vector(where, "block.ln_weight", blk.ln_weight, s.D, "(x's width)");
  if (given(blk.ln_bias)) check_vector(where, "block.ln_bias", blk.ln_bias, s.D, "(x's width)");
  STRATA_CHECK_ARG(std::isfinite(blk.eps) && blk.eps >= 0.f, where, "block.eps", "a finite value >= 0", blk.eps);
  check_matrix(where, "block.stats", blk.stats, s.rows, 2, "(x's rows; mean, rstd)");
  STRATA_CHECK_ARG(blk.stats.stride[0] == 2 || s.rows <= 1, where, "block.stats", "a contiguous tensor",
                   cat("row stride ", blk.stats.stride[0]));
  p.ln_w = static_cast<const float*>(blk.ln_weight.data);
  p.ln_b = given(blk.ln_bias) ? static_cast<const float*>(blk.ln_bias.data) : nullptr;
  p.ln_eps = blk.eps;
  p.stats = static_cast<float*>(blk.stats.data);
}

// The LayerNorm's weight and bias gradients of a backward (after set_block): checked, into p.
void set_ln_grads(const char* where, const MlpSizes& s, const TensorView& dln_weight, const TensorView& dln_bias,
                  cpu::MlpParams& p) {
  STRATA_CHECK_ARG(p.ln_w || (!given(dln_weight) && !given(dln_bias)), where, "dln_weight",
                   "none without block.ln_weight", "a tensor");
  if (given(dln_weight)) check_vector(where, "dln_weight", dln_weight, s.D, "(x's width)");
  if (given(dln_bias)) check_vector(where, "dln_bias", dln_bias, s.D, "(x's width)");
  p.dln_w = given(dln_weight) ? static_cast<float*>(dln_weight.data) : nullptr;
  p.dln_b = given(dln_bias) ? static_cast<float*>(dln_bias.data) : nullptr;
}

cpu::MlpParams params_of(const MlpSizes& s, const TensorView& x, const TensorView& w1, const TensorView& w2) {
  cpu::MlpParams p;
  p.rows = s.rows;
  p.width = s.D;
  p.hidden = s.H;
  p.x = static_cast<const float*>(x.data);
  p.x_rs = x.stride[0];
  p.w1 = static_cast<const float*>(w1.data);
  p.w1_rs = w1.stride[0];
  p.w2 = static_cast<const float*>(w2.data);
  p.w2_rs = w2.stride[0];
  return p;
}

}  // namespace

void gelu_mlp_forward(const TensorView& x, const TensorView& w1, const TensorView& b1, const TensorView& w2,
                      const TensorView& b2, const TensorView& y, const TensorView& h, const MlpBlock& block) {
  const char* where = "gelu_mlp_forward";
  const MlpSizes s = check_inputs(where, x, w1, w2);
  if (given(b1)) check_vector(where, "b1", b1, s.H, "(w1's hidden)");
  if (given(b2)) check_vector(where, "b2", b2, s.D, "(x's width)");
  check_out_matrix(where, "y", y, s.rows, s.D, "(x's rows and width)");
  if (given(h)) check_out_matrix(where, "h", h, s.rows, s.H, "(x's rows, w1's hidden)");
  cpu::MlpParams p = params_of(s, x, w1, w2);
  p.b1 = given(b1) ? static_cast<const float*>(b1.data) : nullptr;
  p.b2 = given(b2) ? static_cast<const float*>(b2.data) : nullptr;
  p.y = static_cast<float*>(y.data);
  p.y_rs = y.stride[0];
  if (given(h)) {
    p.h = static_cast<float*>(h.data);
    p.h_rs = h.stride[0];
  }
  set_block(where, s, block, p);
  if (p.stats) check_no_overlap(where, "block.stats", block.stats);
  STRATA_ACTIVE_KERNELS(kMlpKernels).forward(p);
}

void gelu_mlp_backward(const TensorView& dy, const TensorView& x, const TensorView& w1, const TensorView& w2,
                       const TensorView& h, const TensorView& dx, const TensorView& dw1, const TensorView& db1,
                       const TensorView& dw2, const TensorView& db2, const MlpBlock& block,
                       const TensorView& dln_weight, const TensorView& dln_bias) {
  const char* where = "gelu_mlp_backward";
  const MlpSizes s = check_inputs(where, x, w1, w2);
  check_matrix(where, "dy", dy, s.rows, s.D, "(x's rows and width)");
  check_matrix(where, "h", h, s.rows, s.H, "(x's rows, w1's hidden): gelu_mlp_forward's pre-activation");
  if (given(dx)) check_out_matrix(where, "dx", dx, s.rows, s.D, "(like x)");
  check_weight_grad(where, "dw1", dw1, s.H, s.D, "(like w1)");
  check_weight_grad(where, "dw2", dw2, s.D, s.H, "(like w2)");
  if (given(db1)) check_vector(where, "db1", db1, s.H, "(w1's hidden)");
  if (given(db2)) check_vector(where, "db2", db2, s.D, "(x's width)");
  cpu::MlpParams p = params_of(s, x, w1, w2);
  p.dy = static_cast<const float*>(dy.data);
  p.dy_rs = dy.stride[0];
  p.h = static_cast<float*>(h.data);
  p.h_rs = h.stride[0];
  auto out = [](const TensorView& t) { return given(t) ? static_cast<float*>(t.data) : nullptr; };
  p.dx = out(dx);
  p.dx_rs = given(dx) ? dx.stride[0] : 0;
  p.dw1 = out(dw1);
  p.db1 = out(db1);
  p.dw2 = out(dw2);
  p.db2 = out(db2);
  set_block(where, s, block, p);
  set_ln_grads(where, s, dln_weight, dln_bias, p);
  STRATA_ACTIVE_KERNELS(kMlpKernels).backward(p);
}

void ln_linear_forward(const TensorView& x, const TensorView& w, const TensorView& b, const TensorView& y,
                       const MlpBlock& block) {
  const char* where = "ln_linear_forward";
  const MlpSizes s = check_first_layer(where, x, w, "w", "(out, x's width)");
  if (given(b)) check_vector(where, "b", b, s.H, "(w's out)");
  check_out_matrix(where, "y", y, s.rows, s.H, "(x's rows, w's out)");
  STRATA_CHECK_ARG(!block.residual, where, "block.residual", "false (y's width is w's out, not x's)", "true");
  cpu::MlpParams p = params_of(s, x, w, w);
  p.linear_only = true;
  p.b1 = given(b) ? static_cast<const float*>(b.data) : nullptr;
  p.h = static_cast<float*>(y.data);
  p.h_rs = y.stride[0];
  set_block(where, s, block, p);
  if (p.stats) check_no_overlap(where, "block.stats", block.stats);
  STRATA_ACTIVE_KERNELS(kMlpKernels).forward(p);
}

void ln_linear_backward(const TensorView& dy, const TensorView& x, const TensorView& w, const TensorView& dx,
                        const TensorView& dw, const TensorView& db, const MlpBlock& block, const TensorView& dln_weight,
                        const TensorView& dln_bias) {
  const char* where = "ln_linear_backward";
  const MlpSizes s = check_first_layer(where, x, w, "w", "(out, x's width)");
  check_matrix(where, "dy", dy, s.rows, s.H, "(x's rows, w's out)");
  STRATA_CHECK_ARG(!block.residual, where, "block.residual", "false (y's width is w's out, not x's)", "true");
  if (given(dx)) check_out_matrix(where, "dx", dx, s.rows, s.D, "(like x)");
  check_weight_grad(where, "dw", dw, s.H, s.D, "(like w)");
  if (given(db)) check_vector(where, "db", db, s.H, "(w's out)");
  cpu::MlpParams p = params_of(s, x, w, w);
  p.linear_only = true;
  p.dy = static_cast<const float*>(dy.data);
  p.dy_rs = dy.stride[0];
  auto out = [](const TensorView& t) { return given(t) ? static_cast<float*>(t.data) : nullptr; };
  p.dx = out(dx);
  p.dx_rs = given(dx) ? dx.stride[0] : 0;
  p.dw1 = out(dw);
  p.db1 = out(db);
  set_block(where, s, block, p);
  set_ln_grads(where, s, dln_weight, dln_bias, p);
  STRATA_ACTIVE_KERNELS(kMlpKernels).backward(p);
}

}  // namespace strata
