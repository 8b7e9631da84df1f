// tests/cpp/core_structured_test.cpp: the structured operators (strata/structured.h). The kernels
// (every ISA this CPU runs) against the double reference over a sweep of specs (every named
// constructor at awkward sizes, general MLBTC specs with uneven chunks, shared and identity stages,
// permutations, alpha, several levels, the multiplied-out plan), rows, dtypes and strides, forward
// and backward; the reference against direct transcriptions of the published index formulas;
// parameter counts, FLOPs and ranks against section 1's table and the numerical rank; the
// reference code's BTT factorisation; bad input. (The attention kernel harness is q / k / v
// shaped; these operators use its pieces from test_util.h.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <tuple>
#include <random>
#include <string>
#include <vector>

#include "strata/cpu.h"
#include "strata/structured.h"
#include "strata/threading.h"
#include "test_util.h"

namespace strata {
namespace {

using test::expect_error;
using test::rel_err;

// An owned n-D tensor (2-D or 3-D here), row-major with `gap` extra elements after every
// innermost row (a strided view) and the innermost dim strided by `dim_stride`, starting 64-byte
// aligned (as torch's tensors do: the kernels store aligned fp32 rows non-temporally) or
// `misalign` elements after that.
struct Owned {
  std::vector<uint8_t> buf;
  TensorView view;
  Owned(std::vector<int64_t> shape, DType t, int64_t gap = 0, int64_t dim_stride = 1, int64_t misalign = 0) {
    view.dtype = t;
    view.ndim = int(shape.size());
    int64_t s = 1;
    for (int k = view.ndim - 1; k >= 0; --k) {
      view.shape[k] = shape[size_t(k)];
      view.stride[k] = k == view.ndim - 1 ? dim_stride : s;
      s = k == view.ndim - 1 ? shape[size_t(k)] * dim_stride + gap : s * shape[size_t(k)];
    }
    const int64_t skip = misalign * dtype_size(t);
    buf.assign(size_t(std::max<int64_t>(s, 1) * dtype_size(t) + 64 + skip), 0);
    view.data = buf.data() + (64 - reinterpret_cast<uintptr_t>(buf.data()) % 64) % 64 + skip;
  }
  void fill_random(std::mt19937& rng, double scale = 1) {
    std::uniform_real_distribution<double> u(-scale, scale);
    for_each([&](const int64_t* idx) { view.set(idx, u(rng)); });
  }
  template <class F>
  void for_each(F f) const {
    int64_t idx[3] = {0, 0, 0};
    const int64_t n0 = view.shape[0], n1 = view.shape[1], n2 = view.ndim == 3 ? view.shape[2] : 1;
    for (idx[0] = 0; idx[0] < n0; ++idx[0])
      for (idx[1] = 0; idx[1] < n1; ++idx[1])
        for (int64_t i2 = 0; i2 < n2; ++i2) {
          idx[2] = i2;
          f(idx);
        }
  }
  std::vector<double> values() const {
    std::vector<double> v;
    for_each([&](const int64_t* idx) { v.push_back(view.get(idx)); });
    return v;
  }
};

std::vector<Owned> make_factors(const StructuredSpec& spec, DType t, std::mt19937& rng, int64_t gap = 0) {
  std::vector<Owned> f;
  for (const auto& s : structured_factor_shapes(spec)) {
    f.emplace_back(s, t, gap);
    f.back().fill_random(rng, 1.0 / std::sqrt(double(s[1])));  // keeps activations O(1)
  }
  return f;
}
std::vector<TensorView> views(const std::vector<Owned>& o) {
  std::vector<TensorView> v;
  for (const auto& x : o) v.push_back(x.view);
  return v;
}

// Dense out x in matrix (double, row-major) of a spec through the reference.
std::vector<double> dense_of(const StructuredSpec& spec, const std::vector<TensorView>& f) {
  Owned m({spec.out, spec.in}, DType::f64);
  structured_to_dense(spec, f, m.view);
  return m.values();
}

// Numerical rank (Gaussian elimination with full pivoting, relative tolerance 1e-9).
int64_t numerical_rank(std::vector<double> a, int64_t rows, int64_t cols) {
  double mx = 0;
  for (double v : a) mx = std::max(mx, std::fabs(v));
  const double tol = 1e-9 * std::max(mx, 1e-300) * double(std::max(rows, cols));
  int64_t r = 0;
  std::vector<char> used_col(size_t(cols), 0);
  std::vector<char> used_row(size_t(rows), 0);
  for (;;) {
    double best = 0;
    int64_t bi = -1, bj = -1;
    for (int64_t i = 0; i < rows; ++i)
      if (!used_row[size_t(i)])
        for (int64_t j = 0; j < cols; ++j)
          if (!used_col[size_t(j)] && std::fabs(a[size_t(i * cols + j)]) > best) {
            best = std::fabs(a[size_t(i * cols + j)]);
            bi = i;
            bj = j;
          }
    if (bi < 0 || best <= tol) return r;
    used_row[size_t(bi)] = used_col[size_t(bj)] = 1;
    ++r;
    for (int64_t i = 0; i < rows; ++i) {
      if (used_row[size_t(i)]) continue;
      const double f = a[size_t(i * cols + bj)] / a[size_t(bi * cols + bj)];
      for (int64_t j = 0; j < cols; ++j) a[size_t(i * cols + j)] -= f * a[size_t(bi * cols + j)];
    }
  }
}

// ---- The sweep ----------------------------------------------------------------------------------

struct SpecCase {
  std::string name;
  StructuredSpec spec;
};

// A general MLBTC spec exercising what the named constructors do not: uneven chunks, an identity
// stage, shared stages, both permutations, alpha, three levels of different kinds.
StructuredSpec general_spec() {
  StructuredSpec s{"general", 10, 9, {}};
  std::vector<int64_t> inner_perm(7), out_perm(9);
  std::iota(inner_perm.begin(), inner_perm.end(), 0);
  std::iota(out_perm.begin(), out_perm.end(), 0);
  std::mt19937 rng(3);
  std::shuffle(inner_perm.begin(), inner_perm.end(), rng);
  std::shuffle(out_perm.begin(), out_perm.end(), rng);
  s.levels.push_back({7, {StageKind::blocks, 3}, {StageKind::blocks, 2}, inner_perm, out_perm, 0.75});
  s.levels.push_back({9, {StageKind::blocks, 4}, {StageKind::identity, 1}, {}, {}, -1.5});
  s.levels.push_back({6, {StageKind::blocks, 1}, {StageKind::shared, 3}, {}, {}, 1.0});  // 6 -> 9 in 3 equal chunks
  validate("general_spec", s);
  return s;
}

std::vector<SpecCase> sweep_specs() {
  return {
      {"low_rank_37x29_r5", low_rank_spec(37, 29, 5)},
      {"block_diagonal_30x21_3", block_diagonal_spec(30, 21, 3)},
      {"block_diagonal_uneven_13x11_4", block_diagonal_spec(13, 11, 4)},
      {"mlr_24_4x3", mlr_spec(24, {4, 3, 2})},
      {"mlr_uneven_100_6lev", mlr_spec(100, {2, 2, 1, 1, 1, 1})},  // p_6 = 32 does not divide 100
      {"mlr_multiplied_out_24", mlr_spec(24, {8, 8}, {1, 4})},
      {"btt_64_s1", btt_spec(btt_factorize(64, 64))},
      {"btt_96_s3", btt_spec(btt_factorize(96, 96), 3)},
      {"btt_heads3_48_s2", btt_spec(btt_factorize(48, 48), 2, 3)},
      {"btt_rect_c5d7_a3b4", btt_spec({3, 4, 5, 7}, 2, 2)},
      {"monarch_36_6", monarch_spec(36, 6)},
      {"monarch_40_8", monarch_spec(40, 8)},
      {"kronecker_3x5_4x2", kronecker_spec(3, 5, 4, 2)},
      // token-major (cpu::TokenLevelParams; btt_64_s1 above is one too): 16 | chunks and blocks
      {"monarch_256_16", monarch_spec(256, 16)},
      {"kronecker_3x2_16x16", kronecker_spec(3, 2, 16, 16)},  // shared stages, K = 2, a = 3
      {"btt_heads2_a3b16c5d16", btt_spec({3, 16, 5, 16}, 1, 2)},  // lane groups inside heads
      {"general", general_spec()},
  };
}

struct StorageCase {
  DType dtype;
  int64_t gap, dim_stride;
  int64_t misalign = 0;  // elements past a 64-byte boundary (x, y, dy, dx)
};

// Tolerances (normwise, relative to the largest reference entry). fp32: every output is a chain
// of at most a few hundred fp32 products summed in two stages; the reference reads the same
// values, so the error is fp32 accumulation only, about sqrt(K) * 6e-8 typical and K * 6e-8
// worst case for K <= 300: 2e-5 bounds it. bf16: inputs are bf16 on both sides (the reference
// reads the rounded values); the outputs are rounded once to bf16 (relative 2^-9 = 2e-3 of the
// entry), 8e-3 allows the normwise max over a few thousand entries. Factor gradients are
// written in the factors' dtype (here the same).
double tolerance(DType t) { return t == DType::f32 ? 2e-5 : 8e-3; }

void check_case(const SpecCase& c, int64_t rows, const StorageCase& st, std::mt19937& rng) {
  const StructuredSpec& spec = c.spec;
  SCOPED_TRACE(detail::cat(c.name, " rows=", rows, " ", dtype_name(st.dtype), " gap=", st.gap,
                           " dim_stride=", st.dim_stride, " misalign=", st.misalign));
  Owned x({rows, spec.in}, st.dtype, st.gap, st.dim_stride, st.misalign),
      dy({rows, spec.out}, st.dtype, st.gap, 1, st.misalign);
  x.fill_random(rng);
  dy.fill_random(rng);
  const std::vector<Owned> f = make_factors(spec, st.dtype, rng, st.gap);
  const std::vector<TensorView> fv = views(f);

  std::vector<double> y_ref(size_t(rows * spec.out)), dx_ref(size_t(rows * spec.in));
  std::vector<std::vector<double>> df_ref;
  reference::structured_forward(spec, x.view, fv, y_ref.data());
  reference::structured_backward(spec, x.view, fv, dy.view, dx_ref.data(), df_ref);

  for (Isa isa : test::isas_to_test()) {
    set_isa(isa);
    SCOPED_TRACE(isa_name(isa));
    Owned y({rows, spec.out}, st.dtype, st.gap, st.dim_stride, st.misalign),
        dx({rows, spec.in}, st.dtype, st.gap, 1, st.misalign);
    structured_forward(spec, x.view, fv, y.view);
    EXPECT_LT(rel_err(y.values(), y_ref), tolerance(st.dtype)) << "y";
    std::vector<Owned> df;
    for (const auto& s : structured_factor_shapes(spec)) df.emplace_back(s, st.dtype, st.gap);
    structured_backward(spec, x.view, fv, dy.view, dx.view, views(df));
    EXPECT_LT(rel_err(dx.values(), dx_ref), tolerance(st.dtype)) << "dx";
    for (size_t i = 0; i < df.size(); ++i)
      EXPECT_LT(rel_err(df[i].values(), df_ref[i]), tolerance(st.dtype)) << "dfactors[" << i << "]";
    // The training path: the forward saves the right stages' outputs, the backward reads them.
    std::vector<float> saved(size_t(structured_saved_size(spec, rows)), NAN);
    const TensorView sv(saved.data(), DType::f32, {int64_t(saved.size())});
    Owned y2({rows, spec.out}, st.dtype), dx2({rows, spec.in}, st.dtype);
    structured_forward(spec, x.view, fv, y2.view, sv);
    EXPECT_EQ(y2.values(), y.values()) << "y with saving";
    std::vector<Owned> df2;
    for (const auto& s : structured_factor_shapes(spec)) df2.emplace_back(s, st.dtype);
    structured_backward(spec, x.view, fv, dy.view, dx2.view, views(df2), sv);
    EXPECT_LT(rel_err(dx2.values(), dx_ref), tolerance(st.dtype)) << "dx from saved";
    for (size_t i = 0; i < df2.size(); ++i)
      EXPECT_LT(rel_err(df2[i].values(), df_ref[i]), tolerance(st.dtype)) << "dfactors[" << i << "] from saved";
  }
  test::restore_best_isa();
}

TEST(Structured, KernelsMatchTheReference) {
  std::mt19937 rng(7);
  // fp32 rows aligned (non-temporal stores) and one element off (plain stores), strided, bf16
  const std::vector<StorageCase> storages = {{DType::f32, 0, 1}, {DType::f32, 0, 1, 1}, {DType::f32, 3, 2},
                                             {DType::bf16, 0, 1}, {DType::bf16, 5, 1}};
  for (const SpecCase& c : sweep_specs())
    for (int64_t rows : {1, 7, 97, 130})
      for (const StorageCase& st : storages) check_case(c, rows, st, rng);
}

// Many rows (several tiles per thread, the per-thread factor gradients summed) and wide operators
// (the 32- and 16-token tiles of widths over 4096 and 8192, structured_tile_tokens).
TEST(Structured, ManyRowsAndWideOperators) {
  std::mt19937 rng(11);
  check_case({"btt_256_s1_1025rows", btt_spec(btt_factorize(256, 256))}, 1025, {DType::f32, 0, 1}, rng);
  check_case({"monarch_1600_40", monarch_spec(1600, 40)}, 40, {DType::f32, 0, 1}, rng);
  check_case({"low_rank_5000_r3", low_rank_spec(5000, 4100, 3)}, 33, {DType::f32, 0, 1}, rng);
  check_case({"low_rank_9000_r2", low_rank_spec(9000, 300, 2)}, 37, {DType::f32, 0, 1}, rng);
}

TEST(Structured, GradientsWithoutDxOrWithoutFactors) {
  std::mt19937 rng(5);
  const StructuredSpec spec = btt_spec(btt_factorize(24, 24), 2);
  Owned x({9, 24}, DType::f32), dy({9, 24}, DType::f32), dx({9, 24}, DType::f32);
  x.fill_random(rng);
  dy.fill_random(rng);
  const auto f = make_factors(spec, DType::f32, rng);
  std::vector<double> dx_ref(9 * 24);
  std::vector<std::vector<double>> df_ref;
  reference::structured_backward(spec, x.view, views(f), dy.view, dx_ref.data(), df_ref);
  structured_backward(spec, x.view, views(f), dy.view, dx.view, {});
  EXPECT_LT(rel_err(dx.values(), dx_ref), 2e-5);
  std::vector<Owned> df;
  for (const auto& s : structured_factor_shapes(spec)) df.emplace_back(s, DType::f32);
  structured_backward(spec, x.view, views(f), dy.view, TensorView{}, views(df));
  for (size_t i = 0; i < df.size(); ++i) EXPECT_LT(rel_err(df[i].values(), df_ref[i]), 2e-5);
}

// ---- The reference against the published formulas ---------------------------------------------

// BTT (structured-attention paper section 3, reference code's index formula), for every head.
TEST(Structured, BttIsTheIndexFormula) {
  std::mt19937 rng(1);
  for (const auto& [shape, s, heads] : std::vector<std::tuple<BttShape, int64_t, int64_t>>{
           {btt_factorize(64, 64), 1, 1}, {btt_factorize(96, 96), 3, 2}, {{3, 4, 5, 7}, 2, 2}, {{2, 5, 3, 3}, 1, 3}}) {
    const StructuredSpec spec = btt_spec(shape, s, heads);
    const auto f = make_factors(spec, DType::f64, rng);
    const TensorView &wk = f[0].view, &wq = f[1].view;  // W_K (c, d, H b s), W_Q (H b, a, c s)
    const auto m = dense_of(spec, views(f));
    const int64_t a = shape.a, b = shape.b, c = shape.c, d = shape.d, D = c * d;
    double err = 0;
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t ia = 0; ia < a; ++ia)
        for (int64_t jb = 0; jb < b; ++jb)
          for (int64_t ic = 0; ic < c; ++ic)
            for (int64_t id = 0; id < d; ++id) {
              double want = 0;
              for (int64_t sg = 0; sg < s; ++sg) {
                const int64_t iq[3] = {h * b + jb, ia, ic * s + sg}, ik[3] = {ic, id, (h * b + jb) * s + sg};
                want += wq.get(iq) * wk.get(ik);
              }
              const double got = m[size_t((h * a * b + ia * b + jb) * D + ic * d + id)];
              err = std::max(err, std::fabs(got - want));
            }
    EXPECT_LT(err, 1e-12) << "a=" << a << " b=" << b << " c=" << c << " d=" << d << " s=" << s << " H=" << heads;
  }
}

// MLR over features: M = sum_l blockdiag_k(L_{l,k} R_{l,k}^T), chunks k * D / p_l.
TEST(Structured, MlrIsTheSumOfBlockLowRanks) {
  std::mt19937 rng(2);
  for (int64_t D : {24, 100, 37})
    for (size_t levels = 1; levels <= 6; ++levels) {
      std::vector<int64_t> ranks;
      for (size_t l = 0; l < levels; ++l) ranks.push_back(1 + int64_t(l % 3));
      std::vector<int64_t> blocks;
      for (size_t l = 0; l < levels; ++l) blocks.push_back(std::min<int64_t>(int64_t(1) << l, D));
      const StructuredSpec spec = mlr_spec(D, ranks, blocks);
      const auto f = make_factors(spec, DType::f64, rng);
      const auto m = dense_of(spec, views(f));
      std::vector<double> want(size_t(D * D), 0.0);
      for (size_t l = 0; l < levels; ++l) {
        const TensorView &R = f[2 * l].view, &L = f[2 * l + 1].view;
        const int64_t p = blocks[l], r = ranks[l];
        for (int64_t k = 0; k < p; ++k) {
          const int64_t c0 = k * D / p, c1 = (k + 1) * D / p, m0 = k * (r * p) / p, m1 = (k + 1) * (r * p) / p;
          for (int64_t o = c0; o < c1; ++o)
            for (int64_t i = c0; i < c1; ++i)
              for (int64_t j = 0; j < m1 - m0; ++j) {
                const int64_t il[3] = {k, o - c0, j}, ir[3] = {k, i - c0, j};
                want[size_t(o * D + i)] += L.get(il) * R.get(ir);
              }
        }
      }
      EXPECT_LT(rel_err(m, want, 1e-12), 1e-13) << "D=" << D << " levels=" << levels;
    }
}

// Monarch (Dao et al. 2022): y = P^T blockdiag(L) P blockdiag(R) x, P transposing (blocks, n/blocks).
TEST(Structured, MonarchIsTheProductOfPermutedBlockDiagonals) {
  std::mt19937 rng(4);
  for (const auto& [n, nb] : std::vector<std::pair<int64_t, int64_t>>{{16, 4}, {36, 6}, {40, 8}, {12, 3}}) {
    const StructuredSpec spec = monarch_spec(n, nb);
    const auto f = make_factors(spec, DType::f64, rng);
    const int64_t m = n / nb;
    // dense R-stage (blockdiag of R_k^T), P, L-stage, P^T as matrices, multiplied in order
    std::vector<double> want(size_t(n * n), 0.0);
    for (int64_t col = 0; col < n; ++col) {
      std::vector<double> x(size_t(n), 0.0), z(size_t(n), 0.0), zp(static_cast<size_t>(n)), w(size_t(n), 0.0), y(static_cast<size_t>(n));
      x[size_t(col)] = 1;
      for (int64_t k = 0; k < nb; ++k)
        for (int64_t j = 0; j < m; ++j)
          for (int64_t i = 0; i < m; ++i) {
            const int64_t idx[3] = {k, i, j};
            z[size_t(k * m + j)] += f[0].view.get(idx) * x[size_t(k * m + i)];
          }
      for (int64_t k = 0; k < nb; ++k)
        for (int64_t j = 0; j < m; ++j) zp[size_t(j * nb + k)] = z[size_t(k * m + j)];  // P
      for (int64_t j = 0; j < m; ++j)
        for (int64_t o = 0; o < nb; ++o)
          for (int64_t k = 0; k < nb; ++k) {
            const int64_t idx[3] = {j, o, k};
            w[size_t(j * nb + o)] += f[1].view.get(idx) * zp[size_t(j * nb + k)];
          }
      for (int64_t j = 0; j < m; ++j)
        for (int64_t o = 0; o < nb; ++o) y[size_t(o * m + j)] = w[size_t(j * nb + o)];  // P^T
      for (int64_t r = 0; r < n; ++r) want[size_t(r * n + col)] = y[size_t(r)];
    }
    EXPECT_LT(rel_err(dense_of(spec, views(f)), want, 1e-12), 1e-13) << "n=" << n << " blocks=" << nb;
  }
}

TEST(Structured, KroneckerLowRankAndBlockDiagonalAreTheirDefinitions) {
  std::mt19937 rng(6);
  {  // (A (x) B)[(o, p), (i, j)] = A[o, i] B[p, j]; factors: right B^T, left A
    const int64_t ao = 3, ai = 5, bo = 4, bi = 2;
    const StructuredSpec spec = kronecker_spec(ao, ai, bo, bi);
    const auto f = make_factors(spec, DType::f64, rng);
    const auto m = dense_of(spec, views(f));
    std::vector<double> want;
    for (int64_t o = 0; o < ao; ++o)
      for (int64_t p = 0; p < bo; ++p)
        for (int64_t i = 0; i < ai; ++i)
          for (int64_t j = 0; j < bi; ++j) {
            const int64_t ia[3] = {0, o, i}, ib[3] = {0, j, p};
            want.push_back(f[1].view.get(ia) * f[0].view.get(ib));
          }
    EXPECT_LT(rel_err(m, want, 1e-12), 1e-13) << "kronecker";
  }
  {  // L R^T
    const StructuredSpec spec = low_rank_spec(9, 7, 3);
    const auto f = make_factors(spec, DType::f64, rng);
    std::vector<double> want;
    for (int64_t o = 0; o < 7; ++o)
      for (int64_t i = 0; i < 9; ++i) {
        double acc = 0;
        for (int64_t j = 0; j < 3; ++j) {
          const int64_t il[3] = {0, o, j}, ir[3] = {0, i, j};
          acc += f[1].view.get(il) * f[0].view.get(ir);
        }
        want.push_back(acc);
      }
    EXPECT_LT(rel_err(dense_of(spec, views(f)), want, 1e-12), 1e-13) << "low rank";
  }
  {  // blockdiag(W_k) with W_k^T stored, chunks k * n / p (uneven)
    const StructuredSpec spec = block_diagonal_spec(13, 11, 4);
    const auto f = make_factors(spec, DType::f64, rng);
    std::vector<double> want(13 * 11, 0.0);
    for (int64_t k = 0; k < 4; ++k)
      for (int64_t o = k * 11 / 4; o < (k + 1) * 11 / 4; ++o)
        for (int64_t i = k * 13 / 4; i < (k + 1) * 13 / 4; ++i) {
          const int64_t idx[3] = {k, i - k * 13 / 4, o - k * 11 / 4};
          want[size_t(o * 13 + i)] = f[0].view.get(idx);
        }
    EXPECT_LT(rel_err(dense_of(spec, views(f)), want, 1e-12), 1e-13) << "block diagonal";
  }
}

// The fp32 to_dense (the kernel applied to the identity) agrees with its forward and with the
// double one: every operator of the sweep.
TEST(Structured, ToDenseAgreesWithTheForward) {
  std::mt19937 rng(8);
  for (const SpecCase& c : sweep_specs()) {
    const StructuredSpec& spec = c.spec;
    const auto f = make_factors(spec, DType::f32, rng);
    Owned m32({spec.out, spec.in}, DType::f32), x({5, spec.in}, DType::f32), y({5, spec.out}, DType::f32);
    structured_to_dense(spec, views(f), m32.view);
    EXPECT_LT(rel_err(m32.values(), dense_of(spec, views(f))), 2e-6) << c.name;
    x.fill_random(rng);
    structured_forward(spec, x.view, views(f), y.view);
    std::vector<double> want;
    const auto m = m32.values();
    for (int64_t r = 0; r < 5; ++r)
      for (int64_t o = 0; o < spec.out; ++o) {
        double acc = 0;
        for (int64_t i = 0; i < spec.in; ++i) {
          const int64_t idx[2] = {r, i};
          acc += m[size_t(o * spec.in + i)] * x.view.get(idx);
        }
        want.push_back(acc);
      }
    EXPECT_LT(rel_err(y.values(), want), 2e-5) << c.name;
  }
}

// ---- Queries: section 1's table, and the rank measured numerically ---------------------------

TEST(Structured, ParamsFlopsAndRankFollowTheTable) {
  const int64_t D = 64;
  EXPECT_EQ(structured_params(low_rank_spec(D, D, 5)), 2 * D * 5);
  EXPECT_EQ(structured_params(mlr_spec(D, {4, 3, 2})), 2 * D * (4 + 3 + 2));
  const BttShape t = btt_factorize(D, D);  // (4, 16, 4, 16)
  EXPECT_EQ(structured_params(btt_spec(t, 2)), D * 2 * (t.b + t.c));
  const BttShape bal = btt_factorize(D, D, BttFactorize::balanced);  // 8 x 8: the paper's 2 D^{3/2} s
  EXPECT_EQ(structured_params(btt_spec(bal, 3)), int64_t(2 * std::pow(double(D), 1.5) * 3));
  EXPECT_EQ(structured_params(monarch_spec(36, 6)), 2 * 36 * 6);
  EXPECT_EQ(structured_params(kronecker_spec(3, 5, 4, 2)), 3 * 5 + 4 * 2);
  EXPECT_DOUBLE_EQ(structured_flops(btt_spec(t, 1), 10), 2.0 * 10 * D * (t.b + t.c));
  EXPECT_DOUBLE_EQ(structured_flops(low_rank_spec(D, D, 5), 3), 2.0 * 3 * 2 * D * 5);
  EXPECT_EQ(structured_rank(low_rank_spec(D, D, 5)), 5);
  EXPECT_EQ(structured_rank(mlr_spec(D, {4, 3, 2})), 4 + 3 * 2 + 2 * 4);  // sum_l r_l p_l
  EXPECT_EQ(structured_rank(btt_spec(t)), D);
  // the multiplied-out plan costs what it says: 4 blocks of 6 x 6 instead of 8 x (6 + 6)
  const StructuredSpec mo = mlr_spec(24, {8, 8}, {1, 4});
  EXPECT_EQ(structured_plan(mo), (std::vector<bool>{false, true}));
  EXPECT_DOUBLE_EQ(structured_flops(mo, 1), 2.0 * (24 * 8 * 2 + 4 * 6 * 6));
}

TEST(Structured, RankIsTheNumericalRank) {
  std::mt19937 rng(9);
  std::vector<SpecCase> cases = sweep_specs();
  cases.push_back({"mlr_full_24", mlr_spec(24, {8, 4, 2})});  // 8 + 8 + 8 = 24: full
  cases.push_back({"btt_balanced_36_s1", btt_spec(btt_factorize(36, 36, BttFactorize::balanced))});
  cases.push_back({"btt_rank_deficient", btt_spec({4, 2, 2, 4}, 1)});  // 2 blocks of a x c s = 4 x 2: rank <= 4
  cases.push_back({"kronecker_rect", kronecker_spec(2, 3, 3, 2)});     // rank 2 * 2
  for (const SpecCase& c : cases) {
    if (c.name == "general") continue;  // shared stage in a non-Kronecker level: the rank is a bound
    const auto f = make_factors(c.spec, DType::f64, rng);
    EXPECT_EQ(structured_rank(c.spec), numerical_rank(dense_of(c.spec, views(f)), c.spec.out, c.spec.in)) << c.name;
  }
}

// The reference code's factorize rule: b = the smallest divisor of D above sqrt(D), a = D / b.
TEST(Structured, BttFactorisationOfTheReferenceCode) {
  const std::vector<std::pair<int64_t, std::pair<int64_t, int64_t>>> want = {
      {64, {4, 16}}, {256, {8, 32}}, {384, {16, 24}}, {512, {16, 32}}, {768, {24, 32}}, {1024, {16, 64}}};
  for (const auto& [D, ab] : want) {
    const BttShape t = btt_factorize(D, D);
    EXPECT_EQ(t.a, ab.first) << D;
    EXPECT_EQ(t.b, ab.second) << D;
    EXPECT_EQ(t.c, ab.first) << D;
    EXPECT_EQ(t.d, ab.second) << D;
  }
  EXPECT_EQ(btt_factorize(64, 64, BttFactorize::balanced).a, 8);
  EXPECT_EQ(btt_factorize(96, 96, BttFactorize::balanced).b, 12);  // 8 x 12
  EXPECT_EQ(btt_factorize(13, 13).a, 1);                           // a prime: (1, 13)
}

// ---- Bad input ----------------------------------------------------------------------------------

TEST(Structured, BadInputNamesTheArgument) {
  expect_error([] { monarch_spec(10, 3); }, {"monarch_spec", "'blocks'", "divisor of n = 10", "got 3"});
  expect_error([] { mlr_spec(16, {}); }, {"mlr_spec", "'ranks'", "1..16 levels"});
  expect_error([] { mlr_spec(16, {4, 0}); }, {"'ranks[1]'", ">= 1", "got 0"});
  expect_error([] { mlr_spec(16, {4, 4}, {1}); }, {"'blocks'", "one per level (2)", "got 1"});
  expect_error([] { mlr_spec(8, {1}, {9}); }, {"'blocks[0]'", "1..dim = 8", "got 9"});
  expect_error([] { block_diagonal_spec(4, 6, 5); }, {"'blocks'", "1..min(in, out) = 4", "got 5"});
  expect_error([] { btt_spec({0, 4, 4, 4}); }, {"btt_spec", "'shape'", "a, b, c, d >= 1"});
  expect_error([] { kronecker_spec(0, 1, 1, 1); }, {"kronecker_spec", "'a'"});
  expect_error([] { low_rank_spec(4, 4, 0); }, {"'rank'", "got 0"});
  StructuredSpec s = low_rank_spec(6, 5, 2);
  s.levels[0].inner_perm = {0, 0};
  expect_error([&] { validate("v", s); }, {"'spec.levels[0].inner_perm'", "a permutation of [0, 2)", "repeated"});
  s = low_rank_spec(6, 5, 2);
  s.levels[0].left.kind = StageKind::identity;
  expect_error([&] { validate("v", s); }, {"'spec.levels[0].left.kind'", "identity stage between equal widths", "2 -> 5"});
  s = low_rank_spec(6, 6, 2);
  s.levels[0].inner = 6;
  s.levels[0].right = {StageKind::shared, 4};
  expect_error([&] { validate("v", s); }, {"'spec.levels[0].right.blocks'", "shared blocks are equal"});
  s = low_rank_spec(6, 6, 2);
  s.levels[0].alpha = NAN;
  expect_error([&] { validate("v", s); }, {"'spec.levels[0].alpha'", "finite"});

  const StructuredSpec spec = btt_spec(btt_factorize(16, 16));
  std::mt19937 rng(1);
  const auto f = make_factors(spec, DType::f32, rng);
  Owned x({3, 16}, DType::f32), y({3, 16}, DType::f32), ybad({3, 15}, DType::f32), xb({3, 16}, DType::bf16);
  expect_error([&] { structured_forward(spec, x.view, {f[0].view}, y.view); },
               {"structured_forward", "'factors'", "2 tensors", "got 1"});
  expect_error([&] { structured_forward(spec, x.view, {f[1].view, f[0].view}, y.view); },
               {"'factors[0]'", "shape [2, 8, 8]", "got [8, 2, 2]"});
  expect_error([&] { structured_forward(spec, x.view, views(f), ybad.view); },
               {"'y'", "shape [3, 16] (x's rows, spec.out)", "[3, 15]"});
  expect_error([&] { structured_forward(spec, xb.view, views(f), y.view); }, {"'y'", "dtype bfloat16 (same as x)"});
  Owned x64({3, 16}, DType::f64);
  expect_error([&] { structured_forward(spec, x64.view, views(f), y.view); }, {"'x'", "float32 or bfloat16", "float64"});
  expect_error([&] { structured_backward(spec, x.view, views(f), ybad.view, TensorView{}, {}); },
               {"structured_backward", "'dy'"});
  std::vector<float> small(3);
  expect_error([&] { structured_forward(spec, x.view, views(f), y.view, TensorView(small.data(), DType::f32, {3})); },
               {"'saved'", "a float32 1-D buffer of structured_saved_size(spec, 3) = "});
  Owned m({16, 15}, DType::f32);
  expect_error([&] { structured_to_dense(spec, views(f), m.view); }, {"structured_to_dense", "'m'", "[16, 16]"});
}

TEST(Structured, ZeroRowsIsANoOp) {
  const StructuredSpec spec = low_rank_spec(8, 8, 2);
  std::mt19937 rng(1);
  const auto f = make_factors(spec, DType::f32, rng);
  Owned x({0, 8}, DType::f32), y({0, 8}, DType::f32);
  structured_forward(spec, x.view, views(f), y.view);
  std::vector<Owned> df;
  for (const auto& s : structured_factor_shapes(spec)) df.emplace_back(s, DType::f32);
  df[0].fill_random(rng);
  structured_backward(spec, x.view, views(f), y.view, TensorView{}, views(df));
  for (double v : df[0].values()) EXPECT_EQ(v, 0.0);  // written, not accumulated: zero rows give zero
}

}  // namespace
}  // namespace strata
