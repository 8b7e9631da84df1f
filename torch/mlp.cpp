// torch/mlp.cpp: the fused GELU MLP and LayerNorm + linear for LibTorch tensors (strata/torch/mlp.h):
// the kernel functions (tensors -> views; shape checks here, the rest the core's), the autograd
// Functions over them (called through the dispatcher: torch/op_calls.h), the ATen-ops path for
// float64 and other devices.
#include "strata/torch/mlp.h"

#include <torch/autograd.h>

#include "binding_util.h"
#include "op_calls.h"
#include "strata/mlp.h"
#include "strata/torch/view_of.h"

namespace strata::torch {
namespace {

using binding::cat;
using ::torch::autograd::AutogradContext;
using ::torch::autograd::variable_list;

const DTypes kF32{DType::f32};

// A rows x cols view of t (..., cols) whose last dim is contiguous (a reshape, copying only when
// the leading dims do not flatten or the last dim is strided).
at::Tensor as_rows(const at::Tensor& t, int64_t cols) {
  at::Tensor r = t.reshape({-1, cols});
  return r.stride(1) == 1 || cols <= 1 ? r : r.contiguous();
}
// A weight or bias with a contiguous last dim.
at::Tensor last_contiguous(const at::Tensor& t) {
  return !t.defined() || t.dim() == 0 || t.stride(-1) == 1 || t.size(-1) <= 1 ? t : t.contiguous();
}
// Function::apply takes no undefined tensors (this LibTorch records every input's device): an
// absent bias travels as an empty tensor (gelu_mlp's kNoBias) and is undefined again here.
at::Tensor bias_or_none(const at::Tensor& b) {
  // sym_numel: a guard under torch.compile's symbolic shapes, where numel() would throw
  return b.defined() && b.dim() == 1 && b.sym_numel() == 0 ? at::Tensor() : b;
}
TensorView optional_view(const at::Tensor& t, const char* where, const char* arg) {
  return t.defined() ? view_of(t, where, arg, kF32) : TensorView{};
}
MlpBlock block_of(const char* where, const at::Tensor& ln_w, const at::Tensor& ln_b, double eps, bool residual,
                  const at::Tensor& stats) {
  MlpBlock b;
  b.ln_weight = optional_view(ln_w, where, "ln_weight");
  b.ln_bias = optional_view(ln_b, where, "ln_bias");
  b.eps = float(eps);
  b.residual = residual;
  if (stats.defined()) b.stats = view_of(stats, where, "stats");
  return b;
}

std::string sizes_or_undefined(const at::Tensor& t) {
  return t.defined() ? cat(t.sym_sizes()) : std::string("an undefined tensor");
}

// The LayerNorm's weight and bias, when given, over `width` features (`whose`: where it comes from).
void check_ln(const char* where, const MlpBlockArgs& block, int64_t width, const char* whose) {
  const at::Tensor &lw = block.ln_weight, &lb = block.ln_bias;
  STRATA_CHECK_ARG(!lw.defined() || (lw.dim() == 1 && lw.size(0) == width), where, "ln_weight",
                   cat("a 1-D tensor [", width, "] (", whose, ") or none"), cat(lw.sym_sizes()));
  STRATA_CHECK_ARG(!lb.defined() || (lw.defined() && lb.dim() == 1 && lb.size(0) == width), where, "ln_bias",
                   cat("a 1-D tensor [", width, "] (", whose, ") with ln_weight, or none"), cat(lb.sym_sizes()));
}

// gelu_mlp's arguments: w1 [H x D], x (..., D), b1 [H] / b2 [D] or none, the LayerNorm's over D.
// (w2's shape and every dtype are the core's checks.) A given bias of the wrong size is an error
// here, before an empty one could pass for the autograd Function's kNoBias.
void check_mlp(const char* where, const at::Tensor& x, const at::Tensor& w1, const at::Tensor& b1, const at::Tensor& b2,
               const MlpBlockArgs& block) {
  STRATA_CHECK_ARG(w1.defined() && w1.dim() == 2 && w1.size(0) >= 1, where, "w1", "a 2-D tensor [hidden >= 1, width]",
                   sizes_or_undefined(w1));
  STRATA_CHECK_ARG(x.defined() && x.dim() >= 1 && x.size(-1) == w1.size(1), where, "x",
                   cat("a tensor (..., ", w1.size(1), ") (w1's width)"), sizes_or_undefined(x));
  STRATA_CHECK_ARG(!b1.defined() || (b1.dim() == 1 && b1.size(0) == w1.size(0)), where, "b1",
                   cat("a 1-D tensor [", w1.size(0), "] (w1's hidden) or none"), cat(b1.sym_sizes()));
  STRATA_CHECK_ARG(!b2.defined() || (b2.dim() == 1 && b2.size(0) == w1.size(1)), where, "b2",
                   cat("a 1-D tensor [", w1.size(1), "] (w1's width) or none"), cat(b2.sym_sizes()));
  check_ln(where, block, w1.size(1), "w1's width");
}

// ln_linear's arguments: w [H x D], x (..., D), b [H] or none, the LayerNorm's over D, no residual.
void check_ln_linear(const char* where, const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                     const MlpBlockArgs& block) {
  STRATA_CHECK_ARG(w.defined() && w.dim() == 2 && w.size(0) >= 1, where, "w", "a 2-D tensor [out >= 1, width]",
                   sizes_or_undefined(w));
  STRATA_CHECK_ARG(x.defined() && x.dim() >= 1 && x.size(-1) == w.size(1), where, "x",
                   cat("a tensor (..., ", w.size(1), ") (w's width)"), sizes_or_undefined(x));
  STRATA_CHECK_ARG(!block.residual, where, "block.residual", "false (the output's width is w's out)", "true");
  STRATA_CHECK_ARG(!b.defined() || (b.dim() == 1 && b.size(0) == w.size(0)), where, "b",
                   cat("a 1-D tensor [", w.size(0), "] (w's out) or none"), cat(b.sym_sizes()));
  check_ln(where, block, w.size(1), "w's width");
}

// A backward's dy: `want` sizes (the forward's output's).
void check_dy(const char* where, const at::Tensor& dy, at::IntArrayRef want) {
  STRATA_CHECK_ARG(dy.defined() && dy.sizes() == want, where, "dy", cat("a tensor ", want, " (the output's sizes)"),
                   sizes_or_undefined(dy));
}

// The forward's stats for a backward: rows x 2 with a LayerNorm (undefined without one).
at::Tensor checked_stats(const char* where, const at::Tensor& stats, const MlpBlockArgs& block, int64_t rows) {
  if (!block.ln_weight.defined()) return at::Tensor();
  STRATA_CHECK_ARG(stats.defined() && stats.dim() == 2 && stats.size(0) == rows && stats.size(1) == 2, where, "stats",
                   cat("a tensor [", rows, ", 2] (the forward's LayerNorm stats)"), sizes_or_undefined(stats));
  return stats;
}

// The same math as ATen ops (float64, other devices, and what the kernels are checked against).
at::Tensor aten_mlp(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& b1, const at::Tensor& w2,
                    const at::Tensor& b2, const MlpBlockArgs& blk) {
  const at::Tensor u =
      blk.ln_weight.defined() ? at::layer_norm(x, {x.size(-1)}, blk.ln_weight, blk.ln_bias, blk.eps) : x;
  const at::Tensor y = at::linear(at::gelu(at::linear(u, w1, b1)), w2, b2);
  return blk.residual ? x + y : y;
}

// The options of a block whose LayerNorm tensors travelled as kNoBias-style empty tensors.
MlpBlockArgs block_args(const at::Tensor& ln_w, const at::Tensor& ln_b, double eps, bool residual) {
  return {bias_or_none(ln_w), bias_or_none(ln_b), eps, residual};
}
MlpBlockArgs load_block(AutogradContext* ctx, const at::Tensor& ln_w, const at::Tensor& ln_b) {
  return block_args(ln_w, ln_b, ctx->saved_data["eps"].toDouble(), ctx->saved_data["residual"].toBool());
}

struct GeluMlpFunction : public ::torch::autograd::Function<GeluMlpFunction> {
  // b1, b2, ln_w, ln_b: kNoBias-style empty tensors for none.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w1, const at::Tensor& b1,
                            const at::Tensor& w2, const at::Tensor& b2, const at::Tensor& ln_w, const at::Tensor& ln_b,
                            double eps, bool residual) {
    const MlpBlockArgs blk = block_args(ln_w, ln_b, eps, residual);
    auto [y, h, stats] = op_calls::gelu_mlp_forward(x, w1, bias_or_none(b1), w2, bias_or_none(b2), blk);
    ctx->save_for_backward({x, w1, w2, h, stats, blk.ln_weight, blk.ln_bias});
    ctx->saved_data["b1"] = bias_or_none(b1).defined();
    ctx->saved_data["b2"] = bias_or_none(b2).defined();
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["residual"] = residual;
    return y;
  }

