// apps/strata/main.cpp: the `strata` command line: info, demo, convert, embed, bench ... (CLI11).
// Errors from the library (strata::Error, c10::Error) end the command with status 1 and one line
// on stderr; bad flags get CLI11's message and usage.
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <fmt/core.h>
#include <torch/cuda.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <exception>
#include <unistd.h>
#include <string>

#include "commands.h"
#include "process_memory.h"
#include "session.h"
#include "strata/cpu.h"
#include "strata/error.h"
#include "strata/threading.h"
#include "strata/torch/threads.h"
#include "strata/torch/torch_ops.h"

namespace strata::app {

CLI::App* add_info(CLI::App& app, InfoOptions& o) {
  CLI::App* cmd = app.add_subcommand("info", "Print the CPU features, ISA in use, threads and versions");
  cmd->add_option("--threads", o.threads, "threads for strata and torch (default: STRATA_NUM_THREADS or all)")
      ->check(CLI::Range(1, 4096));
  cmd->add_flag("--peak", o.peak, "also measure the fp32 FMA peak (about 2 seconds)");
  return cmd;
}

int run_info(const InfoOptions& o) {
  const int threads = configure_threads(o.threads);
  fmt::print("version:  {}\n", version_string());
  fmt::print("cpu:      {}\n", cpu_model());
  fmt::print("features: {}\n", cpu_summary());
  fmt::print("isa:      {} (kernels dispatch to this; STRATA_ISA=scalar|avx2|avx512 lowers it)\n",
             isa_name(active_isa()));
  fmt::print("bf16:     products of bfloat16 inputs on {} (compute = auto; strata/cpu.h)\n",
             compute_name(resolve_compute("strata info", Compute::automatic, true)));
  if (cpu_features().avx512_bf16) {
    const Bf16DotRates& r = bf16_dot_rates();
    fmt::print("          vdpbf16ps {:.1f} vs fp32 FMA {:.1f} GMAC/s on one thread ({:.2f}x; auto takes it at "
               ">= {:.2f}x)\n", r.dot, r.fma, r.dot / r.fma, kVdpbf16psPays);
  }
  fmt::print("threads:  strata {}, torch {}; strata's regions run on {} threads (STRATA_THREAD_POOL=torch|own)\n",
             strata::get_num_threads(), at::get_num_threads(),
             strata::torch::thread_pool() == "torch" ? "torch's" : "strata's own");
  // strata has CPU kernels only; on a CUDA device its ops run through the torch-op path (ATen ops).
  const int64_t gpus = ::torch::cuda::is_available() ? int64_t(::torch::cuda::device_count()) : 0;
  fmt::print("cuda:     {}\n", gpus == 0 ? std::string("no device (LibTorch sees none)")
                                           : fmt::format("{} device(s); strata's ops run there through the torch-op "
                                                         "path (ATen ops), train.device=cuda",
                                                         gpus));
  if (o.peak) {
    const FmaPeak p = measure_fma_peak(threads);
    fmt::print("peak:     {:.1f} GFLOP/s fp32 FMA on {} threads, {:.1f} on one ({} loop)\n", p.all_gflops,
               p.threads, p.per_core_gflops, p.isa);
  }
  return 0;
}

}  // namespace strata::app

namespace {

// Only with strata's own pool (STRATA_THREAD_POOL=own; strata/torch/threads.h: with `torch`, the
// default, strata's regions run on torch's own threads and nothing here is needed). Torch's OpenMP threads (libgomp) spin for a
// while after every parallel region; strata's own pool sleeps. When a torch op runs just before
// one of ours (a peer in a benchmark, the projections around attention in a model) the spinning
// threads take the cores our workers need: measured, an MLR decode step went from 1.1 to 3.3 ms
// and the MLR forward lost 5%. libgomp reads OMP_WAIT_POLICY once, when it is loaded (before
// main), so the CLI then sets it to PASSIVE and re-executes itself. Set OMP_WAIT_POLICY yourself
// (ACTIVE or PASSIVE) to choose; STRATA_NO_REEXEC=1 skips this.
void make_torch_threads_passive(char** argv) {
  if (strata::torch::thread_pool() != "own") return;
  if (std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("STRATA_NO_REEXEC") != nullptr) return;
  ::setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
  ::execv("/proc/self/exe", argv);  // returns only on failure: then run as we are
}

}  // namespace

