// data/wordpiece.cpp: see wordpiece.h. The normalisation order is that of the tokenizers
// library's BertNormalizer (clean text, CJK padding, strip accents, then lower-case, each over
// the whole text) and BertPreTokenizer (split on whitespace and punctuation), which is what
// sentence-transformers runs; the reference outputs are in tests/cpp/data_wordpiece_test.cpp.
#include "data/wordpiece.h"

#include <utf8proc.h>

#include <algorithm>
#include <utility>

#include "data/files.h"
#include "strata/error.h"

namespace strata::data {

namespace {

using CodePoints = std::vector<int32_t>;

bool is_bert_control(int32_t c) {  // tokenizers' is_control: categories C* except \t \n \r
  if (c == '\t' || c == '\n' || c == '\r') return false;
  switch (utf8proc_category(c)) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CS:
      return true;
    default:
      return false;
  }
}

bool is_bert_whitespace(int32_t c) {  // tokenizers' is_whitespace: \t \n \r ' ' and Zs
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || utf8proc_category(c) == UTF8PROC_CATEGORY_ZS;
}

// The pre-tokenizer splits on char::is_whitespace (White_Space); after cleaning only ' ' and the
// line/paragraph separators (Zl, Zp) of that set can remain.
bool is_split_space(int32_t c) {
  const auto cat = utf8proc_category(c);
  return is_bert_whitespace(c) || cat == UTF8PROC_CATEGORY_ZL || cat == UTF8PROC_CATEGORY_ZP;
}

bool is_bert_punctuation(int32_t c) {  // ASCII symbols count too ('$', '+', '^', '`', ...)
  if ((c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126)) return true;
  switch (utf8proc_category(c)) {
    case UTF8PROC_CATEGORY_PC:
    case UTF8PROC_CATEGORY_PD:
    case UTF8PROC_CATEGORY_PS:
    case UTF8PROC_CATEGORY_PE:
    case UTF8PROC_CATEGORY_PI:
    case UTF8PROC_CATEGORY_PF:
    case UTF8PROC_CATEGORY_PO:
      return true;
    default:
      return false;
  }
}

bool is_cjk(int32_t c) {  // the CJK Unified Ideographs blocks BERT pads (not kana, not hangul)
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
         (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B820 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

// Valid UTF-8 to code points; throws naming the offending byte (`base`: offset of `text` in the input).
CodePoints decode(std::string_view text, size_t base) {
  CodePoints out;
  out.reserve(text.size());
  const auto* p = reinterpret_cast<const utf8proc_uint8_t*>(text.data());
  size_t i = 0;
  while (i < text.size()) {
    utf8proc_int32_t c = -1;
    const utf8proc_ssize_t n = utf8proc_iterate(p + i, utf8proc_ssize_t(text.size() - i), &c);
    if (n <= 0 || c < 0) {
      static const char* kHex = "0123456789abcdef";
      const unsigned b = p[i];
      throw_arg("WordPieceTokenizer", "text", "valid UTF-8",
                std::string("byte 0x") + kHex[b >> 4] + kHex[b & 15] + " at offset " + std::to_string(base + i));
    }
    out.push_back(c);
    i += size_t(n);
  }
  return out;
}

void append_utf8(int32_t c, std::string& out) {
  utf8proc_uint8_t buf[4];
  const utf8proc_ssize_t n = utf8proc_encode_char(c, buf);
  out.append(reinterpret_cast<const char*>(buf), size_t(n));
}

// Canonical decomposition (NFD) of a whole sequence: full decomposition of every code point,
// then the canonical ordering of each run of combining marks (stable sort by combining class).
CodePoints nfd(const CodePoints& in) {
  CodePoints out;
  out.reserve(in.size());
  utf8proc_int32_t buf[32];
  for (int32_t c : in) {
    int boundclass = 0;
    const utf8proc_ssize_t n = utf8proc_decompose_char(c, buf, 32, UTF8PROC_DECOMPOSE, &boundclass);
    if (n <= 0 || n > 32) {  // cannot happen for valid code points (max expansion is 18)
      out.push_back(c);
      continue;
    }
    out.insert(out.end(), buf, buf + n);
  }
  const auto ccc = [](int32_t c) { return utf8proc_get_property(c)->combining_class; };
  for (size_t i = 0; i < out.size();) {
    if (ccc(out[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < out.size() && ccc(out[j]) != 0) ++j;
    std::stable_sort(out.begin() + std::ptrdiff_t(i), out.begin() + std::ptrdiff_t(j),
                     [&](int32_t a, int32_t b) { return ccc(a) < ccc(b); });
    i = j;
  }
  return out;
}

}  // namespace

WordPieceTokenizer WordPieceTokenizer::from_vocab_file(const std::string& path, WordPieceOptions opt) {
  return from_vocab_text(read_file(path, "WordPieceTokenizer"), std::move(opt), "WordPiece vocabulary '" + path + "'");
}

WordPieceTokenizer WordPieceTokenizer::from_vocab_text(std::string_view text, WordPieceOptions opt,
                                                       const std::string& source) {
  std::vector<std::string> vocab;
  for (size_t start = 0; start < text.size();) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(start, end - start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    vocab.emplace_back(line);
    start = end + 1;
  }
  return WordPieceTokenizer(std::move(vocab), std::move(opt), source);
}

WordPieceTokenizer::WordPieceTokenizer(std::vector<std::string> vocab, WordPieceOptions opt, const std::string& source)
    : opt_(std::move(opt)), vocab_(std::move(vocab)) {
  STRATA_CHECK_ARG(opt_.max_chars_per_word > 0, "WordPieceTokenizer", "max_chars_per_word", "> 0",
                   opt_.max_chars_per_word);
  for (size_t i = 0; i < vocab_.size(); ++i) index_[vocab_[i]] = int64_t(i);  // a repeated token: last id wins
  const auto need = [&](const std::string& tok) {
    const int64_t i = id(tok);
    if (i < 0)
      throw Error(source + ": expected the special token '" + tok + "' among its " + std::to_string(vocab_.size()) +
                  " tokens, got none");
    return i;
  };
  unk_id_ = need(opt_.unk);
  cls_id_ = need(opt_.cls);
  sep_id_ = need(opt_.sep);
  pad_id_ = need(opt_.pad);
  specials_ = {opt_.pad, opt_.unk, opt_.cls, opt_.sep};
  if (id(opt_.mask) >= 0) specials_.push_back(opt_.mask);
  std::sort(specials_.begin(), specials_.end(),
            [](const std::string& a, const std::string& b) { return a.size() > b.size(); });
}

int64_t WordPieceTokenizer::id(std::string_view token) const {
  const auto it = index_.find(token);
  return it == index_.end() ? -1 : it->second;
}

const std::string& WordPieceTokenizer::token(int64_t id) const {
  STRATA_CHECK_ARG(id >= 0 && id < vocab_size(), "WordPieceTokenizer::token", "id",
                   "in [0, " + std::to_string(vocab_size()) + ")", id);
  return vocab_[size_t(id)];
}

std::vector<std::string> WordPieceTokenizer::basic_tokenize(std::string_view text) const {
  std::vector<std::string> words;
  // Special tokens are matched on the raw text (leftmost, longest) and never normalised.
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t hit = std::string_view::npos;
    const std::string* which = nullptr;
    for (size_t i = text.find('[', pos); i != std::string_view::npos; i = text.find('[', i + 1)) {
      for (const auto& s : specials_)
        if (text.compare(i, s.size(), s) == 0) {
          which = &s;
          break;
        }
      if (which) {
        hit = i;
        break;
      }
    }
    const std::string_view segment =
        text.substr(pos, hit == std::string_view::npos ? std::string_view::npos : hit - pos);

    // Clean text and pad CJK ideographs with spaces.
    CodePoints cleaned;
    for (int32_t c : decode(segment, pos)) {
      if (c == 0 || c == 0xFFFD || is_bert_control(c)) continue;
      if (is_bert_whitespace(c)) {
        cleaned.push_back(' ');
      } else if (opt_.tokenize_cjk && is_cjk(c)) {
        cleaned.insert(cleaned.end(), {' ', c, ' '});
      } else {
        cleaned.push_back(c);
      }
    }
    // Strip accents (NFD, drop Mn), then lower-case.
    if (opt_.lowercase) {
      CodePoints stripped;
      for (int32_t c : nfd(cleaned))
        if (utf8proc_category(c) != UTF8PROC_CATEGORY_MN) stripped.push_back(utf8proc_tolower(c));
      cleaned = std::move(stripped);
    }
    // Split on whitespace; every punctuation character is a word of its own.
    std::string word;
    const auto flush = [&] {
      if (!word.empty()) words.push_back(std::move(word));
      word.clear();
    };
    for (int32_t c : cleaned) {
      if (is_split_space(c)) {
        flush();
      } else if (is_bert_punctuation(c)) {
        flush();
        append_utf8(c, word);
        flush();
      } else {
        append_utf8(c, word);
      }
    }
    flush();

    if (!which) break;
    words.push_back(*which);
    pos = hit + which->size();
  }
  return words;
}

void WordPieceTokenizer::wordpiece(const std::string& word, std::vector<int64_t>& out) const {
  // Byte offsets of the code point boundaries of `word` (valid UTF-8 by construction).
  std::vector<size_t> bounds;
  const auto* p = reinterpret_cast<const utf8proc_uint8_t*>(word.data());
  for (size_t i = 0; i < word.size();) {
    bounds.push_back(i);
    utf8proc_int32_t c;
    i += size_t(utf8proc_iterate(p + i, utf8proc_ssize_t(word.size() - i), &c));
  }
  bounds.push_back(word.size());
  const size_t nchars = bounds.size() - 1;
  if (nchars > size_t(opt_.max_chars_per_word)) {
    out.push_back(unk_id_);
    return;
  }
  const size_t mark = out.size();
  std::string piece;
  for (size_t start = 0; start < nchars;) {
    int64_t match = -1;
    size_t end = nchars;
    for (; end > start; --end) {
      piece.assign(start > 0 ? "##" : "");
      piece.append(word, bounds[start], bounds[end] - bounds[start]);
      if ((match = id(piece)) >= 0) break;
    }
    if (match < 0) {  // an unmatched remainder makes the whole word unknown
      out.resize(mark);
      out.push_back(unk_id_);
      return;
    }
    out.push_back(match);
    start = end;
  }
}

std::vector<int64_t> WordPieceTokenizer::ids_of(std::string_view text) const {
  std::vector<int64_t> ids;
  for (const auto& w : basic_tokenize(text)) wordpiece(w, ids);
  return ids;
}

std::vector<int64_t> WordPieceTokenizer::tokenize_ids(std::string_view text) const { return ids_of(text); }

std::vector<std::string> WordPieceTokenizer::tokenize(std::string_view text) const {
  std::vector<std::string> out;
  for (int64_t i : ids_of(text)) out.push_back(vocab_[size_t(i)]);
  return out;
}

Encoding WordPieceTokenizer::encode(std::string_view text, int64_t max_len) const {
  STRATA_CHECK_ARG(max_len >= 2, "WordPieceTokenizer::encode", "max_len", ">= 2 (room for [CLS] and [SEP])", max_len);
  std::vector<int64_t> pieces = ids_of(text);
  Encoding e;
  e.truncated = int64_t(pieces.size()) > max_len - 2;
  if (e.truncated) pieces.resize(size_t(max_len - 2));
  e.ids.reserve(pieces.size() + 2);
  e.ids.push_back(cls_id_);
  e.ids.insert(e.ids.end(), pieces.begin(), pieces.end());
  e.ids.push_back(sep_id_);
  e.attention_mask.assign(e.ids.size(), 1);
  return e;
}

BatchEncoding WordPieceTokenizer::encode_batch(const std::vector<std::string>& texts, int64_t max_len) const {
  std::vector<Encoding> enc;
  enc.reserve(texts.size());
  BatchEncoding b;
  b.batch = int64_t(texts.size());
  for (const auto& t : texts) {
    enc.push_back(encode(t, max_len));
    b.seq = std::max(b.seq, int64_t(enc.back().ids.size()));
  }
  b.ids.assign(size_t(b.batch * b.seq), pad_id_);
  b.attention_mask.assign(size_t(b.batch * b.seq), 0);
  for (size_t i = 0; i < enc.size(); ++i) {
    std::copy(enc[i].ids.begin(), enc[i].ids.end(), b.ids.begin() + std::ptrdiff_t(i * size_t(b.seq)));
    std::fill_n(b.attention_mask.begin() + std::ptrdiff_t(i * size_t(b.seq)), enc[i].ids.size(), 1);
  }
  return b;
}

}  // namespace strata::data
