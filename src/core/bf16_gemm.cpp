// src/core/bf16_gemm.cpp: the AVX512-BF16 engine of src/core/bf16_gemm.h (vdpbf16ps: each fp32
// lane accumulates the dot product of one bf16 pair of A with one of B, twice the multiply-adds
// of an fp32 FMA per instruction), and pack_pairs. Compiled with the AVX-512 flags plus
// -mavx512bf16 (CMakeLists.txt); called only where strata::cpu_features().avx512_bf16 holds.
//
// The micro-kernel is core/gemm.inc's (kMR x kNV vectors of C in registers, A broadcast, B
// vectors) with K counted in pairs: per pair step it loads kNV vectors of B (16 pairs each),
// broadcasts one 32-bit pair of A per row, and issues kMR x kNV vdpbf16ps.
#include "core/bf16_gemm.h"

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#define STRATA_ISA_LEVEL 2
namespace strata::cpu::bf16::simd {
#include "core/simd.h"  // vtranspose_rows (transpose_round)
}  // namespace strata::cpu::bf16::simd

namespace strata::cpu::bf16 {
namespace {

constexpr int kMR = 6, kNV = 4;  // 24 accumulators of 32 zmm, as the fp32 micro-kernel

enum class Epi { scaled, scaled_shift_max, acc };

inline __m512bh as_bh(__m512i x) { return (__m512bh)x; }

// The 32-bit pair at p, broadcast to every lane.
inline __m512bh broadcast_pair(const uint16_t* p) {
  int32_t w;
  std::memcpy(&w, p, 4);
  return as_bh(_mm512_set1_epi32(w));
}

// C[MR x NV*16] per E from A[MR x 2*K2] (row-major bf16, lda) and B[K2 x NV*16] (pairs, ldb).
template <int MR, int NV, Epi E>
void micro(int64_t K2, const uint16_t* A, int64_t lda, const uint32_t* B, int64_t ldb, float* C, int64_t ldc,
           float scale, const float* shift, float* colmax) {
  __m512 c[MR][NV];
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) c[m][v] = E == Epi::acc ? _mm512_loadu_ps(C + m * ldc + v * 16) : _mm512_setzero_ps();
  for (int64_t kk = 0; kk < K2; ++kk) {
    const uint32_t* b = B + kk * ldb;
    __m512bh bv[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) bv[v] = as_bh(_mm512_loadu_si512(b + v * 16));
    const uint16_t* a = A + 2 * kk;
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) {
      const __m512bh am = broadcast_pair(a + m * lda);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) c[m][v] = _mm512_dpbf16_ps(c[m][v], am, bv[v]);
    }
  }
  const __m512 sc = _mm512_set1_ps(scale);
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) {
    __m512 sh = _mm512_setzero_ps(), mx = _mm512_setzero_ps();
    if constexpr (E == Epi::scaled_shift_max) {
      sh = _mm512_loadu_ps(shift + v * 16);
      mx = _mm512_loadu_ps(colmax + v * 16);
    }
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) {
      __m512 x = c[m][v];
      if constexpr (E == Epi::scaled) x = _mm512_mul_ps(x, sc);
      if constexpr (E == Epi::scaled_shift_max) {
        x = _mm512_fmsub_ps(x, sc, sh);
        mx = _mm512_maskz_max_ps(__mmask16(0xffff), mx, x);  // NaN in x: max returns its second operand (maskz: see simd.h)
      }
      _mm512_storeu_ps(C + m * ldc + v * 16, x);
    }
    if constexpr (E == Epi::scaled_shift_max) _mm512_storeu_ps(colmax + v * 16, mx);
  }
}

using MicroFn = void (*)(int64_t, const uint16_t*, int64_t, const uint32_t*, int64_t, float*, int64_t, float,
                         const float*, float*);

template <Epi E, int MR, int NV>
MicroFn pick_nv(int nv) {
  if constexpr (NV == 0) {
    return nullptr;
  } else {
    return nv == NV ? &micro<MR, NV, E> : pick_nv<E, MR, NV - 1>(nv);
  }
}
template <Epi E, int MR>
MicroFn pick(int mr, int nv) {
  if constexpr (MR == 0) {
    return nullptr;
  } else {
    return mr == MR ? pick_nv<E, MR, kNV>(nv) : pick<E, MR - 1>(mr, nv);
  }
}

