// apps/strata/session.h: what every command sets up the same way: thread counts (strata's pool
// and torch's, kept equal so a peer comparison is fair) and the report preamble.
#pragma once
#include <string>

#include "report.h"

namespace strata::app {

// Sets strata's and torch's intra-op thread counts to `requested` (0: strata's default, i.e.
// STRATA_NUM_THREADS or the hardware concurrency). Returns the count in use.
int configure_threads(int requested);

// For the commands that run a model step after step (train, eval, generate, experiment, embed,
// convert, bench train): keeps freed memory in the process (glibc's mmap threshold at its 32 MB
// maximum, trim threshold 1 GB), so each step reuses the last step's pages instead of faulting in
// fresh zeroed ones. Skipped when the user tunes malloc (GLIBC_TUNABLES with glibc.malloc.*, or
// MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_). Returns whether it applied.
bool keep_freed_memory();

// The LibTorch version this binary was built against, e.g. "2.11.0".
std::string torch_version();

// "strata <version> (LibTorch <version>)".
std::string version_string();

// A report named `bench` with the machine filled in: measures the FMA peak on `threads` threads
// (about 2 seconds), cpu_summary(), torch version, date.
BenchReport new_report(const std::string& bench, int threads);

}  // namespace strata::app
