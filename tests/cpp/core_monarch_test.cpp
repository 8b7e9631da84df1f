// tests/cpp/core_monarch_test.cpp: MonarchAttention. The CPU kernel (every ISA this CPU has)
// against the double-precision reference over lengths, block sizes, steps, masks, padding sides,
// modes, GQA, dtypes, layouts and strides (forward output and all three gradients); the
// reference's gradients against central finite differences (float64); the exact cases (B = 1 and
// B >= N are softmax attention); the variational objective; saved state; threads; bad options (the
// checks every family shares are in core_checks_test.cpp). The sweep runs on kernel_harness.h.
//
// Tolerances (normwise: max abs error / max(max |reference|, floor)):
//   fp32 forward 2e-5: every step is fp32 GEMMs of length D, B or M and two softmaxes (exp2
//     polynomial < 2e-8 relative), repeated T <= 3 times; round-off ~ eps * sqrt(n) ~ 1e-6 per
//     product, and logit errors of that size move outputs by as much. Measured max 1.5e-6 over
//     the sweep (all ISAs), so 2e-5 is a 13x margin.
//   fp32 gradients 1e-4: the backward subtracts row dots (the softmax Jacobians, and the
//     "- dabar.abar" term of the normalisation) twice per step, cancellation that costs up to
//     ~10x the forward's error; measured max 6e-6. Floor 1e-2: U(-1, 1) inputs give gradients
//     of order 0.1 - 1, and the floor stops an all-but-zero gradient (N = 1: dq = dk = 0) from
//     dividing round-off by ~0.
//   bf16 1e-2: both sides read the same bf16 inputs; the kernel rounds only its outputs (and
//     the gradients) to bf16, relative 2^-9 = 2e-3 (measured max 3.5e-3), a 3x margin.
//   finite differences: central, h = 1e-5 on the float64 reference: truncation ~h^2 * f''' ~1e-10,
//     cancellation ~1e-16 / h ~ 1e-11; 1e-6 relative leaves a wide margin and still catches any
//     missing term of the adjoint (those are O(1) relative).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "strata/attention.h"
#include "strata/cpu.h"
#include "strata/monarch.h"
#include "strata/threading.h"
#include "kernel_harness.h"

namespace strata {
namespace {

using test::Owned4;

struct Case : test::Storage {
  int64_t Bt = 1, N = 7, Hq = 2, Hkv = 1, D = 16, Dv = 16;
  int64_t block = 0, T = 1;
  bool pre = false, ref = false, mask = false;
  double amp = 1.0;  // q, k ~ U(-amp, amp): larger gives peakier softmaxes
  float scale = std::numeric_limits<float>::quiet_NaN();  // NaN: the default 1/sqrt(D)
  std::string name() const {
    return detail::cat("Bt", Bt, "_N", N, "_Hq", Hq, "_Hkv", Hkv, "_D", D, "_Dv", Dv, "_B", block, "_T", T,
                       pre ? "_pre" : "_post", ref ? "_ref" : "_stable", mask ? "_mask" : "",
                       amp != 1.0 ? "_amp" : "", std::isnan(scale) ? "" : "_scale", "_", storage_name());
  }
};

MonarchOptions options(const Case& c) {
  MonarchOptions o;
  o.num_steps = c.T;
  o.block_size = c.block;
  o.pad = c.pre ? MonarchPad::pre : MonarchPad::post;
  o.mode = c.ref ? MonarchMode::reference : MonarchMode::stable;
  o.layout = c.layout;
  o.scale = c.scale;
  return o;
}

// About a quarter of the tokens masked; in batch 0 also the whole second block (an empty key
// block), and in batch 1 (if any) the first token.
std::vector<uint8_t> make_mask(const Case& c, std::mt19937& rng) {
  std::vector<uint8_t> m(size_t(c.Bt * c.N));
  for (auto& x : m) x = (rng() % 4) != 0;
  const MonarchGeometry g = monarch_geometry(c.N, options(c));
  if (g.num_blocks >= 3)
    for (int64_t p = g.block_size; p < 2 * g.block_size; ++p) {
      const int64_t n = p - g.pad_front;
      if (n >= 0 && n < c.N) m[size_t(n)] = 0;
    }
  if (c.Bt > 1) m[size_t(c.N)] = 0;
  return m;
}

TensorView state_view(std::vector<float>& buf, const Case& c) {
  const MonarchGeometry g = monarch_geometry(c.N, options(c));
  buf.assign(size_t(c.Bt * c.Hq * (c.T - 1) * g.padded_len * c.D), -7.f);
  TensorView s;
  s.data = buf.data();
  s.dtype = DType::f32;
  s.ndim = 5;
  const int64_t shape[5] = {c.Bt, c.Hq, c.T - 1, g.padded_len, c.D};
  int64_t st = 1;
  for (int i = 4; i >= 0; --i) {
    s.shape[i] = shape[i];
    s.stride[i] = st;
    st *= shape[i];
  }
  return s;
}

// The Monarch family's adapter for the harness (kernel_harness.h), and the problem (inputs, mask,
// options) every other test here builds from a case. No lse; the backward reads the forward's
// saved state on every ISA but AVX2, so both backward paths run.
struct MonarchFamily {
  using Case = ::strata::Case;
  double scalar_max_work = 4e6;  // multiply-adds of forward + backward, about (work())
  Case c;
  test::Inputs in;
  std::vector<uint8_t> mask;
  MonarchOptions opt;
  std::vector<float> state_buf;
  TensorView state;

