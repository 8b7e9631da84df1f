// apps/strata/bench_structured.cpp: `strata bench structured`: each structured operator
// (strata/structured.h, fp32) against a dense GEMM of the same shape in the same process (LibTorch's
// matmul, same threads): y = x M^T over N tokens, forward and backward.
//
// Sweep: D in {256, 1024, 4096} (--quick: 256, 1024; --smoke: 64 with N = 256), N = 4096 tokens,
// 7 rounds per group (--quick 5, --smoke 3). Operators at width D (s: BTT rank):
//   btt s=1, btt s=2   the structured-attention code's factorisation (1024: a, b = 16, 64)
//   monarch            sqrt(D) blocks (D a perfect square; else the BTT factorisation's c blocks)
//   low_rank           r = D / 8
//   mlr                4 levels of rank D / 32, p_l = 1, 2, 4, 8
//   block_diagonal     8 blocks
//   kronecker          A (x) B with A of size c x c and B d x d (the BTT factorisation)
// Per (D, operator) two groups through the bench harness (one warm-up, ABBA rounds, the check on
// what the last timed calls wrote):
//   fwd  ours = structured_forward; peer = at::mm_out(y, x, W^T) with W = the operator's dense
//        matrix (structured_to_dense of the same factors): the peer computes the same function
//   bwd  ours = structured_backward (dx and every factor's gradient) given what a training forward
//        saved (the right stages' outputs: structured_saved_size floats; what the autograd path
//        does); peer = dx = dy W and dW = dy^T x (two mm_out)
// Correctness: fwd: ours' y vs the peer's (same function, fp32 both: 1e-4 normwise). bwd: dx vs the
// peer's dx (1e-4); the factor gradients in two random directions U: <dfactors, U> must equal
// <dW, dM(U)> with dM(U) = (M(F + U) - M(F - U)) / 2, exact for M quadratic in the factors (every
// level is bilinear in its two stages), formed with the fp32 to_dense (1e-3: differences of fp32
// matrices).
// End to end (one group per D, fwd and fwd+bwd): strata::torch::BilinearBTTAttention (D, H = 8 heads,
// BTT s = 1 by the reference's rule, causal, fp32; its key transform on the structured kernel, its
// attention on the dense kernel with head dim D and the query shared by the heads) against standard
// causal attention of the same width (q, k, v, out Linear D -> D, SDPA with head dim D / H), T = 1024
// tokens (--smoke: 64, H = 4). Check: ours' output on the first 64 tokens of the last timed call vs
// the same module in float64 (causal: those rows depend on those tokens only), 1e-4; the fwd+bwd
// rows also need finite gradients. FLOPs (2 x MACs, causal attention counted over the allowed
// pairs): ours = the key transform (structured_flops) + V and out projections 4 T D^2 + H T^2 (D +
// D/H); standard = 8 T D^2 + 2 T^2 D; fwd+bwd = 3 x fwd for both (the linear layers' convention).
// FLOPs: ours strata::structured_flops (2 x MACs in the order the kernel runs; backward 2x), the
// peer 2 N D^2 (backward 2x). flop_ratio = peer / ours; fraction_of_ratio = speedup / flop_ratio.
#include <ATen/ATen.h>
#include <fmt/core.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "attention_runner.h"
#include "bench_common.h"
#include "commands.h"
#include "session.h"
#include "strata/error.h"
#include "strata/structured.h"
#include "strata/torch/bilinear_attention.h"
#include "strata/torch/structured.h"
#include "strata/torch/view_of.h"

