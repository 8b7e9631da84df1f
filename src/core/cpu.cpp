// src/core/cpu.cpp: run-time CPU feature detection (cpuid + xgetbv) and the dispatch ISA.
#include "strata/cpu.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/bf16_gemm.h"
#include "strata/error.h"

namespace strata {
namespace {

uint64_t xgetbv0() {
  uint32_t eax, edx;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (uint64_t(edx) << 32) | eax;
}

CpuFeatures detect() {
  CpuFeatures f;
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool osxsave = (c >> 27) & 1, fma = (c >> 12) & 1;
  if (!osxsave) return f;
  const uint64_t xcr0 = xgetbv0();
  const bool os_avx = (xcr0 & 0x6) == 0x6;                // XMM + YMM state
  const bool os_avx512 = os_avx && (xcr0 & 0xe0) == 0xe0;  // opmask + ZMM state
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return f;
  f.fma = fma && os_avx;
  f.avx2 = os_avx && ((b >> 5) & 1);
  f.avx512f = os_avx512 && ((b >> 16) & 1);
  f.avx512dq = os_avx512 && ((b >> 17) & 1);
  f.avx512bw = os_avx512 && ((b >> 30) & 1);
  f.avx512vl = os_avx512 && ((b >> 31) & 1);
  f.avx512_fp16 = os_avx512 && ((d >> 23) & 1);
  const bool amx_tile = (d >> 24) & 1, amx_bf16 = (d >> 22) & 1;
  unsigned a1, b1, c1, d1;
  if (__get_cpuid_count(7, 1, &a1, &b1, &c1, &d1)) f.avx512_bf16 = os_avx512 && ((a1 >> 5) & 1);
  // AMX also needs the OS to grant the tile data state (Linux: arch_prctl ARCH_REQ_XCOMP_PERM).
  const bool os_amx = (xcr0 & (uint64_t(3) << 17)) == (uint64_t(3) << 17);
  if (amx_tile && os_amx) {
#ifdef __linux__
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    const bool granted = syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
    const bool granted = false;
#endif
    f.amx_tile = granted;
    f.amx_bf16 = granted && amx_bf16;
  }
  return f;
}

Isa best_isa(const CpuFeatures& f) {
  if (f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && f.fma) return Isa::avx512;
  if (f.avx2 && f.fma) return Isa::avx2;
  return Isa::scalar;
}

bool supported(const CpuFeatures& f, Isa isa) { return int(isa) <= int(best_isa(f)); }

Isa initial_isa() {
  const CpuFeatures& f = cpu_features();
  Isa isa = best_isa(f);
  if (const char* e = std::getenv("STRATA_ISA")) {
    Isa want = isa;
    if (!std::strcmp(e, "scalar")) want = Isa::scalar;
    else if (!std::strcmp(e, "avx2")) want = Isa::avx2;
    else if (!std::strcmp(e, "avx512")) want = Isa::avx512;
    else throw_arg("strata", "STRATA_ISA", "one of scalar, avx2, avx512", e);
    if (!supported(f, want)) throw_arg("strata", "STRATA_ISA", "an ISA this CPU supports", e);
    isa = want;
  }
  return isa;
}

std::atomic<int>& isa_slot() {
  static std::atomic<int> slot{int(initial_isa())};
  return slot;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detect();
  return f;
}

Isa active_isa() { return Isa(isa_slot().load()); }

void set_isa(Isa isa) {
  if (!supported(cpu_features(), isa)) throw_arg("set_isa", "isa", "an ISA this CPU supports", isa_name(isa));
  isa_slot().store(int(isa));
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::scalar: return "scalar";
    case Isa::avx2: return "avx2";
    case Isa::avx512: return "avx512";
  }
  return "?";
}

const char* compute_name(Compute c) {
  switch (c) {
    case Compute::automatic: return "auto";
    case Compute::fp32: return "fp32";
    case Compute::avx512_bf16: return "avx512_bf16";
    case Compute::amx_bf16: return "amx_bf16";
  }
  return "?";
}

Compute parse_compute(const char* where, const std::string& s) {
  for (Compute c : {Compute::automatic, Compute::fp32, Compute::avx512_bf16, Compute::amx_bf16})
    if (s == compute_name(c)) return c;
  throw_arg(where, "compute", "one of auto, fp32, avx512_bf16, amx_bf16", s);
}

namespace {

// Whether a bf16 engine can run now: the CPU has it and the active ISA is avx512 (whose kernel
// units hold the bf16 paths).
bool engine_here(Compute c) {
  const CpuFeatures& f = cpu_features();
  const bool avx512 = active_isa() == Isa::avx512 && f.avx512_bf16;
  return c == Compute::amx_bf16 ? avx512 && f.amx_bf16 : avx512;
}

}  // namespace

const Bf16DotRates& bf16_dot_rates() {
  static const Bf16DotRates r = [] {
    if (!cpu_features().avx512_bf16) return Bf16DotRates{};
    const cpu::bf16::DotRates m = cpu::bf16::measure_dot_rates();
    return Bf16DotRates{m.dot, m.fma};
  }();
  return r;
}

Compute automatic_compute(bool amx_here, bool vdpbf16ps_here, const Bf16DotRates& rates) {
  if (amx_here) return Compute::amx_bf16;
  const bool pays = rates.fma > 0 && rates.dot >= kVdpbf16psPays * rates.fma;
  return vdpbf16ps_here && pays ? Compute::avx512_bf16 : Compute::fp32;
}

Compute resolve_compute(const char* where, Compute want, bool bf16_inputs) {
  if (!bf16_inputs || want == Compute::fp32) return Compute::fp32;
  if (want == Compute::automatic) {  // (the rule: strata/cpu.h)
    if (engine_here(Compute::amx_bf16)) return Compute::amx_bf16;
    if (!engine_here(Compute::avx512_bf16)) return Compute::fp32;  // no probe where it cannot run
    return automatic_compute(false, true, bf16_dot_rates());
  }
  STRATA_CHECK_ARG(engine_here(want), where, "compute",
                   detail::cat("an engine this CPU and the active ISA (", isa_name(active_isa()), ") have: ",
                               cpu_summary()),
                   compute_name(want));
  return want;
}

std::string cpu_summary() {
  const CpuFeatures& f = cpu_features();
  std::string s = std::string("isa=") + isa_name(active_isa()) + " features:";
  if (f.avx2) s += " avx2";
  if (f.fma) s += " fma";
  if (f.avx512f) s += " avx512f";
  if (f.avx512bw) s += " avx512bw";
  if (f.avx512_bf16) s += " avx512_bf16";
  if (f.avx512_fp16) s += " avx512_fp16";
  if (f.amx_tile) s += " amx_tile";
  if (f.amx_bf16) s += " amx_bf16";
  return s;
}

}  // namespace strata
