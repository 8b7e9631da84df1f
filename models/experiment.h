// models/experiment.h: the paper's experiments (../shared/design/experiments.md sections 1-3) as
// lists of training runs, run in sequence by one command (`strata experiment NAME`), resumable.
//
// An experiment file (configs/experiments/<name>.toml) lists its runs; sizes apply to every run:
//   name = "charlm"
//   kind = "charlm"                       # what the plot step makes: icr | charlm | etth1
//   [sizes.smoke]                         # per size: --set overrides applied after each run's own,
//   set = ["model.layers=1", ...]         # and eval_batch (sequences per batch of the final
//   eval_batch = 256                      # evaluations; 0 = the config's train.batch), and map:
//   map = {"model.width=64" = "model.width=256"}   # a run's set equal to a key is replaced by its
//                                         # value at this size (the paper's widths for the cpu ones);
//                                         # a value may be an array: several sets for one
//   [[run]]
//   label = "mlr8 D=128"                  # unique; the run folder is run_folder_name(label)
//   method = "mlr8"                       # the line (icr, charlm) or table row (etth1) it belongs to
//   config = "../charlm.toml"             # relative to the experiment file
//   set = ["model.attention=mlr:ranks=32|8|6|4|4|4|4|2,avg=1", "model.width=128"]
//   [repeat]                              # optional: after every base run is done, the best
//   seeds = [1, 2]                        # method's runs again with these seeds; the best method
//   metric = "val.mae"                    # is the lowest mean of this metric over its base runs
//                                         # (val, never test)
// A run's config: load_train_config(config, size, map(run.set) + sizes.<size>.set). Labels stay
// the file's (they name the cpu size's widths); the records carry the real model sizes.
//
// OUT (ExperimentOptions::out) holds one folder per run (the trainer's run folder,
// models/trainer.h) and OUT/summary.json:
//   {"experiment", "kind", "size", "file", "best" (repeat: {"method", "metric", "means"}),
//    "runs": [{"label", "method", "folder", "config", "sets", "size", "seed", "steps",
//              "train_flops", "train_tokens", "wall_s", "tokens_per_second", "eval_s",
//              "val": {metrics}, "test": {metrics} | null, "commit", "cpu", "threads", "date",
//              "model": {width, layers, heads, attention, kind}, "data": {dim, context, input_len, horizon, corpus}}]}
// rewritten atomically (data/files.h) after each run, in the experiment's run order.
// Per run: a record in OUT/summary.json -> skipped; the run folder's summary.json (the trainer's
// "complete") -> only evaluated and recorded; a checkpoint -> resumed (RunOptions::resume);
// else started. So the same command after a kill continues where it stopped.
// After training: the val metrics over the whole split (the trainer's final evaluation when its
// train.eval_batches is 0, else evaluate_checkpoint), the test metrics (evaluate_checkpoint) where
// the task has a test split (ett: the test rows; icr: fresh prompts from the test seed).
// wall_s: the sum over the processes that trained the run of their train.csv elapsed_s (steps and
// periodic evaluations; work lost to a kill after the last checkpoint is not counted);
// tokens_per_second: the trainer's (training steps only) of the process that finished the run.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace strata::models {

struct ExperimentRun {
  std::string label, method;
  std::string config;              // the config file's path (resolved against the experiment file)
  std::vector<std::string> sets;   // the run's own --set overrides
};

struct ExperimentSize {
  std::vector<std::string> sets;   // applied after each run's own
  int64_t eval_batch = 0;          // 0 = the config's train.batch
  std::map<std::string, std::vector<std::string>> map;  // a run's set -> its replacement(s) at this size
};

struct Experiment {
  std::string name, kind, path;    // kind: "icr" | "charlm" | "etth1"
  std::map<std::string, ExperimentSize> sizes;
  std::vector<ExperimentRun> runs;
  std::vector<int64_t> repeat_seeds;  // empty: no [repeat]
  std::string repeat_metric;          // "val.<metric>" (lower is better)
};

// Reads an experiment file (format above). Throws strata::Error naming the file and the key: an
// unknown key, a missing label / config, a duplicate label or run folder, a missing config file.
Experiment load_experiment(const std::string& path);

// The folder of a run: the label with '|' as '-' and anything but [A-Za-z0-9._=+-] as '_'.
std::string run_folder_name(const std::string& label);

// The method with the lowest mean of e.repeat_metric over its base runs' records in `summary`
// (OUT/summary.json), with those means; "" when [repeat] is absent or a base run has no record.
std::pair<std::string, std::map<std::string, double>> best_method(const Experiment& e, const nlohmann::json& summary);

// The [repeat] runs of `method`: each of its base runs with " seed=S" added to the label and
// "seed=S" to the sets, for every S in e.repeat_seeds.
std::vector<ExperimentRun> repeat_runs(const Experiment& e, const std::string& method);

struct ExperimentOptions {
  std::string out;                   // OUT
  std::string size = "cpu";
  std::vector<std::string> only;     // labels to run (empty: all)
  std::vector<std::string> sets;     // --set overrides applied to every run after the size's (e.g.
                                     // train.device=cuda, or train.steps=N for a bounded check)
  int64_t stop_after = -1;           // >= 0: stop the first run that trains after this many steps and
                                     // return, as if killed (tests)
  bool progress = true;              // the trainer's progress lines
  std::string commit, cpu;           // recorded per run
  std::function<std::string()> now;  // the date recorded per run (UTC, ISO 8601)
  std::function<void(const std::string&)> say = nullptr;  // one line per run: started / resumed / skipped
};

struct ExperimentResult {
  nlohmann::json summary;        // OUT/summary.json as written
  int64_t ran = 0, skipped = 0;  // runs trained (or evaluated) here / already recorded
  bool stopped = false;          // stop_after ended it early
};

// Runs the experiment's runs (then its [repeat] runs) in sequence into opt.out (see the file
// comment). Throws strata::Error for a bad --only label, an OUT of another experiment or size,
// or whatever the trainer throws (the runs done so far stay recorded).
ExperimentResult run_experiment(const Experiment& e, const ExperimentOptions& opt);

}  // namespace strata::models
