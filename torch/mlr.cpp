// torch/mlr.cpp: the LibTorch binding of MLR attention. Checks devices, dtypes and shapes (every
// error names the argument, expected and got), turns MlrArgs into strata::MlrOptions (segment
// lists as int64 pointers, kept alive for the call), allocates outputs, wraps at::Tensor as
// strata::TensorView (no copies) and calls the torch-free core (include/strata/mlr.h).
// Also here: the float64 reference path (strata::reference checks nothing, so the same checks
// run in front of it) and MlrFunction, the autograd Function behind mlr_attention().
#include "strata/torch/mlr.h"

#include <torch/autograd.h>

#include <array>
#include <cstring>

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
using binding::torch_dtype_name;

// A defined optional tensor, or an undefined one.
at::Tensor defined_or_empty(const std::optional<at::Tensor>& t) {
  return t.has_value() && t->defined() ? *t : at::Tensor();
}

// Checks that t is a 1-D int64 tensor (on the CPU unless any_device); returns it contiguous on the CPU.
at::Tensor int64_list(const char* where, const char* arg, const at::Tensor& t, bool any_device) {
  if (!any_device)
    STRATA_CHECK_ARG(t.device().is_cpu(), where, arg, "a CPU tensor", cat("a tensor on ", t.device().str()));
  STRATA_CHECK_ARG(t.layout() == at::kStrided, where, arg, "a strided (dense) tensor", cat("layout ", t.layout()));
  STRATA_CHECK_ARG(t.dim() == 1, where, arg, "a 1-D tensor", cat(t.dim(), "-D ", t.sizes()));
  STRATA_CHECK_ARG(t.scalar_type() == at::kLong, where, arg, "dtype int64", torch_dtype_name(t));
  return t.to(at::kCPU).contiguous();
}

}  // namespace

binding::MlrResolved binding::mlr_options(const char* where, const MlrArgs& a, Layout l, int64_t batch,
                                          bool any_device) {
  MlrResolved r;
  MlrOptions& o = r.opt;
  const int64_t L = int64_t(a.ranks.size());
  STRATA_CHECK_ARG(L >= 1 && L <= MlrOptions::kMaxLevels, where, "ranks",
                   cat("1..", MlrOptions::kMaxLevels, " ranks r_1..r_L (one per level)"), cat(L, " ranks"));
  o.num_levels = int(L);
  std::copy(a.ranks.begin(), a.ranks.end(), o.ranks);
  STRATA_CHECK_ARG(a.block_sizes.empty() || int64_t(a.block_sizes.size()) == L, where, "block_sizes",
                   cat("empty (default blocks) or ", L, " sizes (one per rank)"), cat(a.block_sizes.size(), " sizes"));
  std::copy(a.block_sizes.begin(), a.block_sizes.end(), o.block_sizes);
  o.context = a.context;
  if (const at::Tensor s = defined_or_empty(a.segment_starts); s.defined()) {
    r.segment_starts = int64_list(where, "segment_starts", s, any_device);
    o.segment_starts = r.segment_starts.numel() > 0 ? r.segment_starts.data_ptr<int64_t>() : nullptr;
    o.num_segment_starts = r.segment_starts.numel();
  }
  if (const at::Tensor s = defined_or_empty(a.segment_offsets); s.defined()) {
    r.segment_offsets = int64_list(where, "segment_offsets", s, any_device);
    STRATA_CHECK_ARG(r.segment_offsets.numel() == batch + 1, where, "segment_offsets",
                     cat(batch + 1, " offsets (batch + 1)"), cat(r.segment_offsets.numel(), " offsets"));
    o.segment_offsets = r.segment_offsets.data_ptr<int64_t>();
    o.num_segment_offsets = r.segment_offsets.numel();
  }
  o.mask_cross_segment = a.mask_cross_segment;
  if (a.scale == "inv_rank")
    o.scale = MlrScale::inv_rank;
  else if (a.scale == "inv_sqrt_head_dim")
    o.scale = MlrScale::inv_sqrt_head_dim;
  else
    throw_arg(where, "scale", "\"inv_rank\" or \"inv_sqrt_head_dim\"", cat("\"", a.scale, "\""));
  o.divide_by_num_levels = a.divide_by_num_levels;
  o.level_average = a.level_average;
  o.causal = a.causal;
  o.layout = l;
  o.compute = parse_compute(where, a.compute);
  return r;
}

