// tests/cpp/encoder_bert_test.cpp: the BERT encoder (models/bert_encoder.h) end to end on
// all-MiniLM-L6-v2: sentence embeddings against the Python reference (sentence-transformers,
// tests/cpp/encoder_reference_data.cpp), padding invariance, the pluggable attention, input
// checks, and the STS-B test Spearman that validates the whole stack (docs/methods.md).
// Tests that need the model skip when scripts/setup_encoder.sh has not installed it.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "data/minilm.h"
#include "minilm_suite.h"
#include "data/sha256.h"
#include "data/shared_files.h"
#include "data/sts.h"
#include "models/bert_encoder.h"
#include "strata/error.h"
#include "strata/threading.h"

namespace strata::test {
extern const char* const kReferenceTexts[4];
extern const float kReferenceEmbeddings[4][384];
}  // namespace strata::test

namespace {

using strata::models::AttentionFn;
using strata::models::BertConfig;
using strata::models::SentenceEncoder;

// Files by POSIX calls, not std::filesystem: libtorch.so exports its own (older) copies of the
// std::filesystem functions, and this executable, linked with torch, binds to them
// (std::filesystem::remove_all crashed).
std::string temp_dir() {
  const char* t = std::getenv("TMPDIR");
  return t && *t ? t : "/tmp";
}
// Published STS-B test Spearman x 100 of all-MiniLM-L6-v2 (MTEB STSBenchmark, cosine), and what
// the Python reference (tools/encoder_reference.py) measures on shared/data/sts/sts-test.csv.
constexpr double kPublishedStsb = 82.03;
constexpr double kReferenceStsb = 82.0325;

double cosine(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor x = a.to(at::kDouble).flatten(), y = b.to(at::kDouble).flatten();
  return (x.dot(y) / (x.norm() * y.norm())).item<double>();
}

// Plain softmax attention by ATen (independent of strata's kernel); q, k, v batch x seq x heads x dim.
at::Tensor aten_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& kpm) {
  const at::Tensor mask = kpm.view({kpm.size(0), 1, 1, kpm.size(1)});
  return at::scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask)
      .transpose(1, 2);
}

class EncoderTest : public MiniLmSuite<EncoderTest> {
 protected:
  // ids, mask (int64 batch x seq, padded) for texts.
  static std::pair<at::Tensor, at::Tensor> batch(const std::vector<std::string>& texts) {
    const auto b = model_->tokenizer.encode_batch(texts, 256);
    at::Tensor ids = at::tensor(b.ids, at::kLong).view({b.batch, b.seq});
    at::Tensor mask = at::tensor(b.attention_mask, at::kLong).view({b.batch, b.seq});
    return {ids, mask};
  }

};

TEST_F(EncoderTest, ConfigOfMiniLm) {
  const BertConfig& c = model_->encoder.config();
  EXPECT_EQ(c.layers, 6);
  EXPECT_EQ(c.hidden, 384);
  EXPECT_EQ(c.heads, 12);
  EXPECT_EQ(c.head_dim(), 32);
  EXPECT_EQ(c.intermediate, 1536);
  EXPECT_EQ(c.vocab_size, 30522);
  EXPECT_EQ(c.max_positions, 512);
  EXPECT_DOUBLE_EQ(c.layer_norm_eps, 1e-12);
}

TEST_F(EncoderTest, MatchesSentenceTransformersReference) {
  std::vector<std::string> texts(std::begin(strata::test::kReferenceTexts), std::end(strata::test::kReferenceTexts));
  // The last text is longer than the model's 256 tokens: both sides truncate it.
  EXPECT_TRUE(model_->tokenizer.encode(texts.back(), model_->max_len).truncated);
  const at::Tensor emb = model_->embed(texts);
  ASSERT_EQ(emb.sizes(), (at::IntArrayRef{4, 384}));
  for (size_t i = 0; i < texts.size(); ++i) {
    const at::Tensor want = at::from_blob(const_cast<float*>(strata::test::kReferenceEmbeddings[i]), {384}, at::kFloat);
    const double cos = cosine(emb[int64_t(i)], want);
    const double max_diff = (emb[int64_t(i)] - want).abs().max().item<double>();
    std::printf("[ reference ] text %zu: 1 - cosine %.2e, max |diff| %.2e, norm %.6f\n", i, 1 - cos, max_diff,
                emb[int64_t(i)].norm().item<double>());
    EXPECT_GE(cos, 0.9999) << texts[i];
    EXPECT_LT(max_diff, 1e-4) << texts[i];
    EXPECT_NEAR(emb[int64_t(i)].norm().item<double>(), 1.0, 1e-5);
  }
}

