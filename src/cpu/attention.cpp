// src/cpu/attention.cpp: the public dense-attention entry points: argument checks (every error
// names the argument), TensorView -> DenseAttnParams, the keys a window cannot reach left out
// before the kernels run, ISA dispatch, and the paper's GSWA composition.
// Semantics: include/strata/attention.h.
#include "strata/attention.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "cpu/attention_params.h"
#include "cpu/views.h"
#include "strata/cpu.h"
#include "strata/threading.h"

namespace strata {
namespace {

using cpu::DenseAttnParams;
using cpu::Strided4;
using cpu::Dims4;
using cpu::check_4d;
using cpu::check_shape;
using cpu::dims;
using cpu::dims_str;
using cpu::layout_str;
using cpu::strided;


// Validates every forward argument and fills the kernel params (o/lse included).
DenseAttnParams make_params(const char* where, const TensorView& q, const TensorView& k,
                            const TensorView& v, const TensorView& o, const TensorView& lse,
                            const AttentionOptions& opt) {
  STRATA_CHECK_ARG(q.ndim == 4, where, "q", "a 4-D tensor", detail::cat(q.ndim, "-D ", q.shape_str()));
  STRATA_CHECK_ARG(q.dtype == DType::f32 || q.dtype == DType::bf16, where, "q",
                   "dtype float32 or bfloat16", dtype_name(q.dtype));
  const Layout L = opt.layout;
  check_4d(where, "q", q, q.dtype, L);
  check_4d(where, "k", k, q.dtype, L);
  check_4d(where, "v", v, q.dtype, L);
  check_4d(where, "o", o, q.dtype, L);
  const Dims4 dq = dims(q, L), dk = dims(k, L), dv = dims(v, L);
  STRATA_CHECK_ARG(dq.d >= 1, where, "q", "head_dim >= 1", dq.d);
  STRATA_CHECK_ARG(dv.d >= 1, where, "v", "head_dim_v >= 1", dv.d);
  STRATA_CHECK_ARG(dq.h >= 1, where, "q", "heads >= 1", dq.h);
  STRATA_CHECK_ARG(dk.h >= 1, where, "k", "heads >= 1", dk.h);
  check_shape(where, "k", dk, {dq.b, dk.s, dk.h, dq.d}, "(batch and head_dim of q)");
  check_shape(where, "v", dv, {dq.b, dk.s, dk.h, dv.d}, "(batch of q, seq and heads of k)");
  STRATA_CHECK_ARG(dq.h % dk.h == 0, where, "k", detail::cat("heads dividing q's heads (", dq.h, ")"), dk.h);
  check_shape(where, "o", dims(o, L), {dq.b, dq.s, dq.h, dv.d}, "(q's batch, seq, heads; v's head_dim)");
  STRATA_CHECK_ARG(lse.ndim == 3 && lse.shape[0] == dq.b && lse.shape[1] == dq.h && lse.shape[2] == dq.s,
                   where, "lse", detail::cat("shape [", dq.b, ", ", dq.h, ", ", dq.s, "] (batch, heads_q, seq_q)"),
                   lse.shape_str());
  STRATA_CHECK_ARG(lse.dtype == DType::f32, where, "lse", "dtype float32", dtype_name(lse.dtype));
  STRATA_CHECK_ARG(lse.data != nullptr || lse.numel() == 0, where, "lse", "a non-null data pointer", "null");
  STRATA_CHECK_ARG(std::isnan(opt.scale) || std::isfinite(opt.scale), where, "scale",
                   "a finite number (or NaN for 1/sqrt(head_dim))", opt.scale);
  STRATA_CHECK_ARG(opt.window_left >= -1, where, "window_left", ">= 0, or -1 for unbounded", opt.window_left);
  STRATA_CHECK_ARG(opt.window_right >= -1, where, "window_right", ">= 0, or -1 for unbounded", opt.window_right);
  STRATA_CHECK_ARG(opt.num_global >= 0, where, "num_global", ">= 0", opt.num_global);

  DenseAttnParams p;
  p.dtype = q.dtype;
  p.batch = dq.b;
  p.seqlen_q = dq.s;
  p.seqlen_k = dk.s;
  p.heads_q = dq.h;
  p.heads_kv = dk.h;
  p.head_dim = dq.d;
  p.head_dim_v = dv.d;
  p.q = strided(q, L);
  p.k = strided(k, L);
  p.v = strided(v, L);
  p.o = strided(o, L);
  p.lse = static_cast<float*>(lse.data);
  p.lse_sb = lse.stride[0];
  p.lse_sh = lse.stride[1];
  p.lse_ss = lse.stride[2];
  p.scale = std::isnan(opt.scale) ? float(1.0 / std::sqrt(double(dq.d))) : opt.scale;
  p.causal = opt.causal;
  p.window_left = opt.window_left;
  p.window_right = opt.window_right;
  p.num_global = opt.num_global;

  const TensorView& m = opt.key_padding_mask;
  if (m.data != nullptr || m.ndim != 0) {
    STRATA_CHECK_ARG(m.ndim == 2 && m.shape[0] == dq.b && m.shape[1] == dk.s, where, "key_padding_mask",
                     detail::cat("shape [", dq.b, ", ", dk.s, "] (batch, seq_k)"), m.shape_str());
    STRATA_CHECK_ARG(m.dtype == DType::u8, where, "key_padding_mask", "dtype uint8 (bool)", dtype_name(m.dtype));
    STRATA_CHECK_ARG(m.data != nullptr || m.numel() == 0, where, "key_padding_mask", "a non-null data pointer", "null");
    p.key_padding_mask = static_cast<const uint8_t*>(m.data);
    p.kpm_sb = m.stride[0];
    p.kpm_ss = m.stride[1];
  }
  const TensorView& bias = opt.bias;
  if (bias.data != nullptr || bias.ndim != 0) {
    const int64_t want[4] = {dq.b, dq.h, dq.s, dk.s};
    bool ok = bias.ndim == 4;
    for (int i = 0; ok && i < 4; ++i) ok = bias.shape[i] == want[i] || bias.shape[i] == 1;
    STRATA_CHECK_ARG(ok, where, "bias",
                     detail::cat("4-D, broadcastable to [", want[0], ", ", want[1], ", ", want[2], ", ", want[3],
                                 "] (batch, heads_q, seq_q, seq_k)"),
                     bias.shape_str());
    STRATA_CHECK_ARG(bias.dtype == DType::f32 || bias.dtype == q.dtype, where, "bias",
                     q.dtype == DType::f32 ? std::string("dtype float32")
                                           : detail::cat("dtype float32 or ", dtype_name(q.dtype)),
                     dtype_name(bias.dtype));
    STRATA_CHECK_ARG(bias.data != nullptr || bias.numel() == 0, where, "bias", "a non-null data pointer", "null");
    p.bias = bias.data;
    p.bias_dtype = bias.dtype;
    int64_t* s[4] = {&p.bias_sb, &p.bias_sh, &p.bias_sq, &p.bias_sk};
    for (int i = 0; i < 4; ++i) *s[i] = bias.shape[i] == 1 ? 0 : bias.stride[i];
  }
  return p;
}

// ---- Keys no query can reach -----------------------------------------------------------------
// With a left window bound and no global tokens every query row's keys lie in the suffix
// [k0, seqlen_k): the last row sits at position seqlen_k - 1 and row i's window starts at
// p_i - window_left, growing with i, so k0 = max(0, p_0 - window_left), p_0 = seqlen_k - seqlen_q.
// The kernels then run on that suffix alone: bottom-right positions shift by k0 for queries and
// keys alike, so every mask and every result is the same, and the packed operands and workspaces
// are sized by what the window touches (window + seqlen_q keys), not by the sequence (a window
// over 2^31 keys of an expanded tensor allocated in proportion to the 2^31).
int64_t first_reachable_key(const DenseAttnParams& p) {
  if (p.window_left < 0 || p.num_global > 0) return 0;
  return std::clamp<int64_t>(p.seqlen_k - p.seqlen_q - p.window_left, 0, p.seqlen_k);
}

// Moves the key-side views (k, v, the key padding mask, the bias; dk, dv for the backward) to
// start at key k0 and shortens seqlen_k accordingly.
void drop_leading_keys(DenseAttnParams& p, int64_t k0, bool backward) {
  if (k0 == 0) return;
  const int64_t esz = dtype_size(p.dtype);
  auto shift = [&](Strided4& t) { t.data = static_cast<char*>(t.data) + k0 * t.ss * esz; };
  shift(p.k);
  shift(p.v);
  if (backward) {
    shift(p.dk);
    shift(p.dv);
  }
  if (p.key_padding_mask) p.key_padding_mask += k0 * p.kpm_ss;
  if (p.bias) p.bias = static_cast<const char*>(p.bias) + k0 * p.bias_sk * dtype_size(p.bias_dtype);
  p.seqlen_k -= k0;
}

// The forward kernel compares key positions in fp32 lanes (exact below 2^24): with a causal,
// window or global mask the keys in reach must stay below that (a causal forward over 2^24 + 300
// keys silently dropped the newest keys of every row). A window bounds the reach, so windowed
// attention over longer sequences still runs.
constexpr int64_t kMaxMaskedKeys = int64_t(1) << 24;
void check_positions_exact(const char* where, const DenseAttnParams& p) {
  const bool masked = p.causal || p.window_left >= 0 || p.window_right >= 0 || p.num_global > 0;
  STRATA_CHECK_ARG(!masked || p.seqlen_k < kMaxMaskedKeys, where, "k",
                   detail::cat("seq_k < ", kMaxMaskedKeys, " keys within the queries' reach when a causal, window "
                               "or global mask is on (positions are exact in the kernel's fp32 lanes; "
                               "window_left bounds the reach)"),
                   p.seqlen_k);
}

// Writes zeros to the first n positions (along the seq dim of layout l) of a 4-D view: the
// gradients of keys no query reaches.
void zero_leading_positions(const TensorView& t, Layout l, int64_t n) {
  if (n == 0) return;
  TensorView s = t;
  s.shape[cpu::kSeqDim[int(l)]] = n;
  const int64_t n0 = s.shape[0], n1 = s.shape[1], n2 = s.shape[2], n3 = s.shape[3];
  parallel_for(n0 * n1, 1, [&](int64_t begin, int64_t end, int) {
    int64_t idx[4];
    for (int64_t r = begin; r < end; ++r) {
      idx[0] = r / n1;
      idx[1] = r % n1;
      for (idx[2] = 0; idx[2] < n2; ++idx[2])
        for (idx[3] = 0; idx[3] < n3; ++idx[3]) s.set(idx, 0.f);
    }
  });
}

void run_forward(const DenseAttnParams& p) {
  switch (active_isa()) {
    case Isa::avx512: cpu::avx512::dense_forward(p); break;
    case Isa::avx2: cpu::avx2::dense_forward(p); break;
    default: cpu::scalar::dense_forward(p); break;
  }
}
void run_backward(const DenseAttnParams& p) {
  switch (active_isa()) {
    case Isa::avx512: cpu::avx512::dense_backward(p); break;
    case Isa::avx2: cpu::avx2::dense_backward(p); break;
    default: cpu::scalar::dense_backward(p); break;
  }
}

}  // namespace

void attention_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                       const TensorView& o, const TensorView& lse, const AttentionOptions& opt) {
  DenseAttnParams p = make_params("attention_forward", q, k, v, o, lse, opt);
  drop_leading_keys(p, first_reachable_key(p), /*backward=*/false);
  check_positions_exact("attention_forward", p);
  run_forward(p);
}

