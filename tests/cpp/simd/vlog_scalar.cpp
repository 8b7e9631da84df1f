// One ISA's vlog for core_simd_test.cpp (tests/cpp/simd/vlog_check.inc), compiled with the
// scalar flags of cmake/strata_family.cmake.
#define STRATA_ISA_LEVEL 0
#include <cstring>

#include "core/isa_unit.h"

namespace strata::test_scalar {
#include "core/simd.h"
#include "simd/vlog_check.inc"
}  // namespace strata::test_scalar

double vlog_worst_ulp_scalar(uint32_t step, float* worst_x) {
  return strata::test_scalar::vlog_worst_ulp(step, worst_x);
}
