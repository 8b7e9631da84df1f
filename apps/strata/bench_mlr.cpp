// apps/strata/bench_mlr.cpp: `strata bench mlr`: MLR attention (strata/mlr.h, causal, fp32) against
// its peers in the same process: our dense causal kernel (strata.flash), torch SDPA causal, and the
// reference code's construction written with torch ops (torch.mlr_blockwise: the peer
// mlr_blockwise_attention, strata/torch/peers.h); then decoding with the MLR KV cache
// (strata/mlr_kv_cache.h) against dense decoding.
//
// Sweep: T in {1024, 2048, 4096, 8192, 16384} (--quick: 1024, 4096, 8192; --smoke: 256), 7 rounds
// per group (--quick 5, --smoke 3), batch 1, 8 heads, head dim 64 (= d_v), splits 8x8,
// 32|8|6|4|4|4|4|2 (the reference code's LM split) and 16x4, default blocks (b_l = T / 2^(l-1)).
// Per (T, split) two groups, each timed by the
// bench harness (bench_harness.h: one warm-up, then rounds in ABBA order: ours, peer 1, peer 2, ...,
// then ..., peer 2, peer 1, ours; the check reads what the last timed calls wrote):
//   fwd causal  ours = mlr_attention_forward (o + lse); peers: strata.flash forward, SDPA forward,
//               torch.mlr_blockwise forward (no autograd graph; T <= --ref-max-seq, 4096)
//   bwd causal  the backward op alone, given the forward's saved outputs: ours =
//               mlr_attention_backward from (o, lse); strata.flash attention_backward from its
//               (o, lse); SDPA and torch.mlr_blockwise: torch::autograd::grad on a graph built
//               once (retain_graph). torch.mlr_blockwise's backward for T <= --ref-bwd-max-seq
//               (4096): each of its per-block slice copies (255 for 8 levels) is an autograd
//               CopySlices node that copies the whole T x T x heads gradient (about 80 s per
//               call at T = 4096 on 2 busy cores).
// torch.mlr_blockwise calls that take over 5 s are timed once (their warm-up, whose outputs are the
// ones checked; rows say peer_timed_once); every other method is timed in every round.
// Correctness, on the outputs of ours' last timed call: vs strata::reference (double) on all of
// head 0 (every query: o and lse of the forward; dq, dk, dv of the backward), and where
// torch.mlr_blockwise runs also vs it on the whole problem (o; dq, dk, dv through autograd). fp32
// tolerance 1e-4 on max|diff| / max|ref| (see kTolerance).
// FLOPs (docs/methods.md): forward = strata::mlr_attention_flops (scores 2*sum of shared-prefix
// lengths over allowed pairs, + 2*pairs*d_v), the dense peers' = its dense_total. Backward =
// 3x the score part + 2x the P V part (recompute QK^T, dQ, dK; dP, dV), i.e. 2.5x the forward
// for dense attention with d = d_v. Rows carry flop_ratio_scores / flop_ratio_total (dense / ours)
// and, against the dense peers, speedup_over_flop_ratio.
// --dtype bfloat16: the forward and backward groups on bf16 tensors: ours with its default compute (bf16
// products where the CPU has AVX512-BF16 / AMX-BF16, strata/mlr.h) against the same call with
// compute = fp32, strata.flash and SDPA in bf16; each method's error against its double reference
// (head 0: the MLR one for ours, strata::reference's dense one for the dense peers)
// is printed under the group and kept in the rows (max_rel_err, extra.peer_ref64_max_rel_err);
// tolerance 2e-2. No decode, no targets (they are the fp32 rows').
// Decode (8x8, T = 8192; quick 8192; smoke 256): an MlrKvCache prefilled with T-1 tokens; a step =
// append token T-1 + attend (each timed step starts from a copy of the prefilled cache, copied
// untimed). Peers: dense decoding over a K/V cache of T tokens (the step writes slot T-1, then
// one query attends all T keys): strata.flash (seqlen_q = 1) and SDPA. Reported: tokens/s, key
// and value bytes of both caches, key-cache ratio. Decode steps use 10x the rounds (3 warm-ups);
// checked: the last timed step's o (all heads) vs the double reference's row T-1.
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
#include "strata/mlr_kv_cache.h"
#include "strata/mlr.h"
#include "strata/threading.h"
#include "strata/torch/attention.h"
#include "strata/torch/peers.h"

