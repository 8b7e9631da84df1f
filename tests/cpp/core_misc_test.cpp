// tests/cpp/core_misc_test.cpp: thread pool, dtype conversions, CPU dispatch.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "strata/cpu.h"
#include "strata/tensor.h"
#include "strata/threading.h"

namespace strata {
namespace {

TEST(Threading, ParallelForCoversEveryIndexOnce) {
  for (int threads : {1, 2, 5}) {
    set_num_threads(threads);
    std::vector<std::atomic<int>> hits(1001);
    parallel_for(1001, 7, [&](int64_t b, int64_t e, int tid) {
      EXPECT_GE(tid, 0);
      EXPECT_LT(tid, threads);
      for (int64_t i = b; i < e; ++i) hits[size_t(i)]++;
    });
    for (auto& h : hits) EXPECT_EQ(h.load(), 1);
  }
}

TEST(Threading, ExceptionIsRethrownAndPoolStaysUsable) {
  set_num_threads(2);
  EXPECT_THROW(parallel_for(100, 1, [](int64_t b, int64_t, int) {
                 if (b == 37) throw std::runtime_error("boom");
               }),
               std::runtime_error);
  std::atomic<int64_t> sum{0};
  parallel_for(100, 3, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) sum += i;
  });
  EXPECT_EQ(sum.load(), 4950);
}

// A resize after regions must not hand the new workers the region that ended: each ran a stray pass
// over it at start-up (fn_ null: UBSan's null reference in CI; a stray decrement of the count of
// workers still running could end a later region before its last chunk). Every region right
// after a resize still covers each index exactly once, and has finished it when it returns.
TEST(Threading, ResizeBetweenRegionsNeverRunsAnEndedRegion) {
  for (int round = 0; round < 200; ++round) {
    const int threads = 2 + round % 3;  // 2, 3, 4, 2, ...
    set_num_threads(threads);
    std::vector<int> hits(257, 0);  // plain ints: read after the region, which must have ended
    parallel_for(257, 1, [&](int64_t b, int64_t e, int) {
      for (int64_t i = b; i < e; ++i) hits[size_t(i)] += 1;
    });
    for (size_t i = 0; i < hits.size(); ++i) ASSERT_EQ(hits[i], 1) << "round " << round << ", index " << i;
  }
  set_num_threads(2);
}

// A runner that records each region's team and runs the calls in reverse order, one after the
// other (a runner may run them sequentially: the first call then takes every chunk).
std::vector<int> g_teams;
void reversed_runner(int team, void (*body)(void*, int), void* ctx) {
  g_teams.push_back(team);
  for (int i = team - 1; i >= 0; --i) body(ctx, i);
}
// A runner on fresh threads, one per call, all at once.
void threaded_runner(int team, void (*body)(void*, int), void* ctx) {
  std::vector<std::thread> ts;
  for (int i = 0; i < team; ++i) ts.emplace_back([=] { body(ctx, i); });
  for (auto& t : ts) t.join();
}

// Installs a runner for one test, and strata's own pool again at its end.
struct RunnerScope {
  explicit RunnerScope(RegionRunner r) : saved(region_runner()) { set_region_runner(r); }
  ~RunnerScope() { set_region_runner(saved); }
  RegionRunner saved;
};

TEST(Threading, RunnerGetsTheTeamAndCoversEveryIndexOnce) {
  const int saved = get_num_threads();
  RunnerScope scope(&reversed_runner);
  EXPECT_EQ(region_runner(), &reversed_runner);
  for (int threads : {1, 2, 5}) {
    set_num_threads(threads);
    for (int64_t n : {int64_t(1), int64_t(3), int64_t(1001)}) {
      g_teams.clear();
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      parallel_for(n, 1, [&](int64_t b, int64_t e, int tid) {
        EXPECT_GE(tid, 0);
        EXPECT_LT(tid, threads);
        for (int64_t i = b; i < e; ++i) hits[size_t(i)]++;
      });
      for (auto& h : hits) EXPECT_EQ(h.load(), 1);
      // team = min(threads, chunks); a one-thread team runs inline, without the runner.
      const int team = int(std::min<int64_t>(threads, n));
      EXPECT_EQ(g_teams, team > 1 ? std::vector<int>{team} : std::vector<int>{}) << threads << " " << n;
    }
  }
  set_num_threads(saved);
}

TEST(Threading, RunnerRegionsRethrowAndNestInline) {
  const int saved = get_num_threads();
  set_num_threads(3);
  RunnerScope scope(&threaded_runner);
  EXPECT_THROW(parallel_for(100, 1, [](int64_t b, int64_t, int) {
                 if (b == 37) throw std::runtime_error("boom");
               }),
               std::runtime_error);
  std::atomic<int64_t> sum{0}, nested_calls{0};
  parallel_for(30, 1, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) sum += i;
    // A region inside a region runs inline on this thread: one call over all of [0, 4).
    parallel_for(4, 1, [&](int64_t nb, int64_t ne, int tid) {
      EXPECT_EQ(nb, 0);
      EXPECT_EQ(ne, 4);
      EXPECT_EQ(tid, 0);
      ++nested_calls;
    });
  });
  EXPECT_EQ(sum.load(), 435);
  EXPECT_EQ(nested_calls.load(), 30);
  set_num_threads(saved);
}

