// tests/cpp/data_train_test.cpp: the training datasets (data/char_corpus.h, data/icr.h, data/ett.h):
// vocabulary, splits, determinism by (seed, step, micro), the ICR distribution and curriculum, the
// ETT protocol's window counts and standardisation, and the checksum errors. Reference numbers
// (ETTh1 train means / stds) are from a plain Python csv + math computation over the same file.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "data/char_corpus.h"
#include "data/ett.h"
#include "data/icr.h"
#include "data/sha256.h"
#include "data/shared_files.h"
#include "strata/error.h"
#include "test_util.h"

namespace {

namespace sd = strata::data;
using strata::test::expect_error;

// A fresh temporary folder, removed with its files (POSIX calls, not std::filesystem: see
// data_sts_test.cpp) when the object goes.
class TempDir {
 public:
  TempDir() {
    const char* t = std::getenv("TMPDIR");
    std::string tmpl = std::string(t && *t ? t : "/tmp") + "/strata_data_train_XXXXXX";
    if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed for " + tmpl);
    dir_ = tmpl;
  }
  ~TempDir() {
    for (const auto& f : files_) std::remove(f.c_str());
    ::rmdir(dir_.c_str());
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& dir() const { return dir_; }
  // Writes `content` to dir/name; returns the path.
  std::string write(const std::string& name, const std::string& content) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary) << content;
    files_.push_back(path);
    return path;
  }

 private:
  std::string dir_;
  std::vector<std::string> files_;
};

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Sets an environment variable for a scope, restoring the old value after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) {
      old_ = old;
      had_ = true;
    }
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() { had_ ? ::setenv(name_, old_.c_str(), 1) : ::unsetenv(name_); }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

// ------------------------------------------------------------------------------------------------
// Character corpora

TEST(DataTrainChars, VocabularyRoundTrip) {
  std::string all = "\n";
  for (int c = 32; c <= 126; ++c) all += char(c);
  const std::vector<int64_t> ids = sd::encode_chars(all);
  ASSERT_EQ(int64_t(ids.size()), sd::CharCorpus::kVocab);
  for (int64_t i = 0; i < sd::CharCorpus::kVocab; ++i) EXPECT_EQ(ids[size_t(i)], i);  // '\n' 0, then c - 31
  EXPECT_EQ(sd::decode_chars(ids), all);
  EXPECT_EQ(sd::char_id(' '), 1);
  EXPECT_EQ(sd::char_id('~'), 95);
  for (int c : {0, 9, 13, 31, 127, 128, 0xC3, 255}) EXPECT_EQ(sd::char_id(static_cast<unsigned char>(c)), -1) << c;
  const std::string text = "To be, or not to be:\nthat is the question.\n";
  EXPECT_EQ(sd::decode_chars(sd::encode_chars(text)), text);
}

TEST(DataTrainChars, OutOfVocabularyIsAnError) {
  expect_error([] { sd::encode_chars("ab\tc"); }, {"encode_chars", "'text'", "byte 0x09 at position 2"});
  expect_error([] { sd::encode_chars("caf\xC3\xA9"); }, {"byte 0xc3 at position 3"});
  expect_error([] { sd::decode_chars(std::vector<int64_t>{1, 2, 96}); }, {"decode_chars", "[0, 96)", "96 at position 2"});
  expect_error([] { sd::decode_chars(std::vector<int64_t>{-1}); }, {"-1 at position 0"});
}

