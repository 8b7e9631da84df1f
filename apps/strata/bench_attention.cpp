// apps/strata/bench_attention.cpp: `strata bench attention`: dense attention, strata vs torch
// SDPA, swept over sequence length at fixed total tokens (FlashAttention's convention).
//
// Full sweep: N in {256, ..., 16384}, batch = max(1, 16384 / N), 8 heads, head_dim 64 and 128,
// causal and not, forward and forward+backward, float32 and bfloat16 (112 rows, 7 rounds each:
// hours on 2 cores; 80 minutes with the former 3 rounds on a busy machine). --quick: 8 rows (fp32
// fwd N 1024/4096 causal and not, fp32 fwd+bwd N 1024/4096, bf16 fwd N 4096 causal and not), 5
// rounds each, about 1.5 minutes on 2 idle cores (51 s with the former 3). Timing and the check of
// the timed outputs: bench_harness.h, through run_attention_row.
//
// --shared-q: instead, a query shared by all 8 heads (Bilinear BTT attention: the raw block input
// attends against every head's keys with head dim = model width): strata gets q with one head,
// SDPA gets it expand()ed to the 8 heads. N in {256, 1024, 4096} at 4096 tokens (batch 4096 / N),
// head_dim 256 and 1024, causal and not, fwd and fwd+bwd, float32 and bfloat16 (48 rows; --quick:
// the 4 float32 non-causal rows at N = 1024).
//
// bfloat16 rows run strata with its default compute (bf16 products on AMX-BF16, or AVX512-BF16
// where it outruns fp32 FMAs, strata/cpu.h) and, in the same rounds, the same call with compute = fp32; a line
// under the row gives both times, their paired ratio, and the error of ours, of ours in fp32
// compute and of SDPA bf16 against the double reference on batch 0, head 0 (rows up to
// --ref-max-seq tokens; attention_runner.h).
#include <fmt/core.h>

#include <algorithm>
#include <chrono>

#include "attention_runner.h"
#include "bench_common.h"
#include "commands.h"
#include "session.h"
#include "strata/error.h"

namespace strata::app {
namespace {

constexpr int64_t kTotalTokens = 16384;
constexpr int64_t kSharedQTokens = 4096;  // --shared-q rows: head dims 4-16x the sweep's, fewer tokens
constexpr int64_t kHeads = 8;

// One case of the sweep: batch from the fixed token budget.
AttnCase sweep_case(int64_t n, int64_t d, bool causal, bool backward, at::ScalarType dtype,
                    int64_t total_tokens = kTotalTokens) {
  AttnCase c;
  c.batch = std::max<int64_t>(1, total_tokens / n);
  c.heads = kHeads;
  c.seq = n;
  c.head_dim = d;
  c.causal = causal;
  c.backward = backward;
  c.dtype = dtype;
  return c;
}

// The rows of the sweep, in table order (dtype, pass, head_dim, causal, N).
std::vector<AttnCase> attention_sweep(bool quick) {
  std::vector<AttnCase> cases;
  if (quick) {  // the rows the targets in docs/results.md are stated on, plus N = 1024
    for (bool causal : {false, true})
      for (int64_t n : {1024, 4096}) cases.push_back(sweep_case(n, 64, causal, false, at::kFloat));
    cases.push_back(sweep_case(1024, 64, false, true, at::kFloat));
    cases.push_back(sweep_case(4096, 64, false, true, at::kFloat));
    for (bool causal : {false, true}) cases.push_back(sweep_case(4096, 64, causal, false, at::kBFloat16));
    return cases;
  }
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16})
    for (bool backward : {false, true})
      for (int64_t d : {64, 128})
        for (bool causal : {false, true})
          for (int64_t n : {256, 512, 1024, 2048, 4096, 8192, 16384})
            cases.push_back(sweep_case(n, d, causal, backward, dtype));
  return cases;
}

// The rows of --shared-q (the file comment), in table order (dtype, pass, head_dim, causal, N).
std::vector<AttnCase> shared_query_sweep(bool quick) {
  std::vector<AttnCase> cases;
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16})
    for (bool backward : {false, true})
      for (int64_t d : {256, 1024})
        for (bool causal : {false, true})
          for (int64_t n : {256, 1024, 4096}) {
            if (quick && (dtype != at::kFloat || causal || n != 1024)) continue;
            cases.push_back(sweep_case(n, d, causal, backward, dtype, kSharedQTokens));
            cases.back().shared_q = true;
          }
  return cases;
}