namespace {

using ResolvedOptions = binding::MlrResolved;

// The kernels' and the reference's conversion (CPU tensors only).
ResolvedOptions make_options(const char* where, const MlrArgs& a, Layout l, int64_t batch) {
  return binding::mlr_options(where, a, l, batch);
}

// ---- autograd ----------------------------------------------------------------------------------

using ::torch::autograd::AutogradContext;
using ::torch::autograd::variable_list;

// Stores the non-tensor options in ctx (the segment tensors go through save_for_backward).
void save_options(AutogradContext* ctx, const MlrArgs& a) {
  ctx->saved_data["ranks"] = a.ranks;
  ctx->saved_data["block_sizes"] = a.block_sizes;
  ctx->saved_data["context"] = a.context;
  ctx->saved_data["mask_cross_segment"] = a.mask_cross_segment;
  ctx->saved_data["scale"] = a.scale;
  ctx->saved_data["divide_by_num_levels"] = a.divide_by_num_levels;
  ctx->saved_data["level_average"] = a.level_average;
  ctx->saved_data["causal"] = a.causal;
  ctx->saved_data["layout"] = a.layout;
  ctx->saved_data["compute"] = a.compute;  // the backward computes as the forward was asked to
}

// Rebuilds the forward's MlrArgs from ctx and the saved (possibly undefined) segment tensors.
MlrArgs load_options(AutogradContext* ctx, const at::Tensor& segment_starts, const at::Tensor& segment_offsets) {
  MlrArgs a;
  a.ranks = ctx->saved_data.at("ranks").toIntVector();
  a.block_sizes = ctx->saved_data.at("block_sizes").toIntVector();
  a.context = ctx->saved_data.at("context").toInt();
  a.mask_cross_segment = ctx->saved_data.at("mask_cross_segment").toBool();
  a.scale = ctx->saved_data.at("scale").toStringRef();
  a.divide_by_num_levels = ctx->saved_data.at("divide_by_num_levels").toBool();
  a.level_average = ctx->saved_data.at("level_average").toBool();
  a.causal = ctx->saved_data.at("causal").toBool();
  a.layout = ctx->saved_data.at("layout").toStringRef();
  a.compute = ctx->saved_data.at("compute").toStringRef();
  if (segment_starts.defined()) a.segment_starts = segment_starts;
  if (segment_offsets.defined()) a.segment_offsets = segment_offsets;
  return a;
}

struct MlrFunction : public ::torch::autograd::Function<MlrFunction> {
  // q, k, v in a.layout (see the header); returns out: batch x seq_q x heads_q x head_dim_v.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const MlrArgs& a) {
    at::Tensor out, lse;
    if (q.defined() && q.scalar_type() == at::kDouble)
      std::tie(out, lse) = reference_mlr_attention_forward(q, k, v, a);
    else
      std::tie(out, lse) = op_calls::mlr_attention_forward(q, k, v, a);
    ctx->save_for_backward(
        {q, k, v, out, lse, defined_or_empty(a.segment_starts), defined_or_empty(a.segment_offsets)});
    save_options(ctx, a);
    return out;
  }

  // grads[0]: d loss / d out (shape of out). Returns (dq, dk, dv, nothing for the options).
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list s = ctx->get_saved_variables();
    const at::Tensor &q = s[0], &k = s[1], &v = s[2], &out = s[3], &lse = s[4];
    const MlrArgs a = load_options(ctx, s[5], s[6]);
    at::Tensor dq, dk, dv;
    if (q.scalar_type() == at::kDouble)
      std::tie(dq, dk, dv) = reference_mlr_attention_backward(q, k, v, grads[0], a);
    else
      std::tie(dq, dk, dv) = op_calls::mlr_attention_backward(q, k, v, out, lse, grads[0], a);
    variable_list out_grads = binding::once_differentiable({dq, dk, dv}, {q, k, v, grads[0]}, "strata mlr_attention");
    out_grads.emplace_back();  // no gradient for the options
    return out_grads;
  }
};

// MlrFunction over q, k, v = qkv[:, :, 0..2] whose backward returns one gradient for qkv.
struct MlrPackedFunction : public ::torch::autograd::Function<MlrPackedFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& qkv, const MlrArgs& a) {
    auto [out, lse] = op_calls::mlr_attention_forward(qkv.select(2, 0), qkv.select(2, 1), qkv.select(2, 2), a);
    ctx->save_for_backward({qkv, out, lse, defined_or_empty(a.segment_starts), defined_or_empty(a.segment_offsets)});
    save_options(ctx, a);
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list s = ctx->get_saved_variables();
    const at::Tensor &qkv = s[0], &out = s[1], &lse = s[2];
    const MlrArgs a = load_options(ctx, s[3], s[4]);
    const at::Tensor dqkv = op_calls::mlr_attention_qkvpacked_backward(qkv, out, lse, grads[0], a);
    variable_list out_grads = binding::once_differentiable({dqkv}, {qkv, grads[0]}, "strata mlr_attention");
    out_grads.emplace_back();  // no gradient for the options
    return out_grads;
  }
};

}  // namespace

