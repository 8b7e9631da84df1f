// src/core/amx_gemm.cpp: the AMX-BF16 engine of src/core/bf16_gemm.h: tdpbf16ps on 16 x 16 fp32
// tiles of C, each step a 16 x 32 bf16 tile of A times a 16-pair x 16 tile of B. Compiled with the
// AVX-512 flags plus -mamx-tile -mamx-bf16 (CMakeLists.txt); called only where
// strata::cpu_features().amx_bf16 holds (the CPU has it and Linux granted the tile state).
//
// Registers: tmm0-3 hold a 2 x 2 block of C tiles (32 rows x 32 columns), tmm4-5 two A tiles,
// tmm6-7 two B tiles, so each A and B tile loaded feeds two products. The configuration (all eight
// 16 rows x 64 bytes) is per thread: begin_thread loads it, end_thread releases the tile state
// (so that the thread's context switches stop saving 8 KB of tiles). The scale, shift and column
// max of the score product run over the stored C in AVX-512 afterwards.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "core/bf16_gemm.h"

namespace strata::cpu::bf16 {
namespace {

// The 64-byte LDTILECFG operand (palette 1): all eight tiles 16 rows x 64 bytes.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};
static_assert(sizeof(TileConfig) == 64);
// A constant in memory: GCC 12's ldtilecfg builtin does not say that it reads its operand, and
// dead-store elimination dropped the rows and column bytes of a configuration built on the stack
// (every tile instruction then raised SIGILL).
alignas(64) constexpr TileConfig kTileConfig{};

void begin_thread() { _tile_loadconfig(&kTileConfig); }

void end_thread() { _tile_release(); }

// One block of MT x NT C tiles (MT, NT in {1, 2}) at C: C (= or +=) A[16 MT x K] B[K/2 x 16 NT].
// (The tile intrinsics take register numbers, so each case is written out.)
template <int MT, int NT, bool ACC>
void block(int64_t K, const uint16_t* A, int64_t lda, const uint32_t* B, int64_t ldb, float* C, int64_t ldc) {
  const int64_t sa = lda * 2, sb = ldb * 4, sc = ldc * 4;  // row strides in bytes
  // (tileloadd's asm does not declare that it reads memory: keep earlier stores before it)
  asm volatile("" ::: "memory");
  if constexpr (ACC) {
    _tile_loadd(0, C, sc);
    if constexpr (NT > 1) _tile_loadd(1, C + 16, sc);
    if constexpr (MT > 1) _tile_loadd(2, C + 16 * ldc, sc);
    if constexpr (MT > 1 && NT > 1) _tile_loadd(3, C + 16 * ldc + 16, sc);
  } else {
    _tile_zero(0);
    if constexpr (NT > 1) _tile_zero(1);
    if constexpr (MT > 1) _tile_zero(2);
    if constexpr (MT > 1 && NT > 1) _tile_zero(3);
  }
  for (int64_t k0 = 0; k0 < K; k0 += 32) {
    const uint32_t* b = B + (k0 / 2) * ldb;
    _tile_loadd(4, A + k0, sa);
    _tile_loadd(6, b, sb);
    if constexpr (NT > 1) _tile_loadd(7, b + 16, sb);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (NT > 1) _tile_dpbf16ps(1, 4, 7);
    if constexpr (MT > 1) {
      _tile_loadd(5, A + 16 * lda + k0, sa);
      _tile_dpbf16ps(2, 5, 6);
      if constexpr (NT > 1) _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, C, sc);
  if constexpr (NT > 1) _tile_stored(1, C + 16, sc);
  if constexpr (MT > 1) _tile_stored(2, C + 16 * ldc, sc);
  if constexpr (MT > 1 && NT > 1) _tile_stored(3, C + 16 * ldc + 16, sc);
}

// C[round_up(M, 16) x N] (= or +=) A B, in 2 x 2 blocks of tiles (1 wide at the edges).
template <bool ACC>
void tiles(int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t lda, const uint32_t* B, int64_t ldb,
           float* C, int64_t ldc) {
  const int64_t M16 = (M + 15) / 16 * 16;
  for (int64_t m0 = 0; m0 < M16; m0 += 32) {
    const bool two_m = m0 + 32 <= M16;
    for (int64_t n0 = 0; n0 < N; n0 += 32) {
      const bool two_n = n0 + 32 <= N;
      const uint16_t* a = A + m0 * lda;
      const uint32_t* b = B + n0;
      float* c = C + m0 * ldc + n0;
      if (two_m && two_n) block<2, 2, ACC>(K, a, lda, b, ldb, c, ldc);
      else if (two_m) block<2, 1, ACC>(K, a, lda, b, ldb, c, ldc);
      else if (two_n) block<1, 2, ACC>(K, a, lda, b, ldb, c, ldc);
      else block<1, 1, ACC>(K, a, lda, b, ldb, c, ldc);
    }
  }
}

void scaled(int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t lda, const uint32_t* B, int64_t ldb,
            float* C, int64_t ldc, float scale) {
  tiles<false>(M, N, K, A, lda, B, ldb, C, ldc);
  const __m512 sc = _mm512_set1_ps(scale);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; n += 16) _mm512_storeu_ps(C + m * ldc + n, _mm512_mul_ps(_mm512_loadu_ps(C + m * ldc + n), sc));
}

void scaled_shift_max(int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t lda, const uint32_t* B,
                      int64_t ldb, float* C, int64_t ldc, float scale, const float* shift, float* colmax) {
  tiles<false>(M, N, K, A, lda, B, ldb, C, ldc);
  const __m512 sc = _mm512_set1_ps(scale);
  for (int64_t n = 0; n < N; n += 16) {
    const __m512 sh = _mm512_loadu_ps(shift + n);
    __m512 mx = _mm512_loadu_ps(colmax + n);
    for (int64_t m = 0; m < M; ++m) {
      const __m512 x = _mm512_fmsub_ps(_mm512_loadu_ps(C + m * ldc + n), sc, sh);
      _mm512_storeu_ps(C + m * ldc + n, x);
      mx = _mm512_maskz_max_ps(__mmask16(0xffff), mx, x);  // NaN in x: max returns its second operand (maskz: see simd.h)
    }
    _mm512_storeu_ps(colmax + n, mx);
  }
}

void acc(int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t lda, const uint32_t* B, int64_t ldb,
         float* C, int64_t ldc) {
  tiles<true>(M, N, K, A, lda, B, ldb, C, ldc);
}

}  // namespace

const Gemms kAmxBf16 = {"amx_bf16", scaled, scaled_shift_max, acc, begin_thread, end_thread};

}  // namespace strata::cpu::bf16
