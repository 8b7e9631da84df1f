// torch/baselines.cpp: Performer and Nystromformer attention as ATen compositions (see
// strata/torch/baselines.h for the math and how it differs from ref). Everything below is
// differentiable by torch's autograd; there is no kernel and no custom backward.
#include "strata/torch/baselines.h"

#include <ATen/core/Generator.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <limits>

#include "binding_util.h"
#include "op_calls.h"
#include "strata/attention.h"
#include "strata/error.h"

namespace strata::torch {
namespace {

using binding::cat;
using binding::shape_of;
using binding::torch_dtype_name;

// q, k, v as batch x heads x seq x dim (k, v expanded to heads_q for GQA), checked; the mask as
// bool batch x seq (all true when absent).
struct Prepared {
  at::Tensor q, k, v, mask;
  Layout layout;
  int64_t b, n, h, d, dv;
  double scale;
};

Prepared prepare(const char* where, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                 const std::optional<at::Tensor>& key_padding_mask, std::optional<double> scale,
                 const std::string& layout) {
  const Layout l = binding::parse_layout(where, layout);
  STRATA_CHECK_ARG(q.defined() && at::isFloatingType(q.scalar_type()), where, "q", "a floating-point dtype",
                   q.defined() ? torch_dtype_name(q) : std::string("an undefined tensor"));
  for (const auto& [t, arg] : {std::pair{&k, "k"}, std::pair{&v, "v"}}) {
    STRATA_CHECK_ARG(t->defined() && t->scalar_type() == q.scalar_type(), where, arg,
                     cat("dtype ", torch_dtype_name(q), " (same as q)"),
                     t->defined() ? torch_dtype_name(*t) : std::string("an undefined tensor"));
    STRATA_CHECK_ARG(t->device() == q.device(), where, arg, cat("a tensor on ", q.device().str(), " (as q)"),
                     t->device().str());
  }
  // Shapes by the core's checks (any dtype and device here: the views carry sizes only).
  const AttnDims d = check_qkv(where, shape_of(where, "q", q), shape_of(where, "k", k), shape_of(where, "v", v), l,
                               DTypes{DType::f32}, /*self_attention=*/true);
  Prepared p;
  p.layout = l;
  p.b = d.batch;
  p.n = d.seqlen_q;
  p.h = d.heads_q;
  p.d = d.head_dim;
  p.dv = d.head_dim_v;
  if (scale.has_value()) {
    STRATA_CHECK_ARG(std::isfinite(*scale) && *scale >= 0, where, "scale",
                     "a finite number >= 0 (or None for 1/sqrt(head_dim))", *scale);
    p.scale = *scale;
  } else {
    p.scale = 1.0 / std::sqrt(double(d.head_dim));
  }
  const auto heads_first = [&](const at::Tensor& t) { return l == Layout::BSHD ? t.transpose(1, 2) : t; };
  const int64_t rep = d.heads_q / d.heads_kv;
  p.q = heads_first(q);
  p.k = heads_first(k);
  p.v = heads_first(v);
  if (rep > 1) {
    p.k = p.k.repeat_interleave(rep, 1);
    p.v = p.v.repeat_interleave(rep, 1);
  }
  if (key_padding_mask.has_value() && key_padding_mask->defined()) {
    const at::Tensor& m = *key_padding_mask;
    STRATA_CHECK_ARG(m.dim() == 2 && m.size(0) == d.batch && m.size(1) == d.seqlen_q, where, "key_padding_mask",
                     cat("shape [", d.batch, ", ", d.seqlen_q, "] (batch, seq)"), m.sizes());
    STRATA_CHECK_ARG(m.scalar_type() == at::kBool || m.scalar_type() == at::kByte, where, "key_padding_mask",
                     "dtype bool or uint8", torch_dtype_name(m));
    p.mask = m.to(q.device()).to(at::kBool);
  } else {
    p.mask = at::ones({d.batch, d.seqlen_q}, at::TensorOptions().dtype(at::kBool).device(q.device()));
  }
  return p;
}

// out (batch x heads x seq x dv) back in the caller's layout, contiguous in that layout.
at::Tensor finish(const Prepared& p, const at::Tensor& out_bhsd) {
  return (p.layout == Layout::BSHD ? out_bhsd.transpose(1, 2) : out_bhsd).contiguous();
}

// The most negative finite value of a floating dtype (a masked logit that never makes NaN).
// (AT_DISPATCH_* cannot be used here: it names torch::headeronly, which inside strata::torch
// resolves to this namespace.)
double lowest(at::ScalarType t) {
  switch (t) {
    case at::kDouble: return std::numeric_limits<double>::lowest();
    case at::kFloat: return double(std::numeric_limits<float>::lowest());
    case at::kBFloat16: return double(std::numeric_limits<c10::BFloat16>::lowest());
    case at::kHalf: return double(std::numeric_limits<c10::Half>::lowest());
    default: return double(std::numeric_limits<float>::lowest());
  }
}

}  // namespace

at::Tensor performer_omega(int64_t head_dim, int64_t num_features, std::optional<int64_t> seed) {
  const char* where = "performer_omega";
  STRATA_CHECK_ARG(head_dim >= 1, where, "head_dim", ">= 1", head_dim);
  STRATA_CHECK_ARG(num_features >= 1, where, "num_features", ">= 1", num_features);
  binding::check_fits_in_memory(where, "num_features", {head_dim, num_features}, sizeof(double),
                                "the random features (head_dim x num_features float64)", num_features);
  const auto opt = at::TensorOptions().dtype(at::kDouble).device(at::kCPU);
  if (!seed.has_value()) return at::randn({head_dim, num_features}, opt);
  STRATA_CHECK_ARG(*seed >= 0, where, "seed", ">= 0", *seed);
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(uint64_t(*seed));
  return at::randn({head_dim, num_features}, gen, opt);
}

at::Tensor performer_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t num_features,
                               std::optional<int64_t> seed, const std::optional<at::Tensor>& key_padding_mask,
                               std::optional<double> scale, const std::string& layout) {
  const char* where = "performer_attention";
  STRATA_CHECK_ARG(num_features >= 1, where, "num_features", ">= 1", num_features);
  STRATA_CHECK_ARG(!seed.has_value() || *seed >= 0, where, "seed", ">= 0 (or None)", seed.value_or(0));
  const Prepared p = prepare(where, q, k, v, key_padding_mask, scale, layout);
  // (2^40 features ended in the allocator's error: issue 48 item 5)
  binding::check_fits_in_memory(where, "num_features", {2, p.b, p.h, p.n, num_features},
                                int64_t(q.element_size()),
                                "the feature maps phi(q), phi(k) (2 x batch x heads x seq x num_features)",
                                num_features);
  const double c = std::sqrt(p.scale);                 // x.y = scale * q.k
  // D x r, through the dispatcher: an opaque node under torch.compile
  const at::Tensor omega = op_calls::performer_omega(p.d, num_features, seed).to(q.options());
  const at::Tensor x = p.q * c, y = p.k * c;           // batch x heads x seq x D
  const at::Tensor key_ok = p.mask.view({p.b, 1, p.n, 1});
  // Exponents of phi: x omega - |x|^2/2 (batch x heads x seq x r).
  at::Tensor ex = at::matmul(x, omega) - x.square().sum(-1, /*keepdim=*/true) / 2;
  at::Tensor ey = at::matmul(y, omega) - y.square().sum(-1, /*keepdim=*/true) / 2;
  ey = ey.masked_fill(key_ok.logical_not(), -std::numeric_limits<double>::infinity());
  // Shifts that cancel in the ratio: per query row, and one per (batch, head) over valid keys.
  ex = ex - ex.amax(-1, /*keepdim=*/true).detach();
  at::Tensor key_max = ey.amax({-2, -1}, /*keepdim=*/true).detach();
  key_max = key_max.masked_fill(key_max.isinf(), 0.0);  // no valid key: phi_k = 0 everywhere
  const double inv_sqrt_r = 1.0 / std::sqrt(double(num_features));
  const at::Tensor phi_q = at::exp(ex) * inv_sqrt_r;            // batch x heads x seq x r
  const at::Tensor phi_k = at::exp(ey - key_max) * inv_sqrt_r;  // 0 at masked keys
  const at::Tensor kv = at::matmul(phi_k.transpose(-2, -1), p.v);              // batch x heads x r x Dv
  const at::Tensor num = at::matmul(phi_q, kv);                               // batch x heads x seq x Dv
  const at::Tensor den = at::matmul(phi_q, phi_k.sum(-2).unsqueeze(-1));      // batch x heads x seq x 1
  const at::Tensor safe_den = at::where(den > 0, den, at::ones_like(den));
  const at::Tensor out = num / safe_den * p.mask.view({p.b, 1, p.n, 1}).to(num.scalar_type());
  return finish(p, out);
}

