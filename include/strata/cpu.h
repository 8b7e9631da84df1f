// strata/cpu.h: CPU feature detection (run time) and the ISA the kernels dispatch to.
#pragma once
#include <cstdint>
#include <string>

namespace strata {

enum class Isa { scalar = 0, avx2 = 1, avx512 = 2 };

struct CpuFeatures {
  bool avx2 = false, fma = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512_bf16 = false, avx512_fp16 = false;
  bool amx_tile = false, amx_bf16 = false;  // CPU bits AND the OS grants the tile state
};

const CpuFeatures& cpu_features();
// Best ISA this CPU supports, lowered by the env var STRATA_ISA=scalar|avx2|avx512 or set_isa().
Isa active_isa();
void set_isa(Isa isa);  // throws strata::Error if the CPU lacks it
const char* isa_name(Isa isa);
std::string cpu_summary();

// What a kernel's products (attention: Q K^T and P V) compute in, for bfloat16 inputs (float32
// inputs always compute in fp32):
//   automatic    the fastest engine this CPU and the active ISA have: AMX-BF16 tiles (amx_bf16)
//                where the OS grants the tile state; else AVX512-BF16 (avx512_bf16) where this
//                core's vdpbf16ps does more multiply-adds per second than its fp32 FMAs, by at
//                least kVdpbf16psPays (bf16_dot_rates: measured once per process); else fp32.
//                The instruction does twice an FMA's multiply-adds, but its throughput is the
//                core's: on some CPUs (an Intel Xeon without AMX exposed) it issues at a fraction
//                of the FMA's rate and the bf16 forward runs slower than fp32 compute, so auto
//                computes in fp32 there (bench/bf16_engines.py; docs/notes.md has the numbers)
//   fp32         fp32 products (the bf16 inputs widened exactly), on every CPU
//   avx512_bf16, amx_bf16   that engine; strata::Error naming 'compute' where it is not there
//                (tests and benchmarks use them to compare the engines)
// Either bf16 engine accumulates in fp32 and keeps the softmax and its statistics in fp32; what
// it rounds is stated by the kernel (e.g. strata/attention.h). Pass an explicit engine where the
// choice must not depend on the machine (auto may differ between CPUs, never between the calls
// of one process).
enum class Compute : uint8_t { automatic = 0, fp32 = 1, avx512_bf16 = 2, amx_bf16 = 3 };
const char* compute_name(Compute c);  // "auto", "fp32", "avx512_bf16", "amx_bf16"
// The Compute named s (one of the names above); strata::Error naming `where` and 'compute'.
Compute parse_compute(const char* where, const std::string& s);
// The engine `want` runs on here for inputs of bf16 (true) or fp32: fp32, avx512_bf16 or amx_bf16
// (never automatic). Throws strata::Error naming `where` and 'compute' when an explicit bf16
// engine is not there (the CPU lacks it, or the active ISA is below avx512).
Compute resolve_compute(const char* where, Compute want, bool bf16_inputs);

// This core's multiply-accumulate rates, one thread, GMAC/s (MAC per ns): vdpbf16ps (2 bf16
// products per fp32 lane) and fp32 FMA, register-resident chains, the best of interleaved rounds.
// Measured on first use (about a millisecond) and kept for the process; zeros where the CPU has
// no AVX512-BF16.
struct Bf16DotRates {
  double dot = 0, fma = 0;
};
const Bf16DotRates& bf16_dot_rates();
// auto takes vdpbf16ps where dot >= kVdpbf16psPays * fma: the engine's kernels also round P (and
// dS) to bf16 pairs and pack Q, so the instruction must gain clearly (the forward's speed over fp32
// compute tracks the instructions' rate ratio: docs/notes.md).
constexpr double kVdpbf16psPays = 1.25;
// The engine automatic resolves to, given which engines can run here (amx, vdpbf16ps) and the
// rates: amx_bf16, avx512_bf16 or fp32 (the rule above, a pure function for tests).
Compute automatic_compute(bool amx_here, bool vdpbf16ps_here, const Bf16DotRates& rates);

}  // namespace strata
