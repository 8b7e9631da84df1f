// apps/strata/experiment.cpp: `strata experiment NAME` (models/experiment.h): the runs of one of the
// paper's experiments in sequence, resumable, then its plot / table (bench/plot_experiment.py).
#include <dirent.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/stat.h>

#include <algorithm>

#include "commands.h"
#include "data/files.h"
#include "models/experiment.h"
#include "plot.h"
#include "report.h"
#include "strata/error.h"

#ifndef STRATA_GIT_COMMIT
#define STRATA_GIT_COMMIT ""
#endif

namespace strata::app {
namespace {

std::string experiments_folder() { return std::string(STRATA_SOURCE_DIR) + "/configs/experiments"; }

// NAME: a path to an experiment file, or the name of one in configs/experiments.
std::string experiment_path(const std::string& name) {
  struct stat st {};
  if (name.find('/') != std::string::npos || (name.size() > 5 && name.compare(name.size() - 5, 5, ".toml") == 0))
    return name;
  const std::string path = experiments_folder() + "/" + name + ".toml";
  if (::stat(path.c_str(), &st) == 0) return path;
  std::vector<std::string> names;
  if (DIR* d = ::opendir(experiments_folder().c_str())) {
    while (const dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      if (n.size() > 5 && n.compare(n.size() - 5, 5, ".toml") == 0) names.push_back(n.substr(0, n.size() - 5));
    }
    ::closedir(d);
  }
  std::sort(names.begin(), names.end());
  std::string all;
  for (const auto& n : names) {
    if (!all.empty()) all += ", ";
    all += n;
  }
  throw Error("strata experiment: argument 'name': no experiment '" + name + "' (in " + experiments_folder() +
              ": " + (all.empty() ? "none" : all) + "; or give a path to an experiment file)");
}

}  // namespace

CLI::App* add_experiment(CLI::App& app, ExperimentOptions& o) {
  CLI::App* cmd = app.add_subcommand(
      "experiment", "Run one of the paper's experiments (configs/experiments/NAME.toml): its runs in sequence, "
                    "resumable, then summary.json and the plot / table");
  cmd->add_option("name", o.name, "icr | charlm | etth1, or the path of an experiment file")->required();
  cmd->add_option("--size", o.size, "smoke | cpu | paper (applied to every run)");
  cmd->add_option("--out", o.out, "the results folder (default results/NAME, results/NAME-SIZE for smoke / paper)");
  cmd->add_option("--only", o.only, "run only these labels (see --list)")->allow_extra_args(false);
  cmd->add_option("--set", o.sets, "override a key in every run, after the size's (e.g. train.device=cuda)")
      ->allow_extra_args(false);
  cmd->add_flag("--list", o.list, "print the runs, their --set overrides and the size's, run nothing");
  cmd->add_flag("--no-plot", o.no_plot, "skip the plot / table step");
  cmd->add_flag("--no-progress", o.no_progress, "no training progress lines");
  cmd->add_option("--stop-after", o.stop_after, "stop the first run after this many steps, as if killed (tests)")
      ->group("");  // hidden
  return cmd;
}

int run_experiment(const ExperimentOptions& o) {
  const models::Experiment e = models::load_experiment(experiment_path(o.name));
  const std::string out =
      !o.out.empty() ? o.out : "results/" + e.name + (o.size == "cpu" ? std::string() : "-" + o.size);
  if (o.list) {
    for (const auto& r : e.runs) {
      std::string sets;
      for (const auto& s : r.sets) sets += " --set '" + s + "'";
      fmt::print("{:<28} {:<20} {}{}\n", r.label, r.method, r.config, sets);
    }
    if (const auto it = e.sizes.find(o.size); it != e.sizes.end()) {
      fmt::print("size '{}': then --set {}\n", o.size, it->second.sets.empty() ? "(none)" : fmt::format("'{}'", fmt::join(it->second.sets, "' '")));
      for (const auto& [from, to] : it->second.map) fmt::print("size '{}': '{}' -> '{}'\n", o.size, from, fmt::join(to, "' '"));
    }
    if (!o.sets.empty()) fmt::print("then --set '{}' (every run)\n", fmt::join(o.sets, "' '"));
    if (!e.repeat_seeds.empty())
      fmt::print("then the best method by {} (lowest mean over its runs) again with seeds {}\n", e.repeat_metric,
                 fmt::join(e.repeat_seeds, ", "));
    return 0;
  }
  const std::string why = data::unwritable_reason(out + "/summary.json");
  STRATA_CHECK(why.empty(), "strata experiment: option '--out': cannot write into '", out, "': ", why);
  fmt::print(stderr, "strata experiment: {} ({} runs, size '{}') -> {}\n", e.name, e.runs.size(), o.size, out);
  models::ExperimentOptions x;
  x.out = out;
  x.size = o.size;
  x.only = o.only;
  x.sets = o.sets;
  x.stop_after = o.stop_after;
  x.progress = !o.no_progress;
  x.commit = STRATA_GIT_COMMIT;
  x.cpu = cpu_model();
  x.now = utc_now;
  x.say = [](const std::string& s) { fmt::print(stderr, "strata experiment: {}\n", s); };
  const auto res = models::run_experiment(e, x);
  if (res.stopped) return 0;
  fmt::print(stderr, "strata experiment: {} runs done here, {} skipped (already recorded); {}/summary.json has {}\n",
             res.ran, res.skipped, out, res.summary["runs"].size());
  if (!o.no_plot) {
    std::string why_plot;
    STRATA_CHECK(run_python_script(plot_script_path("plot_experiment.py"), {out + "/summary.json", out},
                                   &why_plot),
                 "strata experiment: the runs are recorded in ", out, "/summary.json, but the plot failed: ", why_plot,
                 " (rerun the command: the runs are skipped; or pass --no-plot)");
  }
  fmt::print("{}\n", nlohmann::json({{"out", out}, {"runs", res.summary["runs"].size()}, {"ran", res.ran},
                                     {"skipped", res.skipped}})
                         .dump());
  return 0;
}

}  // namespace strata::app
