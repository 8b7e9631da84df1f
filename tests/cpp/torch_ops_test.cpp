// tests/cpp/torch_ops_test.cpp: the torch-ops path (strata/torch/torch_ops.h) against the kernels'
// path of the same public function: attention, paper_gswa_attention, mlr_attention,
// structured_linear, monarch_attention, and the bilinear modules built on them. Each case runs the
// public function twice, switch off (float64: the double reference; float32: the kernel) and on
// (ATen ops), and compares the output and the gradients of every input by autograd.
//
// Tolerances (normwise: max |got - want| / max |want|):
//   float64  1e-10. Both sides compute the same formulas in double, in different orders (naive
//            loops vs BLAS / SDPA); their round-off is ~ (terms summed) * 1.1e-16 ~ 1e-14 for the
//            sizes here (<= 97 keys, head dims <= 16), amplified at most by the softmax's
//            conditioning (logits of O(1)). A semantic difference (one mask entry, a scale rounded
//            differently, a wrong block) moves outputs by 1e-8 (a float32-rounded scale) to O(1).
//   float32  2e-4. The kernel's fp32 round-off (6e-8 per operation, online softmax, tile sums over
//            <= 97 keys) and ATen's, ~1e-5 at worst here; a semantic error is O(1e-2) or more.
//   modules  2e-4 on outputs and parameter gradients (fp32: the same round-off through a few
//            projections and LayerNorms).
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/autograd.h>

#include <functional>
#include <string>
#include <vector>

#include "strata/error.h"
#include "strata/structured.h"
#include "strata/torch/attention.h"
#include "strata/torch/bilinear_attention.h"
#include "strata/torch/mlr.h"
#include "strata/torch/monarch.h"
#include "strata/torch/peers.h"
#include "strata/torch/structured.h"
#include "strata/torch/torch_ops.h"
#include "test_util.h"
#include "torch_test_util.h"

