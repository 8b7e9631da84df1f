// data/files.h: how strata writes files that users keep (results, logs, checkpoints): atomic
// writes (a file is either the old one or the complete new one, never a torn mix, also across a
// power cut: the data is fsync'ed before the rename and the folder after it), and the check of an
// output path before any work. (The shared data folder: data/shared_files.h.)
#pragma once
#include <cstddef>
#include <span>
#include <string>

namespace strata::data {

// Writes `content` to `path` via a temporary file in the same folder, fsync, rename(2), fsync of
// the folder; missing parent folders are created. Throws strata::Error naming `where`, the path and
// the reason on failure (the temporary file is removed then; `path` is unchanged).
void write_file_atomic(const std::string& path, std::span<const std::byte> content, const char* where);
void write_file_atomic(const std::string& path, const std::string& content, const char* where);

// True when `path` names a folder (POSIX stat). (A regular file: data/shared_files.h.)
bool is_folder(const std::string& path);

// Creates `path` and its missing parents (mkdir -p). Returns "" or why it could not.
std::string make_folders(const std::string& path);

// The whole file as bytes. Throws strata::Error naming `where` and the path when it cannot be read
// or is not a regular file (a folder, a device, a pipe).
std::string read_file(const std::string& path, const char* where);

// Why `path` cannot be written as a result file (its missing parent folders created, as the
// writers do), or "" when it can: a folder, a folder that cannot be created, a file that cannot be
// opened for writing. An existing file is not changed; a file created by the probe is removed.
// The CLI runs this on every output path before any work, so that a typo fails in a second.
std::string unwritable_reason(const std::string& path);

// An exclusive lock on a folder for the life of the object: flock(2) on FOLDER/.lock (created if
// missing, with the folder), which holds the holder's pid. The kernel drops the lock when the
// process ends, however it ends (kill -9 included), so a dead run never leaves a stale lock; a
// later holder overwrites the pid. A trainer holds its run folder's for the whole run: two trainers
// on one folder interleaved their train.csv / log.jsonl / checkpoints (issue 48 item 3).
class FolderLock {
 public:
  // Throws strata::Error naming `where`, the folder and the holder's pid when another open of the
  // lock (this process or another) holds it, or naming the reason when the lock file cannot be made.
  FolderLock(const std::string& folder, const char* where);
  ~FolderLock();
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(const FolderLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace strata::data
