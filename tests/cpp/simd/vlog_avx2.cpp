// One ISA's vlog for core_simd_test.cpp (tests/cpp/simd/vlog_check.inc), compiled with the
// avx2 flags of cmake/strata_family.cmake.
#define STRATA_ISA_LEVEL 1
#include <cstring>

#include "core/isa_unit.h"

namespace strata::test_avx2 {
#include "core/simd.h"
#include "simd/vlog_check.inc"
}  // namespace strata::test_avx2

double vlog_worst_ulp_avx2(uint32_t step, float* worst_x) {
  return strata::test_avx2::vlog_worst_ulp(step, worst_x);
}
