// src/core/simd.h: a tiny fp32 vector type for the ISA this translation unit is compiled for.
// Included INSIDE a per-ISA namespace by kernel TUs that define STRATA_ISA_LEVEL:
//   2 = AVX-512 (16 lanes), 1 = AVX2 + FMA (8 lanes), 0 = scalar (1 lane).
// Every TU that includes it is compiled with the matching -m flags and is only called after
// run-time dispatch has checked the CPU (src/core/cpu.cpp), so the binary runs on any x86-64.
// The including TU must include <cmath>, <cstdint> and (level >= 1) <immintrin.h> first, outside
// its namespace.
#pragma once

// Coefficients of the degree-5 polynomial for 2^f on [-0.5, 0.5] shared by the vector exp2 of
// every ISA: minimax for relative error with c0 = 1 fixed, so that 2^0 is exactly 1 (the online
// softmax tests alpha == 1 to skip rescaling). Relative error 9.1e-8 in exact arithmetic, 1.9e-7
// evaluated in fp32 (the degree-6 Taylor polynomial it replaced: 2.4e-7).
constexpr float kExp2C0 = 1.0f, kExp2C1 = 0.6931469775976778f, kExp2C2 = 0.24022242083111783f,
                kExp2C3 = 0.055507337444709946f, kExp2C4 = 0.009671512785779867f,
                kExp2C5 = 0.0013264727252711626f;

