// models/train_config.h: the configuration of a training run (`strata train CONFIG`), read from a
// TOML file in configs/ (one per experiment) with a size (smoke | cpu | paper) and --set overrides.
//
// File layout:
//   name = "charlm_mha"            task = "charlm" | "icr" | "ett"        seed = 0
//   [model] ...   [data] ...   [train] ...      (the keys and defaults: the structs below)
//   [sizes.smoke.train]  steps = 4  ...        per-size overrides: [sizes.<size>] is merged over
//   [sizes.cpu.model]    width = 128 ...       the root (tables deeply, values replaced)
// then each --set "section.key=value" (value in TOML syntax; a bare word is taken as a string,
// so --set model.attention=mlr:ranks=8-8 needs no quotes). Every key must be known and of its type:
// an unknown key, a wrong type or an out-of-range value is a strata::Error naming the key, e.g.
//   config 'configs/charlm.toml': key 'train.stepz': unknown key (keys of [train]: accum, batch, ...)
//   config 'configs/charlm.toml': key 'train.steps': expected an integer >= 1, got "ten" (string)
// Keys that the task does not use (e.g. model.patch_len for charlm) are accepted and ignored.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace strata::models {

struct ModelConfig {
  int64_t width = 128, layers = 4, heads = 4;
  std::string attention = "mha";     // per-layer pattern (models/layer_attention.h)
  bool bias = false, qk_layernorm = false;
  bool fused = true;                 // the blocks' LayerNorms, projections and MLP as strata's fused kernels (false: ATen ops)
  double dropout = 0;
  // Forecaster (task ett) only:
  std::string kind = "patch";        // "patch" (PatchTST-style) | "point" (the paper's point-per-token)
  int64_t ffn = 0;                   // 0 = 4 * width
  int64_t patch_len = 16, stride = 8;
  bool revin = true;
};

struct DataConfig {
  // charlm
  std::string corpus = "tinyshakespeare";  // "tinyshakespeare" | "kjv" | a path
  int64_t context = 256;                   // T (charlm); the model's context
  double val_fraction = 0.1;
  // icr
  int64_t dim = 16, start_dims = 4, start_points = 8, interval = 2000, updates = 15;
  int64_t eval_prompts = 640;              // fresh prompts per evaluation (ref: 50 x 64)
  // ett
  std::string dataset = "ETTh1";
  int64_t input_len = 336, horizon = 96;
};

struct TrainLoopConfig {
  int64_t steps = 1000, batch = 32, accum = 1;  // batch: sequences per optimizer step (split in accum micro-batches)
  double lr = 1e-3;                             // the base learning rate eta
  int64_t warmup = 100;                         // linear warm-up steps
  std::string schedule = "constant";            // "constant" | "cosine" (to min_lr_ratio * lr at the last step)
  double min_lr_ratio = 0.1;
  double clip = 0;                              // max global gradient norm; 0 = no clipping
  // "mup": muP init and per-parameter lrs (lr * base_width / fan_in for the width-fed matrices;
  // strata/torch/mup.h); "sp": the standard parameterisation, PyTorch's own init and lr for every
  // parameter. (The old key train.mup = true | false is read as "mup" | "sp".)
  std::string param = "mup";
  // mup: the reference's zero output projections and readout (true) or muP's random ones (false:
  // zero ones stalled 64-wide models, strata/torch/mup.h).
  bool zero_init = false;
  double base_width = 128, weight_decay = 0, beta1 = 0.9, beta2 = 0.95, eps = 1e-20;
  int64_t eval_every = 100, eval_batches = 8;   // eval_batches: batches of `batch` per evaluation (0 = the whole split)
  int64_t log_every = 10, checkpoint_every = 100, keep_checkpoints = 2;
  int64_t threads = 0;                          // 0 = the machine's cores
  // Where the model trains: "cpu" | "cuda" | "cuda:N". On CUDA the layers whose strata kernel is
  // CPU-only run through strata::torch's torch-op path (LibTorch's own ops); batches are drawn on
  // the CPU (the same draws as a CPU run) and copied over. A resume may change the device.
  std::string device = "cpu";
};

struct TrainConfig {
  std::string name = "run", task = "charlm", size;
  int64_t seed = 0;
  ModelConfig model;
  DataConfig data;
  TrainLoopConfig train;
};

// Reads `path` (TOML), merges [sizes.<size>] (size "" = none; an unknown size is an error listing
// the file's sizes), applies `sets` ("key=value"), checks every key. Throws strata::Error.
TrainConfig load_train_config(const std::string& path, const std::string& size = "",
                              const std::vector<std::string>& sets = {});
// The same from TOML text; `origin` names it in errors.
TrainConfig parse_train_config(const std::string& text, const std::string& origin, const std::string& size = "",
                               const std::vector<std::string>& sets = {});

// The resolved config as TOML (every key, sizes already merged, no [sizes]):
// parse_train_config(to_toml(c), ...) == c. What a run writes beside its logs and checkpoints carry.
std::string to_toml(const TrainConfig& c);

bool operator==(const TrainConfig& a, const TrainConfig& b);

}  // namespace strata::models
