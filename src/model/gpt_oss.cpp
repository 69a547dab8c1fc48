// gpt_oss (GptOssForCausalLM): every layer MoE; attention with q/k/v/o biases and a learned sink
// logit per head; layer_types alternating sliding_attention / full_attention; YaRN RoPE (parsed
// with the shared fields); router with a bias, top-k on the logits then softmax over the k;
// experts with biases and the clamped SwiGLU, gate/up interleaved, stored as the checkpoint's
// quantization_config says: MXFP4 blocks/scales (published) or bf16 as transformers saves them.
#include <fmt/format.h>

#include "model/architecture.h"
#include "model/config_json.h"

namespace sy::model {

using namespace config_json;

Status parse_gpt_oss(const nlohmann::json& json, ModelConfig& c) {
  // intermediate_size is each expert's width; there are no dense layers.
  SY_ASSIGN(c.moe_intermediate_size, get_int(json, {"intermediate_size"}, true));
  SY_ASSIGN(c.num_experts, get_int(json, {"num_local_experts", "num_experts"}, true));
  SY_ASSIGN(c.experts_per_token,
            get_int(json, {"num_experts_per_tok", "experts_per_token"}, false, 4));
  SY_ASSIGN(c.attention_bias, get_bool(json, "attention_bias", true));
  SY_ASSIGN(double limit, get_number(json, "swiglu_limit", 7.0));
  if (!(limit > 0.0)) return Status::errorf("config.json: swiglu_limit must be > 0, got {}", limit);
  // GptOssConfig's defaults: a window of 128; without layer_types, even layers slide.
  SY_ASSIGN(int64_t window, get_int(json, {"sliding_window"}, false, 128));
  std::vector<bool> sliding(static_cast<size_t>(c.num_hidden_layers));
  for (size_t i = 0; i < sliding.size(); ++i) sliding[i] = i % 2 == 0;
  if (auto it = json.find("layer_types"); it != json.end() && !it->is_null()) {
    if (!it->is_array() || static_cast<int64_t>(it->size()) != c.num_hidden_layers)
      return Status::errorf("config.json: layer_types must list {} layer types",
                            c.num_hidden_layers);
    for (size_t i = 0; i < it->size(); ++i) {
      const auto& type = (*it)[i];
      if (type != "sliding_attention" && type != "full_attention")
        return Status::errorf(
            "config.json: layer_types[{}] is {}; supported: full_attention, sliding_attention", i,
            type.dump());
      sliding[i] = type == "sliding_attention";
    }
  }

  // The experts' storage: quantization_config decides (absent: bf16 as transformers saves it).
  moe::ExpertFormat format = moe::ExpertFormat::kTransposedInterleaved;
  if (auto q = json.find("quantization_config"); q != json.end() && !q->is_null()) {
    if (!q->is_object()) return Status::error("config.json: quantization_config must be an object");
    const auto method = q->find("quant_method");
    if (method == q->end() || !method->is_string() || *method != "mxfp4")
      return Status::errorf(
          "config.json: quantization_config.quant_method {} is not supported for gpt_oss "
          "(supported: mxfp4)",
          method == q->end() ? "(missing)" : method->dump());
    format = moe::ExpertFormat::kMxfp4Interleaved;
    for (auto [field, value] : {std::pair{"hidden_size", c.hidden_size},
                                std::pair{"intermediate_size", c.moe_intermediate_size}})
      if (value % 32 != 0)
        return Status::errorf(
            "config.json: {} ({}) must be a multiple of 32 for MXFP4 experts (32-value blocks)",
            field, value);
  }

  for (int layer = 0; layer < c.num_hidden_layers; ++layer) {
    LayerSpec spec;
    spec.attention.qkv_bias = c.attention_bias;
    spec.attention.sinks = true;
    if (sliding[static_cast<size_t>(layer)]) {
      if (window <= 0)
        return Status::errorf("config.json: layer {} slides but sliding_window is {}", layer,
                              window);
      spec.attention.sliding_window = window;
    }
    spec.mlp = MlpKind::kMoe;
    c.layers.push_back(spec);
  }
  c.router.num_experts = c.num_experts;
  c.router.top_k = c.experts_per_token;
  c.router.scoring = moe::RouterScoring::kSoftmax;
  c.router.softmax_after_topk = true;
  c.router.has_logit_bias = true;
  c.router.renormalize = false;  // the softmax over the k already sums to 1
  c.experts.activation = moe::ExpertActivation::kClampedSwiGlu;
  c.experts.alpha = 1.702f;
  c.experts.limit = static_cast<float>(limit);
  c.experts.has_biases = true;
  c.experts.format = format;
  c.experts.stored = format;
  return Status::ok();
}

Result<DecoderWeights> build_gpt_oss(const ModelConfig& c, WeightSource& source) {
  DecoderWeights w;
  SY_TRY(blocks::embeddings_and_head(c, source, w));
  const int64_t E = c.num_experts, H = c.hidden_size, I = c.moe_intermediate_size;
  for (int layer = 0; layer < c.num_hidden_layers; ++layer) {
    const std::string p = fmt::format("model.layers.{}.", layer);
    const LayerSpec& spec = c.layers[static_cast<size_t>(layer)];
    LayerWeights lw;
    SY_TRY(blocks::layer_norms(c, p, source, lw));
    SY_TRY(blocks::attention(c, spec, p, source, lw.attention));
    SY_ASSIGN(lw.attention.sinks, source.get(p + "self_attn.sinks", {c.num_attention_heads}));
    lw.is_moe = true;
    moe::MoeLayerWeights& moe = lw.moe;
    const std::string mp = p + "mlp.";
    SY_ASSIGN(moe.router, source.get(mp + "router.weight", {E, H}));
    SY_ASSIGN(moe.router_bias, source.get(mp + "router.bias", {E}));
    if (c.experts.format != c.experts.stored) {
      // Restacked to bf16 for kernels that read only kStacked (model/requirements.h).
      const WeightSource::StoredExperts stored{mp + "experts.", c.experts.stored, E, H, I};
      SY_ASSIGN(moe.gate_up, source.restacked(stored, WeightSource::RestackedPart::kGateUp));
      SY_ASSIGN(moe.down, source.restacked(stored, WeightSource::RestackedPart::kDown));
      SY_ASSIGN(moe.gate_up_bias,
                source.restacked(stored, WeightSource::RestackedPart::kGateUpBias));
    } else if (c.experts.format == moe::ExpertFormat::kMxfp4Interleaved) {
      SY_ASSIGN(moe.gate_up,
                source.packed(mp + "experts.gate_up_proj_blocks", {E, 2 * I, H / 32, 16}, false));
      SY_ASSIGN(moe.gate_up_scales,
                source.packed(mp + "experts.gate_up_proj_scales", {E, 2 * I, H / 32}, true));
      SY_ASSIGN(moe.down,
                source.packed(mp + "experts.down_proj_blocks", {E, H, I / 32, 16}, false));
      SY_ASSIGN(moe.down_scales,
                source.packed(mp + "experts.down_proj_scales", {E, H, I / 32}, true));
    } else {
      SY_ASSIGN(moe.gate_up, source.get(mp + "experts.gate_up_proj", {E, H, 2 * I}));
      SY_ASSIGN(moe.down, source.get(mp + "experts.down_proj", {E, I, H}));
    }
    if (c.experts.format == c.experts.stored) {  // (restacked above otherwise)
      SY_ASSIGN(moe.gate_up_bias, source.get(mp + "experts.gate_up_proj_bias", {E, 2 * I}));
    }
    SY_ASSIGN(moe.down_bias, source.get(mp + "experts.down_proj_bias", {E, H}));
    w.layers.push_back(std::move(lw));
  }
  SY_TRY(source.finish());
  return w;
}

}  // namespace sy::model
