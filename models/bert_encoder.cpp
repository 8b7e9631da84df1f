// models/bert_encoder.cpp: see bert_encoder.h. Weight names are those of transformers' BertModel
// (embeddings.*, encoder.layer.N.*); the pooler is not used by sentence-transformers.
#include "models/bert_encoder.h"

#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <utility>

#include "strata/error.h"
#include "strata/torch/attention.h"

namespace strata::models {

namespace {

// A copy of a checkpoint tensor as a float32 at::Tensor of the expected shape (the file's bytes
// carry no alignment guarantee, hence the copy rather than a view).
at::Tensor load_f32(const data::SafetensorsFile& f, const std::string& name, std::vector<int64_t> shape) {
  const data::SafetensorsTensor& t = f.tensor(name);
  const std::string where = "BertEncoder: checkpoint '" + f.path() + "'";
  STRATA_CHECK_ARG(t.dtype == data::StDType::F32, where.c_str(), name.c_str(), "dtype F32",
                   data::st_dtype_name(t.dtype));
  std::string want = "[";
  for (size_t i = 0; i < shape.size(); ++i) want += (i ? ", " : "") + std::to_string(shape[i]);
  want += "]";
  STRATA_CHECK_ARG(t.shape == shape, where.c_str(), name.c_str(), "shape " + want, t.shape_str());
  at::Tensor out = at::empty(shape, at::kFloat);
  std::memcpy(out.data_ptr<float>(), t.bytes.data(), t.bytes.size());
  return out;
}

}  // namespace

BertConfig BertConfig::from_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("BERT config '" + path + "': cannot open file");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw Error("BERT config '" + path + "': not valid JSON: " + e.what());
  }
  const auto bad = [&](const std::string& key, const std::string& expected, const nlohmann::json& got) {
    return Error("BERT config '" + path + "': field '" + key + "': expected " + expected + ", got " + got.dump());
  };
  if (!j.is_object()) throw bad("(top level)", "an object", j);
  const auto str = [&](const char* key, const char* want) {
    const auto it = j.find(key);
    if (it == j.end()) return;  // transformers' defaults are the values we implement
    if (!it->is_string() || it->get<std::string>() != want) throw bad(key, std::string("\"") + want + "\"", *it);
  };
  str("model_type", "bert");
  str("hidden_act", "gelu");  // transformers' "gelu" is the exact (erf) GELU
  str("position_embedding_type", "absolute");
  BertConfig c;
  const auto num = [&](const char* key, int64_t& out) {
    const auto it = j.find(key);
    if (it == j.end() || !it->is_number_integer() || it->get<int64_t>() <= 0)
      throw bad(key, "a positive integer", it == j.end() ? nlohmann::json("(missing)") : *it);
    out = it->get<int64_t>();
  };
  num("vocab_size", c.vocab_size);
  num("hidden_size", c.hidden);
  num("num_hidden_layers", c.layers);
  num("num_attention_heads", c.heads);
  num("intermediate_size", c.intermediate);
  num("max_position_embeddings", c.max_positions);
  num("type_vocab_size", c.type_vocab);
  if (const auto it = j.find("layer_norm_eps"); it != j.end()) {
    if (!it->is_number() || !(it->get<double>() > 0)) throw bad("layer_norm_eps", "a positive number", *it);
    c.layer_norm_eps = it->get<double>();
  }
  if (c.hidden % c.heads != 0)
    throw bad("num_attention_heads", "a divisor of hidden_size " + std::to_string(c.hidden), j["num_attention_heads"]);
  return c;
}

AttentionFn dense_attention() {
  return [](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& key_padding_mask) {
    strata::torch::AttentionArgs a;
    a.key_padding_mask = key_padding_mask;
    a.layout = "bshd";
    return strata::torch::attention(q, k, v, a);
  };
}

BertEncoder::BertEncoder(const BertConfig& cfg, const data::SafetensorsFile& f) : cfg_(cfg) {
  const int64_t H = cfg.hidden, F = cfg.intermediate;
  word_ = load_f32(f, "embeddings.word_embeddings.weight", {cfg.vocab_size, H});
  position_ = load_f32(f, "embeddings.position_embeddings.weight", {cfg.max_positions, H});
  token_type_ = load_f32(f, "embeddings.token_type_embeddings.weight", {cfg.type_vocab, H});
  ln_w_ = load_f32(f, "embeddings.LayerNorm.weight", {H});
  ln_b_ = load_f32(f, "embeddings.LayerNorm.bias", {H});
  for (int64_t l = 0; l < cfg.layers; ++l) {
    const std::string p = "encoder.layer." + std::to_string(l) + ".";
    Layer L;
    L.w_qkv = at::cat({load_f32(f, p + "attention.self.query.weight", {H, H}),
                       load_f32(f, p + "attention.self.key.weight", {H, H}),
                       load_f32(f, p + "attention.self.value.weight", {H, H})});
    L.b_qkv =
        at::cat({load_f32(f, p + "attention.self.query.bias", {H}), load_f32(f, p + "attention.self.key.bias", {H}),
                 load_f32(f, p + "attention.self.value.bias", {H})});
    L.w_o = load_f32(f, p + "attention.output.dense.weight", {H, H});
    L.b_o = load_f32(f, p + "attention.output.dense.bias", {H});
    L.ln1_w = load_f32(f, p + "attention.output.LayerNorm.weight", {H});
    L.ln1_b = load_f32(f, p + "attention.output.LayerNorm.bias", {H});
    L.w_1 = load_f32(f, p + "intermediate.dense.weight", {F, H});
    L.b_1 = load_f32(f, p + "intermediate.dense.bias", {F});
    L.w_2 = load_f32(f, p + "output.dense.weight", {H, F});
    L.b_2 = load_f32(f, p + "output.dense.bias", {H});
    L.ln2_w = load_f32(f, p + "output.LayerNorm.weight", {H});
    L.ln2_b = load_f32(f, p + "output.LayerNorm.bias", {H});
    L.attention = dense_attention();
    layers_.push_back(std::move(L));
  }
}

