// data/files.cpp: atomic file writes and output-path checks (files.h).
#include "data/files.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <sys/file.h>
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
  // A folder opens as an ifstream and reads as "" (a folder given as a config started a default
  // run: issue 48 item 2), so the kind of file is checked first (stat follows symbolic links).
  // Pipes and character devices stay readable (`--input /dev/stdin`, `<(cmd)`, /dev/null), with a
  // cap so that an endless one (/dev/zero) is an error instead of a hang.
  struct stat st {};
  const bool known = ::stat(path.c_str(), &st) == 0;
  if (known && S_ISDIR(st.st_mode))
    throw Error(std::string(where) + ": cannot read '" + path + "': expected a file, got a folder");
  if (known && !S_ISREG(st.st_mode) && !S_ISFIFO(st.st_mode) && !S_ISCHR(st.st_mode))
    throw Error(std::string(where) + ": cannot read '" + path + "': expected a file, pipe or character device, got " +
                (S_ISBLK(st.st_mode) ? "a block device" : "a socket"));
  std::ifstream f(path, std::ios::binary);
  STRATA_CHECK(f.good(), where, ": cannot read '", path, "': ", std::strerror(errno));
  if (!known || S_ISREG(st.st_mode)) {
    std::ostringstream os;
    os << f.rdbuf();
    STRATA_CHECK(!f.bad(), where, ": reading '", path, "' failed");
    return os.str();
  }
  constexpr std::size_t kMaxStreamBytes = std::size_t{1} << 30;  // 1 GiB: beyond any config or corpus we read
  std::string out;
  char buf[1 << 16];
  while (f.read(buf, sizeof buf) || f.gcount() > 0) {
    out.append(buf, static_cast<std::size_t>(f.gcount()));
    STRATA_CHECK(out.size() <= kMaxStreamBytes, where, ": reading '", path, "': the stream gave more than ",
                 kMaxStreamBytes, " bytes (an endless device?)");
  }
  STRATA_CHECK(!f.bad(), where, ": reading '", path, "' failed");
  return out;
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

FolderLock::FolderLock(const std::string& folder, const char* where) {
  if (const std::string why = make_folders(folder); !why.empty())
    throw Error(std::string(where) + ": cannot create the folder '" + folder + "': " + why);
  const std::string path = folder + "/.lock";
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw Error(std::string(where) + ": cannot open the lock file '" + path + "': " + std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char buf[32] = {};
    const ssize_t n = ::pread(fd_, buf, sizeof buf - 1, 0);
    ::close(fd_);
    fd_ = -1;
    if (err != EWOULDBLOCK) throw Error(std::string(where) + ": cannot lock '" + path + "': " + std::strerror(err));
    std::string pid = n > 0 ? std::string(buf, size_t(n)) : std::string();
    while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
    throw Error(std::string(where) + ": the folder '" + folder + "' is in use by another run (pid " +
                (pid.empty() ? std::string("unknown") : pid) + ", holding " + path +
                "): wait for it to end, or choose another folder");
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  const bool written = ::ftruncate(fd_, 0) == 0 && ::pwrite(fd_, pid.data(), pid.size(), 0) == ssize_t(pid.size());
  (void)written;  // the pid only words a second run's error: the lock holds without it
}

FolderLock::~FolderLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the last descriptor of the open file releases the flock
}

}  // namespace strata::data
