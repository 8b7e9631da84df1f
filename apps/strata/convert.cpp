// apps/strata/convert.cpp: `strata convert` (convert.h): the pretrained encoder with its attention
// swapped, scored on STS-B and on long-passage embedding fidelity against attention FLOPs.
#include "convert.h"

#include <ATen/ATen.h>
#include <fmt/core.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "commands.h"
#include "data/minilm.h"
#include "data/shared_files.h"
#include "data/sts.h"
#include "files.h"
#include "models/attention_zoo.h"
#include "models/bert_encoder.h"
#include "plot.h"
#include "session.h"
#include "strata/error.h"
#include "strata/threading.h"

namespace strata::app {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Passages of exactly n tokens ([CLS] + n-2 pieces + [SEP]) from consecutive, non-overlapping
// windows of the text's WordPiece ids: count x n ids (mask all ones).
at::Tensor passage_ids(const std::vector<int64_t>& pieces, const data::WordPieceTokenizer& tok, int64_t n,
                       int64_t count) {
  const int64_t body = n - 2;
  STRATA_CHECK(int64_t(pieces.size()) >= body * count, "strata convert: the text gives ", pieces.size(),
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

// Sentence embeddings (n x hidden) with every sentence run at its own length: batches hold
// sentences of equal token count only, so no padding enters any attention (Monarch's default
// block size and its FLOP count then follow each sentence's length, as the table counts them).
at::Tensor embed_unpadded(const models::SentenceEncoder& model, const std::vector<std::vector<int64_t>>& ids,
                          int64_t batch_size) {
  std::vector<size_t> order(ids.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ids[a].size() < ids[b].size(); });
  at::Tensor out = at::empty({int64_t(ids.size()), model.encoder.config().hidden}, at::kFloat);
  for (size_t start = 0; start < order.size();) {
    const size_t len = ids[order[start]].size();
    size_t end = start;
    while (end < order.size() && ids[order[end]].size() == len && int64_t(end - start) < batch_size) ++end;
    at::Tensor batch = at::empty({int64_t(end - start), int64_t(len)}, at::kLong);
    auto a = batch.accessor<int64_t, 2>();
    for (size_t r = start; r < end; ++r)
      for (size_t c = 0; c < len; ++c) a[int64_t(r - start)][int64_t(c)] = ids[order[r]][c];
    const at::Tensor emb = model.encoder.embed(batch, at::ones_like(batch));
    for (size_t r = start; r < end; ++r) out[int64_t(order[r])].copy_(emb[int64_t(r - start)]);
    start = end;
  }
  return out;
}

// Mean and min over rows of the cosine between rows of a and b (both L2-normalised).
std::pair<double, double> cosine_stats(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor c = (a.to(at::kDouble) * b.to(at::kDouble)).sum(1);
  return {c.mean().item<double>(), c.min().item<double>()};
}

std::string layers_label(const std::vector<int64_t>& layers) {
  if (layers.empty()) return "all";
  std::string s;
  for (int64_t l : layers) s += (s.empty() ? "" : ",") + std::to_string(l);
  return s;
}

}  // namespace

std::string ConvertMethod::label() const { return layers.empty() ? spec : spec + "@" + layers_label(layers); }

ConvertMethod parse_convert_method(const std::string& text) {
  ConvertMethod m;
  const size_t at = text.find('@');
  m.spec = text.substr(0, at);
  models::parse_attention_spec(m.spec);  // throws with the spec's own message
  if (at == std::string::npos) return m;
  const std::string list = text.substr(at + 1);
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    int64_t l = -1;
    try {
      l = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    STRATA_CHECK_ARG(used == item.size() && !item.empty() && l >= 0, "strata convert", "--method",
                     ::strata::detail::cat("layers after '@' as comma-separated integers >= 0 in \"", text, "\""),
                     ::strata::detail::cat("\"", item, "\""));
    m.layers.push_back(l);
  }
  STRATA_CHECK_ARG(!m.layers.empty(), "strata convert", "--method",
                   ::strata::detail::cat("at least one layer after '@' in \"", text, "\""), "none");
  return m;
}

std::vector<ConvertMethod> default_convert_methods() {
  std::vector<std::string> t = {
      "softmax",
      // Monarch, every layer: T = 1..3 at the default block (floor(sqrt(N))) and at B = 8 (the
      // best at N = 512 in our sweep: M = 64 blocks), and other fixed blocks.
      "monarch:T=1", "monarch:T=2", "monarch:T=3",
      "monarch:T=1,B=8", "monarch:T=2,B=8", "monarch:T=3,B=8",
      "monarch:T=2,B=4", "monarch:T=2,B=16",
      // Monarch in a subset of the layers (the others stay softmax).
      "monarch:T=2,B=8@0,1,3,4,5", "monarch:T=2,B=8@3,4,5", "monarch:T=2@0,1,2",
      "nystrom:landmarks=8", "nystrom:landmarks=16", "nystrom:landmarks=32", "nystrom:landmarks=64",
      "performer:features=32,seed=0", "performer:features=64,seed=0", "performer:features=128,seed=0",
      "performer:features=256,seed=0",
  };
  std::vector<ConvertMethod> out;
  for (const auto& s : t) out.push_back(parse_convert_method(s));
  return out;
}

std::vector<ConvertMethod> quick_convert_methods() {
  std::vector<ConvertMethod> out;
  for (const char* s : {"softmax", "monarch:T=1", "monarch:T=2,B=8", "monarch:T=3", "nystrom:landmarks=32",
                        "performer:features=128,seed=0"})
    out.push_back(parse_convert_method(s));
  return out;
}

ConvertSummary run_conversion(const ConvertConfig& cfg) {
  const char* where = "strata convert";
  STRATA_CHECK_ARG(!cfg.methods.empty() && cfg.methods[0].spec == "softmax" && cfg.methods[0].layers.empty(), where,
                   "--method", "the list to start with plain \"softmax\" (the baseline every row is compared to)",
                   cfg.methods.empty() ? std::string("an empty list") : cfg.methods[0].label());
  STRATA_CHECK_ARG(cfg.passages >= 1, where, "--passages", ">= 1", cfg.passages);
  for (int64_t n : cfg.long_lengths)
    STRATA_CHECK_ARG(n >= 3 && n <= 512, where, "--long-n", "lengths in 3..512 (the model's positions)", n);
  // The output before any work: a typo must not cost a whole run.
  const std::string out_why = unwritable_reason(cfg.out_dir + "/convert.json");
  STRATA_CHECK_ARG(out_why.empty(), where, "--out", "a folder where convert.json can be written",
                   ::strata::detail::cat("'", cfg.out_dir, "' (", out_why, ")"));

  // --- model and data
  std::string why;
  const std::string model_dir = data::find_minilm_dir(&why);
  STRATA_CHECK(!model_dir.empty(), where, ": the pretrained encoder is missing: ", why);
  std::string tried;
  const std::string sts_path = data::find_shared_file("data/sts/sts-test.csv", &tried);
  STRATA_CHECK(!sts_path.empty(), where, ": STS-B test not found (tried ", tried, "; set STRATA_SHARED_DIR)");
  const std::string text_path = data::find_shared_file("data/text/tinyshakespeare.txt", &tried);
  STRATA_CHECK(!text_path.empty(), where, ": tinyshakespeare.txt not found (tried ", tried,
               "; set STRATA_SHARED_DIR)");

  models::SentenceEncoder model = models::SentenceEncoder::load(model_dir);
  const models::BertConfig& mc = model.encoder.config();
  // Every method's layer list before any row runs (the layer count is the model's).
  for (const ConvertMethod& m : cfg.methods)
    for (int64_t l : m.layers)
      STRATA_CHECK_ARG(l < mc.layers, where, "--method",
                       ::strata::detail::cat("layers in 0..", mc.layers - 1, " in \"", m.label(), "\""), l);
  std::vector<data::StsPair> sts = data::load_sts(sts_path);
  if (cfg.sts_pairs > 0 && cfg.sts_pairs < int64_t(sts.size())) sts.resize(size_t(cfg.sts_pairs));
  std::vector<std::string> sentences;
  std::vector<double> gold;
  for (const auto& p : sts) {
    sentences.push_back(p.sentence1);
    sentences.push_back(p.sentence2);
    gold.push_back(p.score);
  }
  std::vector<std::vector<int64_t>> sent_ids;
  std::vector<int64_t> sent_len;
  for (const auto& s : sentences) {
    sent_ids.push_back(model.tokenizer.encode(s, model.max_len).ids);
    sent_len.push_back(int64_t(sent_ids.back().size()));
  }

  // Enough of the text for the longest passages (a prefix: tokenising all 1.1 MB is not needed).
  std::ifstream tf(text_path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(tf)), std::istreambuf_iterator<char>());
  const int64_t longest = cfg.long_lengths.empty() ? 3 : *std::max_element(cfg.long_lengths.begin(), cfg.long_lengths.end());
  const size_t want_chars = std::min(text.size(), size_t(cfg.passages * longest * 8 + 4096));
  const size_t cut = text.find_first_of(" \n", want_chars);
  const std::vector<int64_t> pieces = model.tokenizer.tokenize_ids(text.substr(0, cut == std::string::npos ? text.size() : cut));
  std::vector<at::Tensor> long_ids;
  for (int64_t n : cfg.long_lengths) long_ids.push_back(passage_ids(pieces, model.tokenizer, n, cfg.passages));

