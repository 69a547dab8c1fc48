#include "model/architecture.h"

#include <fmt/format.h>

namespace sy::model {

const std::vector<Architecture>& architectures() {
  static const std::vector<Architecture> table = {
      {"qwen3_moe", "Qwen3MoeForCausalLM", parse_qwen3_moe, build_qwen3_moe},
      {"mixtral", "MixtralForCausalLM", parse_mixtral, build_mixtral},
      {"olmoe", "OlmoeForCausalLM", parse_olmoe, build_olmoe},
      {"qwen2_moe", "Qwen2MoeForCausalLM", parse_qwen2_moe, build_qwen2_moe},
      {"gpt_oss", "GptOssForCausalLM", parse_gpt_oss, build_gpt_oss},
      {"deepseek_v3", "DeepseekV3ForCausalLM", parse_deepseek_v3, build_deepseek_v3},
      // Kimi-K2 checkpoints: DeepSeek-V3's architecture under their own model_type.
      {"kimi_k2", "DeepseekV3ForCausalLM", parse_deepseek_v3, build_deepseek_v3},
      // Qwen3.5: the published multimodal wrapper (text_config, model.language_model.) and the
      // text model alone (transformers saves Qwen3_5MoeForCausalLM as qwen3_5_moe_text).
      {"qwen3_5_moe", "Qwen3_5MoeForConditionalGeneration", parse_qwen3_5_moe, build_qwen3_5_moe},
      {"qwen3_5_moe_text", "Qwen3_5MoeForCausalLM", parse_qwen3_5_moe, build_qwen3_5_moe},
      {"glm4_moe", "Glm4MoeForCausalLM", parse_glm4_moe, build_glm4_moe},
  };
  return table;
}

std::string supported_architectures_text() {
  std::string text;
  for (const Architecture& arch : architectures())
    text += fmt::format("{}{} ({})", text.empty() ? "" : ", ", arch.model_type, arch.class_name);
  return text;
}

Result<const Architecture*> find_architecture(const std::string& model_type,
                                              const std::string& class_name) {
  for (const Architecture& arch : architectures())
    if (model_type.empty() ? class_name == arch.class_name : model_type == arch.model_type)
      return &arch;
  return Status::errorf(
      "config.json: unsupported architecture (model_type '{}', architectures '{}'); supported: {}",
      model_type, class_name, supported_architectures_text());
}

namespace blocks {

Status embeddings_and_head(const ModelConfig& c, WeightSource& source, DecoderWeights& w) {
  SY_ASSIGN(w.embed_tokens, source.get("model.embed_tokens.weight", {c.vocab_size, c.hidden_size}));
  SY_ASSIGN(w.final_norm, source.get("model.norm.weight", {c.hidden_size}));
  if (c.tie_word_embeddings && !source.has("lm_head.weight")) {
    w.lm_head = w.embed_tokens;
  } else {
    SY_ASSIGN(w.lm_head, source.get("lm_head.weight", {c.vocab_size, c.hidden_size}));
  }
  return Status::ok();
}

Status layer_norms(const ModelConfig& c, const std::string& p, WeightSource& source,
                   LayerWeights& lw) {
  SY_ASSIGN(lw.input_norm, source.get(p + "input_layernorm.weight", {c.hidden_size}));
  SY_ASSIGN(lw.post_attention_norm,
            source.get(p + "post_attention_layernorm.weight", {c.hidden_size}));
  return Status::ok();
}

moe::RouterSpec deepseek_router(const ModelConfig& c, int64_t groups, int64_t topk_groups,
                                double scaling) {
  moe::RouterSpec r = c.router;
  r.num_experts = c.num_experts;
  r.top_k = c.experts_per_token;
  r.scoring = moe::RouterScoring::kSigmoid;
  r.has_selection_bias = true;
  r.num_groups = groups;
  r.topk_groups = topk_groups;
  r.group_scoring = moe::GroupScoring::kTopTwoSum;
  r.renormalize = c.norm_topk_prob;
  r.routed_scaling_factor = static_cast<float>(scaling);
  return r;
}

Status deepseek_mlp(const ModelConfig& c, const LayerSpec& layer, const std::string& p,
                    WeightSource& source, LayerWeights& lw) {
  lw.is_moe = layer.mlp == MlpKind::kMoe;
  if (!lw.is_moe) return dense_mlp(c, p + "mlp.", c.intermediate_size, source, lw.mlp);
  SY_TRY(routed_experts(c, p, {{"mlp.", "gate_proj", "up_proj", "down_proj"}}, source, lw.moe));
  SY_ASSIGN(lw.moe.selection_bias,
            source.get(p + "mlp.gate.e_score_correction_bias", {c.num_experts}));
  if (layer.shared_expert)
    SY_TRY(dense_mlp(c, p + "mlp.shared_experts.", c.shared_expert_intermediate_size, source,
                     lw.shared_expert));
  return Status::ok();
}

Status attention(const ModelConfig& c, const LayerSpec& layer, const std::string& p,
                 WeightSource& source, AttentionWeights& a) {
  const int64_t hidden = c.hidden_size, q_out = c.num_attention_heads * c.head_dim,
                kv_out = c.num_key_value_heads * c.head_dim;
  SY_ASSIGN(a.q_proj, source.get(p + "self_attn.q_proj.weight", {q_out, hidden}));
  SY_ASSIGN(a.k_proj, source.get(p + "self_attn.k_proj.weight", {kv_out, hidden}));
  SY_ASSIGN(a.v_proj, source.get(p + "self_attn.v_proj.weight", {kv_out, hidden}));
  SY_ASSIGN(a.o_proj, source.get(p + "self_attn.o_proj.weight", {hidden, q_out}));
  if (layer.attention.qkv_bias) {
    SY_ASSIGN(a.q_bias, source.get(p + "self_attn.q_proj.bias", {q_out}));
    SY_ASSIGN(a.k_bias, source.get(p + "self_attn.k_proj.bias", {kv_out}));
    SY_ASSIGN(a.v_bias, source.get(p + "self_attn.v_proj.bias", {kv_out}));
    if (source.has(p + "self_attn.o_proj.bias")) {
      SY_ASSIGN(a.o_bias, source.get(p + "self_attn.o_proj.bias", {hidden}));
    }
  }
  if (layer.attention.qk_norm != QkNorm::kNone) {
    const bool whole = layer.attention.qk_norm == QkNorm::kWholeProjection;
    SY_ASSIGN(a.q_norm, source.get(p + "self_attn.q_norm.weight", {whole ? q_out : c.head_dim}));
    SY_ASSIGN(a.k_norm, source.get(p + "self_attn.k_norm.weight", {whole ? kv_out : c.head_dim}));
  }
  return Status::ok();
}

Status dense_mlp(const ModelConfig& c, const std::string& p, int64_t inter, WeightSource& source,
                 DenseMlpWeights& mlp) {
  SY_ASSIGN(mlp.gate_proj, source.get(p + "gate_proj.weight", {inter, c.hidden_size}));
  SY_ASSIGN(mlp.up_proj, source.get(p + "up_proj.weight", {inter, c.hidden_size}));
  SY_ASSIGN(mlp.down_proj, source.get(p + "down_proj.weight", {c.hidden_size, inter}));
  return Status::ok();
}

Status routed_experts(const ModelConfig& c, const std::string& p,
                      const std::vector<ExpertNames>& names, WeightSource& source,
                      moe::MoeLayerWeights& moe) {
  const int64_t hidden = c.hidden_size, inter = c.moe_intermediate_size, experts = c.num_experts;
  // transformers 5 in memory (and checkpoints saved without its reverse conversion): fused.
  if (source.has(p + "mlp.experts.gate_up_proj")) {
    SY_ASSIGN(moe.router, source.get(p + "mlp.gate.weight", {experts, hidden}));
    SY_ASSIGN(moe.gate_up,
              source.get(p + "mlp.experts.gate_up_proj", {experts, 2 * inter, hidden}));
    SY_ASSIGN(moe.down, source.get(p + "mlp.experts.down_proj", {experts, hidden, inter}));
    return Status::ok();
  }
  // Published checkpoints: one tensor per expert and projection, stacked here. The first
  // naming whose expert 0 is present wins; without any, the first naming's names are reported.
  const ExpertNames* chosen = &names.front();
  for (const ExpertNames& candidate : names)
    if (source.has(fmt::format("{}{}experts.0.{}.weight", p, candidate.block, candidate.gate))) {
      chosen = &candidate;
      break;
    }
  SY_ASSIGN(moe.router, source.get(p + chosen->block + "gate.weight", {experts, hidden}));
  std::vector<std::string> gate_up_names, down_names;
  for (int64_t e = 0; e < experts; ++e) {
    const std::string ep = fmt::format("{}{}experts.{}.", p, chosen->block, e);
    gate_up_names.push_back(ep + chosen->gate + ".weight");
    gate_up_names.push_back(ep + chosen->up + ".weight");
    down_names.push_back(ep + chosen->down + ".weight");
  }
  SY_ASSIGN(Tensor gate_up, source.stacked(gate_up_names, {inter, hidden}));
  SY_ASSIGN(Tensor down, source.stacked(down_names, {hidden, inter}));
  // [E * 2, I, H] with gate, up alternating per expert == [E, 2I, H] gate rows then up rows.
  moe.gate_up = gate_up.reshaped({experts, 2 * inter, hidden});
  moe.down = down.reshaped({experts, hidden, inter});
  return Status::ok();
}

}  // namespace blocks
}  // namespace sy::model
