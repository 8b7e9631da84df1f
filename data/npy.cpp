// data/npy.cpp: see npy.h (the format: numpy/lib/format.py, version 1.0).
#include "data/npy.h"

#include <bit>
#include <cstring>

#include "strata/error.h"

namespace strata::data {

namespace {

// "(n, d)", "(n,)" for rank 1 (Python's one-element tuple), "()" for a scalar.
std::string shape_tuple(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  if (shape.size() == 1) s += ",";
  return s + ")";
}

}  // namespace

std::string npy_float32(std::span<const float> values, const std::vector<int64_t>& shape) {
  static_assert(std::endian::native == std::endian::little, "npy_float32 writes '<f4': the host's bytes as they are");
  int64_t count = 1;
  for (int64_t d : shape) {
    STRATA_CHECK_ARG(d >= 0, "npy_float32", "shape", "sizes >= 0", shape_tuple(shape));
    count *= d;
  }
  STRATA_CHECK_ARG(count == int64_t(values.size()), "npy_float32", "shape",
                   "a product equal to the " + std::to_string(values.size()) + " values", shape_tuple(shape));
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': " + shape_tuple(shape) + ", }";
  const size_t prefix = 10;  // magic (6) + version (2) + header length (2)
  const size_t total = (prefix + header.size() + 1 + 63) / 64 * 64;  // + '\n', data 64-byte aligned
  header.append(total - prefix - header.size() - 1, ' ');
  header += '\n';
  STRATA_CHECK(header.size() <= 0xffff, "npy_float32: header of ", header.size(), " bytes (version 1.0 holds 65535)");
  std::string out = "\x93NUMPY";
  out += char(1);
  out += char(0);
  out += char(header.size() & 0xff);
  out += char(header.size() >> 8);
  out += header;
  const size_t at = out.size();
  out.resize(at + values.size_bytes());
  if (!values.empty()) std::memcpy(out.data() + at, values.data(), values.size_bytes());
  return out;
}

}  // namespace strata::data
