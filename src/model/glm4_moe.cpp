// glm4_moe (Glm4MoeForCausalLM: GLM-4.5, GLM-4.5-Air, GLM-4.6): grouped-query attention with
// q/k/v biases (attention_bias), optional per-head q/k RMSNorm before RoPE (use_qk_norm), and
// partial rotary: rotate-half RoPE over the first int(head_dim x partial_rotary_factor) dims of
// each head (default 0.5), the rest passed through. The first first_k_dense_replace layers are
// dense, every later one MoE: DeepSeek-V3's router (sigmoid scores, e_score_correction_bias for
// selection only, n_group/topk_group groups ranked by their two best, weights from the unbiased
// scores, renormalised with norm_topk_prob, times routed_scaling_factor) plus n_shared_experts
// ungated shared experts. Multi-token-prediction layers (index num_hidden_layers) are not loaded.
#include <fmt/format.h>

#include "model/architecture.h"
#include "model/config_json.h"
#include "model/rope.h"

namespace sy::model {

using namespace config_json;

Status parse_glm4_moe(const nlohmann::json& json, ModelConfig& c) {
  SY_TRY(parse_fp8_block_quantization(json, c));
  SY_ASSIGN(c.attention_bias, get_bool(json, "attention_bias", false));
  SY_ASSIGN(bool qk_norm, get_bool(json, "use_qk_norm", false));
  // Glm4MoeConfig's default factor is 0.5 (transformers keeps it "for BC" in version 5).
  SY_ASSIGN(int64_t rotary, partial_rotary_dim(json, c.head_dim, 0.5));
  c.rotary_dim = rotary < c.head_dim ? rotary : 0;

  SY_ASSIGN(c.intermediate_size, get_int(json, {"intermediate_size"}, true));
  SY_ASSIGN(c.moe_intermediate_size, get_int(json, {"moe_intermediate_size"}, true));
  SY_ASSIGN(c.num_experts, get_int(json, {"n_routed_experts", "num_experts"}, true));
  SY_ASSIGN(c.experts_per_token, get_int(json, {"num_experts_per_tok"}, true));
  SY_ASSIGN(c.norm_topk_prob, get_bool(json, "norm_topk_prob", true));
  SY_ASSIGN(int64_t shared_experts, get_int(json, {"n_shared_experts"}, false, 1));
  SY_ASSIGN(int64_t first_dense, get_int(json, {"first_k_dense_replace"}, false, 1));
  SY_ASSIGN(int64_t groups, get_int(json, {"n_group"}, false, 1));
  SY_ASSIGN(int64_t topk_groups, get_int(json, {"topk_group"}, false, 1));
  SY_ASSIGN(double scaling, get_number(json, "routed_scaling_factor", 1.0));
  if (shared_experts < 0 || first_dense < 0)
    return Status::errorf(
        "config.json: n_shared_experts ({}) and first_k_dense_replace ({}) must be >= 0",
        shared_experts, first_dense);
  if (auto it = json.find("hidden_act"); it != json.end() && !it->is_null() && *it != "silu")
    return Status::errorf(
        "config.json: hidden_act {} is not supported for glm4_moe (supported: silu)", it->dump());
  c.shared_expert_intermediate_size = c.moe_intermediate_size * shared_experts;

  for (int layer = 0; layer < c.num_hidden_layers; ++layer) {
    LayerSpec spec;
    spec.attention.qkv_bias = c.attention_bias;
    spec.attention.qk_norm = qk_norm ? QkNorm::kPerHead : QkNorm::kNone;
    // transformers' Glm4MoeDecoderLayer: MoE from first_k_dense_replace on.
    spec.mlp = layer >= first_dense ? MlpKind::kMoe : MlpKind::kDense;
    spec.shared_expert = spec.mlp == MlpKind::kMoe && shared_experts > 0;
    c.layers.push_back(spec);
  }
  c.router = blocks::deepseek_router(c, groups, topk_groups, scaling);
  return Status::ok();
}

Result<DecoderWeights> build_glm4_moe(const ModelConfig& c, WeightSource& source) {
  DecoderWeights w;
  SY_TRY(blocks::embeddings_and_head(c, source, w));
  for (int layer = 0; layer < c.num_hidden_layers; ++layer) {
    const std::string p = fmt::format("model.layers.{}.", layer);
    const LayerSpec& spec = c.layers[static_cast<size_t>(layer)];
    LayerWeights lw;
    SY_TRY(blocks::layer_norms(c, p, source, lw));
    SY_TRY(blocks::attention(c, spec, p, source, lw.attention));
    SY_TRY(blocks::deepseek_mlp(c, spec, p, source, lw));
    w.layers.push_back(std::move(lw));
  }
  SY_TRY(source.finish());
  return w;
}

}  // namespace sy::model
