// A model's weights as backend tensors (DecoderWeights, filled by an architecture adapter), and
// WeightSource: where the adapter's declared tensors come from — a checkpoint (shapes checked
// against it, or copied into an already loaded model), seeded random numbers made on the
// backend, or nowhere (a list of names and shapes, for writing random checkpoints).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/config.h"
#include "model/safetensors.h"
#include "moe/experts_kernel.h"

namespace sy::model {

struct AttentionWeights {
  Tensor q_proj, k_proj, v_proj, o_proj;  // [out, in]
  Tensor q_bias, k_bias, v_bias, o_bias;  // undefined unless the layer has them
  Tensor q_norm, k_norm;  // [head_dim] or [heads * head_dim]; undefined unless qk_norm
  Tensor sinks;           // [heads]; undefined unless the layer has attention sinks
  // Multi-head latent attention (q_proj is q_b_proj when q_a_proj is defined).
  Tensor q_a_proj, q_a_norm;  // [q_lora_rank, hidden], [q_lora_rank]; undefined without q_lora
  Tensor kv_a_proj;           // [kv_lora_rank + qk_rope_head_dim, hidden]
  Tensor kv_a_norm;           // [kv_lora_rank]
  Tensor kv_b_proj;           // [heads * (qk_nope_head_dim + v_head_dim), kv_lora_rank]
};

// Gated DeltaNet (LinearAttentionSpec).
struct LinearAttentionWeights {
  Tensor in_proj_qkv;  // [2 * key_dim + value_dim, hidden]: q, k, v
  Tensor in_proj_z;    // [value_dim, hidden]: the output norm's gate
  Tensor in_proj_b;    // [value_heads, hidden]: beta = sigmoid(b)
  Tensor in_proj_a;    // [value_heads, hidden]: the decay's input
  Tensor conv1d;       // [conv_dim, 1, conv_kernel] depthwise, no bias
  Tensor a_log;        // [value_heads] A_log
  Tensor dt_bias;      // [value_heads]
  Tensor norm;         // [value_head_dim] the gated RMSNorm's weight (plain, not zero-centred)
  Tensor out_proj;     // [hidden, value_dim]
};

struct DenseMlpWeights {
  Tensor gate_proj, up_proj, down_proj;
};

struct LayerWeights {
  Tensor input_norm, post_attention_norm;
  AttentionWeights attention;
  LinearAttentionWeights linear_attention;  // layers with attention.linear
  bool is_moe = false;
  DenseMlpWeights mlp;            // dense layers
  moe::MoeLayerWeights moe;       // MoE layers
  DenseMlpWeights shared_expert;  // MoE layers with a shared expert
  Tensor shared_expert_gate;      // [1, hidden], when the shared expert is gated
};

struct DecoderWeights {
  Tensor embed_tokens;  // [vocab, hidden]
  std::vector<LayerWeights> layers;
  Tensor final_norm;
  Tensor lm_head;  // [vocab, hidden]; the embedding table when tied
};

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  virtual bool has(const std::string& name) const = 0;
  // A float tensor (BF16, F16 or F32 in a checkpoint).
  virtual Result<Tensor> get(const std::string& name, const std::vector<int64_t>& shape) = 0;
  // A U8 tensor kept as stored: MXFP4 blocks (`scales` false) or their e8m0 scales (true).
  virtual Result<Tensor> packed(const std::string& name, const std::vector<int64_t>& shape,
                                bool scales) = 0;
  // Equally shaped tensors stacked into one [names.size(), shape...] tensor (per-expert
  // checkpoint tensors -> the stacked expert layout).
  virtual Result<Tensor> stacked(const std::vector<std::string>& names,
                                 const std::vector<int64_t>& shape) = 0;
  // A zero-centred RMSNorm weight (Qwen3.5: stored w, applied as 1 + w): the tensor returned
  // holds 1 + w in f32, so every backend's rms_norm applies it as it is.
  virtual Result<Tensor> zero_centred_norm(const std::string& name,
                                           const std::vector<int64_t>& shape) = 0;
  // gpt-oss's experts, stored as ExpertSpec::stored (transposed-interleaved bf16 or MXFP4,
  // tensors `prefix` + gate_up_proj[_blocks/_scales/_bias] / down_proj[...]), in the kStacked
  // layout the kernels of a backend without BackendFeature::kInterleavedExperts read: gate_up
  // [E, 2I, H] (gate rows, then up rows), down [E, H, I], bf16; the gate_up bias [E, 2I] in the
  // same row order. Converted on the host (MXFP4 dequantised exactly: e2m1 * 2^k is a bf16).
  enum class RestackedPart { kGateUp, kDown, kGateUpBias };
  struct StoredExperts {
    std::string prefix;
    moe::ExpertFormat stored = moe::ExpertFormat::kTransposedInterleaved;
    int64_t experts = 0, hidden = 0, intermediate = 0;
    std::vector<int64_t> shape(RestackedPart part) const {
      switch (part) {
        case RestackedPart::kGateUp: return {experts, 2 * intermediate, hidden};
        case RestackedPart::kDown: return {experts, hidden, intermediate};
        case RestackedPart::kGateUpBias: return {experts, 2 * intermediate};
      }
      return {};
    }
  };
  virtual Result<Tensor> restacked(const StoredExperts& experts, RestackedPart part) = 0;
  // Called after the last tensor.
  virtual Status finish() { return Status::ok(); }
};