// True when `c` passes the --seq / --head-dim / --dtype / --pass filters (empty = no filter).
bool selected(const AttnCase& c, const BenchAttentionOptions& o) {
  const auto has = [](const auto& list, const auto& x) {
    return list.empty() || std::find(list.begin(), list.end(), x) != list.end();
  };
  const std::string dtype = c.dtype == at::kBFloat16 ? "bfloat16" : "float32";
  const std::string pass = c.backward ? "fwd+bwd" : "fwd";
  return has(o.seq, c.seq) && has(o.head_dim, c.head_dim) && has(o.dtype, dtype) && has(o.pass, pass);
}

}  // namespace

CLI::App* add_bench_attention(CLI::App& bench, BenchAttentionOptions& o) {
  CLI::App* cmd = bench.add_subcommand(
      "attention",
      "Dense attention: strata's flash kernel vs torch scaled_dot_product_attention (same tensors,\n"
      "same process, same threads, interleaved timing, correctness checked on every row)");
  cmd->add_flag("--quick", o.quick, "8-row subset (N 1024/4096, d 64), about 1.5 minutes on 2 idle cores");
  cmd->add_flag("--shared-q", o.shared_q,
                "rows of one query shared by 8 heads (Bilinear BTT attention) at head_dim 256 and 1024,\n"
                "4096 tokens; the peer is SDPA on q.expand() to the heads (--quick: 4 float32 rows)");
  cmd->add_option("--seq", o.seq, "keep only rows with these sequence lengths (repeatable)")->type_name("N");
  cmd->add_option("--head-dim", o.head_dim, "keep only rows with these head dims (repeatable)")->type_name("D");
  cmd->add_option("--dtype", o.dtype, "keep only rows of these dtypes (repeatable)")
      ->check(CLI::IsMember({"float32", "bfloat16"}));
  cmd->add_option("--pass", o.pass, "keep only rows of these passes (repeatable)")
      ->check(CLI::IsMember({"fwd", "fwd+bwd"}));
  cmd->add_option("--ref-max-seq", o.ref_max_seq,
                  "bfloat16 rows: the error against the double reference (batch 0, head 0; seq x seq in\n"
                  "double) only up to this many tokens (default 4096; 0: none)")
      ->check(CLI::NonNegativeNumber);
  add_bench_output_options(cmd, o.json, o.csv, o.threads, o.reps, "row",
                           "timed rounds per row (ABBA order) after one warm-up (default 7, 5 with --quick;\n"
                           "more rounds are cut back on rows over 8 s, never under those)");
  return cmd;
}

int run_bench_attention(const BenchAttentionOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<AttnCase> cases;
  for (AttnCase c : o.shared_q ? shared_query_sweep(o.quick) : attention_sweep(o.quick))
    if (selected(c, o)) {
      c.ref_max_seq = o.ref_max_seq;
      cases.push_back(c);
    }
  STRATA_CHECK(!cases.empty(), "strata bench attention: arguments '--seq', '--head-dim', '--dtype', '--pass': "
               "expected a selection that keeps at least one row of the ", o.quick ? "quick" : "full",
               o.shared_q ? " --shared-q" : "", " sweep, got none");
  const int threads = configure_threads(o.threads);
  fmt::print("measuring the fp32 FMA peak on {} threads...\n", threads);
  std::fflush(stdout);
  BenchReport rep = new_report("attention", threads);
  print_preamble(rep);

  // 7 rounds per row (5 with --quick); rows whose warm-up pair x rounds exceeds 8 s are cut
  // towards that, never under the floor.
  const TimingPlan plan = bench_timing_plan(o.reps, o.quick, false, 8.0);
  fmt::print("{} rows, {} timed rounds each (ABBA order, after a warm-up), ours = strata.flash (layout bhsd), "
             "peer = torch.sdpa{}\n", cases.size(), plan.reps,
             o.shared_q ? " (q expanded to the heads; ours reads the one shared q)" : "");
  print_table_header();
  for (const AttnCase& c : cases) {
    rep.rows.push_back(run_attention_row(c, plan));
    print_table_row(rep.rows.back(), rep.peak.all_gflops);
    if (const std::string line = bf16_compute_line(rep.rows.back()); !line.empty()) fmt::print("{}\n", line);
    if (!o.json.empty()) write_json(rep, o.json);
  }
  // A busy moment at the start would understate the peak (and overstate every % of peak):
  // finish_report measures again and keeps the higher of the two in the JSON.
  finish_report(rep, threads, o.json, o.csv);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return print_run_summary(rep, "strata bench attention", o.json, o.csv, secs);
}

}  // namespace strata::app
