// apps/strata/bench_harness.cpp: warm-up, ABBA-timed rounds, the check of what was timed, and the
// paired-ratio statistics (see the header).
#include "bench_harness.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "strata/error.h"

namespace strata::app {

double median(std::vector<double> xs) {
  STRATA_CHECK(!xs.empty(), "median: argument 'xs': expected a non-empty list, got an empty one");
  std::sort(xs.begin(), xs.end());
  const size_t n = xs.size();
  return n % 2 ? xs[n / 2] : 0.5 * (xs[n / 2 - 1] + xs[n / 2]);
}

double quantile(std::vector<double> xs, double p) {
  STRATA_CHECK(!xs.empty(), "quantile: argument 'xs': expected a non-empty list, got an empty one");
  STRATA_CHECK(p >= 0 && p <= 1, "quantile: argument 'p': expected a value in [0, 1], got ", p);
  std::sort(xs.begin(), xs.end());
  const double pos = p * double(xs.size() - 1);
  const size_t lo = size_t(std::floor(pos)), hi = std::min(lo + 1, xs.size() - 1);
  return xs[lo] + (pos - double(lo)) * (xs[hi] - xs[lo]);
}

TimeStats time_stats(std::vector<double> secs) {
  STRATA_CHECK(!secs.empty(), "time_stats: argument 'secs': expected a non-empty list, got an empty one");
  TimeStats t;
  t.reps = int(secs.size());
  t.min_s = *std::min_element(secs.begin(), secs.end());
  t.max_s = *std::max_element(secs.begin(), secs.end());
  t.median_s = median(std::move(secs));
  return t;
}

double time_once(const std::function<void()>& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

TimingPlan bench_timing_plan(int reps_option, bool quick, bool smoke, double budget_s) {
  const int floor = smoke ? 3 : quick ? 5 : 7;
  TimingPlan p;
  p.reps = reps_option > 0 ? reps_option : floor;
  p.min_reps = std::min(p.reps, floor);
  p.budget_s = budget_s;
  return p;
}

int timed_rounds(const TimingPlan& plan, double round_s) {
  STRATA_CHECK(plan.reps >= 1, "timed_rounds: argument 'plan.reps': expected >= 1, got ", plan.reps);
  if (round_s * plan.reps <= plan.budget_s) return plan.reps;
  const int floor = std::min(plan.reps, std::max(1, plan.min_reps));
  return std::max(floor, int(plan.budget_s / std::max(round_s, 1e-9)));
}

std::string test_corrupt_output() {
  const char* v = std::getenv("STRATA_BENCH_TEST_CORRUPT");
  return v ? std::string(v) : std::string();
}

namespace {

// One call of m: its reset (untimed), then the timed run.
double timed_call(const BenchMethod& m) {
  if (m.reset) m.reset();
  return time_once(m.run);
}

}  // namespace

GroupTimes run_timed_group(const std::vector<BenchMethod>& methods, const TimingPlan& plan,
                           const std::function<void()>& check, const CorruptFn& corrupt) {
  STRATA_CHECK(!methods.empty(), "run_timed_group: argument 'methods': expected at least one method, got none");
  STRATA_CHECK(plan.warmups >= 1, "run_timed_group: argument 'plan.warmups': expected >= 1, got ", plan.warmups);
  const size_t n = methods.size();
  std::vector<double> warm(n);
  for (int w = 0; w < plan.warmups; ++w)
    for (size_t i = 0; i < n; ++i) warm[i] = timed_call(methods[i]);

  std::vector<size_t> timed;  // methods repeated in every round
  double round_s = 0;
  for (size_t i = 0; i < n; ++i) {
    if (methods[i].once_if_slow && warm[i] > kSlowPeerS) continue;
    timed.push_back(i);
    round_s += warm[i];
  }
  GroupTimes g;
  g.rounds = timed_rounds(plan, round_s);
  g.secs.resize(n);
  for (size_t i = 0; i < n; ++i)
    if (std::find(timed.begin(), timed.end(), i) == timed.end()) g.secs[i] = {warm[i]};
  for (int r = 0; r < g.rounds; ++r)
    for (size_t k = 0; k < timed.size(); ++k) {
      const size_t i = timed[r % 2 == 0 ? k : timed.size() - 1 - k];  // ABBA: odd rounds reversed
      g.secs[i].push_back(timed_call(methods[i]));
    }

  const std::string hook = test_corrupt_output();
  if (!hook.empty() && corrupt && corrupt(hook)) {
    std::fprintf(stderr, "STRATA_BENCH_TEST_CORRUPT=%s (test hook): ours' %s perturbed before the check\n",
                 hook.c_str(), hook.c_str());
  }
  check();
  return g;
}

RatioStats paired_ratio_stats(const std::vector<double>& ours_s, const std::vector<double>& peer_s) {
  STRATA_CHECK(!ours_s.empty() && (ours_s.size() == peer_s.size() || peer_s.size() == 1),
               "paired_ratio_stats: expected non-empty timings of ours and the peer's one or as many, got ",
               ours_s.size(), " and ", peer_s.size());
  std::vector<double> ratios;
  for (size_t r = 0; r < ours_s.size(); ++r) ratios.push_back(peer_s[peer_s.size() == 1 ? 0 : r] / ours_s[r]);
  RatioStats s;
  s.n = int(ratios.size());
  s.min = *std::min_element(ratios.begin(), ratios.end());
  s.max = *std::max_element(ratios.begin(), ratios.end());
  s.median = median(ratios);
  s.q1 = quantile(ratios, 0.25);
  s.q3 = quantile(ratios, 0.75);
  return s;
}

}  // namespace strata::app
