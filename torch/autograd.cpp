// torch/autograd.cpp: differentiable attention for LibTorch. AttentionFunction is a
// torch::autograd::Function whose forward runs attention_forward (saving out and lse) and whose
// backward runs attention_backward; float64 inputs take the double-precision reference on both
// passes so that gradcheck sees exact math. paper_gswa_attention composes two of them. Both route
// to the torch-ops path (strata/torch/torch_ops.h) off the CPU or with the switch on.
#include <torch/autograd.h>
#include <torch/csrc/autograd/functions/basic_ops.h>

#include <cmath>

#include "binding_util.h"
#include "strata/error.h"
#include "op_calls.h"
#include "options.h"
#include "strata/torch/attention.h"
#include "strata/torch/torch_ops.h"

namespace strata::torch {
namespace {

using ::torch::autograd::AutogradContext;
using ::torch::autograd::variable_list;

// Stores the non-tensor options in ctx (the tensors go through save_for_backward).
void save_options(AutogradContext* ctx, const AttentionArgs& a) {
  ctx->saved_data["scale"] = a.scale.has_value() ? c10::IValue(*a.scale) : c10::IValue();
  ctx->saved_data["causal"] = a.causal;
  ctx->saved_data["window_left"] = a.window_left;
  ctx->saved_data["window_right"] = a.window_right;
  ctx->saved_data["num_global"] = a.num_global;
  ctx->saved_data["layout"] = a.layout;
  ctx->saved_data["compute"] = a.compute;  // the backward computes as the forward was asked to
}

// Rebuilds the forward's AttentionArgs from ctx and the saved (possibly undefined) mask and bias.
AttentionArgs load_options(AutogradContext* ctx, const at::Tensor& key_padding_mask, const at::Tensor& bias) {
  AttentionArgs a;
  const c10::IValue& scale = ctx->saved_data.at("scale");
  if (!scale.isNone()) a.scale = scale.toDouble();
  a.causal = ctx->saved_data.at("causal").toBool();
  a.window_left = ctx->saved_data.at("window_left").toInt();
  a.window_right = ctx->saved_data.at("window_right").toInt();
  a.num_global = ctx->saved_data.at("num_global").toInt();
  a.layout = ctx->saved_data.at("layout").toStringRef();
  a.compute = ctx->saved_data.at("compute").toStringRef();
  if (key_padding_mask.defined()) a.key_padding_mask = key_padding_mask;
  if (bias.defined()) a.bias = bias;
  return a;
}

// Kernel gradients are differentiable once (binding::once_differentiable).
variable_list once_differentiable(variable_list grads, const variable_list& depends_on) {
  return binding::once_differentiable(std::move(grads), depends_on, "strata attention");
}

struct AttentionFunction : public ::torch::autograd::Function<AttentionFunction> {
  // q, k, v in a.layout (see the header); returns out: batch x seq_q x H x head_dim_v.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const AttentionArgs& a) {
    at::Tensor out, lse;
    if (q.defined() && q.scalar_type() == at::kDouble)
      std::tie(out, lse) = reference_attention_forward(q, k, v, a);
    else
      std::tie(out, lse) = op_calls::attention_forward(q, k, v, a);
    ctx->save_for_backward({q, k, v, out, lse, a.key_padding_mask.value_or(at::Tensor()),
                            a.bias.value_or(at::Tensor())});
    save_options(ctx, a);
    return out;
  }

  // grads[0]: d loss / d out (shape of out). Returns (dq, dk, dv, nothing for the options).
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list s = ctx->get_saved_variables();
    const at::Tensor &q = s[0], &k = s[1], &v = s[2], &out = s[3], &lse = s[4];
    const AttentionArgs a = load_options(ctx, s[5], s[6]);
    at::Tensor dq, dk, dv;
    if (q.scalar_type() == at::kDouble)
      std::tie(dq, dk, dv) = reference_attention_backward(q, k, v, grads[0], a);
    else
      std::tie(dq, dk, dv) = op_calls::attention_backward(q, k, v, out, lse, grads[0], a);
    variable_list out_grads = once_differentiable({dq, dk, dv}, {q, k, v, grads[0]});
    out_grads.emplace_back();  // no gradient for the options
    return out_grads;
  }
};

// attention() over q, k, v = qkv[:, :, 0..2] whose backward returns one gradient for qkv.
struct PackedAttentionFunction : public ::torch::autograd::Function<PackedAttentionFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& qkv, const AttentionArgs& a) {
    auto [out, lse] = op_calls::attention_forward(qkv.select(2, 0), qkv.select(2, 1), qkv.select(2, 2), a);
    ctx->save_for_backward({qkv, out, lse, a.key_padding_mask.value_or(at::Tensor()), a.bias.value_or(at::Tensor())});
    save_options(ctx, a);
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list s = ctx->get_saved_variables();
    const at::Tensor &qkv = s[0], &out = s[1], &lse = s[2];
    const AttentionArgs a = load_options(ctx, s[3], s[4]);
    const at::Tensor dqkv = op_calls::attention_qkvpacked_backward(qkv, out, lse, grads[0], a);
    variable_list out_grads = once_differentiable({dqkv}, {qkv, grads[0]});
    out_grads.emplace_back();  // no gradient for the options
    return out_grads;
  }
};

}  // namespace

