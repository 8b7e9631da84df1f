// tests/cpp/train_test.cpp: run configs (TOML), checkpoints, the tasks' smoke sizes and resume
// after a simulated kill (models/train_config.h, checkpoint.h, tasks.h, trainer.h).
#include <dirent.h>
#include <ftw.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "data/files.h"
#include "models/checkpoint.h"
#include "models/train_config.h"
#include "test_util.h"

namespace strata::models {
namespace {

using strata::test::expect_error;

// POSIX file helpers: no std::filesystem in programs linked with torch (data/files.cpp says why).
bool exists(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0;
}

std::vector<std::string> files_in(const std::string& dir, const std::string& ext) {
  std::vector<std::string> out;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (const dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      if (n.size() > ext.size() && n.compare(n.size() - ext.size(), ext.size(), ext) == 0) out.push_back(dir + "/" + n);
    }
    ::closedir(d);
  }
  return out;
}

// A fresh temporary folder per test, removed afterwards.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/strata_train_test_XXXXXX";
    path_ = ::mkdtemp(tmpl);
  }
  ~TempDir() {
    ::nftw(path_.c_str(), [](const char* p, const struct stat*, int, struct FTW*) { return ::remove(p); }, 16,
           FTW_DEPTH | FTW_PHYS);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

const char* kConfig = R"(
name = "tiny"
task = "charlm"
seed = 3
[model]
width = 32
heads = 2
attention = "mha"
[train]
steps = 100
lr = 3e-3
[sizes.smoke.train]
steps = 4
[sizes.smoke.model]
layers = 1
)";

TEST(TrainConfig, DefaultsSizesAndSets) {
  const TrainConfig c = parse_train_config(kConfig, "t.toml");
  EXPECT_EQ(c.name, "tiny");
  EXPECT_EQ(c.seed, 3);
  EXPECT_EQ(c.model.width, 32);
  EXPECT_EQ(c.model.layers, 4);  // the default
  EXPECT_EQ(c.train.steps, 100);
  EXPECT_DOUBLE_EQ(c.train.lr, 3e-3);
  const TrainConfig s = parse_train_config(kConfig, "t.toml", "smoke", {"train.batch=8", "model.attention=swa:w=16"});
  EXPECT_EQ(s.size, "smoke");
  EXPECT_EQ(s.train.steps, 4);
  EXPECT_EQ(s.model.layers, 1);
  EXPECT_EQ(s.model.width, 32);  // merged, not replaced
  EXPECT_EQ(s.train.batch, 8);
  EXPECT_EQ(s.model.attention, "swa:w=16");  // a bare word is a string
  const TrainConfig q = parse_train_config(kConfig, "t.toml", "", {"model.attention=\"mlr:ranks=8-8\"", "train.lr=1"});
  EXPECT_EQ(q.model.attention, "mlr:ranks=8-8");
  EXPECT_DOUBLE_EQ(q.train.lr, 1.0);  // an integer for a number
}

TEST(TrainConfig, ResolvedTomlRoundTrips) {
  TrainConfig c = parse_train_config(kConfig, "t.toml", "smoke", {"train.eps=1e-20", "train.min_lr_ratio=0.1"});
  const TrainConfig back = parse_train_config(to_toml(c), "resolved");
  EXPECT_TRUE(back == c) << to_toml(c);
  EXPECT_EQ(back.train.eps, 1e-20);
  c.train.beta2 = 0.99;
  EXPECT_FALSE(back == c);
}

TEST(TrainConfig, ErrorsNameTheKey) {
  expect_error([] { parse_train_config(std::string(kConfig) + "[train.x]\n", "t.toml"); }, {"t.toml", "train.x"});
  expect_error([] { parse_train_config(kConfig, "t.toml", "", {"train.stepz=3"}); },
               {"key 'train.stepz'", "unknown key", "steps"});
  expect_error([] { parse_train_config(kConfig, "t.toml", "", {"train.steps=ten"}); },
               {"key 'train.steps'", "expected an integer", "\"ten\""});
  expect_error([] { parse_train_config(kConfig, "t.toml", "", {"train.steps=0"}); },
               {"key 'train.steps'", ">= 1", "got 0"});
  expect_error([] { parse_train_config(kConfig, "t.toml", "", {"model.heads=3"}); },
               {"key 'model.heads'", "divisor of model.width = 32", "got 3"});
  expect_error([] { parse_train_config(kConfig, "t.toml", "", {"train.accum=3"}); }, {"key 'train.accum'"});
  expect_error([] { parse_train_config(kConfig, "t.toml", "", {"task=\"vision\""}); }, {"key 'task'", "charlm"});
  expect_error([] { parse_train_config(kConfig, "t.toml", "", {"model.bias=1"}); },
               {"key 'model.bias'", "true or false", "integer"});
  expect_error([] { parse_train_config(kConfig, "t.toml", "cpu"); }, {"size 'cpu'", "smoke"});
  expect_error([] { parse_train_config("name = \n", "bad.toml"); }, {"bad.toml", "not valid TOML", "line 1"});
  expect_error([] { parse_train_config(kConfig, "t.toml", "", {"steps"}); }, {"--set 'steps'", "key=value"});
  expect_error([] { parse_train_config("[modle]\nwidth = 3\n", "t.toml"); }, {"key 'modle.width'", "no such section"});
  expect_error([] { load_train_config("/nonexistent/x.toml"); }, {"/nonexistent/x.toml", "cannot be read"});
}

