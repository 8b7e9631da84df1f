// models/experiment.cpp: experiment files, the run loop and OUT/summary.json (experiment.h).
#include "models/experiment.h"

#include <toml++/toml.h>

#include <cctype>
#include <chrono>
#include <fstream>
#include <set>
#include <sstream>

#include "data/files.h"
#include "data/shared_files.h"
#include "models/checkpoint.h"
#include "models/train_config.h"
#include "models/trainer.h"
#include "strata/error.h"

namespace strata::models {
namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void bad(const std::string& path, const std::string& key, const std::string& what) {
  throw Error("experiment '" + path + "': key '" + key + "': " + what);
}

// "a/b/../c/./d" -> "a/c/d" (lexically; a leading "/" kept).
std::string normalize_path(const std::string& p) {
  std::vector<std::string> parts;
  std::stringstream ss(p);
  for (std::string part; std::getline(ss, part, '/');) {
    if (part.empty() || part == ".") continue;
    if (part == ".." && !parts.empty() && parts.back() != "..") parts.pop_back();
    else parts.push_back(part);
  }
  std::string out = !p.empty() && p[0] == '/' ? "/" : "";
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i) out += '/';
    out += parts[i];
  }
  return out;
}

std::string folder_of(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

std::string string_of(const toml::table& t, const std::string& key, const std::string& where, const std::string& path,
                      bool required) {
  const auto* n = t.get(key);
  if (!n) {
    if (required) bad(path, where + key, "required (a string)");
    return "";
  }
  if (!n->is_string() || n->as_string()->get().empty()) bad(path, where + key, "expected a non-empty string");
  return n->as_string()->get();
}

std::vector<std::string> strings_of(const toml::table& t, const std::string& key, const std::string& where,
                                    const std::string& path) {
  std::vector<std::string> out;
  const auto* n = t.get(key);
  if (!n) return out;
  if (!n->is_array()) bad(path, where + key, "expected an array of strings");
  for (const auto& v : *n->as_array()) {
    if (!v.is_string()) bad(path, where + key, "expected an array of strings");
    out.push_back(v.as_string()->get());
  }
  return out;
}

void only_keys(const toml::table& t, std::initializer_list<const char*> keys, const std::string& where,
               const std::string& path) {
  for (const auto& [k, v] : t) {
    bool known = false;
    std::string all;
    for (const char* key : keys) {
      known = known || k.str() == key;
      if (!all.empty()) all += ", ";
      all += key;
    }
    if (!known) bad(path, where + std::string(k.str()), "unknown key (keys here: " + all + ")");
  }
}

// The val metrics of the trainer's final evaluation (eval.csv's row at `step`), or empty.
nlohmann::json final_eval_row(const std::string& run_dir, int64_t step) {
  std::ifstream f(run_dir + "/eval.csv");
  std::string header, line;
  if (!std::getline(f, header)) return {};
  std::vector<std::string> names;
  std::stringstream hs(header);
  for (std::string n; std::getline(hs, n, ',');) names.push_back(n);
  nlohmann::json out;
  while (std::getline(f, line)) {
    std::stringstream ls(line);
    std::vector<std::string> cells;
    for (std::string c; std::getline(ls, c, ',');) cells.push_back(c);
    if (cells.size() != names.size() || std::strtoll(cells[0].c_str(), nullptr, 10) != step) continue;
    out = nlohmann::json::object();
    for (size_t i = 2; i < cells.size(); ++i) out[names[i]] = std::strtod(cells[i].c_str(), nullptr);
  }
  return out;
}

// Sum over the processes that trained the run of their last train.csv elapsed_s (elapsed_s restarts
// at each resume).
double wall_seconds(const std::string& run_dir) {
  std::ifstream f(run_dir + "/train.csv");
  std::string line;
  std::getline(f, line);  // header
  double total = 0, prev = 0;
  while (std::getline(f, line)) {
    const auto comma = line.rfind(',');
    if (comma == std::string::npos) continue;
    const double e = std::strtod(line.c_str() + comma + 1, nullptr);
    if (e < prev) total += prev;
    prev = e;
  }
  return total + prev;
}

nlohmann::json read_json_or_null(const std::string& path) {
  if (!data::is_regular_file(path)) return nullptr;
  try {
    return nlohmann::json::parse(data::read_file(path, "experiment"));
  } catch (const nlohmann::json::exception& e) {
    throw Error("experiment: '" + path + "' is not valid JSON (" + e.what() + "): remove it to start over");
  }
}

struct Plan {
  std::vector<ExperimentRun> runs;  // base runs, then the repeat runs once they are known
  std::set<std::string> repeats;    // labels of the repeat runs
};

// The record of one finished run.
nlohmann::json record_run(const ExperimentRun& r, const std::vector<std::string>& sets, const TrainConfig& c,
                          const std::string& run_dir, const std::string& folder, int64_t eval_batch,
                          const ExperimentOptions& opt) {
  const Checkpoint ck = load_checkpoint(run_dir);  // the final one: step == train.steps
  STRATA_CHECK(ck.step >= c.train.steps, "experiment: run '", r.label, "': its latest checkpoint is at step ", ck.step,
               " of ", c.train.steps, " (the run did not finish)");
  const auto t0 = Clock::now();
  nlohmann::json val = c.train.eval_batches == 0 ? final_eval_row(run_dir, c.train.steps) : nlohmann::json();
  const bool need_val = val.is_null() || val.empty(), need_test = c.task != "charlm";
  nlohmann::json test = nullptr;
  if (need_val || need_test) {  // the model and its data built once for both splits
    TrainedRun run = open_trained_run(ck);
    if (need_val) val = evaluate_run(run, "val", eval_batch)["metrics"];
    if (need_test) test = evaluate_run(run, "test", eval_batch)["metrics"];
  }
  const double eval_s = std::chrono::duration<double>(Clock::now() - t0).count();
  const nlohmann::json trainer_summary = read_json_or_null(run_dir + "/summary.json");
  const double wall = wall_seconds(run_dir);
  const double tokens = ck.meta.value("train_tokens", 0.0);
  const double tps = trainer_summary.is_object() && trainer_summary.value("tokens_per_second", 0.0) > 0
                         ? trainer_summary["tokens_per_second"].get<double>()
                         : tokens / std::max(wall, 1e-9);
  return {{"label", r.label},
          {"method", r.method},
          {"folder", folder},
          {"config", r.config},
          {"sets", sets},
          {"size", c.size},
          {"seed", c.seed},
          {"steps", c.train.steps},
          {"train_flops", ck.meta.value("train_flops", 0.0)},
          {"train_tokens", tokens},
          {"wall_s", wall},
          {"tokens_per_second", tps},
          {"eval_s", eval_s},
          {"val", val},
          {"test", test},
          {"commit", ck.meta.value("commit", opt.commit)},
          {"cpu", opt.cpu},
          {"threads", ck.meta.value("threads", 0)},
          {"date", opt.now ? opt.now() : ""},
          {"model", {{"width", c.model.width}, {"layers", c.model.layers}, {"heads", c.model.heads},
                     {"attention", c.model.attention}, {"kind", c.model.kind}}},
          {"data", {{"dim", c.data.dim}, {"context", c.data.context}, {"input_len", c.data.input_len},
                    {"horizon", c.data.horizon}, {"corpus", c.data.corpus}}}};
}

const nlohmann::json* find_record(const nlohmann::json& summary, const std::string& label) {
  for (const auto& r : summary["runs"])
    if (r.value("label", "") == label) return &r;
  return nullptr;
}

// Writes summary with its runs ordered as the plan (records of labels no longer planned last).
void write_summary(nlohmann::json& summary, const Plan& plan, const std::string& path) {
  nlohmann::json ordered = nlohmann::json::array();
  std::set<std::string> placed;
  for (const auto& r : plan.runs)
    if (const auto* rec = find_record(summary, r.label)) {
      ordered.push_back(*rec);
      placed.insert(r.label);
    }
  for (const auto& rec : summary["runs"])
    if (!placed.count(rec.value("label", ""))) ordered.push_back(rec);
  summary["runs"] = ordered;
  data::write_file_atomic(path, summary.dump(2) + "\n", "experiment");
}

}  // namespace

