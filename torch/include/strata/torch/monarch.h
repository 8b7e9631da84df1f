// strata/torch/monarch.h: the LibTorch face of strata's MonarchAttention (Yaras et al., NeurIPS
// 2025). Functions check devices/dtypes/shapes (errors name the argument), allocate outputs, wrap
// tensors as strata::TensorView and call the torch-free core (include/strata/monarch.h, whose
// semantics apply unchanged: steps, blocks, padding, the stable / reference modes, masks).
//
// Tensors are CPU, float32 or bfloat16 (float64 only through monarch_attention() and the
// reference functions), any strides; layout "bshd" (or "bhsd": dims 1 and 2 swapped):
//   q: batch x seq x heads_q  x head_dim
//   k: batch x seq x heads_kv x head_dim       heads_q % heads_kv == 0 (GQA), self-attention only
//   v: batch x seq x heads_kv x head_dim_v
//   state: batch x heads_q x (T-1) x (M*B) x head_dim, float32 (M = ceil(seq/B); empty for T = 1)
#pragma once
#include <ATen/ATen.h>

#include <optional>
#include <string>
#include <string_view>
#include <tuple>

#include "strata/monarch.h"

namespace strata::torch {

struct MonarchArgs {
  int64_t num_steps = 1;                        // T, 1..1024 (a bound against typos like 2**40)
  int64_t block_size = 0;                       // B >= 1; 0 = floor(sqrt(seq)); > seq = one block
  MonarchPad pad = MonarchPad::post;            // zero-padding of seq to M*B at the end or the front
  MonarchMode mode = MonarchMode::stable;       // or reference (ma_torch.py's arithmetic)
  std::optional<double> scale;                  // default 1/sqrt(head_dim)
  std::optional<at::Tensor> key_padding_mask;   // batch x seq, bool/uint8, true = token (key AND query)
  std::string layout = "bshd";                  // or "bhsd"
  // The products of a bfloat16 forward and backward (strata/cpu.h names: "auto", "fp32",
  // "avx512_bf16", "amx_bf16"). "auto" keeps fp32 for Monarch (its forward's bf16 path is not
  // faster: strata/monarch.h); an engine name runs the forward's products and the backward's
  // gradient products on it (an error naming 'compute' where the CPU lacks it). float32 inputs
  // always compute in fp32.
  std::string compute = "auto";
};

// pad and mode by the names the op schema and Python use ("post" / "pre", "stable" /
// "reference"): the conversion at that boundary, once. parse_* throw strata::Error naming the
// argument ('pad' / 'mode') and listing the names; *_name return the name.
MonarchPad parse_monarch_pad(const char* where, std::string_view s);
MonarchMode parse_monarch_mode(const char* where, std::string_view s);
using ::strata::monarch_mode_name;  // the core's (strata/monarch.h)
using ::strata::monarch_pad_name;

// The kernels alone (monarch_attention_forward / _backward, here and as torch.ops.strata.*) are
// NOT differentiable: their outputs never require grad; use monarch_attention() for gradients.
// Returns (out: batch x seq x heads_q x head_dim_v in q's layout and memory order, dtype of q;
//          state: see above, the input of every R-step after the first, for the backward;
//          undefined when save_state is false: inference needs no (T-1) x N x D copy per head).
std::tuple<at::Tensor, at::Tensor> monarch_attention_forward(const at::Tensor& q, const at::Tensor& k,
                                                             const at::Tensor& v, const MonarchArgs& a,
                                                             bool save_state = true);
// dout: shape and dtype of out. state: the forward's, or an undefined tensor to recompute it
// (T-1 extra forward steps). Returns (dq, dk, dv): shapes, dtype and memory order of q, k, v.
std::tuple<at::Tensor, at::Tensor, at::Tensor> monarch_attention_backward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& state,
    const at::Tensor& dout, const MonarchArgs& a);

// Differentiable MonarchAttention (torch::autograd::Function over the two functions above; it
// saves q, k, v, the mask and the state). float64 inputs are computed by the double-precision
// reference on both passes (exact gradients, for gradcheck; materialises seq x seq per head).
// Differentiable once: a second derivative raises. q off the CPU (e.g. CUDA), or use_torch_ops()
// on: torch_ops::monarch_attention instead (stable mode, no mask; strata/torch/torch_ops.h).
at::Tensor monarch_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const MonarchArgs& a = {});

// The double-precision reference (strata::reference) behind the same checks: q, k, v float32,
// bfloat16 or float64 (one dtype). Returns out: float64, in q's layout. For tests and gradcheck.
at::Tensor reference_monarch_attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                               const MonarchArgs& a);
// Returns (dq, dk, dv) float64 in the layouts of q, k, v; dout: shape of out, dtype of q.
std::tuple<at::Tensor, at::Tensor, at::Tensor> reference_monarch_attention_backward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& dout, const MonarchArgs& a);

// FLOPs (2 x multiply-accumulates, matmuls only: the paper's count) of one forward over one
// sequence of N tokens, all `heads` query heads, head dims D (q, k) and Dv (v). With the block
// geometry of the kernel (B = 0: floor(sqrt(N)); B > N: one block of N), M = ceil(N/B), P = M*B:
//   MACs per head = P * [ D * ((T-1)(2B + 2M) + 2B + M) + Dv * (B + M) ]
// (steps before the last: R logits, al, L logits, a: D*(2B+2M) per token; the last step: R logits,
// al, y = R v, L logits, O = L y). For Dv = D this is the design page's P*D*[T(2B+2M) + B], which
// ref's plots use with P = M*B (ViT-B/16, N = 197, B = 14, T = 1, 12 heads x 12 layers:
// 1.39e8 MACs there, 2.79e8 FLOPs here). N = 0 gives 0. Throws strata::Error for negative sizes,
// T < 1 or B < 0. The count is the core's (strata::monarch_attention_flops, strata/monarch.h).
double monarch_attention_flops(int64_t N, int64_t heads, int64_t D, int64_t Dv, int64_t T, int64_t B);

}  // namespace strata::torch
