// tests/cpp/core_nonfinite_test.cpp: non-finite inputs, rows with no key and the finite-input bound,
// for the MLR and Monarch kernels (and the dense one for the bound), forward and backward, under
// every ISA this CPU runs (contracts in include/strata/{attention,mlr,
// monarch}.h).
//   Propagation (attention.h's rule): a NaN or Inf reaches every output whose formula reads it
//   (IEEE, no error); one in a query reaches no other query's o, lse or dq; none reaches another
//   batch or head. (Outputs of masked pairs in the same head may be reached: 0 * Inf = NaN.)
//   Rows with no allowed key (MLR: causal or cross-segment masking; Monarch: masked / padded
//   tokens and whole key blocks): zeros, lse = -inf, zero gradients, never NaN.
//   Bound: inputs just inside the documented bound give finite results equal to the double
//   reference; a logit beyond it is a strata::Error naming q and the bound (issue 48 item 6).
// Tolerances are the kernel suites' (core_mlr_test.cpp, core_monarch_test.cpp): fp32 forward 2e-5,
// gradients 1e-4 normwise with a 1e-2 floor.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "strata/attention.h"
#include "strata/cpu.h"
#include "strata/mlr.h"
#include "strata/monarch.h"
#include "test_util.h"

namespace strata {
namespace {

using test::Owned4;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kFltMax = double(std::numeric_limits<float>::max());
constexpr double kLog2e = 1.4426950408889634;

// ---- helpers --------------------------------------------------------------------------------------

Owned4 tensor(int64_t b, int64_t s, int64_t h, int64_t d) { return Owned4(b, s, h, d, DType::f32, Layout::BSHD); }

Owned4 random_tensor(int64_t b, int64_t s, int64_t h, int64_t d, std::mt19937& rng) {
  Owned4 t = tensor(b, s, h, d);
  t.fill_random(rng);
  return t;
}

void set(Owned4& t, int64_t b, int64_t s, int64_t h, int64_t d, double x) {
  int64_t idx[4] = {b, s, h, d};
  t.view.set(idx, x);
}

// True when pred holds for x = t(b, s, h, d) for every d (all_of) or some d (any_of).
bool all_of(const Owned4& t, int64_t b, int64_t s, int64_t h, const std::function<bool(double)>& pred) {
  for (int64_t d = 0; d < t.view.shape[3]; ++d)
    if (!pred(t.at(b, s, h, d, Layout::BSHD))) return false;
  return true;
}
bool any_of(const Owned4& t, int64_t b, int64_t s, int64_t h, const std::function<bool(double)>& pred) {
  return !all_of(t, b, s, h, [&](double x) { return !pred(x); });
}
const auto is_finite = [](double x) { return std::isfinite(x); };
const auto is_nan = [](double x) { return std::isnan(x); };
const auto is_zero = [](double x) { return x == 0.0; };

bool no_nan(const Owned4& t) {
  for (int64_t b = 0; b < t.view.shape[0]; ++b)
    for (int64_t s = 0; s < t.view.shape[1]; ++s)
      for (int64_t h = 0; h < t.view.shape[2]; ++h)
        if (any_of(t, b, s, h, is_nan)) return false;
  return true;
}

bool all_finite(const Owned4& t) {
  for (int64_t b = 0; b < t.view.shape[0]; ++b)
    for (int64_t s = 0; s < t.view.shape[1]; ++s)
      for (int64_t h = 0; h < t.view.shape[2]; ++h)
        if (!all_of(t, b, s, h, is_finite)) return false;
  return true;
}

// Normwise error of a gradient against its reference, floor 1e-2 (the kernel suites' rule).
double grad_err(const Owned4& got, const std::vector<double>& want) {
  const auto& s = got.view.shape;
  return test::rel_err(got, Layout::BSHD, want, s[0], s[1], s[2], s[3], 1e-2);
}
double fwd_err(const Owned4& got, const std::vector<double>& want) {
  const auto& s = got.view.shape;
  return test::rel_err(got, Layout::BSHD, want, s[0], s[1], s[2], s[3]);
}

// Multiplies every element of t by f.
void scale_by(Owned4& t, double f) {
  int64_t idx[4];
  for (idx[0] = 0; idx[0] < t.view.shape[0]; ++idx[0])
    for (idx[1] = 0; idx[1] < t.view.shape[1]; ++idx[1])
      for (idx[2] = 0; idx[2] < t.view.shape[2]; ++idx[2])
        for (idx[3] = 0; idx[3] < t.view.shape[3]; ++idx[3]) t.view.set(idx, t.view.get(idx) * f);
}

// ---- MLR ------------------------------------------------------------------------------------------

struct MlrRun {  // one MLR forward + backward (f32, BSHD, one head)
  Owned4 o, dq, dk, dv;
  std::vector<float> lse;  // batch x Nq
};

MlrRun run_mlr(const Owned4& q, const Owned4& k, const Owned4& v, const Owned4& g, const MlrOptions& opt) {
  const int64_t Bt = q.view.shape[0], Nq = q.view.shape[1], Nk = k.view.shape[1], D = q.view.shape[3];
  const int64_t Dv = v.view.shape[3];
  MlrRun r{tensor(Bt, Nq, 1, Dv), tensor(Bt, Nq, 1, D), tensor(Bt, Nk, 1, D), tensor(Bt, Nk, 1, Dv),
           std::vector<float>(size_t(Bt * Nq))};
  const TensorView lse(r.lse.data(), DType::f32, {Bt, 1, Nq});
  mlr_attention_forward(q.view, k.view, v.view, r.o.view, lse, opt);
  mlr_attention_backward(q.view, k.view, v.view, r.o.view, lse, g.view, r.dq.view, r.dk.view, r.dv.view, opt);
  return r;
}

struct MlrInputs {
  Owned4 q, k, v, g;
};

MlrInputs mlr_inputs(int64_t Bt, int64_t Nq, int64_t Nk, int64_t D, int64_t Dv, unsigned seed) {
  std::mt19937 rng(seed);
  MlrInputs in{random_tensor(Bt, Nq, 1, D, rng), random_tensor(Bt, Nk, 1, D, rng), random_tensor(Bt, Nk, 1, Dv, rng),
               random_tensor(Bt, Nq, 1, Dv, rng)};
  return in;
}

// True when every row of batch b of t is finite.
bool batch_finite(const Owned4& t, int64_t b) {
  for (int64_t s = 0; s < t.view.shape[1]; ++s)
    if (!all_of(t, b, s, 0, is_finite)) return false;
  return true;
}

// A NaN in one element of query i0 of batch 0 (a last-level dim): its output row, lse and dq row
// are NaN, and so are dk and dv of every key it sees (causal: j <= i0); every other query's o,
// lse, dq and all of batch 1 stay finite. 150 positions span two query tiles and two key tiles.
TEST(MlrNonFinite, NaNInAQueryReachesItsRowAndTheKeysItSees) {
  const int64_t N = 150, D = 6, Dv = 5, i0 = 70;
  MlrInputs in = mlr_inputs(2, N, N, D, Dv, 1);
  set(in.q, 0, i0, 0, D - 1, kNaN);
  const MlrOptions opt = mlr_options({2, 2, 2});
  for (Isa isa : test::isas_to_test()) {
    SCOPED_TRACE(isa_name(isa));
    set_isa(isa);
    const MlrRun r = run_mlr(in.q, in.k, in.v, in.g, opt);
    for (int64_t i = 0; i < N; ++i) {
      if (i == i0) {
        EXPECT_TRUE(all_of(r.o, 0, i, 0, is_nan)) << "o row " << i;
        EXPECT_TRUE(std::isnan(r.lse[size_t(i)]));
        EXPECT_TRUE(all_of(r.dq, 0, i, 0, is_nan)) << "dq row " << i;
      } else {
        EXPECT_TRUE(all_of(r.o, 0, i, 0, is_finite)) << "o row " << i;
        EXPECT_TRUE(std::isfinite(r.lse[size_t(i)])) << i;
        EXPECT_TRUE(all_of(r.dq, 0, i, 0, is_finite)) << "dq row " << i;
      }
      if (i <= i0) {  // key i is seen by query i0
        EXPECT_TRUE(any_of(r.dk, 0, i, 0, is_nan)) << "dk row " << i;
        EXPECT_TRUE(all_of(r.dv, 0, i, 0, is_nan)) << "dv row " << i;
      }
    }
    for (const Owned4* t : {&r.o, &r.dq, &r.dk, &r.dv}) EXPECT_TRUE(batch_finite(*t, 1));
  }
  test::restore_best_isa();
}

// +Inf in dim 2 of value j0 of batch 0: it reaches dim 2 of every output row that sees key j0
// (causal: i >= j0) and their dq rows (dP = dO . v); no other output dim, no lse, not dv
// (dv = P^T dO does not read v), nothing of batch 1. (Rows i < j0 of its query tile mask j0 but
// may be reached through P = 0 times Inf: allowed, attention.h.)
TEST(MlrNonFinite, InfInAValueReachesTheRowsThatSeeIt) {
  const int64_t N = 150, D = 6, Dv = 5, j0 = 40;
  MlrInputs in = mlr_inputs(2, N, N, D, Dv, 2);
  set(in.v, 0, j0, 0, 2, kInf);
  const MlrOptions opt = mlr_options({2, 2, 2});
  for (Isa isa : test::isas_to_test()) {
    SCOPED_TRACE(isa_name(isa));
    set_isa(isa);
    const MlrRun r = run_mlr(in.q, in.k, in.v, in.g, opt);
    for (int64_t i = 0; i < N; ++i) {
      for (int64_t d = 0; d < Dv; ++d) {
        const double x = r.o.at(0, i, 0, d, Layout::BSHD);
        if (d != 2) {
          EXPECT_TRUE(std::isfinite(x)) << "o " << i << "," << d;
        } else if (i >= j0) {
          EXPECT_FALSE(std::isfinite(x)) << "o " << i << "," << d;
        }
      }
      EXPECT_TRUE(std::isfinite(r.lse[size_t(i)])) << i;
      if (i >= j0) {
        EXPECT_TRUE(any_of(r.dq, 0, i, 0, [](double x) { return !std::isfinite(x); })) << "dq row " << i;
      }
    }
    EXPECT_TRUE(all_finite(r.dv));
    for (const Owned4* t : {&r.o, &r.dq, &r.dk}) EXPECT_TRUE(batch_finite(*t, 1));
  }
  test::restore_best_isa();
}

// Rows with no allowed key: zeros, lse = -inf, zero dq, never NaN, and dk / dv equal to the
// reference's, under every ISA.
//   causal, Nq > Nk: the first Nq - Nk queries sit before key 0 (150 x 60: query tile 0 is wholly
//     empty, tile 1 partly);
//   not causal, mask_cross_segment, Nq > Nk: queries at negative positions share no block with
//     any key (blocks are by absolute position: [-8, 0) is not [0, 8)).
TEST(MlrNonFinite, RowsWithNoKeyGiveZerosNotNaN) {
  struct Empty {
    int64_t Nq, Nk;
    bool causal, mask_cross;
  };
  for (const Empty& c : {Empty{150, 60, true, false}, Empty{20, 8, true, true}, Empty{20, 8, false, true},
                         Empty{150, 60, false, true}}) {
    SCOPED_TRACE(testing::Message() << c.Nq << "x" << c.Nk << (c.causal ? " causal" : " full")
                                    << (c.mask_cross ? " mask_cross_segment" : ""));
    const int64_t D = 6, Dv = 5, empty_rows = c.Nq - c.Nk;
    MlrInputs in = mlr_inputs(1, c.Nq, c.Nk, D, Dv, 3);
    MlrOptions opt = mlr_options({2, 2, 2});
    opt.causal = c.causal;
    opt.mask_cross_segment = c.mask_cross;
    std::vector<double> ro(static_cast<size_t>(c.Nq * Dv)), rl(static_cast<size_t>(c.Nq));
    std::vector<double> rdq(static_cast<size_t>(c.Nq * D)), rdk(static_cast<size_t>(c.Nk * D));
    std::vector<double> rdv(static_cast<size_t>(c.Nk * Dv));
    reference::mlr_attention_forward(in.q.view, in.k.view, in.v.view, opt, ro.data(), rl.data());
    reference::mlr_attention_backward(in.q.view, in.k.view, in.v.view, in.g.view, opt, rdq.data(), rdk.data(),
                                      rdv.data());
    for (Isa isa : test::isas_to_test()) {
      SCOPED_TRACE(isa_name(isa));
      set_isa(isa);
      const MlrRun r = run_mlr(in.q, in.k, in.v, in.g, opt);
      for (int64_t i = 0; i < c.Nq; ++i) {
        if (i < empty_rows) {
          EXPECT_TRUE(std::isinf(r.lse[size_t(i)]) && r.lse[size_t(i)] < 0) << i;
          EXPECT_TRUE(all_of(r.o, 0, i, 0, is_zero)) << "o row " << i;
          EXPECT_TRUE(all_of(r.dq, 0, i, 0, is_zero)) << "dq row " << i;
        } else {
          EXPECT_TRUE(std::isfinite(r.lse[size_t(i)])) << i;
        }
      }
      for (const Owned4* t : {&r.o, &r.dq, &r.dk, &r.dv}) EXPECT_TRUE(all_finite(*t));
      EXPECT_LE(fwd_err(r.o, ro), 2e-5);
      EXPECT_LE(grad_err(r.dq, rdq), 1e-4);
      EXPECT_LE(grad_err(r.dk, rdk), 1e-4);
      EXPECT_LE(grad_err(r.dv, rdv), 1e-4);
    }
  }
  test::restore_best_isa();
}

// ---- Monarch --------------------------------------------------------------------------------------

constexpr int64_t kMBt = 2, kMN = 23, kMH = 2, kMD = 8, kMB = 5;  // M = 5 blocks, 2 padded tokens

struct MonarchRun {  // one Monarch forward + backward (f32, BSHD, kMBt x kMN x kMH x kMD)
  Owned4 o, dq, dk, dv;
};

MonarchRun run_monarch(const Owned4& q, const Owned4& k, const Owned4& v, const Owned4& g,
                       const MonarchOptions& opt) {
  const auto& s = q.view.shape;
  MonarchRun r{tensor(s[0], s[1], s[2], v.view.shape[3]), tensor(s[0], s[1], s[2], s[3]),
               tensor(s[0], s[1], k.view.shape[2], s[3]), tensor(s[0], s[1], k.view.shape[2], v.view.shape[3])};
  monarch_attention_forward(q.view, k.view, v.view, r.o.view, TensorView(), opt);
  monarch_attention_backward(q.view, k.view, v.view, TensorView(), g.view, r.dq.view, r.dk.view, r.dv.view, opt);
  return r;
}

struct MonarchInputs {
  Owned4 q, k, v, g;
};

MonarchInputs monarch_inputs(unsigned seed) {
  std::mt19937 rng(seed);
  return MonarchInputs{random_tensor(kMBt, kMN, kMH, kMD, rng), random_tensor(kMBt, kMN, kMH, kMD, rng),
                       random_tensor(kMBt, kMN, kMH, kMD, rng), random_tensor(kMBt, kMN, kMH, kMD, rng)};
}

// Calls body(opt) for T = 1..3 x {stable, reference} x every ISA, with the mode in a trace.
void for_monarch_variants(MonarchOptions opt, const std::function<void(const MonarchOptions&)>& body) {
  for (int64_t T : {1, 2, 3})
    for (MonarchMode mode : {MonarchMode::stable, MonarchMode::reference})
      for (Isa isa : test::isas_to_test()) {
        SCOPED_TRACE(testing::Message() << "T=" << T << (mode == MonarchMode::stable ? " stable " : " reference ")
                                        << isa_name(isa));
        set_isa(isa);
        opt.num_steps = T;
        opt.mode = mode;
        body(opt);
      }
  test::restore_best_isa();
}

// True when every row of (b, h) except those with `except(n)` satisfies all_of(pred).
bool unit_rows(const Owned4& t, int64_t b, int64_t h, const std::function<bool(double)>& pred) {
  for (int64_t n = 0; n < t.view.shape[1]; ++n)
    if (!all_of(t, b, n, h, pred)) return false;
  return true;
}

// A NaN in query token n0 (batch 0, head 0) reaches, in the forward, exactly the queries of its
// offset j0 = n0 mod B (it enters only the R-step rows of offset j0, through a[k, j0] and
// c[k, j0], and so only al, cl of offset j0); in the backward, gradients of that (batch, head)
// only. Every other (batch, head) stays finite.
TEST(MonarchNonFinite, NaNInAQueryReachesItsOffsetAndItsHeadOnly) {
  const int64_t n0 = 7, j0 = n0 % kMB;  // post padding: position = token
  MonarchInputs in = monarch_inputs(4);
  set(in.q, 0, n0, 0, 3, kNaN);
  MonarchOptions opt;
  opt.block_size = kMB;
  for_monarch_variants(opt, [&](const MonarchOptions& o) {
    const MonarchRun r = run_monarch(in.q, in.k, in.v, in.g, o);
    for (int64_t n = 0; n < kMN; ++n) {
      if (n % kMB == j0) {
        EXPECT_TRUE(all_of(r.o, 0, n, 0, is_nan)) << "o row " << n;
      } else {
        EXPECT_TRUE(all_of(r.o, 0, n, 0, is_finite)) << "o row " << n;
      }
    }
    EXPECT_FALSE(no_nan(r.dq) && no_nan(r.dk) && no_nan(r.dv)) << "the gradients of (0, 0) read the NaN";
    for (int64_t b = 0; b < kMBt; ++b)
      for (int64_t h = 0; h < kMH; ++h) {
        if (b == 0 && h == 0) continue;
        for (const Owned4* t : {&r.o, &r.dq, &r.dk, &r.dv}) EXPECT_TRUE(unit_rows(*t, b, h, is_finite)) << b << "," << h;
      }
  });
}

// A NaN in key token m0 (batch 0, kv head 1) reaches every query of that (batch, head): its block's
// R rows of every offset, so al / cl of every offset, so every L-step. +Inf in dim 3 of value m1
// (batch 1, head 0) reaches dim 3 of every output row of that head (y = R v, O = L y) and nothing
// else of the forward. Other (batch, head) units stay finite, forward and backward.
TEST(MonarchNonFinite, NaNInAKeyOrInfInAValueStaysInItsHead) {
  const int64_t m0 = 11, m1 = 20;
  MonarchInputs in = monarch_inputs(5);
  set(in.k, 0, m0, 1, 0, kNaN);
  set(in.v, 1, m1, 0, 3, kInf);
  MonarchOptions opt;
  opt.block_size = kMB;
  for_monarch_variants(opt, [&](const MonarchOptions& o) {
    const MonarchRun r = run_monarch(in.q, in.k, in.v, in.g, o);
    EXPECT_TRUE(unit_rows(r.o, 0, 1, is_nan)) << "NaN key: every query of (0, 1)";
    for (int64_t n = 0; n < kMN; ++n)
      for (int64_t d = 0; d < kMD; ++d)
        EXPECT_EQ(std::isfinite(r.o.at(1, n, 0, d, Layout::BSHD)), d != 3) << "Inf value: (1, 0) row " << n << " dim " << d;
    for (const Owned4* t : {&r.o, &r.dq, &r.dk, &r.dv}) {
      EXPECT_TRUE(unit_rows(*t, 0, 0, is_finite));
      EXPECT_TRUE(unit_rows(*t, 1, 1, is_finite));
    }
    EXPECT_FALSE(no_nan(r.dq) && no_nan(r.dk)) << "the gradients of (0, 1) read the NaN";
  });
}

// Tokens with no valid key anywhere, and key blocks with no valid key (masked + padded), in both
// paddings and for B = 1 (every masked token is an empty block): never NaN, forward or backward;
// a batch with every token masked outputs zeros and gets zero gradients; stable mode outputs zeros
// for masked queries; everything equals the double reference.
TEST(MonarchNonFinite, EmptyBlocksAndRowsGiveZerosNotNaN) {
  for (int64_t block : {kMB, int64_t(1)})
    for (MonarchPad pad : {MonarchPad::post, MonarchPad::pre}) {
      SCOPED_TRACE(testing::Message() << "B=" << block << (pad == MonarchPad::pre ? " pre" : " post"));
      MonarchInputs in = monarch_inputs(6);
      MonarchOptions opt;
      opt.block_size = block;
      opt.pad = pad;
      const MonarchGeometry geo = monarch_geometry(kMN, opt);
      // batch 0: every token masked; batch 1: every token of blocks 0, 2 and M-1, so that a block
      // of only masked tokens, and one of masked and padded tokens (block 0 with pre padding,
      // M-1 with post), have no valid key.
      std::vector<uint8_t> mask(size_t(kMBt * kMN), 1);
      for (int64_t n = 0; n < kMN; ++n) {
        mask[size_t(n)] = 0;
        const int64_t blk = (n + geo.pad_front) / geo.block_size;
        if (blk == 0 || blk == 2 || blk == geo.num_blocks - 1) mask[size_t(kMN + n)] = 0;
      }
      opt.key_padding_mask = TensorView(mask.data(), DType::u8, {kMBt, kMN});
      for_monarch_variants(opt, [&](const MonarchOptions& o) {
        const MonarchRun r = run_monarch(in.q, in.k, in.v, in.g, o);
        for (const Owned4* t : {&r.o, &r.dq, &r.dk, &r.dv}) EXPECT_TRUE(no_nan(*t));
        for (int64_t h = 0; h < kMH; ++h) {
          for (const Owned4* t : {&r.o, &r.dq, &r.dk, &r.dv}) EXPECT_TRUE(unit_rows(*t, 0, h, is_zero)) << "batch 0";
          if (o.mode != MonarchMode::stable) continue;
          for (int64_t n = 0; n < kMN; ++n) {
            if (!mask[size_t(kMN + n)]) {
              EXPECT_TRUE(all_of(r.o, 1, n, h, is_zero)) << "masked query " << n;
            }
          }
        }
        const size_t elems = size_t(kMBt * kMN * kMH * kMD);
        std::vector<double> ro(elems), rdq(elems), rdk(elems), rdv(elems);
        reference::monarch_attention_forward(in.q.view, in.k.view, in.v.view, o, ro.data());
        reference::monarch_attention_backward(in.q.view, in.k.view, in.v.view, in.g.view, o, rdq.data(), rdk.data(),
                                              rdv.data());
        EXPECT_LE(fwd_err(r.o, ro), 2e-5);
        EXPECT_LE(grad_err(r.dq, rdq), 1e-4);
        EXPECT_LE(grad_err(r.dk, rdk), 1e-4);
        EXPECT_LE(grad_err(r.dv, rdv), 1e-4);
      });
    }
}

// ---- The finite-input bound (attention.h, mlr.h, monarch.h) -----------------------------------------

// The logit bound of attention.h / mlr.h for one batch and head: log2(e) * max over pairs (i, j)
// of sum over slices {d0, d1, c} of c * sum_{d0 <= d < d1} |q_id k_jd| (dense: one slice, c = scale;
// MLR: one slice per level, c = c_l).
struct Slice {
  int64_t d0, d1;
  double c;
};
double logit_bound(const Owned4& q, const Owned4& k, const std::vector<Slice>& slices) {
  double best = 0;
  for (int64_t i = 0; i < q.view.shape[1]; ++i)
    for (int64_t j = 0; j < k.view.shape[1]; ++j) {
      double s = 0;
      for (const Slice& sl : slices)
        for (int64_t d = sl.d0; d < sl.d1; ++d)
          s += sl.c * std::fabs(q.at(0, i, 0, d, Layout::BSHD) * k.at(0, j, 0, d, Layout::BSHD));
      best = std::max(best, s);
    }
  return kLog2e * best;
}

struct DenseRun {  // one dense forward + backward (f32, BSHD, one batch and head)
  Owned4 o, dq, dk, dv;
  std::vector<float> lse;
};

DenseRun run_dense(const Owned4& q, const Owned4& k, const Owned4& v, const Owned4& g, const AttentionOptions& opt) {
  const int64_t Nq = q.view.shape[1], Nk = k.view.shape[1], D = q.view.shape[3], Dv = v.view.shape[3];
  DenseRun r{tensor(1, Nq, 1, Dv), tensor(1, Nq, 1, D), tensor(1, Nk, 1, D), tensor(1, Nk, 1, Dv),
             std::vector<float>(size_t(Nq))};
  const TensorView lse(r.lse.data(), DType::f32, {1, 1, Nq});
  attention_forward(q.view, k.view, v.view, r.o.view, lse, opt);
  attention_backward(q.view, k.view, v.view, r.o.view, lse, g.view, r.dq.view, r.dk.view, r.dv.view, opt);
  return r;
}

constexpr int64_t kBNk = 130, kBD = 16, kBDv = 8;  // bound tests: keys, head dims
const std::vector<Slice> kDenseSlices = {{0, kBD, 0.25}};                             // scale = 1/sqrt(16)
const std::vector<Slice> kMlrSlices = {{0, 4, 1.0 / 4}, {4, 8, 1.0 / 4}, {8, 16, 1.0 / 8}};  // ranks 4 | 4 | 8
MlrOptions bound_mlr_options() { return mlr_options({4, 4, 8}); }

// Calls body(in, dense?) for the dense kernel (causal) and MLR, Nq = 3 (the dense decode path) and
// 70 (tiled), with q scaled so that the logit bound equals `target`, under every ISA.
void for_bound_cases(double target, const std::function<void(const MlrInputs&, bool)>& body) {
  for (int64_t Nq : {int64_t(3), int64_t(70)})
    for (bool dense : {true, false}) {
      MlrInputs in = mlr_inputs(1, Nq, kBNk, kBD, kBDv, 7);
      scale_by(in.q, target / logit_bound(in.q, in.k, dense ? kDenseSlices : kMlrSlices));
      for (Isa isa : test::isas_to_test()) {
        SCOPED_TRACE(testing::Message() << (dense ? "dense" : "mlr") << " Nq=" << Nq << " " << isa_name(isa));
        set_isa(isa);
        body(in, dense);
      }
    }
  test::restore_best_isa();
}

AttentionOptions causal_options() {
  AttentionOptions o;
  o.causal = true;
  return o;
}

// Forward at half the forward bound (logits up to ~1e38): o and lse finite and equal to the double
// reference (a softmax of logits this far apart is one-hot in both).
TEST(FiniteBound, ForwardJustInsideIsFinite) {
  for_bound_cases(0.5 * kFltMax, [](const MlrInputs& in, bool dense) {
    const int64_t Nq = in.q.view.shape[1];
    std::vector<double> ro(static_cast<size_t>(Nq * kBDv)), rl(static_cast<size_t>(Nq));
    std::vector<float> lse(static_cast<size_t>(Nq));
    Owned4 o = tensor(1, Nq, 1, kBDv);
    const TensorView lv(lse.data(), DType::f32, {1, 1, Nq});
    if (dense) {
      reference::attention_forward(in.q.view, in.k.view, in.v.view, causal_options(), ro.data(), rl.data());
      attention_forward(in.q.view, in.k.view, in.v.view, o.view, lv, causal_options());
    } else {
      reference::mlr_attention_forward(in.q.view, in.k.view, in.v.view, bound_mlr_options(), ro.data(), rl.data());
      mlr_attention_forward(in.q.view, in.k.view, in.v.view, o.view, lv, bound_mlr_options());
    }
    EXPECT_TRUE(all_finite(o));
    for (float x : lse) EXPECT_TRUE(std::isfinite(x));
    EXPECT_LE(fwd_err(o, ro), 2e-5);
  });
}

// Backward at half its bound (2^25): every gradient finite. Far beyond it (2^32) the recomputed
// probabilities overflow, as documented: some gradient is Inf or NaN.
TEST(FiniteBound, BackwardJustInsideIsFinite) {
  const auto grads_finite = [](const MlrInputs& in, bool dense) {
    if (dense) {
      const DenseRun r = run_dense(in.q, in.k, in.v, in.g, causal_options());
      return all_finite(r.dq) && all_finite(r.dk) && all_finite(r.dv);
    }
    const MlrRun r = run_mlr(in.q, in.k, in.v, in.g, bound_mlr_options());
    return all_finite(r.dq) && all_finite(r.dk) && all_finite(r.dv);
  };
  for_bound_cases(std::ldexp(1.0, 25), [&](const MlrInputs& in, bool dense) { EXPECT_TRUE(grads_finite(in, dense)); });
  // (an error naming the bound instead, issue 48 item 6)
  for_bound_cases(std::ldexp(1.0, 32), [&](const MlrInputs& in, bool dense) {
    test::expect_error([&] { grads_finite(in, dense); },
                       {dense ? "attention_backward" : "mlr_attention_backward", "argument 'q'",
                        "backward's finite-input bound", dense ? "strata/attention.h" : "strata/mlr.h"});
  });
}

// Dense beyond the bound (issue 48 item 6): q and k with entries 1e20 gave NaN, and a row whose
// every logit overflowed to -inf a row of zeros, with no error. Both are now an error naming 'q'
// and the bound, in the forward (the decode rows and the tiled path) and the backward; just inside
// the forward's bound (above) nothing is raised.
TEST(FiniteBound, DenseBeyondIsAnErrorNamingTheBound) {
  const int64_t D = 16, Dv = 8;
  for (int64_t N : {int64_t(3), int64_t(70)}) {
    MlrInputs in = mlr_inputs(1, N, N, D, Dv, 8);
    for (int64_t d = 0; d < D; ++d) {
      set(in.q, 0, N - 1, 0, d, 1e20);
      set(in.k, 0, 1, 0, d, 1e20);
    }
    MlrInputs neg = mlr_inputs(1, N, N, D, Dv, 9);  // every logit of query 0 about -16e40
    for (int64_t j = 0; j < N; ++j)
      for (int64_t d = 0; d < D; ++d) set(neg.k, 0, j, 0, d, 1e20 * (1 + 0.01 * double(j)));
    for (int64_t d = 0; d < D; ++d) set(neg.q, 0, 0, 0, d, -1e20);
    for (Isa isa : test::isas_to_test()) {
      SCOPED_TRACE(testing::Message() << "N=" << N << " " << isa_name(isa));
      set_isa(isa);
      for (const MlrInputs* x : {&in, &neg}) {
        Owned4 o = tensor(1, N, 1, Dv);
        std::vector<float> lse(static_cast<size_t>(N));
        test::expect_error(
            [&] {
              attention_forward(x->q.view, x->k.view, x->v.view, o.view, TensorView(lse.data(), DType::f32, {1, 1, N}),
                                AttentionOptions());
            },
            {"attention_forward", "argument 'q'", "forward's finite-input bound", "scale q or k down"});
      }
    }
  }
  test::restore_best_isa();
}

// MLR beyond the bound: q_i0 . k_j0 = 16e40 overflows fp32. Row i0 held a +inf logit and was NaN
// with no error (issue 48 item 6): now an error naming 'q', the bound and its header.
TEST(FiniteBound, MlrBeyondIsAnErrorNamingTheBound) {
  const int64_t N = 70, D = 16, Dv = 8, i0 = 40, j0 = 5;
  MlrInputs in = mlr_inputs(1, N, N, D, Dv, 8);
  for (int64_t d = 0; d < D; ++d) {
    set(in.q, 0, i0, 0, d, 1e20);
    set(in.k, 0, j0, 0, d, 1e20);
  }
  for (Isa isa : test::isas_to_test()) {
    SCOPED_TRACE(isa_name(isa));
    set_isa(isa);
    test::expect_error([&] { run_mlr(in.q, in.k, in.v, in.g, mlr_options({4, 4, 8})); },
                       {"mlr_attention_forward", "argument 'q'", "forward's finite-input bound", "strata/mlr.h",
                        "scale q or k down"});
  }
  test::restore_best_isa();
}

// Monarch: q scaled so that the documented bound log2(e) * (scale * max |q_n| * max |k_m| + ln B)
// (2-norms) is half of FLT_MAX: finite results equal to the reference in both modes, every T.
TEST(FiniteBound, MonarchJustInsideIsFinite) {
  MonarchInputs in = monarch_inputs(10);
  const double sc = 1 / std::sqrt(double(kMD));
  double qn = 0, kn = 0;
  for (int64_t b = 0; b < kMBt; ++b)
    for (int64_t h = 0; h < kMH; ++h)
      for (int64_t n = 0; n < kMN; ++n) {
        double sq = 0, sk = 0;
        for (int64_t d = 0; d < kMD; ++d) {
          sq += in.q.at(b, n, h, d, Layout::BSHD) * in.q.at(b, n, h, d, Layout::BSHD);
          sk += in.k.at(b, n, h, d, Layout::BSHD) * in.k.at(b, n, h, d, Layout::BSHD);
        }
        qn = std::max(qn, std::sqrt(sq));
        kn = std::max(kn, std::sqrt(sk));
      }
  scale_by(in.q, 0.5 * kFltMax / (kLog2e * sc * qn * kn));
  MonarchOptions opt;
  opt.block_size = kMB;
  for_monarch_variants(opt, [&](const MonarchOptions& o) {
    const MonarchRun r = run_monarch(in.q, in.k, in.v, in.g, o);
    for (const Owned4* t : {&r.o, &r.dq, &r.dk, &r.dv}) EXPECT_TRUE(all_finite(*t));
    std::vector<double> ro(static_cast<size_t>(kMBt * kMN * kMH * kMD));
    reference::monarch_attention_forward(in.q.view, in.k.view, in.v.view, o, ro.data());
    EXPECT_LE(fwd_err(r.o, ro), 2e-5);
  });
}

// Monarch beyond the bound (T = 1): q_n0 . k_m0 = 8e40 with n0, m0 in one block. The R-step row
// (block of m0, offset of n0) held a +inf logit, and the queries of that offset were NaN with no
// error (issue 48 item 6): now an error naming 'q', the bound and its header, in both modes.
TEST(FiniteBound, MonarchBeyondIsAnErrorNamingTheBound) {
  const int64_t n0 = 7, m0 = 9;  // block 1, offsets 2 and 4
  MonarchInputs in = monarch_inputs(11);
  for (int64_t d = 0; d < kMD; ++d) {
    set(in.q, 0, n0, 0, d, 1e20);
    set(in.k, 0, m0, 0, d, 1e20);
  }
  MonarchOptions opt;
  opt.block_size = kMB;
  for (MonarchMode mode : {MonarchMode::stable, MonarchMode::reference})
    for (Isa isa : test::isas_to_test()) {
      SCOPED_TRACE(testing::Message() << (mode == MonarchMode::stable ? "stable " : "reference ") << isa_name(isa));
      set_isa(isa);
      opt.mode = mode;
      test::expect_error([&] { run_monarch(in.q, in.k, in.v, in.g, opt); },
                         {"monarch_attention_forward", "argument 'q'", "forward's finite-input bound",
                          "strata/monarch.h", "+ ln B"});
    }
  test::restore_best_isa();
}

}  // namespace
}  // namespace strata
