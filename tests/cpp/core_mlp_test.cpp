// tests/cpp/core_mlp_test.cpp: the fused GELU MLP (strata/mlp.h). The kernels (every ISA this CPU
// runs) against the double reference over rows (1, 7, 97, 1025: one partial tile, several, a
// ragged last one), widths and hidden sizes that are not multiples of the vector width (the
// padded paths) and are (the in-place paths), with and without biases, strided rows, forward and
// every gradient; optional gradients; repeatability; the reference's backward against finite
// differences of its forward; large pre-activations; bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "strata/cpu.h"
#include "strata/mlp.h"
#include "strata/threading.h"
#include "test_util.h"

namespace strata {
namespace {

using test::expect_error;
using test::rel_err;

// An owned matrix [rows x cols] (or vector: rows = -1) of dtype t, rows `gap` elements longer
// than cols (a strided view), filled with N(0, sd) draws.
struct Mat {
  std::vector<uint8_t> buf;
  TensorView view;
  Mat(int64_t rows, int64_t cols, DType t = DType::f32, int64_t gap = 0) {
    view.dtype = t;
    if (rows < 0) {
      view.ndim = 1;
      view.shape[0] = cols;
      view.stride[0] = 1;
      buf.resize(size_t(std::max<int64_t>(cols, 1) * dtype_size(t)));
    } else {
      view.ndim = 2;
      view.shape[0] = rows;
      view.shape[1] = cols;
      view.stride[0] = cols + gap;
      view.stride[1] = 1;
      buf.resize(size_t(std::max<int64_t>(rows * (cols + gap), 1) * dtype_size(t)));
    }
    view.data = buf.data();
  }
  Mat& fill(std::mt19937& rng, double sd) {
    std::normal_distribution<double> n(0.0, sd);
    for_each([&](int64_t* idx) { view.set(idx, n(rng)); });
    return *this;
  }
  template <class F>
  void for_each(F f) const {
    int64_t idx[2] = {0, 0};
    if (view.ndim == 1) {
      for (idx[0] = 0; idx[0] < view.shape[0]; ++idx[0]) f(idx);
      return;
    }
    for (idx[0] = 0; idx[0] < view.shape[0]; ++idx[0])
      for (idx[1] = 0; idx[1] < view.shape[1]; ++idx[1]) f(idx);
  }
  std::vector<double> values() const {
    std::vector<double> v;
    for_each([&](int64_t* idx) { v.push_back(view.get(idx)); });
    return v;
  }
};

struct Case {
  int64_t rows, D, H;
  bool bias;
  int64_t gap;
  int block = 0;  // MlpBlock: 0 none, 1 LayerNorm (with bias) + residual, 2 LayerNorm alone (no bias), 3 residual
};

// Runs one case under the active ISA; compares forward and backward with the reference.
void check_case(const Case& c, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << "rows " << c.rows << " D " << c.D << " H " << c.H << " bias " << c.bias << " gap "
                                  << c.gap << " block " << c.block << " isa " << isa_name(active_isa()));
  std::mt19937 rng(seed);
  Mat x(c.rows, c.D, DType::f32, c.gap), w1(c.H, c.D, DType::f32, c.gap), w2(c.D, c.H, DType::f32, c.gap);
  Mat b1(-1, c.H), b2(-1, c.D), dy(c.rows, c.D, DType::f32, c.gap);
  x.fill(rng, 1.0);
  w1.fill(rng, 1.0 / std::sqrt(double(c.D)));
  w2.fill(rng, 1.0 / std::sqrt(double(c.H)));
  b1.fill(rng, 0.5);
  b2.fill(rng, 0.5);
  dy.fill(rng, 1.0);
  const TensorView nb1 = c.bias ? b1.view : TensorView{}, nb2 = c.bias ? b2.view : TensorView{};
  Mat lnw(-1, c.D), lnb(-1, c.D), stats(c.rows, 2);
  lnw.fill(rng, 0.3);
  for (int64_t i = 0; i < c.D; ++i) {
    const int64_t idx[1] = {i};
    lnw.view.set(idx, 1.0 + lnw.view.get(idx));
  }
  lnb.fill(rng, 0.3);
  MlpBlock blk;
  if (c.block == 1 || c.block == 2) {
    blk.ln_weight = lnw.view;
    if (c.block == 1) blk.ln_bias = lnb.view;
    blk.stats = stats.view;
  }
  blk.residual = c.block == 1 || c.block == 3;
  Mat y(c.rows, c.D, DType::f32, c.gap), h(c.rows, c.H, DType::f32, c.gap);
  gelu_mlp_forward(x.view, w1.view, nb1, w2.view, nb2, y.view, h.view, blk);
  std::vector<double> ry(size_t(c.rows * c.D)), rh(size_t(c.rows * c.H));
  reference::gelu_mlp_forward(x.view, w1.view, nb1, w2.view, nb2, ry.data(), rh.data(), blk);
  // fp32 products over K = D or H terms (<= 512 here): normwise errors of a few 1e-7 (the erf
  // approximation adds at most 1.5e-7 x |h| to a gelu value); 2e-5 leaves room and still fails
  // any wrong term (a missing bias, a dropped column: ~1e-2 and more).
  EXPECT_LT(rel_err(y.values(), ry), 2e-5);
  EXPECT_LT(rel_err(h.values(), rh), 2e-5);

