// apps/strata/bench_common.h: what the benches (`bench attention`, `bench mlr`, `bench monarch`)
// share: rows from round-robin timings, a table that names each row's peer, issue targets as
// PASS / FAIL lines, and the end of a run (peak re-measured, JSON / CSV written).
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "report.h"

namespace strata::app {

// Timed repetitions for a group whose warm-up round (one call of each method) took `round_s`:
// `reps`, cut so that the group stays near `budget_s`, but never under min(reps, 3).
int group_reps(int reps, double round_s, double budget_s);

// Fills row.ours / row.peer_time and row.speedup (median over rounds of peer / ours) from the
// per-round seconds of a round-robin timing. A peer with one time against several of ours (a
// peer too slow to repeat, timed once) gets speedup = its time / our median.
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

// Calls fn once and returns its wall time (the warm-up whose outputs are checked).
inline double warm_up(const std::function<void()>& fn) { return time_once(fn); }

// A method marked `once_if_slow` whose warm-up takes longer than this is not repeated: its
// warm-up is its one timing (for peers tens of times slower than ours).
constexpr double kSlowPeerS = 5.0;

// Warms up fns once each, runs `check` (on the warm-up outputs), then times them round-robin,
// `reps` rounds (cut by group_reps to about budget_s); result[i][round]. A method i with
// once_if_slow[i] whose warm-up exceeded kSlowPeerS keeps that one time (result[i].size() == 1)
// and sits out the rounds.
std::vector<std::vector<double>> warm_check_time(const std::vector<std::function<void()>>& fns, int reps,
                                                 double budget_s, const std::function<void()>& check,
                                                 const std::vector<bool>& once_if_slow = {});

}  // namespace strata::app
