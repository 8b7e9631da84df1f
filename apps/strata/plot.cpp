// apps/strata/plot.cpp: locates the venv Python and bench/plot.py and runs them (posix_spawn,
// no shell, so paths need no quoting).
#include "plot.h"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

extern char** environ;

namespace strata::app {

namespace {

// The value of env var `name`, or "" when unset.
std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

// Exit status plot.py uses when matplotlib cannot be imported.
constexpr int kPlotNoMatplotlib = 3;

}  // namespace

std::string plot_python() {
  if (std::string p = env_or_empty("STRATA_PYTHON"); !p.empty()) return p;
  std::string home = env_or_empty("STRATA_HOME");
  if (home.empty()) home = env_or_empty("HOME") + "/.cache/strata";
  return home + "/venv/bin/python";
}

std::string plot_script() {
  if (std::string p = env_or_empty("STRATA_PLOT_SCRIPT"); !p.empty()) return p;
  return std::string(STRATA_SOURCE_DIR) + "/bench/plot.py";
}

std::string plot_script_path(const std::string& name) { return std::string(STRATA_SOURCE_DIR) + "/bench/" + name; }

bool run_plot(const std::string& json_path, const std::string& png_path, std::string* why) {
  return run_python_script(plot_script(), {json_path, png_path, "--quiet"}, why);
}

bool run_python_script(const std::string& script, const std::vector<std::string>& script_args, std::string* why) {
  const std::string py = plot_python();
  if (::access(py.c_str(), X_OK) != 0) {
    *why = "no Python at '" + py + "' (run scripts/setup.sh, or set STRATA_PYTHON)";
    return false;
  }
  if (!std::filesystem::exists(script)) {
    *why = "no plot script at '" + script + "'";
    return false;
  }
  std::vector<std::string> args{py, script};
  args.insert(args.end(), script_args.begin(), script_args.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, py.c_str(), nullptr, nullptr, argv.data(), environ);
  if (rc != 0) {
    *why = "cannot start '" + py + "': " + std::strerror(rc);
    return false;
  }
  int status = 0;
  if (waitpid(pid, &status, 0) < 0) {
    *why = std::string("waiting for the plot script failed: ") + std::strerror(errno);
    return false;
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return true;
  if (WIFEXITED(status) && WEXITSTATUS(status) == kPlotNoMatplotlib)
    *why = "matplotlib is not installed for '" + py + "' (pip install matplotlib into that venv)";
  else
    *why = std::filesystem::path(script).filename().string() + " failed (" + (WIFEXITED(status) ? "exit status " + std::to_string(WEXITSTATUS(status))
                                                   : std::string("killed by a signal")) + ")";
  return false;
}

}  // namespace strata::app