namespace strata::app {
namespace {

constexpr int64_t kHeadDim = 64;
constexpr int64_t kRefChunk = 256;      // query rows per call of the double reference (memory ~ 40 x chunk x T bytes)
constexpr double kGroupBudgetS = 20.0;  // timed seconds per group before rounds are cut
// fp32 on max|diff| / max|ref| against the double reference. Each output is a sum over up to T
// = 16384 keys (dk, dv: over as many queries) formed in tiles of 64 with fp32 accumulators and an
// online softmax, so the rounding error is bounded by about eps * (T / 64 + 64) = 6e-8 * 320 =
// 2e-5 (measured, head 0, 8x8: 1.6e-7 forward and 6.9e-6 backward at T = 16384); 1e-4 leaves 5x
// over that bound.
constexpr double kTolerance = 1e-4;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

struct Split {
  std::string name;
  std::vector<int64_t> ranks;  // r_1..r_L
};

std::vector<Split> all_splits() {
  return {{"8x8", std::vector<int64_t>(8, 8)},
          {"32|8|6|4|4|4|4|2", {32, 8, 6, 4, 4, 4, 4, 2}},
          {"16x4", std::vector<int64_t>(4, 16)}};
}

MlrOptions mlr_opts(const Split& s) {
  MlrOptions o;
  for (int64_t r : s.ranks) o.ranks[o.num_levels++] = r;
  o.causal = true;
  o.layout = Layout::BHSD;
  return o;
}

TensorView tv(const at::Tensor& t, const char* arg) { return strata::torch::view_of(t, "bench mlr", arg); }

// The double reference (strata::reference::mlr_attention_*) on all of head 0, BSHD order with
// one head: o, dq: T x d; lse: T; dk, dv: T x d. Computed in chunks of kRefChunk queries, each a
// bottom-right-aligned problem (queries [a, a+R) against keys [0, a+R), context fixed to the full
// problem's so the blocks are the same), which keeps memory at O(R T) per thread instead of
// O(T^2): forward rows are independent, and the backward's dk, dv are sums over the queries, so
// the chunks' dk, dv add up to the full head's. Chunks run on strata's pool, largest first.
struct Head0Ref {
  std::vector<double> o, lse, dq, dk, dv;
};

Head0Ref head0_reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& dout,
                         MlrOptions opt, bool backward) {
  const int64_t T = q.size(2), D = q.size(3), Dv = v.size(3);
  if (opt.context == 0) {  // mlr.h's default, made explicit: seqlen_k rounded up to 2^(L-1)
    const int64_t pow = int64_t(1) << (opt.num_levels - 1);
    opt.context = (T + pow - 1) / pow * pow;
  }
  Head0Ref r;
  const int nthreads = strata::get_num_threads();
  std::vector<std::vector<double>> dk(static_cast<size_t>(nthreads)), dv(static_cast<size_t>(nthreads));  // per thread
  if (!backward) {
    r.o.resize(size_t(T * Dv));
    r.lse.resize(size_t(T));
  } else {
    r.dq.resize(size_t(T * D));
    for (int t = 0; t < nthreads; ++t) {
      dk[size_t(t)].assign(size_t(T * D), 0.0);
      dv[size_t(t)].assign(size_t(T * Dv), 0.0);
    }
  }
  const int64_t chunks = (T + kRefChunk - 1) / kRefChunk;
  strata::parallel_for(chunks, 1, [&](int64_t begin, int64_t end, int tid) {
    std::vector<double> dkc, dvc;
    for (int64_t c = begin; c < end; ++c) {
      const int64_t a = (chunks - 1 - c) * kRefChunk, R = std::min(kRefChunk, T - a), nk = a + R;
      const at::Tensor qc = q.narrow(1, 0, 1).narrow(2, a, R), kc = k.narrow(1, 0, 1).narrow(2, 0, nk),
                       vc = v.narrow(1, 0, 1).narrow(2, 0, nk);
      if (!backward) {
        reference::mlr_attention_forward(tv(qc, "q"), tv(kc, "k"), tv(vc, "v"), opt, r.o.data() + a * Dv,
                                         r.lse.data() + a);
        continue;
      }
      dkc.resize(size_t(nk * D));
      dvc.resize(size_t(nk * Dv));
      reference::mlr_attention_backward(tv(qc, "q"), tv(kc, "k"), tv(vc, "v"),
                                        tv(dout.narrow(1, 0, 1).narrow(2, a, R), "dout"), opt,
                                        r.dq.data() + a * D, dkc.data(), dvc.data());
      for (size_t i = 0; i < dkc.size(); ++i) dk[size_t(tid)][i] += dkc[i];
      for (size_t i = 0; i < dvc.size(); ++i) dv[size_t(tid)][i] += dvc[i];
    }
  });
  if (backward) {
    r.dk = std::move(dk[0]);
    r.dv = std::move(dv[0]);
    for (int t = 1; t < nthreads; ++t) {
      for (size_t i = 0; i < r.dk.size(); ++i) r.dk[i] += dk[size_t(t)][i];
      for (size_t i = 0; i < r.dv.size(); ++i) r.dv[i] += dv[size_t(t)][i];
    }
  }
  return r;
}

// max_rel_err of ours' head 0 (o and lse; or dq, dk, dv) against head0_reference.
double head0_err(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& dout,
                 const MlrOptions& opt, const std::vector<const at::Tensor*>& ours, bool backward) {
  const int64_t T = q.size(2), D = q.size(3), Dv = v.size(3);
  Head0Ref r = head0_reference(q, k, v, dout, opt, backward);
  if (!backward)
    return std::max(max_rel_err(head0_bshd(*ours[0]), reference_tensor(r.o, {1, T, 1, Dv})),
                    max_rel_err(ours[1]->narrow(1, 0, 1), reference_tensor(r.lse, {1, 1, T})));
  return std::max({max_rel_err(head0_bshd(*ours[0]), reference_tensor(r.dq, {1, T, 1, D})),
                   max_rel_err(head0_bshd(*ours[1]), reference_tensor(r.dk, {1, T, 1, D})),
                   max_rel_err(head0_bshd(*ours[2]), reference_tensor(r.dv, {1, T, 1, Dv}))});
}

// One timed method of a group.
struct Method {
  std::string name;
  std::function<void()> run;
  bool dense = false;  // does dense attention (its FLOPs are the dense count)
};

struct Row0 {  // what every row of a group shares
  std::string case_name;
  std::string dtype = "float32";
  double tolerance = kTolerance;
  nlohmann::ordered_json shape;
  std::string label;
  double flops = 0, dense_flops = 0;
  double ratio_scores = 0, ratio_total = 0;
  std::string checked_against;
  double check_err = 0;
};

// Rows of one timed group: one per peer (methods[1..]), ours = methods[0].
void add_group_rows(BenchReport& rep, const Row0& r0, const std::vector<Method>& ms,
                    const std::vector<std::vector<double>>& secs, const std::vector<double>& peer_err) {
  for (size_t i = 1; i < ms.size(); ++i) {
    BenchRow row;
    row.case_name = r0.case_name;
    row.method = ms[0].name;
    row.peer = ms[i].name;
    row.shape = r0.shape;
    row.shape_label = r0.label;
    row.dtype = r0.dtype;
    row.tolerance = r0.tolerance;
    row.checked_against = r0.checked_against;
    row.ref_max_rel_err = r0.check_err;
    row.correct = r0.check_err < r0.tolerance;
    row.max_rel_err = peer_err[i];
    row.flops = r0.flops;
    if (ms[i].dense) row.peer_flops = r0.dense_flops;
    set_row_times(row, secs[0], secs[i]);
    row.extra = {{"flop_ratio_scores", r0.ratio_scores}, {"flop_ratio_total", r0.ratio_total}};
    std::string note;
    if (secs[i].size() != secs[0].size()) {
      row.extra["peer_timed_once"] = true;
      note = "peer timed once (its checked run): too slow to repeat";
    }
    if (ms[i].dense) {
      row.extra["speedup_over_flop_ratio"] = row.speedup.median / r0.ratio_total;
      note = fmt::format("FLOP ratio {:.2f} (scores {:.2f}); {:.2f} of it", r0.ratio_total, r0.ratio_scores,
                         row.speedup.median / r0.ratio_total);
    }
    rep.rows.push_back(std::move(row));
    print_peer_table_row(rep.rows.back(), rep.peak.all_gflops, note);
  }
}

// run_timed_group over the methods (seconds per method and round); only torch.mlr_blockwise may
// be timed once when slow.
std::vector<std::vector<double>> time_group(const std::vector<Method>& ms, const TimingPlan& plan,
                                            const std::function<void()>& check, const CorruptFn& corrupt) {
  std::vector<BenchMethod> bm;
  for (const Method& m : ms) bm.push_back({m.name, m.run, {}, m.name == "torch.mlr_blockwise"});
  return run_timed_group(bm, plan, check, corrupt).secs;
}

// Forward and backward groups of one (T, split): rows appended to rep (correct = the checks).
void run_config(BenchReport& rep, int64_t heads, int64_t T, const Split& split, const TimingPlan& plan,
                int64_t ref_max_seq, int64_t ref_bwd_max_seq) {
  const MlrOptions opt = mlr_opts(split);
  const bool with_ref = T <= ref_max_seq, with_ref_bwd = T <= ref_bwd_max_seq;
  at::manual_seed(20250907);
  const std::vector<int64_t> sizes{1, heads, T, kHeadDim};  // batch x heads x T x d (BHSD)
  const at::Tensor q = at::randn(sizes), k = at::randn(sizes), v = at::randn(sizes), dout = at::randn(sizes);
  strata::torch::AttentionArgs dense_args;
  dense_args.causal = true;
  dense_args.layout = "bhsd";

  const MlrFlops f = mlr_attention_flops(1, heads, T, T, kHeadDim, opt);
  Row0 r0;
  r0.shape = {{"batch", 1}, {"heads", heads}, {"seq", T}, {"head_dim", kHeadDim}, {"split", split.name}};
  r0.label = fmt::format("H={} T={} {}", heads, T, split.name);
  r0.ratio_scores = f.dense_scores / f.scores;
  const std::string head0_ref = "strata::reference f64 (head 0, all T queries)";

  // --- forward
  at::Tensor o, lse, o_dense, lse_dense, o_sdpa, o_ref;
  std::vector<Method> ms;
  ms.push_back({"strata.mlr", [&] {
                  o = at::empty(sizes);
                  lse = at::empty({1, heads, T});
                  mlr_attention_forward(tv(q, "q"), tv(k, "k"), tv(v, "v"), tv(o, "o"), tv(lse, "lse"), opt);
                }});
  ms.push_back({"strata.flash", [&] {
                  std::tie(o_dense, lse_dense) = strata::torch::attention_forward(q, k, v, dense_args);
                }, true});
  ms.push_back({"torch.sdpa", [&] { o_sdpa = at::scaled_dot_product_attention(q, k, v, {}, 0.0, true); }, true});
  if (with_ref)
    ms.push_back({"torch.mlr_blockwise", [&] {
                    at::NoGradGuard no_grad;
                    o_ref = strata::torch::peers::mlr_blockwise_attention(q, k, v, split.ranks);
                  }});
  std::vector<double> peer_err(ms.size(), kNaN);
  const auto fwd_check = [&] {
    r0.check_err = head0_err(q, k, v, dout, opt, {&o, &lse}, false);
    if (with_ref) {
      peer_err[3] = max_rel_err(o, o_ref);
      r0.check_err = std::max(r0.check_err, peer_err[3]);
    }
  };
  const auto fwd_secs = time_group(ms, plan, fwd_check, corrupt_outputs({{"o", &o}, {"lse", &lse}}));
  r0.case_name = "fwd causal";
  r0.checked_against = with_ref ? "torch.mlr_blockwise (all heads) and " + head0_ref + ": o, lse"
                                : head0_ref + ": o, lse";
  r0.flops = f.total;
  r0.dense_flops = f.dense_total;
  r0.ratio_total = f.dense_total / f.total;
  add_group_rows(rep, r0, ms, fwd_secs, peer_err);
  o_ref = at::Tensor();
  o_sdpa = at::Tensor();

  // --- backward (the op alone, from the forward's saved outputs)
  at::Tensor dq, dk, dv, ddq, ddk, ddv;
  std::vector<at::Tensor> g_ref;
  const at::Tensor qg = q.detach().requires_grad_(true), kg = k.detach().requires_grad_(true),
                   vg = v.detach().requires_grad_(true);
  const at::Tensor o_sdpa_graph = at::scaled_dot_product_attention(qg, kg, vg, {}, 0.0, true);
  at::Tensor o_ref_graph;
  if (with_ref_bwd) o_ref_graph = strata::torch::peers::mlr_blockwise_attention(qg, kg, vg, split.ranks);
  ms.clear();
  ms.push_back({"strata.mlr", [&] {
                  dq = at::empty(sizes);
                  dk = at::empty(sizes);
                  dv = at::empty(sizes);
                  mlr_attention_backward(tv(q, "q"), tv(k, "k"), tv(v, "v"), tv(o, "o"), tv(lse, "lse"),
                                         tv(dout, "dout"), tv(dq, "dq"), tv(dk, "dk"), tv(dv, "dv"), opt);
                }});
  ms.push_back({"strata.flash", [&] {
                  std::tie(ddq, ddk, ddv) =
                      strata::torch::attention_backward(q, k, v, o_dense, lse_dense, dout, dense_args);
                }, true});
  ms.push_back({"torch.sdpa", [&] {
                  (void)::torch::autograd::grad({o_sdpa_graph}, {qg, kg, vg}, {dout}, /*retain_graph=*/true);
                }, true});
  if (with_ref_bwd)
    ms.push_back({"torch.mlr_blockwise", [&] {
                    g_ref = ::torch::autograd::grad({o_ref_graph}, {qg, kg, vg}, {dout}, /*retain_graph=*/true);
                  }});
  std::fill(peer_err.begin(), peer_err.end(), kNaN);
  peer_err.resize(ms.size(), kNaN);
  const auto bwd_check = [&] {
    r0.check_err = head0_err(q, k, v, dout, opt, {&dq, &dk, &dv}, true);
    if (with_ref_bwd) {
      peer_err[3] = std::max({max_rel_err(dq, g_ref[0]), max_rel_err(dk, g_ref[1]), max_rel_err(dv, g_ref[2])});
      r0.check_err = std::max(r0.check_err, peer_err[3]);
    }
  };
  const auto bwd_secs =
      time_group(ms, plan, bwd_check, corrupt_outputs({{"dq", &dq}, {"dk", &dk}, {"dv", &dv}}));
  r0.case_name = "bwd causal";
  r0.checked_against = with_ref_bwd ? "torch.mlr_blockwise autograd (all heads) and " + head0_ref + ": dq, dk, dv"
                                    : head0_ref + ": dq, dk, dv";
  r0.flops = f.backward;
  r0.dense_flops = f.dense_backward;
  r0.ratio_total = r0.dense_flops / r0.flops;
  add_group_rows(rep, r0, ms, bwd_secs, peer_err);
}

// add_group_rows for a bf16 group (run_config_bf16's four methods): each row's max_rel_err is its
// peer's own error against its double reference, kept as extra.peer_ref64_max_rel_err too, beside
// the engine; the four errors printed under the group.
void add_bf16_group_rows(BenchReport& rep, const Row0& r0, const std::vector<Method>& ms,
                         const std::vector<std::vector<double>>& secs, const std::vector<double>& peer_err,
                         Compute engine) {
  const size_t first = rep.rows.size();
  add_group_rows(rep, r0, ms, secs, peer_err);
  for (size_t i = first; i < rep.rows.size(); ++i) {
    rep.rows[i].extra["compute"] = compute_name(engine);
    rep.rows[i].extra["peer_ref64_max_rel_err"] = peer_err[i - first + 1];
  }
  fmt::print("  compute {}; err vs double (head 0): ours {:.1e}, ours compute=fp32 {:.1e}, strata.flash bf16 {:.1e}, "
             "torch.sdpa bf16 {:.1e}\n",
             compute_name(engine), r0.check_err, peer_err[1], peer_err[2], peer_err[3]);
}

// The forward and backward groups of one (T, split) in bfloat16 (--dtype bfloat16): ours =
// strata.mlr with its default compute (bf16 products where the CPU has an engine, strata/mlr.h);
// peers: the same call with compute = fp32, strata.flash (its default compute) and SDPA, all on
// the same bf16 tensors.
// Checked: ours and ours in fp32 compute against the MLR double reference (head 0), the dense peers
// against the dense double reference (head 0), each error in the row's extra fields; bf16
// tolerance 2e-2 (attention_tolerance: outputs rounded to bf16 are 2^-9 = 2e-3 off alone).
void run_config_bf16(BenchReport& rep, int64_t heads, int64_t T, const Split& split, const TimingPlan& plan) {
  MlrOptions opt = mlr_opts(split);
  MlrOptions opt_fp32 = opt;
  opt_fp32.compute = Compute::fp32;
  at::manual_seed(20250907);
  const std::vector<int64_t> sizes{1, heads, T, kHeadDim};  // batch x heads x T x d (BHSD)
  const at::Tensor q = at::randn(sizes).to(at::kBFloat16), k = at::randn(sizes).to(at::kBFloat16),
                   v = at::randn(sizes).to(at::kBFloat16);
  strata::torch::AttentionArgs dense_args;
  dense_args.causal = true;
  dense_args.layout = "bhsd";
  const MlrFlops f = mlr_attention_flops(1, heads, T, T, kHeadDim, opt);
  AttnDims d;
  d.dtype = DType::bf16;
  d.batch = 1;
  d.seqlen_q = d.seqlen_k = T;
  d.heads_q = d.heads_kv = heads;
  d.head_dim = d.head_dim_v = kHeadDim;
  const Compute engine = mlr_attention_compute(d, opt);

  at::Tensor o, lse, o32, lse32, o_dense, o_sdpa;
  std::vector<Method> ms;
  ms.push_back({"strata.mlr", [&] {
                  o = at::empty(sizes, at::kBFloat16);
                  lse = at::empty({1, heads, T});
                  mlr_attention_forward(tv(q, "q"), tv(k, "k"), tv(v, "v"), tv(o, "o"), tv(lse, "lse"), opt);
                }});
  ms.push_back({"strata.mlr compute=fp32", [&] {
                  o32 = at::empty(sizes, at::kBFloat16);
                  lse32 = at::empty({1, heads, T});
                  mlr_attention_forward(tv(q, "q"), tv(k, "k"), tv(v, "v"), tv(o32, "o"), tv(lse32, "lse"), opt_fp32);
                }});
  ms.push_back({"strata.flash", [&] { o_dense = std::get<0>(strata::torch::attention_forward(q, k, v, dense_args)); },
                true});
  ms.push_back({"torch.sdpa", [&] { o_sdpa = at::scaled_dot_product_attention(q, k, v, {}, 0.0, true); }, true});
  Row0 r0;
  std::vector<double> peer_err(ms.size(), kNaN);
  const auto check = [&] {
    r0.check_err = head0_err(q, k, v, at::Tensor(), opt, {&o, &lse}, false);
    peer_err[1] = head0_err(q, k, v, at::Tensor(), opt, {&o32, &lse32}, false);
    peer_err[2] = dense_head0_ref_err(q, k, v, at::Tensor(), true, {&o_dense});
    peer_err[3] = dense_head0_ref_err(q, k, v, at::Tensor(), true, {&o_sdpa});
  };
  const auto secs = time_group(ms, plan, check, corrupt_outputs({{"o", &o}, {"lse", &lse}}));
  r0.case_name = "fwd causal";
  r0.dtype = "bfloat16";
  r0.tolerance = attention_tolerance(at::kBFloat16);
  r0.shape = {{"batch", 1}, {"heads", heads}, {"seq", T}, {"head_dim", kHeadDim}, {"split", split.name}};
  r0.label = fmt::format("H={} T={} {}", heads, T, split.name);
  r0.ratio_scores = f.dense_scores / f.scores;
  r0.checked_against = "strata::reference f64 (head 0, all T queries): o, lse";
  r0.flops = f.total;
  r0.dense_flops = f.dense_total;
  r0.ratio_total = f.dense_total / f.total;
  add_bf16_group_rows(rep, r0, ms, secs, peer_err, engine);

  // --- backward (the op alone, from each method's own forward outputs; SDPA: autograd on a graph
  // built once)
  const at::Tensor dout = at::randn(sizes).to(at::kBFloat16);
  at::Tensor dq, dk, dv, dq32, dk32, dv32, ddq, ddk, ddv, lse_dense;
  std::tie(o_dense, lse_dense) = strata::torch::attention_forward(q, k, v, dense_args);
  const at::Tensor qg = q.detach().requires_grad_(true), kg = k.detach().requires_grad_(true),
                   vg = v.detach().requires_grad_(true);
  const at::Tensor o_sdpa_graph = at::scaled_dot_product_attention(qg, kg, vg, {}, 0.0, true);
  const at::Tensor o_sdpa_detached = o_sdpa_graph.detach();
  std::vector<at::Tensor> g_sdpa;
  const auto mlr_bwd = [&](const MlrOptions& mo, const at::Tensor& out, const at::Tensor& l, at::Tensor& gq,
                           at::Tensor& gk, at::Tensor& gv) {
    gq = at::empty(sizes, at::kBFloat16);
    gk = at::empty(sizes, at::kBFloat16);
    gv = at::empty(sizes, at::kBFloat16);
    mlr_attention_backward(tv(q, "q"), tv(k, "k"), tv(v, "v"), tv(out, "o"), tv(l, "lse"), tv(dout, "dout"),
                           tv(gq, "dq"), tv(gk, "dk"), tv(gv, "dv"), mo);
  };
  ms.clear();
  ms.push_back({"strata.mlr", [&] { mlr_bwd(opt, o, lse, dq, dk, dv); }});
  ms.push_back({"strata.mlr compute=fp32", [&] { mlr_bwd(opt_fp32, o32, lse32, dq32, dk32, dv32); }});
  ms.push_back({"strata.flash", [&] {
                  std::tie(ddq, ddk, ddv) =
                      strata::torch::attention_backward(q, k, v, o_dense, lse_dense, dout, dense_args);
                }, true});
  ms.push_back({"torch.sdpa", [&] {
                  g_sdpa = ::torch::autograd::grad({o_sdpa_graph}, {qg, kg, vg}, {dout}, /*retain_graph=*/true);
                }, true});
  std::fill(peer_err.begin(), peer_err.end(), kNaN);
  const auto bwd_check = [&] {
    r0.check_err = head0_err(q, k, v, dout, opt, {&dq, &dk, &dv}, true);
    peer_err[1] = head0_err(q, k, v, dout, opt, {&dq32, &dk32, &dv32}, true);
    peer_err[2] = dense_head0_ref_err(q, k, v, dout, true, {&o_dense, &ddq, &ddk, &ddv});
    peer_err[3] = dense_head0_ref_err(q, k, v, dout, true, {&o_sdpa_detached, &g_sdpa[0], &g_sdpa[1], &g_sdpa[2]});
  };
  const auto bwd_secs = time_group(ms, plan, bwd_check, corrupt_outputs({{"dq", &dq}, {"dk", &dk}, {"dv", &dv}}));
  r0.case_name = "bwd causal";
  r0.checked_against = "strata::reference f64 (head 0, all T queries): dq, dk, dv";
  r0.flops = f.backward;
  r0.dense_flops = f.dense_backward;
  r0.ratio_total = r0.dense_flops / r0.flops;
  add_bf16_group_rows(rep, r0, ms, bwd_secs, peer_err, engine);
}

// Decode at cache length T with the 8x8 split (see the file comment).
void run_decode(BenchReport& rep, int64_t heads, int64_t T, const Split& split, const TimingPlan& plan) {
  MlrOptions opt = mlr_opts(split);
  opt.context = T;  // the model's context (the cache requires it): blocks T / 2^(l-1), as the forwards'
  STRATA_CHECK(T % (int64_t(1) << (split.ranks.size() - 1)) == 0, "bench mlr: decode length ", T,
               " is not a multiple of 2^(L-1)");
  at::manual_seed(20250908);
  const std::vector<int64_t> sizes{1, heads, T, kHeadDim};
  const at::Tensor q = at::randn(sizes), k = at::randn(sizes), v = at::randn(sizes);
  // The new token (position T-1): views, 1 x heads x 1 x d.
  const at::Tensor q1 = q.narrow(2, T - 1, 1), k1 = k.narrow(2, T - 1, 1), v1 = v.narrow(2, T - 1, 1);

  MlrKvCache base(1, heads, kHeadDim, T, opt);
  const int64_t prefill = T - 1, one = 1;
  base.append(tv(k.narrow(2, 0, T - 1), "k"), tv(v.narrow(2, 0, T - 1), "v"), &prefill);
  MlrKvCache work = base;
  const at::Tensor o = at::empty({1, heads, 1, kHeadDim}), lse = at::empty({1, heads, 1});
  // Dense caches of T tokens (slot T-1 rewritten by each step).
  const at::Tensor kc = k.clone(), vc = v.clone();
  strata::torch::AttentionArgs dense_args;  // one query over all keys: no mask needed
  dense_args.layout = "bhsd";
  at::Tensor o_dense, o_sdpa;

  const auto ours = [&] {
    work.append(tv(k1, "k"), tv(v1, "v"), &one);
    work.attend(tv(q1, "q"), tv(o, "o"), tv(lse, "lse"));
  };
  const auto dense = [&] {
    kc.narrow(2, T - 1, 1).copy_(k1);
    vc.narrow(2, T - 1, 1).copy_(v1);
    o_dense = std::get<0>(strata::torch::attention_forward(q1, kc, vc, dense_args));
  };
  const auto sdpa = [&] {
    kc.narrow(2, T - 1, 1).copy_(k1);
    vc.narrow(2, T - 1, 1).copy_(v1);
    o_sdpa = at::scaled_dot_product_attention(q1, kc, vc, {}, 0.0, false);
  };

  // 3 warm-up steps each, then 10x the group's rounds (a step is short); each call of ours starts
  // from a copy of the prefilled cache (untimed reset). The check: the last timed step's o (all
  // heads) vs the double reference's row T-1.
  double err = kNaN, dense_vs_sdpa = kNaN;
  const auto check = [&] {
    std::vector<double> ro(static_cast<size_t>(heads * kHeadDim)), rlse(static_cast<size_t>(heads));
    reference::mlr_attention_forward(tv(q1, "q"), tv(k, "k"), tv(v, "v"), opt, ro.data(), rlse.data());
    err = max_rel_err(o.transpose(1, 2), reference_tensor(ro, {1, 1, heads, kHeadDim}));
    dense_vs_sdpa = max_rel_err(o_dense, o_sdpa);
  };
  TimingPlan steps = plan;
  steps.reps = 10 * plan.reps;
  steps.min_reps = 10 * plan.min_reps;
  steps.warmups = 3;
  const std::vector<std::vector<double>> secs =
      run_timed_group({{"strata.mlr_kv_cache", ours, [&] { work = base; }},
                       {"strata.flash", dense},
                       {"torch.sdpa", sdpa}},
                      steps, check, corrupt_outputs({{"o", &o}}))
          .secs;

  const MlrFlops f = mlr_attention_flops(1, heads, 1, T, kHeadDim, opt);
  const double dense_key_bytes = double(base.dense_key_bytes());
  const double dense_value_bytes = double(heads * T * kHeadDim * int64_t(sizeof(float)));
  const char* peers[] = {"", "strata.flash", "torch.sdpa"};
  for (int i = 1; i <= 2; ++i) {
    BenchRow row;
    row.case_name = "decode step";
    row.method = "strata.mlr_kv_cache";
    row.peer = peers[i];
    row.shape = {{"batch", 1}, {"heads", heads}, {"seq", T}, {"head_dim", kHeadDim}, {"split", split.name}};
    row.shape_label = fmt::format("H={} T={} {}", heads, T, split.name);
    row.dtype = "float32";
    row.tolerance = kTolerance;
    row.checked_against = "strata::reference f64 (row T-1 of the forward over T tokens)";
    row.ref_max_rel_err = err;
    row.correct = err < kTolerance;
    row.max_rel_err = kNaN;
    row.flops = f.total;
    row.peer_flops = f.dense_total;
    set_row_times(row, secs[0], secs[size_t(i)]);
    const double key_ratio = double(base.key_bytes()) / dense_key_bytes;
    row.extra = {{"tokens_per_s", 1.0 / row.ours.median_s},
                 {"peer_tokens_per_s", 1.0 / row.peer_time.median_s},
                 {"key_bytes", base.key_bytes()},
                 {"value_bytes", base.value_bytes()},
                 {"peer_key_bytes", dense_key_bytes},
                 {"peer_value_bytes", dense_value_bytes},
                 {"key_cache_ratio", key_ratio},
                 {"flop_ratio_scores", f.dense_scores / f.scores},
                 {"flop_ratio_total", f.dense_total / f.total},
                 {"dense_decode_vs_sdpa_rel_err", dense_vs_sdpa}};
    rep.rows.push_back(std::move(row));
    const BenchRow& b = rep.rows.back();
    print_peer_table_row(b, rep.peak.all_gflops,
                         fmt::format("tok/s {:.0f} vs {:.0f}; keys {:.2f} MB vs {:.2f} MB ({:.3f}x); values "
                                     "{:.2f} MB both",
                                     1.0 / b.ours.median_s, 1.0 / b.peer_time.median_s, base.key_bytes() / 1e6,
                                     dense_key_bytes / 1e6, key_ratio, base.value_bytes() / 1e6));
  }
}

// The value of `field` (a row field or extra) of the row matching, if any.
std::optional<double> find(const BenchReport& rep, const std::string& case_name, int64_t T, const std::string& split,
                           const std::string& peer, const std::function<double(const BenchRow&)>& field) {
  for (const BenchRow& r : rep.rows)
    if (r.case_name == case_name && r.shape.value("seq", int64_t(0)) == T &&
        r.shape.value("split", std::string()) == split && r.peer == peer)
      return field(r);
  return std::nullopt;
}

void add_targets(BenchReport& rep) {
  const auto speedup = [](const BenchRow& r) { return r.speedup.median; };
  const auto ratio = [](const BenchRow& r) { return r.extra.value("flop_ratio_total", 0.0); };
  for (const auto& [case_name, factor] : {std::pair<std::string, double>{"fwd causal", 0.85}, {"bwd causal", 0.8}}) {
    const auto s = find(rep, case_name, 8192, "8x8", "strata.flash", speedup);
    const auto r = find(rep, case_name, 8192, "8x8", "strata.flash", ratio);
    rep.targets.push_back(
        {fmt::format("{} T=8192 8x8: speedup vs strata.flash >= {} x its FLOP ratio ({})", case_name, factor,
                     r ? fmt::format("{:.3f}", *r) : "?"),
         r ? factor * *r : kNaN, s});
  }
  for (const char* case_name : {"fwd causal", "bwd causal"})
    rep.targets.push_back({fmt::format("{} T=4096 8x8: speedup vs torch.mlr_blockwise (reference construction)",
                                       case_name),
                           10.0, find(rep, case_name, 4096, "8x8", "torch.mlr_blockwise", speedup)});
  rep.targets.push_back({"decode T=8192 8x8: key cache bytes / dense key cache bytes", 0.26,
                         find(rep, "decode step", 8192, "8x8", "strata.flash",
                              [](const BenchRow& r) { return r.extra.value("key_cache_ratio", 0.0); }),
                         true});
  rep.targets.push_back({"decode T=8192 8x8: step speedup vs dense decoding (strata.flash)", 1.0,
                         find(rep, "decode step", 8192, "8x8", "strata.flash", speedup)});
}

}  // namespace