TEST_F(EncoderTest, PaddingAndBatchingDoNotChangeEmbeddings) {
  const std::vector<std::string> texts = {"Short one.", strata::test::kReferenceTexts[2], "A man is playing a guitar."};
  const auto [ids, mask] = batch(texts);  // rows 0 and 2 are padded to row 1's length
  ASSERT_LT(mask[0].sum().item<int64_t>(), ids.size(1));
  const at::Tensor together = model_->encoder.embed(ids, mask);
  for (size_t i = 0; i < texts.size(); ++i) {
    const auto [one_ids, one_mask] = batch({texts[i]});
    const at::Tensor alone = model_->encoder.embed(one_ids, one_mask);
    EXPECT_LT((together[int64_t(i)] - alone[0]).abs().max().item<double>(), 1e-5) << texts[i];
  }
  // SentenceEncoder::embed sorts by length and batches; the order of its rows is the input's.
  const at::Tensor sorted = model_->embed(texts, /*batch_size=*/2);
  EXPECT_LT((sorted - together).abs().max().item<double>(), 1e-5);
}

TEST_F(EncoderTest, AttentionIsPluggablePerLayer) {
  const auto [ids, mask] = batch({"A man is playing a guitar.", "The new movie is awesome."});
  const at::Tensor base = model_->encoder.embed(ids, mask);

  // An independent softmax attention in layer 2 gives the same embeddings; it sees the layout
  // and mask the contract promises.
  int calls = 0;
  model_->encoder.set_attention(
      2, [&](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& kpm) {
        ++calls;
        EXPECT_EQ(q.sizes(), (at::IntArrayRef{2, ids.size(1), 12, 32}));
        EXPECT_EQ(k.sizes(), q.sizes());
        EXPECT_EQ(v.sizes(), q.sizes());
        EXPECT_EQ(kpm.scalar_type(), at::kBool);
        EXPECT_TRUE(kpm.equal(mask.to(at::kBool)));
        return aten_attention(q, k, v, kpm);
      });
  const at::Tensor swapped = model_->encoder.embed(ids, mask);
  EXPECT_EQ(calls, 1);
  EXPECT_LT((swapped - base).abs().max().item<double>(), 1e-5);

  // Every layer on ATen's attention: still the same model.
  model_->encoder.set_attention(AttentionFn(aten_attention));
  EXPECT_LT((model_->encoder.embed(ids, mask) - base).abs().max().item<double>(), 1e-5);

  // A different attention in one layer changes the output: the hook is really used. Uniform
  // attention over the valid keys (mean of v) stands in for an approximation.
  model_->encoder.set_attention(strata::models::dense_attention());
  model_->encoder.set_attention(4,
                                [](const at::Tensor&, const at::Tensor&, const at::Tensor& v, const at::Tensor& kpm) {
                                  const at::Tensor w = kpm.to(at::kFloat).view({kpm.size(0), kpm.size(1), 1, 1});
                                  const at::Tensor mean = (v * w).sum(1, true) / w.sum(1, true);
                                  return mean.expand_as(v).contiguous();
                                });
  const at::Tensor uniform = model_->encoder.embed(ids, mask);
  EXPECT_LT(cosine(uniform[0], base[0]), 0.999);
  EXPECT_GT(cosine(uniform[0], base[0]), 0.5);  // one layer of six: degraded, not destroyed
}

TEST_F(EncoderTest, ChecksItsArguments) {
  auto& enc = model_->encoder;
  const auto [ids, mask] = batch({"hello world"});
  const auto message = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const strata::Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_NE(message([&] { enc.set_attention(6, strata::models::dense_attention()); }).find("argument 'layer'"),
            std::string::npos);
  EXPECT_NE(message([&] { enc.set_attention(0, AttentionFn()); }).find("argument 'fn'"), std::string::npos);
  EXPECT_NE(message([&] { enc.forward(ids.to(at::kInt), mask); }).find("expected dtype int64"), std::string::npos);
  EXPECT_NE(message([&] { enc.forward(ids, mask.narrow(1, 0, 2)); }).find("argument 'attention_mask'"),
            std::string::npos);
  EXPECT_NE(message([&] { enc.forward(ids + 40000, mask); }).find("token ids in [0, 30522)"), std::string::npos);
  EXPECT_NE(message([&] {
              enc.forward(at::zeros({1, 513}, at::kLong), at::ones({1, 513}, at::kLong));
            }).find("at most 512 tokens"),
            std::string::npos);
  EXPECT_NE(message([&] { enc.forward(ids.flatten(), mask); }).find("argument 'ids'"), std::string::npos);
  // An attention that returns the wrong shape is named with its layer.
  enc.set_attention(1, [](const at::Tensor& q, const at::Tensor&, const at::Tensor&, const at::Tensor&) {
    return q.narrow(3, 0, 16);
  });
  EXPECT_NE(message([&] { enc.forward(ids, mask); }).find("attention output of layer 1"), std::string::npos);
}