  Mat dx(c.rows, c.D, DType::f32, c.gap), dw1(c.H, c.D), db1(-1, c.H), dw2(c.D, c.H), db2(-1, c.D);
  Mat dlnw(-1, c.D), dlnb(-1, c.D);
  const bool ln = c.block == 1 || c.block == 2;
  gelu_mlp_backward(dy.view, x.view, w1.view, w2.view, h.view, dx.view, dw1.view, db1.view, dw2.view, db2.view, blk,
                    ln ? dlnw.view : TensorView{}, c.block == 1 ? dlnb.view : TensorView{});
  std::vector<double> rdx(size_t(c.rows * c.D)), rdw1(size_t(c.H * c.D)), rdb1(size_t(c.H)), rdw2(size_t(c.D * c.H)),
      rdb2(size_t(c.D)), rdlnw(size_t(c.D)), rdlnb(size_t(c.D));
  reference::gelu_mlp_backward(dy.view, x.view, w1.view, nb1, w2.view, rdx.data(), rdw1.data(), rdb1.data(),
                               rdw2.data(), rdb2.data(), blk, rdlnw.data(), rdlnb.data());
  // the LayerNorm's weight and bias gradients: sums over the rows, as the others
  if (ln) {
    EXPECT_LT(rel_err(dlnw.values(), rdlnw), 5e-5);
  }
  if (c.block == 1) {
    EXPECT_LT(rel_err(dlnb.values(), rdlnb), 5e-5);
  }
  // The weight gradients sum over the rows (1025 terms): fp32 sums of that length, 5e-5.
  EXPECT_LT(rel_err(dx.values(), rdx), 2e-5);
  EXPECT_LT(rel_err(dw1.values(), rdw1), 5e-5);
  EXPECT_LT(rel_err(db1.values(), rdb1), 5e-5);
  EXPECT_LT(rel_err(dw2.values(), rdw2), 5e-5);
  EXPECT_LT(rel_err(db2.values(), rdb2), 5e-5);
}

TEST(Mlp, KernelsMatchTheReference) {
  const std::vector<Case> cases = {
      {1, 1, 3, true, 0},
      {7, 5, 17, true, 3},
      {97, 16, 64, false, 0},
      {97, 33, 50, true, 1},
      {1025, 16, 48, true, 0},
      {130, 64, 256, false, 5},
      {97, 128, 512, true, 0},
      {1025, 128, 512, false, 0},
      {64, 128, 512, true, 0},
      {65, 17, 130, false, 0},
      // a block's MLP half: LayerNorm and residual, LayerNorm alone, residual alone
      {97, 16, 64, true, 2, 1},
      {130, 33, 50, false, 0, 2},
      {7, 5, 17, true, 0, 3},
      {1025, 128, 512, false, 0, 1},
      {65, 128, 512, true, 0, 2},
  };
  uint32_t seed = 1;
  for (const Case& c : cases) {
    for (Isa isa : test::isas_to_test(double(c.rows) * c.D * c.H, 5e6)) {
      set_isa(isa);
      check_case(c, seed);
    }
    ++seed;
  }
  test::restore_best_isa();
}

// ln_linear (the first layer alone with the block's LayerNorm: a pre-LN block's ln1 + q/k/v
// projection) against its reference, with and without the LayerNorm and the bias, every ISA.
TEST(Mlp, LnLinearMatchesTheReference) {
  struct L {
    int64_t rows, D, H;
    bool ln, bias;
  };
  uint32_t seed = 40;
  for (const L& c : std::vector<L>{{7, 5, 17, true, true},
                                   {97, 128, 384, true, false},
                                   {130, 33, 50, false, true},
                                   {1025, 64, 192, true, true}}) {
    for (Isa isa : test::isas_to_test(double(c.rows) * c.D * c.H, 5e6)) {
      set_isa(isa);
      SCOPED_TRACE(testing::Message() << "rows " << c.rows << " D " << c.D << " H " << c.H << " ln " << c.ln << " isa "
                                      << isa_name(isa));
      std::mt19937 rng(seed);
      Mat x(c.rows, c.D), w(c.H, c.D), b(-1, c.H), lnw(-1, c.D), lnb(-1, c.D), stats(c.rows, 2), dy(c.rows, c.H);
      x.fill(rng, 2);
      w.fill(rng, 1.0 / std::sqrt(double(c.D)));
      b.fill(rng, 0.5);
      lnw.fill(rng, 1);
      lnb.fill(rng, 0.5);
      dy.fill(rng, 1);
      MlpBlock blk;
      if (c.ln) {
        blk.ln_weight = lnw.view;
        blk.ln_bias = lnb.view;
        blk.stats = stats.view;
      }
      const TensorView bv = c.bias ? b.view : TensorView{};
      Mat y(c.rows, c.H);
      ln_linear_forward(x.view, w.view, bv, y.view, blk);
      std::vector<double> ry(size_t(c.rows * c.H));
      reference::ln_linear_forward(x.view, w.view, bv, ry.data(), blk);
      EXPECT_LT(rel_err(y.values(), ry), 2e-5);
      Mat dx(c.rows, c.D), dw(c.H, c.D), db(-1, c.H), dlnw(-1, c.D), dlnb(-1, c.D);
      ln_linear_backward(dy.view, x.view, w.view, dx.view, dw.view, db.view, blk, c.ln ? dlnw.view : TensorView{},
                         c.ln ? dlnb.view : TensorView{});
      std::vector<double> rdx(size_t(c.rows * c.D)), rdw(size_t(c.H * c.D)), rdb(size_t(c.H)), rlw(size_t(c.D)),
          rlb(size_t(c.D));
      reference::ln_linear_backward(dy.view, x.view, w.view, rdx.data(), rdw.data(), rdb.data(), blk, rlw.data(),
                                    rlb.data());
      EXPECT_LT(rel_err(dx.values(), rdx), 2e-5);
      EXPECT_LT(rel_err(dw.values(), rdw), 5e-5);
      EXPECT_LT(rel_err(db.values(), rdb), 5e-5);
      if (c.ln) {
        EXPECT_LT(rel_err(dlnw.values(), rlw), 5e-5);
        EXPECT_LT(rel_err(dlnb.values(), rlb), 5e-5);
      }
    }
    ++seed;
  }
  test::restore_best_isa();
  Mat x(4, 8), w(6, 8), y(4, 6);
  MlpBlock res;
  res.residual = true;
  expect_error([&] { ln_linear_forward(x.view, w.view, {}, y.view, res); }, {"block.residual"});
}

// Any subset of the gradients: the same values as the full call's (the same bits: each gradient
// comes from the same products whatever else is computed).
TEST(Mlp, OptionalGradients) {
  std::mt19937 rng(7);
  const int64_t rows = 200, D = 48, H = 80;
  Mat x(rows, D), w1(H, D), w2(D, H), dy(rows, D), y(rows, D), h(rows, H);
  x.fill(rng, 1);
  w1.fill(rng, 0.2);
  w2.fill(rng, 0.2);
  dy.fill(rng, 1);
  gelu_mlp_forward(x.view, w1.view, {}, w2.view, {}, y.view, h.view);
  Mat dx(rows, D), dw1(H, D), db1(-1, H), dw2(D, H), db2(-1, D);
  gelu_mlp_backward(dy.view, x.view, w1.view, w2.view, h.view, dx.view, dw1.view, db1.view, dw2.view, db2.view);
  Mat dx_only(rows, D), dw2_only(D, H);
  gelu_mlp_backward(dy.view, x.view, w1.view, w2.view, h.view, dx_only.view, {}, {}, {}, {});
  gelu_mlp_backward(dy.view, x.view, w1.view, w2.view, h.view, {}, {}, {}, dw2_only.view, {});
  EXPECT_EQ(dx.values(), dx_only.values());
  EXPECT_EQ(dw2.values(), dw2_only.values());
  // the forward without h: the same y
  Mat y2(rows, D);
  gelu_mlp_forward(x.view, w1.view, {}, w2.view, {}, y2.view, {});
  EXPECT_EQ(y.values(), y2.values());
}

// The same inputs and thread count give the same bits (the weight gradients' partial sums are
// added in a fixed order), whatever tiles each thread happened to run.
TEST(Mlp, Repeatable) {
  std::mt19937 rng(11);
  const int64_t rows = 777, D = 64, H = 256;
  Mat x(rows, D), w1(H, D), w2(D, H), dy(rows, D), y(rows, D), h(rows, H);
  x.fill(rng, 1);
  w1.fill(rng, 0.1);
  w2.fill(rng, 0.1);
  dy.fill(rng, 1);
  gelu_mlp_forward(x.view, w1.view, {}, w2.view, {}, y.view, h.view);
  std::vector<double> first;
  for (int rep = 0; rep < 3; ++rep) {
    Mat dw1(H, D);
    gelu_mlp_backward(dy.view, x.view, w1.view, w2.view, h.view, {}, dw1.view, {}, {}, {});
    if (rep == 0) first = dw1.values();
    EXPECT_EQ(dw1.values(), first);
  }
}

// The reference's backward is the derivative of its forward: central differences of
// sum(dy * y) in double on a tiny case (the kernels are compared with this backward above).
TEST(Mlp, ReferenceBackwardIsTheDerivative) {
  std::mt19937 rng(3);
  const int64_t rows = 3, D = 4, H = 6;
  Mat x(rows, D, DType::f64), w1(H, D, DType::f64), b1(-1, H, DType::f64), w2(D, H, DType::f64), b2(-1, D, DType::f64),
      dy(rows, D, DType::f64);
  x.fill(rng, 1);
  w1.fill(rng, 0.7);
  b1.fill(rng, 0.5);
  w2.fill(rng, 0.7);
  b2.fill(rng, 0.5);
  dy.fill(rng, 1);
  Mat lnw(-1, D, DType::f64), lnb(-1, D, DType::f64);  // a LayerNorm and the residual too
  lnw.fill(rng, 1.0);
  lnb.fill(rng, 0.5);
  MlpBlock blk;
  blk.ln_weight = lnw.view;
  blk.ln_bias = lnb.view;
  blk.residual = true;
  std::vector<double> dx(size_t(rows * D)), dw1(size_t(H * D)), db1(static_cast<size_t>(H)), dw2(size_t(D * H)),
      db2(static_cast<size_t>(D)), dlnw(static_cast<size_t>(D)), dlnb(static_cast<size_t>(D));
  reference::gelu_mlp_backward(dy.view, x.view, w1.view, b1.view, w2.view, dx.data(), dw1.data(), db1.data(),
                               dw2.data(), db2.data(), blk, dlnw.data(), dlnb.data());
  auto loss = [&] {
    std::vector<double> y(size_t(rows * D));
    reference::gelu_mlp_forward(x.view, w1.view, b1.view, w2.view, b2.view, y.data(), nullptr, blk);
    const std::vector<double> g = dy.values();
    double s = 0;
    for (size_t i = 0; i < y.size(); ++i) s += y[i] * g[i];
    return s;
  };
  // grad against central differences of f over every entry of m
  auto check_against = [&](auto&& f, Mat& m, const std::vector<double>& grad, const std::string& name) {
    size_t i = 0;
    m.for_each([&](int64_t* idx) {
      const double v = m.view.get(idx), eps = 1e-6;
      m.view.set(idx, v + eps);
      const double up = f();
      m.view.set(idx, v - eps);
      const double down = f();
      m.view.set(idx, v);
      EXPECT_NEAR(grad[i], (up - down) / (2 * eps), 1e-7) << name << " entry " << i;
      ++i;
    });
  };
  auto check = [&](Mat& m, const std::vector<double>& grad, const char* name) { check_against(loss, m, grad, name); };
  check(x, dx, "x");
  check(w1, dw1, "w1");
  check(b1, db1, "b1");
  check(w2, dw2, "w2");
  check(b2, db2, "b2");
  check(lnw, dlnw, "ln_weight");
  check(lnb, dlnb, "ln_bias");

  // ln_linear's reference backward, the derivative of its forward (sum(dh * y), the same draws)
  Mat dh(rows, H, DType::f64);
  dh.fill(rng, 1);
  std::vector<double> lx(size_t(rows * D)), lw(size_t(H * D)), lb(static_cast<size_t>(H)), llnw(static_cast<size_t>(D)),
      llnb(static_cast<size_t>(D));
  blk.residual = false;
  reference::ln_linear_backward(dh.view, x.view, w1.view, lx.data(), lw.data(), lb.data(), blk, llnw.data(),
                                llnb.data());
  auto lin_loss = [&] {
    std::vector<double> y(size_t(rows * H));
    reference::ln_linear_forward(x.view, w1.view, b1.view, y.data(), blk);
    const std::vector<double> g = dh.values();
    double s = 0;
    for (size_t i = 0; i < y.size(); ++i) s += y[i] * g[i];
    return s;
  };
  auto check_lin = [&](Mat& m, const std::vector<double>& grad, const char* name) {
    check_against(lin_loss, m, grad, std::string("ln_linear ") + name);
  };
  check_lin(x, lx, "x");
  check_lin(w1, lw, "w");
  check_lin(b1, lb, "b");
  check_lin(lnw, llnw, "ln_weight");
  check_lin(lnb, llnb, "ln_bias");
}

// Pre-activations far in both tails (|h| up to ~60): gelu(h) -> 0 and h, gelu'(h) -> 0 and 1, no
// overflow or NaN; a NaN input reaches its row's outputs.
TEST(Mlp, LargePreActivationsAndNaN) {
  std::mt19937 rng(5);
  const int64_t rows = 40, D = 16, H = 32;
  Mat x(rows, D), w1(H, D), w2(D, H), dy(rows, D), y(rows, D), h(rows, H);
  x.fill(rng, 1);
  w1.fill(rng, 8);
  w2.fill(rng, 0.2);
  dy.fill(rng, 1);
  gelu_mlp_forward(x.view, w1.view, {}, w2.view, {}, y.view, h.view);
  std::vector<double> ry(size_t(rows * D)), rh(size_t(rows * H));
  reference::gelu_mlp_forward(x.view, w1.view, {}, w2.view, {}, ry.data(), rh.data());
  EXPECT_LT(rel_err(y.values(), ry), 2e-5);
  Mat dx(rows, D);
  gelu_mlp_backward(dy.view, x.view, w1.view, w2.view, h.view, dx.view, {}, {}, {}, {});
  std::vector<double> rdx(size_t(rows * D)), rw1(size_t(H * D)), rb1(static_cast<size_t>(H)), rw2(size_t(D * H)),
      rb2(static_cast<size_t>(D));
  reference::gelu_mlp_backward(dy.view, x.view, w1.view, {}, w2.view, rdx.data(), rw1.data(), rb1.data(), rw2.data(),
                               rb2.data());
  EXPECT_LT(rel_err(dx.values(), rdx), 2e-5);

  int64_t idx[2] = {3, 2};
  x.view.set(idx, NAN);
  gelu_mlp_forward(x.view, w1.view, {}, w2.view, {}, y.view, h.view);
  int64_t o[2] = {3, 0};
  EXPECT_TRUE(std::isnan(y.view.get(o)));
  int64_t other[2] = {4, 0};
  EXPECT_FALSE(std::isnan(y.view.get(other)));
}

TEST(Mlp, BadInput) {
  Mat x(8, 16), w1(32, 16), w2(16, 32), y(8, 16), h(8, 32), dy(8, 16);
  Mat w1_narrow(32, 15), w2_wrong(16, 31), b1_wrong(-1, 31), xb(8, 16, DType::bf16), dw1(32, 16);
  expect_error([&] { gelu_mlp_forward(b1_wrong.view, w1.view, {}, w2.view, {}, y.view, {}); }, {"x", "2-D", "[31]"});
  expect_error([&] { gelu_mlp_forward(x.view, w1_narrow.view, {}, w2.view, {}, y.view, {}); }, {"w1", "[32, 15]"});
  expect_error([&] { gelu_mlp_forward(x.view, w1.view, {}, w2_wrong.view, {}, y.view, {}); }, {"w2", "[16, 32]"});
  expect_error([&] { gelu_mlp_forward(x.view, w1.view, b1_wrong.view, w2.view, {}, y.view, {}); }, {"b1", "[32]"});
  expect_error([&] { gelu_mlp_forward(xb.view, w1.view, {}, w2.view, {}, y.view, {}); }, {"x", "float32", "bfloat16"});
  TensorView col = x.view;  // a column stride of 2
  col.shape[1] = 8;
  col.stride[1] = 2;
  expect_error([&] { gelu_mlp_forward(col, w1.view, {}, w2.view, {}, y.view, {}); }, {"x"});
  TensorView expanded = y.view;  // every row the same memory
  expanded.stride[0] = 0;
  expect_error([&] { gelu_mlp_forward(x.view, w1.view, {}, w2.view, {}, expanded, {}); }, {"y"});
  TensorView dw1_strided = dw1.view;
  dw1_strided.shape[1] = 8;
  expect_error([&] { gelu_mlp_backward(dy.view, x.view, w1.view, w2.view, h.view, {}, dw1_strided, {}, {}, {}); },
               {"dw1", "[32, 16]"});
  expect_error([&] { gelu_mlp_backward(dy.view, x.view, w1.view, w2.view, y.view, {}, {}, {}, {}, {}); },
               {"h", "[8, 32]"});
}

}  // namespace
}  // namespace strata
