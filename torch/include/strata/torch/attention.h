// strata/torch/attention.h: the LibTorch face of strata's dense attention (the ONLY layer that
// includes torch). Functions check devices/dtypes/shapes (errors name the argument), allocate
// outputs, wrap tensors as strata::TensorView and call the torch-free core
// (include/strata/attention.h, whose semantics apply unchanged).
//
// Tensors are CPU, float32 or bfloat16 (float64 only through attention(), see below), any strides.
//   q: batch x seq_q x heads_q x head_dim  (layout "bshd"; "bhsd" swaps dims 1 and 2)
//   k: batch x seq_k x heads_kv x head_dim, v: batch x seq_k x heads_kv x head_dim_v
//   out: batch x seq_q x H x head_dim_v, H = max(heads_q, heads_kv)
// Heads: heads_q % heads_kv == 0 (GQA / MQA) or heads_kv % heads_q == 0 (a query shared by groups
// of kv heads, e.g. heads_q = 1: one q for every head, never copied; dq has q's shape and sums
// its heads' contributions). An expand()ed q (stride 0 over heads) also works, at H-fold cost in
// the backward's packing; passing the unexpanded q with heads_q = 1 is the cheaper form.
#pragma once
#include <ATen/ATen.h>

#include <optional>
#include <string>
#include <tuple>

#include "strata/attention.h"
#include "strata/torch/view_of.h"  // view_of (kept reachable from here)

namespace strata::torch {

struct AttentionArgs {
  std::optional<double> scale;  // default 1/sqrt(head_dim)
  bool causal = false;
  int64_t window_left = -1, window_right = -1;  // -1: unbounded
  int64_t num_global = 0;
  std::optional<at::Tensor> key_padding_mask;   // batch x seq_k, bool/uint8, true = attend
  std::optional<at::Tensor> bias;               // broadcastable to batch x H x seq_q x seq_k
                                                // (fewer than 4 dims: leading 1s are implied)
  std::string layout = "bshd";                  // or "bhsd"
  // The products of bfloat16 inputs (strata::Compute, strata/cpu.h): "auto" (bf16 products on
  // AMX-BF16, or AVX512-BF16 where it outruns fp32 FMAs here), "fp32", "avx512_bf16", "amx_bf16".
  std::string compute = "auto";
};

// The kernels alone (attention_forward, attention_backward; also torch.ops.strata.attention_forward
// and _backward) are NOT differentiable: their outputs never require grad, whatever the inputs.
// For gradients use attention() below.
// Returns (out: batch x seq_q x H x head_dim_v in q's layout, lse: batch x H x seq_q f32).
std::tuple<at::Tensor, at::Tensor> attention_forward(const at::Tensor& q, const at::Tensor& k,
                                                     const at::Tensor& v, const AttentionArgs& a);
// Returns (dq, dk, dv).
std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_backward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
    const at::Tensor& lse, const at::Tensor& dout, const AttentionArgs& a);
// The same, writing into dq, dk, dv (shaped as q, k, v; any strides; e.g. views of one buffer).
void attention_backward_into(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
                             const at::Tensor& lse, const at::Tensor& dout, const at::Tensor& dq,
                             const at::Tensor& dk, const at::Tensor& dv, const AttentionArgs& a);

// Differentiable attention (torch::autograd::Function over the two ops above). float64 inputs
// are computed by the double-precision reference (exact gradients, for gradcheck); float32 and
// bfloat16 by the kernel. The bias gets no gradient: passing a bias that requires grad throws.
// q off the CPU (e.g. CUDA), or use_torch_ops() on: torch_ops::attention instead, the same
// semantics in ATen ops (strata/torch/torch_ops.h); so for paper_gswa_attention below.
at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const AttentionArgs& a = {});

// attention() on q, k, v packed in one tensor, qkv: batch x seq x 3 x heads x head_dim (bshd: a
// fused q/k/v projection's output viewed as such), self-attention with equal heads. The same
// kernels and results as attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], a), but the backward
// writes dq, dk and dv into one gradient of qkv's shape (attention() returns three, which the
// autograd of a split then copies into one: 12 MB a layer at the char-LM's training size).
// a.layout must be "bshd". Off the CPU, in float64 or with use_torch_ops(): attention() on the
// three views.
at::Tensor attention_qkvpacked(const at::Tensor& qkv, const AttentionArgs& a = {});
// Its backward kernel alone (not differentiable; torch.ops.strata.attention_qkvpacked_backward):
// out, lse from attention_forward on qkv's three views, dout shaped as out. Returns dqkv shaped as
// qkv (contiguous; dq, dk, dv written into its three views by one backward).
at::Tensor attention_qkvpacked_backward(const at::Tensor& qkv, const at::Tensor& out, const at::Tensor& lse,
                                        const at::Tensor& dout, const AttentionArgs& a = {});

// The double-precision reference (strata::reference) behind the same checks: q, k, v float32,
// bfloat16 or float64 (one dtype). Returns (out: float64 in q's layout, lse: float64
// batch x H x seq_q). Materialises seq_q x seq_k per head: for tests and gradcheck only.
std::tuple<at::Tensor, at::Tensor> reference_attention_forward(const at::Tensor& q,
                                                               const at::Tensor& k,
                                                               const at::Tensor& v,
                                                               const AttentionArgs& a);
// Returns (dq, dk, dv) float64 in the layouts of q, k, v; dout: shape of out, dtype of q.
std::tuple<at::Tensor, at::Tensor, at::Tensor> reference_attention_backward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& dout,
    const AttentionArgs& a);

// The paper's GSWA baseline (see PaperGswaOptions in the core header): differentiable
// composition of two attentions. scale_a / scale_b: the global / windowed branch's logit scale;
// unset: the reference code's 8 / split_a and 8 / (head_dim - split_a).
at::Tensor paper_gswa_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                int64_t split_a, int64_t window, std::optional<double> scale_a = {},
                                std::optional<double> scale_b = {}, const std::string& layout = "bshd");

}  // namespace strata::torch
