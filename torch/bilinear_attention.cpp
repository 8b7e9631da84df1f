// torch/bilinear_attention.cpp: the bilinear BTT / MLR scoring layers
// (strata/torch/bilinear_attention.h): the structured transforms as batched GEMMs, the layers'
// forwards as functions of their weights, and the two modules around them.
#include "strata/torch/bilinear_attention.h"

#include <ATen/ATen.h>

#include <cmath>

#include "binding_util.h"
#include "strata/error.h"
#include "strata/torch/attention.h"
#include "strata/torch/structured.h"

namespace strata::torch {

using binding::cat;

namespace {

std::string describe(const at::Tensor& t) {
  return t.defined() ? cat(binding::torch_dtype_name(t), " ", t.sym_sizes()) : std::string("an undefined tensor");
}

// t.sizes() == want, dim by dim: under torch.compile's symbolic shapes a guard (a weight's shape is
// the layer's structure), where sizes() would throw.
bool has_sizes(const at::Tensor& t, at::IntArrayRef want) {
  if (t.dim() != int64_t(want.size())) return false;
  for (int64_t i = 0; i < t.dim(); ++i)
    if (t.size(i) != want[size_t(i)]) return false;
  return true;
}

// t must be a floating tensor of x's dtype and device with sizes `want`.
void check_weight(const char* where, const char* arg, const at::Tensor& t, const at::Tensor& x, at::IntArrayRef want,
                  const std::string& why = "") {
  STRATA_CHECK_ARG(t.defined() && has_sizes(t, want) && t.scalar_type() == x.scalar_type() && t.device() == x.device(),
                   where, arg, cat(binding::torch_dtype_name(x), " on ", x.device(), " (x's) of shape ", want, why),
                   t.defined() ? cat(describe(t), " on ", t.device()) : describe(t));
}
// As check_weight for a tensor that may be absent (undefined).
void check_optional_weight(const char* where, const char* arg, const at::Tensor& t, const at::Tensor& x,
                           at::IntArrayRef want) {
  if (t.defined()) check_weight(where, arg, t, x, want);
}

// x: a floating tensor of at least `min_dim` dims whose last is `width` (width < 0: any).
void check_input(const char* where, const at::Tensor& x, int64_t min_dim, int64_t width = -1) {
  STRATA_CHECK_ARG(
      x.defined() && x.dim() >= min_dim && at::isFloatingType(x.scalar_type()) && (width < 0 || x.size(-1) == width),
      where, "x",
      cat("a floating tensor of ", min_dim == 3 ? "3 dims (batch, seq, D)" : "at least 1 dim",
          width >= 0 ? cat(" with last dim ", width) : std::string()),
      x.defined() ? cat(x.dim(), "-D ", describe(x)) : describe(x));
}

// x's leading dims (symbolic under torch.compile's dynamic shapes) followed by (heads, width).
std::vector<c10::SymInt> head_sizes(const at::Tensor& x, int64_t heads, int64_t width) {
  std::vector<c10::SymInt> s(x.sym_sizes().begin(), x.sym_sizes().end() - 1);
  s.push_back(heads);
  s.push_back(width);
  return s;
}

// The BTT sizes (a, b, c, d, s) read from the cores' shapes (btt_key_transform's checks).
struct BttDims {
  int64_t a, b, c, d, s;
};
BttDims btt_dims(const char* where, const at::Tensor& w_k, const at::Tensor& w_q, int64_t heads) {
  STRATA_CHECK_ARG(heads >= 1, where, "heads", ">= 1", heads);
  STRATA_CHECK_ARG(w_k.defined() && w_k.dim() == 3 && w_k.size(0) >= 1 && w_k.size(1) >= 1, where, "w_k",
                   "a 3-D tensor c x d x (heads*b*s), c, d >= 1", describe(w_k));
  const int64_t c = w_k.size(0), d = w_k.size(1);
  STRATA_CHECK_ARG(
      w_q.defined() && w_q.dim() == 3 && w_q.size(0) >= 1 && w_q.size(0) % heads == 0 && w_q.size(1) >= 1 &&
          w_q.size(2) >= 1 && w_q.size(2) % c == 0,
      where, "w_q",
      cat("a 3-D tensor (heads*b) x a x (c*s) with heads = ", heads, ", c = w_k.size(0) = ", c, ", a, b, s >= 1"),
      describe(w_q));
  const int64_t b = w_q.size(0) / heads, a = w_q.size(1), s = w_q.size(2) / c;
  STRATA_CHECK_ARG(w_k.size(2) == heads * b * s && w_k.scalar_type() == w_q.scalar_type(), where, "w_k",
                   cat("dim 2 = heads*b*s = ", heads * b * s,
                       " (b = w_q.size(0) / heads, s = w_q.size(2) / c) and "
                       "w_q's dtype ",
                       binding::torch_dtype_name(w_q)),
                   describe(w_k));
  return {a, b, c, d, s};
}

// btt_factorize on behalf of `where`, naming `dim_arg` / `rule_arg` (the rules are the core's).
BttShape factorize(const char* where, const char* dim_arg, const char* rule_arg, int64_t dim, const std::string& rule) {
  STRATA_CHECK_ARG(rule == "ref" || rule == "balanced", where, rule_arg, "\"ref\" or \"balanced\"",
                   cat("\"", rule, "\""));
  if (rule == "ref")
    STRATA_CHECK_ARG(dim >= 2, where, dim_arg,
                     "an integer >= 2 (the reference's factorisation needs a divisor greater than sqrt(dim))", dim);
  STRATA_CHECK_ARG(dim >= 1, where, dim_arg, ">= 1", dim);
  return ::strata::btt_factorize(dim, dim, rule == "ref" ? BttFactorize::reference : BttFactorize::balanced);
}

// The logit-scale rule on behalf of `where`.
void check_logit_scale(const char* where, const std::string& logit_scale) {
  STRATA_CHECK_ARG(logit_scale == "sp" || logit_scale == "mup", where, "logit_scale", "\"sp\" or \"mup\"",
                   cat("\"", logit_scale, "\""));
}

}  // namespace

BttShape btt_factorize(int64_t dim, const std::string& rule) {
  return factorize("btt_factorize", "dim", "rule", dim, rule);
}

at::Tensor btt_key_transform(const at::Tensor& x, const at::Tensor& w_k, const at::Tensor& w_q, int64_t heads) {
  const char* where = "btt_key_transform";
  const auto [a, b, c, d, s] = btt_dims(where, w_k, w_q, heads);
  check_input(where, x, 1, c * d);
  STRATA_CHECK_ARG(w_k.scalar_type() == x.scalar_type() && w_k.device() == x.device(), where, "w_k",
                   cat("x's dtype and device (", binding::torch_dtype_name(x), " on ", x.device(), ")"),
                   cat(describe(w_k), " on ", w_k.device()));
  // The core's BTT operator: its factors are W_K (c, d, heads*b*s) and W_Q (heads*b, a, c*s) as they
  // are; its output index h*a*b + i_a*b + j_b is the head-major layout asked for.
  const StructuredSpec spec = btt_spec({a, b, c, d}, s, heads);
  return structured_linear(spec, x, {w_k, w_q}).reshape_symint(head_sizes(x, heads, a * b));
}

at::Tensor block_diag_transform(const at::Tensor& x, const at::Tensor& w, int64_t heads) {
  const char* where = "block_diag_transform";
  STRATA_CHECK_ARG(heads >= 1, where, "heads", ">= 1", heads);
  STRATA_CHECK_ARG(
      w.defined() && w.dim() == 3 && w.size(0) >= 1 && w.size(1) >= 1 && w.size(2) >= 1 && w.size(2) % heads == 0,
      where, "w", cat("a 3-D tensor p x m x (heads*r) with heads = ", heads, ", p, m, r >= 1"), describe(w));
  const int64_t p = w.size(0), m = w.size(1), r = w.size(2) / heads;
  check_input(where, x, 1, p * m);
  STRATA_CHECK_ARG(w.scalar_type() == x.scalar_type() && w.device() == x.device(), where, "w",
                   cat("x's dtype and device (", binding::torch_dtype_name(x), " on ", x.device(), ")"),
                   cat(describe(w), " on ", w.device()));
  // One block-diagonal stage (p chunks of m features -> heads*r each: w as it is), then the output
  // permutation out[h, rho*p + k] <- stage output [k, h*r + rho].
  StructuredSpec spec{"block_diag_heads", p * m, p * heads * r, {}};
  StructuredLevel lv;
  lv.inner = p * heads * r;
  lv.right = {StageKind::blocks, p};
  lv.left = {StageKind::identity, 1};
  lv.out_perm.resize(size_t(lv.inner));
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t rho = 0; rho < r; ++rho)
      for (int64_t k = 0; k < p; ++k) lv.out_perm[size_t((h * r + rho) * p + k)] = k * heads * r + h * r + rho;
  spec.levels.push_back(std::move(lv));
  return structured_linear(spec, x, {w}).reshape_symint(head_sizes(x, heads, r * p));
}

