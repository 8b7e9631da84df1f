// torch/monarch.cpp: the LibTorch binding of MonarchAttention. Checks devices, dtypes and shapes
// (every error names the argument, expected and got), allocates out / state / gradients, wraps
// at::Tensor as strata::TensorView (no copies) and calls the torch-free core
// (include/strata/monarch.h). Also the float64 reference path (strata::reference checks little
// itself, so the core's checks run in front of it), the autograd Function and the FLOP count.
#include "strata/torch/monarch.h"

#include <torch/autograd.h>

#include <cmath>

#include "binding_util.h"
#include "op_calls.h"
#include "options.h"
#include "strata/error.h"
#include "strata/torch/torch_ops.h"

namespace strata::torch {
namespace {

using binding::cat;
using binding::QkvViews;
using binding::qkv_views;
using binding::sizes_in;

constexpr int64_t kMaxSteps = 1024;  // num_steps bound (see make_options)

}  // namespace

MonarchOptions binding::monarch_options(const char* where, const MonarchArgs& a, bool any_device) {
  MonarchOptions o;
  o.num_steps = a.num_steps;
  o.block_size = a.block_size;
  o.pad = a.pad;  // checked by the core's validate
  o.mode = a.mode;
  o.layout = binding::parse_layout(where, a.layout);
  o.compute = parse_compute(where, a.compute);
  // A bound, so that a typo (2**40) is an error rather than a run that never ends: the paper's
  // results use 1-3 steps, and each step costs about one pass of block attention.
  STRATA_CHECK_ARG(a.num_steps >= 1 && a.num_steps <= kMaxSteps, where, "num_steps", cat(">= 1 and <= ", kMaxSteps),
                   a.num_steps);
  STRATA_CHECK_ARG(a.block_size >= 0, where, "block_size", ">= 1, or 0 for floor(sqrt(seq))", a.block_size);
  if (a.scale.has_value()) {
    const double s = *a.scale;
    STRATA_CHECK_ARG(std::isfinite(s) && std::isfinite(float(s)), where, "scale",
                     "a finite float32 value (or None for 1/sqrt(head_dim))", s);
    o.scale = float(s);
  }
  if (a.key_padding_mask.has_value() && a.key_padding_mask->defined())
    o.key_padding_mask = binding::mask_view_of(*a.key_padding_mask, where, "key_padding_mask", any_device);
  return o;
}

namespace {

// The kernels' and the reference's conversion (a CPU mask only).
MonarchOptions make_options(const char* where, const MonarchArgs& a) { return binding::monarch_options(where, a); }

// q, k, v as views checked by the core (self-attention), and the options validated for them.
QkvViews checked_views(const char* where, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       const MonarchOptions& o, const DTypes& dtypes) {
  const QkvViews in = qkv_views(where, q, k, v, o.layout, dtypes, /*self_attention=*/true);
  validate(where, o, in.d);
  return in;
}

// The state tensor of a forward: batch x heads_q x (T-1) x (M*B) x head_dim float32. A state
// larger than memory (num_steps = 2^40, say) is an error naming num_steps, not the allocator's.
at::Tensor empty_state(const char* where, const AttnDims& d, const MonarchOptions& o) {
  const MonarchGeometry g = monarch_geometry(d.seqlen_q, o);
  const std::vector<int64_t> sizes = {d.batch, d.heads_q, o.num_steps - 1, g.padded_len, d.head_dim};
  binding::check_fits_in_memory(where, "num_steps", sizes, sizeof(float),
                                "the state saved for the backward (batch x heads x (num_steps-1) x M*B x head_dim "
                                "float32)",
                                o.num_steps);
  return binding::with_huge_pages(at::empty(sizes, at::TensorOptions().dtype(at::kFloat).device(at::kCPU)));
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> monarch_attention_forward(const at::Tensor& q, const at::Tensor& k,
                                                             const at::Tensor& v, const MonarchArgs& a,
                                                             bool save_state) {
  const char* where = "monarch_attention_forward";
  const MonarchOptions opt = make_options(where, a);
  const QkvViews in = checked_views(where, q, k, v, opt, kKernelDTypes);
  const AttnDims& d = in.d;
  // out: batch x seq x heads_q x head_dim_v (in q's layout and memory order)
  at::Tensor out = binding::empty_in_order_of(q, sizes_in(opt.layout, d.batch, d.seqlen_q, d.heads_q, d.head_dim_v),
                                              q.scalar_type());
  at::Tensor state = save_state ? empty_state(where, d, opt) : at::Tensor();
  strata::monarch_attention_forward(in.q, in.k, in.v, view_of(out, where, "out"),
                                    save_state ? view_of(state, where, "state") : TensorView{}, opt);
  return {out, state};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> monarch_attention_backward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& state,
    const at::Tensor& dout, const MonarchArgs& a) {
  const char* where = "monarch_attention_backward";
  const MonarchOptions opt = make_options(where, a);
  const QkvViews in = checked_views(where, q, k, v, opt, kKernelDTypes);
  const TensorView sv = state.defined() ? view_of(state, where, "state") : TensorView{};
  const TensorView gv = view_of(dout, where, "dout");
  // dq, dk, dv: shapes, dtypes and memory order of q, k, v
  at::Tensor dq = binding::empty_grad_like(q), dk = binding::empty_grad_like(k), dv = binding::empty_grad_like(v);
  strata::monarch_attention_backward(in.q, in.k, in.v, sv, gv, view_of(dq, where, "dq"), view_of(dk, where, "dk"),
                                     view_of(dv, where, "dv"), opt);
  return {dq, dk, dv};
}

at::Tensor reference_monarch_attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                               const MonarchArgs& a) {
  const char* where = "reference_monarch_attention_forward";
  const MonarchOptions opt = make_options(where, a);
  const QkvViews in = checked_views(where, q, k, v, opt, kReferenceDTypes);
  const AttnDims& d = in.d;
  at::Tensor out = binding::empty_reference_out(opt.layout, d.batch, d.seqlen_q, d.heads_q, d.head_dim_v);
  reference::monarch_attention_forward(in.q, in.k, in.v, opt, out.data_ptr<double>());
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> reference_monarch_attention_backward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& dout, const MonarchArgs& a) {
  const char* where = "reference_monarch_attention_backward";
  const MonarchOptions opt = make_options(where, a);
  const QkvViews in = checked_views(where, q, k, v, opt, kReferenceDTypes);
  const AttnDims& d = in.d;
  const TensorView gview = view_of(dout, where, "dout", DTypes{in.q.dtype}, " (same as q)");
  check_4d(where, "dout", gview, opt.layout, in.q.dtype, d.batch, d.seqlen_q, d.heads_q, d.head_dim_v,
           "(shape of out)");
  at::Tensor gq = binding::empty_reference_out(opt.layout, d.batch, d.seqlen_q, d.heads_q, d.head_dim);
  at::Tensor gk = binding::empty_reference_out(opt.layout, d.batch, d.seqlen_k, d.heads_kv, d.head_dim);
  at::Tensor gv = binding::empty_reference_out(opt.layout, d.batch, d.seqlen_k, d.heads_kv, d.head_dim_v);
  reference::monarch_attention_backward(in.q, in.k, in.v, gview, opt, gq.data_ptr<double>(), gk.data_ptr<double>(),
                                        gv.data_ptr<double>());
  return {gq, gk, gv};
}

// ---- autograd ------------------------------------------------------------------------------------
namespace {

using ::torch::autograd::AutogradContext;
using ::torch::autograd::variable_list;

void save_options(AutogradContext* ctx, const MonarchArgs& a) {
  ctx->saved_data["num_steps"] = a.num_steps;
  ctx->saved_data["block_size"] = a.block_size;
  ctx->saved_data["pad"] = int64_t(a.pad);
  ctx->saved_data["mode"] = int64_t(a.mode);
  ctx->saved_data["scale"] = a.scale.has_value() ? c10::IValue(*a.scale) : c10::IValue();
  ctx->saved_data["layout"] = a.layout;
  ctx->saved_data["compute"] = a.compute;  // the backward op gets the forward's (it computes in fp32)
}

MonarchArgs load_options(AutogradContext* ctx, const at::Tensor& key_padding_mask) {
  MonarchArgs a;
  a.num_steps = ctx->saved_data.at("num_steps").toInt();
  a.block_size = ctx->saved_data.at("block_size").toInt();
  a.pad = MonarchPad(ctx->saved_data.at("pad").toInt());
  a.mode = MonarchMode(ctx->saved_data.at("mode").toInt());
  const c10::IValue& scale = ctx->saved_data.at("scale");
  if (!scale.isNone()) a.scale = scale.toDouble();
  a.layout = ctx->saved_data.at("layout").toStringRef();
  a.compute = ctx->saved_data.at("compute").toStringRef();
  if (key_padding_mask.defined()) a.key_padding_mask = key_padding_mask;
  return a;
}

struct MonarchFunction : public ::torch::autograd::Function<MonarchFunction> {
  // q, k, v in a.layout; returns out: batch x seq x heads_q x head_dim_v.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const MonarchArgs& a) {
    at::Tensor out, state;  // state stays undefined on the float64 path (the reference recomputes)
    if (q.defined() && q.scalar_type() == at::kDouble)
      out = reference_monarch_attention_forward(q, k, v, a);
    else
      std::tie(out, state) = op_calls::monarch_attention_forward(q, k, v, a, /*save_state=*/true);
    ctx->save_for_backward({q, k, v, state, a.key_padding_mask.value_or(at::Tensor())});
    save_options(ctx, a);
    return out;
  }

