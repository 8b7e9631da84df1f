// models/bert_encoder.h: a BERT encoder (post-LN, GELU, absolute positions) loaded from a
// Hugging Face safetensors checkpoint, with the attention of every layer pluggable, and the
// sentence-transformers head (mean pooling over valid tokens, L2 normalisation). Inference only
// (no autograd), float32, CPU. Built for all-MiniLM-L6-v2 (docs/methods.md): 6 layers,
// hidden 384, 12 heads of 32, FFN 1536; any BertModel checkpoint with the same names loads.
//
// One layer (x: batch x seq x hidden), as transformers' BertLayer in eval mode:
//   q, k, v = x Wq^T + bq, ...            viewed batch x seq x heads x head_dim
//   a = attention(q, k, v, key_padding_mask)     softmax(q k^T / sqrt(head_dim)) v by default
//   x = LayerNorm(x + a Wo^T + bo);  x = LayerNorm(x + GELU_erf(x W1^T + b1) W2^T + b2)
#pragma once
#include <ATen/ATen.h>

#include <functional>
#include <string>
#include <vector>

#include "data/safetensors.h"
#include "data/wordpiece.h"

namespace strata::models {

struct BertConfig {
  int64_t vocab_size = 30522, hidden = 384, layers = 6, heads = 12, intermediate = 1536;
  int64_t max_positions = 512, type_vocab = 2;
  double layer_norm_eps = 1e-12;
  int64_t head_dim() const { return hidden / heads; }
  // Reads a transformers config.json. Throws strata::Error naming the file for a model this
  // encoder does not implement (model_type other than bert, hidden_act other than gelu,
  // position_embedding_type other than absolute) or missing / inconsistent sizes.
  static BertConfig from_json_file(const std::string& path);
};

// The attention of one layer:
//   q, k, v           batch x seq x heads x head_dim   float32, any strides
//   key_padding_mask  batch x seq                      bool, true = a real token (attend)
// returns             batch x seq x heads x head_dim   float32
using AttentionFn = std::function<at::Tensor(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                             const at::Tensor& key_padding_mask)>;

// Softmax attention by strata's dense kernel (strata::torch::attention, layout "bshd").
AttentionFn dense_attention();

class BertEncoder {
 public:
  // Copies and checks (name, dtype F32, shape) every weight the config calls for.
  BertEncoder(const BertConfig& cfg, const data::SafetensorsFile& weights);
  // config.json + model.safetensors from a model directory.
  static BertEncoder load(const std::string& model_dir);

  // ids, attention_mask: batch x seq, int64 (mask 1 = token, 0 = padding), seq <= max_positions.
  // Returns the last hidden states, batch x seq x hidden float32 (padding rows are computed but
  // meaningless). Token types are all 0 (single sentences).
  at::Tensor forward(const at::Tensor& ids, const at::Tensor& attention_mask) const;
  // Sentence embeddings, batch x hidden: mean of forward() over the masked tokens, L2-normalised.
  at::Tensor embed(const at::Tensor& ids, const at::Tensor& attention_mask) const;

  // Replaces the attention of layer `layer` (0-based) or of every layer.
  void set_attention(int64_t layer, AttentionFn fn);
  void set_attention(const AttentionFn& fn);
  const AttentionFn& attention(int64_t layer) const;
  const BertConfig& config() const { return cfg_; }

 private:
  struct Layer {
    at::Tensor w_qkv, b_qkv;  // 3*hidden x hidden: query, key, value stacked (one GEMM)
    at::Tensor w_o, b_o, ln1_w, ln1_b;
    at::Tensor w_1, b_1, w_2, b_2, ln2_w, ln2_b;
    AttentionFn attention;
  };
  BertConfig cfg_;
  at::Tensor word_, position_, token_type_, ln_w_, ln_b_;
  std::vector<Layer> layers_;
};

// Called after every batch with the sequences embedded so far and the total (a progress bar).
using EmbedProgress = std::function<void(int64_t done, int64_t total)>;
// A progress bar on stderr, "<label>: [#####.....] done/total sentences, 1.2 s", redrawn at most
// 10 times a second and at the end (then a newline). For `strata embed` and strata.SentenceEncoder.
EmbedProgress stderr_progress_bar(const std::string& label);

// Tokenizer + encoder: texts to sentence embeddings (the sentence-transformers pipeline).
struct SentenceEncoder {
  data::WordPieceTokenizer tokenizer;
  BertEncoder encoder;
  int64_t max_len = 256;  // tokens incl. [CLS] and [SEP]; longer texts are truncated (as the model card)

  // vocab.txt, config.json and model.safetensors from a model directory.
  static SentenceEncoder load(const std::string& model_dir);
  // n x hidden float32, row i for texts[i]: each text tokenised (truncated to max_len, which
  // must be in [2, max_positions]), then embed_ids. n = 0 gives 0 x hidden. A text the tokenizer
  // rejects (invalid UTF-8) is a strata::Error naming it: "text i+1 of n (texts[i])".
  at::Tensor embed(const std::vector<std::string>& texts, int64_t batch_size = 32,
                   const EmbedProgress& progress = {}) const;
  // n x hidden float32, row i for ids[i] ([CLS] ... [SEP], as tokenizer.encode gives, each at most
  // max_positions). Every sequence runs at its own length: sorted by length, then batches of up
  // to batch_size sequences of EQUAL length, rows put back in input order. No padding enters any
  // attention, so a method that depends on the length (Monarch's default block floor(sqrt(N)),
  // Nystromformer's segments) sees each sentence as if it ran alone, and the rows equal
  // one-at-a-time embeddings up to the GEMMs' fp32 round-off. This is the conversion
  // benchmark's encoder (models/conversion.h) and what `strata embed` runs.
  at::Tensor embed_ids(const std::vector<std::vector<int64_t>>& ids, int64_t batch_size = 32,
                       const EmbedProgress& progress = {}) const;
};

}  // namespace strata::models