std::tuple<at::Tensor, at::Tensor> mlr_attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                         const MlrArgs& a) {
  const char* where = "mlr_attention_forward";
  const Layout l = binding::parse_layout(where, a.layout);
  const QkvViews in = qkv_views(where, q, k, v, l, kKernelDTypes);
  const AttnDims& d = in.d;
  const ResolvedOptions r = make_options(where, a, l, d.batch);
  // out: batch x seq_q x heads_q x head_dim_v (in q's layout and memory order); lse: batch x heads_q x seq_q
  at::Tensor out =
      binding::empty_in_order_of(q, sizes_in(l, d.batch, d.seqlen_q, d.heads_q, d.head_dim_v), q.scalar_type());
  at::Tensor lse = at::empty({d.batch, d.heads_q, d.seqlen_q}, at::TensorOptions().dtype(at::kFloat).device(at::kCPU));
  strata::mlr_attention_forward(in.q, in.k, in.v, view_of(out, where, "out"), view_of(lse, where, "lse"), r.opt);
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> mlr_attention_backward(const at::Tensor& q, const at::Tensor& k,
                                                                      const at::Tensor& v, const at::Tensor& out,
                                                                      const at::Tensor& lse, const at::Tensor& dout,
                                                                      const MlrArgs& a) {
  qkv_views("mlr_attention_backward", q, k, v, binding::parse_layout("mlr_attention_backward", a.layout),
            kKernelDTypes);
  // dq, dk, dv (q, k, v checked first: empty_like of a bad one would fail without naming it):
  // shapes, dtypes and memory order of q, k, v
  at::Tensor dq = binding::empty_grad_like(q), dk = binding::empty_grad_like(k), dv = binding::empty_grad_like(v);
  mlr_attention_backward_into(q, k, v, out, lse, dout, dq, dk, dv, a);
  return {dq, dk, dv};
}

void mlr_attention_backward_into(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
                                 const at::Tensor& lse, const at::Tensor& dout, const at::Tensor& dq,
                                 const at::Tensor& dk, const at::Tensor& dv, const MlrArgs& a) {
  const char* where = "mlr_attention_backward";
  const Layout l = binding::parse_layout(where, a.layout);
  const QkvViews in = qkv_views(where, q, k, v, l, kKernelDTypes);
  const ResolvedOptions r = make_options(where, a, l, in.d.batch);
  strata::mlr_attention_backward(in.q, in.k, in.v, view_of(out, where, "out"), view_of(lse, where, "lse"),
                                 view_of(dout, where, "dout"), view_of(dq, where, "dq"), view_of(dk, where, "dk"),
                                 view_of(dv, where, "dv"), r.opt);
}

at::Tensor mlr_attention_qkvpacked(const at::Tensor& qkv, const MlrArgs& a) {
  binding::check_qkvpacked("mlr_attention_qkvpacked", qkv, a.layout);
  if (takes_torch_ops(qkv) || qkv.scalar_type() == at::kDouble)
    return mlr_attention(qkv.select(2, 0), qkv.select(2, 1), qkv.select(2, 2), a);
  return MlrPackedFunction::apply(qkv, a);
}

at::Tensor mlr_attention_qkvpacked_backward(const at::Tensor& qkv, const at::Tensor& out, const at::Tensor& lse,
                                            const at::Tensor& dout, const MlrArgs& a) {
  binding::check_qkvpacked("mlr_attention_qkvpacked_backward", qkv, a.layout);
  at::Tensor dqkv = binding::with_huge_pages(at::empty(qkv.sizes(), qkv.options()));
  mlr_attention_backward_into(qkv.select(2, 0), qkv.select(2, 1), qkv.select(2, 2), out, lse, dout, dqkv.select(2, 0),
                              dqkv.select(2, 1), dqkv.select(2, 2), a);
  return dqkv;
}

at::Tensor mlr_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const MlrArgs& a) {
  if (takes_torch_ops(q)) return torch_ops::mlr_attention(q, k, v, a);  // before the CPU-only checks
  return MlrFunction::apply(q, k, v, a);
}

MlrFlops mlr_attention_flops(int64_t batch, int64_t heads_q, int64_t seq_q, int64_t seq_k, int64_t head_dim_v,
                             const MlrArgs& a) {
  const char* where = "mlr_attention_flops";
  const ResolvedOptions r = make_options(where, a, binding::parse_layout(where, a.layout), batch);
  return strata::mlr_attention_flops(batch, heads_q, seq_q, seq_k, head_dim_v, r.opt);
}

