// torch/torch_ops.cpp: the torch-ops path (strata/torch/torch_ops.h): each custom op in ATen ops,
// behind the same checks as its kernel (the core's, run on shape-only views so that any device
// passes them), and the process-wide switch. No .item() or host sync on the data: the masks are
// applied unconditionally, so a CUDA call stays asynchronous (and a meta tensor runs through: the
// boolean masks use the bitwise ops and masked_fill, which have meta kernels, not logical_* or where).
#include "strata/torch/torch_ops.h"

#include <atomic>
#include <cmath>
#include <limits>

#include "binding_util.h"
#include "mlr_regions.h"
#include "options.h"
#include "strata/error.h"

namespace strata::torch {
namespace {

std::atomic<bool> g_use_torch_ops{false};
std::atomic<bool> g_use_mlr_regions{true};

using binding::cat;
using binding::torch_dtype_name;

constexpr double kInf = std::numeric_limits<double>::infinity();

// q, k, v checked as the kernels check them (strata/checks.h), on any device: q's dtype one of the
// kernels' or the reference's, k and v of q's dtype and on q's device.
AttnDims checked_qkv(const char* where, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, Layout l,
                     bool self_attention, HeadGroups groups) {
  const TensorView qv = shape_view_of(q, where, "q", kReferenceDTypes);
  const DTypes same{qv.dtype};
  const TensorView kv = shape_view_of(k, where, "k", same, " (same as q)");
  const TensorView vv = shape_view_of(v, where, "v", same, " (same as q)");
  for (const auto& [t, arg] : {std::pair{&k, "k"}, std::pair{&v, "v"}})
    STRATA_CHECK_ARG(t->device() == q.device(), where, arg, cat("a tensor on ", q.device().str(), " (as q)"),
                     cat("a tensor on ", t->device().str()));
  return check_qkv(where, qv, kv, vv, l, kReferenceDTypes, self_attention, groups);
}

// A tensor of logical dims (b, s, h, d) in layout l as b x h x s x d (a view).
at::Tensor heads_first(const at::Tensor& t, Layout l) { return l == Layout::BSHD ? t.transpose(1, 2) : t; }

// b x h x s x d back to layout l (a view).
at::Tensor from_heads_first(const at::Tensor& t, Layout l) { return heads_first(t, l); }

// t: b x h x s x d -> b x H x s x d, head g of the result reading head g / (H / h) of t (GQA's kv
// heads, a shared query's heads; strata/attention.h). H a multiple of h.
at::Tensor expand_heads(const at::Tensor& t, int64_t H) {
  const int64_t h = t.size(1);
  if (h == H) return t;
  return t.unsqueeze(2)
      .expand({t.size(0), h, H / h, t.size(2), t.size(3)})
      .reshape({t.size(0), H, t.size(2), t.size(3)});
}

// An operand for SDPA off the CPU: expand_heads' broadcast (a zero stride over heads) made dense.
// cuDNN's attention, which SDPA picks for bf16 / fp16 on Hopper, refuses such a layout ("the
// stride for the last dimension ... should be 1"; seen on an H200 with a shared query, heads_q = 1);
// the copy is H x seq x d, small beside the attention itself. CPU operands stay views.
at::Tensor sdpa_operand(const at::Tensor& t) {
  if (t.device().is_cpu()) return t;
  for (int64_t i = 0; i < t.dim(); ++i)
    if (t.stride(i) == 0 && t.size(i) > 1) return t.contiguous();
  return t;
}

// The logit scale as the kernels take it: given ones rounded to float32, else 1/sqrt(head_dim).
double logit_scale(float scale, int64_t head_dim) {
  return std::isnan(scale) ? 1.0 / std::sqrt(double(head_dim)) : double(scale);
}

// (query positions p_i = i + seq_k - seq_q as seq_q x 1, key positions j as 1 x seq_k), int64 on `dev`.
std::pair<at::Tensor, at::Tensor> positions(int64_t seq_q, int64_t seq_k, at::Device dev) {
  const auto opt = at::TensorOptions().dtype(at::kLong).device(dev);
  return {at::arange(seq_q, opt).add(seq_k - seq_q).unsqueeze(1), at::arange(seq_k, opt).unsqueeze(0)};
}

// softmax_j(scores) @ v over the allowed keys, a row with none giving zeros and zero gradients
// (the kernels' convention). scores: ... x seq_q x seq_k; allowed broadcastable to it; v: ... x
// seq_k x dv.
at::Tensor masked_softmax_pv(const at::Tensor& scores, const at::Tensor& allowed, const at::Tensor& v) {
  const at::Tensor row_ok = allowed.any(-1, /*keepdim=*/true);
  // Rows with no allowed key: finite logits in, zeros out (masked_fill passes no gradient back).
  const at::Tensor s = scores.masked_fill(allowed.bitwise_not(), -kInf).masked_fill(row_ok.bitwise_not(), 0.0);
  return at::matmul(at::softmax(s, -1).masked_fill(row_ok.bitwise_not(), 0.0), v);
}

}  // namespace

void set_use_torch_ops(bool on) { g_use_torch_ops.store(on); }
bool use_torch_ops() { return g_use_torch_ops.load(); }
void set_use_mlr_regions(bool on) { g_use_mlr_regions.store(on); }
bool use_mlr_regions() { return g_use_mlr_regions.load(); }
bool takes_torch_ops(const at::Tensor& t) { return use_torch_ops() || (t.defined() && !t.device().is_cpu()); }

namespace torch_ops {

// ---- dense attention ---------------------------------------------------------------------------

at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const AttentionArgs& a) {
  const char* where = "attention";
  const Layout l = binding::parse_layout(where, a.layout);
  const AttnDims d = checked_qkv(where, q, k, v, l, /*self_attention=*/false, HeadGroups::gqa_or_shared_q);
  const AttentionOptions opt = binding::attention_options(where, a, l, d.dtype, /*any_device=*/true);
  validate(where, opt, d);
  const int64_t H = d.heads();
  const at::Device dev = q.device();
  if (d.seqlen_k == 0)  // no key: every row is empty (SDPA has no answer for it)
    return from_heads_first(at::zeros({d.batch, H, d.seqlen_q, d.head_dim_v}, q.options()), l);

  // The allowed (query, key) pairs (strata/attention.h, "Mask"): batch|1 x 1 x seq_q x seq_k. The
  // positions only when a causal or window mask needs them (two kernels less per plain call).
  // A square causal-only call builds no mask at all (SDPA's is_causal, below).
  // Windows as the kernels take them: p - window_left / p + window_right overflow for a window near
  // 2^63 (a user's "no bound"); strata::effective_window makes such a window unbounded.
  const int64_t window_left = effective_window(a.window_left, d.seqlen_q, d.seqlen_k);
  const int64_t window_right = effective_window(a.window_right, d.seqlen_q, d.seqlen_k);
  const bool causal_only = a.causal && d.seqlen_q == d.seqlen_k && window_left < 0 && window_right < 0 &&
                           opt.key_padding_mask.data == nullptr && opt.bias.data == nullptr;
  const bool positional = !causal_only && (a.causal || window_left >= 0 || window_right >= 0);
  const auto [p, j] = positional ? positions(d.seqlen_q, d.seqlen_k, dev) : std::pair<at::Tensor, at::Tensor>{};
  at::Tensor allowed;
  const auto restrict_to = [&](const at::Tensor& m) { allowed = allowed.defined() ? allowed.bitwise_and(m) : m; };
  if (a.causal && !causal_only) restrict_to(j.le(p));
  if (window_left >= 0 || window_right >= 0) {
    at::Tensor win = at::ones({d.seqlen_q, d.seqlen_k}, at::TensorOptions().dtype(at::kBool).device(dev));
    if (window_left >= 0) win = win.bitwise_and(j.ge(p - window_left));
    if (window_right >= 0) win = win.bitwise_and(j.le(p + window_right));
    if (a.num_global > 0)  // global tokens waive the window (causal still applies)
      win = win.bitwise_or(j.lt(a.num_global)).bitwise_or(p.ge(0).bitwise_and(p.lt(a.num_global)));
    restrict_to(win);
  }
  if (allowed.defined()) allowed = allowed.view({1, 1, d.seqlen_q, d.seqlen_k});
  if (opt.key_padding_mask.data != nullptr)
    restrict_to(a.key_padding_mask->to(dev).ne(0).view({d.batch, 1, 1, d.seqlen_k}));
  at::Tensor bias;  // 4-D, q's dtype
  if (opt.bias.data != nullptr) {
    bias = a.bias->to(dev, q.scalar_type());
    while (bias.dim() < 4) bias = bias.unsqueeze(0);
    restrict_to(bias.ne(-kInf));  // a key whose bias is -inf is not attended (as the kernel's)
  }

  const double scale = logit_scale(opt.scale, d.head_dim);
  const at::Tensor qh = sdpa_operand(expand_heads(heads_first(q, l), H)),
                   kh = sdpa_operand(expand_heads(heads_first(k, l), H)),
                   vh = sdpa_operand(expand_heads(heads_first(v, l), H));
  at::Tensor out;
  if (!allowed.defined()) {
    // No mask tensor: on CUDA, SDPA can then pick its flash / memory-efficient kernels (every row
    // has a key under a square causal mask, so the empty-row convention does not arise).
    out = at::scaled_dot_product_attention(qh, kh, vh, {}, 0.0, causal_only, scale);
  } else {
    // The additive mask (SDPA makes one of a boolean mask too): the bias (or 0) where allowed, -inf
    // elsewhere, broadcast to both shapes. A row with no allowed key attends to every key with 0
    // (finite: no NaN in the backward) and is zeroed after.
    const at::Tensor row_ok = allowed.any(-1, /*keepdim=*/true);
    at::Tensor mask =
        at::zeros(allowed.sizes(), q.options().requires_grad(false)).masked_fill(allowed.bitwise_not(), -kInf);
    if (bias.defined()) mask = mask + bias;
    mask = mask.masked_fill(row_ok.bitwise_not(), 0.0);
    out = at::scaled_dot_product_attention(qh, kh, vh, mask, 0.0, false, scale).masked_fill(row_ok.bitwise_not(), 0.0);
  }
  return from_heads_first(out, l);
}

at::Tensor paper_gswa_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t split_a,
                                int64_t window, std::optional<double> scale_a, std::optional<double> scale_b,
                                const std::string& layout) {
  return binding::paper_gswa_of(&attention, q, k, v, split_a, window, scale_a, scale_b, layout);
}