TEST(DataTrainChars, LinesWithOtherCharactersAreDropped) {
  // Two of five lines hold characters outside the vocabulary: a tab, and an e-acute (2 UTF-8 bytes,
  // counted as one character).
  const std::string text = "keep me\nbad\tline\ncaf\xC3\xA9 au lait\nalso kept\nend";
  const sd::CharCorpus c = sd::make_char_corpus("test", text, 0.25);
  EXPECT_EQ(c.dropped_lines, 2);
  EXPECT_EQ(c.dropped_chars, 2);
  std::vector<int64_t> all(c.train.begin(), c.train.end());
  all.insert(all.end(), c.val.begin(), c.val.end());
  EXPECT_EQ(sd::decode_chars(all), "keep me\nalso kept\nend");  // 21 ids
  EXPECT_EQ(c.val.size(), 5u);                                   // floor(21 * 0.25): the last 5
  EXPECT_EQ(sd::decode_chars(std::vector<int64_t>(c.val.begin(), c.val.end())), "t\nend");
  // A stray UTF-8 continuation byte (0x99 with no lead byte) drops its line as one character; it
  // was kept as id 255, past the vocabulary (tests/fuzz/char_corpus_fuzz's first finding).
  const sd::CharCorpus stray = sd::make_char_corpus("stray", "keep me\nsp\x99" "ak\nalso kept\nend", 0.25);
  EXPECT_EQ(stray.dropped_lines, 1);
  EXPECT_EQ(stray.dropped_chars, 1);
  for (const auto* split : {&stray.train, &stray.val})
    for (uint8_t id : *split) EXPECT_LT(id, sd::CharCorpus::kVocab);
  // CRLF: every line holds '\r', nothing is left: a clear error, not an empty corpus.
  expect_error([] { sd::make_char_corpus("crlf", "a\r\nb\r\n", 0.1); },
               {"'crlf'", "dropping 2 of 2 lines", "byte 0x0d on line 1"});
  expect_error([] { sd::make_char_corpus("x", "abc\n", 0.0); }, {"val_fraction", "(0, 1)"});
  expect_error([] { sd::make_char_corpus("x", "abc\n", 1.0); }, {"val_fraction"});
  expect_error([] { sd::make_char_corpus("x", "abc\n", 0.1); }, {"non-empty train and val"});  // floor(0.4) = 0
}

TEST(DataTrainChars, TinyShakespeareSplitByPosition) {
  const std::string path = sd::find_shared_file("data/text/tinyshakespeare.txt");
  if (path.empty()) GTEST_SKIP() << "shared/data/text/tinyshakespeare.txt not found (set STRATA_SHARED_DIR)";
  const sd::CharCorpus c = sd::load_char_corpus("tinyshakespeare");
  EXPECT_EQ(c.name, "tinyshakespeare");
  EXPECT_EQ(c.path, path);
  EXPECT_EQ(c.dropped_chars, 0);  // the file is plain printable ASCII
  // 1,115,394 characters: val = floor(111,539.4) = 111,539, the last ones; train the 1,003,855 before.
  EXPECT_EQ(c.val.size(), 111539u);
  EXPECT_EQ(c.train.size(), 1003855u);
  const std::string text = read_all(path);
  EXPECT_EQ(sd::decode_chars(std::vector<int64_t>(c.train.begin(), c.train.begin() + 15)), "First Citizen:\n");
  EXPECT_EQ(sd::decode_chars(std::vector<int64_t>(c.val.begin(), c.val.end())), text.substr(1003855));
  const sd::CharCorpus half = sd::load_char_corpus("tinyshakespeare", 0.5);
  EXPECT_EQ(half.val.size(), 557697u);  // floor(1,115,394 / 2)
}

TEST(DataTrainChars, KjvFromSetup) {
  const std::string path = sd::kjv_path();
  if (!sd::is_regular_file(path)) GTEST_SKIP() << path << " absent: run scripts/setup.sh (installs bible-kjv)";
  const sd::CharCorpus c = sd::load_char_corpus("kjv");
  EXPECT_EQ(c.name, "kjv");
  EXPECT_EQ(c.dropped_chars, 0);
  // 4,404,412 characters: val = floor(440,441.2).
  EXPECT_EQ(c.val.size(), 440441u);
  EXPECT_EQ(c.train.size(), 4404412u - 440441u);
  EXPECT_EQ(sd::decode_chars(std::vector<int64_t>(c.train.begin(), c.train.begin() + 22)), "Ge1:1 In the beginning");
  std::set<uint8_t> distinct(c.train.begin(), c.train.end());
  distinct.insert(c.val.begin(), c.val.end());
  EXPECT_EQ(distinct.size(), 73u);  // 72 printable characters and '\n'
}

TEST(DataTrainChars, WindowsAreDeterministicByTuple) {
  std::vector<uint8_t> split(1000);
  for (size_t i = 0; i < split.size(); ++i) split[i] = uint8_t(i % 96);
  const int64_t B = 8, T = 32;
  auto draw = [&](uint64_t seed, int64_t step, int64_t micro, int64_t batch) {
    std::vector<int64_t> out(size_t(batch * (T + 1)), -1);
    sd::sample_char_windows(split, batch, T, seed, step, micro, out.data());
    return out;
  };
  const auto a = draw(7, 100, 2, B);
  EXPECT_EQ(a, draw(7, 100, 2, B));
  EXPECT_NE(a, draw(8, 100, 2, B));
  EXPECT_NE(a, draw(7, 101, 2, B));
  EXPECT_NE(a, draw(7, 100, 3, B));
  const auto small = draw(7, 100, 2, 3);  // a smaller batch is a prefix of the larger one
  EXPECT_TRUE(std::equal(small.begin(), small.end(), a.begin()));
  // Every window is T + 1 consecutive ids of the split (here: each id one more, mod 96).
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) EXPECT_EQ(a[size_t(b * (T + 1) + t + 1)], (a[size_t(b * (T + 1) + t)] + 1) % 96);
}

