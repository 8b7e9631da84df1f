// apps/strata/files.h: how the CLI writes files: atomic writes (a result file is either the old
// one or the complete new one, never a torn mix), and the check of an output path before any work.
// (The shared data folder: data/shared_files.h.)
#pragma once
#include <string>

namespace strata::app {

// Writes `content` to `path` via a temporary file in the same folder + rename(2), creating missing
// parent folders. Throws strata::Error naming `where`, the path and the reason on failure.
void write_file_atomic(const std::string& path, const std::string& content, const char* where);

// Why `path` cannot be written as a result file (its missing parent folders created, as the
// writers do), or "" when it can: a folder, a folder that cannot be created, a file that cannot be
// opened for writing. An existing file is not changed; a file created by the probe is removed.
// The CLI runs this on every output path before any work, so that a typo fails in a second.
std::string unwritable_reason(const std::string& path);

}  // namespace strata::app
