// models/spec_util.h (private to models/): the pieces of the one-line spec grammars
// ("kind" or "kind:key=value,key=value,...") shared by the attention zoo (attention_zoo.h) and the
// per-layer attention of the trained models (layer_attention.h): the error, integer and choice
// values, and the split of "key=value,..." into checked pairs.
#pragma once
#include <charconv>
#include <cstdint>
#include <initializer_list>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "strata/error.h"

namespace strata::models::spec_syntax {

using detail::cat;

// The error of a bad spec: 'attention spec "<spec>": <what>'.
[[noreturn]] inline void bad_spec(const std::string& spec, const std::string& what) {
  throw Error(cat("attention spec \"", spec, "\": ", what));
}

// Parses a decimal integer >= lo that fills `text` entirely; throws naming the key otherwise.
inline int64_t parse_int(const std::string& spec, const std::string& key, const std::string& text, int64_t lo) {
  int64_t v = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec != std::errc() || ptr != end || v < lo)
    bad_spec(spec, cat("key '", key, "': expected an integer >= ", lo, ", got \"", text, "\""));
  return v;
}

// The value among `choices` whose name is `text`; throws naming the key and the names otherwise.
template <class E>
E parse_choice(const std::string& spec, const std::string& key, const std::string& text,
               std::initializer_list<E> choices, const char* (*name_of)(E)) {
  std::string list;
  for (E c : choices) {
    if (text == name_of(c)) return c;
    list += list.empty() ? name_of(c) : cat(" or ", name_of(c));
  }
  bad_spec(spec, cat("key '", key, "': expected ", list, ", got \"", text, "\""));
}

// The (key, value) pairs of `rest` = "key=value,key=value,..." (the part of `spec` after ':'):
// throws for an empty rest, an item without '=' or key, and a key given twice.
inline std::vector<std::pair<std::string, std::string>> key_values(const std::string& spec, const std::string& rest) {
  if (rest.empty()) bad_spec(spec, "nothing after ':' (expected key=value pairs, or no ':')");
  std::vector<std::pair<std::string, std::string>> out;
  std::set<std::string> seen;
  size_t pos = 0;
  while (pos <= rest.size()) {
    const size_t comma = std::min(rest.find(',', pos), rest.size());
    const std::string item = rest.substr(pos, comma - pos);
    pos = comma + 1;
    const size_t eq = item.find('=');
    if (item.empty() || eq == std::string::npos || eq == 0) bad_spec(spec, cat("expected key=value, got \"", item, "\""));
    std::string key = item.substr(0, eq);
    if (!seen.insert(key).second) bad_spec(spec, cat("key '", key, "' given twice"));
    out.emplace_back(std::move(key), item.substr(eq + 1));
    if (comma == rest.size()) break;
  }
  return out;
}

}  // namespace strata::models::spec_syntax