  // grads[0]: d loss / d y. Returns dx, dw1, db1, dw2, db2, dln_w, dln_b (undefined where not needed).
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list s = ctx->get_saved_variables();
    const at::Tensor &x = s[0], &w1 = s[1], &w2 = s[2], &h = s[3], &stats = s[4], &ln_w = s[5], &ln_b = s[6];
    auto needs = [&](size_t i) { return ctx->needs_input_grad(i); };
    const std::array<bool, 7> mask{needs(0),
                                   needs(1),
                                   ctx->saved_data["b1"].toBool() && needs(2),
                                   needs(3),
                                   ctx->saved_data["b2"].toBool() && needs(4),
                                   ln_w.defined() && needs(5),
                                   ln_b.defined() && needs(6)};
    const std::array<at::Tensor, 7> g =
        op_calls::gelu_mlp_backward(grads[0], x, w1, w2, h, stats, load_block(ctx, ln_w, ln_b), mask);
    variable_list out(g.begin(), g.end());
    out = binding::once_differentiable(out, {x, w1, w2, h, ln_w, ln_b, grads[0]}, "gelu_mlp");
    out.emplace_back();  // eps
    out.emplace_back();  // residual
    return out;
  }
};

struct LnLinearFunction : public ::torch::autograd::Function<LnLinearFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                            const at::Tensor& ln_w, const at::Tensor& ln_b, double eps) {
    const MlpBlockArgs blk = block_args(ln_w, ln_b, eps, false);
    auto [y, stats] = op_calls::ln_linear_forward(x, w, bias_or_none(b), blk);
    ctx->save_for_backward({x, w, stats, blk.ln_weight, blk.ln_bias});
    ctx->saved_data["b"] = bias_or_none(b).defined();
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["residual"] = false;
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list s = ctx->get_saved_variables();
    const at::Tensor &x = s[0], &w = s[1], &stats = s[2], &ln_w = s[3], &ln_b = s[4];
    auto needs = [&](size_t i) { return ctx->needs_input_grad(i); };
    const std::array<bool, 5> mask{needs(0), needs(1), ctx->saved_data["b"].toBool() && needs(2),
                                   ln_w.defined() && needs(3), ln_b.defined() && needs(4)};
    const std::array<at::Tensor, 5> g =
        op_calls::ln_linear_backward(grads[0], x, w, stats, load_block(ctx, ln_w, ln_b), mask);
    variable_list out(g.begin(), g.end());
    out = binding::once_differentiable(out, {x, w, ln_w, ln_b, grads[0]}, "ln_linear");
    out.emplace_back();  // eps
    return out;
  }
};

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> gelu_mlp_forward(const at::Tensor& x_in, const at::Tensor& w1_in,
                                                                const at::Tensor& b1_in, const at::Tensor& w2_in,
                                                                const at::Tensor& b2_in, const MlpBlockArgs& block) {
  const char* where = "gelu_mlp_forward";
  check_mlp(where, x_in, w1_in, b1_in, b2_in, block);
  const int64_t D = x_in.size(-1), H = w1_in.size(0);
  const at::Tensor x = as_rows(x_in, D), w1 = last_contiguous(w1_in), w2 = last_contiguous(w2_in),
                   b1 = last_contiguous(b1_in), b2 = last_contiguous(b2_in);
  const at::Tensor ln_w = last_contiguous(block.ln_weight), ln_b = last_contiguous(block.ln_bias);
  at::Tensor y = binding::with_huge_pages(at::empty({x.size(0), D}, x.options()));
  at::Tensor h = binding::with_huge_pages(at::empty({x.size(0), H}, x.options()));
  at::Tensor stats = ln_w.defined() ? at::empty({x.size(0), 2}, x.options()) : at::Tensor();
  // Views in argument order (a call's arguments are evaluated in no set order): the first bad one is named.
  const TensorView xv = view_of(x, where, "x", kF32), w1v = view_of(w1, where, "w1", kF32),
                   b1v = optional_view(b1, where, "b1"), w2v = view_of(w2, where, "w2", kF32),
                   b2v = optional_view(b2, where, "b2");
  const MlpBlock blk = block_of(where, ln_w, ln_b, block.eps, block.residual, stats);
  gelu_mlp_forward(xv, w1v, b1v, w2v, b2v, view_of(y, where, "y"), view_of(h, where, "h"), blk);
  return {y.view(x_in.sizes()), h, stats.defined() ? stats : at::empty({0}, x.options())};
}

