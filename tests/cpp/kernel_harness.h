// tests/cpp/kernel_harness.h: the one loop every kernel family's sweep runs. A case becomes random
// inputs (dtype, layout, strides) and the family's double reference(s); then, under every ISA this
// CPU runs, the kernel's forward (and backward) is compared normwise with each reference: o, lse
// (where the family has one), dq, dk, dv. Two references of one family must also agree with each
// other. A family plugs in with a small adapter F, made from one case (F f(c)):
//
//   F::Case                        the sweep's case: a test::Storage (dtype, layout, strides;
//                                  every_storage() is the sweep over them) with std::string name()
//   double scalar_max_work         the scalar ISA (std::fma calls, one lane) runs only cases of at
//                                  most this many multiply-adds (test::isas_to_test)
//   Inputs in                      q, k, v, dout (make_inputs); a test may change them before
//                                  check_kernel(f): the references are computed there
//   Shape shape() const            the sizes and storage of q, k, v, o and the gradients
//   double work() const            multiply-adds of the case, about
//   bool grads() const             also run and compare the backward
//   Tolerance tolerance() const    justified in the family's test file
//   std::vector<Expected> references() const        the first is the family's main reference
//   std::vector<const char*> kernels() const        the entry points held to the references
//                                                   (a trace suffix each; "" = the public one)
//   void forward(size_t kernel, Isa isa, Outputs& out)   writes out.o (and out.lse)
//   void backward(size_t kernel, Isa isa, Outputs& out)  reads out.o, out.lse; writes out.dq, dk, dv
//
// The family files keep their cases, their adapters, and the tests the sweep cannot express.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "strata/checks.h"
#include "strata/cpu.h"
#include "test_util.h"

namespace strata::test {

// How a case stores its tensors: dtype (of q, k, v, o and the gradients), layout, and q, k, v
// strided (row padding `gap`, `dim_stride`; o and the gradients with the gap only; dout
// contiguous). Each family's Case derives from it.
struct Storage {
  DType dtype = DType::f32;
  Layout layout = Layout::BSHD;
  int64_t gap = 0, dim_stride = 1;

  void set_storage(const Storage& s) { *this = s; }
  // For a case's name, e.g. "float32_bhsd_gap_dstride".
  std::string storage_name() const {
    return detail::cat(dtype_name(dtype), layout == Layout::BSHD ? "_bshd" : "_bhsd", gap ? "_gap" : "",
                       dim_stride > 1 ? "_dstride" : "");
  }
};

// The storages every family's sweep covers: both layouts x row gap 0 or 5 x dim stride 1 or 2 x
// fp32 or bf16 (in that nesting).
inline std::vector<Storage> every_storage() {
  std::vector<Storage> v;
  for (Layout l : {Layout::BSHD, Layout::BHSD})
    for (int64_t gap : {0, 5})
      for (int64_t ds : {1, 2})
        for (DType t : {DType::f32, DType::bf16}) v.push_back({t, l, gap, ds});
  return v;
}

// The sizes of one call and how its tensors are stored.
struct Shape {
  AttnDims d;  // d.dtype: the storage's
  Layout layout = Layout::BSHD;
  int64_t gap = 0, dim_stride = 1;
};

// The shape of a case stored as s with sizes d.
inline Shape shape_of(const Storage& s, AttnDims d) {
  d.dtype = s.dtype;
  return {d, s.layout, s.gap, s.dim_stride};
}

// q, k, v and the backward's dout of one case.
struct Inputs {
  Owned4 q, k, v, dout;
};

// Random inputs drawn from rng in the order q, k, v, dout: q, k ~ U(-qk_amp, qk_amp) (wider gives
// peakier softmaxes), v, dout ~ U(-1, 1).
inline Inputs make_inputs(const Shape& s, std::mt19937& rng, double qk_amp = 1.0) {
  const AttnDims& d = s.d;
  Inputs in;
  in.q = Owned4(d.batch, d.seqlen_q, d.heads_q, d.head_dim, d.dtype, s.layout, s.gap, s.dim_stride);
  in.k = Owned4(d.batch, d.seqlen_k, d.heads_kv, d.head_dim, d.dtype, s.layout, s.gap, s.dim_stride);
  in.v = Owned4(d.batch, d.seqlen_k, d.heads_kv, d.head_dim_v, d.dtype, s.layout, s.gap, s.dim_stride);
  in.dout = Owned4(d.batch, d.seqlen_q, d.heads(), d.head_dim_v, d.dtype, s.layout);
  in.q.fill_random(rng, -qk_amp, qk_amp);
  in.k.fill_random(rng, -qk_amp, qk_amp);
  in.v.fill_random(rng);
  in.dout.fill_random(rng);
  return in;
}

// What the kernel writes under one ISA: o and lse (forward), dq, dk, dv (backward).
struct Outputs {
  Owned4 o, dq, dk, dv;
  std::vector<float> lse;  // batch x heads() x seqlen_q, prefilled with 123 so an unwritten row shows
  TensorView lse_view;

