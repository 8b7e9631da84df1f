// src/cpu/monarch_scalar.cpp: the MonarchAttention kernel compiled for ISA level 0 (scalar).
// Compiled with this ISA's -m flags (cmake/strata_monarch.cmake); called only after run-time dispatch.
#define STRATA_ISA_LEVEL 0
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <vector>

#include "cpu/monarch_params.h"
#include "strata/threading.h"

namespace strata::cpu::scalar {
#include "core/simd.h"
#include "cpu/monarch_kernel.inc"
}  // namespace strata::cpu::scalar
