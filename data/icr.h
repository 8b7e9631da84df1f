// data/icr.h: in-context linear regression (torch-free), experiments.md section 1 (Garg et al. 2022
// as used by the paper; ref = YilunKuang/structured-attention, train_ICL.py + in_context_regression/).
//
// Per prompt: w ~ N(0, I_d); points x_i with coordinates N(0, 1/d_active) for the first d_active
// coordinates and 0 beyond; y_i = x_i . w, so Var(y_i) = |w_active|^2 / d_active has mean 1 and
// predicting 0 scores ~1. Tokens interleave x_1, y_1, x_2, y_2, ... (x token = x_i, y token =
// [y_i, 0, ..., 0], both d wide); the model predicts y_i at the x_i token from the earlier pairs.
//
// Curriculum (ref train_ICL.py, "adaptive inc"): d_active starts at start_dims and the point count
// at start_points; every `interval` steps both grow, d_active by
//   inc = max(1, ceil((d - start_dims) / updates))      (ref: the smallest inc >= 1 with
//                                                         start_dims + updates * inc >= d)
// and the point count by 2 inc, each clamped at its full size (d, 2d). So the curriculum completes
// within `updates` updates (ref's 15 = floor(0.06 warm-up ratio x 500,001 steps / 2,000)). The stage
// at step s is the one after floor(s / interval) updates (ref updates after each step, so steps
// 0..interval-1 see the start). E.g. d = 16: inc 1, full size (16 dims, 32 points) at step 24,000;
// d = 64: inc 4, full at update 15 (step 30,000).
//
// Batches are pure functions of (seed, step, micro) (data/counter_rng.h).
#pragma once
#include <cstdint>

namespace strata::data {

struct IcrOptions {
  int64_t dim = 16;                          // d
  int64_t start_dims = 4, start_points = 8;  // curriculum start
  int64_t interval = 2000;                   // steps between curriculum updates
  int64_t updates = 15;                      // the curriculum completes in this many updates
};

struct IcrStage {
  int64_t active_dims = 0, points = 0;  // at a training step
};

// Throws strata::Error naming the option when d < 1, start_dims not in [1, d], start_points not in
// [1, 2d], interval < 1 or updates < 1.
void check_icr_options(const IcrOptions& opt);

// The increment of d_active per update (the point count grows by twice this).
int64_t icr_dims_increment(const IcrOptions& opt);

// The stage at training step `step` >= 0; full size: active_dims = d, points = 2d.
IcrStage icr_stage(const IcrOptions& opt, int64_t step);

// The first step at full size.
int64_t icr_full_size_step(const IcrOptions& opt);

// T = 2 * points at full size = 4d: the model's context.
int64_t icr_max_tokens(const IcrOptions& opt);

// `batch` prompts at `stage` (active_dims in [1, d], points in [1, 2d]), drawn by (seed, step, micro);
// prompt b does not depend on `batch`. Writes every element of both outputs.
void icr_batch(const IcrOptions& opt, const IcrStage& stage, int64_t batch, uint64_t seed, int64_t step,
               int64_t micro, float* tokens /* batch x (2*points) x d */,
               float* targets /* batch x points: y_i, predicted at the x_i token (token 2i) */);

}  // namespace strata::data