namespace {

namespace st = strata::torch;
using strata::test::expect_error;
using strata::test::message;
using strata::test::rel_err;

constexpr double kTol64 = 1e-10, kTol32 = 2e-4;

// A random tensor with logical dims (b, s, h, d) in `layout`.
at::Tensor rand4(int64_t b, int64_t s, int64_t h, int64_t d, const std::string& layout, at::ScalarType dt) {
  const auto o = at::TensorOptions().dtype(dt);
  return layout == "bshd" ? at::randn({b, s, h, d}, o) : at::randn({b, h, s, d}, o);
}

// {q, k, v} of batch 2 (every case's batch; key padding masks and biases are drawn for it):
// q nq x hq x d, k nk x hkv x d, v nk x hkv x dv, in `layout`.
std::vector<at::Tensor> qkv_of(int64_t nq, int64_t nk, int64_t hq, int64_t hkv, int64_t d, int64_t dv,
                               const std::string& layout, at::ScalarType dt) {
  return {rand4(2, nq, hq, d, layout, dt), rand4(2, nk, hkv, d, layout, dt), rand4(2, nk, hkv, dv, layout, dt)};
}

// Outputs and input gradients of fn over `inputs` (detached leaf copies; loss = sum(out * g), g
// fixed by seed).
std::vector<at::Tensor> out_and_grads(const std::function<at::Tensor(const std::vector<at::Tensor>&)>& fn,
                                      const std::vector<at::Tensor>& inputs) {
  std::vector<at::Tensor> leaves;
  for (const at::Tensor& t : inputs) leaves.push_back(t.detach().clone().requires_grad_());
  const at::Tensor out = fn(leaves);
  at::manual_seed(99);
  const at::Tensor g = at::randn(out.sizes(), out.options().requires_grad(false));
  const auto grads = torch::autograd::grad({out}, leaves, {g}, /*retain_graph=*/false, /*create_graph=*/false,
                                           /*allow_unused=*/true);
  std::vector<at::Tensor> r{out.detach()};
  for (size_t i = 0; i < grads.size(); ++i) r.push_back(grads[i].defined() ? grads[i] : at::zeros_like(inputs[i]));
  return r;
}

// fn with the switch off and on: outputs and every input gradient within tol, each relative to its
// own largest entry, or to 1e-3 of the largest entry of the whole call where it is smaller: a
// gradient that is zero in exact arithmetic (one key: the softmax cannot move, dq = dk = 0) comes
// out as exact zeros on one path and round-off of the call's magnitudes on the other (float64 on an
// Intel Xeon: 0 from the kernel, 1e-16 from the ATen ops), which no relative bound can compare.
void expect_same_both_paths(const std::function<at::Tensor(const std::vector<at::Tensor>&)>& fn,
                            const std::vector<at::Tensor>& inputs, double tol) {
  const auto [want, got] = strata::test::on_both_paths([&] { return out_and_grads(fn, inputs); });
  ASSERT_EQ(want.size(), got.size());
  double scale = 0.0;  // the call's largest finite |entry|
  for (const at::Tensor& w : want) {
    const at::Tensor f = w.to(at::kDouble).masked_select(w.isfinite());
    if (f.numel() > 0) scale = std::max(scale, f.abs().max().item<double>());
  }
  for (size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE(i == 0 ? std::string("out") : "grad of input " + std::to_string(i - 1));
    EXPECT_LE(rel_err(got[i], want[i], std::max(1e-3 * scale, 1e-30)), tol);
  }
}

// ---- the switch and the routing ------------------------------------------------------------------

TEST(TorchOps, SwitchIsOffByDefaultAndTheGuardRestoresIt) {
  EXPECT_FALSE(st::use_torch_ops());
  {
    st::UseTorchOps on(true);
    EXPECT_TRUE(st::use_torch_ops());
    {
      st::UseTorchOps off(false);
      EXPECT_FALSE(st::use_torch_ops());
    }
    EXPECT_TRUE(st::use_torch_ops());
  }
  EXPECT_FALSE(st::use_torch_ops());
  const at::Tensor cpu = at::zeros({1}), meta = at::empty({1}, at::TensorOptions().device(at::kMeta));
  EXPECT_FALSE(st::takes_torch_ops(cpu));
  EXPECT_TRUE(st::takes_torch_ops(meta));  // a device without a strata kernel
}

// Tensors off the CPU (the meta device stands in for CUDA here) take the torch-ops path: the public
// functions give the right shapes on that device instead of the kernels' "a CPU tensor" error.
// (attention and paper_gswa_attention reach at::scaled_dot_product_attention, whose math path has
// no meta kernels in ATen: there the error must be ATen's, from inside SDPA, not strata's.)
TEST(TorchOps, TensorsOffTheCpuTakeTheTorchOpsPath) {
  const auto meta = at::TensorOptions().device(at::kMeta);
  const at::Tensor q = at::empty({2, 7, 4, 8}, meta), k = at::empty({2, 7, 2, 8}, meta),
                   v = at::empty({2, 7, 2, 6}, meta);
  st::AttentionArgs a;
  a.causal = true;
  a.window_left = 2;
  for (const auto& run : std::vector<std::function<void()>>{[&] { st::attention(q, k, v, a); },
                                                            [&] { st::paper_gswa_attention(q, k, v, 3, 2); }}) {
    try {
      run();
    } catch (const strata::Error& e) {
      ADD_FAILURE() << "the kernels' path: " << e.what();
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find("Meta"), std::string::npos) << e.what();
    }
  }
  at::Tensor o;
  st::MlrArgs m;
  m.ranks = {4, 4};
  o = st::mlr_attention(q, k, v, m);
  EXPECT_EQ(o.sizes(), at::IntArrayRef({2, 7, 4, 6}));
  st::MonarchArgs mo;
  mo.num_steps = 2;
  o = st::monarch_attention(q, k, v, mo);
  EXPECT_EQ(o.sizes(), at::IntArrayRef({2, 7, 4, 6}));
  // equal chunks (unequal ones gather with index_select, which has no meta kernel)
  const strata::StructuredSpec spec = strata::block_diagonal_spec(6, 4, 2);
  o = st::structured_linear(spec, at::empty({3, 6}, meta), {at::empty({2, 3, 2}, meta)});
  EXPECT_EQ(o.sizes(), at::IntArrayRef({3, 4}));
}

// Entry points that stay CPU-only say so, naming the argument and its device.
TEST(TorchOps, CpuOnlyEntryPointsNameTheArgumentAndDevice) {
  const auto meta = at::TensorOptions().device(at::kMeta);
  const at::Tensor q = at::empty({1, 4, 2, 8}, meta), k = at::empty({1, 4, 2, 8}, meta),
                   v = at::empty({1, 4, 2, 8}, meta);
  const std::vector<std::string> cpu_q{"argument 'q'", "a CPU tensor", "meta"};
  expect_error([&] { st::attention_forward(q, k, v, {}); }, cpu_q);
  st::MlrArgs m;
  m.ranks = {4, 4};
  m.context = 4;
  expect_error([&] { st::mlr_attention_forward(q, k, v, m); }, cpu_q);
  expect_error([&] { st::monarch_attention_forward(q, k, v, {}); }, cpu_q);
  st::MlrDecodeCache cache(1, 2, 8, 16, m);
  expect_error([&] { cache.append(k, v); }, {"argument 'k'", "a CPU tensor", "meta"});
  expect_error([&] { cache.attend(at::empty({1, 1, 2, 8}, meta)); }, cpu_q);
  expect_error(
      [&] {
        st::structured_forward(strata::low_rank_spec(8, 8, 2), at::empty({2, 8}, meta), {});
      },
      {"argument 'x'", "a CPU tensor", "meta"});
}

