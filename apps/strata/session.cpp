// apps/strata/session.cpp: thread setup and the report preamble.
#include "session.h"

#include <ATen/Parallel.h>
#include <malloc.h>
#include <torch/version.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "strata/cpu.h"
#include "strata/error.h"
#include "strata/threading.h"

namespace strata::app {

// Why: glibc serves blocks above its mmap threshold (128 KB at first, raised only as such blocks
// are freed) with fresh mappings and trims the heap's free top; the activations of a training
// step (8192 x 512 floats for the char-LM cpu size: 16 MB) were unmapped after every step and
// faulted in again, zeroed, on the next. Measured (`strata train configs/charlm.toml --size cpu
// --set train.steps=10`, 2 threads, three alternating runs each): 512k -> 208k minor faults, system
// time 1.33-1.74 -> 0.60-0.73 s, wall 7.1-9.1 -> 6.4-6.9 s.
bool keep_freed_memory() {
  if (const char* t = std::getenv("GLIBC_TUNABLES"); t != nullptr && std::strstr(t, "glibc.malloc.") != nullptr)
    return false;
  if (std::getenv("MALLOC_MMAP_THRESHOLD_") != nullptr || std::getenv("MALLOC_TRIM_THRESHOLD_") != nullptr) return false;
  const bool ok = mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1;  // glibc's largest on 64-bit
  return mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1 && ok;
}

void warm_heap(int64_t bytes) {
  constexpr size_t kBlock = size_t(16) << 20;  // under keep_freed_memory's 32 MB mmap threshold: from the heap
  std::vector<void*> blocks;
  for (int64_t done = 0; done < bytes; done += int64_t(kBlock)) {
    void* p = std::malloc(kBlock);
    if (p == nullptr) break;  // less warmth, not an error
    std::memset(p, 1, kBlock);  // not 0: malloc + memset(0) may be folded into a calloc that touches nothing
    blocks.push_back(p);
  }
  for (void* p : blocks) std::free(p);
}

int configure_threads(int requested) {
  STRATA_CHECK_ARG(requested >= 0, "configure_threads", "requested", ">= 1 (or 0 for the default)", requested);
  const int n = requested > 0 ? requested : strata::get_num_threads();
  strata::set_num_threads(n);
  at::set_num_threads(n);
  return n;
}

std::string torch_version() { return TORCH_VERSION; }

std::string version_string() {
  return std::string("strata ") + STRATA_CLI_VERSION + " (LibTorch " + torch_version() + ")";
}

BenchReport new_report(const std::string& bench, int threads) {
  BenchReport r;
  r.bench = bench;
  r.threads = threads;
  r.peak = measure_fma_peak(threads);
  r.cpu = cpu_summary();
  r.cpu_model = cpu_model();
  r.torch_version = torch_version();
  r.date = utc_now();
  return r;
}

}  // namespace strata::app