  if (!cfg.quiet)
    fmt::print("model {} ({} layers, {} heads of {}); STS-B test: {} pairs; passages: {} x N in {}\n", model_dir,
               mc.layers, mc.heads, mc.head_dim(), sts.size(), cfg.passages, fmt::join(cfg.long_lengths, "/"));

  // --- rows
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  std::vector<at::Tensor> softmax_long;
  double softmax_rho = 0;
  const models::AttentionSpec softmax_spec = models::parse_attention_spec("softmax");
  auto flops_of = [&](const models::AttentionSpec& s, const std::vector<int64_t>& layers, int64_t n) {
    return models::encoder_attention_flops(mc, s, layers, n);
  };
  double softmax_sts_flops = 0;
  for (int64_t n : sent_len) softmax_sts_flops += flops_of(softmax_spec, {}, n);
  softmax_sts_flops /= double(sent_len.size());

  if (!cfg.quiet) {
    fmt::print("\n{:<34} {:>8} {:>7} {:>9}", "method@layers", "STS rho", "% soft", "FLOPs/%");
    for (int64_t n : cfg.long_lengths) fmt::print(" {:>7} {:>6}", fmt::format("cos{}", n), "FLOP%");
    fmt::print(" {:>6}\n", "secs");
  }
  ConvertSummary sum;
  double best_long_cos = -2, best_long_frac = 0;
  for (const ConvertMethod& m : cfg.methods) {
    const auto t0 = Clock::now();
    const models::AttentionSpec spec = models::parse_attention_spec(m.spec);
    models::convert(model.encoder, softmax_spec, {});
    models::convert(model.encoder, spec, m.layers);

    const at::Tensor emb = embed_unpadded(model, sent_ids, cfg.batch_size);
    std::vector<double> cos(sts.size());
    auto e = emb.accessor<float, 2>();
    for (size_t i = 0; i < sts.size(); ++i) {
      double d = 0;
      for (int64_t c = 0; c < emb.size(1); ++c) d += double(e[int64_t(2 * i)][c]) * e[int64_t(2 * i + 1)][c];
      cos[i] = d;
    }
    const double rho = 100 * data::spearman(cos, gold);
    double fl = 0;
    for (int64_t n : sent_len) fl += flops_of(spec, m.layers, n);
    fl /= double(sent_len.size());
    const bool is_softmax = &m == &cfg.methods[0];
    if (is_softmax) softmax_rho = rho;

    nlohmann::ordered_json row;
    row["method"] = m.label();
    row["spec"] = models::to_string(spec);
    row["kind"] = models::kind_name(spec.kind);
    row["layers"] = m.layers.empty() ? nlohmann::ordered_json("all") : nlohmann::ordered_json(m.layers);
    row["sts_spearman"] = rho;
    row["sts_pct_of_softmax"] = 100 * rho / softmax_rho;
    row["sts_attn_flops_mean"] = fl;
    row["sts_flop_fraction"] = fl / softmax_sts_flops;
    nlohmann::ordered_json longs = nlohmann::ordered_json::array();
    std::vector<std::pair<double, double>> long_cells;
    for (size_t i = 0; i < cfg.long_lengths.size(); ++i) {
      const int64_t n = cfg.long_lengths[i];
      const at::Tensor ids = long_ids[i];
      const at::Tensor z = model.encoder.embed(ids, at::ones_like(ids));
      if (is_softmax) softmax_long.push_back(z);
      const auto [cmean, cmin] = cosine_stats(z, softmax_long[i]);
      const double frac = flops_of(spec, m.layers, n) / flops_of(softmax_spec, {}, n);
      longs.push_back({{"n", n}, {"cosine_mean", cmean}, {"cosine_min", cmin}, {"attn_flops", flops_of(spec, m.layers, n)},
                       {"flop_fraction", frac}});
      long_cells.emplace_back(cmean, frac);
      if (n == 512 && spec.kind == models::AttentionKind::monarch && frac <= 0.35 && cmean > best_long_cos) {
        best_long_cos = cmean;
        best_long_frac = frac;
      }
    }
    row["long"] = longs;
    row["seconds"] = seconds_since(t0);
    if (spec.kind == models::AttentionKind::monarch && rho > sum.best_monarch_spearman) {
      sum.best_monarch_spearman = rho;
      sum.best_monarch = m.label();
    }
    // STS-B sentences are short: a block size >= the length makes Monarch exact softmax attention
    // (and dearer); the best row that actually saves attention FLOPs is reported beside it.
    if (spec.kind == models::AttentionKind::monarch && fl < softmax_sts_flops && rho > sum.best_cheap_monarch_spearman) {
      sum.best_cheap_monarch_spearman = rho;
      sum.best_cheap_monarch = m.label();
      sum.best_cheap_monarch_fraction = fl / softmax_sts_flops;
    }
    if (!cfg.quiet) {
      fmt::print("{:<34} {:>8.2f} {:>6.1f}% {:>8.1f}%", m.label(), rho, 100 * rho / softmax_rho,
                 100 * fl / softmax_sts_flops);
      for (const auto& [c, f] : long_cells) fmt::print(" {:>7.4f} {:>5.1f}%", c, 100 * f);
      fmt::print(" {:>6.1f}\n", row["seconds"].get<double>());
      std::fflush(stdout);
    }
    rows.push_back(row);
  }
  models::convert(model.encoder, softmax_spec, {});