TEST(DataTrainChars, WindowStartsCoverTheSplit) {
  // 10 ids, T = 3: starts 0..6. 1,400 draws: each start expected 200 times; a start never drawn
  // (or drawn more than twice its share) means a wrong range, not chance (P < 1e-40).
  std::vector<uint8_t> split = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  std::vector<int> count(7, 0);
  std::vector<int64_t> out(4 * 100);
  for (int64_t step = 0; step < 14; ++step) {
    sd::sample_char_windows(split, 100, 3, 1, step, 0, out.data());
    for (int b = 0; b < 100; ++b) ++count[size_t(out[size_t(b * 4)])];
  }
  for (int s = 0; s < 7; ++s) EXPECT_TRUE(count[size_t(s)] > 100 && count[size_t(s)] < 400) << s << ": " << count[size_t(s)];
  std::vector<int64_t> one(5);
  expect_error([&] { sd::sample_char_windows(split, 1, 10, 0, 0, 0, one.data()); }, {"'split'", "at least T + 1 = 11"});
  expect_error([&] { sd::sample_char_windows(split, 0, 3, 0, 0, 0, one.data()); }, {"'batch'"});
  expect_error([&] { sd::sample_char_windows(split, 1, 3, 0, -1, 0, one.data()); }, {"'step'", ">= 0"});
}

TEST(DataTrainChars, EvalWindowsTileTheSplit) {
  std::vector<uint8_t> split = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  EXPECT_EQ(sd::num_eval_windows(split, 3), 3);  // floor(9 / 3): targets 1..9, each once
  EXPECT_EQ(sd::num_eval_windows(split, 4), 2);  // targets 1..8; id 9 is in a partial tail
  std::vector<int64_t> w(4);
  for (int64_t k = 0; k < 3; ++k) {
    sd::eval_char_window(split, 3, k, w.data());
    EXPECT_EQ(w, (std::vector<int64_t>{3 * k, 3 * k + 1, 3 * k + 2, 3 * k + 3}));
  }
  expect_error([&] { sd::eval_char_window(split, 3, 3, w.data()); }, {"'k'", "[0, 3)", "got 3"});
}

// ------------------------------------------------------------------------------------------------
// In-context regression

TEST(DataTrainIcr, CurriculumStages) {
  const sd::IcrOptions o;  // d = 16, start 4 dims / 8 points, every 2,000 steps, 15 updates
  EXPECT_EQ(sd::icr_dims_increment(o), 1);  // ceil(12 / 15) = 1
  EXPECT_EQ(sd::icr_max_tokens(o), 64);
  auto at = [&](int64_t step) {
    const sd::IcrStage s = sd::icr_stage(o, step);
    return std::make_pair(s.active_dims, s.points);
  };
  EXPECT_EQ(at(0), std::make_pair(int64_t(4), int64_t(8)));
  EXPECT_EQ(at(1999), std::make_pair(int64_t(4), int64_t(8)));
  EXPECT_EQ(at(2000), std::make_pair(int64_t(5), int64_t(10)));
  EXPECT_EQ(at(4000), std::make_pair(int64_t(6), int64_t(12)));
  EXPECT_EQ(at(22000), std::make_pair(int64_t(15), int64_t(30)));
  EXPECT_EQ(at(24000), std::make_pair(int64_t(16), int64_t(32)));  // full after 12 updates
  EXPECT_EQ(at(int64_t(1) << 62), std::make_pair(int64_t(16), int64_t(32)));
  EXPECT_EQ(sd::icr_full_size_step(o), 24000);

  sd::IcrOptions o64 = o;  // d = 64: inc ceil(60 / 15) = 4, points by 8: full exactly at update 15
  o64.dim = 64;
  EXPECT_EQ(sd::icr_dims_increment(o64), 4);
  EXPECT_EQ(sd::icr_stage(o64, 29999).active_dims, 60);
  EXPECT_EQ(sd::icr_stage(o64, 29999).points, 120);
  EXPECT_EQ(sd::icr_stage(o64, 30000).active_dims, 64);
  EXPECT_EQ(sd::icr_stage(o64, 30000).points, 128);
  EXPECT_EQ(sd::icr_full_size_step(o64), 30000);

  sd::IcrOptions o128 = o;  // d = 128: inc ceil(124 / 15) = 9, clamped at update 14
  o128.dim = 128;
  EXPECT_EQ(sd::icr_stage(o128, 26000).active_dims, 121);
  EXPECT_EQ(sd::icr_stage(o128, 26000).points, 242);
  EXPECT_EQ(sd::icr_stage(o128, 28000).active_dims, 128);
  EXPECT_EQ(sd::icr_stage(o128, 28000).points, 256);

  // For every width the curriculum completes within 15 updates, and not before icr_full_size_step.
  for (int64_t d : {4, 5, 8, 16, 32, 64, 128, 256, 1024}) {
    sd::IcrOptions od = o;
    od.dim = d;
    const int64_t full = sd::icr_full_size_step(od);
    EXPECT_LE(full / od.interval, od.updates) << d;
    EXPECT_EQ(sd::icr_stage(od, full).active_dims, d);
    EXPECT_EQ(sd::icr_stage(od, full).points, 2 * d);
    if (full > 0) {
      EXPECT_LT(sd::icr_stage(od, full - 1).points, 2 * d) << d;
    }
  }
}

