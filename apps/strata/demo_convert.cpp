// apps/strata/demo_convert.cpp: the demo's zero-shot conversion section: a small `strata convert`
// (300 STS-B pairs, 4 passages of 128 and 512 tokens, four methods).
#include <fmt/core.h>

#include "convert.h"
#include "demo.h"
#include "strata/error.h"

namespace strata::app {

bool demo_convert(DemoContext& ctx) {
  models::ConversionConfig cfg;
  for (const char* m : {"softmax", "monarch:T=2,B=8", "monarch:T=3", "nystrom:landmarks=32", "performer:features=128,seed=0"})
    cfg.methods.push_back(models::parse_conversion_method(m));
  cfg.sts_pairs = 300;
  cfg.passages = 4;
  cfg.long_lengths = {128, 512};
  try {
    const models::ConversionReport s = convert_and_report(cfg, ctx.out_dir + "/convert", /*plot=*/true);
    // PASS: the pipeline ran end to end and the softmax model is sane on this subset (the full
    // test set gives 82.03; 300 pairs land within a few points of it). The quality targets are
    // printed above as PASS/FAIL lines and judged on the full run (`strata convert`).
    const bool ok = s.softmax_spearman > 75;
    fmt::print("{}  softmax STS-B Spearman on 300 pairs {:.2f} (> 75 expected)\n", ok ? "PASS" : "FAIL",
               s.softmax_spearman);
    return ok;
  } catch (const Error& e) {
    // No model or data on this machine: say how to get them; not a failure of the library.
    fmt::print("SKIP  {}\n", e.what());
    return true;
  }
}

}  // namespace strata::app
