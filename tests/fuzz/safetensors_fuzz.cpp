// tests/fuzz/safetensors_fuzz.cpp: a safetensors file (data/safetensors.h) from any bytes.
// Property: every tensor of an accepted file lies inside the file, with as many bytes as its
// shape and dtype say.
#include <vector>

#include "data/safetensors.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace strata;
  std::vector<std::byte> bytes(size);
  for (size_t i = 0; i < size; ++i) bytes[i] = std::byte(data[i]);
  fuzz::accepted([&] {
    const data::SafetensorsFile f = data::SafetensorsFile::from_bytes(std::move(bytes), "fuzz");
    for (const auto& t : f.tensors()) {
      uint64_t n = data::st_dtype_size(t.dtype);
      for (int64_t d : t.shape) {
        if (d < 0) fuzz::property_failed("a negative dimension", t.name);
        n *= uint64_t(d);
      }
      if (n != t.bytes.size()) fuzz::property_failed("byte count differs from shape x dtype", t.name);
      volatile std::byte sink{};
      for (std::byte b : t.bytes) sink = b;  // every byte readable (ASan checks the span)
      (void)sink;
    }
  });
  return 0;
}
