// tests/cpp/bench_harness_test.cpp: the bench harness (apps/strata/bench_harness.h), torch-free:
// ABBA order, the check on what the last timed call wrote, the test hook, the round counts and
// the paired-ratio statistics; the process memory settings of the timing benches.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "apps/strata/bench_harness.h"
#include "apps/strata/process_memory.h"
#include "strata/error.h"

namespace strata::app {
namespace {

// Sets STRATA_BENCH_TEST_CORRUPT for the scope (unset: value nullptr), restoring "unset" after.
struct CorruptEnv {
  explicit CorruptEnv(const char* value) {
    if (value) ::setenv("STRATA_BENCH_TEST_CORRUPT", value, 1);
    else ::unsetenv("STRATA_BENCH_TEST_CORRUPT");
  }
  ~CorruptEnv() { ::unsetenv("STRATA_BENCH_TEST_CORRUPT"); }
};

TimingPlan plan_of(int reps, int warmups = 1) {
  TimingPlan p;
  p.reps = reps;
  p.min_reps = reps;
  p.budget_s = 1e9;
  p.warmups = warmups;
  return p;
}

TEST(BenchHarness, WarmsUpThenTimesInAbbaOrderWithResetsBeforeEveryCall) {
  CorruptEnv env(nullptr);
  std::string log;
  const std::vector<BenchMethod> ms = {{"A", [&] { log += 'A'; }, [&] { log += 'r'; }},
                                       {"B", [&] { log += 'B'; }},
                                       {"C", [&] { log += 'C'; }}};
  const GroupTimes g = run_timed_group(ms, plan_of(4, 2), [&] { log += '|'; }, nullptr);
  // 2 warm-ups in list order, then rounds ABC, CBA, ABC, CBA; the check last.
  EXPECT_EQ(log, "rABC" "rABC" "rABC" "CBrA" "rABC" "CBrA" "|");
  ASSERT_EQ(g.secs.size(), 3u);
  for (const auto& s : g.secs) EXPECT_EQ(s.size(), 4u);
  EXPECT_EQ(g.rounds, 4);
}

TEST(BenchHarness, ChecksWhatTheLastTimedCallWrote) {
  CorruptEnv env(nullptr);
  int calls = 0, out = -1, seen = -2;
  const std::vector<BenchMethod> ms = {{"ours", [&] { out = ++calls; }}, {"peer", [] {}}};
  run_timed_group(ms, plan_of(5), [&] { seen = out; }, nullptr);
  EXPECT_EQ(calls, 6);  // 1 warm-up + 5 rounds
  EXPECT_EQ(seen, 6);   // the check read the last timed call's output, not the warm-up's
}

TEST(BenchHarness, TestHookCorruptsTheNamedOutputAfterTimingBeforeTheCheck) {
  std::string log;
  const std::vector<BenchMethod> ms = {{"ours", [&] { log += 'o'; }}};
  const CorruptFn corrupt = [&](const std::string& name) {
    log += "<" + name + ">";
    return name == "dk";
  };
  {
    CorruptEnv env("dk");
    run_timed_group(ms, plan_of(2), [&] { log += '|'; }, corrupt);
    EXPECT_EQ(log, "ooo<dk>|");
  }
  log.clear();
  {
    CorruptEnv env(nullptr);
    run_timed_group(ms, plan_of(2), [&] { log += '|'; }, corrupt);
    EXPECT_EQ(log, "ooo|");  // hook unset: never called
  }
}

TEST(BenchHarness, RoundsAreCutToTheBudgetButNeverUnderTheFloor) {
  TimingPlan p;
  p.reps = 9;
  p.min_reps = 7;
  p.budget_s = 20;
  EXPECT_EQ(timed_rounds(p, 1.0), 9);   // 9 s: within budget
  EXPECT_EQ(timed_rounds(p, 10.0), 7);  // budget would allow 2: the floor wins
  p.reps = 30;
  EXPECT_EQ(timed_rounds(p, 1.0), 20);  // cut to the budget, above the floor
  p.reps = 2;
  EXPECT_EQ(timed_rounds(p, 100.0), 2);  // never more than asked
}

TEST(BenchHarness, DefaultPlansMeetTheIssueCounts) {
  EXPECT_EQ(bench_timing_plan(0, false, false, 8).reps, 7);
  EXPECT_EQ(bench_timing_plan(0, false, false, 8).min_reps, 7);
  EXPECT_EQ(bench_timing_plan(0, true, false, 8).reps, 5);
  EXPECT_EQ(bench_timing_plan(0, true, false, 8).min_reps, 5);
  EXPECT_EQ(bench_timing_plan(0, false, true, 8).reps, 3);
  const TimingPlan p = bench_timing_plan(12, false, false, 8);  // --reps 12: cut, never under 7
  EXPECT_EQ(p.reps, 12);
  EXPECT_EQ(p.min_reps, 7);
  EXPECT_EQ(timed_rounds(p, 100.0), 7);
  EXPECT_EQ(bench_timing_plan(2, false, false, 8).min_reps, 2);  // an explicit --reps 2 is honoured
}

TEST(BenchHarness, PairedRatioStats) {
  // ratios peer / ours per round: 2, 1, 0.5, 4
  const RatioStats s = paired_ratio_stats({1, 2, 4, 0.5}, {2, 2, 2, 2});
  EXPECT_EQ(s.n, 4);
  EXPECT_DOUBLE_EQ(s.min, 0.5);
  EXPECT_DOUBLE_EQ(s.max, 4);
  EXPECT_DOUBLE_EQ(s.median, 1.5);
  EXPECT_DOUBLE_EQ(s.q1, 0.875);  // numpy.quantile([0.5, 1, 2, 4], 0.25)
  EXPECT_DOUBLE_EQ(s.q3, 2.5);
  // A peer timed once: its one time against each of ours.
  const RatioStats once = paired_ratio_stats({1, 2, 4}, {8});
  EXPECT_DOUBLE_EQ(once.median, 4);
  EXPECT_DOUBLE_EQ(once.min, 2);
  EXPECT_DOUBLE_EQ(once.max, 8);
  EXPECT_THROW(paired_ratio_stats({1, 2}, {1, 2, 3}), strata::Error);
  EXPECT_THROW(paired_ratio_stats({}, {1}), strata::Error);
}

TEST(BenchHarness, QuantileIsLinearBetweenOrderStatistics) {
  EXPECT_DOUBLE_EQ(quantile({3, 1, 2}, 0.5), 2);
  EXPECT_DOUBLE_EQ(quantile({1, 2, 3, 4}, 0.5), median({1, 2, 3, 4}));
  EXPECT_DOUBLE_EQ(quantile({1, 2, 3, 4}, 0), 1);
  EXPECT_DOUBLE_EQ(quantile({1, 2, 3, 4}, 1), 4);
  EXPECT_DOUBLE_EQ(quantile({7}, 0.25), 7);
  EXPECT_THROW(quantile({1, 2}, 1.5), strata::Error);
}

// After warm_heap a block under the mmap threshold comes from pages already mapped: writing all of
// a 12 MB block faults (almost) nothing in, where a cold heap faults its 3072 pages. Guards the
// warming itself: with memset(p, 0, ...) the compiler folded malloc + memset into a calloc that
// touched nothing, and every bench round faulted again. Each gtest case runs in its own process
// (gtest_discover_tests), so this one starts from a cold heap.
TEST(ProcessMemory, WarmHeapServesALaterBlockWithoutFaults) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "ASan's allocator ignores glibc's malloc settings";
#endif
  if (!keep_freed_memory()) GTEST_SKIP() << "malloc settings come from the environment";
  warm_heap(int64_t(64) << 20);
  const auto minor_faults = [] {
    rusage r{};
    getrusage(RUSAGE_SELF, &r);
    return r.ru_minflt;
  };
  const size_t n = size_t(12) << 20;
  const long before = minor_faults();
  char* p = static_cast<char*>(std::malloc(n));
  ASSERT_NE(p, nullptr);
  std::memset(p, 7, n);
  const long faults = minor_faults() - before;
  EXPECT_EQ(p[n - 1], 7);
  std::free(p);
  EXPECT_LT(faults, 64) << "a 12 MB block written after warm_heap faulted " << faults << " pages in";
}

}  // namespace
}  // namespace strata::app
