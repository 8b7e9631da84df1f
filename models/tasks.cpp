// models/tasks.cpp: the charlm, icr and ett tasks (tasks.h).
#include "models/tasks.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/cuda.h>
#include <torch/nn/functional/loss.h>

#include <cmath>
#include <optional>

#include "data/char_corpus.h"
#include "data/ett.h"
#include "data/icr.h"
#include "models/decoder.h"
#include "models/forecaster.h"
#include "strata/error.h"
#include "strata/torch/mup.h"

namespace strata::models {
namespace {

// Evaluation prompts / windows come from this seed offset, never from training's (seed, step).
constexpr uint64_t kEvalSeedOffset = 0x9E3779B97F4A7C15ull;

// Builds a model, prefixing its errors with the config keys that made it (the model's own message
// names the attention spec and its key, e.g. key 'ranks').
template <typename Build>
auto build_model(const TrainConfig& c, Build&& build) {
  try {
    return build();
  } catch (const Error& e) {
    throw Error("config: key 'model.attention' = \"" + c.model.attention + "\" (width " + std::to_string(c.model.width) +
                ", heads " + std::to_string(c.model.heads) + "): " + e.what());
  }
}

// The decoder fields every decoder task takes from [model] (the task sets vocab, read-in and context).
DecoderConfig decoder_config(const TrainConfig& c) {
  DecoderConfig d;
  d.width = c.model.width;
  d.layers = c.model.layers;
  d.heads = c.model.heads;
  d.bias = c.model.bias;
  d.qk_layernorm = c.model.qk_layernorm;
  d.fused = c.model.fused;
  d.dropout = c.model.dropout;
  d.attention = c.model.attention;
  return d;
}

// Initialises m on the CPU by the rules of train.param (muP or PyTorch's own) from `seed`, then
// moves it to `device`.
void init_parameters(::torch::nn::Module& m, const TrainConfig& c, const at::Device& device) {
  at::Generator gen = at::detail::createCPUGenerator(uint64_t(c.seed));
  strata::torch::init_(m, c.train.param == "sp" ? strata::torch::Parameterization::sp : strata::torch::Parameterization::mup,
                       gen, strata::torch::MupInit{c.train.zero_init});
  m.to(device);
}

// Number of batches of `batch` an evaluation runs over `total` items (max_batches 0 = all).
int64_t eval_count(int64_t total, int64_t batch, int64_t max_batches) {
  return max_batches == 0 ? total : std::min(total, batch * max_batches);
}

class CharLmTask final : public Task {
 public:
  explicit CharLmTask(const TrainConfig& c) : c_(c), corpus_(data::load_char_corpus(c.data.corpus, c.data.val_fraction)) {
    DecoderConfig d = decoder_config(c);
    d.vocab_size = data::CharCorpus::kVocab;
    d.context = c.data.context;
    model_ = build_model(c, [&] { return Decoder(d); });
    init_parameters(*model_, c, device_);
    STRATA_CHECK(int64_t(corpus_.val.size()) > c.data.context, "config: key 'data.context': ", c.data.context,
                 " is longer than the validation split of '", c.data.corpus, "' (", corpus_.val.size(), " characters)");
  }
  ::torch::nn::Module& model() override { return *model_; }

  at::Tensor loss(int64_t step, int64_t micro, int64_t batch) override {
    const int64_t T = c_.data.context;
    at::Tensor ids = at::empty({batch, T + 1}, at::kLong);
    data::sample_char_windows(corpus_.train, batch, T, uint64_t(c_.seed), step, micro, ids.data_ptr<int64_t>());
    return lm_loss(ids);
  }

  nlohmann::json evaluate(const std::string& split, int64_t batch, int64_t max_batches) override {
    STRATA_CHECK(split == "val", "evaluate: argument 'split': expected \"val\" for charlm (its corpus has train and val "
                 "splits only), got \"", split, "\"");
    const int64_t T = c_.data.context;
    const int64_t n = eval_count(data::num_eval_windows(corpus_.val, T), batch, max_batches);
    double sum = 0;
    for (int64_t begin = 0; begin < n; begin += batch) {
      const int64_t b = std::min(batch, n - begin);
      at::Tensor ids = at::empty({b, T + 1}, at::kLong);
      for (int64_t i = 0; i < b; ++i) data::eval_char_window(corpus_.val, T, begin + i, ids.data_ptr<int64_t>() + i * (T + 1));
      sum += lm_loss(ids).item<double>() * double(b);
    }
    const double nats = sum / double(n);
    return {{"val_loss", nats}, {"val_bpc", nats / std::log(2.0)}, {"windows", n}};
  }