std::string run_folder_name(const std::string& label) {
  std::string out;
  for (const char ch : label) {
    const bool keep = std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == '_' || ch == '=' || ch == '+' ||
                      ch == '-';
    out += ch == '|' ? '-' : keep ? ch : '_';
  }
  return out;
}

Experiment load_experiment(const std::string& path) {
  STRATA_CHECK(data::is_regular_file(path), "experiment '", path, "': cannot be read (no such file?)");
  toml::table root;
  try {
    root = toml::parse(data::read_file(path, "experiment"), path);
  } catch (const toml::parse_error& e) {
    std::ostringstream os;
    os << "experiment '" << path << "': not valid TOML at line " << e.source().begin.line << ": " << e.description();
    throw Error(os.str());
  }
  only_keys(root, {"name", "kind", "sizes", "run", "repeat"}, "", path);
  Experiment e;
  e.path = path;
  e.name = string_of(root, "name", "", path, true);
  e.kind = string_of(root, "kind", "", path, true);
  if (e.kind != "icr" && e.kind != "charlm" && e.kind != "etth1")
    bad(path, "kind", "expected \"icr\" | \"charlm\" | \"etth1\", got \"" + e.kind + "\"");
  if (const auto* sizes = root.get("sizes")) {
    if (!sizes->is_table()) bad(path, "sizes", "expected a table of sizes");
    for (const auto& [name, node] : *sizes->as_table()) {
      const std::string where = "sizes." + std::string(name.str()) + ".";
      if (!node.is_table()) bad(path, where, "expected a table");
      const auto& t = *node.as_table();
      only_keys(t, {"set", "eval_batch", "map"}, where, path);
      ExperimentSize s;
      s.sets = strings_of(t, "set", where, path);
      if (const auto* b = t.get("eval_batch")) {
        if (!b->is_integer() || b->as_integer()->get() < 0) bad(path, where + "eval_batch", "expected an integer >= 0");
        s.eval_batch = b->as_integer()->get();
      }
      if (const auto* m = t.get("map")) {
        if (!m->is_table()) bad(path, where + "map", "expected a table of \"set\" = \"replacement\" strings");
        for (const auto& [from, to] : *m->as_table()) {
          const std::string key = where + "map.\"" + std::string(from.str()) + "\"";
          auto& into = s.map[std::string(from.str())];
          if (to.is_string()) {
            into.push_back(to.as_string()->get());
          } else if (to.is_array()) {
            for (const auto& v : *to.as_array()) {
              if (!v.is_string()) bad(path, key, "expected a string or an array of strings (the replacement sets)");
              into.push_back(v.as_string()->get());
            }
          } else {
            bad(path, key, "expected a string or an array of strings (the replacement sets)");
          }
        }
      }
      e.sizes[std::string(name.str())] = s;
    }
  }
  const auto* runs = root.get("run");
  if (!runs || !runs->is_array_of_tables() || runs->as_array()->empty())
    bad(path, "run", "expected one or more [[run]] tables");
  std::set<std::string> labels, folders;
  const std::string dir = folder_of(path);
  for (size_t i = 0; i < runs->as_array()->size(); ++i) {
    const auto& t = *runs->as_array()->get(i)->as_table();
    const std::string where = "run[" + std::to_string(i) + "].";
    only_keys(t, {"label", "method", "config", "set"}, where, path);
    ExperimentRun r;
    r.label = string_of(t, "label", where, path, true);
    r.method = string_of(t, "method", where, path, false);
    if (r.method.empty()) r.method = r.label;
    const std::string config = string_of(t, "config", where, path, true);
    r.config = normalize_path(config[0] == '/' ? config : dir + "/" + config);
    if (!data::is_regular_file(r.config)) bad(path, where + "config", "no such file '" + r.config + "'");
    r.sets = strings_of(t, "set", where, path);
    if (!labels.insert(r.label).second) bad(path, where + "label", "duplicate label '" + r.label + "'");
    if (!folders.insert(run_folder_name(r.label)).second)
      bad(path, where + "label", "'" + r.label + "' has the run folder '" + run_folder_name(r.label) +
                                     "' of an earlier run (labels must differ in [A-Za-z0-9._=+-|])");
    e.runs.push_back(r);
  }
  if (const auto* rep = root.get("repeat")) {
    if (!rep->is_table()) bad(path, "repeat", "expected a table");
    const auto& t = *rep->as_table();
    only_keys(t, {"seeds", "metric"}, "repeat.", path);
    const auto* seeds = t.get("seeds");
    if (!seeds || !seeds->is_array() || seeds->as_array()->empty())
      bad(path, "repeat.seeds", "expected a non-empty array of integers >= 0");
    for (const auto& s : *seeds->as_array()) {
      if (!s.is_integer() || s.as_integer()->get() < 0) bad(path, "repeat.seeds", "expected integers >= 0");
      e.repeat_seeds.push_back(s.as_integer()->get());
    }
    e.repeat_metric = string_of(t, "metric", "repeat.", path, true);
    if (e.repeat_metric.rfind("val.", 0) != 0 || e.repeat_metric.size() <= 4)
      bad(path, "repeat.metric", "expected \"val.<metric>\" (the best is chosen on validation, never test), got \"" +
                                     e.repeat_metric + "\"");
  }
  return e;
}