  MonarchFamily(const Case& c_, unsigned seed) : c(c_), opt(options(c)) {
    std::mt19937 rng(seed);
    in = test::make_inputs(shape(), rng, c.amp);
    if (c.mask) {
      mask = make_mask(c, rng);
      opt.key_padding_mask = TensorView(mask.data(), DType::u8, {c.Bt, c.N});
    }
  }
  explicit MonarchFamily(const Case& c_)
      : MonarchFamily(c_, 1234 + unsigned(c_.N * 31 + c_.block * 7 + c_.T + c_.D)) {}
  MonarchFamily(const MonarchFamily&) = delete;  // opt points into mask

  test::Shape shape() const {
    return test::shape_of(c, {c.Bt, c.N, c.N, c.Hq, c.Hkv, c.D, c.Dv});
  }
  double work() const {
    const MonarchGeometry g = monarch_geometry(c.N, opt);
    return double(c.Bt * c.Hq) * c.N * (c.D + c.Dv) * (2 * g.block_size + 2 * g.num_blocks) * c.T;
  }
  bool grads() const { return true; }
  test::Tolerance tolerance() const {  // see the file comment
    return c.dtype == DType::bf16 ? test::Tolerance{1e-2, 1e-2} : test::Tolerance{2e-5, 1e-4};
  }
  std::vector<test::Expected> references() const {
    test::Expected r("the reference", shape(), /*with_lse=*/false, /*grads=*/true);
    reference::monarch_attention_forward(in.q.view, in.k.view, in.v.view, opt, r.o.data());
    reference::monarch_attention_backward(in.q.view, in.k.view, in.v.view, in.dout.view, opt, r.dq.data(),
                                          r.dk.data(), r.dv.data());
    return {r};
  }
  std::vector<const char*> kernels() const { return {""}; }
  void forward(size_t, Isa isa, test::Outputs& out) {
    state = c.T > 1 && isa != Isa::avx2 ? state_view(state_buf, c) : TensorView();
    kernel_forward(out.o.view, state);
  }
  void backward(size_t, Isa, test::Outputs& out) { kernel_backward(state, out.dq.view, out.dk.view, out.dv.view); }

