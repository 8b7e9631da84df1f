// data/safetensors.cpp: see safetensors.h. Validation follows the reference reader
// (huggingface/safetensors, safetensors/src/tensor.rs: Metadata::validate).
#include "data/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <utility>

#include "strata/error.h"

namespace strata::data {

namespace {

// The reference reader refuses headers above 100 MB (a guard against absurd allocations).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct DTypeInfo {
  StDType dtype;
  const char* name;
  size_t size;
};
constexpr DTypeInfo kDTypes[] = {
    {StDType::BOOL, "BOOL", 1},       {StDType::U8, "U8", 1},           {StDType::I8, "I8", 1},
    {StDType::F8_E5M2, "F8_E5M2", 1}, {StDType::F8_E4M3, "F8_E4M3", 1}, {StDType::I16, "I16", 2},
    {StDType::U16, "U16", 2},         {StDType::F16, "F16", 2},         {StDType::BF16, "BF16", 2},
    {StDType::I32, "I32", 4},         {StDType::U32, "U32", 4},         {StDType::F32, "F32", 4},
    {StDType::F64, "F64", 8},         {StDType::I64, "I64", 8},         {StDType::U64, "U64", 8},
};

std::string known_dtypes() {
  std::string s;
  for (const auto& d : kDTypes) s += (s.empty() ? "" : ", ") + std::string(d.name);
  return s;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// A JSON value as a non-negative integer that fits in int64, or false.
bool as_index(const nlohmann::json& j, uint64_t& out) {
  if (j.is_number_unsigned()) {
    out = j.get<uint64_t>();
  } else if (j.is_number_integer()) {
    const int64_t v = j.get<int64_t>();
    if (v < 0) return false;
    out = uint64_t(v);
  } else {
    return false;
  }
  return out <= uint64_t(std::numeric_limits<int64_t>::max());
}

}  // namespace

const char* st_dtype_name(StDType t) {
  for (const auto& d : kDTypes)
    if (d.dtype == t) return d.name;
  return "?";
}

size_t st_dtype_size(StDType t) {
  for (const auto& d : kDTypes)
    if (d.dtype == t) return d.size;
  return 0;
}

int64_t SafetensorsTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // validated at parse time not to overflow
  return n;
}

std::string SafetensorsTensor::shape_str() const { return shape_string(shape); }

// Either a read-only private mapping of a file or an owned byte vector.
struct SafetensorsFile::Storage {
  void* map = nullptr;
  size_t map_len = 0;
  std::vector<std::byte> owned;

  const std::byte* data() const { return map ? static_cast<const std::byte*>(map) : owned.data(); }
  size_t size() const { return map ? map_len : owned.size(); }
  ~Storage() {
    if (map) munmap(map, map_len);
  }
};

