// models/forecaster.cpp: see forecaster.h.
#include "models/forecaster.h"

#include <ATen/ATen.h>

#include <ostream>

#include "strata/error.h"

namespace strata::models {

using detail::cat;
using strata::torch::MupRole;

namespace {
constexpr double kRevinEps = 1e-5;

// The encoder blocks' geometry: non-causal, over the model's token count.
AttentionGeometry encoder_geometry(const ForecasterConfig& c, int64_t tokens) {
  return AttentionGeometry{c.width, c.heads, tokens, /*causal=*/false, c.bias, c.qk_layernorm};
}
}  // namespace

ForecasterImpl::ForecasterImpl(ForecasterConfig cfg) : config(std::move(cfg)) {
  const char* where = "ForecasterConfig";
  const ForecasterConfig& c = config;
  STRATA_CHECK_ARG(c.kind == "point" || c.kind == "patch", where, "kind", "\"point\" or \"patch\"", cat("\"", c.kind, "\""));
  STRATA_CHECK_ARG(c.input_len >= 1, where, "input_len", ">= 1", c.input_len);
  STRATA_CHECK_ARG(c.horizon >= 1, where, "horizon", ">= 1", c.horizon);
  STRATA_CHECK_ARG(c.channels >= 1, where, "channels", ">= 1", c.channels);
  STRATA_CHECK_ARG(c.width >= 1, where, "width", ">= 1", c.width);
  STRATA_CHECK_ARG(c.layers >= 1, where, "layers", ">= 1", c.layers);
  STRATA_CHECK_ARG(c.heads >= 1 && c.width % c.heads == 0, where, "heads", cat("a divisor of width = ", c.width), c.heads);
  STRATA_CHECK_ARG(c.ffn >= 1, where, "ffn", ">= 1", c.ffn);
  STRATA_CHECK_ARG(c.dropout >= 0 && c.dropout < 1, where, "dropout", "in [0, 1)", c.dropout);
  if (c.kind == "patch") {
    STRATA_CHECK_ARG(c.stride >= 1, where, "stride", ">= 1", c.stride);
    STRATA_CHECK_ARG(c.patch_len >= 1 && c.patch_len <= c.input_len + c.stride, where, "patch_len",
                     cat("1..input_len + stride = ", c.input_len + c.stride), c.patch_len);
  }
  layer_specs = model_layer_specs(c.attention, c.layers, encoder_geometry(c, tokens()), where);
  reset();
  strata::torch::mup_init_(*this);
}

int64_t ForecasterImpl::tokens() const {
  const ForecasterConfig& c = config;
  return c.kind == "point" ? c.input_len : (c.input_len + c.stride - c.patch_len) / c.stride + 1;
}

void ForecasterImpl::reset() {
  const ForecasterConfig& c = config;
  const bool point = c.kind == "point";
  const int64_t N = tokens();
  embed = register_module("embed", ::torch::nn::Linear(::torch::nn::LinearOptions(point ? c.channels : c.patch_len, c.width).bias(c.bias)));
  pos_emb = register_module("pos_emb", ::torch::nn::Embedding(N, c.width));
  drop = register_module("drop", ::torch::nn::Dropout(c.dropout));
  blocks = register_module("blocks", ::torch::nn::ModuleList());
  for (const LayerAttentionSpec& s : layer_specs) {
    Block b(s, encoder_geometry(c, N), c.ffn, c.dropout);
    b->set_fused(c.fused);
    blocks->push_back(b);
  }
  ln_f = register_module("ln_f", Norm(c.width, c.bias));
  head = register_module(
      "head", ::torch::nn::Linear(::torch::nn::LinearOptions(N * c.width, point ? c.horizon * c.channels : c.horizon).bias(c.bias)));
}

void ForecasterImpl::pretty_print(std::ostream& stream) const {
  const ForecasterConfig& c = config;
  stream << "strata::models::Forecaster(kind=" << c.kind << ", input_len=" << c.input_len << ", horizon=" << c.horizon
         << ", channels=" << c.channels << ", tokens=" << tokens() << ", width=" << c.width << ", layers=" << c.layers
         << ", heads=" << c.heads << ", attention=" << pattern_to_string(layer_specs) << ")";
}

at::Tensor ForecasterImpl::forward(const at::Tensor& x) {
  const char* where = "Forecaster::forward";
  const ForecasterConfig& c = config;
  STRATA_CHECK_ARG(x.defined() && x.dim() == 3 && x.size(1) == c.input_len && x.size(2) == c.channels &&
                       x.is_floating_point(),
                   where, "x", cat("floats of shape (batch, input_len = ", c.input_len, ", channels = ", c.channels, ")"),
                   x.defined() ? cat(x.dim(), "-D ", x.scalar_type(), " ", x.sizes()) : std::string("an undefined tensor"));
  const int64_t B = x.size(0), L = c.input_len, C = c.channels, N = tokens();
  at::Tensor series = x;  // batch x L x C
  at::Tensor mean, sigma;  // batch x 1 x C
  if (c.revin) {  // per sample and channel, over time
    mean = x.mean({1}, /*keepdim=*/true);
    sigma = (x.var({1}, /*unbiased=*/false, /*keepdim=*/true) + kRevinEps).sqrt();
    series = (x - mean) / sigma;
  }
  const at::Tensor pos = pos_emb(at::arange(N, x.options().dtype(at::kLong)));  // N x width
  at::Tensor h;
  if (c.kind == "point") {
    h = embed(series) + pos;  // batch x L x width
  } else {
    const at::Tensor per_channel = series.transpose(1, 2).reshape({B * C, L});  // (batch C) x L
    const at::Tensor padded = at::cat({per_channel, per_channel.narrow(1, L - 1, 1).expand({B * C, c.stride})}, 1);
    h = embed(padded.unfold(1, c.patch_len, c.stride)) + pos;  // (batch C) x N x width
  }
  h = drop(h);
  for (size_t l = 0; l < blocks->size(); ++l) h = block(l).forward(h);
  const at::Tensor flat = ln_f(h).flatten(1);  // sequences x (N width)
  at::Tensor y = c.kind == "point" ? head(flat).view({B, c.horizon, C})
                                   : head(flat).view({B, C, c.horizon}).transpose(1, 2);  // batch x H x C
  if (c.revin) y = y * sigma + mean;
  return y;
}

double ForecasterImpl::forward_flops() const {
  const ForecasterConfig& c = config;
  const int64_t N = tokens();
  double per_sequence = 0;
  for (size_t l = 0; l < blocks->size(); ++l) per_sequence += block(l).forward_flops(N);
  if (c.kind == "point")
    return 2.0 * double(N) * double(c.channels) * double(c.width) + per_sequence +
           2.0 * double(N * c.width) * double(c.horizon * c.channels);
  per_sequence += 2.0 * double(N) * double(c.patch_len) * double(c.width) + 2.0 * double(N * c.width) * double(c.horizon);
  return double(c.channels) * per_sequence;  // one sequence per channel
}

std::vector<std::pair<std::string, MupRole>> ForecasterImpl::mup_roles() const {
  return {{"head.weight", MupRole::readout(tokens() * config.width)}, {"pos_emb.weight", MupRole::position()}};
}

}  // namespace strata::models