double bilinear_btt_logit_scale(int64_t dim, const std::string& logit_scale) {
  check_logit_scale("bilinear_btt_logit_scale", logit_scale);
  STRATA_CHECK_ARG(dim >= 1, "bilinear_btt_logit_scale", "dim", ">= 1", dim);
  return logit_scale == "sp" ? 1.0 / std::sqrt(double(dim)) : 1.0 / double(dim);
}

double bilinear_mlr_logit_scale(int64_t r, int64_t p, const std::string& logit_scale) {
  check_logit_scale("bilinear_mlr_logit_scale", logit_scale);
  STRATA_CHECK_ARG(r >= 1, "bilinear_mlr_logit_scale", "r", ">= 1", r);
  STRATA_CHECK_ARG(p >= 1, "bilinear_mlr_logit_scale", "p", ">= 1", p);
  const double rp = double(r) * double(p);
  // The reference's muP scale: 1/sqrt(rp) times 8/sqrt(rp).
  return logit_scale == "sp" ? 1.0 / std::sqrt(rp) : 8.0 / rp;
}

at::Tensor shared_query_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                                  bool causal) {
  const char* where = "shared_query_attention";
  STRATA_CHECK_ARG(q.defined() && q.dim() == 3, where, "q", "a 3-D tensor batch x T x Dqk", describe(q));
  STRATA_CHECK_ARG(k.defined() && k.dim() == 4, where, "k", "a 4-D tensor batch x T x heads x Dqk", describe(k));
  AttentionArgs a;
  a.scale = scale;
  a.causal = causal;
  // THE place where the shared query meets the dense op: a stride-0 view over the heads (no copy).
  const at::Tensor q_heads = q.unsqueeze(2).expand_symint({q.sym_size(0), q.sym_size(1), k.sym_size(2), q.sym_size(2)});
  return attention(q_heads, k, v, a);
}

