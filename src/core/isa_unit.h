// src/core/isa_unit.h: what every per-ISA translation unit of a kernel family includes before its
// params header (cmake/strata_family.cmake generates those units). STRATA_ISA_LEVEL (0 scalar,
// 1 avx2, 2 avx512) is defined by the unit; src/core/simd.h, included inside the ISA's namespace,
// picks the vector type from it.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <memory>
#include <mutex>
#include <vector>
#if STRATA_ISA_LEVEL > 0
#include <immintrin.h>
#endif

#include "core/dispatch.h"
#include "strata/threading.h"
