// strata/threading.h: the library's thread pool (one per process, created on first use).
// Thread count: set_num_threads(n), else env STRATA_NUM_THREADS, else hardware concurrency.
// Our own pool (not OpenMP) so that torch's OpenMP runtime in the same process is not disturbed:
// workers sleep on a condition variable between parallel regions.
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

}  // namespace strata
