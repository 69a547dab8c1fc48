// qwen3_5_moe (Qwen3_5MoeForConditionalGeneration: the text model of its text_config, tensors
// under model.language_model.; Qwen3_5MoeForCausalLM / qwen3_5_moe_text: flat, under model.):
// layer_types mixes gated DeltaNet linear attention and gated full attention (q_proj emits query
// and output gate per head, zero-centred per-head q/k norms, partial rotary); every layer MoE,
// softmax -> top-k -> always renormalised, plus a shared expert scaled by sigmoid(x . gate);
// the decoder's RMSNorms are zero-centred (weight stored w, applied as 1 + w), the DeltaNet's
// output norm is not. Multi-token-prediction (mtp.*) and vision tensors are not loaded.
#include <cmath>

#include <fmt/format.h>

#include "model/architecture.h"
#include "model/config_json.h"

namespace sy::model {

using namespace config_json;

namespace {

// transformers' Qwen3_5MoeForConditionalGeneration nests the text model under language_model.
std::string weight_prefix(const ModelConfig& c) {
  return c.architecture == "Qwen3_5MoeForConditionalGeneration" ? "model.language_model."
                                                                : "model.";
}

}  // namespace

Status parse_qwen3_5_moe(const nlohmann::json& json, ModelConfig& c) {
  // transformers' defaults where a field is absent (Qwen3_5MoeTextConfig).
  if (!json.contains("head_dim") || json["head_dim"].is_null()) c.head_dim = 256;
  SY_ASSIGN(c.moe_intermediate_size, get_int(json, {"moe_intermediate_size"}, false, 512));
  SY_ASSIGN(c.shared_expert_intermediate_size,
            get_int(json, {"shared_expert_intermediate_size"}, false, 512));
  SY_ASSIGN(c.num_experts, get_int(json, {"num_experts", "num_local_experts"}, false, 256));
  SY_ASSIGN(c.experts_per_token, get_int(json, {"num_experts_per_tok"}, false, 8));
  SY_ASSIGN(c.attention_bias, get_bool(json, "attention_bias", false));
  c.norm_topk_prob = true;  // Qwen3_5MoeTopKRouter always renormalises

  LinearAttentionSpec& lin = c.linear_attention;
  SY_ASSIGN(lin.conv_kernel, get_int(json, {"linear_conv_kernel_dim"}, false, 4));
  SY_ASSIGN(lin.key_head_dim, get_int(json, {"linear_key_head_dim"}, false, 128));
  SY_ASSIGN(lin.value_head_dim, get_int(json, {"linear_value_head_dim"}, false, 128));
  SY_ASSIGN(lin.num_key_heads, get_int(json, {"linear_num_key_heads"}, false, 16));
  SY_ASSIGN(lin.num_value_heads, get_int(json, {"linear_num_value_heads"}, false, 32));
  SY_TRY(require_positive("linear_conv_kernel_dim", lin.conv_kernel));
  SY_TRY(require_positive("linear_key_head_dim", lin.key_head_dim));
  SY_TRY(require_positive("linear_value_head_dim", lin.value_head_dim));
  SY_TRY(require_positive("linear_num_key_heads", lin.num_key_heads));
  SY_TRY(require_positive("linear_num_value_heads", lin.num_value_heads));
  if (lin.num_value_heads % lin.num_key_heads)
    return Status::errorf(
        "config.json: linear_num_value_heads ({}) must be a multiple of linear_num_key_heads ({})",
        lin.num_value_heads, lin.num_key_heads);
  if (lin.conv_kernel > 64 || lin.key_head_dim > 4096 || lin.value_head_dim > 4096)
    return Status::error("config.json: linear attention dims are implausibly large");

  // Partial rotary: rope_parameters.partial_rotary_factor (transformers 5) or the top-level key
  // (older configs); transformers' default is 0.25. Rotated dims: int(head_dim * factor).
  double partial = 0.25;
  SY_ASSIGN(partial, get_number(json, "partial_rotary_factor", partial));
  if (auto it = json.find("rope_parameters"); it != json.end() && it->is_object()) {
    SY_ASSIGN(partial, get_number(*it, "partial_rotary_factor", partial));
  }
  const int64_t rotary_dim = partial > 0.0 && partial <= 1.0
                                 ? static_cast<int64_t>(static_cast<double>(c.head_dim) * partial)
                                 : 0;
  if (rotary_dim < 2 || rotary_dim % 2)
    return Status::errorf(
        "config.json: partial_rotary_factor {} gives {} rotated dims of head_dim {}; need an even "
        "number >= 2",
        partial, rotary_dim, c.head_dim);
  if (c.rope_scaling.kind != RopeKind::kDefault)
    return Status::error(
        "config.json: qwen3_5_moe supports only default RoPE (mrope with text "
        "positions is plain RoPE)");

  // layer_types, or transformers' default: every full_attention_interval-th layer full.
  std::vector<bool> linear(static_cast<size_t>(c.num_hidden_layers));
  if (auto it = json.find("layer_types"); it != json.end() && !it->is_null()) {
    if (!it->is_array() || static_cast<int64_t>(it->size()) != c.num_hidden_layers)
      return Status::errorf("config.json: layer_types must list {} layer types",
                            c.num_hidden_layers);
    for (size_t i = 0; i < it->size(); ++i) {
      const auto& type = (*it)[i];
      if (type == "linear_attention")
        linear[i] = true;
      else if (type != "full_attention")
        return Status::errorf(
            "config.json: layer_types[{}] is {}; supported: linear_attention, full_attention", i,
            type.dump());
    }
  } else {
    SY_ASSIGN(int64_t interval, get_int(json, {"full_attention_interval"}, false, 4));
    SY_TRY(require_positive("full_attention_interval", interval));
    for (int64_t i = 0; i < c.num_hidden_layers; ++i)
      linear[static_cast<size_t>(i)] = (i + 1) % interval != 0;
  }
  for (int layer = 0; layer < c.num_hidden_layers; ++layer) {
    LayerSpec spec;
    if (linear[static_cast<size_t>(layer)]) {
      spec.attention.linear = true;
    } else {
      spec.attention.qkv_bias = c.attention_bias;
      spec.attention.qk_norm = QkNorm::kPerHead;
      spec.attention.output_gate = true;
      spec.attention.rotary_dim = rotary_dim;
    }
    spec.mlp = MlpKind::kMoe;
    spec.shared_expert = spec.shared_expert_gate = true;
    c.layers.push_back(spec);
  }
  c.router.num_experts = c.num_experts;
  c.router.top_k = c.experts_per_token;
  c.router.scoring = moe::RouterScoring::kSoftmax;
  c.router.renormalize = true;
  return Status::ok();
}

Result<DecoderWeights> build_qwen3_5_moe(const ModelConfig& c, WeightSource& source) {
  const std::string root = weight_prefix(c);
  const int64_t hidden = c.hidden_size, heads = c.num_attention_heads, hd = c.head_dim,
                kv_out = c.num_key_value_heads * c.head_dim;
  const LinearAttentionSpec& lin = c.linear_attention;
  DecoderWeights w;
  SY_ASSIGN(w.embed_tokens, source.get(root + "embed_tokens.weight", {c.vocab_size, hidden}));
  SY_ASSIGN(w.final_norm, source.zero_centred_norm(root + "norm.weight", {hidden}));
  if (c.tie_word_embeddings && !source.has("lm_head.weight")) {
    w.lm_head = w.embed_tokens;
  } else {
    SY_ASSIGN(w.lm_head, source.get("lm_head.weight", {c.vocab_size, hidden}));
  }
  for (int layer = 0; layer < c.num_hidden_layers; ++layer) {
    const std::string p = fmt::format("{}layers.{}.", root, layer);
    const LayerSpec& spec = c.layers[static_cast<size_t>(layer)];
    LayerWeights lw;
    SY_ASSIGN(lw.input_norm, source.zero_centred_norm(p + "input_layernorm.weight", {hidden}));
    SY_ASSIGN(lw.post_attention_norm,
              source.zero_centred_norm(p + "post_attention_layernorm.weight", {hidden}));
    if (spec.attention.linear) {
      LinearAttentionWeights& la = lw.linear_attention;
      const std::string a = p + "linear_attn.";
      SY_ASSIGN(la.in_proj_qkv, source.get(a + "in_proj_qkv.weight", {lin.conv_dim(), hidden}));
      SY_ASSIGN(la.in_proj_z, source.get(a + "in_proj_z.weight", {lin.value_dim(), hidden}));
      SY_ASSIGN(la.in_proj_b, source.get(a + "in_proj_b.weight", {lin.num_value_heads, hidden}));
      SY_ASSIGN(la.in_proj_a, source.get(a + "in_proj_a.weight", {lin.num_value_heads, hidden}));
      SY_ASSIGN(la.conv1d, source.get(a + "conv1d.weight", {lin.conv_dim(), 1, lin.conv_kernel}));
      SY_ASSIGN(la.a_log, source.get(a + "A_log", {lin.num_value_heads}));
      SY_ASSIGN(la.dt_bias, source.get(a + "dt_bias", {lin.num_value_heads}));
      SY_ASSIGN(la.norm, source.get(a + "norm.weight", {lin.value_head_dim}));
      SY_ASSIGN(la.out_proj, source.get(a + "out_proj.weight", {hidden, lin.value_dim()}));
    } else {
      AttentionWeights& at = lw.attention;
      const std::string a = p + "self_attn.";
      // q_proj: per head the query's head_dim rows, then the output gate's.
      SY_ASSIGN(at.q_proj, source.get(a + "q_proj.weight", {heads * 2 * hd, hidden}));
      SY_ASSIGN(at.k_proj, source.get(a + "k_proj.weight", {kv_out, hidden}));
      SY_ASSIGN(at.v_proj, source.get(a + "v_proj.weight", {kv_out, hidden}));
      SY_ASSIGN(at.o_proj, source.get(a + "o_proj.weight", {hidden, heads * hd}));
      if (spec.attention.qkv_bias) {
        SY_ASSIGN(at.q_bias, source.get(a + "q_proj.bias", {heads * 2 * hd}));
        SY_ASSIGN(at.k_bias, source.get(a + "k_proj.bias", {kv_out}));
        SY_ASSIGN(at.v_bias, source.get(a + "v_proj.bias", {kv_out}));
        SY_ASSIGN(at.o_bias, source.get(a + "o_proj.bias", {hidden}));
      }
      SY_ASSIGN(at.q_norm, source.zero_centred_norm(a + "q_norm.weight", {hd}));
      SY_ASSIGN(at.k_norm, source.zero_centred_norm(a + "k_norm.weight", {hd}));
    }
    lw.is_moe = true;
    SY_TRY(blocks::routed_experts(c, p, {{"mlp.", "gate_proj", "up_proj", "down_proj"}}, source,
                                  lw.moe));
    SY_TRY(blocks::dense_mlp(c, p + "mlp.shared_expert.", c.shared_expert_intermediate_size, source,
                             lw.shared_expert));
    SY_ASSIGN(lw.shared_expert_gate, source.get(p + "mlp.shared_expert_gate.weight", {1, hidden}));
    w.layers.push_back(std::move(lw));
  }
  SY_TRY(source.finish());
  return w;
}

}  // namespace sy::model