// ---- dense attention -----------------------------------------------------------------------------

struct AttnCase {
  std::string name;
  std::function<void(st::AttentionArgs&, int64_t batch, int64_t nq, int64_t nk)> set;
};

std::vector<AttnCase> attention_cases() {
  return {
      {"plain", [](st::AttentionArgs&, int64_t, int64_t, int64_t) {}},
      {"causal", [](st::AttentionArgs& a, int64_t, int64_t, int64_t) { a.causal = true; }},
      {"scale", [](st::AttentionArgs& a, int64_t, int64_t, int64_t) { a.scale = 0.7; }},
      {"window", [](st::AttentionArgs& a, int64_t, int64_t, int64_t) { a.window_left = 3, a.window_right = 2; }},
      {"causal window", [](st::AttentionArgs& a, int64_t, int64_t, int64_t) { a.causal = true, a.window_left = 2; }},
      {"window 0 0", [](st::AttentionArgs& a, int64_t, int64_t, int64_t) { a.window_left = 0, a.window_right = 0; }},
      // Issue 48 item 1: windows near 2^63 (a user's "no bound") overflowed p + w: a crash in the
      // kernel, a mask of no key in the torch-op path. Both now read them as unbounded.
      {"window 0 2^63-1",
       [](st::AttentionArgs& a, int64_t, int64_t, int64_t) { a.window_left = 0, a.window_right = INT64_MAX; }},
      {"causal window 2^63-1 globals",
       [](st::AttentionArgs& a, int64_t, int64_t, int64_t) {
         a.causal = true, a.window_left = INT64_MAX - 7, a.window_right = INT64_MAX, a.num_global = 1;
       }},
      {"globals", [](st::AttentionArgs& a, int64_t, int64_t,
                     int64_t) { a.window_left = 1, a.window_right = 1, a.num_global = 2; }},
      {"causal globals",
       [](st::AttentionArgs& a, int64_t, int64_t, int64_t) { a.causal = true, a.window_left = 1, a.num_global = 3; }},
      {"key padding (rows with no key)",
       [](st::AttentionArgs& a, int64_t b, int64_t, int64_t nk) {
         a.causal = true;  // with the first keys padded, the first rows have no key
         at::Tensor m = at::rand({b, nk}).gt(0.3);
         m.narrow(1, 0, std::min<int64_t>(nk, 2)).fill_(false);
         a.key_padding_mask = m;
       }},
      {"bias",
       [](st::AttentionArgs& a, int64_t, int64_t nq, int64_t nk) {
         a.bias = at::randn({nq, nk}, at::kFloat);
       }},
      {"per-head float64 bias",
       [](st::AttentionArgs& a, int64_t b, int64_t nq, int64_t nk) {
         a.causal = true;
         a.bias = at::randn({b, 1, nq, nk}, at::kDouble).expand({b, 4, nq, nk}).narrow(1, 0, 1);
       }},
      {"bias with -inf, window, key padding",
       [](st::AttentionArgs& a, int64_t b, int64_t nq, int64_t nk) {
         at::Tensor bias = at::randn({b, 1, nq, nk}, at::kFloat);
         bias.masked_fill_(at::rand({b, 1, nq, nk}).gt(0.7), -std::numeric_limits<double>::infinity());
         a.bias = bias;
         a.window_left = 4;
         a.window_right = 0;
         a.key_padding_mask = at::rand({b, nk}).gt(0.2).to(at::kByte);
       }},
  };
}

TEST(TorchOps, AttentionEqualsTheReferenceInFloat64) {
  at::manual_seed(1);
  struct Heads {
    int64_t q, kv;
  };
  for (const std::string layout : {"bshd", "bhsd"})
    for (const auto& [nq, nk] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {7, 7}, {97, 97}, {5, 13}, {13, 5}})
      for (const Heads h : {Heads{2, 2}, Heads{4, 2}, Heads{1, 3}})
        for (const AttnCase& c : attention_cases()) {
          SCOPED_TRACE(layout + " nq=" + std::to_string(nq) + " nk=" + std::to_string(nk) + " heads " +
                       std::to_string(h.q) + "/" + std::to_string(h.kv) + " " + c.name);
          const int64_t B = 2;
          st::AttentionArgs a;
          a.layout = layout;
          c.set(a, B, nq, nk);
          expect_same_both_paths([&](const auto& t) { return st::attention(t[0], t[1], t[2], a); },
                                 qkv_of(nq, nk, h.q, h.kv, 5, 3, layout, at::kDouble), kTol64);
        }
}

