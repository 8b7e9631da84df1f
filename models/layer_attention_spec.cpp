// models/layer_attention_spec.cpp: see layer_attention_spec.h.
#include "models/layer_attention_spec.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include "models/spec_util.h"
#include "strata/error.h"

namespace strata::models {
namespace {

using detail::cat;
using spec_syntax::bad_spec;
using spec_syntax::parse_choice;
using spec_syntax::parse_int;
using Kind = LayerAttentionKind;

constexpr Kind kAllKinds[] = {Kind::mha,     Kind::swa, Kind::gswa, Kind::longformer, Kind::mlr,
                              Kind::btt,     Kind::bmlr, Kind::monarch, Kind::sdpa};

// The keys of each kind, in the grammar's (and to_string's) order.
const char* keys_of(Kind k) {
  switch (k) {
    case Kind::mha: return "scale";
    case Kind::swa: return "w, scale";
    case Kind::gswa: return "split, w";
    case Kind::longformer: return "global, w, scale";
    case Kind::mlr: return "ranks, avg, div, scale";
    case Kind::btt: return "s, rule, logit";
    case Kind::bmlr: return "ranks, logit, div";
    case Kind::monarch: return "T, B, scale";
    case Kind::sdpa: return "scale";
  }
  return "";
}

// "<a>|<b>|..." of integers >= lo.
std::vector<int64_t> parse_list(const std::string& spec, const std::string& key, const std::string& text, int64_t lo) {
  std::vector<int64_t> out;
  size_t pos = 0;
  while (true) {
    const size_t bar = std::min(text.find('|', pos), text.size());
    const std::string item = text.substr(pos, bar - pos);
    int64_t v = 0;
    try {
      v = parse_int(spec, key, item, lo);
    } catch (const Error&) {
      bad_spec(spec, cat("key '", key, "': expected integers >= ", lo, " joined by '|', got \"", text, "\""));
    }
    out.push_back(v);
    if (bar == text.size()) break;
    pos = bar + 1;
  }
  return out;
}

std::string list_string(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += cat(i ? "|" : "", v[i]);
  return s;
}

bool parse_bool(const std::string& spec, const std::string& key, const std::string& text) {
  if (text == "0" || text == "1") return text == "1";
  bad_spec(spec, cat("key '", key, "': expected 0 or 1, got \"", text, "\""));
}

// One of the words `choices` (e.g. "sp", "mup").
std::string parse_word(const std::string& spec, const std::string& key, const std::string& text,
                       std::initializer_list<const char*> choices) {
  return parse_choice<const char*>(spec, key, text, choices, +[](const char* s) { return s; });
}

// Splits a pattern at the '|' that start a new layer's spec (those not followed by a digit).
std::vector<std::string> split_pattern(const std::string& pattern) {
  std::vector<std::string> out(1);
  for (size_t i = 0; i < pattern.size(); ++i) {
    const bool continues = i + 1 < pattern.size() && std::isdigit(static_cast<unsigned char>(pattern[i + 1]));
    if (pattern[i] == '|' && !continues) out.emplace_back();
    else out.back() += pattern[i];
  }
  return out;
}

}  // namespace

const char* layer_attention_kind_name(LayerAttentionKind kind) {
  switch (kind) {
    case Kind::mha: return "mha";
    case Kind::swa: return "swa";
    case Kind::gswa: return "gswa";
    case Kind::longformer: return "longformer";
    case Kind::mlr: return "mlr";
    case Kind::btt: return "btt";
    case Kind::bmlr: return "bmlr";
    case Kind::monarch: return "monarch";
    case Kind::sdpa: return "sdpa";
  }
  return "unknown";
}

const char* logit_scale_name(LogitScale s) { return s == LogitScale::eight_over_d ? "8/d" : "1/sqrt(d)"; }

double logit_scale_value(LogitScale s, int64_t head_dim) {
  return s == LogitScale::eight_over_d ? 8.0 / double(head_dim) : 1.0 / std::sqrt(double(head_dim));
}

LayerAttentionSpec parse_layer_attention(const std::string& spec) {
  LayerAttentionSpec s;
  const size_t colon = spec.find(':');
  std::string kind = spec.substr(0, colon);
  // Kinds in any case: the papers write "MHA|SWA|SWA"; keys keep theirs (monarch's T and B).
  std::transform(kind.begin(), kind.end(), kind.begin(), [](unsigned char ch) { return char(std::tolower(ch)); });
  bool found = false;
  std::string kinds;
  for (Kind k : kAllKinds) {
    kinds += cat(kinds.empty() ? "" : ", ", layer_attention_kind_name(k));
    if (kind == layer_attention_kind_name(k)) s.kind = k, found = true;
  }
  if (!found) bad_spec(spec, cat("unknown kind '", kind, "' (expected one of: ", kinds, ")"));
  const bool takes_scale = s.kind == Kind::mha || s.kind == Kind::swa || s.kind == Kind::longformer ||
                           s.kind == Kind::monarch || s.kind == Kind::sdpa;
  if (colon != std::string::npos) {
    for (const auto& [key, value] : spec_syntax::key_values(spec, spec.substr(colon + 1))) {
      const bool windowed = s.kind == Kind::swa || s.kind == Kind::gswa || s.kind == Kind::longformer;
      const bool ranked = s.kind == Kind::mlr || s.kind == Kind::bmlr;
      if (key == "scale" && takes_scale)
        s.scale = parse_choice(spec, key, value, {LogitScale::eight_over_d, LogitScale::inv_sqrt_d}, logit_scale_name);
      else if (key == "scale" && s.kind == Kind::mlr)
        s.mlr_scale = parse_word(spec, key, value, {"inv_rank", "inv_sqrt_head_dim"});
      else if (key == "w" && windowed) s.window = parse_int(spec, key, value, 0);
      else if (key == "global" && s.kind == Kind::longformer) s.num_global = parse_int(spec, key, value, 0);
      else if (key == "split" && s.kind == Kind::gswa) {
        const std::vector<int64_t> ab = parse_list(spec, key, value, 1);
        if (ab.size() != 2) bad_spec(spec, cat("key 'split': expected <a>|<b> (two head-dim counts), got \"", value, "\""));
        s.split_a = ab[0], s.split_b = ab[1];
      } else if (key == "ranks" && ranked) s.ranks = parse_list(spec, key, value, 1);
      else if (key == "avg" && s.kind == Kind::mlr) s.level_average = parse_bool(spec, key, value);
      else if (key == "div" && ranked) s.divide_by_num_levels = parse_bool(spec, key, value);
      else if (key == "s" && s.kind == Kind::btt) s.btt_rank = parse_int(spec, key, value, 1);
      else if (key == "rule" && s.kind == Kind::btt) s.btt_rule = parse_word(spec, key, value, {"ref", "balanced"});
      else if (key == "logit" && (s.kind == Kind::btt || s.kind == Kind::bmlr))
        s.logit = parse_word(spec, key, value, {"sp", "mup"});
      else if (key == "T" && s.kind == Kind::monarch) s.monarch_steps = parse_int(spec, key, value, 1);
      else if (key == "B" && s.kind == Kind::monarch) s.monarch_block = parse_int(spec, key, value, 0);
      else bad_spec(spec, cat("unknown key '", key, "' for ", kind, " (expected one of: ", keys_of(s.kind), ")"));
    }
  }
  // The keys without a default.
  const auto require = [&](bool given, const char* key) {
    if (!given) bad_spec(spec, cat("key '", key, "' is required for ", kind, " (e.g. ", kind, ":", key, "=...)"));
  };
  if (s.kind == Kind::swa || s.kind == Kind::gswa || s.kind == Kind::longformer) require(s.window >= 0, "w");
  if (s.kind == Kind::gswa) require(s.split_a > 0, "split");
  if (s.kind == Kind::longformer) require(s.num_global >= 0, "global");
  if (s.kind == Kind::mlr || s.kind == Kind::bmlr) require(!s.ranks.empty(), "ranks");
  return s;
}

std::string to_string(const LayerAttentionSpec& s) {
  const std::string scale = cat("scale=", logit_scale_name(s.scale));
  switch (s.kind) {
    case Kind::mha: return cat("mha:", scale);
    case Kind::swa: return cat("swa:w=", s.window, ",", scale);
    case Kind::gswa: return cat("gswa:split=", s.split_a, "|", s.split_b, ",w=", s.window);
    case Kind::longformer: return cat("longformer:global=", s.num_global, ",w=", s.window, ",", scale);
    case Kind::mlr:
      return cat("mlr:ranks=", list_string(s.ranks), ",avg=", int(s.level_average), ",div=", int(s.divide_by_num_levels),
                 ",scale=", s.mlr_scale);
    case Kind::btt: return cat("btt:s=", s.btt_rank, ",rule=", s.btt_rule, ",logit=", s.logit);
    case Kind::bmlr: return cat("bmlr:ranks=", list_string(s.ranks), ",logit=", s.logit, ",div=", int(s.divide_by_num_levels));
    case Kind::monarch: return cat("monarch:T=", s.monarch_steps, ",B=", s.monarch_block, ",", scale);
    case Kind::sdpa: return cat("sdpa:", scale);
  }
  return "";
}

std::vector<LayerAttentionSpec> parse_attention_pattern(const std::string& pattern, int64_t num_layers) {
  STRATA_CHECK_ARG(num_layers >= 1, "parse_attention_pattern", "num_layers", ">= 1", num_layers);
  std::vector<LayerAttentionSpec> cycle;
  for (const std::string& one : split_pattern(pattern)) cycle.push_back(parse_layer_attention(one));
  const int64_t n = int64_t(cycle.size());
  if (num_layers % n != 0)
    throw Error(cat("attention pattern \"", pattern, "\" has ", n, " specs: the layer count ", num_layers,
                    " must be a multiple of ", n));
  std::vector<LayerAttentionSpec> out;
  for (int64_t l = 0; l < num_layers; ++l) out.push_back(cycle[size_t(l % n)]);
  return out;
}

std::string pattern_to_string(const std::vector<LayerAttentionSpec>& specs) {
  // The shortest period n dividing the layer count that repeats.
  const size_t L = specs.size();
  size_t period = L;
  for (size_t n = 1; n < L; ++n) {
    if (L % n) continue;
    bool repeats = true;
    for (size_t i = n; i < L && repeats; ++i) repeats = specs[i] == specs[i - n];
    if (repeats) {
      period = n;
      break;
    }
  }
  std::string s;
  for (size_t i = 0; i < period; ++i) s += cat(i ? "|" : "", to_string(specs[i]));
  return s;
}

}  // namespace strata::models
