// src/core/tensor.cpp: element access for references/tests, and f16 conversion.
#include "strata/tensor.h"

#include <cmath>

namespace strata {

float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: renormalise
      int e = -1;
      do { ++e; man <<= 1; } while (!(man & 0x400));
      u = sign | uint32_t(127 - 15 - e) << 23 | (man & 0x3ff) << 13;
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | man << 13;
  } else {
    u = sign | (exp + 127 - 15) << 23 | man << 13;
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00;             // NaN
  if (a >= 0x477ff000u) return sign | 0x7c00;            // overflow -> inf (rounds up past max)
  if (a < 0x38800000u) {                                 // subnormal or zero
    const float r = std::fabs(f) * 16777216.f;           // / 2^-24, round to nearest even
    return sign | uint16_t(std::nearbyint(r));
  }
  uint32_t m = a + 0xfffu + ((a >> 13) & 1u) - 0x38000000u;  // rebias + round to nearest even
  return sign | uint16_t(m >> 13);
}

namespace {
int64_t offset(const TensorView& t, const int64_t* idx) {
  int64_t off = 0;
  for (int k = 0; k < t.ndim; ++k) off += idx[k] * t.stride[k];
  return off;
}
}  // namespace

double TensorView::get(const int64_t* idx) const {
  const int64_t off = offset(*this, idx);
  switch (dtype) {
    case DType::f32: return static_cast<const float*>(data)[off];
    case DType::bf16: return bf16_to_f32(static_cast<const uint16_t*>(data)[off]);
    case DType::f16: return f16_to_f32(static_cast<const uint16_t*>(data)[off]);
    case DType::f64: return static_cast<const double*>(data)[off];
    case DType::u8: return static_cast<const uint8_t*>(data)[off];
  }
  return 0;
}

void TensorView::set(const int64_t* idx, double v) const {
  const int64_t off = offset(*this, idx);
  switch (dtype) {
    case DType::f32: static_cast<float*>(data)[off] = float(v); break;
    case DType::bf16: static_cast<uint16_t*>(data)[off] = f32_to_bf16(float(v)); break;
    case DType::f16: static_cast<uint16_t*>(data)[off] = f32_to_f16(float(v)); break;
    case DType::f64: static_cast<double*>(data)[off] = v; break;
    case DType::u8: static_cast<uint8_t*>(data)[off] = uint8_t(v); break;
  }
}

}  // namespace strata
