// models/attention_spec.cpp: see attention_spec.h.
#include "models/attention_spec.h"

#include <sstream>

#include "models/spec_util.h"
#include "strata/error.h"

namespace strata::models {
namespace {

using detail::cat;
using spec_syntax::bad_spec;
using spec_syntax::parse_choice;
using spec_syntax::parse_int;

std::string layers_label(const std::vector<int64_t>& layers) {
  std::string s;
  for (int64_t l : layers) s += cat(s.empty() ? "" : ",", l);
  return s;
}

// Checks the fields of the spec's kind (also for specs built in code, not parsed).
void check_fields(const AttentionSpec& s, const std::string& shown) {
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
          s.pad = parse_choice(spec, key, value, {MonarchPad::post, MonarchPad::pre}, monarch_pad_name);
        else if (key == "mode")
          s.mode = parse_choice(spec, key, value, {MonarchMode::stable, MonarchMode::reference},
                                monarch_mode_name);
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

void validate(const AttentionSpec& s) { check_fields(s, cat("(", kind_name(s.kind), " spec)")); }

std::string to_string(const AttentionSpec& s) {
  validate(s);
  switch (s.kind) {
    case AttentionKind::softmax: return "softmax";
    case AttentionKind::monarch:
      return cat("monarch:T=", s.num_steps, ",B=", s.block_size, ",pad=", monarch_pad_name(s.pad),
                 ",mode=", monarch_mode_name(s.mode));
    case AttentionKind::nystrom: return cat("nystrom:landmarks=", s.num_landmarks, ",iters=", s.pinv_iters);
    case AttentionKind::performer:
      return s.seed.has_value() ? cat("performer:features=", s.num_features, ",seed=", *s.seed)
                                : cat("performer:features=", s.num_features);
  }
  return "";
}

std::string ConversionMethod::label() const {
  return layers.empty() ? spec_text : spec_text + "@" + layers_label(layers);
}

ConversionMethod parse_conversion_method(const std::string& text) {
  const char* where = "parse_conversion_method";
  ConversionMethod m;
  const size_t at = text.find('@');
  m.spec_text = text.substr(0, at);
  m.spec = parse_attention_spec(m.spec_text);  // throws with the spec's own message
  if (at == std::string::npos) return m;
  std::stringstream ss(text.substr(at + 1));
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    int64_t l = -1;
    try {
      l = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    STRATA_CHECK_ARG(used == item.size() && !item.empty() && l >= 0, where, "layers",
                     cat("layers after '@' as comma-separated integers >= 0 in \"", text, "\""),
                     cat("\"", item, "\""));
    m.layers.push_back(l);
  }
  STRATA_CHECK_ARG(!m.layers.empty(), where, "layers", cat("at least one layer after '@' in \"", text, "\""), "none");
  return m;
}

ConversionMethod parse_conversion_method(const std::string& text, const std::vector<int64_t>& layers) {
  ConversionMethod m = parse_conversion_method(text);
  if (layers.empty()) return m;
  STRATA_CHECK_ARG(m.layers.empty(), "parse_conversion_method", "layers",
                   cat("the layers either after '@' in the spec or apart, not both (spec \"", text, "\")"),
                   cat(layers.size(), " layers given apart"));
  m.layers = layers;
  return m;
}

}  // namespace strata::models
