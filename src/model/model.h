// Model: a loaded checkpoint as one shared decoder description — config plus weights as
// backend tensors. One adapter per architecture fills it (model/qwen3_moe.cpp).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/config.h"
#include "model/safetensors.h"
#include "moe/experts_kernel.h"

namespace sy::model {

struct AttentionWeights {
  Tensor q_proj, k_proj, v_proj, o_proj;  // [out, in]
  Tensor q_bias, k_bias, v_bias, o_bias;  // undefined unless attention_bias
  Tensor q_norm, k_norm;                  // [head_dim], undefined unless qk_norm
};

struct DenseMlpWeights {
  Tensor gate_proj, up_proj, down_proj;
};

struct LayerWeights {
  Tensor input_norm, post_attention_norm;
  AttentionWeights attention;
  bool is_moe = false;
  DenseMlpWeights mlp;       // dense layers
  moe::MoeLayerWeights moe;  // MoE layers
};

struct DecoderWeights {
  Tensor embed_tokens;  // [vocab, hidden]
  std::vector<LayerWeights> layers;
  Tensor final_norm;
  Tensor lm_head;  // [vocab, hidden]; the embedding table when tied
};

// How load_qwen3_moe places tensors: `order` (if set) collects every tensor it returns, in call
// order; with `into` (such a list from an earlier load) it copies each tensor into its
// counterpart instead of allocating, or with check_only only checks that they correspond.
struct WeightPlacement {
  std::vector<Tensor>* order = nullptr;
  std::vector<Tensor>* into = nullptr;
  bool check_only = false;
};

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
  friend Result<DecoderWeights> load_qwen3_moe(const ModelConfig&, const Checkpoint&, backend::Backend&,
                                               std::vector<Tensor>&, const WeightPlacement&);
  std::string model_dir_;
  ModelConfig config_;
  std::unique_ptr<Checkpoint> checkpoint_;
  DecoderWeights weights_;
  backend::Backend* backend_ = nullptr;
  std::vector<Tensor> owned_;  // tensors the backend converted (freed with the model)
  std::vector<Tensor> load_order_;  // every loaded tensor in load order (reload_in_place)
};

// The qwen3_moe adapter: maps tensor names onto DecoderWeights, checking every shape.
Result<DecoderWeights> load_qwen3_moe(const ModelConfig& config, const Checkpoint& checkpoint,
                                      backend::Backend& backend, std::vector<Tensor>& owned,
                                      const WeightPlacement& place = {});

}  // namespace sy::model
