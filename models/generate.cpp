// models/generate.cpp: cached autoregressive decoding (generate.h).
#include "models/generate.h"

#include <torch/nn/functional/activation.h>

#include <chrono>
#include <random>

#include "strata/error.h"
#include "strata/torch/attention.h"
#include "strata/torch/bilinear_attention.h"

namespace strata::models {
namespace {

using Kind = LayerAttentionKind;

bool bilinear(Kind k) { return k == Kind::btt || k == Kind::bmlr; }

// The per-head key width a layer's cache holds: d, or the bilinear layers' transformed keys (btt:
// the full width D; bmlr: the concatenated level features, sum_l r_l p_l with p_l = 2^(l-1)).
int64_t key_width(const LayerAttentionSpec& spec, int64_t width, int64_t head_dim) {
  if (spec.kind == Kind::btt) return width;
  if (spec.kind != Kind::bmlr) return head_dim;
  int64_t features = 0;
  for (size_t l = 0; l < spec.ranks.size(); ++l) features += spec.ranks[l] << l;
  return features;
}

}  // namespace

DecoderCache::DecoderCache(DecoderImpl& model, int64_t max_len) : m_(model), max_len_(max_len) {
  const char* where = "DecoderCache";
  STRATA_CHECK_ARG(model.config.vocab_size > 0, where, "model", "a character-LM decoder (vocab_size > 0)",
                   "a regression decoder");
  STRATA_CHECK_ARG(max_len >= 1 && max_len <= model.config.context, where, "max_len",
                   "1.." + std::to_string(model.config.context) + " (the model's context)", max_len);
  const int64_t H = model.config.heads, D = model.config.width, d = D / H;
  const auto opts = at::TensorOptions().dtype(at::kFloat);
  for (size_t l = 0; l < model.layer_specs.size(); ++l) {
    SelfAttentionImpl& attn = *model.block(l).attn;
    Layer c;
    if (attn.spec.kind == Kind::mlr) {
      c.mlr = std::make_unique<strata::torch::MlrDecodeCache>(1, H, d, max_len, attn.mlr_args());
    } else {
      c.k = at::zeros({1, max_len, H, key_width(attn.spec, D, d)}, opts);
      c.v = at::zeros({1, max_len, H, d}, opts);
    }
    layers_.push_back(std::move(c));
  }
}

int64_t DecoderCache::key_bytes() const {
  int64_t b = 0;
  for (const auto& c : layers_) b += c.mlr ? c.mlr->core().key_bytes() : c.k.defined() ? c.k.nbytes() : 0;
  return b;
}

int64_t DecoderCache::value_bytes() const {
  int64_t b = 0;
  for (const auto& c : layers_) b += c.mlr ? c.mlr->core().value_bytes() : c.v.defined() ? c.v.nbytes() : 0;
  return b;
}

int64_t DecoderCache::dense_key_bytes() const {
  return int64_t(layers_.size()) * max_len_ * m_.config.width * int64_t(sizeof(float));
}

at::Tensor DecoderCache::layer_forward(size_t l, const at::Tensor& x) {
  BlockImpl& blk = m_.block(l);
  SelfAttentionImpl& attn = *blk.attn;
  Layer& c = layers_[l];
  const int64_t n = x.size(1), p0 = len_, p1 = len_ + n, D = m_.config.width;
  const at::Tensor h = blk.ln1->forward(x);
  at::Tensor a;
  if (bilinear(attn.spec.kind)) {  // their transformed keys and values cached
    const auto qkv = attn.spec.kind == Kind::btt ? attn.btt->qkv(h) : attn.bmlr->qkv(h);
    c.k.slice(1, p0, p1).copy_(qkv.k);
    c.v.slice(1, p0, p1).copy_(qkv.v);
    const at::Tensor K = c.k.slice(1, 0, p1), V = c.v.slice(1, 0, p1);
    at::Tensor y;  // bottom-right aligned: rows p0..p1-1
    if (attn.spec.kind == Kind::btt) {
      y = strata::torch::shared_query_attention(qkv.q, K, V, 1.0, /*causal=*/true);
    } else {
      strata::torch::AttentionArgs args;
      args.scale = 1.0;
      args.causal = true;
      y = strata::torch::attention(qkv.q, K, V, args);
    }
    auto& out_proj = attn.spec.kind == Kind::btt ? attn.btt->out_proj : attn.bmlr->out_proj;
    a = out_proj->forward(y.reshape({1, n, D}));
  } else {
    auto [q, k, v] = attn.qkv(h);  // 1 x n x H x d each
    at::Tensor y;
    if (c.mlr) {
      STRATA_CHECK(n == 1 || p0 == 0, "DecoderCache::feed: several tokens after the prompt are not supported");
      c.mlr->append(k, v);
      // The prompt: the layer's own forward over it; then one query at a time over the cache.
      y = n == 1 && p0 > 0 ? c.mlr->attend(q) : attn.attend(q, k, v);
    } else {
      c.k.slice(1, p0, p1).copy_(k);
      c.v.slice(1, p0, p1).copy_(v);
      const at::Tensor K = c.k.slice(1, 0, p1), V = c.v.slice(1, 0, p1);
      if (attn.spec.kind == Kind::sdpa && n < p1) {
        // torch's SDPA aligns a causal mask top-left; the new row sees every cached key.
        STRATA_CHECK(n == 1, "DecoderCache::feed: several sdpa tokens after the prompt are not supported");
        const double scale = logit_scale_value(attn.spec.scale, attn.head_dim);
        y = at::scaled_dot_product_attention(q.transpose(1, 2), K.transpose(1, 2), V.transpose(1, 2), {}, 0.0,
                                             /*is_causal=*/false, scale)
                .transpose(1, 2);
      } else {
        y = attn.attend(q, K, V);  // bottom-right aligned: rows p0..p1-1
      }
    }
    a = attn.out_proj->forward(y.reshape({1, n, D}));
  }
  at::Tensor out = x + a;
  return blk.mlp->forward_block(out, *blk.ln2);  // ln2 + MLP + residual: the model's forward's path
}

at::Tensor DecoderCache::feed(const std::vector<int64_t>& ids) {
  const int64_t n = int64_t(ids.size());
  STRATA_CHECK_ARG(n >= 1, "DecoderCache::feed", "ids", "at least one token", "none");
  STRATA_CHECK_ARG(len_ + n <= max_len_, "DecoderCache::feed", "ids",
                   "at most " + std::to_string(max_len_ - len_) + " more tokens (max_len " + std::to_string(max_len_) + ")",
                   n);
  const at::Tensor t = at::tensor(ids, at::kLong).reshape({1, n});
  const at::Tensor pos = at::arange(len_, len_ + n, at::kLong);
  at::Tensor x = m_.tok_emb->forward(t) + m_.pos_emb->forward(pos).unsqueeze(0);
  for (size_t l = 0; l < layers_.size(); ++l) x = layer_forward(l, x);
  len_ += n;
  return m_.head->forward(m_.ln_f->forward(x.select(1, n - 1))).squeeze(0).to(at::kFloat);
}

int64_t sample_token(const at::Tensor& logits, double temperature, int64_t top_k, double u) {
  if (temperature <= 0) return logits.argmax().item<int64_t>();
  at::Tensor z = logits.to(at::kDouble) / temperature;
  if (top_k > 0 && top_k < z.numel()) {
    const double kth = std::get<0>(z.topk(top_k)).min().item<double>();
    z = z.masked_fill(z < kth, -std::numeric_limits<double>::infinity());
  }
  const at::Tensor cdf = z.softmax(0).cumsum(0);
  const auto* c = cdf.data_ptr<double>();
  for (int64_t i = 0; i < cdf.numel(); ++i)
    if (u < c[i]) return i;
  return cdf.numel() - 1;
}

std::vector<int64_t> generate(DecoderImpl& model, const std::vector<int64_t>& prompt, const GenerateOptions& opt,
                              const std::function<void(int64_t)>& on_token, GenerateStats* stats) {
  const char* where = "generate";
  const int64_t P = int64_t(prompt.size()), C = model.config.context;
  STRATA_CHECK_ARG(P >= 1, where, "prompt", "at least one token", "an empty prompt");
  STRATA_CHECK_ARG(opt.tokens >= 0 && P + opt.tokens <= C, where, "tokens",
                   "0.." + std::to_string(C - P) + " (prompt " + std::to_string(P) + " + tokens <= the model's context " +
                       std::to_string(C) + ")",
                   opt.tokens);
  STRATA_CHECK_ARG(opt.temperature >= 0, where, "temperature", ">= 0 (0 = greedy)", opt.temperature);
  STRATA_CHECK_ARG(opt.top_k >= 0, where, "top_k", ">= 0 (0 = all)", opt.top_k);
  ::torch::NoGradGuard no_grad;
  const bool was_training = model.is_training();
  model.eval();
  using Clock = std::chrono::steady_clock;
  DecoderCache cache(model, std::max<int64_t>(1, P + opt.tokens));
  std::mt19937_64 rng(opt.seed);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  std::vector<int64_t> out;
  auto t0 = Clock::now();
  at::Tensor logits = cache.feed(prompt);
  const double prefill = std::chrono::duration<double>(Clock::now() - t0).count();
  t0 = Clock::now();
  for (int64_t i = 0; i < opt.tokens; ++i) {
    const int64_t id = sample_token(logits, opt.temperature, opt.top_k, uniform(rng));
    out.push_back(id);
    if (on_token) on_token(id);
    if (i + 1 < opt.tokens) logits = cache.feed({id});
  }
  const double decode = std::chrono::duration<double>(Clock::now() - t0).count();
  if (was_training) model.train();
  if (stats) {
    stats->prompt_tokens = P;
    stats->new_tokens = opt.tokens;
    stats->prefill_seconds = prefill;
    stats->decode_seconds = decode;
    stats->tokens_per_second = opt.tokens / std::max(decode, 1e-9);
    stats->key_bytes = cache.key_bytes();
    stats->value_bytes = cache.value_bytes();
    stats->dense_key_bytes = cache.dense_key_bytes();
  }
  return out;
}

}  // namespace strata::models