CLI::App* add_bench_mlr(CLI::App& bench, BenchMlrOptions& o) {
  CLI::App* cmd = bench.add_subcommand(
      "mlr",
      "MLR attention (causal, fp32) vs our dense kernel, torch SDPA and the reference code's\n"
      "block-diagonal construction in torch; then KV-cache decoding vs dense decoding");
  cmd->add_flag("--quick", o.quick, "T 1024/4096/8192 (decode at 8192)");
  cmd->add_flag("--smoke", o.smoke, "T = 256 only, 3 rounds (for tests)");
  cmd->add_option("--seq", o.seq, "keep only these T (repeatable; decode runs when its T is kept)")->type_name("T");
  cmd->add_option("--split", o.split, "keep only these splits (repeatable)")
      ->check(CLI::IsMember({"8x8", "32|8|6|4|4|4|4|2", "16x4"}));
  cmd->add_option("--heads", o.heads, "heads (default 8)")->check(CLI::Range(1, 1024));
  cmd->add_option("--dtype", o.dtype,
                  "float32 (default: forward, backward, decode) or bfloat16 (forward and backward with\n"
                  "bf16 products, against themselves in fp32 compute, strata.flash and SDPA in bf16)")
      ->check(CLI::IsMember({"float32", "bfloat16"}));
  cmd->add_option("--ref-max-seq", o.ref_max_seq,
                  "largest T for the torch.mlr_blockwise peer (T x T buffers per level; default 4096)")
      ->type_name("T")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 30));
  cmd->add_option("--ref-bwd-max-seq", o.ref_bwd_max_seq,
                  "largest T for torch.mlr_blockwise's autograd backward (every block copy adds a\n"
                  "T x T gradient copy: about 80 s a call at T = 4096; default 4096)")
      ->type_name("T")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 30));
  add_bench_output_options(cmd, o.json, o.csv, o.threads, o.reps, "group",
                           "timed rounds per group (ABBA order) after one warm-up (default 7, 5 with --quick,\n"
                           "3 with --smoke; more rounds are cut back on groups over 20 s, never under those);\n"
                           "decode steps: 10x");
  return cmd;
}

