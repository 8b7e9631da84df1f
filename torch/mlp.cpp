// torch/mlp.cpp: the fused GELU MLP for LibTorch tensors (strata/torch/mlp.h): tensors -> views
// (the checks are the core's), the autograd Function, the ATen-ops path for float64 and other
// devices.
#include "strata/torch/mlp.h"

#include <torch/autograd.h>

#include "binding_util.h"
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
  return b.defined() && b.dim() == 1 && b.numel() == 0 ? at::Tensor() : b;
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

// The same math as ATen ops (float64, other devices, and what the kernels are checked against).
at::Tensor aten_mlp(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& b1, const at::Tensor& w2,
                    const at::Tensor& b2, const MlpBlockArgs& blk) {
  const at::Tensor u =
      blk.ln_weight.defined() ? at::layer_norm(x, {x.size(-1)}, blk.ln_weight, blk.ln_bias, blk.eps) : x;
  const at::Tensor y = at::linear(at::gelu(at::linear(u, w1, b1)), w2, b2);
  return blk.residual ? x + y : y;
}

struct GeluMlpFunction : public ::torch::autograd::Function<GeluMlpFunction> {
  // ln_w_in, ln_b_in: the LayerNorm's weight and bias (kNoBias-style empty tensors for none).
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x_in, const at::Tensor& w1_in,
                            const at::Tensor& b1_in, const at::Tensor& w2_in, const at::Tensor& b2_in,
                            const at::Tensor& ln_w_in, const at::Tensor& ln_b_in, double eps, bool residual) {
    const char* where = "gelu_mlp";
    STRATA_CHECK_ARG(w1_in.defined() && w1_in.dim() == 2, where, "w1", "a 2-D tensor [hidden, width]",
                     w1_in.defined() ? cat(w1_in.sizes()) : std::string("an undefined tensor"));
    STRATA_CHECK_ARG(x_in.defined() && x_in.dim() >= 1 && x_in.size(-1) == w1_in.size(1), where, "x",
                     cat("a tensor (..., ", w1_in.size(1), ") (w1's width)"),
                     x_in.defined() ? cat(x_in.sizes()) : std::string("an undefined tensor"));
    const int64_t D = x_in.size(-1), H = w1_in.size(0);
    const at::Tensor x = as_rows(x_in, D), w1 = last_contiguous(w1_in), w2 = last_contiguous(w2_in),
                     b1 = last_contiguous(bias_or_none(b1_in)), b2 = last_contiguous(bias_or_none(b2_in));
    at::Tensor y = binding::with_huge_pages(at::empty({x.size(0), D}, x.options()));
    at::Tensor h = binding::with_huge_pages(at::empty({x.size(0), H}, x.options()));
    const at::Tensor ln_w = last_contiguous(bias_or_none(ln_w_in)), ln_b = last_contiguous(bias_or_none(ln_b_in));
    at::Tensor stats = ln_w.defined() ? at::empty({x.size(0), 2}, x.options()) : at::Tensor();
    const MlpBlock blk = block_of(where, ln_w, ln_b, eps, residual, stats);
    gelu_mlp_forward(view_of(x, where, "x", kF32), view_of(w1, where, "w1", kF32), optional_view(b1, where, "b1"),
                     view_of(w2, where, "w2", kF32), optional_view(b2, where, "b2"), view_of(y, where, "y"),
                     view_of(h, where, "h"), blk);
    ctx->save_for_backward({x, w1, w2, h, stats, ln_w, ln_b});
    ctx->saved_data["b1"] = b1.defined();
    ctx->saved_data["b2"] = b2.defined();
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["residual"] = residual;
    std::vector<int64_t> out_sizes = x_in.sizes().vec();
    return y.view(out_sizes);
  }

  // grads[0]: d loss / d y. Returns dx, dw1, db1, dw2, db2 (undefined where not needed).
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const char* where = "gelu_mlp (backward)";
    const variable_list s = ctx->get_saved_variables();
    const at::Tensor &x = s[0], &w1 = s[1], &w2 = s[2], &h = s[3], &stats = s[4], &ln_w = s[5], &ln_b = s[6];
    const MlpBlock blk =
        block_of(where, ln_w, ln_b, ctx->saved_data["eps"].toDouble(), ctx->saved_data["residual"].toBool(), stats);
    const int64_t D = x.size(1), H = w1.size(0);
    const std::vector<int64_t> x_sizes = grads[0].sizes().vec();
    const at::Tensor dy = as_rows(grads[0], D);
    const auto opt = x.options();
    auto maybe = [&](int i, at::IntArrayRef sizes) {
      return ctx->needs_input_grad(size_t(i)) ? binding::with_huge_pages(at::empty(sizes, opt)) : at::Tensor();
    };
    at::Tensor dx = maybe(0, {x.size(0), D}), dw1 = maybe(1, {H, D}), dw2 = maybe(3, {D, H});
    at::Tensor db1 = ctx->saved_data["b1"].toBool() ? maybe(2, {H}) : at::Tensor();
    at::Tensor db2 = ctx->saved_data["b2"].toBool() ? maybe(4, {D}) : at::Tensor();
    at::Tensor dln_w = ln_w.defined() ? maybe(5, {D}) : at::Tensor();
    at::Tensor dln_b = ln_b.defined() ? maybe(6, {D}) : at::Tensor();
    gelu_mlp_backward(view_of(dy, where, "dy", kF32), view_of(x, where, "x", kF32), view_of(w1, where, "w1", kF32),
                      view_of(w2, where, "w2", kF32), view_of(h, where, "h", kF32), optional_view(dx, where, "dx"),
                      optional_view(dw1, where, "dw1"), optional_view(db1, where, "db1"),
                      optional_view(dw2, where, "dw2"), optional_view(db2, where, "db2"), blk,
                      optional_view(dln_w, where, "dln_weight"), optional_view(dln_b, where, "dln_bias"));
    if (dx.defined()) dx = dx.view(x_sizes);
    variable_list out{dx, dw1, db1, dw2, db2, dln_w, dln_b};
    out = binding::once_differentiable(out, {x, w1, w2, h, ln_w, ln_b, grads[0]}, "gelu_mlp");
    out.emplace_back();  // eps
    out.emplace_back();  // residual
    return out;
  }
};