  int64_t tokens_per_sequence(int64_t) const override { return c_.data.context; }
  double forward_flops_per_sequence(int64_t) const override { return model_->forward_flops(c_.data.context); }

 private:
  // ids: batch x (T+1); the mean next-character cross entropy (nats).
  at::Tensor lm_loss(const at::Tensor& ids) {
    const int64_t T = ids.size(1) - 1;
    const at::Tensor on = ids.to(device_);
    const at::Tensor logits = model_->forward(on.slice(1, 0, T));
    return at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}), on.slice(1, 1, T + 1).reshape({-1}));
  }

  TrainConfig c_;
  at::Device device_{training_device(c_)};
  data::CharCorpus corpus_;
  Decoder model_{nullptr};
};

class IcrTask final : public Task {
 public:
  explicit IcrTask(const TrainConfig& c) : c_(c) {
    opt_.dim = c.data.dim;
    opt_.start_dims = c.data.start_dims;
    opt_.start_points = c.data.start_points;
    opt_.interval = c.data.interval;
    opt_.updates = c.data.updates;
    DecoderConfig d = decoder_config(c);
    d.vocab_size = 0;
    d.input_dim = c.data.dim;
    d.output_dim = 1;
    d.context = data::icr_max_tokens(opt_);
    model_ = build_model(c, [&] { return Decoder(d); });
    init_parameters(*model_, c, device_);
  }
  ::torch::nn::Module& model() override { return *model_; }

  at::Tensor loss(int64_t step, int64_t micro, int64_t batch) override {
    const auto stage = data::icr_stage(opt_, step);
    auto [pred, target] = predict(stage, batch, uint64_t(c_.seed), step, micro);
    return at::mse_loss(pred, target);
  }

  nlohmann::json evaluate(const std::string& split, int64_t batch, int64_t) override {
    STRATA_CHECK(split == "val" || split == "test", "evaluate: argument 'split': expected \"val\" or \"test\", got \"",
                 split, "\"");
    // Fresh prompts at full size from the evaluation seed (val and test use different ones).
    const uint64_t seed = uint64_t(c_.seed) + kEvalSeedOffset + (split == "test" ? 1 : 0);
    const auto full = data::icr_stage(opt_, data::icr_full_size_step(opt_));
    const int64_t n = c_.data.eval_prompts;
    double last = 0, all = 0, zero = 0;
    for (int64_t begin = 0, k = 0; begin < n; begin += batch, ++k) {
      const int64_t b = std::min(batch, n - begin);
      auto [pred, target] = predict(full, b, seed, 0, k);
      const at::Tensor se = (pred - target).square();
      last += se.select(1, full.points - 1).sum().item<double>();
      all += se.mean(1).sum().item<double>();
      zero += target.select(1, full.points - 1).square().sum().item<double>();
    }
    // last_point_zero_se: predicting 0 on the same prompts, the level of "nothing learned" (about
    // 1, but with 640 prompts a sample's level can be 0.9 or 1.1: compare against it, not 1).
    return {{"last_point_se", last / double(n)}, {"mean_se", all / double(n)}, {"last_point_zero_se", zero / double(n)},
            {"prompts", n}};
  }

  int64_t tokens_per_sequence(int64_t step) const override { return 2 * data::icr_stage(opt_, step).points; }
  double forward_flops_per_sequence(int64_t step) const override { return model_->forward_flops(tokens_per_sequence(step)); }

 private:
  // (predictions, targets): batch x points each; y_i predicted at the x_i token (even positions).
  std::pair<at::Tensor, at::Tensor> predict(const data::IcrStage& stage, int64_t batch, uint64_t seed, int64_t step,
                                            int64_t micro) {
    const int64_t P = stage.points, d = opt_.dim;
    at::Tensor tokens = at::empty({batch, 2 * P, d}, at::kFloat);
    at::Tensor target = at::empty({batch, P}, at::kFloat);
    data::icr_batch(opt_, stage, batch, seed, step, micro, tokens.data_ptr<float>(), target.data_ptr<float>());
    const at::Tensor out = model_->forward(tokens.to(device_));  // batch x 2P x 1
    return {out.select(2, 0).slice(1, 0, 2 * P, 2), target.to(device_)};
  }

  TrainConfig c_;
  at::Device device_{training_device(c_)};
  data::IcrOptions opt_;
  Decoder model_{nullptr};
};