BertEncoder BertEncoder::load(const std::string& model_dir) {
  return BertEncoder(BertConfig::from_json_file(model_dir + "/config.json"),
                     data::SafetensorsFile::open(model_dir + "/model.safetensors"));
}

void BertEncoder::set_attention(int64_t layer, AttentionFn fn) {
  STRATA_CHECK_ARG(layer >= 0 && layer < cfg_.layers, "BertEncoder::set_attention", "layer",
                   "in [0, " + std::to_string(cfg_.layers) + ")", layer);
  STRATA_CHECK_ARG(bool(fn), "BertEncoder::set_attention", "fn", "a callable", "an empty std::function");
  layers_[size_t(layer)].attention = std::move(fn);
}

void BertEncoder::set_attention(const AttentionFn& fn) {
  for (int64_t l = 0; l < cfg_.layers; ++l) set_attention(l, fn);
}

const AttentionFn& BertEncoder::attention(int64_t layer) const {
  STRATA_CHECK_ARG(layer >= 0 && layer < cfg_.layers, "BertEncoder::attention", "layer",
                   "in [0, " + std::to_string(cfg_.layers) + ")", layer);
  return layers_[size_t(layer)].attention;
}

at::Tensor BertEncoder::forward(const at::Tensor& ids, const at::Tensor& attention_mask) const {
  const char* where = "BertEncoder::forward";
  STRATA_CHECK_ARG(ids.defined() && ids.dim() == 2 && ids.size(0) > 0 && ids.size(1) > 0, where, "ids",
                   "a non-empty batch x seq tensor", ids.defined() ? ids.sizes() : at::IntArrayRef{});
  STRATA_CHECK_ARG(ids.scalar_type() == at::kLong, where, "ids", "dtype int64", ids.scalar_type());
  STRATA_CHECK_ARG(ids.device().is_cpu(), where, "ids", "a CPU tensor", ids.device());
  const int64_t B = ids.size(0), S = ids.size(1), H = cfg_.hidden, nh = cfg_.heads, hd = cfg_.head_dim();
  STRATA_CHECK_ARG(S <= cfg_.max_positions, where, "ids", "at most " + std::to_string(cfg_.max_positions) + " tokens",
                   S);
  STRATA_CHECK_ARG(attention_mask.defined() && attention_mask.sizes() == ids.sizes(), where, "attention_mask",
                   "shape of ids " + std::string(c10::str(ids.sizes())),
                   attention_mask.defined() ? c10::str(attention_mask.sizes()) : std::string("undefined"));
  STRATA_CHECK_ARG(attention_mask.device().is_cpu(), where, "attention_mask", "a CPU tensor", attention_mask.device());
  const int64_t lo = ids.min().item<int64_t>(), hi = ids.max().item<int64_t>();
  STRATA_CHECK_ARG(lo >= 0 && hi < cfg_.vocab_size, where, "ids",
                   "token ids in [0, " + std::to_string(cfg_.vocab_size) + ")",
                   "ids in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");

  at::NoGradGuard no_grad;
  const at::Tensor key_padding_mask = attention_mask.to(at::kBool).contiguous();  // batch x seq
  // Embeddings: word + absolute position + token type 0, then LayerNorm.
  at::Tensor x = at::embedding(word_, ids) + position_.slice(0, 0, S).unsqueeze(0) + token_type_[0];
  x = at::layer_norm(x, {H}, ln_w_, ln_b_, cfg_.layer_norm_eps);  // batch x seq x hidden
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& L = layers_[l];
    const at::Tensor qkv = at::linear(x, L.w_qkv, L.b_qkv).view({B, S, 3, nh, hd});
    // q, k, v: batch x seq x heads x head_dim views into qkv (not contiguous).
    const at::Tensor a = L.attention(qkv.select(2, 0), qkv.select(2, 1), qkv.select(2, 2), key_padding_mask);
    const std::string arg = "attention output of layer " + std::to_string(l);
    STRATA_CHECK_ARG(
        a.defined() && a.dim() == 4 && a.size(0) == B && a.size(1) == S && a.size(2) == nh && a.size(3) == hd, where,
        arg.c_str(), "batch x seq x heads x head_dim " + c10::str(at::IntArrayRef{B, S, nh, hd}),
        a.defined() ? c10::str(a.sizes()) : std::string("undefined"));
    STRATA_CHECK_ARG(a.scalar_type() == at::kFloat, where, arg.c_str(), "dtype float32", a.scalar_type());
    x = at::layer_norm(x + at::linear(a.reshape({B, S, H}), L.w_o, L.b_o), {H}, L.ln1_w, L.ln1_b, cfg_.layer_norm_eps);
    const at::Tensor h = at::gelu(at::linear(x, L.w_1, L.b_1));  // approximate="none": the erf GELU
    x = at::layer_norm(x + at::linear(h, L.w_2, L.b_2), {H}, L.ln2_w, L.ln2_b, cfg_.layer_norm_eps);
  }
  return x;
}

