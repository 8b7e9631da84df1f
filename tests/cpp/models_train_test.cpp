// tests/cpp/models_train_test.cpp: the trained models (models/layer_attention.h, decoder.h,
// forecaster.h): the per-layer attention grammar (round trip, patterns, errors naming the key),
// shapes of every model with every attention kind, causality, gradients of every kind inside a
// tiny model against float64 finite differences (and the float32 kernels against float64), muP
// roles and inits, FLOP and parameter counts against counts written here independently, clone,
// and the mlr / sdpa layers against their references (MLRAttention, mha); every kind on the
// torch-ops path (what CUDA runs) against the kernels' path.
//
// Tolerances:
//   finite differences (float64 model, central differences, step 1e-6): |fd - grad| <= 1e-6 *
//   max(1, |grad|). The truncation error is ~h^2 |f'''| ~ 1e-12 and the round-off ~1e-16 |f| / h
//   ~ 1e-10 for |f| ~ 1e3; a wrong gradient is off by O(|grad|).
//   float32 model vs the float64 one (same weights), all gradients together, normwise: 1e-3.
//   fp32 round-off (6e-8) grows through two layers of projections, LayerNorms, softmax and MLP to
//   ~1e-5 of the largest gradient; a kernel's wrong gradient is O(1) off.
//   Causality: earlier outputs must not move at all beyond 1e-6 of their size (the kernels tile
//   by position, so the earlier rows are computed from the same numbers; 1e-6 allows reordered
//   sums), while the changed position's outputs must move by more than 1e-3.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/autograd.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "models/decoder.h"
#include "models/forecaster.h"
#include "models/layer_attention.h"
#include "strata/error.h"
#include "strata/torch/mlr_attention.h"
#include "strata/torch/mup.h"
#include "test_util.h"
#include "torch_test_util.h"

