// src/core/bf16_gemm.h: bf16 GEMMs with fp32 accumulation, for the kernels' bf16-compute paths.
// Two engines behind one table of entry points:
//   avx512_bf16  vdpbf16ps (src/core/bf16_gemm.cpp, compiled with -mavx512bf16)
//   amx_bf16     AMX-BF16 tiles, tdpbf16ps (src/core/amx_gemm.cpp, compiled with -mamx-tile
//                -mamx-bf16)
// Each lives in its own translation unit compiled with its ISA's flags and is called only after
// run-time detection (strata::cpu_features(): avx512_bf16; amx_bf16 also needs the OS's permission
// for the tile state, which detection asks for): the binary still runs on any x86-64 CPU.
//
// Operand layouts (bf16 values as uint16_t bit patterns):
//   A [M x K] row-major, lda elements (even): (A[m][2kk], A[m][2kk+1]) is one 32-bit word;
//   B [K/2 x N] of 32-bit pairs (B[2kk][n], B[2kk+1][n]) (the "VNNI" layout both instructions
//     read), ldb words per pair row;
//   C [M x N] fp32 row-major, ldc floats.
// K even, N a multiple of 16. amx_bf16 also needs K a multiple of 32 and reads (and writes) whole
// 16-row tiles: A must hold round_up(M, 16) readable rows and C as many writable ones (rows M..
// get the products of A's extra rows); the epilogue (scale, shift, column max) sees rows < M only.
// Products of bf16 values are exact in fp32; only the accumulation rounds (fp32, as the fp32 path).
#pragma once
#include <cstdint>

#include "strata/cpu.h"  // Compute

namespace strata::cpu::bf16 {

struct Gemms {
  const char* name;
  // C = scale * A B.
  void (*scaled)(int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t lda, const uint32_t* B,
                 int64_t ldb, float* C, int64_t ldc, float scale);
  // C = scale * A B - shift[n], colmax[n] = max(colmax[n], max over rows m < M of C[m][n]) (the
  // forward's score product with the online softmax's first pass fused, as core/gemm.inc's
  // gemm_shift_max; a NaN in C propagates into colmax).
  void (*scaled_shift_max)(int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t lda, const uint32_t* B,
                           int64_t ldb, float* C, int64_t ldc, float scale, const float* shift, float* colmax);
  // C += A B.
  void (*acc)(int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t lda, const uint32_t* B, int64_t ldb,
              float* C, int64_t ldc);
  // Called by a thread before its first and after its last product of a batch of work (AMX:
  // load the tile configuration, release the tile state); null when the engine needs neither.
  void (*begin_thread)();
  void (*end_thread)();
};

// vdpbf16ps against fp32 FMAs on this core, in multiply-accumulates per nanosecond (one thread,
// register-resident chains, the best of interleaved rounds: about a millisecond). What decides
// whether `auto` takes the avx512_bf16 engine (strata/cpu.h): the instruction does twice an FMA's
// multiply-adds, but its throughput differs by core (here, an Intel Xeon without AMX exposed: a
// quarter of the FMA's, so half its multiply-adds). AVX512-BF16: call only where the CPU has it.
struct DotRates {
  double dot, fma;  // bf16 pair dot products (2 per lane) / fp32 FMAs (1 per lane), MAC per ns
};
DotRates measure_dot_rates();

// The engines (each defined in its own unit; call only where the CPU has the ISA).
extern const Gemms kAvx512Bf16;
extern const Gemms kAmxBf16;

// The engine of a resolved Compute (strata::resolve_compute), or null for fp32 products. Inline:
// the engines' units are compiled with their ISA's flags, this runs on any CPU.
inline const Gemms* engine(Compute c) {
  switch (c) {
    case Compute::avx512_bf16: return &kAvx512Bf16;
    case Compute::amx_bf16: return &kAmxBf16;
    default: return nullptr;
  }
}

// Rounds `rows` fp32 rows of n floats (src, row stride lds) to bf16 (nearest even) as pair rows of
// B's layout: dst[kk * ldd + c] = (src[2kk][c], src[2kk + 1][c]) for kk < out_pairs, rows at or
// beyond `rows` read as zeros (out_pairs >= ceil(rows / 2)). n a multiple of 16. AVX512-BF16
// (vcvtne2ps2bf16): call only where the CPU has it.
void pack_pairs(const float* src, int64_t rows, int64_t n, int64_t lds, int64_t out_pairs, uint32_t* dst,
                int64_t ldd);

// Rounds `rows` fp32 rows of n floats (src, row stride lds) to bf16 (nearest even) in A's layout:
// dst[r * ldd + c] = bf16(src[r * lds + c]) for c < n, zeros for n <= c < n_pad (n_pad a multiple
// of 16). AVX512-BF16: call only where the CPU has it.
void round_rows(const float* src, int64_t rows, int64_t n, int64_t lds, int64_t n_pad, uint16_t* dst, int64_t ldd);

// Rounds an fp32 matrix [rows x n] (src, row stride lds) to bf16 transposed, in A's layout:
// dst[c * ldd + r] = bf16(src[r * lds + c]) for c < n, r < rows, zeros for rows <= r < rows_pad.
// (The backward's Q^T and dO^T, the A operands of dK^T += Q^T dS and dV^T += dO^T P.)
void transpose_round(const float* src, int64_t rows, int64_t n, int64_t lds, int64_t rows_pad, uint16_t* dst,
                     int64_t ldd);

}  // namespace strata::cpu::bf16
