// data/counter_rng.h: the random numbers of the training datasets (torch-free). Every batch is a
// pure function of (seed, step, micro-batch index): a resumed run draws exactly the batches of the
// uninterrupted one, so the trainer's "data position" is just the step. The generator is splitmix64
// (Steele, Lea & Flood 2014: a 64-bit counter through a bijective mixer; passes BigCrush), keyed by
// the tuple; normals by Box-Muller, so the output is the same across standard libraries
// (std::normal_distribution's is not), up to the last bit of the libm's log / sin / cos.
#pragma once
#include <cmath>
#include <cstdint>

#include "strata/error.h"

namespace strata::data {

// The splitmix64 finaliser: a bijection of 64-bit words that spreads every input bit over the output.
inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Which dataset draws: distinct streams for the same (seed, step, micro).
enum class RngStream : uint64_t { char_windows = 1, icr_prompts = 2, ett_windows = 3 };

class CounterRng {
 public:
  // The stream of (seed, step, micro, stream); step and micro must be >= 0 (strata::Error otherwise).
  CounterRng(uint64_t seed, int64_t step, int64_t micro, RngStream stream) {
    STRATA_CHECK_ARG(step >= 0, "data batch", "step", ">= 0", step);
    STRATA_CHECK_ARG(micro >= 0, "data batch", "micro", ">= 0", micro);
    // Each stage mixes the previous state with one key: distinct tuples give distinct states
    // (up to 64-bit collisions) because mix64 is a bijection.
    state_ = mix64(seed + kGamma * (uint64_t(stream) + 1));
    state_ = mix64(state_ ^ uint64_t(step));
    state_ = mix64(state_ ^ uint64_t(micro));
  }

  // The next 64 random bits.
  uint64_t next() { return mix64(state_ += kGamma); }

  // Uniform on [0, 1) with 53 random bits.
  double uniform() { return double(next() >> 11) * 0x1.0p-53; }

  // Uniform integer in [0, n), n >= 1: the high word of a 64x64-bit product (Lemire 2019, without
  // the rejection step: the bias is below n / 2^64, under 1e-12 for any data set here).
  uint64_t below(uint64_t n) { return uint64_t((unsigned __int128)next() * n >> 64); }

  // Standard normal N(0, 1): Box-Muller, both values of a pair used in turn.
  double normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double u1 = double((next() >> 11) + 1) * 0x1.0p-53;  // (0, 1]: log(u1) is finite
    const double u2 = uniform();
    const double r = std::sqrt(-2.0 * std::log(u1));
    const double a = 6.283185307179586 * u2;
    spare_ = r * std::sin(a);
    has_spare_ = true;
    return r * std::cos(a);
  }

 private:
  static constexpr uint64_t kGamma = 0x9e3779b97f4a7c15ULL;  // 2^64 / golden ratio, splitmix64's increment
  uint64_t state_ = 0;
  double spare_ = 0;
  bool has_spare_ = false;
};

}  // namespace strata::data
