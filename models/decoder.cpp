// models/decoder.cpp: see decoder.h.
#include "models/decoder.h"

#include <ATen/ATen.h>

#include <ostream>

#include "strata/error.h"
#include "strata/torch/mlp.h"

namespace strata::models {

using detail::cat;
using strata::torch::MupRole;

// ---- Norm --------------------------------------------------------------------------------------

NormImpl::NormImpl(int64_t dim_, bool bias_, double eps_) : dim(dim_), has_bias(bias_), eps(eps_) {
  STRATA_CHECK_ARG(dim >= 1, "Norm", "dim", ">= 1", dim);
  reset();
}

void NormImpl::reset() {
  weight = register_parameter("weight", at::ones({dim}));
  bias = has_bias ? register_parameter("bias", at::zeros({dim})) : at::Tensor();
}

at::Tensor NormImpl::forward(const at::Tensor& x) const { return at::layer_norm(x, {dim}, weight, bias, eps); }

std::vector<std::pair<std::string, MupRole>> NormImpl::mup_roles() const {
  std::vector<std::pair<std::string, MupRole>> roles{{"weight", MupRole::gain()}};
  if (has_bias) roles.emplace_back("bias", MupRole::bias());
  return roles;
}

// ---- Mlp ---------------------------------------------------------------------------------------

MlpImpl::MlpImpl(int64_t width_, int64_t hidden_, bool bias_) : width(width_), hidden(hidden_), bias(bias_) {
  STRATA_CHECK_ARG(width >= 1, "Mlp", "width", ">= 1", width);
  STRATA_CHECK_ARG(hidden >= 1, "Mlp", "hidden", ">= 1", hidden);
  reset();
}

void MlpImpl::reset() {
  fc = register_module("fc", ::torch::nn::Linear(::torch::nn::LinearOptions(width, hidden).bias(bias)));
  proj = register_module("proj", ::torch::nn::Linear(::torch::nn::LinearOptions(hidden, width).bias(bias)));
}

at::Tensor MlpImpl::forward(const at::Tensor& x) {
  if (fused) return strata::torch::gelu_mlp(x, fc->weight, fc->bias, proj->weight, proj->bias);
  return proj(at::gelu(fc(x)));
}

at::Tensor MlpImpl::forward_block(const at::Tensor& x, const NormImpl& ln) {
  if (!fused) return x + forward(ln.forward(x));
  strata::torch::MlpBlockArgs b;
  b.ln_weight = ln.weight;
  b.ln_bias = ln.bias;
  b.eps = ln.eps;
  b.residual = true;
  return strata::torch::gelu_mlp(x, fc->weight, fc->bias, proj->weight, proj->bias, b);
}

std::vector<std::pair<std::string, MupRole>> MlpImpl::mup_roles() const {
  return {{"proj.weight", MupRole::output(hidden)}};
}

double MlpImpl::forward_flops(int64_t T) const { return 2.0 * 2.0 * double(T) * double(width) * double(hidden); }

// ---- Block -------------------------------------------------------------------------------------

BlockImpl::BlockImpl(LayerAttentionSpec spec_, AttentionGeometry g, int64_t mlp_hidden_, double dropout)
    : spec(std::move(spec_)), geometry(g), mlp_hidden(mlp_hidden_), dropout_p(dropout) {
  reset();
}

void BlockImpl::reset() {
  ln1 = register_module("ln1", Norm(geometry.width, geometry.bias));
  attn = register_module("attn", SelfAttention(spec, geometry));
  ln2 = register_module("ln2", Norm(geometry.width, geometry.bias));
  mlp = register_module("mlp", Mlp(geometry.width, mlp_hidden, geometry.bias));
  drop = register_module("drop", ::torch::nn::Dropout(dropout_p));
}

at::Tensor BlockImpl::forward(const at::Tensor& x) {
  at::Tensor a;
  if (fused) a = attn->forward_ln(x, ln1->weight, ln1->bias, ln1->eps);  // (undefined where it does not apply)
  const at::Tensor h = x + drop(a.defined() ? a : attn(ln1(x)));
  // (ln2, the MLP and the residual in one call where no dropout sits between them)
  if (fused && (dropout_p == 0 || !is_training())) return mlp->forward_block(h, *ln2);
  return h + drop(mlp(ln2(h)));
}

double BlockImpl::forward_flops(int64_t T) const { return attn->forward_flops(T) + mlp->forward_flops(T); }

// ---- Decoder -----------------------------------------------------------------------------------

DecoderImpl::DecoderImpl(DecoderConfig cfg) : config(std::move(cfg)) {
  const char* where = "DecoderConfig";
  const DecoderConfig& c = config;
  STRATA_CHECK_ARG(c.vocab_size >= 0, where, "vocab_size", ">= 0 (0: regression)", c.vocab_size);
  if (c.vocab_size == 0) {
    STRATA_CHECK_ARG(c.input_dim >= 1, where, "input_dim", ">= 1 for regression (vocab_size 0)", c.input_dim);
    STRATA_CHECK_ARG(c.output_dim >= 1, where, "output_dim", ">= 1 for regression (vocab_size 0)", c.output_dim);
  }
  STRATA_CHECK_ARG(c.width >= 1, where, "width", ">= 1", c.width);
  STRATA_CHECK_ARG(c.layers >= 1, where, "layers", ">= 1", c.layers);
  STRATA_CHECK_ARG(c.heads >= 1 && c.width % c.heads == 0, where, "heads", cat("a divisor of width = ", c.width),
                   c.heads);
  STRATA_CHECK_ARG(c.context >= 1, where, "context", ">= 1", c.context);
  STRATA_CHECK_ARG(c.dropout >= 0 && c.dropout < 1, where, "dropout", "in [0, 1)", c.dropout);
  layer_specs = model_layer_specs(c.attention, c.layers,
                                  AttentionGeometry{c.width, c.heads, c.context, true, c.bias, c.qk_layernorm}, where);
  reset();
  strata::torch::mup_init_(*this);
}

void DecoderImpl::reset() {
  const DecoderConfig& c = config;
  tok_emb = nullptr;
  read_in = nullptr;
  if (c.vocab_size > 0) tok_emb = register_module("tok_emb", ::torch::nn::Embedding(c.vocab_size, c.width));
  else read_in = register_module("read_in", ::torch::nn::Linear(::torch::nn::LinearOptions(c.input_dim, c.width).bias(c.bias)));
  pos_emb = register_module("pos_emb", ::torch::nn::Embedding(c.context, c.width));
  drop = register_module("drop", ::torch::nn::Dropout(c.dropout));
  blocks = register_module("blocks", ::torch::nn::ModuleList());
  const AttentionGeometry g{c.width, c.heads, c.context, /*causal=*/true, c.bias, c.qk_layernorm};
  for (const LayerAttentionSpec& s : layer_specs) {
    Block b(s, g, 4 * c.width, c.dropout);
    b->set_fused(c.fused);
    blocks->push_back(b);
  }
  ln_f = register_module("ln_f", Norm(c.width, c.bias));
  const int64_t out = c.vocab_size > 0 ? c.vocab_size : c.output_dim;
  // ref's lm_head has no bias; the read-out follows `bias`.
  head = register_module("head", ::torch::nn::Linear(::torch::nn::LinearOptions(c.width, out).bias(c.vocab_size == 0 && c.bias)));
}

void DecoderImpl::pretty_print(std::ostream& stream) const {
  stream << "strata::models::Decoder(" << (config.vocab_size > 0 ? cat("vocab=", config.vocab_size)
                                                                  : cat("input_dim=", config.input_dim, ", output_dim=",
                                                                        config.output_dim))
         << ", width=" << config.width << ", layers=" << config.layers << ", heads=" << config.heads
         << ", context=" << config.context << ", attention=" << pattern_to_string(layer_specs) << ")";
}

at::Tensor DecoderImpl::forward(const at::Tensor& input) {
  const char* where = "Decoder::forward";
  const DecoderConfig& c = config;
  const std::string got = input.defined() ? cat(input.dim(), "-D ", input.scalar_type(), " ", input.sizes())
                                          : std::string("an undefined tensor");
  at::Tensor x;
  if (c.vocab_size > 0) {
    STRATA_CHECK_ARG(input.defined() && input.dim() == 2 && input.scalar_type() == at::kLong, where, "input",
                     "int64 token ids of shape (batch, T)", got);
    if (input.numel() > 0) {
      const int64_t lo = input.min().item<int64_t>(), hi = input.max().item<int64_t>();
      STRATA_CHECK_ARG(lo >= 0 && hi < c.vocab_size, where, "input", cat("token ids in [0, ", c.vocab_size, ")"),
                       cat("ids in [", lo, ", ", hi, "]"));
    }
    x = tok_emb(input);  // batch x T x width
  } else {
    STRATA_CHECK_ARG(input.defined() && input.dim() == 3 && input.size(2) == c.input_dim && input.is_floating_point(),
                     where, "input", cat("floats of shape (batch, T, input_dim = ", c.input_dim, ")"), got);
    x = read_in(input);
  }
  const int64_t T = input.size(1);
  STRATA_CHECK_ARG(T <= c.context, where, "input", cat("at most context = ", c.context, " tokens"), T);
  x = drop(x + pos_emb(at::arange(T, input.options().dtype(at::kLong))));
  for (size_t l = 0; l < blocks->size(); ++l) x = block(l).forward(x);
  return head(ln_f(x));
}

double DecoderImpl::forward_flops(int64_t T) const {
  const DecoderConfig& c = config;
  double f = 0;
  if (c.vocab_size == 0) f += 2.0 * double(T) * double(c.input_dim) * double(c.width);  // read_in
  for (size_t l = 0; l < blocks->size(); ++l) f += block(l).forward_flops(T);
  const int64_t out = c.vocab_size > 0 ? c.vocab_size : c.output_dim;
  return f + 2.0 * double(T) * double(c.width) * double(out);  // head
}

int64_t DecoderImpl::non_embedding_params() const {
  int64_t n = 0;
  for (const at::Tensor& p : parameters()) n += p.numel();
  if (tok_emb) n -= tok_emb->weight.numel();
  return n - pos_emb->weight.numel();
}

std::vector<std::pair<std::string, MupRole>> DecoderImpl::mup_roles() const {
  std::vector<std::pair<std::string, MupRole>> roles{{"head.weight", MupRole::readout(config.width)},
                                                     {"pos_emb.weight", MupRole::position()}};
  // The read-in maps the data's features, not the width: an input matrix (the reference's "fan_in 1",
  // N(0, 0.02^2), lr eta). As a hidden matrix it drew N(0, 1/d) at lr eta * base / d, 48-192x the
  // reference's lr at d = 4..16 (issue 45).
  if (read_in) roles.emplace_back("read_in.weight", MupRole::input(config.input_dim));
  return roles;
}

}  // namespace strata::models