BilinearQkv bilinear_btt_qkv(const at::Tensor& x, const BilinearBTTWeights& w, int64_t num_heads,
                             const std::string& logit_scale, bool rms_cap_on) {
  const char* where = "bilinear_btt_attention";
  check_input(where, x, 3);
  // B, T symbolic under torch.compile's dynamic shapes; D is the layer's width
  const c10::SymInt B = x.sym_size(0), T = x.sym_size(1);
  const int64_t D = x.size(2), H = num_heads;
  STRATA_CHECK_ARG(H >= 1 && D % H == 0, where, "num_heads", cat("a divisor of D = x.size(2) = ", D), H);
  check_logit_scale(where, logit_scale);
  const auto [a, b, c, d, s] = btt_dims(where, w.w_k, w.w_q, H);
  STRATA_CHECK_ARG(c * d == D, where, "w_k", cat("c*d = D = ", D, " (dims 0, 1)"), describe(w.w_k));
  STRATA_CHECK_ARG(a * b == D, where, "w_q", cat("a*b = D = ", D, " (a = dim 1, b = dim 0 / num_heads)"),
                   describe(w.w_q));
  check_weight(where, "w_k", w.w_k, x, w.w_k.sizes());
  check_weight(where, "w_q", w.w_q, x, w.w_q.sizes());
  check_weight(where, "key_norm_weight", w.key_norm_weight, x, {D});
  check_optional_weight(where, "key_norm_bias", w.key_norm_bias, x, {D});
  check_optional_weight(where, "x_norm_weight", w.x_norm_weight, x, {D});
  STRATA_CHECK_ARG(!w.x_norm_bias.defined() || w.x_norm_weight.defined(), where, "x_norm_bias",
                   "absent without x_norm_weight", describe(w.x_norm_bias));
  check_optional_weight(where, "x_norm_bias", w.x_norm_bias, x, {D});
  check_weight(where, "v_weight", w.v_weight, x, {D, D});
  check_optional_weight(where, "v_bias", w.v_bias, x, {D});
  check_weight(where, "out_weight", w.out_weight, x, {D, D});
  check_optional_weight(where, "out_bias", w.out_bias, x, {D});

  const at::Tensor h = w.x_norm_weight.defined() ? at::layer_norm(x, {D}, w.x_norm_weight, w.x_norm_bias, 1e-5) : x;
  // The cores' matrices: W_K maps d -> heads*b*s per chunk, W_Q maps c*s -> a per (h, j_b).
  const at::Tensor w_k = rms_cap_on ? rms_cap(w.w_k, d, H * b * s) : w.w_k;
  const at::Tensor w_q = rms_cap_on ? rms_cap(w.w_q, c * s, a) : w.w_q;
  const at::Tensor keys = at::layer_norm(btt_key_transform(h, w_k, w_q, H), {D}, w.key_norm_weight, w.key_norm_bias,
                                         1e-5);                                     // B x T x H x D
  const at::Tensor v = at::linear(h, w.v_weight, w.v_bias).view_symint({B, T, H, D / H});  // B x T x H x D/H
  // The logit scale goes into the shared query (B x T x D, once) rather than to the op, which
  // keeps its scale in float32: so float64 stays exact.
  return {h * bilinear_btt_logit_scale(D, logit_scale), keys, v};
}