// ---- MLR attention -----------------------------------------------------------------------------

at::Tensor mlr_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const MlrArgs& a) {
  const char* where = "mlr_attention";
  const Layout l = binding::parse_layout(where, a.layout);
  const AttnDims d = checked_qkv(where, q, k, v, l, /*self_attention=*/false, HeadGroups::gqa);
  const binding::MlrResolved r = binding::mlr_options(where, a, l, d.batch, /*any_device=*/true);
  validate(where, r.opt, d);
  const int64_t L = r.opt.num_levels, Nq = d.seqlen_q, Nk = d.seqlen_k;
  const at::Device dev = q.device();
  // The common case (the default dyadic blocks, seq within the context; non-causal: seq == context)
  // without the T x T score matrices: dense attentions over key regions, merged by their lse (mlr_regions.h).
  if (MlrRegionGeometry g; use_mlr_regions() && mlr_regions_geometry(r.opt, d.head_dim, Nq, Nk, q, &g))
    return from_heads_first(mlr_regions_attention(heads_first(q, l), expand_heads(heads_first(k, l), d.heads_q),
                                                  expand_heads(heads_first(v, l), d.heads_q), g),
                            l);

  // Block starts of every position a query or key takes (queries may sit below 0): seqs x L x count,
  // seqs = batch with per-sequence segment lists, else 1 (broadcast over the batch).
  const int64_t first = std::min<int64_t>(0, Nk - Nq), count = Nk - first;
  at::Tensor starts = at::empty({std::max<int64_t>(d.batch, 1), L, count}, at::TensorOptions().dtype(at::kLong));
  const int64_t seqs =
      mlr_block_starts(where, r.opt, d.head_dim, Nk, d.batch, first, count, starts.data_ptr<int64_t>());
  starts = starts.narrow(0, 0, seqs).to(dev);
  // same[s, l, i, j]: query i and key j share level l (seqs x L x seq_q x seq_k)
  const at::Tensor same =
      starts.narrow(2, Nk - Nq - first, Nq).unsqueeze(-1).eq(starts.narrow(2, -first, Nk).unsqueeze(-2));

  // S = sum over shared levels of c_l q_l . k_l  (batch x heads_q x seq_q x seq_k)
  const at::Tensor qh = heads_first(q, l), kh = expand_heads(heads_first(k, l), d.heads_q),
                   vh = expand_heads(heads_first(v, l), d.heads_q);
  at::Tensor scores;
  int64_t off = 0;
  for (int64_t lv = 0; lv < L; ++lv) {
    const int64_t rank = r.opt.ranks[lv];
    const at::Tensor prod = at::matmul(qh.narrow(-1, off, rank), kh.narrow(-1, off, rank).transpose(-1, -2)) *
                            mlr_level_scale(r.opt, int(lv), d.head_dim);
    const at::Tensor term = prod.masked_fill(same.select(1, lv).unsqueeze(1).bitwise_not(), 0.0);
    scores = scores.defined() ? scores + term : term;
    off += rank;
  }
  const at::Tensor shared = same.sum(1, /*keepdim=*/false).unsqueeze(1);  // m(p_i, j): seqs x 1 x seq_q x seq_k
  if (r.opt.level_average)                                                // S /= m, 0 where no level is shared
    scores = (scores / shared.clamp_min(1).to(scores.scalar_type())).masked_fill(shared.eq(0), 0.0);
  const auto [p, j] = positions(Nq, Nk, dev);
  at::Tensor allowed = r.opt.causal ? j.le(p).view({1, 1, Nq, Nk})
                                    : at::ones({1, 1, Nq, Nk}, at::TensorOptions().dtype(at::kBool).device(dev));
  if (r.opt.mask_cross_segment) allowed = allowed.bitwise_and(shared.gt(0));
  return from_heads_first(masked_softmax_pv(scores, allowed, vh), l);
}