// The shared query as Bilinear BTT passes it: one query expanded (stride 0) over the kv heads.
TEST(TorchOps, AttentionWithAnExpandedSharedQuery) {
  at::manual_seed(2);
  st::AttentionArgs a;
  a.causal = true;
  a.scale = 1.0;
  const at::Tensor q = at::randn({2, 9, 16}, at::kDouble), k = at::randn({2, 9, 3, 16}, at::kDouble),
                   v = at::randn({2, 9, 3, 4}, at::kDouble);
  expect_same_both_paths(
      [&](const auto& t) {
        return st::attention(t[0].unsqueeze(2).expand({2, 9, 3, 16}), t[1], t[2], a);
      },
      {q, k, v}, kTol64);
}

TEST(TorchOps, AttentionEqualsTheKernelInFloat32) {
  at::manual_seed(3);
  st::AttentionArgs a;
  a.causal = true;
  a.window_left = 5;
  a.num_global = 2;
  a.key_padding_mask = at::rand({2, 40}).gt(0.2);
  expect_same_both_paths([&](const auto& t) { return st::attention(t[0], t[1], t[2], a); },
                         qkv_of(40, 40, 4, 2, 16, 16, "bshd", at::kFloat), kTol32);
}

TEST(TorchOps, AttentionChecksAsTheKernelPath) {
  st::UseTorchOps on(true);
  const at::Tensor q = at::randn({1, 4, 2, 8}), k = at::randn({1, 4, 3, 8});
  expect_error([&] { st::attention(q, k, k, {}); }, {"argument 'k'"});
  st::AttentionArgs a;
  a.window_left = -2;
  expect_error([&] { st::attention(q, q, q, a); }, {"argument 'window_left'"});
  a = {};
  a.layout = "bsdh";
  expect_error([&] { st::attention(q, q, q, a); }, {"argument 'layout'"});
  a = {};
  a.key_padding_mask = at::ones({1, 5}, at::kBool);
  expect_error([&] { st::attention(q, q, q, a); }, {"argument 'key_padding_mask'"});
  expect_error([&] { st::attention(q.to(at::kInt), q, q, {}); }, {"argument 'q'", "int32"});
}

// ---- the paper's GSWA ----------------------------------------------------------------------------

TEST(TorchOps, PaperGswaEqualsTheReferenceInFloat64) {
  at::manual_seed(4);
  struct Case {
    int64_t nq, nk, split, window;
    std::optional<double> sa, sb;
  };
  for (const std::string layout : {"bshd", "bhsd"})
    for (const Case c : {Case{1, 1, 1, 0, {}, {}}, Case{7, 7, 2, 2, {}, {}}, Case{97, 97, 3, 10, 0.4, {}},
                         Case{5, 11, 4, 3, {}, 0.9}, Case{11, 5, 1, 50, 1.5, 0.2}}) {
      SCOPED_TRACE(layout + " nq=" + std::to_string(c.nq) + " split=" + std::to_string(c.split));
      const std::vector<at::Tensor> qkv = qkv_of(c.nq, c.nk, 4, 2, 5, 3, layout, at::kDouble);
      expect_same_both_paths(
          [&](const auto& t) {
            return st::paper_gswa_attention(t[0], t[1], t[2], c.split, c.window, c.sa, c.sb, layout);
          },
          qkv, kTol64);
    }
}

TEST(TorchOps, PaperGswaEqualsTheKernelInFloat32) {
  at::manual_seed(5);
  expect_same_both_paths([&](const auto& t) { return st::paper_gswa_attention(t[0], t[1], t[2], 8, 6); },
                         qkv_of(33, 33, 2, 2, 16, 16, "bshd", at::kFloat), kTol32);
}

// ---- MLR attention -------------------------------------------------------------------------------

struct MlrCase {
  std::string name;
  int64_t nq, nk, hq, hkv;
  std::function<void(st::MlrArgs&)> set;
};