at::Tensor bilinear_btt_attention(const at::Tensor& x, const BilinearBTTWeights& w, int64_t num_heads,
                                  const std::string& logit_scale, bool causal, bool rms_cap_on) {
  const auto [q, k, v] = bilinear_btt_qkv(x, w, num_heads, logit_scale, rms_cap_on);
  const at::Tensor y = shared_query_attention(q, k, v, 1.0, causal);  // B x T x H x D/H
  return at::linear(y.reshape_symint(x.sym_sizes()), w.out_weight, w.out_bias);
}

BilinearQkv bilinear_mlr_qkv(const at::Tensor& x, const BilinearMLRWeights& w, int64_t num_heads,
                             const std::string& logit_scale, bool divide_by_num_levels, bool rms_cap_on) {
  const char* where = "bilinear_mlr_attention";
  check_input(where, x, 3);
  // B, T symbolic under torch.compile's dynamic shapes; D is the layer's width
  const c10::SymInt B = x.sym_size(0), T = x.sym_size(1);
  const int64_t D = x.size(2), H = num_heads;
  STRATA_CHECK_ARG(H >= 1 && D % H == 0, where, "num_heads", cat("a divisor of D = x.size(2) = ", D), H);
  check_logit_scale(where, logit_scale);
  const int64_t L = int64_t(w.w_q.size());
  STRATA_CHECK_ARG(L >= 1 && L <= 30, where, "w_q", "1 to 30 levels", L);
  STRATA_CHECK_ARG(int64_t(w.w_k.size()) == L, where, "w_k", cat(L, " levels (as w_q)"), w.w_k.size());
  const bool norm = !w.q_norm_weight.empty();
  STRATA_CHECK_ARG(!norm || int64_t(w.q_norm_weight.size()) == L, where, "q_norm_weight",
                   cat("0 or ", L, " levels (as w_q)"), w.q_norm_weight.size());
  STRATA_CHECK_ARG(int64_t(w.k_norm_weight.size()) == (norm ? L : 0), where, "k_norm_weight",
                   cat(norm ? L : 0, " levels (as q_norm_weight)"), w.k_norm_weight.size());
  STRATA_CHECK_ARG(w.q_norm_bias.empty() || (norm && int64_t(w.q_norm_bias.size()) == L), where, "q_norm_bias",
                   cat("0 or ", norm ? L : 0, " levels (as q_norm_weight)"), w.q_norm_bias.size());
  STRATA_CHECK_ARG(w.k_norm_bias.size() == w.q_norm_bias.size(), where, "k_norm_bias",
                   cat(w.q_norm_bias.size(), " levels (as q_norm_bias)"), w.k_norm_bias.size());
  check_weight(where, "v_weight", w.v_weight, x, {D, D});
  check_optional_weight(where, "v_bias", w.v_bias, x, {D});
  check_weight(where, "out_weight", w.out_weight, x, {D, D});
  check_optional_weight(where, "out_bias", w.out_bias, x, {D});

  std::vector<at::Tensor> qs, ks;  // per level: B x T x H x (r_l*p_l), q already scaled
  int64_t rank_sum = 0;
  for (int64_t l = 0; l < L; ++l) {
    const int64_t p = int64_t(1) << l;
    const std::string wq_name = cat("w_q[", l, "]"), wk_name = cat("w_k[", l, "]");
    STRATA_CHECK_ARG(D % p == 0, where, "x", cat("D = x.size(2) a multiple of p_", l + 1, " = ", p), D);
    const at::Tensor& wq = w.w_q[size_t(l)];
    STRATA_CHECK_ARG(wq.defined() && wq.dim() == 3 && wq.size(2) >= 1 && wq.size(2) % H == 0, where, wq_name.c_str(),
                     cat("a 3-D tensor p x (D/p) x (H*r) with p = ", p, ", D = ", D, ", H = ", H, ", r >= 1"),
                     describe(wq));
    const int64_t r = wq.size(2) / H;
    rank_sum += r;
    check_weight(where, wq_name.c_str(), wq, x, {p, D / p, H * r});
    check_weight(where, wk_name.c_str(), w.w_k[size_t(l)], x, {p, D / p, H * r}, " (as w_q)");
    const auto cap = [&](const at::Tensor& t) { return rms_cap_on ? rms_cap(t, D / p, H * r) : t; };
    at::Tensor q = block_diag_transform(x, cap(wq), H), k = block_diag_transform(x, cap(w.w_k[size_t(l)]), H);
    if (norm) {
      const auto at_l = [&](const std::vector<at::Tensor>& v) { return v.empty() ? at::Tensor() : v[size_t(l)]; };
      const std::string names[4] = {cat("q_norm_weight[", l, "]"), cat("k_norm_weight[", l, "]"),
                                    cat("q_norm_bias[", l, "]"), cat("k_norm_bias[", l, "]")};
      check_weight(where, names[0].c_str(), w.q_norm_weight[size_t(l)], x, {r * p});
      check_weight(where, names[1].c_str(), w.k_norm_weight[size_t(l)], x, {r * p});
      check_optional_weight(where, names[2].c_str(), at_l(w.q_norm_bias), x, {r * p});
      check_optional_weight(where, names[3].c_str(), at_l(w.k_norm_bias), x, {r * p});
      q = at::layer_norm(q, {r * p}, w.q_norm_weight[size_t(l)], at_l(w.q_norm_bias), 1e-5);
      k = at::layer_norm(k, {r * p}, w.k_norm_weight[size_t(l)], at_l(w.k_norm_bias), 1e-5);
    }
    // S = sum_l c_l q_l . k_l: c_l folded into q_l (in q's precision; the op keeps its scale in
    // float32), then one attention with scale 1.
    const double c_l = bilinear_mlr_logit_scale(r, p, logit_scale) / (divide_by_num_levels ? double(L) : 1.0);
    qs.push_back(q * c_l);
    ks.push_back(k);
  }
  STRATA_CHECK_ARG(rank_sum == D / H, where, "w_q", cat("ranks r_l = w_q[l].size(2) / H summing to D / H = ", D / H),
                   rank_sum);
  const at::Tensor v = at::linear(x, w.v_weight, w.v_bias).view_symint({B, T, H, D / H});
  return {at::cat(qs, -1), at::cat(ks, -1), v};
}

