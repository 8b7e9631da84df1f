// models/generate.h: autoregressive generation from a character-LM decoder (models/decoder.h) with
// per-layer caches, behind `strata generate`:
//   mlr layers                      the MLR compressed key cache (strata::torch::MlrDecodeCache:
//                                   per level only the current block's r_l-dim key slices) + V
//   mha, swa, longformer, gswa, sdpa  a key / value cache (the new token's q against the cached
//                                   k, v; the kernels' bottom-right alignment gives the last row)
//   btt, bmlr                       their transformed keys (btt: D per head; bmlr: sum_l r_l p_l)
//                                   and values (strata::torch::bilinear_*_qkv), the shared /
//                                   per-head query of the new token against them
// A prompt is fed in one call (each layer's full forward over it, filling the caches), then one
// token at a time. The logits of the last position equal the full forward's over the same tokens to
// fp32 round-off (tests/cpp/train_test.cpp: greedy output identical token for token).
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "models/decoder.h"
#include "strata/torch/mlr.h"

namespace strata::models {

class DecoderCache {
 public:
  // model: a char-LM decoder (vocab_size > 0); max_len <= its context.
  DecoderCache(DecoderImpl& model, int64_t max_len);
  // Feeds ids (int64, n >= 1 tokens: the prompt first, then single tokens) and returns the logits of
  // the last position (vocab, float32). Throws when the total would exceed max_len.
  at::Tensor feed(const std::vector<int64_t>& ids);
  int64_t length() const { return len_; }
  // Key / value cache bytes held for max_len tokens (all layers, fp32), and the key bytes a dense
  // cache of max_len tokens would hold for the same layers (the MLR layers' comparison).
  int64_t key_bytes() const;
  int64_t value_bytes() const;
  int64_t dense_key_bytes() const;

 private:
  struct Layer {
    std::unique_ptr<strata::torch::MlrDecodeCache> mlr;  // mlr layers
    at::Tensor k, v;  // the other layers: 1 x max_len x H x key width (d; bilinear: see above), v d
  };
  at::Tensor layer_forward(size_t l, const at::Tensor& x);  // 1 x n x D -> 1 x n x D (the block)

  DecoderImpl& m_;
  int64_t max_len_, len_ = 0;
  std::vector<Layer> layers_;
};

struct GenerateOptions {
  int64_t tokens = 200;      // new tokens
  double temperature = 1.0;  // 0: greedy (argmax)
  int64_t top_k = 0;         // 0: the whole vocabulary
  uint64_t seed = 0;
};

struct GenerateStats {
  int64_t prompt_tokens = 0, new_tokens = 0;
  double prefill_seconds = 0, decode_seconds = 0, tokens_per_second = 0;  // decode tokens / decode seconds
  int64_t key_bytes = 0, value_bytes = 0, dense_key_bytes = 0;
};

// Generates opt.tokens ids after prompt (prompt + tokens <= the model's context, else an error
// naming 'tokens'); on_token(id) is called as each comes. Under NoGradGuard, eval mode.
std::vector<int64_t> generate(DecoderImpl& model, const std::vector<int64_t>& prompt, const GenerateOptions& opt,
                              const std::function<void(int64_t)>& on_token = {}, GenerateStats* stats = nullptr);

// The next id from logits (vocab): argmax at temperature 0, else a draw from softmax(logits / T)
// restricted to the top_k largest (0 = all), with u uniform in [0, 1).
int64_t sample_token(const at::Tensor& logits, double temperature, int64_t top_k, double u);

}  // namespace strata::models
