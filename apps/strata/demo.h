// apps/strata/demo.h: `strata demo` is a list of sections; each checks or shows one thing and
// returns whether it passed. A later feature adds its section to demo_sections() (demo.cpp).
#pragma once
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "peak.h"

namespace strata::app {

struct DemoContext {
  std::string out_dir;  // where sections write JSON / PNG files (exists)
  int threads = 1;
  // The fp32 FMA peak, measured on first use (2 seconds), shared by the sections.
  const FmaPeak& peak();

 private:
  std::optional<FmaPeak> peak_;
};

struct DemoSection {
  std::string name;  // for --section, e.g. "attention-check"
  std::string title;  // one line, printed as the section's heading
  std::function<bool(DemoContext&)> run;  // prints its rows; false when something FAILed
};

// Every section, in the order the demo runs them.
std::vector<DemoSection> demo_sections();

// Dense attention: ours vs strata::reference and vs SDPA on small awkward shapes (causal, window,
// GQA, bf16, both layouts), fwd and bwd; prints PASS/FAIL per row.
bool demo_attention_check(DemoContext& ctx);

// Dense attention speed, ours vs SDPA (N 1024/2048/4096, d 64, fp32, fwd and fwd+bwd); writes
// <out>/demo_attention.json and, when Python with matplotlib is there, demo_attention.png.
bool demo_attention_speed(DemoContext& ctx);

// Zero-shot conversion of all-MiniLM-L6-v2 (a small `strata convert`); writes <out>/convert/.
// Skips (passes) with a message when the model or the shared data is not installed.
bool demo_convert(DemoContext& ctx);

}  // namespace strata::app
