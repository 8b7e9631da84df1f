// tests/cpp/encoder_convert_test.cpp: the attention zoo (models/attention_zoo.h): spec strings
// (parse, canonical form, errors naming the bad key or value), the attention functions it makes,
// FLOP counts, and convert() on the real all-MiniLM-L6-v2 encoder: MonarchAttention with one
// block (B >= N) or B = 1 is exact, so the converted model must give the softmax model's
// embeddings. The conversion evaluation (models/conversion.h, what `strata convert` runs) on a
// tiny config, without the CLI. Tests that need the model skip when scripts/setup_encoder.sh has
// not installed it (and the evaluation's when shared/ has no STS-B or tinyshakespeare).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "data/minilm.h"
#include "minilm_suite.h"
#include "data/shared_files.h"
#include "models/attention_zoo.h"
#include "models/bert_encoder.h"
#include "models/conversion.h"
#include "strata/error.h"
#include "strata/threading.h"
#include "strata/torch/baselines.h"
#include "strata/torch/monarch.h"
#include "test_util.h"

namespace {

using strata::models::AttentionKind;
using strata::models::AttentionSpec;
using strata::models::parse_attention_spec;

TEST(AttentionSpec, ParsesTheExamples) {
  AttentionSpec s = parse_attention_spec("softmax");
  EXPECT_EQ(s.kind, AttentionKind::softmax);
  EXPECT_EQ(s, AttentionSpec{});

  s = parse_attention_spec("monarch:T=2,B=8,pad=post");
  EXPECT_EQ(s.kind, AttentionKind::monarch);
  EXPECT_EQ(s.num_steps, 2);
  EXPECT_EQ(s.block_size, 8);
  EXPECT_EQ(s.pad, strata::MonarchPad::post);
  EXPECT_EQ(s.mode, strata::MonarchMode::stable);  // default

  s = parse_attention_spec("monarch");
  EXPECT_EQ(s.num_steps, 1);
  EXPECT_EQ(s.block_size, 0);  // floor(sqrt(N)) per call

  s = parse_attention_spec("monarch:mode=reference,pad=pre,B=14");
  EXPECT_EQ(s.mode, strata::MonarchMode::reference);
  EXPECT_EQ(s.pad, strata::MonarchPad::pre);
  EXPECT_EQ(s.block_size, 14);

  s = parse_attention_spec("nystrom:landmarks=16");
  EXPECT_EQ(s.kind, AttentionKind::nystrom);
  EXPECT_EQ(s.num_landmarks, 16);
  EXPECT_EQ(s.pinv_iters, 6);

  s = parse_attention_spec("performer:features=64,seed=0");
  EXPECT_EQ(s.kind, AttentionKind::performer);
  EXPECT_EQ(s.num_features, 64);
  ASSERT_TRUE(s.seed.has_value());
  EXPECT_EQ(*s.seed, 0);
  EXPECT_FALSE(parse_attention_spec("performer:features=8").seed.has_value());
}

TEST(AttentionSpec, CanonicalStringRoundTrips) {
  for (const char* text :
       {"softmax", "monarch", "monarch:T=3,B=0,pad=pre,mode=reference", "monarch:B=24", "nystrom",
        "nystrom:landmarks=64,iters=10", "performer", "performer:features=256,seed=7", "performer:seed=3"}) {
    const AttentionSpec s = parse_attention_spec(text);
    const std::string canon = strata::models::to_string(s);
    EXPECT_EQ(parse_attention_spec(canon), s) << text << " -> " << canon;
    EXPECT_EQ(strata::models::to_string(parse_attention_spec(canon)), canon);
  }
  EXPECT_EQ(strata::models::to_string(parse_attention_spec("monarch:T=2,B=8,pad=post")),
            "monarch:T=2,B=8,pad=post,mode=stable");
  EXPECT_EQ(strata::models::to_string(parse_attention_spec("nystrom:landmarks=16")), "nystrom:landmarks=16,iters=6");
  EXPECT_EQ(strata::models::to_string(parse_attention_spec("performer:features=64")), "performer:features=64");
}

TEST(AttentionSpec, BadSpecsNameTheBadPart) {
  const struct {
    const char* spec;
    std::vector<const char*> want;
  } cases[] = {
      {"flash", {"attention spec \"flash\"", "unknown kind 'flash'", "softmax, monarch, nystrom, performer"}},
      {"", {"unknown kind ''"}},
      {"monarch:T=0", {"key 'T'", ">= 1", "\"0\""}},
      {"monarch:T=two", {"key 'T'", "\"two\""}},
      {"monarch:T=2x", {"key 'T'", "\"2x\""}},
      {"monarch:B=-1", {"key 'B'", ">= 0", "\"-1\""}},
      {"monarch:pad=middle", {"key 'pad'", "post or pre", "\"middle\""}},
      {"monarch:mode=fast", {"key 'mode'", "stable or reference", "\"fast\""}},
      {"monarch:X=1", {"unknown key 'X' for monarch", "T, B, pad, mode"}},
      {"nystrom:B=4", {"unknown key 'B' for nystrom", "landmarks, iters"}},
      {"nystrom:landmarks=0", {"key 'landmarks'"}},
      {"performer:features=", {"key 'features'", "\"\""}},
      {"performer:seed=-3", {"key 'seed'", ">= 0"}},
      {"softmax:T=1", {"unknown key 'T' for softmax"}},
      {"monarch:", {"nothing after ':'"}},
      {"monarch:T=2,", {"expected key=value, got \"\""}},
      {"monarch:T", {"expected key=value, got \"T\""}},
      {"monarch:T=2,T=3", {"key 'T' given twice"}},
  };
  for (const auto& c : cases) {
    try {
      parse_attention_spec(c.spec);
      ADD_FAILURE() << "no error for \"" << c.spec << "\"";
    } catch (const strata::Error& e) {
      for (const char* w : c.want) EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << e.what();
    }
  }
  AttentionSpec bad;  // built in code: checked where it is used
  bad.kind = AttentionKind::monarch;
  bad.num_steps = 0;
  EXPECT_THROW(strata::models::make_attention(bad), strata::Error);
  EXPECT_THROW(strata::models::to_string(bad), strata::Error);
}

TEST(AttentionZoo, FlopsPerSequenceAllHeads) {
  const int64_t N = 128, H = 12, D = 32;
  using namespace strata::torch;
  EXPECT_EQ(strata::models::attention_flops(parse_attention_spec("softmax"), N, H, D), H * 4.0 * N * N * D);
  EXPECT_EQ(strata::models::attention_flops(parse_attention_spec("monarch:T=2,B=8"), N, H, D),
            monarch_attention_flops(N, H, D, D, 2, 8));
  EXPECT_EQ(strata::models::attention_flops(parse_attention_spec("nystrom:landmarks=16"), N, H, D),
            H * nystrom_attention_flops(N, D, D, 16, 6));
  EXPECT_EQ(strata::models::attention_flops(parse_attention_spec("performer:features=64"), N, H, D),
            H * performer_attention_flops(N, D, D, 64));
  // Monarch at sqrt(N) blocks costs a fraction of softmax (T = 1, N = 128: B = 11, M = 12).
  EXPECT_LT(strata::models::attention_flops(parse_attention_spec("monarch"), N, H, D),
            0.4 * strata::models::attention_flops(AttentionSpec{}, N, H, D));
  strata::models::BertConfig cfg;  // 6 layers, 12 heads of 32
  const AttentionSpec m = parse_attention_spec("monarch:B=16");
  const double soft = strata::models::attention_flops(AttentionSpec{}, N, 12, 32),
               mon = strata::models::attention_flops(m, N, 12, 32);
  EXPECT_EQ(strata::models::encoder_attention_flops(cfg, m, {}, N), 6 * mon);
  EXPECT_EQ(strata::models::encoder_attention_flops(cfg, m, {0, 5}, N), 2 * mon + 4 * soft);
  EXPECT_THROW(strata::models::encoder_attention_flops(cfg, m, {6}, N), strata::Error);
}

TEST(AttentionZoo, MadeFunctionsComputeTheirMethod) {
  at::manual_seed(0);
  const int64_t B = 2, N = 20, H = 4, D = 8;
  const at::Tensor q = at::randn({B, N, H, D}), k = at::randn({B, N, H, D}), v = at::randn({B, N, H, D});
  at::Tensor mask = at::ones({B, N}, at::kBool);
  mask[1].narrow(0, 14, N - 14).fill_(false);
  const at::Tensor soft = strata::models::make_attention(AttentionSpec{})(q, k, v, mask);
  // Monarch with one block is exact on the valid rows.
  const at::Tensor one_block = strata::models::make_attention(parse_attention_spec("monarch:T=2,B=64"))(q, k, v, mask);
  EXPECT_LT((one_block[0] - soft[0]).abs().max().item<double>(), 1e-5);
  EXPECT_LT((one_block[1].narrow(0, 0, 14) - soft[1].narrow(0, 0, 14)).abs().max().item<double>(), 1e-5);
  // The baselines: the functions of strata/torch/baselines.h with the spec's options and the mask.
  // Not bitwise: the first Performer call of a process differed from later ones by 2.5e-5
  // (relative) in about 1 run in 50 while each fp32 result is within 4e-7 of float64 otherwise
  // (cause not found: a first-call effect inside ATen / MKL). Bound 1e-4; other options move the
  // output by O(1), so the check still tells methods and options apart.
  const auto close = [](const at::Tensor& a, const at::Tensor& b) {
    return (a - b).abs().max().item<double>() <= 1e-4 * std::max(1.0, b.abs().max().item<double>());
  };
  EXPECT_TRUE(close(strata::models::make_attention(parse_attention_spec("nystrom:landmarks=5,iters=4"))(q, k, v, mask),
                    strata::torch::nystrom_attention(q, k, v, 5, 4, mask)));
  EXPECT_FALSE(close(strata::models::make_attention(parse_attention_spec("nystrom:landmarks=5,iters=4"))(q, k, v, mask),
                     strata::torch::nystrom_attention(q, k, v, 6, 4, mask)));
  {
    const at::Tensor a = strata::models::make_attention(parse_attention_spec("performer:features=16,seed=3"))(q, k, v, mask);
    const at::Tensor b = strata::torch::performer_attention(q, k, v, 16, 3, mask);
    EXPECT_TRUE(close(a, b)) << "max |diff| " << (a - b).abs().max().item<double>();
  }
  EXPECT_FALSE(close(strata::models::make_attention(parse_attention_spec("performer:features=16,seed=3"))(q, k, v, mask),
                     strata::torch::performer_attention(q, k, v, 16, 4, mask)));
  // Monarch's mode reaches the kernel: reference and stable differ on masked query rows.
  const at::Tensor refm = strata::models::make_attention(parse_attention_spec("monarch:B=4,mode=reference"))(q, k, v, mask);
  const at::Tensor stab = strata::models::make_attention(parse_attention_spec("monarch:B=4"))(q, k, v, mask);
  EXPECT_EQ(stab[1].narrow(0, 14, N - 14).abs().max().item<double>(), 0.0);
  EXPECT_GT(refm[1].narrow(0, 14, N - 14).abs().max().item<double>(), 0.0);
}

// ---- on the real encoder ------------------------------------------------------------------------

class ConvertTest : public MiniLmSuite<ConvertTest> {
 protected:
  static at::Tensor embed(const std::vector<std::string>& texts) {
    const auto b = model_->tokenizer.encode_batch(texts, 256);
    const at::Tensor ids = at::tensor(b.ids, at::kLong).view({b.batch, b.seq});
    const at::Tensor mask = at::tensor(b.attention_mask, at::kLong).view({b.batch, b.seq});
    return model_->encoder.embed(ids, mask);
  }
  static double min_cosine(const at::Tensor& a, const at::Tensor& b) {  // rows are unit vectors
    return (a * b).sum(1).min().item<double>();
  }