// ---- structured operators ----------------------------------------------------------------------
namespace {

// Chunk k of a width n cut into p chunks: [floor(k n / p), floor((k+1) n / p)) (strata/structured.h).
int64_t chunk_start(int64_t k, int64_t n, int64_t p) { return k * n / p; }

// One stage: x (rows x n_in) -> rows x n_out, chunk k of x times w[k] (w: p|1 x max in_k x max
// out_k, chunk input -> chunk output; one shared block broadcast over the chunks). Unequal chunks are
// gathered into a zero-padded rows x p x max in_k (the padding of w multiplies zeros, and its outputs
// are not gathered back: it gets zero gradient; it is zeroed first so that it is never read).
at::Tensor stage(const at::Tensor& x, int64_t n_in, int64_t n_out, int64_t p, const at::Tensor& w) {
  const int64_t rows = x.size(0), mi = w.size(1), mo = w.size(2);
  const at::Tensor wp = w.size(0) == p ? w : w.expand({p, mi, mo});
  if (n_in == p * mi && n_out == p * mo)  // equal chunks, no padding
    return at::einsum("rpi,pio->rpo", {x.reshape({rows, p, mi}), wp}).reshape({rows, n_out});
  const auto lopt = at::TensorOptions().dtype(at::kLong);
  at::Tensor in_idx = at::full({p, mi}, n_in, lopt), out_idx = at::empty({n_out}, lopt);
  at::Tensor valid = at::zeros({p, mi, mo}, at::TensorOptions().dtype(at::kBool));
  for (int64_t k = 0; k < p; ++k) {
    const int64_t i0 = chunk_start(k, n_in, p), i1 = chunk_start(k + 1, n_in, p);
    const int64_t o0 = chunk_start(k, n_out, p), o1 = chunk_start(k + 1, n_out, p);
    in_idx[k].narrow(0, 0, i1 - i0).copy_(at::arange(i0, i1, lopt));
    out_idx.narrow(0, o0, o1 - o0).copy_(at::arange(o1 - o0, lopt).add(k * mo));
    valid[k].narrow(0, 0, i1 - i0).narrow(1, 0, o1 - o0).fill_(true);
  }
  const at::Device dev = x.device();
  const at::Tensor x_pad =
      at::cat({x, at::zeros({rows, 1}, x.options())}, 1).index_select(1, in_idx.flatten().to(dev)).view({rows, p, mi});
  const at::Tensor w_read = wp.masked_fill(valid.to(dev).bitwise_not(), 0.0);
  return at::einsum("rpi,pio->rpo", {x_pad, w_read}).reshape({rows, p * mo}).index_select(1, out_idx.to(dev));
}

// A permutation list as an index tensor on dev.
at::Tensor index_of(const std::vector<int64_t>& perm, at::Device dev) {
  return at::tensor(perm, at::TensorOptions().dtype(at::kLong)).to(dev);
}

}  // namespace