  explicit Outputs(const Shape& s) {
    const AttnDims& d = s.d;
    o = Owned4(d.batch, d.seqlen_q, d.heads(), d.head_dim_v, d.dtype, s.layout, s.gap);
    dq = Owned4(d.batch, d.seqlen_q, d.heads_q, d.head_dim, d.dtype, s.layout, s.gap);
    dk = Owned4(d.batch, d.seqlen_k, d.heads_kv, d.head_dim, d.dtype, s.layout, s.gap);
    dv = Owned4(d.batch, d.seqlen_k, d.heads_kv, d.head_dim_v, d.dtype, s.layout, s.gap);
    lse.assign(size_t(d.batch * d.heads() * d.seqlen_q), 123.f);
    lse_view = TensorView(lse.data(), DType::f32, {d.batch, d.heads(), d.seqlen_q});
  }
  Outputs(const Outputs&) = delete;  // lse_view points into lse
  Outputs& operator=(const Outputs&) = delete;
};

// One double reference's results, contiguous in the BSHD order (as the references write them):
// o B*Nq*H*Dv, lse B*H*Nq (empty: the family has none), dq B*Nq*Hq*D, dk B*Nk*Hkv*D,
// dv B*Nk*Hkv*Dv (empty: forward only); H = d.heads(), the heads of o.
struct Expected {
  const char* name;
  std::vector<double> o, lse, dq, dk, dv;

  Expected(const char* name_, const Shape& s, bool with_lse, bool grads) : name(name_) {
    const AttnDims& d = s.d;
    o.resize(size_t(d.batch * d.seqlen_q * d.heads() * d.head_dim_v));
    if (with_lse) lse.resize(size_t(d.batch * d.heads() * d.seqlen_q));
    if (!grads) return;
    dq.resize(size_t(d.batch * d.seqlen_q * d.heads_q * d.head_dim));
    dk.resize(size_t(d.batch * d.seqlen_k * d.heads_kv * d.head_dim));
    dv.resize(size_t(d.batch * d.seqlen_k * d.heads_kv * d.head_dim_v));
  }
};

// Normwise bounds (test::rel_err) of one family and dtype; the family's file says why.
struct Tolerance {
  double o, grads;
  double lse = 1e-5;  // per row, relative (absolute below 1): lse is fp32 in every dtype
  // Denominator floors: o's only guards an all-zero output; the gradients' 1e-2 keeps rows with
  // one allowed key (an exactly-zero dq, dk up to fp32 round-off ~1e-7) from dividing by ~0,
  // while U(-1, 1) inputs give every gradient that is not identically zero entries above it.
  double o_floor = 1e-6, grad_floor = 1e-2;
  double references = 1e-11;  // two double references: summation order only
};

// max over rows of |got - want| / max(|want|, 1). A row the reference leaves empty (lse = -inf)
// must be -inf in got too; any other mismatch of infinities, or a NaN, is an infinite error.
inline double lse_err(const std::vector<float>& got, const std::vector<double>& want) {
  if (got.size() != want.size()) return INFINITY;
  double err = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], w = want[i];
    if (std::isnan(g) || std::isnan(w)) return INFINITY;
    if (std::isinf(g) || std::isinf(w)) {
      if (g != w) return INFINITY;
      continue;
    }
    err = std::max(err, std::fabs(g - w) / std::max(1.0, std::fabs(w)));
  }
  return err;
}

