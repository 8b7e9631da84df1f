// src/core/threading.cpp: a small persistent thread pool with dynamic chunking, or an installed
// region runner (strata/threading.h) that the same chunking runs on.
// The pool's workers sleep on a condition variable between regions (no spinning), so a torch peer
// running in the same process, interleaved with us, gets the cores back.
// Fork: see threading.h for the rule; the pthread_atfork child handler below implements it.
#include "strata/threading.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

#include "strata/error.h"

namespace strata {
namespace {

thread_local bool t_in_region = false;  // nested parallel_for runs inline

// fn over all of [0, n) on the calling thread, as one region (nested calls inside it run inline).
void run_inline(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn) {
  t_in_region = true;
  try { fn(0, n, 0); } catch (...) { t_in_region = false; throw; }
  t_in_region = false;
}

// Runs fn's chunks of [0, n) as `next` hands them out, until none is left; the first exception
// is kept in `error` (under mu) and stops the handing out. The pool's workers and an installed
// runner's calls share it.
void drain_chunks(const std::function<void(int64_t, int64_t, int)>& fn, int64_t n, int64_t grain,
                  std::atomic<int64_t>& next, std::mutex& mu, std::exception_ptr& error, int tid) {
  for (;;) {
    const int64_t b = next.fetch_add(1) * grain;
    if (b >= n) break;
    try {
      fn(b, std::min(n, b + grain), tid);
    } catch (...) {
      std::lock_guard<std::mutex> g(mu);
      if (!error) error = std::current_exception();
      next.store(n);  // stop handing out chunks
    }
  }
}

class Pool {
 public:
  explicit Pool(int n) { resize(n); }
  ~Pool() { stop(); }

  int size() const { return nthreads_; }

  Pool* next_abandoned = nullptr;  // the chain of pools a forked child inherited (see below)

  void resize(int n) {
    std::lock_guard<std::mutex> no_region(run_mu_);  // never resize under a running region
    stop();
    nthreads_ = n;
    quit_ = false;
    // New workers start at the current generation: a region that ended before the resize is not
    // theirs to run (its fn_ is gone, and a stray pass would decrement active_ it never counted).
    const uint64_t now = generation_;
    for (int i = 1; i < n; ++i) workers_.emplace_back([this, i, now] { loop(i, now); });
  }

