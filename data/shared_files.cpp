// data/shared_files.cpp: see shared_files.h.
#include "data/shared_files.h"

#include <sys/stat.h>

#include <cstdlib>
#include <vector>

#include "data/sha256.h"
#include "strata/error.h"

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

void check_file_sha256(const std::string& what, const std::string& path, const std::string& expected_sha256,
                       const std::string& how_to_get) {
  const std::string head = what + " file '" + path + "': ";
  if (!is_regular_file(path))
    throw Error(head + "missing: expected sha256 " + expected_sha256 + ", got none (no such file). To get it: " +
                how_to_get);
  const std::string actual = sha256_file_hex(path);
  if (actual != expected_sha256)
    throw Error(head + "altered or a different version: expected sha256 " + expected_sha256 + ", got " + actual +
                ". To get the right one: " + how_to_get);
}

std::string checked_shared_file(const std::string& what, const std::string& relative,
                                const std::string& expected_sha256, const std::string& how_to_get) {
  std::string tried;
  const std::string path = find_shared_file(relative, &tried);
  if (path.empty())
    throw Error(what + " file '" + relative + "': missing: expected sha256 " + expected_sha256 +
                ", got none (looked for " + tried + "). To get it: " + how_to_get);
  check_file_sha256(what, path, expected_sha256, how_to_get);
  return path;
}

std::string base_name(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace strata::data
