// The architecture table: one adapter per Hugging Face model_type. An adapter reads its
// family's config.json fields into the decoder description (ModelConfig::layers, router) and
// declares every weight by name and shape against a WeightSource, which either loads them from
// a checkpoint, makes seeded random ones, or lists them (make-model). docs/architectures.md
// says how to add one.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/config.h"
#include "model/weights.h"

namespace sy::model {

struct Architecture {
  std::string_view model_type;  // config.json "model_type"
  std::string_view class_name;  // config.json "architectures"[0]
  // Reads the family's fields into `config`, whose shared shapes are already parsed, and fills
  // config.layers and config.router.
  Status (*parse)(const nlohmann::json& json, ModelConfig& config);
  // Declares every weight of the model (shapes checked by the source).
  Result<DecoderWeights> (*build)(const ModelConfig& config, WeightSource& source);
};

// Every supported architecture, in a fixed order.
const std::vector<Architecture>& architectures();
// By model_type, or by class name when model_type is absent; the error lists what is supported.
Result<const Architecture*> find_architecture(const std::string& model_type,
                                              const std::string& class_name);
std::string supported_architectures_text();  // "qwen3_moe (Qwen3MoeForCausalLM), ..."

// The adapters (one file each: model/<model_type>.cpp).
Status parse_qwen3_moe(const nlohmann::json& json, ModelConfig& config);
Result<DecoderWeights> build_qwen3_moe(const ModelConfig& config, WeightSource& source);
Status parse_mixtral(const nlohmann::json& json, ModelConfig& config);
Result<DecoderWeights> build_mixtral(const ModelConfig& config, WeightSource& source);
Status parse_olmoe(const nlohmann::json& json, ModelConfig& config);
Result<DecoderWeights> build_olmoe(const ModelConfig& config, WeightSource& source);
Status parse_qwen2_moe(const nlohmann::json& json, ModelConfig& config);
Result<DecoderWeights> build_qwen2_moe(const ModelConfig& config, WeightSource& source);
Status parse_gpt_oss(const nlohmann::json& json, ModelConfig& config);
Result<DecoderWeights> build_gpt_oss(const ModelConfig& config, WeightSource& source);
Status parse_deepseek_v3(const nlohmann::json& json, ModelConfig& config);
Result<DecoderWeights> build_deepseek_v3(const ModelConfig& config, WeightSource& source);
Status parse_qwen3_5_moe(const nlohmann::json& json, ModelConfig& config);
Result<DecoderWeights> build_qwen3_5_moe(const ModelConfig& config, WeightSource& source);
Status parse_glm4_moe(const nlohmann::json& json, ModelConfig& config);
Result<DecoderWeights> build_glm4_moe(const ModelConfig& config, WeightSource& source);
// quantization_config of an FP8 block-quantised checkpoint (quant_method fp8, e4m3,
// weight_block_size) into config.fp8_blocks; none leaves it off; anything else is refused
// (deepseek_v3.cpp, shared with glm4_moe).
Status parse_fp8_block_quantization(const nlohmann::json& json, ModelConfig& config);

// Blocks adapters share (model/adapter_blocks.cpp).
namespace blocks {
// embed_tokens, final norm, lm_head (tied when the config says so and no lm_head is stored).
Status embeddings_and_head(const ModelConfig& c, WeightSource& source, DecoderWeights& w);
// `prefix` + {q,k,v,o}_proj (+ biases, + q/k norms as layer.attention says).
Status attention(const ModelConfig& c, const LayerSpec& layer, const std::string& prefix,
                 WeightSource& source, AttentionWeights& a);
// `prefix` + {gate,up,down}_proj.weight of width `intermediate`.
Status dense_mlp(const ModelConfig& c, const std::string& prefix, int64_t intermediate,
                 WeightSource& source, DenseMlpWeights& mlp);
// How a family names its routed experts under the layer's prefix.
struct ExpertNames {
  std::string block;  // "mlp." (or "block_sparse_moe." for Mixtral's published names)
  std::string gate, up,
      down;  // per-expert matrices: "gate_proj", "up_proj", "down_proj" (w1, w3, w2)
};
// The router `prefix` + block + "gate.weight" and the experts, stacked into [E, 2I, H] / [E, H, I]:
// per-expert tensors under any of `names`, or transformers 5's fused experts.gate_up_proj.
Status routed_experts(const ModelConfig& c, const std::string& prefix,
                      const std::vector<ExpertNames>& names, WeightSource& source,
                      moe::MoeLayerWeights& moe);
// DeepSeek-V3's router (GLM-4.5's too): sigmoid scores, e_score_correction_bias for selection
// only, group-limited top-k with groups scored by their two best, renormalised if
// norm_topk_prob, times routed_scaling_factor.
moe::RouterSpec deepseek_router(const ModelConfig& c, int64_t groups, int64_t topk_groups,
                                double scaling);
// DeepSeek-V3's feed-forward block (GLM-4.5 names it the same): for a MoE layer the routed
// experts under "mlp.", the router's e_score_correction_bias (selection only) and, where the
// layer has them, "mlp.shared_experts."; for a dense layer "mlp." of intermediate_size.
Status deepseek_mlp(const ModelConfig& c, const LayerSpec& layer, const std::string& prefix,
                    WeightSource& source, LayerWeights& lw);
// The layer's two pre-norms.
Status layer_norms(const ModelConfig& c, const std::string& prefix, WeightSource& source,
                   LayerWeights& lw);
}  // namespace blocks

}  // namespace sy::model