SafetensorsFile::SafetensorsFile(SafetensorsFile&&) noexcept = default;
SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&&) noexcept = default;
SafetensorsFile::~SafetensorsFile() = default;

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  const auto fail = [&](const std::string& what) -> Error { return Error("safetensors file '" + path + "': " + what); };
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw fail(std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    throw fail(std::string("cannot stat: ") + std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw fail("not a regular file");
  }
  SafetensorsFile f;
  f.path_ = path;
  f.storage_ = std::make_unique<Storage>();
  if (st.st_size > 0) {  // mmap refuses length 0; an empty file fails in parse() with a clear message
    void* p = mmap(nullptr, size_t(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int e = errno;
      ::close(fd);
      throw fail(std::string("cannot memory-map ") + std::to_string(st.st_size) + " bytes: " + std::strerror(e));
    }
    f.storage_->map = p;
    f.storage_->map_len = size_t(st.st_size);
  }
  ::close(fd);  // the mapping stays valid
  f.parse();
  return f;
}

SafetensorsFile SafetensorsFile::from_bytes(std::vector<std::byte> bytes, const std::string& name) {
  SafetensorsFile f;
  f.path_ = name;
  f.storage_ = std::make_unique<Storage>();
  f.storage_->owned = std::move(bytes);
  f.parse();
  return f;
}

void SafetensorsFile::parse() {
  const std::byte* base = storage_->data();
  const uint64_t file_size = storage_->size();
  const auto fail = [&](const std::string& what) -> Error {
    return Error("safetensors file '" + path_ + "': " + what);
  };

  if (file_size < 8)
    throw fail("file is " + std::to_string(file_size) + " bytes, too short for the 8-byte header length");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | uint64_t(std::to_integer<uint8_t>(base[i]));
  if (header_len > kMaxHeaderBytes)
    throw fail("header length " + std::to_string(header_len) + " exceeds the format's limit of " +
               std::to_string(kMaxHeaderBytes) + " bytes (not a safetensors file, or corrupted)");
  if (header_len > file_size - 8)
    throw fail("header length " + std::to_string(header_len) + " runs past the end of the file (" +
               std::to_string(file_size) + " bytes): truncated or corrupted");

  const char* hdr = reinterpret_cast<const char*>(base + 8);
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(hdr, hdr + header_len);
  } catch (const nlohmann::json::exception& e) {
    throw fail(std::string("header is not valid JSON: ") + e.what());
  }
  if (!header.is_object()) throw fail(std::string("header: expected a JSON object, got ") + header.type_name());

  const uint64_t data_begin = 8 + header_len;
  const uint64_t data_size = file_size - data_begin;
  struct Span {
    uint64_t begin, end;
    size_t index;
  };
  std::vector<Span> spans;
  tensors_.clear();
  index_.clear();
  metadata_.clear();

  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) throw fail(std::string("__metadata__: expected an object, got ") + entry.type_name());
      for (const auto& [k, v] : entry.items()) {
        if (!v.is_string()) throw fail("__metadata__ entry '" + k + "': expected a string, got " + v.type_name());
        metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    const std::string& tensor = name;  // clang < 16 cannot capture a structured binding
    const auto bad = [&](const std::string& what) { return fail("tensor '" + tensor + "': " + what); };
    if (!entry.is_object()) throw bad(std::string("expected an object, got ") + entry.type_name());
    for (const auto& [k, v] : entry.items())
      if (k != "dtype" && k != "shape" && k != "data_offsets") throw bad("unknown field '" + k + "'");

    SafetensorsTensor t;
    t.name = name;
    const auto dt = entry.find("dtype");
    if (dt == entry.end() || !dt->is_string()) throw bad("expected a string field 'dtype'");
    const std::string dname = dt->get<std::string>();
    const auto known =
        std::find_if(std::begin(kDTypes), std::end(kDTypes), [&](const DTypeInfo& d) { return dname == d.name; });
    if (known == std::end(kDTypes)) throw bad("dtype: expected one of " + known_dtypes() + ", got '" + dname + "'");
    t.dtype = known->dtype;

    const auto sh = entry.find("shape");
    if (sh == entry.end() || !sh->is_array()) throw bad("expected an array field 'shape'");
    uint64_t numel = 1;
    bool overflow = false;
    for (const auto& d : *sh) {
      uint64_t dim = 0;
      if (!as_index(d, dim)) throw bad("shape: expected non-negative integers, got " + sh->dump());
      t.shape.push_back(int64_t(dim));
      if (dim != 0 && numel > uint64_t(std::numeric_limits<int64_t>::max()) / dim) overflow = true;
      numel *= dim;
    }
    // A zero dim makes the product 0 whatever the other dims are.
    if (std::find(t.shape.begin(), t.shape.end(), 0) != t.shape.end()) overflow = false;
    if (overflow || numel > uint64_t(std::numeric_limits<int64_t>::max()) / known->size)
      throw bad("shape " + sh->dump() + " is too large");

    const auto off = entry.find("data_offsets");
    if (off == entry.end() || !off->is_array() || off->size() != 2)
      throw bad("expected a field 'data_offsets' of 2 integers");
    uint64_t b = 0, e = 0;
    if (!as_index((*off)[0], b) || !as_index((*off)[1], e))
      throw bad("data_offsets: expected non-negative integers, got " + off->dump());
    if (b > e) throw bad("data_offsets " + off->dump() + ": begin after end");
    if (e > data_size)
      throw bad("data_offsets " + off->dump() + " run past the data section (" + std::to_string(data_size) +
                " bytes): truncated or corrupted");
    const uint64_t want = numel * known->size;
    if (e - b != want)
      throw bad("data_offsets " + off->dump() + " span " + std::to_string(e - b) + " bytes, but " + dname + " " +
                shape_string(t.shape) + " needs " + std::to_string(want));
    t.bytes = std::span<const std::byte>(base + data_begin + b, size_t(e - b));
    spans.push_back({b, e, tensors_.size()});
    tensors_.push_back(std::move(t));
  }

  // The tensors must tile [0, data_size): sorted, no overlap, no hole, no trailing bytes.
  std::stable_sort(spans.begin(), spans.end(),
                   [](const Span& x, const Span& y) { return x.begin != y.begin ? x.begin < y.begin : x.end < y.end; });
  uint64_t pos = 0;
  for (const Span& s : spans) {
    const std::string& name = tensors_[s.index].name;
    if (s.begin < pos)
      throw fail("tensor '" + name + "': data_offsets [" + std::to_string(s.begin) + ", " + std::to_string(s.end) +
                 "] overlap the previous tensor (ends at " + std::to_string(pos) + ")");
    if (s.begin > pos)
      throw fail("tensor '" + name + "': data_offsets [" + std::to_string(s.begin) + ", " + std::to_string(s.end) +
                 "] leave a hole after byte " + std::to_string(pos) + " of the data section");
    pos = s.end;
  }
  if (pos != data_size)
    throw fail("data section is " + std::to_string(data_size) + " bytes but the tensors cover " + std::to_string(pos) +
               " (trailing bytes: corrupted)");

  std::vector<SafetensorsTensor> ordered;
  ordered.reserve(spans.size());
  for (const Span& s : spans) ordered.push_back(std::move(tensors_[s.index]));
  tensors_ = std::move(ordered);
  for (size_t i = 0; i < tensors_.size(); ++i) index_[tensors_[i].name] = i;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const auto& t : tensors_) out.push_back(t.name);
  return out;
}

