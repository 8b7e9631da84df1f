// torch/structured.cpp: the structured operators for LibTorch tensors (strata/torch/structured.h):
// tensors -> views (the checks are the core's), the spec's integer encoding for the ops, the
// autograd Function and StructuredLinear.
#include "strata/torch/structured.h"

#include <cmath>

#include "binding_util.h"
#include "op_calls.h"
#include "strata/torch/torch_ops.h"

namespace strata::torch {
namespace {

using ::torch::autograd::AutogradContext;
using ::torch::autograd::variable_list;
using binding::cat;

// x (..., in) as a rows x in view (a reshape that copies only when the leading dims cannot be
// flattened without one), plus the leading dims.
struct Rows {
  at::Tensor t;
  std::vector<int64_t> lead;
};
Rows rows_of(const char* where, const char* arg, const at::Tensor& x, int64_t width) {
  STRATA_CHECK_ARG(x.defined(), where, arg, "a defined tensor", "an undefined tensor");
  STRATA_CHECK_ARG(x.dim() >= 1 && x.size(-1) == width, where, arg, cat("a tensor (..., ", width, ")"),
                   cat(x.sizes()));
  Rows r;
  r.lead = x.sizes().vec();
  r.lead.pop_back();
  r.t = x.reshape({-1, width});
  return r;
}

std::vector<int64_t> with_last(std::vector<int64_t> lead, int64_t last) {
  lead.push_back(last);
  return lead;
}

std::vector<TensorView> factor_views(const char* where, const std::vector<at::Tensor>& f, const DTypes& dtypes) {
  std::vector<TensorView> v;
  for (size_t i = 0; i < f.size(); ++i) {
    const std::string arg = cat("factors[", i, "]");
    v.push_back(view_of(f[i], where, arg.c_str(), dtypes));
  }
  return v;
}

bool is_double(const at::Tensor& x) { return x.defined() && x.scalar_type() == at::kDouble; }

// The double reference for float64 inputs: y, and (backward) dx and the factors' gradients.
at::Tensor reference_forward(const StructuredSpec& spec, const at::Tensor& x, const std::vector<at::Tensor>& factors) {
  const char* where = "structured_linear";
  const Rows r = rows_of(where, "x", x, spec.in);
  const TensorView xv = view_of(r.t, where, "x", kReferenceDTypes);
  at::Tensor y = at::empty({r.t.size(0), spec.out}, x.options().dtype(at::kDouble));
  reference::structured_forward(spec, xv, factor_views(where, factors, kReferenceDTypes), y.data_ptr<double>());
  return y.reshape(with_last(r.lead, spec.out));
}

std::tuple<at::Tensor, std::vector<at::Tensor>> reference_backward(const StructuredSpec& spec, const at::Tensor& x,
                                                                   const std::vector<at::Tensor>& factors,
                                                                   const at::Tensor& dy) {
  const char* where = "structured_linear";
  const Rows r = rows_of(where, "x", x, spec.in), d = rows_of(where, "dy", dy, spec.out);
  at::Tensor dx = at::empty({r.t.size(0), spec.in}, x.options().dtype(at::kDouble));
  std::vector<std::vector<double>> df;
  reference::structured_backward(spec, view_of(r.t, where, "x", kReferenceDTypes),
                                 factor_views(where, factors, kReferenceDTypes),
                                 view_of(d.t.to(at::kDouble), where, "dy", kReferenceDTypes), dx.data_ptr<double>(), df);
  std::vector<at::Tensor> dfs;
  for (size_t i = 0; i < df.size(); ++i)
    dfs.push_back(at::tensor(df[i], x.options().dtype(at::kDouble)).reshape(factors[i].sizes()));
  return {dx.reshape(x.sizes()), dfs};
}

struct StructuredFunction : public ::torch::autograd::Function<StructuredFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, at::TensorList factors,
                            const StructuredSpec& spec) {
    std::vector<at::Tensor> f(factors.begin(), factors.end());
    at::Tensor y, z;  // z: the right stages' outputs, so that the backward does not recompute them
    if (is_double(x)) {
      y = reference_forward(spec, x, f);
    } else {
      std::tie(y, z) = op_calls::structured_forward_saving(spec, x, f);
    }
    variable_list saved{x, z};
    saved.insert(saved.end(), f.begin(), f.end());
    ctx->save_for_backward(saved);
    ctx->saved_data["spec"] = c10::IValue(encode_spec(spec));
    ctx->saved_data["alpha"] = c10::IValue(spec_alphas(spec));
    return y;
  }