  void run(int64_t n, int64_t grain,
           const std::function<void(int64_t, int64_t, int)>& fn) {
    const int64_t chunks = (n + grain - 1) / grain;
    if (nthreads_ == 1 || chunks <= 1) return run_inline(n, fn);
    std::unique_lock<std::mutex> run_lock(run_mu_);  // one region at a time
    {
      std::lock_guard<std::mutex> g(mu_);
      fn_ = &fn;
      n_ = n;
      grain_ = grain;
      next_.store(0);
      error_ = nullptr;
      active_ = nthreads_ - 1;
      ++generation_;
    }
    cv_.notify_all();
    work(0);
    std::unique_lock<std::mutex> g(mu_);
    done_cv_.wait(g, [this] { return active_ == 0; });
    fn_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void work(int tid) {
    t_in_region = true;
    drain_chunks(*fn_, n_, grain_, next_, mu_, error_, tid);
    t_in_region = false;
  }

  void loop(int tid, uint64_t seen) {
    for (;;) {
      {
        std::unique_lock<std::mutex> g(mu_);
        cv_.wait(g, [&] { return quit_ || generation_ != seen; });
        if (quit_) return;
        seen = generation_;
      }
      work(tid);
      std::lock_guard<std::mutex> g(mu_);
      if (--active_ == 0) done_cv_.notify_one();
    }
  }

  void stop() {
    {
      std::lock_guard<std::mutex> g(mu_);
      quit_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
    workers_.clear();
  }

  int nthreads_ = 1;
  std::vector<std::thread> workers_;
  std::mutex mu_, run_mu_;
  std::condition_variable cv_, done_cv_;
  bool quit_ = false;
  uint64_t generation_ = 0;
  int active_ = 0;
  const std::function<void(int64_t, int64_t, int)>* fn_ = nullptr;
  int64_t n_ = 0, grain_ = 1;
  std::atomic<int64_t> next_{0};
  std::exception_ptr error_;
};

int default_threads() {
  if (const char* e = std::getenv("STRATA_NUM_THREADS")) {
    char* end = nullptr;
    long v = std::strtol(e, &end, 10);
    if (end != e && *end == '\0' && v >= 1) return int(v);
    throw_arg("strata", "STRATA_NUM_THREADS", "an integer >= 1", e);
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

std::mutex g_pool_mu;                // guards g_threads and creating / resizing the pool
int g_threads = 0;                   // the pool's thread count; 0 = not yet read (default_threads)
std::atomic<Pool*> g_pool{nullptr};  // created by the first parallel region; reset in a fork child
Pool* g_abandoned = nullptr;         // pools inherited over fork: kept reachable, never touched
std::atomic<RegionRunner> g_runner{nullptr};  // set_region_runner's; nullptr = the pool

int threads_locked() {  // under g_pool_mu
  if (g_threads == 0) g_threads = default_threads();
  return g_threads;
}

// Joins the workers at exit (static destruction) in the process that created the pool. At
// namespace scope, not a function-local static: a fork while another thread held that static's
// initialisation guard would leave the child waiting on it forever.
struct PoolReaper {
  ~PoolReaper() { delete g_pool.exchange(nullptr); }
} g_reaper;

Pool& pool() {
  if (Pool* p = g_pool.load(std::memory_order_acquire)) return *p;
  std::lock_guard<std::mutex> g(g_pool_mu);
  if (Pool* p = g_pool.load(std::memory_order_relaxed)) return *p;
  Pool* p = new Pool(threads_locked());
  g_pool.store(p, std::memory_order_release);
  return *p;
}

// pthread_atfork child handler (runs in the child, which has only the forking thread). The
// inherited pool's workers do not exist here and its mutexes may be held by threads that do not
// exist either (a region running in the parent at the fork): joining or locking them would hang.
// So the child abandons it (never destroyed: its destructor would join the phantom workers) and
// its first parallel region builds a fresh pool with the same thread count. g_pool_mu may have
// been held by another parent thread (set_num_threads) at the fork: it is re-created unlocked.
// No prepare handler: fork() never waits for a running region.
// An installed runner is dropped in the child too: the LibTorch layer's runs on libgomp, whose
// thread team does not survive fork (torch's own ops hang in such a child), so a forked child's
// regions run on a fresh pool of strata's own.
void after_fork_in_child() {
  g_runner.store(nullptr, std::memory_order_relaxed);
  if (Pool* p = g_pool.exchange(nullptr)) {
    p->next_abandoned = g_abandoned;
    g_abandoned = p;
  }
  new (&g_pool_mu) std::mutex();
}

[[maybe_unused]] const int g_atfork_registered =
    pthread_atfork(nullptr, nullptr, after_fork_in_child);

// One region on an installed runner: the chunks of [0, n), handed out by an atomic counter.
struct RunnerRegion {
  const std::function<void(int64_t, int64_t, int)>* fn;
  int64_t n, grain;
  std::atomic<int64_t> next{0};
  std::mutex mu;
  std::exception_ptr error;
};

void runner_body(void* ctx, int tid) {
  RunnerRegion& r = *static_cast<RunnerRegion*>(ctx);
  const bool outer = t_in_region;  // a runner may run a call on a thread already in a region
  t_in_region = true;
  drain_chunks(*r.fn, r.n, r.grain, r.next, r.mu, r.error, tid);
  t_in_region = outer;
}

}  // namespace

void set_region_runner(RegionRunner runner) { g_runner.store(runner, std::memory_order_release); }

RegionRunner region_runner() { return g_runner.load(std::memory_order_acquire); }

int get_num_threads() {
  std::lock_guard<std::mutex> g(g_pool_mu);
  return threads_locked();
}

void set_num_threads(int n) {
  STRATA_CHECK_ARG(n >= 1, "set_num_threads", "n", "an integer >= 1", n);
  std::lock_guard<std::mutex> g(g_pool_mu);
  g_threads = n;
  Pool* p = g_pool.load(std::memory_order_relaxed);
  if (p && p->size() != n) p->resize(n);
}

void parallel_for(int64_t n, int64_t grain,
                  const std::function<void(int64_t, int64_t, int)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  if (t_in_region) {  // nested: run inline on this thread
    fn(0, n, 0);  // a kernel's scratch is per call, so thread slot 0 is safe here
    return;
  }
  RegionRunner runner = region_runner();
  if (runner == nullptr) return pool().run(n, grain, fn);
  const int64_t chunks = (n + grain - 1) / grain;
  const int team = int(std::min<int64_t>(get_num_threads(), chunks));
  if (team <= 1) return run_inline(n, fn);  // (never creates the pool's threads)
  RunnerRegion r;
  r.fn = &fn;
  r.n = n;
  r.grain = grain;
  runner(team, &runner_body, &r);
  if (r.error) std::rethrow_exception(r.error);
}

}  // namespace strata
