// data/char_corpus.h: the character-level language-modelling corpora (torch-free), experiments.md
// section 2: tinyshakespeare (shared/data/text) and Debian's King James Bible (bible-kjv), standing
// in for ref's OpenWebText, with ref's 96-character printable-ASCII vocabulary.
//
// Vocabulary (ref): '\n' and the 95 printable ASCII characters 32..126; id 0 = '\n', id c - 31 for c.
// A document with a character outside it is dropped whole (ref drops such OpenWebText documents).
// Here a document is a LINE (with its '\n'): KJV's lines are its verses, tinyshakespeare's are lines
// of a speech, and both files hold only vocabulary characters, so nothing is dropped from either;
// for a user's file a line is the smallest unit whose removal keeps the neighbouring text intact
// (a paragraph would lose more text for one stray character). '\r' is outside the vocabulary: a
// CRLF file loses every line, which is reported as an error.
//
// Splits by position (experiments.md): the last floor(n * val_fraction) ids are val, the rest train.
// Batches are pure functions of (seed, step, micro) (data/counter_rng.h), so a resumed run sees the
// uninterrupted run's batches.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace strata::data {

// shared/data/README.md's sha256 of text/tinyshakespeare.txt (1,115,394 bytes).
inline constexpr const char* kTinyShakespeareSha256 =
    "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed";
// sha256 of `bible -f 'gen1:1-rev22:21'` from Debian's bible-kjv 4.38 (4,404,412 bytes; 31,102
// verses, one per line; 72 distinct printable characters and '\n'), measured when scripts/setup.sh
// gained the step.
inline constexpr const char* kKjvSha256 = "cd45f0c9cedab8e4439bd6486c8952c77cc8b0ecc5d1f6ae3513f2039f47229d";

struct CharCorpus {
  std::string name, path;            // "tinyshakespeare" | "kjv" | the path a user gave
  std::vector<uint8_t> train, val;   // token ids; split by position, the last val_fraction is val
  int64_t dropped_chars = 0;         // characters outside the vocabulary (UTF-8 characters, else bytes) in dropped lines
  int64_t dropped_lines = 0;         // lines (documents) dropped for holding one
  static constexpr int64_t kVocab = 96;
};

// The id of byte c: '\n' -> 0, 32..126 -> c - 31; -1 outside the vocabulary.
inline int char_id(unsigned char c) { return c == '\n' ? 0 : (c >= 32 && c <= 126 ? int(c) - 31 : -1); }

// Where scripts/setup.sh writes the KJV text: $STRATA_HOME/data/kjv.txt, STRATA_HOME defaulting to
// $HOME/.cache/strata.
std::string kjv_path();

// Loads "tinyshakespeare" (shared/data/text/tinyshakespeare.txt via find_shared_file), "kjv"
// (kjv_path()) or a path to a text file. Named corpora, and a path whose file name is
// tinyshakespeare.txt or kjv.txt (a copy), are checked against their sha256; a missing or altered
// one is a strata::Error naming the file, the expected and actual sha256 and how to get it.
// val_fraction in (0, 1); both splits must come out non-empty (strata::Error otherwise).
CharCorpus load_char_corpus(const std::string& name_or_path, double val_fraction = 0.1);

// The corpus of `text` (already read): drops the lines with characters outside the vocabulary and
// splits. `name` goes into the result and into error messages.
CharCorpus make_char_corpus(const std::string& name, std::string_view text, double val_fraction = 0.1);

// Text -> ids; a character outside the vocabulary is a strata::Error naming it and its position.
std::vector<int64_t> encode_chars(std::string_view text);
// Ids -> text; an id outside [0, 96) is a strata::Error naming it and its position.
std::string decode_chars(const int64_t* ids, int64_t n);
std::string decode_chars(const std::vector<int64_t>& ids);

// `batch` windows of T + 1 consecutive ids of `split` (input = first T, targets = last T), each
// starting at a position drawn uniformly from [0, size - T - 1] by (seed, step, micro); window b
// does not depend on `batch` (a prefix of a larger batch is the smaller batch).
void sample_char_windows(const std::vector<uint8_t>& split, int64_t batch, int64_t T, uint64_t seed, int64_t step,
                         int64_t micro, int64_t* out /* batch x (T+1) */);

// Evaluation: window k holds ids [k T, k T + T + 1) of the split, so consecutive windows share one
// id and every id but the first is a target exactly once; the tail of fewer than T targets is left
// out. Count: floor((size - 1) / T).
int64_t num_eval_windows(const std::vector<uint8_t>& split, int64_t T);
void eval_char_window(const std::vector<uint8_t>& split, int64_t T, int64_t k, int64_t* out /* T+1 */);

}  // namespace strata::data