  // grads[0]: d loss / d y. Returns (dx, one gradient per factor, nothing for the spec).
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list s = ctx->get_saved_variables();
    const at::Tensor &x = s[0], &z = s[1];
    const std::vector<at::Tensor> f(s.begin() + 2, s.end());
    const StructuredSpec spec = decode_spec("structured_linear", ctx->saved_data.at("spec").toIntVector(),
                                            ctx->saved_data.at("alpha").toDoubleVector());
    const bool need_dx = ctx->needs_input_grad(0);
    bool need_df = false;
    for (size_t i = 0; i < f.size(); ++i) need_df = need_df || ctx->needs_input_grad(i + 1);
    at::Tensor dx;
    std::vector<at::Tensor> df;
    if (is_double(x)) {
      std::tie(dx, df) = reference_backward(spec, x, f, grads[0]);
    } else {
      std::tie(dx, df) = op_calls::structured_backward(spec, x, f, grads[0], need_dx, need_df, z);
    }
    variable_list out{dx};
    for (size_t i = 0; i < f.size(); ++i) out.push_back(i < df.size() ? df[i] : at::Tensor());
    variable_list depends{x, grads[0]};
    depends.insert(depends.end(), f.begin(), f.end());
    out = binding::once_differentiable(out, depends, "structured_linear");
    out.emplace_back();  // the spec
    return out;
  }
};

}  // namespace

std::vector<int64_t> encode_spec(const StructuredSpec& spec) {
  std::vector<int64_t> v{spec.in, spec.out, int64_t(spec.levels.size())};
  for (const StructuredLevel& lv : spec.levels) {
    v.insert(v.end(), {lv.inner, int64_t(lv.right.kind), lv.right.blocks, int64_t(lv.left.kind), lv.left.blocks,
                       int64_t(lv.inner_perm.size()), int64_t(lv.out_perm.size())});
    v.insert(v.end(), lv.inner_perm.begin(), lv.inner_perm.end());
    v.insert(v.end(), lv.out_perm.begin(), lv.out_perm.end());
  }
  return v;
}

std::vector<double> spec_alphas(const StructuredSpec& spec) {
  std::vector<double> a;
  for (const StructuredLevel& lv : spec.levels) a.push_back(lv.alpha);
  return a;
}

StructuredSpec decode_spec(const char* where, const std::vector<int64_t>& v, const std::vector<double>& alpha) {
  const std::string bad = "an encoded spec (strata.structured's specs: [in, out, levels, per level: inner, "
                          "right kind, right blocks, left kind, left blocks, len(inner_perm), len(out_perm), perms])";
  STRATA_CHECK_ARG(v.size() >= 3 && v[2] >= 1 && v[2] <= 64, where, "spec", bad, cat(v.size(), " integers"));
  StructuredSpec s;
  s.in = v[0];
  s.out = v[1];
  const int64_t levels = v[2];
  STRATA_CHECK_ARG(int64_t(alpha.size()) == levels, where, "alpha", cat("one value per level (", levels, ")"),
                   cat(alpha.size(), " values"));
  size_t i = 3;
  for (int64_t l = 0; l < levels; ++l) {
    STRATA_CHECK_ARG(i + 7 <= v.size(), where, "spec", bad, cat("a list ending inside level ", l));
    StructuredLevel lv;
    lv.inner = v[i];
    STRATA_CHECK_ARG(v[i + 1] >= 0 && v[i + 1] <= 2 && v[i + 3] >= 0 && v[i + 3] <= 2, where, "spec",
                     "stage kinds 0 (blocks), 1 (shared) or 2 (identity)", cat(v[i + 1], " and ", v[i + 3]));
    lv.right = {StageKind(v[i + 1]), v[i + 2]};
    lv.left = {StageKind(v[i + 3]), v[i + 4]};
    const int64_t np = v[i + 5], no = v[i + 6];
    i += 7;
    STRATA_CHECK_ARG(np >= 0 && no >= 0 && int64_t(i) + np + no <= int64_t(v.size()), where, "spec", bad,
                     cat("permutation lengths ", np, ", ", no, " past the end of level ", l));
    lv.inner_perm.assign(v.begin() + int64_t(i), v.begin() + int64_t(i) + np);
    i += size_t(np);
    lv.out_perm.assign(v.begin() + int64_t(i), v.begin() + int64_t(i) + no);
    i += size_t(no);
    lv.alpha = alpha[size_t(l)];
    s.levels.push_back(std::move(lv));
  }
  STRATA_CHECK_ARG(i == v.size(), where, "spec", bad, cat(v.size() - i, " integers after the last level"));
  validate(where, s);
  return s;
}

