// src/core/dispatch.h: run-time ISA dispatch for the kernel families. A family's kernel bodies
// (src/cpu/kernels/<family>.inc) are compiled once per ISA by strata_kernel_family
// (cmake/strata_family.cmake) inside namespace strata::cpu::<isa>, and each defines one table of
// entry points there (e.g. `const MlrKernels kMlrKernels = {...};`). The family's params header
// declares the tables with STRATA_PER_ISA and its entry point picks one with
// STRATA_ACTIVE_KERNELS: no switch per entry point.
#pragma once
#include "strata/cpu.h"

// Declares `decl` in every ISA namespace (the list matches Isa in strata/cpu.h and STRATA_ISAS in
// cmake/strata_family.cmake). Use inside namespace strata::cpu.
#define STRATA_PER_ISA(decl)  \
  namespace scalar { decl }   \
  namespace avx2 { decl }     \
  namespace avx512 { decl }

// The active ISA's instance of a table declared with STRATA_PER_ISA (usable from any namespace).
#define STRATA_ACTIVE_KERNELS(table)                                                      \
  (*::strata::cpu::active_of(&::strata::cpu::scalar::table, &::strata::cpu::avx2::table, \
                             &::strata::cpu::avx512::table))

namespace strata::cpu {

// The object of the active ISA (strata::active_isa()) among its per-ISA instances.
template <class T>
const T* active_of(const T* scalar, const T* avx2, const T* avx512) {
  switch (active_isa()) {
    case Isa::avx512: return avx512;
    case Isa::avx2: return avx2;
    default: return scalar;
  }
}

}  // namespace strata::cpu
