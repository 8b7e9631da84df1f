// tests/cpp/torch_test_util.h: what every LibTorch test needs: a normwise relative error between
// tensors, outputs and gradients of a function by autograd, and the message of a strata::Error.
#pragma once
#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "strata/error.h"
#include "strata/torch/torch_ops.h"

namespace strata::test {

// max |got - want| / max(max |want|, floor) in float64 over the finite entries of want; infinite
// entries must match exactly; a NaN in got, or where want has none, is an infinite error (the
// test that expects NaN says so by comparing isnan itself).
inline double rel_err(const at::Tensor& got, const at::Tensor& want, double floor = 1e-30) {
  const at::Tensor g = got.to(at::kDouble), w = want.to(at::kDouble);
  if (g.sizes() != w.sizes()) return std::numeric_limits<double>::infinity();
  if (g.numel() == 0) return 0.0;
  if (g.isnan().any().item<bool>() || w.isnan().any().item<bool>()) return std::numeric_limits<double>::infinity();
  const at::Tensor fin = w.isfinite();
  if (!at::equal(g.masked_select(fin.logical_not()), w.masked_select(fin.logical_not())))
    return std::numeric_limits<double>::infinity();
  if (!fin.any().item<bool>()) return 0.0;
  const double num = (g.masked_select(fin) - w.masked_select(fin)).abs().max().item<double>();
  return num / std::max(w.masked_select(fin).abs().max().item<double>(), floor);
}

// {out, dq, dk, dv} of loss = sum(fn(q, k, v) * g) by autograd, from detached copies of q, k, v.
template <class Fn>
std::vector<at::Tensor> out_and_grads(Fn fn, const at::Tensor& q0, const at::Tensor& k0, const at::Tensor& v0,
                                      const at::Tensor& g) {
  const at::Tensor q = q0.detach().clone().requires_grad_(), k = k0.detach().clone().requires_grad_(),
                   v = v0.detach().clone().requires_grad_();
  const at::Tensor out = fn(q, k, v);
  const auto grads = ::torch::autograd::grad({out}, {q, k, v}, {g.to(out.scalar_type())});
  return {out.detach(), grads[0], grads[1], grads[2]};
}

// {out, then the gradient of every parameter of m (zeros where none)} of loss = sum(fwd(x) * w),
// from zeroed gradients.
template <class Fwd>
std::vector<at::Tensor> out_and_param_grads(::torch::nn::Module& m, Fwd fwd, const at::Tensor& x, const at::Tensor& w) {
  m.zero_grad();
  const at::Tensor y = fwd(x);
  (y * w).sum().backward();
  std::vector<at::Tensor> r{y.detach()};
  for (const auto& p : m.named_parameters())
    r.push_back(p.value().grad().defined() ? p.value().grad().clone() : at::zeros_like(p.value()));
  return r;
}

// rel_err of each parameter gradient (entries 1.. of out_and_param_grads) against the LARGEST one
// of `want`'s: some gradients are zero up to round-off by symmetry (a bias added to every key
// shifts each softmax row by a constant), where an error relative to their own size is noise.
inline std::vector<double> param_grad_errs(const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& want) {
  double scale = 0;
  for (size_t i = 1; i < want.size(); ++i) scale = std::max(scale, want[i].abs().max().item<double>());
  std::vector<double> e;
  for (size_t i = 1; i < want.size() && i < got.size(); ++i) e.push_back(rel_err(got[i], want[i], scale));
  return e;
}

// f() with strata::torch::use_torch_ops off, then on (restored after): {the kernels' path, the
// torch-ops path}.
template <class F>
auto on_both_paths(F f) -> std::pair<decltype(f()), decltype(f())> {
  decltype(f()) kernels, torch_ops;
  {
    ::strata::torch::UseTorchOps off(false);
    kernels = f();
  }
  {
    ::strata::torch::UseTorchOps on(true);
    torch_ops = f();
  }
  return {kernels, torch_ops};
}

// The message of the strata::Error fn throws ("" if it throws none).
template <class Fn>
std::string message(Fn fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace strata::test