std::vector<MlrCase> mlr_cases() {
  const auto seg = [](std::vector<int64_t> s) { return at::tensor(s, at::TensorOptions().dtype(at::kLong)); };
  return {
      {"one level", 7, 7, 2, 2, [](st::MlrArgs& a) { a.ranks = {5}; }},
      {"one level non-causal seq 1", 1, 1, 2, 2, [](st::MlrArgs& a) { a.ranks = {5}, a.causal = false; }},
      {"default blocks", 97, 97, 2, 2,
       [](st::MlrArgs& a) {
         a.ranks = {2, 2, 1};
       }},
      {"default blocks GQA", 7, 7, 4, 2,
       [](st::MlrArgs& a) {
         a.ranks = {3, 2};
       }},
      {"context", 13, 13, 2, 1,
       [](st::MlrArgs& a) {
         a.ranks = {3, 1, 1}, a.context = 16;
       }},
      {"block sizes (non-nested)", 29, 29, 2, 2,
       [](st::MlrArgs& a) {
         a.ranks = {2, 2, 1}, a.block_sizes = {12, 4, 6};
       }},
      {"averaging, non-causal", 21, 21, 2, 2,
       [](st::MlrArgs& a) {
         a.ranks = {2, 2, 1}, a.block_sizes = {8, 4, 2}, a.level_average = true, a.causal = false;
       }},
      {"1/L, inv_sqrt_head_dim", 11, 11, 2, 2,
       [](st::MlrArgs& a) {
         a.ranks = {4, 1}, a.divide_by_num_levels = true, a.scale = "inv_sqrt_head_dim";
       }},
      {"prefill (seq_q < seq_k)", 5, 12, 2, 2,
       [](st::MlrArgs& a) {
         a.ranks = {3, 2}, a.context = 8;
       }},
      {"seq_q > seq_k (empty rows)", 12, 5, 2, 2,
       [](st::MlrArgs& a) {
         a.ranks = {3, 2}, a.context = 8;
       }},
      {"segments", 23, 23, 2, 2,
       [seg](st::MlrArgs& a) {
         a.ranks = {2, 2, 1}, a.block_sizes = {0, 4, 2}, a.segment_starts = seg({5, 14});
       }},
      {"segments, cross-segment masked, averaged", 23, 23, 2, 2,
       [seg](st::MlrArgs& a) {
         a.ranks = {2, 2, 1}, a.context = 8, a.segment_starts = seg({5, 14}), a.mask_cross_segment = true;
         a.level_average = true;
       }},
      {"segments per sequence, non-causal", 17, 17, 2, 2,
       [seg](st::MlrArgs& a) {
         a.ranks = {3, 2}, a.block_sizes = {0, 3}, a.segment_starts = seg({4, 9, 11}),
         a.segment_offsets = seg({0, 1, 3});
         a.causal = false, a.mask_cross_segment = true;
       }},
  };
}

TEST(TorchOps, MlrAttentionEqualsTheReferenceInFloat64) {
  at::manual_seed(6);
  for (const std::string layout : {"bshd", "bhsd"})
    for (const MlrCase& c : mlr_cases()) {
      SCOPED_TRACE(layout + " " + c.name);
      st::MlrArgs a;
      a.layout = layout;
      c.set(a);
      int64_t D = 0;
      for (int64_t r : a.ranks) D += r;
      const std::vector<at::Tensor> qkv = qkv_of(c.nq, c.nk, c.hq, c.hkv, D, 3, layout, at::kDouble);
      expect_same_both_paths([&](const auto& t) { return st::mlr_attention(t[0], t[1], t[2], a); }, qkv, kTol64);
    }
}

TEST(TorchOps, MlrAttentionEqualsTheKernelInFloat32) {
  at::manual_seed(7);
  st::MlrArgs a;
  a.ranks = {8, 4, 4};
  a.context = 48;
  a.level_average = true;
  expect_same_both_paths([&](const auto& t) { return st::mlr_attention(t[0], t[1], t[2], a); },
                         qkv_of(40, 40, 4, 2, 16, 16, "bshd", at::kFloat), kTol32);
}

// The fast case of the torch-ops path (torch/mlr_regions.h: dyadic blocks within the context, no
// segments; non-causal with seq == context) against the double reference, and against the general
// composition (set_use_mlr_regions(false)) in bf16: awkward lengths (1, 7, 97, 1025: tiles that end
// mid-block, levels with no second half), 1 to 6 levels, GQA, a context longer than the sequence,
// explicit dyadic block sizes, averaging, 1/L, inv_sqrt_head_dim, non-causal (8, 96, 336). The
// non-dyadic, non-causal shorter than the context, prefill and past-the-context cases of
// mlr_cases() take the general composition and are checked above.
struct MlrRegionsCase {
  int64_t seq, hq, hkv;
  std::vector<int64_t> ranks, block_sizes;
  int64_t context;
  bool average, one_over_l;
  std::string scale;
  bool causal = true;
};