int run_bench_mlr(const BenchMlrOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<int64_t> seqs = o.smoke ? std::vector<int64_t>{256}
                              : o.quick ? std::vector<int64_t>{1024, 4096, 8192}
                                        : std::vector<int64_t>{1024, 2048, 4096, 8192, 16384};
  const int64_t decode_T = o.smoke ? 256 : 8192;
  const auto kept = [](const auto& list, const auto& x) {
    return list.empty() || std::find(list.begin(), list.end(), x) != list.end();
  };
  std::vector<int64_t> sel;
  for (int64_t T : seqs)
    if (kept(o.seq, T)) sel.push_back(T);
  std::vector<Split> splits;
  for (const Split& s : all_splits())
    if (kept(o.split, s.name)) splits.push_back(s);
  const bool decode = kept(o.seq, decode_T) && kept(o.split, std::string("8x8"));
  STRATA_CHECK(!(sel.empty() && !decode) && !splits.empty(), "strata bench mlr: arguments '--seq', '--split': "
               "expected a selection that keeps at least one T of the sweep and one split, got none");

  STRATA_CHECK(o.dtype == "float32" || o.dtype == "bfloat16", "strata bench mlr: argument '--dtype': expected "
               "float32 or bfloat16, got '", o.dtype, "'");
  const bool bf16 = o.dtype == "bfloat16";
  const int threads = configure_threads(o.threads);
  fmt::print("measuring the fp32 FMA peak on {} threads...\n", threads);
  std::fflush(stdout);
  BenchReport rep = new_report("mlr", threads);
  print_preamble(rep);
  // 7 rounds (5 with --quick): the T = 8192 8x8 rows carry targets with a few % of margin, and the
  // median of 3 paired rounds on a VM with +-5-10% run-to-run noise put the forward at 1.34-1.39
  // in three sweeps while 9-round runs measured 1.37-1.49.
  const TimingPlan plan = bench_timing_plan(o.reps, o.quick, o.smoke, kGroupBudgetS);
  fmt::print("T: {}; splits: {}; ours = strata.mlr (layout bhsd, causal, {}), {} heads, d = d_v = {}; "
             "torch.mlr_blockwise up to T = {} (its backward: {}); {} timed rounds per group (ABBA order)\n",
             fmt::join(sel, ", "), splits.size(), o.dtype, o.heads, kHeadDim, o.ref_max_seq, o.ref_bwd_max_seq, plan.reps);
  print_peer_table_header();
  for (int64_t T : sel)
    for (const Split& s : splits) {
      if (bf16) {
        run_config_bf16(rep, o.heads, T, s, plan);
      } else {
        run_config(rep, o.heads, T, s, plan, o.ref_max_seq, o.ref_bwd_max_seq);
      }
      if (!o.json.empty()) write_json(rep, o.json);
    }
  if (decode && !bf16) {
    run_decode(rep, o.heads, decode_T, all_splits()[0], plan);
    if (!o.json.empty()) write_json(rep, o.json);
  }
  if (!bf16) add_targets(rep);  // (the targets are the fp32 rows')
  finish_report(rep, threads, o.json, o.csv);
  print_targets(rep.targets);

  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return print_run_summary(rep, "strata bench mlr", o.json, o.csv, secs);
}

}  // namespace strata::app