std::array<at::Tensor, 7> gelu_mlp_backward(const at::Tensor& dy_in, const at::Tensor& x_in, const at::Tensor& w1_in,
                                            const at::Tensor& w2_in, const at::Tensor& h, const at::Tensor& stats_in,
                                            const MlpBlockArgs& block, std::array<bool, 7> mask) {
  const char* where = "gelu_mlp_backward";
  check_mlp(where, x_in, w1_in, at::Tensor(), at::Tensor(), block);
  check_dy(where, dy_in, x_in.sizes());
  const int64_t D = x_in.size(-1), H = w1_in.size(0);
  const at::Tensor x = as_rows(x_in, D), dy = as_rows(dy_in, D), w1 = last_contiguous(w1_in),
                   w2 = last_contiguous(w2_in);
  const at::Tensor ln_w = last_contiguous(block.ln_weight), ln_b = last_contiguous(block.ln_bias);
  const at::Tensor stats = checked_stats(where, stats_in, block, x.size(0));
  const auto opt = x.options();
  auto maybe = [&](bool want, at::IntArrayRef sizes) {
    return want ? binding::with_huge_pages(at::empty(sizes, opt)) : at::Tensor();
  };
  at::Tensor dx = maybe(mask[0], {x.size(0), D}), dw1 = maybe(mask[1], {H, D}), db1 = maybe(mask[2], {H}),
             dw2 = maybe(mask[3], {D, H}), db2 = maybe(mask[4], {D});
  at::Tensor dln_w = maybe(mask[5] && ln_w.defined(), {D}), dln_b = maybe(mask[6] && ln_b.defined(), {D});
  const TensorView dyv = view_of(dy, where, "dy", kF32), xv = view_of(x, where, "x", kF32),
                   w1v = view_of(w1, where, "w1", kF32), w2v = view_of(w2, where, "w2", kF32),
                   hv = view_of(h, where, "h", kF32);
  const MlpBlock blk = block_of(where, ln_w, ln_b, block.eps, block.residual, stats);
  gelu_mlp_backward(dyv, xv, w1v, w2v, hv, optional_view(dx, where, "dx"), optional_view(dw1, where, "dw1"),
                    optional_view(db1, where, "db1"), optional_view(dw2, where, "dw2"),
                    optional_view(db2, where, "db2"), blk, optional_view(dln_w, where, "dln_weight"),
                    optional_view(dln_b, where, "dln_bias"));
  if (dx.defined()) dx = dx.view(x_in.sizes());
  return {dx, dw1, db1, dw2, db2, dln_w, dln_b};
}

