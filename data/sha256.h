// data/sha256.h: SHA-256 (FIPS 180-4) of bytes and of files, as lowercase hex (torch-free).
// Used to check downloaded weights and data files against their published digests.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace strata::data {

// Incremental hasher: update() any number of times, then digest() once.
class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t n);
  std::array<uint8_t, 32> digest();  // finalises; the object must not be updated afterwards

 private:
  void block(const uint8_t* p);  // one 64-byte block
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t buf_len_ = 0;
  uint64_t total_ = 0;  // bytes
};

std::string to_hex(const std::array<uint8_t, 32>& digest);
std::string sha256_hex(std::string_view bytes);
// Streams the file. Throws strata::Error naming the file when it cannot be read.
std::string sha256_file_hex(const std::string& path);

}  // namespace strata::data
