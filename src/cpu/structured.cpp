// src/cpu/structured.cpp: the structured operators' specs (named constructors, validation,
// queries) and the public entry points: argument checks (every error names the argument), factors
// -> contiguous fp32, TensorView -> StructuredParams, ISA dispatch. Semantics: strata/structured.h.
#include "strata/structured.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "cpu/structured_params.h"
#include "strata/threading.h"

namespace strata {
namespace {

using cpu::StageParams;
using cpu::StructuredLevelParams;
using cpu::StructuredParams;

inline int64_t chunk_at(int64_t n, int64_t p, int64_t k) { return k * n / p; }
// Largest chunk of a width n split in p chunks.
inline int64_t max_chunk(int64_t n, int64_t p) { return (n + p - 1) / p; }

std::string field(int l, const char* name) { return detail::cat("spec.levels[", l, "].", name); }

// The transpose of a (rows, cols) reshape as a permutation: new index j * rows + i takes old
// index i * cols + j.
std::vector<int64_t> reshape_transpose(int64_t rows, int64_t cols) {
  std::vector<int64_t> perm(size_t(rows * cols));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) perm[size_t(j * rows + i)] = i * cols + j;
  return perm;
}

void check_perm(const char* where, const std::vector<int64_t>& perm, int64_t n, const std::string& arg) {
  if (perm.empty()) return;
  STRATA_CHECK_ARG(int64_t(perm.size()) == n, where, arg.c_str(), detail::cat("empty or ", n, " indices"),
                   perm.size());
  std::vector<char> seen(size_t(n), 0);
  for (size_t i = 0; i < perm.size(); ++i) {
    const int64_t v = perm[i];
    STRATA_CHECK_ARG(v >= 0 && v < n && !seen[size_t(v)], where, arg.c_str(),
                     detail::cat("a permutation of [0, ", n, ")"),
                     detail::cat("index ", v, " at position ", i, v >= 0 && v < n ? " (repeated)" : ""));
    seen[size_t(v)] = 1;
  }
}

// A stage from width n_in to n_out: block count, shared chunks equal, identity widths equal.
void check_stage(const char* where, const StructuredStage& s, int64_t n_in, int64_t n_out, const std::string& arg) {
  STRATA_CHECK_ARG(s.kind == StageKind::blocks || s.kind == StageKind::shared || s.kind == StageKind::identity,
                   where, (arg + ".kind").c_str(), "blocks, shared or identity", int(s.kind));
  if (s.kind == StageKind::identity) {
    STRATA_CHECK_ARG(n_in == n_out, where, (arg + ".kind").c_str(),
                     detail::cat("an identity stage between equal widths"), detail::cat(n_in, " -> ", n_out));
    return;
  }
  STRATA_CHECK_ARG(s.blocks >= 1 && s.blocks <= std::min(n_in, n_out), where, (arg + ".blocks").c_str(),
                   detail::cat("1..", std::min(n_in, n_out), " (at most the widths ", n_in, " -> ", n_out, ")"),
                   s.blocks);
  if (s.kind == StageKind::shared)
    STRATA_CHECK_ARG(n_in % s.blocks == 0 && n_out % s.blocks == 0, where, (arg + ".blocks").c_str(),
                     detail::cat("a divisor of both widths ", n_in, " and ", n_out, " (shared blocks are equal)"),
                     s.blocks);
}

// Whether level lv runs multiplied out (see strata/structured.h).
bool multiplied_out(const StructuredSpec& spec, const StructuredLevel& lv) {
  if (!lv.inner_perm.empty() || lv.right.kind != StageKind::blocks || lv.left.kind != StageKind::blocks ||
      lv.right.blocks != lv.left.blocks)
    return false;
  const int64_t p = lv.right.blocks;
  double product = 0, factored = 0;
  for (int64_t k = 0; k < p; ++k) {
    const double ni = double(chunk_at(spec.in, p, k + 1) - chunk_at(spec.in, p, k));
    const double no = double(chunk_at(spec.out, p, k + 1) - chunk_at(spec.out, p, k));
    const double m = double(chunk_at(lv.inner, p, k + 1) - chunk_at(lv.inner, p, k));
    product += ni * no;
    factored += m * (ni + no);
  }
  return product < factored;
}

// Entries of a stage's storage {blocks or 1, rows, cols} (right: rows = input chunk; left: rows =
// output chunk; cols = inner chunk).
std::vector<int64_t> stage_shape(const StructuredStage& s, int64_t rows_width, int64_t inner) {
  const int64_t p = s.blocks;
  return {s.kind == StageKind::shared ? 1 : p, max_chunk(rows_width, p), max_chunk(inner, p)};
}

// Generic rank of one stage: sum over chunks of min(chunk in, chunk out).
int64_t stage_rank(const StructuredStage& s, int64_t a, int64_t b) {
  if (s.kind == StageKind::identity) return a;
  int64_t r = 0;
  for (int64_t k = 0; k < s.blocks; ++k)
    r += std::min(chunk_at(a, s.blocks, k + 1) - chunk_at(a, s.blocks, k),
                  chunk_at(b, s.blocks, k + 1) - chunk_at(b, s.blocks, k));
  return r;
}

}  // namespace

const char* stage_kind_name(StageKind k) {
  switch (k) {
    case StageKind::blocks: return "blocks";
    case StageKind::shared: return "shared";
    case StageKind::identity: return "identity";
  }
  return "?";
}

// ---- Specs ------------------------------------------------------------------------------------

// The largest width (2^31) and factor storage (2^36 entries in all: a 256 GiB fp32 operator, past
// any machine this runs on) validate accepts. Every count derived from a spec then fits int64 with
// room to spare (chunk_at's k * n < 2^62; params, storage, FLOPs, workspaces): a hand-built inner
// width of 2^61 had wrapped params() to 0 (issue 48 item 4).
constexpr int64_t kMaxStructuredWidth = int64_t(1) << 31;
constexpr int64_t kMaxStructuredSize = int64_t(1) << 36;