struct LnLinearFunction : public ::torch::autograd::Function<LnLinearFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x_in, const at::Tensor& w_in,
                            const at::Tensor& b_in, const at::Tensor& ln_w_in, const at::Tensor& ln_b_in, double eps) {
    const char* where = "ln_linear";
    const int64_t D = x_in.size(-1), H = w_in.size(0);
    const at::Tensor x = as_rows(x_in, D), w = last_contiguous(w_in), b = last_contiguous(bias_or_none(b_in));
    const at::Tensor ln_w = last_contiguous(bias_or_none(ln_w_in)), ln_b = last_contiguous(bias_or_none(ln_b_in));
    at::Tensor stats = ln_w.defined() ? at::empty({x.size(0), 2}, x.options()) : at::Tensor();
    at::Tensor y = binding::with_huge_pages(at::empty({x.size(0), H}, x.options()));
    ln_linear_forward(view_of(x, where, "x", kF32), view_of(w, where, "w", kF32), optional_view(b, where, "b"),
                      view_of(y, where, "y"), block_of(where, ln_w, ln_b, eps, false, stats));
    ctx->save_for_backward({x, w, stats, ln_w, ln_b});
    ctx->saved_data["b"] = b.defined();
    ctx->saved_data["eps"] = eps;
    std::vector<int64_t> sizes = x_in.sizes().vec();
    sizes.back() = H;
    return y.view(sizes);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const char* where = "ln_linear (backward)";
    const variable_list s = ctx->get_saved_variables();
    const at::Tensor &x = s[0], &w = s[1], &stats = s[2], &ln_w = s[3], &ln_b = s[4];
    const int64_t D = x.size(1), H = w.size(0);
    std::vector<int64_t> x_sizes = grads[0].sizes().vec();
    x_sizes.back() = D;
    const at::Tensor dy = as_rows(grads[0], H);
    const auto opt = x.options();
    auto maybe = [&](int i, at::IntArrayRef sizes) {
      return ctx->needs_input_grad(size_t(i)) ? binding::with_huge_pages(at::empty(sizes, opt)) : at::Tensor();
    };
    at::Tensor dx = maybe(0, {x.size(0), D}), dw = maybe(1, {H, D});
    at::Tensor db = ctx->saved_data["b"].toBool() ? maybe(2, {H}) : at::Tensor();
    at::Tensor dln_w = ln_w.defined() ? maybe(3, {D}) : at::Tensor();
    at::Tensor dln_b = ln_b.defined() ? maybe(4, {D}) : at::Tensor();
    ln_linear_backward(view_of(dy, where, "dy", kF32), view_of(x, where, "x", kF32), view_of(w, where, "w", kF32),
                       optional_view(dx, where, "dx"), optional_view(dw, where, "dw"), optional_view(db, where, "db"),
                       block_of(where, ln_w, ln_b, ctx->saved_data["eps"].toDouble(), false, stats),
                       optional_view(dln_w, where, "dln_weight"), optional_view(dln_b, where, "dln_bias"));
    if (dx.defined()) dx = dx.view(x_sizes);
    variable_list out{dx, dw, db, dln_w, dln_b};
    out = binding::once_differentiable(out, {x, w, ln_w, ln_b, grads[0]}, "ln_linear");
    out.emplace_back();  // eps
    return out;
  }
};

}  // namespace