bool SafetensorsFile::contains(const std::string& name) const { return index_.count(name) != 0; }

const SafetensorsTensor& SafetensorsFile::tensor(const std::string& name) const {
  const auto it = index_.find(name);
  if (it == index_.end())
    throw Error("safetensors file '" + path_ + "': no tensor named '" + name + "' (it holds " +
                std::to_string(tensors_.size()) + " tensors)");
  return tensors_[it->second];
}

}  // namespace strata::data

namespace strata::data {

std::vector<std::byte> safetensors_bytes(const std::vector<SafetensorsTensor>& tensors,
                                         const std::map<std::string, std::string>& metadata) {
  // nlohmann::ordered_json keeps the tensors in data order (readers sort by offset anyway).
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    STRATA_CHECK(!t.name.empty() && t.name != "__metadata__", "safetensors_bytes: tensor name '", t.name,
                 "': expected a non-empty name other than __metadata__");
    STRATA_CHECK(!header.contains(t.name), "safetensors_bytes: tensor '", t.name, "': name repeated");
    const uint64_t expect = uint64_t(t.numel()) * st_dtype_size(t.dtype);
    STRATA_CHECK(expect == t.bytes.size(), "safetensors_bytes: tensor '", t.name, "': expected ", expect,
                 " bytes (", t.shape_str(), " x ", st_dtype_name(t.dtype), "), got ", t.bytes.size());
    header[t.name] = {{"dtype", st_dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + expect}}};
    offset += expect;
  }
  std::string h = header.dump();
  h.resize((h.size() + 7) / 8 * 8, ' ');  // data 8-byte aligned (the format allows trailing spaces)
  std::vector<std::byte> out(8 + h.size() + offset);
  const uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) out[size_t(i)] = std::byte((n >> (8 * i)) & 0xff);
  std::memcpy(out.data() + 8, h.data(), h.size());
  size_t at = 8 + h.size();
  for (const auto& t : tensors) {
    if (!t.bytes.empty()) std::memcpy(out.data() + at, t.bytes.data(), t.bytes.size());
    at += t.bytes.size();
  }
  return out;
}

}  // namespace strata::data