// a * b for a named constructor's sizes (each >= 1), or strata::Error naming arg when the product
// overflows int64 (validate then bounds what fits).
int64_t checked_mul(const char* where, const char* arg, int64_t a, int64_t b) {
  int64_t r = 0;
  STRATA_CHECK_ARG(!__builtin_mul_overflow(a, b, &r), where, arg, "sizes whose product fits int64",
                   detail::cat(a, " x ", b));
  return r;
}

// Entries of a stage's storage {blocks or 1, rows, cols} as an unbounded integer (no wrap).
unsigned __int128 stage_storage(const StructuredStage& s, int64_t a, int64_t b) {
  if (s.kind == StageKind::identity) return 0;
  const auto p = (unsigned __int128)(s.kind == StageKind::shared ? 1 : s.blocks);
  return p * (unsigned __int128)max_chunk(a, s.blocks) * (unsigned __int128)max_chunk(b, s.blocks);
}

void validate(const char* where, const StructuredSpec& spec) {
  const std::string width_bound = detail::cat("a width in 1..2^31 = ", kMaxStructuredWidth);
  STRATA_CHECK_ARG(spec.in >= 1 && spec.in <= kMaxStructuredWidth, where, "spec.in", width_bound, spec.in);
  STRATA_CHECK_ARG(spec.out >= 1 && spec.out <= kMaxStructuredWidth, where, "spec.out", width_bound, spec.out);
  STRATA_CHECK_ARG(!spec.levels.empty() && spec.levels.size() <= 64, where, "spec.levels", "1..64 levels",
                   spec.levels.size());
  unsigned __int128 storage = 0;
  for (int l = 0; l < int(spec.levels.size()); ++l) {
    const StructuredLevel& lv = spec.levels[size_t(l)];
    STRATA_CHECK_ARG(lv.inner >= 1 && lv.inner <= kMaxStructuredWidth, where, field(l, "inner").c_str(), width_bound,
                     lv.inner);
    STRATA_CHECK_ARG(std::isfinite(lv.alpha), where, field(l, "alpha").c_str(), "a finite number", lv.alpha);
    check_stage(where, lv.right, spec.in, lv.inner, field(l, "right"));
    check_stage(where, lv.left, lv.inner, spec.out, field(l, "left"));
    check_perm(where, lv.inner_perm, lv.inner, field(l, "inner_perm"));
    check_perm(where, lv.out_perm, spec.out, field(l, "out_perm"));
    storage += stage_storage(lv.right, spec.in, lv.inner) + stage_storage(lv.left, spec.out, lv.inner);
    STRATA_CHECK_ARG(storage <= (unsigned __int128)kMaxStructuredSize, where, field(l, "inner").c_str(),
                     detail::cat("factors of at most 2^36 = ", kMaxStructuredSize, " entries in all (levels 0..", l,
                                 ")"),
                     detail::cat("widths in ", spec.in, ", inner ", lv.inner, ", out ", spec.out));
  }
}

StructuredSpec low_rank_spec(int64_t in, int64_t out, int64_t rank) {
  STRATA_CHECK_ARG(rank >= 1, "low_rank_spec", "rank", ">= 1", rank);
  StructuredSpec s{"low_rank", in, out, {}};
  s.levels.push_back({rank, {StageKind::blocks, 1}, {StageKind::blocks, 1}, {}, {}, 1.0});
  validate("low_rank_spec", s);
  return s;
}

StructuredSpec block_diagonal_spec(int64_t in, int64_t out, int64_t blocks) {
  StructuredSpec s{"block_diagonal", in, out, {}};
  s.levels.push_back({out, {StageKind::blocks, blocks}, {StageKind::identity, 1}, {}, {}, 1.0});
  STRATA_CHECK_ARG(blocks >= 1 && blocks <= std::min(in, out), "block_diagonal_spec", "blocks",
                   detail::cat("1..min(in, out) = ", std::min(in, out)), blocks);
  validate("block_diagonal_spec", s);
  return s;
}

StructuredSpec mlr_spec(int64_t dim, const std::vector<int64_t>& ranks, std::vector<int64_t> blocks) {
  const char* where = "mlr_spec";
  STRATA_CHECK_ARG(!ranks.empty() && ranks.size() <= 16, where, "ranks", "1..16 levels", ranks.size());
  if (blocks.empty())
    for (size_t l = 0; l < ranks.size(); ++l) blocks.push_back(int64_t(1) << l);
  STRATA_CHECK_ARG(blocks.size() == ranks.size(), where, "blocks", detail::cat("one per level (", ranks.size(), ")"),
                   blocks.size());
  StructuredSpec s{"mlr", dim, dim, {}};
  for (size_t l = 0; l < ranks.size(); ++l) {
    STRATA_CHECK_ARG(ranks[l] >= 1, where, detail::cat("ranks[", l, "]").c_str(), ">= 1", ranks[l]);
    STRATA_CHECK_ARG(blocks[l] >= 1 && blocks[l] <= dim, where, detail::cat("blocks[", l, "]").c_str(),
                     detail::cat("1..dim = ", dim), blocks[l]);
    const int64_t p = blocks[l];
    s.levels.push_back({checked_mul(where, "ranks", ranks[l], p), {StageKind::blocks, p}, {StageKind::blocks, p}, {}, {}, 1.0});
  }
  validate(where, s);
  return s;
}

BttShape btt_factorize(int64_t in, int64_t out_per_head, BttFactorize rule) {
  const char* where = "btt_factorize";
  STRATA_CHECK_ARG(in >= 1, where, "in", ">= 1", in);
  STRATA_CHECK_ARG(out_per_head >= 1, where, "out_per_head", ">= 1", out_per_head);
  STRATA_CHECK_ARG(rule == BttFactorize::reference || rule == BttFactorize::balanced, where, "rule",
                   "reference or balanced", int(rule));
  // (small, big) with small * big = n
  auto split = [rule](int64_t n) -> std::pair<int64_t, int64_t> {
    if (rule == BttFactorize::reference) {
      for (int64_t b = 1; b <= n; ++b)
        if (n % b == 0 && b * b > n) return {n / b, b};
      return {1, n};
    }
    int64_t a = 1;
    for (int64_t x = 1; x * x <= n; ++x)
      if (n % x == 0) a = x;
    return {a, n / a};
  };
  const auto [a, b] = split(out_per_head);
  const auto [c, d] = split(in);
  return {a, b, c, d};
}

