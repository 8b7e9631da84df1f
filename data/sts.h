// data/sts.h: the STS Benchmark (semantic textual similarity) and its metric (torch-free).
// File format (shared/data/sts/sts-*.csv): tab-separated genre, file, year, id, score (0-5),
// sentence1, sentence2; some rows carry extra fields after these 7, which are ignored.
#pragma once
#include <string>
#include <vector>

namespace strata::data {

// sha256 of shared/data/sts/sts-test.csv (1,379 pairs), the split the conversion evaluates on.
inline constexpr const char* kStsTestSha256 = "affe45928a66ee5a708531233c95b7dacbbdc57f974f002a3d32ea0180cf816a";

struct StsPair {
  double score = 0;  // gold similarity, 0 (unrelated) .. 5 (equivalent)
  std::string sentence1, sentence2;
};

// Reads every row. Throws strata::Error naming the file and line for a row with fewer than 7
// fields or a score that is not a number in [0, 5], and for an unreadable or empty file.
std::vector<StsPair> load_sts(const std::string& path);

// Spearman rank correlation of x and y (average ranks for ties, as scipy.stats.spearmanr):
// the Pearson correlation of the ranks. Requires equal sizes >= 2 (strata::Error otherwise);
// returns NaN when either input is constant.
double spearman(const std::vector<double>& x, const std::vector<double>& y);

// Pearson correlation; same contract as spearman.
double pearson(const std::vector<double>& x, const std::vector<double>& y);

}  // namespace strata::data
