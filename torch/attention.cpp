// torch/attention.cpp: the LibTorch binding of dense attention. Checks devices, dtypes and shapes
// (every error names the argument, expected and got), allocates outputs, wraps at::Tensor as
// strata::TensorView (no copies) and calls the torch-free core (include/strata/attention.h).
// The float64 reference path lives here too: strata::reference has no checks of its own, so the
// same checks run in front of it.
#include "strata/torch/attention.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>

#include "binding_util.h"
#include "strata/error.h"

namespace strata::torch {
namespace {

using namespace binding;  // dims, parse_layout, check_4d, empty_in_order_of, ... (binding_util.h)

// Converts the user-facing arguments to core options (masks as views, no copies). q_dtype: the
// dtype of q, one of the bias's allowed dtypes.
AttentionOptions make_options(const char* where, const AttentionArgs& a, Layout l, at::ScalarType q_dtype) {
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
  if (a.key_padding_mask.has_value() && a.key_padding_mask->defined()) {
    check_dtype_in(where, "key_padding_mask", *a.key_padding_mask, {at::kBool, at::kByte});
    o.key_padding_mask = view_of(*a.key_padding_mask, where, "key_padding_mask");
  }
  if (a.bias.has_value() && a.bias->defined()) {
    if (q_dtype == at::kFloat)
      check_dtype_in(where, "bias", *a.bias, {at::kFloat});
    else
      check_dtype_in(where, "bias", *a.bias, {at::kFloat, q_dtype});
    TensorView b = view_of(*a.bias, where, "bias");
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

// Everything the core's own checks cover, for the reference (which checks nothing); q, k, v may
// be float32, bfloat16 or float64 (one dtype).
void check_reference_inputs(const char* where, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const AttentionOptions& o) {
  const auto [dq, dk, dv] = check_reference_qkv(where, q, k, v, o.layout);
  const DType qdt = view_of(q, where, "q").dtype;
  STRATA_CHECK_ARG(o.window_left >= -1, where, "window_left", ">= 0, or -1 for unbounded", o.window_left);
  STRATA_CHECK_ARG(o.window_right >= -1, where, "window_right", ">= 0, or -1 for unbounded", o.window_right);
  STRATA_CHECK_ARG(o.num_global >= 0, where, "num_global", ">= 0", o.num_global);
  const TensorView& m = o.key_padding_mask;
  if (m.ndim != 0) {
    STRATA_CHECK_ARG(m.ndim == 2 && m.shape[0] == dq.b && m.shape[1] == dk.s, where, "key_padding_mask",
                     cat("shape [", dq.b, ", ", dk.s, "] (batch, seq_k)"), m.shape_str());
    STRATA_CHECK_ARG(m.dtype == DType::u8, where, "key_padding_mask", "dtype uint8 (bool)", dtype_name(m.dtype));
  }
  const TensorView& b = o.bias;
  if (b.ndim != 0) {
    const int64_t want[4] = {dq.b, dq.h, dq.s, dk.s};
    bool ok = b.ndim == 4;
    for (int i = 0; ok && i < 4; ++i) ok = b.shape[i] == want[i] || b.shape[i] == 1;
    STRATA_CHECK_ARG(ok, where, "bias",
                     cat("4-D, broadcastable to [", want[0], ", ", want[1], ", ", want[2], ", ", want[3],
                         "] (batch, heads_q, seq_q, seq_k)"),
                     b.shape_str());
    STRATA_CHECK_ARG(b.dtype == DType::f32 || b.dtype == qdt, where, "bias",
                     qdt == DType::f32 ? std::string("dtype float32") : cat("dtype float32 or ", dtype_name(qdt)),
                     dtype_name(b.dtype));
  }
}

}  // namespace

TensorView view_of(const at::Tensor& t, const char* arg) { return view_of(t, "view_of", arg); }

TensorView view_of(const at::Tensor& t, const char* where, const char* arg) {
  STRATA_CHECK_ARG(t.defined(), where, arg, "a defined tensor", "an undefined tensor");
  STRATA_CHECK_ARG(t.device().is_cpu(), where, arg, "a CPU tensor", cat("a tensor on ", t.device().str()));
  STRATA_CHECK_ARG(t.layout() == at::kStrided, where, arg, "a strided (dense) tensor", cat("layout ", t.layout()));
  STRATA_CHECK_ARG(!t.is_neg(), where, arg, "a tensor without a lazy negation bit (call resolve_neg())",
                   "a negative view");
  STRATA_CHECK_ARG(t.dim() <= TensorView::kMaxDims, where, arg, cat("at most ", TensorView::kMaxDims, " dims"),
                   t.dim());
  TensorView v;
  switch (t.scalar_type()) {
    case at::kFloat: v.dtype = DType::f32; break;
    case at::kBFloat16: v.dtype = DType::bf16; break;
    case at::kDouble: v.dtype = DType::f64; break;
    case at::kByte: v.dtype = DType::u8; break;
    case at::kBool: v.dtype = DType::u8; break;  // torch bool is one byte holding 0 or 1
    default:  // the catch-all: callers check their own dtypes first (binding::check_dtype_in)
      throw_arg(where, arg, "dtype float32, bfloat16, float64, uint8 or bool", torch_dtype_name(t));
  }
  v.data = t.numel() == 0 ? nullptr : t.data_ptr();
  v.ndim = int(t.dim());
  for (int i = 0; i < v.ndim; ++i) {
    v.shape[i] = t.size(i);
    v.stride[i] = t.stride(i);
  }
  return v;
}

std::tuple<at::Tensor, at::Tensor> attention_forward(const at::Tensor& q, const at::Tensor& k,
                                                     const at::Tensor& v, const AttentionArgs& a) {
  const char* where = "attention_forward";
  const Layout l = parse_layout(where, a.layout);
  check_4d(where, "q", q, l);
  check_4d(where, "k", k, l);
  check_4d(where, "v", v, l);
  check_qkv_dtypes(where, q, k, v, /*allow_f64=*/false);
  const TensorView qv = view_of(q, where, "q"), kv = view_of(k, where, "k"), vv = view_of(v, where, "v");
  const AttentionOptions opt = make_options(where, a, l, q.scalar_type());
  const Dims4 dq = dims(q, l);
  // out: batch x seq_q x heads_q x head_dim_v (in q's layout and memory order)
  std::array<int64_t, 4> out_sizes = {q.size(0), q.size(1), q.size(2), v.size(3)};
  at::Tensor out = empty_in_order_of(q, out_sizes, q.scalar_type());
  // lse: batch x heads_q x seq_q
  at::Tensor lse = at::empty({dq.b, dq.h, dq.s}, at::TensorOptions().dtype(at::kFloat).device(at::kCPU));
  strata::attention_forward(qv, kv, vv, view_of(out, where, "out"), view_of(lse, where, "lse"), opt);
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_backward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
    const at::Tensor& lse, const at::Tensor& dout, const AttentionArgs& a) {
  const char* where = "attention_backward";
  const Layout l = parse_layout(where, a.layout);
  check_4d(where, "q", q, l);
  check_4d(where, "k", k, l);
  check_4d(where, "v", v, l);
  check_qkv_dtypes(where, q, k, v, /*allow_f64=*/false);
  const TensorView qv = view_of(q, where, "q"), kv = view_of(k, where, "k"), vv = view_of(v, where, "v");
  const TensorView ov = view_of(out, where, "out"), lv = view_of(lse, where, "lse");
  const TensorView gv = view_of(dout, where, "dout");
  const AttentionOptions opt = make_options(where, a, l, q.scalar_type());
  // dq, dk, dv: shapes, dtypes and memory order of q, k, v
  at::Tensor dq = at::empty_like(q), dk = at::empty_like(k), dv = at::empty_like(v);
  strata::attention_backward(qv, kv, vv, ov, lv, gv, view_of(dq, where, "dq"), view_of(dk, where, "dk"),
                             view_of(dv, where, "dv"), opt);
  return {dq, dk, dv};
}

std::tuple<at::Tensor, at::Tensor> reference_attention_forward(const at::Tensor& q, const at::Tensor& k,
                                                               const at::Tensor& v, const AttentionArgs& a) {
  const char* where = "reference_attention_forward";
  const Layout l = parse_layout(where, a.layout);
  check_reference_qkv(where, q, k, v, l);
  const AttentionOptions opt = make_options(where, a, l, q.scalar_type());
  check_reference_inputs(where, q, k, v, opt);
  const Dims4 dq = dims(q, l);
  at::Tensor out = empty_reference_out(l, dq.b, dq.s, dq.h, v.size(3));
  at::Tensor lse = at::empty({dq.b, dq.h, dq.s}, at::TensorOptions().dtype(at::kDouble).device(at::kCPU));
  reference::attention_forward(view_of(q, where, "q"), view_of(k, where, "k"), view_of(v, where, "v"), opt,
                               out.data_ptr<double>(), lse.data_ptr<double>());
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> reference_attention_backward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& dout,
    const AttentionArgs& a) {
  const char* where = "reference_attention_backward";
  const Layout l = parse_layout(where, a.layout);
  check_reference_qkv(where, q, k, v, l);
  const AttentionOptions opt = make_options(where, a, l, q.scalar_type());
  check_reference_inputs(where, q, k, v, opt);
  check_4d(where, "dout", dout, l);
  const Dims4 dq = dims(q, l), dk = dims(k, l), want{dq.b, dq.s, dq.h, v.size(3)}, got = dims(dout, l);
  STRATA_CHECK_ARG(got.b == want.b && got.s == want.s && got.h == want.h && got.d == want.d, where, "dout",
                   cat(dims_str(want), " (shape of out)"), dims_str(got));
  STRATA_CHECK_ARG(dout.scalar_type() == q.scalar_type(), where, "dout",
                   cat("dtype ", torch_dtype_name(q), " (same as q)"), torch_dtype_name(dout));
  at::Tensor gq = empty_reference_out(l, dq.b, dq.s, dq.h, dq.d);
  at::Tensor gk = empty_reference_out(l, dk.b, dk.s, dk.h, dk.d);
  at::Tensor gv = empty_reference_out(l, dk.b, dk.s, dk.h, v.size(3));
  reference::attention_backward(view_of(q, where, "q"), view_of(k, where, "k"), view_of(v, where, "v"),
                                view_of(dout, where, "dout"), opt, gq.data_ptr<double>(), gk.data_ptr<double>(),
                                gv.data_ptr<double>());
  return {gq, gk, gv};
}

}  // namespace strata::torch
