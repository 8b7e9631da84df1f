// apps/strata/attention_runner.h: one dense-attention benchmark row: strata's kernel (through
// strata::torch, layout "bhsd") against torch's scaled_dot_product_attention on the very same
// (batch, heads, seq, dim) tensors, same process, same threads. Correctness first on the warm-up
// outputs, then interleaved timing (ours, SDPA, ours, SDPA, ...).
// Correctness: max_rel_err is ours vs SDPA (o, and dq, dk, dv for fwd+bwd rows). float32 rows are
// correct when it is < 1e-4. bfloat16 rows are judged against SDPA run in float32 on the same
// inputs (< 2e-2), because SDPA's own bf16 gradients exceed 2e-2 at N = 16384; both errors
// against that reference are recorded.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <string>

#include "report.h"

namespace strata::app {

struct AttnCase {
  int64_t batch = 1, heads = 8, seq = 1024, head_dim = 64;
  bool causal = false;
  bool backward = false;  // false: forward only; true: forward + backward (wall time of both)
  at::ScalarType dtype = at::kFloat;
};

struct TimingPlan {
  int reps = 5;              // timed repetitions per method (after one warm-up each)
  double row_budget_s = 8;   // rows whose warm-up pair would exceed this in total use fewer reps,
                             // never fewer than 3 (nor more than `reps`)
};

// "fwd", "fwd causal", "fwd+bwd", "fwd+bwd causal".
std::string attention_case_name(const AttnCase& c);

// FLOPs by the performance.md convention: 4*B*H*N*N*D forward (halved when causal), x3.5 with
// the backward.
double attention_flops(const AttnCase& c);

// Tolerance on the normwise relative error: 1e-4 for float32, 2e-2 for bfloat16.
double attention_tolerance(at::ScalarType dtype);

// max|a - b| / max|b| in double (max|a - b| when b is all zeros); +inf if either holds a NaN.
double max_rel_err(const at::Tensor& a, const at::Tensor& b);

// Runs one row (see the file comment): inputs from a fixed seed, one warm-up run of each method
// (its outputs are checked), then plan.reps interleaved timed runs (fewer for slow rows, see
// TimingPlan).
BenchRow run_attention_row(const AttnCase& c, const TimingPlan& plan);

}  // namespace strata::app
