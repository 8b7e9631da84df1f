// tests/fuzz/char_corpus_fuzz.cpp: a character-LM corpus (data/char_corpus.h) from any bytes; the
// first byte picks the val fraction (0..1 in 1/255 steps: out-of-range ones are errors).
// Properties: every id of an accepted corpus is in the vocabulary, and decoding and re-encoding
// it gives the same ids.
#include <algorithm>

#include "data/char_corpus.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace strata;
  if (size == 0) return 0;
  const double val_fraction = double(data[0]) / 255.0 * 1.2 - 0.1;  // also a little outside [0, 1]
  const std::string text = fuzz::text_of(data + 1, size - 1);
  data::CharCorpus c;
  if (!fuzz::accepted([&] { c = data::make_char_corpus("fuzz", text, val_fraction); })) return 0;
  for (const auto* split : {&c.train, &c.val}) {
    for (uint8_t id : *split)
      if (id >= data::CharCorpus::kVocab) fuzz::property_failed("an id outside the vocabulary", std::to_string(id));
    std::vector<int64_t> ids(split->begin(), split->end());
    const std::string decoded = data::decode_chars(ids);
    if (data::encode_chars(decoded) != ids) fuzz::property_failed("encode(decode(ids)) != ids", decoded);
  }
  return 0;
}
