// apps/strata/bench_memory.cpp: `strata bench memory`: the peak memory of one dense-attention
// forward + backward above its inputs, strata's kernel against torch's SDPA (issue 15 item 4).
//
// Each (method, N) runs in a process of its own (this binary, re-executed with --child), so
// neither the allocator's cache nor strata's persistent workspace of an earlier call hides what
// one call needs: the child makes q, k, v (requiring grad) and dout, batch 1 x 8 heads x N x d
// float32 in BHSD, reads its resident set, resets the kernel's high-water mark (/proc/self/clear_refs
// "5"), runs the forward and backward through autograd (strata::torch::attention, or
// at::scaled_dot_product_attention) and prints VmHWM - that resident set: the outputs (o, dq, dk,
// dv, lse), what the autograd graph saves, and every workspace and temporary.
#include <fmt/core.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "data/files.h"
#include "report.h"
#include "session.h"
#include "strata/cpu.h"
#include "strata/error.h"
#include "strata/torch/attention.h"

extern char** environ;

namespace strata::app {
namespace {

// A field of /proc/self/status in bytes ("VmRSS", "VmHWM"); throws when it cannot be read.
int64_t status_bytes(const char* field) {
  std::ifstream f("/proc/self/status");
  std::string line;
  const std::string key = std::string(field) + ":";
  while (std::getline(f, line))
    if (line.rfind(key, 0) == 0) return std::stoll(line.substr(key.size())) * 1024;  // "  123 kB"
  throw Error(fmt::format("strata bench memory: /proc/self/status has no {} line (Linux only)", field));
}

// The child: one forward + backward of `method`, printing "peak_above_inputs_bytes N".
int run_child(const BenchMemoryOptions& o) {
  STRATA_CHECK(o.child == "strata" || o.child == "sdpa", "strata bench memory: argument '--child': expected strata or ",
               "sdpa, got '", o.child, "'");
  STRATA_CHECK(o.seq.size() == 1, "strata bench memory --child: expected one --seq, got ", o.seq.size());
  configure_threads(o.threads);
  at::manual_seed(0);
  const int64_t n = o.seq[0];
  const auto opts = at::TensorOptions().dtype(at::kFloat);
  at::Tensor q = at::randn({1, o.heads, n, o.head_dim}, opts).requires_grad_(true);
  at::Tensor k = at::randn({1, o.heads, n, o.head_dim}, opts).requires_grad_(true);
  at::Tensor v = at::randn({1, o.heads, n, o.head_dim}, opts).requires_grad_(true);
  const at::Tensor dout = at::randn({1, o.heads, n, o.head_dim}, opts);
  const int64_t base = status_bytes("VmRSS");
  {
    std::ofstream clear("/proc/self/clear_refs");
    clear << "5";  // resets VmHWM to the current resident set
    STRATA_CHECK(bool(clear), "strata bench memory: cannot write /proc/self/clear_refs (needed to reset VmHWM)");
  }
  at::Tensor out;
  if (o.child == "strata") {
    strata::torch::AttentionArgs a;
    a.causal = o.causal;
    a.layout = "bhsd";
    out = strata::torch::attention(q, k, v, a);
  } else {
    out = at::scaled_dot_product_attention(q, k, v, {}, 0.0, o.causal);
  }
  ::torch::autograd::backward({out}, {dout});
  fmt::print("peak_above_inputs_bytes {}\n", status_bytes("VmHWM") - base);
  return 0;
}

// Runs this binary as a child for (method, n) and returns what it printed, in bytes.
int64_t measure_in_child(const BenchMemoryOptions& o, const std::string& method, int64_t n) {
  std::vector<std::string> args = {"strata", "bench", "memory", "--child", method, "--seq", std::to_string(n),
                                   "--heads", std::to_string(o.heads), "--head-dim", std::to_string(o.head_dim),
                                   "--threads", std::to_string(o.threads)};
  if (!o.causal) args.push_back("--no-causal");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  int fd[2];
  STRATA_CHECK(pipe(fd) == 0, "strata bench memory: pipe() failed");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fd[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&fa, fd[0]);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, "/proc/self/exe", &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  close(fd[1]);
  STRATA_CHECK(rc == 0, "strata bench memory: cannot start /proc/self/exe (posix_spawn error ", rc, ")");
  std::string text;
  char buf[256];
  for (ssize_t got; (got = read(fd[0], buf, sizeof buf)) > 0;) text.append(buf, size_t(got));
  close(fd[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  const std::string key = "peak_above_inputs_bytes ";
  const size_t at = text.find(key);
  STRATA_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0 && at != std::string::npos, "strata bench memory: the ",
               method, " child (N = ", n, ") failed; it printed: ", text);
  return std::stoll(text.substr(at + key.size()));
}

}  // namespace

CLI::App* add_bench_memory(CLI::App& bench, BenchMemoryOptions& o) {
  CLI::App* cmd = bench.add_subcommand(
      "memory",
      "Peak memory of one dense-attention forward + backward above its inputs (batch 1, float32),\n"
      "strata vs torch SDPA, each (method, N) in a process of its own");
  cmd->add_option("--seq", o.seq, "sequence lengths (repeatable; default 16384 32768)")->type_name("N");
  cmd->add_option("--heads", o.heads, "heads (default 8)");
  cmd->add_option("--head-dim", o.head_dim, "head dim (default 64)");
  cmd->add_flag("--causal,!--no-causal", o.causal, "causal mask (default) or none");
  cmd->add_option("--threads", o.threads, "threads (default: all)");
  cmd->add_option("--json", o.json, "write the rows as JSON here");
  cmd->add_option("--child", o.child, "internal: run one measurement (strata | sdpa) and print it")->group("");
  return cmd;
}

int run_bench_memory(const BenchMemoryOptions& o_in) {
  if (!o_in.child.empty()) return run_child(o_in);
  BenchMemoryOptions o = o_in;
  if (o.seq.empty()) o.seq = {16384, 32768};
  for (int64_t n : o.seq) STRATA_CHECK(n >= 1, "strata bench memory: argument '--seq': expected >= 1, got ", n);
  STRATA_CHECK(o.heads >= 1 && o.head_dim >= 1, "strata bench memory: arguments '--heads', '--head-dim': expected >= 1, got ",
               o.heads, ", ", o.head_dim);
  if (!o.json.empty()) {
    const std::string why = data::unwritable_reason(o.json);
    STRATA_CHECK(why.empty(), "strata bench memory: argument '--json': ", why);
  }
  const int threads = configure_threads(o.threads);
  fmt::print("machine: {}; {} threads; torch {}\n", cpu_model(), threads, torch_version());
  fmt::print("one {}forward + backward, batch 1, {} heads, d = {}, float32, BHSD; peak resident memory above the "
             "inputs (q, k, v, dout), each in its own process\n\n",
             o.causal ? "causal " : "", o.heads, o.head_dim);
  fmt::print("{:>7}  {:>12}  {:>12}  {:>14}  {:>12}\n", "N", "strata MB", "sdpa MB", "strata / sdpa", "inputs MB");
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  for (int64_t n : o.seq) {
    const int64_t ours = measure_in_child(o, "strata", n), peer = measure_in_child(o, "sdpa", n);
    const double inputs = 4.0 * n * o.heads * o.head_dim * 4;
    fmt::print("{:>7}  {:>12.1f}  {:>12.1f}  {:>14.2f}  {:>12.1f}\n", n, ours / 1e6, peer / 1e6, double(ours) / peer,
               inputs / 1e6);
    rows.push_back({{"case", o.causal ? "fwd+bwd causal" : "fwd+bwd"},
                    {"shape", {{"batch", 1}, {"heads", o.heads}, {"seq", n}, {"head_dim", o.head_dim}}},
                    {"dtype", "float32"},
                    {"ours_peak_bytes", ours},
                    {"peer_peak_bytes", peer},
                    {"ratio", double(ours) / peer},
                    {"inputs_bytes", inputs}});
  }
  if (!o.json.empty()) {
    nlohmann::ordered_json j = {{"bench", "memory"}, {"method", "strata.flash"}, {"peer", "torch.sdpa"},
                                {"threads", threads}, {"cpu", cpu_summary()}, {"cpu_model", cpu_model()},
                                {"torch_version", torch_version()}, {"date", utc_now()}, {"rows", rows}};
    data::write_file_atomic(o.json, j.dump(2) + "\n", "strata bench memory --json");
    fmt::print("\nJSON: {}\n", o.json);
  }
  return 0;
}

}  // namespace strata::app
