// apps/strata/peak.h: this machine's measured fp32 FMA peak (the denominator of every "% of peak").
// A loop of 12 independent FMA chains per thread (16-lane AVX-512 where the CPU has it, 8-lane
// AVX2+FMA otherwise, scalar as a last resort), run on one thread and on all threads at once.
#pragma once
#include <string>

namespace strata::app {

struct FmaPeak {
  std::string isa;          // "avx512", "avx2" or "scalar": the loop that ran
  int threads = 1;          // threads in the all-threads measurement
  double per_core_gflops = 0;  // one thread
  double all_gflops = 0;       // `threads` threads concurrently (sum of their rates)
};

// Measures the fp32 FMA peak with `threads` threads (>= 1), best of 5; takes about 2 seconds.
FmaPeak measure_fma_peak(int threads);

namespace detail {
// Runs `iters` iterations of 12 independent 16-lane FMA chains; returns a value derived from the
// accumulators (so the loop is not removed). 384 FLOPs per iteration. AVX-512F CPUs only.
float fma_loop_avx512(long iters);
// Same with 8-lane AVX2 FMA; 192 FLOPs per iteration. AVX2+FMA CPUs only.
float fma_loop_avx2(long iters);
}  // namespace detail

}  // namespace strata::app
