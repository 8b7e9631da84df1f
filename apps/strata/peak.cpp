// apps/strata/peak.cpp: picks the widest FMA loop this CPU runs (run-time check), calibrates it
// to ~0.2 s, and times it on one thread and on all threads at once (best of 5 each).
#include "peak.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "strata/cpu.h"
#include "strata/error.h"

namespace strata::app {
namespace {

using Loop = float (*)(long);

// 12 independent scalar chains (the fallback when the CPU has neither AVX-512 nor AVX2+FMA).
float fma_loop_scalar(long iters) {
  float c[12];
  for (int j = 0; j < 12; ++j) c[j] = float(j);
  for (long i = 0; i < iters; ++i)
    for (int j = 0; j < 12; ++j) c[j] = c[j] * 0.999999f + 1e-7f;
  float r = 0.f;
  for (float x : c) r += x;
  return r;
}

struct Kernel {
  const char* isa;
  Loop loop;
  double flops_per_iter;  // 12 chains x lanes x 2
};

Kernel pick_kernel() {
  const CpuFeatures& f = cpu_features();
  if (f.avx512f) return {"avx512", detail::fma_loop_avx512, 12.0 * 16 * 2};
  if (f.avx2 && f.fma) return {"avx2", detail::fma_loop_avx2, 12.0 * 8 * 2};
  return {"scalar", fma_loop_scalar, 12.0 * 2};
}

std::atomic<float> g_sink{0.f};  // keeps the loops' results alive

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Returns GFLOP/s summed over `threads` threads that each run `iters` iterations concurrently.
double run_concurrent(const Kernel& k, long iters, int threads) {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<double> secs(size_t(threads), 0.0);
  auto body = [&](int t) {
    ready.fetch_add(1);
    while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
    const auto t0 = std::chrono::steady_clock::now();
    const float r = k.loop(iters);
    secs[size_t(t)] = seconds_since(t0);
    g_sink.store(r, std::memory_order_relaxed);
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(body, t);
  while (ready.load() < threads - 1) std::this_thread::yield();
  go.store(true, std::memory_order_release);
  // The calling thread is thread 0.
  {
    const auto t0 = std::chrono::steady_clock::now();
    const float r = k.loop(iters);
    secs[0] = seconds_since(t0);
    g_sink.store(r, std::memory_order_relaxed);
  }
  for (auto& th : pool) th.join();
  double gflops = 0;
  for (double s : secs) gflops += k.flops_per_iter * double(iters) / s * 1e-9;
  return gflops;
}

}  // namespace

FmaPeak measure_fma_peak(int threads) {
  STRATA_CHECK_ARG(threads >= 1, "measure_fma_peak", "threads", ">= 1", threads);
  const Kernel k = pick_kernel();
  // Calibrate: grow the iteration count until one run takes >= 20 ms, then aim at 0.2 s.
  long iters = 1 << 16;
  double s = 0;
  for (;;) {
    const auto t0 = std::chrono::steady_clock::now();
    g_sink.store(k.loop(iters), std::memory_order_relaxed);
    s = seconds_since(t0);
    if (s >= 0.02) break;
    iters *= 4;
  }
  iters = std::max(1L, long(double(iters) * 0.2 / s));

  FmaPeak p;
  p.isa = k.isa;
  p.threads = threads;
  for (int rep = 0; rep < 5; ++rep) {
    p.per_core_gflops = std::max(p.per_core_gflops, run_concurrent(k, iters, 1));
    p.all_gflops = std::max(p.all_gflops, run_concurrent(k, iters, threads));
  }
  return p;
}

}  // namespace strata::app