// STRATA_BF16_AMX_CONTRACT=1 (tests): this engine holds its callers to what the AMX engine needs
// of them, which otherwise only a CPU with AMX checks: K a multiple of 32 (else it stops the
// process with a message), and C's rows M .. round_up(M, 16) writable: it writes them (NaN), as
// AMX's whole 16-row tiles do, so that a caller whose product tile runs into rows it does not own
// fails its tests here too. (ctest runs the bf16 sweeps so: CMakeLists.txt, *_bf16_amx_contract.)
bool amx_contract() {
  static const bool on = [] {
    const char* e = std::getenv("STRATA_BF16_AMX_CONTRACT");
    return e && e[0] == '1';
  }();
  return on;
}
void hold_to_amx_contract(int64_t M, int64_t N, int64_t K, float* C, int64_t ldc) {
  if (K % 32 != 0) {
    std::fprintf(stderr, "strata: STRATA_BF16_AMX_CONTRACT: a bf16 product with K = %lld (AMX: a multiple of 32)\n",
                 static_cast<long long>(K));
    std::abort();
  }
  for (int64_t m = M; m < (M + 15) / 16 * 16; ++m)
    for (int64_t n = 0; n < N; ++n) C[m * ldc + n] = __builtin_nanf("");
}

// C[M x N] per E, tiled into micro-tiles.
template <Epi E>
void gemm_epi(int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t lda, const uint32_t* B, int64_t ldb,
              float* C, int64_t ldc, float scale, const float* shift, float* colmax) {
  if (amx_contract()) hold_to_amx_contract(M, N, K, C, ldc);
  const int64_t K2 = K / 2;
  for (int64_t n0 = 0; n0 < N; n0 += kNV * 16) {
    const int nv = int(std::min<int64_t>(kNV, (N - n0) / 16));
    for (int64_t m0 = 0; m0 < M; m0 += kMR) {
      const int mr = int(std::min<int64_t>(kMR, M - m0));
      pick<E, kMR>(mr, nv)(K2, A + m0 * lda, lda, B + n0, ldb, C + m0 * ldc + n0, ldc, scale,
                           shift ? shift + n0 : nullptr, colmax ? colmax + n0 : nullptr);
    }
  }
}

void scaled(int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t lda, const uint32_t* B, int64_t ldb,
            float* C, int64_t ldc, float scale) {
  gemm_epi<Epi::scaled>(M, N, K, A, lda, B, ldb, C, ldc, scale, nullptr, nullptr);
}
void scaled_shift_max(int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t lda, const uint32_t* B,
                      int64_t ldb, float* C, int64_t ldc, float scale, const float* shift, float* colmax) {
  gemm_epi<Epi::scaled_shift_max>(M, N, K, A, lda, B, ldb, C, ldc, scale, shift, colmax);
}
void acc(int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t lda, const uint32_t* B, int64_t ldb,
         float* C, int64_t ldc) {
  gemm_epi<Epi::acc>(M, N, K, A, lda, B, ldb, C, ldc, 1.f, nullptr, nullptr);
}

}  // namespace

const Gemms kAvx512Bf16 = {"avx512_bf16", scaled, scaled_shift_max, acc, nullptr, nullptr};

namespace {

// kChains independent accumulators (more than latency x ports on any core: the loop measures
// throughput, not latency), `reps` rounds of one instruction per chain; returns nanoseconds.
constexpr int kChains = 16;
template <class Step>
double time_chains(int64_t reps, Step step) {
  __m512 c[kChains];
  for (int i = 0; i < kChains; ++i) c[i] = _mm512_set1_ps(1e-3f * float(i));
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t r = 0; r < reps; ++r) {
#pragma GCC unroll 16
    for (int i = 0; i < kChains; ++i) c[i] = step(c[i]);
    __asm__ volatile("" : "+v"(c[0]));  // keeps the rounds from being folded
  }
  const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
  __m512 s = c[0];
  for (int i = 1; i < kChains; ++i) s = _mm512_add_ps(s, c[i]);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, s);
  volatile float sink = lanes[0];  // the chains' results are used
  (void)sink;
  return ns;
}

}  // namespace

