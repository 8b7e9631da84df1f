// strata/torch/threads.h: which threads strata's kernels run their parallel regions on, in a
// process that has LibTorch loaded.
//
//   "torch" (the default): torch's own intra-op threads (at::parallel_for: OpenMP in the official
//           builds). One team for both libraries: a strata kernel right after a torch op finds the
//           team awake instead of fighting it for the cores (with libgomp's default wait policy,
//           torch's workers spin for a while after every op, and a second pool of N threads on N
//           cores then runs at about half speed until they give up). A region uses
//           min(strata::get_num_threads(), at::get_num_threads()) threads.
//   "own": strata's own pool (strata/threading.h), as without LibTorch; its workers sleep between
//           regions (the CLI then re-executes itself with OMP_WAIT_POLICY=PASSIVE).
// The environment variable STRATA_THREAD_POOL=torch|own sets the default when the library loads.
// "torch" was opt-in until issue 48 item 7 settled it: one clean-clone CI run had seen `strata
// bench monarch --smoke` give a 2e-4 error on its T = 1 forward rows on torch's threads, and later,
// beside a busy process, the same wrong rows came in 1 of 25 runs on torch's threads and in 1 of 40
// on strata's own pool (an Intel Xeon with AVX-512), so not this runner. bench/stress_pools.py then
// ran every kernel family 500 times per pool beside a busy process, with more threads than cores and
// the workspace poisoned (STRATA_POISON_WORKSPACE=1), each call checked per head against the
// float64 reference and bit for bit against the first call on the same inputs: no wrong or unstable
// result on either pool (AMD EPYC, AVX2; docs/results.md "Thread pools" has the command and result),
// nor in 30 + 30 runs of the bench smoke under load (bench/stress_under_load.sh). The same stress
// run on an AVX-512 CPU (AMD EPYC, kernels dispatched to avx512) found nothing either.
// Fork (DataLoader workers, multiprocessing's 'fork'): libgomp's team does not survive fork, and
// a child of a process that ran a parallel region on it hangs in its first one (torch's own ops
// too, e.g. MKL's threaded exp). So a child forked after strata ran a region on torch's threads
// starts with one intra-op thread (at::set_num_threads(1) in a fork handler: torch.get_num_threads()
// == 1 there, as in DataLoader workers; raising it again there hangs), and strata's regions in
// any forked child run on a fresh pool of strata's own (strata::get_num_threads() threads).
#pragma once
#include <string>

namespace strata::torch {

// name: "torch" or "own"; anything else is a strata::Error naming `name`. Takes effect for the
// next parallel region; do not call it while another thread runs a strata kernel.
void set_thread_pool(const std::string& name);
std::string thread_pool();  // "torch" or "own"

}  // namespace strata::torch
