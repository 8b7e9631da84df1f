// tests/cpp/core_attention_test.cpp: the dense CPU kernel (every ISA this CPU has) against the
// double-precision reference, over awkward sizes, layouts, strides, masks, GQA, a query shared by
// heads, head dims up to 1024, dtypes; forward output, lse and all three gradients (the sweep runs
// on kernel_harness.h); and bad options (the checks every family shares are in
// core_checks_test.cpp).
//
// Tolerances (normwise: max abs error / max abs reference value):
//   fp32: 2e-5 forward, 1e-4 gradients. fp32 round-off in dot products of length D and sums of
//   up to Nk terms grows like eps * sqrt(n) ~ 1e-6 for n ~ 1e3 here; exp2's polynomial adds
//   < 2e-8. Gradients subtract D_i = rowsum(dO*O) from dP (cancellation), so allow 5x more.
//   bf16: inputs are exactly representable for both sides (the reference reads the same bf16
//   values); the kernel rounds its OUTPUT to bf16 (relative 2^-9 = 2e-3), P and the
//   accumulators stay fp32. 1e-2 leaves 5x margin; gradients 2e-2 (rounded dO, O feed D_i).
//   Gradient errors are divided by max(max |ref|, 1e-2): with U(-1, 1) inputs every gradient
//   that is not identically zero has entries above 1e-2, while rows with a single allowed key
//   have an exactly-zero dq/dk whose fp32 round-off (~1e-7) must not be divided by ~0.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "strata/attention.h"
#include "strata/cpu.h"
#include "strata/threading.h"
#include "kernel_harness.h"

namespace strata {
namespace {

using test::Owned4;

struct Case : test::Storage {
  int64_t B = 1, Nq = 7, Nk = 7, Hq = 2, Hkv = 1, D = 16, Dv = 16;
  bool causal = false;
  int64_t wl = -1, wr = -1, G = 0;
  bool kpm = false, bias = false;
  bool grads = true;
  std::string name() const {
    auto side = [](int64_t w) { return w < 0 ? std::string("inf") : std::to_string(w); };
    return detail::cat("B", B, "_Nq", Nq, "_Nk", Nk, "_Hq", Hq, "_Hkv", Hkv, "_D", D, "_Dv", Dv, "_",
                       storage_name(), causal ? "_causal" : "",
                       wl >= 0 || wr >= 0 ? detail::cat("_win", side(wl), "_", side(wr)) : std::string(),
                       G ? detail::cat("_glob", G) : std::string(), kpm ? "_kpm" : "", bias ? "_bias" : "");
  }
};

// The dense family's adapter for the harness (kernel_harness.h). Key padding masks roughly a
// third of the keys (and in batch 0 the first key); the bias is U(-2, 2), broadcast over batch.
struct DenseFamily {
  using Case = ::strata::Case;
  double scalar_max_work = 2e7;  // scalar (std::fma calls, one lane): the small cases only
  Case c;
  test::Inputs in;
  AttentionOptions opt;
  std::vector<uint8_t> kpm;
  std::vector<float> bias;

  explicit DenseFamily(const Case& c_) : c(c_) {
    std::mt19937 rng(1234 + unsigned(c.Nq * 31 + c.Nk * 7 + c.D));
    in = test::make_inputs(shape(), rng);
    opt.causal = c.causal;
    opt.window_left = c.wl;
    opt.window_right = c.wr;
    opt.num_global = c.G;
    opt.layout = c.layout;
    if (c.kpm) {
      kpm.resize(size_t(c.B * c.Nk));
      for (size_t i = 0; i < kpm.size(); ++i) kpm[i] = (rng() % 3) != 0;
      kpm[0] = 0;
      opt.key_padding_mask = TensorView(kpm.data(), DType::u8, {c.B, c.Nk});
    }
    if (c.bias) {  // shape [1, H, Nq, Nk], H the heads of o
      const int64_t H = std::max(c.Hq, c.Hkv);
      bias.resize(size_t(H * c.Nq * c.Nk));
      std::uniform_real_distribution<float> u(-2.f, 2.f);
      for (float& x : bias) x = u(rng);
      opt.bias = TensorView(bias.data(), DType::f32, {1, H, c.Nq, c.Nk});
    }
  }
  DenseFamily(const DenseFamily&) = delete;  // opt points into kpm and bias

