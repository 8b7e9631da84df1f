// apps/strata/attention_runner.h: one dense-attention benchmark row: strata's kernel (through
// strata::torch, layout "bhsd") against torch's scaled_dot_product_attention on the very same
// (batch, heads, seq, dim) tensors, same process, same threads, timed by the bench harness
// (warm-up, ABBA rounds, then the check on the outputs of the last timed calls); plus the torch
// helpers the other benches share (max_rel_err, the test hook's perturbation).
// Correctness: max_rel_err is ours vs SDPA (o, and dq, dk, dv for fwd+bwd rows). float32 rows are
// correct when it is < 1e-4. bfloat16 rows are judged against SDPA run in float32 on the same
// inputs (< 2e-2), because SDPA's own bf16 gradients exceed 2e-2 at N = 16384; both errors
// against that reference are recorded.
// bfloat16 rows also time the same call with compute = "fp32" (strata/cpu.h) in the same rounds,
// check it the same way, and record (in the row's extra fields) its time, the paired speedup of
// the bf16 products over it, and, for rows of at most ref_max_seq tokens (not shared-q), the
// error of ours, of ours in fp32 compute and of SDPA bf16 against the double reference
// (strata::reference) on batch 0, head 0: see bf16_compute_fields.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "bench_harness.h"
#include "report.h"

namespace strata::app {

struct AttnCase {
  int64_t batch = 1, heads = 8, seq = 1024, head_dim = 64;
  bool causal = false;
  bool backward = false;  // false: forward only; true: forward + backward (wall time of both)
  at::ScalarType dtype = at::kFloat;
  // One query head shared by all `heads` kv heads (Bilinear BTT attention's raw block input):
  // strata gets q with 1 head; the peer, SDPA, gets q.expand() to the heads (what a user of
  // SDPA would do; its autograd sums the heads' dq).
  bool shared_q = false;
  // bfloat16 rows: the double-reference errors (batch 0, head 0) only up to this many tokens
  // (the reference materialises seq x seq in double).
  int64_t ref_max_seq = 4096;
};

// "fwd", "fwd causal", "fwd+bwd", "fwd+bwd causal"; with " shared-q" appended for shared_q.
std::string attention_case_name(const AttnCase& c);

// Tolerance on the normwise relative error: 1e-4 for float32, 2e-2 for bfloat16.
double attention_tolerance(at::ScalarType dtype);

// max|a - b| / max|b| in double (max|a - b| when b is all zeros); +inf if either holds a NaN.
double max_rel_err(const at::Tensor& a, const at::Tensor& b);

// A double buffer written by strata::reference (BSHD order) as a tensor of `sizes`, no copy: the
// right-hand side of max_rel_err.
at::Tensor reference_tensor(std::vector<double>& buf, at::IntArrayRef sizes);

// Head 0 of a BHSD tensor (batch x heads x seq x dim) as 1 x seq x 1 x dim in BSHD order: what the
// references write for one head.
at::Tensor head0_bshd(const at::Tensor& t);

// max_rel_err of batch 0, head 0 of a dense attention's outputs against the double reference
// (strata::reference, scale 1/sqrt(d), causal or not): ours = {o} (forward) or {o, dq, dk, dv}
// (forward and backward, given dout); BHSD tensors, q, k, v, dout as the call read them.
double dense_head0_ref_err(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& dout,
                           bool causal, const std::vector<const at::Tensor*>& ours);

// The test hook's perturbation (bench_harness.h): adds 1 + max|t| to one element of t in place,
// in the middle row of batch 0, head 0 (t: batch x heads x seq x dim, or batch x heads x seq), so
// any check of that head or of the whole tensor sees a relative error of at least 1.
void perturb_for_test(const at::Tensor& t);

// A CorruptFn over named outputs: perturbs the one named (perturb_for_test) and returns true, or
// returns false when `outputs` has no such name. The tensors are captured by reference, so the
// function sees what the last timed call left in them.
CorruptFn corrupt_outputs(std::vector<std::pair<std::string, const at::Tensor*>> outputs);

// The bf16-compute line of a bfloat16 row (its extra fields, the file comment), for the table:
// "" for other rows.
std::string bf16_compute_line(const BenchRow& row);

// Runs one row (see the file comment): inputs from a fixed seed; plan.reps timed rounds (fewer
// for rows over plan.budget_s, never under min(plan.reps, plan.min_reps)).
BenchRow run_attention_row(const AttnCase& c, const TimingPlan& plan);

}  // namespace strata::app