TEST(DataTrainIcr, BadOptionsNameTheOption) {
  sd::IcrOptions o;
  o.start_dims = 17;
  expect_error([&] { sd::icr_stage(o, 0); }, {"'start_dims'", "in [1, dim = 16]", "got 17"});
  o = {};
  o.start_points = 33;
  expect_error([&] { sd::icr_stage(o, 0); }, {"'start_points'", "in [1, 2 dim = 32]"});
  o = {};
  o.interval = 0;
  expect_error([&] { sd::icr_stage(o, 0); }, {"'interval'"});
  o = {};
  o.updates = 0;
  expect_error([&] { sd::icr_stage(o, 0); }, {"'updates'"});
  o = {};
  o.dim = 0;
  expect_error([&] { sd::icr_max_tokens(o); }, {"'dim'"});
  expect_error([] { sd::icr_stage({}, -1); }, {"'step'"});
  std::vector<float> tok(2 * 33 * 16), tgt(33);
  expect_error([&] { sd::icr_batch({}, {4, 33}, 1, 0, 0, 0, tok.data(), tgt.data()); }, {"'stage.points'"});
  expect_error([&] { sd::icr_batch({}, {17, 8}, 1, 0, 0, 0, tok.data(), tgt.data()); }, {"'stage.active_dims'"});
}

struct IcrBatch {
  int64_t B, n, d;
  std::vector<float> tokens, targets;
  float x(int64_t b, int64_t i, int64_t j) const { return tokens[size_t(((b * 2 * n) + 2 * i) * d + j)]; }
  float y_token(int64_t b, int64_t i, int64_t j) const { return tokens[size_t(((b * 2 * n) + 2 * i + 1) * d + j)]; }
};

IcrBatch icr_draw(const sd::IcrOptions& o, const sd::IcrStage& s, int64_t B, uint64_t seed, int64_t step, int64_t micro) {
  IcrBatch r{B, s.points, o.dim, {}, {}};
  r.tokens.assign(size_t(B * 2 * s.points * o.dim), NAN);  // NaN: a slot the generator forgot shows
  r.targets.assign(size_t(B * s.points), NAN);
  sd::icr_batch(o, s, B, seed, step, micro, r.tokens.data(), r.targets.data());
  return r;
}

// Solves A w = y (n x n, row-major) by Gaussian elimination with partial pivoting, in double.
std::vector<double> solve(std::vector<double> A, std::vector<double> y) {
  const size_t n = y.size();
  for (size_t c = 0; c < n; ++c) {
    size_t p = c;
    for (size_t r = c + 1; r < n; ++r)
      if (std::fabs(A[r * n + c]) > std::fabs(A[p * n + c])) p = r;
    for (size_t k = 0; k < n; ++k) std::swap(A[c * n + k], A[p * n + k]);
    std::swap(y[c], y[p]);
    for (size_t r = c + 1; r < n; ++r) {
      const double f = A[r * n + c] / A[c * n + c];
      for (size_t k = c; k < n; ++k) A[r * n + k] -= f * A[c * n + k];
      y[r] -= f * y[c];
    }
  }
  std::vector<double> w(n);
  for (size_t c = n; c-- > 0;) {
    double s = y[c];
    for (size_t k = c + 1; k < n; ++k) s -= A[c * n + k] * w[k];
    w[c] = s / A[c * n + c];
  }
  return w;
}

