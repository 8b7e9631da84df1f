// strata/structured.h: structured linear operators on the CPU, forward and backward: the MLBTC
// family (structured-attention paper, section 5; docs/methods.md) and its named special cases
// (low rank, block diagonal, MLR over features, BTT, Monarch, Kronecker).
//
// One operator maps x in R^in to y in R^out:
//
//   y = M x,   M = sum_{l < L} alpha_l  P_L,l  blockdiag_{k' < q_l}(L_{l,k'})  P_R,l  blockdiag_{k < p_l}(R_{l,k}^T)
//
// Level l goes through an inner width m_l:
//   right stage  x split into p_l contiguous chunks; chunk k (in_k features) times R_{l,k}
//                (in_k x m_k, so z_k = R_{l,k}^T x_k) gives the m_l inner features, chunk by chunk;
//   inner perm   P_R,l: the left stage's input i is inner feature inner_perm[i] (empty: identity);
//   left stage   the permuted inner features split into q_l chunks; chunk k' (m'_k' features)
//                times L_{l,k'} (out_k' x m'_k') gives out features, chunk by chunk;
//   out perm     P_L,l: y[i] += alpha_l * (left stage output)[out_perm[i]] (empty: identity).
// Chunks: a width n in p chunks has chunk k = [floor(k n / p), floor((k+1) n / p)): equal chunks
// when p divides n, chunk sizes differing by one otherwise (the blocks' storage is padded to the
// largest chunk, the padding is never read and gets zero gradient).
// A stage is `blocks` (its own weight per chunk), `shared` (one weight for every chunk, e.g. the
// Kronecker product; chunks must be equal) or `identity` (no weight; the stage's in and out widths
// must be equal; for `identity` the block count is ignored).
//
// Factor storage (what `structured_factor_shapes` lists, per level: right then left, identities
// skipped), row-major in any strides, float32 or bfloat16 (all factors one dtype):
//   right  (p_l or 1 if shared) x max_k in_k  x max_k m_k        R_{l,k}[i, j]: chunk feature i -> inner j
//   left   (q_l or 1 if shared) x max_k' out_k' x max_k' m'_k'   L_{l,k'}[o, j]: inner j -> out o
// The named constructors' storage is the published layout: BTT's right factor is the reference
// code's W_K (c, d, b*s), its left factor W_Q (b, a, c*s).
//
// Batched calls: x is rows x in, y rows x out (2-D views, any strides; float32 or bfloat16).
// Math in fp32 (bf16 is read and rounded once). Cost and the contraction order: each level runs
// right stage then left stage (rows * (in * m / p + m * out / q) MACs), except an MLR-type level
// (no inner perm, equal partitions on both sides, both stages `blocks`) whose blocks are cheaper
// multiplied out (in_k * out_k < m_k * (in_k + out_k)): that level runs as one block-diagonal
// stage of the products L_k R_k^T, formed per call (structured_plan says which).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "strata/checks.h"
#include "strata/tensor.h"

