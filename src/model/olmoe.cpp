// olmoe (OlmoeForCausalLM): every layer MoE, q/k RMSNorm over the whole projection (q_norm
// [hidden], k_norm [kv_heads * head_dim]) before the heads are split, softmax -> top-k with
// norm_topk_prob (false in the published model).
#include <fmt/format.h>

#include "model/architecture.h"
#include "model/config_json.h"

namespace sy::model {

using namespace config_json;

Status parse_olmoe(const nlohmann::json& json, ModelConfig& c) {
  SY_ASSIGN(c.moe_intermediate_size, get_int(json, {"intermediate_size"}, true));
  SY_ASSIGN(c.num_experts, get_int(json, {"num_experts", "num_local_experts"}, true));
  SY_ASSIGN(c.experts_per_token, get_int(json, {"num_experts_per_tok"}, true));
  SY_ASSIGN(c.norm_topk_prob, get_bool(json, "norm_topk_prob", false));
  SY_ASSIGN(c.attention_bias, get_bool(json, "attention_bias", false));
  if (auto it = json.find("clip_qkv"); it != json.end() && !it->is_null())
    return Status::errorf("config.json: clip_qkv {} is not supported yet (supported: null)",
                          it->dump());
  // transformers sizes q_norm by hidden_size: head_dim must be hidden / heads.
  if (c.head_dim * c.num_attention_heads != c.hidden_size)
    return Status::errorf(
        "config.json: olmoe needs head_dim ({}) x num_attention_heads ({}) == hidden_size ({})",
        c.head_dim, c.num_attention_heads, c.hidden_size);
  for (int layer = 0; layer < c.num_hidden_layers; ++layer) {
    LayerSpec spec;
    spec.attention.qkv_bias = c.attention_bias;
    spec.attention.qk_norm = QkNorm::kWholeProjection;
    spec.mlp = MlpKind::kMoe;
    c.layers.push_back(spec);
  }
  c.router.num_experts = c.num_experts;
  c.router.top_k = c.experts_per_token;
  c.router.scoring = moe::RouterScoring::kSoftmax;
  c.router.renormalize = c.norm_topk_prob;
  return Status::ok();
}

Result<DecoderWeights> build_olmoe(const ModelConfig& c, WeightSource& source) {
  DecoderWeights w;
  SY_TRY(blocks::embeddings_and_head(c, source, w));
  for (int layer = 0; layer < c.num_hidden_layers; ++layer) {
    const std::string p = fmt::format("model.layers.{}.", layer);
    LayerWeights lw;
    SY_TRY(blocks::layer_norms(c, p, source, lw));
    SY_TRY(blocks::attention(c, c.layers[static_cast<size_t>(layer)], p, source, lw.attention));
    lw.is_moe = true;
    SY_TRY(blocks::routed_experts(c, p, {{"mlp.", "gate_proj", "up_proj", "down_proj"}}, source,
                                  lw.moe));
    w.layers.push_back(std::move(lw));
  }
  SY_TRY(source.finish());
  return w;
}

}  // namespace sy::model
