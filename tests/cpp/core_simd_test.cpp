// tests/cpp/core_simd_test.cpp: the vector math of src/core/simd.h that the kernels' tests do not
// pin down on their own, checked on every ISA this CPU runs.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/bf16_gemm.h"
#include "strata/cpu.h"

double vlog_worst_ulp_scalar(uint32_t step, float* worst_x);
double vlog_worst_ulp_avx2(uint32_t step, float* worst_x);
double vlog_worst_ulp_avx512(uint32_t step, float* worst_x);

namespace {

// vlog (the Monarch R-step's ln Z) within 3 ulp of ln x over the normal floats, every 61st bit
// pattern (~35M values per ISA). Why it needs its own test: an error of ~1e-5 in ln Z moves the
// Monarch outputs by less than their tests' tolerance (one series term of vlog dropped passed all
// 230 Monarch tests), yet it is 40x the float rounding of ln Z.
TEST(Simd, VlogWithinThreeUlpOnEveryIsa) {
  const strata::CpuFeatures& f = strata::cpu_features();
  struct Unit {
    const char* isa;
    bool runs;
    double (*worst)(uint32_t, float*);
  };
  const Unit units[] = {
      {"scalar", true, vlog_worst_ulp_scalar},
      {"avx2", f.avx2 && f.fma, vlog_worst_ulp_avx2},
      {"avx512", f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq, vlog_worst_ulp_avx512},
  };
  for (const Unit& u : units) {
    if (!u.runs) {
      std::printf("vlog: %s not on this CPU, not checked\n", u.isa);
      continue;
    }
    float x = 0.f;
    const double worst = u.worst(61, &x);
    EXPECT_LE(worst, 3.0) << u.isa << ": at x = " << x;
    std::printf("vlog %s: worst %.2f ulp (x = %g)\n", u.isa, worst, double(x));
  }
}


// ---- bf16 operand packing (src/core/bf16_gemm.h) -------------------------------------------------
// transpose_round against its definition, value for value (round to nearest even; normal values, so
// that the instruction's flushing of denormals does not enter): ragged widths (its tail path),
// rows below rows_pad (zeros), a source row stride past n.
uint16_t bf16_nearest_even(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

TEST(Bf16Operands, TransposeRoundMatchesItsDefinition) {
  if (!strata::cpu_features().avx512_bf16) GTEST_SKIP() << "this CPU has no AVX512-BF16";
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 3.f);
  for (int64_t rows : {1, 15, 16, 17, 45, 64})
    for (int64_t n : {1, 7, 16, 20, 48, 64}) {
      const int64_t lds = n + 5, rows_pad = (rows + 15) / 16 * 16 + 16, ldd = rows_pad + 32;
      std::vector<float> src(size_t(rows * lds));
      for (float& x : src) x = nd(rng);
      std::vector<uint16_t> dst(size_t(n * ldd), 0xffff);
      strata::cpu::bf16::transpose_round(src.data(), rows, n, lds, rows_pad, dst.data(), ldd);
      for (int64_t c = 0; c < n; ++c)
        for (int64_t r = 0; r < rows_pad; ++r) {
          const uint16_t want = r < rows ? bf16_nearest_even(src[size_t(r * lds + c)]) : 0;
          ASSERT_EQ(dst[size_t(c * ldd + r)], want)
              << "rows " << rows << ", n " << n << ": dst[" << c << "][" << r << "]";
        }
      for (int64_t c = 0; c < n; ++c)  // nothing written past rows_pad
        ASSERT_EQ(dst[size_t(c * ldd + rows_pad)], 0xffff) << "rows " << rows << ", n " << n;
    }
}

}  // namespace
