// tests/cpp/torch_structured_test.cpp: the structured operators through LibTorch
// (strata/torch/structured.h): the differentiable call's float64 gradients against central finite
// differences, the fp32 kernels against the float64 path through autograd, StructuredLinear as a
// module (init, bias, dense weight, bf16), the spec encoding and its errors.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <vector>

#include "strata/torch/structured.h"
#include "torch_test_util.h"

namespace strata {
namespace {

using strata::test::rel_err;
using strata::torch::StructuredLinear;
using strata::torch::StructuredLinearOptions;

std::vector<at::Tensor> random_factors(const StructuredSpec& spec, at::ScalarType t) {
  std::vector<at::Tensor> f;
  for (const auto& s : structured_factor_shapes(spec))
    f.push_back((at::randn(s, at::kDouble) / std::sqrt(double(s[1]))).to(t));
  return f;
}

// loss = sum(y * g): its gradient with respect to every input, by autograd.
std::vector<at::Tensor> grads_of(const StructuredSpec& spec, const at::Tensor& x0, const std::vector<at::Tensor>& f0,
                                 const at::Tensor& g) {
  std::vector<at::Tensor> leaves{x0.detach().clone().requires_grad_()};
  for (const auto& f : f0) leaves.push_back(f.detach().clone().requires_grad_());
  const at::Tensor y = strata::torch::structured_linear(spec, leaves[0], {leaves.begin() + 1, leaves.end()});
  auto grads = ::torch::autograd::grad({y}, leaves, {g.to(y.scalar_type())});
  grads.insert(grads.begin(), y.detach());
  return grads;
}

TEST(TorchStructured, Float64GradientsAreFiniteDifferences) {
  at::manual_seed(0);
  for (const StructuredSpec& spec : {btt_spec({3, 4, 5, 7}, 2, 2), mlr_spec(12, {2, 2, 1}), kronecker_spec(2, 3, 3, 2),
                                     mlr_spec(12, {4, 4}, {1, 3})}) {
    SCOPED_TRACE(spec.name);
    const at::Tensor x = at::randn({3, spec.in}, at::kDouble), g = at::randn({3, spec.out}, at::kDouble);
    const auto f = random_factors(spec, at::kDouble);
    const auto grads = grads_of(spec, x, f, g);
    // Central differences of loss along one random direction per input: (L(+e) - L(-e)) / 2e.
    std::vector<at::Tensor> inputs{x};
    inputs.insert(inputs.end(), f.begin(), f.end());
    for (size_t i = 0; i < inputs.size(); ++i) {
      const at::Tensor dir = at::randn(inputs[i].sizes(), at::kDouble);
      const double eps = 1e-6;
      auto loss = [&](double s) {
        std::vector<at::Tensor> in = inputs;
        in[i] = inputs[i] + s * dir;
        return (strata::torch::structured_linear(spec, in[0], {in.begin() + 1, in.end()}) * g).sum().item<double>();
      };
      const double fd = (loss(eps) - loss(-eps)) / (2 * eps);
      const double an = (grads[i + 1] * dir).sum().item<double>();
      EXPECT_NEAR(an, fd, 1e-6 * std::max(1.0, std::fabs(fd))) << "input " << i;
    }
  }
}

TEST(TorchStructured, KernelsMatchTheFloat64Path) {
  at::manual_seed(1);
  const StructuredSpec spec = btt_spec(btt_factorize(96, 96), 2);
  const at::Tensor x = at::randn({2, 33, 96}), g = at::randn({2, 33, 96});
  const auto f = random_factors(spec, at::kFloat);
  std::vector<at::Tensor> f64;
  for (const auto& t : f) f64.push_back(t.to(at::kDouble));
  const auto got = grads_of(spec, x, f, g), want = grads_of(spec, x.to(at::kDouble), f64, g);
  // fp32 accumulation over at most c * d + b * s = 96 + 24 products per entry: 1e-5.
  for (size_t i = 0; i < got.size(); ++i) EXPECT_LT(rel_err(got[i], want[i]), 1e-5) << "tensor " << i;
}

TEST(TorchStructured, StructuredLinearModule) {
  at::manual_seed(2);
  StructuredLinear layer(StructuredLinearOptions(monarch_spec(64, 8)));
  EXPECT_EQ(layer->factors.size(), 2u);
  EXPECT_EQ(layer->named_parameters().size(), 3u);  // factor_0, factor_1, bias
  const at::Tensor x = at::randn({5, 64});
  const at::Tensor w = layer->dense_weight();
  EXPECT_LT(rel_err(layer->forward(x), at::matmul(x, w.t()) + layer->bias), 1e-5);
  // init: U(-1/sqrt(8), 1/sqrt(8)) per factor (fan-in 8, one level): std 1 / sqrt(3 * 8)
  EXPECT_NEAR(layer->factors[0].std().item<double>(), 1.0 / std::sqrt(24.0), 0.02);
  layer->to(at::kBFloat16);
  EXPECT_EQ(layer->forward(x.to(at::kBFloat16)).scalar_type(), at::kBFloat16);
  StructuredLinear nobias(StructuredLinearOptions(low_rank_spec(6, 4, 2)).bias(false));
  EXPECT_FALSE(nobias->bias.defined());
}

TEST(TorchStructured, SpecEncodingRoundTripsAndNamesErrors) {
  const StructuredSpec s = btt_spec({3, 4, 5, 7}, 2, 2);
  const StructuredSpec back = strata::torch::decode_spec("t", strata::torch::encode_spec(s), strata::torch::spec_alphas(s));
  EXPECT_EQ(strata::torch::encode_spec(back), strata::torch::encode_spec(s));
  auto message = [](auto fn) -> std::string {
    try {
      fn();
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  const auto ints = strata::torch::encode_spec(s);
  EXPECT_NE(message([&] { strata::torch::decode_spec("t", ints, {1.0, 2.0}); }).find("argument 'alpha': expected one value per level (1)"),
            std::string::npos);
  auto cut = ints;
  cut.pop_back();
  EXPECT_NE(message([&] { strata::torch::decode_spec("t", cut, {1.0}); }).find("argument 'spec'"), std::string::npos);
  EXPECT_NE(message([&] { strata::torch::structured_linear(s, at::zeros({2, 34}), random_factors(s, at::kFloat)); })
                .find("argument 'x': expected a tensor (..., 35)"),
            std::string::npos);
}

}  // namespace
}  // namespace strata
