// src/cpu/mlr_avx2.cpp: the MLR attention kernel compiled for ISA level 1 (avx2).
// Compiled with this ISA's -m flags (cmake/strata_mlr.cmake); called only after run-time dispatch.
#define STRATA_ISA_LEVEL 1
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <immintrin.h>
#include <limits>
#include <memory>
#include <mutex>
#include <vector>

#include "cpu/mlr_params.h"
#include "strata/threading.h"

namespace strata::cpu::avx2 {
#include "core/simd.h"
#include "cpu/mlr_kernel.inc"
#include "cpu/mlr_decode.inc"
}  // namespace strata::cpu::avx2
