// models/trainer.cpp: the training loop, its logs and its checkpoints (trainer.h).
#include "models/trainer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <torch/autograd.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

#include "data/files.h"
#include "models/checkpoint.h"
#include "models/tasks.h"
#include "strata/error.h"
#include "strata/threading.h"
#include "strata/torch/mup.h"

namespace strata::models {
namespace {

using Clock = std::chrono::steady_clock;

const char* kTrainHeader = "step,lr,loss,grad_norm,tokens,flops,elapsed_s";

void configure_threads(int64_t threads) {
  if (threads > 0) strata::set_num_threads(int(threads));
  at::set_num_threads(strata::get_num_threads());  // torch and strata on the same count
}

// The optimizer: one AdamW group per muP group (lr base_lr * base_width / fan_in for matrices), or
// every group at base_lr with train.param = "sp". Returns it with each group's base lr.
std::pair<std::unique_ptr<::torch::optim::AdamW>, std::vector<double>> make_optimizer(::torch::nn::Module& model,
                                                                                      const TrainLoopConfig& t) {
  strata::torch::MupOptions mo;
  mo.base_width = t.base_width;
  mo.weight_decay = t.weight_decay;
  mo.beta1 = t.beta1;
  mo.beta2 = t.beta2;
  mo.eps = t.eps;
  std::vector<::torch::optim::OptimizerParamGroup> groups;
  std::vector<double> base_lrs;
  for (const auto& g : strata::torch::mup_param_groups(model, t.lr, mo)) {
    const double lr = t.param == "mup" ? g.lr : t.lr;
    auto o = std::make_unique<::torch::optim::AdamWOptions>(lr);
    o->betas({t.beta1, t.beta2}).eps(t.eps).weight_decay(g.weight_decay);
    groups.emplace_back(g.params, std::move(o));
    base_lrs.push_back(lr);
  }
  ::torch::optim::AdamWOptions defaults(t.lr);
  defaults.betas({t.beta1, t.beta2}).eps(t.eps).weight_decay(t.weight_decay);
  return {std::make_unique<::torch::optim::AdamW>(std::move(groups), defaults), std::move(base_lrs)};
}

std::map<void*, std::string> param_names(::torch::nn::Module& model) {
  std::map<void*, std::string> names;
  for (const auto& p : model.named_parameters()) names.emplace(p.value().unsafeGetTensorImpl(), p.key());
  return names;
}

// Everything a resumed run needs, as named tensors.
std::vector<std::pair<std::string, at::Tensor>> state_tensors(::torch::nn::Module& model, ::torch::optim::AdamW& opt) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& p : model.named_parameters()) out.emplace_back("param/" + p.key(), p.value());
  for (const auto& b : model.named_buffers()) out.emplace_back("buffer/" + b.key(), b.value());
  const auto names = param_names(model);
  for (const auto& group : opt.param_groups()) {
    for (const auto& p : group.params()) {
      const auto it = opt.state().find(p.unsafeGetTensorImpl());
      if (it == opt.state().end()) continue;  // no step taken yet
      const auto& s = static_cast<const ::torch::optim::AdamWParamState&>(*it->second);
      const std::string n = "adam/" + names.at(p.unsafeGetTensorImpl());
      out.emplace_back(n + "/exp_avg", s.exp_avg());
      out.emplace_back(n + "/exp_avg_sq", s.exp_avg_sq());
      out.emplace_back(n + "/step", at::scalar_tensor(s.step(), at::kLong));
    }
  }
  auto gen = at::detail::getDefaultCPUGenerator();
  {
    std::lock_guard<std::mutex> lock(gen.mutex());
    out.emplace_back("rng/torch", gen.get_state());
  }
  return out;
}

const at::Tensor& need(const Checkpoint& ck, const std::string& name, at::IntArrayRef shape) {
  const auto it = ck.tensors.find(name);
  STRATA_CHECK(it != ck.tensors.end(), "checkpoint '", ck.path, "': tensor '", name,
               "' is missing (the config builds a different model than the one saved?)");
  STRATA_CHECK(it->second.sizes() == shape, "checkpoint '", ck.path, "': tensor '", name, "' has shape ",
               it->second.sizes(), ", the model expects ", shape);
  return it->second;
}