  test::Shape shape() const {
    return test::shape_of(c, {c.B, c.Nq, c.Nk, c.Hq, c.Hkv, c.D, c.Dv});
  }
  double work() const { return double(c.Nq) * c.Nk * (c.D + c.Dv) * shape().d.heads() * c.B; }
  bool grads() const { return c.grads; }
  test::Tolerance tolerance() const {  // see the file comment
    return c.dtype == DType::bf16 ? test::Tolerance{1e-2, 2e-2} : test::Tolerance{2e-5, 1e-4};
  }
  std::vector<test::Expected> references() const {
    test::Expected r("the reference", shape(), /*with_lse=*/true, c.grads);
    reference::attention_forward(in.q.view, in.k.view, in.v.view, opt, r.o.data(), r.lse.data());
    if (c.grads)
      reference::attention_backward(in.q.view, in.k.view, in.v.view, in.dout.view, opt, r.dq.data(), r.dk.data(),
                                    r.dv.data());
    return {r};
  }
  std::vector<const char*> kernels() const { return {""}; }
  void forward(size_t, Isa, test::Outputs& out) {
    attention_forward(in.q.view, in.k.view, in.v.view, out.o.view, out.lse_view, opt);
  }
  void backward(size_t, Isa, test::Outputs& out) {
    attention_backward(in.q.view, in.k.view, in.v.view, out.o.view, out.lse_view, in.dout.view, out.dq.view,
                       out.dk.view, out.dv.view, opt);
  }
};

using AttentionSweep = test::KernelSweep<DenseFamily>;
TEST_P(AttentionSweep, MatchesReference) { test::run_case<DenseFamily>(GetParam()); }

std::vector<Case> length_cases() {
  std::vector<Case> v;
  for (int64_t n : {1, 7, 97, 256, 1025})
    for (bool causal : {false, true}) {
      Case c;
      c.Nq = c.Nk = n;
      c.D = c.Dv = 64;
      c.causal = causal;
      v.push_back(c);
    }
  Case c;  // Nq != Nk, bottom-right aligned causal
  c.Nq = 97;
  c.Nk = 256;
  c.D = c.Dv = 64;
  c.causal = true;
  v.push_back(c);
  c.Nq = 256;
  c.Nk = 97;  // more queries than keys: the first rows see no key at all
  v.push_back(c);
  return v;
}

std::vector<Case> head_dim_cases() {
  std::vector<Case> v;
  for (int64_t d : {16, 59, 64, 128, 256, 1024}) {
    for (int64_t n : {7, 97}) {
      if (d == 1024 && n == 97) continue;
      Case c;
      c.Nq = c.Nk = n;
      c.D = c.Dv = d;
      c.causal = n == 97;
      v.push_back(c);
    }
  }
  Case c;
  c.Nq = c.Nk = 33;
  c.D = 1;
  c.Dv = 3;  // tiny and unequal
  v.push_back(c);
  c.D = 40;
  c.Dv = 72;
  v.push_back(c);
  // Bilinear BTT attention attends with head dim = model width (up to 1024): odd widths, both
  // dtypes, and one length with two query tiles and a partial key tile (D = 1000, N = 97).
  for (int64_t d : {769, 1000, 1024})
    for (DType t : {DType::f32, DType::bf16}) {
      if (d == 1024 && t == DType::f32) continue;  // above
      Case w;
      w.dtype = t;
      w.Nq = w.Nk = 7;
      w.D = w.Dv = d;
      w.causal = t == DType::bf16;
      v.push_back(w);
    }
  Case w;
  w.Nq = w.Nk = 97;
  w.Hq = 1;
  w.Hkv = 1;
  w.D = 1000;
  w.Dv = 769;
  w.causal = true;
  w.layout = Layout::BHSD;
  v.push_back(w);
  return v;
}

// A query shared by heads (heads_kv % heads_q == 0, attention.h): heads_q = 1 against H in
// {1, 3, 8} kv heads, head dims {1, 63, 64, 257, 1024}, lengths {1 (the decode path), 7, 97}; causal
// on every other case, a window on every third, the storages (layouts, dtypes, strides) rotating
// through every_storage().
std::vector<Case> shared_query_cases() {
  std::vector<Case> v;
  const std::vector<test::Storage> storages = test::every_storage();
  int i = 0;
  for (int64_t H : {1, 3, 8})
    for (int64_t d : {1, 63, 64, 257, 1024})
      for (int64_t n : {1, 7, 97}) {
        Case c;
        c.set_storage(storages[size_t(i) % storages.size()]);
        c.Nq = c.Nk = n;
        c.Hq = 1;
        c.Hkv = H;
        c.D = c.Dv = d;
        c.causal = i % 2 == 1;
        if (i % 3 == 2) {
          c.wl = 5;
          c.wr = c.causal ? 0 : 3;
        }
        v.push_back(c);
        ++i;
      }
  Case c;  // 2 query heads, each shared by 3 kv heads, with every mask, fewer queries than keys
  c.B = 2;
  c.Nq = 37;
  c.Nk = 97;
  c.Hq = 2;
  c.Hkv = 6;
  c.D = 24;
  c.Dv = 40;
  c.causal = true;
  c.wl = 20;
  c.G = 3;
  c.kpm = true;
  c.bias = true;
  v.push_back(c);
  c.dtype = DType::bf16;
  c.layout = Layout::BHSD;
  v.push_back(c);
  c.Nq = 3;  // decode path with a shared query and every mask
  v.push_back(c);
  c.Nq = c.Nk = 200;  // 4 query tiles, 2 key tiles: the dq sum over heads crosses tiles
  c.Hq = 1;
  c.Hkv = 4;
  c.D = c.Dv = 64;
  c.wl = -1;
  c.G = 0;
  c.kpm = c.bias = false;
  c.dtype = DType::f32;
  v.push_back(c);
  return v;
}

std::vector<Case> mask_cases() {
  std::vector<Case> v;
  // INT64_MAX (- 7): a user's "no bound" (issue 48 item 1: p + w overflowed, a segfault);
  // effective_window makes it unbounded, as the reference reads it.
  constexpr int64_t kHuge = std::numeric_limits<int64_t>::max();
  const std::pair<int64_t, int64_t> windows[] = {{-1, -1}, {8, 0}, {5, 3}, {0, 0}, {-1, 4}, {0, kHuge}, {kHuge - 7, 2}};
  for (auto [nq, nk] : {std::pair<int64_t, int64_t>{97, 97}, {37, 97}, {97, 37}})
    for (bool causal : {false, true})
      for (auto [wl, wr] : windows)
        for (int64_t G : {0, 3})
          for (bool kpm : {false, true})
            for (bool bias : {false, true}) {
              if (nq != nk && (kpm != bias)) continue;  // keep the sweep small off the diagonal
              Case c;
              c.B = 2;
              c.Nq = nq;
              c.Nk = nk;
              c.D = c.Dv = 32;
              c.causal = causal;
              c.wl = wl;
              c.wr = wr;
              c.G = G;
              c.kpm = kpm;
              c.bias = bias;
              v.push_back(c);
            }
  return v;
}

// A case on storage st (layout, dtype, row gaps, dim strides) with awkward sizes: 97 queries, 131
// keys, GQA 4:2, head dims 59 / 48; causal with row gaps, a padding mask with dim strides.
Case storage_case(const test::Storage& st) {
  Case c;
  c.set_storage(st);
  c.B = 2;
  c.Nq = 97;
  c.Nk = 131;
  c.Hq = 4;
  c.Hkv = 2;
  c.D = 59;
  c.Dv = 48;
  c.causal = st.gap > 0;
  c.kpm = st.dim_stride > 1;
  return c;
}

std::vector<Case> layout_gqa_dtype_cases() {
  std::vector<Case> v;
  for (int64_t ratio : {1, 2, 8}) {
    Case c;
    c.Hq = 8;
    c.Hkv = 8 / ratio;
    c.Nq = c.Nk = 97;
    c.D = c.Dv = 64;
    c.causal = true;
    v.push_back(c);
    c.dtype = DType::bf16;
    v.push_back(c);
  }
  for (const test::Storage& st : test::every_storage()) {
    Case c = storage_case(st);
    c.wl = st.layout == Layout::BHSD ? 16 : -1;
    v.push_back(c);
  }
  {
    Case c;  // bf16 at a long length with every mask on
    c.dtype = DType::bf16;
    c.Nq = c.Nk = 1025;
    c.D = c.Dv = 128;
    c.causal = true;
    c.wl = 300;
    c.G = 2;
    c.kpm = true;
    c.bias = true;
    v.push_back(c);
  }
  return v;
}

// Few queries (decoding, seqlen_q <= 4) take their own path in the kernel (keys read in place,
// one unit per (batch, head)): every option again, against the same reference.
std::vector<Case> decode_cases() {
  std::vector<Case> v;
  for (int64_t nq : {1, 2, 4})
    for (int64_t nk : {1, 7, 97, 1025}) {
      Case c;
      c.Nq = nq;
      c.Nk = nk;
      c.D = c.Dv = 64;
      c.Hq = 4;
      c.Hkv = 2;
      v.push_back(c);
      c.causal = true;
      v.push_back(c);
      if (nk < 97) continue;
      c.wl = 20;  // window + globals + key padding + bias, bf16, BHSD, odd dims, strided
      c.G = 3;
      c.kpm = true;
      c.bias = true;
      v.push_back(c);
      c.dtype = DType::bf16;
      c.layout = Layout::BHSD;
      c.D = 59;
      c.Dv = 48;
      c.gap = 3;
      c.dim_stride = 2;
      v.push_back(c);
      c.dtype = DType::f32;
      c.Hkv = 1;  // MQA
      c.wl = -1;
      c.wr = 0;
      v.push_back(c);
    }
  return v;
}

constexpr auto case_name = test::case_name<Case>;

INSTANTIATE_TEST_SUITE_P(Lengths, AttentionSweep, ::testing::ValuesIn(length_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Decode, AttentionSweep, ::testing::ValuesIn(decode_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(HeadDims, AttentionSweep, ::testing::ValuesIn(head_dim_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(SharedQuery, AttentionSweep, ::testing::ValuesIn(shared_query_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Masks, AttentionSweep, ::testing::ValuesIn(mask_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(LayoutGqaDtype, AttentionSweep, ::testing::ValuesIn(layout_gqa_dtype_cases()),
                         case_name);

// ---- special rows, threads, composition --------------------------------------------------------

TEST(Attention, FullyMaskedRowsGiveZerosAndNegInfLse) {
  const int64_t B = 2, N = 20, H = 1, D = 8;
  std::mt19937 rng(7);
  Owned4 q(B, N, H, D, DType::f32, Layout::BSHD), k(B, N, H, D, DType::f32, Layout::BSHD);
  Owned4 v(B, N, H, D, DType::f32, Layout::BSHD), o(B, N, H, D, DType::f32, Layout::BSHD);
  Owned4 g(B, N, H, D, DType::f32, Layout::BSHD), dq(B, N, H, D, DType::f32, Layout::BSHD);
  Owned4 dk(B, N, H, D, DType::f32, Layout::BSHD), dv(B, N, H, D, DType::f32, Layout::BSHD);
  for (Owned4* t : {&q, &k, &v, &g}) t->fill_random(rng);
  std::vector<uint8_t> kpm(size_t(B * N), 1);
  for (int64_t j = 0; j < N; ++j) kpm[size_t(N + j)] = 0;  // batch 1: every key masked
  AttentionOptions opt;
  opt.key_padding_mask = TensorView(kpm.data(), DType::u8, {B, N});
  std::vector<float> lse(size_t(B * H * N));
  TensorView lv(lse.data(), DType::f32, {B, H, N});
  attention_forward(q.view, k.view, v.view, o.view, lv, opt);
  attention_backward(q.view, k.view, v.view, o.view, lv, g.view, dq.view, dk.view, dv.view, opt);
  for (int64_t i = 0; i < N; ++i) {
    EXPECT_TRUE(std::isinf(lse[size_t(N + i)]) && lse[size_t(N + i)] < 0);
    EXPECT_TRUE(std::isfinite(lse[size_t(i)]));
    for (int64_t d = 0; d < D; ++d) {
      EXPECT_EQ(o.at(1, i, 0, d, Layout::BSHD), 0.0);
      EXPECT_EQ(dq.at(1, i, 0, d, Layout::BSHD), 0.0);
      EXPECT_EQ(dk.at(1, i, 0, d, Layout::BSHD), 0.0);
      EXPECT_EQ(dv.at(1, i, 0, d, Layout::BSHD), 0.0);
    }
  }
}

TEST(Attention, NonFiniteInputPropagatesToItsRowsOnly) {
  const int64_t N = 40, D = 16;
  std::mt19937 rng(3);
  Owned4 q(1, N, 1, D, DType::f32, Layout::BSHD), k(1, N, 1, D, DType::f32, Layout::BSHD);
  Owned4 v(1, N, 1, D, DType::f32, Layout::BSHD), o(1, N, 1, D, DType::f32, Layout::BSHD);
  for (Owned4* t : {&q, &k, &v}) t->fill_random(rng);
  int64_t idx[4] = {0, 5, 0, 3};
  q.view.set(idx, std::numeric_limits<double>::quiet_NaN());  // query row 5 only
  std::vector<float> lse(static_cast<size_t>(N));
  AttentionOptions opt;
  attention_forward(q.view, k.view, v.view, o.view, TensorView(lse.data(), DType::f32, {1, 1, N}), opt);
  for (int64_t i = 0; i < N; ++i) {
    const double x = o.at(0, i, 0, 0, Layout::BSHD);
    if (i == 5) {
      EXPECT_TRUE(std::isnan(x));
    } else {
      EXPECT_TRUE(std::isfinite(x)) << i;
    }
  }
}

// One head, B = 1, BSHD, Nq = 70 over Nk = 700 keys, head dim 16: the sweep's checks (every ISA,
// forward and backward) on inputs a test then shapes.
Case long_keys_case() {
  Case c;
  c.Nq = 70;
  c.Nk = 700;
  c.Hq = c.Hkv = 1;
  return c;
}

// The forward raises a row's reference max lazily (only when a key tile beats it by more than
// 2^8, core/online_softmax.inc). Bias jumps at later key tiles exercise both paths: +5 (kept: P up
// to 2^5 * e^...), +40 and +200 (raised; the old P underflow to 0), and -200 (far below the max).
TEST(Attention, LogitJumpsAcrossKeyTilesMatchReference) {
  const Case c = long_keys_case();
  DenseFamily f(c);
  std::vector<float> bias(size_t(c.Nq * c.Nk), 0.f);
  const float jump[4] = {5.f, 40.f, 200.f, -200.f};
  for (int64_t i = 0; i < c.Nq; ++i)
    for (int64_t j = 0; j < c.Nk; ++j)
      if (j >= 150 + 37 * (i % 5)) bias[size_t(i * c.Nk + j)] = jump[i % 4] * float(1 + j / 250);
  f.opt.bias = TensorView(bias.data(), DType::f32, {1, 1, c.Nq, c.Nk});
  test::check_kernel(f);
}

// The same without bias or masks, so every tile takes the fused path (the score GEMM subtracts
// the lanes' reference max and takes the column max, core/gemm.inc gemm_shift_max).
TEST(Attention, GrowingLogitsOnUnmaskedTilesMatchReference) {
  DenseFamily f(long_keys_case());
  test::grow_keys_with_position(f.in.k);
  test::check_kernel(f);
}

TEST(Attention, ThreadCountDoesNotChangeResults) {
  const int64_t N = 300, D = 64;
  std::mt19937 rng(5);
  Owned4 q(1, N, 2, D, DType::f32, Layout::BSHD), k(1, N, 2, D, DType::f32, Layout::BSHD);
  Owned4 v(1, N, 2, D, DType::f32, Layout::BSHD);
  for (Owned4* t : {&q, &k, &v}) t->fill_random(rng);
  AttentionOptions opt;
  opt.causal = true;
  std::vector<double> out[2];
  const int saved = get_num_threads();
  for (int t : {1, 3}) {
    set_num_threads(t);
    Owned4 o(1, N, 2, D, DType::f32, Layout::BSHD);
    std::vector<float> lse(size_t(2 * N));
    attention_forward(q.view, k.view, v.view, o.view, TensorView(lse.data(), DType::f32, {1, 2, N}), opt);
    for (int64_t i = 0; i < N; ++i) out[t == 3].push_back(o.at(0, i, 1, 7, Layout::BSHD));
  }
  set_num_threads(saved);
  EXPECT_EQ(out[0], out[1]);  // forward is deterministic: each query tile is one unit of work
}

// The shared query (heads_q = 1) against the same query expanded to the H heads by a stride-0 view,
// as torch's expand() passes it: the same forward bit for bit (each head reads the same row), the
// same dk, dv bit for bit (each head packs the same values), and dq = the sum over heads of the
// expanded call's per-head dq (fp32 sums in another order: 1e-6 relative).
TEST(Attention, SharedQueryEqualsItsStrideZeroExpansion) {
  const int64_t B = 2, N = 70, H = 4, D = 48;
  const Layout L = Layout::BSHD;
  std::mt19937 rng(17);
  Owned4 q(B, N, 1, D, DType::f32, L), k(B, N, H, D, DType::f32, L), v(B, N, H, D, DType::f32, L);
  Owned4 g(B, N, H, D, DType::f32, L);
  for (Owned4* t : {&q, &k, &v, &g}) t->fill_random(rng);
  TensorView qx = q.view;  // B x N x H x D, stride 0 over heads
  qx.shape[2] = H;
  qx.stride[2] = 0;
  AttentionOptions opt;
  opt.causal = true;
  struct Run {
    Owned4 o, dq, dk, dv;
    std::vector<float> lse;
  };
  auto run = [&](const TensorView& qv, int64_t hq) {
    Run r{Owned4(B, N, H, D, DType::f32, L), Owned4(B, N, hq, D, DType::f32, L), Owned4(B, N, H, D, DType::f32, L),
          Owned4(B, N, H, D, DType::f32, L), std::vector<float>(size_t(B * H * N))};
    const TensorView lv(r.lse.data(), DType::f32, {B, H, N});
    attention_forward(qv, k.view, v.view, r.o.view, lv, opt);
    attention_backward(qv, k.view, v.view, r.o.view, lv, g.view, r.dq.view, r.dk.view, r.dv.view, opt);
    return r;
  };
  const Run shared = run(q.view, 1), expanded = run(qx, H);
  EXPECT_EQ(shared.o.buf, expanded.o.buf);
  EXPECT_EQ(shared.lse, expanded.lse);
  EXPECT_EQ(shared.dk.buf, expanded.dk.buf);
  EXPECT_EQ(shared.dv.buf, expanded.dv.buf);
  std::vector<double> dq_sum(size_t(B * N * D), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < N; ++i)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t d = 0; d < D; ++d) dq_sum[size_t((b * N + i) * D + d)] += expanded.dq.at(b, i, h, d, L);
  EXPECT_LE(test::rel_err(shared.dq, L, dq_sum, B, N, 1, D), 1e-6);
}

TEST(Attention, EmptySizesAreNoOps) {
  std::vector<float> buf(64, 1.f), lse(8, 5.f);
  AttentionOptions opt;
  // Nk = 0: every row has no key -> zeros and lse = -inf.
  TensorView q(buf.data(), DType::f32, {1, 2, 1, 4}), k(buf.data(), DType::f32, {1, 0, 1, 4});
  TensorView v(buf.data(), DType::f32, {1, 0, 1, 4}), o(buf.data() + 32, DType::f32, {1, 2, 1, 4});
  attention_forward(q, k, v, o, TensorView(lse.data(), DType::f32, {1, 1, 2}), opt);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(buf[size_t(32 + i)], 0.f);
  EXPECT_TRUE(std::isinf(lse[0]) && lse[0] < 0);
  // batch = 0: nothing to do, no error.
  TensorView q0(buf.data(), DType::f32, {0, 2, 1, 4}), o0(buf.data(), DType::f32, {0, 2, 1, 4});
  TensorView k0(buf.data(), DType::f32, {0, 3, 1, 4});
  EXPECT_NO_THROW(attention_forward(q0, k0, k0, o0, TensorView(lse.data(), DType::f32, {0, 1, 2}), opt));
}

// paper_gswa_forward / _backward with the given per-branch scales (NaN: the default) against the
// two probability matrices materialised in double with scales want_a, want_b.
void expect_gswa_is_sum_of_two_softmax_branches(float scale_a, float scale_b, double want_a, double want_b) {
  const int64_t B = 1, N = 50, H = 2, D = 24, a = 8, w = 6;
  std::mt19937 rng(11);
  auto mk = [&](int64_t n, int64_t d) { Owned4 t(B, n, H, d, DType::f32, Layout::BSHD); t.fill_random(rng); return t; };
  Owned4 q = mk(N, D), k = mk(N, D), v = mk(N, D), g = mk(N, D);
  Owned4 o(B, N, H, D, DType::f32, Layout::BSHD), oa = o, ob = o;
  oa.view.data = oa.buf.data();
  ob.view.data = ob.buf.data();
  std::vector<float> la(size_t(B * H * N)), lb(la.size());
  PaperGswaOptions opt;
  opt.split_a = a;
  opt.window = w;
  opt.scale_a = scale_a;
  opt.scale_b = scale_b;
  TensorView lav(la.data(), DType::f32, {B, H, N}), lbv(lb.data(), DType::f32, {B, H, N});
  paper_gswa_forward(q.view, k.view, v.view, o.view, oa.view, ob.view, lav, lbv, opt);
  Owned4 dq(B, N, H, D, DType::f32, Layout::BSHD), dk = dq, dv = dq;
  dq.view.data = dq.buf.data();
  dk.view.data = dk.buf.data();
  dv.view.data = dv.buf.data();
  paper_gswa_backward(q.view, k.view, v.view, oa.view, ob.view, lav, lbv, g.view, dq.view, dk.view, dv.view, opt);

  // Independent check: materialise the two probability matrices in double and add them (the
  // scales rounded to float, as the core stores them).
  double max_err_o = 0, max_o = 0, max_err_dv = 0, max_dv = 0;
  std::vector<double> dvref(size_t(N * H * D), 0.0);
  for (int64_t h = 0; h < H; ++h) {
    std::vector<double> P(size_t(N * N), 0.0);
    for (int branch = 0; branch < 2; ++branch) {
      const int64_t d0 = branch ? a : 0, d1 = branch ? D : a;
      const double scale = double(float(branch ? want_b : want_a));
      for (int64_t i = 0; i < N; ++i) {
        std::vector<double> s(size_t(N), -INFINITY);
        double mx = -INFINITY;
        for (int64_t j = 0; j <= i; ++j) {
          if (branch == 1 && j < i - w) continue;
          double acc = 0;
          for (int64_t d = d0; d < d1; ++d) acc += q.at(0, i, h, d, Layout::BSHD) * k.at(0, j, h, d, Layout::BSHD);
          s[size_t(j)] = scale * acc;
          mx = std::max(mx, s[size_t(j)]);
        }
        double sum = 0;
        for (int64_t j = 0; j < N; ++j) sum += std::isinf(s[size_t(j)]) ? 0 : std::exp(s[size_t(j)] - mx);
        for (int64_t j = 0; j < N; ++j)
          P[size_t(i * N + j)] += std::isinf(s[size_t(j)]) ? 0 : std::exp(s[size_t(j)] - mx) / sum;
      }
    }
    for (int64_t i = 0; i < N; ++i)
      for (int64_t d = 0; d < D; ++d) {
        double acc = 0, gacc = 0;
        for (int64_t j = 0; j < N; ++j) {
          acc += P[size_t(i * N + j)] * v.at(0, j, h, d, Layout::BSHD);
          gacc += P[size_t(j * N + i)] * g.at(0, j, h, d, Layout::BSHD);  // dV = P^T dO
        }
        max_err_o = std::max(max_err_o, std::fabs(acc - o.at(0, i, h, d, Layout::BSHD)));
        max_o = std::max(max_o, std::fabs(acc));
        max_err_dv = std::max(max_err_dv, std::fabs(gacc - dv.at(0, i, h, d, Layout::BSHD)));
        max_dv = std::max(max_dv, std::fabs(gacc));
      }
  }
  EXPECT_LE(max_err_o / max_o, 2e-5);
  EXPECT_LE(max_err_dv / max_dv, 1e-4);
  // row 0 of both branches sees only key 0: P rows sum to 2 there, so o[0] = 2 v[0]
  EXPECT_NEAR(o.at(0, 0, 0, 0, Layout::BSHD), 2 * v.at(0, 0, 0, 0, Layout::BSHD), 1e-5);
}

// Default scales: the reference code's (CausalSelfGlobalSlidingWindowAttention) 8/a for the
// global branch and 8/b for the windowed one; a = 8, b = 24 - 8 = 16.
TEST(Attention, PaperGswaIsSumOfTwoSoftmaxBranches) {
  expect_gswa_is_sum_of_two_softmax_branches(NAN, NAN, 8.0 / 8, 8.0 / 16);
}

// A given scale overrides its own branch's default only.
TEST(Attention, PaperGswaPerBranchScalesOverride) {
  expect_gswa_is_sum_of_two_softmax_branches(0.2f, NAN, 0.2, 8.0 / 16);
  expect_gswa_is_sum_of_two_softmax_branches(NAN, 0.7f, 8.0 / 8, 0.7);
}

// ---- bf16 products (AttentionOptions::compute, strata/cpu.h) ----------------------------------
// bf16 inputs on a CPU with AVX512-BF16 (and AMX-BF16) run the forward's two products in bf16 with
// fp32 accumulation. The sweep above already runs them (compute = auto under the avx512 ISA);
// here every engine this CPU has is held to the reference by name, the engine is checked to be the
// one that ran, and compute = fp32 is checked to be the fp32 path bit for bit.
//
// Tolerance: the sweep's bf16 one (1e-2 forward, 2e-2 gradients). Q K^T of bf16 inputs is exact in
// fp32 before the fp32 accumulation (products of 8-bit mantissas fit in 24 bits), as in the fp32
// path; the new error is P rounded to bf16 for P V: each weight off by a relative delta_j, |delta_j|
// <= 2^-9, independent across keys, so o_i moves by sum_j P_ij delta_j v_j / l_i, about 2^-9 times
// the spread of the v_j under row i's weights, the same order as o's own output rounding (2^-9 =
// 2e-3 relative): together about 4e-3, under 1e-2. The backward runs its five products on the
// engine too: Q K^T and dO V^T of bf16 inputs are exact products with fp32 sums in another order;
// P^T dO, dS^T Q and dS K read P and dS rounded to bf16 (each value off by at most 2^-9 relative,
// independently, so each gradient moves by about 2^-9 of its terms' spread, as o does above), and
// it reads the bf16 forward's o and lse (D_i = rowsum(dO * O)): 2e-2 as in the sweep (measured by
// strata bench attention at N = 4096: 2.5e-3 to 5.0e-3 against the double reference).

using test::bf16_engines;

// Sizes of a case (its AttnDims, bf16).
AttnDims dims_of(const Case& c) { return test::shape_of(c, {c.B, c.Nq, c.Nk, c.Hq, c.Hkv, c.D, c.Dv}).d; }

using Bf16ComputeSweep = ::testing::TestWithParam<Case>;
TEST_P(Bf16ComputeSweep, EveryEngineMatchesReference) {
  const Case& c = GetParam();
  DenseFamily f(c);
  test::check_bf16_engines(f, [&](Compute e) {
    // the tiled forward takes the engine; decoding-sized calls (<= 4 queries) stay fp32
    EXPECT_EQ(attention_compute(dims_of(c), f.opt), c.Nq > 4 ? e : Compute::fp32);
  });
}

// Lengths 1 (the fp32 row path), 7, 97, 1025; head dims 1, 7, 65, 129 (and unequal D, Dv); every
// mask; GQA, MQA and a shared query; both layouts, row gaps and dim strides; all bf16.
std::vector<Case> bf16_compute_cases() {
  std::vector<Case> v;
  auto bf16 = [](Case c) {
    c.dtype = DType::bf16;
    return c;
  };
  for (int64_t n : {1, 7, 97, 1025})
    for (bool causal : {false, true}) {
      Case c;
      c.Nq = c.Nk = n;
      c.D = c.Dv = 64;
      c.causal = causal;
      c.grads = n < 1025 || causal;
      v.push_back(bf16(c));
    }
  for (int64_t d : {1, 7, 65, 129}) {
    Case c;
    c.Nq = c.Nk = 97;
    c.D = c.Dv = d;
    v.push_back(bf16(c));
  }
  {
    Case c;
    c.Nq = c.Nk = 97;
    c.D = 7;
    c.Dv = 65;
    c.causal = true;
    v.push_back(bf16(c));
  }
  const std::pair<int64_t, int64_t> windows[] = {{-1, -1}, {8, 0}, {5, 3}};
  for (auto [nq, nk] : {std::pair<int64_t, int64_t>{97, 97}, {37, 97}, {97, 37}})
    for (bool causal : {false, true})
      for (auto [wl, wr] : windows) {
        Case c;
        c.B = 2;
        c.Nq = nq;
        c.Nk = nk;
        c.D = c.Dv = 32;
        c.causal = causal;
        c.wl = wl;
        c.wr = wr;
        c.G = wl >= 0 ? 3 : 0;
        c.kpm = causal;
        c.bias = !causal || wl >= 0;
        v.push_back(bf16(c));
      }
  for (auto [hq, hkv] : {std::pair<int64_t, int64_t>{8, 2}, {8, 1}, {1, 4}}) {
    Case c;
    c.Nq = c.Nk = 200;
    c.Hq = hq;
    c.Hkv = hkv;
    c.D = c.Dv = 64;
    c.causal = true;
    v.push_back(bf16(c));
  }
  for (const test::Storage& st : test::every_storage()) {
    if (st.dtype == DType::bf16) v.push_back(storage_case(st));
  }
  {
    Case c;  // a long row with every mask, head dim 128
    c.Nq = c.Nk = 1025;
    c.D = c.Dv = 128;
    c.causal = true;
    c.wl = 300;
    c.G = 2;
    c.kpm = true;
    c.bias = true;
    v.push_back(bf16(c));
  }
  return v;
}
INSTANTIATE_TEST_SUITE_P(Bf16Compute, Bf16ComputeSweep, ::testing::ValuesIn(bf16_compute_cases()), case_name);

// The lazily raised reference max (LogitJumpsAcrossKeyTilesMatchReference) under bf16 products:
// key rows growing with position make later key tiles beat the running max by a little and by far.
TEST(Attention, Bf16GrowingLogitsMatchReference) {
  const std::vector<Compute> engines = bf16_engines();
  if (engines.empty()) GTEST_SKIP() << "this CPU has no AVX512-BF16";
  Case c = long_keys_case();
  c.dtype = DType::bf16;
  DenseFamily f(c);
  test::grow_keys_with_position(f.in.k);
  const test::Shape s = f.shape();
  const std::vector<test::Expected> refs = f.references();
  test::IsaGuard guard;
  set_isa(Isa::avx512);
  for (Compute e : engines) {
    SCOPED_TRACE(compute_name(e));
    f.opt.compute = e;
    test::Outputs out(s);
    f.forward(0, Isa::avx512, out);
    test::expect_forward_near(out, refs[0], s, f.tolerance());
  }
}

// Which engine runs: the best this CPU has by default (AMX-BF16, else AVX512-BF16 on CPUs without
// AMX, strata/cpu.h) for bf16 inputs only, fp32 when asked, under a lowered ISA, for float32 inputs and for decoding; an
// explicit engine the CPU or ISA lacks is an error naming 'compute'. Says which engines this CPU
// has (AMX tested or not).
TEST(Attention, ComputeResolvesToTheEnginesOfThisCpu) {
  const std::vector<Compute> engines = bf16_engines();
  std::printf("[ bf16 engines on this CPU: %s%s ]\n", engines.empty() ? "none" : compute_name(engines[0]),
              engines.size() > 1 ? " amx_bf16 (AMX tested)" : " (no AMX here: AMX not tested)");
  const AttnDims d{2, 64, 64, 2, 2, 64, 64, DType::bf16};
  AttnDims d32 = d;
  d32.dtype = DType::f32;
  AttnDims decode = d;
  decode.seqlen_q = 4;
  AttentionOptions opt;
  test::IsaGuard guard;
  const Bf16DotRates& rates = bf16_dot_rates();
  const Compute best = engines.size() > 1 ? Compute::amx_bf16
                       : !engines.empty() && rates.dot >= kVdpbf16psPays * rates.fma ? Compute::avx512_bf16
                                                                                     : Compute::fp32;
  EXPECT_EQ(attention_compute(d, opt), best);
  EXPECT_EQ(attention_compute(d32, opt), Compute::fp32);
  EXPECT_EQ(attention_compute(decode, opt), Compute::fp32);
  opt.compute = Compute::fp32;
  EXPECT_EQ(attention_compute(d, opt), Compute::fp32);
  for (Compute e : {Compute::avx512_bf16, Compute::amx_bf16}) {
    opt.compute = e;
    if (std::find(engines.begin(), engines.end(), e) != engines.end()) {
      EXPECT_EQ(attention_compute(d, opt), e);
    } else {
      test::expect_error([&] { attention_compute(d, opt); }, {"attention_compute: argument 'compute'", compute_name(e)});
    }
  }
  if (engines.empty()) return;
  set_isa(Isa::avx2);  // the bf16 paths live in the avx512 units
  opt.compute = Compute::automatic;
  EXPECT_EQ(attention_compute(d, opt), Compute::fp32);
  opt.compute = Compute::avx512_bf16;
  test::expect_error([&] { attention_compute(d, opt); }, {"'compute'", "active ISA (avx2)", "got avx512_bf16"});
}

// auto's rule (strata/cpu.h) on given rates, both sides of the threshold, and the probe here.
TEST(Attention, AutomaticComputeFollowsTheMeasuredRates) {
  EXPECT_EQ(automatic_compute(true, true, {0.5, 1.0}), Compute::amx_bf16);
  EXPECT_EQ(automatic_compute(false, true, {2.0, 1.0}), Compute::avx512_bf16);   // AMD Zen 4 / 5 class
  EXPECT_EQ(automatic_compute(false, true, {0.49, 1.0}), Compute::fp32);         // this Xeon class
  EXPECT_EQ(automatic_compute(false, true, {1.2, 1.0}), Compute::fp32);          // under kVdpbf16psPays
  EXPECT_EQ(automatic_compute(false, true, {1.25, 1.0}), Compute::avx512_bf16);  // at it
  EXPECT_EQ(automatic_compute(false, false, {2.0, 1.0}), Compute::fp32);         // no engine
  EXPECT_EQ(automatic_compute(false, true, {}), Compute::fp32);                  // no rates
  const Bf16DotRates& r = bf16_dot_rates();
  if (!cpu_features().avx512_bf16) {
    EXPECT_EQ(r.dot, 0.0);
    EXPECT_EQ(r.fma, 0.0);
    return;
  }
  std::printf("[ vdpbf16ps %.1f, fp32 FMA %.1f GMAC/s on one thread: dot / fma %.2f ]\n", r.dot, r.fma, r.dot / r.fma);
  // One thread of any AVX-512 core does 1-400 GMAC/s of either; a broken timer or folded loop does not.
  for (double x : {r.dot, r.fma}) {
    EXPECT_GT(x, 1.0);
    EXPECT_LT(x, 400.0);
  }
  EXPECT_EQ(&bf16_dot_rates(), &r);  // measured once per process
}

TEST(Attention, ComputeNamesParse) {
  for (Compute c : {Compute::automatic, Compute::fp32, Compute::avx512_bf16, Compute::amx_bf16})
    EXPECT_EQ(parse_compute("t", compute_name(c)), c);
  test::expect_error([] { parse_compute("t", "bf16"); },
                     {"t: argument 'compute'", "one of auto, fp32, avx512_bf16, amx_bf16", "got bf16"});
}

// compute = fp32 on bf16 inputs is the fp32 path: o is the bf16 rounding of the float32 kernel's o
// on the same (widened) values, bit for bit, and lse equal; and where the CPU has a bf16 engine,
// compute = auto gives another o (P rounded to bf16): the bf16 path ran.
TEST(Attention, Fp32ComputeIsTheFp32PathBitForBit) {
  const int64_t B = 2, N = 150, H = 2, D = 64;
  const Layout L = Layout::BSHD;
  std::mt19937 rng(23);
  Owned4 q(B, N, H, D, DType::bf16, L), k(B, N, H, D, DType::bf16, L), v(B, N, H, D, DType::bf16, L);
  for (Owned4* t : {&q, &k, &v}) t->fill_random(rng);
  auto widened = [&](const Owned4& t) {
    Owned4 w(B, N, H, D, DType::f32, L);
    int64_t idx[4];
    for (idx[0] = 0; idx[0] < B; ++idx[0])
      for (idx[1] = 0; idx[1] < N; ++idx[1])
        for (idx[2] = 0; idx[2] < H; ++idx[2])
          for (idx[3] = 0; idx[3] < D; ++idx[3]) w.view.set(idx, t.view.get(idx));
    return w;
  };
  const Owned4 q32 = widened(q), k32 = widened(k), v32 = widened(v);
  struct Run {
    Owned4 o;
    std::vector<float> lse;
  };
  auto run = [&](const Owned4& qq, const Owned4& kk, const Owned4& vv, Compute compute) {
    Run r{Owned4(B, N, H, D, qq.view.dtype, L), std::vector<float>(size_t(B * H * N))};
    AttentionOptions opt;
    opt.causal = true;
    opt.compute = compute;
    attention_forward(qq.view, kk.view, vv.view, r.o.view, TensorView(r.lse.data(), DType::f32, {B, H, N}), opt);
    return r;
  };
  test::IsaGuard guard;
  const Run f32 = run(q32, k32, v32, Compute::automatic), fp32 = run(q, k, v, Compute::fp32);
  EXPECT_EQ(fp32.lse, f32.lse);
  int64_t mismatches = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < N; ++i)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t c = 0; c < D; ++c)
          mismatches += fp32.o.at(b, i, h, c, L) != double(bf16_to_f32(f32_to_bf16(float(f32.o.at(b, i, h, c, L)))));
  EXPECT_EQ(mismatches, 0) << "compute = fp32 is not the fp32 path";
  for (Compute e : bf16_engines()) {
    set_isa(Isa::avx512);
    const Run r = run(q, k, v, e);
    EXPECT_NE(r.o.buf, fp32.o.buf) << compute_name(e) << " gave the fp32 path's o bit for bit: the bf16 path did not run";
  }
}

// ---- bad options (the checks every family shares: core_checks_test.cpp) ---------------------------

struct AttentionBadInput : ::testing::Test {
  std::vector<float> buf = std::vector<float>(4096, 0.5f), lse = std::vector<float>(64);
  TensorView q{buf.data(), DType::f32, {1, 8, 2, 16}}, k{buf.data(), DType::f32, {1, 8, 2, 16}};
  TensorView v{buf.data(), DType::f32, {1, 8, 2, 16}}, o{buf.data() + 1024, DType::f32, {1, 8, 2, 16}};
  TensorView lv{lse.data(), DType::f32, {1, 2, 8}};
  AttentionOptions opt;
  // Expects attention_forward to throw strata::Error whose message contains every needle.
  void expect_error(const std::vector<std::string>& needles) {
    test::expect_error([&] { attention_forward(q, k, v, o, lv, opt); }, needles);
  }
};

TEST_F(AttentionBadInput, NegativeWindow) {
  opt.window_left = -5;
  expect_error({"'window_left'", "-5"});
}
TEST_F(AttentionBadInput, NegativeGlobal) {
  opt.num_global = -1;
  expect_error({"'num_global'"});
}
TEST_F(AttentionBadInput, BiasNotBroadcastable) {
  opt.bias = TensorView(buf.data(), DType::f32, {1, 2, 8, 5});
  expect_error({"'bias'", "broadcastable", "[1, 2, 8, 5]"});
}
TEST_F(AttentionBadInput, NonFiniteScale) {
  opt.scale = INFINITY;
  expect_error({"'scale'", "finite"});
}
TEST_F(AttentionBadInput, GswaNonFiniteScale) {
  PaperGswaOptions g;
  g.split_a = 4;
  g.window = 2;
  g.scale_b = INFINITY;
  try {
    paper_gswa_forward(q, k, v, o, o, o, lv, lv, g);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("paper_gswa_forward: argument 'scale_b'"), std::string::npos) << e.what();
  }
}
// 2^24 keys in reach of a causal mask: the forward's fp32 positions would be inexact (it dropped
// the newest keys of every row); a clear error instead. Stride-0 k and v: no memory needed.
TEST_F(AttentionBadInput, CausalOver2To24KeysInReach) {
  for (TensorView* t : {&k, &v}) {
    t->shape[1] = (int64_t(1) << 24) + 300;
    t->stride[1] = 0;
  }
  opt.causal = true;
  expect_error({"attention_forward: argument 'k'", "16777216", "16777516"});
  opt.window_left = 64;  // a window bounds the reach: the same call is fine
  EXPECT_NO_THROW(attention_forward(q, k, v, o, lv, opt));
}
TEST_F(AttentionBadInput, BiasDtypeNamesOnlyAcceptedDtypes) {
  std::vector<double> bias(64, 0.0);
  opt.bias = TensorView(bias.data(), DType::f64, {1, 1, 8, 8});
  expect_error({"'bias'", "expected dtype float32, got float64"});
}
// One of heads_q, heads_kv must divide the other (GQA or a shared query).
TEST_F(AttentionBadInput, HeadsDividingNeitherWay) {
  k.shape[2] = v.shape[2] = 3;
  expect_error({"attention_forward: argument 'k'", "heads dividing q's heads (2) (GQA) or a multiple of them",
                "got 3"});
}
// With a shared query, o and lse have the kv heads.
TEST_F(AttentionBadInput, SharedQueryOutputWithQueryHeads) {
  q.shape[2] = 1;  // 1 query head, 2 kv heads: o must have 2 heads
  o.shape[2] = 1;
  expect_error({"'o'", "heads=2", "got (batch=1, seq=8, heads=1, dim=16)"});
  o.shape[2] = 2;
  lv.shape[1] = 1;
  expect_error({"'lse'", "shape [1, 2, 8]", "got [1, 1, 8]"});
}
// Outputs whose elements overlap (e.g. an expand()ed tensor) would be written over one another.
TEST_F(AttentionBadInput, OverlappingOutputs) {
  o.stride[2] = 0;
  expect_error({"attention_forward: argument 'o'", "do not overlap", "stride 0 on dim 2"});
  o.stride[2] = 16;
  lv.stride[2] = 0;
  expect_error({"attention_forward: argument 'lse'", "do not overlap"});
  lv.stride[2] = 1;
  o.stride[1] = 8;  // rows of seq and heads interleaved over one another
  expect_error({"argument 'o'", "do not overlap"});
}
TEST_F(AttentionBadInput, OverlappingGradients) {
  std::vector<float> grads(4 * 256, 0.f);
  TensorView dq(grads.data(), DType::f32, {1, 8, 2, 16}), dk(grads.data() + 256, DType::f32, {1, 8, 2, 16});
  TensorView dv(grads.data() + 512, DType::f32, {1, 8, 2, 16}), dout(grads.data() + 768, DType::f32, {1, 8, 2, 16});
  dq.stride[2] = 0;
  test::expect_error([&] { attention_backward(q, k, v, o, lv, dout, dq, dk, dv, opt); },
                     {"attention_backward: argument 'dq'", "do not overlap"});
  dq.stride[2] = 16;
  dv.stride[1] = 0;
  test::expect_error([&] { attention_backward(q, k, v, o, lv, dout, dq, dk, dv, opt); },
                     {"attention_backward: argument 'dv'", "do not overlap"});
}
TEST_F(AttentionBadInput, GswaSplitOutOfRange) {
  PaperGswaOptions g;
  g.split_a = 16;
  g.window = 4;
  test::expect_error([&] { paper_gswa_forward(q, k, v, o, o, o, lv, lv, g); }, {"'split_a'"});
}

}  // namespace
}  // namespace strata