  // The kernel on these inputs and options, with any state (TensorView(): none) and outputs.
  void kernel_forward(const TensorView& o, const TensorView& st) const {
    monarch_attention_forward(in.q.view, in.k.view, in.v.view, o, st, opt);
  }
  void kernel_backward(const TensorView& st, const TensorView& dq, const TensorView& dk, const TensorView& dv) const {
    monarch_attention_backward(in.q.view, in.k.view, in.v.view, st, in.dout.view, dq, dk, dv, opt);
  }
};

bool has_nan(const Owned4& t, int64_t B, int64_t S, int64_t H, int64_t D, Layout l) {
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t d = 0; d < D; ++d)
          if (std::isnan(t.at(b, s, h, d, l))) return true;
  return false;
}

using MonarchSweep = test::KernelSweep<MonarchFamily>;
TEST_P(MonarchSweep, MatchesReference) { test::run_case<MonarchFamily>(GetParam()); }

// Lengths x block sizes x steps, both modes and padding sides, with and without a mask.
std::vector<Case> length_cases() {
  std::vector<Case> v;
  for (int64_t n : {1, 7, 97, 256}) {
    std::vector<int64_t> blocks = {0, 1, 3, 16, n, n + 5};
    if (n == 1) blocks = {0, 1, 3};
    if (n == 97) blocks = {0, 1, 8, 20, 97, 128};
    if (n == 256) blocks = {0, 1, 12, 40, 256};
    for (int64_t blk : blocks)
      for (int64_t T : {1, 2, 3}) {
        if (n >= 97 && blk == 1 && T != 2) continue;  // B = 1 is M = N blocks: slow, one T is enough
        Case c;
        c.N = n;
        c.block = blk;
        c.T = T;
        const int64_t sel = n + blk * 3 + T;  // rotate the switches so that every combination appears
        c.pre = sel % 2 == 1;
        c.ref = (sel / 2) % 2 == 1;
        c.mask = (sel / 4) % 2 == 1 || n == 7;
        v.push_back(c);
        if (n == 97 && blk == 8) {  // the same case with every switch flipped
          c.pre = !c.pre;
          c.ref = !c.ref;
          c.mask = !c.mask;
          v.push_back(c);
        }
      }
  }
  // more than 128 blocks and more than 64 offsets: the kernel's lane and row chunking
  for (int64_t blk : {2, 150}) {
    Case c;
    c.N = 300;
    c.block = blk;
    c.T = 3;
    c.ref = blk == 2;
    c.mask = true;
    c.pre = blk == 150;
    v.push_back(c);
  }
  // peaky softmaxes (large logits) in both modes
  for (bool ref : {false, true}) {
    Case c;
    c.N = 97;
    c.block = 10;
    c.T = 3;
    c.amp = 3.0;
    c.ref = ref;
    c.mask = true;
    c.D = c.Dv = 32;
    v.push_back(c);
  }
  return v;
}

std::vector<Case> shape_cases() {
  std::vector<Case> v;
  for (auto [hq, hkv] : {std::pair<int64_t, int64_t>{4, 4}, {4, 2}, {4, 1}}) {  // MHA, GQA, MQA
    Case c;
    c.Bt = 2;
    c.Hq = hq;
    c.Hkv = hkv;
    c.N = 50;
    c.T = 2;
    c.mask = hkv == 2;
    v.push_back(c);
  }
  for (auto [d, dv] : {std::pair<int64_t, int64_t>{1, 3}, {59, 48}, {64, 64}, {128, 24}}) {
    Case c;
    c.N = 61;
    c.D = d;
    c.Dv = dv;
    c.T = 2;
    c.ref = d == 59;
    if (d == 59 || d == 1) c.scale = d == 1 ? 1.7f : 0.3f;
    v.push_back(c);
  }
  for (const test::Storage& st : test::every_storage()) {
    Case c;
    c.set_storage(st);
    c.Bt = 2;
    c.N = 45;
    c.Hq = 4;
    c.Hkv = 2;
    c.D = 24;
    c.Dv = 20;
    c.T = 2;
    c.block = 6;
    c.mask = st.dim_stride > 1;
    c.pre = st.gap > 0;
    c.ref = st.layout == Layout::BHSD && st.dtype == DType::f32;
    v.push_back(c);
  }
  {
    Case c;  // bf16, longer, every switch on
    c.dtype = DType::bf16;
    c.N = 300;
    c.D = c.Dv = 64;
    c.T = 3;
    c.mask = true;
    c.pre = true;
    v.push_back(c);
  }
  return v;
}

std::string case_name(const ::testing::TestParamInfo<Case>& i) { return i.param.name(); }

INSTANTIATE_TEST_SUITE_P(Lengths, MonarchSweep, ::testing::ValuesIn(length_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Shapes, MonarchSweep, ::testing::ValuesIn(shape_cases()), case_name);

// ---- bf16 products (MonarchOptions::compute, strata/cpu.h) --------------------------------------
// bf16 inputs with compute = avx512_bf16 / amx_bf16 (opt in: auto keeps fp32) run the forward's six
// products on that engine (strata/monarch.h): the inputs exactly, R, L and y rounded to bf16 where
// they weigh outputs, R, al, w L and abar as hi + lo bf16 parts where they feed a logit; and the
// backward's gradient products, their intermediates (R, L, y, al, abar, du, ds', dal, dy, dabar)
// rounded once, as attention's P and dS. Every case of the sweep, in bf16, is held to the
// reference on every engine this CPU has, and the engine is checked to be the one that runs; the
// cases cover what the path adds: K dims padded to 32 (D = 1, 24, 59, 128; B and M from 1 to
// 300), row chunks of 64 and lane chunks of 128 with their 16-row remainders (B = 150, M = 150),
// T = 1..3 (abar rounded on the way into the next R-step), both modes, masks, padding sides, GQA.
//
// Tolerance: 2e-2 forward and gradients. The gradients: each gradient product reads one or two
// operands rounded to bf16 (relative 2^-9 each, as the dense kernel's bf16 backward), chained
// through up to T R- and L-steps; measured max over the sweep 8.3e-3 (dv; N = 97, B = 10, T = 3,
// reference mode, masked, peaky; avx512_bf16, on an AMD EPYC without AMX), against 3.7e-3 with the
// backward's products in fp32; the dense kernel's bf16 gradients are held to 2e-2 too. A 2% error
// in the scale of one gradient product fails 22 (dabar) to 73 (dy) of the 81 cases; V dy^T left
// out of dP fails 64. The forward's new errors beside the output's own rounding (2^-9 = 2e-3):
// the weights of y = R v and o = L y rounded (each off by a relative 2^-9, independently: about
// 2^-9 of the spread of the averaged rows, as attention's P, times the few products in a row),
// and y rounded (2^-9 again); the logits' operands are split, so they add ~2^-17. Measured max
// over the sweep (both engines): o 8.8e-3 (N = 97, B = 20, reference mode: an output small beside
// its values). With the logits' operands rounded once instead of split, o reached 1.2e-2 and dk
// 2.0e-2 (T = 3, amp 3). A 2% error in the scale of o's product
// fails 73 cases, of a's 43, of S's or U's 3 (a logit scale error moves outputs little).
struct MonarchBf16Family : MonarchFamily {
  using MonarchFamily::MonarchFamily;
  test::Tolerance tolerance() const { return test::Tolerance{2e-2, 2e-2}; }
};
using MonarchBf16ComputeSweep = ::testing::TestWithParam<Case>;
TEST_P(MonarchBf16ComputeSweep, EveryEngineMatchesReference) {
  MonarchBf16Family f(GetParam());
  test::check_bf16_engines(f, [&](Compute e) { EXPECT_EQ(monarch_attention_compute(f.shape().d, f.opt), e); });
}

// Every case of the sweep in bf16 (BSHD; the storages are the shape cases' own bf16 ones), and a
// longer sequence at the paper's sizes (D = 64, B = floor(sqrt(N)) = 32, M = 33 with padding).
std::vector<Case> bf16_compute_cases() {
  std::vector<Case> v;
  std::set<std::string> names;  // the fp32 storage case made bf16 is the bf16 one
  for (auto cases : {length_cases(), shape_cases()})
    for (Case c : cases) {
      if (c.dtype != DType::bf16 && !(c.layout == Layout::BSHD && c.gap == 0 && c.dim_stride == 1)) continue;
      c.dtype = DType::bf16;
      if (names.insert(c.name()).second) v.push_back(c);
    }
  for (int64_t T : {1, 2}) {
    Case c;
    c.dtype = DType::bf16;
    c.N = 1025;
    c.Hq = c.Hkv = 1;
    c.D = c.Dv = 64;
    c.T = T;
    c.mask = T == 2;
    v.push_back(c);
  }
  return v;
}
INSTANTIATE_TEST_SUITE_P(Bf16Compute, MonarchBf16ComputeSweep, ::testing::ValuesIn(bf16_compute_cases()), case_name);

// compute = fp32 keeps a bf16 forward on fp32 products; an engine the CPU or the active ISA lacks
// is an error naming 'compute'; float32 inputs compute in fp32 whatever compute asks.
TEST(Monarch, ComputeOptionResolves) {
  test::IsaGuard guard;
  const auto compute_of = [](AttnDims d, Compute c) {
    MonarchOptions o;
    o.compute = c;
    return monarch_attention_compute(d, o);
  };
  test::check_compute_rules("monarch_attention_compute", compute_of);
  if (test::bf16_engines().empty()) return;
  AttnDims d;  // bf16 at avx512 with engines here: auto still keeps fp32 (strata/monarch.h)
  d.dtype = DType::bf16;
  d.batch = d.heads_q = d.heads_kv = 1;
  d.seqlen_q = d.seqlen_k = 300;
  d.head_dim = d.head_dim_v = 16;
  EXPECT_EQ(compute_of(d, Compute::automatic), Compute::fp32);
}

// ---- finite differences of the float64 reference ------------------------------------------------

// Loss = sum(dout * O) with the double reference; returns the central-difference gradient of one
// tensor (which = 0: q, 1: k, 2: v) and compares it with reference::monarch_attention_backward.
void check_fd(const Case& c) {
  SCOPED_TRACE(c.name());
  Case cd = c;
  cd.dtype = DType::f64;
  MonarchFamily P(cd, 99 + unsigned(c.N + c.T));
  const int64_t no = c.Bt * c.N * c.Hq * c.Dv;
  std::vector<double> gq(size_t(c.Bt * c.N * c.Hq * c.D)), gk(size_t(c.Bt * c.N * c.Hkv * c.D));
  std::vector<double> gv(size_t(c.Bt * c.N * c.Hkv * c.Dv)), o(static_cast<size_t>(no));
  reference::monarch_attention_backward(P.in.q.view, P.in.k.view, P.in.v.view, P.in.dout.view, P.opt, gq.data(),
                                        gk.data(), gv.data());
  auto loss = [&]() {
    reference::monarch_attention_forward(P.in.q.view, P.in.k.view, P.in.v.view, P.opt, o.data());
    double s = 0;
    for (int64_t b = 0; b < c.Bt; ++b)
      for (int64_t n = 0; n < c.N; ++n)
        for (int64_t h = 0; h < c.Hq; ++h)
          for (int64_t d = 0; d < c.Dv; ++d)
            s += o[size_t(((b * c.N + n) * c.Hq + h) * c.Dv + d)] * P.in.dout.at(b, n, h, d, c.layout);
    return s;
  };
  const double h = 1e-5;
  Owned4* ts[3] = {&P.in.q, &P.in.k, &P.in.v};
  const std::vector<double>* an[3] = {&gq, &gk, &gv};
  const char* names[3] = {"dq", "dk", "dv"};
  for (int w = 0; w < 3; ++w) {
    Owned4& t = *ts[w];
    const int64_t H = t.view.shape[c.layout == Layout::BSHD ? 2 : 1], D = t.view.shape[3];
    double err = 0, mx = 0;
    for (int64_t b = 0; b < c.Bt; ++b)
      for (int64_t n = 0; n < c.N; ++n)
        for (int64_t hh = 0; hh < H; ++hh)
          for (int64_t d = 0; d < D; ++d) {
            int64_t idx[4] = {b, n, hh, d};
            if (c.layout == Layout::BHSD) std::swap(idx[1], idx[2]);
            const double x0 = t.view.get(idx);
            t.view.set(idx, x0 + h);
            const double fp = loss();
            t.view.set(idx, x0 - h);
            const double fm = loss();
            t.view.set(idx, x0);
            const double fd = (fp - fm) / (2 * h);
            const double a = (*an[w])[size_t(((b * c.N + n) * H + hh) * D + d)];
            err = std::max(err, std::fabs(fd - a));
            mx = std::max(mx, std::fabs(fd));
          }
    EXPECT_GT(mx, 1e-3) << names[w] << ": a gradient that is all zero proves nothing";
    EXPECT_LE(err / std::max(mx, 1e-3), 1e-6) << names[w];
  }
}

TEST(MonarchGradients, ReferenceMatchesFiniteDifferences) {
  Case c;
  c.N = 7;
  c.Hq = 2;
  c.Hkv = 1;
  c.D = 3;
  c.Dv = 2;
  c.block = 3;
  c.amp = 2.0;
  for (int64_t T : {1, 3})
    for (bool ref : {false, true})
      for (bool pre : {false, true}) {
        c.T = T;
        c.ref = ref;
        c.pre = pre;
        c.mask = pre;
        check_fd(c);
      }
  Case e;  // an empty key block (batch 0, block 1) and a masked first token in batch 1; BHSD
  e.Bt = 2;
  e.N = 10;
  e.Hq = e.Hkv = 1;
  e.D = 3;
  e.Dv = 2;
  e.block = 3;
  e.T = 2;
  e.mask = true;
  e.amp = 2.0;
  e.layout = Layout::BHSD;
  e.scale = 0.8f;
  for (bool ref : {false, true}) {
    e.ref = ref;
    check_fd(e);
  }
}

// ---- exact cases: B = 1 and B >= N are softmax attention ---------------------------------------

// Compares Monarch (kernel and reference) with exact attention on the valid query rows.
void check_exact(int64_t N, int64_t block, int64_t T, bool ref, bool mask, bool pre) {
  SCOPED_TRACE(detail::cat("N", N, " B", block, " T", T, ref ? " ref" : " stable", mask ? " mask" : "",
                           pre ? " pre" : ""));
  test::IsaGuard guard;
  Case c;
  c.Bt = 2;
  c.N = N;
  c.Hq = 2;
  c.Hkv = 1;
  c.D = 16;
  c.Dv = 8;
  c.block = block;
  c.T = T;
  c.ref = ref;
  c.pre = pre;
  c.amp = 2.0;
  MonarchFamily P(c, 7 + unsigned(N + block + T));
  std::vector<uint8_t> m(size_t(c.Bt * N), 1);
  if (mask) {
    for (size_t i = 0; i < m.size(); ++i) m[i] = (i * 7 + 3) % 5 != 0;
    P.opt.key_padding_mask = TensorView(m.data(), DType::u8, {c.Bt, N});
    // masked queries are excluded in stable mode: compare gradients with dO = 0 on them
    for (int64_t b = 0; b < c.Bt; ++b)
      for (int64_t n = 0; n < N; ++n)
        if (!m[size_t(b * N + n)])
          for (int64_t h = 0; h < c.Hq; ++h)
            for (int64_t d = 0; d < c.Dv; ++d) {
              int64_t idx[4] = {b, n, h, d};
              P.in.dout.view.set(idx, 0.0);
            }
  }
  AttentionOptions ao;
  ao.key_padding_mask = P.opt.key_padding_mask;
  std::vector<double> eo(size_t(c.Bt * N * c.Hq * c.Dv)), lse(size_t(c.Bt * c.Hq * N));
  reference::attention_forward(P.in.q.view, P.in.k.view, P.in.v.view, ao, eo.data(), lse.data());
  std::vector<double> edq(size_t(c.Bt * N * c.Hq * c.D)), edk(size_t(c.Bt * N * c.D)), edv(size_t(c.Bt * N * c.Dv));
  reference::attention_backward(P.in.q.view, P.in.k.view, P.in.v.view, P.in.dout.view, ao, edq.data(), edk.data(),
                                edv.data());
  // the exact output on valid rows; on masked rows 0 in stable mode (reference mode, T = 1, one
  // block: still the exact row, as ma_torch.py feeds every query to the first R-step)
  for (int64_t b = 0; b < c.Bt && !ref; ++b)
    for (int64_t n = 0; n < N; ++n)
      if (!m[size_t(b * N + n)])
        for (int64_t h = 0; h < c.Hq; ++h)
          for (int64_t d = 0; d < c.Dv; ++d) eo[size_t(((b * N + n) * c.Hq + h) * c.Dv + d)] = 0.0;

  std::vector<double> ro(eo.size());
  reference::monarch_attention_forward(P.in.q.view, P.in.k.view, P.in.v.view, P.opt, ro.data());
  double err = 0;
  for (size_t i = 0; i < ro.size(); ++i) err = std::max(err, std::fabs(ro[i] - eo[i]));
  EXPECT_LE(err, 1e-10) << "reference vs exact attention";

  for (Isa isa : test::isas_to_test()) {
    SCOPED_TRACE(isa_name(isa));
    set_isa(isa);
    Owned4 o(c.Bt, N, c.Hq, c.Dv, DType::f32, Layout::BSHD);
    P.kernel_forward(o.view, TensorView());
    EXPECT_LE(test::rel_err(o, Layout::BSHD, eo, c.Bt, N, c.Hq, c.Dv), 2e-5);
    Owned4 dq(c.Bt, N, c.Hq, c.D, DType::f32, Layout::BSHD), dk(c.Bt, N, 1, c.D, DType::f32, Layout::BSHD);
    Owned4 dv(c.Bt, N, 1, c.Dv, DType::f32, Layout::BSHD);
    P.kernel_backward(TensorView(), dq.view, dk.view, dv.view);
    EXPECT_LE(test::rel_err(dq, Layout::BSHD, edq, c.Bt, N, c.Hq, c.D, 1e-2), 1e-4) << "dq";
    EXPECT_LE(test::rel_err(dk, Layout::BSHD, edk, c.Bt, N, 1, c.D, 1e-2), 1e-4) << "dk";
    EXPECT_LE(test::rel_err(dv, Layout::BSHD, edv, c.Bt, N, 1, c.Dv, 1e-2), 1e-4) << "dv";
  }
}

TEST(MonarchExact, BlockSizeOneIsSoftmaxAttention) {
  for (int64_t T : {1, 3}) {
    check_exact(23, 1, T, false, false, false);
    check_exact(23, 1, T, true, false, false);
    check_exact(23, 1, T, false, true, false);
  }
}

TEST(MonarchExact, OneBlockIsSoftmaxAttention) {
  for (int64_t T : {1, 2}) {
    for (int64_t block : {29, 40}) {  // B = N and B > N (one block either way)
      check_exact(29, block, T, false, false, block > 29);
      check_exact(29, block, T, true, false, false);
      check_exact(29, block, T, false, true, true);
    }
  }
  check_exact(1, 0, 2, false, false, false);  // N = 1: B = 1 = N
  // reference mode with a mask, T = 1: masked queries still get an exact row (ar = q)
  check_exact(29, 29, 1, true, true, false);
}

// ---- the variational objective -------------------------------------------------------------------

TEST(MonarchObjective, NeverDecreasesAndStaysBelowSoftmax) {
  struct Obj {
    int64_t N, block, T;
    bool mask, pre, ref;
  };
  for (const Obj& s : {Obj{29, 5, 6, false, false, false}, Obj{29, 5, 6, true, true, false},
                       Obj{40, 4, 5, true, false, false}, Obj{33, 6, 5, false, true, true},
                       Obj{16, 4, 4, false, false, true}}) {
    SCOPED_TRACE(detail::cat("N", s.N, " B", s.block, " T", s.T, s.mask ? " mask" : "", s.pre ? " pre" : "",
                             s.ref ? " ref" : ""));
    Case c;
    c.Bt = 2;
    c.N = s.N;
    c.Hq = c.Hkv = 2;
    c.D = 8;
    c.block = s.block;
    c.T = s.T;
    c.mask = s.mask;
    c.pre = s.pre;
    c.ref = s.ref;
    c.amp = 2.5;
    MonarchFamily P(c, 31 + unsigned(s.N));
    std::vector<double> f(size_t(c.Bt * c.Hq * c.T * 2));
    reference::monarch_objective_trace(P.in.q.view, P.in.k.view, P.opt, f.data());
    // the exact maximum: sum over valid query rows of lse (softmax is the maximiser)
    AttentionOptions ao;
    ao.key_padding_mask = P.opt.key_padding_mask;
    std::vector<double> eo(size_t(c.Bt * c.N * c.Hq * c.Dv)), lse(size_t(c.Bt * c.Hq * c.N));
    reference::attention_forward(P.in.q.view, P.in.k.view, P.in.v.view, ao, eo.data(), lse.data());
    for (int64_t b = 0; b < c.Bt; ++b)
      for (int64_t h = 0; h < c.Hq; ++h) {
        double fmax = 0;
        for (int64_t n = 0; n < c.N; ++n)
          if (!s.mask || P.mask[size_t(b * c.N + n)]) fmax += lse[size_t((b * c.Hq + h) * c.N + n)];
        const double* tr = &f[size_t((b * c.Hq + h) * c.T * 2)];
        for (int64_t i = 0; i < 2 * c.T; ++i) {
          EXPECT_LE(tr[i], fmax + 1e-9 * std::fabs(fmax)) << "half step " << i;
          if (i > 0) {
            EXPECT_GE(tr[i], tr[i - 1] - 1e-9 * std::fabs(tr[i])) << "half step " << i;
          }
        }
        EXPECT_GT(tr[2 * c.T - 1], tr[0] + 1e-3) << "the iteration should make progress";
      }
  }
  // one block: the first R-step is already the exact softmax, so f = sum lse from the start
  Case c;
  c.N = 20;
  c.Hq = c.Hkv = 1;
  c.block = 20;
  c.T = 2;
  MonarchFamily P(c, 5);
  std::vector<double> f(4), eo(size_t(c.N * c.Dv)), lse(size_t(c.N));
  reference::monarch_objective_trace(P.in.q.view, P.in.k.view, P.opt, f.data());
  reference::attention_forward(P.in.q.view, P.in.k.view, P.in.v.view, AttentionOptions(), eo.data(), lse.data());
  double fmax = 0;
  for (double x : lse) fmax += x;
  for (double x : f) EXPECT_NEAR(x, fmax, 1e-9 * std::fabs(fmax));
}

// ---- saved state, threads, special inputs --------------------------------------------------------

TEST(MonarchState, BackwardWithSavedStateEqualsRecompute) {
  Case c;
  c.Bt = 2;
  c.N = 70;
  c.Hq = 2;
  c.Hkv = 1;
  c.T = 3;
  c.mask = true;
  c.pre = true;
  MonarchFamily P(c, 17);
  std::vector<float> sbuf;
  const TensorView st = state_view(sbuf, c);
  Owned4 o1(c.Bt, c.N, c.Hq, c.Dv, c.dtype, c.layout), o2 = o1;
  o2.view.data = o2.buf.data();
  P.kernel_forward(o1.view, st);
  P.kernel_forward(o2.view, TensorView());
  EXPECT_EQ(o1.buf, o2.buf) << "writing the state must not change the output";
  for (float x : sbuf) ASSERT_NE(x, -7.f) << "every state entry is written";
  Owned4 g1[3] = {Owned4(c.Bt, c.N, c.Hq, c.D, c.dtype, c.layout), Owned4(c.Bt, c.N, c.Hkv, c.D, c.dtype, c.layout),
                  Owned4(c.Bt, c.N, c.Hkv, c.Dv, c.dtype, c.layout)};
  Owned4 g2[3] = {g1[0], g1[1], g1[2]};
  for (Owned4& t : g2) t.view.data = t.buf.data();
  P.kernel_backward(st, g1[0].view, g1[1].view, g1[2].view);
  P.kernel_backward(TensorView(), g2[0].view, g2[1].view, g2[2].view);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(g1[i].buf, g2[i].buf) << "gradient " << i;
  // a different state gives different gradients: the backward really reads it
  for (float& x : sbuf) x *= 0.5f;
  P.kernel_backward(st, g1[0].view, g1[1].view, g1[2].view);
  EXPECT_NE(g1[0].buf, g2[0].buf);
}

TEST(MonarchState, OneBlockStateIsQ) {
  // one block, no mask: L = 1 and c = 1, so every later R-step input is q itself
  Case c;
  c.N = 12;
  c.Hq = c.Hkv = 1;
  c.block = 12;
  c.T = 3;
  MonarchFamily P(c, 3);
  std::vector<float> sbuf;
  const TensorView st = state_view(sbuf, c);
  Owned4 o(c.Bt, c.N, c.Hq, c.Dv, c.dtype, c.layout);
  P.kernel_forward(o.view, st);
  for (int64_t s = 0; s < c.T - 1; ++s)
    for (int64_t n = 0; n < c.N; ++n)
      for (int64_t d = 0; d < c.D; ++d)
        EXPECT_NEAR(sbuf[size_t((s * c.N + n) * c.D + d)], P.in.q.at(0, n, 0, d, c.layout), 1e-6);
}

TEST(MonarchThreads, ThreadCountAndPlanDoNotChangeResults) {
  const int saved = get_num_threads();
  for (int64_t heads : {1, 3, 8}) {  // on 3 threads: 1 and 8 heads split each head's blocks, 3 run whole
    Case c;
    c.N = 130;
    c.Hq = heads;
    c.Hkv = 1;
    c.T = 2;
    c.mask = true;
    MonarchFamily P(c, 41);
    std::vector<float> out[2];
    for (int t : {1, 3}) {
      set_num_threads(t);
      Owned4 o(c.Bt, c.N, c.Hq, c.Dv, c.dtype, c.layout), dq(c.Bt, c.N, c.Hq, c.D, c.dtype, c.layout);
      Owned4 dk(c.Bt, c.N, 1, c.D, c.dtype, c.layout), dv(c.Bt, c.N, 1, c.Dv, c.dtype, c.layout);
      P.kernel_forward(o.view, TensorView());
      P.kernel_backward(TensorView(), dq.view, dk.view, dv.view);
      for (const Owned4* x : {&o, &dq, &dk, &dv}) {
        const float* f = reinterpret_cast<const float*>(x->buf.data());
        out[t == 3].insert(out[t == 3].end(), f, f + x->buf.size() / 4);
      }
    }
    EXPECT_EQ(out[0], out[1]) << heads << " heads";
  }
  set_num_threads(saved);
}

TEST(MonarchSpecial, FullyMaskedInputsNeverNaN) {
  // batch 0: every token masked; batch 1: one fully masked block and one lone valid token
  const int64_t Bt = 2, N = 30, H = 2, D = 8;
  Case c;
  c.Bt = Bt;
  c.N = N;
  c.Hq = c.Hkv = H;
  c.D = c.Dv = D;
  c.block = 5;
  c.T = 3;
  for (bool ref : {false, true}) {
    SCOPED_TRACE(ref ? "reference" : "stable");
    c.ref = ref;
    MonarchFamily P(c, 77);
    std::vector<uint8_t> m(size_t(Bt * N), 1);
    for (int64_t n = 0; n < N; ++n) m[size_t(n)] = 0;
    for (int64_t n = 10; n < 15; ++n) m[size_t(N + n)] = 0;
    P.opt.key_padding_mask = TensorView(m.data(), DType::u8, {Bt, N});
    Owned4 o(Bt, N, H, D, DType::f32, Layout::BSHD), dq = o, dk = o, dv = o;
    for (Owned4* t : {&dq, &dk, &dv}) t->view.data = t->buf.data();
    P.kernel_forward(o.view, TensorView());
    P.kernel_backward(TensorView(), dq.view, dk.view, dv.view);
    for (const Owned4* t : {&o, &dq, &dk, &dv}) EXPECT_FALSE(has_nan(*t, Bt, N, H, D, Layout::BSHD));
    for (int64_t n = 0; n < N; ++n)
      for (int64_t d = 0; d < D; ++d) {
        EXPECT_EQ(o.at(0, n, 1, d, Layout::BSHD), 0.0) << "no valid key: zero output";
        EXPECT_EQ(dk.at(0, n, 1, d, Layout::BSHD), 0.0);
        EXPECT_EQ(dv.at(0, n, 1, d, Layout::BSHD), 0.0);
        if (!ref) {
          EXPECT_EQ(o.at(1, 12, 0, d, Layout::BSHD), 0.0) << "stable: a masked query outputs 0";
        }
      }
    std::vector<double> ro(size_t(Bt * N * H * D));
    reference::monarch_attention_forward(P.in.q.view, P.in.k.view, P.in.v.view, P.opt, ro.data());
    EXPECT_LE(test::rel_err(o, Layout::BSHD, ro, Bt, N, H, D), 2e-5);
  }
}

TEST(MonarchSpecial, ReferenceModeUnderflowQuirk) {
  // Every logit is far below 0 (-200 in block 0, -300 in block 1). ma_torch.py subtracts
  // max(rowmax, 1e-12) instead of the row max, so exp underflows, R = 0, y = 0 and the output is
  // 0; stable mode takes the true softmax (block 0 wins: the mean of its values).
  const int64_t N = 8, D = 4;
  std::vector<float> q(size_t(N * D)), k(size_t(N * D)), v(size_t(N * D));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t d = 0; d < D; ++d) {
      q[size_t(n * D + d)] = d == 0 ? 20.f : 0.f;
      k[size_t(n * D + d)] = d == 0 ? (n < 4 ? -20.f : -30.f) : 0.f;
      v[size_t(n * D + d)] = float(n + d);
    }
  TensorView Q(q.data(), DType::f32, {1, N, 1, D}), K(k.data(), DType::f32, {1, N, 1, D});
  TensorView V(v.data(), DType::f32, {1, N, 1, D});
  MonarchOptions opt;
  opt.block_size = 4;
  Owned4 os(1, N, 1, D, DType::f32, Layout::BSHD), orf = os;
  orf.view.data = orf.buf.data();
  monarch_attention_forward(Q, K, V, os.view, TensorView(), opt);
  opt.mode = MonarchMode::reference;
  monarch_attention_forward(Q, K, V, orf.view, TensorView(), opt);
  std::vector<double> ro(size_t(N * D));
  reference::monarch_attention_forward(Q, K, V, opt, ro.data());
  EXPECT_LE(test::rel_err(orf, Layout::BSHD, ro, 1, N, 1, D), 2e-5);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t d = 0; d < D; ++d) {
      EXPECT_NEAR(orf.at(0, n, 0, d, Layout::BSHD), 0.0, 1e-6) << "reference mode: underflow to 0";
      EXPECT_NEAR(os.at(0, n, 0, d, Layout::BSHD), 1.5 + double(d), 1e-4) << "stable: mean of block 0's v";
    }
}