TEST(DataTrainIcr, PromptLayoutAndLinearity) {
  const sd::IcrOptions o;
  const sd::IcrStage s{6, 14};  // mid-curriculum: 6 of 16 coordinates active
  const IcrBatch r = icr_draw(o, s, 4, 3, 5, 0);
  for (float v : r.tokens) ASSERT_TRUE(std::isfinite(v)) << "a token slot left unwritten";
  std::vector<double> w_first;
  for (int64_t b = 0; b < r.B; ++b) {
    for (int64_t i = 0; i < r.n; ++i) {
      for (int64_t j = 0; j < r.d; ++j) {
        if (j >= s.active_dims) {
          EXPECT_EQ(r.x(b, i, j), 0.0f) << "x coord beyond d_active";
        }
        if (j >= 1) {
          EXPECT_EQ(r.y_token(b, i, j), 0.0f) << "y token is [y, 0, ..., 0]";
        }
      }
      EXPECT_EQ(r.y_token(b, i, 0), r.targets[size_t(b * r.n + i)]);
    }
    // y_i = x_i . w with one w per prompt: the least-squares w over all 14 points (normal
    // equations in double) fits every point. The only misfit is rounding y to float (6e-8 of |y|,
    // and |y| < 6 here): 1e-5 is a wide margin, while y with any other dependence on x, or a w that
    // changed inside the prompt, misses by O(1).
    const int64_t da = s.active_dims;
    std::vector<double> AtA(size_t(da * da), 0.0), Aty(size_t(da), 0.0);
    for (int64_t i = 0; i < r.n; ++i)
      for (int64_t j = 0; j < da; ++j) {
        Aty[size_t(j)] += double(r.x(b, i, j)) * r.targets[size_t(b * r.n + i)];
        for (int64_t k = 0; k < da; ++k) AtA[size_t(j * da + k)] += double(r.x(b, i, j)) * r.x(b, i, k);
      }
    const std::vector<double> w = solve(AtA, Aty);
    for (int64_t i = 0; i < r.n; ++i) {
      double pred = 0;
      for (int64_t j = 0; j < da; ++j) pred += r.x(b, i, j) * w[size_t(j)];
      EXPECT_NEAR(pred, r.targets[size_t(b * r.n + i)], 1e-5) << "prompt " << b << " point " << i;
    }
    if (b == 0) {
      w_first = w;
    } else {
      EXPECT_GT(std::fabs(w[0] - w_first[0]), 1e-6) << "each prompt draws its own w";
    }
  }
}

TEST(DataTrainIcr, StatisticsMatchTheProtocol) {
  // Full size d = 16: E[y^2] = E|w|^2 / d = 1. Per prompt, the mean of y_i^2 over n points is
  // s Q with s = |w|^2/d (variance 2/d) and Q a mean of n chi^2_1 / n (variance 2/n), so its
  // variance is (1 + 2/d)(1 + 2/n) - 1 = 0.195 for d = 16, n = 32; over P = 4,096 prompts the
  // estimate's std is sqrt(0.195 / 4096) = 0.0069: a 0.035 tolerance is 5 sigma.
  const sd::IcrOptions o;
  const int64_t P = 4096;
  const IcrBatch r = icr_draw(o, sd::icr_stage(o, 1'000'000), P, 11, 0, 0);
  ASSERT_EQ(r.n, 32);
  double sum = 0, sq = 0;
  for (float y : r.targets) sum += y, sq += double(y) * y;
  const double N = double(r.targets.size());
  EXPECT_NEAR(sq / N, 1.0, 0.035);
  EXPECT_NEAR(sum / N, 0.0, 0.014);  // y_i independent given w, variance 1: std 1/sqrt(131072) = 0.0028, 5 sigma
  // x coordinates: variance 1/d_active, so d_active E[x^2] = 1; x^2 d_active has variance 2 over
  // P n d = 2.1M samples: std 0.001, 5 sigma 0.005.
  double xsq = 0;
  for (int64_t b = 0; b < P; ++b)
    for (int64_t i = 0; i < r.n; ++i)
      for (int64_t j = 0; j < r.d; ++j) xsq += double(r.x(b, i, j)) * r.x(b, i, j);
  EXPECT_NEAR(xsq / double(P * r.n * r.d) * double(r.d), 1.0, 0.005);

  // At the curriculum's start (4 dims, 8 points) too: s has variance 2/4, so the per-prompt variance
  // is (1.5)(1.25) - 1 = 0.875: std over 4,096 prompts 0.0146, 5 sigma 0.073.
  const IcrBatch r0 = icr_draw(o, sd::icr_stage(o, 0), P, 12, 0, 0);
  double sq0 = 0;
  for (float y : r0.targets) sq0 += double(y) * y;
  EXPECT_NEAR(sq0 / double(r0.targets.size()), 1.0, 0.073);
}

