// apps/strata/bench_common.cpp: shared pieces of the structured-attention benches.
#include "bench_common.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "commands.h"
#include "files.h"
#include "strata/error.h"

namespace strata::app {

// CLI11 check of an output FILE, run when the command line is parsed (before any row): the
// results of a long run must not be lost to a typo found at the first write.
CLI::Validator writable_file() {
  return CLI::Validator(
      [](std::string& path) {
        const std::string why = unwritable_reason(path);
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

int group_reps(int reps, double round_s, double budget_s) {
  if (reps <= 3 || round_s * reps <= budget_s) return reps;
  return std::max(3, int(budget_s / std::max(round_s, 1e-9)));
}

void set_row_times(BenchRow& row, const std::vector<double>& ours_s, const std::vector<double>& peer_s) {
  STRATA_CHECK(!ours_s.empty() && (ours_s.size() == peer_s.size() || peer_s.size() == 1),
               "set_row_times: expected non-empty timings, the peer's one or as many as ours, got ", ours_s.size(),
               " and ", peer_s.size());
  row.ours = time_stats(ours_s);
  row.peer_time = time_stats(peer_s);
  if (peer_s.size() != ours_s.size()) {
    row.speedup = peer_s[0] / row.ours.median_s;
    return;
  }
  std::vector<double> ratios;
  for (size_t i = 0; i < ours_s.size(); ++i) ratios.push_back(peer_s[i] / ours_s[i]);
  row.speedup = median(ratios);
}

std::vector<std::vector<double>> warm_check_time(const std::vector<std::function<void()>>& fns, int reps,
                                                 double budget_s, const std::function<void()>& check,
                                                 const std::vector<bool>& once_if_slow) {
  std::vector<double> warm;
  for (const auto& fn : fns) warm.push_back(warm_up(fn));
  check();
  std::vector<std::function<void()>> timed;
  std::vector<size_t> index;  // fns index of timed[i]
  double round_s = 0;
  for (size_t i = 0; i < fns.size(); ++i) {
    if (i < once_if_slow.size() && once_if_slow[i] && warm[i] > kSlowPeerS) continue;
    timed.push_back(fns[i]);
    index.push_back(i);
    round_s += warm[i];
  }
  const auto t = time_round_robin(timed, group_reps(reps, round_s, budget_s));
  std::vector<std::vector<double>> secs(fns.size());
  for (size_t i = 0; i < fns.size(); ++i) secs[i] = {warm[i]};
  for (size_t i = 0; i < timed.size(); ++i) secs[index[i]] = t[i];
  return secs;
}

void print_peer_table_header() {
  fmt::print("(rel_err: ours vs the reference named in the JSON's checked_against; ok: under the tolerance;\n"
             " speedup: median of paired peer / ours times; GFLOP/s: each method's own FLOPs)\n");
  fmt::print("{:<11} {:<30} {:<22} {:<3} {:>8} {:>9} {:>9} {:>8} {:>7} {:>6} {:>7}  {}\n", "case", "shape", "peer",
             "ok", "rel_err", "ours ms", "peer ms", "speedup", "GF/s", "%peak", "peerGF", "note");
  fmt::print("{}\n", std::string(140, '-'));
  std::fflush(stdout);
}

void print_peer_table_row(const BenchRow& row, double peak_gflops, const std::string& note) {
  const double gf = row_gflops(row, false);
  const double err = row.ref_max_rel_err ? *row.ref_max_rel_err : row.max_rel_err;
  fmt::print("{:<11} {:<30} {:<22} {:<3} {:>8.1e} {:>9.3f} {:>9.3f} {:>7.2f}x {:>7.1f} {:>6.1f} {:>7.1f}  {}\n",
             row.case_name, row.shape_label, row.peer, row.correct ? "yes" : "NO", err, row.ours.median_s * 1e3,
             row.peer_time.median_s * 1e3, row.speedup, gf, peak_gflops > 0 ? 100.0 * gf / peak_gflops : 0.0,
             row_gflops(row, true), note);
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