at::Tensor bilinear_mlr_attention(const at::Tensor& x, const BilinearMLRWeights& w, int64_t num_heads,
                                  const std::string& logit_scale, bool divide_by_num_levels, bool causal,
                                  bool rms_cap_on) {
  const auto [q, k, v] = bilinear_mlr_qkv(x, w, num_heads, logit_scale, divide_by_num_levels, rms_cap_on);
  AttentionArgs args;
  args.scale = 1.0;
  args.causal = causal;
  const at::Tensor y = attention(q, k, v, args);  // B x T x H x D/H
  return at::linear(y.reshape_symint(x.sym_sizes()), w.out_weight, w.out_bias);
}

// ---- BilinearBTTAttention ----

BilinearBTTAttentionImpl::BilinearBTTAttentionImpl(BilinearBTTAttentionOptions options_)
    : options(std::move(options_)) {
  const char* where = "BilinearBTTAttention";
  const int64_t E = options.embed_dim(), H = options.num_heads();
  STRATA_CHECK_ARG(E >= 1, where, "embed_dim", ">= 1", E);
  STRATA_CHECK_ARG(H >= 1 && E % H == 0, where, "num_heads", cat("a divisor of embed_dim = ", E), H);
  STRATA_CHECK_ARG(options.btt_rank() >= 1, where, "btt_rank", ">= 1", options.btt_rank());
  check_logit_scale(where, options.logit_scale());
  if (const auto& given = options.btt_shape()) {
    const BttShape& g = *given;
    STRATA_CHECK_ARG(g.a >= 1 && g.b >= 1 && g.c >= 1 && g.d >= 1 && g.a * g.b == E && g.c * g.d == E, where,
                     "btt_shape", cat("(a, b, c, d) >= 1 with a*b = c*d = embed_dim = ", E),
                     cat("(", g.a, ", ", g.b, ", ", g.c, ", ", g.d, ")"));
    shape = g;
  } else {
    shape = factorize(where, "embed_dim", "factorization", E, options.factorization());
  }
  reset();
}