std::tuple<at::Tensor, at::Tensor> ln_linear_forward(const at::Tensor& x_in, const at::Tensor& w_in,
                                                     const at::Tensor& b_in, const MlpBlockArgs& block) {
  const char* where = "ln_linear_forward";
  check_ln_linear(where, x_in, w_in, b_in, block);
  const int64_t D = x_in.size(-1), H = w_in.size(0);
  const at::Tensor x = as_rows(x_in, D), w = last_contiguous(w_in), b = last_contiguous(b_in);
  const at::Tensor ln_w = last_contiguous(block.ln_weight), ln_b = last_contiguous(block.ln_bias);
  at::Tensor stats = ln_w.defined() ? at::empty({x.size(0), 2}, x.options()) : at::Tensor();
  at::Tensor y = binding::with_huge_pages(at::empty({x.size(0), H}, x.options()));
  const TensorView xv = view_of(x, where, "x", kF32), wv = view_of(w, where, "w", kF32),
                   bv = optional_view(b, where, "b");
  const MlpBlock blk = block_of(where, ln_w, ln_b, block.eps, false, stats);
  ln_linear_forward(xv, wv, bv, view_of(y, where, "y"), blk);
  std::vector<int64_t> sizes = x_in.sizes().vec();
  sizes.back() = H;
  return {y.view(sizes), stats.defined() ? stats : at::empty({0}, x.options())};
}