#if STRATA_ISA_LEVEL == 2
struct VF {
  static constexpr int W = 16;
  __m512 v;
};
inline VF vload(const float* p) { return {_mm512_loadu_ps(p)}; }
inline void vstore(float* p, VF a) { _mm512_storeu_ps(p, a.v); }
inline VF vzero() { return {_mm512_setzero_ps()}; }
inline VF vset1(float x) { return {_mm512_set1_ps(x)}; }
inline VF vfma(VF a, VF b, VF c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
inline VF vadd(VF a, VF b) { return {_mm512_add_ps(a.v, b.v)}; }
inline VF vsub(VF a, VF b) { return {_mm512_sub_ps(a.v, b.v)}; }
inline VF vmul(VF a, VF b) { return {_mm512_mul_ps(a.v, b.v)}; }
// (the maskz form with a full mask is the same instruction; GCC 12 flags _mm512_max_ps's
// undefined pass-through as uninitialised under -Werror in some callers)
inline VF vmax(VF a, VF b) { return {_mm512_maskz_max_ps(__mmask16(0xffff), a.v, b.v)}; }
inline float vreduce_max(VF a) { return _mm512_reduce_max_ps(a.v); }
inline float vreduce_add(VF a) { return _mm512_reduce_add_ps(a.v); }
// 2^x (x < -125 gives exactly 0, -inf gives 0, NaN gives NaN, x >= 128 gives +inf). The lower
// clamp keeps every result a normal float: an underflowing scalef (e.g. 2^-150 for a masked
// score) takes a microcode assist costing ~100+ cycles, which made causal tiles much slower.
// scalef itself saturates large n to +inf, so no upper clamp is needed (every caller passes a
// score minus its row max or lse, x <= ~0). max returns its SECOND operand when either is NaN,
// so putting x second lets NaN flow through. 10 vector ops: it is the softmax's inner loop.
inline VF vexp2(VF x) {
  const __m512 xc = _mm512_max_ps(_mm512_set1_ps(-125.f), x.v);
  const __m512 n = _mm512_roundscale_ps(xc, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(xc, n);  // f in [-0.5, 0.5]
  // 2^f: the degree-5 polynomial above
  __m512 p = _mm512_set1_ps(kExp2C5);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kExp2C4));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kExp2C3));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kExp2C2));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kExp2C1));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kExp2C0));
  const __mmask16 keep = _mm512_cmp_ps_mask(x.v, _mm512_set1_ps(-125.f), _CMP_NLT_UQ);  // NaN kept
  return {_mm512_maskz_scalef_ps(keep, p, n)};
}
// b where b > a + slack, else a (b = NaN gives a): a lazily raised running max.
inline VF vraise(VF a, VF b, float slack) {
  return {_mm512_mask_mov_ps(a.v, _mm512_cmp_ps_mask(b.v, _mm512_add_ps(a.v, _mm512_set1_ps(slack)), _CMP_GT_OQ), b.v)};
}
// x where x != -inf, else 0 (so that x - m never computes (-inf) - (-inf)).
inline VF vneginf_to_zero(VF x) {
  return {_mm512_mask_mov_ps(x.v, _mm512_cmp_ps_mask(x.v, _mm512_set1_ps(-INFINITY), _CMP_EQ_OQ),
                             _mm512_setzero_ps())};
}
// a / b lane by lane (IEEE division: the scalar quotient's bits).
inline VF vdiv(VF a, VF b) { return {_mm512_div_ps(a.v, b.v)}; }
// |a| lane by lane (the sign bit cleared; NaN stays NaN).
inline VF vabs(VF a) { return {_mm512_abs_ps(a.v)}; }
// 1 / a for a >= 1 (the GELU's t = 1 / (1 + p z)): the 14-bit estimate and one Newton step,
// within ~2 ulp of the quotient (a division's throughput is ~10x this; NaN stays NaN).
inline VF vrcp_ge1(VF a) {
  const __m512 r = _mm512_rcp14_ps(a.v);
  return {_mm512_mul_ps(r, _mm512_fnmadd_ps(a.v, r, _mm512_set1_ps(2.f)))};
}
// a where c > 0, else b.
inline VF vselect_pos(VF c, VF a, VF b) {
  return {_mm512_mask_mov_ps(b.v, _mm512_cmp_ps_mask(c.v, _mm512_setzero_ps(), _CMP_GT_OQ), a.v)};
}
// x = m 2^e with m in [sqrt(1/2), sqrt(2)], for x positive, normal and finite; returns m.
inline VF vfrexp_sqrt2(VF x, VF* e) {
  const __m512 m = _mm512_maskz_getmant_ps(__mmask16(0xffff), x.v, _MM_MANT_NORM_1_2, _MM_MANT_SIGN_src);
  const __m512 ev = _mm512_maskz_getexp_ps(__mmask16(0xffff), x.v);  // (maskz forms: see vtranspose_rows)
  const __mmask16 big = _mm512_cmp_ps_mask(m, _mm512_set1_ps(1.41421356f), _CMP_GT_OQ);
  *e = {_mm512_mask_add_ps(ev, big, ev, _mm512_set1_ps(1.f))};
  return {_mm512_mask_mul_ps(m, big, m, _mm512_set1_ps(0.5f))};
}
// s where key j is allowed for the lane's query ((lo <= j <= hi) or j <= ghi), else -inf.
// Non-temporal store of a vector to a 64-byte-aligned p (one whole cache line: written without
// reading it first); vstream_fence orders the calling thread's streamed stores before its later ones.
inline void vstream(float* p, VF a) { _mm512_stream_ps(p, a.v); }
inline void vstream_fence() { _mm_sfence(); }
inline VF vmask_keys(VF s, VF lo, VF hi, VF ghi, float j) {
  const __m512 jv = _mm512_set1_ps(j);
  const __mmask16 win = _mm512_cmp_ps_mask(lo.v, jv, _CMP_LE_OQ) & _mm512_cmp_ps_mask(jv, hi.v, _CMP_LE_OQ);
  const __mmask16 ok = win | _mm512_cmp_ps_mask(jv, ghi.v, _CMP_LE_OQ);
  return {_mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), ok, s.v)};
}
#elif STRATA_ISA_LEVEL == 1
struct VF {
  static constexpr int W = 8;
  __m256 v;
};
inline VF vload(const float* p) { return {_mm256_loadu_ps(p)}; }
inline void vstore(float* p, VF a) { _mm256_storeu_ps(p, a.v); }
inline VF vzero() { return {_mm256_setzero_ps()}; }
inline VF vset1(float x) { return {_mm256_set1_ps(x)}; }
inline VF vfma(VF a, VF b, VF c) { return {_mm256_fmadd_ps(a.v, b.v, c.v)}; }
inline VF vadd(VF a, VF b) { return {_mm256_add_ps(a.v, b.v)}; }
inline VF vsub(VF a, VF b) { return {_mm256_sub_ps(a.v, b.v)}; }
inline VF vmul(VF a, VF b) { return {_mm256_mul_ps(a.v, b.v)}; }
inline VF vmax(VF a, VF b) { return {_mm256_max_ps(a.v, b.v)}; }
inline float vreduce_max(VF a) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(a.v), _mm256_extractf128_ps(a.v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}
inline float vreduce_add(VF a) {
  __m128 m = _mm_add_ps(_mm256_castps256_ps128(a.v), _mm256_extractf128_ps(a.v, 1));
  m = _mm_add_ps(m, _mm_movehl_ps(m, m));
  m = _mm_add_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}
