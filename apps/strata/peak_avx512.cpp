// apps/strata/peak_avx512.cpp: the AVX-512 FMA peak loop (compiled with -mavx512f -mfma; called
// only after strata::cpu_features() reports AVX-512F).
#include <immintrin.h>

#include "peak.h"

namespace strata::app::detail {

float fma_loop_avx512(long iters) {
  // 12 independent accumulator chains hide the 4-cycle FMA latency on two FMA ports.
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  __m512 c0 = _mm512_set1_ps(0.f), c1 = _mm512_set1_ps(1.f), c2 = _mm512_set1_ps(2.f);
  __m512 c3 = _mm512_set1_ps(3.f), c4 = _mm512_set1_ps(4.f), c5 = _mm512_set1_ps(5.f);
  __m512 c6 = _mm512_set1_ps(6.f), c7 = _mm512_set1_ps(7.f), c8 = _mm512_set1_ps(8.f);
  __m512 c9 = _mm512_set1_ps(9.f), c10 = _mm512_set1_ps(10.f), c11 = _mm512_set1_ps(11.f);
  for (long i = 0; i < iters; ++i) {
    c0 = _mm512_fmadd_ps(c0, a, b);
    c1 = _mm512_fmadd_ps(c1, a, b);
    c2 = _mm512_fmadd_ps(c2, a, b);
    c3 = _mm512_fmadd_ps(c3, a, b);
    c4 = _mm512_fmadd_ps(c4, a, b);
    c5 = _mm512_fmadd_ps(c5, a, b);
    c6 = _mm512_fmadd_ps(c6, a, b);
    c7 = _mm512_fmadd_ps(c7, a, b);
    c8 = _mm512_fmadd_ps(c8, a, b);
    c9 = _mm512_fmadd_ps(c9, a, b);
    c10 = _mm512_fmadd_ps(c10, a, b);
    c11 = _mm512_fmadd_ps(c11, a, b);
  }
  const __m512 s = _mm512_add_ps(
      _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(c0, c1), _mm512_add_ps(c2, c3)),
                    _mm512_add_ps(_mm512_add_ps(c4, c5), _mm512_add_ps(c6, c7))),
      _mm512_add_ps(_mm512_add_ps(c8, c9), _mm512_add_ps(c10, c11)));
  // (Not _mm512_reduce_add_ps: GCC 12 warns falsely inside it.)
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, s);
  float r = 0.f;
  for (float x : lanes) r += x;
  return r;
}

}  // namespace strata::app::detail