// How a CheckpointSource places tensors: `order` (if set) collects every tensor it returns, in
// call order; with `into` (such a list from an earlier load) it copies each tensor into its
// counterpart instead of allocating, or with check_only only checks that they correspond.
struct WeightPlacement {
  std::vector<Tensor>* order = nullptr;
  std::vector<Tensor>* into = nullptr;
  bool check_only = false;
};

// Tensors from a checkpoint: a missing tensor or a wrong shape is an error naming the tensor
// (and its file). Tensors the backend converted are appended to `owned`. With `fp8` on, a float
// tensor stored as F8_E4M3 is dequantised per block with its `<name>_scale_inv` into a bf16
// buffer of the backend (BackendFeature::kFp8BlockWeights); the scale grid must be
// [ceil(out/rows), ceil(in/cols)].
class CheckpointSource final : public WeightSource {
 public:
  CheckpointSource(const Checkpoint& checkpoint, backend::Backend& backend,
                   std::vector<Tensor>& owned, const WeightPlacement& place = {},
                   Fp8BlockQuantization fp8 = {})
      : checkpoint_(checkpoint), backend_(backend), owned_(owned), place_(place), fp8_(fp8) {}
  bool has(const std::string& name) const override { return checkpoint_.find(name) != nullptr; }
  Result<Tensor> get(const std::string& name, const std::vector<int64_t>& shape) override;
  Result<Tensor> packed(const std::string& name, const std::vector<int64_t>& shape,
                        bool scales) override;
  Result<Tensor> stacked(const std::vector<std::string>& names,
                         const std::vector<int64_t>& shape) override;
  Result<Tensor> zero_centred_norm(const std::string& name,
                                   const std::vector<int64_t>& shape) override;
  Result<Tensor> restacked(const StoredExperts& experts, RestackedPart part) override;
  Status finish() override;

 private:
  Result<Tensor*> next_target(const std::string& name);
  Result<Tensor> load(const std::string& name, const std::vector<int64_t>& shape, bool packed);
  // An F8_E4M3 weight's values as bf16 (row-major, its shape), scales checked.
  Result<std::vector<uint16_t>> dequantize_fp8(const TensorInfo& weight) const;
  const Checkpoint& checkpoint_;
  backend::Backend& backend_;
  std::vector<Tensor>& owned_;
  WeightPlacement place_;
  Fp8BlockQuantization fp8_;
  size_t next_ = 0;
};

// Seeded random weights made on the backend (--random-weights): matrices bf16 uniform with std
// 0.02 (routers 3/sqrt(hidden), so routing is decisive), 1-D tensors f32 (norm weights near 1).
// Only the tensors an adapter always needs exist (has() is false: no optional tensor is made).
class RandomSource final : public WeightSource {
 public:
  RandomSource(backend::Backend& backend, uint64_t seed, int64_t hidden, std::vector<Tensor>& owned)
      : backend_(backend), seed_(seed), hidden_(hidden), owned_(owned) {}
  bool has(const std::string&) const override { return false; }
  Result<Tensor> get(const std::string& name, const std::vector<int64_t>& shape) override;
  // Random blocks (every e2m1 code) and scales near 2^-8, so weights are ~0.02 like get()'s.
  Result<Tensor> packed(const std::string& name, const std::vector<int64_t>& shape,
                        bool scales) override;
  Result<Tensor> stacked(const std::vector<std::string>& names,
                         const std::vector<int64_t>& shape) override;
  // 1 + w directly: near 1, like get()'s norm weights.
  Result<Tensor> zero_centred_norm(const std::string& name,
                                   const std::vector<int64_t>& shape) override;
  Result<Tensor> restacked(const StoredExperts& experts, RestackedPart part) override;

 private:
  backend::Backend& backend_;
  uint64_t seed_;
  int64_t hidden_;
  std::vector<Tensor>& owned_;
  uint64_t tensor_index_ = 0;
};

// Records names and shapes only (the returned tensors have no data): what a checkpoint of this
// configuration holds, one entry per stored tensor.
class TensorListSource final : public WeightSource {
 public:
  bool has(const std::string&) const override { return false; }
  Result<Tensor> get(const std::string& name, const std::vector<int64_t>& shape) override;
  Result<Tensor> packed(const std::string& name, const std::vector<int64_t>& shape,
                        bool scales) override;
  Result<Tensor> stacked(const std::vector<std::string>& names,
                         const std::vector<int64_t>& shape) override;
  Result<Tensor> zero_centred_norm(const std::string& name,
                                   const std::vector<int64_t>& shape) override;
  Result<Tensor> restacked(const StoredExperts& experts, RestackedPart part) override;
  const std::vector<TensorSpec>& tensors() const { return tensors_; }
  // The names packed() recorded as e8m0 scales (make-model fills them as scales).
  bool is_scales(const std::string& name) const;
  // The names zero_centred_norm() recorded (make-model fills them near 0, not near 1).
  bool is_zero_centred(const std::string& name) const;

 private:
  std::vector<TensorSpec> tensors_;
  std::vector<std::string> scales_;
  std::vector<std::string> zero_centred_;
};

// Init scale by tensor role, shared by RandomSource and make-model: routers decisive.
bool is_router_weight(const std::string& name);

// An OCP FP8 E4M3 (torch.float8_e4m3fn) value: bias 7, subnormals, no infinities, NaN at
// S.1111.111.
float fp8_e4m3_to_f32(uint8_t bits);

}  // namespace sy::model
