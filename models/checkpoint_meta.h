// models/checkpoint_meta.h: the metadata of a training checkpoint (checkpoints/step-*.json and
// latest.json, models/checkpoint.h), parsed and checked before any tensor is read. Torch-free, so
// that this reader of user files is fuzzed (tests/fuzz/) and tested under ASan.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace strata::models {

inline constexpr const char* kCheckpointFormat = "strata-checkpoint/1";

struct CheckpointMeta {
  nlohmann::json json;      // the whole object (what the trainer added: config, data position, ...)
  int64_t step = 0;         // >= 0
  std::string safetensors;  // the tensors' file name, in the metadata's folder (a plain name: no '/')
  uint64_t bytes = 0;       // its byte size
  std::string sha256;       // its sha256, 64 lowercase hex digits
};

// Parses the metadata `text` of the file `path` (named in every error). Throws strata::Error
// "checkpoint '<path>': ..." for text that is not a JSON object, a missing or mistyped field, a
// format other than kCheckpointFormat, a negative step, or a file name that leaves the folder.
CheckpointMeta parse_checkpoint_meta(const std::string& text, const std::string& path);

}  // namespace strata::models
