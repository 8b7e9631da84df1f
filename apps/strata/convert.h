// apps/strata/convert.h: `strata convert`: zero-shot conversion of the pretrained encoder
// all-MiniLM-L6-v2 (experiments.md section 4). Every method row swaps the attention of some layers
// (models/attention_zoo.h) and is scored on
//   1. STS-B test: Spearman x 100 of cos(emb1, emb2) against the gold scores;
//   2. long passages: N = 128, 256, 512 tokens cut from tinyshakespeare ([CLS] + N-2 pieces +
//      [SEP]), mean cosine between the converted and the softmax model's embeddings;
// each with its attention FLOPs (per sequence, all layers; the reference's count, x2 for FLOPs)
// as a fraction of the softmax model's. Writes a table, <out>/convert.json and convert.png.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace strata::app {

// One row: a method spec with the layers it replaces, "<spec>[@<layer>,<layer>...]", e.g.
// "monarch:T=2,B=8@3,4,5" (no @: every layer).
struct ConvertMethod {
  std::string spec;             // models::parse_attention_spec grammar
  std::vector<int64_t> layers;  // empty: all
  std::string label() const;    // spec[@layers]
};
ConvertMethod parse_convert_method(const std::string& text);

struct ConvertConfig {
  std::vector<ConvertMethod> methods;  // the first must be plain softmax over all layers (checked)
  int64_t sts_pairs = 0;               // 0: all 1,379; else the first n pairs
  std::vector<int64_t> long_lengths = {128, 256, 512};
  int64_t passages = 16;               // per length, consecutive non-overlapping windows
  int64_t batch_size = 32;             // sentences per forward (of equal length: no padding)
  std::string out_dir = "out/convert";
  bool plot = true;
  bool quiet = false;
};

// The default method list (softmax first): Monarch T = 1..3 at the default block size, fixed
// blocks, layer subsets; Nystromformer and Performer at several sizes.
std::vector<ConvertMethod> default_convert_methods();
// A smaller list for --quick and the demo.
std::vector<ConvertMethod> quick_convert_methods();

struct ConvertSummary {
  double softmax_spearman = 0, best_monarch_spearman = 0;
  std::string best_monarch;
  // the best Monarch row with fewer STS-B attention FLOPs than softmax (short sentences: a block
  // size >= the length is exact softmax attention at a higher cost)
  double best_cheap_monarch_spearman = 0, best_cheap_monarch_fraction = 0;
  std::string best_cheap_monarch;
  bool sts_target = false;   // best Monarch >= 97% of softmax
  bool long_target = false;  // N = 512: a Monarch row at <= 35% FLOPs with mean cosine >= 0.95
  bool baselines_lower = false;  // and every Nystrom / Performer row at >= its FLOPs scores lower
  std::string json_path, png_path;
};

// Runs the whole evaluation, prints the tables, writes the JSON (atomically) and the plot.
// Throws strata::Error when the model or the data cannot be found (the message says how to get them).
ConvertSummary run_conversion(const ConvertConfig& cfg);

}  // namespace strata::app
