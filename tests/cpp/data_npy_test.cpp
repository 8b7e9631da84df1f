// tests/cpp/data_npy_test.cpp: the .npy writer (data/npy.h). The expected headers are numpy's own
// (np.save of float32 arrays with numpy 2.4: the same 128-byte prefix, so the bytes must match);
// tests/python/test_embed.py reads the CLI's files back with numpy.load.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "data/npy.h"
#include "strata/error.h"

namespace {

using strata::data::npy_float32;

// The header text (between the 10-byte prefix and the data) as np.save writes it for `shape`.
std::string numpy_header(const std::string& shape) {
  std::string h = "{'descr': '<f4', 'fortran_order': False, 'shape': " + shape + ", }";
  h.append(117 - h.size(), ' ');
  return h + "\n";
}

void expect_npy(const std::vector<float>& values, const std::vector<int64_t>& shape, const std::string& shape_text) {
  const std::string b = npy_float32(values, shape);
  ASSERT_EQ(b.size(), 128 + 4 * values.size()) << shape_text;
  EXPECT_EQ(b.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
  EXPECT_EQ(uint8_t(b[8]) + 256 * uint8_t(b[9]), 118);  // the header length, little-endian
  EXPECT_EQ(b.substr(10, 118), numpy_header(shape_text));
  std::vector<float> back(values.size());
  if (!back.empty()) std::memcpy(back.data(), b.data() + 128, 4 * back.size());
  EXPECT_EQ(back, values) << shape_text;
}

TEST(Npy, MatchesNumpysBytes) {
  expect_npy({0, 1, 2, 3, 4, 5}, {2, 3}, "(2, 3)");
  expect_npy({0.5f, -1.25f, 3e-7f, 1e30f}, {4}, "(4,)");  // rank 1: Python's one-element tuple
  expect_npy({7}, {}, "()");
  expect_npy({}, {0, 384}, "(0, 384)");
}

TEST(Npy, DataIs64ByteAlignedForLongShapes) {
  // A header that does not fit in 118 bytes grows by whole 64-byte steps.
  const std::vector<int64_t> shape = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2};
  const std::string b = npy_float32(std::vector<float>{1, 2}, shape);
  const size_t header_len = uint8_t(b[8]) + 256 * uint8_t(b[9]);
  EXPECT_EQ((10 + header_len) % 64, 0u);
  EXPECT_GT(header_len, 118u);
  EXPECT_EQ(b[10 + header_len - 1], '\n');
  EXPECT_EQ(b.size(), 10 + header_len + 8);
}

TEST(Npy, RejectsAShapeThatDoesNotMatch) {
  try {
    npy_float32(std::vector<float>{1, 2, 3}, {2, 2});
    FAIL() << "no error";
  } catch (const strata::Error& e) {
    EXPECT_NE(std::string(e.what()).find("argument 'shape'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("(2, 2)"), std::string::npos) << e.what();
  }
  EXPECT_THROW(npy_float32(std::vector<float>{}, {-1}), strata::Error);
}

}  // namespace