void attention_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                        const TensorView& o, const TensorView& lse, const TensorView& dout,
                        const TensorView& dq, const TensorView& dk, const TensorView& dv,
                        const AttentionOptions& opt) {
  const char* where = "attention_backward";
  DenseAttnParams p = make_params(where, q, k, v, o, lse, opt);
  const Layout L = opt.layout;
  check_4d(where, "dout", dout, q.dtype, L);
  check_4d(where, "dq", dq, q.dtype, L);
  check_4d(where, "dk", dk, q.dtype, L);
  check_4d(where, "dv", dv, q.dtype, L);
  check_shape(where, "dout", dims(dout, L), dims(o, L), "(same as o)");
  check_shape(where, "dq", dims(dq, L), dims(q, L), "(same as q)");
  check_shape(where, "dk", dims(dk, L), dims(k, L), "(same as k)");
  check_shape(where, "dv", dims(dv, L), dims(v, L), "(same as v)");
  p.dout = strided(dout, L);
  p.dq = strided(dq, L);
  p.dk = strided(dk, L);
  p.dv = strided(dv, L);
  const int64_t k0 = first_reachable_key(p);
  zero_leading_positions(dk, L, k0);  // keys no query reaches get no gradient
  zero_leading_positions(dv, L, k0);
  drop_leading_keys(p, k0, /*backward=*/true);
  run_backward(p);
}