  // grads[0]: d loss / d out. Returns (dq, dk, dv, nothing for the options).
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list s = ctx->get_saved_variables();
    const at::Tensor &q = s[0], &k = s[1], &v = s[2], &state = s[3];
    const MonarchArgs a = load_options(ctx, s[4]);
    const at::Tensor& dout = grads[0];  // materialised by the engine; may be expanded (any strides)
    at::Tensor dq, dk, dv;
    if (q.scalar_type() == at::kDouble)
      std::tie(dq, dk, dv) = reference_monarch_attention_backward(q, k, v, dout, a);
    else
      std::tie(dq, dk, dv) = op_calls::monarch_attention_backward(q, k, v, state, dout, a);
    variable_list out = binding::once_differentiable({dq, dk, dv}, {q, k, v, grads[0]}, "monarch_attention");
    out.emplace_back();  // no gradient for the options
    return out;
  }
};

}  // namespace

at::Tensor monarch_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const MonarchArgs& a) {
  if (takes_torch_ops(q)) return torch_ops::monarch_attention(q, k, v, a);
  // q's dtype first, with this function's list (the kernel's own check would omit float64).
  STRATA_CHECK_ARG(q.defined(), "monarch_attention", "q", "a defined tensor", "an undefined tensor");
  checked_dtype(q, "monarch_attention", "q", kReferenceDTypes);  // first, with this function's list (not the data:
                                                                 // torch.compile's fake tensors pass)
  // Inference (no grad needed): the forward alone, without the saved state.
  const bool grad = at::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad());
  if (!grad && !(q.defined() && q.scalar_type() == at::kDouble))
    return std::get<0>(op_calls::monarch_attention_forward(q, k, v, a, /*save_state=*/false));
  return MonarchFunction::apply(q, k, v, a);
}

