// deepseek_v3 (DeepseekV3ForCausalLM; Kimi-K2's kimi_k2 is the same architecture): multi-head
// latent attention (model/description.h: LatentAttentionSpec) with the softmax scale YaRN's
// mscale_all_dim corrects; the first first_k_dense_replace layers dense, then MoE every
// moe_layer_freq layers; sigmoid router with e_score_correction_bias for selection only,
// group-limited top-k (a group ranks by its two best biased scores), weights from the unbiased
// scores, renormalised with norm_topk_prob, times routed_scaling_factor; n_shared_experts
// ungated shared experts. Multi-token-prediction layers (index num_hidden_layers) are not loaded.
// FP8 block-quantised checkpoints are dequantised to bf16 at load (parse_fp8_block_quantization).
#include <cmath>

#include <fmt/format.h>

#include "model/architecture.h"
#include "model/config_json.h"

namespace sy::model {

using namespace config_json;

namespace {

// An integer field that DeepSeek configs may set to null (q_lora_rank): null and absent read 0.
Result<int64_t> get_optional_int(const nlohmann::json& json, const char* key) {
  auto it = json.find(key);
  if (it == json.end() || it->is_null()) return int64_t{0};
  return get_int(json, {key}, true);
}

double yarn_mscale(double scale, double mscale) {
  return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

}  // namespace

Status parse_fp8_block_quantization(const nlohmann::json& json, ModelConfig& c) {
  auto q = json.find("quantization_config");
  if (q == json.end() || q->is_null()) return Status::ok();
  if (!q->is_object()) return Status::error("config.json: quantization_config must be an object");
  auto method = q->find("quant_method");
  if (method == q->end() || *method != "fp8")
    return Status::errorf(
        "config.json: quantization_config.quant_method {} is not supported for {} (supported: "
        "fp8 with weight_block_size, as DeepSeek-V3 publishes it)",
        method == q->end() ? "(absent)" : method->dump(), c.model_type);
  if (auto fmt = q->find("fmt"); fmt != q->end() && !fmt->is_null() && *fmt != "e4m3")
    return Status::errorf(
        "config.json: quantization_config.fmt {} is not supported (supported: e4m3)", fmt->dump());
  // Static activation scales would be per-layer input scales; dynamic ones are made on the fly
  // by FP8 kernels. We dequantise the weights and keep activations in f32, so only the weights'
  // scales matter.
  if (auto scheme = q->find("activation_scheme");
      scheme != q->end() && !scheme->is_null() && *scheme != "dynamic")
    return Status::errorf(
        "config.json: quantization_config.activation_scheme {} is not supported (supported: "
        "dynamic)",
        scheme->dump());
  auto block = q->find("weight_block_size");
  if (block == q->end() || !block->is_array() || block->size() != 2 ||
      !(*block)[0].is_number_integer() || !(*block)[1].is_number_integer() ||
      (*block)[0].get<int64_t>() <= 0 || (*block)[1].get<int64_t>() <= 0 ||
      (*block)[0].get<int64_t>() > config_json::kMaxConfigInt ||
      (*block)[1].get<int64_t>() > config_json::kMaxConfigInt)
    return Status::errorf(
        "config.json: quantization_config.weight_block_size must be two positive integers "
        "([128, 128] in published checkpoints), got {}",
        block == q->end() ? "(absent)" : block->dump());
  c.fp8_blocks.rows = (*block)[0].get<int64_t>();
  c.fp8_blocks.cols = (*block)[1].get<int64_t>();
  return Status::ok();
}

Status parse_deepseek_v3(const nlohmann::json& json, ModelConfig& c) {
  SY_TRY(parse_fp8_block_quantization(json, c));
  SY_ASSIGN(bool attention_bias, get_bool(json, "attention_bias", false));
  if (attention_bias)
    return Status::error("config.json: attention_bias true is not supported for deepseek_v3");
  LatentAttentionSpec& mla = c.latent_attention;
  SY_ASSIGN(mla.q_lora_rank, get_optional_int(json, "q_lora_rank"));
  SY_ASSIGN(mla.kv_lora_rank, get_int(json, {"kv_lora_rank"}, true));
  SY_ASSIGN(mla.qk_nope_head_dim, get_int(json, {"qk_nope_head_dim"}, true));
  SY_ASSIGN(mla.qk_rope_head_dim, get_int(json, {"qk_rope_head_dim"}, true));
  SY_ASSIGN(mla.v_head_dim, get_int(json, {"v_head_dim"}, true));
  SY_ASSIGN(mla.interleave, get_bool(json, "rope_interleave", true));
  if (mla.q_lora_rank < 0)
    return Status::errorf("config.json: q_lora_rank must be >= 0 or null, got {}", mla.q_lora_rank);
  SY_TRY(require_positive("kv_lora_rank", mla.kv_lora_rank));
  SY_TRY(require_positive("qk_rope_head_dim", mla.qk_rope_head_dim));
  SY_TRY(require_positive("v_head_dim", mla.v_head_dim));
  if (mla.qk_nope_head_dim < 0)
    return Status::errorf("config.json: qk_nope_head_dim must be >= 0, got {}",
                          mla.qk_nope_head_dim);
  if (mla.qk_rope_head_dim % 2)
    return Status::errorf("config.json: qk_rope_head_dim must be even for RoPE, got {}",
                          mla.qk_rope_head_dim);
  // Every head has its own k and v (expanded from the shared latent): no GQA. head_dim is the
  // q/k head (DeepseekV3Config's own head_dim is the rope part).
  c.head_dim = mla.qk_nope_head_dim + mla.qk_rope_head_dim;
  c.num_key_value_heads = c.num_attention_heads;
  c.attention_scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
  if (c.rope_scaling.kind == RopeKind::kYarn && c.rope_scaling.mscale_all_dim != 0.0) {
    const double m = yarn_mscale(c.rope_scaling.factor, c.rope_scaling.mscale_all_dim);
    c.attention_scale *= m * m;
  }

  SY_ASSIGN(c.intermediate_size, get_int(json, {"intermediate_size"}, true));
  SY_ASSIGN(c.moe_intermediate_size, get_int(json, {"moe_intermediate_size"}, true));
  SY_ASSIGN(c.num_experts, get_int(json, {"n_routed_experts", "num_experts"}, true));
  SY_ASSIGN(c.experts_per_token, get_int(json, {"num_experts_per_tok"}, true));
  SY_ASSIGN(c.norm_topk_prob, get_bool(json, "norm_topk_prob", true));
  SY_ASSIGN(int64_t shared_experts, get_int(json, {"n_shared_experts"}, false, 1));
  SY_ASSIGN(int64_t first_dense, get_int(json, {"first_k_dense_replace"}, false, 0));
  SY_ASSIGN(int64_t moe_freq, get_int(json, {"moe_layer_freq"}, false, 1));
  SY_ASSIGN(int64_t groups, get_int(json, {"n_group"}, false, 1));
  SY_ASSIGN(int64_t topk_groups, get_int(json, {"topk_group"}, false, 1));
  SY_ASSIGN(double scaling, get_number(json, "routed_scaling_factor", 1.0));
  SY_TRY(require_positive("moe_layer_freq", moe_freq));
  if (shared_experts < 0 || first_dense < 0)
    return Status::errorf(
        "config.json: n_shared_experts ({}) and first_k_dense_replace ({}) must be >= 0",
        shared_experts, first_dense);
  if (auto it = json.find("scoring_func"); it != json.end() && *it != "sigmoid")
    return Status::errorf("config.json: scoring_func {} is not supported (supported: sigmoid)",
                          it->dump());
  if (auto it = json.find("topk_method"); it != json.end() && *it != "noaux_tc")
    return Status::errorf("config.json: topk_method {} is not supported (supported: noaux_tc)",
                          it->dump());
  c.shared_expert_intermediate_size = c.moe_intermediate_size * shared_experts;

  for (int layer = 0; layer < c.num_hidden_layers; ++layer) {
    LayerSpec spec;
    spec.attention.latent = true;
    // transformers' DeepseekV3DecoderLayer: MoE from first_k_dense_replace on, every
    // moe_layer_freq layers (layer % freq == 0).
    spec.mlp = layer >= first_dense && layer % moe_freq == 0 ? MlpKind::kMoe : MlpKind::kDense;
    spec.shared_expert = spec.mlp == MlpKind::kMoe && shared_experts > 0;
    c.layers.push_back(spec);
  }
  c.router = blocks::deepseek_router(c, groups, topk_groups, scaling);
  return Status::ok();
}

Result<DecoderWeights> build_deepseek_v3(const ModelConfig& c, WeightSource& source) {
  DecoderWeights w;
  SY_TRY(blocks::embeddings_and_head(c, source, w));
  const LatentAttentionSpec& mla = c.latent_attention;
  const int64_t H = c.hidden_size, heads = c.num_attention_heads;
  for (int layer = 0; layer < c.num_hidden_layers; ++layer) {
    const std::string p = fmt::format("model.layers.{}.", layer);
    const LayerSpec& spec = c.layers[static_cast<size_t>(layer)];
    LayerWeights lw;
    SY_TRY(blocks::layer_norms(c, p, source, lw));
    AttentionWeights& a = lw.attention;
    const std::string ap = p + "self_attn.";
    if (mla.q_lora_rank > 0) {
      SY_ASSIGN(a.q_a_proj, source.get(ap + "q_a_proj.weight", {mla.q_lora_rank, H}));
      SY_ASSIGN(a.q_a_norm, source.get(ap + "q_a_layernorm.weight", {mla.q_lora_rank}));
      SY_ASSIGN(a.q_proj,
                source.get(ap + "q_b_proj.weight", {heads * c.head_dim, mla.q_lora_rank}));
    } else {
      SY_ASSIGN(a.q_proj, source.get(ap + "q_proj.weight", {heads * c.head_dim, H}));
    }
    SY_ASSIGN(a.kv_a_proj, source.get(ap + "kv_a_proj_with_mqa.weight", {mla.cache_row(), H}));
    SY_ASSIGN(a.kv_a_norm, source.get(ap + "kv_a_layernorm.weight", {mla.kv_lora_rank}));
    SY_ASSIGN(a.kv_b_proj,
              source.get(ap + "kv_b_proj.weight",
                         {heads * (mla.qk_nope_head_dim + mla.v_head_dim), mla.kv_lora_rank}));
    SY_ASSIGN(a.o_proj, source.get(ap + "o_proj.weight", {H, heads * mla.v_head_dim}));
    SY_TRY(blocks::deepseek_mlp(c, spec, p, source, lw));
    w.layers.push_back(std::move(lw));
  }
  SY_TRY(source.finish());
  return w;
}

}  // namespace sy::model
