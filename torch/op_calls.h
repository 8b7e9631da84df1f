// torch/op_calls.h (private to torch/): the forward / backward kernel ops called through the
// dispatcher (torch.ops.strata.*_forward / *_backward) rather than as C++ functions. The autograd
// Functions behind the differentiable ops use these: on real CPU tensors the dispatcher reaches
// the same CPU kernel, and under torch.compile's tracing (fake, functional, symbolic-size tensors)
// it reaches the op's fake implementation (python/strata/_fake.py), so the traced graph holds the
// kernel ops as opaque nodes instead of failing on a tensor without data. Arguments and results
// as the C++ functions of the same name (strata/torch/{attention,mlr,mlp,monarch,structured}.h).
#pragma once
#include <ATen/ATen.h>

#include <array>
#include <tuple>
#include <vector>

#include "strata/torch/attention.h"
#include "strata/torch/mlp.h"
#include "strata/torch/mlr.h"
#include "strata/torch/monarch.h"
#include "strata/torch/structured.h"

namespace strata::torch::op_calls {

// strata::attention_forward / _backward (torch/ops_attention.cpp).
std::tuple<at::Tensor, at::Tensor> attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                     const AttentionArgs& a);
std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_backward(const at::Tensor& q, const at::Tensor& k,
                                                                  const at::Tensor& v, const at::Tensor& out,
                                                                  const at::Tensor& lse, const at::Tensor& dout,
                                                                  const AttentionArgs& a);

// strata::attention_qkvpacked_backward (torch/ops_attention.cpp): dqkv shaped as qkv (batch x seq x
// 3 x heads x head_dim), written by one backward (strata::torch::attention_backward_into).
at::Tensor attention_qkvpacked_backward(const at::Tensor& qkv, const at::Tensor& out, const at::Tensor& lse,
                                        const at::Tensor& dout, const AttentionArgs& a);

// strata::mlr_attention_forward / _backward (torch/ops_mlr.cpp).
std::tuple<at::Tensor, at::Tensor> mlr_attention_forward(const at::Tensor& q, const at::Tensor& k,
                                                         const at::Tensor& v, const MlrArgs& a);
std::tuple<at::Tensor, at::Tensor, at::Tensor> mlr_attention_backward(const at::Tensor& q, const at::Tensor& k,
                                                                      const at::Tensor& v, const at::Tensor& out,
                                                                      const at::Tensor& lse, const at::Tensor& dout,
                                                                      const MlrArgs& a);

// strata::mlr_attention_qkvpacked_backward (torch/ops_mlr.cpp), as attention_qkvpacked_backward.
at::Tensor mlr_attention_qkvpacked_backward(const at::Tensor& qkv, const at::Tensor& out, const at::Tensor& lse,
                                            const at::Tensor& dout, const MlrArgs& a);

// strata::gelu_mlp_forward / _backward, strata::ln_linear_forward / _backward (torch/ops_mlp.cpp).
std::tuple<at::Tensor, at::Tensor, at::Tensor> gelu_mlp_forward(const at::Tensor& x, const at::Tensor& w1,
                                                                const at::Tensor& b1, const at::Tensor& w2,
                                                                const at::Tensor& b2, const MlpBlockArgs& block);
std::array<at::Tensor, 7> gelu_mlp_backward(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& w1,
                                            const at::Tensor& w2, const at::Tensor& h, const at::Tensor& stats,
                                            const MlpBlockArgs& block, std::array<bool, 7> output_mask);
std::tuple<at::Tensor, at::Tensor> ln_linear_forward(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                                                     const MlpBlockArgs& block);
std::array<at::Tensor, 5> ln_linear_backward(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& w,
                                             const at::Tensor& stats, const MlpBlockArgs& block,
                                             std::array<bool, 5> output_mask);

// strata::monarch_attention_forward / _backward (torch/ops_monarch.cpp). save_state false: the
// state is an empty tensor (inference needs none).
std::tuple<at::Tensor, at::Tensor> monarch_attention_forward(const at::Tensor& q, const at::Tensor& k,
                                                             const at::Tensor& v, const MonarchArgs& a,
                                                             bool save_state);
std::tuple<at::Tensor, at::Tensor, at::Tensor> monarch_attention_backward(const at::Tensor& q, const at::Tensor& k,
                                                                          const at::Tensor& v, const at::Tensor& state,
                                                                          const at::Tensor& dout,
                                                                          const MonarchArgs& a);

// strata::performer_omega (torch/ops_monarch.cpp).
at::Tensor performer_omega(int64_t head_dim, int64_t num_features, std::optional<int64_t> seed);

// strata::structured_forward / _forward_saving / _backward (torch/ops_structured.cpp).
at::Tensor structured_forward(const StructuredSpec& spec, const at::Tensor& x, const std::vector<at::Tensor>& factors);
std::tuple<at::Tensor, at::Tensor> structured_forward_saving(const StructuredSpec& spec, const at::Tensor& x,
                                                             const std::vector<at::Tensor>& factors);
std::tuple<at::Tensor, std::vector<at::Tensor>> structured_backward(const StructuredSpec& spec, const at::Tensor& x,
                                                                    const std::vector<at::Tensor>& factors,
                                                                    const at::Tensor& dy, bool input_grad,
                                                                    bool factor_grads, const at::Tensor& saved);

}  // namespace strata::torch::op_calls
