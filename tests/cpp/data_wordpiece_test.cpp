// tests/cpp/data_wordpiece_test.cpp: the WordPiece tokenizer (data/wordpiece.h). Unit tests on a
// small vocabulary written by the test, then the real all-MiniLM-L6-v2 vocab.txt against token
// ids produced once by the tokenizers (Rust) backend that sentence-transformers runs
// (tools/encoder_reference.py: transformers 5.24 BertTokenizerFast, tokenizers 0.23).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "data/minilm.h"
#include "data/wordpiece.h"
#include "strata/error.h"

namespace {

using namespace std::string_view_literals;
using strata::data::WordPieceOptions;
using strata::data::WordPieceTokenizer;

// Files by POSIX calls, not std::filesystem: libtorch.so exports its own (older) copies of the
// std::filesystem functions, and this executable, linked with torch, binds to them
// (std::filesystem::remove_all crashed).
std::string temp_dir() {
  const char* t = std::getenv("TMPDIR");
  return t && *t ? t : "/tmp";
}

// ids 0..4 specials, then pieces.
const std::vector<std::string> kTinyVocab = {
    "[PAD]", "[UNK]",     "[CLS]", "[SEP]", "[MASK]", "un",    "##aff", "##able", "aff",
    "able",  "##affable", "a",     "##a",   ",",      "!",     "hello", "world",  "##s",
    "cafe",  "東",        "京",    "x",     "##x",    "naive", "σ",     "##σ",    "ο",
};

WordPieceTokenizer tiny(WordPieceOptions opt = {}) { return WordPieceTokenizer(kTinyVocab, opt, "tiny vocabulary"); }

std::vector<std::string> S(std::initializer_list<const char*> l) { return {l.begin(), l.end()}; }

TEST(DataWordPiece, GreedyLongestMatchWithContinuationPieces) {
  const WordPieceTokenizer t = tiny();
  EXPECT_EQ(t.vocab_size(), int64_t(kTinyVocab.size()));
  EXPECT_EQ(t.cls_id(), 2);
  EXPECT_EQ(t.sep_id(), 3);
  EXPECT_EQ(t.pad_id(), 0);
  EXPECT_EQ(t.unk_id(), 1);
  // "##affable" is longer than "##aff" + "##able": the longest match wins.
  EXPECT_EQ(t.tokenize("unaffable"), S({"un", "##affable"}));
  EXPECT_EQ(t.tokenize("affable"), S({"aff", "##able"}));
  EXPECT_EQ(t.tokenize("aaa"), S({"a", "##a", "##a"}));
  EXPECT_EQ(t.tokenize("worlds"), S({"world", "##s"}));
  // An unmatched remainder makes the whole word [UNK], not a prefix + [UNK].
  EXPECT_EQ(t.tokenize("unaffablez hello"), S({"[UNK]", "hello"}));
  EXPECT_EQ(t.tokenize_ids("hello, world!"), (std::vector<int64_t>{15, 13, 16, 14}));
  EXPECT_EQ(t.id("##affable"), 10);
  EXPECT_EQ(t.id("nope"), -1);
  EXPECT_EQ(t.token(16), "world");
  EXPECT_THROW(t.token(int64_t(kTinyVocab.size())), strata::Error);
  EXPECT_THROW(t.token(-1), strata::Error);
}

TEST(DataWordPiece, BasicTokenizerNormalises) {
  const WordPieceTokenizer t = tiny();
  // Lower-case + strip accents, punctuation split, whitespace of every kind.
  EXPECT_EQ(t.basic_tokenize("  Café\tNAÏVE,\u3000Hello!! "), S({"cafe", "naive", ",", "hello", "!", "!"}));
  // CJK ideographs become words of their own; kana does not.
  EXPECT_EQ(t.basic_tokenize("東京は"), S({"東", "京", "は"}));
  // Controls, format characters, NUL and U+FFFD vanish without splitting.
  EXPECT_EQ(t.basic_tokenize("he\x00l\xe2\x80\x8bl\xef\xbf\xbdo"sv), S({"hello"}));
  // Upper-case sigma lowers to sigma everywhere (character-wise, no final form), as tokenizers does.
  EXPECT_EQ(t.basic_tokenize("ΟΣ"), S({"οσ"}));
  // Special tokens are kept whole when written exactly; lower-case look-alikes are split.
  EXPECT_EQ(t.basic_tokenize("a[MASK]b [mask]"), S({"a", "[MASK]", "b", "[", "mask", "]"}));
  EXPECT_EQ(t.tokenize_ids("x[SEP]x"), (std::vector<int64_t>{21, 3, 21}));
  // With lower-casing off, case and accents stay.
  WordPieceOptions cased;
  cased.lowercase = false;
  EXPECT_EQ(tiny(cased).basic_tokenize("Café"), S({"Café"}));
}

TEST(DataWordPiece, MaxCharsPerWord) {
  WordPieceOptions opt;
  opt.max_chars_per_word = 4;
  const WordPieceTokenizer t = tiny(opt);
  EXPECT_EQ(t.tokenize("xxxx xxxxx"), S({"x", "##x", "##x", "##x", "[UNK]"}));
  // Counted in code points, not bytes: 4 two-byte characters are within the limit.
  EXPECT_EQ(t.tokenize("σσσσ"), S({"σ", "##σ", "##σ", "##σ"}));
  opt.max_chars_per_word = 0;
  EXPECT_THROW(tiny(opt), strata::Error);
}

TEST(DataWordPiece, EncodeAddsSpecialsTruncatesAndPads) {
  const WordPieceTokenizer t = tiny();
  const auto e = t.encode("hello world hello", 512);
  EXPECT_EQ(e.ids, (std::vector<int64_t>{2, 15, 16, 15, 3}));
  EXPECT_EQ(e.attention_mask, (std::vector<int64_t>{1, 1, 1, 1, 1}));
  EXPECT_FALSE(e.truncated);
  const auto cut = t.encode("hello world hello", 4);
  EXPECT_EQ(cut.ids, (std::vector<int64_t>{2, 15, 16, 3}));
  EXPECT_TRUE(cut.truncated);
  EXPECT_EQ(t.encode("hello", 2).ids, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(t.encode("", 8).ids, (std::vector<int64_t>{2, 3}));
  try {
    t.encode("hello", 1);
    FAIL() << "expected strata::Error";
  } catch (const strata::Error& err) {
    EXPECT_NE(std::string(err.what()).find("argument 'max_len'"), std::string::npos) << err.what();
  }
  const auto b = t.encode_batch({"hello", "hello world hello", ""}, 512);
  EXPECT_EQ(b.batch, 3);
  EXPECT_EQ(b.seq, 5);
  EXPECT_EQ(b.ids, (std::vector<int64_t>{2, 15, 3, 0, 0, 2, 15, 16, 15, 3, 2, 3, 0, 0, 0}));
  EXPECT_EQ(b.attention_mask, (std::vector<int64_t>{1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0}));
}

TEST(DataWordPiece, InvalidInputIsAClearError) {
  const WordPieceTokenizer t = tiny();
  const std::vector<std::pair<std::string_view, int>> bad = {
      {"ok \xff"sv, 3}, {"caf\xc3"sv, 3}, {"a[SEP]\xed\xa0\x80"sv, 6}, {"\xc0\xaf"sv, 0}};
  for (const auto& [text, offset] : bad) {
    try {
      t.tokenize(text);
      FAIL() << "expected strata::Error for offset " << offset;
    } catch (const strata::Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("argument 'text': expected valid UTF-8"), std::string::npos) << msg;
      EXPECT_NE(msg.find("at offset " + std::to_string(offset)), std::string::npos) << msg;
    }
  }
  // A vocabulary without [UNK]; a vocabulary file that does not exist.
  std::vector<std::string> v = kTinyVocab;
  v[1] = "[unk]";
  try {
    WordPieceTokenizer(v, {}, "broken vocabulary");
    FAIL() << "expected strata::Error";
  } catch (const strata::Error& e) {
    EXPECT_NE(std::string(e.what()).find("broken vocabulary: expected the special token '[UNK]'"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(WordPieceTokenizer::from_vocab_file("/nonexistent/vocab.txt"), strata::Error);
}

TEST(DataWordPiece, VocabFileIdsAreLineNumbers) {
  const std::string path = temp_dir() + '/' + "strata_vocab_" + std::to_string(::getpid()) + ".txt";
  {
    std::ofstream out(path, std::ios::binary);
    for (const auto& tok : kTinyVocab) out << tok << (tok == "hello" ? "\r\n" : "\n");  // one CRLF line
  }
  const WordPieceTokenizer t = WordPieceTokenizer::from_vocab_file(path);
  std::remove(path.c_str());
  EXPECT_EQ(t.vocab_size(), int64_t(kTinyVocab.size()));
  EXPECT_EQ(t.id("hello"), 15);
  EXPECT_EQ(t.encode("Hello, world!").ids, (std::vector<int64_t>{2, 15, 13, 16, 14, 3}));
}

// Random text (ASCII, accents, combining marks, CJK, controls, separators, any code point, and
// invalid bytes): every outcome is ids inside the vocabulary or, for invalid UTF-8 only, a
// strata::Error. Run under ASan + UBSan too.
TEST(DataWordPiece, FuzzedTextTokenizesOrThrowsStrataError) {
  const WordPieceTokenizer t = tiny();
  std::mt19937 rng(7);
  const auto pick = [&](uint32_t lo, uint32_t hi) { return std::uniform_int_distribution<uint32_t>(lo, hi)(rng); };
  const auto append = [](std::string& s, uint32_t c) {
    if (c < 0x80) {
      s += char(c);
    } else if (c < 0x800) {
      s += char(0xC0 | (c >> 6));
      s += char(0x80 | (c & 0x3F));
    } else if (c < 0x10000) {
      s += char(0xE0 | (c >> 12));
      s += char(0x80 | ((c >> 6) & 0x3F));
      s += char(0x80 | (c & 0x3F));
    } else {
      s += char(0xF0 | (c >> 18));
      s += char(0x80 | ((c >> 12) & 0x3F));
      s += char(0x80 | ((c >> 6) & 0x3F));
      s += char(0x80 | (c & 0x3F));
    }
  };
  const uint32_t pools[][2] = {{0x20, 0x7E},       {0x00, 0x1F},     {0xC0, 0x17F},    {0x300, 0x36F},
                               {0x4E00, 0x4E20},   {0x3040, 0x30FF}, {0x2000, 0x206F}, {0xAC00, 0xAC10},
                               {0x1F600, 0x1F64F}, {0x80, 0x10FFFF}};
  int valid = 0, invalid = 0;
  for (int it = 0; it < 3000; ++it) {
    std::string s;
    bool broken = false;
    const int n = int(pick(0, 40));
    for (int i = 0; i < n; ++i) {
      if (it % 4 == 3 && pick(0, 30) == 0) {  // a raw byte: may break the encoding
        s += char(pick(0x80, 0xFF));
        broken = true;
        continue;
      }
      if (pick(0, 12) == 0) {
        s += "[SEP]";
        continue;
      }
      const auto& p = pools[pick(0, std::size(pools) - 1)];
      uint32_t c = pick(p[0], p[1]);
      if (c >= 0xD800 && c <= 0xDFFF) c = 'x';  // surrogates are not characters
      append(s, c);
    }
    try {
      const auto e = t.encode(s, 64);
      ASSERT_LE(e.ids.size(), 64u);
      ASSERT_EQ(e.ids.front(), t.cls_id());
      ASSERT_EQ(e.ids.back(), t.sep_id());
      for (int64_t id : e.ids) ASSERT_TRUE(id >= 0 && id < t.vocab_size()) << id;
      ++valid;
    } catch (const strata::Error& e) {
      ASSERT_TRUE(broken) << "valid UTF-8 rejected: " << e.what();
      ++invalid;
    }
  }
  EXPECT_GT(valid, 2000);
  EXPECT_GT(invalid, 50);
}

struct ReferenceCase {
  std::string_view text;
  std::vector<int64_t> ids;
};

// Generated by tools/encoder_reference.py (max_length 512); the comment shows the tokens.
// clang-format off
const std::vector<ReferenceCase> kReferenceCases = {
    // [CLS] hello , world ! [SEP]
    {"Hello, world!"sv,
     {101, 7592, 1010, 2088, 999, 102}},
    // [CLS] the quick brown fox jumps over the lazy dog . [SEP]
    {"The quick brown fox jumps over the lazy dog."sv,
     {101, 1996, 4248, 2829, 4419, 14523, 2058, 1996, 13971, 3899, 1012, 102}},
    // [CLS] cafe de ##ja vu : naive resume facade , ang ##strom , œ ##u ##vre . [SEP]
    {"Café déjà vu: naïve résumé façade, Ångström, Œuvre."sv,
     {101, 7668, 2139, 3900, 24728, 1024, 15743, 13746, 8508, 1010, 17076, 15687, 1010, 1107, 2226, 12229, 1012, 102}},
    // [CLS] i can ' t believe it ' s not butter . . . ( really ? ! ) [SEP]
    {"I can't believe it's not butter... (really?!)"sv,
     {101, 1045, 2064, 1005, 1056, 2903, 2009, 1005, 1055, 2025, 12136, 1012, 1012, 1012, 1006, 2428, 1029, 999, 1007, 102}},
    // [CLS] 東 京 は 日 本 の [UNK] 都 て ##す 。 北 京 也 [UNK] 大 [SEP]
    {"東京は日本の首都です。北京也很大"sv,
     {101, 1879, 1755, 1672, 1864, 1876, 1671, 100, 1961, 1665, 30184, 1636, 1781, 1755, 1750, 100, 1810, 102}},
    // [CLS] ᄀ ##ᅡ ##ᄂ ##ᅡ ##ᄃ ##ᅡ ᄒ ##ᅡ ##ᆫ ##ᄀ ##ᅮ ##ᆨ ##ᄋ ##ᅥ [SEP]
    {"가나다 한국어"sv,
     {101, 1455, 30006, 29992, 30006, 29993, 30006, 1469, 30006, 30021, 29991, 30014, 30020, 29999, 30008, 102}},
    // [CLS] una ##ffa ##ble super ##cal ##if ##rag ##ilis ##tic ##ex ##pia ##lid ##oc ##ious anti ##dis ##est ##ab ##lish ##ment ##arian ##ism [SEP]
    {"unaffable supercalifragilisticexpialidocious antidisestablishmentarianism"sv,
     {101, 14477, 20961, 3468, 3565, 9289, 10128, 29181, 24411, 4588, 10288, 19312, 21273, 10085, 6313, 3424, 10521, 4355, 7875, 13602, 3672, 12199, 2964, 102}},
    // [CLS] [UNK] ok y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y ##y [SEP]
    {"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx ok yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy"sv,
     {101, 100, 7929, 1061, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 2100, 102}},
    // [CLS] tab ##s and new ##lines and multiple spaces line para ##fs ##nel [SEP]
    {"Tabs\x09" "and\x0a" "newlines\x0d" "\x0a" "and   multiple   spaces\xe2\x80\xa8" "line\xe2\x80\xa9" "para\x1c" "fs\xc2\x85" "nel"sv,
     {101, 21628, 2015, 1998, 2047, 12735, 1998, 3674, 7258, 2240, 11498, 10343, 11877, 102}},
    // [CLS] em ##oj ##i [UNK] and math [UNK] √ ##2 ≈ 1 . 41 ##4 ¿ que ? ¡ si ! [SEP]
    {"Emoji 🙂 and math ∑ √2 ≈ 1.414 ¿Qué? ¡Sí!"sv,
     {101, 7861, 29147, 2072, 100, 1998, 8785, 100, 1600, 2475, 1606, 1015, 1012, 4601, 2549, 1094, 10861, 1029, 1067, 9033, 999, 102}},
    // [CLS] [UNK] letters and [UNK] , st ##raße , ca , istanbul , [UNK] ½ ﬁ [SEP]
    {"Ｆｕｌｌｗｉｄｔｈ letters and ＡＢＣ１２３, Straße, ÇA, İstanbul, Ǆ ½ ﬁ"sv,
     {101, 100, 4144, 1998, 100, 1010, 2358, 27807, 1010, 6187, 1010, 9960, 1010, 100, 1092, 1984, 102}},
    // [CLS] control ##cha ##rz ##ero ##wi ##dt ##h soft - h ##yp ##hen [SEP]
    {"control\x00" "char\xe2\x80\x8b" "zero�width \xc2\xad" "soft-hyphen"sv,
     {101, 2491, 7507, 15378, 10624, 9148, 11927, 2232, 3730, 1011, 1044, 22571, 10222, 102}},
    // [CLS] п ##р ##и ##в ##е ##т , м ##и ##р ! γ ##ε ##ια σ ##ου κ ##ο ##σ ##μ ##ε , ο ##δ ##ο ##σ . ש ##ל ##ו ##ם ע ##ו ##ל ##ם م ##ر ##ح ##ب ##ا [SEP]
    {"Привет, мир! Γειά σου κόσμε, ΟΔΟΣ. שלום עולם مرحبا"sv,
     {101, 1194, 16856, 10325, 25529, 15290, 22919, 1010, 1191, 10325, 16856, 999, 1157, 29723, 27432, 1173, 26789, 1164, 29730, 29733, 29728, 29723, 1010, 1169, 29722, 29730, 29733, 1012, 1266, 29799, 29792, 29800, 1259, 29792, 29799, 29800, 1295, 17149, 29820, 29816, 25573, 102}},
    // [CLS] e - mail : john . doe @ example . com , ur ##l https : / / strata . dev / x ? y = 1 & z = 2 # top $ 3 . 50 50 % # hash ##tag [SEP]
    {"e-mail: john.doe@example.com, URL https://strata.dev/x?y=1&z=2#top $3.50 50% #hashtag"sv,
     {101, 1041, 1011, 5653, 1024, 2198, 1012, 18629, 1030, 2742, 1012, 4012, 1010, 24471, 2140, 16770, 1024, 1013, 1013, 22913, 1012, 16475, 1013, 1060, 1029, 1061, 1027, 1015, 1004, 1062, 1027, 1016, 1001, 2327, 1002, 1017, 1012, 2753, 2753, 1003, 1001, 23325, 15900, 102}},
    // [CLS] hello [MASK] world [SEP] x [ mask ] [CLS] [UNK] [SEP]
    {"hello[MASK]world [SEP] x [mask] [CLS][UNK]"sv,
     {101, 7592, 103, 2088, 102, 1060, 1031, 7308, 1033, 101, 100, 102}},
    // [CLS] no [UNK] [SEP]
    {"n\xcc\x83" "o\xcc\x83" " \xe3\x82\x99" "\xe3\x82\x9a" " ｶﾞ"sv,
     {101, 2053, 100, 102}},
    // [CLS] [SEP]
    {""sv,
     {101, 102}},
};
// clang-format on

TEST(DataWordPiece, MatchesTheReferenceTokenizerOnMiniLmVocab) {
  std::string why;
  const std::string dir = strata::data::find_minilm_dir(&why);
  if (dir.empty()) GTEST_SKIP() << "all-MiniLM-L6-v2 not installed: " << why;
  const WordPieceTokenizer t = WordPieceTokenizer::from_vocab_file(dir + "/vocab.txt");
  EXPECT_EQ(t.vocab_size(), 30522);
  EXPECT_EQ(t.cls_id(), 101);
  EXPECT_EQ(t.sep_id(), 102);
  EXPECT_EQ(t.unk_id(), 100);
  for (const auto& c : kReferenceCases) {
    const auto e = t.encode(c.text, 512);
    EXPECT_EQ(e.ids, c.ids) << "text: " << c.text;
    EXPECT_EQ(e.attention_mask, std::vector<int64_t>(c.ids.size(), 1));
  }
  // Truncation keeps the first max_len - 2 pieces (reference, max_length 8).
  EXPECT_EQ(t.encode(kReferenceCases[1].text, 8).ids,
            (std::vector<int64_t>{101, 1996, 4248, 2829, 4419, 14523, 2058, 102}));
}

}  // namespace
