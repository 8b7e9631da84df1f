// strata/threading.h: where the kernels' parallel regions run.
// Thread count: set_num_threads(n), else env STRATA_NUM_THREADS, else hardware concurrency.
// Two places a region can run:
//  - strata's own pool (one per process, created on first use; not OpenMP, so that the core needs
//    no OpenMP runtime): workers sleep on a condition variable between regions.
//  - a region runner installed with set_region_runner. The LibTorch layer installs one that runs
//    regions on torch's own intra-op threads (strata/torch/threads.h): in a process that also runs
//    torch ops, two pools of N threads on N cores fight whenever torch's OpenMP workers spin after
//    an op (libgomp's default policy) and strata's wake; one team of threads avoids that.
//
// Fork (e.g. torch DataLoader workers, multiprocessing's default 'fork' start on Linux): safe at
// any time, also while a region runs in another thread. The child does not inherit the workers
// (fork copies only the calling thread), so it drops the inherited pool without touching it and
// its first parallel region starts a fresh pool with the parent's thread count; the parent's pool
// is unaffected. A region that was running at the fork does not continue in the child. If the
// forking thread was itself inside a region (fork from fn), its parallel_for calls in the child
// run inline on that one thread, as nested calls do.
#pragma once
#include <cstdint>
#include <functional>

namespace strata {

int get_num_threads();
void set_num_threads(int n);  // n >= 1; throws strata::Error otherwise

// Runs fn(begin, end, thread_id) over [0, n) split into chunks of `grain`, handed out dynamically.
// Blocks until all chunks are done; an exception from fn is rethrown here (first one wins).
void parallel_for(int64_t n, int64_t grain,
                  const std::function<void(int64_t begin, int64_t end, int tid)>& fn);

// A region runner calls body(ctx, i) once for every i in [0, team), concurrently as far as it can
// (sequential calls are correct too: chunks are handed out dynamically, so the first call may do
// them all), and returns when every call has returned. body never throws. parallel_for passes
// team = min(get_num_threads(), chunks) and tids i < team, so per-thread scratch sized by
// get_num_threads() stays valid.
using RegionRunner = void (*)(int team, void (*body)(void* ctx, int i), void* ctx);
// nullptr: strata's own pool (the default). Takes effect for the next region; not while one runs.
// A forked child starts without the runner (its regions run on a fresh pool of strata's own: see
// the fork rule above), whatever the parent had installed.
void set_region_runner(RegionRunner runner);
RegionRunner region_runner();

}  // namespace strata
