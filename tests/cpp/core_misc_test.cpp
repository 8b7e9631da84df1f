// tests/cpp/core_misc_test.cpp: thread pool, dtype conversions, CPU dispatch.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "strata/cpu.h"
#include "strata/tensor.h"
#include "strata/threading.h"

namespace strata {
namespace {

TEST(Threading, ParallelForCoversEveryIndexOnce) {
  for (int threads : {1, 2, 5}) {
    set_num_threads(threads);
    std::vector<std::atomic<int>> hits(1001);
    parallel_for(1001, 7, [&](int64_t b, int64_t e, int tid) {
      EXPECT_GE(tid, 0);
      EXPECT_LT(tid, threads);
      for (int64_t i = b; i < e; ++i) hits[size_t(i)]++;
    });
    for (auto& h : hits) EXPECT_EQ(h.load(), 1);
  }
}

TEST(Threading, ExceptionIsRethrownAndPoolStaysUsable) {
  set_num_threads(2);
  EXPECT_THROW(parallel_for(100, 1, [](int64_t b, int64_t, int) {
                 if (b == 37) throw std::runtime_error("boom");
               }),
               std::runtime_error);
  std::atomic<int64_t> sum{0};
  parallel_for(100, 3, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) sum += i;
  });
  EXPECT_EQ(sum.load(), 4950);
}

TEST(Threading, RejectsZeroThreads) {
  try {
    set_num_threads(0);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'n'"), std::string::npos);
  }
}

TEST(DType, Bf16RoundTripAndRounding) {
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f)), 1.0f);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(-3.5f)), -3.5f);
  // 1 + 2^-8 is a tie between 1 and 1 + 2^-7: round to even (1).
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 1.0f / 256)), 1.0f);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
  EXPECT_TRUE(std::isinf(bf16_to_f32(f32_to_bf16(INFINITY))));
}

TEST(DType, F16RoundTrip) {
  for (float x : {0.f, 1.f, -2.5f, 65504.f, 6.1035156e-05f, 5.9604645e-08f, 0.333251953125f})
    EXPECT_EQ(f16_to_f32(f32_to_f16(x)), x) << x;
  EXPECT_TRUE(std::isinf(f16_to_f32(f32_to_f16(1e6f))));
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(NAN))));
}

TEST(Cpu, DispatchIsConsistent) {
  const CpuFeatures& f = cpu_features();
  if (f.avx512f) {
    EXPECT_TRUE(f.avx2);
  }
  EXPECT_NO_THROW(set_isa(Isa::scalar));
  EXPECT_EQ(active_isa(), Isa::scalar);
  if (f.avx2 && f.fma) {
    set_isa(Isa::avx2);
    EXPECT_EQ(active_isa(), Isa::avx2);
  }
  if (!f.avx512f) {
    EXPECT_THROW(set_isa(Isa::avx512), Error);
  } else {
    set_isa(Isa::avx512);
  }
  EXPECT_FALSE(cpu_summary().empty());
}

}  // namespace
}  // namespace strata
