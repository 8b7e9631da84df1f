// tests/fuzz/specs_fuzz.cpp: the spec grammars a user types: `model.attention` patterns
// (models/layer_attention_spec.h) and `strata convert --method` / the encoder's specs
// (models/attention_spec.h). The first byte picks the layer count (1..8).
// Property: an accepted spec's canonical string parses back to the same spec.
#include "fuzz_common.h"
#include "models/attention_spec.h"
#include "models/layer_attention_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace strata;
  if (size == 0) return 0;
  const int64_t layers = 1 + data[0] % 8;
  const std::string text = fuzz::text_of(data + 1, size - 1);

  std::vector<models::LayerAttentionSpec> specs;
  if (fuzz::accepted([&] { specs = models::parse_attention_pattern(text, layers); })) {
    const std::string canon = models::pattern_to_string(specs);
    std::vector<models::LayerAttentionSpec> again;
    if (!fuzz::accepted([&] { again = models::parse_attention_pattern(canon, layers); }) || again != specs)
      fuzz::property_failed("parse_attention_pattern(pattern_to_string(p)) != p", text + " -> " + canon);
  }

  models::ConversionMethod m;
  if (fuzz::accepted([&] { m = models::parse_conversion_method(text); })) {
    const std::string canon = models::to_string(m.spec);
    models::AttentionSpec again;
    if (!fuzz::accepted([&] { again = models::parse_attention_spec(canon); }) || !(again == m.spec))
      fuzz::property_failed("parse_attention_spec(to_string(s)) != s", text + " -> " + canon);
    models::ConversionMethod relabelled;
    if (!fuzz::accepted([&] { relabelled = models::parse_conversion_method(m.label()); }) ||
        relabelled.layers != m.layers)
      fuzz::property_failed("parse_conversion_method(label()) changes the layers", text + " -> " + m.label());
  }
  return 0;
}