std::array<at::Tensor, 5> ln_linear_backward(const at::Tensor& dy_in, const at::Tensor& x_in, const at::Tensor& w_in,
                                             const at::Tensor& stats_in, const MlpBlockArgs& block,
                                             std::array<bool, 5> mask) {
  const char* where = "ln_linear_backward";
  check_ln_linear(where, x_in, w_in, at::Tensor(), block);
  const int64_t D = x_in.size(-1), H = w_in.size(0);
  std::vector<int64_t> y_sizes = x_in.sizes().vec();
  y_sizes.back() = H;
  check_dy(where, dy_in, y_sizes);
  const at::Tensor x = as_rows(x_in, D), dy = as_rows(dy_in, H), w = last_contiguous(w_in);
  const at::Tensor ln_w = last_contiguous(block.ln_weight), ln_b = last_contiguous(block.ln_bias);
  const at::Tensor stats = checked_stats(where, stats_in, block, x.size(0));
  const auto opt = x.options();
  auto maybe = [&](bool want, at::IntArrayRef sizes) {
    return want ? binding::with_huge_pages(at::empty(sizes, opt)) : at::Tensor();
  };
  at::Tensor dx = maybe(mask[0], {x.size(0), D}), dw = maybe(mask[1], {H, D}), db = maybe(mask[2], {H});
  at::Tensor dln_w = maybe(mask[3] && ln_w.defined(), {D}), dln_b = maybe(mask[4] && ln_b.defined(), {D});
  const TensorView dyv = view_of(dy, where, "dy", kF32), xv = view_of(x, where, "x", kF32),
                   wv = view_of(w, where, "w", kF32);
  const MlpBlock blk = block_of(where, ln_w, ln_b, block.eps, false, stats);
  ln_linear_backward(dyv, xv, wv, optional_view(dx, where, "dx"), optional_view(dw, where, "dw"),
                     optional_view(db, where, "db"), blk, optional_view(dln_w, where, "dln_weight"),
                     optional_view(dln_b, where, "dln_bias"));
  if (dx.defined()) dx = dx.view(x_in.sizes());
  return {dx, dw, db, dln_w, dln_b};
}

at::Tensor gelu_mlp(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& b1, const at::Tensor& w2,
                    const at::Tensor& b2, const MlpBlockArgs& block) {
  const char* where = "gelu_mlp";
  check_mlp(where, x, w1, b1, b2, block);
  if (!(x.device().is_cpu() && x.scalar_type() == at::kFloat)) {
    STRATA_CHECK_ARG(x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble, where, "x",
                     "dtype float32 (the kernels) or float64 (ATen ops)", cat(x.scalar_type()));
    return aten_mlp(x, w1, b1, w2, b2, block);
  }
  const at::Tensor none = at::empty({0}, x.options());
  auto or_none = [&](const at::Tensor& t) { return t.defined() ? t : none; };
  return GeluMlpFunction::apply(x, w1, or_none(b1), w2, or_none(b2), or_none(block.ln_weight), or_none(block.ln_bias),
                                block.eps, block.residual);
}

at::Tensor ln_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, const MlpBlockArgs& block) {
  const char* where = "ln_linear";
  check_ln_linear(where, x, w, b, block);
  if (!(x.device().is_cpu() && x.scalar_type() == at::kFloat)) {
    STRATA_CHECK_ARG(x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble, where, "x",
                     "dtype float32 (the kernels) or float64 (ATen ops)", cat(x.scalar_type()));
    const at::Tensor u =
        block.ln_weight.defined() ? at::layer_norm(x, {x.size(-1)}, block.ln_weight, block.ln_bias, block.eps) : x;
    return at::linear(u, w, b);
  }
  const at::Tensor none = at::empty({0}, x.options());
  auto or_none = [&](const at::Tensor& t) { return t.defined() ? t : none; };
  return LnLinearFunction::apply(x, w, or_none(b), or_none(block.ln_weight), or_none(block.ln_bias), block.eps);
}

}  // namespace strata::torch
