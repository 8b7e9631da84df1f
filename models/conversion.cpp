// models/conversion.cpp: see conversion.h.
#include "models/conversion.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iterator>
#include <sstream>
#include <utility>

#include "data/minilm.h"
#include "data/shared_files.h"
#include "data/sts.h"
#include "strata/error.h"

namespace strata::models {

namespace {

using detail::cat;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Checks what needs no model or data (run before any is loaded).
void check_config(const char* where, const ConversionConfig& cfg) {
  const bool softmax_first =
      !cfg.methods.empty() && cfg.methods[0].spec == AttentionSpec{} && cfg.methods[0].layers.empty();
  STRATA_CHECK_ARG(softmax_first, where, cfg.methods_name.c_str(),
                   "a list that starts with plain \"softmax\" (the baseline every row is compared to)",
                   cfg.methods.empty() ? std::string("an empty list") : cfg.methods[0].label());
  STRATA_CHECK_ARG(cfg.sts_pairs == 0 || cfg.sts_pairs >= 2, where, "sts_pairs", "0 (all) or >= 2 (a Spearman)",
                   cfg.sts_pairs);
  for (int64_t n : cfg.long_lengths)
    STRATA_CHECK_ARG(n >= 3 && n <= 512, where, "long_lengths", "lengths in 3..512 (the model's positions)", n);
  STRATA_CHECK_ARG(cfg.passages >= 1, where, "passages", ">= 1", cfg.passages);
  STRATA_CHECK_ARG(cfg.batch_size >= 1, where, "batch_size", ">= 1", cfg.batch_size);
}

// cfg's path, or the shared data folder's `relative`; throws naming the paths tried.
std::string data_file(const char* where, const std::string& given, const std::string& relative) {
  if (!given.empty()) return given;
  std::string tried;
  const std::string path = data::find_shared_file(relative, &tried);
  STRATA_CHECK(!path.empty(), where, ": ", relative, " not found (tried ", tried, "; set STRATA_SHARED_DIR)");
  return path;
}

// Passages of exactly n tokens ([CLS] + n-2 pieces + [SEP]) from consecutive, non-overlapping
// windows of the text's WordPiece ids: count x n ids (mask all ones).
at::Tensor passage_ids(const std::vector<int64_t>& pieces, const data::WordPieceTokenizer& tok, int64_t n,
                       int64_t count) {
  const int64_t body = n - 2;
  STRATA_CHECK(int64_t(pieces.size()) >= body * count, "run_conversion: the text gives ", pieces.size(),
               " WordPiece tokens, fewer than the ", body * count, " that ", count, " passages of ", n, " need");
  at::Tensor ids = at::empty({count, n}, at::kLong);
  auto a = ids.accessor<int64_t, 2>();
  for (int64_t p = 0; p < count; ++p) {
    a[p][0] = tok.cls_id();
    for (int64_t i = 0; i < body; ++i) a[p][i + 1] = pieces[size_t(p * body + i)];
    a[p][n - 1] = tok.sep_id();
  }
  return ids;
}

// The WordPiece ids of enough of the text at `path` for `count` passages of up to `longest`
// tokens (a prefix cut at a space or newline: tokenising all 1.1 MB is not needed).
std::vector<int64_t> text_pieces(const std::string& path, const data::WordPieceTokenizer& tok, int64_t count,
                                 int64_t longest) {
  std::ifstream f(path, std::ios::binary);
  STRATA_CHECK(f.good(), "run_conversion: cannot read '", path, "'");
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t want_chars = std::min(text.size(), size_t(count * longest * 8 + 4096));
  const size_t cut = text.find_first_of(" \n", want_chars);
  return tok.tokenize_ids(text.substr(0, cut == std::string::npos ? text.size() : cut));
}

// Mean and min over rows of the cosine between rows of a and b (both L2-normalised).
std::pair<double, double> cosine_stats(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor c = (a.to(at::kDouble) * b.to(at::kDouble)).sum(1);
  return {c.mean().item<double>(), c.min().item<double>()};
}

// Spearman x 100 of the cosines of the pairs (rows 2i, 2i+1 of emb) against the gold scores.
double sts_spearman(const at::Tensor& emb, const std::vector<double>& gold) {
  std::vector<double> cos(gold.size());
  auto e = emb.accessor<float, 2>();
  for (size_t i = 0; i < gold.size(); ++i) {
    double d = 0;
    for (int64_t c = 0; c < emb.size(1); ++c) d += double(e[int64_t(2 * i)][c]) * e[int64_t(2 * i + 1)][c];
    cos[i] = d;
  }
  return 100 * data::spearman(cos, gold);
}

// The targets of the conversion from the rows (see ConversionReport).
void set_targets(ConversionReport& r, const std::vector<int64_t>& long_lengths) {
  r.softmax_spearman = r.rows[0].sts_spearman;
  for (const ConversionRow& row : r.rows) {
    if (row.method.spec.kind != AttentionKind::monarch) continue;
    if (row.sts_spearman > r.best_monarch_spearman) {
      r.best_monarch_spearman = row.sts_spearman;
      r.best_monarch = row.method.label();
    }
    // STS-B sentences are short: a block size >= the length makes Monarch exact softmax attention
    // (and dearer); the best row that actually saves attention FLOPs is reported beside it.
    if (row.sts_flop_fraction < 1 && row.sts_spearman > r.best_cheap_monarch_spearman) {
      r.best_cheap_monarch_spearman = row.sts_spearman;
      r.best_cheap_monarch = row.method.label();
      r.best_cheap_monarch_fraction = row.sts_flop_fraction;
    }
    for (const ConversionRow::Long& c : row.long_cells)
      if (c.n == 512 && c.flop_fraction <= 0.35 && c.cosine_mean > r.n512_best_monarch_cosine) {
        r.n512_best_monarch_cosine = c.cosine_mean;
        r.n512_best_monarch_fraction = c.flop_fraction;
      }
  }
  r.sts_target = r.best_monarch_spearman >= 0.97 * r.softmax_spearman;
  r.has_512 = std::find(long_lengths.begin(), long_lengths.end(), 512) != long_lengths.end();
  r.long_target = r.has_512 && r.n512_best_monarch_cosine >= 0.95;
  bool lower = r.has_512 && r.n512_best_monarch_cosine > -2;
  for (const ConversionRow& row : r.rows) {
    if (row.method.spec.kind != AttentionKind::nystrom && row.method.spec.kind != AttentionKind::performer) continue;
    for (const ConversionRow::Long& c : row.long_cells) {
      if (c.n != 512 || c.flop_fraction < r.n512_best_monarch_fraction) continue;
      ++r.baselines_compared;
      if (c.cosine_mean >= r.n512_best_monarch_cosine) lower = false;
    }
  }
  r.baselines_lower = lower && r.baselines_compared > 0;
}

}  // namespace

std::vector<ConversionMethod> default_conversion_methods() {
  std::vector<ConversionMethod> out;
  for (const char* s : {
           "softmax",
           // Monarch, every layer: T = 1..3 at the default block (floor(sqrt(N))) and at B = 8 (the
           // best at N = 512 in our sweep: M = 64 blocks), and other fixed blocks.
           "monarch:T=1", "monarch:T=2", "monarch:T=3", "monarch:T=1,B=8", "monarch:T=2,B=8", "monarch:T=3,B=8",
           "monarch:T=2,B=4", "monarch:T=2,B=16",
           // Monarch in a subset of the layers (the others stay softmax).
           "monarch:T=2,B=8@0,1,3,4,5", "monarch:T=2,B=8@3,4,5", "monarch:T=2@0,1,2",
           "nystrom:landmarks=8", "nystrom:landmarks=16", "nystrom:landmarks=32", "nystrom:landmarks=64",
           "performer:features=32,seed=0", "performer:features=64,seed=0", "performer:features=128,seed=0",
           "performer:features=256,seed=0"})
    out.push_back(parse_conversion_method(s));
  return out;
}

std::vector<ConversionMethod> quick_conversion_methods() {
  std::vector<ConversionMethod> out;
  for (const char* s : {"softmax", "monarch:T=1", "monarch:T=2,B=8", "monarch:T=3", "nystrom:landmarks=32",
                        "performer:features=128,seed=0"})
    out.push_back(parse_conversion_method(s));
  return out;
}

namespace {

// run_conversion on a loaded model; model_dir is only reported.
ConversionReport evaluate(const char* where, const ConversionConfig& cfg, SentenceEncoder& model,
                          const std::string& model_dir, const ConversionProgress& progress) {
  const BertConfig& mc = model.encoder.config();
  for (const ConversionMethod& m : cfg.methods)
    for (int64_t l : m.layers)
      STRATA_CHECK_ARG(l < mc.layers, where, cfg.methods_name.c_str(),
                       cat("layers in 0..", mc.layers - 1, " (the model's) in \"", m.label(), "\""), l);
  ConversionReport rep;
  rep.model_dir = model_dir;
  rep.sts_path = data_file(where, cfg.sts_path, "data/sts/sts-test.csv");
  rep.text_path = data_file(where, cfg.text_path, "data/text/tinyshakespeare.txt");
  rep.layers = mc.layers;
  rep.heads = mc.heads;
  rep.head_dim = mc.head_dim();

  // --- inputs: STS-B pairs as token ids (each sentence its own length), passages per length
  std::vector<data::StsPair> sts = data::load_sts(rep.sts_path);
  if (cfg.sts_pairs > 0 && cfg.sts_pairs < int64_t(sts.size())) sts.resize(size_t(cfg.sts_pairs));
  rep.sts_pairs_used = int64_t(sts.size());
  std::vector<std::vector<int64_t>> sent_ids;
  std::vector<double> gold;
  for (const data::StsPair& p : sts) {
    for (const std::string* s : {&p.sentence1, &p.sentence2})
      sent_ids.push_back(model.tokenizer.encode(*s, model.max_len).ids);
    gold.push_back(p.score);
  }
  const int64_t longest =
      cfg.long_lengths.empty() ? 3 : *std::max_element(cfg.long_lengths.begin(), cfg.long_lengths.end());
  const std::vector<int64_t> pieces = text_pieces(rep.text_path, model.tokenizer, cfg.passages, longest);
  std::vector<at::Tensor> long_ids;
  for (int64_t n : cfg.long_lengths) long_ids.push_back(passage_ids(pieces, model.tokenizer, n, cfg.passages));

  // Mean attention FLOPs over the sentences (each at its own length).
  const auto sts_flops = [&](const ConversionMethod& m) {
    double f = 0;
    for (const auto& ids : sent_ids) f += encoder_attention_flops(mc, m.spec, m.layers, int64_t(ids.size()));
    return f / double(sent_ids.size());
  };
  rep.softmax_sts_attn_flops_mean = sts_flops(cfg.methods[0]);
  if (progress) progress(rep);

  // --- rows (the model is set back to softmax attention however the loop ends)
  struct BackToSoftmax {
    BertEncoder& encoder;
    ~BackToSoftmax() { convert(encoder, AttentionSpec{}, {}); }
  } back_to_softmax{model.encoder};
  std::vector<at::Tensor> softmax_long;
  for (const ConversionMethod& m : cfg.methods) {
    const auto t0 = Clock::now();
    convert(model.encoder, AttentionSpec{}, {});
    convert(model.encoder, m.spec, m.layers);
    ConversionRow row;
    row.method = m;
    row.sts_spearman = sts_spearman(model.embed_ids(sent_ids, cfg.batch_size), gold);
    const double softmax_rho = rep.rows.empty() ? row.sts_spearman : rep.rows[0].sts_spearman;
    row.sts_pct_of_softmax = 100 * row.sts_spearman / softmax_rho;
    row.sts_attn_flops_mean = sts_flops(m);
    row.sts_flop_fraction = row.sts_attn_flops_mean / rep.softmax_sts_attn_flops_mean;
    for (size_t i = 0; i < cfg.long_lengths.size(); ++i) {
      const int64_t n = cfg.long_lengths[i];
      const at::Tensor z = model.encoder.embed(long_ids[i], at::ones_like(long_ids[i]));
      if (rep.rows.empty()) softmax_long.push_back(z);
      ConversionRow::Long c;
      c.n = n;
      std::tie(c.cosine_mean, c.cosine_min) = cosine_stats(z, softmax_long[i]);
      c.attn_flops = encoder_attention_flops(mc, m.spec, m.layers, n);
      c.flop_fraction = c.attn_flops / encoder_attention_flops(mc, AttentionSpec{}, {}, n);
      row.long_cells.push_back(c);
    }
    row.seconds = seconds_since(t0);
    rep.rows.push_back(std::move(row));
    if (progress) progress(rep);
  }
  set_targets(rep, cfg.long_lengths);
  return rep;
}

}  // namespace

ConversionReport run_conversion(const ConversionConfig& cfg, SentenceEncoder& model,
                                const ConversionProgress& progress) {
  check_config("run_conversion", cfg);
  return evaluate("run_conversion", cfg, model, "", progress);
}

namespace {
// The model directory: `given`, or data::find_minilm_dir() (throws saying how to install it).
std::string minilm_dir(const char* where, const std::string& given) {
  if (!given.empty()) return given;
  std::string why;
  const std::string dir = data::find_minilm_dir(&why);
  STRATA_CHECK(!dir.empty(), where, ": the pretrained encoder all-MiniLM-L6-v2 is missing: ", why);
  return dir;
}
}  // namespace

SentenceEncoder load_converted_encoder(const ConversionMethod& method, const std::string& model_dir) {
  SentenceEncoder model = SentenceEncoder::load(minilm_dir("load_converted_encoder", model_dir));
  convert(model.encoder, method.spec, method.layers);
  return model;
}

ConversionReport run_conversion(const ConversionConfig& cfg, const ConversionProgress& progress) {
  check_config("run_conversion", cfg);
  const std::string model_dir = minilm_dir("run_conversion", "");
  SentenceEncoder model = SentenceEncoder::load(model_dir);
  return evaluate("run_conversion", cfg, model, model_dir, progress);
}

}  // namespace strata::models
