// tests/fuzz/train_config_fuzz.cpp: the TOML run config (models/train_config.h) from any text.
// Property: an accepted config survives its own canonical TOML, parse(to_toml(c)) == c, the
// contract the checkpoints rely on (a run resumes from the config it wrote).
#include "fuzz_common.h"
#include "models/train_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace strata;
  const std::string text = fuzz::text_of(data, size);
  models::TrainConfig c;
  if (!fuzz::accepted([&] { c = models::parse_train_config(text, "fuzz.toml"); })) return 0;
  const std::string again = models::to_toml(c);
  models::TrainConfig d;
  if (!fuzz::accepted([&] { d = models::parse_train_config(again, "fuzz.toml (to_toml)"); }))
    fuzz::property_failed("to_toml of an accepted config is rejected", again);
  if (!(c == d)) fuzz::property_failed("parse(to_toml(c)) != c", again);
  return 0;
}
