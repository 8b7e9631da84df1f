// apps/strata/session.h: what every command sets up the same way: thread counts (strata's pool
// and torch's, kept equal so a peer comparison is fair) and the report preamble.
#pragma once
#include <string>

#include "report.h"

namespace strata::app {

// Sets strata's and torch's intra-op thread counts to `requested` (0: strata's default, i.e.
// STRATA_NUM_THREADS or the hardware concurrency). Returns the count in use.
int configure_threads(int requested);

// The LibTorch version this binary was built against, e.g. "2.11.0".
std::string torch_version();

// "strata <version> (LibTorch <version>)".
std::string version_string();

// A report named `bench` with the machine filled in: measures the FMA peak on `threads` threads
// (about 2 seconds), cpu_summary(), torch version, date.
BenchReport new_report(const std::string& bench, int threads);

}  // namespace strata::app