int main(int argc, char** argv) {
  make_torch_threads_passive(argv);
  using namespace strata::app;
  CLI::App app{"strata: structured softmax attention kernels, their peers and benchmarks", "strata"};
  app.set_version_flag("--version", version_string());
  InfoOptions info_opt;
  DemoOptions demo_opt;
  BenchAttentionOptions bench_attn_opt;
  BenchMlrOptions bench_mlr_opt;
  BenchMonarchOptions bench_monarch_opt;
  BenchStructuredOptions bench_structured_opt;
  CLI::App* info = add_info(app, info_opt);
  CLI::App* demo = add_demo(app, demo_opt);
  ConvertOptions convert_opt;
  CLI::App* convert = add_convert(app, convert_opt);
  EmbedOptions embed_opt;
  CLI::App* embed = add_embed(app, embed_opt);
  TrainOptions train_opt;
  CLI::App* train = add_train(app, train_opt);
  EvalOptions eval_opt;
  CLI::App* eval = add_eval(app, eval_opt);
  GenerateOptions generate_opt;
  CLI::App* generate = add_generate(app, generate_opt);
  ExperimentOptions experiment_opt;
  CLI::App* experiment = add_experiment(app, experiment_opt);
  PlotRunsOptions plot_opt;
  CLI::App* plot = add_plot_runs(app, plot_opt);
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks against peers (table + JSON)");
  CLI::App* bench_attn = add_bench_attention(*bench, bench_attn_opt);
  CLI::App* bench_mlr = add_bench_mlr(*bench, bench_mlr_opt);
  CLI::App* bench_monarch = add_bench_monarch(*bench, bench_monarch_opt);
  CLI::App* bench_structured = add_bench_structured(*bench, bench_structured_opt);
  BenchTrainOptions bench_train_opt;
  CLI::App* bench_train = add_bench_train(*bench, bench_train_opt);
  BenchMemoryOptions bench_memory_opt;
  CLI::App* bench_memory = add_bench_memory(*bench, bench_memory_opt);
  CLI11_PARSE(app, argc, argv);

  try {
    // STRATA_TORCH_OPS=1: every custom op through strata::torch's torch-op path (the ATen ops a
    // CUDA device runs), to check that path on the CPU (scripts/gpu_paper.sh does, before a GPU).
    if (const char* ops = std::getenv("STRATA_TORCH_OPS"); ops != nullptr && *ops != '\0') {
      const std::string v = ops;
      STRATA_CHECK(v == "0" || v == "1", "environment variable STRATA_TORCH_OPS: expected 0 or 1, got \"", v, "\"");
      if (v == "1") {
        strata::torch::set_use_torch_ops(true);
        fmt::print(stderr, "strata: STRATA_TORCH_OPS=1: the custom ops run through the torch-op path (ATen ops)\n");
      }
    }
    // bench memory measures resident memory: its processes keep glibc's own policy and a cold heap
    const bool timing_bench = *bench && !*bench_memory;
    if (*train || *eval || *generate || *experiment || *embed || *convert || timing_bench) {
      const bool kept = keep_freed_memory();
      // 512 MB: many times the outputs under 32 MB that a bench group holds at once (N = 4096, 12 heads:
      // 12 MB each), so every timed call's come from warmed pages
      if (timing_bench && kept) warm_heap(int64_t(512) << 20);
    }
    if (*info) return run_info(info_opt);
    if (*demo) return run_demo(demo_opt);
    if (*convert) return run_convert(convert_opt);
    if (*embed) return run_embed(embed_opt);
    if (*train) return run_train(train_opt);
    if (*eval) return run_eval(eval_opt);
    if (*generate) return run_generate(generate_opt);
    if (*plot) return run_plot_runs(plot_opt);
    if (*experiment) return run_experiment(experiment_opt);
    if (*bench_attn) return run_bench_attention(bench_attn_opt);
    if (*bench_mlr) return run_bench_mlr(bench_mlr_opt);
    if (*bench_monarch) return run_bench_monarch(bench_monarch_opt);
    if (*bench_structured) return run_bench_structured(bench_structured_opt);
    if (*bench_train) return run_bench_train(bench_train_opt);
    if (*bench_memory) return run_bench_memory(bench_memory_opt);
    // No command given (CLI11 has already rejected unknown words): say so and show the usage.
    CLI::App* where = *bench ? bench : &app;
    std::string names;
    for (const CLI::App* sub : where->get_subcommands({})) names += (names.empty() ? "" : ", ") + sub->get_name();
    fmt::print(stderr, "{}: expected a command ({}), got none\n\n{}", *bench ? "strata bench" : "strata", names,
               where->help());
    return 2;
  } catch (const strata::Error& e) {
    fmt::print(stderr, "strata: error: {}\n", e.what());
    return 1;
  } catch (const c10::Error& e) {
    fmt::print(stderr, "strata: torch error: {}\n", e.what_without_backtrace());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "strata: error: {}\n", e.what());
    return 1;
  }
  return 0;
}
