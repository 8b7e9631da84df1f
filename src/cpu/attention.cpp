// src/cpu/attention.cpp: the public dense-attention entry points: argument checks (every error
// names the argument), TensorView -> DenseAttnParams, the keys a window cannot reach left out
// before the kernels run, ISA dispatch, and the paper's GSWA composition.
// Semantics: include/strata/attention.h.
#include "strata/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "cpu/attention_params.h"
#include "cpu/finite_bound.h"
#include "cpu/views.h"  // fill_io, fill_grads
#include "strata/cpu.h"
#include "strata/threading.h"

namespace strata {
namespace {

using cpu::DenseAttnParams;

// q, k, v of a dense attention call: GQA or a shared query (strata/attention.h).
AttnDims check_dense_qkv(const char* where, const TensorView& q, const TensorView& k, const TensorView& v, Layout l,
                         const DTypes& dtypes = kKernelDTypes) {
  return check_qkv(where, q, k, v, l, dtypes, /*self_attention=*/false, HeadGroups::gqa_or_shared_q);
}

}  // namespace

void validate(const char* where, const AttentionOptions& opt, const AttnDims& d) {
  STRATA_CHECK_ARG(std::isnan(opt.scale) || std::isfinite(opt.scale), where, "scale",
                   "a finite number (or NaN for 1/sqrt(head_dim))", opt.scale);
  STRATA_CHECK_ARG(opt.window_left >= -1, where, "window_left", ">= 0, or -1 for unbounded", opt.window_left);
  STRATA_CHECK_ARG(opt.window_right >= -1, where, "window_right", ">= 0, or -1 for unbounded", opt.window_right);
  STRATA_CHECK_ARG(opt.num_global >= 0, where, "num_global", ">= 0", opt.num_global);
  // The kernels compare positions in fp32 lanes (exact below 2^24; a causal forward over 2^24 + 300
  // keys silently dropped the newest keys of every row): the queries and the keys within their
  // reach stay below that. A left window without global tokens bounds the reach (the kernels then
  // run on the keys some query reaches: first_reachable_key), so windowed attention over longer
  // sequences runs.
  const int64_t window_left = effective_window(opt.window_left, d.seqlen_q, d.seqlen_k);
  const bool windowed = window_left >= 0 && opt.num_global == 0;
  const int64_t reach = windowed ? std::min(d.seqlen_k, d.seqlen_q + window_left) : d.seqlen_k;
  check_positions(where, d.seqlen_q, reach, " (keys within the queries' reach: window_left bounds it)");
  check_key_padding_mask(where, opt.key_padding_mask, d.batch, d.seqlen_k);
  const TensorView& bias = opt.bias;
  if (given(bias)) {
    const int64_t want[4] = {d.batch, d.heads(), d.seqlen_q, d.seqlen_k};
    bool ok = bias.ndim == 4;
    for (int i = 0; ok && i < 4; ++i) ok = bias.shape[i] == want[i] || bias.shape[i] == 1;
    STRATA_CHECK_ARG(ok, where, "bias",
                     detail::cat("4-D, broadcastable to [", want[0], ", ", want[1], ", ", want[2], ", ", want[3],
                                 "] (batch, heads of o, seq_q, seq_k)"),
                     bias.shape_str());
    const bool dtype_ok = bias.dtype == DType::f32 || bias.dtype == d.dtype;
    STRATA_CHECK_ARG(dtype_ok, where, "bias",
                     d.dtype == DType::f32 ? std::string("dtype float32")
                                           : detail::cat("dtype float32 or ", dtype_name(d.dtype)),
                     dtype_name(bias.dtype));
    STRATA_CHECK_ARG(bias.data != nullptr || bias.numel() == 0, where, "bias", "a non-null data pointer", "null");
  }
}

int64_t effective_window(int64_t w, int64_t seqlen_q, int64_t seqlen_k) {
  return w >= 0 && w - seqlen_q >= seqlen_k ? -1 : w;  // (w - seqlen_q: no sum to overflow)
}

namespace {

// The bf16 engine of a forward of sizes d with opt, or null for fp32 products.
const cpu::bf16::Gemms* forward_bf16_gemms(const char* where, const AttnDims& d, const AttentionOptions& opt) {
  if (d.seqlen_q <= cpu::kDenseDecodeRows) {  // the row path (fp32); an explicit engine is still checked
    resolve_compute(where, opt.compute, d.dtype == DType::bf16);
    return nullptr;
  }
  return cpu::bf16::engine(resolve_compute(where, opt.compute, d.dtype == DType::bf16));
}

// Validates every forward argument and fills the kernel params (o/lse included; the bf16 engine
// of a forward).
DenseAttnParams make_params(const char* where, const TensorView& q, const TensorView& k,
                            const TensorView& v, const TensorView& o, const TensorView& lse,
                            const AttentionOptions& opt) {
  const Layout L = opt.layout;
  const AttnDims d = check_dense_qkv(where, q, k, v, L);
  check_out(where, o, L, d);
  check_lse(where, lse, d);
  validate(where, opt, d);
  check_no_overlap(where, "o", o);
  check_no_overlap(where, "lse", lse);

  DenseAttnParams p;
  cpu::fill_io(p, d, q, k, v, o, lse, L);
  p.scale = std::isnan(opt.scale) ? float(1.0 / std::sqrt(double(d.head_dim))) : opt.scale;
  p.causal = opt.causal;
  p.window_left = effective_window(opt.window_left, d.seqlen_q, d.seqlen_k);
  p.window_right = effective_window(opt.window_right, d.seqlen_q, d.seqlen_k);
  p.num_global = opt.num_global;
  p.bf16_gemms = forward_bf16_gemms(where, d, opt);

  const TensorView& m = opt.key_padding_mask;
  if (given(m)) {
    p.key_padding_mask = static_cast<const uint8_t*>(m.data);
    p.kpm_sb = m.stride[0];
    p.kpm_ss = m.stride[1];
  }
  const TensorView& bias = opt.bias;
  if (given(bias)) {
    p.bias = bias.data;
    p.bias_dtype = bias.dtype;
    int64_t* s[4] = {&p.bias_sb, &p.bias_sh, &p.bias_sq, &p.bias_sk};
    for (int i = 0; i < 4; ++i) *s[i] = bias.shape[i] == 1 ? 0 : bias.stride[i];
  }
  return p;
}

// Calls f(idx) for every index (b, i1, i2, d) of a 4-D view, parallel over the first two dims.
template <class F>
void for_each_index(const TensorView& t, const F& f) {
  const int64_t n1 = t.shape[1], n2 = t.shape[2], n3 = t.shape[3];
  parallel_for(t.shape[0] * n1, 1, [&](int64_t begin, int64_t end, int) {
    int64_t idx[4];
    for (int64_t r = begin; r < end; ++r) {
      idx[0] = r / n1;
      idx[1] = r % n1;
      for (idx[2] = 0; idx[2] < n2; ++idx[2])
        for (idx[3] = 0; idx[3] < n3; ++idx[3]) f(idx);
    }
  });
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
  auto shift = [&](cpu::Strided4& t) { t.data = static_cast<char*>(t.data) + k0 * t.ss * esz; };
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

// Writes zeros to the first n positions (along the seq dim of layout l) of a 4-D view: the
// gradients of keys no query reaches.
void zero_leading_positions(const TensorView& t, Layout l, int64_t n) {
  if (n == 0) return;
  TensorView s = t;
  s.shape[cpu::kSeqDim[int(l)]] = n;
  for_each_index(s, [&](const int64_t* idx) { s.set(idx, 0.f); });
}

void run_forward(const DenseAttnParams& p) {
  const cpu::DenseKernels& kernels = STRATA_ACTIVE_KERNELS(kDenseKernels);
  if (p.bf16_gemms && kernels.forward_bf16) return kernels.forward_bf16(p);
  kernels.forward(p);
}
void run_backward(const DenseAttnParams& p) {
  const cpu::DenseKernels& kernels = STRATA_ACTIVE_KERNELS(kDenseKernels);
  if (p.bf16_gemms && kernels.backward_bf16) return kernels.backward_bf16(p);
  kernels.backward(p);
}

}  // namespace

Compute attention_compute(const AttnDims& d, const AttentionOptions& opt) {
  const cpu::bf16::Gemms* g = forward_bf16_gemms("attention_compute", d, opt);
  if (!g) return Compute::fp32;
  return g == &cpu::bf16::kAmxBf16 ? Compute::amx_bf16 : Compute::avx512_bf16;
}

namespace {

// The finite-input bound (strata/attention.h): src/cpu/finite_bound.h checks it after each call.
cpu::LogitBound dense_bound(const AttentionOptions& opt, float scale) {
  cpu::LogitBound b;
  b.scale = std::fabs(double(scale));
  b.bias = &opt.bias;
  return b;
}

}  // namespace

void attention_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                       const TensorView& o, const TensorView& lse, const AttentionOptions& opt) {
  const char* where = "attention_forward";
  DenseAttnParams p = make_params(where, q, k, v, o, lse, opt);
  const float scale = p.scale;
  drop_leading_keys(p, first_reachable_key(p), /*backward=*/false);
  run_forward(p);
  cpu::check_forward_bound(where, q, k, lse, dense_bound(opt, scale));
}

void attention_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                        const TensorView& o, const TensorView& lse, const TensorView& dout,
                        const TensorView& dq, const TensorView& dk, const TensorView& dv,
                        const AttentionOptions& opt) {
  const char* where = "attention_backward";
  DenseAttnParams p = make_params(where, q, k, v, o, lse, opt);
  const Layout L = opt.layout;
  check_grads(where, dout, dq, dk, dv, L, check_dense_qkv(where, q, k, v, L));
  cpu::fill_grads(p, dout, dq, dk, dv, L);
  const int64_t k0 = first_reachable_key(p);
  zero_leading_positions(dk, L, k0);  // keys no query reaches get no gradient
  zero_leading_positions(dv, L, k0);
  const float scale = p.scale;
  drop_leading_keys(p, k0, /*backward=*/true);
  run_backward(p);
  cpu::check_backward_bound(where, q, k, v, &o, dout, dq, dk, dv, dense_bound(opt, scale));
}

AttentionFlops attention_flops(const AttnDims& d, bool causal) {
  AttentionFlops f;
  f.forward = 2.0 * double(d.batch) * double(d.heads()) * double(d.seqlen_q) * double(d.seqlen_k) *
              double(d.head_dim + d.head_dim_v) * (causal ? 0.5 : 1.0);
  f.backward = AttentionFlops::kBackwardFlops * f.forward;
  return f;
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
  for_each_index(dst, [&](const int64_t* idx) { dst.set(idx, float(a.get(idx)) + float(b.get(idx))); });
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
  check_out("paper_gswa_forward", o, opt.layout, check_dense_qkv("paper_gswa_forward", q, k, v, opt.layout));
  check_no_overlap("paper_gswa_forward", "o", o);
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