namespace {

namespace sm = strata::models;
namespace st = strata::torch;
using strata::test::expect_error;
using strata::test::rel_err;

// Every kind at head dim 8 (width 16, 2 heads): the causal ones (decoder) and the non-causal
// ones (forecasters). Contexts: the decoder's 16, the encoders' 16 (point) and 8 (patch) tokens.
const std::vector<std::string> kCausalSpecs = {
    "mha",        "mha:scale=1/sqrt(d)", "swa:w=3", "gswa:split=4|4,w=3", "longformer:global=2,w=3",
    "mlr:ranks=4|2|2,avg=1", "mlr:ranks=6|2,scale=inv_sqrt_head_dim,div=1", "btt:s=2", "btt:rule=balanced,logit=mup",
    "bmlr:ranks=4|4",        "bmlr:ranks=4|2|2,logit=mup,div=1", "sdpa"};
const std::vector<std::string> kEncoderSpecs = {
    "mha", "swa:w=2", "longformer:global=1,w=2", "mlr:ranks=4|4", "mlr:ranks=4|2|1|1,avg=1", "btt", "bmlr:ranks=4|4",
    "monarch:T=2,B=4", "monarch", "sdpa:scale=1/sqrt(d)"};

sm::DecoderConfig lm_config(const std::string& attention, int64_t layers = 2) {
  sm::DecoderConfig c;
  c.vocab_size = 11;
  c.width = 16;
  c.heads = 2;
  c.layers = layers;
  c.context = 16;
  c.qk_layernorm = true;
  c.attention = attention;
  return c;
}

sm::ForecasterConfig fc_config(const std::string& kind, const std::string& attention) {
  sm::ForecasterConfig c;
  c.kind = kind;
  c.input_len = 16;
  c.horizon = 4;
  c.channels = 2;
  c.width = 16;
  c.heads = 2;
  c.ffn = 24;
  c.layers = 2;
  c.patch_len = 4;
  c.stride = 2;  // (16 + 2 - 4) / 2 + 1 = 8 patches
  c.dropout = 0;
  c.attention = attention;
  return c;
}

// Every parameter redrawn (the muP init zeroes the outputs, which would hide every path): gains
// 1 + N(0, 0.1^2), other vectors N(0, 0.1^2), matrices N(0, 1 / last dim).
void randomize(torch::nn::Module& m, uint64_t seed) {
  at::manual_seed(seed);
  at::NoGradGuard g;
  for (auto& p : m.named_parameters()) {
    at::Tensor t = p.value();
    if (t.dim() == 1)
      t.copy_((p.key().find("weight") != std::string::npos ? 1.0 : 0.0) + 0.1 * at::randn_like(t));
    else
      t.copy_(at::randn_like(t) / std::sqrt(double(t.size(-1))));
  }
}

at::Tensor lm_ids(int64_t B, int64_t T, uint64_t seed) {
  at::manual_seed(seed);
  return at::randint(0, 11, {B, T}, at::TensorOptions().dtype(at::kLong));
}

// ---- grammar -----------------------------------------------------------------------------------

TEST(LayerAttentionSpec, RoundTripsEveryKind) {
  for (const auto& list : {kCausalSpecs, kEncoderSpecs})
    for (const std::string& s : list) {
      const sm::LayerAttentionSpec a = sm::parse_layer_attention(s);
      const std::string canon = sm::to_string(a);
      EXPECT_EQ(sm::parse_layer_attention(canon), a) << s << " -> " << canon;
      EXPECT_EQ(sm::to_string(sm::parse_layer_attention(canon)), canon);
    }
  EXPECT_EQ(sm::to_string(sm::parse_layer_attention("mha")), "mha:scale=8/d");
  EXPECT_EQ(sm::to_string(sm::parse_layer_attention("mlr:ranks=32|8|6|4|4|4|4|2,avg=1")),
            "mlr:ranks=32|8|6|4|4|4|4|2,avg=1,div=0,scale=inv_rank");
  EXPECT_EQ(sm::to_string(sm::parse_layer_attention("gswa:split=32|32,w=512")), "gswa:split=32|32,w=512");
  const sm::LayerAttentionSpec g = sm::parse_layer_attention("longformer:global=16,w=64");
  EXPECT_EQ(g.kind, sm::LayerAttentionKind::longformer);
  EXPECT_EQ(g.num_global, 16);
  EXPECT_EQ(g.window, 64);
  EXPECT_EQ(g.scale, sm::LogitScale::eight_over_d);
}

TEST(LayerAttentionSpec, PatternsRepeatAndKeepListValues) {
  const auto six = sm::parse_attention_pattern("mha|swa:w=64|swa:w=64", 6);
  ASSERT_EQ(six.size(), 6u);
  const char* kinds[] = {"mha", "swa", "swa", "mha", "swa", "swa"};
  for (size_t l = 0; l < 6; ++l) EXPECT_STREQ(sm::layer_attention_kind_name(six[l].kind), kinds[l]) << l;
  EXPECT_EQ(six[1].window, 64);
  EXPECT_EQ(sm::pattern_to_string(six), "mha:scale=8/d|swa:w=64,scale=8/d|swa:w=64,scale=8/d");
  // '|' + digit continues a list value, '|' + letter starts the next layer.
  const auto two = sm::parse_attention_pattern("mlr:ranks=48|16|gswa:split=32|32,w=8", 2);
  EXPECT_EQ(two[0].ranks, (std::vector<int64_t>{48, 16}));
  EXPECT_EQ(two[1].split_a, 32);
  EXPECT_EQ(two[1].split_b, 32);
  EXPECT_EQ(sm::parse_attention_pattern(sm::pattern_to_string(two), 4)[3], two[1]);
  // Kinds in the papers' capitals ("MHA|SWA|SWA"); keys keep their case (monarch's T, B).
  EXPECT_EQ(sm::parse_attention_pattern("MHA|SWA:w=64|Swa:w=64", 6), six);
  EXPECT_EQ(sm::parse_layer_attention("MONARCH:T=2,B=8").monarch_steps, 2);
  expect_error([] { sm::parse_attention_pattern("mha|swa:w=4", 3); },
               {"attention pattern \"mha|swa:w=4\" has 2 specs", "layer count 3", "multiple of 2"});
}

TEST(LayerAttentionSpec, ErrorsNameTheKey) {
  expect_error([] { sm::parse_layer_attention("flash"); },
               {"attention spec \"flash\"", "unknown kind 'flash'", "mha, swa, gswa, longformer, mlr, btt, bmlr"});
  expect_error([] { sm::parse_layer_attention("swa:x=1,w=2"); }, {"unknown key 'x' for swa", "w, scale"});
  expect_error([] { sm::parse_layer_attention("mha:w=2"); }, {"unknown key 'w' for mha"});
  expect_error([] { sm::parse_layer_attention("swa"); }, {"key 'w' is required for swa"});
  expect_error([] { sm::parse_layer_attention("mlr:avg=1"); }, {"key 'ranks' is required for mlr"});
  expect_error([] { sm::parse_layer_attention("swa:w=-1"); }, {"key 'w'", "integer >= 0", "\"-1\""});
  expect_error([] { sm::parse_layer_attention("mlr:ranks=8|x"); }, {"key 'ranks'", "joined by '|'", "8|x"});
  expect_error([] { sm::parse_layer_attention("mlr:ranks=8|0"); }, {"key 'ranks'", ">= 1"});
  expect_error([] { sm::parse_layer_attention("mha:scale=1/d"); }, {"key 'scale'", "8/d or 1/sqrt(d)", "1/d"});
  expect_error([] { sm::parse_layer_attention("btt:logit=x"); }, {"key 'logit'", "sp or mup"});
  expect_error([] { sm::parse_layer_attention("mlr:ranks=8,avg=2"); }, {"key 'avg'", "0 or 1"});
  expect_error([] { sm::parse_layer_attention("gswa:split=8,w=1"); }, {"key 'split'", "<a>|<b>"});
  expect_error([] { sm::parse_layer_attention("swa:w=1,w=2"); }, {"key 'w' given twice"});
  expect_error([] { sm::parse_layer_attention("mha:"); }, {"nothing after ':'"});
  // Sizes against the model: the key at fault, what was expected, what came.
  expect_error([] { sm::Decoder(lm_config("mha|mlr:ranks=4|2", 2)); },
               {"DecoderConfig: key 'attention'", "layer 1", "key 'ranks'", "head dim = width / heads = 8", "got 6"});
  expect_error([] { sm::Decoder(lm_config("bmlr:ranks=4|2")); }, {"key 'ranks'", "= 8", "got 6"});
  expect_error([] { sm::Decoder(lm_config("gswa:split=4|3,w=2")); }, {"key 'split'", "a + b = head dim", "4|3"});
  expect_error([] { sm::Decoder(lm_config("monarch")); }, {"monarch is non-causal", "layer 0"});
  expect_error([] { sm::Forecaster(fc_config("patch", "gswa:split=4|4,w=2")); },
               {"ForecasterConfig: key 'attention'", "gswa", "causal only"});
  sm::DecoderConfig c = lm_config("mlr:ranks=2|2|2|2|0");
  expect_error([&] { sm::Decoder{c}; }, {"key 'ranks'", ">= 1"});
  c = lm_config("mlr:ranks=2|2|1|1|1|1");  // 6 levels: 32 finest blocks, not dividing the context 48
  c.context = 48;
  expect_error([&] { sm::Decoder{c}; }, {"key 'ranks'", "multiple of 32", "context 48"});
  c = lm_config("mha");
  c.heads = 3;
  expect_error([&] { sm::Decoder{c}; }, {"'heads'", "divisor of width = 16", "3"});
  c = lm_config("mha");
  c.vocab_size = 0;  // regression without an input dim
  expect_error([&] { sm::Decoder{c}; }, {"'input_dim'", ">= 1"});
  sm::ForecasterConfig f = fc_config("tokens", "mha");
  expect_error([&] { sm::Forecaster{f}; }, {"'kind'", "\"point\" or \"patch\"", "tokens"});
}

// ---- shapes, causality --------------------------------------------------------------------------

TEST(Models, ShapesOfEveryModelWithEveryKind) {
  at::manual_seed(1);
  for (const std::string& s : kCausalSpecs) {
    SCOPED_TRACE(s);
    sm::Decoder lm(lm_config(s));
    EXPECT_EQ(lm(lm_ids(3, 16, 2)).sizes(), (std::vector<int64_t>{3, 16, 11}));
    EXPECT_EQ(lm(lm_ids(2, 5, 3)).sizes(), (std::vector<int64_t>{2, 5, 11}));  // shorter than the context
    sm::DecoderConfig rc = lm_config(s);
    rc.vocab_size = 0;
    rc.input_dim = 3;
    sm::Decoder reg(rc);
    EXPECT_EQ(reg(at::randn({2, 12, 3})).sizes(), (std::vector<int64_t>{2, 12, 1}));
  }
  for (const std::string& s : kEncoderSpecs) {
    SCOPED_TRACE(s);
    for (const char* kind : {"point", "patch"}) {
      sm::Forecaster f(fc_config(kind, s));
      EXPECT_EQ(f(at::randn({3, 16, 2})).sizes(), (std::vector<int64_t>{3, 4, 2})) << kind;
    }
  }
  sm::Decoder mixed(lm_config("mha|swa:w=4|mlr:ranks=4|4|btt", 4));
  EXPECT_EQ(mixed(lm_ids(1, 16, 4)).sizes(), (std::vector<int64_t>{1, 16, 11}));
  EXPECT_EQ(sm::ForecasterImpl(sm::ForecasterConfig{}).tokens(), 42);  // 336 / 16 / 8: PatchTST's 42
}

TEST(Models, InputErrors) {
  sm::Decoder lm(lm_config("mha"));
  expect_error([&] { lm(lm_ids(1, 17, 1)); }, {"Decoder::forward", "'input'", "at most context = 16", "17"});
  expect_error([&] { lm(at::full({1, 4}, 11, at::TensorOptions().dtype(at::kLong))); }, {"token ids in [0, 11)"});
  expect_error([&] { lm(at::randn({1, 4})); }, {"int64 token ids"});
  sm::Forecaster f(fc_config("point", "mha"));
  expect_error([&] { f(at::randn({1, 15, 2})); }, {"Forecaster::forward", "'x'", "input_len = 16"});
}

TEST(Models, CausalKindsDoNotSeeLaterTokens) {
  for (const std::string& s : kCausalSpecs) {
    SCOPED_TRACE(s);
    sm::Decoder lm(lm_config(s));
    randomize(*lm, 5);
    at::NoGradGuard g;
    const at::Tensor ids = lm_ids(2, 16, 6), changed = ids.clone();
    changed.select(1, 9).copy_((ids.select(1, 9) + 1).remainder(11));  // token 9 differs in both sequences
    ASSERT_FALSE(at::equal(ids, changed));
    const at::Tensor a = lm(ids), b = lm(changed);
    EXPECT_LE(rel_err(b.narrow(1, 0, 9), a.narrow(1, 0, 9)), 1e-6);
    EXPECT_GT((b.narrow(1, 9, 1) - a.narrow(1, 9, 1)).abs().max().item<double>(), 1e-3);
  }
}

TEST(Models, EncoderKindsSeeTheWholeInput) {  // the non-causal side: an early output hears a late step
  for (const std::string& s : kEncoderSpecs) {
    SCOPED_TRACE(s);
    sm::ForecasterConfig c = fc_config("point", s);
    c.revin = false;
    sm::Forecaster f(c);
    randomize(*f, 7);
    at::NoGradGuard g;
    at::manual_seed(8);
    const at::Tensor x = at::randn({1, 16, 2});
    const at::Tensor a = f->block(0).forward(f->embed(x) + f->pos_emb->weight);
    at::Tensor x2 = x.clone();
    x2[0][2][0] += 1.0;  // a later step inside every kind's reach of step 0 (swa w=2: keys 0..2)
    const at::Tensor b = f->block(0).forward(f->embed(x2) + f->pos_emb->weight);
    EXPECT_GT((b[0][0] - a[0][0]).abs().max().item<double>(), 1e-6);
  }
}

// ---- gradients ---------------------------------------------------------------------------------

// loss = sum(model(input) * weights); analytic gradients vs central differences on a few entries
// of every parameter, float64. Then the float32 model's gradients vs the float64 ones.
template <class Model>
void check_gradients(Model& model, const at::Tensor& input, const std::string& what) {
  SCOPED_TRACE(what);
  model->to(at::kDouble);
  const bool float_input = input.is_floating_point();
  const at::Tensor in64 = float_input ? input.to(at::kDouble) : input;
  at::manual_seed(11);
  const at::Tensor w = at::randn(model->forward(in64).sizes(), at::TensorOptions().dtype(at::kDouble));
  const auto loss = [&]() -> at::Tensor { return (model->forward(in64) * w).sum(); };
  model->zero_grad();
  loss().backward();
  std::vector<at::Tensor> grads64;
  int checked = 0;
  for (auto& p : model->named_parameters()) {
    const at::Tensor param = p.value();
    ASSERT_TRUE(param.grad().defined()) << p.key() << ": no gradient";
    grads64.push_back(param.grad().detach().clone().flatten());
    const at::Tensor flat = param.detach().view({-1});
    for (int64_t idx : {int64_t(0), flat.numel() - 1}) {  // the first and last entries
      constexpr double h = 1e-6;
      at::NoGradGuard g;
      const double x0 = flat[idx].item<double>();
      flat[idx] = x0 + h;
      const double up = loss().template item<double>();
      flat[idx] = x0 - h;
      const double down = loss().template item<double>();
      flat[idx] = x0;
      const double fd = (up - down) / (2 * h), an = param.grad().view({-1})[idx].item<double>();
      EXPECT_LE(std::abs(fd - an), 1e-6 * std::max(1.0, std::abs(an))) << p.key() << "[" << idx << "]";
      ++checked;
    }
  }
  EXPECT_GT(checked, 16);
  // The float32 kernels against the float64 references, same weights.
  model->zero_grad();
  model->to(at::kFloat);
  const at::Tensor in32 = float_input ? input.to(at::kFloat) : input;
  (model->forward(in32) * w.to(at::kFloat)).sum().backward();
  std::vector<at::Tensor> grads32;
  for (auto& p : model->named_parameters()) grads32.push_back(p.value().grad().to(at::kDouble).flatten());
  EXPECT_LE(rel_err(at::cat(grads32), at::cat(grads64)), 1e-3);
}

TEST(Models, GradientsOfEveryCausalKindMatchFiniteDifferences) {
  for (const std::string& s : kCausalSpecs) {
    sm::Decoder lm(lm_config(s));
    randomize(*lm, 21);
    check_gradients(lm, lm_ids(2, 8, 22), "decoder " + s);
  }
}

// The paths the shipped configs take (issue 45 item 3): the char-LM config has QK-LayerNorm off,
// where a block with >= 16 tokens runs the fused LayerNorm + packed q/k/v projection (ln_linear,
// attention_qkvpacked / mlr_attention_qkvpacked) and the fused MLP block; ICR has it on. Every
// combination of QK-LayerNorm and fused, for the dense and the MLR layers, at 16 tokens (packed)
// and 7 (unpacked), against finite differences.
TEST(Models, GradientsThroughTheConfigsPathsMatchFiniteDifferences) {
  for (const std::string s : {"mha", "mlr:ranks=4|4,avg=1"})
    for (bool qk_ln : {false, true})
      for (bool fused : {false, true})
        for (int64_t T : {int64_t(8), int64_t(7)}) {
          sm::DecoderConfig c = lm_config(s);
          c.qk_layernorm = qk_ln;
          c.fused = fused;
          sm::Decoder lm(c);
          randomize(*lm, 27);
          check_gradients(lm, lm_ids(2, T, 28),
                          "decoder " + s + (qk_ln ? " qk_ln" : "") + (fused ? " fused" : "") + " T=" + std::to_string(T));
        }
}

TEST(Models, GradientsOfEveryEncoderKindMatchFiniteDifferences) {
  for (const std::string& s : kEncoderSpecs) {
    sm::ForecasterConfig c = fc_config("patch", s);
    c.layers = 1;
    sm::Forecaster f(c);
    randomize(*f, 23);
    at::manual_seed(24);
    check_gradients(f, at::randn({2, 16, 2}), "patch encoder " + s);
  }
  sm::Forecaster point(fc_config("point", "mlr:ranks=4|4|mha"));  // the point model's own layers
  randomize(*point, 25);
  check_gradients(point, at::randn({1, 16, 2}), "point encoder");
  sm::DecoderConfig rc = lm_config("mha|bmlr:ranks=4|4");
  rc.vocab_size = 0;
  rc.input_dim = 3;
  sm::Decoder reg(rc);
  randomize(*reg, 26);
  check_gradients(reg, at::randn({2, 8, 3}), "regression decoder");
}

// ---- the mlr and sdpa layers against their references -----------------------------------------

// The blocks' MLP as the fused kernel (the default) and as three ATen ops: the same function.
TEST(Models, MlpFusedOrNot) {
  at::manual_seed(2);
  sm::Mlp mlp(32, 128, true);
  const at::Tensor x = at::randn({4, 9, 32}).requires_grad_();
  mlp->fused = true;
  const at::Tensor yf = mlp->forward(x);
  yf.sum().backward();
  const at::Tensor gf = x.grad().clone(), wf = mlp->fc->weight.grad().clone();
  x.grad().zero_();
  mlp->zero_grad();
  mlp->fused = false;
  const at::Tensor yu = mlp->forward(x);
  yu.sum().backward();
  EXPECT_LT(rel_err(yf.detach().to(at::kDouble), yu.detach().to(at::kDouble)), 2e-5);
  EXPECT_LT(rel_err(gf.to(at::kDouble), x.grad().to(at::kDouble)), 2e-5);
  EXPECT_LT(rel_err(wf.to(at::kDouble), mlp->fc->weight.grad().to(at::kDouble)), 5e-5);
}

TEST(Models, MlrLayerIsMlrAttention) {
  sm::AttentionGeometry g{16, 2, 16, true, true, true};
  sm::SelfAttention ours(sm::parse_layer_attention("mlr:ranks=4|2|2,avg=1"), g);
  randomize(*ours, 31);
  st::MLRAttention ref(st::MLRAttentionOptions(16, 2, {4, 2, 2}).context(16).level_average(true).qk_layernorm(true));
  {
    at::NoGradGuard ng;
    for (auto& p : ref->named_parameters()) p.value().copy_(ours->named_parameters()[p.key()]);
  }
  const at::Tensor x = at::randn({2, 16, 16});
  EXPECT_LE(rel_err(ours(x), ref(x)), 1e-6);
  EXPECT_EQ(ours->mlr_args().context, 16);
}

TEST(Models, SdpaLayerMatchesMha) {
  for (const char* scale : {"8/d", "1/sqrt(d)"})
    for (bool causal : {true, false}) {
      sm::AttentionGeometry g{16, 2, 16, causal, false, true};
      sm::SelfAttention mha(sm::parse_layer_attention(std::string("mha:scale=") + scale), g);
      sm::SelfAttention sdpa(sm::parse_layer_attention(std::string("sdpa:scale=") + scale), g);
      randomize(*mha, 32);
      randomize(*sdpa, 32);
      const at::Tensor x = at::randn({2, 12, 16});
      EXPECT_LE(rel_err(sdpa(x), mha(x)), 1e-5) << scale << " causal " << causal;  // fp32 round-off
    }
}

// The torch-ops path (strata/torch/torch_ops.h: what a CUDA device runs) gives every kind's layer
// the forward and parameter gradients of the kernels' path, fp32 on both: 2e-4 normwise (gradients
// against the largest, param_grad_errs: k's LayerNorm bias has a zero gradient by symmetry), for the
// kernels' and ATen's fp32 round-off (~1e-5 through the projections, QK-LayerNorm, softmax and the
// structured transforms); a path computing something else is O(1e-2) off or more.
TEST(Models, EveryKindIsTheSameOnTheTorchOpsPath) {
  for (const bool causal : {true, false})
    for (const std::string& spec : causal ? kCausalSpecs : kEncoderSpecs) {
      SCOPED_TRACE(spec + (causal ? " causal" : " encoder"));
      sm::AttentionGeometry g{16, 2, 16, causal, true, true};
      sm::SelfAttention layer(sm::parse_layer_attention(spec), g);
      randomize(*layer, 41);
      at::manual_seed(42);
      const at::Tensor x = at::randn({2, 16, 16}), w = at::randn({2, 16, 16});
      const auto fwd = [&](const at::Tensor& t) { return layer(t); };
      const auto [want, got] =
          strata::test::on_both_paths([&] { return strata::test::out_and_param_grads(*layer, fwd, x, w); });
      EXPECT_LE(rel_err(got[0], want[0]), 2e-4) << "out";
      const auto names = layer->named_parameters().keys();
      const std::vector<double> errs = strata::test::param_grad_errs(got, want);
      for (size_t i = 0; i < errs.size(); ++i) EXPECT_LE(errs[i], 2e-4) << "grad of " << names[i];
    }
}

TEST(Models, CloneIsIndependentAndEqual) {
  sm::Decoder lm(lm_config("mha|mlr:ranks=4|2|2|btt|bmlr:ranks=4|4", 4));
  randomize(*lm, 33);
  auto copy = std::dynamic_pointer_cast<sm::DecoderImpl>(lm->clone());
  const at::Tensor ids = lm_ids(1, 16, 34);
  EXPECT_LE(rel_err(copy->forward(ids), lm(ids)), 0.0);
  {
    at::NoGradGuard ng;
    copy->block(1).attn->v_proj->weight.mul_(2.0);
  }
  EXPECT_GT(rel_err(copy->forward(ids), lm(ids)), 1e-3);
  EXPECT_FALSE(at::equal(copy->block(1).attn->v_proj->weight, lm->block(1).attn->v_proj->weight));
}

// ---- muP ---------------------------------------------------------------------------------------

TEST(Models, MupRolesAndInit) {
  at::manual_seed(41);
  sm::DecoderConfig c = lm_config("mha|mlr:ranks=4|4|btt|bmlr:ranks=4|4", 4);
  c.vocab_size = 96;
  c.width = 64;
  c.heads = 8;
  c.context = 64;
  c.bias = true;
  sm::Decoder lm(c);
  std::map<std::string, st::MupParam> by_name;
  for (const st::MupParam& p : st::mup_params(*lm)) by_name.emplace(p.name, p);
  EXPECT_EQ(by_name.size(), lm->parameters().size());
  for (int l = 0; l < 4; ++l) {
    const std::string b = "blocks." + std::to_string(l) + ".";
    const std::string out = l == 2 ? b + "attn.btt.out_proj.weight" : l == 3 ? b + "attn.bmlr.out_proj.weight"
                                                                           : b + "attn.out_proj.weight";
    ASSERT_TRUE(by_name.count(out)) << out;
    // Output projections: muP's hidden rule N(0, 1/fan_in) (4096 / 16384 draws: 5% is 4.5 sigma).
    EXPECT_EQ(by_name.at(out).role.kind, st::MupKind::Output) << out;
    EXPECT_NEAR(by_name.at(out).param.std().item<double>(), 1.0 / 8, 0.125 * 0.05) << out;
    EXPECT_EQ(by_name.at(b + "mlp.proj.weight").role.kind, st::MupKind::Output);
    EXPECT_EQ(by_name.at(b + "mlp.proj.weight").role.fan_in, 256);
    EXPECT_NEAR(by_name.at(b + "mlp.proj.weight").param.std().item<double>(), 1.0 / 16, 0.05 / 16);
    EXPECT_EQ(by_name.at(b + "ln1.weight").role.kind, st::MupKind::Gain);
    EXPECT_EQ(by_name.at(b + "ln1.bias").role.kind, st::MupKind::Bias);
  }
  EXPECT_EQ(by_name.at("blocks.0.attn.q_norm_weight").role.kind, st::MupKind::Gain);
  EXPECT_EQ(by_name.at("blocks.2.attn.btt.w_k").role.kind, st::MupKind::StructuredCore);
  // The readout: muP's N(0, 1/fan_in^2) (6144 draws, 5%).
  EXPECT_EQ(by_name.at("head.weight").role.kind, st::MupKind::Readout);
  EXPECT_NEAR(lm->head->weight.std().item<double>(), 1.0 / 64, 0.05 / 64);
  EXPECT_FALSE(lm->head->bias.defined());  // the LM head never has a bias (ref's lm_head)
  // Draws: embeddings N(0, 0.02^2) (96 x 64 = 6144 draws: the sample std's relative standard
  // error is 1/sqrt(2n) = 0.9%, so 5% is over 5 sigma), the position table 0, q_proj N(0, 1/64)
  // (4096 draws, 5%: 4.5 sigma).
  EXPECT_NEAR(lm->tok_emb->weight.std().item<double>(), 0.02, 0.02 * 0.05);
  EXPECT_EQ(by_name.at("pos_emb.weight").role.kind, st::MupKind::Position);
  EXPECT_EQ(lm->pos_emb->weight.abs().max().item<double>(), 0.0);
  EXPECT_NEAR(lm->block(0).attn->q_proj->weight.std().item<double>(), 1.0 / 8, 0.125 * 0.05);
  EXPECT_EQ(by_name.at("tok_emb.weight").role.kind, st::MupKind::Embedding);
  // Learning rates from the reference's table (src/muP.py: lr * base / fan_in for q/k/v, MLP-in,
  // both out-projections and the LM head; lr for embeddings, LayerNorms and biases), written out
  // for width 64 (MLP hidden 256) at strata's default base width 128 and eta = 1e-3: the numbers
  // are the table's, not the code's roles read back (a wrong role fails here).
  EXPECT_EQ(st::MupOptions().base_width, 128.0);
  std::map<std::string, double> lr_of;
  for (const auto& g : st::mup_param_groups(*lm, 1e-3))
    for (const auto& n : g.names) lr_of[n] = g.lr;
  const std::map<std::string, double> reference_lr = {
      {"tok_emb.weight", 1e-3},                     {"pos_emb.weight", 1e-3},
      {"blocks.0.ln1.weight", 1e-3},                {"blocks.0.ln1.bias", 1e-3},
      {"blocks.0.attn.q_proj.weight", 2e-3},        {"blocks.0.attn.k_proj.weight", 2e-3},
      {"blocks.0.attn.v_proj.weight", 2e-3},        {"blocks.0.attn.out_proj.weight", 2e-3},
      {"blocks.0.attn.q_norm_weight", 1e-3},        {"blocks.0.mlp.fc.weight", 2e-3},
      {"blocks.0.mlp.proj.weight", 1e-3 * 128 / 256}, {"blocks.0.mlp.fc.bias", 1e-3},
      {"ln_f.weight", 1e-3},                        {"head.weight", 2e-3},
  };
  for (const auto& [name, lr] : reference_lr) {
    ASSERT_TRUE(lr_of.count(name)) << name;
    EXPECT_DOUBLE_EQ(lr_of.at(name), lr) << name;
  }
  // The reference's zero init (train.zero_init): every output projection and the readout 0.
  st::mup_init_(*lm, std::nullopt, st::MupInit{/*zero_outputs=*/true});
  for (const auto& [name, p] : by_name) {
    if (p.role.kind == st::MupKind::Output || p.role.kind == st::MupKind::Readout) {
      EXPECT_EQ(p.param.abs().max().item<double>(), 0.0) << name;
    }
  }
  EXPECT_EQ(lm->block(0).attn->q_proj->weight.eq(0).sum().item<int64_t>(), 0);  // the rest drawn
  sm::Forecaster f(fc_config("patch", "mha|monarch"));
  EXPECT_EQ(st::mup_params(*f).size(), f->parameters().size());
  EXPECT_EQ(f->pos_emb->weight.abs().max().item<double>(), 0.0);
  st::mup_init_(*f, std::nullopt, st::MupInit{true});
  EXPECT_EQ(f->head->weight.abs().max().item<double>(), 0.0);
}

TEST(Models, RevinDenormalisesAZeroHead) {  // a fresh model predicts each channel's mean
  for (const char* kind : {"point", "patch"}) {
    sm::Forecaster f(fc_config(kind, "mha"));
    {
      at::NoGradGuard ng;
      f->head->weight.zero_();
    }
    f->eval();
    const at::Tensor x = at::randn({2, 16, 2}) * 3 + 5;
    const at::Tensor y = f(x);
    EXPECT_LE(rel_err(y, x.mean({1}, true).expand({2, 4, 2})), 1e-6) << kind;
  }
}

TEST(Models, DropoutOnlyInTraining) {
  sm::DecoderConfig c = lm_config("mha|mlr:ranks=4|4");
  c.dropout = 0.5;
  sm::Decoder lm(c);
  randomize(*lm, 42);
  const at::Tensor ids = lm_ids(2, 16, 43);
  lm->train();
  EXPECT_GT(rel_err(lm(ids), lm(ids)), 1e-3);  // two draws of the masks
  lm->eval();
  EXPECT_LE(rel_err(lm(ids), lm(ids)), 0.0);
}

TEST(Models, RegressionReadInAndReadOutRoles) {
  sm::DecoderConfig c = lm_config("mha");
  c.vocab_size = 0;
  c.input_dim = 5;
  c.bias = true;
  sm::Decoder reg(c);
  std::map<std::string, st::MupParam> by_name;
  for (const st::MupParam& p : st::mup_params(*reg)) by_name.emplace(p.name, p);
  // The reference's read-in (src/muP.py "_read_in.weight": fan_in 1, std 0.02): lr eta whatever
  // the data's width, init N(0, 0.02^2) under muP. (It was a hidden matrix: N(0, 1/d) at
  // eta * 768 / d, and ICR did not learn: issue 45.)
  EXPECT_EQ(by_name.at("read_in.weight").role.kind, st::MupKind::Input);
  EXPECT_EQ(by_name.at("read_in.weight").role.fan_in, 5);
  EXPECT_DOUBLE_EQ(by_name.at("read_in.weight").role.resolved_std(), 0.02);
  std::map<std::string, double> lr_of;
  for (const auto& g : st::mup_param_groups(*reg, 1e-3))
    for (const auto& n : g.names) lr_of[n] = g.lr;
  EXPECT_DOUBLE_EQ(lr_of.at("read_in.weight"), 1e-3);
  EXPECT_DOUBLE_EQ(lr_of.at("head.weight"), 1e-3 * 128 / 16);  // the read-out: a readout of fan_in = width
  EXPECT_EQ(by_name.at("head.weight").role.kind, st::MupKind::Readout);
  EXPECT_EQ(reg->head->weight.sizes(), (std::vector<int64_t>{1, 16}));
  EXPECT_FALSE(reg->tok_emb);
  // Every parameter but the position embedding (context 16 x width 16) is non-embedding here.
  int64_t all = 0;
  for (const at::Tensor& p : reg->parameters()) all += p.numel();
  EXPECT_EQ(reg->non_embedding_params(), all - 16 * 16);
}

// ---- FLOPs and parameter counts ----------------------------------------------------------------

TEST(Models, ForwardFlopsOfMhaMatchAHandCount) {
  sm::DecoderConfig c = lm_config("mha", 3);
  c.width = 32, c.heads = 4, c.context = 64, c.vocab_size = 96;
  c.qk_layernorm = false;  // (its weights would add 2 d per layer to the parameter count)
  sm::Decoder lm(c);
  const double D = 32, T = 64, V = 96, L = 3;
  // per layer: q, k, v, out (4 x 2 T D^2), MLP (2 x 2 T D 4D), attention: QK^T and PV over the
  // causal half, 2 (H T^2 d) x 2 / 2 = 2 T^2 D; then the head 2 T D V.
  const double want = L * (8 * T * D * D + 16 * T * D * D + 2 * T * T * D) + 2 * T * D * V;
  EXPECT_DOUBLE_EQ(lm->forward_flops(64), want);
  // Parameters (no biases): per layer 12 D^2 + 2 D (LN weights), ln_f D, head D V.
  EXPECT_EQ(lm->non_embedding_params(), int64_t(L * (12 * D * D + 2 * D) + D + D * V));
}

TEST(Models, ForwardFlopsOfMlrMatchAPairCount) {
  const std::vector<int64_t> ranks = {4, 2, 1, 1};
  const int64_t T = 32, context = 32, H = 2, d = 8, D = 16;
  // Score FLOPs: 2 x the ranks of the levels each causal pair shares (level l blocks of
  // context / 2^l); values 2 d per pair; per head.
  double want = 0;
  for (int64_t i = 0; i < T; ++i)
    for (int64_t j = 0; j <= i; ++j) {
      for (size_t l = 0; l < ranks.size(); ++l) {
        const int64_t b = context >> l;
        if (i / b == j / b) want += 2.0 * double(ranks[l]);
      }
      want += 2.0 * double(d);
    }
  want *= double(H);
  const sm::LayerAttentionSpec s = sm::parse_layer_attention("mlr:ranks=4|2|1|1,avg=1");
  EXPECT_DOUBLE_EQ(sm::attention_forward_flops(s, T, D, H, true, context), want);
  sm::DecoderConfig c = lm_config("mlr:ranks=4|2|1|1,avg=1", 2);
  c.context = context;
  sm::Decoder lm(c);
  EXPECT_DOUBLE_EQ(lm->forward_flops(T), 2 * (8.0 * T * D * D + 16.0 * T * D * D + want) + 2.0 * T * D * 11);
  // Fewer score FLOPs than mha's exact count.
  EXPECT_LT(want, double(H) * double(T * (T + 1) / 2) * 2.0 * (d + d));
}

TEST(Models, WindowedFlopsCountAllowedPairs) {
  const int64_t T = 10, D = 16, H = 2, d = 8;
  // swa w=3 causal: query t sees min(t, 3) + 1 keys: 1+2+3+4*7 = 34 pairs.
  EXPECT_DOUBLE_EQ(sm::attention_forward_flops(sm::parse_layer_attention("swa:w=3"), T, D, H, true), 2.0 * H * 2 * d * 34);
  // two-sided in an encoder: keys max(0, t-3)..min(9, t+3).
  double pairs = 0;
  for (int64_t t = 0; t < T; ++t) pairs += double(std::min<int64_t>(T - 1, t + 3) - std::max<int64_t>(0, t - 3) + 1);
  EXPECT_DOUBLE_EQ(sm::attention_forward_flops(sm::parse_layer_attention("swa:w=3"), T, D, H, false), 2.0 * H * 2 * d * pairs);
  // longformer global=2, w=1, causal: queries 0, 1 are global (1, 2 keys); query t >= 2 sees
  // t-1, t and the 2 global keys left of its window (t = 2: key 0 only, key 1 is in the window).
  double lp = 1 + 2 + 3;
  for (int64_t t = 3; t < T; ++t) lp += 4;
  EXPECT_DOUBLE_EQ(sm::attention_forward_flops(sm::parse_layer_attention("longformer:global=2,w=1"), T, D, H, true),
                   2.0 * H * 2 * d * lp);
}

}  // namespace