TEST(Threading, RejectsZeroThreads) {
  try {
    set_num_threads(0);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'n'"), std::string::npos);
  }
}

// True when a region over [0, 10000) in chunks of 1 sums to the closed form and the pool still
// reports `threads`.
bool region_sums_correctly(int threads) {
  std::atomic<int64_t> sum{0};
  parallel_for(10000, 1, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) sum += i;
  });
  return sum.load() == 10000 * 9999 / 2 && get_num_threads() == threads;
}

// Runs body in a forked child and returns the child's wait status. The child exits through
// std::exit (static destruction joins its pool's workers: the exit is tested too), with status 0
// when body returned true; a 30 s alarm turns a hang into SIGALRM instead of a stuck suite.
int status_of_forked_child(const std::function<bool()>& body) {
  std::fflush(nullptr);  // else the child flushes the parent's buffered output a second time
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::alarm(30);
    bool ok = false;
    try {
      ok = body();
    } catch (...) {
    }
    std::exit(ok ? 0 : 3);
  }
  int status = -1;
  EXPECT_EQ(::waitpid(pid, &status, 0), pid);
  return status;
}

std::string describe_status(int status) {
  if (WIFSIGNALED(status))
    return "killed by signal " + std::to_string(WTERMSIG(status)) + (WTERMSIG(status) == SIGALRM ? " (hung)" : "");
  return "exit status " + std::to_string(WEXITSTATUS(status));
}

// Issue 9 item 6: the child of a fork inherits the pool but not its workers; it used to wait
// forever for them in its first region (and at exit, joining them).
TEST(Threading, ForkedChildRunsRegionsAndExits) {
  const int saved = get_num_threads();
  set_num_threads(4);
  ASSERT_TRUE(region_sums_correctly(4));  // the parent's pool and workers exist at the fork
  const int status = status_of_forked_child([] {
    if (!region_sums_correctly(4) || !region_sums_correctly(4)) return false;
    set_num_threads(3);  // resizing the child's fresh pool works too
    return region_sums_correctly(3);
  });
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << describe_status(status);
  EXPECT_TRUE(region_sums_correctly(4)) << "the parent's pool after the fork";
  set_num_threads(saved);
}

// A fork while another thread is inside a region: the child inherits the pool's locks held by
// threads it does not have. It must not touch them (see threading.h's fork rule).
TEST(Threading, ForkWhileARegionRunsInAnotherThread) {
  const int saved = get_num_threads();
  set_num_threads(4);
  struct Region {
    std::atomic<int> started{0};
    std::atomic<bool> release{false};
    std::atomic<int64_t> covered{0};
  } r;
  // The region's functor captures one reference, so std::function holds it inline: no heap block
  // that only the busy thread's stack points to (that thread does not exist in the child, and
  // LeakSanitizer would report the block at the child's exit).
  std::thread busy([&r] {
    parallel_for(64, 1, [&r](int64_t b, int64_t e, int) {
      ++r.started;
      while (!r.release.load()) std::this_thread::yield();
      r.covered += e - b;
    });
  });
  // Fork once all 4 pool threads are inside the region (each holds a chunk until released), so no
  // parent thread is in malloc at the fork: GCC 12's ASan runtime does not lock its allocator
  // around fork, and a child forked while a new worker was allocating in its start-up hung in
  // the allocator (seen 3 in 40 runs; glibc's malloc is fork-safe, so Release never did).
  while (r.started.load() < 4) std::this_thread::yield();
  const int status = status_of_forked_child([] { return region_sums_correctly(4); });
  r.release = true;
  busy.join();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << describe_status(status);
  EXPECT_EQ(r.covered.load(), 64) << "the parent's region completes";
  EXPECT_TRUE(region_sums_correctly(4)) << "the parent's pool after the fork";
  set_num_threads(saved);
}

TEST(DType, Bf16RoundTripAndRounding) {
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f)), 1.0f);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(-3.5f)), -3.5f);
  // 1 + 2^-8 is a tie between 1 and 1 + 2^-7: round to even (1).
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 1.0f / 256)), 1.0f);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
  EXPECT_TRUE(std::isinf(bf16_to_f32(f32_to_bf16(INFINITY))));
}

TEST(DType, F16RoundTrip) {
  for (float x : {0.f, 1.f, -2.5f, 65504.f, 6.1035156e-05f, 5.9604645e-08f, 0.333251953125f})
    EXPECT_EQ(f16_to_f32(f32_to_f16(x)), x) << x;
  EXPECT_TRUE(std::isinf(f16_to_f32(f32_to_f16(1e6f))));
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(NAN))));
}

TEST(Cpu, DispatchIsConsistent) {
  const CpuFeatures& f = cpu_features();
  if (f.avx512f) {
    EXPECT_TRUE(f.avx2);
  }
  EXPECT_NO_THROW(set_isa(Isa::scalar));
  EXPECT_EQ(active_isa(), Isa::scalar);
  if (f.avx2 && f.fma) {
    set_isa(Isa::avx2);
    EXPECT_EQ(active_isa(), Isa::avx2);
  }
  if (!f.avx512f) {
    EXPECT_THROW(set_isa(Isa::avx512), Error);
  } else {
    set_isa(Isa::avx512);
  }
  EXPECT_FALSE(cpu_summary().empty());
}

}  // namespace
}  // namespace strata