inline VF vexp2(VF x) {
  __m256 xc = _mm256_max_ps(_mm256_set1_ps(-125.f), x.v);  // normal results only (see above)
  xc = _mm256_min_ps(_mm256_set1_ps(127.f), xc);
  __m256 n = _mm256_round_ps(xc, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 f = _mm256_sub_ps(xc, n);
  __m256 p = _mm256_set1_ps(kExp2C5);  // 2^f: the minimax polynomial above
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kExp2C4));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kExp2C3));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kExp2C2));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kExp2C1));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kExp2C0));
  __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  __m256 r = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
  // below 2^-125 flush to 0 (softmax weights that small do not matter); NaN stays NaN (x second
  // in max/min above carries it through)
  return {_mm256_blendv_ps(r, _mm256_setzero_ps(), _mm256_cmp_ps(x.v, _mm256_set1_ps(-125.f), _CMP_LT_OQ))};
}
inline VF vraise(VF a, VF b, float slack) {
  return {_mm256_blendv_ps(a.v, b.v, _mm256_cmp_ps(b.v, _mm256_add_ps(a.v, _mm256_set1_ps(slack)), _CMP_GT_OQ))};
}
inline VF vneginf_to_zero(VF x) {
  return {_mm256_blendv_ps(x.v, _mm256_setzero_ps(), _mm256_cmp_ps(x.v, _mm256_set1_ps(-INFINITY), _CMP_EQ_OQ))};
}
inline VF vdiv(VF a, VF b) { return {_mm256_div_ps(a.v, b.v)}; }
inline VF vabs(VF a) { return {_mm256_andnot_ps(_mm256_set1_ps(-0.f), a.v)}; }
inline VF vrcp_ge1(VF a) {  // the 12-bit estimate and one Newton step (~1e-7 relative)
  const __m256 r = _mm256_rcp_ps(a.v);
  return {_mm256_mul_ps(r, _mm256_fnmadd_ps(a.v, r, _mm256_set1_ps(2.f)))};
}
inline VF vselect_pos(VF c, VF a, VF b) {
  return {_mm256_blendv_ps(b.v, a.v, _mm256_cmp_ps(c.v, _mm256_setzero_ps(), _CMP_GT_OQ))};
}
inline VF vfrexp_sqrt2(VF x, VF* e) {  // as the AVX-512 one, from the bits
  const __m256i bits = _mm256_castps_si256(x.v);
  const __m256 ev = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(bits, 23), _mm256_set1_epi32(127)));
  const __m256 m = _mm256_castsi256_ps(
      _mm256_or_si256(_mm256_and_si256(bits, _mm256_set1_epi32(0x7fffff)), _mm256_set1_epi32(0x3f800000)));
  const __m256 big = _mm256_cmp_ps(m, _mm256_set1_ps(1.41421356f), _CMP_GT_OQ);
  *e = {_mm256_add_ps(ev, _mm256_and_ps(big, _mm256_set1_ps(1.f)))};
  return {_mm256_blendv_ps(m, _mm256_mul_ps(m, _mm256_set1_ps(0.5f)), big)};
}
inline void vstream(float* p, VF a) { _mm256_stream_ps(p, a.v); }  // p 32-byte aligned
inline void vstream_fence() { _mm_sfence(); }
inline VF vmask_keys(VF s, VF lo, VF hi, VF ghi, float j) {
  const __m256 jv = _mm256_set1_ps(j);
  const __m256 win = _mm256_and_ps(_mm256_cmp_ps(lo.v, jv, _CMP_LE_OQ), _mm256_cmp_ps(jv, hi.v, _CMP_LE_OQ));
  const __m256 ok = _mm256_or_ps(win, _mm256_cmp_ps(jv, ghi.v, _CMP_LE_OQ));
  return {_mm256_blendv_ps(_mm256_set1_ps(-INFINITY), s.v, ok)};
}
#else
struct VF {
  static constexpr int W = 1;
  float v;
};
inline VF vload(const float* p) { return {*p}; }
inline void vstore(float* p, VF a) { *p = a.v; }
inline VF vzero() { return {0.f}; }
inline VF vset1(float x) { return {x}; }
inline VF vfma(VF a, VF b, VF c) { return {std::fma(a.v, b.v, c.v)}; }
inline VF vadd(VF a, VF b) { return {a.v + b.v}; }
inline VF vsub(VF a, VF b) { return {a.v - b.v}; }
inline VF vmul(VF a, VF b) { return {a.v * b.v}; }
inline VF vmax(VF a, VF b) { return {a.v > b.v ? a.v : (b.v != b.v ? b.v : (a.v != a.v ? a.v : b.v))}; }
inline float vreduce_max(VF a) { return a.v; }
inline float vreduce_add(VF a) { return a.v; }
inline VF vexp2(VF x) { return {std::exp2(x.v)}; }
inline VF vraise(VF a, VF b, float slack) { return {b.v > a.v + slack ? b.v : a.v}; }
inline VF vneginf_to_zero(VF x) { return {x.v == -INFINITY ? 0.f : x.v}; }
inline VF vdiv(VF a, VF b) { return {a.v / b.v}; }
inline VF vabs(VF a) { return {std::fabs(a.v)}; }
inline VF vrcp_ge1(VF a) { return {1.f / a.v}; }
inline VF vselect_pos(VF c, VF a, VF b) { return {c.v > 0.f ? a.v : b.v}; }
inline VF vfrexp_sqrt2(VF x, VF* e) {
  int ei = 0;
  float m = std::frexp(x.v, &ei);  // [1/2, 1)
  if (m < 0.70710678f) {
    m *= 2.f;
    --ei;
  }
  *e = {float(ei)};
  return {m};
}
inline void vstream(float* p, VF a) { *p = a.v; }
inline void vstream_fence() {}
inline VF vmask_keys(VF s, VF lo, VF hi, VF ghi, float j) {
  return {((lo.v <= j && j <= hi.v) || j <= ghi.v) ? s.v : -INFINITY};
}
#endif

