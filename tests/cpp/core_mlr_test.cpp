// tests/cpp/core_mlr_test.cpp: the MLR attention CPU kernel (every ISA this CPU has) against the
// two double-precision references (per-pair formula, and the reference code's block-diagonal
// construction), which must also agree with each other; over awkward lengths, 1..8 levels,
// random rank splits, custom block lists, segment boundaries, every scale option, causal or not,
// GQA, fp32/bf16, BHSD and strided views; forward output, lse and all three gradients. Plus:
// L = 1 against the dense kernel, a finite-difference check of the references' gradients, the
// default block rule, empty rows, threads, the FLOP count, and bad options (the checks every
// family shares are in core_checks_test.cpp). The sweep runs on kernel_harness.h.
//
// Tolerances (normwise: max abs error / max abs reference value), as core_attention_test.cpp:
//   fp32: 2e-5 forward, 1e-4 gradients. fp32 round-off in dot products of length <= head_dim and
//   sums over <= Nk ~ 1e3 keys grows like eps * sqrt(n) ~ 1e-6; exp2's polynomial adds < 2e-8.
//   MLR adds nothing new in kind: per-level partial sums (prefix + rectangles) are fp32 sums of
//   the same terms in another order; q is multiplied by c_l in fp32 (one more rounding, 6e-8).
//   Gradients subtract D_i = rowsum(dO*O) from dP (cancellation), so allow 5x more.
//   bf16: inputs are exactly representable for both sides; the kernel rounds its OUTPUT to bf16
//   (relative 2^-9 = 2e-3); 1e-2 forward, 2e-2 gradients.
//   Gradient errors are divided by max(max |ref|, 1e-2) (rows with one allowed key have exactly
//   zero dq/dk whose fp32 round-off must not be divided by ~0).
//   The two references are both double: they agree to 1e-11 (different summation orders only).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "strata/attention.h"
#include "strata/cpu.h"
#include "strata/mlr.h"
#include "strata/threading.h"
#include "cpu/mlr_params.h"  // mlr_attention_*_kernel: the kernel body without the L = 1 shortcut
#include "kernel_harness.h"

namespace strata {
namespace {

using test::Owned4;

struct Case : test::Storage {
  int64_t B = 1, Nq = 7, Nk = 7, Hq = 2, Hkv = 1, Dv = 16;
  std::vector<int64_t> ranks = {8, 8};
  std::vector<int64_t> blocks;  // empty: default rule
  int64_t context = 0;
  std::vector<int64_t> segs;
  std::vector<int64_t> seg_offsets;  // B + 1 offsets into segs: per-sequence lists (empty: shared)
  bool mask_cross = false, div = false, avg = false, causal = true;
  MlrScale scale = MlrScale::inv_rank;
  bool grads = true;
  int64_t D() const {
    int64_t d = 0;
    for (int64_t r : ranks) d += r;
    return d;
  }
  std::string name() const {
    std::string r = "r";
    for (int64_t x : ranks) r += detail::cat(x, "_");
    std::string bl;
    for (int64_t x : blocks) bl += detail::cat(x, "_");
    return detail::cat("B", B, "_Nq", Nq, "_Nk", Nk, "_Hq", Hq, "_Hkv", Hkv, "_Dv", Dv, "_", r,
                       blocks.empty() ? std::string() : "b" + bl, context ? detail::cat("ctx", context, "_") : "",
                       segs.empty() ? std::string() : detail::cat("seg", segs.size(), "_"),
                       seg_offsets.empty() ? std::string() : "perseq_",
                       mask_cross ? "xmask_" : "", div ? "div_" : "", avg ? "avg_" : "",
                       scale == MlrScale::inv_sqrt_head_dim ? "isqrt_" : "", causal ? "causal_" : "full_",
                       storage_name());
  }
  MlrOptions options() const {
    MlrOptions o;
    o.num_levels = int(ranks.size());
    for (size_t l = 0; l < ranks.size(); ++l) o.ranks[l] = ranks[l];
    for (size_t l = 0; l < blocks.size(); ++l) o.block_sizes[l] = blocks[l];
    o.context = context;
    o.segment_starts = segs.empty() ? nullptr : segs.data();
    o.num_segment_starts = int64_t(segs.size());
    o.segment_offsets = seg_offsets.empty() ? nullptr : seg_offsets.data();
    o.num_segment_offsets = int64_t(seg_offsets.size());
    o.mask_cross_segment = mask_cross;
    o.scale = scale;
    o.divide_by_num_levels = div;
    o.level_average = avg;
    o.causal = causal;
    o.layout = layout;
    return o;
  }
};

// The MLR family's adapter for the harness (kernel_harness.h): two references, the per-pair
// formula and the reference code's block-diagonal construction; one-level cases also hold the
// MLR kernel body (cpu::mlr_attention_*_kernel, without the dense shortcut) to them.
struct MlrFamily {
  using Case = ::strata::Case;
  // scalar: std::fma calls, W = 1; slow, under ASan very: small cases only (most of them)
  double scalar_max_work = 1.5e6;
  Case c;
  test::Inputs in;
  MlrOptions opt;

  explicit MlrFamily(const Case& c_) : c(c_), opt(c.options()) {
    std::mt19937 rng(4321 + unsigned(c.Nq * 31 + c.Nk * 7 + c.D() * 3 + c.ranks.size()));
    // q, k wider than U(-1, 1): the 1/r_l scale makes logits small; this keeps P far from uniform.
    in = test::make_inputs(shape(), rng, 2.0);
  }
  MlrFamily(const MlrFamily&) = delete;  // opt points into c's lists

