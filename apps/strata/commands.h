// apps/strata/commands.h: the CLI's commands. Each has an options struct, an add_* that registers
// its CLI11 subcommand (flags bound to the struct) and a run_* that returns the exit status.
#pragma once
#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace strata::app {

struct InfoOptions {
  int threads = 0;    // 0: default
  bool peak = false;  // also measure the FMA peak
};
CLI::App* add_info(CLI::App& app, InfoOptions& o);
int run_info(const InfoOptions& o);

struct BenchAttentionOptions {
  bool quick = false;
  std::string json, csv;  // "" = do not write
  int threads = 0;        // 0: default
  int reps = 0;           // 0: 5 (3 with --quick)
  // Row filters (empty: all rows of the sweep).
  std::vector<int64_t> seq, head_dim;
  std::vector<std::string> dtype, pass;
};
CLI::App* add_bench_attention(CLI::App& bench, BenchAttentionOptions& o);
int run_bench_attention(const BenchAttentionOptions& o);

struct DemoOptions {
  std::string out = "out";
  int threads = 0;
  std::vector<std::string> sections;  // empty: all
};
CLI::App* add_demo(CLI::App& app, DemoOptions& o);
int run_demo(const DemoOptions& o);

}  // namespace strata::app
