// data/sts.cpp: see sts.h.
#include "data/sts.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <numeric>

#include "strata/error.h"

namespace strata::data {

std::vector<StsPair> load_sts(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("STS file '" + path + "': cannot open file");
  std::vector<StsPair> rows;
  std::string line;
  for (size_t lineno = 1; std::getline(in, line); ++lineno) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    std::vector<std::string> f;
    for (size_t start = 0;;) {
      const size_t tab = line.find('\t', start);
      f.push_back(line.substr(start, tab == std::string::npos ? std::string::npos : tab - start));
      if (tab == std::string::npos) break;
      start = tab + 1;
    }
    const std::string where = "STS file '" + path + "', line " + std::to_string(lineno);
    if (f.size() < 7)
      throw Error(where + ": expected at least 7 tab-separated fields, got " + std::to_string(f.size()));
    StsPair p;
    size_t used = 0;
    try {
      p.score = std::stod(f[4], &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != f[4].size() || !(p.score >= 0 && p.score <= 5))
      throw Error(where + ": field 5 (score): expected a number in [0, 5], got '" + f[4] + "'");
    p.sentence1 = std::move(f[5]);
    p.sentence2 = std::move(f[6]);
    rows.push_back(std::move(p));
  }
  if (in.bad()) throw Error("STS file '" + path + "': read error");
  if (rows.empty()) throw Error("STS file '" + path + "': expected at least one row, got an empty file");
  return rows;
}

namespace {

void check_pair(const char* where, const std::vector<double>& x, const std::vector<double>& y) {
  STRATA_CHECK_ARG(x.size() >= 2, where, "x", "at least 2 values", x.size());
  STRATA_CHECK_ARG(y.size() == x.size(), where, "y", std::to_string(x.size()) + " values (as x)", y.size());
}

// 1-based ranks; tied values share the mean of their ranks.
std::vector<double> average_ranks(const std::vector<double>& v) {
  std::vector<size_t> order(v.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return v[a] < v[b]; });
  std::vector<double> rank(v.size());
  for (size_t i = 0; i < order.size();) {
    size_t j = i;
    while (j + 1 < order.size() && v[order[j + 1]] == v[order[i]]) ++j;
    const double r = 0.5 * double(i + j) + 1.0;
    for (size_t k = i; k <= j; ++k) rank[order[k]] = r;
    i = j + 1;
  }
  return rank;
}

}  // namespace

double pearson(const std::vector<double>& x, const std::vector<double>& y) {
  check_pair("pearson", x, y);
  const double n = double(x.size());
  const double mx = std::accumulate(x.begin(), x.end(), 0.0) / n;
  const double my = std::accumulate(y.begin(), y.end(), 0.0) / n;
  double sxy = 0, sxx = 0, syy = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    sxy += (x[i] - mx) * (y[i] - my);
    sxx += (x[i] - mx) * (x[i] - mx);
    syy += (y[i] - my) * (y[i] - my);
  }
  if (sxx == 0 || syy == 0) return std::numeric_limits<double>::quiet_NaN();
  return sxy / std::sqrt(sxx * syy);
}

double spearman(const std::vector<double>& x, const std::vector<double>& y) {
  check_pair("spearman", x, y);
  for (size_t i = 0; i < x.size(); ++i)
    STRATA_CHECK_ARG(!std::isnan(x[i]) && !std::isnan(y[i]), "spearman", std::isnan(x[i]) ? "x" : "y", "no NaN values",
                     "NaN at index " + std::to_string(i));
  return pearson(average_ranks(x), average_ranks(y));
}

}  // namespace strata::data