StructuredSpec btt_spec(const BttShape& t, int64_t rank, int64_t heads) {
  const char* where = "btt_spec";
  STRATA_CHECK_ARG(t.a >= 1 && t.b >= 1 && t.c >= 1 && t.d >= 1, where, "shape", "a, b, c, d >= 1",
                   detail::cat("(", t.a, ", ", t.b, ", ", t.c, ", ", t.d, ")"));
  STRATA_CHECK_ARG(rank >= 1, where, "rank", ">= 1", rank);
  STRATA_CHECK_ARG(heads >= 1, where, "heads", ">= 1", heads);
  const int64_t hb = checked_mul(where, "heads", heads, t.b), s = rank;
  StructuredSpec spec{"btt", checked_mul(where, "shape", t.c, t.d), checked_mul(where, "heads", hb, t.a), {}};
  StructuredLevel lv;
  lv.inner = checked_mul(where, "rank", checked_mul(where, "shape", t.c, hb), s);  // right stage output (i_c, h b + j_b, sigma)
  lv.right = {StageKind::blocks, t.c};
  lv.left = {StageKind::blocks, hb};
  spec.levels.push_back(lv);
  validate(where, spec);  // the sizes, before the permutations are allocated
  spec.levels.clear();
  // left input (h b + j_b, i_c, sigma) takes right output (i_c, h b + j_b, sigma)
  lv.inner_perm.resize(size_t(lv.inner));
  for (int64_t jb = 0; jb < hb; ++jb)
    for (int64_t ic = 0; ic < t.c; ++ic)
      for (int64_t sg = 0; sg < s; ++sg)
        lv.inner_perm[size_t((jb * t.c + ic) * s + sg)] = (ic * hb + jb) * s + sg;
  // y[h, i_a, j_b] takes left output (h b + j_b, i_a)
  lv.out_perm.resize(size_t(spec.out));
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t ia = 0; ia < t.a; ++ia)
      for (int64_t jb = 0; jb < t.b; ++jb)
        lv.out_perm[size_t(h * t.a * t.b + ia * t.b + jb)] = (h * t.b + jb) * t.a + ia;
  spec.levels.push_back(std::move(lv));
  validate(where, spec);
  return spec;
}

StructuredSpec monarch_spec(int64_t n, int64_t blocks) {
  const char* where = "monarch_spec";
  STRATA_CHECK_ARG(n >= 1, where, "n", ">= 1", n);
  STRATA_CHECK_ARG(blocks >= 1 && blocks <= n && n % blocks == 0, where, "blocks",
                   detail::cat("a divisor of n = ", n), blocks);
  const int64_t m = n / blocks;
  StructuredSpec s{"monarch", n, n, {}};
  s.levels.push_back({n, {StageKind::blocks, blocks}, {StageKind::blocks, m}, {}, {}, 1.0});
  validate(where, s);  // the sizes, before the permutations are allocated
  s.levels.back().inner_perm = reshape_transpose(blocks, m);
  s.levels.back().out_perm = reshape_transpose(m, blocks);
  validate(where, s);
  return s;
}

StructuredSpec kronecker_spec(int64_t a_out, int64_t a_in, int64_t b_out, int64_t b_in) {
  const char* where = "kronecker_spec";
  STRATA_CHECK_ARG(a_out >= 1 && a_in >= 1, where, "a", "a_out, a_in >= 1", detail::cat(a_out, " x ", a_in));
  STRATA_CHECK_ARG(b_out >= 1 && b_in >= 1, where, "b", "b_out, b_in >= 1", detail::cat(b_out, " x ", b_in));
  StructuredSpec s{"kronecker", checked_mul(where, "a_in", a_in, b_in), checked_mul(where, "a_out", a_out, b_out), {}};
  // right: a_in chunks (b_in -> b_out) sharing B; inner (i, p) -> (p, i); left: b_out chunks
  // (a_in -> a_out) sharing A; output (p, o) -> (o, p).
  const int64_t inner = checked_mul(where, "b_out", a_in, b_out);
  s.levels.push_back({inner, {StageKind::shared, a_in}, {StageKind::shared, b_out}, {}, {}, 1.0});
  validate(where, s);  // the sizes, before the permutations are allocated
  s.levels.back().inner_perm = reshape_transpose(a_in, b_out);
  s.levels.back().out_perm = reshape_transpose(b_out, a_out);
  validate(where, s);
  return s;
}

// ---- Queries ----------------------------------------------------------------------------------

std::vector<std::vector<int64_t>> structured_factor_shapes(const StructuredSpec& spec) {
  validate("structured_factor_shapes", spec);
  std::vector<std::vector<int64_t>> shapes;
  for (const StructuredLevel& lv : spec.levels) {
    if (lv.right.kind != StageKind::identity) shapes.push_back(stage_shape(lv.right, spec.in, lv.inner));
    if (lv.left.kind != StageKind::identity) shapes.push_back(stage_shape(lv.left, spec.out, lv.inner));
  }
  return shapes;
}

int64_t structured_params(const StructuredSpec& spec) {
  validate("structured_params", spec);
  int64_t n = 0;
  auto stage = [&n](const StructuredStage& s, int64_t a, int64_t b) {
    if (s.kind == StageKind::identity) return;
    if (s.kind == StageKind::shared) {
      n += (a / s.blocks) * (b / s.blocks);
      return;
    }
    for (int64_t k = 0; k < s.blocks; ++k)
      n += (chunk_at(a, s.blocks, k + 1) - chunk_at(a, s.blocks, k)) *
           (chunk_at(b, s.blocks, k + 1) - chunk_at(b, s.blocks, k));
  };
  for (const StructuredLevel& lv : spec.levels) {
    stage(lv.right, spec.in, lv.inner);
    stage(lv.left, lv.inner, spec.out);
  }
  return n;
}

