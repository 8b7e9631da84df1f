// strata/torch/peers.h: the torch-op peers of the structured-attention benches: published
// algorithms transcribed with ATen ops, so that a bench times strata's kernel against the way the
// method is written in torch, and checks both against each other and against the core's double
// references (tests/cpp/torch_peers_test.cpp). Not kernels: they run at ATen speed and
// materialise what the algorithm materialises. Differentiable by torch's autograd when the inputs
// require grad (the benches time and check their backward through it).
//
// Tensors: CPU, float32, bfloat16 or float64 (one dtype), any strides, layout BHSD (the layout
// torch code uses; SDPA's):
//   q: batch x heads x seq x head_dim,  k: batch x heads x seq x head_dim (same heads: no GQA)
//   v: batch x heads x seq x head_dim_v;  out: batch x heads x seq x head_dim_v, dtype of q
// Self-attention only (q and k have the same seq). Errors name the argument (strata::Error).
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace strata::torch::peers {

// MLR attention as the reference code builds it (AttentionMLR.forward in
// YilunKuang/structured-attention, src/model.py), in the same torch ops: q and k are split along
// head_dim into levels of ranks r_1..r_L (sum = head_dim); level l (0-based) cuts the sequence
// into 2^l blocks of b_l = T / 2^l tokens, stacks the blocks, forms every block product
// Q_blk K_blk^T in one batched matmul scaled by 1/r_l, and copies each product onto the diagonal
// of a zero T x T buffer; the levels' buffers are summed, the causal mask (when `causal`) sets
// the entries above the diagonal to -inf, then softmax over keys and @ v. Materialises
// L + 1 buffers of batch x heads x T x T.
// = strata::mlr_attention_forward with these ranks, default blocks (context T) and scale
// (c_l = 1/r_l), and strata::reference::mlr_attention_forward_blockwise. Requires 1..16 ranks
// >= 1 summing to head_dim and T >= 1 a multiple of 2^(L-1) (the construction splits evenly).
at::Tensor mlr_blockwise_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const std::vector<int64_t>& ranks, bool causal = true);

// MonarchAttention (Yaras et al., NeurIPS 2025; strata/monarch.h's algorithm) in torch ops,
// batched over (batch, head): stable mode, post-padding, scale 1/sqrt(head_dim), no key padding
// mask. Blocks: B = block_size (0: floor(sqrt(seq)); > seq: one block, as the kernel), M =
// ceil(seq / B), the sequence zero-padded at the end to M*B (padded tokens are never keys and
// never queries). num_steps = T >= 1 alternating-maximisation steps:
//   R-step  R_k[j, i] = softmax_i(sc * a[k, j].k_{kB+i} / c[k, j])   over block k's real keys
//           al[j, k] = sc * sum_i R k,  cl[j, k] = sum_i R log R
//   L-step  L_j[l, k] = softmax_k(q_{lB+j}.al[j, k] - cl[j, k])
//           a[k, j] = sum_l w L q,  c[k, j] = sum_l w L   (w = 1 for real queries, 0 for padding)
// starting from a = q, c = 1; the last step outputs O_{lB+j} = sum_k L_j[l, k] sum_i R v.
// Materialises per (batch, head) M x B x B (R) and B x M x M (L), never seq x seq.
// = strata::monarch_attention_forward and strata::reference::monarch_attention_forward with
// MonarchOptions{num_steps, block_size} (layout BHSD); runs torch_ops::monarch_attention
// (strata/torch/torch_ops.h), which generalises it (pad, scale, GQA, layouts).
at::Tensor monarch_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t num_steps,
                             int64_t block_size = 0);

}  // namespace strata::torch::peers
