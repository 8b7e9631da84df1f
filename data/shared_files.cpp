// data/shared_files.cpp: see shared_files.h.
#include "data/shared_files.h"

#include <sys/stat.h>

#include <cstdlib>
#include <vector>

namespace strata::data {

bool is_regular_file(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string find_shared_file(const std::string& relative, std::string* tried) {
  std::vector<std::string> dirs;
  if (const char* env = std::getenv("STRATA_SHARED_DIR"); env && *env) dirs.emplace_back(env);
  dirs.push_back(std::string(STRATA_SOURCE_DIR) + "/shared");
  dirs.push_back(std::string(STRATA_SOURCE_DIR) + "/../shared");
  std::string all;
  for (const std::string& d : dirs) {
    const std::string p = d + "/" + relative;
    if (is_regular_file(p)) return p;
    all += (all.empty() ? "" : ", ") + p;
  }
  if (tried) *tried = all;
  return "";
}

}  // namespace strata::data
