// apps/strata/convert.cpp: `strata convert` (convert.h): options, the table, the JSON and the plot
// around models::run_conversion.
#include "convert.h"

#include <fmt/core.h>
#include <fmt/ranges.h>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "data/files.h"
#include "plot.h"
#include "session.h"
#include "strata/error.h"
#include "strata/threading.h"

namespace strata::app {

namespace {

// Prints the header once the inputs are known (no rows yet), else the newest row.
void print_progress(const models::ConversionReport& r, const std::vector<int64_t>& long_lengths, int64_t passages) {
  if (r.rows.empty()) {
    fmt::print("model {} ({} layers, {} heads of {}); STS-B test: {} pairs; passages: {} x N in {}\n", r.model_dir,
               r.layers, r.heads, r.head_dim, r.sts_pairs_used, passages, fmt::join(long_lengths, "/"));
    fmt::print("\n{:<34} {:>8} {:>7} {:>9}", "method@layers", "STS rho", "% soft", "FLOPs/%");
    for (int64_t n : long_lengths) fmt::print(" {:>7} {:>6}", fmt::format("cos{}", n), "FLOP%");
    fmt::print(" {:>6}\n", "secs");
  } else {
    const models::ConversionRow& row = r.rows.back();
    fmt::print("{:<34} {:>8.2f} {:>6.1f}% {:>8.1f}%", row.method.label(), row.sts_spearman, row.sts_pct_of_softmax,
               100 * row.sts_flop_fraction);
    for (const auto& c : row.long_cells) fmt::print(" {:>7.4f} {:>5.1f}%", c.cosine_mean, 100 * c.flop_fraction);
    fmt::print(" {:>6.1f}\n", row.seconds);
  }
  std::fflush(stdout);
}

nlohmann::ordered_json row_json(const models::ConversionRow& row) {
  nlohmann::ordered_json j;
  j["method"] = row.method.label();
  j["spec"] = models::to_string(row.method.spec);
  j["kind"] = models::kind_name(row.method.spec.kind);
  j["layers"] = row.method.layers.empty() ? nlohmann::ordered_json("all") : nlohmann::ordered_json(row.method.layers);
  j["sts_spearman"] = row.sts_spearman;
  j["sts_pct_of_softmax"] = row.sts_pct_of_softmax;
  j["sts_attn_flops_mean"] = row.sts_attn_flops_mean;
  j["sts_flop_fraction"] = row.sts_flop_fraction;
  nlohmann::ordered_json longs = nlohmann::ordered_json::array();
  for (const auto& c : row.long_cells)
    longs.push_back({{"n", c.n}, {"cosine_mean", c.cosine_mean}, {"cosine_min", c.cosine_min},
                     {"attn_flops", c.attn_flops}, {"flop_fraction", c.flop_fraction}});
  j["long"] = longs;
  j["seconds"] = row.seconds;
  return j;
}

nlohmann::ordered_json report_json(const models::ConversionReport& r, const models::ConversionConfig& cfg) {
  nlohmann::ordered_json j;
  j["bench"] = "convert";
  j["model"] = r.model_dir;
  j["date"] = utc_now();
  j["threads"] = strata::get_num_threads();
  j["torch_version"] = torch_version();
  j["sts"] = {{"file", r.sts_path}, {"pairs", r.sts_pairs_used}, {"softmax_spearman", r.softmax_spearman},
              {"softmax_attn_flops_mean", r.softmax_sts_attn_flops_mean}};
  j["long"] = {{"file", r.text_path}, {"lengths", cfg.long_lengths}, {"passages", cfg.passages}};
  j["flops"] =
      "2 x the multiply-accumulates of the attention matmuls per sequence, all layers (models/attention_zoo.h)";
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  for (const auto& row : r.rows) rows.push_back(row_json(row));
  j["rows"] = rows;
  const bool has_long = r.n512_best_monarch_cosine > -2;
  j["targets"] = {{"best_monarch", r.best_monarch},
                  {"best_monarch_spearman", r.best_monarch_spearman},
                  {"best_monarch_below_softmax_flops", r.best_cheap_monarch},
                  {"best_monarch_below_softmax_flops_spearman", r.best_cheap_monarch_spearman},
                  {"best_monarch_below_softmax_flops_fraction", r.best_cheap_monarch_fraction},
                  {"sts_best_monarch_ge_97pct", r.sts_target},
                  {"n512_monarch_le_35pct_flops_cos_ge_095", r.long_target},
                  {"n512_best_monarch_cosine", has_long ? nlohmann::ordered_json(r.n512_best_monarch_cosine) : nullptr},
                  {"n512_baselines_at_ge_flops_lower", r.baselines_lower},
                  {"n512_baselines_compared", r.baselines_compared}};
  return j;
}

void print_convert_targets(const models::ConversionReport& r) {
  const double soft = r.softmax_spearman;
  fmt::print("\ntargets: best Monarch STS {} = {:.2f} ({:.1f}% of softmax {:.2f}; need >= 97%): {}\n", r.best_monarch,
             r.best_monarch_spearman, 100 * r.best_monarch_spearman / soft, soft, r.sts_target ? "PASS" : "FAIL");
  if (!r.best_cheap_monarch.empty())
    fmt::print("         best Monarch with fewer STS attention FLOPs than softmax: {} = {:.2f} ({:.1f}% of softmax) at "
               "{:.1f}% of the FLOPs\n",
               r.best_cheap_monarch, r.best_cheap_monarch_spearman, 100 * r.best_cheap_monarch_spearman / soft,
               100 * r.best_cheap_monarch_fraction);
  if (r.has_512) {
    fmt::print("         N=512 best Monarch at <= 35% FLOPs: mean cosine {:.4f} at {:.1f}% (need >= 0.95): {}\n",
               r.n512_best_monarch_cosine, 100 * r.n512_best_monarch_fraction, r.long_target ? "PASS" : "FAIL");
    fmt::print("         N=512 Nystromformer / Performer at >= that FLOP fraction score lower ({} cells): {}\n",
               r.baselines_compared, r.baselines_lower ? "PASS" : "FAIL");
  }
}

}  // namespace

models::ConversionReport convert_and_report(const models::ConversionConfig& cfg, const std::string& out_dir,
                                            bool plot) {
  const char* where = "strata convert";
  // The output before any work: a typo must not cost a whole run.
  const std::string json_path = out_dir + "/convert.json";
  const std::string out_why = data::unwritable_reason(json_path);
  STRATA_CHECK_ARG(out_why.empty(), where, "--out", "a folder where convert.json can be written",
                   ::strata::detail::cat("'", out_dir, "' (", out_why, ")"));
  const models::ConversionReport r = models::run_conversion(
      cfg, [&](const models::ConversionReport& so_far) { print_progress(so_far, cfg.long_lengths, cfg.passages); });
  data::write_file_atomic(json_path, report_json(r, cfg).dump(2) + "\n", where);
  print_convert_targets(r);
  fmt::print("wrote {}\n", json_path);
  if (plot) {
    const std::string png = out_dir + "/convert.png";
    std::string why;
    if (run_python_script(plot_script_path("plot_convert.py"), {json_path, png, "--quiet"}, &why))
      fmt::print("wrote {}\n", png);
    else
      fmt::print("no plot: {}\n", why);
  }
  return r;
}

CLI::App* add_convert(CLI::App& app, ConvertOptions& o) {
  CLI::App* cmd = app.add_subcommand(
      "convert", "Zero-shot conversion of all-MiniLM-L6-v2: STS-B and long-passage fidelity vs attention FLOPs");
  cmd->add_option("--method", o.methods,
                  "a row: <spec>[@layers], e.g. monarch:T=2,B=8@3,4,5 (repeatable; default: the full list; "
                  "the first must be softmax)")
      ->type_name("SPEC");
  cmd->add_flag("--quick", o.quick, "fewer methods, 300 STS pairs, 4 passages per length (~1 minute)");
  cmd->add_option("--sts-pairs", o.sts_pairs, "use the first n STS-B test pairs (default: all 1,379)")
      ->check(CLI::Range(int64_t(2), int64_t(1) << 40));
  cmd->add_option("--long-n", o.long_lengths, "passage lengths in tokens (default 128 256 512)")
      ->check(CLI::Range(3, 512));
  cmd->add_option("--passages", o.passages, "passages per length (default 16)")->check(CLI::Range(1, 1000));
  cmd->add_option("--out", o.out, "folder for convert.json and convert.png")->capture_default_str()->type_name("DIR");
  cmd->add_option("--threads", o.threads, "threads for strata and torch (default: STRATA_NUM_THREADS or all)")
      ->check(CLI::Range(1, 4096));
  cmd->add_flag("--no-plot", o.no_plot, "do not run the plot script");
  return cmd;
}

int run_convert(const ConvertOptions& o) {
  configure_threads(o.threads);
  models::ConversionConfig cfg;
  cfg.methods = o.quick ? models::quick_conversion_methods() : models::default_conversion_methods();
  if (!o.methods.empty()) {
    cfg.methods.clear();
    cfg.methods_name = "--method";
    for (const auto& m : o.methods) {
      try {
        cfg.methods.push_back(models::parse_conversion_method(m));
      } catch (const Error& e) {
        throw Error("strata convert: argument '--method' (\"" + m + "\"): " + e.what());
      }
    }
  }
  if (o.quick) {
    cfg.sts_pairs = 300;
    cfg.passages = 4;
  }
  if (o.sts_pairs > 0) cfg.sts_pairs = o.sts_pairs;
  if (o.passages > 0) cfg.passages = o.passages;
  if (!o.long_lengths.empty()) cfg.long_lengths = o.long_lengths;
  fmt::print("{}\n", version_string());
  convert_and_report(cfg, o.out, !o.no_plot);
  return 0;
}

}  // namespace strata::app
