// models/checkpoint.h: training checkpoints that survive a kill at any moment.
//
// A run folder holds checkpoints/step-<8 digits>.safetensors (the tensors: model parameters and
// buffers, optimizer state, RNG state) and checkpoints/step-<8 digits>.json (the metadata: format,
// step, the safetensors file's name, byte size and sha256, and whatever the trainer adds: config,
// data position, commit), then checkpoints/latest.json (a copy of the newest metadata). Each is
// written atomically (data/files.h: temp file, fsync, rename, fsync of the folder) in that order,
// so a kill leaves either the previous complete checkpoint or the new one as latest; older
// checkpoints beyond `keep` are removed only after the new latest is on disk.
// Loading checks the metadata, the byte size and the sha256 before parsing the tensors: a torn,
// truncated or altered checkpoint is a strata::Error naming the file and what is wrong, never a
// crash and never a silent fresh start.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace strata::models {

struct Checkpoint {
  int64_t step = 0;
  nlohmann::json meta;                         // the metadata JSON (as written)
  std::map<std::string, at::Tensor> tensors;   // name -> CPU tensor (a copy, owning its memory)
  std::string path;                            // the metadata file it came from
};

// Writes the checkpoint of `step` into run_dir/checkpoints (see the file comment). `tensors`:
// CPU tensors of float32 / float64 / bfloat16 / int64 / uint8 (made contiguous here); `meta`: an
// object merged into the metadata. Removes all but the newest `keep` checkpoints afterwards.
// Returns the metadata file's path.
std::string save_checkpoint(const std::string& run_dir, int64_t step,
                            const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                            const nlohmann::json& meta, int64_t keep = 2);

// Loads `path`: a run folder (its checkpoints/latest.json), a checkpoints folder, or a step-*.json
// metadata file. Throws strata::Error naming the file for anything missing, torn or altered.
Checkpoint load_checkpoint(const std::string& path);

// True when the run folder has a latest checkpoint (checkpoints/latest.json exists).
bool has_checkpoint(const std::string& run_dir);

}  // namespace strata::models