namespace strata {

enum class StageKind : uint8_t { blocks = 0, shared = 1, identity = 2 };
const char* stage_kind_name(StageKind k);

struct StructuredStage {
  StageKind kind = StageKind::blocks;
  int64_t blocks = 1;  // p (right) or q (left) >= 1; ignored for identity
};

struct StructuredLevel {
  int64_t inner = 0;              // m_l >= 1
  StructuredStage right, left;    // in -> inner, inner -> out
  std::vector<int64_t> inner_perm;  // empty or a permutation of [0, inner)
  std::vector<int64_t> out_perm;    // empty or a permutation of [0, out)
  double alpha = 1.0;
};

struct StructuredSpec {
  std::string name = "mlbtc";  // what built it ("low_rank", "btt", ...): for messages and reports
  int64_t in = 0, out = 0;     // >= 1
  std::vector<StructuredLevel> levels;  // 1..64
};

// ---- Named constructors (each returns a validated spec) --------------------------------------
// Low rank: M = L R^T, rank r (one level, one chunk each side). Factors R (1, in, r), L (1, out, r).
StructuredSpec low_rank_spec(int64_t in, int64_t out, int64_t rank);
// Block diagonal with `blocks` chunks on each side: M = blockdiag(W_k), W_k out_k x in_k, stored
// as the right stage (blocks, in_k, out_k) = W_k^T (one level, left stage identity).
StructuredSpec block_diagonal_spec(int64_t in, int64_t out, int64_t blocks);
// MLR over features (square, width D): M = sum_l blockdiag_{k < p_l}(L_{l,k} R_{l,k}^T) with
// rank r_l per block and p_l blocks (default p_l = 2^l); factors per level R (p_l, D/p_l, r_l),
// L (p_l, D/p_l, r_l) (chunk sizes differ by one where p_l does not divide D).
StructuredSpec mlr_spec(int64_t dim, const std::vector<int64_t>& ranks, std::vector<int64_t> blocks = {});
// BTT factorisation of D: `reference` = the structured-attention code's rule (b = the smallest
// divisor of D strictly greater than sqrt(D), a = D / b: 64 -> (4, 16), 1024 -> (16, 64); a prime D
// gives (1, D)); `balanced` = the divisor pair closest to sqrt(D) with a <= b (64 -> (8, 8)).
enum class BttFactorize : uint8_t { reference = 0, balanced = 1 };
struct BttShape {
  int64_t a = 0, b = 0;  // out = heads * a * b
  int64_t c = 0, d = 0;  // in = c * d
  bool operator==(const BttShape&) const = default;
};
BttShape btt_factorize(int64_t in, int64_t out_per_head, BttFactorize rule = BttFactorize::reference);
// BTT of rank s (the structured-attention paper; ref BilinearBTTAttention with `heads` heads):
//   M_h[(i_a b + j_b), (i_c d + i_d)] = sum_{sigma < s} W_Q[h b + j_b, i_a, i_c s + sigma] *
//                                                       W_K[i_c, i_d, (h b + j_b) s + sigma]
// y = concat_h M_h x (out = heads * a * b). Factors: right W_K (c, d, heads*b*s), left W_Q
// (heads*b, a, c*s). Cost per row: heads * (c d b s + b a c s) MACs.
StructuredSpec btt_spec(const BttShape& shape, int64_t rank = 1, int64_t heads = 1);
// Monarch (Dao et al. 2022) of size n with `blocks` right blocks: M = P^T blockdiag(L) P blockdiag(R)
// with P the transpose of the (blocks, n/blocks) reshape; right (blocks, n/blocks, n/blocks),
// left (n/blocks, blocks, blocks). blocks must divide n; sqrt(n) blocks is the usual choice.
StructuredSpec monarch_spec(int64_t n, int64_t blocks);
// Kronecker product A (a_out x a_in) (x) B (b_out x b_in): y = (A (x) B) x with x indexed
// (i, j) = i * b_in + j. Factors: right (1, b_in, b_out) = B^T, left (1, a_out, a_in) = A.
StructuredSpec kronecker_spec(int64_t a_out, int64_t a_in, int64_t b_out, int64_t b_in);

// Throws strata::Error naming the field unless spec is a well-formed MLBTC operator.
void validate(const char* where, const StructuredSpec& spec);

// ---- Queries --------------------------------------------------------------------------------
// The factor tensors' shapes, in order (level 0 right, level 0 left, level 1 right, ...; identity
// stages have none). Each is {blocks or 1, rows, cols}.
std::vector<std::vector<int64_t>> structured_factor_shapes(const StructuredSpec& spec);
// Number of weights (the factors' logical entries; padding excluded).
int64_t structured_params(const StructuredSpec& spec);
// FLOPs (2 x multiply-accumulates) of one forward over `rows` rows in the order the kernel runs
// (structured_plan); the backward is twice that (input and factor gradients). A dense GEMM of the
// same shape: 2 * rows * in * out.
double structured_flops(const StructuredSpec& spec, int64_t rows);
// Generic rank: the rank M has for random factors (exact for every named constructor, tested
// against the numerical rank; for other specs with shared stages an upper bound):
// min(in, out, sum over levels of the level's rank), a level's rank being the smaller of its two
// stages' ranks (sum over chunks of min(chunk in, chunk out)); a Kronecker level (both stages
// shared) rank(A) * rank(B).
int64_t structured_rank(const StructuredSpec& spec);
// Per level: true when it runs multiplied out (see the header comment), else two stages.
std::vector<bool> structured_plan(const StructuredSpec& spec);

// ---- Kernels (CPU, fp32 math, threads over row tiles) --------------------------------------
// The backward's factor gradients: one accumulator per thread, each thread a fixed set of row
// tiles, summed in thread order: repeated calls give the same bits for the same thread count.
// Floats a training forward may save for its backward: every level's right-stage output over the
// rows, in the kernel's tile layout (0 when no level has a right stage). Saving costs memory (about
// rows x inner floats per level) and spares the backward recomputing the right stages (for a BTT,
// 4/5 of the forward's multiply-adds).
int64_t structured_saved_size(const StructuredSpec& spec, int64_t rows);
// The same count as a formula: ceil(rows / tile_rows) * per_tile floats (for code that knows rows
// only symbolically, e.g. the ops' fake implementations under torch.compile).
struct StructuredSavedLayout {
  int64_t tile_rows = 1;  // rows per kernel tile
  int64_t per_tile = 0;   // floats saved per tile (0: nothing to save)
};
StructuredSavedLayout structured_saved_layout(const StructuredSpec& spec);

// y = x M^T row by row: x rows x in, y rows x out (x's dtype), factors as listed above. saved
// (optional): a float32 1-D buffer of structured_saved_size(spec, rows) elements, written.
void structured_forward(const StructuredSpec& spec, const TensorView& x, const std::vector<TensorView>& factors,
                        const TensorView& y, const TensorView& saved = TensorView{});
// Given dy (rows x out, x's dtype): writes dx (rows x in) when defined and each dfactor (shapes and
// dtype of the factors) when `dfactors` is not empty. Gradients are written, not accumulated.
// saved (optional): what structured_forward saved for the same x and factors (not checked: other
// contents give wrong gradients); without it the right stages are recomputed.
void structured_backward(const StructuredSpec& spec, const TensorView& x, const std::vector<TensorView>& factors,
                         const TensorView& dy, const TensorView& dx, const std::vector<TensorView>& dfactors,
                         const TensorView& saved = TensorView{});
// The dense out x in matrix M (float32 or float64 view `m`, any strides).
void structured_to_dense(const StructuredSpec& spec, const std::vector<TensorView>& factors, const TensorView& m);

// ---- Double-precision reference: the definition, stage by stage, one row at a time ----------
namespace reference {
// y: rows * out doubles (contiguous). Inputs of any dtype, float64 included.
void structured_forward(const StructuredSpec& spec, const TensorView& x, const std::vector<TensorView>& factors,
                        double* y);
// dx: rows * in doubles; dfactors[i]: the logical entries of factor i, contiguous (blocks x rows x
// cols of structured_factor_shapes; padding entries 0).
void structured_backward(const StructuredSpec& spec, const TensorView& x, const std::vector<TensorView>& factors,
                         const TensorView& dy, double* dx, std::vector<std::vector<double>>& dfactors);
}  // namespace reference

}  // namespace strata