void load_optimizer_state(::torch::nn::Module& model, ::torch::optim::AdamW& opt, const Checkpoint& ck) {
  const auto names = param_names(model);
  for (const auto& group : opt.param_groups()) {
    for (const auto& p : group.params()) {
      const std::string n = "adam/" + names.at(p.unsafeGetTensorImpl());
      if (!ck.tensors.count(n + "/step")) continue;  // saved before its first step
      auto s = std::make_unique<::torch::optim::AdamWParamState>();
      s->step(need(ck, n + "/step", {}).item<int64_t>());
      s->exp_avg(need(ck, n + "/exp_avg", p.sizes()).to(p.options(), false, /*copy=*/true));
      s->exp_avg_sq(need(ck, n + "/exp_avg_sq", p.sizes()).to(p.options(), false, /*copy=*/true));
      opt.state()[p.unsafeGetTensorImpl()] = std::move(s);
    }
  }
  const auto it = ck.tensors.find("rng/torch");
  STRATA_CHECK(it != ck.tensors.end(), "checkpoint '", ck.path, "': tensor 'rng/torch' is missing");
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(it->second);
}

// Keeps the header and the rows whose first field (the step) is <= step; lines that do not parse
// (a row torn by a kill) are dropped. Rewritten atomically.
void cut_csv(const std::string& path, int64_t step) {
  std::ifstream f(path);
  if (!f.good()) return;
  std::string line, out;
  bool header = true;
  while (std::getline(f, line)) {
    if (header) {
      out += line + "\n";
      header = false;
      continue;
    }
    char* end = nullptr;
    const long long s = std::strtoll(line.c_str(), &end, 10);
    if (end != line.c_str() && *end == ',' && s <= step) out += line + "\n";
  }
  data::write_file_atomic(path, out, "resume");
}

void cut_jsonl(const std::string& path, int64_t step) {
  std::ifstream f(path);
  if (!f.good()) return;
  std::string line, out;
  while (std::getline(f, line)) {
    try {
      const auto j = nlohmann::json::parse(line);
      // Only an integer step is ours: get<int64_t> of a float casts it, undefined out of range.
      const auto& s = j.at("step");
      const bool kept = s.is_number_unsigned() ? step >= 0 && s.get<uint64_t>() <= uint64_t(step)
                                               : s.is_number_integer() && s.get<int64_t>() <= step;
      if (kept) out += line + "\n";
    } catch (const std::exception&) {  // torn by a kill: dropped
    }
  }
  data::write_file_atomic(path, out, "resume");
}

std::string fmt_time(double s) {
  const long long t = (long long)(s + 0.5);
  char buf[32];
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", t / 3600, t / 60 % 60, t % 60);
  else std::snprintf(buf, sizeof buf, "%lld:%02lld", t / 60, t % 60);
  return buf;
}

std::string fmt_num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", v);  // float32 values round-trip with 9 digits
  return buf;
}

// Appends one line (flushed: a kill loses at most the line being written).
void append_line(const std::string& path, const std::string& line) {
  std::ofstream f(path, std::ios::app);
  STRATA_CHECK(f.good(), "train: cannot append to '", path, "'");
  f << line << "\n";
  f.flush();
}

// The config of a resumed run must be the checkpoint's (the step count may change).
void check_same_config(const TrainConfig& c, const Checkpoint& ck) {
  TrainConfig saved = checkpoint_config(ck);
  TrainConfig mine = c;
  saved.train.steps = mine.train.steps;
  saved.train.device = mine.train.device;  // a run may move between devices
  if (saved == mine) return;
  // Name the first differing key.
  std::istringstream a(to_toml(saved)), b(to_toml(mine));
  std::string la, lb, section;
  while (std::getline(a, la) && std::getline(b, lb)) {
    if (!la.empty() && la[0] == '#') continue;  // the comment naming the size
    if (!la.empty() && la[0] == '[') section = la;
    if (la != lb)
      throw Error("resume: the config differs from the checkpoint's (" + ck.path + ") at " + section + " '" + lb +
                  "' (checkpoint: '" + la + "'); resume with the run's own config.toml, or start a new --out folder");
  }
  throw Error("resume: the config differs from the checkpoint's (" + ck.path + ")");
}

