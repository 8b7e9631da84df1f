// data/shared_files.h: where the shared data folder (STS-B, tinyshakespeare, ...) is found
// (torch-free). One lookup for the CLI, the converter (models/conversion.h) and the tests.
#pragma once
#include <string>

namespace strata::data {

// A file of the shared data folder (e.g. "data/sts/sts-test.csv"): under $STRATA_SHARED_DIR when
// set, else shared/ in or beside the source tree (the build's STRATA_SOURCE_DIR). Returns "" when
// it is in none of them, and then sets *tried (when given) to the candidates, comma-separated.
std::string find_shared_file(const std::string& relative, std::string* tried = nullptr);

// True when `path` names a regular file (POSIX stat: libtorch.so exports its own older copies of
// the std::filesystem functions, which executables linked with torch bind to).
bool is_regular_file(const std::string& path);

// Checks a data file against its published sha256: throws strata::Error unless `path` is a regular
// file whose sha256 is `expected_sha256`. The message names `what` and the file, the expected and
// the actual sha256 ("none: the file is missing" for a missing one) and `how_to_get` it.
void check_file_sha256(const std::string& what, const std::string& path, const std::string& expected_sha256,
                       const std::string& how_to_get);

// find_shared_file(relative) checked with check_file_sha256; a file in none of the candidate
// folders is a strata::Error naming them. Returns the path.
std::string checked_shared_file(const std::string& what, const std::string& relative,
                                const std::string& expected_sha256, const std::string& how_to_get);

// The file name of a path: what follows its last '/'.
std::string base_name(const std::string& path);

}  // namespace strata::data
