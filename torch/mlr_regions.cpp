// torch/mlr_regions.cpp: MLR attention of the default (dyadic) geometry as a sum of dense attentions
// over key regions: the torch-ops path's fast case (torch/mlr_regions.h), for CUDA float32, where
// strata has no MLR kernel, and for the CPU with the torch-ops switch on (where it is tested).
//
// Why it is exact. With b_l = 2 b_{l+1} and every position inside one level-1 block (seq <= b_1),
// the keys query i may attend split into L disjoint regions by the finest level they share with i:
//   m < L: the other half of i's level-m block (the sibling of i's level-(m+1) block); causal: only
//          when i's half is the second (the first half's sibling is in i's future);
//   m = L: i's own level-L block (keys <= i when causal).
// On region m the score is q'_m . k'_m with q'_m = (c_1 q_1, ..., c_m q_m) / (m with level
// averaging) and k'_m = (k_1, ..., k_m): a dense attention of a tile of b_{m+1} queries against
// one tile of b_{m+1} keys, no mask (the level-L tiles causal when the call is). Each region's
// (out, lse) comes from torch's fused attention kernels that return the log-sum-exp
// (memory-efficient on CUDA, flash on the CPU), and the regions merge by their lse. The backward
// calls the same kernels' backward per region with the GLOBAL out and lse, which gives each
// region's exact share of dq, dk, dv (they recompute P = exp(S - lse) and D = rowsum(dO * O) from
// what they are given). Non-causal calls need seq == b_1 (a sibling tile past the sequence would
// need a key mask). Work (causal): (T / 2) b_{m+1} (R_m + dv) multiply-adds per level m < L and
// T b_L (d + dv) / 2 for the last, as the CPU kernel's; the general composition forms L dense
// T x T score matrices.
#include "mlr_regions.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <array>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "binding_util.h"

namespace strata::torch::torch_ops {
namespace {

using ::torch::autograd::AutogradContext;
using ::torch::autograd::variable_list;

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// The merge's and the gradients' accumulation type: float64 for float64 inputs, else float32.
at::ScalarType accumulation_type(const at::Tensor& q) {
  return q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// The kernels' head width: q, k and v padded to one width, as SDPA's own calls have them (the CPU
// flash kernel requires it), a multiple of 8 on CUDA. Zero columns add nothing to the scores, and
// v's zero columns give zero output columns (sliced off).
int64_t padded_width(bool cuda, int64_t r, int64_t dv) { return cuda ? round_up(std::max(r, dv), 8) : std::max(r, dv); }

at::Tensor pad_last(const at::Tensor& t, int64_t width) {
  const int64_t w = t.size(-1);
  return w == width ? t : at::constant_pad_nd(t, {0, width - w}, 0.0);
}

// One region's attention and its backward on torch's fused kernels (q, k: n x H x M x qk,
// v: n x H x M x v, heads first; scale 1: the level scales are in q).
struct RegionForward {
  at::Tensor out, lse, seed, offset;  // out n x H x M x v (q's dtype); lse n x H x M' (M' >= M)
};
RegionForward region_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal) {
  if (q.is_cuda()) {
    auto [o, lse, seed, offset] = at::_scaled_dot_product_efficient_attention(
        q, k, v, std::nullopt, /*compute_log_sumexp=*/true, 0.0, causal, 1.0);
    return {o, lse, seed, offset};
  }
  auto [o, lse] = at::_scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, std::nullopt, 1.0);
  return {o, lse, at::Tensor(), at::Tensor()};
}

// out (n x H x M x w) laid out as the region kernels' forward writes it: on CUDA the
// memory-efficient forward's output is an n x M x H x w buffer seen as n x H x M x w, and its
// backward reads out's rows with that stride (head_dim_value * num_heads, not out.stride(2):
// PyTorch's kernel_backward.h, Params::o_strideM) where it computes D = rowsum(dO * O) itself.
// A dense n x H x M x w out gives such kernels wrong rows of O: wrong dq / dk and reads past
// the end (seen on an H200 in bf16: dq / dk errors 0.4-2.6, an illegal address; float32's
// kernels took D from ATen, which reads any layout). The CPU kernel reads any layout.
at::Tensor kernel_layout(const at::Tensor& out) {
  if (!out.is_cuda()) return out.contiguous();
  at::Tensor bmhk = at::empty({out.size(0), out.size(2), out.size(1), out.size(3)}, out.options());
  bmhk.transpose(1, 2).copy_(out);
  return bmhk.transpose(1, 2);
}

// dq, dk, dv of one region given the merged out and lse (laid out as region_forward's).
std::array<at::Tensor, 3> region_backward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                                          const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                          const RegionForward& f, bool causal) {
  if (q.is_cuda()) {
    auto [dq, dk, dv, db] = at::_scaled_dot_product_efficient_attention_backward(
        dout, q, k, v, at::Tensor(), out, lse, f.seed, f.offset, 0.0, {true, true, true, false}, causal, 1.0);
    return {dq, dk, dv};
  }
  auto [dq, dk, dv] =
      at::_scaled_dot_product_flash_attention_for_cpu_backward(dout, q, k, v, out, lse, 0.0, causal, std::nullopt, 1.0);
  return {dq, dk, dv};
}