std::vector<bool> structured_plan(const StructuredSpec& spec) {
  validate("structured_plan", spec);
  std::vector<bool> plan;
  for (const StructuredLevel& lv : spec.levels) plan.push_back(multiplied_out(spec, lv));
  return plan;
}

double structured_flops(const StructuredSpec& spec, int64_t rows) {
  validate("structured_flops", spec);
  STRATA_CHECK_ARG(rows >= 0, "structured_flops", "rows", ">= 0", rows);
  double macs = 0;
  auto stage = [&macs](const StructuredStage& s, int64_t a, int64_t b) {
    if (s.kind == StageKind::identity) return;
    for (int64_t k = 0; k < s.blocks; ++k)
      macs += double(chunk_at(a, s.blocks, k + 1) - chunk_at(a, s.blocks, k)) *
              double(chunk_at(b, s.blocks, k + 1) - chunk_at(b, s.blocks, k));
  };
  for (const StructuredLevel& lv : spec.levels) {
    if (multiplied_out(spec, lv)) {
      stage(lv.right, spec.in, spec.out);  // one block-diagonal stage of the products
    } else {
      stage(lv.right, spec.in, lv.inner);
      stage(lv.left, lv.inner, spec.out);
    }
  }
  return 2.0 * double(rows) * macs;
}

int64_t structured_rank(const StructuredSpec& spec) {
  validate("structured_rank", spec);
  int64_t r = 0;
  for (const StructuredLevel& lv : spec.levels) {
    if (lv.right.kind == StageKind::shared && lv.left.kind == StageKind::shared) {
      // one shared block per side: rank(right block) * rank(left block) for a Kronecker pattern
      r += std::min(spec.in / lv.right.blocks, lv.inner / lv.right.blocks) *
           std::min(lv.inner / lv.left.blocks, spec.out / lv.left.blocks);
      continue;
    }
    r += std::min(stage_rank(lv.right, spec.in, lv.inner), stage_rank(lv.left, lv.inner, spec.out));
  }
  return std::min({spec.in, spec.out, r});
}

