// models/checkpoint.cpp: checkpoint files (checkpoint.h).
#include "models/checkpoint.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "data/files.h"
#include "models/checkpoint_meta.h"
#include "data/safetensors.h"
#include "data/sha256.h"
#include "strata/error.h"

namespace strata::models {
namespace {

struct DTypePair {
  at::ScalarType torch;
  data::StDType st;
};
constexpr DTypePair kDTypes[] = {
    {at::kFloat, data::StDType::F32}, {at::kDouble, data::StDType::F64}, {at::kBFloat16, data::StDType::BF16},
    {at::kLong, data::StDType::I64},  {at::kInt, data::StDType::I32},    {at::kByte, data::StDType::U8},
    {at::kBool, data::StDType::BOOL},
};

data::StDType st_dtype_of(at::ScalarType t, const std::string& name) {
  for (const auto& d : kDTypes)
    if (d.torch == t) return d.st;
  throw Error("save_checkpoint: tensor '" + name + "': dtype " + std::string(c10::toString(t)) +
              " cannot be stored (expected float32, float64, bfloat16, int64, int32, uint8 or bool)");
}

at::ScalarType torch_dtype_of(data::StDType t, const std::string& file, const std::string& name) {
  for (const auto& d : kDTypes)
    if (d.st == t) return d.torch;
  throw Error("checkpoint '" + file + "': tensor '" + name + "': unsupported dtype " + data::st_dtype_name(t));
}

std::string step_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08lld", static_cast<long long>(step));
  return buf;
}

std::string folder_of(const std::string& file) {
  const auto slash = file.rfind('/');
  return slash == std::string::npos ? "." : file.substr(0, slash);
}

// Steps of the complete checkpoints in `dir` (those with a step-*.json), ascending.
std::vector<int64_t> listed_steps(const std::string& dir) {
  std::vector<int64_t> steps;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return steps;
  while (const dirent* e = ::readdir(d)) {
    long long s = 0;
    char tail[16] = {};
    if (std::sscanf(e->d_name, "step-%lld.%15s", &s, tail) == 2 && std::string(tail) == "json") steps.push_back(s);
  }
  ::closedir(d);
  std::sort(steps.begin(), steps.end());
  return steps;
}

}  // namespace

bool has_checkpoint(const std::string& run_dir) {
  struct stat st {};
  return ::stat((run_dir + "/checkpoints/latest.json").c_str(), &st) == 0;
}

