// tests/cpp/data_safetensors_test.cpp: the safetensors reader (data/safetensors.h) on files the
// test writes (valid ones, one per malformation, and thousands of random corruptions: every
// outcome must be a valid file or a strata::Error), SHA-256 against the FIPS 180 examples, and
// the real all-MiniLM-L6-v2 checkpoint when scripts/setup_encoder.sh has installed it.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "data/minilm.h"
#include "data/safetensors.h"
#include "data/sha256.h"
#include "strata/error.h"

namespace {

using strata::data::SafetensorsFile;
using strata::data::StDType;

// Files by POSIX calls, not std::filesystem: libtorch.so exports its own (older) copies of the
// std::filesystem functions, and this executable, linked with torch, binds to them
// (std::filesystem::remove_all crashed).
std::string temp_dir() {
  const char* t = std::getenv("TMPDIR");
  return t && *t ? t : "/tmp";
}

struct Entry {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;
};

// A safetensors image: header (entries in the given order, offsets packed in that order, the
// header padded with spaces to a multiple of 8 as the reference writer does), then the data.
std::vector<std::byte> make_image(const std::vector<Entry>& entries, const std::string& metadata_json = "") {
  std::string header = "{";
  size_t offset = 0;
  if (!metadata_json.empty()) header += "\"__metadata__\":" + metadata_json;
  for (const auto& e : entries) {
    if (header.size() > 1) header += ",";
    // Appends one piece at a time (GCC 12 warns falsely on long operator+ chains: -Wrestrict).
    for (const std::string& piece :
         {std::string("\""), e.name, std::string("\":{\"dtype\":\""), e.dtype, std::string("\",\"shape\":[")})
      header += piece;
    for (size_t i = 0; i < e.shape.size(); ++i) {
      if (i) header += ",";
      header += std::to_string(e.shape[i]);
    }
    header += "],\"data_offsets\":[";
    header += std::to_string(offset);
    header += ",";
    header += std::to_string(offset + e.data.size());
    header += "]}";
    offset += e.data.size();
  }
  header += "}";
  while (header.size() % 8) header += ' ';
  std::vector<std::byte> img(8);
  for (int i = 0; i < 8; ++i) img[size_t(i)] = std::byte(uint8_t(uint64_t(header.size()) >> (8 * i)));
  for (char c : header) img.push_back(std::byte(uint8_t(c)));
  for (const auto& e : entries)
    for (uint8_t b : e.data) img.push_back(std::byte(b));
  return img;
}

// An image with a hand-written header (length prefix computed) and `data_bytes` zero bytes.
std::vector<std::byte> raw_image(const std::string& header, size_t data_bytes) {
  std::vector<std::byte> img(8);
  for (int i = 0; i < 8; ++i) img[size_t(i)] = std::byte(uint8_t(uint64_t(header.size()) >> (8 * i)));
  for (char c : header) img.push_back(std::byte(uint8_t(c)));
  img.resize(img.size() + data_bytes, std::byte{0});
  return img;
}

std::vector<uint8_t> bytes_of(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

std::vector<Entry> sample_entries() {
  std::vector<uint8_t> ids(4 * 8);
  for (size_t i = 0; i < ids.size(); i += 8) ids[i] = uint8_t(i / 8 + 1);  // int64 1, 2, 3, 4
  return {
      {"weight", "F32", {2, 3}, bytes_of({1.f, 2.f, 3.f, 4.f, 5.f, 6.f})},
      {"ids", "I64", {4}, ids},
      {"empty", "BF16", {0, 5}, {}},
      {"scalar", "U8", {}, {42}},
      {"half", "F16", {1, 2}, {0x00, 0x3c, 0x00, 0xc0}},  // 1.0, -2.0
  };
}

std::string temp_path(const std::string& stem) {
  return temp_dir() + '/' + "strata_" + stem + "_" + std::to_string(::getpid()) + ".safetensors";
}

void write_file(const std::string& path, const std::vector<std::byte>& img) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(img.data()), std::streamsize(img.size()));
  ASSERT_TRUE(out.good()) << path;
}

// The message of the strata::Error that parsing `img` throws ("" when it parses).
std::string error_of(const std::vector<std::byte>& img, const std::string& name = "case.safetensors") {
  try {
    SafetensorsFile::from_bytes(img, name);
  } catch (const strata::Error& e) {
    return e.what();
  }
  return "";
}