MonarchPad parse_monarch_pad(const char* where, std::string_view s) {
  if (s == "post") return MonarchPad::post;
  if (s == "pre") return MonarchPad::pre;
  throw_arg(where, "pad", "\"post\" or \"pre\"", cat("\"", s, "\""));
}

MonarchMode parse_monarch_mode(const char* where, std::string_view s) {
  if (s == "stable") return MonarchMode::stable;
  if (s == "reference") return MonarchMode::reference;
  throw_arg(where, "mode", "\"stable\" or \"reference\"", cat("\"", s, "\""));
}

double monarch_attention_flops(int64_t N, int64_t heads, int64_t D, int64_t Dv, int64_t T, int64_t B) {
  const char* where = "monarch_attention_flops";
  // The arguments under Python's names first; the count is the core's.
  STRATA_CHECK_ARG(N >= 0, where, "N", ">= 0", N);
  STRATA_CHECK_ARG(heads >= 0, where, "heads", ">= 0", heads);
  STRATA_CHECK_ARG(D >= 0, where, "D", ">= 0", D);
  STRATA_CHECK_ARG(Dv >= 0, where, "Dv", ">= 0", Dv);
  STRATA_CHECK_ARG(T >= 1, where, "T", ">= 1", T);
  STRATA_CHECK_ARG(B >= 0, where, "B", ">= 1, or 0 for floor(sqrt(N))", B);
  AttnDims d;
  d.batch = 1;
  d.seqlen_q = d.seqlen_k = N;
  d.heads_q = d.heads_kv = heads;
  d.head_dim = D;
  d.head_dim_v = Dv;
  MonarchOptions o;
  o.num_steps = T;
  o.block_size = B;
  return ::strata::monarch_attention_flops(d, o);
}

}  // namespace strata::torch
