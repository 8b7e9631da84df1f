// models/trainer.h: the training loop behind `strata train` and `strata eval`: AdamW with muP
// per-parameter learning rates (strata/torch/mup.h), warm-up then constant or cosine, gradient
// clipping, gradient accumulation, deterministic seeding, logs, evaluation and checkpoints that
// let a killed run continue exactly.
//
// A run folder (RunOptions::run_dir) holds:
//   config.toml        the resolved config (models/train_config.h)
//   train.csv          step,lr,loss,grad_norm,tokens,flops,elapsed_s   one row per optimizer step
//   eval.csv           step,flops,<metric>...                           one row per evaluation
//   log.jsonl          the same rows as JSON lines ({"kind": "train" | "eval", ...})
//   checkpoints/       models/checkpoint.h: parameters, buffers, AdamW state, torch's RNG state,
//                      and in the metadata the config, the step (= the data position: batches are
//                      a function of (seed, step, micro)) and the commit
// Resume (RunOptions::resume): loads checkpoints/latest.json, checks that the config equals the
// checkpoint's (train.steps may differ, to extend a run), cuts the logs back to the checkpoint's
// step and continues. On the CPU with the same thread count the losses equal the uninterrupted
// run's bit for bit (tests/cpp/train_test.cpp). A run folder that already has a checkpoint is
// never overwritten: without resume that is an error.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "models/checkpoint.h"
#include "models/tasks.h"
#include "models/train_config.h"

#include <torch/nn/module.h>

namespace strata::models {

struct RunOptions {
  std::string run_dir;
  bool resume = false;
  bool progress = true;       // a live progress line on stderr (a line per log_every when not a terminal)
  int64_t stop_after = -1;    // >= 0: return after this many steps of this process, as if killed
                              // (no final evaluation or checkpoint beyond the periodic ones); tests
  std::string commit;         // recorded in checkpoints and the summary ("" = unknown)
};

struct RunSummary {
  int64_t first_step = 0, last_step = 0;  // steps run by this call: [first_step, last_step)
  double last_loss = 0;
  nlohmann::json last_eval;               // the final evaluation's metrics (empty if none)
  double seconds = 0, tokens_per_second = 0, train_flops = 0;
};

// Trains c into opt.run_dir. Throws strata::Error for a bad config, a missing data file, a run
// folder with a checkpoint and no resume, a config that differs from the checkpoint's, or a
// non-finite loss (naming the step; the last checkpoint stays).
RunSummary train(const TrainConfig& c, const RunOptions& opt);

// The config a checkpoint was trained with (its metadata's resolved TOML). Throws strata::Error
// naming the checkpoint when there is none.
TrainConfig checkpoint_config(const Checkpoint& ck);

// A trained model as a checkpoint holds it: the checkpoint, its config and its task with the
// checkpoint's weights loaded (eval mode). What eval, generate and the experiment runner start from.
struct TrainedRun {
  Checkpoint checkpoint;
  TrainConfig config;
  std::unique_ptr<Task> task;
};
// From a loaded checkpoint (threads set from its config, its data loaded once), on `device` ("" =
// the run's train.device; e.g. "cpu" to evaluate a GPU run on a machine without one).
TrainedRun open_trained_run(Checkpoint ck, const std::string& device = "");
// load_checkpoint(path) (a run folder or a checkpoint metadata file), then the above.
TrainedRun load_trained_run(const std::string& checkpoint, const std::string& device = "");

// The task's metrics of a trained run on `split`, over the whole split (batch 0: the config's
// train.batch). Returns {"name", "task", "step", "split", "metrics": {...}, "checkpoint"}.
nlohmann::json evaluate_run(TrainedRun& run, const std::string& split, int64_t batch = 0);
// load_trained_run + evaluate_run.
nlohmann::json evaluate_checkpoint(const std::string& checkpoint, const std::string& split, int64_t batch = 0,
                                   const std::string& device = "");

// Copies a checkpoint's parameters and buffers ("param/<name>", "buffer/<name>") into model; every
// one must be there with the model's shape (an error names the tensor otherwise).
void load_model_state(::torch::nn::Module& model, const Checkpoint& ck);

// lr multiplier at `step` (0-based) of `steps`: linear warm-up (step + 1) / warmup over the first
// warmup steps, then 1 (constant) or a cosine from 1 to min_lr_ratio at the last step.
double lr_factor(const TrainLoopConfig& t, int64_t step);

}  // namespace strata::models
