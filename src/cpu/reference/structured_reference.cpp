// src/cpu/reference/structured_reference.cpp: the structured operators in double precision, the
// definition in strata/structured.h taken literally: per row, per level, right stage chunk by
// chunk, inner perm, left stage chunk by chunk, out perm, alpha. No plan (never multiplied out),
// no tiles, no fp32: what the kernels are compared with.
#include <string>
#include <vector>

#include "strata/structured.h"

namespace strata::reference {
namespace {

inline int64_t chunk_at(int64_t n, int64_t p, int64_t k) { return k * n / p; }

// Entry (b, i, j) of a 3-D view as double.
double at3(const TensorView& t, int64_t b, int64_t i, int64_t j) {
  const int64_t idx[3] = {b, i, j};
  return t.get(idx);
}

// A stage's weight for chunk k, chunk-local input i and output o (right: R_k[i, o]; left: L_k[o, i]).
double weight(const TensorView& w, const StructuredStage& s, bool right, int64_t k, int64_t i, int64_t o) {
  const int64_t b = s.kind == StageKind::shared ? 0 : k;
  return right ? at3(w, b, i, o) : at3(w, b, o, i);
}

// Calls fn(k, i, o, w) for every weight of stage s (widths a -> b): chunk k, stage input i, stage
// output o (global indices), w = the weight entry linking them.
template <class F>
void for_each_weight(const StructuredStage& s, const TensorView& wt, bool right, int64_t a, int64_t b, F fn) {
  for (int64_t k = 0; k < s.blocks; ++k) {
    const int64_t i0 = chunk_at(a, s.blocks, k), i1 = chunk_at(a, s.blocks, k + 1);
    const int64_t o0 = chunk_at(b, s.blocks, k), o1 = chunk_at(b, s.blocks, k + 1);
    for (int64_t o = o0; o < o1; ++o)
      for (int64_t i = i0; i < i1; ++i) fn(k, i, o, weight(wt, s, right, k, i - i0, o - o0), i - i0, o - o0);
  }
}

// out = the stage applied to in (widths a -> b).
void stage_apply(const StructuredStage& s, const TensorView* w, bool right, const std::vector<double>& in, int64_t a,
                 int64_t b, std::vector<double>& out) {
  if (s.kind == StageKind::identity) {
    out = in;
    return;
  }
  out.assign(size_t(b), 0.0);
  for_each_weight(s, *w, right, a, b, [&](int64_t, int64_t i, int64_t o, double wv, int64_t, int64_t) {
    out[size_t(o)] += wv * in[size_t(i)];
  });
}

// in_grad = the stage's transpose applied to out_grad; dw (the factor's entries) += its weight gradient.
void stage_back(const StructuredStage& s, const TensorView* w, bool right, const std::vector<double>& in,
                const std::vector<double>& dout, int64_t a, int64_t b, std::vector<double>& din,
                std::vector<double>* dw, int64_t rows, int64_t cols) {
  if (s.kind == StageKind::identity) {
    din = dout;
    return;
  }
  din.assign(size_t(a), 0.0);
  for_each_weight(s, *w, right, a, b, [&](int64_t k, int64_t i, int64_t o, double wv, int64_t il, int64_t ol) {
    din[size_t(i)] += wv * dout[size_t(o)];
    const int64_t blk = s.kind == StageKind::shared ? 0 : k, r = right ? il : ol, c = right ? ol : il;
    if (dw) (*dw)[size_t((blk * rows + r) * cols + c)] += in[size_t(i)] * dout[size_t(o)];
  });
}

std::vector<double> row_of(const TensorView& x, int64_t r, int64_t n) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t idx[2] = {r, i};
    v[size_t(i)] = x.get(idx);
  }
  return v;
}

// The factor views of each level (null for identity stages).
std::vector<std::pair<const TensorView*, const TensorView*>> level_factors(const StructuredSpec& spec,
                                                                           const std::vector<TensorView>& f) {
  std::vector<std::pair<const TensorView*, const TensorView*>> out;
  size_t i = 0;
  for (const StructuredLevel& lv : spec.levels) {
    const TensorView* r = lv.right.kind != StageKind::identity ? &f[i++] : nullptr;
    const TensorView* l = lv.left.kind != StageKind::identity ? &f[i++] : nullptr;
    out.push_back({r, l});
  }
  return out;
}

void check_call(const char* where, const StructuredSpec& spec, const TensorView& x,
                const std::vector<TensorView>& factors) {
  validate(where, spec);
  STRATA_CHECK_ARG(x.ndim == 2 && x.shape[1] == spec.in && x.shape[0] >= 0, where, "x",
                   detail::cat("shape [rows, ", spec.in, "]"), x.shape_str());
  const auto shapes = structured_factor_shapes(spec);
  STRATA_CHECK_ARG(factors.size() == shapes.size(), where, "factors", detail::cat(shapes.size(), " tensors"),
                   factors.size());
  for (size_t i = 0; i < shapes.size(); ++i) {
    const TensorView& t = factors[i];
    const bool ok = t.ndim == 3 && t.shape[0] == shapes[i][0] && t.shape[1] == shapes[i][1] &&
                    t.shape[2] == shapes[i][2];
    STRATA_CHECK_ARG(ok, where, detail::cat("factors[", i, "]").c_str(),
                     detail::cat("shape [", shapes[i][0], ", ", shapes[i][1], ", ", shapes[i][2], "]"), t.shape_str());
  }
}

}  // namespace

