// tests/fuzz/ett_csv_fuzz.cpp: an ETT-format CSV (data/ett.h) from any text. Inputs shorter than
// the protocol's 14,400 rows are rejected after the parse of every line, so the line reader is
// what this mostly covers; a 4-byte prefix may ask for the text's data rows to be repeated up to
// that length, which reaches the standardisation and the windows too.
// Property: an accepted file's values are finite and every window of every split can be read.
#include <algorithm>
#include <cmath>
#include <vector>

#include "data/ett.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace strata;
  std::string text = fuzz::text_of(data, size);
  if (text.rfind("REP\n", 0) == 0) {  // "REP\n<header>\n<rows...>": rows repeated to 14,400
    text.erase(0, 4);
    const size_t nl = text.find('\n');
    if (nl != std::string::npos && nl + 1 < text.size()) {
      const std::string header = text.substr(0, nl + 1), rows = text.substr(nl + 1);
      std::string out = header;
      const size_t lines = size_t(std::count(rows.begin(), rows.end(), '\n')) + 1;
      for (size_t n = 0; n * lines < size_t(data::kEttTestEnd) + lines; ++n) out += rows + "\n";
      text = out;
    }
  }
  data::EttData d;
  if (!fuzz::accepted([&] { d = data::parse_ett_csv(text, "fuzz.csv"); })) return 0;
  for (float v : d.values)
    if (!std::isfinite(v)) fuzz::property_failed("a non-finite standardised value", "");
  const int64_t L = 24, H = 24;
  std::vector<float> in(size_t(L * d.channels)), out(size_t(H * d.channels));
  for (auto split : {data::EttSplit::train, data::EttSplit::val, data::EttSplit::test}) {
    const int64_t n = data::ett_num_windows(d, split, L, H);
    for (int64_t k : {int64_t(0), n / 2, n - 1}) data::ett_window(d, split, L, H, k, in.data(), out.data());
  }
  return 0;
}