// ---- The paper's GSWA composition ----------------------------------------------------------
namespace {

// The head-dim slice [d0, d0 + n) of a 4-D view (no copy).
TensorView dim_slice(const TensorView& t, int64_t d0, int64_t n) {
  TensorView s = t;
  s.data = static_cast<char*>(t.data) + d0 * t.stride[3] * dtype_size(t.dtype);
  s.shape[3] = n;
  return s;
}

// dst = a + b elementwise over 4-D views of one dtype (f32 or bf16); fp32 arithmetic.
void add_4d(const TensorView& dst, const TensorView& a, const TensorView& b) {
  const int64_t n0 = dst.shape[0], n1 = dst.shape[1], n2 = dst.shape[2], n3 = dst.shape[3];
  parallel_for(n0 * n1, 1, [&](int64_t begin, int64_t end, int) {
    int64_t idx[4];
    for (int64_t r = begin; r < end; ++r) {
      idx[0] = r / n1;
      idx[1] = r % n1;
      for (idx[2] = 0; idx[2] < n2; ++idx[2])
        for (idx[3] = 0; idx[3] < n3; ++idx[3]) dst.set(idx, float(a.get(idx)) + float(b.get(idx)));
    }
  });
}

struct GswaBranches {
  AttentionOptions a, b;
  int64_t D;
};

GswaBranches gswa_branches(const char* where, const TensorView& q, const PaperGswaOptions& opt) {
  STRATA_CHECK_ARG(q.ndim == 4, where, "q", "a 4-D tensor", detail::cat(q.ndim, "-D ", q.shape_str()));
  const int64_t D = q.shape[3];
  STRATA_CHECK_ARG(opt.split_a >= 1 && opt.split_a < D, where, "split_a",
                   detail::cat("1..", D - 1, " (head dims of the global branch; head_dim is ", D, ")"), opt.split_a);
  STRATA_CHECK_ARG(opt.window >= 0, where, "window", ">= 0", opt.window);
  STRATA_CHECK_ARG(std::isnan(opt.scale_a) || std::isfinite(opt.scale_a), where, "scale_a",
                   "a finite number (or NaN for 8 / split_a)", opt.scale_a);
  STRATA_CHECK_ARG(std::isnan(opt.scale_b) || std::isfinite(opt.scale_b), where, "scale_b",
                   "a finite number (or NaN for 8 / (head_dim - split_a))", opt.scale_b);
  GswaBranches g;
  g.D = D;
  g.a.causal = true;
  g.a.layout = opt.layout;
  g.b = g.a;
  // The reference code's defaults: 8 / (the branch's head dims), per branch.
  g.a.scale = std::isnan(opt.scale_a) ? float(8.0 / double(opt.split_a)) : opt.scale_a;
  g.b.scale = std::isnan(opt.scale_b) ? float(8.0 / double(D - opt.split_a)) : opt.scale_b;
  g.b.window_left = opt.window;
  g.b.window_right = 0;
  return g;
}

std::vector<uint8_t> scratch_like(const TensorView& t, TensorView* view) {
  std::vector<uint8_t> buf(size_t(t.numel() * dtype_size(t.dtype)));
  *view = TensorView(buf.data(), t.dtype, {t.shape[0], t.shape[1], t.shape[2], t.shape[3]});
  return buf;
}

}  // namespace

