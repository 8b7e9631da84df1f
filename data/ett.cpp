// data/ett.cpp: see ett.h.
#include "data/ett.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <istream>
#include <sstream>

#include "data/counter_rng.h"
#include "data/files.h"
#include "data/shared_files.h"
#include "strata/error.h"

namespace strata::data {

namespace {

const char* kEttHowTo =
    "it ships in the project's shared data folder as data/ett/ETTh1.csv (origin: zhouhaoyi/ETDataset "
    "ETT-small/ETTh1.csv; see shared/data/README.md); set STRATA_SHARED_DIR to the folder holding data/";

// The file of "ETTh1" or a path, checked against its sha256 when it is ETTh1.csv.
std::string resolve_ett(const std::string& name_or_path, std::string* name) {
  if (name_or_path == "ETTh1") {
    *name = name_or_path;
    return checked_shared_file("ETTh1", "data/ett/ETTh1.csv", kEtth1Sha256, kEttHowTo);
  }
  if (base_name(name_or_path) == "ETTh1.csv") {
    *name = "ETTh1";
    check_file_sha256(*name, name_or_path, kEtth1Sha256, kEttHowTo);
    return name_or_path;
  }
  *name = name_or_path;
  STRATA_CHECK_ARG(is_regular_file(name_or_path), "load_ett", "name", "'ETTh1' or the path of an ETT-format CSV",
                   "'" + name_or_path + "' (no such file)");
  return name_or_path;
}

std::vector<std::string> split_commas(const std::string& line) {
  std::vector<std::string> f;
  for (size_t start = 0;;) {
    const size_t comma = line.find(',', start);
    f.push_back(line.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) return f;
    start = comma + 1;
  }
}

// Reads the header into data->columns / channels and the rows (date column dropped) into *raw
// (rows x channels), counting them in data->rows.
void read_ett_csv(std::istream& in, const std::string& path, EttData* data, std::vector<double>* raw) {
  std::string line;
  if (!std::getline(in, line)) throw Error("ETT file '" + path + "': expected a header line, got an empty file");
  if (!line.empty() && line.back() == '\r') line.pop_back();
  std::vector<std::string> header = split_commas(line);
  if (header.size() < 2 || header[0] != "date")
    throw Error("ETT file '" + path + "', line 1: expected a header 'date,<channel>,...', got '" + line + "'");
  data->columns.assign(header.begin() + 1, header.end());
  data->channels = int64_t(data->columns.size());
  for (size_t lineno = 2; std::getline(in, line); ++lineno) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    const std::vector<std::string> f = split_commas(line);
    const std::string where = "ETT file '" + path + "', line " + std::to_string(lineno);
    if (f.size() != header.size())
      throw Error(where + ": expected " + std::to_string(header.size()) + " comma-separated fields, got " +
                  std::to_string(f.size()));
    for (size_t c = 1; c < f.size(); ++c) {
      char* end = nullptr;
      const double v = std::strtod(f[c].c_str(), &end);
      if (f[c].empty() || *end != '\0' || !std::isfinite(v))
        throw Error(where + ": field " + std::to_string(c + 1) + " (" + header[c] + "): expected a finite number, got '" +
                    f[c] + "'");
      raw->push_back(v);
    }
    ++data->rows;
  }
  if (in.bad()) throw Error("ETT file '" + path + "': read error");
}

// data->values = raw standardised per channel with the mean and population std of the train rows.
void standardise(const std::string& path, const std::vector<double>& raw, EttData* data) {
  const int64_t C = data->channels;
  data->values.assign(raw.size(), 0.0f);
  data->mean.assign(size_t(C), 0.0f);
  data->std.assign(size_t(C), 0.0f);
  for (int64_t c = 0; c < C; ++c) {
    double sum = 0, sq = 0;
    for (int64_t r = 0; r < kEttTrainEnd; ++r) sum += raw[size_t(r * C + c)];
    const double mean = sum / double(kEttTrainEnd);
    for (int64_t r = 0; r < kEttTrainEnd; ++r) {
      const double dv = raw[size_t(r * C + c)] - mean;
      sq += dv * dv;
    }
    const double sd = std::sqrt(sq / double(kEttTrainEnd));
    if (!(sd > 0))
      throw Error("ETT file '" + path + "': channel '" + data->columns[size_t(c)] +
                  "': expected a varying channel over the train rows, got a constant (std 0)");
    for (int64_t r = 0; r < data->rows; ++r)
      data->values[size_t(r * C + c)] = float((raw[size_t(r * C + c)] - mean) / sd);
    data->mean[size_t(c)] = float(mean);
    data->std[size_t(c)] = float(sd);
  }
}

// The split's first row a (input of window 0) and end b.
void split_range(EttSplit split, int64_t L, int64_t* a, int64_t* b) {
  switch (split) {
    case EttSplit::train: *a = 0, *b = kEttTrainEnd; return;
    case EttSplit::val: *a = kEttTrainEnd - L, *b = kEttValEnd; return;
    case EttSplit::test: *a = kEttValEnd - L, *b = kEttTestEnd; return;
  }
  throw Error("ETT: argument 'split': expected train, val or test, got " + std::to_string(int(split)));
}

// Copies `n` rows starting at `row` into out (n x channels).
void copy_rows(const EttData& data, int64_t row, int64_t n, float* out) {
  std::memcpy(out, data.values.data() + row * data.channels, size_t(n * data.channels) * sizeof(float));
}

}  // namespace