// ln x for x positive, normal and finite (other lanes: unspecified; callers select them away):
// e ln 2 + ln m, ln m = 2 atanh(s) = 2 (s + s^3/3 + .. + s^9/9), s = (m - 1)/(m + 1), |s| <= 0.172
// (the first term left out is under 1e-9 relative). Within 3 ulp of ln x on every ISA (checked at
// every 61st bit pattern of the normal floats); one division and ~12 vector ops, where the Monarch
// R-step made 64 calls of logf per block (one per row).
inline VF vlog(VF x) {
  VF e;
  const VF m = vfrexp_sqrt2(x, &e), one = vset1(1.f);
  const VF s = vdiv(vsub(m, one), vadd(m, one)), s2 = vmul(s, s);
  VF p = vset1(2.f / 9.f);
  p = vfma(p, s2, vset1(2.f / 7.f));
  p = vfma(p, s2, vset1(2.f / 5.f));
  p = vfma(p, s2, vset1(2.f / 3.f));
  p = vfma(p, s2, vset1(2.f));
  return vfma(e, vset1(0.6931471805599453f), vmul(p, s));
}

// Register-blocking shape of the GEMM micro-kernel: MR rows x NV vectors of C in registers.
#if STRATA_ISA_LEVEL == 2
constexpr int kMR = 6, kNV = 4;  // 24 accumulators of 32 zmm
#elif STRATA_ISA_LEVEL == 1
constexpr int kMR = 6, kNV = 2;  // 12 accumulators of 16 ymm
#else
constexpr int kMR = 4, kNV = 4;
#endif

