// apps/strata/peak_avx2.cpp: the AVX2 FMA peak loop (compiled with -mavx2 -mfma; called only
// after strata::cpu_features() reports AVX2 and FMA).
#include <immintrin.h>

#include "peak.h"

namespace strata::app::detail {

float fma_loop_avx2(long iters) {
  // 12 independent accumulator chains hide the 4-5 cycle FMA latency on two FMA ports.
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  __m256 c0 = _mm256_set1_ps(0.f), c1 = _mm256_set1_ps(1.f), c2 = _mm256_set1_ps(2.f);
  __m256 c3 = _mm256_set1_ps(3.f), c4 = _mm256_set1_ps(4.f), c5 = _mm256_set1_ps(5.f);
  __m256 c6 = _mm256_set1_ps(6.f), c7 = _mm256_set1_ps(7.f), c8 = _mm256_set1_ps(8.f);
  __m256 c9 = _mm256_set1_ps(9.f), c10 = _mm256_set1_ps(10.f), c11 = _mm256_set1_ps(11.f);
  for (long i = 0; i < iters; ++i) {
    c0 = _mm256_fmadd_ps(c0, a, b);
    c1 = _mm256_fmadd_ps(c1, a, b);
    c2 = _mm256_fmadd_ps(c2, a, b);
    c3 = _mm256_fmadd_ps(c3, a, b);
    c4 = _mm256_fmadd_ps(c4, a, b);
    c5 = _mm256_fmadd_ps(c5, a, b);
    c6 = _mm256_fmadd_ps(c6, a, b);
    c7 = _mm256_fmadd_ps(c7, a, b);
    c8 = _mm256_fmadd_ps(c8, a, b);
    c9 = _mm256_fmadd_ps(c9, a, b);
    c10 = _mm256_fmadd_ps(c10, a, b);
    c11 = _mm256_fmadd_ps(c11, a, b);
  }
  const __m256 s = _mm256_add_ps(
      _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(c0, c1), _mm256_add_ps(c2, c3)),
                    _mm256_add_ps(_mm256_add_ps(c4, c5), _mm256_add_ps(c6, c7))),
      _mm256_add_ps(_mm256_add_ps(c8, c9), _mm256_add_ps(c10, c11)));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, s);
  float r = 0.f;
  for (float x : lanes) r += x;
  return r;
}

}  // namespace strata::app::detail