TEST(DataTrainIcr, DeterministicByTuple) {
  const sd::IcrOptions o;
  const sd::IcrStage s = sd::icr_stage(o, 0);
  const IcrBatch a = icr_draw(o, s, 6, 1, 2, 3);
  EXPECT_EQ(a.tokens, icr_draw(o, s, 6, 1, 2, 3).tokens);
  EXPECT_EQ(a.targets, icr_draw(o, s, 6, 1, 2, 3).targets);
  EXPECT_NE(a.targets, icr_draw(o, s, 6, 9, 2, 3).targets);
  EXPECT_NE(a.targets, icr_draw(o, s, 6, 1, 4, 3).targets);
  EXPECT_NE(a.targets, icr_draw(o, s, 6, 1, 2, 0).targets);
  const IcrBatch small = icr_draw(o, s, 2, 1, 2, 3);  // prompt b does not depend on the batch size
  EXPECT_TRUE(std::equal(small.tokens.begin(), small.tokens.end(), a.tokens.begin()));
}

// ------------------------------------------------------------------------------------------------
// ETTh1

class DataTrainEtt : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!sd::find_shared_file("data/ett/ETTh1.csv").empty()) data_ = new sd::EttData(sd::load_ett("ETTh1"));
  }
  static void TearDownTestSuite() {
    delete data_;
    data_ = nullptr;
  }
  void SetUp() override {
    if (!data_) GTEST_SKIP() << "shared/data/ett/ETTh1.csv not found (set STRATA_SHARED_DIR)";
  }
  static const sd::EttData& d() { return *data_; }
  static sd::EttData* data_;
};
sd::EttData* DataTrainEtt::data_ = nullptr;

TEST_F(DataTrainEtt, LoadsTheFile) {
  EXPECT_EQ(d().name, "ETTh1");
  EXPECT_EQ(d().rows, 17420);
  EXPECT_EQ(d().channels, 7);
  EXPECT_EQ(d().columns, (std::vector<std::string>{"HUFL", "HULL", "MUFL", "MULL", "LUFL", "LULL", "OT"}));
  EXPECT_EQ(d().values.size(), size_t(17420 * 7));
}

TEST_F(DataTrainEtt, StandardisedWithTrainStatistics) {
  // The raw train means / population stds (Python over the same rows [0, 8640)).
  const double mean[7] = {7.937742245659508, 2.0210386567335163, 5.079770601157927, 0.7461858799957015,
                          2.781762386375555, 0.7884531235540096, 17.1282616982271};
  const double stdv[7] = {5.81274940914376, 2.0901046504075986, 5.51879357903625, 1.9263792741329897,
                          1.0235226594952223, 0.6302366362251974, 9.176491024944383};
  const int64_t C = 7;
  for (int64_t c = 0; c < C; ++c) {
    EXPECT_NEAR(d().mean[size_t(c)], mean[c], 1e-6 * std::fabs(mean[c])) << c;  // float storage: 6e-8 relative
    EXPECT_NEAR(d().std[size_t(c)], stdv[c], 1e-6 * stdv[c]) << c;
    // Train columns: mean 0, std 1. Each stored value is rounded to float (|v| < 10: error < 6e-7).
    double s = 0, sq = 0;
    for (int64_t r = 0; r < sd::kEttTrainEnd; ++r) s += d().values[size_t(r * C + c)];
    const double m = s / double(sd::kEttTrainEnd);
    for (int64_t r = 0; r < sd::kEttTrainEnd; ++r) sq += std::pow(d().values[size_t(r * C + c)] - m, 2);
    EXPECT_NEAR(m, 0.0, 1e-6) << c;
    EXPECT_NEAR(std::sqrt(sq / double(sd::kEttTrainEnd)), 1.0, 1e-6) << c;
  }
  // A test row back in raw units: row 14,399 (the test split's last), OT = 2.321000099182129.
  EXPECT_NEAR(d().values[size_t(14399 * C + 6)] * stdv[6] + mean[6], 2.321000099182129, 1e-5);
}

