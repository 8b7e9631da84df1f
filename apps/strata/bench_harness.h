// apps/strata/bench_harness.h: the one timing path of every `strata bench ...` (and the demo's
// speed table). Torch-free: a method is a callable that writes its outputs into buffers the caller
// owns, so this file can move into a library unchanged.
//
// One timed group (run_timed_group):
//   1. warm-up: every method `warmups` times, untimed, in list order;
//   2. `rounds` timed rounds in ABBA order: even rounds call the methods in list order, odd rounds
//      in reverse (ours, peer, peer, ours, ...), so neither side always runs first: a method
//      that profits or suffers from what ran just before it (caches, OpenMP threads still
//      spinning, frequency) does so equally often in both positions;
//   3. the check, on the buffers the LAST timed call of each method wrote: what is timed is what
//      is checked (a kernel right on its first call and wrong later, e.g. a race or state carried
//      across calls, fails its row).
// A peer marked once_if_slow whose warm-up exceeded kSlowPeerS sits out the rounds: that warm-up
// call is its one timing (and its outputs are the ones checked).
//
// Speedups are paired: ratio_r = peer_r / ours_r per round r (both measured in the same round,
// so slow drift of a shared machine cancels); a row reports their median with min, max and
// quartiles (paired_ratio_stats).
//
// Test hook (not a user option): when the environment variable STRATA_BENCH_TEST_CORRUPT names
// an output ("o", "dq", "dk", "dv"), run_timed_group calls the group's `corrupt` with that name
// after timing and before the check; the bench perturbs that output of ours in place, and the
// check must then fail the rows (tests/cli/check_bench_json.py relies on it).
#pragma once
#include <functional>
#include <string>
#include <vector>

namespace strata::app {

struct TimeStats {
  double median_s = 0, min_s = 0, max_s = 0;
  int reps = 0;
};

// Median / min / max of `secs` (non-empty).
TimeStats time_stats(std::vector<double> secs);

// Median of `xs` (non-empty).
double median(std::vector<double> xs);

// The p-quantile (0 <= p <= 1) of `xs` (non-empty), linear between order statistics (the
// default of numpy.quantile): quantile(xs, 0.5) == median(xs).
double quantile(std::vector<double> xs, double p);

// Wall-clock seconds of one call of fn.
double time_once(const std::function<void()>& fn);

// A method of a timed group.
struct BenchMethod {
  std::string name;
  std::function<void()> run;    // one call; writes its outputs where the group's check reads them
  std::function<void()> reset = nullptr;  // optional, untimed, before every call (e.g. restore a cache it appends to)
  bool once_if_slow = false;    // a peer whose warm-up takes over kSlowPeerS is timed once (that warm-up)
};

// A peer marked once_if_slow whose warm-up takes longer than this is not repeated (for peers tens
// of times slower than ours: torch.mlr_blockwise's backward takes about a minute at T = 4096).
constexpr double kSlowPeerS = 5.0;

// How many timed rounds a group gets.
struct TimingPlan {
  int reps = 7;           // timed rounds
  int min_reps = 7;       // the budget cut never goes under min(reps, min_reps)
  double budget_s = 20;   // groups whose warm-up round x reps exceeds this get fewer rounds
  int warmups = 1;        // untimed calls of each method before the rounds
};

// The default plan of a bench: `reps_option` rounds when given (> 0), else the floor of the mode:
// 7 rounds in a full sweep, 5 with --quick, 3 with --smoke; the budget never cuts under the floor.
TimingPlan bench_timing_plan(int reps_option, bool quick, bool smoke, double budget_s);

// Rounds after the budget cut: plan.reps, or fewer when round_s * plan.reps > plan.budget_s, never
// under min(plan.reps, plan.min_reps).
int timed_rounds(const TimingPlan& plan, double round_s);

struct GroupTimes {
  std::vector<std::vector<double>> secs;  // secs[i][round] of methods[i]; one entry for a peer timed once
  int rounds = 0;                         // timed rounds after the budget cut
};

// Perturbs ours' output named `output` in place (the test hook); returns false when the group
// has no such output.
using CorruptFn = std::function<bool(const std::string& output)>;

// Runs one group as the file comment says: warm-up, ABBA rounds, [test hook: corrupt(name)],
// check(). `corrupt` may be empty (then the hook does nothing for this group).
GroupTimes run_timed_group(const std::vector<BenchMethod>& methods, const TimingPlan& plan,
                           const std::function<void()>& check, const CorruptFn& corrupt);

// The output the test hook asks to corrupt (STRATA_BENCH_TEST_CORRUPT), "" when unset.
std::string test_corrupt_output();

// The spread of the paired ratios peer / ours of one row.
struct RatioStats {
  double median = 0, min = 0, max = 0, q1 = 0, q3 = 0;
  int n = 0;
};

// Ratios peer_s[r] / ours_s[r] per round (a peer timed once, peer_s.size() == 1: peer_s[0] /
// ours_s[r]) and their median, min, max and quartiles. Throws unless ours_s is non-empty and
// peer_s has one entry or as many as ours_s.
RatioStats paired_ratio_stats(const std::vector<double>& ours_s, const std::vector<double>& peer_s);

}  // namespace strata::app
