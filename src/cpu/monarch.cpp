// src/cpu/monarch.cpp: the public MonarchAttention entry points: argument checks (every error
// names the argument), TensorView -> MonarchParams, ISA dispatch. Semantics: strata/monarch.h.
#include "strata/monarch.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "cpu/monarch_params.h"
#include "cpu/views.h"
#include "strata/cpu.h"

namespace strata {
namespace {

using cpu::MonarchParams;
using cpu::Strided4;
using cpu::Dims4;
using cpu::check_4d;
using cpu::check_shape;
using cpu::dims;
using cpu::dims_str;
using cpu::layout_str;
using cpu::strided;

bool given(const TensorView& t) { return t.data != nullptr || t.ndim != 0; }

MonarchParams make_params(const char* where, const TensorView& q, const TensorView& k, const TensorView& v,
                          const TensorView& state, const MonarchOptions& opt) {
  STRATA_CHECK_ARG(q.ndim == 4, where, "q", "a 4-D tensor", detail::cat(q.ndim, "-D ", q.shape_str()));
  STRATA_CHECK_ARG(q.dtype == DType::f32 || q.dtype == DType::bf16, where, "q", "dtype float32 or bfloat16",
                   dtype_name(q.dtype));
  STRATA_CHECK_ARG(opt.layout == Layout::BSHD || opt.layout == Layout::BHSD, where, "layout", "BSHD or BHSD",
                   int(opt.layout));
  const Layout L = opt.layout;
  check_4d(where, "q", q, q.dtype, L);
  check_4d(where, "k", k, q.dtype, L);
  check_4d(where, "v", v, q.dtype, L);
  const Dims4 dq = dims(q, L), dk = dims(k, L), dv = dims(v, L);
  STRATA_CHECK_ARG(dq.d >= 1, where, "q", "head_dim >= 1", dq.d);
  STRATA_CHECK_ARG(dv.d >= 1, where, "v", "head_dim_v >= 1", dv.d);
  STRATA_CHECK_ARG(dq.h >= 1, where, "q", "heads >= 1", dq.h);
  STRATA_CHECK_ARG(dk.h >= 1, where, "k", "heads >= 1", dk.h);
  check_shape(where, "k", dk, {dq.b, dq.s, dk.h, dq.d},
              "(batch, seq and head_dim of q: self-attention only, no cross-attention)");
  check_shape(where, "v", dv, {dq.b, dq.s, dk.h, dv.d}, "(batch and seq of q, heads of k)");
  STRATA_CHECK_ARG(dq.h % dk.h == 0, where, "k", detail::cat("heads dividing q's heads (", dq.h, ")"), dk.h);
  STRATA_CHECK_ARG(opt.num_steps >= 1, where, "num_steps", ">= 1", opt.num_steps);
  STRATA_CHECK_ARG(opt.mode == MonarchMode::stable || opt.mode == MonarchMode::reference, where, "mode",
                   "stable or reference", int(opt.mode));
  STRATA_CHECK_ARG(opt.pad == MonarchPad::post || opt.pad == MonarchPad::pre, where, "pad", "post or pre",
                   int(opt.pad));
  STRATA_CHECK_ARG(std::isnan(opt.scale) || std::isfinite(opt.scale), where, "scale",
                   "a finite number (or NaN for 1/sqrt(head_dim))", opt.scale);
  const MonarchGeometry g = monarch_geometry(dq.s, opt);

  MonarchParams p;
  p.dtype = q.dtype;
  p.batch = dq.b;
  p.seqlen = dq.s;
  p.heads_q = dq.h;
  p.heads_kv = dk.h;
  p.head_dim = dq.d;
  p.head_dim_v = dv.d;
  p.block = g.block_size;
  p.nblocks = g.num_blocks;
  p.pad_front = g.pad_front;
  p.steps = opt.num_steps;
  p.stable = opt.mode == MonarchMode::stable;
  p.scale = std::isnan(opt.scale) ? float(1.0 / std::sqrt(double(dq.d))) : opt.scale;
  p.q = strided(q, L);
  p.k = strided(k, L);
  p.v = strided(v, L);

  const TensorView& m = opt.key_padding_mask;
  if (given(m)) {
    STRATA_CHECK_ARG(m.ndim == 2 && m.shape[0] == dq.b && m.shape[1] == dq.s, where, "key_padding_mask",
                     detail::cat("shape [", dq.b, ", ", dq.s, "] (batch, seq)"), m.shape_str());
    STRATA_CHECK_ARG(m.dtype == DType::u8, where, "key_padding_mask", "dtype uint8 (bool)", dtype_name(m.dtype));
    STRATA_CHECK_ARG(m.data != nullptr || m.numel() == 0, where, "key_padding_mask", "a non-null data pointer",
                     "null");
    p.key_padding_mask = static_cast<const uint8_t*>(m.data);
    p.kpm_sb = m.stride[0];
    p.kpm_ss = m.stride[1];
  }
  if (given(state)) {
    const int64_t want[5] = {dq.b, dq.h, opt.num_steps - 1, g.padded_len, dq.d};
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

void monarch_attention_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                               const TensorView& o, const TensorView& state, const MonarchOptions& opt) {
  const char* where = "monarch_attention_forward";
  MonarchParams p = make_params(where, q, k, v, state, opt);
  const Layout L = opt.layout;
  check_4d(where, "o", o, q.dtype, L);
  check_shape(where, "o", dims(o, L), {p.batch, p.seqlen, p.heads_q, p.head_dim_v},
              "(q's batch, seq, heads; v's head_dim)");
  p.o = strided(o, L);
  STRATA_ACTIVE_KERNELS(kMonarchKernels).forward(p);
}

void monarch_attention_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                                const TensorView& state, const TensorView& dout, const TensorView& dq,
                                const TensorView& dk, const TensorView& dv, const MonarchOptions& opt) {
  const char* where = "monarch_attention_backward";
  MonarchParams p = make_params(where, q, k, v, state, opt);
  const Layout L = opt.layout;
  check_4d(where, "dout", dout, q.dtype, L);
  check_4d(where, "dq", dq, q.dtype, L);
  check_4d(where, "dk", dk, q.dtype, L);
  check_4d(where, "dv", dv, q.dtype, L);
  check_shape(where, "dout", dims(dout, L), {p.batch, p.seqlen, p.heads_q, p.head_dim_v},
              "(q's batch, seq, heads; v's head_dim)");
  check_shape(where, "dq", dims(dq, L), dims(q, L), "(same as q)");
  check_shape(where, "dk", dims(dk, L), dims(k, L), "(same as k)");
  check_shape(where, "dv", dims(dv, L), dims(v, L), "(same as v)");
  p.dout = strided(dout, L);
  p.dq = strided(dq, L);
  p.dk = strided(dk, L);
  p.dv = strided(dv, L);
  STRATA_ACTIVE_KERNELS(kMonarchKernels).backward(p);
}

}  // namespace strata
