// apps/strata/report.h: the benchmark result schema shared by every `strata bench ...` and the
// demo, its JSON / CSV writers and the readable table (timing: bench_harness.h).
//
// JSON: {"bench", "peak_gflops" (all-thread fp32 FMA peak; `bench` keeps the higher of the
//        measurements at its start and end), "peak_gflops_per_core", "peak_isa",
//        "threads", "cpu" (strata::cpu_summary()), "cpu_model", "torch_version", "date",
//        "rows": [{"case", "method", "peer", "shape" (object), "dtype", "correct", "max_rel_err",
//                  "median_s", "peer_median_s", "speedup_vs_peer", "speedup_min", "speedup_max",
//                  "speedup_q1", "speedup_q3", "gflops", "pct_of_peak",
//                  "min_s", "max_s", "peer_min_s", "peer_max_s", "reps", "flops", "peer_gflops",
//                  "tolerance", "checked_against", "ref_max_rel_err", "peer_ref_max_rel_err",
//                  optional: "peer_flops", and the row's `extra` fields}],
//        optional: "targets": [{"target", "bound", "at_most", "measured", "met"}]}
// correct: ours matched `checked_against` (the peer, or a reference named there) within
// `tolerance`; max_rel_err is always ours vs the peer (null when the peer computes another
// function: a dense baseline of a structured kernel); the ref_* errors are null when the peer
// was the reference.
// peer_flops: the peer's own FLOPs when it does different work (a dense baseline), else absent
// (= flops); peer_gflops uses it. extra: bench-specific numbers (e.g. "flop_ratio_total"),
// written as further fields of the row.
// speedup_vs_peer is the median over the timed rounds of peer_time / our_time, each pair measured
// in the same round (ABBA order, bench_harness.h), so slow drift of a shared machine cancels;
// speedup_min / speedup_max / speedup_q1 / speedup_q3 are the min, max and quartiles of those
// per-round ratios (speedup_min <= speedup_vs_peer <= speedup_max).
#pragma once
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_harness.h"
#include "peak.h"

namespace strata::app {

struct BenchRow {
  std::string case_name;          // what is computed, e.g. "fwd causal"
  std::string method, peer;       // e.g. "strata.flash", "torch.sdpa"
  nlohmann::ordered_json shape;   // problem sizes by name, e.g. {"batch": 4, "seq": 4096, ...}
  std::string shape_label;        // the same, short, for the table: "B=4 H=8 N=4096 D=64"
  std::string dtype;              // "float32" / "bfloat16"
  bool correct = false;           // our result matched `checked_against` within `tolerance`
  double max_rel_err = 0;         // max over outputs of max|ours - peer| / max|peer|
  double tolerance = 0;           // the bound the verdict used
  std::string checked_against;    // what decided `correct`: the peer, or a reference
  std::optional<double> ref_max_rel_err;       // ours vs that reference (when not the peer)
  std::optional<double> peer_ref_max_rel_err;  // the peer vs that reference
  double flops = 0;               // by the conventions of docs/methods.md
  std::optional<double> peer_flops;  // the peer's FLOPs when it does other work than ours
  TimeStats ours, peer_time;
  RatioStats speedup;             // paired peer/ours ratios: median (the row's speedup), min, max, quartiles
  nlohmann::ordered_json extra;   // object of further fields (null: none)
};

// One issue target: `measured` against `bound` (met when measured >= bound, or <= for at_most).
struct BenchTarget {
  std::string label;
  double bound = 0;
  std::optional<double> measured;  // absent: not measured in this run
  bool at_most = false;
};

struct BenchReport {
  std::string bench;
  FmaPeak peak;
  int threads = 1;
  std::string cpu, cpu_model, torch_version, date;
  std::vector<BenchRow> rows;
  std::vector<BenchTarget> targets;
};

// The CPU's model name and logical CPU count, e.g. "Intel(R) Xeon(R) Processor x 2" (from
// /proc/cpuinfo; "unknown" where it cannot be read).
std::string cpu_model();

// The date and time now, UTC, ISO 8601 ("2025-01-31T12:00:00Z").
std::string utc_now();

// The report as JSON (schema above).
nlohmann::ordered_json to_json(const BenchReport& r);

// Writes the JSON (2-space indent) to `path`, creating missing parent folders. Throws
// strata::Error naming the path when it cannot be written.
void write_json(const BenchReport& r, const std::string& path);

// Writes the rows as CSV (one header line, the JSON row fields; shape flattened to shape_label).
void write_csv(const BenchReport& r, const std::string& path);

// Warns on stderr when the all-threads peak is under 0.8 x threads x the one-thread peak (other
// processes are using the cores: every time measured now is suspect).
void warn_if_busy(const FmaPeak& p);

// Prints the report's preamble (machine, threads, peak, torch) to stdout.
void print_preamble(const BenchReport& r);

// "1.36-1.45": the min-max range of a row's paired ratios, for the tables.
std::string speedup_range(const RatioStats& s);

// Prints the table header line(s) to stdout.
void print_table_header();

// Prints one row as a table line (flushes, so long sweeps show progress). Its rel_err is the
// error that decided `correct` (ref_max_rel_err when set, else max_rel_err).
void print_table_row(const BenchRow& row, double peak_gflops);

// Achieved GFLOP/s of `row` (ours: peer = false).
double row_gflops(const BenchRow& row, bool peer);

}  // namespace strata::app
