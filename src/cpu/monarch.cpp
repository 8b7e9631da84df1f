// src/cpu/monarch.cpp: the public MonarchAttention entry points: argument checks (every error
// names the argument), TensorView -> MonarchParams, ISA dispatch. Semantics: strata/monarch.h.
#include "strata/monarch.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "cpu/finite_bound.h"
#include "cpu/monarch_params.h"
#include "cpu/views.h"  // strided
#include "strata/cpu.h"

namespace strata {
namespace {

using cpu::MonarchParams;
using cpu::strided;

// Validates q, k, v, the options and the saved state (when given); fills the kernel params but o
// and the gradients. Returns the call's sizes in *dims.
// The engine of a call's products: resolve_compute's, except that auto keeps fp32 products (the
// forward's bf16 path is not faster: strata/monarch.h); an explicit engine is checked and honoured.
Compute resolve(const char* where, Compute want, bool bf16_inputs) {
  return want == Compute::automatic ? Compute::fp32 : resolve_compute(where, want, bf16_inputs);
}

MonarchParams make_params(const char* where, const TensorView& q, const TensorView& k, const TensorView& v,
                          const TensorView& state, const MonarchOptions& opt, AttnDims* dims) {
  const Layout L = opt.layout;
  const AttnDims d = check_qkv(where, q, k, v, L, kKernelDTypes, /*self_attention=*/true);
  validate(where, opt, d);
  *dims = d;
  const MonarchGeometry g = monarch_geometry(d.seqlen_q, opt);

  MonarchParams p;
  p.dtype = d.dtype;
  p.bf16_gemms = cpu::bf16::engine(resolve(where, opt.compute, d.dtype == DType::bf16));
  p.batch = d.batch;
  p.seqlen = d.seqlen_q;
  p.heads_q = d.heads_q;
  p.heads_kv = d.heads_kv;
  p.head_dim = d.head_dim;
  p.head_dim_v = d.head_dim_v;
  p.block = g.block_size;
  p.nblocks = g.num_blocks;
  p.pad_front = g.pad_front;
  p.steps = opt.num_steps;
  p.stable = opt.mode == MonarchMode::stable;
  p.scale = std::isnan(opt.scale) ? float(1.0 / std::sqrt(double(d.head_dim))) : opt.scale;
  p.q = strided(q, L);
  p.k = strided(k, L);
  p.v = strided(v, L);

  const TensorView& m = opt.key_padding_mask;
  if (given(m)) {
    p.key_padding_mask = static_cast<const uint8_t*>(m.data);
    p.kpm_sb = m.stride[0];
    p.kpm_ss = m.stride[1];
  }
  if (given(state)) {
    const int64_t want[5] = {d.batch, d.heads_q, opt.num_steps - 1, g.padded_len, d.head_dim};
    bool ok = state.ndim == 5;
    for (int i = 0; ok && i < 5; ++i) ok = state.shape[i] == want[i];
    STRATA_CHECK_ARG(ok, where, "state",
                     detail::cat("shape [", want[0], ", ", want[1], ", ", want[2], ", ", want[3], ", ", want[4],
                                 "] (batch, heads_q, num_steps - 1, padded seq M*B, head_dim)"),
                     state.shape_str());
    STRATA_CHECK_ARG(state.dtype == DType::f32, where, "state", "dtype float32", dtype_name(state.dtype));
    STRATA_CHECK_ARG(state.data != nullptr || state.numel() == 0, where, "state", "a non-null data pointer",
                     "null");
    p.state = static_cast<float*>(state.data);
    p.st_sb = state.stride[0];
    p.st_sh = state.stride[1];
    p.st_st = state.stride[2];
    p.st_sp = state.stride[3];
    p.st_sd = state.stride[4];
    if (state.numel() == 0) p.state = nullptr;
  }
  return p;
}

}  // namespace

void validate(const char* where, const MonarchOptions& opt, const AttnDims& d) {
  STRATA_CHECK_ARG(d.seqlen_q == d.seqlen_k, where, "k", detail::cat("seq ", d.seqlen_q, " (q's: self-attention only)"),
                   d.seqlen_k);
  STRATA_CHECK_ARG(opt.num_steps >= 1, where, "num_steps", ">= 1", opt.num_steps);
  STRATA_CHECK_ARG(opt.mode == MonarchMode::stable || opt.mode == MonarchMode::reference, where, "mode",
                   "stable or reference", int(opt.mode));
  STRATA_CHECK_ARG(opt.pad == MonarchPad::post || opt.pad == MonarchPad::pre, where, "pad", "post or pre",
                   int(opt.pad));
  STRATA_CHECK_ARG(std::isnan(opt.scale) || std::isfinite(opt.scale), where, "scale",
                   "a finite number (or NaN for 1/sqrt(head_dim))", opt.scale);
  STRATA_CHECK_ARG(opt.block_size >= 0, where, "block_size", ">= 1, or 0 for floor(sqrt(seqlen))", opt.block_size);
  check_positions(where, d.seqlen_q, d.seqlen_k);  // one bound on sequence lengths for every family
  check_key_padding_mask(where, opt.key_padding_mask, d.batch, d.seqlen_k);
}

MonarchGeometry monarch_geometry(int64_t seqlen, const MonarchOptions& opt) {
  STRATA_CHECK_ARG(seqlen >= 0, "monarch_geometry", "seqlen", ">= 0", seqlen);
  STRATA_CHECK_ARG(opt.block_size >= 0, "monarch_geometry", "block_size", ">= 1, or 0 for floor(sqrt(seqlen))",
                   opt.block_size);
  MonarchGeometry g;
  int64_t b = opt.block_size;
  if (b == 0) {  // floor(sqrt(N)), exact for every int64 N (fix up the double estimate)
    b = int64_t(std::sqrt(double(seqlen)));
    while (b > 0 && b * b > seqlen) --b;
    while ((b + 1) * (b + 1) <= seqlen) ++b;
  }
  // A block longer than the sequence is one block: identical results (padding is never valid).
  g.block_size = std::max<int64_t>(1, std::min(b, seqlen));
  g.num_blocks = (seqlen + g.block_size - 1) / g.block_size;
  g.padded_len = g.num_blocks * g.block_size;
  g.pad_front = opt.pad == MonarchPad::pre ? g.padded_len - seqlen : 0;
  return g;
}

double monarch_attention_flops(const AttnDims& d, const MonarchOptions& opt) {
  const char* where = "monarch_attention_flops";
  STRATA_CHECK_ARG(d.batch >= 0 && d.heads_q >= 0 && d.seqlen_q >= 0 && d.head_dim >= 0 && d.head_dim_v >= 0, where,
                   "sizes", "batch, heads, seq, head_dim, head_dim_v >= 0",
                   detail::cat(d.batch, ", ", d.heads_q, ", ", d.seqlen_q, ", ", d.head_dim, ", ", d.head_dim_v));
  STRATA_CHECK_ARG(opt.num_steps >= 1, where, "num_steps", ">= 1", opt.num_steps);
  if (d.seqlen_q == 0) return 0.0;
  const MonarchGeometry g = monarch_geometry(d.seqlen_q, opt);
  const double b = double(g.block_size), m = double(g.num_blocks), p = double(g.padded_len);
  const double T = double(opt.num_steps), D = double(d.head_dim), Dv = double(d.head_dim_v);
  const double macs = p * (D * ((T - 1) * (2 * b + 2 * m) + 2 * b + m) + Dv * (b + m));
  return 2.0 * macs * double(d.heads_q) * double(d.batch);
}

Compute monarch_attention_compute(const AttnDims& d, const MonarchOptions& opt) {
  const char* where = "monarch_attention_compute";
  validate(where, opt, d);
  return resolve(where, opt.compute, d.dtype == DType::bf16);
}

namespace {

// The finite-input bound of strata/monarch.h: log2(e) (scale max ||q_n|| max ||k_m|| + ln B) < FLT_MAX.
cpu::LogitBound monarch_bound(const MonarchParams& p) {
  cpu::LogitBound b;
  b.scale = std::fabs(double(p.scale));
  b.extra = std::log(double(p.block));
  b.contract = "strata/monarch.h";
  b.backward_limit = double(std::numeric_limits<float>::max()) / 1.4426950408889634;  // log2(e)
  return b;
}

}  // namespace

void monarch_attention_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                               const TensorView& o, const TensorView& state, const MonarchOptions& opt) {
  const char* where = "monarch_attention_forward";
  AttnDims d;
  MonarchParams p = make_params(where, q, k, v, state, opt, &d);
  const Layout L = opt.layout;
  check_out(where, o, L, d);
  check_no_overlap(where, "o", o);
  p.o = strided(o, L);
  STRATA_ACTIVE_KERNELS(kMonarchKernels).forward(p);
  cpu::check_forward_bound(where, q, k, o, monarch_bound(p));
}

void monarch_attention_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                                const TensorView& state, const TensorView& dout, const TensorView& dq,
                                const TensorView& dk, const TensorView& dv, const MonarchOptions& opt) {
  const char* where = "monarch_attention_backward";
  AttnDims d;
  MonarchParams p = make_params(where, q, k, v, state, opt, &d);
  const Layout L = opt.layout;
  check_grads(where, dout, dq, dk, dv, L, d);
  p.dout = strided(dout, L);
  p.dq = strided(dq, L);
  p.dk = strided(dk, L);
  p.dv = strided(dv, L);
  STRATA_ACTIVE_KERNELS(kMonarchKernels).backward(p);
  cpu::check_backward_bound(where, q, k, v, nullptr, dout, dq, dk, dv, monarch_bound(p));
}

}  // namespace strata
