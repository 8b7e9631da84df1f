// models/tasks.h: the three training tasks of the experiments (../shared/design/experiments.md):
// what model a config builds, what a training micro-batch's loss is and how a model is evaluated.
// The trainer (models/trainer.h) is the same loop for all of them.
//
//   charlm  character LM: models/decoder.h over a data/char_corpus.h corpus; loss: cross entropy
//           (nats/char); metrics: loss and bits/char over the evaluation windows of a split.
//   icr     in-context linear regression: the decoder with read-in / read-out over data/icr.h
//           prompts; loss: mean squared error of the y_i predicted at the x_i tokens; metric: the
//           squared error at the LAST point over `data.eval_prompts` fresh prompts at full size.
//           (also mean_se over all points, and last_point_zero_se: predicting 0 on the same prompts)
//   ett     ETTh1 forecasting: models/forecaster.h over data/ett.h windows; loss: MSE; metrics: MSE
//           and MAE on the standardised split, averaged over windows (stride 1) and variables.
//
// Determinism: a micro-batch is a pure function of (seed, step, micro) (data/*.h), evaluation
// draws from fixed seeds, so a resumed run sees exactly the batches of the uninterrupted one.
#pragma once
#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "models/train_config.h"

namespace strata::models {

class Task {
 public:
  virtual ~Task() = default;
  // The model (its parameters are what the trainer optimises and checkpoints).
  virtual ::torch::nn::Module& model() = 0;
  // The mean loss over `batch` sequences of micro-batch `micro` of optimizer step `step` (a scalar
  // that requires grad in training mode).
  virtual at::Tensor loss(int64_t step, int64_t micro, int64_t batch) = 0;
  // The task's metrics on `split` ("val" | "test"; charlm has no test split), under NoGradGuard in
  // eval mode; `max_batches` batches of `batch` (0 = the whole split). Object of name -> number; the
  // first key is the headline metric.
  virtual nlohmann::json evaluate(const std::string& split, int64_t batch, int64_t max_batches) = 0;
  // Tokens of one training sequence at `step` (the ICR curriculum lengthens them).
  virtual int64_t tokens_per_sequence(int64_t step) const = 0;
  // Forward FLOPs of one training sequence at `step`, non-embedding (matmuls incl. attention).
  virtual double forward_flops_per_sequence(int64_t step) const = 0;
};

// The device of c.train.device, checked against this machine: throws strata::Error naming
// 'train.device' when it is a CUDA device LibTorch does not see (no CUDA build, no GPU, or no
// device of that index).
at::Device training_device(const TrainConfig& c);

// The task of c.task with its model built (parameters initialised by the muP rules from a
// generator seeded with c.seed) and its data loaded (checksums checked). Throws strata::Error
// naming the config key for what does not fit. The model lives on training_device(c) (initialised
// on the CPU, then moved: the same initial weights on every device); batches are drawn on the CPU
// and copied there.
std::unique_ptr<Task> make_task(const TrainConfig& c);

}  // namespace strata::models