// ---- Kernels ----------------------------------------------------------------------------------
namespace {

// A checked 2-D rows x width view of dtype `dt` (or the kernels' dtypes when dt is null).
void check_matrix(const char* where, const char* arg, const TensorView& t, int64_t rows, int64_t width,
                  const char* why, const DType* dt) {
  STRATA_CHECK_ARG(t.ndim == 2, where, arg, detail::cat("a 2-D tensor (rows, ", width, ")"),
                   detail::cat(t.ndim, "-D ", t.shape_str()));
  STRATA_CHECK_ARG(t.data != nullptr || t.numel() == 0, where, arg, "a non-null data pointer", "null");
  if (dt) {
    STRATA_CHECK_ARG(t.dtype == *dt, where, arg, detail::cat("dtype ", dtype_name(*dt), " (same as x)"),
                     dtype_name(t.dtype));
  } else {
    STRATA_CHECK_ARG(kKernelDTypes.has(t.dtype), where, arg, kKernelDTypes.names(), dtype_name(t.dtype));
  }
  const bool ok = (rows < 0 || t.shape[0] == rows) && t.shape[1] == width;
  STRATA_CHECK_ARG(ok, where, arg,
                   detail::cat("shape [", rows < 0 ? std::string("rows") : std::to_string(rows), ", ", width, "] ", why),
                   t.shape_str());
}

// The factors (and their gradients, when given): the listed shapes, one kernel dtype for all.
void check_factors(const char* where, const char* arg, const StructuredSpec& spec, const std::vector<TensorView>& f,
                   const DType* dt, const DTypes& dtypes = kKernelDTypes) {
  const auto shapes = structured_factor_shapes(spec);
  STRATA_CHECK_ARG(f.size() == shapes.size(), where, arg,
                   detail::cat(shapes.size(), " tensors (one per non-identity stage, for a ", spec.name, " spec)"),
                   f.size());
  for (size_t i = 0; i < f.size(); ++i) {
    const std::string a = detail::cat(arg, "[", i, "]");
    const TensorView& t = f[i];
    const auto& s = shapes[i];
    const std::string want = detail::cat("shape [", s[0], ", ", s[1], ", ", s[2], "]");
    STRATA_CHECK_ARG(t.ndim == 3 && t.shape[0] == s[0] && t.shape[1] == s[1] && t.shape[2] == s[2], where, a.c_str(),
                     want, t.shape_str());
    STRATA_CHECK_ARG(t.data != nullptr, where, a.c_str(), "a non-null data pointer", "null");
    const DType want_dt = dt ? *dt : f[0].dtype;
    STRATA_CHECK_ARG(dtypes.has(t.dtype) && t.dtype == want_dt, where, a.c_str(),
                     detail::cat(dt ? "dtype of the factors, " : "one dtype for all factors, ", dtypes.names(),
                                 " (", dtype_name(want_dt), ")"),
                     dtype_name(t.dtype));
  }
}

// A stage's fp32 weights and gradient layout inside the plan's buffers.
struct PlanStage {
  int64_t w_off = -1;  // into Plan::weights (-1: identity)
  int64_t rows = 0, cols = 0, nb = 0;
  bool right = true;   // rows index the stage's input chunk
};

// What the kernel runs: levels (some multiplied out), their fp32 weights, and where each user
// factor lives in them.
struct Plan {
  std::vector<float> weights;
  std::vector<StructuredLevelParams> levels;
  std::vector<std::vector<int64_t>> in_rows;  // the left stages' in_row arrays (reserved: never moves)
  std::vector<PlanStage> stages;            // per level: right, left
  std::vector<bool> product;                // per level: multiplied out
  int64_t max_width = 0;
  int64_t z_tile = 0;                       // floats of one tile's saved right-stage outputs
  // The token-major forward (cpu::TokenLevelParams), when the spec runs that way: its lane tables
  // and the left weights in the lanes' layout.
  bool token = false;
  std::vector<int64_t> zpos, ypos;
  std::vector<float> lw;
};

// The widest activation the kernel holds and each level's right-stage output width (0: identity),
// given which levels run multiplied out.
int64_t plan_max_width(const StructuredSpec& spec, const std::vector<bool>& product,
                       std::vector<int64_t>* right_out) {
  int64_t w = std::max(spec.in, spec.out);
  for (size_t l = 0; l < spec.levels.size(); ++l) {
    const StructuredLevel& lv = spec.levels[l];
    const int64_t r = product[l] ? spec.out : lv.right.kind == StageKind::identity ? 0 : lv.inner;
    w = std::max(w, product[l] ? spec.out : lv.inner);
    if (right_out) right_out->push_back(r);
  }
  return w;
}

// Calls fn(offset in t's elements, n) for each entry of a 3-D view in row-major order (n: its index).
template <class F>
void for_each_entry(const TensorView& t, F fn) {
  int64_t n = 0;
  for (int64_t a = 0; a < t.shape[0]; ++a)
    for (int64_t b = 0; b < t.shape[1]; ++b)
      for (int64_t c = 0; c < t.shape[2]; ++c) fn(a * t.stride[0] + b * t.stride[1] + c * t.stride[2], n++);
}

// Copies a 3-D factor view (any strides, f32 / bf16) into dst (contiguous fp32).
void copy_factor(const TensorView& t, float* dst) {
  for_each_entry(t, [&](int64_t off, int64_t n) {
    dst[n] = t.dtype == DType::f32 ? static_cast<const float*>(t.data)[off]
                                   : bf16_to_f32(static_cast<const uint16_t*>(t.data)[off]);
  });
}

StageParams stage_params(const StructuredStage& s, int64_t n_in, int64_t n_out, const float* w, int64_t rows,
                         int64_t cols, bool right) {
  StageParams p;
  p.n_in = n_in;
  p.n_out = n_out;
  if (s.kind == StageKind::identity) return p;
  p.blocks = s.blocks;
  p.shared = s.kind == StageKind::shared;
  p.w = w;
  p.w_bs = rows * cols;
  p.w_is = right ? cols : 1;  // right: w(i, o) at i * cols + o; left: w(i, o) at o * cols + i
  p.w_os = right ? 1 : cols;
  return p;
}

// When every left chunk of the level reads inner rows perm[i0] + j * stride (one stride for all
// chunks; a reshape-transpose does): the chunks' first rows, and the stride in *stride. Else empty.
std::vector<int64_t> strided_chunks(const StructuredLevel& lv, int64_t* stride) {
  const StructuredStage& s = lv.left;
  if (lv.inner_perm.empty() || lv.alpha != 1.0 || s.kind == StageKind::identity) return {};
  std::vector<int64_t> first;
  int64_t st = 0;
  for (int64_t k = 0; k < s.blocks; ++k) {
    const int64_t i0 = chunk_at(lv.inner, s.blocks, k), i1 = chunk_at(lv.inner, s.blocks, k + 1);
    first.push_back(lv.inner_perm[size_t(i0)]);
    for (int64_t i = i0 + 1; i < i1; ++i) {
      const int64_t d = lv.inner_perm[size_t(i)] - lv.inner_perm[size_t(i - 1)];
      if (st == 0) st = d;
      if (d != st || d <= 0) return {};
    }
  }
  *stride = st == 0 ? 1 : st;
  return first;
}

// Whether the spec runs token-major (cpu::TokenLevelParams: one level, alpha 1, the right stage p
// equal chunks ni -> no, the left stage q equal chunks K -> a, ni, no and q multiples of 16, and
// permutations that put 16 consecutive left blocks' same input (output) at 16 consecutive inner
// (out) positions); if so, the lane tables: zpos (q/16 x K) and ypos (q/16 x a).
bool token_major(const StructuredSpec& spec, std::vector<int64_t>* zpos, std::vector<int64_t>* ypos) {
  constexpr int64_t L = cpu::kLanes;
  if (spec.levels.size() != 1) return false;
  const StructuredLevel& lv = spec.levels[0];
  if (lv.alpha != 1.0 || lv.right.kind == StageKind::identity || lv.left.kind == StageKind::identity ||
      multiplied_out(spec, lv))
    return false;
  const int64_t p = lv.right.blocks, q = lv.left.blocks;
  if (spec.in % p || lv.inner % p || lv.inner % q || spec.out % q) return false;
  if ((spec.in / p) % L || (lv.inner / p) % L || q % L) return false;
  const int64_t K = lv.inner / q, a = spec.out / q;
  // left block j's input kk is inner position zp(j, kk); its output o goes to out position yp(j, o)
  std::vector<int64_t> inv_out(size_t(spec.out));
  for (int64_t o = 0; o < spec.out; ++o) inv_out[size_t(lv.out_perm.empty() ? o : lv.out_perm[size_t(o)])] = o;
  const auto zp = [&](int64_t j, int64_t kk) {
    return lv.inner_perm.empty() ? j * K + kk : lv.inner_perm[size_t(j * K + kk)];
  };
  const auto yp = [&](int64_t j, int64_t o) { return inv_out[size_t(j * a + o)]; };
  zpos->clear();
  ypos->clear();
  for (int64_t g = 0; g < q / L; ++g) {
    for (int64_t kk = 0; kk < K; ++kk) {
      for (int64_t l = 1; l < L; ++l)
        if (zp(g * L + l, kk) != zp(g * L, kk) + l) return false;
      zpos->push_back(zp(g * L, kk));
    }
    for (int64_t o = 0; o < a; ++o) {
      for (int64_t l = 1; l < L; ++l)
        if (yp(g * L + l, o) != yp(g * L, o) + l) return false;
      ypos->push_back(yp(g * L, o));
    }
  }
  return true;
}

// The token-major forward's left weights in the lanes' layout, from the plan's fp32 L (q or 1, a, K).
void token_weights(const StructuredSpec& spec, Plan& plan) {
  constexpr int64_t L = cpu::kLanes;
  const PlanStage& ps_l = plan.stages[1];
  const int64_t q = spec.levels[0].left.blocks, a = ps_l.rows, K = ps_l.cols;
  const float* lw = plan.weights.data() + ps_l.w_off;
  plan.lw.resize(size_t(q * a * K));
  for (int64_t j = 0; j < q; ++j)
    for (int64_t o = 0; o < a; ++o)
      for (int64_t kk = 0; kk < K; ++kk)
        plan.lw[size_t((((j / L) * K + kk) * a + o) * L + j % L)] = lw[((ps_l.nb == 1 ? 0 : j) * a + o) * K + kk];
}

// token: whether the call may run token-major (a forward that does not save).
Plan make_plan(const StructuredSpec& spec, const std::vector<TensorView>& factors, bool token) {
  Plan plan;
  plan.in_rows.reserve(spec.levels.size());
  plan.product = structured_plan(spec);
  plan.max_width = plan_max_width(spec, plan.product, nullptr);
  const int64_t T = cpu::structured_tile_tokens(plan.max_width);
  size_t fi = 0;
  // Weight offsets first (the buffer must not move once pointers are taken).
  std::vector<std::pair<const TensorView*, const TensorView*>> level_factors;
  for (size_t l = 0; l < spec.levels.size(); ++l) {
    const StructuredLevel& lv = spec.levels[l];
    const TensorView* r = lv.right.kind != StageKind::identity ? &factors[fi++] : nullptr;
    const TensorView* le = lv.left.kind != StageKind::identity ? &factors[fi++] : nullptr;
    level_factors.push_back({r, le});
    PlanStage ps_r, ps_l;
    if (plan.product[l]) {  // one right stage (in -> out) holding alpha * R_k L_k^T
      const int64_t p = lv.right.blocks;
      ps_r = {int64_t(plan.weights.size()), max_chunk(spec.in, p), max_chunk(spec.out, p), p, true};
      plan.weights.resize(plan.weights.size() + size_t(p * ps_r.rows * ps_r.cols), 0.f);
    } else {
      if (r) {
        ps_r = {int64_t(plan.weights.size()), r->shape[1], r->shape[2], r->shape[0], true};
        plan.weights.resize(plan.weights.size() + size_t(r->numel()));
      }
      if (le) {
        ps_l = {int64_t(plan.weights.size()), le->shape[1], le->shape[2], le->shape[0], false};
        plan.weights.resize(plan.weights.size() + size_t(le->numel()));
      }
    }
    plan.stages.push_back(ps_r);
    plan.stages.push_back(ps_l);
  }
  for (size_t l = 0; l < spec.levels.size(); ++l) {
    const StructuredLevel& lv = spec.levels[l];
    const PlanStage& ps_r = plan.stages[2 * l];
    const PlanStage& ps_l = plan.stages[2 * l + 1];
    StructuredLevelParams lp;
    if (plan.product[l]) {
      const TensorView& R = *level_factors[l].first;
      const TensorView& L = *level_factors[l].second;
      std::vector<float> rf(size_t(R.numel())), lf(size_t(L.numel()));
      copy_factor(R, rf.data());
      copy_factor(L, lf.data());
      const int64_t p = lv.right.blocks, m = R.shape[2];
      float* w = plan.weights.data() + ps_r.w_off;
      for (int64_t k = 0; k < p; ++k) {
        const int64_t ni = chunk_at(spec.in, p, k + 1) - chunk_at(spec.in, p, k);
        const int64_t no = chunk_at(spec.out, p, k + 1) - chunk_at(spec.out, p, k);
        const int64_t nm = chunk_at(lv.inner, p, k + 1) - chunk_at(lv.inner, p, k);
        const float* rk = rf.data() + k * R.shape[1] * m;
        const float* lk = lf.data() + k * L.shape[1] * m;
        float* wk = w + k * ps_r.rows * ps_r.cols;
        for (int64_t i = 0; i < ni; ++i)
          for (int64_t o = 0; o < no; ++o) {
            double acc = 0;
            for (int64_t j = 0; j < nm; ++j) acc += double(rk[i * m + j]) * double(lk[o * m + j]);
            wk[i * ps_r.cols + o] = float(lv.alpha * acc);
          }
      }
      lp.right = stage_params(lv.right, spec.in, spec.out, w, ps_r.rows, ps_r.cols, true);
      lp.left.n_in = lp.left.n_out = spec.out;  // identity
    } else {
      if (level_factors[l].first) copy_factor(*level_factors[l].first, plan.weights.data() + ps_r.w_off);
      if (level_factors[l].second) copy_factor(*level_factors[l].second, plan.weights.data() + ps_l.w_off);
      lp.right = stage_params(lv.right, spec.in, lv.inner,
                              ps_r.w_off >= 0 ? plan.weights.data() + ps_r.w_off : nullptr, ps_r.rows, ps_r.cols, true);
      lp.left = stage_params(lv.left, lv.inner, spec.out,
                             ps_l.w_off >= 0 ? plan.weights.data() + ps_l.w_off : nullptr, ps_l.rows, ps_l.cols, false);
      lp.alpha = float(lv.alpha);
      if (!lv.inner_perm.empty()) lp.inner_perm = lv.inner_perm.data();
      int64_t stride = 1;
      std::vector<int64_t> first = strided_chunks(lv, &stride);
      if (!first.empty()) {  // the left stage reads the permuted rows in place
        plan.in_rows.push_back(std::move(first));
        lp.left.in_row = plan.in_rows.back().data();
        lp.left.in_stride = stride;
      }
    }
    if (!lv.out_perm.empty()) lp.out_perm = lv.out_perm.data();
    if (lp.right.w) {
      lp.z_off = plan.z_tile;
      plan.z_tile += lp.right.n_out * T;
    }
    plan.levels.push_back(lp);
  }
  plan.token = token && token_major(spec, &plan.zpos, &plan.ypos);
  if (plan.token) token_weights(spec, plan);
  return plan;
}

StructuredParams make_params(const StructuredSpec& spec, const TensorView& x, const Plan& plan) {
  StructuredParams p;
  p.dtype = x.dtype;
  p.rows = x.shape[0];
  p.in = spec.in;
  p.out = spec.out;
  p.max_width = plan.max_width;
  p.x = x.data;
  p.x_rs = x.stride[0];
  p.x_cs = x.stride[1];
  p.num_levels = int(plan.levels.size());
  p.levels = plan.levels.data();
  p.z_tile = plan.z_tile;
  if (plan.token) {
    const StructuredLevel& lv = spec.levels[0];
    const PlanStage &ps_r = plan.stages[0], &ps_l = plan.stages[1];
    cpu::TokenLevelParams& tk = p.tok;
    tk.on = true;
    tk.p = lv.right.blocks;
    tk.ni = ps_r.rows;
    tk.no = ps_r.cols;
    tk.r = plan.weights.data() + ps_r.w_off;
    tk.r_bs = ps_r.nb == 1 ? 0 : tk.ni * tk.no;
    tk.q = lv.left.blocks;
    tk.a = ps_l.rows;
    tk.K = ps_l.cols;
    tk.zpos = plan.zpos.data();
    tk.ypos = plan.ypos.data();
    tk.lines = std::all_of(plan.ypos.begin(), plan.ypos.end(), [](int64_t v) { return v % cpu::kLanes == 0; });
    tk.lw = plan.lw.data();
  }
  return p;
}

// Writes a fp32 accumulator (contiguous, the factor's logical shape) to a factor-shaped view.
void write_factor(const float* src, const TensorView& t) {
  for_each_entry(t, [&](int64_t off, int64_t n) {
    if (t.dtype == DType::f32) {
      static_cast<float*>(t.data)[off] = src[n];
    } else {
      static_cast<uint16_t*>(t.data)[off] = f32_to_bf16(src[n]);
    }
  });
}

// The optional saved buffer: float32, 1-D, structured_saved_size elements.
void check_saved(const char* where, const TensorView& saved, const StructuredSpec& spec, int64_t rows) {
  const int64_t n = structured_saved_size(spec, rows);
  STRATA_CHECK_ARG(saved.ndim == 1 && saved.shape[0] == n && saved.dtype == DType::f32 && (saved.data || n == 0),
                   where, "saved",
                   detail::cat("a float32 1-D buffer of structured_saved_size(spec, ", rows, ") = ", n, " elements"),
                   detail::cat(dtype_name(saved.dtype), " ", saved.shape_str()));
}

}  // namespace