void paper_gswa_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                        const TensorView& o, const TensorView& o_a, const TensorView& o_b,
                        const TensorView& lse_a, const TensorView& lse_b,
                        const PaperGswaOptions& opt) {
  const GswaBranches g = gswa_branches("paper_gswa_forward", q, opt);
  const int64_t a = opt.split_a, rest = g.D - a;
  attention_forward(dim_slice(q, 0, a), dim_slice(k, 0, a), v, o_a, lse_a, g.a);
  attention_forward(dim_slice(q, a, rest), dim_slice(k, a, rest), v, o_b, lse_b, g.b);
  check_4d("paper_gswa_forward", "o", o, q.dtype, opt.layout);
  STRATA_CHECK_ARG(o.shape[1] == o_a.shape[1] && o.shape[2] == o_a.shape[2] && o.shape[3] == o_a.shape[3] &&
                       o.shape[0] == o_a.shape[0],
                   "paper_gswa_forward", "o", detail::cat("shape ", o_a.shape_str(), " (same as o_a)"), o.shape_str());
  add_4d(o, o_a, o_b);
}

void paper_gswa_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                         const TensorView& o_a, const TensorView& o_b, const TensorView& lse_a,
                         const TensorView& lse_b, const TensorView& dout, const TensorView& dq,
                         const TensorView& dk, const TensorView& dv, const PaperGswaOptions& opt) {
  const GswaBranches g = gswa_branches("paper_gswa_backward", q, opt);
  const int64_t a = opt.split_a, rest = g.D - a;
  TensorView dv_b;
  std::vector<uint8_t> buf = scratch_like(v, &dv_b);
  attention_backward(dim_slice(q, 0, a), dim_slice(k, 0, a), v, o_a, lse_a, dout, dim_slice(dq, 0, a),
                     dim_slice(dk, 0, a), dv, g.a);
  attention_backward(dim_slice(q, a, rest), dim_slice(k, a, rest), v, o_b, lse_b, dout,
                     dim_slice(dq, a, rest), dim_slice(dk, a, rest), dv_b, g.b);
  add_4d(dv, dv, dv_b);
}

}  // namespace strata