// A non-negative count the trainer wrote into the metadata (0 when absent: older checkpoints).
double meta_number(const Checkpoint& ck, const char* key) {
  if (!ck.meta.contains(key)) return 0;
  const nlohmann::json& v = ck.meta.at(key);
  STRATA_CHECK(v.is_number() && v.get<double>() >= 0, "checkpoint '", ck.path, "': metadata '", key,
               "' is ", v.dump(), " (expected a number >= 0)");
  return v.get<double>();
}

}  // namespace

TrainConfig checkpoint_config(const Checkpoint& ck) {
  STRATA_CHECK(ck.meta.contains("config") && ck.meta["config"].is_string(), "checkpoint '", ck.path,
               "': its metadata has no config");
  return parse_train_config(ck.meta["config"].get<std::string>(), ck.path + " (config)");
}

void load_model_state(::torch::nn::Module& model, const Checkpoint& ck) {
  ::torch::NoGradGuard no_grad;
  for (auto& p : model.named_parameters()) p.value().copy_(need(ck, "param/" + p.key(), p.value().sizes()));
  for (auto& b : model.named_buffers()) b.value().copy_(need(ck, "buffer/" + b.key(), b.value().sizes()));
}

double lr_factor(const TrainLoopConfig& t, int64_t step) {
  if (step < t.warmup) return double(step + 1) / double(t.warmup);
  if (t.schedule == "constant") return 1.0;
  const int64_t span = t.steps - 1 - t.warmup;
  const double x = span <= 0 ? 1.0 : std::min(1.0, double(step - t.warmup) / double(span));
  return t.min_lr_ratio + (1 - t.min_lr_ratio) * 0.5 * (1 + std::cos(M_PI * x));
}