// The tiles of one level: `count` tiles of `size` positions, tile j starting at first + j * step.
// Level m < L: queries at first = size, keys at first = 0, step 2 size; level L: both at 0, step size.
struct Tiles {
  int64_t first, size, step, count;
  bool swap_pairs = false;  // tile j stands at j ^ 1 (non-causal keys: the sibling half-block)
};

// (B count) x H x size x w in tile order -> the same with tiles 2i and 2i + 1 swapped (self-inverse).
at::Tensor swap_tile_pairs(const at::Tensor& y, int64_t B, int64_t count) {
  const int64_t H = y.size(1), size = y.size(2), w = y.size(3);
  return y.view({B, count / 2, 2, H, size, w}).flip(2).reshape({B * count, H, size, w});
}

// x: B x H x Tp x w (Tp >= the tiles' end) -> (B count) x H x size x w, the tiles' rows (a copy).
at::Tensor gather_tiles(const at::Tensor& x, const Tiles& t) {
  const int64_t B = x.size(0), H = x.size(1), w = x.size(3);
  const at::Tensor rows = x.narrow(2, 0, t.count * t.step).view({B, H, t.count, t.step, w}).narrow(3, t.first, t.size);
  const at::Tensor tiles = rows.permute({0, 2, 1, 3, 4}).reshape({B * t.count, H, t.size, w});
  return t.swap_pairs ? swap_tile_pairs(tiles, B, t.count) : tiles;
}

// The inverse of gather_tiles into full (B x H x Tp x w): full's tile rows (+)= y's.
void scatter_tiles(at::Tensor& full, const at::Tensor& y, const Tiles& t, bool add) {
  const int64_t B = full.size(0), H = full.size(1), w = y.size(3);
  at::Tensor dst = full.narrow(2, 0, t.count * t.step)
                       .view({B, H, t.count, t.step, full.size(3)})
                       .narrow(3, t.first, t.size)
                       .narrow(4, 0, w);
  const at::Tensor src =
      (t.swap_pairs ? swap_tile_pairs(y, B, t.count) : y).view({B, t.count, H, t.size, w}).permute({0, 2, 1, 3, 4});
  if (add)
    dst.add_(src);
  else
    dst.copy_(src);
}

// The query and key tiles of level m (0-based) for a sequence of T positions, or count 0.
std::pair<Tiles, Tiles> level_tiles(const MlrRegionGeometry& g, int m, int64_t T) {
  if (m == g.levels - 1) {  // own block (causal when the call is)
    const int64_t size = g.levels == 1 ? T : g.block[m];
    const Tiles own{0, size, size, (T + size - 1) / size};
    return {own, own};
  }
  const int64_t size = g.block[m + 1];
  if (!g.causal) {  // T == b_1: every tile full; each attends to its sibling
    const int64_t count = T / size;
    return {Tiles{0, size, size, count}, Tiles{0, size, size, count, /*swap_pairs=*/true}};
  }
  const int64_t pairs = (T + size - 1) / size / 2;  // second halves holding a position < T
  return {Tiles{size, size, 2 * size, pairs}, Tiles{0, size, 2 * size, pairs}};
}

