// torch/ops_mlr.cpp: the kernels of the MLR attention ops torch.ops.strata.mlr_attention_* (their
// schemas are in torch/library.cpp): CPU kernels for the forward/backward ops
// (not differentiable: outputs never require grad), a CompositeImplicitAutograd kernel for the
// differentiable one (it runs the C++ autograd Function, so torch.autograd works from Python). A
// strata::Error becomes a c10::Error with the same message (RuntimeError in Python).
#include <torch/library.h>

#include <string>

#include "binding_util.h"
#include "op_calls.h"
#include "strata/torch/mlr.h"

namespace strata::torch {
namespace {

using binding::rethrow_as_c10;

// The schema's option arguments as MlrArgs.
MlrArgs make_args(c10::IntArrayRef ranks, c10::IntArrayRef block_sizes, int64_t context,
                  const std::optional<at::Tensor>& segment_starts, const std::optional<at::Tensor>& segment_offsets,
                  bool mask_cross_segment, c10::string_view scale, bool divide_by_num_levels, bool level_average,
                  bool causal, c10::string_view layout, c10::string_view compute) {
  MlrArgs a;
  a.ranks = ranks.vec();
  a.block_sizes = block_sizes.vec();
  a.context = context;
  a.segment_starts = segment_starts;
  a.segment_offsets = segment_offsets;
  a.mask_cross_segment = mask_cross_segment;
  a.scale = std::string(scale);
  a.divide_by_num_levels = divide_by_num_levels;
  a.level_average = level_average;
  a.causal = causal;
  a.layout = std::string(layout);
  a.compute = std::string(compute);
  return a;
}

// strata::mlr_attention_forward (CPU): q, k, v in `layout`; returns (out, lse f32 [B, Hq, Nq]).
std::tuple<at::Tensor, at::Tensor> forward_op(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                              c10::IntArrayRef ranks, c10::IntArrayRef block_sizes, int64_t context,
                                              const std::optional<at::Tensor>& segment_starts,
                                              const std::optional<at::Tensor>& segment_offsets, bool mask_cross_segment,
                                              c10::string_view scale, bool divide_by_num_levels, bool level_average,
                                              bool causal, c10::string_view layout, c10::string_view compute) {
  return rethrow_as_c10([&] {
    return mlr_attention_forward(
        q, k, v,
        make_args(ranks, block_sizes, context, segment_starts, segment_offsets, mask_cross_segment, scale,
                  divide_by_num_levels, level_average, causal, layout, compute));
  });
}

// strata::mlr_attention_backward (CPU): out, lse from the forward, dout shaped like out;
// returns (dq, dk, dv).
std::tuple<at::Tensor, at::Tensor, at::Tensor> backward_op(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
    const at::Tensor& dout, c10::IntArrayRef ranks, c10::IntArrayRef block_sizes, int64_t context,
    const std::optional<at::Tensor>& segment_starts, const std::optional<at::Tensor>& segment_offsets,
    bool mask_cross_segment, c10::string_view scale, bool divide_by_num_levels, bool level_average, bool causal,
    c10::string_view layout, c10::string_view compute) {
  return rethrow_as_c10([&] {
    return mlr_attention_backward(
        q, k, v, out, lse, dout,
        make_args(ranks, block_sizes, context, segment_starts, segment_offsets, mask_cross_segment, scale,
                  divide_by_num_levels, level_average, causal, layout, compute));
  });
}

// strata::mlr_attention (differentiable): returns out, batch x seq_q x heads_q x head_dim_v in `layout`.
at::Tensor mlr_attention_op(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, c10::IntArrayRef ranks,
                            c10::IntArrayRef block_sizes, int64_t context,
                            const std::optional<at::Tensor>& segment_starts,
                            const std::optional<at::Tensor>& segment_offsets, bool mask_cross_segment,
                            c10::string_view scale, bool divide_by_num_levels, bool level_average, bool causal,
                            c10::string_view layout, c10::string_view compute) {
  return rethrow_as_c10([&] {
    return mlr_attention(q, k, v,
                         make_args(ranks, block_sizes, context, segment_starts, segment_offsets, mask_cross_segment,
                                   scale, divide_by_num_levels, level_average, causal, layout, compute));
  });
}

// strata::mlr_attention_qkvpacked (differentiable): qkv batch x seq x 3 x heads x head_dim; returns out.
at::Tensor qkvpacked_op(const at::Tensor& qkv, c10::IntArrayRef ranks, c10::IntArrayRef block_sizes, int64_t context,
                        const std::optional<at::Tensor>& segment_starts,
                        const std::optional<at::Tensor>& segment_offsets, bool mask_cross_segment,
                        c10::string_view scale, bool divide_by_num_levels, bool level_average, bool causal,
                        c10::string_view layout, c10::string_view compute) {
  return rethrow_as_c10([&] {
    return mlr_attention_qkvpacked(
        qkv, make_args(ranks, block_sizes, context, segment_starts, segment_offsets, mask_cross_segment, scale,
                       divide_by_num_levels, level_average, causal, layout, compute));
  });
}

// strata::mlr_attention_qkvpacked_backward (CPU): returns dqkv shaped as qkv.
at::Tensor qkvpacked_backward_op(const at::Tensor& qkv, const at::Tensor& out, const at::Tensor& lse,
                                 const at::Tensor& dout, c10::IntArrayRef ranks, c10::IntArrayRef block_sizes,
                                 int64_t context, const std::optional<at::Tensor>& segment_starts,
                                 const std::optional<at::Tensor>& segment_offsets, bool mask_cross_segment,
                                 c10::string_view scale, bool divide_by_num_levels, bool level_average, bool causal,
                                 c10::string_view layout, c10::string_view compute) {
  return rethrow_as_c10([&] {
    return mlr_attention_qkvpacked_backward(
        qkv, out, lse, dout,
        make_args(ranks, block_sizes, context, segment_starts, segment_offsets, mask_cross_segment, scale,
                  divide_by_num_levels, level_average, causal, layout, compute));
  });
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> op_calls::mlr_attention_forward(const at::Tensor& q, const at::Tensor& k,
                                                                   const at::Tensor& v, const MlrArgs& a) {
  static const auto op = binding::typed_op<decltype(forward_op)>("strata::mlr_attention_forward");
  return binding::rethrow_as_strata([&] {
    return op.call(q, k, v, a.ranks, a.block_sizes, a.context, a.segment_starts, a.segment_offsets,
                   a.mask_cross_segment, a.scale, a.divide_by_num_levels, a.level_average, a.causal, a.layout,
                   a.compute);
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> op_calls::mlr_attention_backward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
    const at::Tensor& dout, const MlrArgs& a) {
  static const auto op = binding::typed_op<decltype(backward_op)>("strata::mlr_attention_backward");
  return binding::rethrow_as_strata([&] {
    return op.call(q, k, v, out, lse, dout, a.ranks, a.block_sizes, a.context, a.segment_starts, a.segment_offsets,
                   a.mask_cross_segment, a.scale, a.divide_by_num_levels, a.level_average, a.causal, a.layout,
                   a.compute);
  });
}

at::Tensor op_calls::mlr_attention_qkvpacked_backward(const at::Tensor& qkv, const at::Tensor& out,
                                                      const at::Tensor& lse, const at::Tensor& dout, const MlrArgs& a) {
  static const auto op = binding::typed_op<decltype(qkvpacked_backward_op)>("strata::mlr_attention_qkvpacked_backward");
  return binding::rethrow_as_strata([&] {
    return op.call(qkv, out, lse, dout, a.ranks, a.block_sizes, a.context, a.segment_starts, a.segment_offsets,
                   a.mask_cross_segment, a.scale, a.divide_by_num_levels, a.level_average, a.causal, a.layout,
                   a.compute);
  });
}

}  // namespace strata::torch

TORCH_LIBRARY_IMPL(strata, CPU, m) {
  m.impl("mlr_attention_forward", &strata::torch::forward_op);
  m.impl("mlr_attention_backward", &strata::torch::backward_op);
  m.impl("mlr_attention_qkvpacked_backward", &strata::torch::qkvpacked_backward_op);
}

// The kernels alone are not differentiable: their outputs never require grad (binding_util.h).
TORCH_LIBRARY_IMPL(strata, Autograd, m) {
  m.impl("mlr_attention_forward", strata::torch::binding::non_differentiable());
  m.impl("mlr_attention_backward", strata::torch::binding::non_differentiable());
  m.impl("mlr_attention_qkvpacked_backward", strata::torch::binding::non_differentiable());
}

TORCH_LIBRARY_IMPL(strata, CompositeImplicitAutograd, m) {
  m.impl("mlr_attention", &strata::torch::mlr_attention_op);
  m.impl("mlr_attention_qkvpacked", &strata::torch::qkvpacked_op);
}