StructuredSavedLayout structured_saved_layout(const StructuredSpec& spec) {
  const std::vector<bool> product = structured_plan(spec);
  std::vector<int64_t> right_out;
  StructuredSavedLayout s;
  s.tile_rows = cpu::structured_tile_tokens(plan_max_width(spec, product, &right_out));
  for (int64_t r : right_out) s.per_tile += r * s.tile_rows;
  return s;
}

int64_t structured_saved_size(const StructuredSpec& spec, int64_t rows) {
  STRATA_CHECK_ARG(rows >= 0, "structured_saved_size", "rows", ">= 0", rows);
  const StructuredSavedLayout s = structured_saved_layout(spec);
  return (rows + s.tile_rows - 1) / s.tile_rows * s.per_tile;
}

void structured_forward(const StructuredSpec& spec, const TensorView& x, const std::vector<TensorView>& factors,
                        const TensorView& y, const TensorView& saved) {
  const char* where = "structured_forward";
  validate(where, spec);
  check_matrix(where, "x", x, -1, spec.in, "(rows, spec.in)", nullptr);
  check_matrix(where, "y", y, x.shape[0], spec.out, "(x's rows, spec.out)", &x.dtype);
  check_factors(where, "factors", spec, factors, nullptr);
  if (given(saved)) check_saved(where, saved, spec, x.shape[0]);
  if (x.shape[0] == 0) return;
  const Plan plan = make_plan(spec, factors, !given(saved));
  StructuredParams p = make_params(spec, x, plan);
  if (given(saved)) p.z_save = static_cast<float*>(saved.data);
  p.y = y.data;
  p.y_rs = y.stride[0];
  p.y_cs = y.stride[1];
  STRATA_ACTIVE_KERNELS(kStructuredKernels).forward(p);
}

