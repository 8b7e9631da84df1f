// data/files.cpp: atomic file writes and output-path checks (files.h).
#include "data/files.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <sys/stat.h>
#include <fstream>
#include <sstream>

#include "strata/error.h"

namespace strata::data {

namespace {

// The folder part of a path ("" when there is none).
std::string parent_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return "";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// fsync of a file or folder by path; false with errno set on failure.
bool sync_path(const std::string& path, int flags) {
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = ::fsync(fd) == 0;
  ::close(fd);
  return ok;
}

}  // namespace

bool is_folder(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// POSIX only, no std::filesystem: libtorch.so exports its own copies of some std::filesystem
// functions, which programs linked with torch bind to, and some of them crash (remove_all).
std::string make_folders(const std::string& path) {
  if (path.empty() || is_folder(path)) return "";
  if (const std::string up = parent_of(path); !up.empty()) {
    if (std::string why = make_folders(up); !why.empty()) return why;
  }
  if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) return std::strerror(errno);
  return is_folder(path) ? "" : "a file of that name exists";
}

void write_file_atomic(const std::string& path, std::span<const std::byte> content, const char* where) {
  const std::string parent = parent_of(path);
  if (const std::string why = make_folders(parent); !why.empty())
    STRATA_CHECK(false, where, ": cannot create folder '", parent, "': ", why);
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  STRATA_CHECK(fd >= 0, where, ": cannot open '", tmp, "' for writing: ", std::strerror(errno));
  size_t done = 0;
  while (done < content.size()) {
    const ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += size_t(n);
  }
  const bool written = done == content.size() && ::fsync(fd) == 0;
  const std::string why = written ? "" : std::strerror(errno);
  ::close(fd);
  if (!written) {
    std::remove(tmp.c_str());
    STRATA_CHECK(false, where, ": writing '", tmp, "' failed (", why, "; disk full?)");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string err = std::strerror(errno);
    std::remove(tmp.c_str());
    STRATA_CHECK(false, where, ": cannot rename '", tmp, "' to '", path, "': ", err);
  }
  // The rename is durable only once the folder's entry is on disk.
  const std::string dir = parent.empty() ? "." : parent;
  STRATA_CHECK(sync_path(dir, O_RDONLY | O_DIRECTORY), where, ": cannot fsync folder '", dir, "': ", std::strerror(errno));
}

void write_file_atomic(const std::string& path, const std::string& content, const char* where) {
  write_file_atomic(path, std::as_bytes(std::span(content.data(), content.size())), where);
}

std::string read_file(const std::string& path, const char* where) {
  std::ifstream f(path, std::ios::binary);
  STRATA_CHECK(f.good(), where, ": cannot read '", path, "': ", std::strerror(errno));
  std::ostringstream os;
  os << f.rdbuf();
  STRATA_CHECK(!f.bad(), where, ": reading '", path, "' failed");
  return os.str();
}

std::string unwritable_reason(const std::string& path) {
  if (path.empty()) return "an empty path";
  if (is_folder(path)) return "it is a folder";
  const std::string parent = parent_of(path);
  if (const std::string why = make_folders(parent); !why.empty())
    return "cannot create the folder '" + parent + "': " + why;
  struct stat st {};
  const bool existed = ::stat(path.c_str(), &st) == 0;
  {
    std::ofstream f(path, std::ios::app);  // append: an existing file keeps its content
    if (!f.good()) return std::string("cannot open it for writing: ") + std::strerror(errno);
  }
  if (!existed) std::remove(path.c_str());
  return "";
}

}  // namespace strata::data