at::Tensor nystrom_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t num_landmarks,
                             int64_t pinv_iters, const std::optional<at::Tensor>& key_padding_mask,
                             std::optional<double> scale, const std::string& layout) {
  const char* where = "nystrom_attention";
  STRATA_CHECK_ARG(num_landmarks >= 1, where, "num_landmarks", ">= 1", num_landmarks);
  STRATA_CHECK_ARG(pinv_iters >= 0, where, "pinv_iters", ">= 0", pinv_iters);
  const Prepared p = prepare(where, q, k, v, key_padding_mask, scale, layout);
  const int64_t B = p.b, H = p.h, N = p.n, D = p.d, m = std::min(num_landmarks, N);
  if (N == 0) return finish(p, at::zeros({B, H, 0, p.dv}, q.options()));
  const auto dt = q.scalar_type();
  const auto long_opt = at::TensorOptions().dtype(at::kLong).device(q.device());

  // Segments: valid token of rank r (among n valid ones) -> floor(r m / n); masked -> bin m.
  const at::Tensor valid = p.mask;                                  // batch x seq, bool
  const at::Tensor rank = valid.to(at::kLong).cumsum(1) - 1;        // batch x seq
  const at::Tensor n_valid = valid.to(at::kLong).sum(1, /*keepdim=*/true).clamp_min(1);
  const at::Tensor seg = at::where(valid, at::div(rank * m, n_valid, "floor"), at::full_like(rank, m));
  const at::Tensor bin = (seg + at::arange(B, long_opt).unsqueeze(1) * (m + 1)).reshape({B * N});
  // Segment means (batch x heads x m x D) by index_add over the flattened (batch, seq) rows.
  const auto seg_mean = [&](const at::Tensor& t) {  // t: batch x heads x seq x D
    const at::Tensor rows = t.transpose(1, 2).reshape({B * N, H, D});
    const at::Tensor sums = at::zeros({B * (m + 1), H, D}, t.options()).index_add(0, bin, rows);
    return sums.view({B, m + 1, H, D}).narrow(1, 0, m).transpose(1, 2);
  };
  const at::Tensor counts =
      at::zeros({B * (m + 1)}, q.options()).index_add(0, bin, at::ones({B * N}, q.options())).view({B, m + 1})
          .narrow(1, 0, m);                                          // batch x m
  const at::Tensor lm_ok = counts > 0;                               // batch x m: non-empty landmark
  const at::Tensor inv_counts = (1.0 / counts.clamp_min(1)).view({B, 1, m, 1});
  const at::Tensor q_lm = seg_mean(p.q) * inv_counts, k_lm = seg_mean(p.k) * inv_counts;

  const double low = lowest(dt), s = p.scale;
  const at::Tensor lm_col_bad = lm_ok.logical_not().view({B, 1, 1, m});
  const at::Tensor key_bad = valid.logical_not().view({B, 1, 1, N});
  // F: batch x heads x seq x m; A: batch x heads x m x m; Bm: batch x heads x m x seq.
  const at::Tensor F = at::softmax((at::matmul(p.q, k_lm.transpose(-2, -1)) * s).masked_fill(lm_col_bad, low), -1);
  const at::Tensor eye = at::eye(m, q.options());
  at::Tensor A = at::softmax((at::matmul(q_lm, k_lm.transpose(-2, -1)) * s).masked_fill(lm_col_bad, low), -1);
  A = at::where(lm_ok.logical_not().view({B, 1, m, 1}), eye, A);  // empty landmark: identity row
  const at::Tensor Bm = at::softmax((at::matmul(q_lm, p.k.transpose(-2, -1)) * s).masked_fill(key_bad, low), -1) *
                        lm_ok.view({B, 1, m, 1}).to(dt);

  // Iterative pseudo-inverse (ref's order of products); Z0 scale per (batch, head) matrix.
  const at::Tensor absA = A.abs();
  const at::Tensor c0 = absA.sum(-2).amax(-1, /*keepdim=*/true) * absA.sum(-1).amax(-1, /*keepdim=*/true);
  at::Tensor Z = A.transpose(-2, -1) / c0.unsqueeze(-1);
  for (int64_t it = 0; it < pinv_iters; ++it) {
    const at::Tensor t1 = 7 * eye - at::matmul(A, Z);
    const at::Tensor t2 = 15 * eye - at::matmul(A, at::matmul(Z, t1));
    const at::Tensor t3 = 13 * eye - at::matmul(A, at::matmul(Z, t2));
    Z = 0.25 * at::matmul(Z, t3);
  }
  const at::Tensor out = at::matmul(F, at::matmul(Z, at::matmul(Bm, p.v)));  // batch x heads x seq x Dv
  return finish(p, out * valid.view({B, 1, N, 1}).to(dt));
}

