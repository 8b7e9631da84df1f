// apps/strata/commands.h: the CLI's commands. Each has an options struct, an add_* that registers
// its CLI11 subcommand (flags bound to the struct) and a run_* that returns the exit status.
#pragma once
#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace strata::app {

struct InfoOptions {
  int threads = 0;    // 0: default
  bool peak = false;  // also measure the FMA peak
};
CLI::App* add_info(CLI::App& app, InfoOptions& o);
int run_info(const InfoOptions& o);

// Registers the options every bench shares on cmd: --json FILE (rewritten after every
// `json_unit`), --csv FILE, --threads and --reps (help text reps_help).
void add_bench_output_options(CLI::App* cmd, std::string& json, std::string& csv, int& threads, int& reps,
                              const std::string& json_unit, const std::string& reps_help);

struct BenchAttentionOptions {
  bool quick = false;
  bool shared_q = false;  // the shared-query rows instead of the sweep (bench_attention.cpp)
  std::string json, csv;  // "" = do not write
  int threads = 0;        // 0: default
  int reps = 0;           // 0: 7 (5 with --quick)
  int64_t ref_max_seq = 4096;  // bf16 rows: double-reference errors up to this many tokens
  // Row filters (empty: all rows of the sweep).
  std::vector<int64_t> seq, head_dim;
  std::vector<std::string> dtype, pass;
};
CLI::App* add_bench_attention(CLI::App& bench, BenchAttentionOptions& o);
int run_bench_attention(const BenchAttentionOptions& o);

struct BenchMlrOptions {
  bool quick = false, smoke = false;
  std::string json, csv;       // "" = do not write
  int threads = 0;             // 0: default
  int reps = 0;                // 0: 7 (5 with --quick, 3 with --smoke)
  int64_t heads = 8;
  std::string dtype = "float32";   // or "bfloat16": the forward group with bf16 products
  int64_t ref_max_seq = 4096;      // largest T for the reference-construction peer
  int64_t ref_bwd_max_seq = 4096;  // and for its autograd backward
  std::vector<int64_t> seq;    // row filters (empty: all)
  std::vector<std::string> split;
};
CLI::App* add_bench_mlr(CLI::App& bench, BenchMlrOptions& o);
int run_bench_mlr(const BenchMlrOptions& o);

struct BenchMonarchOptions {
  bool quick = false, smoke = false;
  std::string json, csv;
  int threads = 0;
  int reps = 0;                     // 0: 7 (5 with --quick, 3 with --smoke)
  int64_t heads = 12;
  std::vector<int64_t> seq, steps;  // filters (empty: all N; T = 1 and 2)
  std::string dtype = "float32";    // or bfloat16: the forward's bf16 products (opt in)
};
CLI::App* add_bench_monarch(CLI::App& bench, BenchMonarchOptions& o);
int run_bench_monarch(const BenchMonarchOptions& o);

struct BenchStructuredOptions {
  bool quick = false, smoke = false;
  std::string json, csv;
  int threads = 0;
  int reps = 0;                   // 0: 7 (5 with --quick, 3 with --smoke)
  int64_t tokens = 0;             // 0: 4096 (256 with --smoke)
  std::vector<int64_t> dim;       // filters (empty: all)
  std::vector<std::string> ops;
};
CLI::App* add_bench_structured(CLI::App& bench, BenchStructuredOptions& o);
int run_bench_structured(const BenchStructuredOptions& o);

struct BenchTrainOptions {  // bench_train.cpp
  bool smoke = false;
  std::string json, csv;
  int threads = 0;
  int reps = 0;
};
CLI::App* add_bench_train(CLI::App& bench, BenchTrainOptions& o);
int run_bench_train(const BenchTrainOptions& o);

struct BenchMemoryOptions {  // bench_memory.cpp
  std::vector<int64_t> seq;  // empty: 16384, 32768
  int64_t heads = 8, head_dim = 64;
  bool causal = true;
  int threads = 0;
  std::string json;
  std::string child;  // internal: "strata" | "sdpa" runs one measurement in this process
};
CLI::App* add_bench_memory(CLI::App& bench, BenchMemoryOptions& o);
int run_bench_memory(const BenchMemoryOptions& o);

struct DemoOptions {
  std::string out = "out";
  int threads = 0;
  std::vector<std::string> sections;  // empty: all
};
CLI::App* add_demo(CLI::App& app, DemoOptions& o);
int run_demo(const DemoOptions& o);

struct ConvertOptions {  // convert.h
  std::vector<std::string> methods;  // "<spec>[@layers]"; empty: the default list
  bool quick = false, no_plot = false;
  int64_t sts_pairs = 0, passages = 0;  // 0: default
  std::vector<int64_t> long_lengths;
  std::string out = "out/convert";
  int threads = 0;
};
CLI::App* add_convert(CLI::App& app, ConvertOptions& o);
int run_convert(const ConvertOptions& o);

struct EmbedOptions {  // embed.cpp
  std::string method = "softmax";  // "<spec>[@layers]"
  std::vector<int64_t> layers;     // empty: the spec's own, or all
  std::string input, output;       // "" or "-": stdin / stdout
  std::string format;              // "npy" | "json"; "": json for --output *.json, else npy
  int64_t batch_size = 32, max_length = 256;
  bool progress = false;           // also when stderr is not a terminal
  int threads = 0;
};
CLI::App* add_embed(CLI::App& app, EmbedOptions& o);
int run_embed(const EmbedOptions& o);

struct TrainOptions {  // train.cpp
  std::string config, size, out;
  std::vector<std::string> sets;  // "key=value"
  bool resume = false, no_progress = false;
  int64_t stop_after = -1;
};
CLI::App* add_train(CLI::App& app, TrainOptions& o);
int run_train(const TrainOptions& o);

struct EvalOptions {  // train.cpp
  std::string checkpoint, split = "val", json, device;
  int64_t batch = 0;
};
CLI::App* add_eval(CLI::App& app, EvalOptions& o);
int run_eval(const EvalOptions& o);

struct GenerateOptions {  // train.cpp
  std::string checkpoint, prompt;
  int64_t tokens = 200, top_k = 0;
  double temperature = 1.0;
  uint64_t seed = 0;
};
CLI::App* add_generate(CLI::App& app, GenerateOptions& o);
int run_generate(const GenerateOptions& o);

struct PlotRunsOptions {  // train.cpp
  std::vector<std::string> runs;
  std::string out = "runs/plot.png", metric;
  int64_t smooth = 20;
};
CLI::App* add_plot_runs(CLI::App& app, PlotRunsOptions& o);
int run_plot_runs(const PlotRunsOptions& o);

struct ExperimentOptions {  // experiment.cpp
  std::string name, size = "cpu", out;
  std::vector<std::string> only;  // labels
  std::vector<std::string> sets;  // --set, applied to every run
  bool list = false, no_plot = false, no_progress = false;
  int64_t stop_after = -1;
};
CLI::App* add_experiment(CLI::App& app, ExperimentOptions& o);
int run_experiment(const ExperimentOptions& o);

}  // namespace strata::app
