// tests/cpp/torch_threads_test.cpp: strata's parallel regions on torch's threads
// (strata/torch/threads.h): the default, the switch, the error for a bad name, that the regions
// really run on the threads torch's own at::parallel_for uses (a build that compiles
// at::parallel_for without OpenMP runs it serially on one thread: this test sees that), and that a
// kernel's results do not depend on the pool, and that the gradients are the same bits on every call
// and for every thread count (core/key_splits.inc, structured_grad_items).
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
#include "strata/structured.h"
#include "strata/threading.h"
#include "strata/torch/attention.h"
#include "strata/torch/mlr.h"
#include "strata/torch/monarch.h"
#include "strata/torch/structured.h"
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
      : strata_threads(strata::get_num_threads()),
        torch_threads(at::get_num_threads()),
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

TEST(TorchThreads, DefaultIsTorchsThreads) {
  if (std::getenv("STRATA_THREAD_POOL") != nullptr) GTEST_SKIP() << "STRATA_THREAD_POOL is set";
  EXPECT_EQ(strata::torch::thread_pool(), "torch");
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

// Forward + backward of `op` on fresh copies of `inputs`: the output and every input gradient.
template <class Op>
std::vector<at::Tensor> outputs_and_grads(const std::vector<at::Tensor>& inputs, Op op) {
  std::vector<at::Tensor> leaves;
  for (const at::Tensor& t : inputs) leaves.push_back(t.detach().clone().requires_grad_(true));
  const at::Tensor y = op(leaves);
  // a fixed, uneven output gradient (all ones would hide sums in a different order less often)
  const at::Tensor g = at::sin(at::arange(y.numel(), y.options().requires_grad(false))).view(y.sizes());
  y.backward(g);
  std::vector<at::Tensor> r = {y.detach()};
  for (const at::Tensor& t : leaves) r.push_back(t.grad());
  return r;
}

// Every call and both pools: the same bits, for each thread count (and across thread counts when
// `across_threads`: Monarch, and attention with batch x heads >= 4 x threads,
// where the backward does not split a head's key tiles; core/key_splits.inc). Before the backward
// bodies summed in a fixed order, dQ (dense, MLR) and the structured factor gradients came from
// whichever key tile / row tile a thread finished first, and differed in the last bits from call to
// call (up to 3e-4 absolute in a BTT factor gradient), so no training run could be repeated bit
// for bit. Most shapes have few heads and many key tiles, so a head's key tiles are split.
template <class Op>
void expect_same_bits_everywhere(const char* what, const std::vector<at::Tensor>& inputs, bool across_threads, Op op) {
  std::vector<at::Tensor> first_of_all;
  for (int threads : {1, 2, 3, 5}) {
    std::vector<at::Tensor> first;
    for (const char* pool : {"own", "torch"})
      for (int call = 0; call < 2; ++call) {
        Scope scope(threads, pool);
        const std::vector<at::Tensor> r = outputs_and_grads(inputs, op);
        if (first.empty()) first = r;
        if (first_of_all.empty()) first_of_all = r;
        const std::vector<at::Tensor>& want = across_threads ? first_of_all : first;
        ASSERT_EQ(r.size(), want.size());
        for (size_t i = 0; i < r.size(); ++i)
          EXPECT_TRUE(at::equal(r[i], want[i]))
              << what << ": tensor " << i << " (0 = output, then the input gradients), " << pool << " pool, " << threads
              << " threads, call " << call << ": max difference " << (r[i] - want[i]).abs().max().item<double>();
      }
  }
}

TEST(TorchThreads, GradientsAreTheSameBitsOnEveryCall) {
  at::manual_seed(0);
  const int64_t B = 1, N = 1025, D = 64;  // 17 key tiles per head
  const at::Tensor q2 = at::randn({B, N, 2, D}), k2 = at::randn({B, N, 2, D}), v2 = at::randn({B, N, 2, D});
  const at::Tensor q4 = at::randn({B, N, 4, D}), q1 = at::randn({B, N, 1, D});
  for (bool causal : {true, false}) {
    strata::torch::AttentionArgs a;
    a.causal = causal;
    const auto attend = [&a](const std::vector<at::Tensor>& t) {
      return strata::torch::attention(t[0], t[1], t[2], a);
    };
    expect_same_bits_everywhere(causal ? "attention, causal" : "attention", {q2, k2, v2}, false, attend);
    expect_same_bits_everywhere("attention, GQA 4 query heads on 2 kv heads", {q4, k2, v2}, false, attend);
    expect_same_bits_everywhere("attention, one query shared by 2 kv heads", {q1, k2, v2}, false, attend);
    // 2 x 12 heads >= 4 x 5 threads: no split, the same bits for every thread count
    const at::Tensor q = at::randn({2, 200, 12, 32}), k = at::randn({2, 200, 12, 32}), v = at::randn({2, 200, 12, 32});
    expect_same_bits_everywhere("attention, 24 heads", {q, k, v}, true, attend);
  }
  {
    strata::torch::AttentionArgs a;
    a.window_left = 200;
    a.window_right = 100;
    expect_same_bits_everywhere("attention, window", {q2, k2, v2}, false, [&a](const std::vector<at::Tensor>& t) {
      return strata::torch::attention(t[0], t[1], t[2], a);
    });
  }
  for (bool causal : {true, false}) {
    strata::torch::MlrArgs m;
    m.ranks = {32, 16, 8, 8};
    m.causal = causal;
    const auto mlr = [&m](const std::vector<at::Tensor>& t) {
      return strata::torch::mlr_attention(t[0], t[1], t[2], m);
    };
    expect_same_bits_everywhere(causal ? "mlr, causal" : "mlr", {q2, k2, v2}, false, mlr);
    expect_same_bits_everywhere("mlr, GQA", {q4, k2, v2}, false, mlr);
  }
  {
    strata::torch::MonarchArgs m;
    m.num_steps = 2;
    expect_same_bits_everywhere("monarch", {q2, k2, v2}, true, [&m](const std::vector<at::Tensor>& t) {
      return strata::torch::monarch_attention(t[0], t[1], t[2], m);
    });
  }
  // 4096 rows: 64 row tiles of 64
  for (const strata::StructuredSpec& spec :
       {strata::btt_spec(strata::btt_factorize(256, 256)), strata::low_rank_spec(192, 160, 24),
        strata::mlr_spec(256, {16, 8, 8}), strata::monarch_spec(256, 16), strata::block_diagonal_spec(256, 256, 4),
        strata::kronecker_spec(16, 12, 16, 16)}) {
    std::vector<at::Tensor> inputs = {at::randn({4096, spec.in})};
    for (const auto& shape : strata::structured_factor_shapes(spec)) inputs.push_back(at::randn(shape) * 0.1);
    expect_same_bits_everywhere(spec.name.c_str(), inputs, false, [&spec](const std::vector<at::Tensor>& t) {
      return strata::torch::structured_linear(spec, t[0], std::vector<at::Tensor>(t.begin() + 1, t.end()));
    });
  }
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