std::string save_checkpoint(const std::string& run_dir, int64_t step,
                            const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                            const nlohmann::json& meta, int64_t keep) {
  STRATA_CHECK_ARG(step >= 0, "save_checkpoint", "step", ">= 0", step);
  STRATA_CHECK_ARG(keep >= 1, "save_checkpoint", "keep", ">= 1", keep);
  STRATA_CHECK_ARG(meta.is_object() || meta.is_null(), "save_checkpoint", "meta", "a JSON object", meta.type_name());
  std::vector<at::Tensor> owned;  // contiguous CPU copies kept alive while the bytes are gathered
  std::vector<data::SafetensorsTensor> st;
  for (const auto& [name, t0] : tensors) {
    STRATA_CHECK(t0.defined(), "save_checkpoint: tensor '", name, "' is undefined");
    const at::Tensor t = t0.detach().to(at::kCPU).contiguous();
    owned.push_back(t);
    data::SafetensorsTensor s;
    s.name = name;
    s.dtype = st_dtype_of(t.scalar_type(), name);
    s.shape.assign(t.sizes().begin(), t.sizes().end());
    s.bytes = {static_cast<const std::byte*>(t.data_ptr()), size_t(t.nbytes())};
    st.push_back(std::move(s));
  }
  const std::vector<std::byte> bytes =
      data::safetensors_bytes(st, {{"format", kCheckpointFormat}, {"step", std::to_string(step)}});
  const std::string dir = run_dir + "/checkpoints";
  const std::string base = step_name(step);
  data::write_file_atomic(dir + "/" + base + ".safetensors", bytes, "save_checkpoint");

  nlohmann::json m = meta.is_null() ? nlohmann::json::object() : meta;
  m["format"] = kCheckpointFormat;
  m["step"] = step;
  m["safetensors"] = base + ".safetensors";
  m["bytes"] = bytes.size();
  m["sha256"] = data::sha256_hex(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
  const std::string text = m.dump(2) + "\n";
  const std::string meta_path = dir + "/" + base + ".json";
  data::write_file_atomic(meta_path, text, "save_checkpoint");
  data::write_file_atomic(dir + "/latest.json", text, "save_checkpoint");

  const auto steps = listed_steps(dir);
  for (size_t i = 0; i + size_t(keep) < steps.size(); ++i) {
    if (steps[i] == step) continue;
    const std::string old = dir + "/" + step_name(steps[i]);
    std::remove((old + ".json").c_str());  // the metadata first: a listed checkpoint is always complete
    std::remove((old + ".safetensors").c_str());
  }
  return meta_path;
}

Checkpoint load_checkpoint(const std::string& path) {
  struct stat info {};
  STRATA_CHECK(::stat(path.c_str(), &info) == 0, "checkpoint '", path,
               "': no such file or folder (expected a run folder or a checkpoint's .json)");
  std::string meta_path = path;
  if (data::is_folder(path)) {
    // A run folder (its checkpoints/ inside) or its checkpoints folder itself (latest.json inside).
    const std::string in_run = path + "/checkpoints/latest.json", here = path + "/latest.json";
    meta_path = ::stat(here.c_str(), &info) == 0 && !data::is_folder(path + "/checkpoints") ? here : in_run;
    STRATA_CHECK(::stat(meta_path.c_str(), &info) == 0, "checkpoint '", path, "': no checkpoint in this folder (expected ",
                 in_run, ", or ", here, " in a checkpoints folder)");
  }
  Checkpoint c;
  c.path = meta_path;
  CheckpointMeta m = parse_checkpoint_meta(data::read_file(meta_path, "load_checkpoint"), meta_path);
  c.meta = std::move(m.json);
  c.step = m.step;
  const std::string file = folder_of(meta_path) + "/" + m.safetensors;
  const uint64_t size = m.bytes;
  const std::string& sha = m.sha256;

  // Size and sha256 first (streamed), then the tensors from a mapping: the file is never held twice
  // in memory (a checkpoint with AdamW state is 3x the model).
  struct stat file_info {};
  STRATA_CHECK(::stat(file.c_str(), &file_info) == 0, "load_checkpoint: cannot read '", file, "': ",
               std::strerror(errno));
  STRATA_CHECK(uint64_t(file_info.st_size) == size, "checkpoint '", file, "': ", file_info.st_size,
               " bytes where its metadata says ", size, " (truncated or altered; an earlier checkpoint may remain in ",
               folder_of(meta_path), ")");
  const std::string got = data::sha256_file_hex(file);
  STRATA_CHECK(got == sha, "checkpoint '", file, "': sha256 ", got, " where its metadata says ", sha,
               " (corrupt or altered)");
  const auto st = data::SafetensorsFile::open(file);
  const auto it = st.metadata().find("step");
  STRATA_CHECK(it != st.metadata().end() && it->second == std::to_string(c.step), "checkpoint '", file,
               "': its step does not match the metadata's ", c.step);
  for (const auto& t : st.tensors()) {
    at::Tensor x = at::empty(t.shape, at::TensorOptions().dtype(torch_dtype_of(t.dtype, file, t.name)));
    if (!t.bytes.empty()) std::memcpy(x.data_ptr(), t.bytes.data(), t.bytes.size());
    c.tensors.emplace(t.name, std::move(x));
  }
  return c;
}

}  // namespace strata::models
