// qwen3_moe (Qwen3MoeForCausalLM): per-head q/k RMSNorm, optional attention biases, MoE layers by
// decoder_sparse_step / mlp_only_layers, softmax -> top-k -> optional renormalisation.
#include <fmt/format.h>

#include "model/architecture.h"
#include "model/config_json.h"

namespace sy::model {

using namespace config_json;

Status parse_qwen3_moe(const nlohmann::json& json, ModelConfig& c) {
  SY_ASSIGN(c.intermediate_size, get_int(json, {"intermediate_size"}, true));
  SY_ASSIGN(c.moe_intermediate_size, get_int(json, {"moe_intermediate_size"}, true));
  SY_ASSIGN(c.num_experts, get_int(json, {"num_experts", "num_local_experts"}, true));
  SY_ASSIGN(c.experts_per_token, get_int(json, {"num_experts_per_tok"}, true));
  SY_ASSIGN(c.norm_topk_prob, get_bool(json, "norm_topk_prob", false));
  SY_ASSIGN(c.decoder_sparse_step, get_int(json, {"decoder_sparse_step"}, false, 1));
  SY_TRY(require_positive("decoder_sparse_step", c.decoder_sparse_step));
  SY_ASSIGN(c.mlp_only_layers, get_layer_list(json, "mlp_only_layers", c.num_hidden_layers));
  SY_ASSIGN(c.attention_bias, get_bool(json, "attention_bias", false));
  SY_ASSIGN(bool sliding, get_bool(json, "use_sliding_window", false));
  if (sliding)
    return Status::error("config.json: use_sliding_window true is not supported for qwen3_moe yet");

  for (int layer = 0; layer < c.num_hidden_layers; ++layer) {
    LayerSpec spec;
    spec.attention.qkv_bias = c.attention_bias;
    spec.attention.qk_norm = QkNorm::kPerHead;
    spec.mlp = sparse_step_layer(c, layer) ? MlpKind::kMoe : MlpKind::kDense;
    c.layers.push_back(spec);
  }
  c.router.num_experts = c.num_experts;
  c.router.top_k = c.experts_per_token;
  c.router.scoring = moe::RouterScoring::kSoftmax;
  c.router.renormalize = c.norm_topk_prob;
  return Status::ok();
}

Result<DecoderWeights> build_qwen3_moe(const ModelConfig& c, WeightSource& source) {
  DecoderWeights w;
  SY_TRY(blocks::embeddings_and_head(c, source, w));
  for (int layer = 0; layer < c.num_hidden_layers; ++layer) {
    const std::string p = fmt::format("model.layers.{}.", layer);
    const LayerSpec& spec = c.layers[static_cast<size_t>(layer)];
    LayerWeights lw;
    SY_TRY(blocks::layer_norms(c, p, source, lw));
    SY_TRY(blocks::attention(c, spec, p, source, lw.attention));
    lw.is_moe = spec.mlp == MlpKind::kMoe;
    if (lw.is_moe) {
      SY_TRY(blocks::routed_experts(c, p, {{"mlp.", "gate_proj", "up_proj", "down_proj"}}, source,
                                    lw.moe));
    } else {
      SY_TRY(blocks::dense_mlp(c, p + "mlp.", c.intermediate_size, source, lw.mlp));
    }
    w.layers.push_back(std::move(lw));
  }
  SY_TRY(source.finish());
  return w;
}

}  // namespace sy::model