void BilinearBTTAttentionImpl::reset() {
  const int64_t D = options.embed_dim(), H = options.num_heads(), s = options.btt_rank();
  const auto [a, b, c, d] = shape;
  const bool bias = options.bias();
  // The muP stds (mup_roles): W_K N(0, 1/d), W_Q N(0, 1/(c*s)).
  w_k = register_parameter("w_k", at::randn({c, d, H * b * s}) / std::sqrt(double(d)));
  w_q = register_parameter("w_q", at::randn({H * b, a, c * s}) / std::sqrt(double(c * s)));
  key_norm_weight = register_parameter("key_norm_weight", at::ones({D}));
  key_norm_bias = bias ? register_parameter("key_norm_bias", at::zeros({D})) : at::Tensor();
  x_norm_weight = options.x_layernorm() ? register_parameter("x_norm_weight", at::ones({D})) : at::Tensor();
  x_norm_bias = options.x_layernorm() && bias ? register_parameter("x_norm_bias", at::zeros({D})) : at::Tensor();
  v_proj = register_module("v_proj", ::torch::nn::Linear(::torch::nn::LinearOptions(D, D).bias(bias)));
  out_proj = register_module("out_proj", ::torch::nn::Linear(::torch::nn::LinearOptions(D, D).bias(bias)));
}

void BilinearBTTAttentionImpl::pretty_print(std::ostream& stream) const {
  stream << "strata::torch::BilinearBTTAttention(embed_dim=" << options.embed_dim()
         << ", num_heads=" << options.num_heads() << ", btt_shape=(" << shape.a << ", " << shape.b << ", " << shape.c
         << ", " << shape.d << "), btt_rank=" << options.btt_rank() << ", logit_scale=" << options.logit_scale()
         << ", bias=" << options.bias() << ", x_layernorm=" << options.x_layernorm() << ", causal=" << options.causal()
         << ", rms_cap=" << options.rms_cap() << ")";
}

BilinearBTTWeights BilinearBTTAttentionImpl::weights() const {
  return {w_k,
          w_q,
          key_norm_weight,
          key_norm_bias,
          x_norm_weight,
          x_norm_bias,
          v_proj->weight,
          v_proj->bias,
          out_proj->weight,
          out_proj->bias};
}

// x: batch x T x embed_dim, checked here so that a wrong width is named as x's.
static void check_module_input(const char* where, const at::Tensor& x, int64_t embed_dim) {
  STRATA_CHECK_ARG(x.defined() && x.dim() == 3 && x.size(2) == embed_dim, where, "x",
                   cat("a 3-D tensor (batch, seq, embed_dim = ", embed_dim, ")"),
                   x.defined() ? cat(x.dim(), "-D ", describe(x)) : describe(x));
}

