// torch/info.cpp: torch.ops.strata.info: which strata this library is and what its kernels run on
// (strata.info() and strata.__version__ in Python). Its schema is here, not in torch/library.cpp,
// as a fragment of the same `strata` library: it is no kernel, only a report.
#include <torch/library.h>
#include <torch/version.h>

#include <cstdint>
#include <string>
#include <tuple>

#include "strata/cpu.h"
#include "strata/threading.h"

namespace {

// (strata's version, the LibTorch version it was compiled against, the ISA the kernels dispatch to,
//  the threads of strata's pool, the CPU's features).
std::tuple<std::string, std::string, std::string, int64_t, std::string> info() {
  return {STRATA_VERSION, TORCH_VERSION, strata::isa_name(strata::active_isa()), strata::get_num_threads(),
          strata::cpu_summary()};
}

// (the engine compute="auto" gives bfloat16 inputs here: "amx_bf16", "avx512_bf16" or "fp32"; the
//  core's vdpbf16ps and fp32 FMA rates that decided it, GMAC/s on one thread, zeros without
//  AVX512-BF16: strata/cpu.h).
std::tuple<std::string, double, double> bf16_auto() {
  const strata::Compute c = strata::resolve_compute("bf16_auto", strata::Compute::automatic, true);
  const strata::Bf16DotRates& r = strata::bf16_dot_rates();
  return {strata::compute_name(c), r.dot, r.fma};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(strata, m) {
  m.def("info() -> (str version, str torch_version, str isa, int num_threads, str cpu_features)", &info);
  m.def("bf16_auto() -> (str engine, float dot_gmacs, float fma_gmacs)", &bf16_auto);
}