TEST(TorchOps, MlrRegionsEqualTheReferenceAndTheComposition) {
  const std::vector<MlrRegionsCase> cases = {
      {1, 2, 2, {3, 2}, {}, 0, false, false, "inv_rank"},
      {7, 2, 2, {5}, {}, 0, false, false, "inv_rank"},
      {7, 4, 2, {2, 2, 1}, {}, 0, true, false, "inv_rank"},
      {97, 2, 1, {4, 2, 1, 1}, {}, 128, true, false, "inv_rank"},
      {97, 2, 2, {3, 2, 1, 1, 1, 1}, {}, 0, false, true, "inv_sqrt_head_dim"},
      {40, 2, 2, {4, 3, 1}, {64, 32, 16}, 0, false, false, "inv_rank"},
      {1025, 1, 1, {4, 2, 1, 1}, {}, 2048, true, false, "inv_rank"},
      // non-causal with seq == context (the encoders' case): every tile attends to its sibling
      {1, 2, 2, {3}, {}, 0, false, false, "inv_rank", false},
      {8, 2, 1, {2, 2, 1}, {}, 0, true, false, "inv_rank", false},
      {96, 2, 2, {4, 2, 1, 1}, {}, 96, false, true, "inv_sqrt_head_dim", false},
      {336, 2, 2, {6, 2}, {336, 168}, 0, true, false, "inv_rank", false},
  };
  at::manual_seed(17);
  for (const MlrRegionsCase& c : cases) {
    SCOPED_TRACE("seq " + std::to_string(c.seq) + ", " + std::to_string(c.ranks.size()) + " levels");
    st::MlrArgs a;
    a.ranks = c.ranks, a.block_sizes = c.block_sizes, a.context = c.context;
    a.level_average = c.average, a.divide_by_num_levels = c.one_over_l, a.scale = c.scale, a.causal = c.causal;
    int64_t D = 0;
    for (int64_t r : c.ranks) D += r;
    const auto fn = [&](const auto& t) { return st::mlr_attention(t[0], t[1], t[2], a); };
    const std::vector<at::Tensor> qkv = qkv_of(c.seq, c.seq, c.hq, c.hkv, D, 5, "bshd", at::kDouble);
    // float64: the reference against the regions on the CPU flash kernel. The floor: with one key
    // (seq 1) dq and dk are exactly 0 and the regions' P (dP - D) leaves rounding noise (~1e-17).
    const auto [want, got] = strata::test::on_both_paths([&] { return out_and_grads(fn, qkv); });
    for (size_t i = 0; i < want.size(); ++i) EXPECT_LE(rel_err(got[i], want[i], 1e-3), kTol64) << "float64, " << i;
    // bf16: the regions against the general composition, both on the torch-ops path; their
    // roundings differ (q scaled per level before the product; scores summed in fp32 vs bf16
    // matmuls), so the bound is bf16's (2^-8 relative per operand over sums of <= 1025 terms).
    at::manual_seed(99);
    const at::Tensor cot = at::randn({2, c.seq, c.hq, 5}, at::TensorOptions().dtype(at::kDouble));
    const auto run = [&](at::ScalarType dt) {  // out and input grads, inputs and cotangent rounded to dt
      std::vector<at::Tensor> leaves;
      for (const at::Tensor& t : qkv) leaves.push_back(t.to(dt).detach().requires_grad_());
      const at::Tensor out = fn(leaves);
      const auto g = torch::autograd::grad({out}, leaves, {cot.to(dt)});
      return std::vector<at::Tensor>{out.detach(), g[0], g[1], g[2]};
    };
    const st::UseTorchOps on(true);
    st::set_use_mlr_regions(false);
    const std::vector<at::Tensor> general = run(at::kBFloat16);
    st::set_use_mlr_regions(true);
    const std::vector<at::Tensor> regions = run(at::kBFloat16);
    const std::vector<at::Tensor> exact = run(at::kDouble);
    for (size_t i = 0; i < exact.size(); ++i) {
      SCOPED_TRACE(i == 0 ? std::string("out") : "grad of input " + std::to_string(i - 1));
      // Each against the float64 truth, the regions no worse than the composition (x 1.5 + slack).
      const double e_regions = rel_err(regions[i].to(at::kDouble), exact[i], 1e-3);
      const double e_general = rel_err(general[i].to(at::kDouble), exact[i], 1e-3);
      EXPECT_LE(e_regions, 3e-2);
      EXPECT_LE(e_regions, 1.5 * e_general + 4e-3);
    }
  }
}

TEST(TorchOps, MlrAttentionChecksAsTheKernelPath) {
  st::UseTorchOps on(true);
  const at::Tensor q = at::randn({1, 4, 2, 8});
  st::MlrArgs a;
  a.ranks = {4, 3};
  expect_error([&] { st::mlr_attention(q, q, q, a); }, {"ranks"});
  a.ranks = {4, 4};
  a.scale = "inv_d";
  expect_error([&] { st::mlr_attention(q, q, q, a); }, {"argument 'scale'"});
  a.scale = "inv_rank";
  a.segment_offsets = at::tensor(std::vector<int64_t>{0, 1, 1}, at::TensorOptions().dtype(at::kLong));
  a.segment_starts = at::tensor(std::vector<int64_t>{2}, at::TensorOptions().dtype(at::kLong));
  expect_error([&] { st::mlr_attention(q, q, q, a); }, {"argument 'segment_offsets'"});
}

// ---- structured operators ------------------------------------------------------------------------

