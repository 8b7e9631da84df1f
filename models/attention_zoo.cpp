// models/attention_zoo.cpp: see attention_zoo.h.
#include "models/attention_zoo.h"

#include <algorithm>
#include <set>
#include <utility>

#include "models/spec_util.h"
#include "strata/attention.h"
#include "strata/error.h"
#include "strata/monarch.h"
#include "strata/torch/attention.h"
#include "strata/torch/baselines.h"
#include "strata/torch/monarch.h"

namespace strata::models {
namespace {

using detail::cat;
using spec_syntax::bad_spec;
using spec_syntax::parse_choice;
using spec_syntax::parse_int;

// Checks the fields of the spec's kind (also for specs built in code, not parsed).
void validate(const AttentionSpec& s, const std::string& shown) {
  switch (s.kind) {
    case AttentionKind::softmax: break;
    case AttentionKind::monarch:
      if (s.num_steps < 1) bad_spec(shown, cat("key 'T': expected an integer >= 1, got ", s.num_steps));
      if (s.block_size < 0) bad_spec(shown, cat("key 'B': expected an integer >= 0, got ", s.block_size));
      if (s.pad != MonarchPad::post && s.pad != MonarchPad::pre)
        bad_spec(shown, cat("key 'pad': expected post or pre, got ", int(s.pad)));
      if (s.mode != MonarchMode::stable && s.mode != MonarchMode::reference)
        bad_spec(shown, cat("key 'mode': expected stable or reference, got ", int(s.mode)));
      break;
    case AttentionKind::nystrom:
      if (s.num_landmarks < 1)
        bad_spec(shown, cat("key 'landmarks': expected an integer >= 1, got ", s.num_landmarks));
      if (s.pinv_iters < 1) bad_spec(shown, cat("key 'iters': expected an integer >= 1, got ", s.pinv_iters));
      break;
    case AttentionKind::performer:
      if (s.num_features < 1)
        bad_spec(shown, cat("key 'features': expected an integer >= 1, got ", s.num_features));
      if (s.seed.has_value() && *s.seed < 0) bad_spec(shown, cat("key 'seed': expected an integer >= 0, got ", *s.seed));
      break;
    default: bad_spec(shown, cat("unknown kind ", int(s.kind)));
  }
}

}  // namespace

const char* kind_name(AttentionKind kind) {
  switch (kind) {
    case AttentionKind::softmax: return "softmax";
    case AttentionKind::monarch: return "monarch";
    case AttentionKind::nystrom: return "nystrom";
    case AttentionKind::performer: return "performer";
  }
  return "unknown";
}

AttentionSpec parse_attention_spec(const std::string& spec) {
  AttentionSpec s;
  const size_t colon = spec.find(':');
  const std::string kind = spec.substr(0, colon);
  if (kind == "softmax") s.kind = AttentionKind::softmax;
  else if (kind == "monarch") s.kind = AttentionKind::monarch;
  else if (kind == "nystrom") s.kind = AttentionKind::nystrom;
  else if (kind == "performer") s.kind = AttentionKind::performer;
  else bad_spec(spec, cat("unknown kind '", kind, "' (expected one of: softmax, monarch, nystrom, performer)"));
  if (colon == std::string::npos) return s;

  const char* keys = s.kind == AttentionKind::monarch   ? "T, B, pad, mode"
                     : s.kind == AttentionKind::nystrom ? "landmarks, iters"
                     : s.kind == AttentionKind::performer ? "features, seed"
                                                          : "none: softmax takes no options";
  for (const auto& [key, value] : spec_syntax::key_values(spec, spec.substr(colon + 1))) {
    bool known = true;
    switch (s.kind) {
      case AttentionKind::monarch:
        if (key == "T") s.num_steps = parse_int(spec, key, value, 1);
        else if (key == "B") s.block_size = parse_int(spec, key, value, 0);
        else if (key == "pad")
          s.pad = parse_choice(spec, key, value, {MonarchPad::post, MonarchPad::pre}, strata::torch::monarch_pad_name);
        else if (key == "mode")
          s.mode = parse_choice(spec, key, value, {MonarchMode::stable, MonarchMode::reference},
                                strata::torch::monarch_mode_name);
        else known = false;
        break;
      case AttentionKind::nystrom:
        if (key == "landmarks") s.num_landmarks = parse_int(spec, key, value, 1);
        else if (key == "iters") s.pinv_iters = parse_int(spec, key, value, 1);
        else known = false;
        break;
      case AttentionKind::performer:
        if (key == "features") s.num_features = parse_int(spec, key, value, 1);
        else if (key == "seed") s.seed = parse_int(spec, key, value, 0);
        else known = false;
        break;
      default: known = false;
    }
    if (!known) bad_spec(spec, cat("unknown key '", key, "' for ", kind, " (expected one of: ", keys, ")"));
  }
  return s;
}

std::string to_string(const AttentionSpec& s) {
  validate(s, cat("(", kind_name(s.kind), " spec)"));
  switch (s.kind) {
    case AttentionKind::softmax: return "softmax";
    case AttentionKind::monarch:
      return cat("monarch:T=", s.num_steps, ",B=", s.block_size, ",pad=", strata::torch::monarch_pad_name(s.pad),
                 ",mode=", strata::torch::monarch_mode_name(s.mode));
    case AttentionKind::nystrom: return cat("nystrom:landmarks=", s.num_landmarks, ",iters=", s.pinv_iters);
    case AttentionKind::performer:
      return s.seed.has_value() ? cat("performer:features=", s.num_features, ",seed=", *s.seed)
                                : cat("performer:features=", s.num_features);
  }
  return "";
}

AttentionFn make_attention(const AttentionSpec& spec) {
  validate(spec, cat("(", kind_name(spec.kind), " spec)"));
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
  validate(spec, cat("(", kind_name(spec.kind), " spec)"));
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
  validate(spec, cat("(", kind_name(spec.kind), " spec)"));
  const std::vector<int64_t> conv = resolve_layers("convert", encoder.config().layers, layers);
  for (int64_t l : conv) {
    AttentionSpec s = spec;
    if (s.kind == AttentionKind::performer && s.seed.has_value()) s.seed = *s.seed + l;
    encoder.set_attention(l, make_attention(s));
  }
}

}  // namespace strata::models