RunSummary train(const TrainConfig& c, const RunOptions& opt) {
  STRATA_CHECK(!opt.run_dir.empty(), "train: argument 'run_dir': expected a folder, got an empty path");
  const data::FolderLock lock(opt.run_dir, "train");  // for the whole run, before any file is read or written
  configure_threads(c.train.threads);
  at::manual_seed(uint64_t(c.seed));  // dropout's draws; restored from the checkpoint on resume
  auto task = make_task(c);
  ::torch::nn::Module& model = task->model();
  auto [optimizer, base_lrs] = make_optimizer(model, c.train);

  const std::string train_csv = opt.run_dir + "/train.csv", eval_csv = opt.run_dir + "/eval.csv",
                    jsonl = opt.run_dir + "/log.jsonl";
  int64_t start = 0;
  double flops_done = 0;
  int64_t tokens_done = 0;
  if (opt.resume) {
    const Checkpoint ck = load_checkpoint(opt.run_dir);
    check_same_config(c, ck);
    load_model_state(model, ck);
    load_optimizer_state(model, *optimizer, ck);
    start = ck.step;
    flops_done = meta_number(ck, "train_flops");
    tokens_done = int64_t(meta_number(ck, "train_tokens"));
    cut_csv(train_csv, start);
    cut_csv(eval_csv, start);
    cut_jsonl(jsonl, start);
    if (start >= c.train.steps) {  // nothing left: the run is complete
      RunSummary done;
      done.first_step = done.last_step = start;
      return done;
    }
  } else {
    STRATA_CHECK(!has_checkpoint(opt.run_dir), "train: the run folder '", opt.run_dir,
                 "' already has a checkpoint: pass --resume to continue it, or choose another output folder");
    data::write_file_atomic(opt.run_dir + "/config.toml", to_toml(c), "train");
    data::write_file_atomic(train_csv, std::string(kTrainHeader) + "\n", "train");
    data::write_file_atomic(eval_csv, "", "train");
    data::write_file_atomic(jsonl, "", "train");
  }

  RunSummary sum;
  sum.first_step = start;
  const bool tty = opt.progress && ::isatty(2);
  const auto t0 = Clock::now();
  double train_seconds = 0;
  int64_t tokens_here = 0;
  bool eval_header_written = false;
  {
    std::ifstream f(eval_csv);
    std::string first;
    eval_header_written = static_cast<bool>(std::getline(f, first)) && !first.empty();
  }
  const int64_t micro_batch = c.train.batch / c.train.accum;

  const auto save = [&](int64_t step_done) {
    nlohmann::json meta = {{"config", to_toml(c)}, {"name", c.name}, {"size", c.size}, {"commit", opt.commit},
                           {"data_position", {{"step", step_done}, {"seed", c.seed}}},
                           {"train_flops", flops_done}, {"train_tokens", tokens_done},
                           {"threads", strata::get_num_threads()}};
    save_checkpoint(opt.run_dir, step_done, state_tensors(model, *optimizer), meta, c.train.keep_checkpoints);
  };
  const auto evaluate = [&](int64_t step_done) {
    model.eval();
    nlohmann::json m;
    {
      ::torch::NoGradGuard no_grad;
      m = task->evaluate("val", c.train.batch, c.train.eval_batches);
    }
    model.train();
    if (!eval_header_written) {
      std::string h = "step,flops";
      for (const auto& [k, v] : m.items()) {
        h += ',';
        h += k;
      }
      append_line(eval_csv, h);
      eval_header_written = true;
    }
    std::string row = std::to_string(step_done) + "," + fmt_num(flops_done);
    for (const auto& [k, v] : m.items()) {
      row += ',';  // (not "," + ...: GCC 12's -Wrestrict misfires on it)
      row += fmt_num(v.get<double>());
    }
    append_line(eval_csv, row);
    append_line(jsonl, nlohmann::json({{"kind", "eval"}, {"step", step_done}, {"flops", flops_done}, {"metrics", m}}).dump());
    sum.last_eval = m;
    return m;
  };

  // clip_grad_norm_ skips parameters whose gradient stayed undefined.
  std::vector<at::Tensor> trainable;
  for (const auto& p : model.parameters())
    if (p.requires_grad()) trainable.push_back(p);
  model.train();
  int64_t steps_here = 0;
  for (int64_t step = start; step < c.train.steps; ++step) {
    const auto s0 = Clock::now();
    const double f = lr_factor(c.train, step);
    for (size_t g = 0; g < optimizer->param_groups().size(); ++g)
      static_cast<::torch::optim::AdamWOptions&>(optimizer->param_groups()[g].options()).lr(base_lrs[g] * f);
    optimizer->zero_grad();
    double loss_sum = 0;
    for (int64_t micro = 0; micro < c.train.accum; ++micro) {
      at::Tensor loss = task->loss(step, micro, micro_batch) / double(c.train.accum);
      loss.backward();
      loss_sum += loss.item<double>();
    }
    if (!std::isfinite(loss_sum))
      throw Error("train: the loss is " + fmt_num(loss_sum) + " at step " + std::to_string(step) +
                  " (lr " + fmt_num(c.train.lr * f) + "): stopped; the last checkpoint in '" + opt.run_dir +
                  "/checkpoints' is intact (try a lower train.lr)");
    const double grad_norm = ::torch::nn::utils::clip_grad_norm_(
        trainable, c.train.clip > 0 ? c.train.clip : std::numeric_limits<double>::infinity());
    optimizer->step();
    const double dt = std::chrono::duration<double>(Clock::now() - s0).count();
    train_seconds += dt;
    const int64_t tok = c.train.batch * task->tokens_per_sequence(step);
    tokens_here += tok;
    tokens_done += tok;
    flops_done += 3.0 * task->forward_flops_per_sequence(step) * double(c.train.batch);
    const int64_t done = step + 1;
    const double elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
    append_line(train_csv, std::to_string(done) + "," + fmt_num(c.train.lr * f) + "," + fmt_num(loss_sum) + "," +
                               fmt_num(grad_norm) + "," + std::to_string(tokens_done) + "," + fmt_num(flops_done) + "," +
                               fmt_num(elapsed));
    append_line(jsonl, nlohmann::json({{"kind", "train"}, {"step", done}, {"lr", c.train.lr * f}, {"loss", loss_sum},
                                       {"grad_norm", grad_norm}, {"tokens", tokens_done}, {"flops", flops_done},
                                       {"elapsed_s", elapsed}})
                           .dump());
    sum.last_loss = loss_sum;
    ++steps_here;
    if (opt.progress && (tty || done % c.train.log_every == 0 || done == c.train.steps)) {
      const double rate = tokens_here / std::max(train_seconds, 1e-9);
      const double eta = (c.train.steps - done) * (elapsed / double(steps_here));
      std::fprintf(stderr, "%sstep %lld/%lld  loss %.4f  lr %.2e  %.0f tok/s  %s elapsed  ETA %s%s", tty ? "\r" : "",
                   (long long)done, (long long)c.train.steps, loss_sum, c.train.lr * f, rate, fmt_time(elapsed).c_str(),
                   fmt_time(eta).c_str(), tty ? "   " : "\n");
    }
    const bool last = done == c.train.steps;
    if (done % c.train.eval_every == 0 || last) {
      const auto m = evaluate(done);
      if (opt.progress) std::fprintf(stderr, "%seval at step %lld: %s\n", tty ? "\n" : "", (long long)done, m.dump().c_str());
    }
    if (done % c.train.checkpoint_every == 0 || last) save(done);
    if (opt.stop_after >= 0 && steps_here >= opt.stop_after) break;
  }
  if (tty) std::fprintf(stderr, "\n");
  sum.last_step = sum.first_step + steps_here;
  sum.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  sum.tokens_per_second = tokens_here / std::max(train_seconds, 1e-9);
  sum.train_flops = flops_done;
  if (sum.last_step == c.train.steps) {
    const nlohmann::json s = {{"name", c.name}, {"task", c.task}, {"size", c.size}, {"seed", c.seed},
                              {"steps", c.train.steps}, {"last_loss", sum.last_loss}, {"eval", sum.last_eval},
                              {"train_flops", flops_done}, {"train_tokens", tokens_done},
                              {"tokens_per_second", sum.tokens_per_second}, {"seconds_this_process", sum.seconds},
                              {"threads", strata::get_num_threads()}, {"commit", opt.commit}};
    data::write_file_atomic(opt.run_dir + "/summary.json", s.dump(2) + "\n", "train");
  }
  return sum;
}

