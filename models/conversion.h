// models/conversion.h: the zero-shot conversion evaluation of docs/methods.md (what
// `strata convert` runs, without printing or files). The pretrained encoder all-MiniLM-L6-v2 has
// the attention of some layers swapped (models/attention_zoo.h) and every method row is scored on
//   1. STS-B test: Spearman x 100 of cos(emb1, emb2) against the gold scores;
//   2. long passages: N tokens cut from tinyshakespeare ([CLS] + N-2 pieces + [SEP], consecutive
//      non-overlapping windows), mean and min cosine between the converted and the softmax
//      model's embeddings;
// each with its attention FLOPs (per sequence, all layers: encoder_attention_flops) as a fraction
// of the softmax model's. STS-B sentences run at their own lengths (batches of equal token count,
// no padding), so Monarch's default block size and its FLOP count follow each sentence.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "models/attention_zoo.h"
#include "models/bert_encoder.h"

namespace strata::models {

// ConversionMethod and parse_conversion_method (a row's "<spec>[@<layer>,...]"): models/attention_spec.h.

// all-MiniLM-L6-v2 from model_dir ("" = data::find_minilm_dir(); strata::Error saying how to
// install it when missing) with `method` applied: the model a conversion row embeds with
// (SentenceEncoder::embed_ids). Layers out of the model's range are a strata::Error naming them.
SentenceEncoder load_converted_encoder(const ConversionMethod& method, const std::string& model_dir = "");

// The default method list (softmax first): Monarch T = 1..3 at the default block size, fixed
// blocks, layer subsets; Nystromformer and Performer at several sizes.
std::vector<ConversionMethod> default_conversion_methods();
// A smaller list (the CLI's --quick).
std::vector<ConversionMethod> quick_conversion_methods();

struct ConversionConfig {
  std::vector<ConversionMethod> methods;  // the first must be plain softmax over all layers
  int64_t sts_pairs = 0;                  // 0: all 1,379; else the first n (n >= 2)
  std::vector<int64_t> long_lengths = {128, 256, 512};  // passage lengths, 3..512 tokens
  int64_t passages = 16;                  // per length
  int64_t batch_size = 32;                // sentences per forward (of equal length)
  std::string sts_path, text_path;        // "": data/sts/sts-test.csv, data/text/tinyshakespeare.txt
                                          // of the shared data folder (data/shared_files.h)
  // How the caller took `methods`, for its errors: the CLI's "--method" (a user never sees the
  // field's name there).
  std::string methods_name = "methods";
};

// One method's scores.
struct ConversionRow {
  ConversionMethod method;
  double sts_spearman = 0;        // x 100
  double sts_pct_of_softmax = 0;  // 100 x sts_spearman / the softmax row's
  double sts_attn_flops_mean = 0, sts_flop_fraction = 0;  // mean over the sentences; / softmax's
  struct Long {
    int64_t n = 0;
    double cosine_mean = 0, cosine_min = 0, attn_flops = 0, flop_fraction = 0;
  };
  std::vector<Long> long_cells;  // one per long length, in cfg.long_lengths order
  double seconds = 0;            // wall time of the row
};

// The evaluation's inputs, rows and its targets.
struct ConversionReport {
  std::string model_dir, sts_path, text_path;  // model_dir: "" when the caller gave the model
  int64_t layers = 0, heads = 0, head_dim = 0;  // the model's
  int64_t sts_pairs_used = 0;
  double softmax_sts_attn_flops_mean = 0;
  std::vector<ConversionRow> rows;  // in cfg.methods order; rows[0] is softmax

  double softmax_spearman = 0, best_monarch_spearman = 0;
  std::string best_monarch;  // label, "" when no Monarch row
  // The best Monarch row with fewer STS-B attention FLOPs than softmax (short sentences: a block
  // size >= the length is exact softmax attention at a higher cost).
  double best_cheap_monarch_spearman = 0, best_cheap_monarch_fraction = 0;
  std::string best_cheap_monarch;
  bool sts_target = false;             // best Monarch >= 97% of softmax
  bool has_512 = false;                // 512 is among the long lengths (the long targets need it)
  double n512_best_monarch_cosine = -2;  // the best Monarch row at N = 512 with <= 35% of the
  double n512_best_monarch_fraction = 0;  //   FLOPs (-2: none), and its FLOP fraction
  bool long_target = false;            // that cosine >= 0.95
  bool baselines_lower = false;        // every Nystrom / Performer cell at N = 512 with >= that
  int baselines_compared = 0;          //   FLOP fraction scores lower (and there is one)
};

// Called once before the first row (rows empty: the inputs are known) and after every row.
using ConversionProgress = std::function<void(const ConversionReport&)>;

// Runs the evaluation on `model` (its attention is set back to softmax at the end). Checks the
// config before any work (strata::Error naming the field: methods, sts_pairs, long_lengths,
// passages, batch_size, and layers against the model); throws strata::Error when the data files
// cannot be found (naming the paths tried) or read.
ConversionReport run_conversion(const ConversionConfig& cfg, SentenceEncoder& model,
                                const ConversionProgress& progress = {});
// The same after loading the model from data::find_minilm_dir() (strata::Error saying how to
// install it when missing); the config is checked first.
ConversionReport run_conversion(const ConversionConfig& cfg, const ConversionProgress& progress = {});

}  // namespace strata::models
