// strata/tensor.h: a torch-free, non-owning tensor view (pointer, dtype, shape, strides).
// Strides are in ELEMENTS (not bytes), as in torch. Up to 6 dims.
#pragma once
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>

#include "strata/error.h"

namespace strata {

enum class DType : uint8_t { f32 = 0, bf16 = 1, f16 = 2, f64 = 3, u8 = 4 };

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "float32";
    case DType::bf16: return "bfloat16";
    case DType::f16: return "float16";
    case DType::f64: return "float64";
    case DType::u8: return "uint8";
  }
  return "?";
}

inline int dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::bf16: case DType::f16: return 2;
    case DType::f64: return 8;
    case DType::u8: return 1;
  }
  return 0;
}

// bf16 <-> f32 (round to nearest even; NaN stays NaN).
inline float bf16_to_f32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// Order of the (seq, head) dims of a 4-D attention tensor: BSHD = (batch, seq, heads, dim),
// BHSD = (batch, heads, seq, dim). Kernels read either, with any strides.
enum class Layout : uint8_t { BSHD = 0, BHSD = 1 };

struct TensorView {
  static constexpr int kMaxDims = 6;
  void* data = nullptr;
  DType dtype = DType::f32;
  int ndim = 0;
  int64_t shape[kMaxDims] = {};
  int64_t stride[kMaxDims] = {};  // in elements

  TensorView() = default;
  // Contiguous (row-major) view over `data` with the given shape.
  TensorView(void* p, DType t, std::initializer_list<int64_t> dims) : data(p), dtype(t) {
    ndim = int(dims.size());
    int i = 0;
    for (int64_t d : dims) shape[i++] = d;
    int64_t s = 1;
    for (int k = ndim - 1; k >= 0; --k) { stride[k] = s; s *= shape[k]; }
  }
  bool defined() const { return data != nullptr || numel() == 0; }
  int64_t numel() const {
    int64_t n = 1;
    for (int k = 0; k < ndim; ++k) n *= shape[k];
    return n;
  }
  // Returns a view with dims a and b swapped (no copy).
  TensorView transpose(int a, int b) const {
    TensorView t = *this;
    std::swap(t.shape[a], t.shape[b]);
    std::swap(t.stride[a], t.stride[b]);
    return t;
  }
  std::string shape_str() const {
    std::string s = "[";
    for (int k = 0; k < ndim; ++k) s += (k ? ", " : "") + std::to_string(shape[k]);
    return s + "]";
  }
  // Reads element at flat multi-index (for references and tests; slow).
  double get(const int64_t* idx) const;
  void set(const int64_t* idx, double v) const;
};

}  // namespace strata
