// torch/mlr_regions.h: the torch-ops path's fast case of MLR attention (torch/mlr_regions.cpp):
// self-attention (seq_q == seq_k) of the dyadic geometry (b_l = 2 b_{l+1}, the default) with every
// position in one level-1 block (non-causal: seq == b_1), no segments; CUDA float32 (bf16 / fp16:
// see mlr_regions_geometry) or the CPU (float32 / bf16 / float64). Exact: the same scores, merged
// over disjoint key regions by their log-sum-exp, on torch's fused attention kernels;
// differentiable (its own backward).
#pragma once

#include <ATen/core/Tensor.h>

#include "strata/mlr.h"

namespace strata::torch::torch_ops {

struct MlrRegionGeometry {
  int levels = 0;                              // L
  int64_t block[MlrOptions::kMaxLevels] = {};  // b_l, b_l = 2 b_{l+1}
  int64_t rank[MlrOptions::kMaxLevels] = {};   // r_l
  double scale[MlrOptions::kMaxLevels] = {};   // c_l (1/L folded in with divide_by_num_levels)
  bool level_average = false;                  // region m's scores / (m + 1)
  bool causal = true;                          // the last level's tiles causal; earlier: second halves only
};

// True, with *g filled, when a call of these options and sizes takes the fast case.
bool mlr_regions_geometry(const MlrOptions& opt, int64_t head_dim, int64_t seq_q, int64_t seq_k, const at::Tensor& q,
                          MlrRegionGeometry* g);

// q, k: batch x H x T x head_dim, v: batch x H x T x dv (heads first; k, v already expanded to q's
// H heads). Returns batch x H x T x dv in q's dtype.
at::Tensor mlr_regions_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const MlrRegionGeometry& g);

}  // namespace strata::torch::torch_ops