// A general MLBTC spec: a level with a shared right stage, an inner and an out permutation and
// alpha, and a level with an identity right stage and unequal left chunks.
strata::StructuredSpec general_spec() {
  strata::StructuredSpec s;
  s.in = 6;
  s.out = 7;
  strata::StructuredLevel a;
  a.inner = 4;
  a.right = {strata::StageKind::shared, 2};
  a.left = {strata::StageKind::blocks, 3};
  a.inner_perm = {2, 0, 3, 1};
  a.out_perm = {6, 5, 4, 3, 2, 1, 0};
  a.alpha = 0.5;
  strata::StructuredLevel b;
  b.inner = 6;
  b.right = {strata::StageKind::identity, 1};
  b.left = {strata::StageKind::blocks, 4};
  b.alpha = -1.25;
  s.levels = {a, b};
  strata::validate("general_spec", s);
  return s;
}

std::vector<strata::StructuredSpec> structured_specs() {
  return {strata::low_rank_spec(7, 5, 3),
          strata::block_diagonal_spec(7, 5, 3),  // unequal chunks (padded storage)
          strata::block_diagonal_spec(6, 4, 2),
          strata::mlr_spec(8, {2, 2, 1}),
          strata::mlr_spec(7, {2, 1}, {1, 3}),  // unequal chunks
          strata::btt_spec(strata::btt_factorize(12, 12), 2),
          strata::btt_spec(strata::BttShape{2, 3, 2, 3}, 1, 2),  // two heads
          strata::monarch_spec(16, 4),
          strata::monarch_spec(12, 3),
          strata::kronecker_spec(2, 3, 4, 5),
          general_spec()};
}

// structured_linear(spec, x, factors) on both paths, factors N(0, scale^2) of x's dtype.
void expect_structured_same_both_paths(const strata::StructuredSpec& spec, const at::Tensor& x, double scale,
                                       double tol) {
  std::vector<at::Tensor> inputs{x};
  for (const auto& shape : strata::structured_factor_shapes(spec))
    inputs.push_back(at::randn(shape, x.options()) * scale);
  expect_same_both_paths(
      [&](const std::vector<at::Tensor>& t) {
        return st::structured_linear(spec, t[0], std::vector<at::Tensor>(t.begin() + 1, t.end()));
      },
      inputs, tol);
}

TEST(TorchOps, StructuredLinearEqualsTheReferenceInFloat64) {
  at::manual_seed(8);
  for (const strata::StructuredSpec& spec : structured_specs())
    for (const std::vector<int64_t>& lead : {std::vector<int64_t>{1}, {5}, {2, 3}}) {
      SCOPED_TRACE(spec.name + " rows " + std::to_string(lead.size()) + "-D");
      std::vector<int64_t> xs = lead;
      xs.push_back(spec.in);
      expect_structured_same_both_paths(spec, at::randn(xs, at::kDouble), 1.0, kTol64);
    }
}

// Padding entries of the factors' storage are never read (NaN there changes nothing).
TEST(TorchOps, StructuredLinearNeverReadsFactorPadding) {
  st::UseTorchOps on(true);
  const strata::StructuredSpec spec = strata::block_diagonal_spec(7, 5, 3);  // chunks 2, 2, 3 -> 1, 2, 2
  const at::Tensor x = at::randn({4, 7}, at::kDouble), w = at::randn({3, 3, 2}, at::kDouble);
  const at::Tensor want = at::matmul(x, st::structured_to_dense(spec, {w}).t());
  at::Tensor w_nan = w.clone();
  w_nan[0][2].fill_(NAN);            // chunk 0 has 2 inputs: row 2 is padding
  w_nan[0].select(1, 1).fill_(NAN);  // and 1 output: column 1 is padding
  EXPECT_LE(rel_err(st::structured_linear(spec, x, {w_nan}), want), kTol64);
}

TEST(TorchOps, StructuredLinearEqualsTheKernelInFloat32) {
  at::manual_seed(9);
  const strata::StructuredSpec spec = strata::btt_spec(strata::btt_factorize(64, 64), 2, 2);
  expect_structured_same_both_paths(spec, at::randn({3, 10, 64}), 0.3, kTol32);
}

TEST(TorchOps, StructuredLinearChecksItsFactors) {
  st::UseTorchOps on(true);
  const strata::StructuredSpec spec = strata::low_rank_spec(6, 4, 2);
  const at::Tensor x = at::randn({2, 6});
  expect_error([&] { st::structured_linear(spec, x, {at::randn({1, 6, 2})}); }, {"argument 'factors'", "2 tensors"});
  expect_error(
      [&] {
        st::structured_linear(spec, x, {at::randn({1, 6, 2}), at::randn({1, 4, 3})});
      },
      {"argument 'factors[1]'", "[1, 4, 2]"});
  expect_error(
      [&] {
        st::structured_linear(spec, at::randn({2, 5}), {at::randn({1, 6, 2}), at::randn({1, 4, 2})});
      },
      {"argument 'x'"});
}

// ---- MonarchAttention ----------------------------------------------------------------------------

