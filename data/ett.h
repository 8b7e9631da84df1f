// data/ett.h: ETTh1 for long-horizon forecasting (torch-free), experiments.md section 3: the
// standard protocol of Informer / Autoformer / PatchTST (their Dataset_ETT_hour).
//
// File: shared/data/ett/ETTh1.csv (sha256 checked), a header "date,HUFL,HULL,MUFL,MULL,LUFL,LULL,OT"
// then 17,420 hourly rows; the 7 numeric columns are the channels (OT, the target, last).
// Borders by row (12/4/4 months of 30 days of 24 hours; the rows past 14,400 are never used):
//   train [0, 8640), val [8640 - L, 11520), test [11520 - L, 14400)
// A split [a, b) holds the b - a - L - H + 1 windows of stride 1: window k's input is rows
// [a + k, a + k + L) and its target rows [a + k + L, a + k + L + H). So val and test hold 2881 - H
// windows whatever L (test, H = 96: 2785, every one of them counted: PatchTST's test loader drops
// its last partial batch, which we do not copy), train 8641 - L - H (L = 336, H = 96: 8209).
// Standardisation: each channel with the mean and population std (ddof 0, as sklearn's
// StandardScaler) of the train rows [0, 8640).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace strata::data {

// shared/data/README.md's sha256 of ett/ETTh1.csv.
inline constexpr const char* kEtth1Sha256 = "f18de3ad269cef59bb07b5438d79bb3042d3be49bdeecf01c1cd6d29695ee066";

// The protocol's row borders for hourly ETT data.
inline constexpr int64_t kEttTrainEnd = 12 * 30 * 24;              // 8640
inline constexpr int64_t kEttValEnd = kEttTrainEnd + 4 * 30 * 24;  // 11520
inline constexpr int64_t kEttTestEnd = kEttValEnd + 4 * 30 * 24;   // 14400

struct EttData {
  std::vector<float> values;  // rows x channels, row-major, standardised with the train mean / std
  int64_t rows = 0, channels = 7;
  std::vector<float> mean, std;       // per channel, of the raw train rows
  std::vector<std::string> columns;   // the channel names from the header
  std::string name, path;             // "ETTh1" (or the path a user gave) and the file read
};

// Loads "ETTh1" (shared/data/ett/ETTh1.csv via find_shared_file) or a path to an ETT-format CSV
// (date column, then numeric channels; at least 14,400 rows). "ETTh1" and a path whose file name is
// ETTh1.csv (a copy) are checked against kEtth1Sha256: a missing or altered file is a strata::Error
// naming the file, the expected and actual sha256 and how to get it. A malformed row is an error
// naming the file and line; a channel constant over the train rows (std 0) is an error naming it.
EttData load_ett(const std::string& name = "ETTh1");

// The CSV text of an ETT-format file (load_ett's parse, without the file or its sha256); `origin`
// names it in errors and becomes name and path. Throws strata::Error naming origin and line.
EttData parse_ett_csv(const std::string& text, const std::string& origin);

enum class EttSplit { train, val, test };

// Windows of input length L and horizon H (stride 1) in a split; L, H >= 1 and the split must
// hold at least one window (strata::Error naming the argument otherwise).
int64_t ett_num_windows(const EttData& data, EttSplit split, int64_t L, int64_t H);

// Window `index` of the split, in order.
void ett_window(const EttData& data, EttSplit split, int64_t L, int64_t H, int64_t index,
                float* input /* L x channels */, float* target /* H x channels */);

// Training batches: `batch` train windows drawn uniformly by (seed, step, micro); window b does
// not depend on `batch`.
void ett_sample(const EttData& data, int64_t L, int64_t H, int64_t batch, uint64_t seed, int64_t step, int64_t micro,
                float* input /* batch x L x channels */, float* target /* batch x H x channels */);

}  // namespace strata::data