void structured_forward(const StructuredSpec& spec, const TensorView& x, const std::vector<TensorView>& factors,
                        double* y) {
  check_call("reference::structured_forward", spec, x, factors);
  const auto lf = level_factors(spec, factors);
  std::vector<double> z, zp, ypre;
  for (int64_t r = 0; r < x.shape[0]; ++r) {
    const std::vector<double> xr = row_of(x, r, spec.in);
    double* yr = y + r * spec.out;
    for (int64_t o = 0; o < spec.out; ++o) yr[o] = 0;
    for (size_t l = 0; l < spec.levels.size(); ++l) {
      const StructuredLevel& lv = spec.levels[l];
      stage_apply(lv.right, lf[l].first, true, xr, spec.in, lv.inner, z);
      zp.resize(z.size());
      for (int64_t i = 0; i < lv.inner; ++i) zp[size_t(i)] = z[size_t(lv.inner_perm.empty() ? i : lv.inner_perm[size_t(i)])];
      stage_apply(lv.left, lf[l].second, false, zp, lv.inner, spec.out, ypre);
      for (int64_t o = 0; o < spec.out; ++o)
        yr[o] += lv.alpha * ypre[size_t(lv.out_perm.empty() ? o : lv.out_perm[size_t(o)])];
    }
  }
}

void structured_backward(const StructuredSpec& spec, const TensorView& x, const std::vector<TensorView>& factors,
                         const TensorView& dy, double* dx, std::vector<std::vector<double>>& dfactors) {
  const char* where = "reference::structured_backward";
  check_call(where, spec, x, factors);
  STRATA_CHECK_ARG(dy.ndim == 2 && dy.shape[0] == x.shape[0] && dy.shape[1] == spec.out, where, "dy",
                   detail::cat("shape [", x.shape[0], ", ", spec.out, "]"), dy.shape_str());
  const auto lf = level_factors(spec, factors);
  const auto shapes = structured_factor_shapes(spec);
  dfactors.assign(shapes.size(), {});
  for (size_t i = 0; i < shapes.size(); ++i) dfactors[i].assign(size_t(shapes[i][0] * shapes[i][1] * shapes[i][2]), 0.0);
  std::vector<double> z, zp, dypre, dzp, dz, dxl;
  for (int64_t r = 0; r < x.shape[0]; ++r) {
    const std::vector<double> xr = row_of(x, r, spec.in), dyr = row_of(dy, r, spec.out);
    double* dxr = dx + r * spec.in;
    for (int64_t i = 0; i < spec.in; ++i) dxr[i] = 0;
    size_t fi = 0;
    for (size_t l = 0; l < spec.levels.size(); ++l) {
      const StructuredLevel& lv = spec.levels[l];
      const bool has_r = lf[l].first != nullptr, has_l = lf[l].second != nullptr;
      std::vector<double>* dr = has_r ? &dfactors[fi] : nullptr;
      const auto* rs = has_r ? &shapes[fi] : nullptr;
      fi += has_r;
      std::vector<double>* dl = has_l ? &dfactors[fi] : nullptr;
      const auto* ls = has_l ? &shapes[fi] : nullptr;
      fi += has_l;
      stage_apply(lv.right, lf[l].first, true, xr, spec.in, lv.inner, z);
      zp.resize(z.size());
      for (int64_t i = 0; i < lv.inner; ++i) zp[size_t(i)] = z[size_t(lv.inner_perm.empty() ? i : lv.inner_perm[size_t(i)])];
      dypre.assign(size_t(spec.out), 0.0);
      for (int64_t o = 0; o < spec.out; ++o)
        dypre[size_t(lv.out_perm.empty() ? o : lv.out_perm[size_t(o)])] += lv.alpha * dyr[size_t(o)];
      stage_back(lv.left, lf[l].second, false, zp, dypre, lv.inner, spec.out, dzp, dl, ls ? (*ls)[1] : 0,
                 ls ? (*ls)[2] : 0);
      dz.assign(size_t(lv.inner), 0.0);
      for (int64_t i = 0; i < lv.inner; ++i) dz[size_t(lv.inner_perm.empty() ? i : lv.inner_perm[size_t(i)])] += dzp[size_t(i)];
      stage_back(lv.right, lf[l].first, true, xr, dz, spec.in, lv.inner, dxl, dr, rs ? (*rs)[1] : 0, rs ? (*rs)[2] : 0);
      for (int64_t i = 0; i < spec.in; ++i) dxr[i] += dxl[size_t(i)];
    }
  }
}

}  // namespace strata::reference
