// data/wordpiece.h: the BERT uncased WordPiece tokenizer (torch-free), as in Hugging Face's
// BertTokenizer / BertTokenizerFast with do_lower_case=True (bert-base-uncased, all-MiniLM-L6-v2).
//
//   1. special tokens written literally in the text ("[SEP]", "[MASK]", ...) map to their ids
//   2. BasicTokenizer: clean text (drop NUL, U+FFFD and control/format/unassigned code points,
//      map whitespace to ' '); put spaces around CJK ideographs; split on whitespace; per word:
//      lower-case (full Unicode mapping incl. final sigma), NFD, drop nonspacing marks (Mn);
//      split off every punctuation character (ASCII symbols count as punctuation)
//   3. WordPiece: greedy longest match from the left, continuation pieces prefixed "##"; a word
//      with an unmatched remainder, or longer than max_chars_per_word code points, is [UNK]
//   4. encode: [CLS] pieces [SEP], truncated to max_len, attention mask of ones
//
// Unicode properties come from utf8proc. Input must be valid UTF-8 (strata::Error otherwise).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace strata::data {

struct WordPieceOptions {
  bool lowercase = true;     // also strips accents (NFD, drop Mn), as BERT uncased does
  bool tokenize_cjk = true;  // one token per CJK ideograph
  int max_chars_per_word = 100;
  std::string unk = "[UNK]", cls = "[CLS]", sep = "[SEP]", pad = "[PAD]", mask = "[MASK]";
};

// One text: ids = [CLS] pieces [SEP] (at most max_len), attention_mask = ones, same length.
struct Encoding {
  std::vector<int64_t> ids;
  std::vector<int64_t> attention_mask;
  bool truncated = false;  // pieces were dropped to fit max_len
};

// Several texts padded to the longest: row-major batch x seq, [PAD] ids where the mask is 0.
struct BatchEncoding {
  int64_t batch = 0, seq = 0;
  std::vector<int64_t> ids;
  std::vector<int64_t> attention_mask;
};

class WordPieceTokenizer {
 public:
  // vocab.txt: one token per line, id = line number from 0. Throws strata::Error naming the file
  // when it cannot be read or lacks one of the special tokens.
  static WordPieceTokenizer from_vocab_file(const std::string& path, WordPieceOptions opt = {});
  // The same from the file's text (lines split at '\n', a trailing '\r' dropped); `source` names
  // it in errors.
  static WordPieceTokenizer from_vocab_text(std::string_view text, WordPieceOptions opt = {},
                                            const std::string& source = "vocabulary");
  explicit WordPieceTokenizer(std::vector<std::string> vocab, WordPieceOptions opt = {},
                              const std::string& source = "vocabulary");

  // Step 1 + 2: normalised words and punctuation (special tokens kept whole).
  std::vector<std::string> basic_tokenize(std::string_view text) const;
  // Steps 1-3: the WordPiece tokens of the text, no [CLS]/[SEP].
  std::vector<std::string> tokenize(std::string_view text) const;
  std::vector<int64_t> tokenize_ids(std::string_view text) const;
  // Steps 1-4. max_len >= 2 (room for [CLS] and [SEP]).
  Encoding encode(std::string_view text, int64_t max_len = 512) const;
  BatchEncoding encode_batch(const std::vector<std::string>& texts, int64_t max_len = 512) const;

  // Id of a vocabulary token, or -1.
  int64_t id(std::string_view token) const;
  const std::string& token(int64_t id) const;
  int64_t vocab_size() const { return int64_t(vocab_.size()); }
  int64_t unk_id() const { return unk_id_; }
  int64_t cls_id() const { return cls_id_; }
  int64_t sep_id() const { return sep_id_; }
  int64_t pad_id() const { return pad_id_; }

 private:
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  // Appends the WordPiece ids of one basic token to `out`.
  void wordpiece(const std::string& word, std::vector<int64_t>& out) const;
  std::vector<int64_t> ids_of(std::string_view text) const;

  WordPieceOptions opt_;
  std::vector<std::string> vocab_;
  std::unordered_map<std::string, int64_t, Hash, std::equal_to<>> index_;
  std::vector<std::string> specials_;  // matched literally in the input, longest first
  int64_t unk_id_ = -1, cls_id_ = -1, sep_id_ = -1, pad_id_ = -1;
};

}  // namespace strata::data