  // --- targets (experiments.md section 4; issue 4)
  sum.softmax_spearman = softmax_rho;
  sum.sts_target = sum.best_monarch_spearman >= 0.97 * softmax_rho;
  const bool has512 = std::find(cfg.long_lengths.begin(), cfg.long_lengths.end(), 512) != cfg.long_lengths.end();
  sum.long_target = has512 && best_long_cos >= 0.95;
  int baselines_compared = 0;
  sum.baselines_lower = has512 && best_long_cos > -2;
  for (const auto& row : rows) {
    const std::string kind = row["kind"];
    if (kind != "nystrom" && kind != "performer") continue;
    for (const auto& cell : row["long"]) {
      if (cell["n"] != 512 || cell["flop_fraction"].get<double>() < best_long_frac) continue;
      ++baselines_compared;
      if (cell["cosine_mean"].get<double>() >= best_long_cos) sum.baselines_lower = false;
    }
  }
  sum.baselines_lower = sum.baselines_lower && baselines_compared > 0;

  nlohmann::ordered_json j;
  j["bench"] = "convert";
  j["model"] = model_dir;
  j["date"] = utc_now();
  j["threads"] = strata::get_num_threads();
  j["torch_version"] = torch_version();
  j["sts"] = {{"file", sts_path}, {"pairs", sts.size()}, {"softmax_spearman", softmax_rho},
              {"softmax_attn_flops_mean", softmax_sts_flops}};
  j["long"] = {{"file", text_path}, {"lengths", cfg.long_lengths}, {"passages", cfg.passages}};
  j["flops"] = "2 x the multiply-accumulates of the attention matmuls per sequence, all layers (models/attention_zoo.h)";
  j["rows"] = rows;
  j["targets"] = {{"best_monarch", sum.best_monarch},
                  {"best_monarch_spearman", sum.best_monarch_spearman},
                  {"best_monarch_below_softmax_flops", sum.best_cheap_monarch},
                  {"best_monarch_below_softmax_flops_spearman", sum.best_cheap_monarch_spearman},
                  {"best_monarch_below_softmax_flops_fraction", sum.best_cheap_monarch_fraction},
                  {"sts_best_monarch_ge_97pct", sum.sts_target},
                  {"n512_monarch_le_35pct_flops_cos_ge_095", sum.long_target},
                  {"n512_best_monarch_cosine", best_long_cos > -2 ? nlohmann::ordered_json(best_long_cos) : nullptr},
                  {"n512_baselines_at_ge_flops_lower", sum.baselines_lower},
                  {"n512_baselines_compared", baselines_compared}};
  sum.json_path = cfg.out_dir + "/convert.json";
  write_file_atomic(sum.json_path, j.dump(2) + "\n", where);
  if (!cfg.quiet) {
    fmt::print("\ntargets: best Monarch STS {} = {:.2f} ({:.1f}% of softmax {:.2f}; need >= 97%): {}\n",
               sum.best_monarch, sum.best_monarch_spearman, 100 * sum.best_monarch_spearman / softmax_rho, softmax_rho,
               sum.sts_target ? "PASS" : "FAIL");
    if (!sum.best_cheap_monarch.empty())
      fmt::print("         best Monarch with fewer STS attention FLOPs than softmax: {} = {:.2f} ({:.1f}% of softmax) at "
                 "{:.1f}% of the FLOPs\n",
                 sum.best_cheap_monarch, sum.best_cheap_monarch_spearman,
                 100 * sum.best_cheap_monarch_spearman / softmax_rho, 100 * sum.best_cheap_monarch_fraction);
    if (has512) {
      fmt::print("         N=512 best Monarch at <= 35% FLOPs: mean cosine {:.4f} at {:.1f}% (need >= 0.95): {}\n",
                 best_long_cos, 100 * best_long_frac, sum.long_target ? "PASS" : "FAIL");
      fmt::print("         N=512 Nystromformer / Performer at >= that FLOP fraction score lower ({} cells): {}\n",
                 baselines_compared, sum.baselines_lower ? "PASS" : "FAIL");
    }
    fmt::print("wrote {}\n", sum.json_path);
  }
  if (cfg.plot) {
    const std::string png = cfg.out_dir + "/convert.png";
    if (run_python_script(plot_script_path("plot_convert.py"), {sum.json_path, png, "--quiet"}, &why)) {
      sum.png_path = png;
      if (!cfg.quiet) fmt::print("wrote {}\n", png);
    } else if (!cfg.quiet) {
      fmt::print("no plot: {}\n", why);
    }
  }
  return sum;
}

