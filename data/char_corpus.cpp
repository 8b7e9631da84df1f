// data/char_corpus.cpp: see char_corpus.h.
#include "data/char_corpus.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "data/counter_rng.h"
#include "data/shared_files.h"
#include "strata/error.h"

namespace strata::data {

namespace {

const char* kSharedHowTo =
    "it ships in the project's shared data folder as data/text/tinyshakespeare.txt (origin: karpathy/char-rnn "
    "data/tinyshakespeare/input.txt; see shared/data/README.md); set STRATA_SHARED_DIR to the folder holding data/";

std::string kjv_how_to() {
  return "run scripts/setup.sh (it runs apt-get install bible-kjv, then bible -f 'gen1:1-rev22:21' > " + kjv_path() +
         ")";
}

// A byte for an error message: 'c' when printable, else its hex code.
std::string describe_byte(unsigned char c) {
  if (c >= 32 && c <= 126) return std::string("'") + char(c) + "'";
  char buf[16];
  std::snprintf(buf, sizeof buf, "byte 0x%02x", unsigned(c));
  return buf;
}

std::string read_file(const std::string& what, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(what + " file '" + path + "': cannot open file");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw Error(what + " file '" + path + "': read error");
  return ss.str();
}

// The file of a named corpus or a path, checked against its sha256 when it is a known corpus.
// Sets *name to the corpus name ("tinyshakespeare", "kjv") or, for another file, the path.
std::string resolve_corpus(const std::string& name_or_path, std::string* name) {
  if (name_or_path == "tinyshakespeare") {
    *name = name_or_path;
    return checked_shared_file("tinyshakespeare", "data/text/tinyshakespeare.txt", kTinyShakespeareSha256,
                               kSharedHowTo);
  }
  if (name_or_path == "kjv") {
    *name = name_or_path;
    const std::string path = kjv_path();
    check_file_sha256("kjv", path, kKjvSha256, kjv_how_to());
    return path;
  }
  // A copy of a known corpus stays checked: a path cannot pass an altered file off as the corpus.
  const std::string base = base_name(name_or_path);
  if (base == "tinyshakespeare.txt") {
    *name = "tinyshakespeare";
    check_file_sha256(*name, name_or_path, kTinyShakespeareSha256, kSharedHowTo);
  } else if (base == "kjv.txt") {
    *name = "kjv";
    check_file_sha256(*name, name_or_path, kKjvSha256, kjv_how_to());
  } else {
    *name = name_or_path;
    STRATA_CHECK_ARG(is_regular_file(name_or_path), "load_char_corpus", "name_or_path",
                     "'tinyshakespeare', 'kjv' or the path of a text file", "'" + name_or_path + "' (no such file)");
  }
  return name_or_path;
}

void check_window(const char* where, const std::vector<uint8_t>& split, int64_t T) {
  STRATA_CHECK_ARG(T >= 1, where, "T", ">= 1", T);
  STRATA_CHECK_ARG(int64_t(split.size()) >= T + 1, where, "split",
                   "at least T + 1 = " + std::to_string(T + 1) + " ids", std::to_string(split.size()) + " ids");
}

}  // namespace

std::string kjv_path() {
  if (const char* home = std::getenv("STRATA_HOME"); home && *home) return std::string(home) + "/data/kjv.txt";
  const char* user_home = std::getenv("HOME");
  if (!user_home || !*user_home)
    throw Error("kjv: cannot locate the KJV text: neither STRATA_HOME nor HOME is set (expected "
                "$STRATA_HOME/data/kjv.txt, default $HOME/.cache/strata/data/kjv.txt)");
  return std::string(user_home) + "/.cache/strata/data/kjv.txt";
}

CharCorpus make_char_corpus(const std::string& name, std::string_view text, double val_fraction) {
  STRATA_CHECK_ARG(val_fraction > 0 && val_fraction < 1, "load_char_corpus", "val_fraction", "a number in (0, 1)",
                   val_fraction);
  CharCorpus c;
  c.name = name;
  std::vector<uint8_t> ids;
  ids.reserve(text.size());
  int64_t lines = 0;
  std::string first_bad;  // the first dropped line's offending character, for the all-dropped error
  for (size_t start = 0; start < text.size();) {
    const size_t nl = text.find('\n', start);
    const size_t end = nl == std::string_view::npos ? text.size() : nl + 1;  // the line with its '\n'
    ++lines;
    int64_t bad = 0;
    bool any_bad = false;
    for (size_t i = start; i < end; ++i) {
      const auto b = static_cast<unsigned char>(text[i]);
      if (char_id(b) < 0) {
        if (first_bad.empty()) first_bad = describe_byte(b) + " on line " + std::to_string(lines);
        any_bad = true;
        bad += (b & 0xC0) != 0x80;  // a UTF-8 continuation byte is part of the character before it
      }
    }
    // A stray continuation byte (no lead byte before it) still drops its line, as one character:
    // kept, it became id 255 past the vocabulary (found by tests/fuzz/char_corpus_fuzz).
    if (any_bad) {
      bad = std::max<int64_t>(bad, 1);
      c.dropped_chars += bad;
      ++c.dropped_lines;
    } else {
      for (size_t i = start; i < end; ++i) ids.push_back(uint8_t(char_id(static_cast<unsigned char>(text[i]))));
    }
    start = end;
  }
  const auto n = int64_t(ids.size());
  const auto n_val = int64_t(double(n) * val_fraction);
  if (n_val < 1 || n - n_val < 1) {
    std::string why = std::to_string(n) + " ids after dropping " + std::to_string(c.dropped_lines) + " of " +
                      std::to_string(lines) + " lines";
    if (!first_bad.empty()) why += " (first character outside the vocabulary: " + first_bad + ")";
    throw Error("char corpus '" + name + "': expected text giving non-empty train and val splits (val_fraction " +
                std::to_string(val_fraction) + "), got " + why);
  }
  c.train.assign(ids.begin(), ids.end() - n_val);
  c.val.assign(ids.end() - n_val, ids.end());
  return c;
}

CharCorpus load_char_corpus(const std::string& name_or_path, double val_fraction) {
  std::string name;
  const std::string path = resolve_corpus(name_or_path, &name);
  CharCorpus c = make_char_corpus(name, read_file(name, path), val_fraction);
  c.path = path;
  return c;
}

std::vector<int64_t> encode_chars(std::string_view text) {
  std::vector<int64_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const int id = char_id(static_cast<unsigned char>(text[i]));
    STRATA_CHECK_ARG(id >= 0, "encode_chars", "text", "characters '\\n' or 32..126 (the 96-character vocabulary)",
                     describe_byte(static_cast<unsigned char>(text[i])) + " at position " + std::to_string(i));
    ids[i] = id;
  }
  return ids;
}