TEST_F(DataTrainEtt, WindowCountsFollowTheBorders) {
  // train [0, 8640): 8640 - L - H + 1; val [8640 - L, 11520) and test [11520 - L, 14400):
  // 2880 + L - L - H + 1 = 2881 - H, whatever L.
  EXPECT_EQ(sd::ett_num_windows(d(), sd::EttSplit::test, 336, 96), 2785);
  EXPECT_EQ(sd::ett_num_windows(d(), sd::EttSplit::val, 336, 96), 2785);
  EXPECT_EQ(sd::ett_num_windows(d(), sd::EttSplit::train, 336, 96), 8209);
  EXPECT_EQ(sd::ett_num_windows(d(), sd::EttSplit::test, 336, 720), 2161);
  EXPECT_EQ(sd::ett_num_windows(d(), sd::EttSplit::test, 512, 192), 2689);
  EXPECT_EQ(sd::ett_num_windows(d(), sd::EttSplit::train, 512, 720), 7409);
  // The last test window's target ends on row 14,399; the first's input starts on 11,520 - L.
  const int64_t L = 336, H = 96, C = 7;
  std::vector<float> in(size_t(L * C)), out(size_t(H * C));
  sd::ett_window(d(), sd::EttSplit::test, L, H, 2784, in.data(), out.data());
  EXPECT_TRUE(std::equal(out.begin(), out.end(), d().values.begin() + (14400 - H) * C));
  EXPECT_TRUE(std::equal(in.begin(), in.end(), d().values.begin() + (14400 - H - L) * C));
  sd::ett_window(d(), sd::EttSplit::test, L, H, 0, in.data(), out.data());
  EXPECT_TRUE(std::equal(in.begin(), in.end(), d().values.begin() + (11520 - L) * C));
  EXPECT_TRUE(std::equal(out.begin(), out.end(), d().values.begin() + 11520 * C));
  sd::ett_window(d(), sd::EttSplit::val, L, H, 0, in.data(), out.data());
  EXPECT_TRUE(std::equal(out.begin(), out.end(), d().values.begin() + 8640 * C));
  expect_error([&] { sd::ett_window(d(), sd::EttSplit::test, L, H, 2785, in.data(), out.data()); },
               {"'index'", "[0, 2785)"});
  expect_error([&] { sd::ett_num_windows(d(), sd::EttSplit::val, 8641, 1); }, {"'L'", "<= 8640"});
  expect_error([&] { sd::ett_num_windows(d(), sd::EttSplit::test, 11521, 1); }, {"'L'", "<= 11520"});
  expect_error([&] { sd::ett_num_windows(d(), sd::EttSplit::val, 96, 2881); }, {"'L + H'"});
  expect_error([&] { sd::ett_num_windows(d(), sd::EttSplit::val, 0, 96); }, {"'L'", ">= 1"});
}

TEST_F(DataTrainEtt, TrainingSamplesAreTrainWindowsByTuple) {
  const int64_t L = 96, H = 24, B = 5, C = 7;
  auto draw = [&](uint64_t seed, int64_t step, int64_t micro) {
    std::vector<float> in(size_t(B * L * C)), out(size_t(B * H * C));
    sd::ett_sample(d(), L, H, B, seed, step, micro, in.data(), out.data());
    in.insert(in.end(), out.begin(), out.end());
    return in;
  };
  const auto a = draw(1, 2, 3);
  EXPECT_EQ(a, draw(1, 2, 3));
  EXPECT_NE(a, draw(2, 2, 3));
  EXPECT_NE(a, draw(1, 3, 3));
  EXPECT_NE(a, draw(1, 2, 4));
  // Each sample is a train window: input row 0 found among the train rows, then the whole window matches.
  const int64_t n = sd::ett_num_windows(d(), sd::EttSplit::train, L, H);
  std::vector<float> win_in(size_t(L * C)), win_out(size_t(H * C));
  for (int64_t b = 0; b < B; ++b) {
    const float* in = a.data() + b * L * C;
    const float* out = a.data() + B * L * C + b * H * C;
    int64_t k = 0;
    while (k < n && !std::equal(in, in + C, d().values.begin() + k * C)) ++k;
    ASSERT_LT(k, n) << "sample " << b << " is not a train window";
    sd::ett_window(d(), sd::EttSplit::train, L, H, k, win_in.data(), win_out.data());
    EXPECT_TRUE(std::equal(win_in.begin(), win_in.end(), in)) << b;
    EXPECT_TRUE(std::equal(win_out.begin(), win_out.end(), out)) << b;
  }
}

