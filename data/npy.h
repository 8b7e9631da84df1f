// data/npy.h: NumPy's .npy format (version 1.0) for float32 arrays in C order, what
// `strata embed` writes (torch-free). numpy.load reads it back; the format:
//   "\x93NUMPY" 0x01 0x00, header length (uint16, little-endian), the header, the data, where the
//   header is the Python dict literal "{'descr': '<f4', 'fortran_order': False, 'shape': (n, d), }"
//   padded with spaces and ended by '\n' so that the data starts at a multiple of 64 bytes.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace strata::data {

// The bytes of a .npy file holding `values` (little-endian float32, row-major) with shape `shape`
// (any rank, () a scalar). Throws strata::Error when the shape has a negative size or its product
// is not values.size().
std::string npy_float32(std::span<const float> values, const std::vector<int64_t>& shape);

}  // namespace strata::data
