// data/icr.cpp: see icr.h.
#include "data/icr.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "data/counter_rng.h"
#include "strata/error.h"

namespace strata::data {

void check_icr_options(const IcrOptions& opt) {
  const char* where = "IcrOptions";
  STRATA_CHECK_ARG(opt.dim >= 1, where, "dim", ">= 1", opt.dim);
  STRATA_CHECK_ARG(opt.start_dims >= 1 && opt.start_dims <= opt.dim, where, "start_dims",
                   "in [1, dim = " + std::to_string(opt.dim) + "]", opt.start_dims);
  STRATA_CHECK_ARG(opt.start_points >= 1 && opt.start_points <= 2 * opt.dim, where, "start_points",
                   "in [1, 2 dim = " + std::to_string(2 * opt.dim) + "]", opt.start_points);
  STRATA_CHECK_ARG(opt.interval >= 1, where, "interval", ">= 1", opt.interval);
  STRATA_CHECK_ARG(opt.updates >= 1, where, "updates", ">= 1", opt.updates);
}

int64_t icr_dims_increment(const IcrOptions& opt) {
  check_icr_options(opt);
  return std::max<int64_t>(1, (opt.dim - opt.start_dims + opt.updates - 1) / opt.updates);
}

IcrStage icr_stage(const IcrOptions& opt, int64_t step) {
  const int64_t inc = icr_dims_increment(opt);
  STRATA_CHECK_ARG(step >= 0, "icr_stage", "step", ">= 0", step);
  // Clamp the update count before multiplying: a huge step must not overflow.
  const int64_t k = std::min(step / opt.interval, 2 * opt.dim);
  return {std::min(opt.start_dims + k * inc, opt.dim), std::min(opt.start_points + k * 2 * inc, 2 * opt.dim)};
}

int64_t icr_full_size_step(const IcrOptions& opt) {
  const int64_t inc = icr_dims_increment(opt);
  const int64_t k_dims = (opt.dim - opt.start_dims + inc - 1) / inc;
  const int64_t k_points = (2 * opt.dim - opt.start_points + 2 * inc - 1) / (2 * inc);
  return std::max(k_dims, k_points) * opt.interval;
}

int64_t icr_max_tokens(const IcrOptions& opt) {
  check_icr_options(opt);
  return 4 * opt.dim;
}

void icr_batch(const IcrOptions& opt, const IcrStage& stage, int64_t batch, uint64_t seed, int64_t step,
               int64_t micro, float* tokens, float* targets) {
  check_icr_options(opt);
  const int64_t d = opt.dim, n = stage.points, da = stage.active_dims;
  STRATA_CHECK_ARG(da >= 1 && da <= d, "icr_batch", "stage.active_dims", "in [1, dim = " + std::to_string(d) + "]",
                   da);
  STRATA_CHECK_ARG(n >= 1 && n <= 2 * d, "icr_batch", "stage.points", "in [1, 2 dim = " + std::to_string(2 * d) + "]",
                   n);
  STRATA_CHECK_ARG(batch >= 1, "icr_batch", "batch", ">= 1", batch);
  STRATA_CHECK_ARG(tokens != nullptr, "icr_batch", "tokens", "a buffer of batch x 2 points x dim floats", "null");
  STRATA_CHECK_ARG(targets != nullptr, "icr_batch", "targets", "a buffer of batch x points floats", "null");
  CounterRng rng(seed, step, micro, RngStream::icr_prompts);
  const double x_std = 1.0 / std::sqrt(double(da));
  std::vector<double> w(size_t(d), 0.0);
  std::fill(tokens, tokens + batch * 2 * n * d, 0.0f);
  for (int64_t b = 0; b < batch; ++b) {
    for (double& wj : w) wj = rng.normal();  // all d coords: w ~ N(0, I_d) whatever the stage
    for (int64_t i = 0; i < n; ++i) {
      float* x = tokens + (b * 2 * n + 2 * i) * d;  // token 2i: x_i
      double y = 0;
      for (int64_t j = 0; j < da; ++j) {
        x[j] = float(x_std * rng.normal());
        y += double(x[j]) * w[size_t(j)];  // from the rounded x the model sees
      }
      x[d] = float(y);  // token 2i + 1: [y_i, 0, ..., 0]
      targets[b * n + i] = float(y);
    }
  }
}

}  // namespace strata::data
