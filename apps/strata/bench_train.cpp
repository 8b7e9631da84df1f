// apps/strata/bench_train.cpp: `strata bench train`: training throughput of the char-LM decoder
// (models/decoder.h) with strata's attention and fused MLP against the same model built from plain
// LibTorch ops (SDPA as its attention; Linear, GELU, Linear as its MLP), in the same process, plus
// the attention's and the MLP's shares of the step (issue 12, item 4).
//
// Groups (each through the bench harness: warm-up, ABBA rounds, check of the last timed calls):
//   step T=256   one training step (forward, backward, AdamW) of configs/charlm.toml's cpu size,
//                attention "mha" and the fused MLP (ours) vs "sdpa" and model.fused = false
//                (peer: plain LibTorch). The optimizer's lr is 0, so every call
//                sees the same weights and the two models (identical random parameters: same seed,
//                same structure; not the muP init, whose zero outputs hide the attention) must give
//                the same loss and gradients: that is the check.
//   attn T=256   the attention of one layer alone (SelfAttention forward + backward on a fixed
//                input), mha vs sdpa; x layers / step time = the attention's share of a step.
//   op T=256     the attention op alone (SelfAttention::attend on fixed q, k, v: no projections),
//                forward + backward, mha vs sdpa: the kernels' part of the attention block.
//   mlp T=256    the MLP of one layer alone (forward + backward on a fixed input and output
//                gradient), fused vs three ATen ops.
//   step / attn / op T=1024  MLR, 8 levels 32|8|6|4|4|4|4|2 with level averaging (ours) against
//                standard attention (strata's mha: the "peer" here), batch 8: the MLR target rows.
//                Checked: finite, deterministic loss (the two models differ by design).
#include <fmt/format.h>
#include <torch/autograd.h>
#include <torch/optim/adamw.h>

#include <chrono>
#include <cmath>

#include "bench_common.h"
#include "bench_harness.h"
#include "commands.h"
#include "models/decoder.h"
#include "models/tasks.h"
#include "models/train_config.h"
#include "session.h"
#include "strata/error.h"

