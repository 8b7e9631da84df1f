// models/attention_zoo.cpp: see attention_zoo.h.
#include "models/attention_zoo.h"

#include <algorithm>
#include <set>
#include <utility>

#include "strata/attention.h"
#include "strata/error.h"
#include "strata/monarch.h"
#include "strata/torch/attention.h"
#include "strata/torch/baselines.h"
#include "strata/torch/monarch.h"

namespace strata::models {
using detail::cat;

AttentionFn make_attention(const AttentionSpec& spec) {
  validate(spec);
  switch (spec.kind) {
    case AttentionKind::softmax: return dense_attention();
    case AttentionKind::monarch: {
      strata::torch::MonarchArgs a;
      a.num_steps = spec.num_steps;
      a.block_size = spec.block_size;
      a.pad = spec.pad;
      a.mode = spec.mode;
      a.layout = "bshd";
      return [a](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& kpm) {
        strata::torch::MonarchArgs args = a;
        if (kpm.defined()) args.key_padding_mask = kpm;
        return strata::torch::monarch_attention(q, k, v, args);
      };
    }
    case AttentionKind::nystrom: {
      const int64_t m = spec.num_landmarks, iters = spec.pinv_iters;
      return [m, iters](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& kpm) {
        std::optional<at::Tensor> mask;
        if (kpm.defined()) mask = kpm;
        return strata::torch::nystrom_attention(q, k, v, m, iters, mask);
      };
    }
    case AttentionKind::performer: {
      const int64_t r = spec.num_features;
      const std::optional<int64_t> seed = spec.seed;
      return [r, seed](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& kpm) {
        std::optional<at::Tensor> mask;
        if (kpm.defined()) mask = kpm;
        return strata::torch::performer_attention(q, k, v, r, seed, mask);
      };
    }
  }
  throw Error("make_attention: unknown attention kind");
}

double attention_flops(const AttentionSpec& spec, int64_t seqlen, int64_t heads, int64_t head_dim) {
  validate(spec);
  const char* where = "attention_flops";
  STRATA_CHECK_ARG(seqlen >= 0, where, "seqlen", ">= 0", seqlen);
  STRATA_CHECK_ARG(heads >= 0, where, "heads", ">= 0", heads);
  STRATA_CHECK_ARG(head_dim >= 1, where, "head_dim", ">= 1", head_dim);
  AttnDims d;  // one sequence, self-attention, D = Dv
  d.batch = 1;
  d.seqlen_q = d.seqlen_k = seqlen;
  d.heads_q = d.heads_kv = heads;
  d.head_dim = d.head_dim_v = head_dim;
  const double h = double(heads);
  switch (spec.kind) {
    case AttentionKind::softmax: return strata::attention_flops(d, /*causal=*/false).forward;
    case AttentionKind::monarch: {
      MonarchOptions o;
      o.num_steps = spec.num_steps;
      o.block_size = spec.block_size;
      o.pad = spec.pad;
      return strata::monarch_attention_flops(d, o);
    }
    case AttentionKind::nystrom:
      return h * strata::torch::nystrom_attention_flops(seqlen, head_dim, head_dim, spec.num_landmarks,
                                                        spec.pinv_iters);
    case AttentionKind::performer:
      return h * strata::torch::performer_attention_flops(seqlen, head_dim, head_dim, spec.num_features);
  }
  return 0.0;
}

namespace {
// The layers a conversion touches: `layers` checked (in range, no repeats), or all of them.
std::vector<int64_t> resolve_layers(const char* where, int64_t num_layers, const std::vector<int64_t>& layers) {
  if (layers.empty()) {
    std::vector<int64_t> all(static_cast<size_t>(num_layers));
    for (int64_t l = 0; l < num_layers; ++l) all[size_t(l)] = l;
    return all;
  }
  std::set<int64_t> seen;
  for (int64_t l : layers) {
    STRATA_CHECK_ARG(l >= 0 && l < num_layers, where, "layers", cat("indices in [0, ", num_layers, ")"), l);
    STRATA_CHECK_ARG(seen.insert(l).second, where, "layers", "distinct indices", cat(l, " twice"));
  }
  return layers;
}
}  // namespace

double encoder_attention_flops(const BertConfig& cfg, const AttentionSpec& spec, const std::vector<int64_t>& layers,
                               int64_t seqlen) {
  const std::vector<int64_t> conv = resolve_layers("encoder_attention_flops", cfg.layers, layers);
  const double converted = attention_flops(spec, seqlen, cfg.heads, cfg.head_dim());
  const double softmax = attention_flops(AttentionSpec{}, seqlen, cfg.heads, cfg.head_dim());
  return double(conv.size()) * converted + double(cfg.layers - int64_t(conv.size())) * softmax;
}

void convert(BertEncoder& encoder, const AttentionSpec& spec, const std::vector<int64_t>& layers) {
  validate(spec);
  const std::vector<int64_t> conv = resolve_layers("convert", encoder.config().layers, layers);
  for (int64_t l : conv) {
    AttentionSpec s = spec;
    if (s.kind == AttentionKind::performer && s.seed.has_value()) s.seed = *s.seed + l;
    encoder.set_attention(l, make_attention(s));
  }
}

}  // namespace strata::models