TrainedRun open_trained_run(Checkpoint ck, const std::string& device) {
  TrainedRun r;
  r.config = checkpoint_config(ck);
  if (!device.empty()) r.config.train.device = device;
  configure_threads(r.config.train.threads);
  r.task = make_task(r.config);
  load_model_state(r.task->model(), ck);
  r.task->model().eval();
  r.checkpoint = std::move(ck);
  return r;
}

TrainedRun load_trained_run(const std::string& checkpoint, const std::string& device) {
  return open_trained_run(load_checkpoint(checkpoint), device);
}

nlohmann::json evaluate_run(TrainedRun& run, const std::string& split, int64_t batch) {
  const TrainConfig& c = run.config;
  ::torch::NoGradGuard no_grad;
  const auto m = run.task->evaluate(split, batch > 0 ? batch : c.train.batch, 0);
  return {{"name", c.name}, {"task", c.task}, {"step", run.checkpoint.step}, {"split", split}, {"metrics", m},
          {"checkpoint", run.checkpoint.path}};
}

nlohmann::json evaluate_checkpoint(const std::string& checkpoint, const std::string& split, int64_t batch,
                                   const std::string& device) {
  TrainedRun run = load_trained_run(checkpoint, device);
  return evaluate_run(run, split, batch);
}

}  // namespace strata::models