std::vector<ExperimentRun> repeat_runs(const Experiment& e, const std::string& method) {
  std::vector<ExperimentRun> out;
  for (const int64_t seed : e.repeat_seeds)
    for (const auto& r : e.runs) {
      if (r.method != method) continue;
      ExperimentRun x = r;
      x.label += " seed=" + std::to_string(seed);
      x.sets.push_back("seed=" + std::to_string(seed));
      out.push_back(x);
    }
  return out;
}

std::pair<std::string, std::map<std::string, double>> best_method(const Experiment& e, const nlohmann::json& summary) {
  if (e.repeat_seeds.empty() || !summary.is_object() || !summary.contains("runs")) return {};
  const std::string metric = e.repeat_metric.substr(4);
  std::map<std::string, std::pair<double, int>> sums;
  for (const auto& r : e.runs) {
    const auto* rec = find_record(summary, r.label);
    if (!rec) return {};
    const auto& val = (*rec)["val"];
    STRATA_CHECK(val.is_object() && val.contains(metric) && val[metric].is_number(), "experiment '", e.path,
                 "': key 'repeat.metric': run '", r.label, "' has no val metric '", metric, "' (its val metrics: ",
                 val.dump(), ")");
    auto& s = sums[r.method];
    s.first += val[metric].get<double>();
    s.second += 1;
  }
  std::map<std::string, double> means;
  std::string best;
  for (const auto& [method, s] : sums) {
    means[method] = s.first / s.second;
    if (best.empty() || means[method] < means[best]) best = method;
  }
  return {best, means};
}