// ------------------------------------------------------------------------------------------------
// Checksums: an altered or missing file is a clear error naming it, the sha256s and how to get it.

TEST(DataTrainChecksums, AlteredCopiesAreRefused) {
  const std::string ett = sd::find_shared_file("data/ett/ETTh1.csv");
  const std::string shakespeare = sd::find_shared_file("data/text/tinyshakespeare.txt");
  if (ett.empty() || shakespeare.empty()) GTEST_SKIP() << "shared data files not found (set STRATA_SHARED_DIR)";
  TempDir tmp;
  // An exact copy passes (the path route works), one changed byte does not.
  std::string text = read_all(shakespeare);
  EXPECT_EQ(sd::load_char_corpus(tmp.write("tinyshakespeare.txt", text)).val.size(), 111539u);
  text[1000] = text[1000] == 'a' ? 'b' : 'a';
  const std::string bad_text = tmp.write("tinyshakespeare.txt", text);
  expect_error([&] { sd::load_char_corpus(bad_text); },
               {"tinyshakespeare file '" + bad_text + "'", "expected sha256 " + std::string(sd::kTinyShakespeareSha256),
                "got " + sd::sha256_file_hex(bad_text), "karpathy/char-rnn", "STRATA_SHARED_DIR"});
  std::string csv = read_all(ett);
  csv.back() = '\n' == csv.back() ? ' ' : '\n';
  const std::string bad_csv = tmp.write("ETTh1.csv", csv);
  expect_error([&] { sd::load_ett(bad_csv); }, {"ETTh1 file '" + bad_csv + "'", "expected sha256 " + std::string(sd::kEtth1Sha256),
                                               "got " + sd::sha256_file_hex(bad_csv), "zhouhaoyi/ETDataset"});
}

TEST(DataTrainChecksums, MissingFilesSayHowToGetThem) {
  TempDir tmp;
  {
    ScopedEnv home("STRATA_HOME", tmp.dir());
    EXPECT_EQ(sd::kjv_path(), tmp.dir() + "/data/kjv.txt");
    expect_error([] { sd::load_char_corpus("kjv"); },
                 {"kjv file '" + tmp.dir() + "/data/kjv.txt'", "missing", "expected sha256 " + std::string(sd::kKjvSha256),
                  "got none", "scripts/setup.sh", "apt-get install bible-kjv", "bible -f 'gen1:1-rev22:21'"});
  }
  expect_error([] { sd::load_ett("/nonexistent/ETTh1.csv"); },
               {"ETTh1 file '/nonexistent/ETTh1.csv'", "missing", sd::kEtth1Sha256, "got none", "zhouhaoyi/ETDataset"});
  expect_error([] { sd::load_char_corpus("/nonexistent/kjv.txt"); }, {"missing", sd::kKjvSha256, "scripts/setup.sh"});
  expect_error([] { sd::load_char_corpus("shakespeare"); },
               {"'name_or_path'", "'tinyshakespeare', 'kjv' or the path of a text file", "'shakespeare' (no such file)"});
  expect_error([] { sd::load_ett("ETTh2"); }, {"'name'", "'ETTh1' or the path", "'ETTh2' (no such file)"});
}

TEST(DataTrainChecksums, MalformedEttCsvNamesTheLine) {
  TempDir tmp;
  const std::string bad_field = tmp.write("mine.csv", "date,a,b\n2016-07-01 00:00:00,1.5,x\n");
  expect_error([&] { sd::load_ett(bad_field); }, {"line 2", "field 3 (b)", "expected a finite number, got 'x'"});
  const std::string short_row = tmp.write("short.csv", "date,a,b\n2016-07-01 00:00:00,1.5\n");
  expect_error([&] { sd::load_ett(short_row); }, {"line 2", "expected 3 comma-separated fields, got 2"});
  const std::string few = tmp.write("few.csv", "date,a\n2016-07-01 00:00:00,1.5\n");
  expect_error([&] { sd::load_ett(few); }, {"at least 14400 data rows", "got 1"});
  const std::string header = tmp.write("header.csv", "when,a\n");
  expect_error([&] { sd::load_ett(header); }, {"line 1", "expected a header 'date,<channel>,...'"});
}

}  // namespace