// q'_m's column scales: c_l (/ m with level averaging) for each column of levels 0..m.
at::Tensor level_query_scale(const MlrRegionGeometry& g, int m, const at::TensorOptions& opt) {
  std::vector<double> s;
  for (int l = 0; l <= m; ++l)
    for (int64_t c = 0; c < g.rank[l]; ++c) s.push_back(g.scale[l] / (g.level_average ? double(m + 1) : 1.0));
  return at::tensor(s, at::TensorOptions().dtype(at::kDouble)).to(opt.device(), opt.dtype().toScalarType());
}

// The width of levels 0..m.
int64_t prefix_rank(const MlrRegionGeometry& g, int m) {
  int64_t r = 0;
  for (int l = 0; l <= m; ++l) r += g.rank[l];
  return r;
}

// Level m's operands, tiled and padded: (q'_m query tiles, k'_m key tiles, v key tiles); scale is
// level_query_scale's (made once per level and pass: on a GPU each is a host-to-device copy).
std::array<at::Tensor, 3> level_operands(const MlrRegionGeometry& g, int m, const at::Tensor& q, const at::Tensor& k,
                                         const at::Tensor& v, const Tiles& qt, const Tiles& kt,
                                         const at::Tensor& scale) {
  const int64_t R = prefix_rank(g, m);
  const int64_t w = padded_width(q.is_cuda(), R, v.size(3));
  const at::Tensor qs = q.narrow(3, 0, R) * scale;
  return {pad_last(gather_tiles(qs, qt), w), pad_last(gather_tiles(k.narrow(3, 0, R), kt), w),
          pad_last(gather_tiles(v, kt), w)};
}

