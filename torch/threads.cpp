// torch/threads.cpp: strata's parallel regions on torch's intra-op threads (strata/torch/threads.h),
// installed when the library loads; torch.ops.strata.thread_pool for Python.
#include "strata/torch/threads.h"

#include <ATen/Parallel.h>
#include <torch/library.h>

#include <pthread.h>

#include <atomic>
#include <cstdlib>
#include <optional>

#include "binding_util.h"
#include "strata/error.h"
#include "strata/threading.h"

namespace strata::torch {
namespace {

std::atomic<bool> g_ran_on_torch_threads{false};  // for the fork handler below

// The region runner: body(ctx, i) for i in [0, team) over at::parallel_for, one index per thread
// when torch has team threads (fewer: a thread runs several indices in turn, which the core's
// dynamic chunking allows); inline when called from inside a torch parallel region.
void run_on_torch_threads(int team, void (*body)(void*, int), void* ctx) {
  if (!g_ran_on_torch_threads.load(std::memory_order_relaxed)) g_ran_on_torch_threads.store(true);
  at::parallel_for(0, team, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) body(ctx, int(i));
  });
}

strata::RegionRunner runner_for(const std::string& name, const char* where, const char* arg) {
  if (name == "torch") return &run_on_torch_threads;
  if (name == "own") return nullptr;
  throw_arg(where, arg, "\"torch\" or \"own\"", "\"" + name + "\"");
}

// pthread_atfork child handler. libgomp's thread team does not survive fork: once a process has
// run a parallel region on it, the first parallel region of a forked child waits forever for
// threads that do not exist (torch's own ops included: a tensor copy in a multiprocessing worker,
// MKL's threaded exp). A process that runs strata's regions on torch's threads has such a region,
// so its children get one intra-op thread, as torch's DataLoader gives its workers:
// at::set_num_threads(1) sets OpenMP's and MKL's counts (and renews torch's pthreadpool, which
// torch's own fork handler, registered before this one, has marked for renewal). strata's own
// regions there run on a fresh pool of strata's own (the core drops the runner in a child).
// Processes that never ran a strata region on torch's threads are left as torch leaves them.
void one_thread_in_child() {
  if (g_ran_on_torch_threads.load(std::memory_order_relaxed)) at::set_num_threads(1);
}

[[maybe_unused]] const int g_atfork_registered = pthread_atfork(nullptr, nullptr, one_thread_in_child);

// A bad STRATA_THREAD_POOL cannot throw while the library loads (that would abort the process):
// this runner, installed instead, makes every kernel call fail with the error, as a bad
// STRATA_NUM_THREADS does, until set_thread_pool picks a valid one.
void run_with_bad_env(int, void (*)(void*, int), void*) {
  const char* env = std::getenv("STRATA_THREAD_POOL");
  runner_for(env ? env : "", "strata", "STRATA_THREAD_POOL");  // throws for the bad value
  throw Error("strata: STRATA_THREAD_POOL changed after the library loaded; call set_thread_pool");
}

// STRATA_THREAD_POOL, read once when the library loads (before any region can run); default "torch".
[[maybe_unused]] const bool g_installed = [] {
  const char* env = std::getenv("STRATA_THREAD_POOL");
  const std::string name = env ? env : "torch";  // see threads.h: the stress run that settled it
  const bool valid = name == "torch" || name == "own";
  strata::set_region_runner(valid ? runner_for(name, "strata", "STRATA_THREAD_POOL") : &run_with_bad_env);
  return true;
}();

// torch.ops.strata.thread_pool(name=None): sets it when given; returns the current one.
std::string thread_pool_op(std::optional<std::string> name) {
  return binding::rethrow_as_c10([&] {
    if (name) set_thread_pool(*name);
    return thread_pool();
  });
}

}  // namespace

void set_thread_pool(const std::string& name) {
  strata::set_region_runner(runner_for(name, "set_thread_pool", "name"));
}

std::string thread_pool() {
  const strata::RegionRunner r = strata::region_runner();
  return r == nullptr ? "own" : r == &run_on_torch_threads ? "torch" : "invalid STRATA_THREAD_POOL";
}

}  // namespace strata::torch

TORCH_LIBRARY_FRAGMENT(strata, m) { m.def("thread_pool(str? name=None) -> str", &strata::torch::thread_pool_op); }