TEST(DataSafetensors, ReadsWhatItWroteFromAFile) {
  const auto entries = sample_entries();
  const std::string path = temp_path("valid");
  write_file(path, make_image(entries, R"({"format":"pt","note":"x"})"));
  const SafetensorsFile f = SafetensorsFile::open(path);
  std::remove(path.c_str());  // the mapping outlives the directory entry

  EXPECT_EQ(f.path(), path);
  ASSERT_EQ(f.size(), 5u);
  // Data order by (begin, end): the zero-sized "empty" [56, 56] comes before "scalar" [56, 57].
  EXPECT_EQ(f.names(), (std::vector<std::string>{"weight", "ids", "empty", "scalar", "half"}));
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.metadata().at("note"), "x");

  const auto& w = f.tensor("weight");
  EXPECT_EQ(w.dtype, StDType::F32);
  EXPECT_EQ(w.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(w.shape_str(), "[2, 3]");
  EXPECT_EQ(w.numel(), 6);
  ASSERT_EQ(w.bytes.size(), 24u);
  float v[6];
  std::memcpy(v, w.bytes.data(), 24);
  EXPECT_EQ(v[0], 1.f);
  EXPECT_EQ(v[5], 6.f);

  const auto& ids = f.tensor("ids");
  EXPECT_EQ(ids.dtype, StDType::I64);
  int64_t i64[4];
  std::memcpy(i64, ids.bytes.data(), 32);
  EXPECT_EQ(i64[0], 1);
  EXPECT_EQ(i64[3], 4);

  EXPECT_EQ(f.tensor("empty").numel(), 0);
  EXPECT_TRUE(f.tensor("empty").bytes.empty());
  EXPECT_EQ(f.tensor("scalar").numel(), 1);
  EXPECT_EQ(std::to_integer<int>(f.tensor("scalar").bytes[0]), 42);
  EXPECT_EQ(f.tensor("half").dtype, StDType::F16);
  EXPECT_EQ(strata::data::st_dtype_size(StDType::F16), 2u);
  EXPECT_STREQ(strata::data::st_dtype_name(StDType::BF16), "BF16");

  EXPECT_TRUE(f.contains("weight"));
  EXPECT_FALSE(f.contains("bias"));
  try {
    f.tensor("bias");
    FAIL() << "expected strata::Error";
  } catch (const strata::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no tensor named 'bias'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}

TEST(DataSafetensors, AcceptsEveryDtypeAndUnsortedHeaderOrder) {
  // Offsets in the header need not follow key order; every dtype of the format is known.
  std::vector<Entry> entries;
  const std::pair<const char*, size_t> dts[] = {{"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1},
                                                {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
                                                {"U32", 4},  {"F32", 4}, {"F64", 8}, {"I64", 8},     {"U64", 8}};
  for (const auto& [name, size] : dts)
    entries.push_back({std::string("z_") + name, name, {3}, std::vector<uint8_t>(3 * size, 7)});
  const SafetensorsFile f = SafetensorsFile::from_bytes(make_image(entries), "all_dtypes");
  ASSERT_EQ(f.size(), std::size(dts));
  for (size_t i = 0; i < std::size(dts); ++i) {
    const auto& t = f.tensors()[i];
    EXPECT_STREQ(strata::data::st_dtype_name(t.dtype), dts[i].first);
    EXPECT_EQ(t.bytes.size(), 3 * dts[i].second);
  }
}

TEST(DataSafetensors, EachMalformationIsAClearError) {
  struct Case {
    const char* what;
    std::vector<std::byte> img;
    const char* expect;  // a substring of the message
  };
  const std::string ok = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  std::vector<std::byte> huge_len = raw_image("{}", 0);
  huge_len[5] = std::byte{0x7f};  // header length ~ 2^47
  std::vector<std::byte> past_end = raw_image("{}", 0);
  past_end[0] = std::byte{200};
  std::vector<std::byte> short_file(5, std::byte{0});
  const std::vector<Case> cases = {
      {"empty file", {}, "0 bytes, too short"},
      {"5-byte file", short_file, "5 bytes, too short"},
      {"header length over the format limit", huge_len, "exceeds the format's limit"},
      {"header length past the end", past_end, "runs past the end of the file"},
      {"not JSON", raw_image("{\"a\":", 0), "not valid JSON"},
      {"invalid UTF-8 in JSON", raw_image("{\"\xff\":1}", 0), "not valid JSON"},
      {"JSON array", raw_image("[1,2]", 0), "expected a JSON object, got array"},
      {"entry not an object", raw_image(R"({"a":3})", 0), "tensor 'a': expected an object, got number"},
      {"missing dtype", raw_image(R"({"a":{"shape":[2],"data_offsets":[0,8]}})", 8), "expected a string field 'dtype'"},
      {"unknown dtype", raw_image(R"({"a":{"dtype":"F31","shape":[2],"data_offsets":[0,8]}})", 8), "got 'F31'"},
      {"lower-case dtype", raw_image(R"({"a":{"dtype":"f32","shape":[2],"data_offsets":[0,8]}})", 8), "got 'f32'"},
      {"missing shape", raw_image(R"({"a":{"dtype":"F32","data_offsets":[0,8]}})", 8),
       "expected an array field 'shape'"},
      {"negative dim", raw_image(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8),
       "non-negative integers"},
      {"fractional dim", raw_image(R"({"a":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", 8),
       "non-negative integers"},
      {"string dim", raw_image(R"({"a":{"dtype":"F32","shape":["2"],"data_offsets":[0,8]}})", 8),
       "non-negative integers"},
      {"dim over int64", raw_image(R"({"a":{"dtype":"F32","shape":[18446744073709551615],"data_offsets":[0,8]}})", 8),
       "non-negative integers"},
      {"shape product overflows",
       raw_image(R"({"a":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8), "too large"},
      {"shape x size != span", raw_image(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
       "span 8 bytes, but F32 [3] needs 12"},
      {"missing offsets", raw_image(R"({"a":{"dtype":"F32","shape":[2]}})", 8), "data_offsets' of 2 integers"},
      {"three offsets", raw_image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8,9]}})", 8), "of 2 integers"},
      {"negative offset", raw_image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[-8,0]}})", 8), "non-negative"},
      {"begin after end", raw_image(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", 8), "begin after end"},
      {"offsets past the data", raw_image("{" + ok + "}", 4), "run past the data section (4 bytes)"},
      {"overlap",
       raw_image(
           R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
           12),
       "overlap the previous tensor"},
      {"hole",
       raw_image(
           R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
           12),
       "leave a hole after byte 4"},
      {"trailing bytes", raw_image("{" + ok + "}", 12), "trailing bytes"},
      {"unknown field", raw_image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", 8),
       "unknown field 'x'"},
      {"metadata not an object", raw_image(R"({"__metadata__":[1]})", 0), "__metadata__: expected an object"},
      {"metadata value not a string", raw_image(R"({"__metadata__":{"k":1}})", 0), "__metadata__ entry 'k'"},
  };
  for (const auto& c : cases) {
    const std::string msg = error_of(c.img, "bad.safetensors");
    EXPECT_NE(msg.find(c.expect), std::string::npos) << c.what << ": got message '" << msg << "'";
    EXPECT_EQ(msg.rfind("safetensors file 'bad.safetensors': ", 0), 0u) << c.what << ": " << msg;
  }
  // Controls: the same shapes of header, well-formed, parse.
  EXPECT_EQ(error_of(raw_image("{" + ok + "}", 8)), "");
  EXPECT_EQ(error_of(raw_image(R"({"__metadata__":{"k":"v"}})", 0)), "");
  EXPECT_EQ(error_of(raw_image("{}", 0)), "");
}

TEST(DataSafetensors, FileErrorsNameThePath) {
  const std::string missing = temp_path("does_not_exist");
  try {
    SafetensorsFile::open(missing);
    FAIL() << "expected strata::Error";
  } catch (const strata::Error& e) {
    EXPECT_NE(std::string(e.what()).find("'" + missing + "': cannot open"), std::string::npos) << e.what();
  }
  const std::string dir = temp_dir();
  try {
    SafetensorsFile::open(dir);
    FAIL() << "expected strata::Error";
  } catch (const strata::Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a regular file"), std::string::npos) << e.what();
  }
  // A file truncated inside its data section.
  auto img = make_image(sample_entries());
  img.resize(img.size() - 3);
  const std::string path = temp_path("truncated");
  write_file(path, img);
  try {
    SafetensorsFile::open(path);
    FAIL() << "expected strata::Error";
  } catch (const strata::Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("truncated or corrupted"), std::string::npos) << e.what();
  }
  std::remove(path.c_str());
}

// Invariants of a file that parsed: shapes match byte counts, the tensors tile the data section,
// and every byte is readable (under ASan a span outside the image would be reported).
void check_parsed(const SafetensorsFile& f, const std::vector<std::byte>& img) {
  size_t total = 0;
  unsigned sum = 0;
  for (const auto& t : f.tensors()) {
    ASSERT_EQ(t.bytes.size(), size_t(t.numel()) * strata::data::st_dtype_size(t.dtype)) << t.name;
    total += t.bytes.size();
    for (std::byte b : t.bytes) sum += std::to_integer<unsigned>(b);
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | std::to_integer<uint64_t>(img[size_t(i)]);
  ASSERT_EQ(8 + header_len + total, img.size());
  volatile unsigned sink = sum;
  (void)sink;
}

TEST(DataSafetensors, FuzzedFilesParseOrThrowStrataError) {
  const std::vector<std::byte> valid = make_image(sample_entries(), R"({"format":"pt"})");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | std::to_integer<uint64_t>(valid[size_t(i)]);
  const size_t header_end = size_t(8 + header_len);

  std::mt19937_64 rng(20240531);
  const auto pick = [&](size_t lo, size_t hi) { return std::uniform_int_distribution<size_t>(lo, hi)(rng); };
  const char header_chars[] = "0123456789[]{},:\" -eE.FIU8_";
  int ok = 0, rejected = 0;
  const int kIterations = 10000;
  for (int it = 0; it < kIterations; ++it) {
    std::vector<std::byte> img = valid;
    const int kind = it % 7;
    const int edits = int(pick(1, 4));
    for (int e = 0; e < edits; ++e) {
      if (img.empty()) break;
      if (kind == 0) {  // random byte anywhere
        img[pick(0, img.size() - 1)] = std::byte(uint8_t(pick(0, 255)));
      } else if (kind == 1) {  // a JSON-ish character inside the header
        if (img.size() > 8)
          img[pick(8, std::min(img.size(), header_end) - 1)] =
              std::byte(header_chars[pick(0, sizeof(header_chars) - 2)]);
      } else if (kind == 2) {  // a bit of the length prefix
        img[pick(0, 7)] ^= std::byte(uint8_t(1u << pick(0, 7)));
      } else if (kind == 3) {  // truncation
        img.resize(pick(0, img.size() - 1));
      } else if (kind == 4) {  // insertion or deletion inside the header (shifts everything after)
        const size_t at = pick(8, std::min(img.size(), header_end));
        if (pick(0, 1) && at < img.size()) {
          img.erase(img.begin() + std::ptrdiff_t(at));
        } else {
          img.insert(img.begin() + std::ptrdiff_t(at), std::byte(header_chars[pick(0, sizeof(header_chars) - 2)]));
        }
      } else if (kind == 5) {  // one dtype name replaced by another (sizes change, or not)
        static const char* kNames[] = {"F32", "I64", "F16", "U8", "BF16", "F64", "I32", "U16", "BOOL", "X99"};
        std::string text(reinterpret_cast<const char*>(img.data()), img.size());
        const size_t at = text.find("\"dtype\":\"", pick(8, std::min(img.size(), header_end)) % text.size());
        if (at == std::string::npos) continue;
        const size_t begin = at + 9, end = text.find('"', begin);
        if (end == std::string::npos) continue;
        text.replace(begin, end - begin, kNames[pick(0, std::size(kNames) - 1)]);
        // Keep the length prefix consistent with the new header (modulo 2^64, as the file would be).
        uint64_t len = 0;
        for (int i = 7; i >= 0; --i) len = (len << 8) | std::to_integer<uint64_t>(img[size_t(i)]);
        len += uint64_t(text.size()) - uint64_t(img.size());
        img.assign(reinterpret_cast<const std::byte*>(text.data()),
                   reinterpret_cast<const std::byte*>(text.data()) + text.size());
        for (int i = 0; i < 8; ++i) img[size_t(i)] = std::byte(uint8_t(len >> (8 * i)));
      } else {  // a digit changed to another digit (offsets, shapes), keeping the JSON well-formed
        std::vector<size_t> digits;
        for (size_t i = 8; i < std::min(img.size(), header_end); ++i) {
          const char c = char(std::to_integer<uint8_t>(img[i]));
          if (c >= '0' && c <= '9') digits.push_back(i);
        }
        if (!digits.empty()) img[digits[pick(0, digits.size() - 1)]] = std::byte(uint8_t('0' + pick(0, 9)));
      }
    }
    try {
      const SafetensorsFile f = SafetensorsFile::from_bytes(img, "fuzz");
      check_parsed(f, img);
      ++ok;
    } catch (const strata::Error& e) {
      ASSERT_EQ(std::string(e.what()).rfind("safetensors file 'fuzz': ", 0), 0u) << e.what();
      ++rejected;
    } catch (const std::exception& e) {
      FAIL() << "iteration " << it << " (kind " << kind << "): not a strata::Error: " << e.what();
    }
  }
  // Both outcomes occur (some corruptions are harmless: data bytes, header padding, metadata text).
  EXPECT_GT(ok, 50);
  EXPECT_GT(rejected, kIterations / 2);
  std::printf("[ fuzz ] %d mutated images: %d parsed, %d rejected with strata::Error\n", kIterations, ok, rejected);

  // Every truncation of a real file on disk.
  const std::string path = temp_path("fuzz_truncated");
  for (size_t n = 0; n < valid.size(); n += 7) {
    write_file(path, std::vector<std::byte>(valid.begin(), valid.begin() + std::ptrdiff_t(n)));
    EXPECT_THROW(SafetensorsFile::open(path), strata::Error) << "truncated to " << n << " bytes";
  }
  std::remove(path.c_str());
}

TEST(DataSha256, FipsExamples) {
  using strata::data::sha256_hex;
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(sha256_hex(std::string(1000000, 'a')), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  // Incremental updates in awkward pieces give the one-shot digest (block boundaries 55, 56, 64).
  std::string msg;
  for (int i = 0; i < 1000; ++i) msg += char('a' + i % 26);
  for (size_t piece : {1u, 3u, 55u, 56u, 63u, 64u, 65u, 200u}) {
    strata::data::Sha256 h;
    for (size_t i = 0; i < msg.size(); i += piece) h.update(msg.data() + i, std::min(piece, msg.size() - i));
    EXPECT_EQ(strata::data::to_hex(h.digest()), sha256_hex(msg)) << "piece " << piece;
  }
  const std::string path = temp_path("sha");
  {
    std::ofstream out(path, std::ios::binary);
    out << "abc";
  }
  EXPECT_EQ(strata::data::sha256_file_hex(path), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  std::remove(path.c_str());
  EXPECT_THROW(strata::data::sha256_file_hex(path), strata::Error);
}

TEST(DataMiniLm, FindHonoursStrataMiniLmDir) {
  const char* old = std::getenv("STRATA_MINILM_DIR");
  const std::string saved = old ? old : "";
  const std::string dir = temp_dir() + "/strata_minilm_" + std::to_string(::getpid());
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0) << dir;
  ::setenv("STRATA_MINILM_DIR", dir.c_str(), 1);
  std::string why;
  EXPECT_EQ(strata::data::find_minilm_dir(&why), "");
  EXPECT_NE(why.find("lacks " + dir + "/model.safetensors"), std::string::npos) << why;
  EXPECT_NE(why.find("scripts/setup_encoder.sh"), std::string::npos) << why;
  const char* files[] = {"model.safetensors", "vocab.txt", "config.json"};
  for (const char* f : files) std::ofstream(dir + "/" + f) << "x";
  EXPECT_EQ(strata::data::find_minilm_dir(&why), dir);
  for (const char* f : files) std::remove((dir + "/" + f).c_str());
  ::rmdir(dir.c_str());
  if (old) {
    ::setenv("STRATA_MINILM_DIR", saved.c_str(), 1);
  } else {
    ::unsetenv("STRATA_MINILM_DIR");
  }
}

TEST(DataSafetensors, MiniLmCheckpoint) {
  std::string why;
  const std::string dir = strata::data::find_minilm_dir(&why);
  if (dir.empty()) GTEST_SKIP() << "all-MiniLM-L6-v2 not installed: " << why;
  const std::string path = dir + "/model.safetensors";
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0) << path;
  EXPECT_EQ(int64_t(st.st_size), int64_t(strata::data::kMiniLmSafetensorsBytes));
  EXPECT_EQ(strata::data::sha256_file_hex(path), strata::data::kMiniLmSafetensorsSha256);
  const SafetensorsFile f = SafetensorsFile::open(path);
  EXPECT_EQ(f.size(), 104u);  // 5 embedding tensors + position_ids + 6 layers x 16 + 2 pooler
  EXPECT_EQ(f.metadata().at("format"), "pt");
  const auto& w = f.tensor("embeddings.word_embeddings.weight");
  EXPECT_EQ(w.dtype, StDType::F32);
  EXPECT_EQ(w.shape, (std::vector<int64_t>{30522, 384}));
  EXPECT_EQ(f.tensor("encoder.layer.5.intermediate.dense.weight").shape, (std::vector<int64_t>{1536, 384}));
  EXPECT_EQ(f.tensor("embeddings.position_ids").dtype, StDType::I64);
}

}  // namespace