TEST(TrainConfig, ShippedConfigsParseAtEverySize) {
  const std::string dir = std::string(STRATA_SOURCE_DIR) + "/configs";
  int n = 0;
  for (const auto& file : files_in(dir, ".toml")) {
    for (const char* size : {"smoke", "cpu", "paper"}) {
      SCOPED_TRACE(file + " " + size);
      EXPECT_NO_THROW(load_train_config(file, size));
    }
    ++n;
  }
  EXPECT_GE(n, 3);  // charlm, icr, etth1 at least
}

std::vector<std::pair<std::string, at::Tensor>> sample_tensors() {
  return {{"param/w", at::randn({3, 5})},
          {"param/b", at::randn({7}, at::kDouble)},
          {"adam/w/step", at::scalar_tensor(int64_t(42), at::kLong)},
          {"half", at::randn({4, 2}).to(at::kBFloat16)},
          {"rng/torch", at::randint(0, 255, {13}, at::kByte)},
          {"empty", at::empty({0, 3})}};
}

TEST(Checkpoint, RoundTripsExactlyAndKeepsTheNewest) {
  TempDir dir;
  const auto tensors = sample_tensors();
  for (int64_t step : {10, 20, 30}) save_checkpoint(dir.path(), step, tensors, {{"note", "x"}}, 2);
  EXPECT_TRUE(has_checkpoint(dir.path()));
  const Checkpoint c = load_checkpoint(dir.path());
  EXPECT_EQ(c.step, 30);
  EXPECT_EQ(c.meta["note"], "x");
  ASSERT_EQ(c.tensors.size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    SCOPED_TRACE(name);
    const at::Tensor& back = c.tensors.at(name);
    EXPECT_EQ(back.scalar_type(), t.scalar_type());
    EXPECT_TRUE(at::equal(back, t));  // bit for bit
  }
  // Only the newest 2 remain; an older one still loads by its own metadata file.
  EXPECT_FALSE(exists(dir.path() + "/checkpoints/step-00000010.json"));
  EXPECT_FALSE(exists(dir.path() + "/checkpoints/step-00000010.safetensors"));
  EXPECT_EQ(load_checkpoint(dir.path() + "/checkpoints/step-00000020.json").step, 20);
}

// Every way a kill or a disk can damage a checkpoint is a clear error naming the file.
TEST(Checkpoint, DamagedFilesAreClearErrors) {
  TempDir dir;
  save_checkpoint(dir.path(), 5, sample_tensors(), {}, 2);
  const std::string st = dir.path() + "/checkpoints/step-00000005.safetensors";
  const std::string meta = dir.path() + "/checkpoints/latest.json";
  const std::string bytes = data::read_file(st, "test");

  data::write_file_atomic(st, bytes.substr(0, bytes.size() / 2), "test");  // truncated
  expect_error([&] { load_checkpoint(dir.path()); }, {st, "truncated"});
  std::string flipped = bytes;
  flipped[bytes.size() - 3] ^= 0x40;  // one bit of a tensor
  data::write_file_atomic(st, flipped, "test");
  expect_error([&] { load_checkpoint(dir.path()); }, {st, "sha256", "corrupt"});
  data::write_file_atomic(st, bytes, "test");
  EXPECT_EQ(load_checkpoint(dir.path()).step, 5);

  const std::string m = data::read_file(meta, "test");
  data::write_file_atomic(meta, m.substr(0, m.size() / 2), "test");  // torn metadata
  expect_error([&] { load_checkpoint(dir.path()); }, {meta, "not valid JSON"});
  data::write_file_atomic(meta, "{\"format\": \"strata-checkpoint/1\"}", "test");
  expect_error([&] { load_checkpoint(dir.path()); }, {meta, "no 'step'"});
  std::remove(st.c_str());
  data::write_file_atomic(meta, m, "test");
  expect_error([&] { load_checkpoint(dir.path()); }, {st, "cannot read"});
  TempDir empty;
  expect_error([&] { load_checkpoint(empty.path()); }, {empty.path(), "no checkpoint"});
  expect_error([&] { save_checkpoint(empty.path(), 1, {{"c", at::zeros({2}, at::kComplexFloat)}}, {}); },
               {"'c'", "cannot be stored"});
}

}  // namespace
}  // namespace strata::models
