// tests/cpp/experiment_test.cpp: experiment files, run folders and the [repeat] selection
// (models/experiment.h). The runs themselves run end to end in tests/cli/experiment_cli.sh.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "data/files.h"
#include "models/experiment.h"
#include "test_util.h"

namespace strata::models {
namespace {

using strata::test::expect_error;

// An experiment file in a fresh folder beside a copy-free config path (the repo's charlm.toml).
class ExperimentFile {
 public:
  explicit ExperimentFile(const std::string& text) {
    char tmpl[] = "/tmp/strata_experiment_test_XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    path_ = dir_ + "/e.toml";
    data::write_file_atomic(path_, text, "test");
  }
  ~ExperimentFile() {
    std::remove(path_.c_str());
    ::rmdir(dir_.c_str());
  }
  const std::string& path() const { return path_; }

 private:
  std::string dir_, path_;
};

const std::string kConfig = std::string(STRATA_SOURCE_DIR) + "/configs/charlm.toml";

std::string run_table(const std::string& label, const std::string& method, const std::string& extra = "") {
  return "[[run]]\nlabel = \"" + label + "\"\nmethod = \"" + method + "\"\nconfig = \"" + kConfig + "\"\n" + extra + "\n";
}

TEST(Experiment, ParsesRunsSizesMapsAndRepeat) {
  ExperimentFile f(R"(name = "x"
kind = "etth1"
[repeat]
seeds = [1, 2]
metric = "val.mae"
[sizes.smoke]
set = ["train.steps=3"]
eval_batch = 64
map = {"model.width=64" = "model.width=16", "model.kind=point" = ["model.kind=point", "train.steps=2"]}
)" + run_table("a|b c", "m1", "set = [\"model.width=64\"]") +
                   run_table("d", "m2"));
  const Experiment e = load_experiment(f.path());
  EXPECT_EQ(e.name, "x");
  EXPECT_EQ(e.kind, "etth1");
  ASSERT_EQ(e.runs.size(), 2u);
  EXPECT_EQ(e.runs[0].label, "a|b c");
  EXPECT_EQ(e.runs[0].config, kConfig);
  EXPECT_EQ(e.runs[0].sets, std::vector<std::string>{"model.width=64"});
  EXPECT_EQ(e.sizes.at("smoke").eval_batch, 64);
  EXPECT_EQ(e.sizes.at("smoke").map.at("model.width=64"), std::vector<std::string>{"model.width=16"});
  EXPECT_EQ(e.sizes.at("smoke").map.at("model.kind=point"),
            (std::vector<std::string>{"model.kind=point", "train.steps=2"}));
  EXPECT_EQ(e.repeat_seeds, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(run_folder_name("patch mlr 40|16|4|4 H=96"), "patch_mlr_40-16-4-4_H=96");
  EXPECT_EQ(run_folder_name("a/b:c,d"), "a_b_c_d");

  const auto rep = repeat_runs(e, "m1");
  ASSERT_EQ(rep.size(), 2u);
  EXPECT_EQ(rep[0].label, "a|b c seed=1");
  EXPECT_EQ(rep[1].sets.back(), "seed=2");
}

TEST(Experiment, BestMethodIsTheLowestValidationMeanAndWaitsForEveryBaseRun) {
  ExperimentFile f("name = \"x\"\nkind = \"etth1\"\n[repeat]\nseeds = [1]\nmetric = \"val.mae\"\n" +
                   run_table("a1", "A") + run_table("a2", "A") + run_table("b1", "B") + run_table("b2", "B"));
  const Experiment e = load_experiment(f.path());
  const auto rec = [](const std::string& label, double val_mae, double test_mae) {
    return nlohmann::json{{"label", label}, {"val", {{"mae", val_mae}}}, {"test", {{"mae", test_mae}}}};
  };
  // B has the lower validation mean (0.45 vs 0.5) though A has the lower test: B is chosen.
  nlohmann::json summary = {{"runs", {rec("a1", 0.4, 0.1), rec("a2", 0.6, 0.1), rec("b1", 0.5, 0.9)}}};
  EXPECT_EQ(best_method(e, summary).first, "") << "b2 is not recorded yet";
  summary["runs"].push_back(rec("b2", 0.4, 0.9));
  const auto [best, means] = best_method(e, summary);
  EXPECT_EQ(best, "B");
  EXPECT_DOUBLE_EQ(means.at("A"), 0.5);
  EXPECT_DOUBLE_EQ(means.at("B"), 0.45);
}

TEST(Experiment, BadFilesAreErrorsNamingTheKey) {
  const std::string head = "name = \"x\"\nkind = \"charlm\"\n";
  const auto load = [](const std::string& text) {
    ExperimentFile f(text);
    load_experiment(f.path());
  };
  expect_error([&] { load(head + "colour = 1\n" + run_table("a", "m")); }, {"key 'colour'", "unknown key"});
  expect_error([&] { load(head); }, {"key 'run'", "one or more [[run]]"});
  expect_error([&] { load(head + run_table("a", "m") + run_table("a", "n")); }, {"run[1].label", "duplicate label 'a'"});
  expect_error([&] { load(head + run_table("a b", "m") + run_table("a/b", "n")); },
               {"run[1].label", "run folder 'a_b'"});
  expect_error([&] { load(head + "[[run]]\nlabel = \"a\"\nconfig = \"nope.toml\"\n"); },
               {"run[0].config", "no such file", "nope.toml"});
  expect_error([&] { load(head + "[[run]]\nlabel = \"a\"\nconfig = \"" + kConfig + "\"\nsets = []\n"); },
               {"run[0].sets", "unknown key"});
  expect_error([&] { load(head + "[repeat]\nseeds = [1]\nmetric = \"test.mae\"\n" + run_table("a", "m")); },
               {"repeat.metric", "validation, never test"});
  expect_error([&] { load("name = \"x\"\nkind = \"vision\"\n" + run_table("a", "m")); }, {"key 'kind'", "\"vision\""});
  expect_error([&] { load(head + "[sizes.cpu]\nmap = {\"a=1\" = 2}\n" + run_table("a", "m")); },
               {"sizes.cpu.map.\"a=1\"", "a string or an array"});
  expect_error([] { load_experiment("/nonexistent/e.toml"); }, {"/nonexistent/e.toml", "cannot be read"});
}

TEST(Experiment, RunErrorsNameTheOption) {
  ExperimentFile f("name = \"x\"\nkind = \"charlm\"\n[sizes.smoke]\nset = []\n" + run_table("a", "m"));
  const Experiment e = load_experiment(f.path());
  char tmpl[] = "/tmp/strata_experiment_out_XXXXXX";
  const std::string out = ::mkdtemp(tmpl);
  ExperimentOptions o;
  o.out = out;
  o.size = "cpu";
  expect_error([&] { run_experiment(e, o); }, {"size 'cpu'", "its sizes: smoke"});
  o.size = "smoke";
  o.only = {"b"};
  expect_error([&] { run_experiment(e, o); }, {"option '--only'", "\"b\"", "runs: \"a\""});
  // An OUT that holds another experiment's summary.
  data::write_file_atomic(out + "/summary.json", R"({"experiment": "y", "size": "smoke", "runs": []})", "test");
  o.only.clear();
  expect_error([&] { run_experiment(e, o); }, {"option '--out'", "holds experiment 'y'"});
  std::remove((out + "/summary.json").c_str());
  ::rmdir(out.c_str());
}

}  // namespace
}  // namespace strata::models
