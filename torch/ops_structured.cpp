// torch/ops_structured.cpp: the kernels of the structured-operator ops torch.ops.strata.structured_*
// (schemas in torch/library.cpp). A spec travels as (int[] spec, float[] alpha): the named
// constructors return the integer list (alpha: 1.0 per level), every other op decodes it once
// (strata::torch::decode_spec; errors name 'spec' or 'alpha'). CPU kernels for the forward /
// backward (not differentiable), CompositeImplicitAutograd for the differentiable
// structured_linear, CompositeExplicitAutograd for to_dense (not differentiable; a fake for
// torch.compile), catch-all kernels for the spec functions (no tensors).
#include <torch/library.h>

#include <optional>
#include <string>

#include "binding_util.h"
#include "op_calls.h"
#include "strata/torch/structured.h"

namespace strata::torch {
namespace {

using binding::cat;
using binding::rethrow_as_c10;

std::vector<int64_t> ints(c10::IntArrayRef a) { return a.vec(); }
std::vector<double> doubles(c10::ArrayRef<double> a) { return a.vec(); }
std::vector<at::Tensor> tensors(at::TensorList t) { return t.vec(); }

at::Tensor forward_op(const at::Tensor& x, at::TensorList factors, c10::IntArrayRef spec, c10::ArrayRef<double> alpha) {
  return rethrow_as_c10([&] {
    return structured_forward(decode_spec("structured_forward", ints(spec), doubles(alpha)), x, tensors(factors));
  });
}

std::tuple<at::Tensor, at::Tensor> forward_saving_op(const at::Tensor& x, at::TensorList factors,
                                                     c10::IntArrayRef spec, c10::ArrayRef<double> alpha) {
  return rethrow_as_c10([&] {
    return structured_forward_saving(decode_spec("structured_forward_saving", ints(spec), doubles(alpha)), x,
                                     tensors(factors));
  });
}

std::tuple<std::optional<at::Tensor>, std::vector<at::Tensor>> backward_op(const at::Tensor& x, at::TensorList factors,
                                                                           c10::IntArrayRef spec,
                                                                           c10::ArrayRef<double> alpha,
                                                                           const at::Tensor& dy, bool input_grad,
                                                                           bool factor_grads,
                                                                           const std::optional<at::Tensor>& saved) {
  return rethrow_as_c10([&] {
    auto [dx, df] = structured_backward(decode_spec("structured_backward", ints(spec), doubles(alpha)), x,
                                        tensors(factors), dy, input_grad, factor_grads,
                                        saved.value_or(at::Tensor()));
    return std::tuple<std::optional<at::Tensor>, std::vector<at::Tensor>>(
        dx.defined() ? std::optional<at::Tensor>(dx) : std::nullopt, df);
  });
}

at::Tensor linear_op(const at::Tensor& x, at::TensorList factors, c10::IntArrayRef spec, c10::ArrayRef<double> alpha) {
  return rethrow_as_c10([&] {
    return structured_linear(decode_spec("structured_linear", ints(spec), doubles(alpha)), x, tensors(factors));
  });
}

at::Tensor to_dense_op(at::TensorList factors, c10::IntArrayRef spec, c10::ArrayRef<double> alpha) {
  return rethrow_as_c10([&] {
    return structured_to_dense(decode_spec("structured_to_dense", ints(spec), doubles(alpha)), tensors(factors));
  });
}

// ---- Specs (no tensors) -------------------------------------------------------------------------

std::vector<int64_t> low_rank_op(int64_t in, int64_t out, int64_t rank) {
  return rethrow_as_c10([&] { return encode_spec(low_rank_spec(in, out, rank)); });
}
std::vector<int64_t> block_diagonal_op(int64_t in, int64_t out, int64_t blocks) {
  return rethrow_as_c10([&] { return encode_spec(block_diagonal_spec(in, out, blocks)); });
}
std::vector<int64_t> mlr_op(int64_t dim, c10::IntArrayRef ranks, c10::IntArrayRef blocks) {
  return rethrow_as_c10([&] { return encode_spec(mlr_spec(dim, ranks.vec(), blocks.vec())); });
}
BttFactorize parse_factorize(const char* where, c10::string_view s) {
  if (s == "reference") return BttFactorize::reference;
  if (s == "balanced") return BttFactorize::balanced;
  throw_arg(where, "factorize", "\"reference\" or \"balanced\"", cat("\"", std::string(s), "\""));
}
// BTT from in to out features (out = heads * a * b). shape = [a, b, c, d] overrides the rule and
// must multiply out: a * b * heads = out, c * d = in.
std::vector<int64_t> btt_op(int64_t in, int64_t out, int64_t rank, int64_t heads, c10::string_view factorize,
                            c10::IntArrayRef shape) {
  return rethrow_as_c10([&] {
    const char* where = "structured_btt_spec";
    STRATA_CHECK_ARG(heads >= 1, where, "heads", ">= 1", heads);
    STRATA_CHECK_ARG(out >= 1 && out % heads == 0, where, "out_features", cat("a positive multiple of heads = ", heads),
                     out);
    BttShape t;
    if (shape.empty()) {
      t = btt_factorize(in, out / heads, parse_factorize(where, factorize));
    } else {
      STRATA_CHECK_ARG(shape.size() == 4, where, "shape", "[a, b, c, d] or []", cat(shape.size(), " values"));
      t = {shape[0], shape[1], shape[2], shape[3]};
      STRATA_CHECK_ARG(t.a * t.b * heads == out && t.c * t.d == in, where, "shape",
                       cat("a factorisation a * b * heads = out_features (", out, "), c * d = in_features (", in, ")"),
                       cat("[", t.a, ", ", t.b, ", ", t.c, ", ", t.d, "] with heads = ", heads));
    }
    return encode_spec(btt_spec(t, rank, heads));
  });
}
std::vector<int64_t> monarch_op(int64_t n, int64_t blocks) {
  return rethrow_as_c10([&] {
    int64_t b = blocks;
    if (b == 0) {  // sqrt(n), for n a perfect square
      b = int64_t(std::llround(std::sqrt(double(n))));
      STRATA_CHECK_ARG(n >= 1 && b * b == n, "structured_monarch_spec", "blocks",
                       cat("a divisor of n = ", n, " (0 = sqrt(n) needs n a perfect square)"), blocks);
    }
    return encode_spec(monarch_spec(n, b));
  });
}
std::vector<int64_t> kronecker_op(int64_t a_out, int64_t a_in, int64_t b_out, int64_t b_in) {
  return rethrow_as_c10([&] { return encode_spec(kronecker_spec(a_out, a_in, b_out, b_in)); });
}

std::vector<int64_t> factor_shapes_op(c10::IntArrayRef spec, c10::ArrayRef<double> alpha) {
  return rethrow_as_c10([&] {
    std::vector<int64_t> flat;
    for (const auto& s : structured_factor_shapes(decode_spec("structured_factor_shapes", ints(spec), doubles(alpha))))
      flat.insert(flat.end(), s.begin(), s.end());
    return flat;
  });
}
// (tile_rows, per_tile): structured_saved_layout, for the fake of structured_forward_saving.
std::tuple<int64_t, int64_t> saved_layout_op(c10::IntArrayRef spec, c10::ArrayRef<double> alpha) {
  return rethrow_as_c10([&] {
    const StructuredSavedLayout s =
        structured_saved_layout(decode_spec("structured_saved_layout", ints(spec), doubles(alpha)));
    return std::tuple<int64_t, int64_t>(s.tile_rows, s.per_tile);
  });
}
// (params, forward FLOPs over `rows` rows, generic rank, plan: per level 1 = multiplied out)
std::tuple<int64_t, double, int64_t, std::vector<int64_t>> stats_op(c10::IntArrayRef spec, c10::ArrayRef<double> alpha,
                                                                  int64_t rows) {
  return rethrow_as_c10([&] {
    const StructuredSpec s = decode_spec("structured_stats", ints(spec), doubles(alpha));
    std::vector<int64_t> plan;
    for (bool b : structured_plan(s)) plan.push_back(b ? 1 : 0);
    return std::tuple<int64_t, double, int64_t, std::vector<int64_t>>(structured_params(s), structured_flops(s, rows),
                                                                    structured_rank(s), plan);
  });
}

}  // namespace

at::Tensor op_calls::structured_forward(const StructuredSpec& spec, const at::Tensor& x,
                                        const std::vector<at::Tensor>& factors) {
  static const auto op = binding::typed_op<decltype(forward_op)>("strata::structured_forward");
  return binding::rethrow_as_strata([&] {
    return op.call(x, factors, encode_spec(spec), spec_alphas(spec));
  });
}

std::tuple<at::Tensor, at::Tensor> op_calls::structured_forward_saving(const StructuredSpec& spec, const at::Tensor& x,
                                                                       const std::vector<at::Tensor>& factors) {
  static const auto op = binding::typed_op<decltype(forward_saving_op)>("strata::structured_forward_saving");
  return binding::rethrow_as_strata([&] {
    return op.call(x, factors, encode_spec(spec), spec_alphas(spec));
  });
}

std::tuple<at::Tensor, std::vector<at::Tensor>> op_calls::structured_backward(
    const StructuredSpec& spec, const at::Tensor& x, const std::vector<at::Tensor>& factors, const at::Tensor& dy,
    bool input_grad, bool factor_grads, const at::Tensor& saved) {
  static const auto op = binding::typed_op<decltype(backward_op)>("strata::structured_backward");
  auto [dx, df] = binding::rethrow_as_strata([&] {
    return op.call(x, factors, encode_spec(spec), spec_alphas(spec), dy, input_grad, factor_grads,
                   saved.defined() ? std::optional<at::Tensor>(saved) : std::nullopt);
  });
  return {dx.value_or(at::Tensor()), df};
}

}  // namespace strata::torch

