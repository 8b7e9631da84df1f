// tests/fuzz/fuzz_common.h: what every libFuzzer target here shares. The contract each checks: a
// reader of user input either returns a value (whose properties the target checks) or throws
// strata::Error; any other exception, a crash, a sanitizer report, a hang or a leak is a finding.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "strata/error.h"

namespace strata::fuzz {

// The input as text (any bytes, NULs included).
inline std::string text_of(const uint8_t* data, size_t size) { return std::string(reinterpret_cast<const char*>(data), size); }

// Runs f(); strata::Error is the expected outcome for bad input and returns false; anything else
// escapes to libFuzzer (an uncaught exception is reported with the input that caused it).
template <typename F>
bool accepted(F&& f) {
  try {
    f();
    return true;
  } catch (const Error&) {
    return false;
  }
}

// A property of an accepted input that does not hold: a finding (abort, so libFuzzer saves it).
[[noreturn]] inline void property_failed(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz property failed: %s\n%s\n", what, detail.c_str());
  std::abort();
}

}  // namespace strata::fuzz