std::string decode_chars(const int64_t* ids, int64_t n) {
  STRATA_CHECK_ARG(n >= 0, "decode_chars", "n", ">= 0", n);
  STRATA_CHECK_ARG(ids != nullptr || n == 0, "decode_chars", "ids", "a pointer to n ids", "null");
  std::string text(size_t(n), '\0');
  for (int64_t i = 0; i < n; ++i) {
    STRATA_CHECK_ARG(ids[i] >= 0 && ids[i] < CharCorpus::kVocab, "decode_chars", "ids", "ids in [0, 96)",
                     std::to_string(ids[i]) + " at position " + std::to_string(i));
    text[size_t(i)] = ids[i] == 0 ? '\n' : char(ids[i] + 31);
  }
  return text;
}

std::string decode_chars(const std::vector<int64_t>& ids) { return decode_chars(ids.data(), int64_t(ids.size())); }

void sample_char_windows(const std::vector<uint8_t>& split, int64_t batch, int64_t T, uint64_t seed, int64_t step,
                         int64_t micro, int64_t* out) {
  check_window("sample_char_windows", split, T);
  STRATA_CHECK_ARG(batch >= 1, "sample_char_windows", "batch", ">= 1", batch);
  STRATA_CHECK_ARG(out != nullptr, "sample_char_windows", "out", "a buffer of batch x (T+1) ids", "null");
  CounterRng rng(seed, step, micro, RngStream::char_windows);
  const auto starts = uint64_t(int64_t(split.size()) - T);  // start positions 0 .. size - T - 1
  for (int64_t b = 0; b < batch; ++b) {
    const uint8_t* src = split.data() + rng.below(starts);
    for (int64_t t = 0; t <= T; ++t) out[b * (T + 1) + t] = src[t];
  }
}

int64_t num_eval_windows(const std::vector<uint8_t>& split, int64_t T) {
  check_window("num_eval_windows", split, T);
  return (int64_t(split.size()) - 1) / T;
}

void eval_char_window(const std::vector<uint8_t>& split, int64_t T, int64_t k, int64_t* out) {
  const int64_t windows = num_eval_windows(split, T);
  STRATA_CHECK_ARG(k >= 0 && k < windows, "eval_char_window", "k", "in [0, " + std::to_string(windows) + ")", k);
  STRATA_CHECK_ARG(out != nullptr, "eval_char_window", "out", "a buffer of T+1 ids", "null");
  for (int64_t t = 0; t <= T; ++t) out[t] = split[size_t(k * T + t)];
}

}  // namespace strata::data
