// Model: a loaded checkpoint as one shared decoder description — config (with the per-layer
// description) plus weights as backend tensors. The architecture's adapter
// (model/architecture.h) fills both.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/config.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "moe/experts_kernel.h"

namespace sy::model {

// Called while loading: (tensors done, tensors total, bytes done, bytes total).
using LoadProgress = std::function<void(size_t, size_t, uint64_t, uint64_t)>;

class Model {
 public:
  ~Model();
  static Result<std::unique_ptr<Model>> load(const std::string& model_dir, backend::Backend& backend,
                                             const LoadProgress& progress = {});
  // Seeded random weights of config.json's shapes, built on the backend (no checkpoint files:
  // full-size models need not fit on disk). Router rows are scaled so routing is decisive.
  static Result<std::unique_ptr<Model>> random(const std::string& config_json_path,
                                               backend::Backend& backend, uint64_t seed);
  // A model of given parts (a tensor-parallel shard, dist/shard_model.h): `owned` are backend
  // buffers freed with the model; other weight tensors must outlive it.
  static std::unique_ptr<Model> from_parts(ModelConfig config, DecoderWeights weights, std::vector<Tensor> owned,
                                           backend::Backend& backend, std::string model_dir);
  const ModelConfig& config() const { return config_; }
  const DecoderWeights& weights() const { return weights_; }
  const std::string& model_dir() const { return model_dir_; }
  int64_t parameter_count() const;
  // Same architecture and every tensor the same shape (required by weight updates).
  Status check_same_shapes(const Model& other) const;
  // A weight update without a second copy: checks that model_dir's checkpoint has this model's
  // configuration and tensors, then copies every tensor into the buffer it was loaded into.
  // kUnsupported where the backend cannot (the CPU: load a new Model and swap instead). A
  // failure after the first copy leaves a mix of old and new weights and says so.
  Status reload_in_place(const std::string& model_dir);

 private:
  Model() = default;
  std::string model_dir_;
  ModelConfig config_;
  std::unique_ptr<Checkpoint> checkpoint_;
  DecoderWeights weights_;
  backend::Backend* backend_ = nullptr;
  std::vector<Tensor> owned_;  // tensors the backend converted (freed with the model)
  std::vector<Tensor> load_order_;  // every loaded tensor in load order (reload_in_place)
};

}  // namespace sy::model