// Restores the best ISA when a check leaves, a fatal failure included.
struct IsaGuard {
  ~IsaGuard() { restore_best_isa(); }
};

// The bf16 engines this CPU has (Compute values; empty without AVX512-BF16), for the families'
// bf16-products sweeps.
inline std::vector<Compute> bf16_engines() {
  std::vector<Compute> e;
  const CpuFeatures& f = cpu_features();
  if (f.avx512_bf16 && f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq) e.push_back(Compute::avx512_bf16);
  if (!e.empty() && f.amx_bf16) e.push_back(Compute::amx_bf16);
  return e;
}

// The compute option's rules every family shares (strata/cpu.h), through the family's
// `compute_of(d, compute)` (its *_attention_compute with the family's options): compute = fp32
// keeps a bf16 call on fp32 products; an engine the active ISA lacks is an error naming `where`,
// 'compute' and the engine; auto below avx512 is fp32; float32 inputs compute in fp32 whatever
// compute asks. Returns with the ISA at avx512 where the CPU has a bf16 engine (else at scalar),
// for the family's own checks of auto; restored by the caller's IsaGuard.
template <class ComputeOf>
void check_compute_rules(const char* where, ComputeOf compute_of) {
  AttnDims d;
  d.dtype = DType::bf16;
  d.batch = 1;
  d.seqlen_q = d.seqlen_k = 300;
  d.heads_q = d.heads_kv = 1;
  d.head_dim = d.head_dim_v = 16;
  EXPECT_EQ(compute_of(d, Compute::fp32), Compute::fp32);
  set_isa(Isa::scalar);  // below avx512: no engine, whatever the CPU has
  expect_error([&] { compute_of(d, Compute::avx512_bf16); }, {where, "compute", "avx512_bf16"});
  EXPECT_EQ(compute_of(d, Compute::automatic), Compute::fp32);
  if (bf16_engines().empty()) return;  // (set_isa(avx512) throws on a CPU without AVX-512)
  set_isa(Isa::avx512);
  d.dtype = DType::f32;
  for (Compute e : bf16_engines()) EXPECT_EQ(compute_of(d, e), Compute::fp32);
}

// Every reference after the first agrees with the first (o, lse, gradients).
inline void expect_references_agree(const std::vector<Expected>& refs, const Tolerance& tol) {
  for (size_t r = 1; r < refs.size(); ++r) {
    const Expected &a = refs[r], &b = refs[0];
    SCOPED_TRACE(detail::cat(a.name, " vs ", b.name));
    EXPECT_LE(rel_err(a.o, b.o, tol.o_floor), tol.references) << "references disagree: o";
    EXPECT_LE(rel_err(a.lse, b.lse, 1.0), tol.references) << "references disagree: lse";
    EXPECT_LE(rel_err(a.dq, b.dq, tol.grad_floor), tol.references) << "references disagree: dq";
    EXPECT_LE(rel_err(a.dk, b.dk, tol.grad_floor), tol.references) << "references disagree: dk";
    EXPECT_LE(rel_err(a.dv, b.dv, tol.grad_floor), tol.references) << "references disagree: dv";
  }
}

// The forward's o (and lse) against one reference.
inline void expect_forward_near(const Outputs& out, const Expected& r, const Shape& s, const Tolerance& tol) {
  const AttnDims& d = s.d;
  EXPECT_LE(rel_err(out.o, s.layout, r.o, d.batch, d.seqlen_q, d.heads(), d.head_dim_v, tol.o_floor), tol.o)
      << "o vs " << r.name;
  if (!r.lse.empty()) {
    EXPECT_LE(lse_err(out.lse, r.lse), tol.lse) << "lse vs " << r.name;
  }
}