  test::Shape shape() const {
    return test::shape_of(c, {c.B, c.Nq, c.Nk, c.Hq, c.Hkv, c.D(), c.Dv});
  }
  double work() const { return double(c.Nq) * c.Nk * (c.D() + c.Dv) * c.Hq * c.B; }
  bool grads() const { return c.grads; }
  test::Tolerance tolerance() const {  // see the file comment
    return c.dtype == DType::bf16 ? test::Tolerance{1e-2, 2e-2} : test::Tolerance{2e-5, 1e-4};
  }
  std::vector<test::Expected> references() const {
    std::vector<test::Expected> r;
    for (bool blockwise : {false, true}) {
      test::Expected e(blockwise ? "the block-diagonal reference" : "the per-pair reference", shape(), true, c.grads);
      (blockwise ? reference::mlr_attention_forward_blockwise : reference::mlr_attention_forward)(
          in.q.view, in.k.view, in.v.view, opt, e.o.data(), e.lse.data());
      if (c.grads)
        (blockwise ? reference::mlr_attention_backward_blockwise : reference::mlr_attention_backward)(
            in.q.view, in.k.view, in.v.view, in.dout.view, opt, e.dq.data(), e.dk.data(), e.dv.data());
      r.push_back(std::move(e));
    }
    return r;
  }
  // One-level cases run twice: the public entry (which may take the dense shortcut) and the MLR
  // kernel body itself, so both are held to the MLR references.
  std::vector<const char*> kernels() const {
    if (c.ranks.size() == 1) return {"", " (MLR kernel body)"};
    return {""};
  }
  void forward(size_t kernel, Isa, test::Outputs& out) {
    (kernel ? cpu::mlr_attention_forward_kernel : mlr_attention_forward)(in.q.view, in.k.view, in.v.view, out.o.view,
                                                                        out.lse_view, opt);
  }
  void backward(size_t kernel, Isa, test::Outputs& out) {
    (kernel ? cpu::mlr_attention_backward_kernel : mlr_attention_backward)(
        in.q.view, in.k.view, in.v.view, out.o.view, out.lse_view, in.dout.view, out.dq.view, out.dk.view,
        out.dv.view, opt);
  }
};

using MlrSweep = test::KernelSweep<MlrFamily>;
TEST_P(MlrSweep, MatchesBothReferences) { test::run_case<MlrFamily>(GetParam()); }

// A random split of d into L ranks >= 1.
std::vector<int64_t> random_split(std::mt19937& rng, int64_t d, int L) {
  std::vector<int64_t> cuts;
  while (int(cuts.size()) < L - 1) {
    const int64_t x = 1 + int64_t(rng() % uint32_t(d - 1));
    if (std::find(cuts.begin(), cuts.end(), x) == cuts.end()) cuts.push_back(x);
  }
  std::sort(cuts.begin(), cuts.end());
  std::vector<int64_t> r;
  int64_t prev = 0;
  for (int64_t x : cuts) {
    r.push_back(x - prev);
    prev = x;
  }
  r.push_back(d - prev);
  return r;
}

std::vector<Case> length_cases() {
  std::vector<Case> v;
  std::mt19937 rng(99);
  for (int64_t n : {1, 7, 97, 256, 1000, 1025})
    for (bool causal : {false, true}) {
      if (n >= 1000 && !causal) continue;  // the long ones: few (the references are O(T^2))
      Case c;
      c.Nq = c.Nk = n;
      c.Hq = n >= 1000 ? 1 : 2;
      c.Dv = 32;
      c.ranks = random_split(rng, 32, n >= 1000 ? 6 : 4);
      c.causal = causal;
      v.push_back(c);
    }
  return v;
}

std::vector<Case> level_cases() {  // L = 1..8, random splits, both mask modes
  std::vector<Case> v;
  std::mt19937 rng(7);
  for (int L = 1; L <= 8; ++L)
    for (int64_t n : {97, 256}) {
      Case c;
      c.Nq = c.Nk = n;
      c.Dv = 24;
      c.ranks = random_split(rng, L == 1 ? 16 : 40, L);
      c.causal = (L + n) % 2 == 0;
      v.push_back(c);
    }
  Case c;  // 8 levels of 8 at T = 256: the dyadic case of the paper (blocks 256 .. 2)
  c.Nq = c.Nk = 256;
  c.ranks = std::vector<int64_t>(8, 8);
  c.Dv = 64;
  v.push_back(c);
  c.causal = false;
  c.avg = true;
  v.push_back(c);
  return v;
}

std::vector<Case> block_cases() {  // custom block lists, context, segments
  std::vector<Case> v;
  auto base = [] {
    Case c;
    c.Nq = c.Nk = 97;
    c.ranks = {6, 4, 3, 3};
    c.Dv = 16;
    return c;
  };
  for (bool causal : {false, true}) {
    Case c = base();
    c.causal = causal;
    c.blocks = {96, 48, 12, 3};  // T not a multiple of the top block
    v.push_back(c);
    c.blocks = {64, 64, 16, 1};  // equal neighbours and size-1 blocks are nested too
    v.push_back(c);
    c.blocks = {32, 16, 8, 4};   // top block < T: pairs in different top blocks share nothing
    v.push_back(c);
    c.mask_cross = true;         // ... or are masked
    v.push_back(c);
    c.avg = true;
    v.push_back(c);
    c = base();
    c.causal = causal;
    c.context = 512;  // blocks 512, 256, 128, 64 for a 97-token sequence
    v.push_back(c);
    c.context = 40;   // T > context: level 1 has 3 blocks (40, 40, 17)
    c.ranks = {5, 5, 3, 3};
    v.push_back(c);
  }
  // Block lists that are not nested (each level a partition on its own, as the reference code
  // allows): the general path, where the levels a pair shares are not a prefix.
  for (bool causal : {false, true})
    for (const std::vector<int64_t>& bl : {std::vector<int64_t>{64, 16, 32}, {96, 32, 24}, {48, 64, 20}}) {
      Case c = base();
      c.Nq = c.Nk = 192 + 11;  // past the context of 192: blocks continue by absolute position
      c.ranks = {6, 5, 5};
      c.causal = causal;
      c.blocks = bl;
      v.push_back(c);
      c.avg = true;
      c.mask_cross = bl[0] == 48;  // 48|64: pairs sharing level 2 only, or no level
      v.push_back(c);
      c.Nq = 40;  // decode-like
      c.div = true;
      v.push_back(c);
    }
  for (bool causal : {false, true}) {  // segments with finer levels that are not nested
    Case c = base();
    c.Nq = c.Nk = 160;
    c.causal = causal;
    c.segs = {30, 100};
    c.blocks = {0, 24, 16, 6};
    c.avg = causal;
    c.mask_cross = !causal;
    v.push_back(c);
  }
  // One level with more queries than keys, not causal: the queries at negative positions share
  // no block with any key (score 0, or an empty row under mask_cross_segment), so no dense shortcut.
  for (bool mask : {false, true})
    for (bool causal : {false, true}) {
      Case c = base();
      c.Nq = 12;
      c.Nk = 5;
      c.ranks = {8};
      c.causal = causal;
      c.mask_cross = mask;
      v.push_back(c);
      c.Nq = 130;  // more than one query tile at negative positions
      c.Nk = 70;
      c.avg = true;
      v.push_back(c);
    }
  for (bool mask : {false, true})
    for (bool causal : {false, true}) {
      Case c = base();
      c.causal = causal;
      c.mask_cross = mask;
      c.segs = {10, 40, 41, 90};  // a one-token segment, and one at the end
      v.push_back(c);
      c.blocks = {0, 16, 4, 2};   // level-1 size unused with segments
      c.avg = mask;
      v.push_back(c);
      c.Nq = c.Nk = 300;          // segments longer and shorter than the 128-key tiles
      c.segs = {5, 130, 131, 200, 263};
      c.blocks = {0, 64, 32, 8};
      c.div = true;
      v.push_back(c);
      // Per-sequence lists (packed documents): 3 sequences with 2, 0 and 3 starts.
      c = base();
      c.causal = causal;
      c.mask_cross = mask;
      c.B = 3;
      c.Nq = c.Nk = 200;
      c.segs = {64, 129, /* none */ 1, 70, 199};
      c.seg_offsets = {0, 2, 2, 5};
      c.blocks = {0, 32, 8, 4};
      v.push_back(c);
      c.Nq = 37;  // decode-like: fewer queries than keys
      c.Hq = 4;
      c.Hkv = 2;
      c.blocks.clear();
      c.avg = true;
      v.push_back(c);
    }
  return v;
}

std::vector<Case> scale_cases() {  // every scale option, causal and not
  std::vector<Case> v;
  for (MlrScale s : {MlrScale::inv_rank, MlrScale::inv_sqrt_head_dim})
    for (bool div : {false, true})
      for (bool avg : {false, true})
        for (bool causal : {false, true}) {
          Case c;
          c.Nq = c.Nk = 150;
          c.ranks = {12, 8, 4, 4, 2, 2};
          c.Dv = 20;
          c.scale = s;
          c.div = div;
          c.avg = avg;
          c.causal = causal;
          v.push_back(c);
        }
  return v;
}

std::vector<Case> shape_cases() {  // GQA, dtypes, layouts, strides, Nq != Nk, head dims
  std::vector<Case> v;
  for (int64_t ratio : {1, 2, 4})
    for (DType t : {DType::f32, DType::bf16}) {
      Case c;
      c.Hq = 4;
      c.Hkv = 4 / ratio;
      c.Nq = c.Nk = 130;
      c.ranks = {16, 8, 4, 4};
      c.Dv = 32;
      c.dtype = t;
      c.avg = ratio == 2;
      v.push_back(c);
    }
  for (const test::Storage& st : test::every_storage()) {
    Case c;
    c.set_storage(st);
    c.B = 2;
    c.Nq = 97;
    c.Nk = 131;
    c.Hq = 4;
    c.Hkv = 2;
    c.ranks = {32, 20, 7};  // head dim 59
    c.Dv = 48;
    c.causal = st.gap == 0;
    c.segs = st.dim_stride > 1 ? std::vector<int64_t>{50} : std::vector<int64_t>{};
    v.push_back(c);
  }
  for (auto [nq, nk] : {std::pair<int64_t, int64_t>{37, 97}, {1, 200}, {97, 37}, {64, 300}})
    for (bool causal : {false, true}) {
      Case c;  // bottom-right alignment: query i at position nk - nq + i
      c.Nq = nq;
      c.Nk = nk;
      c.ranks = {8, 4, 4};
      c.causal = causal;
      c.segs = nk == 300 ? std::vector<int64_t>{100, 250} : std::vector<int64_t>{};
      c.mask_cross = nk == 300 && causal;
      v.push_back(c);
    }
  Case c;  // tiny and unequal head dims
  c.Nq = c.Nk = 33;
  c.ranks = {1, 1, 1};
  c.Dv = 3;
  v.push_back(c);
  c.ranks = {100, 28};  // head dim 128, two levels
  c.Dv = 72;
  c.Nq = c.Nk = 200;
  v.push_back(c);
  return v;
}

std::string case_name(const ::testing::TestParamInfo<Case>& i) {
  return detail::cat("c", i.index, "_", i.param.name());
}

INSTANTIATE_TEST_SUITE_P(Lengths, MlrSweep, ::testing::ValuesIn(length_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Levels, MlrSweep, ::testing::ValuesIn(level_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Blocks, MlrSweep, ::testing::ValuesIn(block_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Scales, MlrSweep, ::testing::ValuesIn(scale_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Shapes, MlrSweep, ::testing::ValuesIn(shape_cases()), case_name);

// ---- bf16 products (MlrOptions::compute, strata/cpu.h) -----------------------------------------
// bf16 inputs on a CPU with AVX512-BF16 (and AMX-BF16) run the forward's products on a bf16
// engine: level 1 of the scores from bf16 copies of the inputs (exact products, fp32 sums, c_1 in
// the epilogue), deeper slices fp32, P rounded to bf16 for P V. The bf16 shape cases of the sweep
// above run it already (compute = auto); here every case of the sweep, in bf16, is held to the
// references on every engine this CPU has, by name, and the engine is checked to be the one that
// runs. The cases cover what the bf16 path adds: level-1 ranks 1..100 (k1 padded to 32 or 128),
// tiles whose pairs share level 1 only (the engine's fused shift/max product: T >= 256 with a
// level-2 boundary between tiles), deeper prefixes (level 1 on the engine plus fp32 slices),
// straddling tiles and tiles sharing no level (mu = 0: fp32 prefix of length 0), causal cuts.
//
// Tolerance: the sweep's bf16 one (1e-2 forward, 2e-2 gradients), as the dense kernel's bf16
// sweep argues (core_attention_test.cpp): the only new error is P rounded to bf16 for P V, each
// weight off by a relative 2^-9 independently, about 2^-9 of the spread of v under the row's
// weights, the order of o's own rounding to bf16 (2e-3); the level-1 product is exact before its
// fp32 sum, as in the fp32 path (which multiplies q by c_1 first: one rounding there, one
// rounding of the product by c_1 here). The backward recomputes S the same way; its dP = dO V^T
// is exact before its fp32 sum; its dV reads P rounded to bf16 (each term off by 2^-9 relative,
// as o above); dK and dQ over each pair's shared prefix read G = P (dP - D_i) / m rounded to bf16
// (the same 2^-9 per term, as the dense kernel's dS); it reads this forward's o (D_i = rowsum(dO *
// O)): 2e-2 as for the dense kernel's bf16 backward. (A 2% error in the engine's dK fails 22 cases,
// in its dQ 18: those whose prefix products are large enough beside the rest to see it.)
using MlrBf16ComputeSweep = ::testing::TestWithParam<Case>;
TEST_P(MlrBf16ComputeSweep, EveryEngineMatchesReference) {
  MlrFamily f(GetParam());
  test::check_bf16_engines(f, [&](Compute e) {
    if (f.c.ranks.size() > 1) {  // (L = 1 may take the dense kernel: attention_compute's rule)
      EXPECT_EQ(mlr_attention_compute(f.shape().d, f.opt), e);
    }
  });
}

// Every case of the sweep in bf16 (BSHD; the storages are the shape cases' own bf16 ones).
std::vector<Case> bf16_compute_cases() {
  std::vector<Case> v;
  for (auto cases : {length_cases(), level_cases(), block_cases(), scale_cases(), shape_cases()})
    for (Case c : cases) {
      if (c.dtype == DType::bf16) {
        v.push_back(c);
      } else if (c.layout == Layout::BSHD && c.gap == 0 && c.dim_stride == 1) {
        c.dtype = DType::bf16;
        v.push_back(c);
      }
    }
  Case c;  // the paper's 8 levels at T = 1025 (dyadic blocks: most tiles share level 1 only)
  c.Nq = c.Nk = 1025;
  c.Hq = 1;
  c.ranks = {32, 8, 6, 4, 4, 4, 4, 2};
  c.Dv = 64;
  c.avg = true;
  c.dtype = DType::bf16;
  v.push_back(c);
  c.avg = false;
  c.ranks = {7, 25};  // an odd level-1 rank on the engine (padded to 32)
  c.grads = false;
  v.push_back(c);
  return v;
}
INSTANTIATE_TEST_SUITE_P(Bf16Compute, MlrBf16ComputeSweep, ::testing::ValuesIn(bf16_compute_cases()), case_name);

// compute = fp32 keeps a bf16 forward on fp32 products; an engine the CPU or the active ISA lacks
// is an error naming 'compute'; float32 inputs compute in fp32 whatever compute asks.
TEST(Mlr, ComputeOptionResolves) {
  test::IsaGuard guard;
  test::check_compute_rules("mlr_attention_compute", [](AttnDims d, Compute c) {
    MlrOptions o = mlr_options({8, 4, 4});
    o.compute = c;
    return mlr_attention_compute(d, o);
  });
}

// ---- L = 1 is dense attention ------------------------------------------------------------------
// With one level whose block holds every key and query, mlr_attention_* runs the dense kernel
// with scale c_1: the same numbers, bit for bit. That this shortcut is RIGHT is the sweep's job:
// its one-level cases compare both the public entry and the MLR kernel body
// (cpu::mlr_attention_*_kernel) with the MLR double references, including the shapes where the
// shortcut must not be taken (queries at negative positions, blocks shorter than the sequence).

TEST(Mlr, OneLevelEqualsDenseAttention) {
  // One thread: the dense backward adds dQ from several key tiles under locks, so with more
  // threads even two dense runs can differ in the last bit (the order of the additions).
  const int threads = get_num_threads();
  set_num_threads(1);
  struct Restore {
    int n;
    ~Restore() { set_num_threads(n); }
  } restore{threads};
  const int64_t N = 300, H = 2, D = 40, Dv = 24;
  std::mt19937 rng(17);
  Owned4 q(1, N, H, D, DType::f32, Layout::BSHD), k(1, N, H, D, DType::f32, Layout::BSHD);
  Owned4 v(1, N, H, Dv, DType::f32, Layout::BSHD), g(1, N, H, Dv, DType::f32, Layout::BSHD);
  for (Owned4* t : {&q, &k, &v, &g}) t->fill_random(rng, -2, 2);
  for (bool causal : {false, true})
    for (MlrScale s : {MlrScale::inv_rank, MlrScale::inv_sqrt_head_dim}) {
      SCOPED_TRACE(detail::cat("causal=", causal, " scale=", int(s)));
      MlrOptions mo = mlr_options({D});
      mo.causal = causal;
      mo.scale = s;
      AttentionOptions ao;
      ao.causal = causal;
      ao.scale = float(s == MlrScale::inv_rank ? 1.0 / double(D) : 1.0 / std::sqrt(double(D)));  // c_1 as mlr.cpp rounds it
      Owned4 o1(1, N, H, Dv, DType::f32, Layout::BSHD), o2 = o1;
      o2.view.data = o2.buf.data();
      std::vector<float> l1(size_t(H * N)), l2(l1.size());
      TensorView lv1(l1.data(), DType::f32, {1, H, N}), lv2(l2.data(), DType::f32, {1, H, N});
      mlr_attention_forward(q.view, k.view, v.view, o1.view, lv1, mo);
      attention_forward(q.view, k.view, v.view, o2.view, lv2, ao);
      double err = 0, mx = 0;
      for (size_t i = 0; i < o1.buf.size() / 4; ++i) {
        const float a = reinterpret_cast<const float*>(o1.buf.data())[i];
        const float b = reinterpret_cast<const float*>(o2.buf.data())[i];
        err = std::max(err, double(std::fabs(a - b)));
        mx = std::max(mx, double(std::fabs(b)));
      }
      EXPECT_EQ(err, 0.0) << "relative " << err / mx;
      for (size_t i = 0; i < l1.size(); ++i) ASSERT_EQ(l1[i], l2[i]) << i;
      Owned4 dq1(1, N, H, D, DType::f32, Layout::BSHD), dk1 = dq1, dq2 = dq1, dk2 = dq1;
      Owned4 dv1(1, N, H, Dv, DType::f32, Layout::BSHD), dv2 = dv1;
      for (Owned4* t : {&dq1, &dk1, &dq2, &dk2, &dv1, &dv2}) t->view.data = t->buf.data();
      mlr_attention_backward(q.view, k.view, v.view, o1.view, lv1, g.view, dq1.view, dk1.view, dv1.view, mo);
      attention_backward(q.view, k.view, v.view, o2.view, lv2, g.view, dq2.view, dk2.view, dv2.view, ao);
      for (auto [a, b] : {std::pair<Owned4*, Owned4*>{&dq1, &dq2}, {&dk1, &dk2}, {&dv1, &dv2}}) {
        double e = 0, m = 1e-2;
        for (size_t i = 0; i < a->buf.size() / 4; ++i) {
          const float x = reinterpret_cast<const float*>(a->buf.data())[i];
          const float y = reinterpret_cast<const float*>(b->buf.data())[i];
          e = std::max(e, double(std::fabs(x - y)));
          m = std::max(m, double(std::fabs(y)));
        }
        EXPECT_EQ(e, 0.0) << "relative " << e / m;
      }
    }
}

// ---- the default block rule ------------------------------------------------------------------------

std::vector<float> forward_f32(const Owned4& q, const Owned4& k, const Owned4& v, const MlrOptions& o) {
  const int64_t B = q.view.shape[0], N = q.view.shape[1], H = q.view.shape[2], Dv = v.view.shape[3];
  Owned4 out(B, N, H, Dv, DType::f32, Layout::BSHD);
  std::vector<float> lse(size_t(B * H * N));
  mlr_attention_forward(q.view, k.view, v.view, out.view, TensorView(lse.data(), DType::f32, {B, H, N}), o);
  std::vector<float> r(reinterpret_cast<const float*>(out.buf.data()),
                       reinterpret_cast<const float*>(out.buf.data()) + out.buf.size() / 4);
  r.insert(r.end(), lse.begin(), lse.end());
  return r;
}

TEST(Mlr, PerSequenceSegmentsEqualEachSequenceAlone) {
  // A batch with per-sequence lists gives, sequence by sequence, the result of running that
  // sequence alone with its own (shared-form) list: bitwise, the kernel's arithmetic per
  // (sequence, head) not depending on the batch.
  const int64_t B = 3, N = 150, H = 2, Dv = 16;
  const std::vector<int64_t> segs = {10, 90, 128, 7};
  const int64_t offs[] = {0, 3, 3, 4};
  MlrOptions o = mlr_options({8, 4, 4});
  o.segment_starts = segs.data();
  o.num_segment_starts = 4;
  o.segment_offsets = offs;
  o.num_segment_offsets = 4;
  std::mt19937 rng(5);
  Owned4 q(B, N, H, 16, DType::f32, Layout::BSHD), k(B, N, H, 16, DType::f32, Layout::BSHD);
  Owned4 v(B, N, H, Dv, DType::f32, Layout::BSHD), out(B, N, H, Dv, DType::f32, Layout::BSHD);
  q.fill_random(rng, -2, 2);
  k.fill_random(rng, -2, 2);
  v.fill_random(rng);
  std::vector<float> lse(size_t(B * H * N));
  mlr_attention_forward(q.view, k.view, v.view, out.view, TensorView(lse.data(), DType::f32, {B, H, N}), o);
  for (int64_t b = 0; b < B; ++b) {
    SCOPED_TRACE(detail::cat("sequence ", b));
    auto one = [&](const Owned4& t) {  // batch row b as a batch of one (a view, no copy)
      TensorView x = t.view;
      x.data = static_cast<char*>(x.data) + b * x.stride[0] * 4;
      x.shape[0] = 1;
      return x;
    };
    MlrOptions ob = o;
    ob.segment_offsets = nullptr;
    ob.segment_starts = segs.data() + offs[b];
    ob.num_segment_starts = offs[b + 1] - offs[b];
    if (ob.num_segment_starts == 0) {
      static const int64_t kEmpty[2] = {0, 0};  // one segment, still in segment mode
      ob.segment_offsets = kEmpty;
      ob.num_segment_offsets = 2;
    }
    Owned4 ob_out(1, N, H, Dv, DType::f32, Layout::BSHD);
    std::vector<float> lb(size_t(H * N));
    mlr_attention_forward(one(q), one(k), one(v), ob_out.view, TensorView(lb.data(), DType::f32, {1, H, N}), ob);
    for (int64_t i = 0; i < N; ++i)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t c = 0; c < Dv; ++c)
          ASSERT_EQ(out.at(b, i, h, c, Layout::BSHD), ob_out.at(0, i, h, c, Layout::BSHD)) << i << " " << h << " " << c;
  }
  // and the lists matter: sequence 1 (one segment) differs from sequence 0's geometry
  MlrOptions shared = o;
  shared.segment_offsets = nullptr;
  shared.num_segment_starts = 3;  // sequence 0's list for everyone
  Owned4 o2(B, N, H, Dv, DType::f32, Layout::BSHD);
  mlr_attention_forward(q.view, k.view, v.view, o2.view, TensorView(lse.data(), DType::f32, {B, H, N}), shared);
  double diff = 0;
  for (int64_t i = 0; i < N; ++i) diff = std::max(diff, std::fabs(o2.at(1, i, 0, 0, Layout::BSHD) - out.at(1, i, 0, 0, Layout::BSHD)));
  EXPECT_GT(diff, 1e-3);
}

TEST(Mlr, DefaultBlocksAreContextOverPowersOfTwo) {
  // T = 97, L = 3: context = 100 (97 rounded up to a multiple of 4), blocks 100, 50, 25.
  const int64_t N = 97;
  std::mt19937 rng(3);
  Owned4 q(1, N, 1, 12, DType::f32, Layout::BSHD), k = q, v = q;
  k.view.data = k.buf.data();
  v.view.data = v.buf.data();
  for (Owned4* t : {&q, &k, &v}) t->fill_random(rng, -2, 2);
  MlrOptions def = mlr_options({4, 4, 4});
  def.causal = false;
  MlrOptions ctx = def, expl = def, other = def;
  ctx.context = 100;
  expl.block_sizes[0] = 100;
  expl.block_sizes[1] = 50;
  expl.block_sizes[2] = 25;
  other.block_sizes[0] = 97;  // a different partition must give a different result
  other.block_sizes[1] = 97;
  other.block_sizes[2] = 1;
  const std::vector<float> a = forward_f32(q, k, v, def);
  EXPECT_EQ(a, forward_f32(q, k, v, ctx));
  EXPECT_EQ(a, forward_f32(q, k, v, expl));
  EXPECT_NE(a, forward_f32(q, k, v, other));
}

// With the model's blocks fixed (context or block_sizes), a causal output row never depends on
// later tokens: the forward over n tokens equals the first n rows of the forward over n + m.
// (The default, context = 0, takes the blocks from each call's length and does not have this
// property: mlr.h says so.) The two calls tile the queries alike but may add a deeper level's
// rectangle in another order on the boundary tile: fp32 round-off, 2e-6 normwise.
TEST(Mlr, CausalRowsDoNotDependOnLaterTokens) {
  std::vector<MlrOptions> opts;
  MlrOptions o = mlr_options({4, 4, 4});
  o.context = 100;  // the example: blocks 100/50/25 whatever the length
  opts.push_back(o);
  o = mlr_options({8, 4, 2, 2});
  o.context = 64;
  o.level_average = true;
  opts.push_back(o);
  o = mlr_options({6, 5, 5});  // not nested
  o.block_sizes[0] = 96;
  o.block_sizes[1] = 32;
  o.block_sizes[2] = 24;
  o.mask_cross_segment = true;
  opts.push_back(o);
  const int64_t H = 2, Dv = 8;
  std::mt19937 rng(31);
  for (size_t i = 0; i < opts.size(); ++i)
    for (auto [n, m] : {std::pair<int64_t, int64_t>{25, 76}, {100, 1}, {64, 65}, {101, 200}, {1, 130}}) {
      SCOPED_TRACE(detail::cat("options ", i, ", n = ", n, ", m = ", m));
      int64_t D = 0;
      for (int l = 0; l < opts[i].num_levels; ++l) D += opts[i].ranks[l];
      Owned4 q(1, n + m, H, D, DType::f32, Layout::BSHD), k = q, v(1, n + m, H, Dv, DType::f32, Layout::BSHD);
      k.view.data = k.buf.data();
      q.fill_random(rng, -2, 2);
      k.fill_random(rng, -2, 2);
      v.fill_random(rng);
      auto prefix = [&](const Owned4& t) {
        TensorView x = t.view;
        x.shape[1] = n;
        return x;
      };
      Owned4 of(1, n + m, H, Dv, DType::f32, Layout::BSHD), op(1, n, H, Dv, DType::f32, Layout::BSHD);
      std::vector<float> lf(size_t(H * (n + m))), lp(size_t(H * n));
      mlr_attention_forward(q.view, k.view, v.view, of.view, TensorView(lf.data(), DType::f32, {1, H, n + m}), opts[i]);
      mlr_attention_forward(prefix(q), prefix(k), prefix(v), op.view, TensorView(lp.data(), DType::f32, {1, H, n}),
                            opts[i]);
      double err = 0, mx = 1e-6;
      for (int64_t t = 0; t < n; ++t)
        for (int64_t h = 0; h < H; ++h) {
          for (int64_t c = 0; c < Dv; ++c) {
            err = std::max(err, std::fabs(op.at(0, t, h, c, Layout::BSHD) - of.at(0, t, h, c, Layout::BSHD)));
            mx = std::max(mx, std::fabs(of.at(0, t, h, c, Layout::BSHD)));
          }
          ASSERT_NEAR(lp[size_t(h * n + t)], lf[size_t(h * (n + m) + t)], 1e-5) << "lse row " << t;
        }
      EXPECT_LE(err / mx, 2e-6);
    }
}

// ---- finite differences against the double references' analytic gradients ------------------------

TEST(Mlr, ReferenceGradientsMatchFiniteDifferences) {
  const int64_t N = 13, Nq = 11, H = 2, Hkv = 1, D = 7, Dv = 3;
  std::mt19937 rng(5);
  Owned4 q(1, Nq, H, D, DType::f64, Layout::BSHD), k(1, N, Hkv, D, DType::f64, Layout::BSHD);
  Owned4 v(1, N, Hkv, Dv, DType::f64, Layout::BSHD), g(1, Nq, H, Dv, DType::f64, Layout::BSHD);
  for (Owned4* t : {&q, &k, &v, &g}) t->fill_random(rng, -2, 2);
  const int64_t segs[] = {5, 6};
  for (int variant = 0; variant < 3; ++variant) {
    MlrOptions o = mlr_options({3, 1, 2, 1});
    if (variant == 0) {  // default blocks 16, 8, 4, 2 over 13 keys
      o.divide_by_num_levels = true;
    } else if (variant == 1) {  // level average, custom blocks, not causal
      o.level_average = true;
      o.causal = false;
      o.block_sizes[0] = 12;
      o.block_sizes[1] = 6;
      o.block_sizes[2] = 3;
      o.block_sizes[3] = 1;
    } else {  // segments, masked across, sqrt scale
      o.segment_starts = segs;
      o.num_segment_starts = 2;
      o.mask_cross_segment = true;
      o.level_average = true;
      o.scale = MlrScale::inv_sqrt_head_dim;
    }
    for (bool blockwise : {false, true}) {
      SCOPED_TRACE(detail::cat("variant ", variant, blockwise ? " blockwise" : " pairwise"));
      auto loss = [&] {  // sum(o * g)
        std::vector<double> out(size_t(Nq * H * Dv)), lse(size_t(H * Nq));
        (blockwise ? reference::mlr_attention_forward_blockwise : reference::mlr_attention_forward)(
            q.view, k.view, v.view, o, out.data(), lse.data());
        double s = 0;
        for (int64_t i = 0; i < Nq; ++i)
          for (int64_t h = 0; h < H; ++h)
            for (int64_t d = 0; d < Dv; ++d) s += out[size_t((i * H + h) * Dv + d)] * g.at(0, i, h, d, Layout::BSHD);
        return s;
      };
      std::vector<double> dq(size_t(Nq * H * D)), dk(size_t(N * Hkv * D)), dv(size_t(N * Hkv * Dv));
      (blockwise ? reference::mlr_attention_backward_blockwise : reference::mlr_attention_backward)(
          q.view, k.view, v.view, g.view, o, dq.data(), dk.data(), dv.data());
      double max_err = 0, max_g = 0;
      auto check = [&](Owned4& t, const std::vector<double>& grad) {
        int64_t idx[4] = {0, 0, 0, 0};
        for (idx[1] = 0; idx[1] < t.view.shape[1]; ++idx[1])
          for (idx[2] = 0; idx[2] < t.view.shape[2]; ++idx[2])
            for (idx[3] = 0; idx[3] < t.view.shape[3]; ++idx[3]) {
              const double x = t.view.get(idx), eps = 1e-6;
              t.view.set(idx, x + eps);
              const double up = loss();
              t.view.set(idx, x - eps);
              const double down = loss();
              t.view.set(idx, x);
              const double fd = (up - down) / (2 * eps);
              const double an = grad[size_t((idx[1] * t.view.shape[2] + idx[2]) * t.view.shape[3] + idx[3])];
              max_err = std::max(max_err, std::fabs(fd - an));
              max_g = std::max(max_g, std::fabs(an));
            }
      };
      check(q, dq);
      check(k, dk);
      check(v, dv);
      EXPECT_GT(max_g, 1e-2);
      EXPECT_LE(max_err / max_g, 1e-7);  // central differences: O(eps^2) + rounding O(1e-16 / eps)
    }
  }
}

// ---- special rows, threads, cost ------------------------------------------------------------------

TEST(Mlr, EmptyRowsGiveZerosAndNegInfLse) {
  // 20 queries over 8 keys, causal, bottom-right: queries 0..11 sit before key 0 and see nothing.
  const int64_t Nq = 20, Nk = 8, D = 6;
  std::mt19937 rng(9);
  Owned4 q(1, Nq, 1, D, DType::f32, Layout::BSHD), k(1, Nk, 1, D, DType::f32, Layout::BSHD);
  Owned4 v(1, Nk, 1, D, DType::f32, Layout::BSHD), o(1, Nq, 1, D, DType::f32, Layout::BSHD);
  Owned4 g = o, dq = q, dk = k, dv = v;
  for (Owned4* t : {&g, &dq, &dk, &dv}) t->view.data = t->buf.data();
  for (Owned4* t : {&q, &k, &v, &g}) t->fill_random(rng);
  MlrOptions opt = mlr_options({2, 2, 2});
  std::vector<float> lse(static_cast<size_t>(Nq));
  TensorView lv(lse.data(), DType::f32, {1, 1, Nq});
  mlr_attention_forward(q.view, k.view, v.view, o.view, lv, opt);
  mlr_attention_backward(q.view, k.view, v.view, o.view, lv, g.view, dq.view, dk.view, dv.view, opt);
  for (int64_t i = 0; i < Nq; ++i) {
    if (i < Nq - Nk) {
      EXPECT_TRUE(std::isinf(lse[size_t(i)]) && lse[size_t(i)] < 0) << i;
      for (int64_t d = 0; d < D; ++d) {
        EXPECT_EQ(o.at(0, i, 0, d, Layout::BSHD), 0.0);
        EXPECT_EQ(dq.at(0, i, 0, d, Layout::BSHD), 0.0);
      }
    } else {
      EXPECT_TRUE(std::isfinite(lse[size_t(i)])) << i;
    }
  }
}

TEST(Mlr, EmptySizesAreNoOps) {
  std::vector<float> buf(64, 1.f), lse(8, 5.f);
  MlrOptions opt = mlr_options({2, 2});
  opt.causal = false;
  // Nk = 0: every row has no key -> zeros and lse = -inf.
  TensorView q(buf.data(), DType::f32, {1, 2, 1, 4}), k(buf.data(), DType::f32, {1, 0, 1, 4});
  TensorView v(buf.data(), DType::f32, {1, 0, 1, 4}), o(buf.data() + 32, DType::f32, {1, 2, 1, 4});
  mlr_attention_forward(q, k, v, o, TensorView(lse.data(), DType::f32, {1, 1, 2}), opt);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(buf[size_t(32 + i)], 0.f);
  EXPECT_TRUE(std::isinf(lse[0]) && lse[0] < 0);
  // batch = 0: nothing to do, no error.
  TensorView q0(buf.data(), DType::f32, {0, 2, 1, 4}), o0(buf.data(), DType::f32, {0, 2, 1, 4});
  TensorView k0(buf.data(), DType::f32, {0, 3, 1, 4});
  EXPECT_NO_THROW(mlr_attention_forward(q0, k0, k0, o0, TensorView(lse.data(), DType::f32, {0, 1, 2}), opt));
  EXPECT_NO_THROW(mlr_attention_backward(q0, k0, k0, o0, TensorView(lse.data(), DType::f32, {0, 1, 2}), o0, q0, k0,
                                         k0, opt));
}

// The forward raises a row's reference max lazily (core/online_softmax.inc). Keys whose norm grows
// with position (x1 at key 0, x ~150 at key 699) make later key tiles beat the running max by
// small amounts (kept) and by far more than 2^8 (raised), non-causal and causal.
TEST(Mlr, GrowingLogitsAcrossKeyTilesMatchReference) {
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "non-causal");
    Case c;
    c.Nq = c.Nk = 700;
    c.Hq = c.Hkv = 1;
    c.ranks = {4, 4, 4, 4};
    c.causal = causal;
    MlrFamily f(c);
    f.scalar_max_work = INFINITY;  // every ISA
    test::grow_keys_with_position(f.in.k);
    test::check_kernel(f);
  }
}

TEST(Mlr, ThreadCountDoesNotChangeForward) {
  const int64_t N = 300, D = 32;
  std::mt19937 rng(5);
  Owned4 q(1, N, 2, D, DType::f32, Layout::BSHD), k(1, N, 2, D, DType::f32, Layout::BSHD);
  Owned4 v(1, N, 2, D, DType::f32, Layout::BSHD);
  for (Owned4* t : {&q, &k, &v}) t->fill_random(rng);
  MlrOptions opt = mlr_options({8, 8, 8, 8});
  std::vector<float> out[2];
  const int saved = get_num_threads();
  for (int t : {1, 3}) {
    set_num_threads(t);
    out[t == 3] = forward_f32(q, k, v, opt);
  }
  set_num_threads(saved);
  EXPECT_EQ(out[0], out[1]);  // each query tile is one unit of work
}

TEST(Mlr, FlopCountMatchesTheDyadicFormula) {
  // Non-causal, dyadic blocks: score FLOPs = 2 T^2 sum_l r_l / 2^(l-1); the paper's 8 x 8 split
  // gives 15.94 effective dims of 64 (4.0x), 48|16 1.14x, 16|16|16|16 2.13x.
  const int64_t T = 1024, Dv = 64;
  struct Split {
    std::vector<int64_t> r;
    double ratio;
  };
  for (const Split& s : {Split{{8, 8, 8, 8, 8, 8, 8, 8}, 64 / 15.9375}, Split{{48, 16}, 64 / 56.0},
                         Split{{16, 16, 16, 16}, 64 / 30.0}}) {
    MlrOptions o;
    o.num_levels = int(s.r.size());
    double eff = 0;
    for (size_t l = 0; l < s.r.size(); ++l) {
      o.ranks[l] = s.r[l];
      eff += double(s.r[l]) / double(int64_t(1) << l);
    }
    o.causal = false;
    const MlrFlops f = mlr_attention_flops(2, 3, T, T, Dv, o);
    EXPECT_DOUBLE_EQ(f.scores, 2.0 * 6 * T * T * eff);
    EXPECT_DOUBLE_EQ(f.dense_scores, 2.0 * 6 * T * T * 64);
    EXPECT_NEAR(f.dense_scores / f.scores, s.ratio, 1e-12);
    EXPECT_DOUBLE_EQ(f.total - f.scores, 2.0 * 6 * T * T * Dv);
    o.causal = true;  // causal: the pairs j <= i, i.e. T (T + 1) / 2
    const MlrFlops c = mlr_attention_flops(1, 1, T, T, Dv, o);
    EXPECT_DOUBLE_EQ(c.dense_total, 2.0 * T * (T + 1) / 2 * (64 + Dv));
  }
}

// ---- bad options (the checks every family shares: core_checks_test.cpp) ---------------------------

struct MlrBadInput : ::testing::Test {
  std::vector<float> buf = std::vector<float>(4096, 0.5f), lse = std::vector<float>(64);
  TensorView q{buf.data(), DType::f32, {1, 8, 2, 16}}, k{buf.data(), DType::f32, {1, 8, 2, 16}};
  TensorView v{buf.data(), DType::f32, {1, 8, 2, 16}}, o{buf.data() + 1024, DType::f32, {1, 8, 2, 16}};
  TensorView lv{lse.data(), DType::f32, {1, 2, 8}};
  MlrOptions opt = mlr_options({8, 4, 4});
  // Expects mlr_attention_forward to throw strata::Error whose message contains every needle.
  void expect_error(const std::vector<std::string>& needles) {
    test::expect_error([&] { mlr_attention_forward(q, k, v, o, lv, opt); }, needles);
  }
};

TEST_F(MlrBadInput, ValidInputRuns) { EXPECT_NO_THROW(mlr_attention_forward(q, k, v, o, lv, opt)); }
TEST_F(MlrBadInput, RanksNotSummingToHeadDim) {
  opt.ranks[2] = 5;
  expect_error({"'ranks'", "head_dim 16", "got 17"});
}
TEST_F(MlrBadInput, ZeroRank) {
  opt = mlr_options({8, 0, 8});
  expect_error({"'ranks[1]'", ">= 1", "got 0"});
}
TEST_F(MlrBadInput, NoLevels) {
  opt.num_levels = 0;
  expect_error({"'num_levels'", "1..16", "got 0"});
}
TEST_F(MlrBadInput, RankBeyondNumLevels) {
  opt.num_levels = 2;
  expect_error({"'ranks[2]'", "beyond num_levels"});
}
TEST_F(MlrBadInput, NonNestedBlockSizesAreValid) {  // as in the reference code (the sweep checks the values)
  opt.block_sizes[0] = 8;
  opt.block_sizes[1] = 4;
  opt.block_sizes[2] = 3;
  EXPECT_NO_THROW(mlr_attention_forward(q, k, v, o, lv, opt));
}
TEST_F(MlrBadInput, ZeroBlockSize) {
  opt.block_sizes[0] = 8;
  opt.block_sizes[1] = -4;
  opt.block_sizes[2] = 2;
  expect_error({"'block_sizes[1]'", ">= 1", "got -4"});
}
TEST_F(MlrBadInput, MissingBlockSize) {
  opt.block_sizes[0] = 8;
  opt.block_sizes[1] = 4;
  expect_error({"'block_sizes[2]'", ">= 1", "got 0"});
}
TEST_F(MlrBadInput, ContextNotMultipleOfPowerOfTwo) {
  opt.context = 10;
  expect_error({"'context'", "multiple of", "4", "got 10"});
}
TEST_F(MlrBadInput, ContextWithExplicitBlocks) {
  opt.block_sizes[0] = 8;
  opt.block_sizes[1] = 4;
  opt.block_sizes[2] = 2;
  opt.context = 8;
  expect_error({"'context'", "0 when block_sizes"});
}
TEST_F(MlrBadInput, SegmentsOutOfOrder) {
  const int64_t s[] = {2, 5, 5};
  opt.segment_starts = s;
  opt.num_segment_starts = 3;
  expect_error({"'segment_starts[2]'", "increasing", "got 5"});
}
TEST_F(MlrBadInput, SegmentOutOfRange) {
  const int64_t s[] = {2, 8};
  opt.segment_starts = s;
  opt.num_segment_starts = 2;
  expect_error({"'segment_starts[1]'", "1..7", "got 8"});
}
TEST_F(MlrBadInput, SegmentAtZero) {
  const int64_t s[] = {0};
  opt.segment_starts = s;
  opt.num_segment_starts = 1;
  expect_error({"'segment_starts[0]'", "got 0"});
}
TEST_F(MlrBadInput, SegmentOffsetsInconsistent) {
  static const int64_t s[] = {2, 3, 1};
  static const int64_t bad_end[] = {0, 1}, decreasing[] = {0, 2, 1}, bad_first[] = {1, 3};
  opt.segment_starts = s;
  opt.num_segment_starts = 3;
  opt.num_segment_offsets = 2;
  opt.segment_offsets = bad_end;  // batch 1: offsets[1] must be 3
  expect_error({"'segment_offsets[1]'", "num_segment_starts = 3", "got 1"});
  opt.segment_offsets = bad_first;
  expect_error({"'segment_offsets[0]'", "got 1"});
  opt.segment_offsets = decreasing;  // the length is checked before any entry is read
  opt.num_segment_offsets = 3;
  expect_error({"'num_segment_offsets'", "batch + 1 = 2", "got 3"});
  // Batch 2: offsets {0, 2, 1} decrease.
  std::vector<float> b2(8192, 0.5f), l2(64);
  q = TensorView(b2.data(), DType::f32, {2, 8, 2, 16});
  k = v = q;
  o = TensorView(b2.data() + 4096, DType::f32, {2, 8, 2, 16});
  lv = TensorView(l2.data(), DType::f32, {2, 2, 8});
  expect_error({"'segment_offsets[1..2]'", "non-decreasing", "got 2, 1"});
}
TEST_F(MlrBadInput, SegmentsNull) {
  opt.num_segment_starts = 2;
  expect_error({"'segment_starts'", "null"});
}
}  // namespace
}  // namespace strata
