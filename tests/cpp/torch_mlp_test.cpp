// tests/cpp/torch_mlp_test.cpp: the fused GELU MLP through LibTorch (strata/torch/mlp.h): the fp32
// kernels' output and every gradient against float64 autograd of the same math in ATen ops (with
// and without biases, leading dims, a strided input, a needs-grad subset), and bad input. (The
// models' MLP fused and unfused: models_train_test.cpp.)
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <string>
#include <vector>

#include "strata/error.h"
#include "strata/torch/mlp.h"
#include "test_util.h"  // expect_error
#include "torch_test_util.h"

namespace strata {
namespace {

using strata::test::expect_error;
using strata::test::rel_err;

// Output and gradients of sum(y * g) for gelu_mlp at the leaves' dtype (undefined b1 / b2: none);
// in[5], in[6]: the block's LayerNorm weight and bias (undefined: none).
std::vector<at::Tensor> run(const std::vector<at::Tensor>& in, const at::Tensor& g, at::ScalarType t,
                            bool residual = false) {
  std::vector<at::Tensor> leaves;
  for (const auto& a : in) leaves.push_back(a.defined() ? a.detach().to(t).requires_grad_() : at::Tensor());
  strata::torch::MlpBlockArgs blk;
  if (leaves.size() > 5) {
    blk.ln_weight = leaves[5];
    blk.ln_bias = leaves[6];
  }
  blk.residual = residual;
  const at::Tensor y = strata::torch::gelu_mlp(leaves[0], leaves[1], leaves[2], leaves[3], leaves[4], blk);
  std::vector<at::Tensor> wrt;
  for (const auto& l : leaves)
    if (l.defined()) wrt.push_back(l);
  auto grads = ::torch::autograd::grad({y}, wrt, {g.to(t)});
  grads.insert(grads.begin(), y.detach());
  return grads;
}

TEST(TorchMlp, Fp32KernelsMatchFloat64Autograd) {
  at::manual_seed(0);
  for (bool bias : {false, true}) {
    for (auto sizes : std::vector<std::vector<int64_t>>{{3, 37, 24}, {130, 16}, {2, 5, 7, 33}}) {
      const int64_t D = sizes.back(), H = 3 * D + 5;
      SCOPED_TRACE(testing::Message() << "bias " << bias << " x " << at::IntArrayRef(sizes));
      const at::Tensor x = at::randn(sizes, at::kDouble), g = at::randn(sizes, at::kDouble);
      const at::Tensor w1 = at::randn({H, D}, at::kDouble) / std::sqrt(double(D));
      const at::Tensor w2 = at::randn({D, H}, at::kDouble) / std::sqrt(double(H));
      const at::Tensor b1 = bias ? at::randn({H}, at::kDouble) * 0.3 : at::Tensor();
      const at::Tensor b2 = bias ? at::randn({D}, at::kDouble) * 0.3 : at::Tensor();
      const auto want = run({x, w1, b1, w2, b2}, g, at::kDouble);
      const auto got = run({x, w1, b1, w2, b2}, g, at::kFloat);
      ASSERT_EQ(want.size(), got.size());
      for (size_t i = 0; i < want.size(); ++i) {
        // fp32 products over <= H terms and weight gradients summed over <= 185 rows: 5e-5
        EXPECT_LT(rel_err(got[i].to(at::kDouble), want[i]), 5e-5) << "output " << i;
      }
    }
  }
}

// A pre-LN block's MLP half (LayerNorm with and without bias, residual): fp32 against float64 ATen.
TEST(TorchMlp, BlockLayerNormAndResidual) {
  at::manual_seed(5);
  const int64_t D = 48, H = 130;
  for (int mode : {0, 1, 2}) {
    SCOPED_TRACE(testing::Message() << "mode " << mode);
    const at::Tensor x = at::randn({4, 33, D}, at::kDouble) * 2 + 0.5, g = at::randn({4, 33, D}, at::kDouble);
    const at::Tensor w1 = at::randn({H, D}, at::kDouble) / std::sqrt(double(D));
    const at::Tensor w2 = at::randn({D, H}, at::kDouble) / std::sqrt(double(H));
    const at::Tensor lnw = 1 + 0.2 * at::randn({D}, at::kDouble);
    const at::Tensor lnb = mode == 0 ? 0.2 * at::randn({D}, at::kDouble) : at::Tensor();
    const std::vector<at::Tensor> in =
        mode == 2 ? std::vector<at::Tensor>{x, w1, {}, w2, {}} : std::vector<at::Tensor>{x, w1, {}, w2, {}, lnw, lnb};
    const bool residual = mode != 1;
    const auto want = run(in, g, at::kDouble, residual), got = run(in, g, at::kFloat, residual);
    ASSERT_EQ(want.size(), got.size());
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_LT(rel_err(got[i].to(at::kDouble), want[i]), 5e-5) << "output " << i;
  }
}

// ln_linear: fp32 kernels against float64 ATen autograd (LayerNorm with and without bias, none).
TEST(TorchMlp, LnLinearMatchesFloat64Autograd) {
  at::manual_seed(6);
  const int64_t D = 40, H = 120;
  for (int mode : {0, 1, 2}) {
    SCOPED_TRACE(testing::Message() << "mode " << mode);
    const at::Tensor x = at::randn({3, 21, D}, at::kDouble) * 2 - 0.3, g = at::randn({3, 21, H}, at::kDouble);
    const at::Tensor w = at::randn({H, D}, at::kDouble) / std::sqrt(double(D)), b = at::randn({H}, at::kDouble);
    const at::Tensor lnw = 1 + 0.2 * at::randn({D}, at::kDouble), lnb = 0.2 * at::randn({D}, at::kDouble);
    auto go = [&](at::ScalarType t) {
      std::vector<at::Tensor> leaves{x.to(t).requires_grad_(), w.to(t).requires_grad_(), b.to(t).requires_grad_()};
      strata::torch::MlpBlockArgs blk;
      if (mode < 2) {
        leaves.push_back(lnw.to(t).requires_grad_());
        blk.ln_weight = leaves.back();
      }
      if (mode == 0) {
        leaves.push_back(lnb.to(t).requires_grad_());
        blk.ln_bias = leaves.back();
      }
      const at::Tensor y = strata::torch::ln_linear(leaves[0], leaves[1], leaves[2], blk);
      auto grads = ::torch::autograd::grad({y}, leaves, {g.to(t)});
      grads.insert(grads.begin(), y.detach());
      return grads;
    };
    const auto want = go(at::kDouble), got = go(at::kFloat);
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_LT(rel_err(got[i].to(at::kDouble), want[i]), 5e-5) << "output " << i;
  }
}

TEST(TorchMlp, StridedInputAndPartialGradients) {
  at::manual_seed(1);
  const int64_t D = 20, H = 64;
  const at::Tensor big = at::randn({50, 2 * D}), w1 = at::randn({H, D}) * 0.2, w2 = at::randn({D, H}) * 0.2;
  const at::Tensor x = big.slice(1, 0, 2 * D, 2);  // column stride 2: copied to rows first
  const at::Tensor want = at::linear(at::gelu(at::linear(x.to(at::kDouble), w1.to(at::kDouble))), w2.to(at::kDouble));
  EXPECT_LT(rel_err(strata::torch::gelu_mlp(x, w1, {}, w2, {}).to(at::kDouble), want), 2e-5);
  // only w2 needs a gradient
  const at::Tensor w2l = w2.detach().requires_grad_();
  const at::Tensor y = strata::torch::gelu_mlp(x, w1, {}, w2l, {});
  y.sum().backward();
  const at::Tensor w2d = w2.to(at::kDouble).requires_grad_();
  at::linear(at::gelu(at::linear(x.to(at::kDouble), w1.to(at::kDouble))), w2d).sum().backward();
  EXPECT_LT(rel_err(w2l.grad().to(at::kDouble), w2d.grad()), 5e-5);
}

TEST(TorchMlp, BadInput) {
  const at::Tensor x = at::randn({4, 8}), w1 = at::randn({16, 8}), w2 = at::randn({8, 16});
  expect_error([&] { strata::torch::gelu_mlp(x, w1, at::randn({15}), w2, {}); }, {"b1", "[16]"});
  expect_error([&] { strata::torch::gelu_mlp(x, w1, at::empty({0}), w2, {}); }, {"b1", "[16]"});
  expect_error([&] { strata::torch::gelu_mlp(x, w1, {}, w2, at::randn({9})); }, {"b2", "[8]"});
  expect_error([&] { strata::torch::gelu_mlp(at::randn({4, 7}), w1, {}, w2, {}); }, {"x", "8"});
  expect_error([&] { strata::torch::gelu_mlp(x, w1, {}, at::randn({8, 15}), {}); }, {"w2", "[8, 16]"});
  expect_error([&] { strata::torch::gelu_mlp(x.to(at::kBFloat16), w1, {}, w2, {}); }, {"x", "float32"});
}

}  // namespace
}  // namespace strata
