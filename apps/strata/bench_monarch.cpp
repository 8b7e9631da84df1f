// apps/strata/bench_monarch.cpp: `strata bench monarch`: MonarchAttention (strata/monarch.h, stable
// mode, fp32, non-causal) against exact attention in the same process: torch SDPA and our dense
// kernel (strata.flash).
//
// Sweep: N in {1024, 2048, 4096, 8192, 16384} (--quick: 1024, 4096, 16384; --smoke: 256), 7 rounds
// per group (--quick 5, --smoke 3), batch 1, 12 heads, D = Dv = 64, steps T in {1, 2}, block size
// B = floor(sqrt(N)) (the paper's benchmarks), M = ceil(N / B) blocks. Per N two groups, each
// timed by the bench harness (bench_harness.h: one warm-up, rounds in ABBA order over ours for
// T = 1 and T = 2 and the two peers; the check reads what the last timed calls wrote):
//   fwd  ours = strata::torch::monarch_attention_forward (no saved state); peers: strata.flash forward, SDPA
//   bwd  the backward op alone: ours = strata::torch::monarch_attention_backward given the forward's saved state
//        (T = 2; nothing to save for T = 1); strata.flash attention_backward from its (o, lse);
//        SDPA: torch::autograd::grad on a graph built once (retain_graph)
// Ours goes through the LibTorch layer, as a user's call and the strata.flash peer do, so its outputs
// are allocated as theirs are (before 2026-12-05: the core into a plain at::empty). No timed call
// faults its output in: the CLI keeps freed memory and warms the heap first (process_memory.h);
// before, faulting a 12 MB output in added 2-22 ms to a 10 ms Monarch call (docs/results.md).
// Correctness (Monarch is an approximation, so against Monarch references), on the outputs of
// ours' last timed call for each T: ours vs the same algorithm written with torch ops in float64
// (the peer monarch_attention, strata/torch/peers.h, all heads; its autograd for dq, dk, dv) and,
// for N <= 4096 (backward: N <= 2048), vs strata::reference (double, materialises N x N) on head 0.
// fp32 tolerance 1e-4 on max|diff| / max|ref|; a row over it prints its per-head errors. (The torch-
// ops check ran in fp32 before: 3 of ~500 smoke runs beside a busy process on Xeons failed it at
// 2.0e-4; in the one that printed both checks, ours matched the double reference on head 0 to
// 9e-7, and ours was bitwise the same in 3000 loaded calls: docs/results.md, threads.)
// Informational: ours vs exact softmax attention (SDPA) in max_rel_err of every row (and
// "rel_err_vs_exact_softmax").
// FLOPs: the core's counts (strata/monarch.h, strata/attention.h). Monarch forward:
// strata::monarch_attention_flops, 2 x P*D*[T*(2B + 2M) + B] MACs per (batch, head) for D = Dv,
// over the PADDED length P = M*B: the paper's N*D*[...] where B divides N (N = 256, 1024, 4096,
// 16384) and up to (P - N) / N more where it does not (N = 2048: P = 2070; N = 8192: P = 8280),
// because the kernel computes the padded blocks too. Dense: strata::attention_flops, 4*N^2*D.
// Backward 2.5x forward for both (docs/methods.md's convention). ideal_mac_ratio = dense / Monarch
// FLOPs; rows against a peer carry fraction_of_ideal = speedup / ideal_mac_ratio.
// --dtype bfloat16: a forward and a backward group per N on bf16 tensors: ours with the CPU's best bf16 engine
// (compute = amx_bf16, else avx512_bf16, as the dense kernel's auto; Monarch's own auto keeps fp32;
// fp32 where the CPU has no engine, as bench mlr, and a note says so) for each T, against the same
// call with compute = fp32, strata.flash and SDPA in bf16; each method's error against its double
// reference (head 0, N <= 4096, backward N <= 2048: Monarch's for ours, the dense one for the peers) printed and kept
// in the rows (extra). bf16 tolerance 2e-2 (the core's bf16 sweep's, tests/cpp/core_monarch_test.cpp).
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <fmt/core.h>
#include <fmt/ranges.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "attention_runner.h"
#include "bench_common.h"
#include "commands.h"
#include "session.h"
#include "strata/error.h"
#include "strata/monarch.h"
#include "strata/torch/attention.h"
#include "strata/torch/monarch.h"
#include "strata/torch/peers.h"

