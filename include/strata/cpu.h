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
  bool amx_bf16_cpu = false;                 // the CPU's AMX-BF16 bit alone (granted or not)
};

const CpuFeatures& cpu_features();
// Best ISA this CPU supports, lowered by the env var STRATA_ISA=scalar|avx2|avx512 or set_isa().
Isa active_isa();
void set_isa(Isa isa);  // throws strata::Error if the CPU lacks it
const char* isa_name(Isa isa);
std::string cpu_summary();

// What a kernel's products (attention: Q K^T and P V) compute in, for bfloat16 inputs (float32
// inputs always compute in fp32):
//   automatic    bf16 products with fp32 accumulation on the best engine this CPU and the active
//                ISA have: AMX-BF16 tiles (amx_bf16), else AVX512-BF16 (avx512_bf16) on CPUs
//                without AMX (AMD Zen 4/5: vdpbf16ps does twice an FMA's multiply-adds); fp32
//                elsewhere: CPUs without them, an ISA lowered below avx512, and AMX CPUs whose OS
//                withholds the tile state (on the Intel Xeon with AMX this was written on,
//                vdpbf16ps ran the forward 1.6x SLOWER than fp32 FMAs: 655 vs 402 ms, AMX 131 ms,
//                N = 4096, d = 64; bench/bf16_engines.py, docs/results.md)
//   fp32         fp32 products (the bf16 inputs widened exactly), on every CPU
//   avx512_bf16, amx_bf16   that engine; strata::Error naming 'compute' where it is not there
//                (tests and benchmarks use them to compare the engines)
// Either bf16 engine accumulates in fp32 and keeps the softmax and its statistics in fp32; what
// it rounds is stated by the kernel (e.g. strata/attention.h).
enum class Compute : uint8_t { automatic = 0, fp32 = 1, avx512_bf16 = 2, amx_bf16 = 3 };
const char* compute_name(Compute c);  // "auto", "fp32", "avx512_bf16", "amx_bf16"
// The Compute named s (one of the names above); strata::Error naming `where` and 'compute'.
Compute parse_compute(const char* where, const std::string& s);
// The engine `want` runs on here for inputs of bf16 (true) or fp32: fp32, avx512_bf16 or amx_bf16
// (never automatic). Throws strata::Error naming `where` and 'compute' when an explicit bf16
// engine is not there (the CPU lacks it, or the active ISA is below avx512).
Compute resolve_compute(const char* where, Compute want, bool bf16_inputs);

}  // namespace strata