at::Tensor structured_linear(const StructuredSpec& spec, const at::Tensor& x, const std::vector<at::Tensor>& factors) {
  const char* where = "structured_linear";
  validate(where, spec);
  STRATA_CHECK_ARG(x.defined() && x.dim() >= 1 && x.size(-1) == spec.in, where, "x",
                   cat("a tensor (..., ", spec.in, ")"),
                   x.defined() ? cat(x.sizes()) : std::string("an undefined tensor"));
  const TensorView xv = shape_view_of(x, where, "x", kReferenceDTypes);
  const auto shapes = structured_factor_shapes(spec);
  STRATA_CHECK_ARG(factors.size() == shapes.size(), where, "factors",
                   cat(shapes.size(), " tensors (structured_factor_shapes)"), factors.size());
  for (size_t i = 0; i < factors.size(); ++i) {
    const std::string arg = cat("factors[", i, "]");
    shape_view_of(factors[i], where, arg.c_str(), DTypes{xv.dtype}, " (same as x)");
    STRATA_CHECK_ARG(factors[i].sizes() == at::IntArrayRef(shapes[i]) && factors[i].device() == x.device(), where,
                     arg.c_str(), cat("shape ", at::IntArrayRef(shapes[i]), " on ", x.device().str(), " (x's)"),
                     cat(factors[i].sizes(), " on ", factors[i].device().str()));
  }
  std::vector<int64_t> lead = x.sizes().vec();
  lead.back() = spec.out;
  const at::Tensor rows = x.reshape({-1, spec.in});
  at::Tensor y;
  size_t fi = 0;
  for (const StructuredLevel& lv : spec.levels) {
    at::Tensor z = rows;  // rows x in -> rows x inner
    if (lv.right.kind != StageKind::identity) z = stage(z, spec.in, lv.inner, lv.right.blocks, factors[fi++]);
    if (!lv.inner_perm.empty()) z = z.index_select(1, index_of(lv.inner_perm, x.device()));
    // The left factor is stored out x inner per chunk: transposed, it is the stage's in x out.
    if (lv.left.kind != StageKind::identity)
      z = stage(z, lv.inner, spec.out, lv.left.blocks, factors[fi++].transpose(1, 2));
    if (!lv.out_perm.empty()) z = z.index_select(1, index_of(lv.out_perm, x.device()));
    const at::Tensor term = lv.alpha == 1.0 ? z : z * lv.alpha;
    y = y.defined() ? y + term : term;
  }
  return y.reshape(lead);
}