DotRates measure_dot_rates() {
  // Operands near 1 keep the chains finite and normal (no denormal slow paths) over every round.
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  const __m512bh x = as_bh(_mm512_set1_epi16(0x3f80)), y = as_bh(_mm512_set1_epi16(0x3400));  // 1, 2^-23
  constexpr int64_t kReps = 4096;  // 65536 instructions a round: ~10-50 us
  double dot_ns = 1e300, fma_ns = 1e300;
  // Interleaved, best of each: a round the scheduler interrupts, or one run before the core's
  // AVX-512 clock settles, does not decide.
  for (int round = 0; round < 9; ++round) {
    fma_ns = std::min(fma_ns, time_chains(kReps, [&](__m512 c) { return _mm512_fmadd_ps(c, a, b); }));
    dot_ns = std::min(dot_ns, time_chains(kReps, [&](__m512 c) { return _mm512_dpbf16_ps(c, x, y); }));
  }
  const double instructions = double(kReps) * kChains;
  return {instructions * 32 / dot_ns, instructions * 16 / fma_ns};
}

void pack_pairs(const float* src, int64_t rows, int64_t n, int64_t lds, int64_t out_pairs, uint32_t* dst,
                int64_t ldd) {
  // vcvtne2ps2bf16 puts its second operand's 16 values in the low half, its first's in the high
  // half; the permutation interleaves them into (row 2kk, row 2kk + 1) pairs.
  alignas(64) static constexpr uint16_t kInterleave[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,
                                                          21, 6, 22, 7, 23, 8,  24, 9,  25, 10, 26,
                                                          11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i idx = _mm512_load_si512(kInterleave);
  for (int64_t kk = 0; kk < out_pairs; ++kk) {
    const int64_t r0 = 2 * kk, r1 = r0 + 1;
    for (int64_t c = 0; c < n; c += 16) {
      const __m512 lo = r0 < rows ? _mm512_loadu_ps(src + r0 * lds + c) : _mm512_setzero_ps();
      const __m512 hi = r1 < rows ? _mm512_loadu_ps(src + r1 * lds + c) : _mm512_setzero_ps();
      const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
      _mm512_storeu_si512(dst + kk * ldd + c, _mm512_permutexvar_epi16(idx, both));
    }
  }
}

void round_rows(const float* src, int64_t rows, int64_t n, int64_t lds, int64_t n_pad, uint16_t* dst, int64_t ldd) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < n_pad; c += 16) {
      const int64_t left = std::clamp<int64_t>(n - c, 0, 16);
      const __mmask16 m = left == 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1);
      const __m512 x = _mm512_maskz_loadu_ps(m, src + r * lds + c);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + r * ldd + c), (__m256i)_mm512_cvtneps_pbh(x));
    }
}

void transpose_round(const float* src, int64_t rows, int64_t n, int64_t lds, int64_t rows_pad, uint16_t* dst,
                     int64_t ldd) {
  // 16 x 16 blocks through the fp32 register transpose (rows past `rows` read as zeros), each of
  // its rows rounded into 16 contiguous values of a dst row; a ragged last column block value by
  // value (a 16-wide load would read past the rows' ends). (One value at a time everywhere, as
  // before, was a visible part of the Monarch backward with bf16 products.)
  alignas(64) static const float kZeros[16] = {};
  alignas(64) float blk[16 * 16];
  const int64_t nfull = n / 16 * 16;
  for (int64_t r0 = 0; r0 < rows_pad; r0 += 16) {
    const int64_t rr = std::clamp<int64_t>(rows - r0, 0, 16);
    for (int64_t c0 = 0; c0 < n; c0 += 16) {
      const int64_t cw = std::min<int64_t>(16, n - c0);
      if (c0 < nfull) {
        simd::vtranspose_rows([&](int i) { return i < rr ? src + (r0 + i) * lds + c0 : kZeros; }, blk, 16);
      } else {
        for (int64_t c = 0; c < cw; ++c)
          for (int64_t i = 0; i < 16; ++i) blk[c * 16 + i] = i < rr ? src[(r0 + i) * lds + c0 + c] : 0.f;
      }
      for (int64_t c = 0; c < cw; ++c)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + (c0 + c) * ldd + r0),
                            (__m256i)_mm512_cvtneps_pbh(_mm512_load_ps(blk + c * 16)));
    }
  }
}

}  // namespace strata::cpu::bf16
