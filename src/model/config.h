// ModelConfig: Hugging Face config.json parsed into what the shared decoder needs, in every key
// spelling real checkpoints use (transformers 4 and 5).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "moe/router_spec.h"
#include "util/status.h"

namespace sy::model {

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
  int64_t num_experts = 0;
  int64_t experts_per_token = 0;
  bool norm_topk_prob = false;
  int64_t decoder_sparse_step = 1;
  std::vector<int> mlp_only_layers;
  float rms_norm_eps = 1e-6f;
  double rope_theta = 10000.0;
  int64_t max_position_embeddings = 0;
  bool attention_bias = false;
  bool qk_norm = true;
  bool tie_word_embeddings = false;
  std::string torch_dtype;  // as written; informational
  std::vector<int32_t> eos_token_ids;
  int32_t bos_token_id = -1;

  bool is_moe_layer(int layer) const;
  std::vector<int> moe_layers() const;
  moe::RouterSpec router_spec() const;
};

// Parses and checks consistency; errors name the field and what was expected.
Result<ModelConfig> parse_model_config(const nlohmann::json& config);
Result<ModelConfig> load_model_config(const std::string& model_dir);

}  // namespace sy::model
