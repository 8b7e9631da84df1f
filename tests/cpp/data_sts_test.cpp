// tests/cpp/data_sts_test.cpp: the STS-B loader and the rank correlation (data/sts.h). Expected
// correlations are scipy.stats.spearmanr / pearsonr values (scipy 1.17).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "data/sha256.h"
#include "data/shared_files.h"
#include "data/sts.h"
#include "strata/error.h"

namespace {

using strata::data::load_sts;

// Files by POSIX calls, not std::filesystem: libtorch.so exports its own (older) copies of the
// std::filesystem functions, and this executable, linked with torch, binds to them
// (std::filesystem::remove_all crashed).
std::string temp_dir() {
  const char* t = std::getenv("TMPDIR");
  return t && *t ? t : "/tmp";
}
std::string temp_file(const std::string& stem, const std::string& content) {
  const std::string path = temp_dir() + '/' + "strata_" + stem + "_" + std::to_string(::getpid()) + ".csv";
  std::ofstream(path, std::ios::binary) << content;
  return path;
}

std::string error_of(const std::string& content) {
  const std::string path = temp_file("sts_bad", content);
  std::string msg;
  try {
    load_sts(path);
  } catch (const strata::Error& e) {
    msg = e.what();
  }
  std::remove(path.c_str());
  return msg;
}

TEST(DataSts, SpearmanAndPearsonMatchScipy) {
  using strata::data::pearson;
  using strata::data::spearman;
  EXPECT_NEAR(spearman({1, 2, 3, 4, 5}, {5, 6, 7, 8, 7}), 0.8207826816681233, 1e-14);
  // Ties in both inputs take average ranks.
  EXPECT_NEAR(spearman({0.1, 0.4, 0.4, 0.2, 0.9, 0.9, 0.3}, {1, 3, 2, 2, 5, 4, 0}), 0.8348975218874902, 1e-14);
  EXPECT_NEAR(pearson({1, 2, 3, 4, 5}, {2, 4, 5, 4, 5}), 0.7745966692414835, 1e-14);
  // Monotone maps do not change Spearman; reversal negates it.
  EXPECT_NEAR(spearman({1, 2, 3, 10}, {1, 8, 27, 1000}), 1.0, 1e-15);
  EXPECT_NEAR(spearman({1, 2, 3, 10}, {4, 3, 2, 1}), -1.0, 1e-15);
  EXPECT_TRUE(std::isnan(spearman({1, 1, 1}, {1, 2, 3})));
  EXPECT_THROW(spearman({1}, {1}), strata::Error);
  EXPECT_THROW(spearman({1, 2}, {1, 2, 3}), strata::Error);
  EXPECT_THROW(spearman({1, NAN}, {1, 2}), strata::Error);
}

TEST(DataSts, LoadsTheFirstSevenFields) {
  const std::string path =
      temp_file("sts_ok",
                "g\tf\t2012\t0001\t2.500\tA girl is styling her hair.\tA girl is brushing her hair.\n"
                "g\tf\t2016\t0008\t3\tfirst \tsecond\textra field\tanother\r\n"
                "g\tf\t2016\t0009\t0\t\t\n");
  const auto rows = load_sts(path);
  std::remove(path.c_str());
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].score, 2.5);
  EXPECT_EQ(rows[0].sentence1, "A girl is styling her hair.");
  EXPECT_EQ(rows[0].sentence2, "A girl is brushing her hair.");
  EXPECT_EQ(rows[1].score, 3.0);
  EXPECT_EQ(rows[1].sentence1, "first ");
  EXPECT_EQ(rows[1].sentence2, "second");
  EXPECT_EQ(rows[2].sentence1, "");
}

TEST(DataSts, MalformedRowsNameTheLine) {
  EXPECT_NE(error_of("g\tf\t2012\t1\t2.5\tonly six\n").find("line 1: expected at least 7 tab-separated fields, got 6"),
            std::string::npos);
  EXPECT_NE(error_of("g\tf\t2012\t1\t2.5\ta\tb\ng\tf\t2012\t2\tfive\ta\tb\n").find("line 2: field 5 (score)"),
            std::string::npos);
  EXPECT_NE(error_of("g\tf\t2012\t1\t5.5\ta\tb\n").find("expected a number in [0, 5], got '5.5'"), std::string::npos);
  EXPECT_NE(error_of("g\tf\t2012\t1\t2.5x\ta\tb\n").find("got '2.5x'"), std::string::npos);
  EXPECT_NE(error_of("").find("empty file"), std::string::npos);
  EXPECT_THROW(load_sts("/nonexistent/sts-test.csv"), strata::Error);
}

TEST(DataSts, StsBenchmarkTestSplit) {
  const std::string path = strata::data::find_shared_file("data/sts/sts-test.csv");
  if (path.empty()) GTEST_SKIP() << "shared/data/sts/sts-test.csv not found (set STRATA_SHARED_DIR)";
  EXPECT_EQ(strata::data::sha256_file_hex(path), strata::data::kStsTestSha256) << path;
  const auto rows = load_sts(path);
  ASSERT_EQ(rows.size(), 1379u);
  EXPECT_EQ(rows[0].score, 2.5);
  EXPECT_EQ(rows[0].sentence1, "A girl is styling her hair.");
  for (const auto& r : rows) EXPECT_FALSE(r.sentence1.empty() || r.sentence2.empty());
}

}  // namespace
