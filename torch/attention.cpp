// torch/attention.cpp: the LibTorch binding of dense attention: tensors -> views (no copies), the
// core's checks (strata/checks.h, every error names the argument), outputs allocated, the
// torch-free core called (include/strata/attention.h); also the float64 reference path.
#include "strata/torch/attention.h"

#include <algorithm>
#include <cmath>

#include "binding_util.h"
#include "options.h"
#include "strata/error.h"

namespace strata::torch {
namespace {

using namespace binding;  // qkv_views, parse_layout, empty_in_order_of, ... (binding_util.h)

// q, k, v as checked views: GQA or a shared query (strata/attention.h).
QkvViews attention_views(const char* where, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, Layout l,
                         const DTypes& allowed) {
  return qkv_views(where, q, k, v, l, allowed, /*self_attention=*/false, HeadGroups::gqa_or_shared_q);
}

}  // namespace

AttentionOptions binding::attention_options(const char* where, const AttentionArgs& a, Layout l, DType q_dt,
                                            bool any_device) {
  AttentionOptions o;
  if (a.scale.has_value()) {
    const double s = *a.scale;
    STRATA_CHECK_ARG(std::isfinite(s) && std::isfinite(float(s)), where, "scale",
                     "a finite float32 value (or None for 1/sqrt(head_dim))", s);
    o.scale = float(s);
  }
  o.causal = a.causal;
  o.window_left = a.window_left;
  o.window_right = a.window_right;
  o.num_global = a.num_global;
  o.layout = l;
  o.compute = parse_compute(where, a.compute);
  if (a.key_padding_mask.has_value() && a.key_padding_mask->defined())
    o.key_padding_mask = binding::mask_view_of(*a.key_padding_mask, where, "key_padding_mask", any_device);
  if (a.bias.has_value() && a.bias->defined()) {
    const DTypes bias_dtypes = q_dt == DType::f32 ? DTypes{DType::f32} : DTypes{DType::f32, q_dt};
    TensorView b = any_device ? shape_view_of(*a.bias, where, "bias", bias_dtypes)
                              : view_of(*a.bias, where, "bias", bias_dtypes);
    if (b.ndim < 4) {  // torch broadcasting: missing leading dims are size 1 (stride 0)
      const int shift = 4 - b.ndim;
      for (int i = 3; i >= 0; --i) {
        b.shape[i] = i >= shift ? b.shape[i - shift] : 1;
        b.stride[i] = i >= shift ? b.stride[i - shift] : 0;
      }
      b.ndim = 4;
    }
    o.bias = b;
  }
  return o;
}


std::tuple<at::Tensor, at::Tensor> attention_forward(const at::Tensor& q, const at::Tensor& k,
                                                     const at::Tensor& v, const AttentionArgs& a) {
  const char* where = "attention_forward";
  const Layout l = parse_layout(where, a.layout);
  const QkvViews in = attention_views(where, q, k, v, l, kKernelDTypes);
  const AttentionOptions opt = attention_options(where, a, l, in.q.dtype);
  const AttnDims& d = in.d;
  // out: batch x seq_q x H x head_dim_v (in q's layout and memory order); lse: batch x H x seq_q;
  // H = max(heads_q, heads_kv)
  at::Tensor out = empty_in_order_of(q, sizes_in(l, d.batch, d.seqlen_q, d.heads(), d.head_dim_v), q.scalar_type());
  at::Tensor lse = at::empty({d.batch, d.heads(), d.seqlen_q}, at::TensorOptions().dtype(at::kFloat).device(at::kCPU));
  strata::attention_forward(in.q, in.k, in.v, view_of(out, where, "out"), view_of(lse, where, "lse"), opt);
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_backward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
    const at::Tensor& lse, const at::Tensor& dout, const AttentionArgs& a) {
  attention_views("attention_backward", q, k, v, parse_layout("attention_backward", a.layout), kKernelDTypes);
  // dq, dk, dv (q, k, v checked first: empty_like of a bad one would fail without naming it): shapes,
  // dtypes and memory order of q, k, v (empty_like: contiguous for an overlapping input such as an
  // expand()ed q, whose heads each get their own dq; autograd sums them)
  at::Tensor dq = empty_grad_like(q), dk = empty_grad_like(k), dv = empty_grad_like(v);
  attention_backward_into(q, k, v, out, lse, dout, dq, dk, dv, a);
  return {dq, dk, dv};
}

void attention_backward_into(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
                             const at::Tensor& lse, const at::Tensor& dout, const at::Tensor& dq,
                             const at::Tensor& dk, const at::Tensor& dv, const AttentionArgs& a) {
  const char* where = "attention_backward";
  const Layout l = parse_layout(where, a.layout);
  const QkvViews in = attention_views(where, q, k, v, l, kKernelDTypes);
  const AttentionOptions opt = attention_options(where, a, l, in.q.dtype);
  strata::attention_backward(in.q, in.k, in.v, view_of(out, where, "out"), view_of(lse, where, "lse"),
                             view_of(dout, where, "dout"), view_of(dq, where, "dq"), view_of(dk, where, "dk"),
                             view_of(dv, where, "dv"), opt);
}

std::tuple<at::Tensor, at::Tensor> reference_attention_forward(const at::Tensor& q, const at::Tensor& k,
                                                               const at::Tensor& v, const AttentionArgs& a) {
  const char* where = "reference_attention_forward";
  const Layout l = parse_layout(where, a.layout);
  const QkvViews in = attention_views(where, q, k, v, l, kReferenceDTypes);
  const AttentionOptions opt = attention_options(where, a, l, in.q.dtype);
  const AttnDims& d = in.d;
  validate(where, opt, d);
  at::Tensor out = empty_reference_out(l, d.batch, d.seqlen_q, d.heads(), d.head_dim_v);
  at::Tensor lse = at::empty({d.batch, d.heads(), d.seqlen_q}, at::TensorOptions().dtype(at::kDouble).device(at::kCPU));
  reference::attention_forward(in.q, in.k, in.v, opt, out.data_ptr<double>(), lse.data_ptr<double>());
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> reference_attention_backward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& dout,
    const AttentionArgs& a) {
  const char* where = "reference_attention_backward";
  const Layout l = parse_layout(where, a.layout);
  const QkvViews in = attention_views(where, q, k, v, l, kReferenceDTypes);
  const AttentionOptions opt = attention_options(where, a, l, in.q.dtype);
  const AttnDims& d = in.d;
  validate(where, opt, d);
  const TensorView gv = view_of(dout, where, "dout", DTypes{in.q.dtype}, " (same as q)");
  check_4d(where, "dout", gv, l, in.q.dtype, d.batch, d.seqlen_q, d.heads(), d.head_dim_v, "(shape of out)");
  at::Tensor gq = empty_reference_out(l, d.batch, d.seqlen_q, d.heads_q, d.head_dim);
  at::Tensor gk = empty_reference_out(l, d.batch, d.seqlen_k, d.heads_kv, d.head_dim);
  at::Tensor gvv = empty_reference_out(l, d.batch, d.seqlen_k, d.heads_kv, d.head_dim_v);
  reference::attention_backward(in.q, in.k, in.v, gv, opt, gq.data_ptr<double>(), gk.data_ptr<double>(),
                                gvv.data_ptr<double>());
  return {gq, gk, gvv};
}

}  // namespace strata::torch
