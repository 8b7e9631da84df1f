// apps/strata/train.cpp: `strata train CONFIG` and `strata eval CHECKPOINT` (models/trainer.h).
#include <fmt/format.h>

#include "commands.h"
#include "data/files.h"
#include "data/char_corpus.h"
#include "models/checkpoint.h"
#include "models/decoder.h"
#include "models/generate.h"
#include "models/tasks.h"
#include "models/trainer.h"
#include "plot.h"
#include "strata/error.h"

#ifndef STRATA_GIT_COMMIT
#define STRATA_GIT_COMMIT ""
#endif

namespace strata::app {

CLI::App* add_train(CLI::App& app, TrainOptions& o) {
  CLI::App* cmd = app.add_subcommand("train", "Train a model from a TOML config (configs/*.toml); resumable");
  cmd->add_option("config", o.config, "the config file, e.g. configs/charlm.toml")->required();
  cmd->add_option("--size", o.size, "the config's size: smoke | cpu | paper (its [sizes.<size>] table)");
  cmd->add_option("--set", o.sets, "override a key, e.g. --set train.steps=100 --set model.attention=swa:w=64")
      ->allow_extra_args(false);
  cmd->add_option("--out", o.out, "the run folder (default runs/<name>-<size>)");
  cmd->add_flag("--resume", o.resume, "continue the run in --out from its latest checkpoint");
  cmd->add_flag("--no-progress", o.no_progress, "no progress line on stderr");
  cmd->add_option("--stop-after", o.stop_after, "stop after this many steps, as if killed (for tests)")
      ->group("");  // hidden
  return cmd;
}

int run_train(const TrainOptions& o) {
  const models::TrainConfig c = models::load_train_config(o.config, o.size, o.sets);
  const std::string out = o.out.empty() ? "runs/" + c.name + (c.size.empty() ? "" : "-" + c.size) : o.out;
  const std::string why = data::unwritable_reason(out + "/config.toml");
  STRATA_CHECK(why.empty(), "strata train: option '--out': cannot write into '", out, "': ", why);
  fmt::print(stderr, "strata train: {} (task {}, size '{}') -> {}{}\n", c.name, c.task, c.size, out,
             o.resume ? " (resuming)" : "");
  models::RunOptions r;
  r.run_dir = out;
  r.resume = o.resume;
  r.progress = !o.no_progress;
  r.stop_after = o.stop_after;
  r.commit = STRATA_GIT_COMMIT;
  const auto s = models::train(c, r);
  fmt::print("{}\n", nlohmann::json({{"run_dir", out}, {"steps", {s.first_step, s.last_step}}, {"last_loss", s.last_loss},
                                     {"eval", s.last_eval}, {"tokens_per_second", s.tokens_per_second},
                                     {"train_flops", s.train_flops}, {"seconds", s.seconds}})
                         .dump());
  return 0;
}

CLI::App* add_eval(CLI::App& app, EvalOptions& o) {
  CLI::App* cmd = app.add_subcommand("eval", "Evaluate a checkpoint on the task's metric (whole split)");
  cmd->add_option("checkpoint", o.checkpoint, "a run folder or a checkpoint's .json")->required();
  cmd->add_option("--split", o.split, "val | test (charlm: val only)")->check(CLI::IsMember({"val", "test"}));
  cmd->add_option("--batch", o.batch, "sequences per batch (default: the config's train.batch)");
  cmd->add_option("--device", o.device, "cpu | cuda | cuda:N (default: the run's train.device)");
  cmd->add_option("--json", o.json, "also write the result to this file");
  return cmd;
}

int run_eval(const EvalOptions& o) {
  if (!o.json.empty()) {
    const std::string why = data::unwritable_reason(o.json);
    STRATA_CHECK(why.empty(), "strata eval: option '--json': cannot write '", o.json, "': ", why);
  }
  const auto r = models::evaluate_checkpoint(o.checkpoint, o.split, o.batch, o.device);
  fmt::print("{}\n", r.dump(2));
  if (!o.json.empty()) data::write_file_atomic(o.json, r.dump(2) + "\n", "strata eval");
  return 0;
}

CLI::App* add_generate(CLI::App& app, GenerateOptions& o) {
  CLI::App* cmd = app.add_subcommand("generate", "Sample characters from a char-LM checkpoint (cached decoding)");
  cmd->add_option("checkpoint", o.checkpoint, "a run folder or a checkpoint's .json (task charlm)")->required();
  cmd->add_option("--prompt", o.prompt, "the text to continue (printable ASCII and newlines)");
  cmd->add_option("--tokens", o.tokens, "characters to generate")->check(CLI::NonNegativeNumber);
  cmd->add_option("--temperature", o.temperature, "softmax temperature; 0 = greedy")->check(CLI::NonNegativeNumber);
  cmd->add_option("--top-k", o.top_k, "sample among the k likeliest (0 = all)")->check(CLI::NonNegativeNumber);
  cmd->add_option("--seed", o.seed, "the sampling seed");
  return cmd;
}

int run_generate(const GenerateOptions& o) {
  models::Checkpoint ck = models::load_checkpoint(o.checkpoint);
  const models::TrainConfig c = models::checkpoint_config(ck);
  STRATA_CHECK(c.task == "charlm", "strata generate: argument 'checkpoint': expected a charlm run, got task '", c.task, "'");
  const std::vector<int64_t> prompt = data::encode_chars(o.prompt.empty() ? std::string("\n") : o.prompt);
  models::TrainedRun run = models::open_trained_run(std::move(ck), "cpu");  // the decode caches are CPU-only
  auto* model = dynamic_cast<models::DecoderImpl*>(&run.task->model());
  STRATA_CHECK(model, "strata generate: the checkpoint's model is not a decoder");
  models::GenerateOptions g;
  g.tokens = o.tokens;
  g.temperature = o.temperature;
  g.top_k = o.top_k;
  g.seed = o.seed;
  models::GenerateStats st;
  fmt::print("{}", o.prompt);
  std::fflush(stdout);
  models::generate(*model, prompt, g, [](int64_t id) {
    const std::string ch = data::decode_chars(&id, 1);
    std::fwrite(ch.data(), 1, ch.size(), stdout);
    std::fflush(stdout);
  }, &st);
  fmt::print("\n");
  fmt::print(stderr,
             "strata generate: {} tokens after a {}-token prompt: {:.1f} tokens/s (prefill {:.3f} s); cache at the "
             "context {}: keys {} bytes ({:.3f}x a dense key cache of {} bytes), values {} bytes\n",
             st.new_tokens, st.prompt_tokens, st.tokens_per_second, st.prefill_seconds, model->config.context,
             st.key_bytes, double(st.key_bytes) / double(std::max<int64_t>(1, st.dense_key_bytes)), st.dense_key_bytes,
             st.value_bytes);
  return 0;
}

CLI::App* add_plot_runs(CLI::App& app, PlotRunsOptions& o) {
  CLI::App* cmd = app.add_subcommand("plot", "Plot training runs: loss against step and against training FLOPs");
  cmd->add_option("runs", o.runs, "run folders of `strata train`")->required();
  cmd->add_option("--out", o.out, "the PNG to write");
  cmd->add_option("--metric", o.metric, "the evaluation metric (default: each run's first)");
  cmd->add_option("--smooth", o.smooth, "moving average of the training loss over this many steps")
      ->check(CLI::PositiveNumber);
  return cmd;
}

int run_plot_runs(const PlotRunsOptions& o) {
  const std::string why_out = data::unwritable_reason(o.out);
  STRATA_CHECK(why_out.empty(), "strata plot: option '--out': cannot write '", o.out, "': ", why_out);
  std::vector<std::string> args = {o.out};
  args.insert(args.end(), o.runs.begin(), o.runs.end());
  if (!o.metric.empty()) args.insert(args.end(), {"--metric", o.metric});
  args.insert(args.end(), {"--smooth", std::to_string(o.smooth), "--quiet"});
  std::string why;
  STRATA_CHECK(run_python_script(plot_script_path("plot_runs.py"), args, &why), "strata plot: ", why);
  fmt::print("wrote {}\n", o.out);
  return 0;
}

}  // namespace strata::app
