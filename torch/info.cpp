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

}  // namespace

TORCH_LIBRARY_FRAGMENT(strata, m) {
  m.def("info() -> (str version, str torch_version, str isa, int num_threads, str cpu_features)", &info);
}
