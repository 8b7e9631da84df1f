// src/cpu/monarch_avx512.cpp: the MonarchAttention kernel compiled for ISA level 2 (avx512).
// Compiled with this ISA's -m flags (cmake/strata_monarch.cmake); called only after run-time dispatch.
#define STRATA_ISA_LEVEL 2
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <immintrin.h>
#include <limits>
#include <vector>

#include "cpu/monarch_params.h"
#include "strata/threading.h"

namespace strata::cpu::avx512 {
#include "core/simd.h"
#include "cpu/monarch_kernel.inc"
}  // namespace strata::cpu::avx512
