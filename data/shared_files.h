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

}  // namespace strata::data
