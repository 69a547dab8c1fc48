#include "model/presets.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include <xxhash.h>

#include "model/architecture.h"
#include "model/config.h"
#include "model/safetensors.h"

namespace sy::model {
namespace {

using nlohmann::json;

json qwen3_30b_a3b() {
  // The published Qwen/Qwen3-30B-A3B config.json (transformers 4 spellings).
  return json{{"architectures", {"Qwen3MoeForCausalLM"}},
              {"attention_bias", false},
              {"attention_dropout", 0.0},
              {"bos_token_id", 151643},
              {"decoder_sparse_step", 1},
              {"eos_token_id", 151645},
              {"head_dim", 128},
              {"hidden_act", "silu"},
              {"hidden_size", 2048},
              {"initializer_range", 0.02},
              {"intermediate_size", 6144},
              {"max_position_embeddings", 40960},
              {"max_window_layers", 48},
              {"mlp_only_layers", json::array()},
              {"model_type", "qwen3_moe"},
              {"moe_intermediate_size", 768},
              {"norm_topk_prob", true},
              {"num_attention_heads", 32},
              {"num_experts", 128},
              {"num_experts_per_tok", 8},
              {"num_hidden_layers", 48},
              {"num_key_value_heads", 4},
              {"output_router_logits", false},
              {"rms_norm_eps", 1e-06},
              {"rope_scaling", nullptr},
              {"rope_theta", 1000000.0},
              {"router_aux_loss_coef", 0.001},
              {"sliding_window", nullptr},
              {"tie_word_embeddings", false},
              {"torch_dtype", "bfloat16"},
              {"transformers_version", "4.51.0"},
              {"use_cache", true},
              {"use_sliding_window", false},
              {"vocab_size", 151936}};
}

json tiny() {
  // Qwen3 tokenizer's vocabulary; 4 layers, layer 1 dense (mlp_only_layers), head_dim set apart
  // from hidden/heads, GQA 4:2, 32 experts top-4 (uint8 routes on the wire).
  json config = qwen3_30b_a3b();
  config["hidden_size"] = 64;
  config["head_dim"] = 32;
  config["num_attention_heads"] = 4;
  config["num_key_value_heads"] = 2;
  config["intermediate_size"] = 128;
  config["moe_intermediate_size"] = 32;
  config["num_experts"] = 32;
  config["num_experts_per_tok"] = 4;
  config["num_hidden_layers"] = 4;
  config["max_window_layers"] = 4;
  config["mlp_only_layers"] = json::array({1});
  return config;
}

// The other families' tiny presets: the Qwen3 tokenizer's vocabulary (make-model copies it),
// dimensions that are not multiples of 16 where the family allows, and each family's own blocks.
json tiny_mixtral() {
  // Published Mixtral-8x7B config.json spellings (transformers 4), shrunk; a sliding window of
  // 20 so prompts longer than that exercise it.
  return json{{"architectures", {"MixtralForCausalLM"}},
              {"attention_dropout", 0.0},
              {"bos_token_id", 151643},
              {"eos_token_id", 151645},
              {"hidden_act", "silu"},
              {"hidden_size", 72},
              {"initializer_range", 0.02},
              {"intermediate_size", 40},
              {"max_position_embeddings", 4096},
              {"model_type", "mixtral"},
              {"num_attention_heads", 4},
              {"num_experts_per_tok", 2},
              {"num_hidden_layers", 3},
              {"num_key_value_heads", 2},
              {"num_local_experts", 8},
              {"output_router_logits", false},
              {"rms_norm_eps", 1e-05},
              {"rope_theta", 1000000.0},
              {"router_aux_loss_coef", 0.02},
              {"sliding_window", 20},
              {"tie_word_embeddings", false},
              {"torch_dtype", "bfloat16"},
              {"transformers_version", "4.36.0"},
              {"use_cache", true},
              {"vocab_size", 151936}};
}

json mixtral_8x7b() {
  // mistralai/Mixtral-8x7B-v0.1's dimensions as published (32 layers, hidden 4096, 8 experts top-2
  // of width 14336, 32 query heads of 128 over 8 KV heads, no sliding window, rope_theta 1e6,
  // vocabulary 32,000), on the tiny preset's spellings: for --config-only folders that
  // --random-weights builds on a GPU. Its 93 GB of bf16 do not fit one GPU with room for KV:
  // issue 13 benches the 16-layer cut (--layers 16).
  json config = tiny_mixtral();
  config["hidden_size"] = 4096;
  config["intermediate_size"] = 14336;
  config["num_attention_heads"] = 32;
  config["num_key_value_heads"] = 8;
  config["num_hidden_layers"] = 32;
  config["max_position_embeddings"] = 32768;
  config["sliding_window"] = nullptr;
  config["vocab_size"] = 32000;
  config["bos_token_id"] = 1;
  config["eos_token_id"] = 2;
  return config;
}

json tiny_olmoe() {
  // Published OLMoE-1B-7B-0924 spellings, shrunk.
  return json{{"architectures", {"OlmoeForCausalLM"}},
              {"attention_bias", false},
              {"attention_dropout", 0.0},
              {"bos_token_id", 151643},
              {"clip_qkv", nullptr},
              {"eos_token_id", 151645},
              {"hidden_act", "silu"},
              {"hidden_size", 72},
              {"initializer_range", 0.02},
              {"intermediate_size", 24},
              {"max_position_embeddings", 4096},
              {"model_type", "olmoe"},
              {"norm_topk_prob", false},
              {"num_attention_heads", 6},
              {"num_experts", 16},
              {"num_experts_per_tok", 4},
              {"num_hidden_layers", 3},
              {"num_key_value_heads", 6},
              {"output_router_logits", false},
              {"rms_norm_eps", 1e-05},
              {"rope_scaling", nullptr},
              {"rope_theta", 10000.0},
              {"router_aux_loss_coef", 0.01},
              {"tie_word_embeddings", false},
              {"torch_dtype", "bfloat16"},
              {"transformers_version", "4.43.0"},
              {"use_cache", true},
              {"vocab_size", 151936}};
}

json tiny_qwen2_moe() {
  // Published Qwen1.5-MoE-A2.7B spellings, shrunk; layer 1 dense (mlp_only_layers), sliding
  // window on layer 0 (layer_types, as transformers 5 writes them).
  return json{{"architectures", {"Qwen2MoeForCausalLM"}},
              {"attention_dropout", 0.0},
              {"bos_token_id", 151643},
              {"decoder_sparse_step", 1},
              {"eos_token_id", 151645},
              {"hidden_act", "silu"},
              {"hidden_size", 72},
              {"initializer_range", 0.02},
              {"intermediate_size", 88},
              {"max_position_embeddings", 4096},
              {"max_window_layers", 3},
              {"mlp_only_layers", {1}},
              {"model_type", "qwen2_moe"},
              {"moe_intermediate_size", 24},
              {"norm_topk_prob", false},
              {"num_attention_heads", 4},
              {"num_experts", 12},
              {"num_experts_per_tok", 3},
              {"num_hidden_layers", 3},
              {"num_key_value_heads", 2},
              {"output_router_logits", false},
              {"qkv_bias", true},
              {"rms_norm_eps", 1e-06},
              {"rope_theta", 1000000.0},
              {"router_aux_loss_coef", 0.001},
              {"shared_expert_intermediate_size", 56},
              {"sliding_window", 20},
              {"layer_types", {"sliding_attention", "full_attention", "full_attention"}},
              {"tie_word_embeddings", false},
              {"torch_dtype", "bfloat16"},
              {"transformers_version", "4.40.0"},
              {"use_cache", true},
              {"use_sliding_window", true},
              {"vocab_size", 151936}};
}

json tiny_gpt_oss() {
  // The published gpt-oss-20b config.json spellings, shrunk: MXFP4 experts (hidden 64 and expert
  // width 96: multiples of 32, and no two of H, I, 2I equal, so a transposed bf16 expert tensor
  // cannot pass the shape checks), head_dim 24 and 5 query heads (q width 120, not a multiple of 16) over
  // one KV head, 6 experts top-2, a sliding window of 20 on alternate layers, YaRN over an
  // original context of 32 so short prompts reach the interpolated frequencies.
  return json{{"architectures", {"GptOssForCausalLM"}},
              {"attention_bias", true},
              {"attention_dropout", 0.0},
              {"bos_token_id", 151643},
              {"eos_token_id", 151645},
              {"experts_per_token", 2},
              {"head_dim", 24},
              {"hidden_act", "silu"},
              {"hidden_size", 64},
              {"initial_context_length", 32},
              {"initializer_range", 0.02},
              {"intermediate_size", 96},
              {"layer_types", {"sliding_attention", "full_attention", "sliding_attention"}},
              // = YaRN factor x original context (transformers 4.5x derive the factor so).
              {"max_position_embeddings", 256},
              {"model_type", "gpt_oss"},
              {"num_attention_heads", 5},
              {"num_experts_per_tok", 2},
              {"num_hidden_layers", 3},
              {"num_key_value_heads", 1},
              {"num_local_experts", 6},
              {"output_router_logits", false},
              {"quantization_config",
               {{"modules_to_not_convert",
                 {"model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
                  "lm_head"}},
                {"quant_method", "mxfp4"}}},
              {"rms_norm_eps", 1e-05},
              {"rope_scaling",
               {{"beta_fast", 32.0},
                {"beta_slow", 1.0},
                {"factor", 8.0},
                {"original_max_position_embeddings", 32},
                {"rope_type", "yarn"},
                {"truncate", false}}},
              {"rope_theta", 150000},
              {"router_aux_loss_coef", 0.9},
              {"sliding_window", 20},
              {"swiglu_limit", 7.0},
              {"tie_word_embeddings", false},
              {"torch_dtype", "bfloat16"},
              {"transformers_version", "4.55.0"},
              {"use_cache", true},
              {"vocab_size", 151936}};
}

json gpt_oss_20b() {
  // openai/gpt-oss-20b's dimensions as published (24 layers alternating sliding window 128 and
  // full attention, hidden and expert width 2880, 64 query heads of 64 over 8 KV heads, 32 MXFP4
  // experts top-4, YaRN 32x over 4,096, vocabulary 201,088), on the tiny preset's spellings: for
  // --config-only folders that --random-weights builds on a GPU (step_bench).
  json config = tiny_gpt_oss();
  config["hidden_size"] = 2880;
  config["intermediate_size"] = 2880;
  config["head_dim"] = 64;
  config["num_attention_heads"] = 64;
  config["num_key_value_heads"] = 8;
  config["num_hidden_layers"] = 24;
  config["num_local_experts"] = 32;
  config["num_experts_per_tok"] = 4;
  config["experts_per_token"] = 4;
  config["sliding_window"] = 128;
  config["initial_context_length"] = 4096;
  config["max_position_embeddings"] = 131072;
  config["rope_scaling"]["factor"] = 32.0;
  config["rope_scaling"]["original_max_position_embeddings"] = 4096;
  config["vocab_size"] = 201088;
  config["bos_token_id"] = 199998;
  config["eos_token_id"] = 200002;
  config["pad_token_id"] = 199999;
  json types = json::array();
  for (int layer = 0; layer < 24; ++layer) types.push_back(layer % 2 ? "full_attention" : "sliding_attention");
  config["layer_types"] = types;
  return config;
}

json tiny_deepseek_v3() {
  // The published DeepSeek-V3 config.json spellings, shrunk: hidden 72, 3 heads, q through a
  // rank-40 path, kv latent of rank 24 (the ranks differ so a swapped q/kv tensor fails the
  // shape checks), q/k heads of 12 nope + 10 rope dims, v heads of 14 (no two alike, none a
  // multiple of 16); layer 0 dense (first_k_dense_replace), layers 1-3 MoE with 12 experts in 4
  // groups, 2 groups kept, top-3, 2 shared experts; YaRN over an original context of 32 with
  // mscale != mscale_all_dim, so both the cos/sin factor and the softmax scale's correction
  // matter.
  return json{{"architectures", {"DeepseekV3ForCausalLM"}},
              {"attention_bias", false},
              {"attention_dropout", 0.0},
              {"bos_token_id", 151643},
              {"eos_token_id", 151645},
              {"first_k_dense_replace", 1},
              {"hidden_act", "silu"},
              {"hidden_size", 72},
              {"initializer_range", 0.02},
              {"intermediate_size", 88},
              {"kv_lora_rank", 24},
              {"max_position_embeddings", 128},
              {"model_type", "deepseek_v3"},
              {"moe_intermediate_size", 20},
              {"moe_layer_freq", 1},
              {"n_group", 4},
              {"n_routed_experts", 12},
              {"n_shared_experts", 2},
              {"norm_topk_prob", true},
              {"num_attention_heads", 3},
              {"num_experts_per_tok", 3},
              {"num_hidden_layers", 4},
              {"num_key_value_heads", 3},
              {"num_nextn_predict_layers", 0},
              {"q_lora_rank", 40},
              {"qk_nope_head_dim", 12},
              {"qk_rope_head_dim", 10},
              {"rms_norm_eps", 1e-06},
              {"rope_interleave", true},
              {"rope_scaling",
               {{"beta_fast", 32.0},
                {"beta_slow", 1.0},
                {"factor", 4.0},
                {"mscale", 1.0},
                {"mscale_all_dim", 0.8},
                {"original_max_position_embeddings", 32},
                {"rope_type", "yarn"}}},
              {"rope_theta", 10000.0},
              {"routed_scaling_factor", 2.5},
              {"scoring_func", "sigmoid"},
              {"tie_word_embeddings", false},
              {"topk_group", 2},
              {"topk_method", "noaux_tc"},
              {"torch_dtype", "bfloat16"},
              {"transformers_version", "4.57.0"},
              {"use_cache", true},
              {"v_head_dim", 14},
              {"vocab_size", 151936}};
}

json tiny_qwen3_5_moe() {
  // The published Qwen3.5-MoE layout (Qwen3_5MoeForConditionalGeneration: the text model in
  // text_config, tensors under model.language_model.), shrunk: hidden 72; layers linear, linear,
  // full, linear; full attention 4 query / 2 KV heads of 24 with output gate and partial rotary
  // 0.25 (6 of 24 dims); DeltaNet 2 key heads of 12 and 4 value heads of 10 (each key head
  // serves two value heads), conv kernel 4; 10 experts top-3 of width 20 and a shared expert of
  // 28. No dimension is a multiple of 16 and no two head sizes are equal.
  json text{{"architectures", {"Qwen3_5MoeForCausalLM"}},
            {"attention_bias", false},
            {"attention_dropout", 0.0},
            {"bos_token_id", 151643},
            {"dtype", "bfloat16"},
            {"eos_token_id", 151645},
            {"head_dim", 24},
            {"hidden_act", "silu"},
            {"hidden_size", 72},
            {"initializer_range", 0.02},
            {"layer_types",
             {"linear_attention", "linear_attention", "full_attention", "linear_attention"}},
            {"linear_conv_kernel_dim", 4},
            {"linear_key_head_dim", 12},
            {"linear_num_key_heads", 2},
            {"linear_num_value_heads", 4},
            {"linear_value_head_dim", 10},
            {"max_position_embeddings", 4096},
            {"model_type", "qwen3_5_moe_text"},
            {"moe_intermediate_size", 20},
            {"num_attention_heads", 4},
            {"num_experts", 10},
            {"num_experts_per_tok", 3},
            {"num_hidden_layers", 4},
            {"num_key_value_heads", 2},
            {"rms_norm_eps", 1e-06},
            {"rope_parameters",
             {{"mrope_interleaved", true},
              {"mrope_section", {1, 1, 1}},
              {"partial_rotary_factor", 0.25},
              {"rope_theta", 10000000.0},
              {"rope_type", "default"}}},
            {"router_aux_loss_coef", 0.001},
            {"shared_expert_intermediate_size", 28},
            {"tie_word_embeddings", false},
            {"use_cache", true},
            {"vocab_size", 151936}};
  return json{{"architectures", {"Qwen3_5MoeForConditionalGeneration"}},
              {"model_type", "qwen3_5_moe"},
              {"text_config", text},
              {"tie_word_embeddings", false},
              {"transformers_version", "5.2.0"}};
}

json moonlight_16b_a3b() {
  // moonshotai/Moonlight-16B-A3B's config.json (the DeepSeek-V3 architecture: 27 layers, the
  // first dense, hidden 2048, 16 heads of 128 nope + 64 rope dims over a kv latent of rank 512,
  // no q low-rank path, v heads of 128; 64 experts of 1408 top-6 with 2 shared, sigmoid router
  // with one group and routed_scaling_factor 2.446, rope_theta 50000 without YaRN, vocabulary
  // 163,840), on the tiny preset's spellings: for --config-only folders that --random-weights
  // builds on a GPU (step_bench).
  json config = tiny_deepseek_v3();
  config["bos_token_id"] = 163584;
  config["eos_token_id"] = 163586;
  config["hidden_size"] = 2048;
  config["intermediate_size"] = 11264;
  config["kv_lora_rank"] = 512;
  config["max_position_embeddings"] = 8192;
  config["moe_intermediate_size"] = 1408;
  config["n_group"] = 1;
  config["n_routed_experts"] = 64;
  config["n_shared_experts"] = 2;
  config["num_attention_heads"] = 16;
  config["num_experts_per_tok"] = 6;
  config["num_hidden_layers"] = 27;
  config["num_key_value_heads"] = 16;
  config["q_lora_rank"] = nullptr;
  config["qk_nope_head_dim"] = 128;
  config["qk_rope_head_dim"] = 64;
  config["rms_norm_eps"] = 1e-05;
  config["rope_scaling"] = nullptr;
  config["rope_theta"] = 50000.0;
  config["routed_scaling_factor"] = 2.446;
  config["topk_group"] = 1;
  config["v_head_dim"] = 128;
  config["vocab_size"] = 163840;
  return config;
}

json qwen3_5_35b_a3b() {
  // Qwen3.5-35B-A3B's text model as issue 14 gives it (40 layers, three gated-DeltaNet layers to
  // one gated full-attention layer, hidden 2048; full attention 16 query / 2 KV heads of 256
  // with output gate and partial rotary 0.25; DeltaNet 16 key / 32 value heads of 128, conv
  // kernel 4; 256 experts of 512 top-8 and a shared expert of 512; vocabulary 248,320), on the
  // tiny preset's spellings: for --config-only folders (step_bench, throughput runs).
  json config = tiny_qwen3_5_moe();
  json& text = config["text_config"];
  json types = json::array();
  for (int layer = 0; layer < 40; ++layer)
    types.push_back(layer % 4 == 3 ? "full_attention" : "linear_attention");
  text["layer_types"] = types;
  text["head_dim"] = 256;
  text["hidden_size"] = 2048;
  text["linear_key_head_dim"] = 128;
  text["linear_num_key_heads"] = 16;
  text["linear_num_value_heads"] = 32;
  text["linear_value_head_dim"] = 128;
  text["max_position_embeddings"] = 262144;
  text["moe_intermediate_size"] = 512;
  text["num_attention_heads"] = 16;
  text["num_experts"] = 256;
  text["num_experts_per_tok"] = 8;
  text["num_hidden_layers"] = 40;
  text["num_key_value_heads"] = 2;
  text["shared_expert_intermediate_size"] = 512;
  text["vocab_size"] = 248320;
  text["rope_parameters"]["mrope_section"] = {11, 11, 10};
  return config;
}

json tiny_glm4_moe() {
  // The published GLM-4.5-Air config.json spellings (transformers 4.54), shrunk: hidden 72, 6
  // query heads of 20 over 2 KV heads (q width 120: no multiple of 16), partial rotary 0.5 (RoPE
  // on the first 10 dims of each head), q/k/v biases and q/k norm (GLM-4.5's; Air has no norm),
  // layer 0 dense, layers 1-2 MoE with 12 experts top-3 and one shared expert,
  // routed_scaling_factor 2.5 (GLM-4.5's), rope_theta 10000 so a short prompt turns every
  // rotary pair; one multi-token-prediction layer whose tensors make-model writes (index 3) and
  // the loader leaves alone.
  return json{{"architectures", {"Glm4MoeForCausalLM"}},
              {"attention_bias", true},
              {"attention_dropout", 0.0},
              {"bos_token_id", 151643},
              {"eos_token_id", 151645},
              {"first_k_dense_replace", 1},
              {"head_dim", 20},
              {"hidden_act", "silu"},
              {"hidden_size", 72},
              {"initializer_range", 0.02},
              {"intermediate_size", 88},
              {"max_position_embeddings", 4096},
              {"model_type", "glm4_moe"},
              {"moe_intermediate_size", 20},
              {"n_group", 1},
              {"n_routed_experts", 12},
              {"n_shared_experts", 1},
              {"norm_topk_prob", true},
              {"num_attention_heads", 6},
              {"num_experts_per_tok", 3},
              {"num_hidden_layers", 3},
              {"num_key_value_heads", 2},
              {"num_nextn_predict_layers", 1},
              {"partial_rotary_factor", 0.5},
              {"rms_norm_eps", 1e-05},
              {"rope_scaling", nullptr},
              {"rope_theta", 10000.0},
              {"routed_scaling_factor", 2.5},
              {"tie_word_embeddings", false},
              {"topk_group", 1},
              {"torch_dtype", "bfloat16"},
              {"transformers_version", "4.54.0"},
              {"use_cache", true},
              {"use_qk_norm", true},
              {"vocab_size", 151936}};
}

// The tensors of `num_nextn_predict_layers` multi-token-prediction layers (DeepSeek-V3, GLM):
// layer num_hidden_layers + i is a decoder layer of its own plus eh_proj, enorm, hnorm and
// shared_head.norm (the vocabulary-sized shared_head.head and embed_tokens some checkpoints
// also hold are left out: they only make the file bigger). The loader never reads them.
Result<std::vector<TensorSpec>> mtp_tensors(const json& config, const Architecture& arch) {
  std::vector<TensorSpec> specs;
  auto it = config.find("num_nextn_predict_layers");
  if (it == config.end() || !it->is_number_integer() || it->get<int64_t>() <= 0) return specs;
  const int64_t layers = config["num_hidden_layers"].get<int64_t>(), extra = it->get<int64_t>();
  json deeper = config;
  deeper["num_hidden_layers"] = layers + extra;
  SY_ASSIGN(ModelConfig c, parse_model_config(deeper));
  TensorListSource listing;
  auto declared = arch.build(c, listing);
  if (!declared) return declared.status();
  const int64_t H = c.hidden_size;
  for (int64_t layer = layers; layer < layers + extra; ++layer) {
    const std::string p = "model.layers." + std::to_string(layer) + ".";
    for (const TensorSpec& spec : listing.tensors())
      if (spec.name.starts_with(p)) specs.push_back(spec);
    specs.push_back({p + "eh_proj.weight", DType::kBF16, {H, 2 * H}});
    for (const char* norm : {"enorm.weight", "hnorm.weight", "shared_head.norm.weight"})
      specs.push_back({p + norm, DType::kBF16, {H}});
  }
  return specs;
}

// Deterministic per-tensor random numbers: xoshiro-style generator seeded from (seed, name).
struct Rng {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Approximately normal: sum of 4 uniforms, scaled to unit variance.
  float normal() {
    float sum = 0.0f;
    for (int i = 0; i < 4; ++i) sum += static_cast<float>(next() >> 40) * (1.0f / 16777216.0f);
    return (sum - 2.0f) * 1.7320508f;
  }
};

float init_std(const std::string& name, const ModelConfig& config) {
  if (is_router_weight(name))
    return 3.0f / std::sqrt(static_cast<float>(config.hidden_size));  // decisive routing
  // DeepSeek-V3's correction bias, large enough beside the sigmoid scores to change selections.
  if (name.ends_with("e_score_correction_bias")) return 0.3f;
  // Qwen3.5's gated DeltaNet: conv taps large enough that the conv's output is not negligible,
  // and per-head decays (A_log, dt_bias) spread around exp(-softplus(0)) = 0.5.
  if (name.ends_with("conv1d.weight") || name.ends_with("A_log") || name.ends_with("dt_bias"))
    return 0.5f;
  return 0.02f;
}

}  // namespace

Result<json> preset_config(const std::string& arch, const std::string& preset, int layers) {
  json config;
  if (arch == "qwen3_moe") {
    if (preset == "tiny")
      config = tiny();
    else if (preset == "qwen3-30b-a3b")
      config = qwen3_30b_a3b();
    else
      return Status::errorf(
          "--preset '{}' is unknown for qwen3_moe (supported: tiny, qwen3-30b-a3b)", preset);
  } else if (arch == "mixtral" || arch == "olmoe" || arch == "qwen2_moe" || arch == "gpt_oss" ||
             arch == "deepseek_v3" || arch == "glm4_moe") {
    if (arch == "gpt_oss" && preset == "gpt-oss-20b")
      config = gpt_oss_20b();
    else if (arch == "mixtral" && preset == "mixtral-8x7b")
      config = mixtral_8x7b();
    else if (arch == "deepseek_v3" && preset == "moonlight-16b-a3b")
      config = moonlight_16b_a3b();
    else if (preset != "tiny")
      return Status::errorf("--preset '{}' is unknown for {} (supported: tiny{})", preset, arch,
                            arch == "gpt_oss"       ? ", gpt-oss-20b"
                            : arch == "deepseek_v3" ? ", moonlight-16b-a3b"
                            : arch == "mixtral"     ? ", mixtral-8x7b"
                                                    : "");
    else
      config = arch == "mixtral"     ? tiny_mixtral()
             : arch == "olmoe"       ? tiny_olmoe()
             : arch == "qwen2_moe"   ? tiny_qwen2_moe()
             : arch == "gpt_oss"     ? tiny_gpt_oss()
             : arch == "deepseek_v3" ? tiny_deepseek_v3()
                                     : tiny_glm4_moe();
  } else if (arch == "qwen3_5_moe") {
    if (preset == "qwen3.5-35b-a3b")
      config = qwen3_5_35b_a3b();
    else if (preset == "tiny")
      config = tiny_qwen3_5_moe();
    else
      return Status::errorf("--preset '{}' is unknown for {} (supported: tiny, qwen3.5-35b-a3b)",
                            preset, arch);
  } else {
    return Status::errorf(
        "--arch '{}' is not supported (supported: qwen3_moe, mixtral, olmoe, qwen2_moe, gpt_oss, "
        "deepseek_v3, glm4_moe, qwen3_5_moe)",
        arch);
  }
  // A multimodal wrapper's text model is in text_config.
  json& body = config.contains("text_config") ? config["text_config"] : config;
  if (layers > 0) {
    if (layers > body["num_hidden_layers"].get<int>())
      return Status::errorf("--layers {} is more than the preset's {}", layers,
                            body["num_hidden_layers"].get<int>());
    body["num_hidden_layers"] = layers;
    if (body.contains("max_window_layers")) body["max_window_layers"] = layers;
    if (body.contains("mlp_only_layers")) {
      json kept = json::array();
      for (const auto& layer : body["mlp_only_layers"])
        if (layer.get<int>() < layers) kept.push_back(layer);
      body["mlp_only_layers"] = kept;
    }
    if (body.contains("layer_types")) {
      json kept = json::array();
      for (int layer = 0; layer < layers; ++layer) kept.push_back(body["layer_types"][layer]);
      body["layer_types"] = kept;
    }
  }
  return config;
}

json preset_generation_config(const std::string&) {
  // Qwen3's published generation_config.json.
  return json{{"bos_token_id", 151643}, {"do_sample", true}, {"eos_token_id", {151645, 151643}},
              {"pad_token_id", 151643}, {"temperature", 0.6}, {"top_k", 20},
              {"top_p", 0.95}, {"transformers_version", "4.51.0"}};
}

Status write_random_checkpoint(const json& config_json, const json& generation_config,
                               const std::string& model_dir, uint64_t seed, bool show_progress) {
  SY_ASSIGN(ModelConfig c, parse_model_config(config_json));
  std::error_code ec;
  std::filesystem::create_directories(model_dir, ec);
  if (ec) return Status::errorf("{}: cannot create folder: {}", model_dir, ec.message());

  // The adapter declares every tensor; a listing source records names and shapes.
  SY_ASSIGN(const Architecture* arch, find_architecture(c.model_type, c.architecture));
  TensorListSource listing;
  auto declared = arch->build(c, listing);
  if (!declared) return declared.status();
  std::vector<TensorSpec> specs = listing.tensors();
  SY_ASSIGN(std::vector<TensorSpec> mtp, mtp_tensors(config_json, *arch));
  specs.insert(specs.end(), mtp.begin(), mtp.end());

  uint64_t total = 0, written = 0;
  for (const auto& spec : specs) {
    uint64_t n = dtype_size(spec.dtype);
    for (int64_t d : spec.shape) n *= static_cast<uint64_t>(d);
    total += n;
  }
  auto fill = [&](const TensorSpec& spec, uint8_t* out, size_t nbytes) {
    if (spec.dtype == DType::kU8) {
      // MXFP4: random codes in the blocks; scales 2^(117..120 - 127), weights ~ +-0.02.
      Rng rng{XXH64(spec.name.data(), spec.name.size(), seed)};
      const bool scales = listing.is_scales(spec.name);
      for (size_t i = 0; i < nbytes; ++i)
        out[i] =
            scales ? static_cast<uint8_t>(117 + rng.next() % 4) : static_cast<uint8_t>(rng.next());
      written += nbytes;
      return;
    }
    uint16_t* values = reinterpret_cast<uint16_t*>(out);
    const size_t count = nbytes / 2;
    // Zero-centred norms (applied as 1 + w) are stored near 0, the others near 1.
    const bool zero_centred = listing.is_zero_centred(spec.name);
    const bool is_norm = !zero_centred && spec.name.find("norm.weight") != std::string::npos;
    const float std_dev = init_std(spec.name, c);
    const uint64_t tensor_seed = XXH64(spec.name.data(), spec.name.size(), seed);
    // Split big tensors over threads; each chunk has its own stream so output is deterministic.
    const size_t chunk = 1 << 20;
    const size_t chunks = (count + chunk - 1) / chunk;
    const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
    std::vector<std::thread> workers;
    for (unsigned w = 0; w < threads; ++w)
      workers.emplace_back([&, w] {
        for (size_t ci = w; ci < chunks; ci += threads) {
          Rng rng{tensor_seed ^ (0x51afd6c3ull * (ci + 1))};
          for (size_t i = ci * chunk; i < std::min(count, (ci + 1) * chunk); ++i)
            values[i] = f32_to_bf16(is_norm        ? 1.0f + 0.1f * rng.normal()
                                    : zero_centred ? 0.1f * rng.normal()
                                                   : std_dev * rng.normal());
        }
      });
    for (auto& worker : workers) worker.join();
    written += nbytes;
    if (show_progress)
      std::fprintf(stderr, "\rwriting weights: %.1f / %.1f MB", written / 1e6, total / 1e6);
  };
  const uint64_t shard_bytes = total > (uint64_t{2} << 30) ? (uint64_t{2} << 30) : 0;
  SY_TRY(write_checkpoint(model_dir, specs, fill, shard_bytes));
  if (show_progress) std::fprintf(stderr, "\n");

  auto write_json = [&](const std::string& name, const json& value) -> Status {
    std::ofstream out(model_dir + "/" + name);
    out << value.dump(2) << "\n";
    if (!out) return Status::errorf("{}/{}: cannot write", model_dir, name);
    return Status::ok();
  };
  SY_TRY(write_json("config.json", config_json));
  SY_TRY(write_json("generation_config.json", generation_config));
  return Status::ok();
}

}  // namespace sy::model
