// ModelConfig: Hugging Face config.json parsed into what the shared decoder needs, in every key
// spelling real checkpoints use (transformers 4 and 5): the shapes every family shares, plus
// the per-layer decoder description (model/description.h) the family's adapter builds.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/description.h"
#include "moe/expert_spec.h"
#include "moe/router_spec.h"
#include "util/status.h"

namespace sy::model {

// FP8 block-quantised checkpoints (quantization_config quant_method fp8, DeepSeek-V3 and GLM
// publish them): an F8_E4M3 weight [out, in] comes with `<weight>_scale_inv` F32
// [ceil(out/rows), ceil(in/cols)]; the loader dequantises it per block to bf16
// (model/weights.h: CheckpointSource). rows 0: none.
struct Fp8BlockQuantization {
  int64_t rows = 0, cols = 0;
  bool enabled() const { return rows > 0 && cols > 0; }
};

struct ModelConfig {
  std::string architecture;  // "Qwen3MoeForCausalLM"
  std::string model_type;    // "qwen3_moe"
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  int64_t intermediate_size = 0;      // dense MLP layers
  int64_t moe_intermediate_size = 0;  // each expert
  int64_t shared_expert_intermediate_size = 0;  // MoE layers with a shared expert
  int64_t num_experts = 0;
  int64_t experts_per_token = 0;
  bool norm_topk_prob = false;
  int64_t decoder_sparse_step = 1;
  std::vector<int> mlp_only_layers;
  float rms_norm_eps = 1e-6f;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  int64_t max_position_embeddings = 0;
  bool attention_bias = false;
  bool tie_word_embeddings = false;
  std::string torch_dtype;  // as written; informational
  std::vector<int32_t> eos_token_ids;
  int32_t bos_token_id = -1;

  // The decoder description, one entry per hidden layer, and the router of every MoE layer.
  NormPlacement norm_placement = NormPlacement::kPreNorm;
  std::vector<LayerSpec> layers;
  moe::RouterSpec router;
  moe::ExpertSpec experts;  // how every MoE layer's experts compute and are stored
  LatentAttentionSpec latent_attention;  // layers with attention.latent (DeepSeek-V3)
  LinearAttentionSpec linear_attention;  // layers with attention.linear (Qwen3.5)
  // Some layers keep per-sequence state instead of KV (linear attention): such a model cannot
  // resume from a prefix-cache hit, whose blocks hold KV only.
  bool has_linear_attention() const {
    for (const LayerSpec& layer : layers)
      if (layer.attention.linear) return true;
    return false;
  }
  double attention_scale = 0.0;          // softmax scale; 0: 1 / sqrt(head_dim)
  Fp8BlockQuantization fp8_blocks;       // FP8 block-quantised checkpoint weights
  // Partial rotary (partial_rotary_factor < 1, GLM-4.5): RoPE on the first rotary_dim dims of
  // each q/k head only; 0: every dim (model/rope.h: partial_rotary_dim reads it).
  int64_t rotary_dim = 0;
  // The dims RoPE rotates: head_dim, rotary_dim under partial rotary, or qk_rope_head_dim under
  // latent attention.
  int64_t rope_dim() const {
    if (latent_attention.qk_rope_head_dim > 0) return latent_attention.qk_rope_head_dim;
    return rotary_dim > 0 ? rotary_dim : head_dim;
  }

  // Values the KV cache holds per token over all layers (K and V, or MLA's latent + k_pe).
  int64_t kv_cache_values_per_token() const;
  bool is_moe_layer(int layer) const;
  std::vector<int> moe_layers() const;
  moe::RouterSpec router_spec() const { return router; }
  // The widest dense SwiGLU MLP of any layer (dense layers, shared experts): scratch sizing.
  int64_t widest_dense_mlp() const;
};

// qwen3_moe/Qwen2-MoE's rule for which layers are MoE: not in mlp_only_layers and
// (layer + 1) % decoder_sparse_step == 0.
bool sparse_step_layer(const ModelConfig& config, int layer);

// Parses and checks consistency; errors name the field and what was expected.
Result<ModelConfig> parse_model_config(const nlohmann::json& config);
Result<ModelConfig> load_model_config(const std::string& model_dir);

}  // namespace sy::model
