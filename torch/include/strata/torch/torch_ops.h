// strata/torch/torch_ops.h: the torch-ops path of the LibTorch layer: each custom op written with
// ATen ops only, so that it runs on any device ATen has (CUDA included) and torch's autograd
// differentiates it, with EXACTLY the semantics of the kernel it stands in for (arguments, layouts,
// head groups, scale defaults, masks, empty rows). They materialise what the formulas do (seq x seq
// scores per head where the op has no ATen kernel of its own): for devices without a strata kernel,
// and to test the whole model path on the CPU.
//
// Routing: strata::torch::attention, paper_gswa_attention, mlr_attention, structured_linear and
// monarch_attention call the function of the same name below when their input tensor (q, or x) is
// not on the CPU, or when use_torch_ops() is on; otherwise their kernels (float32 / bfloat16) or
// double references (float64). Entry points without a torch-ops version (the forward / backward
// kernels alone, the decode caches) take CPU tensors only and say so naming the argument.
//
// Tensors: float32, bfloat16 or float64 (the dtypes the kernels and references take), any device
// (all of one call's on q's), any strides. Outputs: the kernels' shapes in the caller's layout
// (memory order may differ from the kernels'). The checks are the core's (errors name the argument).
#pragma once
#include <ATen/ATen.h>

#include <optional>
#include <string>
#include <vector>

#include "strata/structured.h"
#include "strata/torch/attention.h"
#include "strata/torch/mlr.h"
#include "strata/torch/monarch.h"

namespace strata::torch {

// The process-wide switch (an atomic; off by default): on, the public ops above take the
// torch-ops path for CPU tensors too. For tests and for devices without a kernel.
void set_use_torch_ops(bool on);
bool use_torch_ops();

// RAII: sets the switch for a scope and restores the previous value (tests).
class UseTorchOps {
 public:
  explicit UseTorchOps(bool on) : previous_(use_torch_ops()) { set_use_torch_ops(on); }
  ~UseTorchOps() { set_use_torch_ops(previous_); }
  UseTorchOps(const UseTorchOps&) = delete;
  UseTorchOps& operator=(const UseTorchOps&) = delete;

 private:
  bool previous_;
};

// The torch-ops MLR path's fast case (an atomic; on by default): self-attention of the default
// dyadic geometry (causal, or non-causal with seq == context) as dense attentions over key regions
// merged by their lse, on torch's fused kernels, instead of L dense seq x seq score matrices
// (torch/mlr_regions.h; CUDA float32, CPU float32 / bf16 / float64). Off: always the general
// composition (tests compare the two).
void set_use_mlr_regions(bool on);
bool use_mlr_regions();

// True when a call whose main input is t takes the torch-ops path: the switch is on, or t is
// defined and not on the CPU (no strata kernel there).
bool takes_torch_ops(const at::Tensor& t);

namespace torch_ops {

// strata::torch::attention (strata/torch/attention.h): at::scaled_dot_product_attention with an
// additive mask (causal, windows, global tokens, key padding, bottom-right aligned; plus the bias)
// when there is one; GQA and the shared query by expanding heads. A row with no allowed key gives
// zeros and zero gradients (the kernel's convention, not SDPA's NaN). The scale is rounded to
// float32 as the kernel's is. A bias gets a gradient here only if it requires one (the public
// attention() refuses that while grad mode is on).
at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const AttentionArgs& a = {});

// strata::torch::paper_gswa_attention (the paper's GSWA: two attentions, probabilities summed).
at::Tensor paper_gswa_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t split_a,
                                int64_t window, std::optional<double> scale_a = {}, std::optional<double> scale_b = {},
                                const std::string& layout = "bshd");

// strata::torch::mlr_attention (strata/torch/mlr.h), every MlrArgs field: per level the block
// products c_l q_l k_l^T where the level's blocks (strata::mlr_block_starts: fixed, default,
// segments, per sequence) agree, summed; 1/L, level averaging, causal and cross-segment masks;
// softmax with empty rows as zeros; V dense. Materialises batch x heads x seq_q x seq_k, except
// in the fast case of use_mlr_regions() (seq_q == seq_k, dyadic blocks, no segments).
at::Tensor mlr_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const MlrArgs& a);

// strata::torch::structured_linear (strata/torch/structured.h): y = x M^T for every spec the core
// validates, level by level: the right stage as a batched matmul over its (padded) chunks, the
// inner permutation, the left stage likewise, the out permutation, times alpha. Padding entries of
// the factors are never read (zero gradient), as the kernel's.
at::Tensor structured_linear(const StructuredSpec& spec, const at::Tensor& x, const std::vector<at::Tensor>& factors);

// strata::torch::monarch_attention (strata/torch/monarch.h) in stable mode: any num_steps,
// block_size, pad ("post" / "pre"), scale, layout, GQA. Not here (strata::Error naming the arg):
// mode reference and key_padding_mask.
at::Tensor monarch_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const MonarchArgs& a = {});

}  // namespace torch_ops
}  // namespace strata::torch
