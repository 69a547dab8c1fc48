// Safetensors checkpoints: a validated, zero-copy (mmap) reader for one file or a sharded folder
// (model.safetensors.index.json), and a streaming writer. Model files are untrusted input: every
// check the reference implementation (huggingface/safetensors) makes is made here, and errors name
// the file, the tensor and what was expected.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tensor/dtype.h"
#include "util/mmap.h"
#include "util/status.h"

namespace sy::model {

struct TensorInfo {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  const uint8_t* data;  // into the mmap
  size_t nbytes;
  std::string file;  // path of the file that holds it
  int64_t numel() const;
};

// One validated file; move-only, keeps its mmap alive.
class SafetensorsFile {
 public:
  static Result<SafetensorsFile> open(const std::string& path);
  // Validates `data` without taking ownership (it must outlive the result); for fuzzing and tests.
  static Result<SafetensorsFile> parse(const uint8_t* data, size_t size,
                                       const std::string& name_for_errors);

  SafetensorsFile(SafetensorsFile&&) noexcept = default;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept = default;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::vector<TensorInfo>& tensors() const { return tensors_; }  // sorted by name
  const TensorInfo* find(std::string_view name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return path_; }
  size_t header_bytes() const { return header_bytes_; }  // 8 + N

 private:
  SafetensorsFile() = default;
  std::unique_ptr<MappedFile> map_;  // null when parsed from caller-owned bytes
  std::string path_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
  size_t header_bytes_ = 0;
};

// A model folder: model.safetensors, or shards listed by model.safetensors.index.json.
// Only BF16, F16, F32, U8 (MXFP4 blocks and scales) and F8_E4M3 (FP8 block-quantised weights)
// tensors are accepted for now; the architecture adapter checks each tensor's dtype
// (WeightSource::get / packed).
class Checkpoint {
 public:
  static Result<Checkpoint> open(const std::string& model_dir);

  Checkpoint(Checkpoint&&) noexcept = default;
  Checkpoint& operator=(Checkpoint&&) noexcept = default;

  const TensorInfo* find(std::string_view name) const;
  const std::vector<TensorInfo>& tensors() const { return tensors_; }  // all shards, sorted by name
  uint64_t total_bytes() const;  // sum of tensor bytes
  std::vector<std::string> files() const;  // paths, in shard order

 private:
  Checkpoint() = default;
  std::vector<SafetensorsFile> files_;
  std::vector<TensorInfo> tensors_;
};

// Writer used by `make-model` (models of several GB: never hold all data in memory).
struct TensorSpec {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
};
using TensorFiller = std::function<void(const TensorSpec&, uint8_t* out, size_t nbytes)>;

// Writes model_dir/model.safetensors (shard_bytes == 0) or shards
// model-0000i-of-0000n.safetensors of at most ~shard_bytes each (a tensor larger than that gets a
// shard of its own) plus model.safetensors.index.json (with metadata.total_size), filling each
// tensor's bytes by calling fill. Creates model_dir if needed.
Status write_checkpoint(const std::string& model_dir, const std::vector<TensorSpec>& tensors,
                        const TensorFiller& fill, uint64_t shard_bytes = 0,
                        const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

}  // namespace sy::model