at::Tensor gelu_mlp(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& b1, const at::Tensor& w2,
                    const at::Tensor& b2, const MlpBlockArgs& block) {
  const bool kernel = x.defined() && x.device().is_cpu() && x.scalar_type() == at::kFloat;
  if (!kernel) {
    const char* where = "gelu_mlp";
    STRATA_CHECK_ARG(x.defined(), where, "x", "a defined tensor", "an undefined tensor");
    STRATA_CHECK_ARG(x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble, where, "x",
                     "dtype float32 (the kernels) or float64 (ATen ops)", cat(x.scalar_type()));
    return aten_mlp(x, w1, b1, w2, b2, block);
  }
  // A given bias of the wrong size is an error here, before an empty one could pass for kNoBias.
  const char* where = "gelu_mlp";
  STRATA_CHECK_ARG(w1.defined() && w1.dim() == 2 && w1.size(0) >= 1, where, "w1", "a 2-D tensor [hidden >= 1, width]",
                   w1.defined() ? cat(w1.sizes()) : std::string("an undefined tensor"));
  STRATA_CHECK_ARG(!b1.defined() || (b1.dim() == 1 && b1.size(0) == w1.size(0)), where, "b1",
                   cat("a 1-D tensor [", w1.size(0), "] (w1's hidden) or none"), cat(b1.sizes()));
  STRATA_CHECK_ARG(!b2.defined() || (b2.dim() == 1 && b2.size(0) == w1.size(1)), where, "b2",
                   cat("a 1-D tensor [", w1.size(1), "] (w1's width) or none"), cat(b2.sizes()));
  const at::Tensor &lw = block.ln_weight, &lb = block.ln_bias;
  STRATA_CHECK_ARG(!lw.defined() || (lw.dim() == 1 && lw.size(0) == w1.size(1)), where, "ln_weight",
                   cat("a 1-D tensor [", w1.size(1), "] (w1's width) or none"), cat(lw.sizes()));
  STRATA_CHECK_ARG(!lb.defined() || (lw.defined() && lb.dim() == 1 && lb.size(0) == w1.size(1)), where, "ln_bias",
                   cat("a 1-D tensor [", w1.size(1), "] (w1's width) with ln_weight, or none"), cat(lb.sizes()));
  const at::Tensor none = at::empty({0}, x.options());
  return GeluMlpFunction::apply(x, w1, b1.defined() ? b1 : none, w2, b2.defined() ? b2 : none, lw.defined() ? lw : none,
                                lb.defined() ? lb : none, block.eps, block.residual);
}

at::Tensor ln_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, const MlpBlockArgs& block) {
  const char* where = "ln_linear";
  STRATA_CHECK_ARG(x.defined(), where, "x", "a defined tensor", "an undefined tensor");
  STRATA_CHECK_ARG(w.defined() && w.dim() == 2 && w.size(0) >= 1, where, "w", "a 2-D tensor [out >= 1, width]",
                   w.defined() ? cat(w.sizes()) : std::string("an undefined tensor"));
  STRATA_CHECK_ARG(x.dim() >= 1 && x.size(-1) == w.size(1), where, "x",
                   cat("a tensor (..., ", w.size(1), ") (w's width)"), cat(x.sizes()));
  STRATA_CHECK_ARG(!block.residual, where, "block.residual", "false (the output's width is w's out)", "true");
  STRATA_CHECK_ARG(!b.defined() || (b.dim() == 1 && b.size(0) == w.size(0)), where, "b",
                   cat("a 1-D tensor [", w.size(0), "] (w's out) or none"), cat(b.sizes()));
  const at::Tensor &lw = block.ln_weight, &lb = block.ln_bias;
  STRATA_CHECK_ARG(!lw.defined() || (lw.dim() == 1 && lw.size(0) == w.size(1)), where, "ln_weight",
                   cat("a 1-D tensor [", w.size(1), "] (w's width) or none"), cat(lw.sizes()));
  STRATA_CHECK_ARG(!lb.defined() || (lw.defined() && lb.dim() == 1 && lb.size(0) == w.size(1)), where, "ln_bias",
                   cat("a 1-D tensor [", w.size(1), "] (w's width) with ln_weight, or none"), cat(lb.sizes()));
  if (!(x.device().is_cpu() && x.scalar_type() == at::kFloat)) {
    STRATA_CHECK_ARG(x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble, where, "x",
                     "dtype float32 (the kernels) or float64 (ATen ops)", cat(x.scalar_type()));
    const at::Tensor u = lw.defined() ? at::layer_norm(x, {x.size(-1)}, lw, lb, block.eps) : x;
    return at::linear(u, w, b);
  }
  const at::Tensor none = at::empty({0}, x.options());
  return LnLinearFunction::apply(x, w, b.defined() ? b : none, lw.defined() ? lw : none, lb.defined() ? lb : none,
                                 block.eps);
}

}  // namespace strata::torch
