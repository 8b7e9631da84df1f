// apps/strata/report.cpp: result schema -> JSON / CSV / table.
#include "report.h"

#include <fmt/core.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>

#include "strata/error.h"

namespace strata::app {

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line, model;
  int cpus = 0;
  while (std::getline(f, line)) {
    if (line.rfind("processor", 0) == 0) ++cpus;
    if (model.empty() && line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      const size_t b = colon == std::string::npos ? colon : line.find_first_not_of(" \t", colon + 1);
      if (b != std::string::npos) model = line.substr(b);
    }
  }
  if (model.empty()) return "unknown";
  return model + " x " + std::to_string(cpus);
}

double row_gflops(const BenchRow& row, bool peer) {
  const double s = peer ? row.peer_time.median_s : row.ours.median_s;
  const double flops = peer && row.peer_flops ? *row.peer_flops : row.flops;
  return s > 0 ? flops / s * 1e-9 : 0.0;
}

nlohmann::ordered_json to_json(const BenchReport& r) {
  nlohmann::ordered_json j;
  j["bench"] = r.bench;
  j["peak_gflops"] = r.peak.all_gflops;
  j["peak_gflops_per_core"] = r.peak.per_core_gflops;
  j["peak_isa"] = r.peak.isa;
  j["threads"] = r.threads;
  j["cpu"] = r.cpu;
  j["cpu_model"] = r.cpu_model;
  j["torch_version"] = r.torch_version;
  j["date"] = r.date;
  j["rows"] = nlohmann::ordered_json::array();
  for (const BenchRow& row : r.rows) {
    nlohmann::ordered_json o;
    const double gf = row_gflops(row, false);
    o["case"] = row.case_name;
    o["method"] = row.method;
    o["peer"] = row.peer;
    o["shape"] = row.shape;
    o["dtype"] = row.dtype;
    o["correct"] = row.correct;
    // JSON has no Inf/NaN: a non-finite error (NaN output) is written as null.
    if (std::isfinite(row.max_rel_err)) o["max_rel_err"] = row.max_rel_err;
    else o["max_rel_err"] = nullptr;
    o["median_s"] = row.ours.median_s;
    o["peer_median_s"] = row.peer_time.median_s;
    o["speedup_vs_peer"] = row.speedup.median;
    o["speedup_min"] = row.speedup.min;
    o["speedup_max"] = row.speedup.max;
    o["speedup_q1"] = row.speedup.q1;
    o["speedup_q3"] = row.speedup.q3;
    o["gflops"] = gf;
    o["pct_of_peak"] = r.peak.all_gflops > 0 ? 100.0 * gf / r.peak.all_gflops : 0.0;
    o["min_s"] = row.ours.min_s;
    o["max_s"] = row.ours.max_s;
    o["peer_min_s"] = row.peer_time.min_s;
    o["peer_max_s"] = row.peer_time.max_s;
    o["reps"] = row.ours.reps;
    o["flops"] = row.flops;
    o["peer_gflops"] = row_gflops(row, true);
    o["tolerance"] = row.tolerance;
    o["checked_against"] = row.checked_against;
    const auto opt_num = [](const std::optional<double>& x) {
      return x && std::isfinite(*x) ? nlohmann::ordered_json(*x) : nlohmann::ordered_json(nullptr);
    };
    o["ref_max_rel_err"] = opt_num(row.ref_max_rel_err);
    o["peer_ref_max_rel_err"] = opt_num(row.peer_ref_max_rel_err);
    if (row.peer_flops) o["peer_flops"] = *row.peer_flops;
    if (row.extra.is_object())
      for (const auto& [key, value] : row.extra.items()) o[key] = value;
    j["rows"].push_back(std::move(o));
  }
  if (!r.targets.empty()) {
    j["targets"] = nlohmann::ordered_json::array();
    for (const BenchTarget& t : r.targets) {
      nlohmann::ordered_json o;
      o["target"] = t.label;
      o["bound"] = t.bound;
      o["at_most"] = t.at_most;
      if (t.measured && std::isfinite(*t.measured)) o["measured"] = *t.measured;
      else o["measured"] = nullptr;
      o["met"] = t.measured && (t.at_most ? *t.measured <= t.bound : *t.measured >= t.bound);
      j["targets"].push_back(std::move(o));
    }
  }
  return j;
}

namespace {

// Opens `path` for writing, creating missing parent folders; throws naming the path.
std::ofstream open_for_write(const std::string& path, const char* where) {
  const std::filesystem::path p(path);
  std::error_code ec;
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path(), ec);
  STRATA_CHECK(!ec, where, ": cannot create the folder of '", path, "': ", ec.message());
  std::ofstream f(p);
  STRATA_CHECK(f.good(), where, ": cannot open '", path, "' for writing: ", std::strerror(errno));
  return f;
}

}  // namespace