at::Tensor BilinearBTTAttentionImpl::forward(const at::Tensor& x) {
  check_module_input("BilinearBTTAttention::forward", x, options.embed_dim());
  try {
    return bilinear_btt_attention(x, weights(), options.num_heads(), options.logit_scale(), options.causal(),
                                  options.rms_cap());
  } catch (const Error& e) {
    throw binding::readdressed(e, "bilinear_btt_attention", "BilinearBTTAttention::forward");
  }
}

BilinearQkv BilinearBTTAttentionImpl::qkv(const at::Tensor& x) {
  check_module_input("BilinearBTTAttention::qkv", x, options.embed_dim());
  try {
    return bilinear_btt_qkv(x, weights(), options.num_heads(), options.logit_scale(), options.rms_cap());
  } catch (const Error& e) {
    throw binding::readdressed(e, "bilinear_btt_attention", "BilinearBTTAttention::qkv");
  }
}

std::vector<std::pair<std::string, MupRole>> BilinearBTTAttentionImpl::mup_roles() const {
  const int64_t D = options.embed_dim(), cs = shape.c * options.btt_rank();
  std::vector<std::pair<std::string, MupRole>> r = {
      {"w_k", MupRole::structured_core(shape.d, 1.0 / std::sqrt(double(shape.d)))},
      {"w_q", MupRole::structured_core(cs, 1.0 / std::sqrt(double(cs)))},
      {"key_norm_weight", MupRole::gain()},
      {"v_proj.weight", MupRole::hidden(D)},
      {"out_proj.weight", MupRole::output(D)}};
  if (key_norm_bias.defined()) r.emplace_back("key_norm_bias", MupRole::bias());
  if (x_norm_weight.defined()) r.emplace_back("x_norm_weight", MupRole::gain());
  if (x_norm_bias.defined()) r.emplace_back("x_norm_bias", MupRole::bias());
  if (options.bias()) {
    r.emplace_back("v_proj.bias", MupRole::bias());
    r.emplace_back("out_proj.bias", MupRole::bias());
  }
  return r;
}

// ---- BilinearMLRAttention ----

BilinearMLRAttentionImpl::BilinearMLRAttentionImpl(BilinearMLRAttentionOptions options_)
    : options(std::move(options_)) {
  const char* where = "BilinearMLRAttention";
  const int64_t E = options.embed_dim(), H = options.num_heads();
  STRATA_CHECK_ARG(E >= 1, where, "embed_dim", ">= 1", E);
  STRATA_CHECK_ARG(H >= 1 && E % H == 0, where, "num_heads", cat("a divisor of embed_dim = ", E), H);
  const auto& ranks = options.ranks();
  const int64_t L = int64_t(ranks.size());
  STRATA_CHECK_ARG(L >= 1 && L <= 30, where, "ranks", "1 to 30 levels", L);
  int64_t sum = 0;
  for (int64_t l = 0; l < L; ++l) {
    STRATA_CHECK_ARG(ranks[size_t(l)] >= 1, where, "ranks", cat("r_l >= 1 (r_", l + 1, ")"), ranks[size_t(l)]);
    sum += ranks[size_t(l)];
  }
  STRATA_CHECK_ARG(sum == E / H, where, "ranks", cat("r_1 + .. + r_L = head_dim = embed_dim / num_heads = ", E / H),
                   sum);
  const int64_t p_last = int64_t(1) << (L - 1);
  STRATA_CHECK_ARG(E % p_last == 0, where, "embed_dim",
                   cat("a multiple of the block count 2^(L-1) = ", p_last, " of the last of L = ", L, " levels"), E);
  check_logit_scale(where, options.logit_scale());
  reset();
}