namespace strata::app {
namespace {

constexpr double kGroupBudgetS = 30;

struct StepModel {
  std::unique_ptr<models::Task> task;
  std::unique_ptr<::torch::optim::AdamW> opt;
  double loss = 0;
  std::vector<at::Tensor> grads;
};

// A char-LM task from configs/charlm.toml at `size` with `sets`, and an AdamW at lr 0.
StepModel make_step_model(const std::string& size, const std::vector<std::string>& sets) {
  StepModel m;
  const auto c = models::load_train_config(std::string(STRATA_SOURCE_DIR) + "/configs/charlm.toml", size, sets);
  m.task = models::make_task(c);
  // Not the muP init: its zero out-projections and head would make the loss and every gradient
  // but the head's independent of the attention (the check would compare nothing). The same draws
  // for both models of a pair (same structure, same parameter order).
  {
    ::torch::NoGradGuard no_grad;
    at::manual_seed(1);
    for (auto& p : m.task->model().parameters())
      if (p.dim() >= 2) p.normal_(0, 0.05);
  }
  m.opt = std::make_unique<::torch::optim::AdamW>(m.task->model().parameters(), ::torch::optim::AdamWOptions(0.0));
  m.task->model().train();
  return m;
}

// One training step on the same micro-batch every call (step 0).
void train_step(StepModel& m, int64_t batch) {
  m.opt->zero_grad();
  at::Tensor loss = m.task->loss(0, 0, batch);
  loss.backward();
  m.opt->step();
  m.loss = loss.item<double>();
}

double max_grad_rel_diff(StepModel& a, StepModel& b) {
  const auto pa = a.task->model().parameters(), pb = b.task->model().parameters();
  double worst = 0;
  for (size_t i = 0; i < pa.size(); ++i) {
    if (!pa[i].grad().defined()) continue;
    const double scale = pb[i].grad().abs().max().item<double>();
    if (scale == 0) continue;
    worst = std::max(worst, (pa[i].grad() - pb[i].grad()).abs().max().item<double>() / scale);
  }
  return worst;
}

// The attention of layer 0 alone: forward + backward on a fixed input (batch x T x width).
struct AttnPart {
  models::SelfAttentionImpl* attn = nullptr;
  at::Tensor x, out;
  void run() {
    at::Tensor xi = x.detach().requires_grad_(true);
    out = attn->forward(xi);
    out.sum().backward();
  }
};

AttnPart attn_part(StepModel& m, int64_t batch, int64_t T, int64_t width) {
  auto* dec = dynamic_cast<models::DecoderImpl*>(&m.task->model());
  STRATA_CHECK(dec, "bench train: the task's model is not a decoder");
  AttnPart p;
  p.attn = dec->block(0).attn.get();
  p.x = at::randn({batch, T, width}, at::TensorOptions().dtype(at::kFloat).requires_grad(false));
  return p;
}

// The attention op of layer 0 alone (attend: no projections), forward + backward on fixed q, k, v
// (batch x T x H x d).
struct AttnOp {
  models::SelfAttentionImpl* attn = nullptr;
  at::Tensor q, k, v, out;
  void run() {
    at::Tensor qi = q.detach().requires_grad_(true), ki = k.detach().requires_grad_(true),
               vi = v.detach().requires_grad_(true);
    out = attn->attend(qi, ki, vi);
    out.sum().backward();
  }
};

AttnOp attn_op(StepModel& m, int64_t batch, int64_t T) {
  auto* dec = dynamic_cast<models::DecoderImpl*>(&m.task->model());
  STRATA_CHECK(dec, "bench train: the task's model is not a decoder");
  AttnOp o;
  o.attn = dec->block(0).attn.get();
  const int64_t H = dec->config.heads, d = dec->config.width / H;
  const auto opt = at::TensorOptions().dtype(at::kFloat);
  o.q = at::randn({batch, T, H, d}, opt);
  o.k = at::randn({batch, T, H, d}, opt);
  o.v = at::randn({batch, T, H, d}, opt);
  return o;
}

// The MLP of layer 0 alone: forward + backward on a fixed input and output gradient (batch x T x
// width).
struct MlpPart {
  models::MlpImpl* mlp = nullptr;
  at::Tensor x, dy, out;
  void run() {
    at::Tensor xi = x.detach().requires_grad_(true);
    out = mlp->forward(xi);
    out.backward(dy);
  }
};

MlpPart mlp_part(StepModel& m, int64_t batch, int64_t T, int64_t width) {
  auto* dec = dynamic_cast<models::DecoderImpl*>(&m.task->model());
  STRATA_CHECK(dec, "bench train: the task's model is not a decoder");
  MlpPart p;
  p.mlp = dec->block(0).mlp.get();
  p.x = at::randn({batch, T, width}, at::TensorOptions().dtype(at::kFloat));
  p.dy = at::randn({batch, T, width}, at::TensorOptions().dtype(at::kFloat));
  return p;
}

struct Pair {
  std::string label, ours_attn, peer_attn;
  int64_t T, batch;
  bool same_model;  // peer = ours with torch SDPA: losses and gradients must agree
};

// Times ours vs peer (each a part with run() and its output `out`: AttnPart, AttnOp), checks that
// ours' output is finite, and appends the row (case_name, the step row's method / peer / shape),
// with its share of each model's step (layers x its time / the step's time) in extra.
template <class Part>
const BenchRow& attention_row(BenchReport& rep, const TimingPlan& plan, const BenchRow& step_row, Part& ours,
                              Part& peer, const std::string& case_name, const std::string& label, double flops,
                              double peer_flops, int64_t layers, double step_ours, double step_peer) {
  std::vector<BenchMethod> fns = {{"ours", [&] { ours.run(); }}, {"peer", [&] { peer.run(); }}};
  bool ok = false;
  const auto check = [&] { ok = ours.out.defined() && at::isfinite(ours.out).all().template item<bool>(); };
  const auto secs = run_timed_group(fns, plan, check, CorruptFn()).secs;
  BenchRow r;
  r.case_name = case_name;
  r.method = step_row.method;
  r.peer = step_row.peer;
  r.shape = step_row.shape;
  r.shape_label = label;
  r.dtype = "float32";
  r.checked_against = "finite output (each layer kind is checked against its reference in the tests)";
  r.correct = ok;
  r.flops = flops;
  r.peer_flops = peer_flops;
  set_row_times(r, secs[0], secs[1]);
  r.extra = {{"share_of_step", layers * r.ours.median_s / step_ours},
             {"peer_share_of_step", layers * r.peer_time.median_s / step_peer}};
  rep.rows.push_back(r);
  return rep.rows.back();
}

void run_pair(BenchReport& rep, const Pair& pr, const std::string& size, const TimingPlan& plan,
              std::vector<BenchTarget>& targets) {
  const std::vector<std::string> common = {"data.context=" + std::to_string(pr.T),
                                           "train.batch=" + std::to_string(pr.batch), "train.threads=0"};
  auto sets_with = [&](const std::string& attn) {
    auto s = common;
    s.push_back("model.attention=" + attn);
    return s;
  };
  auto peer_sets = sets_with(pr.peer_attn);
  if (pr.same_model) peer_sets.push_back("model.fused=false");  // the plain-LibTorch model
  StepModel ours = make_step_model(size, sets_with(pr.ours_attn)), peer = make_step_model(size, peer_sets);
  const auto* dec = dynamic_cast<models::DecoderImpl*>(&ours.task->model());
  const int64_t width = dec->config.width, layers = dec->config.layers, heads = dec->config.heads;
  const double tokens = double(pr.batch * pr.T);

  // Whole training step.
  double loss_ours_first = 0;
  train_step(ours, pr.batch);
  loss_ours_first = ours.loss;
  std::vector<BenchMethod> fns = {{"ours", [&] { train_step(ours, pr.batch); }},
                                  {"peer", [&] { train_step(peer, pr.batch); }}};
  double err = 0;
  bool ok = false;
  const auto check = [&] {
    err = std::abs(ours.loss - peer.loss) / std::abs(peer.loss);
    const double gerr = pr.same_model ? max_grad_rel_diff(ours, peer) : 0;
    const bool deterministic = ours.loss == loss_ours_first;
    // Same model: fp32 sums in another order over T keys and `layers` layers: 1e-4 relative.
    ok = std::isfinite(ours.loss) && deterministic && (!pr.same_model || (err < 1e-4 && gerr < 1e-3));
    if (pr.same_model) err = std::max(err, gerr);
  };
  const auto secs = run_timed_group(fns, plan, check, CorruptFn()).secs;
  BenchRow row;
  row.case_name = "train step";
  row.method = "strata " + pr.ours_attn;
  row.peer = pr.same_model ? "plain libtorch (sdpa)" : "strata " + pr.peer_attn;
  row.shape = {{"batch", pr.batch}, {"T", pr.T}, {"width", width}, {"layers", layers}, {"heads", heads}};
  row.shape_label = fmt::format("{} B={} T={} D={} L={}", pr.label, pr.batch, pr.T, width, layers);
  row.dtype = "float32";
  row.tolerance = pr.same_model ? 1e-4 : 0;
  row.checked_against = pr.same_model ? "the peer model's loss (1e-4) and gradients (1e-3), identical weights"
                                      : "finite and deterministic loss (different models)";
  row.max_rel_err = err;
  row.correct = ok;
  row.flops = 3.0 * ours.task->forward_flops_per_sequence(0) * pr.batch;
  row.peer_flops = 3.0 * peer.task->forward_flops_per_sequence(0) * pr.batch;
  set_row_times(row, secs[0], secs[1]);
  row.extra = {{"tokens_per_s", tokens / row.ours.median_s}, {"peer_tokens_per_s", tokens / row.peer_time.median_s}};
  rep.rows.push_back(row);
  print_peer_table_row(
      rep.rows.back(), rep.peak.all_gflops,
      fmt::format("{:.0f} vs {:.0f} tokens/s", tokens / row.ours.median_s, tokens / row.peer_time.median_s));
  const double step_ours = row.ours.median_s, step_peer = row.peer_time.median_s;
  targets.push_back({fmt::format("{}: whole step speedup over {} (>=)", pr.label, row.peer), pr.same_model ? 1.2 : 1.0,
                     row.speedup.median});

  // The attention block alone (layer 0, x layers for the share), then its op alone.
  const auto flops = [&](const models::SelfAttentionImpl& a, bool block) {
    return 3.0 * (a.forward_flops(pr.T) - (block ? 0.0 : a.projection_flops(pr.T))) * pr.batch;
  };
  AttnPart ao = attn_part(ours, pr.batch, pr.T, width), ap = attn_part(peer, pr.batch, pr.T, width);
  ap.x = ao.x;
  const BenchRow& arow = attention_row(rep, plan, row, ao, ap, "attention fwd+bwd", pr.label + " attention, 1 layer",
                                       flops(*ao.attn, true), flops(*ap.attn, true), layers, step_ours, step_peer);
  print_peer_table_row(arow, rep.peak.all_gflops,
                       fmt::format("attention ~{:.0f}% of ours' step, {:.0f}% of the peer's",
                                   100 * arow.extra.at("share_of_step").get<double>(),
                                   100 * arow.extra.at("peer_share_of_step").get<double>()));
  if (!pr.same_model)
    targets.push_back(
        {fmt::format("{}: attention fwd+bwd speedup over {} (>=)", pr.label, row.peer), 1.1, arow.speedup.median});

  AttnOp oo = attn_op(ours, pr.batch, pr.T), op = attn_op(peer, pr.batch, pr.T);
  op.q = oo.q;
  op.k = oo.k;
  op.v = oo.v;
  const BenchRow& orow =
      attention_row(rep, plan, row, oo, op, "attention op fwd+bwd", pr.label + " attend(q, k, v), 1 layer",
                    flops(*oo.attn, false), flops(*op.attn, false), layers, step_ours, step_peer);
  print_peer_table_row(orow, rep.peak.all_gflops,
                       fmt::format("the op ~{:.0f}% of ours' step, {:.0f}% of the peer's; FLOP ratio {:.2f}",
                                   100 * orow.extra.at("share_of_step").get<double>(),
                                   100 * orow.extra.at("peer_share_of_step").get<double>(),
                                   orow.peer_flops.value_or(orow.flops) / orow.flops));

  if (!pr.same_model) return;  // (both models' MLPs are the fused one)
  MlpPart mo = mlp_part(ours, pr.batch, pr.T, width), mp = mlp_part(peer, pr.batch, pr.T, width);
  mp.x = mo.x;
  mp.dy = mo.dy;
  const double mlp_flops = 3.0 * mo.mlp->forward_flops(pr.T) * pr.batch;
  const BenchRow& mrow = attention_row(rep, plan, row, mo, mp, "mlp fwd+bwd", pr.label + " mlp, 1 layer", mlp_flops,
                                       mlp_flops, layers, step_ours, step_peer);
  print_peer_table_row(mrow, rep.peak.all_gflops,
                       fmt::format("fused vs Linear, GELU, Linear: ~{:.0f}% of ours' step, {:.0f}% of the peer's",
                                   100 * mrow.extra.at("share_of_step").get<double>(),
                                   100 * mrow.extra.at("peer_share_of_step").get<double>()));
}

}  // namespace

CLI::App* add_bench_train(CLI::App& bench, BenchTrainOptions& o) {
  CLI::App* cmd =
      bench.add_subcommand("train", "Training step of the char-LM decoder: strata vs plain LibTorch (SDPA)");
  cmd->add_flag("--smoke", o.smoke, "the smoke size, 3 rounds (for tests)");
  add_bench_output_options(cmd, o.json, o.csv, o.threads, o.reps, "group",
                           "timed rounds per group (ABBA order) after one warm-up (default 7, 3 with --smoke)");
  return cmd;
}

int run_bench_train(const BenchTrainOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  const int threads = configure_threads(o.threads);
  fmt::print("measuring the fp32 FMA peak on {} threads...\n", threads);
  std::fflush(stdout);
  BenchReport rep = new_report("train", threads);
  print_preamble(rep);
  const TimingPlan plan = bench_timing_plan(o.reps, false, o.smoke, kGroupBudgetS);
  const std::string size = o.smoke ? "smoke" : "cpu";
  fmt::print("configs/charlm.toml at size '{}'; {} timed rounds per group\n", size, plan.reps);
  print_peer_table_header();
  std::vector<BenchTarget> targets;
  std::vector<Pair> pairs;
  if (o.smoke) {
    pairs.push_back(Pair{"mha vs sdpa", "mha", "sdpa", 32, 4, true});
    pairs.push_back(Pair{"mlr vs mha", "mlr:ranks=8|4|4,avg=1", "mha", 32, 4, false});
  } else {
    pairs.push_back(Pair{"mha vs sdpa", "mha", "sdpa", 256, 32, true});
    pairs.push_back(Pair{"mlr8 vs mha T=1024", "mlr:ranks=32|8|6|4|4|4|4|2,avg=1", "mha", 1024, 8, false});
  }
  for (const auto& p : pairs) {
    run_pair(rep, p, size, plan, targets);
    if (!o.json.empty()) write_json(rep, o.json);
  }
  rep.targets = targets;
  finish_report(rep, threads, o.json, o.csv);
  print_targets(rep.targets);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return print_run_summary(rep, "strata bench train", o.json, o.csv, secs);
}

}  // namespace strata::app