CLI::App* add_convert(CLI::App& app, ConvertOptions& o) {
  CLI::App* cmd = app.add_subcommand(
      "convert", "Zero-shot conversion of all-MiniLM-L6-v2: STS-B and long-passage fidelity vs attention FLOPs");
  cmd->add_option("--method", o.methods,
                  "a row: <spec>[@layers], e.g. monarch:T=2,B=8@3,4,5 (repeatable; default: the full list; "
                  "the first must be softmax)")
      ->type_name("SPEC");
  cmd->add_flag("--quick", o.quick, "fewer methods, 300 STS pairs, 4 passages per length (~1 minute)");
  cmd->add_option("--sts-pairs", o.sts_pairs, "use the first n STS-B test pairs (default: all 1,379)")
      ->check(CLI::Range(int64_t(2), int64_t(1) << 40));
  cmd->add_option("--long-n", o.long_lengths, "passage lengths in tokens (default 128 256 512)")
      ->check(CLI::Range(3, 512));
  cmd->add_option("--passages", o.passages, "passages per length (default 16)")->check(CLI::Range(1, 1000));
  cmd->add_option("--out", o.out, "folder for convert.json and convert.png")->capture_default_str()->type_name("DIR");
  cmd->add_option("--threads", o.threads, "threads for strata and torch (default: STRATA_NUM_THREADS or all)")
      ->check(CLI::Range(1, 4096));
  cmd->add_flag("--no-plot", o.no_plot, "do not run the plot script");
  return cmd;
}

int run_convert(const ConvertOptions& o) {
  configure_threads(o.threads);
  ConvertConfig cfg;
  cfg.methods = o.quick ? quick_convert_methods() : default_convert_methods();
  if (!o.methods.empty()) {
    cfg.methods.clear();
    for (const auto& m : o.methods) cfg.methods.push_back(parse_convert_method(m));
  }
  if (o.quick) {
    cfg.sts_pairs = 300;
    cfg.passages = 4;
  }
  if (o.sts_pairs > 0) cfg.sts_pairs = o.sts_pairs;
  if (o.passages > 0) cfg.passages = o.passages;
  if (!o.long_lengths.empty()) cfg.long_lengths = o.long_lengths;
  cfg.out_dir = o.out;
  cfg.plot = !o.no_plot;
  fmt::print("{}\n", version_string());
  run_conversion(cfg);
  return 0;
}

}  // namespace strata::app