namespace strata::app {
namespace {

constexpr double kGroupBudgetS = 20.0;
constexpr double kTolerance = 1e-4, kGradTolerance = 1e-3;

TensorView tv(const at::Tensor& t, const char* arg) { return strata::torch::view_of(t, "bench structured", arg); }

struct Operator {
  std::string name;
  StructuredSpec spec;
};

std::vector<Operator> operators_at(int64_t D) {
  const BttShape t = btt_factorize(D, D);
  const int64_t root = int64_t(std::llround(std::sqrt(double(D))));
  std::vector<Operator> ops = {
      {"btt s=1", btt_spec(t, 1)},
      {"btt s=2", btt_spec(t, 2)},
      {"monarch", monarch_spec(D, root * root == D ? root : t.c)},
      {"low_rank r=D/8", low_rank_spec(D, D, std::max<int64_t>(1, D / 8))},
      {"mlr 4x(D/32)", mlr_spec(D, std::vector<int64_t>(4, std::max<int64_t>(1, D / 32)))},
      {"block_diagonal 8", block_diagonal_spec(D, D, 8)},
      {"kronecker", kronecker_spec(t.c, t.c, t.d, t.d)},
  };
  return ops;
}

std::vector<at::Tensor> random_factors(const StructuredSpec& spec) {
  std::vector<at::Tensor> f;
  for (const auto& s : structured_factor_shapes(spec)) f.push_back(at::randn(s) / std::sqrt(double(s[1])));
  return f;
}
std::vector<TensorView> views(const std::vector<at::Tensor>& ts, const char* arg) {
  std::vector<TensorView> v;
  for (const auto& t : ts) v.push_back(tv(t, arg));
  return v;
}

// max over two random directions U of |<df, U> - <dW, dM(U)>| / |<dW, dM(U)>|.
double factor_grad_err(const StructuredSpec& spec, const std::vector<at::Tensor>& f, const std::vector<at::Tensor>& df,
                       const at::Tensor& dW) {
  double err = 0;
  for (int trial = 0; trial < 2; ++trial) {
    std::vector<at::Tensor> plus, minus;
    double ours = 0;
    for (size_t i = 0; i < f.size(); ++i) {
      const at::Tensor u = at::randn(f[i].sizes()) * f[i].abs().max();
      plus.push_back(f[i] + u);
      minus.push_back(f[i] - u);
      ours += (df[i].to(at::kDouble) * u.to(at::kDouble)).sum().item<double>();
    }
    const at::Tensor dM = (strata::torch::structured_to_dense(spec, plus) -
                           strata::torch::structured_to_dense(spec, minus)).to(at::kDouble) / 2;
    const double want = (dW.to(at::kDouble) * dM).sum().item<double>();
    err = std::max(err, std::fabs(ours - want) / std::max(std::fabs(want), 1e-30));
  }
  return err;
}

void run_operator(BenchReport& rep, const Operator& op, int64_t N, const TimingPlan& plan,
                  std::vector<BenchTarget>& targets) {
  at::manual_seed(20250709);
  const StructuredSpec& spec = op.spec;
  const int64_t D = spec.in;
  const at::Tensor x = at::randn({N, D}), dy = at::randn({N, spec.out});
  const std::vector<at::Tensor> f = random_factors(spec);
  const at::Tensor W = strata::torch::structured_to_dense(spec, f);  // out x in, fp32
  const double ours_fwd = structured_flops(spec, N), dense_fwd = 2.0 * double(N) * double(D) * double(spec.out);
  for (const bool backward : {false, true}) {
    at::Tensor y = at::empty({N, spec.out}), y_peer = at::empty({N, spec.out});
    at::Tensor dx = at::empty({N, D}), dx_peer = at::empty({N, D}), dW = at::empty({spec.out, D});
    std::vector<at::Tensor> df;
    for (const auto& t : f) df.push_back(at::empty_like(t));
    const at::Tensor saved = at::empty({structured_saved_size(spec, N)});  // the training forward's
    if (backward) structured_forward(spec, tv(x, "x"), views(f, "factors"), tv(y, "y"), tv(saved, "saved"));
    std::vector<BenchMethod> fns;
    if (!backward) {
      fns.push_back({"strata.structured", [&] { structured_forward(spec, tv(x, "x"), views(f, "factors"), tv(y, "y")); }});
      fns.push_back({"torch.matmul", [&] { at::mm_out(y_peer, x, W.t()); }});
    } else {
      fns.push_back({"strata.structured", [&] {
                       structured_backward(spec, tv(x, "x"), views(f, "factors"), tv(dy, "dy"), tv(dx, "dx"),
                                           views(df, "dfactors"), tv(saved, "saved"));
                     }});
      fns.push_back({"torch.matmul", [&] {
                       at::mm_out(dx_peer, dy, W);
                       at::mm_out(dW, dy.t(), x);
                     }});
    }
    double err = 0, grad_err = 0;
    const auto check = [&] {
      if (!backward) {
        err = max_rel_err(y, y_peer);
      } else {
        err = max_rel_err(dx, dx_peer);
        grad_err = factor_grad_err(spec, f, df, dW);
      }
    };
    // (the test hook's perturbation reads batch x heads x seq x dim: 4-D views of the outputs)
    const at::Tensor y4 = y.view({1, 1, N, spec.out}), dx4 = dx.view({1, 1, N, D});
    const CorruptFn corrupt = corrupt_outputs({{"o", &y4}, {"dq", &dx4}});
    const auto secs = run_timed_group(fns, plan, check, corrupt).secs;

    const double mult = backward ? 2.0 : 1.0, ratio = dense_fwd / ours_fwd;
    BenchRow row;
    row.case_name = backward ? "bwd" : "fwd";
    row.method = "strata.structured";
    row.peer = "torch.matmul";
    row.shape = {{"tokens", N}, {"in", D}, {"out", spec.out}, {"operator", op.name}};
    row.shape_label = fmt::format("{} D={} N={}", op.name, D, N);
    row.dtype = "float32";
    row.tolerance = kTolerance;
    row.checked_against = backward ? "the dense GEMM's dx; factor gradients projected on 2 random directions"
                                   : "the dense GEMM (the operator's dense matrix)";
    row.max_rel_err = err;
    row.correct = err < kTolerance && grad_err < kGradTolerance;
    row.flops = mult * ours_fwd;
    row.peer_flops = mult * dense_fwd;
    set_row_times(row, secs[0], secs[1]);
    row.extra = {{"flop_ratio", ratio},
                 {"fraction_of_ratio", row.speedup.median / ratio},
                 {"params", structured_params(spec)},
                 {"rank", structured_rank(spec)}};
    if (backward) row.extra["factor_grad_rel_err"] = grad_err;
    rep.rows.push_back(std::move(row));
    const BenchRow& r = rep.rows.back();
    print_peer_table_row(r, rep.peak.all_gflops,
                         fmt::format("FLOP ratio {:.1f}, {:.2f} of it{}", ratio, r.speedup.median / ratio,
                                     backward ? fmt::format("; dfactors {:.1e}", grad_err) : std::string()));
    if (op.name == "btt s=1" && (D == 1024 || D == 4096))
      targets.push_back({fmt::format("{} btt s=1 D={}: speedup vs torch.matmul >= 0.6 x its FLOP ratio ({:.1f})",
                                     backward ? "bwd" : "fwd", D, ratio),
                         0.6 * ratio, r.speedup.median});
  }
}

// Bilinear BTT attention end to end against standard attention of the same width (file comment).
void run_bilinear_btt(BenchReport& rep, int64_t D, int64_t H, int64_t T, const TimingPlan& plan) {
  at::manual_seed(20250710);
  namespace st = strata::torch;
  st::BilinearBTTAttention ours(st::BilinearBTTAttentionOptions(D, H));
  ::torch::nn::Linear wq(D, D), wk(D, D), wv(D, D), wo(D, D);
  const at::Tensor x = at::randn({1, T, D});
  const auto standard = [&](const at::Tensor& in) {
    const auto heads = [&](const at::Tensor& t) { return t.view({1, T, H, D / H}).transpose(1, 2); };
    const at::Tensor o = at::scaled_dot_product_attention(heads(wq(in)), heads(wk(in)), heads(wv(in)), {}, 0.0, true);
    return wo(o.transpose(1, 2).reshape({1, T, D}));
  };
  // the check's truth: the module in float64 on the first 64 tokens
  const int64_t C = std::min<int64_t>(T, 64);
  at::Tensor want;
  {
    at::NoGradGuard no_grad;
    auto ref = std::dynamic_pointer_cast<st::BilinearBTTAttentionImpl>(ours->clone());
    ref->to(at::kDouble);
    want = ref->forward(x.narrow(1, 0, C).to(at::kDouble));
  }
  const BttShape shape = btt_factorize(D, D);
  const double Td = double(T), Dd = double(D), Hd = double(H);
  const double ours_fwd = structured_flops(btt_spec(shape, 1, H), T) + 4 * Td * Dd * Dd + Hd * Td * Td * (Dd + Dd / Hd);
  const double std_fwd = 8 * Td * Dd * Dd + 2 * Td * Td * Dd;
  for (const bool backward : {false, true}) {
    at::Tensor y_ours, y_std, gx;
    std::vector<BenchMethod> fns;
    if (!backward) {
      fns.push_back({"strata.bilinear_btt", [&] {
                       at::NoGradGuard g;
                       y_ours = ours->forward(x);
                     }});
      fns.push_back({"standard attention", [&] {
                       at::NoGradGuard g;
                       y_std = standard(x);
                     }});
    } else {
      fns.push_back({"strata.bilinear_btt", [&] {
                       const at::Tensor xg = x.detach().requires_grad_(true);
                       y_ours = ours->forward(xg);
                       y_ours.sum().backward();
                       gx = xg.grad();
                       y_ours = y_ours.detach();
                     }});
      fns.push_back({"standard attention", [&] {
                       const at::Tensor xg = x.detach().requires_grad_(true);
                       standard(xg).sum().backward();
                     }});
    }
    double err = 0;
    bool finite = true;
    const auto check = [&] {
      err = max_rel_err(y_ours.narrow(1, 0, C), want);
      if (backward) finite = gx.defined() && gx.isfinite().all().item<bool>();
    };
    const auto secs = run_timed_group(fns, plan, check, CorruptFn()).secs;
    const double mult = backward ? 3.0 : 1.0;
    BenchRow row;
    row.case_name = backward ? "fwd+bwd causal" : "fwd causal";
    row.method = "strata.bilinear_btt";
    row.peer = "standard attention";
    row.shape = {{"batch", 1}, {"tokens", T}, {"width", D}, {"heads", H}, {"btt_a", shape.a}, {"btt_b", shape.b}};
    row.shape_label = fmt::format("bilinear BTT D={} H={} T={}", D, H, T);
    row.dtype = "float32";
    row.tolerance = kTolerance;
    row.checked_against = "the module in float64 (first 64 tokens)";
    row.ref_max_rel_err = err;
    row.correct = err < kTolerance && finite;
    row.flops = mult * ours_fwd;
    row.peer_flops = mult * std_fwd;
    set_row_times(row, secs[0], secs[1]);
    row.extra = {{"flop_ratio", std_fwd / ours_fwd}};
    rep.rows.push_back(std::move(row));
    const BenchRow& r = rep.rows.back();
    print_peer_table_row(r, rep.peak.all_gflops, fmt::format("FLOP ratio {:.2f} (standard / ours)", std_fwd / ours_fwd));
  }
}

}  // namespace

CLI::App* add_bench_structured(CLI::App& bench, BenchStructuredOptions& o) {
  CLI::App* cmd = bench.add_subcommand(
      "structured",
      "Structured operators (BTT, Monarch, low rank, MLR, block diagonal, Kronecker; fp32) vs a dense\n"
      "GEMM of the same shape (torch matmul): y = x M^T over N tokens, forward and backward");
  cmd->add_flag("--quick", o.quick, "D 256 and 1024");
  cmd->add_flag("--smoke", o.smoke, "D = 64, N = 256, 3 rounds (for tests)");
  cmd->add_option("--dim", o.dim, "keep only these widths D (repeatable)")->type_name("D");
  cmd->add_option("--tokens", o.tokens, "tokens N (default 4096)")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--operator", o.ops, "keep only these operators (repeatable; e.g. \"btt s=1\")");
  add_bench_output_options(cmd, o.json, o.csv, o.threads, o.reps, "operator",
                           "timed rounds per group (ABBA order) after one warm-up (default 7, 5 with --quick,\n"
                           "3 with --smoke; more rounds are cut back on groups over 20 s, never under those)");
  return cmd;
}

int run_bench_structured(const BenchStructuredOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<int64_t> dims = o.smoke ? std::vector<int64_t>{64}
                                    : o.quick ? std::vector<int64_t>{256, 1024}
                                              : std::vector<int64_t>{256, 1024, 4096};
  std::vector<int64_t> sel;
  for (int64_t d : dims)
    if (o.dim.empty() || std::find(o.dim.begin(), o.dim.end(), d) != o.dim.end()) sel.push_back(d);
  STRATA_CHECK(!sel.empty(), "strata bench structured: argument '--dim': expected a selection that keeps at least "
               "one D of the ", o.smoke ? "smoke" : o.quick ? "quick" : "full", " sweep, got none");
  const int64_t N = o.tokens > 0 ? o.tokens : o.smoke ? 256 : 4096;

  const int threads = configure_threads(o.threads);
  fmt::print("measuring the fp32 FMA peak on {} threads...\n", threads);
  std::fflush(stdout);
  BenchReport rep = new_report("structured", threads);
  print_preamble(rep);
  const TimingPlan plan = bench_timing_plan(o.reps, o.quick, o.smoke, kGroupBudgetS);
  fmt::print("D: {}; N = {} tokens; ours = strata.structured (fp32, y = x M^T, x row-major); peer = torch.matmul\n"
             "on the operator's dense matrix (mm_out into preallocated outputs); {} timed rounds per group\n",
             fmt::join(sel, ", "), N, plan.reps);
  print_peer_table_header();
  std::vector<BenchTarget> targets;
  size_t ran = 0;
  for (int64_t d : sel)
    for (const Operator& op : operators_at(d)) {
      if (!o.ops.empty() && std::find(o.ops.begin(), o.ops.end(), op.name) == o.ops.end()) continue;
      run_operator(rep, op, N, plan, targets);
      ++ran;
      if (!o.json.empty()) write_json(rep, o.json);
    }
  STRATA_CHECK(ran > 0, "strata bench structured: argument '--operator': expected names from the sweep (e.g. "
               "\"btt s=1\", \"monarch\"), got none that match");
  if (o.ops.empty())
    for (int64_t d : sel) {
      run_bilinear_btt(rep, d, o.smoke ? 4 : 8, o.smoke ? 64 : 1024, plan);
      if (!o.json.empty()) write_json(rep, o.json);
    }
  rep.targets = targets;
  finish_report(rep, threads, o.json, o.csv);
  print_targets(rep.targets);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return print_run_summary(rep, "strata bench structured", o.json, o.csv, secs);
}

}  // namespace strata::app
