// tests/fuzz/checkpoint_meta_fuzz.cpp: a checkpoint's metadata JSON (models/checkpoint_meta.h),
// then the run config a resume reads out of it (its "config" string, models/train_config.h).
// Property: an accepted metadata's tensor file stays in the metadata's folder.
#include "fuzz_common.h"
#include "models/checkpoint_meta.h"
#include "models/train_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace strata;
  models::CheckpointMeta m;
  if (!fuzz::accepted([&] { m = models::parse_checkpoint_meta(fuzz::text_of(data, size), "fuzz.json"); })) return 0;
  if (m.safetensors.empty() || m.safetensors.find('/') != std::string::npos || m.safetensors == "..")
    fuzz::property_failed("the tensor file leaves the checkpoint folder", m.safetensors);
  if (m.json.contains("config") && m.json["config"].is_string())
    fuzz::accepted([&] { models::parse_train_config(m.json["config"].get<std::string>(), "fuzz.json (config)"); });
  return 0;
}
