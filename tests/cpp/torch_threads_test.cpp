// tests/cpp/torch_threads_test.cpp: strata's parallel regions on torch's threads
// (strata/torch/threads.h): the default, the switch, the error for a bad name, that the regions
// really run on the threads torch's own at::parallel_for uses (a build that compiles
// at::parallel_for without OpenMP runs it serially on one thread: this test sees that), and that a
// kernel's results do not depend on the pool.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "strata/error.h"
#include "strata/threading.h"
#include "strata/torch/attention.h"
#include "strata/torch/threads.h"

namespace {

using ThreadIds = std::set<std::thread::id>;

// The threads that run chunks of a region of `chunks` chunks, each ~2 ms long (so that every
// thread of the team takes at least one).
ThreadIds strata_region_threads(int chunks) {
  std::mutex mu;
  ThreadIds ids;
  strata::parallel_for(chunks, 1, [&](int64_t, int64_t, int) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    std::lock_guard<std::mutex> g(mu);
    ids.insert(std::this_thread::get_id());
  });
  return ids;
}

// The threads of torch's own at::parallel_for over `n` indices (one index per thread).
ThreadIds torch_region_threads(int n) {
  std::mutex mu;
  ThreadIds ids;
  at::parallel_for(0, n, 1, [&](int64_t, int64_t) {
    std::lock_guard<std::mutex> g(mu);
    ids.insert(std::this_thread::get_id());
  });
  return ids;
}

// Sets both pools' thread counts and the pool for one test; restores them at its end.
struct Scope {
  Scope(int threads, const std::string& pool)
      : strata_threads(strata::get_num_threads()), torch_threads(at::get_num_threads()),
        saved(strata::torch::thread_pool()) {
    strata::set_num_threads(threads);
    at::set_num_threads(threads);
    strata::torch::set_thread_pool(pool);
  }
  ~Scope() {
    strata::set_num_threads(strata_threads);
    at::set_num_threads(torch_threads);
    strata::torch::set_thread_pool(saved);
  }
  int strata_threads, torch_threads;
  std::string saved;
};

TEST(TorchThreads, DefaultIsStrataOwnPool) {
  if (std::getenv("STRATA_THREAD_POOL") != nullptr) GTEST_SKIP() << "STRATA_THREAD_POOL is set";
  EXPECT_EQ(strata::torch::thread_pool(), "own");
}

TEST(TorchThreads, RegionsRunOnTorchsThreads) {
  Scope scope(2, "torch");
  const ThreadIds torch_ids = torch_region_threads(2);
  ASSERT_EQ(torch_ids.size(), 2u) << "torch's at::parallel_for ran on one thread";
  EXPECT_EQ(strata_region_threads(16), torch_ids);
}

TEST(TorchThreads, OwnPoolRunsOnItsOwnWorkers) {
  Scope scope(2, "own");
  EXPECT_EQ(strata::torch::thread_pool(), "own");
  const ThreadIds torch_ids = torch_region_threads(2), own_ids = strata_region_threads(16);
  ASSERT_EQ(own_ids.size(), 2u);
  // The calling thread takes part in both; the other one differs.
  ThreadIds shared;
  for (const auto& id : own_ids)
    if (torch_ids.count(id)) shared.insert(id);
  EXPECT_EQ(shared, ThreadIds{std::this_thread::get_id()});
}

TEST(TorchThreads, TeamIsCappedByTorchsThreadCount) {
  Scope scope(3, "torch");
  at::set_num_threads(2);  // strata 3, torch 2: the regions get torch's 2
  EXPECT_EQ(strata_region_threads(24).size(), 2u);
}

TEST(TorchThreads, KernelResultsDoNotDependOnThePool) {
  at::manual_seed(0);
  const at::Tensor q = at::randn({3, 97, 4, 24}), k = at::randn({3, 97, 2, 24}), v = at::randn({3, 97, 2, 24});
  strata::torch::AttentionArgs a;
  a.causal = true;
  at::Tensor out[2];
  int i = 0;
  for (const char* pool : {"torch", "own"}) {
    Scope scope(2, pool);
    out[i++] = strata::torch::attention(q, k, v, a);
  }
  EXPECT_TRUE(at::equal(out[0], out[1]));
}

TEST(TorchThreads, BadNameIsAnErrorNamingIt) {
  const std::string saved = strata::torch::thread_pool();
  try {
    strata::torch::set_thread_pool("openmp");
    ADD_FAILURE() << "no error";
  } catch (const strata::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("'name'"), std::string::npos) << m;
    EXPECT_NE(m.find("\"torch\" or \"own\""), std::string::npos) << m;
    EXPECT_NE(m.find("openmp"), std::string::npos) << m;
  }
  EXPECT_EQ(strata::torch::thread_pool(), saved);  // unchanged
}

}  // namespace
