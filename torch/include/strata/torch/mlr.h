// strata/torch/mlr.h: the LibTorch face of strata's multi-level low-rank (MLR) attention
// (Kuang et al., ICML 2025). Functions check devices/dtypes/shapes (errors name the argument),
// allocate outputs, wrap tensors as strata::TensorView and call the torch-free core
// (include/strata/mlr.h, whose semantics apply unchanged: levels, blocks by absolute position,
// segments, scales, bottom-right causal alignment, empty rows).
//
// Tensors are CPU, float32 or bfloat16 (float64 only through mlr_attention(), see below), any
// strides; layout "bshd" (or "bhsd": dims 1 and 2 swapped):
//   q: batch x seq_q x heads_q  x head_dim      head_dim = r_1 + ... + r_L
//   k: batch x seq_k x heads_kv x head_dim      heads_q % heads_kv == 0 (GQA)
//   v: batch x seq_k x heads_kv x head_dim_v
#pragma once
#include <ATen/ATen.h>

#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "strata/mlr.h"
#include "strata/mlr_kv_cache.h"

namespace strata::torch {

struct MlrArgs {
  std::vector<int64_t> ranks;        // r_1..r_L (1..16 levels), sum = head_dim
  std::vector<int64_t> block_sizes;  // b_1..b_L, nested; empty = default (context / 2^(l-1))
  int64_t context = 0;               // 0 = seq_k rounded up to a multiple of 2^(L-1)
  // 1-D int64: increasing segment starts (0 < s < seq_k) replacing the level-1 blocks.
  std::optional<at::Tensor> segment_starts;
  // 1-D int64, batch + 1 non-decreasing offsets into segment_starts: sequence b's own list is
  // segment_starts[offsets[b] .. offsets[b+1]) (an empty list = one segment). Absent: every
  // sequence uses the whole list.
  std::optional<at::Tensor> segment_offsets;
  bool mask_cross_segment = false;    // pairs sharing no level: -inf instead of score 0
  std::string scale = "inv_rank";     // c_l = 1/r_l, or "inv_sqrt_head_dim": 1/sqrt(head_dim)
  bool divide_by_num_levels = false;  // S *= 1/L
  bool level_average = false;         // S /= number of levels shared
  bool causal = true;
  std::string layout = "bshd";  // or "bhsd"
  // The products of a bfloat16 forward (strata::Compute, strata/cpu.h; strata/mlr.h says which):
  // "auto" (bf16 products on AMX-BF16, or AVX512-BF16 where it outruns fp32 here), "fp32",
  // "avx512_bf16", "amx_bf16". The backward runs its value-side products (dO V^T, P^T dO) and the
  // leading levels' scores on the same engine (the autograd Function passes the forward's choice on).
  std::string compute = "auto";
};

// Returns (out: batch x seq_q x heads_q x head_dim_v in q's layout and memory order, dtype of q;
//          lse: batch x heads_q x seq_q float32, natural log, -inf for rows with no key).
std::tuple<at::Tensor, at::Tensor> mlr_attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                         const MlrArgs& a);
// dout: shape and dtype of out. Returns (dq, dk, dv): shapes, dtype and memory order of q, k, v.
std::tuple<at::Tensor, at::Tensor, at::Tensor> mlr_attention_backward(const at::Tensor& q, const at::Tensor& k,
                                                                      const at::Tensor& v, const at::Tensor& out,
                                                                      const at::Tensor& lse, const at::Tensor& dout,
                                                                      const MlrArgs& a);
// The same, writing into dq, dk, dv (shaped as q, k, v; any strides; e.g. views of one buffer).
void mlr_attention_backward_into(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
                                 const at::Tensor& lse, const at::Tensor& dout, const at::Tensor& dq,
                                 const at::Tensor& dk, const at::Tensor& dv, const MlrArgs& a);

// Differentiable MLR attention (torch::autograd::Function over the two ops above). float64
// inputs are computed by the double-precision reference (exact gradients, for gradcheck);
// float32 and bfloat16 by the kernel. Returns out as mlr_attention_forward. q off the CPU (e.g.
// CUDA), or use_torch_ops() on: torch_ops::mlr_attention instead (strata/torch/torch_ops.h).
at::Tensor mlr_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const MlrArgs& a);
// mlr_attention on q, k, v packed as batch x seq x 3 x heads x head_dim (a.layout "bshd"), whose
// backward writes one gradient for qkv (as attention_qkvpacked, strata/torch/attention.h). Off the
// CPU, in float64 or with use_torch_ops(): mlr_attention on the three views.
at::Tensor mlr_attention_qkvpacked(const at::Tensor& qkv, const MlrArgs& a);
// Its backward kernel alone (not differentiable; torch.ops.strata.mlr_attention_qkvpacked_backward),
// as attention_qkvpacked_backward: returns dqkv shaped as qkv.
at::Tensor mlr_attention_qkvpacked_backward(const at::Tensor& qkv, const at::Tensor& out, const at::Tensor& lse,
                                            const at::Tensor& dout, const MlrArgs& a);

// FLOPs of one forward (strata::mlr_attention_flops, exact over allowed pairs; per-sequence
// segment lists need their batch + 1 offsets, as in the forward).
MlrFlops mlr_attention_flops(int64_t batch, int64_t heads_q, int64_t seq_q, int64_t seq_k, int64_t head_dim_v,
                             const MlrArgs& a);

// The double-precision reference (strata::reference::mlr_attention_*, the per-pair formula)
// behind the same checks: q, k, v float32, bfloat16 or float64 (one dtype). Returns
// (out: float64 in q's layout, lse: float64 batch x heads_q x seq_q). Materialises
// seq_q x seq_k per head: for tests and gradcheck only.
std::tuple<at::Tensor, at::Tensor> reference_mlr_attention_forward(const at::Tensor& q, const at::Tensor& k,
                                                                   const at::Tensor& v, const MlrArgs& a);
// Returns (dq, dk, dv) float64 in the layouts of q, k, v; dout: shape of out, dtype of q.
std::tuple<at::Tensor, at::Tensor, at::Tensor> reference_mlr_attention_backward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& dout, const MlrArgs& a);

// The decode cache of MLR attention (strata/mlr_kv_cache.h: per level only the current block's
// r_l-dim key slices) over LibTorch tensors, layout "bshd", float32 or bfloat16 in, fp32 storage.
// Blocks are fixed at construction from a (its context or block_sizes; required with 2 or more
// levels); segments are not supported here (an error names segment_starts / segment_offsets).
//   append: k batch x n x heads_kv x head_dim, v batch x n x heads_kv x head_dim_v (n tokens for
//           every sequence)
//   attend: q batch x 1 x heads_q x head_dim -> batch x 1 x heads_q x head_dim_v (q's dtype): the
//           last position of each sequence over its cache; equals the last row of mlr_attention
//           over the tokens so far (same args, causal) to fp32 round-off.
class MlrDecodeCache {
 public:
  MlrDecodeCache(int64_t batch, int64_t heads_kv, int64_t head_dim_v, int64_t max_seqlen, const MlrArgs& a);
  void append(const at::Tensor& k, const at::Tensor& v);
  at::Tensor attend(const at::Tensor& q) const;
  const MlrKvCache& core() const { return *cache_; }

 private:
  std::unique_ptr<MlrKvCache> cache_;
  int64_t batch_, head_dim_v_;
};

}  // namespace strata::torch
