// apps/strata/session.cpp: thread setup and the report preamble.
#include "session.h"

#include <ATen/Parallel.h>
#include <torch/version.h>

#include "strata/cpu.h"
#include "strata/error.h"
#include "strata/threading.h"

namespace strata::app {

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