// ---- MonarchAttention --------------------------------------------------------------------------

at::Tensor monarch_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const MonarchArgs& a) {
  const char* where = "monarch_attention";
  const MonarchOptions opt = binding::monarch_options(where, a, /*any_device=*/true);
  const AttnDims d = checked_qkv(where, q, k, v, opt.layout, /*self_attention=*/true, HeadGroups::gqa);
  validate(where, opt, d);
  STRATA_CHECK_ARG(opt.mode == MonarchMode::stable, where, "mode",
                   "\"stable\" (the torch-ops path has no reference mode; it runs on the CPU kernel)",
                   monarch_mode_name(opt.mode));
  STRATA_CHECK_ARG(opt.key_padding_mask.data == nullptr, where, "key_padding_mask",
                   "none (the torch-ops path has no key padding mask; it runs on the CPU kernel)", "a mask");
  const int64_t N = d.seqlen_q, Hq = d.heads_q;
  const Layout l = opt.layout;
  if (N == 0) return from_heads_first(at::zeros({d.batch, Hq, 0, d.head_dim_v}, q.options()), l);
  const MonarchGeometry g = monarch_geometry(N, opt);
  const int64_t BH = d.batch * Hq, B = g.block_size, M = g.num_blocks, P = g.padded_len, front = g.pad_front;
  const double sc = logit_scale(opt.scale, d.head_dim);
  const at::TensorOptions real = q.options().requires_grad(false);
  // Index names as strata/monarch.h: block k / l, offset j / i. a, c are indexed [k][j]; al, cl, L [j][...].
  const auto blocks = [&](const at::Tensor& x) {  // BH x M x B x dim, zero-padded at the front / end
    at::Tensor y = expand_heads(heads_first(x, l), Hq).reshape({BH, N, x.size(3)});
    if (P > N) y = at::constant_pad_nd(y, {0, 0, front, P - N - front});
    return y.reshape({BH, M, B, y.size(2)});
  };
  const at::Tensor qb = blocks(q), kb = blocks(k), vb = blocks(v);
  // The padding masks only where there is padding (P > N): unpadded calls (the common case) skip
  // their kernels, as they skip c = 1 at the first step (a GPU runs these small steps launch-bound).
  const bool padded = P > N;
  at::Tensor key_ok, w;  // [k][.][i] real keys; query weights at [j][l] (padded calls only)
  if (padded) {
    const at::Tensor pos = at::arange(P, real.dtype(at::kLong));
    const at::Tensor valid = pos.ge(front).bitwise_and(pos.lt(front + N)).reshape({M, B});  // token m*B+j is real
    key_ok = valid.reshape({1, M, 1, B});
    w = valid.to(q.scalar_type()).t().reshape({1, B, M, 1});
  }
  const at::Tensor qT = qb.transpose(1, 2);  // [j][l] x D
  at::Tensor am = qb, c;                     // c undefined: 1 (the first step)
  for (int64_t t = 0;; ++t) {
    // R-step: R_k[j, i] = softmax_i(sc * a[k,j].k_{kB+i} / c[k,j]) over block k's real keys.
    at::Tensor s = at::matmul(am, kb.transpose(-1, -2));
    s = c.defined() ? s * (sc / c).unsqueeze(-1) : s * sc;
    if (padded) s = s.masked_fill(key_ok.bitwise_not(), -kInf);
    const at::Tensor logR = at::log_softmax(s, -1), R = logR.exp();
    const at::Tensor al = (at::matmul(R, kb) * sc).transpose(1, 2);  // [j][k] x D
    // R log R with 0 log 0 = 0 (padded keys), without a NaN gradient through the -inf.
    const at::Tensor cl =
        (R * (padded ? logR.masked_fill(key_ok.bitwise_not(), 0.0) : logR)).sum(-1).transpose(1, 2);  // [j][k]
    // L-step: L_j[l, k] = softmax_k(q_{lB+j}.al[j,k] - cl[j,k]).
    const at::Tensor Lm = at::softmax(at::matmul(qT, al.transpose(-1, -2)) - cl.unsqueeze(-2), -1);  // [j][l][k]
    if (t + 1 == opt.num_steps) {
      const at::Tensor y = at::matmul(R, vb).transpose(1, 2);  // [j][k] x Dv
      const at::Tensor o = at::matmul(Lm, y).transpose(1, 2).reshape({d.batch, Hq, P, d.head_dim_v});
      return from_heads_first(o.narrow(2, front, N), l);
    }
    const at::Tensor Lw = padded ? Lm * w : Lm;
    am = at::matmul(Lw.transpose(-1, -2), qT).transpose(1, 2);  // [k][j] x D
    c = Lw.sum(-2).transpose(1, 2);                             // [k][j]
  }
}

}  // namespace torch_ops
}  // namespace strata::torch