// The backward's dq, dk, dv against one reference.
inline void expect_backward_near(const Outputs& out, const Expected& r, const Shape& s, const Tolerance& tol) {
  const AttnDims& d = s.d;
  const Layout L = s.layout;
  EXPECT_LE(rel_err(out.dq, L, r.dq, d.batch, d.seqlen_q, d.heads_q, d.head_dim, tol.grad_floor), tol.grads)
      << "dq vs " << r.name;
  EXPECT_LE(rel_err(out.dk, L, r.dk, d.batch, d.seqlen_k, d.heads_kv, d.head_dim, tol.grad_floor), tol.grads)
      << "dk vs " << r.name;
  EXPECT_LE(rel_err(out.dv, L, r.dv, d.batch, d.seqlen_k, d.heads_kv, d.head_dim_v, tol.grad_floor), tol.grads)
      << "dv vs " << r.name;
}

// The family's references (which must agree), then every kernel entry point under every ISA
// this CPU runs (scalar only up to f.scalar_max_work), forward and backward, against each.
template <class F>
void check_kernel(F& f) {
  const Shape s = f.shape();
  const Tolerance tol = f.tolerance();
  const std::vector<Expected> refs = f.references();
  expect_references_agree(refs, tol);
  IsaGuard guard;
  const std::vector<const char*> kernels = f.kernels();
  for (size_t kernel = 0; kernel < kernels.size(); ++kernel)
    for (Isa isa : isas_to_test(f.work(), f.scalar_max_work)) {
      SCOPED_TRACE(detail::cat(isa_name(isa), kernels[kernel]));
      set_isa(isa);
      Outputs out(s);
      f.forward(kernel, isa, out);
      for (const Expected& r : refs) expect_forward_near(out, r, s, tol);
      if (!f.grads()) continue;
      f.backward(kernel, isa, out);
      for (const Expected& r : refs) expect_backward_near(out, r, s, tol);
    }
}

// The family's bf16 products (its options' `compute`): every engine this CPU has (bf16_engines),
// under the avx512 ISA, every kernel entry point forward and backward against the first
// reference; expect_engine(e) checks what the family reports for its options with compute = e.
// Skips (GTEST_SKIP) on a CPU without AVX512-BF16.
template <class F, class ExpectEngine>
void check_bf16_engines(F& f, ExpectEngine expect_engine) {
  const std::vector<Compute> engines = bf16_engines();
  if (engines.empty()) GTEST_SKIP() << "this CPU has no AVX512-BF16: the bf16 products are not tested here";
  const Shape s = f.shape();
  const Tolerance tol = f.tolerance();
  const std::vector<Expected> refs = f.references();
  IsaGuard guard;
  set_isa(Isa::avx512);
  const std::vector<const char*> kernels = f.kernels();
  for (Compute e : engines) {
    SCOPED_TRACE(compute_name(e));
    f.opt.compute = e;
    expect_engine(e);
    for (size_t kernel = 0; kernel < kernels.size(); ++kernel) {
      SCOPED_TRACE(kernels[kernel]);
      Outputs out(s);
      f.forward(kernel, Isa::avx512, out);
      expect_forward_near(out, refs[0], s, tol);
      if (!f.grads()) continue;
      f.backward(kernel, Isa::avx512, out);
      expect_backward_near(out, refs[0], s, tol);
    }
  }
}

// One case of a sweep: the family's adapter made from it, checked.
template <class F>
void run_case(const typename F::Case& c) {
  SCOPED_TRACE(c.name());
  F f(c);
  check_kernel(f);
}

// The parameterised test of a family's sweep: TEST_P(Sweep, ...) { run_case<F>(GetParam()); }
template <class F>
class KernelSweep : public ::testing::TestWithParam<typename F::Case> {};

// gtest's name for a case: its name().
template <class Case>
std::string case_name(const ::testing::TestParamInfo<Case>& i) {
  return i.param.name();
}

}  // namespace strata::test