class EttTask final : public Task {
 public:
  explicit EttTask(const TrainConfig& c) : c_(c), data_(data::load_ett(c.data.dataset)) {
    ForecasterConfig f;
    f.kind = c.model.kind;
    f.input_len = c.data.input_len;
    f.horizon = c.data.horizon;
    f.channels = data_.channels;
    f.width = c.model.width;
    f.layers = c.model.layers;
    f.heads = c.model.heads;
    f.ffn = c.model.ffn > 0 ? c.model.ffn : 4 * c.model.width;
    f.patch_len = c.model.patch_len;
    f.stride = c.model.stride;
    f.revin = c.model.revin;
    f.fused = c.model.fused;
    f.dropout = c.model.dropout;
    f.attention = c.model.attention;
    model_ = build_model(c, [&] { return Forecaster(f); });
    init_parameters(*model_, c, device_);
  }
  ::torch::nn::Module& model() override { return *model_; }

  at::Tensor loss(int64_t step, int64_t micro, int64_t batch) override {
    const int64_t L = c_.data.input_len, H = c_.data.horizon, C = data_.channels;
    at::Tensor x = at::empty({batch, L, C}, at::kFloat), y = at::empty({batch, H, C}, at::kFloat);
    data::ett_sample(data_, L, H, batch, uint64_t(c_.seed), step, micro, x.data_ptr<float>(), y.data_ptr<float>());
    return at::mse_loss(model_->forward(x.to(device_)), y.to(device_));
  }

  nlohmann::json evaluate(const std::string& split, int64_t batch, int64_t max_batches) override {
    STRATA_CHECK(split == "val" || split == "test", "evaluate: argument 'split': expected \"val\" or \"test\", got \"",
                 split, "\"");
    const auto s = split == "val" ? data::EttSplit::val : data::EttSplit::test;
    const int64_t L = c_.data.input_len, H = c_.data.horizon, C = data_.channels;
    const int64_t n = eval_count(data::ett_num_windows(data_, s, L, H), batch, max_batches);
    double se = 0, ae = 0;
    for (int64_t begin = 0; begin < n; begin += batch) {
      const int64_t b = std::min(batch, n - begin);
      at::Tensor x = at::empty({b, L, C}, at::kFloat), y = at::empty({b, H, C}, at::kFloat);
      for (int64_t i = 0; i < b; ++i)
        data::ett_window(data_, s, L, H, begin + i, x.data_ptr<float>() + i * L * C, y.data_ptr<float>() + i * H * C);
      const at::Tensor err = model_->forward(x.to(device_)).to(at::kDouble) - y.to(device_, at::kDouble);
      se += err.square().sum().item<double>();
      ae += err.abs().sum().item<double>();
    }
    const double count = double(n) * double(H) * double(C);
    return {{"mse", se / count}, {"mae", ae / count}, {"windows", n}};
  }

  int64_t tokens_per_sequence(int64_t) const override { return c_.data.input_len; }
  double forward_flops_per_sequence(int64_t) const override { return model_->forward_flops(); }

 private:
  TrainConfig c_;
  at::Device device_{training_device(c_)};
  data::EttData data_;
  Forecaster model_{nullptr};
};

}  // namespace

at::Device training_device(const TrainConfig& c) {
  const std::string& name = c.train.device;
  std::optional<at::Device> dev;
  try {
    dev.emplace(name);
  } catch (const std::exception&) {
  }
  STRATA_CHECK(dev && (dev->is_cpu() || dev->is_cuda()), "config: key 'train.device': expected \"cpu\" | \"cuda\" | "
               "\"cuda:N\", got \"", name, "\"");
  if (dev->is_cuda()) {
    const int64_t n = int64_t(::torch::cuda::device_count());
    STRATA_CHECK(n > 0, "config: key 'train.device': \"", name, "\" asked for, but LibTorch sees no CUDA device on this "
                 "machine (", ::torch::cuda::is_available() ? "available" : "CUDA not available",
                 "); use train.device=cpu");
    STRATA_CHECK(!dev->has_index() || dev->index() < n, "config: key 'train.device': \"", name, "\" asked for, but this "
                 "machine has ", n, " CUDA device(s) (cuda:0..cuda:", n - 1, ")");
  }
  return *dev;
}

std::unique_ptr<Task> make_task(const TrainConfig& c) {
  if (c.task == "charlm") return std::make_unique<CharLmTask>(c);
  if (c.task == "icr") return std::make_unique<IcrTask>(c);
  if (c.task == "ett") return std::make_unique<EttTask>(c);
  throw Error("config: key 'task': expected one of \"charlm\" | \"icr\" | \"ett\", got \"" + c.task + "\"");
}

}  // namespace strata::models
