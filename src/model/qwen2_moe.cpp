// qwen2_moe (Qwen2MoeForCausalLM): q/k/v biases (qkv_bias), MoE layers by decoder_sparse_step /
// mlp_only_layers with a shared expert whose output is scaled by sigmoid(x . shared_expert_gate)
// and added to the routed output; sliding window on the layers layer_types marks.
#include <fmt/format.h>

#include "model/architecture.h"
#include "model/config_json.h"

namespace sy::model {

using namespace config_json;

Status parse_qwen2_moe(const nlohmann::json& json, ModelConfig& c) {
  SY_ASSIGN(c.intermediate_size, get_int(json, {"intermediate_size"}, true));
  SY_ASSIGN(c.moe_intermediate_size, get_int(json, {"moe_intermediate_size"}, true));
  SY_ASSIGN(c.shared_expert_intermediate_size,
            get_int(json, {"shared_expert_intermediate_size"}, true));
  SY_ASSIGN(c.num_experts, get_int(json, {"num_experts", "num_local_experts"}, true));
  SY_ASSIGN(c.experts_per_token, get_int(json, {"num_experts_per_tok"}, true));
  SY_ASSIGN(c.norm_topk_prob, get_bool(json, "norm_topk_prob", false));
  SY_ASSIGN(c.decoder_sparse_step, get_int(json, {"decoder_sparse_step"}, false, 1));
  SY_TRY(require_positive("decoder_sparse_step", c.decoder_sparse_step));
  SY_ASSIGN(c.mlp_only_layers, get_layer_list(json, "mlp_only_layers", c.num_hidden_layers));
  // Older configs have no qkv_bias: the published models always had q/k/v biases.
  SY_ASSIGN(bool qkv_bias, get_bool(json, "qkv_bias", true));
  c.attention_bias = qkv_bias;

  // Sliding window: transformers 5 writes layer_types; its default for configs without them
  // changed between versions, so a config that turns the window on must say where.
  SY_ASSIGN(bool use_sliding, get_bool(json, "use_sliding_window", false));
  SY_ASSIGN(int64_t window, get_int(json, {"sliding_window"}, false, 0));
  std::vector<bool> sliding(static_cast<size_t>(c.num_hidden_layers), false);
  if (auto it = json.find("layer_types"); it != json.end() && !it->is_null()) {
    if (!it->is_array() || static_cast<int64_t>(it->size()) != c.num_hidden_layers)
      return Status::errorf("config.json: layer_types must list {} layer types",
                            c.num_hidden_layers);
    for (size_t i = 0; i < it->size(); ++i) {
      const auto& type = (*it)[i];
      if (type == "sliding_attention")
        sliding[i] = true;
      else if (type != "full_attention")
        return Status::errorf(
            "config.json: layer_types[{}] is {}; supported: full_attention, sliding_attention", i,
            type.dump());
    }
  } else if (use_sliding) {
    return Status::error(
        "config.json: use_sliding_window true without layer_types is ambiguous (transformers "
        "versions differ on "
        "which layers slide); add layer_types");
  }
  for (int layer = 0; layer < c.num_hidden_layers; ++layer) {
    LayerSpec spec;
    spec.attention.qkv_bias = qkv_bias;
    if (sliding[static_cast<size_t>(layer)] && use_sliding) {
      if (window <= 0)
        return Status::errorf("config.json: layer {} slides but sliding_window is {}", layer,
                              window);
      spec.attention.sliding_window = window;
    }
    spec.mlp = sparse_step_layer(c, layer) ? MlpKind::kMoe : MlpKind::kDense;
    spec.shared_expert = spec.shared_expert_gate = spec.mlp == MlpKind::kMoe;
    c.layers.push_back(spec);
  }
  c.router.num_experts = c.num_experts;
  c.router.top_k = c.experts_per_token;
  c.router.scoring = moe::RouterScoring::kSoftmax;
  c.router.renormalize = c.norm_topk_prob;
  return Status::ok();
}

Result<DecoderWeights> build_qwen2_moe(const ModelConfig& c, WeightSource& source) {
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
      SY_TRY(blocks::dense_mlp(c, p + "mlp.shared_expert.", c.shared_expert_intermediate_size,
                               source, lw.shared_expert));
      SY_ASSIGN(lw.shared_expert_gate,
                source.get(p + "mlp.shared_expert_gate.weight", {1, c.hidden_size}));
    } else {
      SY_TRY(blocks::dense_mlp(c, p + "mlp.", c.intermediate_size, source, lw.mlp));
    }
    w.layers.push_back(std::move(lw));
  }
  SY_TRY(source.finish());
  return w;
}

}  // namespace sy::model
