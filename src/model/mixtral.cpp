// mixtral (MixtralForCausalLM): every layer MoE, 8 experts top-2 in the published models,
// softmax -> top-k -> renormalise (always), optional sliding window on every layer, no q/k norm.
// Experts as published (block_sparse_moe.experts.E.w1/w3/w2 = gate/up/down), as some
// conversions name them (mlp.experts.E.gate_proj/...), or fused (transformers 5).
#include <fmt/format.h>

#include "model/architecture.h"
#include "model/config_json.h"

namespace sy::model {

using namespace config_json;

Status parse_mixtral(const nlohmann::json& json, ModelConfig& c) {
  // Mixtral's intermediate_size is each expert's width; it has no dense layers.
  SY_ASSIGN(c.moe_intermediate_size, get_int(json, {"intermediate_size"}, true));
  SY_ASSIGN(c.num_experts, get_int(json, {"num_local_experts", "num_experts"}, true));
  SY_ASSIGN(c.experts_per_token, get_int(json, {"num_experts_per_tok"}, true));
  SY_ASSIGN(int64_t window, get_int(json, {"sliding_window"}, false, 0));
  if (window < 0) return Status::errorf("config.json: sliding_window must be >= 0, got {}", window);
  c.norm_topk_prob = true;
  for (int layer = 0; layer < c.num_hidden_layers; ++layer) {
    LayerSpec spec;
    spec.attention.sliding_window = window;
    spec.mlp = MlpKind::kMoe;
    c.layers.push_back(spec);
  }
  c.router.num_experts = c.num_experts;
  c.router.top_k = c.experts_per_token;
  c.router.scoring = moe::RouterScoring::kSoftmax;
  c.router.renormalize = true;
  return Status::ok();
}

Result<DecoderWeights> build_mixtral(const ModelConfig& c, WeightSource& source) {
  DecoderWeights w;
  SY_TRY(blocks::embeddings_and_head(c, source, w));
  const std::vector<blocks::ExpertNames> names = {{"block_sparse_moe.", "w1", "w3", "w2"},
                                                  {"mlp.", "gate_proj", "up_proj", "down_proj"}};
  for (int layer = 0; layer < c.num_hidden_layers; ++layer) {
    const std::string p = fmt::format("model.layers.{}.", layer);
    LayerWeights lw;
    SY_TRY(blocks::layer_norms(c, p, source, lw));
    SY_TRY(blocks::attention(c, c.layers[static_cast<size_t>(layer)], p, source, lw.attention));
    lw.is_moe = true;
    SY_TRY(blocks::routed_experts(c, p, names, source, lw.moe));
    w.layers.push_back(std::move(lw));
  }
  SY_TRY(source.finish());
  return w;
}

}  // namespace sy::model