TEST(TorchOps, MonarchAttentionEqualsTheReferenceInFloat64) {
  at::manual_seed(10);
  struct Case {
    int64_t n, steps, block;
    strata::MonarchPad pad;
    std::optional<double> scale;
    int64_t hq, hkv;
  };
  const auto post = strata::MonarchPad::post, pre = strata::MonarchPad::pre;
  for (const std::string layout : {"bshd", "bhsd"})
    for (const Case c : {Case{1, 1, 0, post, {}, 2, 2}, Case{7, 1, 3, post, {}, 2, 2}, Case{7, 2, 3, pre, 0.8, 4, 2},
                         Case{97, 3, 0, post, {}, 2, 1}, Case{97, 2, 10, pre, {}, 2, 2}, Case{13, 2, 1, post, {}, 2, 2},
                         Case{13, 2, 200, post, 1.3, 2, 2}, Case{16, 3, 4, post, {}, 2, 2}}) {
      SCOPED_TRACE(layout + " n=" + std::to_string(c.n) + " T=" + std::to_string(c.steps) +
                   " B=" + std::to_string(c.block) + (c.pad == pre ? " pre" : " post"));
      st::MonarchArgs a;
      a.num_steps = c.steps;
      a.block_size = c.block;
      a.pad = c.pad;
      a.scale = c.scale;
      a.layout = layout;
      const std::vector<at::Tensor> qkv = qkv_of(c.n, c.n, c.hq, c.hkv, 5, 3, layout, at::kDouble);
      expect_same_both_paths([&](const auto& t) { return st::monarch_attention(t[0], t[1], t[2], a); }, qkv, kTol64);
    }
}

TEST(TorchOps, MonarchAttentionEqualsTheKernelInFloat32) {
  at::manual_seed(11);
  st::MonarchArgs a;
  a.num_steps = 2;
  a.block_size = 6;
  expect_same_both_paths([&](const auto& t) { return st::monarch_attention(t[0], t[1], t[2], a); },
                         qkv_of(40, 40, 2, 2, 16, 16, "bshd", at::kFloat), kTol32);
}

TEST(TorchOps, MonarchAttentionNamesWhatTheTorchOpsPathLacks) {
  st::UseTorchOps on(true);
  const at::Tensor q = at::randn({1, 8, 2, 4});
  st::MonarchArgs a;
  a.mode = strata::MonarchMode::reference;
  expect_error([&] { st::monarch_attention(q, q, q, a); }, {"argument 'mode'", "reference"});
  a = {};
  a.key_padding_mask = at::ones({1, 8}, at::kBool);
  expect_error([&] { st::monarch_attention(q, q, q, a); }, {"argument 'key_padding_mask'"});
  a = {};
  a.num_steps = 0;
  expect_error([&] { st::monarch_attention(q, q, q, a); }, {"argument 'num_steps'"});
}

// ---- the bilinear modules ------------------------------------------------------------------------

// A module's output and parameter gradients, switch off vs on (fp32); gradients against the
// largest (param_grad_errs: the key LayerNorm's bias has a zero gradient by symmetry).
void expect_module_same_both_paths(torch::nn::Module& m, const std::function<at::Tensor(const at::Tensor&)>& fwd,
                                   const at::Tensor& x) {
  at::manual_seed(12);
  const at::Tensor w = at::randn(fwd(x).sizes());
  const auto [want, got] = strata::test::on_both_paths([&] { return strata::test::out_and_param_grads(m, fwd, x, w); });
  EXPECT_LE(rel_err(got[0], want[0]), kTol32) << "out";
  const auto names = m.named_parameters().keys();
  const std::vector<double> errs = strata::test::param_grad_errs(got, want);
  for (size_t i = 0; i < errs.size(); ++i) EXPECT_LE(errs[i], kTol32) << "grad of " << names[i];
}

TEST(TorchOps, BilinearModulesAreTheSameOnBothPaths) {
  at::manual_seed(13);
  const at::Tensor x = at::randn({2, 11, 16});
  st::BilinearBTTAttention btt(st::BilinearBTTAttentionOptions(16, 2).btt_rank(2).bias(true).x_layernorm(true));
  expect_module_same_both_paths(
      *btt, [&](const at::Tensor& t) { return btt(t); }, x);
  st::BilinearMLRAttention bmlr(st::BilinearMLRAttentionOptions(16, 2, {4, 2, 2}).divide_by_num_levels(true));
  expect_module_same_both_paths(
      *bmlr, [&](const at::Tensor& t) { return bmlr(t); }, x);
  st::BilinearBTTAttention btt_enc(st::BilinearBTTAttentionOptions(16, 4).causal(false).logit_scale("mup"));
  expect_module_same_both_paths(
      *btt_enc, [&](const at::Tensor& t) { return btt_enc(t); }, x);
}

}  // namespace
