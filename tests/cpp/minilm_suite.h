// tests/cpp/minilm_suite.h: the suite set-up shared by the tests that need all-MiniLM-L6-v2
// (encoder_{bert,convert,embed}_test.cpp): the model loaded once per suite, or every test of the
// suite skipped with the reason (the model comes from scripts/setup_encoder.sh); one thread for ATen
// and for strata's kernels while the suite runs, restored after it. One thread because ctest runs
// test processes side by side, and spinning thread pools on oversubscribed cores made the STS-B pass
// 2-10x slower than one thread (measured on the 2-core machine: 8 s single-threaded vs 15-140 s with
// 2 threads). Each test starts from the model with dense attention (a test may plug in another).
#pragma once
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>

#include "data/minilm.h"
#include "models/bert_encoder.h"
#include "strata/threading.h"

// Suite: the derived fixture (one model per suite: the statics are per instantiation).
template <class Suite>
class MiniLmSuite : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string why;
    dir_ = strata::data::find_minilm_dir(&why);
    if (dir_.empty()) {
      skip_reason_ = "all-MiniLM-L6-v2 not installed: " + why;
      return;
    }
    model_ = std::make_unique<strata::models::SentenceEncoder>(strata::models::SentenceEncoder::load(dir_));
    saved_threads_ = {at::get_num_threads(), strata::get_num_threads()};
    at::set_num_threads(1);
    strata::set_num_threads(1);
  }
  static void TearDownTestSuite() {
    if (model_) {
      at::set_num_threads(saved_threads_.first);
      strata::set_num_threads(saved_threads_.second);
    }
    model_.reset();
  }
  void SetUp() override {
    if (!model_) GTEST_SKIP() << skip_reason_;
    model_->encoder.set_attention(strata::models::dense_attention());  // undo what a test plugged in
  }

  static inline std::string dir_, skip_reason_;
  static inline std::unique_ptr<strata::models::SentenceEncoder> model_;
  static inline std::pair<int, int> saved_threads_;
};