double softmax_attention_flops(int64_t N, int64_t D, int64_t Dv) {
  const char* where = "softmax_attention_flops";
  STRATA_CHECK_ARG(N >= 0, where, "N", ">= 0", N);
  STRATA_CHECK_ARG(D >= 0, where, "D", ">= 0", D);
  AttnDims d;  // one sequence, one head: the core's count (strata/attention.h)
  d.batch = d.heads_q = d.heads_kv = 1;
  d.seqlen_q = d.seqlen_k = N;
  d.head_dim = D;
  d.head_dim_v = Dv < 0 ? D : Dv;
  return ::strata::attention_flops(d, /*causal=*/false).forward;
}

double performer_attention_flops(int64_t N, int64_t D, int64_t Dv, int64_t num_features) {
  const char* where = "performer_attention_flops";
  STRATA_CHECK_ARG(N >= 0, where, "N", ">= 0", N);
  STRATA_CHECK_ARG(D >= 0, where, "D", ">= 0", D);
  STRATA_CHECK_ARG(Dv >= 0, where, "Dv", ">= 0", Dv);
  STRATA_CHECK_ARG(num_features >= 1, where, "num_features", ">= 1", num_features);
  return 2.0 * double(N) * double(num_features) * double(2 * D + 2 * Dv + 1);
}

double nystrom_attention_flops(int64_t N, int64_t D, int64_t Dv, int64_t num_landmarks, int64_t pinv_iters) {
  const char* where = "nystrom_attention_flops";
  STRATA_CHECK_ARG(N >= 0, where, "N", ">= 0", N);
  STRATA_CHECK_ARG(D >= 0, where, "D", ">= 0", D);
  STRATA_CHECK_ARG(Dv >= 0, where, "Dv", ">= 0", Dv);
  STRATA_CHECK_ARG(num_landmarks >= 1, where, "num_landmarks", ">= 1", num_landmarks);
  STRATA_CHECK_ARG(pinv_iters >= 0, where, "pinv_iters", ">= 0", pinv_iters);
  const double n = double(N), m = double(std::min(num_landmarks, N)), dd = double(D + Dv);
  return 2.0 * (2 * n * m * dd + m * m * dd + 6.0 * double(pinv_iters) * m * m * m);
}

}  // namespace strata::torch
