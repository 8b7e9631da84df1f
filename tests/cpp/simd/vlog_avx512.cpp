// One ISA's vlog for core_simd_test.cpp (tests/cpp/simd/vlog_check.inc), compiled with the
// avx512 flags of cmake/strata_family.cmake.
#define STRATA_ISA_LEVEL 2
#include <cstring>

#include "core/isa_unit.h"

namespace strata::test_avx512 {
#include "core/simd.h"
#include "simd/vlog_check.inc"
}  // namespace strata::test_avx512

double vlog_worst_ulp_avx512(uint32_t step, float* worst_x) {
  return strata::test_avx512::vlog_worst_ulp(step, worst_x);
}
