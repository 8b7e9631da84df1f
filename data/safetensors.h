// data/safetensors.h: a validating, read-only reader of the safetensors format (torch-free).
//
// Format (huggingface/safetensors): 8-byte little-endian u64 N, then N bytes of UTF-8 JSON
// { "<name>": {"dtype": "F32", "shape": [d0, d1, ...], "data_offsets": [begin, end]}, ...,
//   "__metadata__": {"<key>": "<string>", ...} (optional) }, then the data section; offsets are
// byte offsets into the data section. Validated like the reference implementation: the header
// fits in the file, is a JSON object of well-formed entries, dtypes are known, product(shape) x
// dtype size == end - begin, and the tensors tile the data section exactly (sorted by offset,
// no overlap, no hole, nothing after the last one). Any violation is a strata::Error that names
// the file and what is wrong; no input makes the reader crash.
//
// The file is memory-mapped; tensor bytes are views into the mapping (alive as long as the
// SafetensorsFile) and carry no alignment guarantee: copy them (memcpy) before typed use.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace strata::data {

enum class StDType : uint8_t { BOOL, U8, I8, F8_E5M2, F8_E4M3, I16, U16, F16, BF16, I32, U32, F32, F64, I64, U64 };

// "F32", "BF16", ... as written in the header.
const char* st_dtype_name(StDType t);
// Element size in bytes.
size_t st_dtype_size(StDType t);

struct SafetensorsTensor {
  std::string name;
  StDType dtype = StDType::F32;
  std::vector<int64_t> shape;
  std::span<const std::byte> bytes;  // end - begin bytes of the data section, unaligned

  int64_t numel() const;
  std::string shape_str() const;  // "[30522, 384]"
};

class SafetensorsFile {
 public:
  // Memory-maps and validates `path`. Throws strata::Error naming the file on any problem.
  static SafetensorsFile open(const std::string& path);
  // Validates an in-memory image (takes ownership); `name` stands for the file in errors.
  static SafetensorsFile from_bytes(std::vector<std::byte> bytes, const std::string& name);

  const std::string& path() const { return path_; }
  // Tensor names in data order (ascending offsets).
  std::vector<std::string> names() const;
  size_t size() const { return tensors_.size(); }
  bool contains(const std::string& name) const;
  // Throws strata::Error naming the file and the tensor when absent.
  const SafetensorsTensor& tensor(const std::string& name) const;
  // All tensors in data order.
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  // The optional "__metadata__" string map.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  SafetensorsFile(SafetensorsFile&&) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept;
  ~SafetensorsFile();

 private:
  struct Storage;  // the mapping or the owned bytes
  SafetensorsFile() = default;
  void parse();

  std::string path_;
  std::unique_ptr<Storage> storage_;
  std::vector<SafetensorsTensor> tensors_;  // data order
  std::map<std::string, size_t> index_;     // name -> position in tensors_
  std::map<std::string, std::string> metadata_;
};

// The bytes of a safetensors file holding `tensors` (in that order; names unique, numel x dtype
// size == bytes.size()) and `metadata` (the "__metadata__" string map; omitted when empty). The
// header is padded with spaces to a multiple of 8 bytes, so tensor data starts 8-byte aligned.
// SafetensorsFile::from_bytes(safetensors_bytes(t, m)) reads them back exactly. Throws
// strata::Error naming the tensor for a repeated name or a size mismatch.
std::vector<std::byte> safetensors_bytes(const std::vector<SafetensorsTensor>& tensors,
                                         const std::map<std::string, std::string>& metadata = {});

}  // namespace strata::data
