// tests/fuzz/wordpiece_fuzz.cpp: the WordPiece tokenizer (data/wordpiece.h). An input holding a NUL
// is "<vocab.txt text>\0<text>"; else the text alone, tokenized with a fixed small vocabulary.
// Properties: ids are in the vocabulary, [CLS] first and [SEP] last, within max_len.
#include <vector>

#include "data/wordpiece.h"
#include "fuzz_common.h"

namespace {

const char* kVocab =
    "[PAD]\n[unused0]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n!\n\"\n#\n'\n(\n)\n,\n-\n.\n:\n?\na\nb\nc\ne\nh\ni\nn\no\nr\ns\n"
    "t\nthe\nof\nand\nto\nin\nis\n##s\n##ing\n##ed\n##e\n##a\n##n\n##t\nattention\nmonarch\nstruct\n##ured\n"
    "\xc3\xa9\n\xe4\xb8\xad\n";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace strata;
  const std::string in = fuzz::text_of(data, size);
  const size_t nul = in.find('\0');
  const std::string vocab = nul == std::string::npos ? kVocab : in.substr(0, nul);
  const std::string text = nul == std::string::npos ? in : in.substr(nul + 1);
  fuzz::accepted([&] {
    const auto tok = data::WordPieceTokenizer::from_vocab_text(vocab, {}, "fuzz vocab");
    const int64_t max_len = 2 + int64_t(size % 64);
    const data::Encoding e = tok.encode(text, max_len);
    if (e.ids.size() < 2 || int64_t(e.ids.size()) > max_len || e.ids.front() != tok.cls_id() ||
        e.ids.back() != tok.sep_id() || e.attention_mask.size() != e.ids.size())
      fuzz::property_failed("an encoding without [CLS] ... [SEP] within max_len", text);
    for (int64_t id : e.ids)
      if (id < 0 || id >= tok.vocab_size()) fuzz::property_failed("an id outside the vocabulary", std::to_string(id));
    const data::BatchEncoding b = tok.encode_batch({text, "a"}, max_len);
    if (b.ids.size() != size_t(b.batch * b.seq)) fuzz::property_failed("a batch of the wrong size", text);
  });
  return 0;
}