TEST(EncoderConfig, RejectsWhatItDoesNotImplement) {
  const std::string path = temp_dir() + '/' + "strata_config_" + std::to_string(::getpid()) + ".json";
  const auto error_of = [&](const std::string& json) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << json;
    try {
      BertConfig::from_json_file(path);
    } catch (const strata::Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const std::string sizes = R"("vocab_size": 100, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
      "intermediate_size": 128, "max_position_embeddings": 32, "type_vocab_size": 2)";
  EXPECT_EQ(error_of("{" + sizes + "}"), "");
  EXPECT_NE(
      error_of(R"({"hidden_act": "relu", )" + sizes + "}").find("field 'hidden_act': expected \"gelu\", got \"relu\""),
      std::string::npos);
  EXPECT_NE(error_of(R"({"model_type": "roberta", )" + sizes + "}").find("field 'model_type'"), std::string::npos);
  EXPECT_NE(error_of(R"({"position_embedding_type": "relative_key", )" + sizes + "}").find("position_embedding_type"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"num_attention_heads": 5, "vocab_size": 100, "hidden_size": 64, "num_hidden_layers": 2,
      "intermediate_size": 128, "max_position_embeddings": 32, "type_vocab_size": 2})")
                .find("a divisor of hidden_size 64"),
            std::string::npos);
  EXPECT_NE(
      error_of(R"({"hidden_size": 64})").find("field 'vocab_size': expected a positive integer, got \"(missing)\""),
      std::string::npos);
  EXPECT_NE(error_of("{not json").find("not valid JSON"), std::string::npos);
  std::remove(path.c_str());
  EXPECT_NE(error_of("").find("not valid JSON"), std::string::npos);
  std::remove(path.c_str());
}

TEST_F(EncoderTest, StsBenchmarkSpearman) {
  const std::string path = strata::data::find_shared_file("data/sts/sts-test.csv");
  if (path.empty()) GTEST_SKIP() << "shared/data/sts/sts-test.csv not found (set STRATA_SHARED_DIR)";
  ASSERT_EQ(strata::data::sha256_file_hex(path), strata::data::kStsTestSha256) << path;
  const auto rows = strata::data::load_sts(path);
  // Each distinct sentence once (2,552 of the 2,758).
  std::vector<std::string> texts;
  std::map<std::string, int64_t> row_of;
  std::vector<std::pair<int64_t, int64_t>> pair_rows;
  for (const auto& r : rows) {
    int64_t idx[2];
    for (int s = 0; s < 2; ++s) {
      const std::string& t = s == 0 ? r.sentence1 : r.sentence2;
      const auto [it, inserted] = row_of.emplace(t, int64_t(texts.size()));
      if (inserted) texts.push_back(t);
      idx[s] = it->second;
    }
    pair_rows.emplace_back(idx[0], idx[1]);
  }
  const auto t0 = std::chrono::steady_clock::now();
  const at::Tensor emb = model_->embed(texts);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::vector<double> cos, gold;
  const auto acc = emb.accessor<float, 2>();
  for (size_t i = 0; i < rows.size(); ++i) {
    double dot = 0;
    for (int64_t d = 0; d < emb.size(1); ++d) dot += double(acc[pair_rows[i].first][d]) * acc[pair_rows[i].second][d];
    cos.push_back(dot);  // embeddings are unit vectors
    gold.push_back(rows[i].score);
  }
  const double rho = 100 * strata::data::spearman(cos, gold);
  std::printf(
      "[ STS-B ] test: %zu pairs, Spearman x 100 = %.4f (reference %.4f, published %.2f); %zu sentences in %.1f s\n",
      rows.size(), rho, kReferenceStsb, kPublishedStsb, texts.size(), secs);
  EXPECT_NEAR(rho, kPublishedStsb, 0.5);
  EXPECT_NEAR(rho, kReferenceStsb, 0.05);
}

}  // namespace