namespace strata::app {
namespace {

constexpr int64_t kHeadDim = 64;
constexpr int64_t kRefMaxN = 4096;     // strata::reference forward (N x N doubles) up to here
constexpr int64_t kRefBwdMaxN = 2048;  // and its backward
constexpr double kGroupBudgetS = 20.0;
constexpr double kTolerance = 1e-4;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

TensorView tv(const at::Tensor& t, const char* arg) { return strata::torch::view_of(t, "bench monarch", arg); }

// The LibTorch layer's arguments for the core options mo (this bench's: steps, BHSD, compute).
strata::torch::MonarchArgs torch_args(const MonarchOptions& mo) {
  strata::torch::MonarchArgs a;
  a.num_steps = mo.num_steps;
  a.layout = "bhsd";
  a.compute = compute_name(mo.compute);
  return a;
}

// A row of ours (T steps, block size B) against `peer`: its case, method, shape and dtype (the rest
// is its group's).
BenchRow monarch_row(bool backward, const std::string& peer, int64_t heads, int64_t N, int64_t T, int64_t B,
                     const char* dtype) {
  BenchRow row;
  row.case_name = backward ? "bwd" : "fwd";
  row.method = "strata.monarch";
  row.peer = peer;
  row.shape = {{"batch", 1}, {"heads", heads}, {"seq", N}, {"head_dim", kHeadDim}, {"steps", T}};
  row.shape_label = fmt::format("H={} N={} T={} B={}", heads, N, T, B);
  row.dtype = dtype;
  return row;
}

// The test hook over ours' outputs of the last timed call (per T: o, or dq, dk, dv): perturbs the
// named one for every T (bench_harness.h's CorruptFn; false for a name ours does not output).
CorruptFn corrupt_ours(bool backward, std::vector<std::vector<at::Tensor>>& outs) {
  const std::vector<std::string> names =
      backward ? std::vector<std::string>{"dq", "dk", "dv"} : std::vector<std::string>{"o"};
  return [names, &outs](const std::string& name) {
    const auto it = std::find(names.begin(), names.end(), name);
    if (it == names.end()) return false;
    for (auto& o : outs) perturb_for_test(o[size_t(it - names.begin())]);
    return true;
  };
}

// One N: the forward group and the backward group (see the file comment).
void run_n(BenchReport& rep, int64_t heads, int64_t N, const std::vector<int64_t>& steps_list,
           const TimingPlan& plan) {
  at::manual_seed(20250518);
  const std::vector<int64_t> sizes{1, heads, N, kHeadDim};  // batch x heads x N x d (BHSD)
  const at::Tensor q = at::randn(sizes), k = at::randn(sizes), v = at::randn(sizes), dout = at::randn(sizes);
  strata::torch::AttentionArgs dense_args;
  dense_args.layout = "bhsd";
  const size_t S = steps_list.size();
  std::vector<MonarchOptions> opts(S);
  std::vector<strata::torch::MonarchArgs> args(S);  // the same, for the LibTorch calls (made once, not per call)
  for (size_t s = 0; s < S; ++s) {
    opts[s].num_steps = steps_list[s];
    opts[s].layout = Layout::BHSD;
    args[s] = torch_args(opts[s]);
  }
  const MonarchGeometry g = monarch_geometry(N, opts[0]);
  AttnDims dims;  // of every call: batch 1, self-attention, D = Dv
  dims.batch = 1;
  dims.seqlen_q = dims.seqlen_k = N;
  dims.heads_q = dims.heads_kv = heads;
  dims.head_dim = dims.head_dim_v = kHeadDim;
  const AttentionFlops dense = attention_flops(dims, /*causal=*/false);

  const at::Tensor q64 = q.to(at::kDouble), k64 = k.to(at::kDouble), v64 = v.to(at::kDouble);
  // Per head: max |ours - ref| / max |ref| (over all heads), for a row that failed (a wrong head or
  // a wrong everything tells a race from a numerical error apart).
  const auto print_head_errors = [&](const char* what, const at::Tensor& ours, const at::Tensor& ref) {
    const double mx = ref.abs().max().item<double>();
    std::string line;
    for (int64_t h = 0; h < heads; ++h) {
      const at::Tensor d = ours.select(1, h).to(at::kDouble) - ref.select(1, h);
      line += fmt::format(" {:.1e}", d.abs().max().item<double>() / mx);
    }
    fmt::print("  {} vs torch ops (f64) per head:{}\n", what, line);
  };
  // Checks of ours (per T) on the outputs of its last timed call. `ours_out` = o or (dq, dk, dv).
  // err_ops: against the torch-ops peer (all heads); err_ref: against the double reference (head 0;
  // NaN where N is above its limit). A row's error is the larger.
  const auto check = [&](size_t s, const std::vector<at::Tensor>& ours_out, bool backward, double* err_ops,
                         double* err_ref, std::string* against) {
    const int64_t T = steps_list[s];
    *against = "peers::monarch_attention in torch ops, float64 (all heads)";
    if (!backward) {
      at::NoGradGuard no_grad;
      const at::Tensor o = strata::torch::peers::monarch_attention(q64, k64, v64, T, g.block_size);
      *err_ops = max_rel_err(ours_out[0], o);
      if (*err_ops >= kTolerance) print_head_errors("o", ours_out[0], o);
    } else {
      const at::Tensor qg = q64.detach().requires_grad_(true), kg = k64.detach().requires_grad_(true),
                       vg = v64.detach().requires_grad_(true);
      const at::Tensor o = strata::torch::peers::monarch_attention(qg, kg, vg, T, g.block_size);
      const auto gr = ::torch::autograd::grad({o}, {qg, kg, vg}, {dout.to(at::kDouble)});
      *err_ops = 0;
      const char* names[3] = {"dq", "dk", "dv"};
      for (int i = 0; i < 3; ++i) {
        const double e = max_rel_err(ours_out[size_t(i)], gr[size_t(i)]);
        if (e >= kTolerance) print_head_errors(names[i], ours_out[size_t(i)], gr[size_t(i)]);
        *err_ops = std::max(*err_ops, e);
      }
    }
    *err_ref = kNaN;
    if (N > (backward ? kRefBwdMaxN : kRefMaxN)) return;
    *against += " and strata::reference f64 (head 0)";
    const at::Tensor q0 = q.narrow(1, 0, 1), k0 = k.narrow(1, 0, 1), v0 = v.narrow(1, 0, 1);
    if (!backward) {
      std::vector<double> ro(size_t(N * kHeadDim));
      reference::monarch_attention_forward(tv(q0, "q"), tv(k0, "k"), tv(v0, "v"), opts[s], ro.data());
      *err_ref = max_rel_err(head0_bshd(ours_out[0]), reference_tensor(ro, {1, N, 1, kHeadDim}));
    } else {
      std::vector<double> rdq(size_t(N * kHeadDim)), rdk(rdq.size()), rdv(rdq.size());
      reference::monarch_attention_backward(tv(q0, "q"), tv(k0, "k"), tv(v0, "v"),
                                            tv(dout.narrow(1, 0, 1), "dout"), opts[s], rdq.data(), rdk.data(),
                                            rdv.data());
      std::vector<double>* r[3] = {&rdq, &rdk, &rdv};
      *err_ref = 0;
      for (int i = 0; i < 3; ++i)
        *err_ref = std::max(*err_ref,
                            max_rel_err(head0_bshd(ours_out[size_t(i)]), reference_tensor(*r[i], {1, N, 1, kHeadDim})));
    }
  };

  for (const bool backward : {false, true}) {
    // Methods: ours for each T, then the peers.
    std::vector<std::vector<at::Tensor>> ours_out(S);
    std::vector<at::Tensor> states(S);
    at::Tensor o_dense, lse_dense, o_sdpa;
    std::vector<at::Tensor> g_dense, g_sdpa;
    std::vector<BenchMethod> fns;  // ours for each T, then strata.flash, torch.sdpa
    at::Tensor qg, kg, vg, o_graph;
    if (backward) {
      std::tie(o_dense, lse_dense) = strata::torch::attention_forward(q, k, v, dense_args);
      qg = q.detach().requires_grad_(true);
      kg = k.detach().requires_grad_(true);
      vg = v.detach().requires_grad_(true);
      o_graph = at::scaled_dot_product_attention(qg, kg, vg);
      for (size_t s = 0; s < S; ++s)
        if (steps_list[s] >= 2) states[s] = std::get<1>(strata::torch::monarch_attention_forward(q, k, v, args[s]));
    }
    for (size_t s = 0; s < S; ++s) {
      const std::string name = fmt::format("strata.monarch T={}", steps_list[s]);
      if (!backward) {
        fns.push_back({name, [&, s] {
          ours_out[s] = {
              std::get<0>(strata::torch::monarch_attention_forward(q, k, v, args[s], /*save_state=*/false))};
        }});
      } else {
        fns.push_back({name, [&, s] {
          const auto [dq, dk, dv] = strata::torch::monarch_attention_backward(q, k, v, states[s], dout, args[s]);
          ours_out[s] = {dq, dk, dv};
        }});
      }
    }
    if (!backward) {
      fns.push_back({"strata.flash", [&] {
                       std::tie(o_dense, lse_dense) = strata::torch::attention_forward(q, k, v, dense_args);
                     }});
      fns.push_back({"torch.sdpa", [&] { o_sdpa = at::scaled_dot_product_attention(q, k, v); }});
    } else {
      fns.push_back({"strata.flash", [&] {
                       const auto [a, b, c] =
                           strata::torch::attention_backward(q, k, v, o_dense, lse_dense, dout, dense_args);
                       g_dense = {a, b, c};
                     }});
      fns.push_back({"torch.sdpa", [&] {
                       g_sdpa = ::torch::autograd::grad({o_graph}, {qg, kg, vg}, {dout}, /*retain_graph=*/true);
                     }});
    }
    const CorruptFn corrupt = corrupt_ours(backward, ours_out);
    std::vector<double> err_ops(S), err_ref(S);
    std::vector<std::string> against(S);
    std::vector<double> exact_err(S);
    const auto check_all = [&] {
      for (size_t s = 0; s < S; ++s) {
        check(s, ours_out[s], backward, &err_ops[s], &err_ref[s], &against[s]);
        exact_err[s] = 0;
        if (!backward) exact_err[s] = max_rel_err(ours_out[s][0], o_sdpa);
        for (size_t i = 0; backward && i < 3; ++i)
          exact_err[s] = std::max(exact_err[s], max_rel_err(ours_out[s][i], g_sdpa[i]));
      }
    };
    const auto secs = run_timed_group(fns, plan, check_all, corrupt).secs;

    const char* peers[] = {"strata.flash", "torch.sdpa"};
    for (size_t s = 0; s < S; ++s) {
      const int64_t T = steps_list[s];
      const double fwd = monarch_attention_flops(dims, opts[s]);
      const double mult = backward ? AttentionFlops::kBackwardFlops : 1.0;  // the dense convention, for both
      const double flops = mult * fwd;
      const double ideal = dense.forward / fwd;
      for (size_t p = 0; p < 2; ++p) {
        BenchRow row = monarch_row(backward, peers[p], heads, N, T, g.block_size, "float32");
        row.tolerance = kTolerance;
        row.checked_against = against[s];
        row.ref_max_rel_err = std::isnan(err_ref[s]) ? err_ops[s] : std::max(err_ops[s], err_ref[s]);
        row.correct = row.ref_max_rel_err < kTolerance;
        row.max_rel_err = exact_err[s];  // the peer computes exact softmax attention
        row.flops = flops;
        row.peer_flops = backward ? dense.backward : dense.forward;
        set_row_times(row, secs[s], secs[S + p]);
        row.extra = {{"block_size", g.block_size},          {"num_blocks", g.num_blocks},
                     {"padded_len", g.padded_len},  // the length the FLOPs count (see the file comment)
                     {"ideal_mac_ratio", ideal},            {"fraction_of_ideal", row.speedup.median / ideal},
                     {"rel_err_vs_exact_softmax", exact_err[s]},
                     {"rel_err_vs_torch_ops", err_ops[s]},  // the two checks apart (null: not run)
                     {"rel_err_vs_reference_head0", err_ref[s]}};
        rep.rows.push_back(std::move(row));
        print_peer_table_row(rep.rows.back(), rep.peak.all_gflops,
                             fmt::format("ideal {:.1f}x, {:.2f} of it; vs exact {:.1e}", ideal,
                                         rep.rows.back().speedup.median / ideal, exact_err[s]));
        if (!rep.rows.back().correct)
          fmt::print("  the check apart: vs torch ops (all heads) {:.2e}, vs strata::reference f64 (head 0) {:.2e}\n",
                     err_ops[s], err_ref[s]);
      }
    }
  }
}

// The bf16 groups of one N, forward then backward (--dtype bfloat16; see the file comment).
void run_n_bf16(BenchReport& rep, int64_t heads, int64_t N, const std::vector<int64_t>& steps_list,
                const TimingPlan& plan, Compute engine) {
  at::manual_seed(20250518);
  const std::vector<int64_t> sizes{1, heads, N, kHeadDim};  // batch x heads x N x d (BHSD)
  const at::Tensor q = at::randn(sizes).to(at::kBFloat16), k = at::randn(sizes).to(at::kBFloat16),
                   v = at::randn(sizes).to(at::kBFloat16), dout = at::randn(sizes).to(at::kBFloat16);
  strata::torch::AttentionArgs dense_args;
  dense_args.layout = "bhsd";
  const size_t S = steps_list.size();
  std::vector<MonarchOptions> opts(S), opts32(S);
  for (size_t s = 0; s < S; ++s) {
    opts[s].num_steps = steps_list[s];
    opts[s].layout = Layout::BHSD;
    opts[s].compute = engine;
    opts32[s] = opts[s];
    opts32[s].compute = Compute::fp32;
  }
  const MonarchGeometry g = monarch_geometry(N, opts[0]);
  AttnDims dims;
  dims.batch = 1;
  dims.seqlen_q = dims.seqlen_k = N;
  dims.heads_q = dims.heads_kv = heads;
  dims.head_dim = dims.head_dim_v = kHeadDim;
  const AttentionFlops dense = attention_flops(dims, /*causal=*/false);
  // Through the LibTorch layer, as a user calls it (its output allocation included, as the peers')
  std::vector<strata::torch::MonarchArgs> args(S), args32(S);  // made once, not per timed call
  for (size_t s = 0; s < S; ++s) {
    args[s] = torch_args(opts[s]);
    args32[s] = torch_args(opts32[s]);
  }
  const at::Tensor q0 = q.narrow(1, 0, 1), k0 = k.narrow(1, 0, 1), v0 = v.narrow(1, 0, 1);

  for (const bool backward : {false, true}) {
    const bool with_ref = N <= (backward ? kRefBwdMaxN : kRefMaxN);
    // outputs of the last timed call: o, or dq, dk, dv (the dense peers: o first, then the gradients)
    std::vector<std::vector<at::Tensor>> out(S), out32(S);
    std::vector<at::Tensor> states(S), states32(S);
    std::vector<at::Tensor> out_dense, out_sdpa;
    at::Tensor o_dense, lse_dense, qg, kg, vg, o_graph;
    if (backward) {  // what the backward calls read: the forwards' outputs, states, SDPA's graph
      std::tie(o_dense, lse_dense) = strata::torch::attention_forward(q, k, v, dense_args);
      qg = q.detach().requires_grad_(true);
      kg = k.detach().requires_grad_(true);
      vg = v.detach().requires_grad_(true);
      o_graph = at::scaled_dot_product_attention(qg, kg, vg);
      for (size_t s = 0; s < S; ++s) {
        if (steps_list[s] < 2) continue;
        states[s] = std::get<1>(strata::torch::monarch_attention_forward(q, k, v, args[s]));
        states32[s] = std::get<1>(strata::torch::monarch_attention_forward(q, k, v, args32[s]));
      }
    }
    const auto monarch = [&](const strata::torch::MonarchArgs& a, const at::Tensor& state) {
      if (!backward)
        return std::vector<at::Tensor>{std::get<0>(strata::torch::monarch_attention_forward(q, k, v, a, false))};
      const auto [dq, dk, dv] = strata::torch::monarch_attention_backward(q, k, v, state, dout, a);
      return std::vector<at::Tensor>{dq, dk, dv};
    };
    std::vector<BenchMethod> fns;  // ours for each T, ours compute = fp32 for each T, strata.flash, torch.sdpa
    for (size_t s = 0; s < S; ++s)
      fns.push_back(
          {fmt::format("strata.monarch T={}", steps_list[s]), [&, s] { out[s] = monarch(args[s], states[s]); }});
    for (size_t s = 0; s < S; ++s)
      fns.push_back({fmt::format("strata.monarch T={} compute=fp32", steps_list[s]),
                     [&, s] { out32[s] = monarch(args32[s], states32[s]); }});
    if (!backward) {
      fns.push_back({"strata.flash", [&] {
                       out_dense = {std::get<0>(strata::torch::attention_forward(q, k, v, dense_args))};
                     }});
      fns.push_back({"torch.sdpa", [&] { out_sdpa = {at::scaled_dot_product_attention(q, k, v)}; }});
    } else {
      fns.push_back({"strata.flash", [&] {
                       const auto [a, b, c] =
                           strata::torch::attention_backward(q, k, v, o_dense, lse_dense, dout, dense_args);
                       out_dense = {o_dense, a, b, c};
                     }});
      fns.push_back({"torch.sdpa", [&] {
                       const auto gr = ::torch::autograd::grad({o_graph}, {qg, kg, vg}, {dout}, /*retain_graph=*/true);
                       out_sdpa = {o_graph, gr[0], gr[1], gr[2]};
                     }});
    }

    // Errors against the double references (head 0), NaN above the reference's limit.
    std::vector<double> err(S, kNaN), err32(S, kNaN);
    double err_dense = kNaN, err_sdpa = kNaN;
    const auto monarch_err = [&](const MonarchOptions& mo, const std::vector<at::Tensor>& got) {
      if (!backward) {
        std::vector<double> ro(size_t(N * kHeadDim));
        reference::monarch_attention_forward(tv(q0, "q"), tv(k0, "k"), tv(v0, "v"), mo, ro.data());
        return max_rel_err(head0_bshd(got[0]), reference_tensor(ro, {1, N, 1, kHeadDim}));
      }
      std::vector<double> r[3];
      for (auto& x : r) x.resize(size_t(N * kHeadDim));
      reference::monarch_attention_backward(tv(q0, "q"), tv(k0, "k"), tv(v0, "v"), tv(dout.narrow(1, 0, 1), "dout"), mo,
                                            r[0].data(), r[1].data(), r[2].data());
      double e = 0;
      for (int i = 0; i < 3; ++i)
        e = std::max(e, max_rel_err(head0_bshd(got[size_t(i)]), reference_tensor(r[i], {1, N, 1, kHeadDim})));
      return e;
    };
    const auto dense_err = [&](const std::vector<at::Tensor>& got) {
      std::vector<const at::Tensor*> ptrs;
      for (const at::Tensor& t : got) ptrs.push_back(&t);
      return dense_head0_ref_err(q, k, v, backward ? dout : at::Tensor(), false, ptrs);
    };
    const auto check_all = [&] {
      if (!with_ref) return;
      for (size_t s = 0; s < S; ++s) {
        err[s] = monarch_err(opts[s], out[s]);
        err32[s] = monarch_err(opts32[s], out32[s]);
      }
      err_dense = dense_err(out_dense);
      err_sdpa = dense_err(out_sdpa);
    };
    const CorruptFn corrupt = corrupt_ours(backward, out);
    const auto secs = run_timed_group(fns, plan, check_all, corrupt).secs;

    const double tol = 2e-2;
    const double mult = backward ? AttentionFlops::kBackwardFlops : 1.0;  // the dense convention, for both
    for (size_t s = 0; s < S; ++s) {
      const int64_t T = steps_list[s];
      const double fwd = monarch_attention_flops(dims, opts[s]);
      const double ideal = dense.forward / fwd;
      const std::string peers[] = {fmt::format("strata.monarch T={} compute=fp32", T), "strata.flash", "torch.sdpa"};
      const std::vector<double>* peer_secs[] = {&secs[S + s], &secs[2 * S], &secs[2 * S + 1]};
      const double peer_err[] = {err32[s], err_dense, err_sdpa};
      for (size_t p = 0; p < 3; ++p) {
        BenchRow row = monarch_row(backward, peers[p], heads, N, T, g.block_size, "bfloat16");
        row.tolerance = tol;
        row.checked_against = with_ref ? "strata::reference f64 (head 0)" : "unchecked (N above the reference's limit)";
        row.ref_max_rel_err = err[s];
        row.correct = with_ref ? err[s] < tol : true;
        row.max_rel_err = peer_err[p];  // the peer's own error against its double reference
        row.flops = mult * fwd;
        row.peer_flops = p == 0 ? mult * fwd : (backward ? dense.backward : dense.forward);
        set_row_times(row, secs[s], *peer_secs[p]);
        row.extra = {{"compute", compute_name(engine)},
                     {"block_size", g.block_size},
                     {"num_blocks", g.num_blocks},
                     {"ideal_mac_ratio", ideal},
                     {"peer_ref64_max_rel_err", peer_err[p]}};
        if (p > 0) row.extra["fraction_of_ideal"] = row.speedup.median / ideal;
        rep.rows.push_back(std::move(row));
        const double frac = rep.rows.back().speedup.median / ideal;
        print_peer_table_row(rep.rows.back(), rep.peak.all_gflops,
                             p == 0 ? std::string("same call, fp32 products")
                                    : fmt::format("ideal {:.1f}x, {:.2f} of it", ideal, frac));
      }
      fmt::print("  compute {}; err vs double (head 0): ours {:.1e}, ours compute=fp32 {:.1e}, strata.flash bf16 "
                 "{:.1e}, torch.sdpa bf16 {:.1e}\n",
                 compute_name(engine), err[s], err32[s], err_dense, err_sdpa);
    }
  }
}

}  // namespace

CLI::App* add_bench_monarch(CLI::App& bench, BenchMonarchOptions& o) {
  CLI::App* cmd = bench.add_subcommand(
      "monarch",
      "MonarchAttention (fp32, T = 1, 2 steps, B = floor(sqrt(N))) vs exact attention: torch SDPA\n"
      "and our dense kernel; forward and backward");
  cmd->add_flag("--quick", o.quick, "N 1024/4096/16384");
  cmd->add_flag("--smoke", o.smoke, "N = 256 only, 3 rounds (for tests)");
  cmd->add_option("--seq", o.seq, "keep only these N (repeatable)")->type_name("N");
  cmd->add_option("--steps", o.steps, "keep only these step counts T (repeatable; default 1 and 2)")
      ->check(CLI::Range(1, 16));
  cmd->add_option("--heads", o.heads, "heads (default 12)")->check(CLI::Range(1, 1024));
  cmd->add_option("--dtype", o.dtype,
                  "float32 (default: forward and backward) or bfloat16 (forward and backward with bf16 products,\n"
                  "opt in, against themselves in fp32 compute, strata.flash and SDPA in bf16)")
      ->check(CLI::IsMember({"float32", "bfloat16"}));
  add_bench_output_options(cmd, o.json, o.csv, o.threads, o.reps, "group",
                           "timed rounds per group (ABBA order) after one warm-up (default 7, 5 with --quick,\n"
                           "3 with --smoke; more rounds are cut back on groups over 20 s, never under those)");
  return cmd;
}

int run_bench_monarch(const BenchMonarchOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<int64_t> seqs = o.smoke ? std::vector<int64_t>{256}
                                    : o.quick ? std::vector<int64_t>{1024, 4096, 16384}
                                              : std::vector<int64_t>{1024, 2048, 4096, 8192, 16384};
  std::vector<int64_t> sel;
  for (int64_t n : seqs)
    if (o.seq.empty() || std::find(o.seq.begin(), o.seq.end(), n) != o.seq.end()) sel.push_back(n);
  std::vector<int64_t> steps = o.steps.empty() ? std::vector<int64_t>{1, 2} : o.steps;
  std::sort(steps.begin(), steps.end());
  steps.erase(std::unique(steps.begin(), steps.end()), steps.end());
  STRATA_CHECK(!sel.empty(), "strata bench monarch: argument '--seq': expected a selection that keeps at least "
               "one N of the ", o.smoke ? "smoke" : o.quick ? "quick" : "full", " sweep, got none");

  STRATA_CHECK(o.dtype == "float32" || o.dtype == "bfloat16", "strata bench monarch: argument '--dtype': expected "
               "float32 or bfloat16, got '", o.dtype, "'");
  const bool bf16 = o.dtype == "bfloat16";
  // the best engine here (what the dense and MLR kernels' auto takes); Monarch's auto keeps fp32
  const Compute engine = resolve_compute("strata bench monarch", Compute::automatic, true);
  if (bf16 && engine == Compute::fp32)  // (as bench mlr: the group still times bf16 inputs against the bf16 peers)
    fmt::print("note: auto computes in fp32 here (no bf16 engine at this ISA, or vdpbf16ps no faster than fp32 "
               "FMAs: strata info): ours computes in fp32, so its row against 'compute=fp32' times the same call "
               "twice\n");
  const int threads = configure_threads(o.threads);
  fmt::print("measuring the fp32 FMA peak on {} threads...\n", threads);
  std::fflush(stdout);
  BenchReport rep = new_report("monarch", threads);
  print_preamble(rep);
  const TimingPlan plan = bench_timing_plan(o.reps, o.quick, o.smoke, kGroupBudgetS);
  fmt::print("N: {}; T: {}; ours = strata.monarch (stable mode, layout bhsd, fp32), {} heads, D = {}, "
             "B = floor(sqrt(N)); peers: strata.flash and torch.sdpa (exact, non-causal); {} timed rounds per "
             "group (ABBA order); Monarch FLOPs over the padded length M*B\n",
             fmt::join(sel, ", "), fmt::join(steps, ", "), o.heads, kHeadDim, plan.reps);
  print_peer_table_header();
  for (int64_t n : sel) {
    if (bf16) {
      run_n_bf16(rep, o.heads, n, steps, plan, engine);
    } else {
      run_n(rep, o.heads, n, steps, plan);
    }
    if (!o.json.empty()) write_json(rep, o.json);
  }
  const auto speedup_at = [&](int64_t n) -> std::optional<double> {
    for (const BenchRow& r : rep.rows)
      if (r.case_name == "fwd" && r.peer == "torch.sdpa" && r.shape.value("seq", int64_t(0)) == n &&
          r.shape.value("steps", int64_t(0)) == 1)
        return r.speedup.median;
    return std::nullopt;
  };
  if (!bf16) {  // (the targets are the fp32 rows')
    rep.targets.push_back({"fwd T=1 N=4096: speedup vs torch.sdpa", 10.0, speedup_at(4096)});
    rep.targets.push_back({"fwd T=1 N=16384: speedup vs torch.sdpa", 20.0, speedup_at(16384)});
  }
  finish_report(rep, threads, o.json, o.csv);
  print_targets(rep.targets);

  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return print_run_summary(rep, "strata bench monarch", o.json, o.csv, secs);
}

}  // namespace strata::app
