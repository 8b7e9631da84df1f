// src/cpu/structured_params.h: the POD parameter struct of the structured-operator kernels
// (strata/structured.h). Filled by src/cpu/structured.cpp after validation, with the factors
// already converted to contiguous fp32 (they are small next to rows x width); read by every ISA
// variant of src/cpu/kernels/structured.inc.
#pragma once
#include <algorithm>
#include <cstdint>

#include "core/dispatch.h"
#include "cpu/attention_params.h"  // Strided4 (core/rows.inc reads it)
#include "strata/tensor.h"

namespace strata::cpu {

// One block-diagonal stage, width n_in -> n_out, in `blocks` chunks (floor(k n / p) boundaries).
// Block k's weight: w + (shared ? 0 : k * w_bs); its entry for chunk input i and chunk output o
// at i * w_is + o * w_os (a right stage stores R_k with rows = inputs: w_is = cols, w_os = 1; a
// left stage stores L_k with rows = outputs: w_is = 1, w_os = cols). identity: w == nullptr and
// n_in == n_out.
struct StageParams {
  int64_t n_in = 0, n_out = 0, blocks = 1;
  bool shared = false;
  const float* w = nullptr;
  int64_t w_bs = 0, w_is = 0, w_os = 0;
  float* dw = nullptr;  // backward: this stage's gradient accumulator, same layout as w (fp32, zeroed)
  // Input rows read through a strided permutation (null: block k reads rows i0 .. i0 + ni): block k's
  // input row j is in_row[k] + j * in_stride. Set for a left stage whose level permutes its inner
  // rows that way (BTT with s = 1, Monarch, Kronecker: reshape-transposes), so the permutation costs
  // nothing: no gather forward, no scatter backward.
  const int64_t* in_row = nullptr;
  int64_t in_stride = 1;
};

struct StructuredLevelParams {
  StageParams right, left;              // in -> inner, inner -> out
  int64_t z_off = 0;                    // this level's right-stage output in a tile's saved block (floats)
  const int64_t* inner_perm = nullptr;  // inner, or null (identity)
  const int64_t* out_perm = nullptr;    // out, or null (identity)
  float alpha = 1.f;
};

// The forward of a one-level operator run TOKEN-major (src/cpu/kernels/structured.inc, "Token-major
// forward"): the rows stay as they come, the right stage is p GEMMs over the tile's tokens (M =
// tokens), and the left stage's q small GEMMs are batched across the vector lanes (lane l of group g
// is left block 16 g + l). Set by src/cpu/structured.cpp for a single level (alpha 1) whose right
// stage is p equal chunks ni -> no (multiples of 16), whose left stage is q equal chunks K -> a (q a
// multiple of 16), and whose permutations put 16 consecutive left blocks' same input (output) at 16
// consecutive inner (out) positions: BTT with s = 1 (b a multiple of 16), Monarch and Kronecker
// at widths with 16 | sqrt(D).
constexpr int64_t kLanes = 16;  // lanes per left-stage group (the widest vector)
struct TokenLevelParams {
  bool on = false;
  int64_t p = 0, ni = 0, no = 0;    // right stage: chunk k maps x[:, k ni + i] to z[:, k no + o]
  const float* r = nullptr;         // R_k (ni x no, row-major) at r + k * r_bs (r_bs 0: shared)
  int64_t r_bs = 0;
  int64_t q = 0, K = 0, a = 0;      // left stage: q blocks, K inputs -> a outputs each
  const int64_t* zpos = nullptr;    // (q / 16) x K: inner position of group g's input kk, lane 0
  const int64_t* ypos = nullptr;    // (q / 16) x a: out position of group g's output o, lane 0
  bool lines = false;               // every ypos a multiple of 16 (a group's outputs: whole cache lines)
  const float* lw = nullptr;        // (q / 16) x K x a x 16: L_{16g+l}[o, kk] at ((g K + kk) a + o) 16 + l
};

struct StructuredParams {
  DType dtype = DType::f32;  // of x, y, dy, dx
  int64_t rows = 0, in = 0, out = 0, max_width = 0;  // max_width: max(in, out, every inner)
  const void* x = nullptr;   // rows x in
  int64_t x_rs = 0, x_cs = 0;
  void* y = nullptr;         // rows x out (forward)
  int64_t y_rs = 0, y_cs = 0;
  const void* dy = nullptr;  // rows x out (backward)
  int64_t dy_rs = 0, dy_cs = 0;
  void* dx = nullptr;        // rows x in (backward, optional)
  int64_t dx_rs = 0, dx_cs = 0;
  int num_levels = 0;
  const StructuredLevelParams* levels = nullptr;
  // backward: the row tiles are dealt to grad_items work items round-robin (structured_grad_items);
  // item i walks its tiles in order, adding its factor gradients to the levels' dw pointers offset by
  // i * grad_stride floats; the entry point zeroes grad_items * grad_stride floats and sums the
  // items in order (a fixed summation order: the same bits on every call).
  int64_t grad_stride = 0;
  int64_t grad_items = 1;
  bool weight_grads = false;
  // Saved right-stage outputs (optional): tile t's block of z_tile floats holds, for each level with
  // a right stage, its n_out x T output tile at z_off. The forward writes them when z_save is set;
  // the backward reads z_saved instead of recomputing them.
  float* z_save = nullptr;
  const float* z_saved = nullptr;
  int64_t z_tile = 0;
  TokenLevelParams tok;  // when tok.on: a forward that does not save runs token-major
};

// Tokens per row tile: the GEMMs' N. 64 (four AVX-512 vectors: the micro-kernel's widest tile)
// up to width 4096, where a tile's few activations (about 1 MB each) still mostly stay in L2; measured
// at D = 4096 (bench structured, BTT s=1 / Monarch / low rank, fwd and bwd), 64 beat 16 on 5 of 6
// rows and 32 on 4 of 6. Halved beyond. A multiple of every ISA's vector width, and the same for
// all ISAs (the saved layout depends on it).
inline int64_t structured_tile_tokens(int64_t max_width) {
  return max_width <= 4096 ? 64 : max_width <= 8192 ? 32 : 16;
}

// Work items of a backward with factor gradients over `tiles` row tiles: one per thread (at most
// one per tile), item i walking tiles i, i + items, i + 2 items, ... in order (the threads work on
// neighbouring tiles at the same time, as the dynamic hand-out of single tiles had them), each with
// its own factor-gradient accumulators, summed in item order: the same bits for the same thread
// count. More items per thread (each with its own, cold accumulators, zeroed and summed once)
// made the BTT s=1 backward slower (in-process A/B, AMD EPYC, 2 threads); one per thread costs
// little against the dynamic hand-out it replaced (docs/notes.md, the fixed summation order).
inline int64_t structured_grad_items(int64_t tiles, int threads) {
  return std::max<int64_t>(1, std::min<int64_t>(tiles, threads));
}

// The family's entry points, one table per ISA (src/cpu/kernels/structured.inc defines it).
struct StructuredKernels {
  void (*forward)(const StructuredParams& p);
  void (*backward)(const StructuredParams& p);
};
STRATA_PER_ISA(extern const StructuredKernels kStructuredKernels;)

}  // namespace strata::cpu
