// torch/options.h (private to torch/): the user-facing argument structs (AttentionArgs, MlrArgs,
// MonarchArgs) as the core's options, shared by the kernel bindings and the torch-ops path
// (strata/torch/torch_ops.h). any_device: tensors in the args (masks, bias, segment lists) may
// live on any device; their views then carry shapes and dtypes only (shape_view_of), for the
// core's checks, and never reach a kernel.
#pragma once
#include <ATen/ATen.h>

#include <optional>
#include <string>

#include "strata/attention.h"
#include "strata/mlr.h"
#include "strata/monarch.h"
#include "strata/torch/attention.h"
#include "strata/torch/mlr.h"
#include "strata/torch/monarch.h"

namespace strata::torch::binding {

// AttentionArgs as AttentionOptions (masks as views, no copies). q_dt: q's dtype, one of the
// bias's allowed dtypes. Throws naming the argument (scale, key_padding_mask, bias).
AttentionOptions attention_options(const char* where, const AttentionArgs& a, Layout l, DType q_dt,
                                   bool any_device = false);

// MlrOptions and the int64 CPU tensors its segment pointers point into (contiguous CPU copies
// where the caller's were not); valid while this object lives.
struct MlrResolved {
  MlrOptions opt;
  at::Tensor segment_starts, segment_offsets;
};
// MlrArgs as MlrOptions. batch: q's batch (segment_offsets must hold batch + 1). Value checks
// (ranks, blocks, segments) are the core's validate's.
MlrResolved mlr_options(const char* where, const MlrArgs& a, Layout l, int64_t batch, bool any_device = false);

// MonarchArgs as MonarchOptions (the mask as a view, no copy); num_steps, block_size and scale
// checked here, the rest by the core's validate.
MonarchOptions monarch_options(const char* where, const MonarchArgs& a, bool any_device = false);

// The paper's GSWA (strata::torch::paper_gswa_attention: its checks, default scales and the sum of
// the two branches) over `attend`, the kernels' attention() or the torch-ops one.
using AttentionFn = at::Tensor (*)(const at::Tensor&, const at::Tensor&, const at::Tensor&, const AttentionArgs&);
at::Tensor paper_gswa_of(AttentionFn attend, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         int64_t split_a, int64_t window, std::optional<double> scale_a, std::optional<double> scale_b,
                         const std::string& layout);

}  // namespace strata::torch::binding