void BilinearMLRAttentionImpl::reset() {
  const int64_t D = options.embed_dim(), H = options.num_heads();
  const bool bias = options.bias(), norm = options.qk_layernorm();
  for (auto* v : {&w_q, &w_k, &q_norm_weight, &q_norm_bias, &k_norm_weight, &k_norm_bias}) v->clear();
  for (size_t i = 0; i < options.ranks().size(); ++i) {
    const int64_t p = int64_t(1) << i, r = options.ranks()[i];
    const std::string l = std::to_string(i + 1);
    const double std = 1.0 / std::sqrt(double(D / p));  // the muP std of W_l
    w_q.push_back(register_parameter("w_q_" + l, at::randn({p, D / p, H * r}) * std));
    w_k.push_back(register_parameter("w_k_" + l, at::randn({p, D / p, H * r}) * std));
    if (norm) {
      q_norm_weight.push_back(register_parameter("q_norm_weight_" + l, at::ones({r * p})));
      k_norm_weight.push_back(register_parameter("k_norm_weight_" + l, at::ones({r * p})));
      if (bias) {
        q_norm_bias.push_back(register_parameter("q_norm_bias_" + l, at::zeros({r * p})));
        k_norm_bias.push_back(register_parameter("k_norm_bias_" + l, at::zeros({r * p})));
      }
    }
  }
  v_proj = register_module("v_proj", ::torch::nn::Linear(::torch::nn::LinearOptions(D, D).bias(bias)));
  out_proj = register_module("out_proj", ::torch::nn::Linear(::torch::nn::LinearOptions(D, D).bias(bias)));
}

void BilinearMLRAttentionImpl::pretty_print(std::ostream& stream) const {
  stream << "strata::torch::BilinearMLRAttention(embed_dim=" << options.embed_dim()
         << ", num_heads=" << options.num_heads() << ", ranks=[";
  for (size_t i = 0; i < options.ranks().size(); ++i) stream << (i ? ", " : "") << options.ranks()[i];
  stream << "], logit_scale=" << options.logit_scale() << ", qk_layernorm=" << options.qk_layernorm()
         << ", bias=" << options.bias() << ", divide_by_num_levels=" << options.divide_by_num_levels()
         << ", causal=" << options.causal() << ", rms_cap=" << options.rms_cap() << ")";
}

BilinearMLRWeights BilinearMLRAttentionImpl::weights() const {
  return {w_q,
          w_k,
          q_norm_weight,
          q_norm_bias,
          k_norm_weight,
          k_norm_bias,
          v_proj->weight,
          v_proj->bias,
          out_proj->weight,
          out_proj->bias};
}

at::Tensor BilinearMLRAttentionImpl::forward(const at::Tensor& x) {
  check_module_input("BilinearMLRAttention::forward", x, options.embed_dim());
  try {
    return bilinear_mlr_attention(x, weights(), options.num_heads(), options.logit_scale(),
                                  options.divide_by_num_levels(), options.causal(), options.rms_cap());
  } catch (const Error& e) {
    throw binding::readdressed(e, "bilinear_mlr_attention", "BilinearMLRAttention::forward");
  }
}

BilinearQkv BilinearMLRAttentionImpl::qkv(const at::Tensor& x) {
  check_module_input("BilinearMLRAttention::qkv", x, options.embed_dim());
  try {
    return bilinear_mlr_qkv(x, weights(), options.num_heads(), options.logit_scale(), options.divide_by_num_levels(),
                            options.rms_cap());
  } catch (const Error& e) {
    throw binding::readdressed(e, "bilinear_mlr_attention", "BilinearMLRAttention::qkv");
  }
}

std::vector<std::pair<std::string, MupRole>> BilinearMLRAttentionImpl::mup_roles() const {
  const int64_t D = options.embed_dim();
  std::vector<std::pair<std::string, MupRole>> r = {{"v_proj.weight", MupRole::hidden(D)},
                                                    {"out_proj.weight", MupRole::output(D)}};
  for (size_t i = 0; i < options.ranks().size(); ++i) {
    const int64_t m = D >> i;  // D / p_l, the blocks' fan-in
    const MupRole core = MupRole::structured_core(m, 1.0 / std::sqrt(double(m)));
    const std::string l = std::to_string(i + 1);
    r.emplace_back("w_q_" + l, core);
    r.emplace_back("w_k_" + l, core);
    if (options.qk_layernorm()) {
      r.emplace_back("q_norm_weight_" + l, MupRole::gain());
      r.emplace_back("k_norm_weight_" + l, MupRole::gain());
      if (options.bias()) {
        r.emplace_back("q_norm_bias_" + l, MupRole::bias());
        r.emplace_back("k_norm_bias_" + l, MupRole::bias());
      }
    }
  }
  if (options.bias()) {
    r.emplace_back("v_proj.bias", MupRole::bias());
    r.emplace_back("out_proj.bias", MupRole::bias());
  }
  return r;
}

}  // namespace strata::torch
