// apps/strata/demo_attention.cpp: the dense-attention demo sections: a correctness table (ours vs
// the double-precision reference and vs torch SDPA, forward and backward) and a speed table.
#include <fmt/core.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "attention_runner.h"
#include "demo.h"
#include "plot.h"
#include "session.h"
#include "strata/attention.h"
#include "strata/cpu.h"
#include "strata/torch/attention.h"

namespace strata::app {
namespace {

struct CheckCase {
  std::string label;
  int64_t batch, heads_q, heads_kv, seq_q, seq_k, head_dim;
  bool causal;
  int64_t window_left, window_right;  // -1: unbounded
  at::ScalarType dtype;
  std::string layout;  // "bshd" or "bhsd"
};

// Small shapes that exercise masks, GQA, odd sizes, bf16 and both layouts. No shape leaves a query
// row without keys (SDPA returns NaN there, strata zeros: a documented difference).
std::vector<CheckCase> check_cases() {
  return {
      {"plain", 2, 4, 4, 97, 97, 64, false, -1, -1, at::kFloat, "bshd"},
      {"causal", 2, 4, 4, 130, 130, 64, true, -1, -1, at::kFloat, "bshd"},
      {"causal Nq<Nk d59", 1, 3, 3, 65, 200, 59, true, -1, -1, at::kFloat, "bshd"},
      {"window 32/16", 2, 4, 4, 256, 256, 64, false, 32, 16, at::kFloat, "bshd"},
      {"causal window 48", 1, 2, 2, 300, 300, 128, true, 48, -1, at::kFloat, "bhsd"},
      {"GQA 8:2 causal", 2, 8, 2, 128, 128, 64, true, -1, -1, at::kFloat, "bshd"},
      {"bf16 causal", 2, 4, 4, 256, 256, 64, true, -1, -1, at::kBFloat16, "bhsd"},
      {"bf16 GQA 4:1 win 64", 1, 4, 1, 192, 192, 80, false, 64, 0, at::kBFloat16, "bshd"},
  };
}

// A 4-D tensor of random normals in the case's layout (sizes given in BSHD order).
at::Tensor random_4d(const CheckCase& c, int64_t b, int64_t s, int64_t h, int64_t d) {
  const at::Tensor t = c.layout == "bhsd" ? at::randn({b, h, s, d}) : at::randn({b, s, h, d});
  return t.to(c.dtype);
}

// The same data viewed as BSHD (a transpose for "bhsd", no copy).
at::Tensor as_bshd(const at::Tensor& t, const std::string& layout) {
  return layout == "bhsd" ? t.transpose(1, 2) : t;
}

// The same data viewed as BHSD, SDPA's layout (no copy).
at::Tensor as_bhsd(const at::Tensor& t, const std::string& layout) {
  return layout == "bhsd" ? t : t.transpose(1, 2);
}

// seq_q x seq_k boolean mask, true = attend, with strata's bottom-right alignment.
std::optional<at::Tensor> sdpa_mask(const CheckCase& c) {
  if (!c.causal && c.window_left < 0 && c.window_right < 0) return std::nullopt;
  const at::Tensor p = at::arange(c.seq_q).unsqueeze(1) + (c.seq_k - c.seq_q);  // seq_q x 1
  const at::Tensor j = at::arange(c.seq_k).unsqueeze(0);                        // 1 x seq_k
  at::Tensor m = at::ones({c.seq_q, c.seq_k}, at::kBool);
  if (c.causal) m = m.logical_and(j <= p);
  if (c.window_left >= 0) m = m.logical_and(j >= p - c.window_left);
  if (c.window_right >= 0) m = m.logical_and(j <= p + c.window_right);
  return m;
}

struct Errors {
  double fwd = 0, bwd = 0;  // out; max over dq, dk, dv
};

// Prints one PASS/FAIL line; returns pass.
bool print_check(const CheckCase& c, const char* against, const Errors& e, double tol) {
  const bool ok = e.fwd < tol && e.bwd < tol;
  fmt::print("  {}  {:<20} {:<9} {:<4} vs {:<10} fwd {:8.1e}  bwd {:8.1e}  (tol {:.0e})\n", ok ? "PASS" : "FAIL",
             c.label, c.dtype == at::kBFloat16 ? "bfloat16" : "float32", c.layout, against, e.fwd, e.bwd, tol);
  std::fflush(stdout);
  return ok;
}

// Runs one case: ours fwd + bwd, the double reference, SDPA through autograd; prints two rows.
bool run_check(const CheckCase& c) {
  at::manual_seed(7);
  const at::Tensor q = random_4d(c, c.batch, c.seq_q, c.heads_q, c.head_dim);
  const at::Tensor k = random_4d(c, c.batch, c.seq_k, c.heads_kv, c.head_dim);
  const at::Tensor v = random_4d(c, c.batch, c.seq_k, c.heads_kv, c.head_dim);
  const at::Tensor dout = random_4d(c, c.batch, c.seq_q, c.heads_q, c.head_dim);
  strata::torch::AttentionArgs args;
  args.causal = c.causal;
  args.window_left = c.window_left;
  args.window_right = c.window_right;
  args.layout = c.layout;

  // Ours.
  const auto [o, lse] = strata::torch::attention_forward(q, k, v, args);
  const auto [dq, dk, dv] = strata::torch::attention_backward(q, k, v, o, lse, dout, args);

  // The double-precision reference (outputs contiguous BSHD).
  AttentionOptions opt;
  opt.causal = c.causal;
  opt.window_left = c.window_left;
  opt.window_right = c.window_right;
  opt.layout = c.layout == "bhsd" ? Layout::BHSD : Layout::BSHD;
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  const at::Tensor ro = at::empty({c.batch, c.seq_q, c.heads_q, c.head_dim}, f64);
  const at::Tensor rlse = at::empty({c.batch, c.heads_q, c.seq_q}, f64);
  const at::Tensor rdq = at::empty({c.batch, c.seq_q, c.heads_q, c.head_dim}, f64);
  const at::Tensor rdk = at::empty({c.batch, c.seq_k, c.heads_kv, c.head_dim}, f64);
  const at::Tensor rdv = at::empty({c.batch, c.seq_k, c.heads_kv, c.head_dim}, f64);
  const TensorView vq = strata::torch::view_of(q, "q"), vk = strata::torch::view_of(k, "k"),
                   vv = strata::torch::view_of(v, "v"), vdout = strata::torch::view_of(dout, "dout");
  reference::attention_forward(vq, vk, vv, opt, ro.data_ptr<double>(), rlse.data_ptr<double>());
  reference::attention_backward(vq, vk, vv, vdout, opt, rdq.data_ptr<double>(), rdk.data_ptr<double>(),
                                rdv.data_ptr<double>());

  // torch SDPA through autograd, on BHSD views of the same tensors.
  const at::Tensor qg = q.detach().requires_grad_(true), kg = k.detach().requires_grad_(true),
                   vg = v.detach().requires_grad_(true);
  const at::Tensor so = at::scaled_dot_product_attention(
      as_bhsd(qg, c.layout), as_bhsd(kg, c.layout), as_bhsd(vg, c.layout), sdpa_mask(c), 0.0, false,
      std::nullopt, c.heads_q != c.heads_kv);
  const auto sg = ::torch::autograd::grad({so}, {qg, kg, vg}, {as_bhsd(dout, c.layout)});

  const std::string& L = c.layout;
  const double tol = attention_tolerance(c.dtype);
  Errors vs_ref, vs_sdpa;
  vs_ref.fwd = max_rel_err(as_bshd(o, L), ro);
  vs_ref.bwd = std::max({max_rel_err(as_bshd(dq, L), rdq), max_rel_err(as_bshd(dk, L), rdk),
                         max_rel_err(as_bshd(dv, L), rdv)});
  vs_sdpa.fwd = max_rel_err(as_bshd(o, L), so.detach().transpose(1, 2));
  vs_sdpa.bwd = std::max({max_rel_err(as_bshd(dq, L), as_bshd(sg[0], L)),
                          max_rel_err(as_bshd(dk, L), as_bshd(sg[1], L)),
                          max_rel_err(as_bshd(dv, L), as_bshd(sg[2], L))});
  const bool ok_ref = print_check(c, "reference", vs_ref, tol);
  const bool ok_sdpa = print_check(c, "sdpa", vs_sdpa, tol);
  return ok_ref && ok_sdpa;
}

}  // namespace

bool demo_attention_check(DemoContext& ctx) {
  fmt::print("  max|ours - other| / max|other| over out (fwd) and dq, dk, dv (bwd); masks bottom-right aligned\n");
  bool ok = true;
  for (const CheckCase& c : check_cases()) ok = run_check(c) && ok;
  return ok;
}

bool demo_attention_speed(DemoContext& ctx) {
  BenchReport rep;
  rep.bench = "attention";
  rep.threads = ctx.threads;
  rep.peak = ctx.peak();
  rep.cpu = cpu_summary();
  rep.cpu_model = cpu_model();
  rep.torch_version = torch_version();
  rep.date = utc_now();
  fmt::print("  fp32 FMA peak {:.1f} GFLOP/s on {} threads; ours = strata.flash, peer = torch.sdpa, "
             "median of 3 interleaved reps\n\n", rep.peak.all_gflops, rep.threads);
  std::fflush(stdout);
  warn_if_busy(rep.peak);
  TimingPlan plan;
  plan.reps = 3;
  print_table_header();
  bool ok = true;
  for (bool backward : {false, true})
    for (int64_t n : {1024, 2048, 4096}) {
      AttnCase c;
      c.batch = 16384 / n;
      c.heads = 8;
      c.seq = n;
      c.head_dim = 64;
      c.backward = backward;
      rep.rows.push_back(run_attention_row(c, plan));
      print_table_row(rep.rows.back(), rep.peak.all_gflops);
      ok = ok && rep.rows.back().correct;
    }
  const std::string json = ctx.out_dir + "/demo_attention.json", png = ctx.out_dir + "/demo_attention.png";
  write_json(rep, json);
  fmt::print("\n  wrote {}\n", json);
  std::fflush(stdout);
  std::string why;
  if (run_plot(json, png, &why)) fmt::print("  wrote {}\n", png);
  else fmt::print("  no plot: {}\n  (the table above has the same numbers)\n", why);
  return ok;
}

}  // namespace strata::app