ExperimentResult run_experiment(const Experiment& e, const ExperimentOptions& opt) {
  STRATA_CHECK(!opt.out.empty(), "experiment: option '--out': expected a folder, got an empty path");
  const auto size_it = e.sizes.find(opt.size);
  if (size_it == e.sizes.end()) {
    std::string names;
    for (const auto& [k, v] : e.sizes) {
      if (!names.empty()) names += ", ";
      names += k;
    }
    throw Error("experiment '" + e.path + "': size '" + opt.size + "': not in the file (its sizes: " + names + ")");
  }
  const ExperimentSize& size = size_it->second;
  const auto say = [&](const std::string& s) {
    if (opt.say) opt.say(s);
  };
  const std::string summary_path = opt.out + "/summary.json";
  nlohmann::json summary = read_json_or_null(summary_path);
  if (summary.is_null()) {
    summary = {{"experiment", e.name}, {"kind", e.kind}, {"size", opt.size}, {"file", e.path},
               {"runs", nlohmann::json::array()}};
  } else {
    STRATA_CHECK(summary.is_object() && summary.value("experiment", "") == e.name && summary.value("size", "") == opt.size &&
                     summary.contains("runs") && summary["runs"].is_array(),
                 "experiment: option '--out': '", summary_path, "' holds experiment '", summary.value("experiment", "?"),
                 "' at size '", summary.value("size", "?"), "', not '", e.name, "' at size '", opt.size,
                 "': choose another --out");
  }

  Plan plan{e.runs, {}};
  const auto add_repeats = [&]() {
    if (!plan.repeats.empty()) return;
    const auto [best, means] = best_method(e, summary);
    if (best.empty()) return;
    summary["best"] = {{"method", best}, {"metric", e.repeat_metric}, {"means", means},
                       {"rule", "lowest mean of the metric over the method's base runs (seed of the config)"}};
    for (const auto& r : repeat_runs(e, best)) {
      plan.runs.push_back(r);
      plan.repeats.insert(r.label);
    }
  };
  add_repeats();
  // --only: every label must be a run (the repeat runs exist once the base runs are recorded).
  std::set<std::string> only(opt.only.begin(), opt.only.end());
  for (const auto& label : only) {
    bool found = false;
    for (const auto& r : plan.runs) found = found || r.label == label;
    if (found) continue;
    std::string all;
    for (const auto& r : plan.runs) {
      if (!all.empty()) all += ", ";
      all += '"';
      all += r.label;
      all += '"';
    }
    throw Error("experiment '" + e.path + "': option '--only': no run labelled \"" + label + "\" (runs: " + all + ")" +
                (e.repeat_seeds.empty() || !plan.repeats.empty() ? "" : "; the [repeat] runs are known once every base run is done"));
  }

  ExperimentResult res;
  for (size_t i = 0; i < plan.runs.size(); ++i) {
    const ExperimentRun r = plan.runs[i];  // (a copy: add_repeats() grows plan.runs)
    std::string tag = "[";  // (built piece by piece: GCC 12's -Wrestrict misfires on "[" + ...)
    tag += std::to_string(i + 1);
    tag += '/';
    tag += std::to_string(plan.runs.size());
    tag += "] ";
    tag += r.label;
    if (!only.empty() && !only.count(r.label)) continue;
    if (find_record(summary, r.label)) {
      say(tag + ": done (recorded in " + summary_path + "), skipped");
      ++res.skipped;
      add_repeats();
      continue;
    }
    std::vector<std::string> sets;
    for (const auto& s : r.sets) {
      const auto m = size.map.find(s);
      if (m == size.map.end()) sets.push_back(s);
      else sets.insert(sets.end(), m->second.begin(), m->second.end());
    }
    sets.insert(sets.end(), size.sets.begin(), size.sets.end());
    sets.insert(sets.end(), opt.sets.begin(), opt.sets.end());
    const TrainConfig c = load_train_config(r.config, opt.size, sets);
    const std::string folder = run_folder_name(r.label);
    const std::string run_dir = opt.out + "/" + folder;
    RunOptions ro;
    ro.run_dir = run_dir;
    ro.progress = opt.progress;
    ro.commit = opt.commit;
    ro.stop_after = opt.stop_after;
    if (data::is_regular_file(run_dir + "/summary.json")) {
      say(tag + ": trained (" + run_dir + "/summary.json), evaluating");
    } else {
      ro.resume = has_checkpoint(run_dir);
      say(tag + (ro.resume ? ": resuming in " : ": starting in ") + run_dir);
      const RunSummary s = train(c, ro);
      if (opt.stop_after >= 0 && s.last_step < c.train.steps) {
        say(tag + ": stopped after " + std::to_string(s.last_step - s.first_step) + " steps (--stop-after), as if killed");
        res.stopped = true;
        return res;
      }
    }
    nlohmann::json rec = record_run(r, sets, c, run_dir, folder, size.eval_batch, opt);
    summary["runs"].push_back(rec);
    ++res.ran;
    add_repeats();
    write_summary(summary, plan, summary_path);
    say(tag + ": val " + rec["val"].dump() + (rec["test"].is_null() ? "" : ", test " + rec["test"].dump()));
  }
  if (res.ran == 0 && !data::is_regular_file(summary_path)) write_summary(summary, plan, summary_path);
  res.summary = summary;
  return res;
}

}  // namespace strata::models