at::Tensor attention_qkvpacked(const at::Tensor& qkv, const AttentionArgs& a) {
  const char* where = "attention_qkvpacked";
  binding::check_qkvpacked(where, qkv, a.layout);
  const at::Tensor q = qkv.select(2, 0), k = qkv.select(2, 1), v = qkv.select(2, 2);
  if (takes_torch_ops(qkv) || qkv.scalar_type() == at::kDouble ||
      (a.bias.has_value() && a.bias->defined() && a.bias->requires_grad() && at::GradMode::is_enabled()))
    return attention(q, k, v, a);  // (its checks and messages, and the float64 reference)
  checked_dtype(qkv, where, "qkv", kKernelDTypes);
  return PackedAttentionFunction::apply(qkv, a);
}

at::Tensor attention_qkvpacked_backward(const at::Tensor& qkv, const at::Tensor& out, const at::Tensor& lse,
                                        const at::Tensor& dout, const AttentionArgs& a) {
  binding::check_qkvpacked("attention_qkvpacked_backward", qkv, a.layout);
  at::Tensor dqkv = binding::with_huge_pages(at::empty(qkv.sizes(), qkv.options()));
  attention_backward_into(qkv.select(2, 0), qkv.select(2, 1), qkv.select(2, 2), out, lse, dout, dqkv.select(2, 0),
                          dqkv.select(2, 1), dqkv.select(2, 2), a);
  return dqkv;
}

at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const AttentionArgs& a) {
  // A bias that wants a gradient would silently get none: refuse it while grad mode is on.
  STRATA_CHECK_ARG(!(a.bias.has_value() && a.bias->defined() && a.bias->requires_grad() &&
                     at::GradMode::is_enabled()),
                   "attention", "bias",
                   "a tensor that does not require grad (strata computes no bias gradient; pass bias.detach())",
                   "requires_grad=True");
  if (takes_torch_ops(q)) return torch_ops::attention(q, k, v, a);
  // q's dtype first, with this function's list (the kernel's own check would omit float64); a
  // dtype-only check, so that torch.compile's fake tensors pass (the kernel op checks the rest).
  checked_dtype(q, "attention", "q", kReferenceDTypes);
  return AttentionFunction::apply(q, k, v, a);
}

at::Tensor binding::paper_gswa_of(AttentionFn attend, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  int64_t split_a, int64_t window, std::optional<double> scale_a,
                                  std::optional<double> scale_b, const std::string& layout) {
  const char* where = "paper_gswa_attention";
  STRATA_CHECK_ARG(q.defined() && q.dim() == 4, where, "q", "a 4-D tensor",
                   q.defined() ? detail::cat(q.dim(), "-D ", q.sizes()) : std::string("an undefined tensor"));
  shape_view_of(q, where, "q", kReferenceDTypes);  // q's dtype first (either path checks the device)
  STRATA_CHECK_ARG(k.defined() && k.dim() == 4, where, "k", "a 4-D tensor",
                   k.defined() ? detail::cat(k.dim(), "-D ", k.sizes()) : std::string("an undefined tensor"));
  const int64_t D = q.size(3);
  STRATA_CHECK_ARG(k.size(3) == D, where, "k", detail::cat("head_dim ", D, " (same as q)"), k.size(3));
  STRATA_CHECK_ARG(split_a >= 1 && split_a < D, where, "split_a",
                   detail::cat("1..", D - 1, " (head dims of the global branch; head_dim is ", D, ")"), split_a);
  STRATA_CHECK_ARG(window >= 0, where, "window", ">= 0", window);
  for (const auto& [s, arg] : {std::pair{scale_a, "scale_a"}, std::pair{scale_b, "scale_b"}})
    STRATA_CHECK_ARG(!s.has_value() || (std::isfinite(*s) && std::isfinite(float(*s))), where, arg,
                     "a finite float32 value (or None for the reference code's 8 / the branch's head dims)", *s);
  AttentionArgs global;  // branch a: causal softmax over head dims [0, a)
  // Defaults: the reference code's 8/a and 8/b (see PaperGswaOptions in strata/attention.h).
  global.scale = scale_a.has_value() ? *scale_a : 8.0 / double(split_a);
  global.causal = true;
  global.layout = layout;
  AttentionArgs local = global;  // branch b: causal window (keys p-w..p) over head dims [a, D)
  local.scale = scale_b.has_value() ? *scale_b : 8.0 / double(D - split_a);
  local.window_left = window;
  local.window_right = 0;
  // O = P_a V + P_b V (probabilities added, not renormalised; v shared)
  return attend(q.narrow(3, 0, split_a), k.narrow(3, 0, split_a), v, global) +
         attend(q.narrow(3, split_a, D - split_a), k.narrow(3, split_a, D - split_a), v, local);
}

at::Tensor paper_gswa_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t split_a,
                                int64_t window, std::optional<double> scale_a, std::optional<double> scale_b,
                                const std::string& layout) {
  if (takes_torch_ops(q)) return torch_ops::paper_gswa_attention(q, k, v, split_a, window, scale_a, scale_b, layout);
  return binding::paper_gswa_of(&attention, q, k, v, split_a, window, scale_a, scale_b, layout);
}

}  // namespace strata::torch