struct MlrRegionsFunction : public ::torch::autograd::Function<MlrRegionsFunction> {
  // q, k: B x H x T x d, v: B x H x T x dv (heads first, H the query heads). Returns B x H x T x dv.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q_in, const at::Tensor& k_in,
                            const at::Tensor& v_in, const MlrRegionGeometry& g) {
    const int64_t B = q_in.size(0), H = q_in.size(1), T = q_in.size(2), dv = v_in.size(3);
    const int64_t Tp = g.levels == 1 ? T : round_up(T, g.block[1]);  // every level's tiles fit
    const auto pad_seq = [&](const at::Tensor& x) {
      return Tp == T ? x : at::constant_pad_nd(x, {0, 0, 0, Tp - T}, 0.0);
    };
    const at::Tensor q = pad_seq(q_in), k = pad_seq(k_in), v = pad_seq(v_in);
    const auto acc = q.options().dtype(accumulation_type(q));
    // The running merge over levels at full positions (B x H x Tp x dv, B x H x Tp x 1); only each
    // level's query tiles are read and rewritten (lse' = logaddexp(lse, l_m), out' = out e^(lse -
    // lse') + o_m e^(l_m - lse')), so no level costs a pass over the whole sequence.
    at::Tensor out = at::zeros({B, H, Tp, dv}, acc);
    at::Tensor lse = at::full({B, H, Tp, 1}, -std::numeric_limits<double>::infinity(), acc);
    std::vector<at::Tensor> kernel_state;  // per level: philox seed, offset (CUDA; empty on the CPU)
    std::vector<int64_t> lse_width;        // per level: the kernel's lse rows (CUDA pads them)
    for (int m = 0; m < g.levels; ++m) {
      const auto [qt, kt] = level_tiles(g, m, T);
      if (qt.count == 0) continue;
      const auto [qm, km, vm] = level_operands(g, m, q, k, v, qt, kt, level_query_scale(g, m, q.options()));
      const RegionForward f =
          region_forward(qm.contiguous(), km.contiguous(), vm.contiguous(), g.causal && m == g.levels - 1);
      const at::Tensor o_m = f.out.narrow(3, 0, dv).to(acc.dtype());
      const at::Tensor l_m = f.lse.narrow(2, 0, qt.size).unsqueeze(-1).to(acc.dtype());
      const at::Tensor o_run = gather_tiles(out, qt), l_run = gather_tiles(lse, qt);
      const at::Tensor l_new = at::logaddexp(l_run, l_m);  // finite: l_m is
      scatter_tiles(out, o_run * at::exp(l_run - l_new) + o_m * at::exp(l_m - l_new), qt, false);
      scatter_tiles(lse, l_new, qt, false);
      kernel_state.push_back(f.seed.defined() ? f.seed : at::empty({0}));
      kernel_state.push_back(f.offset.defined() ? f.offset : at::empty({0}));
      lse_width.push_back(f.lse.size(2));
    }
    const at::Tensor out_q = out.to(q.scalar_type());
    ctx->save_for_backward({q, k, v, out_q, lse});
    ctx->saved_data["T"] = T;
    ctx->saved_data["geometry"] = geometry_to_ivalue(g);
    ctx->saved_data["kernel_state"] = c10::List<at::Tensor>(kernel_state);
    ctx->saved_data["lse_width"] = lse_width;
    return out_q.narrow(2, 0, T);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list s = ctx->get_saved_variables();
    const at::Tensor &q = s[0], &k = s[1], &v = s[2], &out = s[3], &lse = s[4];
    const int64_t T = ctx->saved_data["T"].toInt(), Tp = q.size(2), dv = v.size(3);
    const MlrRegionGeometry g = geometry_from_ivalue(ctx->saved_data["geometry"]);
    const c10::List<at::Tensor> state = ctx->saved_data["kernel_state"].toTensorList();
    const std::vector<int64_t> lse_width = ctx->saved_data["lse_width"].toIntVector();
    const at::Tensor dout = at::constant_pad_nd(grads[0].to(q.scalar_type()), {0, 0, 0, Tp - T}, 0.0);
    const auto acc = q.options().dtype(accumulation_type(q));
    at::Tensor dq = at::zeros(q.sizes(), acc), dk = at::zeros(k.sizes(), acc), dvv = at::zeros(v.sizes(), acc);
    size_t i = 0;  // the index of the level among those that ran
    for (int m = 0; m < g.levels; ++m) {
      const auto [qt, kt] = level_tiles(g, m, T);
      if (qt.count == 0) continue;
      const bool causal = g.causal && m == g.levels - 1;
      const at::Tensor scale = level_query_scale(g, m, q.options());
      const auto [qm, km, vm] = level_operands(g, m, q, k, v, qt, kt, scale);
      const at::Tensor qc = qm.contiguous(), kc = km.contiguous(), vc = vm.contiguous();
      // The merged lse and out in the kernel's layouts (lse rows padded to its width).
      at::Tensor lse_m = at::zeros({qc.size(0), qc.size(1), lse_width[i]}, lse.options());  // the kernels' lse type
      lse_m.narrow(2, 0, qt.size).copy_(gather_tiles(lse, qt).squeeze(-1));
      const at::Tensor out_m = kernel_layout(pad_last(gather_tiles(out, qt), vc.size(3)));
      const at::Tensor dout_m = pad_last(gather_tiles(dout, qt), vc.size(3)).contiguous();
      RegionForward f;
      if (q.is_cuda()) f = {at::Tensor(), at::Tensor(), state.get(2 * i), state.get(2 * i + 1)};
      const auto [gq, gk, gv] = region_backward(dout_m, qc, kc, vc, out_m, lse_m, f, causal);
      const int64_t R = prefix_rank(g, m);
      scatter_tiles(dq, (gq.narrow(3, 0, R) * scale).to(acc.dtype()), qt, true);
      scatter_tiles(dk, gk.narrow(3, 0, R).to(acc.dtype()), kt, true);
      scatter_tiles(dvv, gv.narrow(3, 0, dv).to(acc.dtype()), kt, true);
      ++i;
    }
    const auto back = [&](const at::Tensor& x, const at::Tensor& like) {
      return x.narrow(2, 0, T).to(like.scalar_type());
    };
    variable_list r = binding::once_differentiable({back(dq, q), back(dk, k), back(dvv, v)}, {q, k, v, grads[0]},
                                                   "strata mlr_attention (torch ops)");
    r.emplace_back();  // the geometry
    return r;
  }

  static c10::IValue geometry_to_ivalue(const MlrRegionGeometry& g) {
    std::vector<int64_t> ints{g.levels, g.level_average ? 1 : 0, g.causal ? 1 : 0};
    std::vector<double> scales;
    for (int l = 0; l < g.levels; ++l) {
      ints.push_back(g.block[l]);
      ints.push_back(g.rank[l]);
      scales.push_back(g.scale[l]);
    }
    return c10::IValue(c10::ivalue::Tuple::create({c10::IValue(ints), c10::IValue(scales)}));
  }

  static MlrRegionGeometry geometry_from_ivalue(const c10::IValue& v) {
    const auto t = v.toTuple();
    const std::vector<int64_t> ints = t->elements()[0].toIntVector();
    const std::vector<double> scales = t->elements()[1].toDoubleVector();
    MlrRegionGeometry g;
    g.levels = int(ints[0]);
    g.level_average = ints[1] != 0;
    g.causal = ints[2] != 0;
    for (int l = 0; l < g.levels; ++l) {
      g.block[l] = ints[3 + 2 * l];
      g.rank[l] = ints[4 + 2 * l];
      g.scale[l] = scales[l];
    }
    return g;
  }
};

}  // namespace

