// apps/strata/bench_common.cpp: shared pieces of the structured-attention benches.
#include "bench_common.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "commands.h"
#include "data/files.h"
#include "strata/error.h"

namespace strata::app {

// CLI11 check of an output FILE, run when the command line is parsed (before any row): the
// results of a long run must not be lost to a typo found at the first write.
CLI::Validator writable_file() {
  return CLI::Validator(
      [](std::string& path) {
        const std::string why = data::unwritable_reason(path);
        return why.empty() ? std::string() : "cannot write '" + path + "': " + why;
      },
      "FILE", "writable file");
}

void add_bench_output_options(CLI::App* cmd, std::string& json, std::string& csv, int& threads, int& reps,
                              const std::string& json_unit, const std::string& reps_help) {
  cmd->add_option("--json", json, "write the results as JSON to FILE (rewritten after every " + json_unit + ")")
      ->type_name("FILE")
      ->check(writable_file());
  cmd->add_option("--csv", csv, "also write the rows as CSV to FILE")->type_name("FILE")->check(writable_file());
  cmd->add_option("--threads", threads, "threads for strata and torch (default: STRATA_NUM_THREADS or all)")
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--reps", reps, reps_help)->check(CLI::Range(1, 100000));
}

void set_row_times(BenchRow& row, const std::vector<double>& ours_s, const std::vector<double>& peer_s) {
  row.speedup = paired_ratio_stats(ours_s, peer_s);
  row.ours = time_stats(ours_s);
  row.peer_time = time_stats(peer_s);
}

void print_peer_table_header() {
  fmt::print("(rel_err: ours' last timed call vs the reference named in the JSON's checked_against; ok: under\n"
             " the tolerance; speedup: median of the per-round peer / ours ratios, range: their min-max;\n"
             " GFLOP/s: each method's own FLOPs)\n");
  fmt::print("{:<11} {:<30} {:<22} {:<3} {:>8} {:>9} {:>9} {:>8} {:>11} {:>7} {:>6} {:>7}  {}\n", "case", "shape",
             "peer", "ok", "rel_err", "ours ms", "peer ms", "speedup", "range", "GF/s", "%peak", "peerGF", "note");
  fmt::print("{}\n", std::string(152, '-'));
  std::fflush(stdout);
}

void print_peer_table_row(const BenchRow& row, double peak_gflops, const std::string& note) {
  const double gf = row_gflops(row, false);
  const double err = row.ref_max_rel_err ? *row.ref_max_rel_err : row.max_rel_err;
  fmt::print("{:<11} {:<30} {:<22} {:<3} {:>8.1e} {:>9.3f} {:>9.3f} {:>7.2f}x {:>11} {:>7.1f} {:>6.1f} {:>7.1f}  {}\n",
             row.case_name, row.shape_label, row.peer, row.correct ? "yes" : "NO", err, row.ours.median_s * 1e3,
             row.peer_time.median_s * 1e3, row.speedup.median, speedup_range(row.speedup), gf,
             peak_gflops > 0 ? 100.0 * gf / peak_gflops : 0.0, row_gflops(row, true), note);
  std::fflush(stdout);
}

void print_targets(const std::vector<BenchTarget>& targets) {
  if (targets.empty()) return;
  fmt::print("\ntargets (informational; they do not change the exit status):\n");
  for (const BenchTarget& t : targets) {
    const char* op = t.at_most ? "<=" : ">=";
    if (!t.measured || !std::isfinite(*t.measured) || !std::isfinite(t.bound)) {
      fmt::print("  n/a   {}: {} {:.3g} (not measured in this run)\n", t.label, op, t.bound);
      continue;
    }
    const bool met = t.at_most ? *t.measured <= t.bound : *t.measured >= t.bound;
    fmt::print("  {}  {}: {:.3f} {} {:.3f}\n", met ? "PASS" : "FAIL", t.label, *t.measured, op, t.bound);
  }
  std::fflush(stdout);
}

void finish_report(BenchReport& rep, int threads, const std::string& json, const std::string& csv) {
  const FmaPeak end_peak = measure_fma_peak(threads);
  if (end_peak.all_gflops > rep.peak.all_gflops) {
    fmt::print("\nfp32 FMA peak re-measured at the end: {:.1f} GFLOP/s (start: {:.1f}); the JSON's % of peak "
               "uses the higher\n", end_peak.all_gflops, rep.peak.all_gflops);
    rep.peak.all_gflops = end_peak.all_gflops;
  }
  rep.peak.per_core_gflops = std::max(rep.peak.per_core_gflops, end_peak.per_core_gflops);
  if (!json.empty()) write_json(rep, json);
  if (!csv.empty()) write_csv(rep, csv);
}

int print_run_summary(const BenchReport& rep, const char* command, const std::string& json, const std::string& csv,
                      double seconds) {
  int wrong = 0;
  for (const BenchRow& r : rep.rows) wrong += !r.correct;
  fmt::print("\n{} of {} rows correct; {:.0f} s in all.", int(rep.rows.size()) - wrong, rep.rows.size(), seconds);
  if (!json.empty()) fmt::print(" JSON: {}", json);
  if (!csv.empty()) fmt::print(" CSV: {}", csv);
  fmt::print("\n");
  if (wrong) {
    fmt::print(stderr, "{}: {} row(s) failed the correctness check (ok = NO above)\n", command, wrong);
    return 1;
  }
  return 0;
}

}  // namespace strata::app