void structured_backward(const StructuredSpec& spec, const TensorView& x, const std::vector<TensorView>& factors,
                         const TensorView& dy, const TensorView& dx, const std::vector<TensorView>& dfactors,
                         const TensorView& saved) {
  const char* where = "structured_backward";
  validate(where, spec);
  check_matrix(where, "x", x, -1, spec.in, "(rows, spec.in)", nullptr);
  check_factors(where, "factors", spec, factors, nullptr);
  check_matrix(where, "dy", dy, x.shape[0], spec.out, "(x's rows, spec.out)", &x.dtype);
  const bool want_dx = given(dx);
  if (want_dx) check_matrix(where, "dx", dx, x.shape[0], spec.in, "(same as x)", &x.dtype);
  const bool want_dw = !dfactors.empty();
  if (want_dw) check_factors(where, "dfactors", spec, dfactors, &factors[0].dtype);
  if (given(saved)) check_saved(where, saved, spec, x.shape[0]);

  Plan plan = make_plan(spec, factors, false);
  StructuredParams p = make_params(spec, x, plan);
  if (given(saved)) p.z_saved = static_cast<const float*>(saved.data);
  p.dy = dy.data;
  p.dy_rs = dy.stride[0];
  p.dy_cs = dy.stride[1];
  if (want_dx) {
    p.dx = dx.data;
    p.dx_rs = dx.stride[0];
    p.dx_cs = dx.stride[1];
  }
  // Per-work-item gradient accumulators (structured_grad_items), laid out like plan.weights.
  std::vector<float> grads;
  if (want_dw) {
    p.weight_grads = true;
    p.grad_stride = int64_t(plan.weights.size());
    const int64_t tile_rows = cpu::structured_tile_tokens(p.max_width);
    p.grad_items = cpu::structured_grad_items((p.rows + tile_rows - 1) / tile_rows, get_num_threads());
    grads.assign(size_t(p.grad_items) * plan.weights.size(), 0.f);
    for (size_t l = 0; l < plan.levels.size(); ++l) {
      StructuredLevelParams& lp = plan.levels[l];
      if (lp.right.w) lp.right.dw = grads.data() + plan.stages[2 * l].w_off;
      if (lp.left.w) lp.left.dw = grads.data() + plan.stages[2 * l + 1].w_off;
    }
    p.levels = plan.levels.data();
  }
  if (x.shape[0] > 0 && (want_dx || want_dw)) STRATA_ACTIVE_KERNELS(kStructuredKernels).backward(p);
  if (!want_dw) return;
  for (int64_t t = 1; t < p.grad_items; ++t)  // in item order
    for (size_t i = 0; i < plan.weights.size(); ++i) grads[i] += grads[size_t(t) * plan.weights.size() + i];

  size_t fi = 0;
  for (size_t l = 0; l < spec.levels.size(); ++l) {
    const StructuredLevel& lv = spec.levels[l];
    if (!plan.product[l]) {
      if (lv.right.kind != StageKind::identity) {
        write_factor(grads.data() + plan.stages[2 * l].w_off, dfactors[fi]);
        ++fi;
      }
      if (lv.left.kind != StageKind::identity) {
        write_factor(grads.data() + plan.stages[2 * l + 1].w_off, dfactors[fi]);
        ++fi;
      }
      continue;
    }
    // Multiplied out: dW_k (in_k x out_k) -> dR_k = alpha dW_k L_k, dL_k = alpha dW_k^T R_k.
    const TensorView& R = factors[fi];
    const TensorView& L = factors[fi + 1];
    std::vector<float> rf(size_t(R.numel())), lf(size_t(L.numel())), dr(rf.size(), 0.f), dl(lf.size(), 0.f);
    copy_factor(R, rf.data());
    copy_factor(L, lf.data());
    const PlanStage& ps = plan.stages[2 * l];
    const int64_t p_blocks = lv.right.blocks, m = R.shape[2];
    for (int64_t k = 0; k < p_blocks; ++k) {
      const int64_t ni = chunk_at(spec.in, p_blocks, k + 1) - chunk_at(spec.in, p_blocks, k);
      const int64_t no = chunk_at(spec.out, p_blocks, k + 1) - chunk_at(spec.out, p_blocks, k);
      const int64_t nm = chunk_at(lv.inner, p_blocks, k + 1) - chunk_at(lv.inner, p_blocks, k);
      const float* dw = grads.data() + ps.w_off + k * ps.rows * ps.cols;
      const float* rk = rf.data() + k * R.shape[1] * m;
      const float* lk = lf.data() + k * L.shape[1] * m;
      float* drk = dr.data() + k * R.shape[1] * m;
      float* dlk = dl.data() + k * L.shape[1] * m;
      for (int64_t i = 0; i < ni; ++i)
        for (int64_t o = 0; o < no; ++o) {
          const float g = float(lv.alpha) * dw[i * ps.cols + o];
          for (int64_t j = 0; j < nm; ++j) {
            drk[i * m + j] += g * lk[o * m + j];
            dlk[o * m + j] += g * rk[i * m + j];
          }
        }
    }
    write_factor(dr.data(), dfactors[fi]);
    write_factor(dl.data(), dfactors[fi + 1]);
    fi += 2;
  }
}

