// apps/strata/process_memory.h: how the CLI's process holds freed memory (glibc malloc settings),
// for the model commands and the timing benches. Torch-free (part of strata_bench_harness).
#pragma once
#include <cstdint>

namespace strata::app {

// For the commands that run a model step after step (train, eval, generate, experiment, embed,
// convert) and every timing bench (not bench memory): keeps freed memory in the process (glibc's
// mmap threshold at its 32 MB maximum, trim threshold 1 GB), so each step (or timed call) reuses
// the last one's pages instead of faulting in fresh zeroed ones. Benches too since 2026-12-05:
// under glibc's own heuristics whether a call's fresh output was faulted in depended on what the
// call before it had freed (a 10 ms Monarch forward at N = 4096 took 13-19 ms after another one in
// a Python loop, 10 ms after the dense peer: docs/results.md, MonarchAttention), noise the 200 ms
// peers hid. Skipped when the user tunes malloc (GLIBC_TUNABLES with glibc.malloc.*, or
// MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_). Returns whether it applied.
bool keep_freed_memory();

// For the benches, after keep_freed_memory(): touches `bytes` of heap and frees it, so that the
// heap's free top holds that much resident memory and the timed calls' fresh outputs (under 32 MB)
// are carved from pages already mapped, from the first round on, whatever order the methods
// allocate and free in. Why: on a fresh heap the first rounds each faulted in some method's output
// (a 12 MB output: 4-5 ms in 4 KB pages, 2-22 ms in 2 MB pages on the Xeon VM of 2026-12-05),
// which decided a 10 ms call's median.
void warm_heap(int64_t bytes);

}  // namespace strata::app
