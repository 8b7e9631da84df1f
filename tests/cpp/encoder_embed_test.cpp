// tests/cpp/encoder_embed_test.cpp: the converted encoder on the user's own text (what
// `strata embed` and strata.SentenceEncoder run: models::load_converted_encoder +
// SentenceEncoder::embed) gives the embeddings of the conversion benchmark's encoder object (the
// model run_conversion converts with models::convert and embeds with embed_ids), and the rows of
// its length-sorted batches equal one-at-a-time embeddings. tests/python/test_embed.py checks the
// CLI against Python. Tests that need the model skip when scripts/setup_encoder.sh has not
// installed it.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "data/minilm.h"
#include "minilm_suite.h"
#include "models/conversion.h"
#include "strata/error.h"
#include "strata/threading.h"

namespace {

using strata::models::ConversionMethod;
using strata::models::parse_conversion_method;
using strata::models::SentenceEncoder;

// What a message from f() says ("(no error)" when f does not throw strata::Error).
std::string message(const std::function<void()>& f) {
  try {
    f();
  } catch (const strata::Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(EmbedMethod, LayersApartOrInTheSpec) {
  const ConversionMethod apart = parse_conversion_method("monarch:T=2,B=8", {3, 4, 5});
  EXPECT_EQ(apart.label(), "monarch:T=2,B=8@3,4,5");
  EXPECT_EQ(apart.spec, parse_conversion_method("monarch:T=2,B=8@3,4,5").spec);
  EXPECT_EQ(apart.layers, parse_conversion_method("monarch:T=2,B=8@3,4,5").layers);
  EXPECT_TRUE(parse_conversion_method("softmax", {}).layers.empty());
  EXPECT_NE(message([] { parse_conversion_method("monarch@1", {2}); }).find("argument 'layers'"), std::string::npos);
  EXPECT_NE(message([] { parse_conversion_method("monarch:T=0", {2}); }).find("key 'T'"), std::string::npos);
}

class EmbedTest : public MiniLmSuite<EmbedTest> {
 protected:

  // The benchmark's encoder object for method m: run_conversion's model, converted as its row
  // loop does (back to softmax, then the method).
  static SentenceEncoder& benchmark_encoder(const ConversionMethod& m) {
    strata::models::convert(model_->encoder, strata::models::AttentionSpec{}, {});
    strata::models::convert(model_->encoder, m.spec, m.layers);
    return *model_;
  }
  // The token ids run_conversion gives the model for each text.
  static std::vector<std::vector<int64_t>> token_ids(const std::vector<std::string>& texts) {
    std::vector<std::vector<int64_t>> ids;
    for (const auto& t : texts) ids.push_back(model_->tokenizer.encode(t, model_->max_len).ids);
    return ids;
  }

  // Lengths 9, 9, 9, 3, 2, 33, 9, ...: runs of equal length batch together, others alone.
  const std::vector<std::string> texts_ = {
      "A man is playing a guitar.",
      "The new movie is awesome.",
      "A woman is playing a violin.",
      "Short.",
      "",
      "The quick brown fox jumps over the lazy dog while the farmer watches from the porch, "
      "wondering whether the fence will hold through another winter of storms.",
      "A man is playing a flute.",
      "Café au lait and 東京 in one line."};
};

TEST_F(EmbedTest, UserTextGivesTheBenchmarksEmbeddings) {
  // Monarch at a fixed and at the length-dependent default block, in all and in some layers, and
  // the baselines (Performer with a seed: without one, features are redrawn on every call).
  for (const char* spec : {"softmax", "monarch:T=2,B=8", "monarch:T=2@0,1,2", "nystrom:landmarks=8@3,4,5",
                           "performer:features=64,seed=0"}) {
    const ConversionMethod m = parse_conversion_method(spec);
    const at::Tensor got = strata::models::load_converted_encoder(m).embed(texts_, /*batch_size=*/2);
    ASSERT_EQ(got.sizes(), (at::IntArrayRef{int64_t(texts_.size()), 384})) << spec;

    SentenceEncoder& bench = benchmark_encoder(m);
    const std::vector<std::vector<int64_t>> ids = token_ids(texts_);
    const at::Tensor bench_rows = bench.embed_ids(ids, /*batch_size=*/32);  // run_conversion's call
    // One sentence per forward, no batching at all.
    std::vector<at::Tensor> alone;
    for (const auto& one : ids) {
      const at::Tensor t = at::tensor(one, at::kLong).view({1, int64_t(one.size())});
      alone.push_back(bench.encoder.embed(t, at::ones_like(t)));
    }
    const at::Tensor one_at_a_time = at::cat(alone);
    // The same weights and kernels; only the GEMMs' fp32 blocking differs with the batch size
    // (rows are unit vectors, entries ~0.05: 1e-5 is ~200 float32 ulps of an entry).
    EXPECT_LT((got - one_at_a_time).abs().max().item<double>(), 1e-5) << spec;
    EXPECT_LT((bench_rows - one_at_a_time).abs().max().item<double>(), 1e-5) << spec;
    EXPECT_LT((got.norm(2, {1}) - 1).abs().max().item<double>(), 1e-5) << spec;
  }
  // The method really changed the model (the comparison above is not softmax against itself).
  const at::Tensor softmax = strata::models::load_converted_encoder(parse_conversion_method("softmax")).embed(texts_);
  const at::Tensor monarch =
      strata::models::load_converted_encoder(parse_conversion_method("monarch:T=1,B=2")).embed(texts_);
  EXPECT_GT((softmax - monarch).abs().max().item<double>(), 1e-3);
}

TEST_F(EmbedTest, ChecksItsArguments) {
  SentenceEncoder& model = benchmark_encoder(parse_conversion_method("softmax"));
  EXPECT_EQ(model.embed({}).sizes(), (at::IntArrayRef{0, 384}));
  EXPECT_NE(message([&] { model.embed(texts_, 0); }).find("argument 'batch_size'"), std::string::npos);
  for (int64_t bad : {1, 513}) {
    model.max_len = bad;
    EXPECT_NE(message([&] { model.embed(texts_); }).find("argument 'max_len'"), std::string::npos) << bad;
  }
  model.max_len = 256;
  const std::string bad_utf8 = message([&] { model.embed({"fine", "\xff not UTF-8", "fine"}); });
  EXPECT_NE(bad_utf8.find("text 2 of 3 (texts[1])"), std::string::npos) << bad_utf8;
  EXPECT_NE(bad_utf8.find("valid UTF-8"), std::string::npos) << bad_utf8;
  EXPECT_NE(message([] { strata::models::load_converted_encoder(parse_conversion_method("monarch@6")); })
                .find("argument 'layers'"),
            std::string::npos);
}

TEST_F(EmbedTest, TruncatesAtMaxLength) {
  SentenceEncoder& model = benchmark_encoder(parse_conversion_method("softmax"));
  std::string longer;
  for (int i = 0; i < 100; ++i) longer += "the river bends past the mill ";
  const at::Tensor at_256 = model.embed({longer});
  model.max_len = 16;
  const at::Tensor at_16 = model.embed({longer});
  const at::Tensor first_16 = model.embed({"the river bends past the mill the river bends past the mill the river bends"});
  model.max_len = 256;
  EXPECT_LT((at_16 - first_16).abs().max().item<double>(), 1e-5);  // 14 pieces + [CLS] + [SEP]
  EXPECT_GT((at_16 - at_256).abs().max().item<double>(), 1e-4);
}

}  // namespace