void structured_to_dense(const StructuredSpec& spec, const std::vector<TensorView>& factors, const TensorView& m) {
  const char* where = "structured_to_dense";
  validate(where, spec);
  STRATA_CHECK_ARG(m.ndim == 2 && m.shape[0] == spec.out && m.shape[1] == spec.in, where, "m",
                   detail::cat("shape [", spec.out, ", ", spec.in, "] (spec.out, spec.in)"), m.shape_str());
  STRATA_CHECK_ARG(m.dtype == DType::f32 || m.dtype == DType::f64, where, "m", "dtype float32 or float64",
                   dtype_name(m.dtype));
  STRATA_CHECK_ARG(m.data != nullptr, where, "m", "a non-null data pointer", "null");
  // float64 factors only through the double reference (m float64)
  check_factors(where, "factors", spec, factors, nullptr, m.dtype == DType::f64 ? kReferenceDTypes : kKernelDTypes);
  // M^T = I M^T: the operator applied to the identity's rows (fp32 kernel or double reference).
  std::vector<float> eye(size_t(spec.in * spec.in), 0.f);
  for (int64_t i = 0; i < spec.in; ++i) eye[size_t(i * spec.in + i)] = 1.f;
  const TensorView xi(eye.data(), DType::f32, {spec.in, spec.in});
  std::vector<double> mt(size_t(spec.in * spec.out));
  if (m.dtype == DType::f64) {
    reference::structured_forward(spec, xi, factors, mt.data());
  } else {
    std::vector<float> yt(mt.size());
    structured_forward(spec, xi, factors, TensorView(yt.data(), DType::f32, {spec.in, spec.out}));
    std::copy(yt.begin(), yt.end(), mt.begin());
  }
  for (int64_t o = 0; o < spec.out; ++o)
    for (int64_t i = 0; i < spec.in; ++i) {
      const double v = mt[size_t(i * spec.out + o)];
      const int64_t off = o * m.stride[0] + i * m.stride[1];
      if (m.dtype == DType::f64) {
        static_cast<double*>(m.data)[off] = v;
      } else {
        static_cast<float*>(m.data)[off] = float(v);
      }
    }
}

}  // namespace strata
