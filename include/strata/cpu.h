// strata/cpu.h: CPU feature detection (run time) and the ISA the kernels dispatch to.
#pragma once
#include <string>

namespace strata {

enum class Isa { scalar = 0, avx2 = 1, avx512 = 2 };

struct CpuFeatures {
  bool avx2 = false, fma = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512_bf16 = false, avx512_fp16 = false;
  bool amx_tile = false, amx_bf16 = false;  // CPU bits AND the OS grants the tile state
};

const CpuFeatures& cpu_features();
// Best ISA this CPU supports, lowered by the env var STRATA_ISA=scalar|avx2|avx512 or set_isa().
Isa active_isa();
void set_isa(Isa isa);  // throws strata::Error if the CPU lacks it
const char* isa_name(Isa isa);
std::string cpu_summary();

}  // namespace strata