at::Tensor BertEncoder::embed(const at::Tensor& ids, const at::Tensor& attention_mask) const {
  const at::Tensor x = forward(ids, attention_mask);
  at::NoGradGuard no_grad;
  const at::Tensor m = attention_mask.to(at::kFloat).unsqueeze(-1);  // batch x seq x 1
  // sentence-transformers Pooling (mean) then Normalize: sum / max(count, 1e-9), x / max(|x|, 1e-12).
  const at::Tensor mean = (x * m).sum(1) / m.sum(1).clamp_min(1e-9);
  return mean / mean.norm(2, {1}, /*keepdim=*/true).clamp_min(1e-12);
}

EmbedProgress stderr_progress_bar(const std::string& label) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  Clock::time_point last{};
  return [=](int64_t done, int64_t total) mutable {
    const Clock::time_point now = Clock::now();
    if (done < total && now - last < std::chrono::milliseconds(100)) return;
    last = now;
    const int width = 30, filled = int(width * done / std::max<int64_t>(total, 1));
    std::fprintf(stderr, "\r%s: [%s%s] %lld/%lld sentences, %.1f s", label.c_str(), std::string(size_t(filled), '#').c_str(),
                 std::string(size_t(width - filled), '.').c_str(), (long long)done, (long long)total,
                 std::chrono::duration<double>(now - start).count());
    if (done == total) std::fprintf(stderr, "\n");
    std::fflush(stderr);
  };
}

SentenceEncoder SentenceEncoder::load(const std::string& model_dir) {
  return SentenceEncoder{data::WordPieceTokenizer::from_vocab_file(model_dir + "/vocab.txt"),
                         BertEncoder::load(model_dir)};
}

at::Tensor SentenceEncoder::embed(const std::vector<std::string>& texts, int64_t batch_size,
                                  const EmbedProgress& progress) const {
  const int64_t max_positions = encoder.config().max_positions;
  STRATA_CHECK_ARG(max_len >= 2 && max_len <= max_positions, "SentenceEncoder::embed", "max_len",
                   "in [2, " + std::to_string(max_positions) + "] (room for [CLS] and [SEP], the model's positions)",
                   max_len);
  std::vector<std::vector<int64_t>> ids;
  ids.reserve(texts.size());
  for (size_t i = 0; i < texts.size(); ++i) {
    try {
      ids.push_back(tokenizer.encode(texts[i], max_len).ids);
    } catch (const Error& e) {  // which text (the CLI's line number), e.g. for invalid UTF-8
      throw Error(detail::cat("SentenceEncoder::embed: text ", i + 1, " of ", texts.size(), " (texts[", i, "]): ",
                              e.what()));
    }
  }
  return embed_ids(ids, batch_size, progress);
}

at::Tensor SentenceEncoder::embed_ids(const std::vector<std::vector<int64_t>>& ids, int64_t batch_size,
                                      const EmbedProgress& progress) const {
  STRATA_CHECK_ARG(batch_size > 0, "SentenceEncoder::embed", "batch_size", "> 0", batch_size);
  std::vector<size_t> order(ids.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ids[a].size() < ids[b].size(); });
  at::Tensor out = at::empty({int64_t(ids.size()), encoder.config().hidden}, at::kFloat);
  for (size_t start = 0; start < order.size();) {
    const size_t len = ids[order[start]].size();
    size_t end = start;
    while (end < order.size() && ids[order[end]].size() == len && int64_t(end - start) < batch_size) ++end;
    at::Tensor batch = at::empty({int64_t(end - start), int64_t(len)}, at::kLong);  // rows of equal length
    auto a = batch.accessor<int64_t, 2>();
    for (size_t r = start; r < end; ++r)
      for (size_t c = 0; c < len; ++c) a[int64_t(r - start)][int64_t(c)] = ids[order[r]][c];
    const at::Tensor emb = encoder.embed(batch, at::ones_like(batch));
    for (size_t r = start; r < end; ++r) out[int64_t(order[r])].copy_(emb[int64_t(r - start)]);
    start = end;
    if (progress) progress(int64_t(end), int64_t(ids.size()));
  }
  return out;
}

}  // namespace strata::models
