// models/checkpoint_meta.cpp: see checkpoint_meta.h.
#include "models/checkpoint_meta.h"

#include <cstdint>
#include <type_traits>

#include "strata/error.h"

namespace strata::models {
namespace {

template <typename T>
T meta_field(const nlohmann::json& j, const char* key, const std::string& path) {
  STRATA_CHECK(j.contains(key), "checkpoint '", path, "': metadata has no '", key, "'");
  if constexpr (std::is_integral_v<T>) {
    // An integer field must be an integer literal in T's range: nlohmann's get<T> casts a float
    // (5.9e69 -> uint64 is undefined behaviour, found by the checkpoint_meta fuzzer) and wraps an
    // unsigned literal past INT64_MAX.
    const nlohmann::json& v = j.at(key);
    const bool too_big = v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX);
    const bool fits = std::is_unsigned_v<T> ? v.is_number_unsigned() : v.is_number_integer() && !too_big;
    if (v.is_number() && !fits)  // other types: the wrong-type error below
      throw Error("checkpoint '" + path + "': metadata '" + key + "' is " + v.dump() + " (expected " +
                  (std::is_unsigned_v<T> ? "an integer >= 0" : "an integer") + " that fits in 64 bits)");
  }
  try {
    return j.at(key).get<T>();
  } catch (const nlohmann::json::exception&) {
    throw Error("checkpoint '" + path + "': metadata '" + key + "' has the wrong type: " + j.at(key).dump());
  }
}

bool is_sha256_hex(const std::string& s) {
  if (s.size() != 64) return false;
  for (char ch : s)
    if (!((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f'))) return false;
  return true;
}

}  // namespace

CheckpointMeta parse_checkpoint_meta(const std::string& text, const std::string& path) {
  CheckpointMeta m;
  try {
    m.json = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error("checkpoint '" + path + "': metadata is not valid JSON (torn or altered file?): " + e.what());
  }
  STRATA_CHECK(m.json.is_object(), "checkpoint '", path, "': metadata is not a JSON object (got ",
               m.json.type_name(), ")");
  const auto format = meta_field<std::string>(m.json, "format", path);
  STRATA_CHECK(format == kCheckpointFormat, "checkpoint '", path, "': format '", format, "' (expected ",
               kCheckpointFormat, ")");
  m.step = meta_field<int64_t>(m.json, "step", path);
  STRATA_CHECK(m.step >= 0, "checkpoint '", path, "': metadata 'step' is ", m.step, " (expected >= 0)");
  m.safetensors = meta_field<std::string>(m.json, "safetensors", path);
  STRATA_CHECK(!m.safetensors.empty() && m.safetensors.find('/') == std::string::npos && m.safetensors != "." &&
                   m.safetensors != ".." && m.safetensors.find('\0') == std::string::npos,
               "checkpoint '", path, "': metadata 'safetensors' is \"", m.safetensors,
               "\" (expected the file name of the tensors beside it, e.g. step-00000010.safetensors)");
  m.bytes = meta_field<uint64_t>(m.json, "bytes", path);
  m.sha256 = meta_field<std::string>(m.json, "sha256", path);
  STRATA_CHECK(is_sha256_hex(m.sha256), "checkpoint '", path, "': metadata 'sha256' is \"", m.sha256,
               "\" (expected 64 lowercase hex digits)");
  return m;
}

}  // namespace strata::models