TORCH_LIBRARY_IMPL(strata, CPU, m) {
  m.impl("structured_forward", &strata::torch::forward_op);
  m.impl("structured_forward_saving", &strata::torch::forward_saving_op);
  m.impl("structured_backward", &strata::torch::backward_op);
}

// Every backend (a factor off the CPU gets the binding's error naming it), opaque to torch.compile.
TORCH_LIBRARY_IMPL(strata, CompositeExplicitAutograd, m) { m.impl("structured_to_dense", &strata::torch::to_dense_op); }

TORCH_LIBRARY_IMPL(strata, Autograd, m) {
  m.impl("structured_forward", strata::torch::binding::non_differentiable());
  m.impl("structured_forward_saving", strata::torch::binding::non_differentiable());
  m.impl("structured_backward", strata::torch::binding::non_differentiable());
  m.impl("structured_to_dense", strata::torch::binding::non_differentiable());
}

TORCH_LIBRARY_IMPL(strata, CompositeImplicitAutograd, m) {
  m.impl("structured_linear", &strata::torch::linear_op);
}

TORCH_LIBRARY_IMPL(strata, CatchAll, m) {
  m.impl("structured_low_rank_spec", &strata::torch::low_rank_op);
  m.impl("structured_block_diagonal_spec", &strata::torch::block_diagonal_op);
  m.impl("structured_mlr_spec", &strata::torch::mlr_op);
  m.impl("structured_btt_spec", &strata::torch::btt_op);
  m.impl("structured_monarch_spec", &strata::torch::monarch_op);
  m.impl("structured_kronecker_spec", &strata::torch::kronecker_op);
  m.impl("structured_factor_shapes", &strata::torch::factor_shapes_op);
  m.impl("structured_stats", &strata::torch::stats_op);
  m.impl("structured_saved_layout", &strata::torch::saved_layout_op);
}