TEST(MonarchSpecial, EmptySizesAreNoOps) {
  std::vector<float> buf(64, 1.f);
  MonarchOptions opt;
  TensorView q0(buf.data(), DType::f32, {0, 4, 1, 4}), o0(buf.data(), DType::f32, {0, 4, 1, 4});
  EXPECT_NO_THROW(monarch_attention_forward(q0, q0, q0, o0, TensorView(), opt));
  TensorView qn(buf.data(), DType::f32, {1, 0, 1, 4});
  EXPECT_NO_THROW(monarch_attention_forward(qn, qn, qn, qn, TensorView(), opt));
  EXPECT_NO_THROW(monarch_attention_backward(qn, qn, qn, TensorView(), qn, qn, qn, qn, opt));
}

TEST(MonarchGeometryTest, DefaultsAndPadding) {
  MonarchOptions opt;
  EXPECT_EQ(monarch_geometry(197, opt).block_size, 14);
  EXPECT_EQ(monarch_geometry(196, opt).block_size, 14);
  EXPECT_EQ(monarch_geometry(195, opt).block_size, 13);
  EXPECT_EQ(monarch_geometry(1, opt).block_size, 1);
  opt.block_size = 14;
  opt.pad = MonarchPad::pre;
  const MonarchGeometry g = monarch_geometry(197, opt);
  EXPECT_EQ(g.num_blocks, 15);
  EXPECT_EQ(g.padded_len, 210);
  EXPECT_EQ(g.pad_front, 13);
  opt.block_size = 100;
  EXPECT_EQ(monarch_geometry(37, opt).block_size, 37);  // one block
  EXPECT_EQ(monarch_geometry(37, opt).pad_front, 0);
}