bool mlr_regions_geometry(const MlrOptions& opt, int64_t head_dim, int64_t seq_q, int64_t seq_k, const at::Tensor& q,
                          MlrRegionGeometry* g) {
  if (seq_q != seq_k || seq_k == 0 || opt.segment_starts != nullptr || opt.num_segment_starts != 0 ||
      opt.segment_offsets != nullptr)
    return false;
  const bool cuda = q.is_cuda(), cpu = q.device().is_cpu();
  const at::ScalarType t = q.scalar_type();
  // CUDA: float32 only, the one dtype seen right on a GPU. On an H200 (torch 2.11.0+cu130) the
  // memory-efficient kernel's bf16 backward returned wrong dq / dk (dv and the forward right) and
  // once an illegal address, with out passed dense n x H x M x w; the cause found after the GPU
  // was gone is kernel_layout's (out's row stride), now fixed but not yet run on a GPU: bf16 /
  // fp16 keep the composition until tools/gpu_ops_check.py passes with them here.
  // STRATA_MLR_REGIONS_CUDA_HALF=1 lets them take it, for that check (tools/gpu_ops_check.py
  // --mlr-regions-half), read once.
  static const bool half_on_cuda = [] {
    const char* e = std::getenv("STRATA_MLR_REGIONS_CUDA_HALF");
    return e != nullptr && std::string(e) == "1";
  }();
  const bool cuda_ok = t == at::kFloat || (half_on_cuda && (t == at::kBFloat16 || t == at::kHalf));
  if (!(cuda && cuda_ok) && !(cpu && (t == at::kFloat || t == at::kBFloat16 || t == at::kDouble))) return false;
  const int L = opt.num_levels;
  bool given = false;
  for (int l = 0; l < L; ++l) given = given || opt.block_sizes[l] != 0;
  const int64_t context = opt.context != 0 ? opt.context : round_up(seq_k, int64_t(1) << (L - 1));
  for (int l = 0; l < L; ++l) g->block[l] = given ? opt.block_sizes[l] : context >> l;
  for (int l = 0; l + 1 < L; ++l)
    if (g->block[l] != 2 * g->block[l + 1]) return false;        // not dyadic: the general composition
  if (g->block[L - 1] < 1 || g->block[0] < seq_k) return false;  // positions past one level-1 block
  // Non-causal: a query's sibling half-block must hold only real keys (no mask): seq == b_1.
  if (!opt.causal && g->block[0] != seq_k) return false;
  g->levels = L;
  g->causal = opt.causal;
  g->level_average = opt.level_average;
  for (int l = 0; l < L; ++l) {
    g->rank[l] = opt.ranks[l];
    g->scale[l] = mlr_level_scale(opt, l, head_dim);
  }
  return true;
}

at::Tensor mlr_regions_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const MlrRegionGeometry& g) {
  return MlrRegionsFunction::apply(q, k, v, g);
}

}  // namespace strata::torch::torch_ops