EttData parse_ett_csv(const std::string& text, const std::string& origin) {
  EttData data;
  data.name = data.path = origin;
  std::istringstream in(text);
  std::vector<double> raw;
  read_ett_csv(in, origin, &data, &raw);
  if (data.rows < kEttTestEnd)
    throw Error("ETT file '" + origin + "': expected at least " + std::to_string(kEttTestEnd) +
                " data rows (the protocol's test split ends there), got " + std::to_string(data.rows));
  standardise(origin, raw, &data);
  return data;
}

EttData load_ett(const std::string& name) {
  std::string shown;
  const std::string path = resolve_ett(name, &shown);
  EttData data = parse_ett_csv(read_file(path, "load_ett"), path);
  data.name = shown;
  return data;
}

int64_t ett_num_windows(const EttData& data, EttSplit split, int64_t L, int64_t H) {
  STRATA_CHECK_ARG(L >= 1, "ett_num_windows", "L", ">= 1", L);
  STRATA_CHECK_ARG(H >= 1, "ett_num_windows", "H", ">= 1", H);
  STRATA_CHECK_ARG(data.rows >= kEttTestEnd && int64_t(data.values.size()) == data.rows * data.channels,
                   "ett_num_windows", "data", "a loaded EttData (load_ett)",
                   std::to_string(data.rows) + " rows of " + std::to_string(data.channels) + " channels");
  int64_t a = 0, b = 0;
  split_range(split, L, &a, &b);
  STRATA_CHECK_ARG(a >= 0, "ett_num_windows", "L", "<= " + std::to_string(a + L) + " (the rows before the split)", L);
  const int64_t n = b - a - L - H + 1;
  STRATA_CHECK_ARG(n >= 1, "ett_num_windows", "L + H", "at most " + std::to_string(b - a) + " rows of the split",
                   L + H);
  return n;
}

void ett_window(const EttData& data, EttSplit split, int64_t L, int64_t H, int64_t index, float* input,
                float* target) {
  const int64_t n = ett_num_windows(data, split, L, H);
  STRATA_CHECK_ARG(index >= 0 && index < n, "ett_window", "index", "in [0, " + std::to_string(n) + ")", index);
  STRATA_CHECK_ARG(input != nullptr && target != nullptr, "ett_window", input ? "target" : "input",
                   "a buffer of (L or H) x channels floats", "null");
  int64_t a = 0, b = 0;
  split_range(split, L, &a, &b);
  copy_rows(data, a + index, L, input);
  copy_rows(data, a + index + L, H, target);
}

void ett_sample(const EttData& data, int64_t L, int64_t H, int64_t batch, uint64_t seed, int64_t step, int64_t micro,
                float* input, float* target) {
  const int64_t n = ett_num_windows(data, EttSplit::train, L, H);
  STRATA_CHECK_ARG(batch >= 1, "ett_sample", "batch", ">= 1", batch);
  STRATA_CHECK_ARG(input != nullptr && target != nullptr, "ett_sample", input ? "target" : "input",
                   "a buffer of batch x (L or H) x channels floats", "null");
  CounterRng rng(seed, step, micro, RngStream::ett_windows);
  for (int64_t b = 0; b < batch; ++b) {
    const auto k = int64_t(rng.below(uint64_t(n)));  // train window k: rows [k, k + L + H)
    copy_rows(data, k, L, input + b * L * data.channels);
    copy_rows(data, k + L, H, target + b * H * data.channels);
  }
}

}  // namespace strata::data