// ---- bad options (the checks every family shares: core_checks_test.cpp) ---------------------------

struct MonarchBadInput : ::testing::Test {
  std::vector<float> buf = std::vector<float>(4096, 0.5f);
  TensorView q{buf.data(), DType::f32, {1, 8, 2, 16}}, k{buf.data(), DType::f32, {1, 8, 2, 16}};
  TensorView v{buf.data(), DType::f32, {1, 8, 2, 16}}, o{buf.data() + 1024, DType::f32, {1, 8, 2, 16}};
  TensorView state;
  MonarchOptions opt;
  // Expects the forward (or the backward) to throw strata::Error whose message has every needle.
  void expect_error(const std::vector<std::string>& needles, bool backward = false) {
    test::expect_error(
        [&] {
          if (backward) {
            monarch_attention_backward(q, k, v, state, o, o, k, v, opt);
          } else {
            monarch_attention_forward(q, k, v, o, state, opt);
          }
        },
        needles);
  }
};

TEST_F(MonarchBadInput, ZeroSteps) {
  opt.num_steps = 0;
  expect_error({"'num_steps'", ">= 1", "got 0"});
}
TEST_F(MonarchBadInput, NegativeBlockSize) {
  opt.block_size = -3;
  expect_error({"'block_size'", "-3"});
}
TEST_F(MonarchBadInput, NonFiniteScale) {
  opt.scale = INFINITY;
  expect_error({"'scale'", "finite"});
}
TEST_F(MonarchBadInput, StateWrongShape) {
  opt.num_steps = 3;
  opt.block_size = 3;  // M*B = 9
  state = TensorView(buf.data(), DType::f32, {1, 2, 2, 8, 16});
  expect_error({"'state'", "[1, 2, 2, 9, 16]", "[1, 2, 2, 8, 16]"});
  state = TensorView(buf.data(), DType::bf16, {1, 2, 2, 9, 16});
  expect_error({"'state'", "float32", "bfloat16"}, true);
}

}  // namespace
}  // namespace strata