std::tuple<at::Tensor, at::Tensor> reference_mlr_attention_forward(const at::Tensor& q, const at::Tensor& k,
                                                                   const at::Tensor& v, const MlrArgs& a) {
  const char* where = "reference_mlr_attention_forward";
  const Layout l = binding::parse_layout(where, a.layout);
  const QkvViews in = qkv_views(where, q, k, v, l, kReferenceDTypes);
  const AttnDims& d = in.d;
  const ResolvedOptions r = make_options(where, a, l, d.batch);
  validate(where, r.opt, d);
  at::Tensor out = binding::empty_reference_out(l, d.batch, d.seqlen_q, d.heads_q, d.head_dim_v);
  at::Tensor lse = at::empty({d.batch, d.heads_q, d.seqlen_q}, at::TensorOptions().dtype(at::kDouble).device(at::kCPU));
  reference::mlr_attention_forward(in.q, in.k, in.v, r.opt, out.data_ptr<double>(), lse.data_ptr<double>());
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> reference_mlr_attention_backward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& dout, const MlrArgs& a) {
  const char* where = "reference_mlr_attention_backward";
  const Layout l = binding::parse_layout(where, a.layout);
  const QkvViews in = qkv_views(where, q, k, v, l, kReferenceDTypes);
  const AttnDims& d = in.d;
  const ResolvedOptions r = make_options(where, a, l, d.batch);
  validate(where, r.opt, d);
  const TensorView gview = view_of(dout, where, "dout", DTypes{in.q.dtype}, " (same as q)");
  check_4d(where, "dout", gview, l, in.q.dtype, d.batch, d.seqlen_q, d.heads_q, d.head_dim_v, "(shape of out)");
  at::Tensor gq = binding::empty_reference_out(l, d.batch, d.seqlen_q, d.heads_q, d.head_dim);
  at::Tensor gk = binding::empty_reference_out(l, d.batch, d.seqlen_k, d.heads_kv, d.head_dim);
  at::Tensor gv = binding::empty_reference_out(l, d.batch, d.seqlen_k, d.heads_kv, d.head_dim_v);
  reference::mlr_attention_backward(in.q, in.k, in.v, gview, r.opt, gq.data_ptr<double>(), gk.data_ptr<double>(),
                                    gv.data_ptr<double>());
  return {gq, gk, gv};
}

// ---- decode cache ------------------------------------------------------------------------------

MlrDecodeCache::MlrDecodeCache(int64_t batch, int64_t heads_kv, int64_t head_dim_v, int64_t max_seqlen,
                               const MlrArgs& a)
    : batch_(batch), head_dim_v_(head_dim_v) {
  const char* where = "MlrDecodeCache";
  STRATA_CHECK_ARG(!a.segment_starts.has_value() && !a.segment_offsets.has_value(), where, "segment_starts / segment_offsets",
                   "none (segments are not supported by this wrapper; use strata::MlrKvCache)", "a segment list");
  STRATA_CHECK_ARG(a.layout == "bshd", where, "layout", "\"bshd\"", cat("\"", a.layout, "\""));
  const ResolvedOptions r = make_options(where, a, Layout::BSHD, batch);
  cache_ = std::make_unique<MlrKvCache>(batch, heads_kv, head_dim_v, max_seqlen, r.opt);
}

void MlrDecodeCache::append(const at::Tensor& k, const at::Tensor& v) {
  const char* where = "MlrDecodeCache::append";
  STRATA_CHECK_ARG(k.dim() == 4 && k.size(0) == batch_, where, "k", cat("batch ", batch_, " x n x heads_kv x head_dim"),
                   k.sizes());
  STRATA_CHECK_ARG(v.dim() == 4 && v.size(1) == k.size(1), where, "v", cat("batch x ", k.size(1), " x heads_kv x head_dim_v"),
                   v.sizes());
  const std::vector<int64_t> n_new(size_t(batch_), k.size(1));
  const TensorView kv = view_of(k, where, "k"), vv = view_of(v, where, "v");  // k's errors first
  cache_->append(kv, vv, n_new.data());
}

at::Tensor MlrDecodeCache::attend(const at::Tensor& q) const {
  const char* where = "MlrDecodeCache::attend";
  STRATA_CHECK_ARG(q.dim() == 4 && q.size(0) == batch_ && q.size(1) == 1, where, "q",
                   cat("batch ", batch_, " x 1 x heads_q x head_dim"), q.sizes());
  const TensorView qv = view_of(q, where, "q");  // q's errors (a CPU tensor) before the outputs'
  at::Tensor o = at::empty({q.size(0), 1, q.size(2), head_dim_v_}, q.options());
  at::Tensor lse = at::empty({q.size(0), q.size(2), 1}, q.options().dtype(at::kFloat));
  cache_->attend(qv, view_of(o, where, "o"), view_of(lse, where, "lse"));
  return o;
}

}  // namespace strata::torch