// Transposes one W x W tile: dst[c * ldd + r] = row(r)[c] for r, c < VF::W (in registers), the W
// source rows given by row(r) (a pointer each: rows in any order, e.g. through a permutation).
// vtranspose below is the case of rows lds apart.
// (AVX-512: the maskz forms with a full mask are the same instructions; the plain forms pass
// _mm512_undefined_ps(), which GCC 12 flags as uninitialised under -Werror.)
// STREAM: the W destination rows are whole aligned vectors written once (e.g. the user's output
// rows), stored non-temporally (see vstream; vstream_fence after the last).
#if STRATA_ISA_LEVEL == 2
template <bool STREAM = false, class Row>
inline void vtranspose_rows(Row row, float* dst, int64_t ldd) {
  __m512 r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(row(i));
  for (int i = 0; i < 16; i += 2) {  // interleave row pairs (32-bit)
    t[i] = _mm512_maskz_unpacklo_ps(0xffff, r[i], r[i + 1]);
    t[i + 1] = _mm512_maskz_unpackhi_ps(0xffff, r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {  // 64-bit pairs
    r[i] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int h = 0; h < 16; h += 8)  // 128-bit lanes, rows 4 apart
    for (int i = 0; i < 4; ++i) {
      t[h + i] = _mm512_maskz_shuffle_f32x4(0xffff, r[h + i], r[h + i + 4], 0x88);
      t[h + i + 4] = _mm512_maskz_shuffle_f32x4(0xffff, r[h + i], r[h + i + 4], 0xdd);
    }
  for (int i = 0; i < 8; ++i) {  // 128-bit lanes, rows 8 apart
    r[i] = _mm512_maskz_shuffle_f32x4(0xffff, t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_maskz_shuffle_f32x4(0xffff, t[i], t[i + 8], 0xdd);
  }
  for (int i = 0; i < 16; ++i) {
    if constexpr (STREAM) {
      _mm512_stream_ps(dst + i * ldd, r[i]);
    } else {
      _mm512_storeu_ps(dst + i * ldd, r[i]);
    }
  }
}
#elif STRATA_ISA_LEVEL == 1
template <bool STREAM = false, class Row>
inline void vtranspose_rows(Row row, float* dst, int64_t ldd) {
  __m256 r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(row(i));
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    r[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm256_permute2f128_ps(r[i], r[i + 4], 0x20);
    t[i + 4] = _mm256_permute2f128_ps(r[i], r[i + 4], 0x31);
  }
  for (int i = 0; i < 8; ++i) {
    if constexpr (STREAM) {
      _mm256_stream_ps(dst + i * ldd, t[i]);
    } else {
      _mm256_storeu_ps(dst + i * ldd, t[i]);
    }
  }
}
#else
template <bool STREAM = false, class Row>
inline void vtranspose_rows(Row row, float* dst, int64_t ldd) { dst[0] = row(0)[0]; (void)ldd; }
#endif
inline void vtranspose(const float* src, int64_t lds, float* dst, int64_t ldd) {
  vtranspose_rows([src, lds](int i) { return src + i * lds; }, dst, ldd);
}