  // Padded batch: the short texts see masked keys, so the mask path is exercised.
  const std::vector<std::string> texts_ = {
      "A man is playing a guitar.",
      "The quick brown fox jumps over the lazy dog while the farmer watches from the porch, "
      "wondering whether the fence will hold through another winter of storms.",
      "Short."};
};

TEST_F(ConvertTest, ExactMonarchGivesTheSoftmaxEmbeddings) {
  const at::Tensor base = embed(texts_);
  // B >= N (one block) and B = 1 are softmax attention for every T; fp32 rounding only.
  for (const char* spec : {"monarch:T=1,B=512", "monarch:T=3,B=512", "monarch:T=2,B=1"}) {
    strata::models::convert(model_->encoder, parse_attention_spec(spec), {});
    const at::Tensor got = embed(texts_);
    EXPECT_LT((got - base).abs().max().item<double>(), 1e-5) << spec;
  }
}

TEST_F(ConvertTest, ApproximationsStayCloseAndLayersAreRespected) {
  const at::Tensor base = embed(texts_);
  // Monarch with small blocks in two layers: changed, but close (zero-shot conversion works).
  strata::models::convert(model_->encoder, parse_attention_spec("monarch:T=2,B=4"), {0, 3});
  const at::Tensor mon = embed(texts_);
  EXPECT_GT((mon - base).abs().max().item<double>(), 1e-4);
  EXPECT_GT(min_cosine(mon, base), 0.9);
  // The other layers still run softmax: converting them to exact Monarch changes nothing.
  strata::models::convert(model_->encoder, parse_attention_spec("monarch:B=512"), {1, 2, 4, 5});
  EXPECT_LT((embed(texts_) - mon).abs().max().item<double>(), 1e-5);
  // Bad layer lists throw and leave the model as it was.
  EXPECT_THROW(strata::models::convert(model_->encoder, AttentionSpec{}, {0, 6}), strata::Error);
  EXPECT_THROW(strata::models::convert(model_->encoder, AttentionSpec{}, {2, 2}), strata::Error);
  EXPECT_LT((embed(texts_) - mon).abs().max().item<double>(), 1e-5);
  // The baselines run through the encoder (finite, unit-norm embeddings); performer with a seed is
  // reproducible.
  strata::models::convert(model_->encoder, parse_attention_spec("nystrom:landmarks=8"), {});
  const at::Tensor ny = embed(texts_);
  EXPECT_TRUE(ny.isfinite().all().item<bool>());
  strata::models::convert(model_->encoder, parse_attention_spec("performer:features=64,seed=1"), {});
  const at::Tensor pf = embed(texts_);
  EXPECT_TRUE(pf.isfinite().all().item<bool>());
  EXPECT_TRUE(at::equal(pf, embed(texts_)));
  std::printf("[ convert ] min cosine to softmax: monarch T=2 B=4 (2 layers) %.4f, nystrom 8 %.4f, performer 64 %.4f\n",
              min_cosine(mon, base), min_cosine(ny, base), min_cosine(pf, base));
}

// ---- the conversion evaluation (models/conversion.h) ---------------------------------------------

// (expect_error: tests/cpp/test_util.h)
using strata::test::expect_error;

TEST(Conversion, MethodsAreParsedOnce) {
  using strata::models::parse_conversion_method;
  const auto m = parse_conversion_method("monarch:T=2,B=8,pad=pre@3,4");
  EXPECT_EQ(m.spec_text, "monarch:T=2,B=8,pad=pre");
  EXPECT_EQ(m.spec, parse_attention_spec("monarch:T=2,B=8,pad=pre"));
  EXPECT_EQ(m.spec.pad, strata::MonarchPad::pre);
  EXPECT_EQ(m.layers, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(m.label(), "monarch:T=2,B=8,pad=pre@3,4");
  EXPECT_TRUE(parse_conversion_method("softmax").layers.empty());
  expect_error([] { parse_conversion_method("monarch:T=0@1"); }, {"key 'T'"});
  expect_error([] { parse_conversion_method("monarch@1,x"); }, {"argument 'layers'", "\"x\""});
  expect_error([] { parse_conversion_method("monarch@"); }, {"argument 'layers'", "at least one layer"});
  expect_error([] { parse_conversion_method("monarch@-1"); }, {"argument 'layers'", "\"-1\""});
  for (const auto& list : {strata::models::default_conversion_methods(), strata::models::quick_conversion_methods()})
    EXPECT_EQ(list.at(0).spec, AttentionSpec{});
}

// The config is checked before the model is looked for: these fail the same with or without it.
TEST(Conversion, BadConfigsNameTheField) {
  using strata::models::ConversionConfig;
  const auto run = [](const ConversionConfig& c) { return [c] { strata::models::run_conversion(c); }; };
  ConversionConfig cfg;
  expect_error(run(cfg), {"run_conversion", "argument 'methods'", "an empty list"});
  cfg.methods = {strata::models::parse_conversion_method("monarch:T=1")};
  expect_error(run(cfg), {"argument 'methods'", "plain \"softmax\"", "monarch:T=1"});
  cfg.methods = {strata::models::parse_conversion_method("softmax@0")};
  expect_error(run(cfg), {"argument 'methods'", "softmax@0"});
  cfg.methods = {strata::models::parse_conversion_method("softmax")};
  ConversionConfig c = cfg;
  c.sts_pairs = 1;
  expect_error(run(c), {"argument 'sts_pairs'"});
  c = cfg;
  c.long_lengths = {64, 600};
  expect_error(run(c), {"argument 'long_lengths'", "600"});
  c = cfg;
  c.passages = 0;
  expect_error(run(c), {"argument 'passages'"});
  c = cfg;
  c.batch_size = 0;
  expect_error(run(c), {"argument 'batch_size'"});
}

// A tiny evaluation on the loaded model: 8 STS-B pairs, one passage of 64 tokens. The softmax row
// is the baseline; Monarch with one block (B = 512 >= every length) is exact softmax attention, so
// it scores the same (fp32 rounding: embeddings within 1e-5, far from any tie among 8 cosines) at
// more FLOPs; Monarch with B = 4 in two layers approximates at fewer FLOPs on the passage.
TEST_F(ConvertTest, ConversionEvaluationRunsWithoutTheCli) {
  if (strata::data::find_shared_file("data/sts/sts-test.csv").empty() ||
      strata::data::find_shared_file("data/text/tinyshakespeare.txt").empty())
    GTEST_SKIP() << "shared/data/sts/sts-test.csv or data/text/tinyshakespeare.txt not found (set STRATA_SHARED_DIR)";
  const at::Tensor base = embed(texts_);
  strata::models::ConversionConfig cfg;
  for (const char* m : {"softmax", "monarch:T=2,B=512", "monarch:T=2,B=4@0,3"})
    cfg.methods.push_back(strata::models::parse_conversion_method(m));
  cfg.sts_pairs = 8;
  cfg.long_lengths = {64};
  cfg.passages = 1;
  size_t calls = 0;
  const strata::models::ConversionReport r =
      strata::models::run_conversion(cfg, *model_, [&](const strata::models::ConversionReport& so_far) {
        EXPECT_EQ(so_far.rows.size(), calls) << "once before the rows, then after each";
        EXPECT_EQ(so_far.sts_pairs_used, 8);
        ++calls;
      });
  EXPECT_EQ(calls, 4u);
  EXPECT_EQ(r.layers, 6);
  EXPECT_EQ(r.heads, 12);
  EXPECT_TRUE(r.model_dir.empty());  // the caller's model
  ASSERT_EQ(r.rows.size(), 3u);
  const auto& soft = r.rows[0];
  const auto& exact = r.rows[1];
  const auto& approx = r.rows[2];
  EXPECT_EQ(soft.method.label(), "softmax");
  EXPECT_EQ(soft.sts_pct_of_softmax, 100.0);
  EXPECT_EQ(soft.sts_flop_fraction, 1.0);
  ASSERT_EQ(soft.long_cells.size(), 1u);
  EXPECT_EQ(soft.long_cells[0].n, 64);
  EXPECT_NEAR(soft.long_cells[0].cosine_mean, 1.0, 1e-6);
  EXPECT_EQ(soft.long_cells[0].flop_fraction, 1.0);
  EXPECT_GT(soft.sts_spearman, 0.0);  // 8 pairs: a positive correlation, not a benchmark figure
  EXPECT_NEAR(exact.sts_spearman, soft.sts_spearman, 1e-9);
  EXPECT_NEAR(exact.long_cells[0].cosine_mean, 1.0, 1e-6);
  EXPECT_GT(exact.sts_flop_fraction, 1.0);
  EXPECT_GT(exact.long_cells[0].flop_fraction, 1.0);
  EXPECT_EQ(approx.method.layers, (std::vector<int64_t>{0, 3}));
  EXPECT_LT(approx.long_cells[0].flop_fraction, 1.0);
  EXPECT_GT(approx.long_cells[0].flop_fraction, 4.0 / 6.0);  // 4 of 6 layers stay softmax
  EXPECT_LT(approx.long_cells[0].cosine_mean, 1.0 - 1e-5);
  EXPECT_GT(approx.long_cells[0].cosine_min, 0.9);
  // The targets read the rows: the best Monarch is the exact one; no N = 512, no long target.
  EXPECT_EQ(r.softmax_spearman, soft.sts_spearman);
  EXPECT_TRUE(r.sts_target);
  EXPECT_FALSE(r.has_512);
  EXPECT_FALSE(r.long_target);
  EXPECT_FALSE(r.baselines_lower);
  // Layers past the model's are an error naming the method, before any row.
  cfg.methods.push_back(strata::models::parse_conversion_method("monarch@6"));
  expect_error([&] { strata::models::run_conversion(cfg, *model_); }, {"argument 'methods'", "monarch@6", "0..5"});
  // The model is softmax again afterwards.
  EXPECT_LT((embed(texts_) - base).abs().max().item<double>(), 1e-6);
}

}  // namespace