namespace {
// y, and the saved right-stage outputs when `save`.
std::tuple<at::Tensor, at::Tensor> forward_impl(const char* where, const StructuredSpec& spec, const at::Tensor& x,
                                                const std::vector<at::Tensor>& factors, bool save) {
  validate(where, spec);
  const Rows r = rows_of(where, "x", x, spec.in);
  const TensorView xv = view_of(r.t, where, "x", kKernelDTypes);
  at::Tensor y = binding::with_huge_pages(at::empty({r.t.size(0), spec.out}, r.t.options())), saved;
  TensorView sv;
  if (save) {
    saved = binding::with_huge_pages(
        at::empty({structured_saved_size(spec, r.t.size(0))}, at::TensorOptions().dtype(at::kFloat)));
    sv = view_of(saved, where, "saved");
  }
  strata::structured_forward(spec, xv, factor_views(where, factors, kKernelDTypes), view_of(y, where, "y"), sv);
  return {y.reshape(with_last(r.lead, spec.out)), saved};
}
}  // namespace

at::Tensor structured_forward(const StructuredSpec& spec, const at::Tensor& x, const std::vector<at::Tensor>& factors) {
  return std::get<0>(forward_impl("structured_forward", spec, x, factors, false));
}

std::tuple<at::Tensor, at::Tensor> structured_forward_saving(const StructuredSpec& spec, const at::Tensor& x,
                                                             const std::vector<at::Tensor>& factors) {
  return forward_impl("structured_forward", spec, x, factors, true);
}

std::tuple<at::Tensor, std::vector<at::Tensor>> structured_backward(const StructuredSpec& spec, const at::Tensor& x,
                                                                    const std::vector<at::Tensor>& factors,
                                                                    const at::Tensor& dy, bool input_grad,
                                                                    bool factor_grads, const at::Tensor& saved) {
  const char* where = "structured_backward";
  validate(where, spec);
  const Rows r = rows_of(where, "x", x, spec.in), d = rows_of(where, "dy", dy, spec.out);
  STRATA_CHECK_ARG(d.lead == r.lead, where, "dy", cat("leading dims ", at::IntArrayRef(r.lead), " (x's)"),
                   at::IntArrayRef(d.lead));
  const TensorView xv = view_of(r.t, where, "x", kKernelDTypes);
  const DTypes same{xv.dtype};
  const TensorView dyv = view_of(d.t, where, "dy", same, " (same as x)");
  at::Tensor dx;
  TensorView dxv;
  if (input_grad) {
    dx = binding::with_huge_pages(at::empty({r.t.size(0), spec.in}, r.t.options()));
    dxv = view_of(dx, where, "dx");
  }
  std::vector<at::Tensor> df;
  std::vector<TensorView> dfv;
  if (factor_grads)
    for (const at::Tensor& f : factors) {
      df.push_back(at::empty(f.sizes(), f.options()));
      dfv.push_back(view_of(df.back(), where, "dfactors"));
    }
  const TensorView sv = saved.defined() ? view_of(saved, where, "saved") : TensorView{};
  strata::structured_backward(spec, xv, factor_views(where, factors, kKernelDTypes), dyv, dxv, dfv, sv);
  if (dx.defined()) dx = dx.reshape(x.sizes());
  return {dx, df};
}