void write_json(const BenchReport& r, const std::string& path) {
  std::ofstream f = open_for_write(path, "write_json");
  f << to_json(r).dump(2) << "\n";
  STRATA_CHECK(f.good(), "write_json: writing '", path, "' failed");
}

void write_csv(const BenchReport& r, const std::string& path) {
  std::ofstream f = open_for_write(path, "write_csv");
  const nlohmann::ordered_json j = to_json(r);
  f << "case,method,peer,shape,dtype,correct,max_rel_err,median_s,peer_median_s,speedup_vs_peer,"
       "speedup_min,speedup_max,speedup_q1,speedup_q3,gflops,pct_of_peak,min_s,max_s,peer_min_s,peer_max_s,"
       "reps,flops,peer_gflops,tolerance,checked_against,"
       "ref_max_rel_err,peer_ref_max_rel_err\n";
  for (size_t i = 0; i < r.rows.size(); ++i) {
    const auto& o = j["rows"][i];
    const auto num = [&](const char* k) { return o[k].is_null() ? std::string("nan") : o[k].dump(); };
    f << o["case"].get<std::string>() << ',' << o["method"].get<std::string>() << ','
      << o["peer"].get<std::string>() << ',' << r.rows[i].shape_label << ','
      << o["dtype"].get<std::string>() << ',' << (r.rows[i].correct ? "true" : "false");
    for (const char* k : {"max_rel_err", "median_s", "peer_median_s", "speedup_vs_peer", "speedup_min",
                          "speedup_max", "speedup_q1", "speedup_q3", "gflops",
                          "pct_of_peak", "min_s", "max_s", "peer_min_s", "peer_max_s", "reps", "flops",
                          "peer_gflops", "tolerance"})
      f << ',' << num(k);
    f << ',' << r.rows[i].checked_against << ',' << num("ref_max_rel_err") << ',' << num("peer_ref_max_rel_err");
    f << '\n';
  }
  STRATA_CHECK(f.good(), "write_csv: writing '", path, "' failed");
}

void warn_if_busy(const FmaPeak& p) {
  std::fflush(stdout);
  if (p.threads > 1 && p.all_gflops < 0.8 * p.threads * p.per_core_gflops)
    fmt::print(stderr,
               "warning: the {}-thread FMA peak is only {:.2f}x the one-thread peak: other processes are\n"
               "         using the cores, so times (ours and the peer's) and % of peak are unreliable\n\n",
               p.threads, p.all_gflops / p.per_core_gflops);
}

void print_preamble(const BenchReport& r) {
  fmt::print("bench:   {}\n", r.bench);
  fmt::print("date:    {}\n", r.date);
  fmt::print("cpu:     {} ({})\n", r.cpu_model, r.cpu);
  fmt::print("threads: {} (strata and torch)\n", r.threads);
  fmt::print("peak:    {:.1f} GFLOP/s fp32 FMA on {} threads, {:.1f} GFLOP/s on one ({} loop)\n",
             r.peak.all_gflops, r.threads, r.peak.per_core_gflops, r.peak.isa);
  fmt::print("torch:   {}\n\n", r.torch_version);
  warn_if_busy(r.peak);
}

std::string speedup_range(const RatioStats& s) { return fmt::format("{:.2f}-{:.2f}", s.min, s.max); }

void print_table_header() {
  fmt::print("(rel_err: max|ours - ref| / max|ref| over the outputs of the last timed call, ref = the peer, or\n"
             " the reference the row names in the JSON's checked_against; ok: rel_err under the dtype's tolerance;\n"
             " speedup: median of the per-round peer / ours ratios, range: their min-max)\n");
  fmt::print("{:<15} {:<9} {:<24} {:<4} {:>8} {:>10} {:>10} {:>8} {:>11} {:>8} {:>6} {:>9}\n", "case", "dtype",
             "shape", "ok", "rel_err", "ours ms", "peer ms", "speedup", "range", "GFLOP/s", "%peak", "peer GF/s");
  fmt::print("{}\n", std::string(15 + 9 + 24 + 4 + 8 + 10 + 10 + 8 + 11 + 8 + 6 + 9 + 11, '-'));
  std::fflush(stdout);
}

void print_table_row(const BenchRow& row, double peak_gflops) {
  const double gf = row_gflops(row, false);
  fmt::print("{:<15} {:<9} {:<24} {:<4} {:>8.1e} {:>10.2f} {:>10.2f} {:>7.2f}x {:>11} {:>8.1f} {:>6.1f} {:>9.1f}\n",
             row.case_name, row.dtype, row.shape_label, row.correct ? "yes" : "NO",
             row.ref_max_rel_err ? *row.ref_max_rel_err : row.max_rel_err, row.ours.median_s * 1e3,
             row.peer_time.median_s * 1e3, row.speedup.median, speedup_range(row.speedup), gf,
             peak_gflops > 0 ? 100.0 * gf / peak_gflops : 0.0, row_gflops(row, true));
  std::fflush(stdout);
}

}  // namespace strata::app
