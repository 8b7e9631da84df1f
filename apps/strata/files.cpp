// apps/strata/files.cpp: atomic file writes and output-path checks (files.h).
#include "files.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "strata/error.h"

namespace strata::app {

void write_file_atomic(const std::string& path, const std::string& content, const char* where) {
  namespace fs = std::filesystem;
  const fs::path p(path);
  std::error_code ec;
  if (p.has_parent_path()) {
    fs::create_directories(p.parent_path(), ec);
    STRATA_CHECK(!ec, where, ": cannot create folder '", p.parent_path().string(), "': ", ec.message());
  }
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    STRATA_CHECK(f.good(), where, ": cannot open '", tmp, "' for writing: ", std::strerror(errno));
    f.write(content.data(), std::streamsize(content.size()));
    f.flush();
    if (!f.good()) {
      std::remove(tmp.c_str());
      STRATA_CHECK(false, where, ": writing '", tmp, "' failed (disk full?)");
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(tmp.c_str());
    STRATA_CHECK(false, where, ": cannot rename '", tmp, "' to '", path, "': ", why);
  }
}

std::string unwritable_reason(const std::string& path) {
  namespace fs = std::filesystem;
  if (path.empty()) return "an empty path";
  const fs::path p(path);
  std::error_code ec;
  if (fs::is_directory(p, ec)) return "it is a folder";
  if (p.has_parent_path()) {
    fs::create_directories(p.parent_path(), ec);
    if (ec) return "cannot create the folder '" + p.parent_path().string() + "': " + ec.message();
  }
  const bool existed = fs::exists(p, ec);
  {
    std::ofstream f(path, std::ios::app);  // append: an existing file keeps its content
    if (!f.good()) return std::string("cannot open it for writing: ") + std::strerror(errno);
  }
  if (!existed) fs::remove(p, ec);
  return "";
}

}  // namespace strata::app