at::Tensor structured_linear(const StructuredSpec& spec, const at::Tensor& x, const std::vector<at::Tensor>& factors) {
  if (takes_torch_ops(x)) return torch_ops::structured_linear(spec, x, factors);
  const char* where = "structured_linear";
  validate(where, spec);
  STRATA_CHECK_ARG(x.defined(), where, "x", "a defined tensor", "an undefined tensor");
  checked_dtype(x, where, "x", kReferenceDTypes);  // first, with this function's list (dtype only: fake tensors pass)
  bool grad = at::GradMode::is_enabled() && x.requires_grad();
  for (const at::Tensor& f : factors) grad = grad || (at::GradMode::is_enabled() && f.defined() && f.requires_grad());
  if (!grad) return is_double(x) ? reference_forward(spec, x, factors) : op_calls::structured_forward(spec, x, factors);
  return StructuredFunction::apply(x, at::TensorList(factors), spec);
}

at::Tensor structured_to_dense(const StructuredSpec& spec, const std::vector<at::Tensor>& factors) {
  const char* where = "structured_to_dense";
  validate(where, spec);
  const bool dbl = !factors.empty() && is_double(factors[0]);
  at::Tensor m = at::empty({spec.out, spec.in}, at::TensorOptions().dtype(dbl ? at::kDouble : at::kFloat));
  strata::structured_to_dense(spec, factor_views(where, factors, dbl ? kReferenceDTypes : kKernelDTypes),
                              view_of(m, where, "m"));
  return m;
}

// ---- StructuredLinear -------------------------------------------------------------------------

StructuredLinearImpl::StructuredLinearImpl(StructuredLinearOptions o) : options(std::move(o)) { reset(); }

void StructuredLinearImpl::reset() {
  validate("StructuredLinear", options.spec());
  factors.clear();
  const auto shapes = structured_factor_shapes(options.spec());
  for (size_t i = 0; i < shapes.size(); ++i)
    factors.push_back(register_parameter(cat("factor_", i), at::empty(shapes[i])));
  bias = options.bias() ? register_parameter("bias", at::empty({options.spec().out})) : at::Tensor();
  reset_parameters();
}

void StructuredLinearImpl::reset_parameters() {
  ::torch::NoGradGuard no_grad;
  const StructuredSpec& spec = options.spec();
  const double levels = double(spec.levels.size());
  size_t fi = 0;
  for (const StructuredLevel& lv : spec.levels) {
    for (int side = 0; side < 2; ++side) {
      const StructuredStage& st = side == 0 ? lv.right : lv.left;
      if (st.kind == StageKind::identity) continue;
      at::Tensor& f = factors[fi++];
      const double fan_in = double(side == 0 ? f.size(1) : f.size(2));
      const double bound = 1.0 / std::sqrt(fan_in * levels);
      f.uniform_(-bound, bound);
    }
  }
  if (bias.defined()) bias.uniform_(-1.0 / std::sqrt(double(spec.in)), 1.0 / std::sqrt(double(spec.in)));
}

at::Tensor StructuredLinearImpl::forward(const at::Tensor& x) {
  at::Tensor y = structured_linear(options.spec(), x, factors);
  return bias.defined() ? y + bias.to(y.scalar_type()) : y;
}

at::Tensor StructuredLinearImpl::dense_weight() const { return structured_to_dense(options.spec(), factors); }

void StructuredLinearImpl::pretty_print(std::ostream& stream) const {
  const StructuredSpec& s = options.spec();
  stream << "strata::StructuredLinear(" << s.name << ", in=" << s.in << ", out=" << s.out
         << ", levels=" << s.levels.size() << ", params=" << structured_params(s)
         << ", rank=" << structured_rank(s) << ", bias=" << (bias.defined() ? "true" : "false") << ")";
}

}  // namespace strata::torch
