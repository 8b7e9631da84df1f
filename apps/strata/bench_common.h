// apps/strata/bench_common.h: what the benches (`bench attention`, `bench mlr`, `bench monarch`)
// share beyond the timing harness (bench_harness.h): rows from a group's timings, a table that
// names each row's peer, issue targets as PASS / FAIL lines, and the end of a run (peak
// re-measured, JSON / CSV written).
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "report.h"

namespace strata::app {

// Fills row.ours / row.peer_time and row.speedup (paired_ratio_stats of peer / ours per round)
// from a group's per-round seconds (a peer timed once: one entry).
void set_row_times(BenchRow& row, const std::vector<double>& ours_s, const std::vector<double>& peer_s);

// Table with a peer column; `note` is free text at the end of the line (e.g. a FLOP ratio).
void print_peer_table_header();
void print_peer_table_row(const BenchRow& row, double peak_gflops, const std::string& note);

// Prints the targets as "PASS" / "FAIL" / "n/a " lines (never changes the exit status).
void print_targets(const std::vector<BenchTarget>& targets);

// Re-measures the FMA peak (keeps the higher, as bench attention), writes JSON and CSV when the
// paths are non-empty.
void finish_report(BenchReport& rep, int threads, const std::string& json, const std::string& csv);

// The last lines of a bench run: "n of m rows correct; s in all", the files written, and on stderr
// how many rows failed. Returns the command's exit status: 1 when a row failed its correctness
// check, else 0. `command` names the bench in the message, e.g. "strata bench mlr".
int print_run_summary(const BenchReport& rep, const char* command, const std::string& json, const std::string& csv,
                      double seconds);

}  // namespace strata::app
