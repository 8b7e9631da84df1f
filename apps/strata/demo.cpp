// apps/strata/demo.cpp: `strata demo`: runs the demo sections in order and prints a summary.
#include "demo.h"

#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <filesystem>

#include "commands.h"
#include "session.h"
#include "strata/error.h"

namespace strata::app {

const FmaPeak& DemoContext::peak() {
  if (!peak_) peak_ = measure_fma_peak(threads);
  return *peak_;
}

std::vector<DemoSection> demo_sections() {
  return {
      {"attention-check", "dense attention: correctness vs strata::reference and torch SDPA",
       demo_attention_check},
      {"attention-speed", "dense attention: speed vs torch SDPA (fp32, d 64, fixed 16384 tokens)",
       demo_attention_speed},
      {"convert", "zero-shot conversion of all-MiniLM-L6-v2: STS-B and long-passage fidelity vs FLOPs",
       demo_convert},
  };
}

CLI::App* add_demo(CLI::App& app, DemoOptions& o) {
  CLI::App* cmd = app.add_subcommand("demo", "Show that the kernels work and how fast they are (~2 minutes)");
  cmd->add_option("--out", o.out, "folder for the JSON and PNG results (created if missing)")
      ->capture_default_str()
      ->type_name("DIR");
  cmd->add_option("--threads", o.threads, "threads for strata and torch (default: STRATA_NUM_THREADS or all)")
      ->check(CLI::Range(1, 4096));
  std::vector<std::string> names;
  for (const DemoSection& s : demo_sections()) names.push_back(s.name);
  cmd->add_option("--section", o.sections, "run only these sections (repeatable; default: all)")
      ->check(CLI::IsMember(names))
      ->type_name("NAME");
  return cmd;
}

int run_demo(const DemoOptions& o) {
  std::error_code ec;
  std::filesystem::create_directories(o.out, ec);
  STRATA_CHECK(!ec, "strata demo: argument '--out': cannot create folder '", o.out, "': ", ec.message());
  DemoContext ctx;
  ctx.out_dir = o.out;
  ctx.threads = configure_threads(o.threads);
  fmt::print("{}; {} threads; output folder {}\n", version_string(), ctx.threads, o.out);

  std::vector<std::pair<std::string, bool>> results;
  const auto t0 = std::chrono::steady_clock::now();
  for (const DemoSection& s : demo_sections()) {
    if (!o.sections.empty() && std::find(o.sections.begin(), o.sections.end(), s.name) == o.sections.end())
      continue;
    fmt::print("\n== {}: {}\n", s.name, s.title);
    std::fflush(stdout);
    results.emplace_back(s.name, s.run(ctx));
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  fmt::print("\n== summary ({:.0f} s)\n", secs);
  int failed = 0;
  for (const auto& [name, ok] : results) {
    fmt::print("  {}  {}\n", ok ? "PASS" : "FAIL", name);
    failed += !ok;
  }
  if (failed) fmt::print(stderr, "strata demo: {} section(s) FAILED\n", failed);
  return failed ? 1 : 0;
}

}  // namespace strata::app
