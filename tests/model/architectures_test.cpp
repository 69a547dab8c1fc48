// The architecture table and the decoder description: each family's config.json becomes the
// description it should, its make-model checkpoint loads and runs on the CPU, its blocks change
// the output the way they must (a sliding window hides what it should), and bad files are
// refused naming the field or tensor.
#include <gtest/gtest.h>

#include <unistd.h>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "model/architecture.h"
#include "model/decoder.h"
#include "model/presets.h"
#include "moe/router.h"

namespace sy::model {
namespace {

using nlohmann::json;

// The tensors a configuration's checkpoint holds (names, dtypes, shapes), as make-model lists them.
std::vector<TensorSpec> preset_tensors(const json& config) {
  auto c = parse_model_config(config);
  EXPECT_TRUE(c.is_ok()) << c.message();
  TensorListSource listing;
  auto arch = find_architecture(c->model_type, c->architecture);
  EXPECT_TRUE(arch.is_ok());
  EXPECT_TRUE((*arch)->build(*c, listing).is_ok());
  return listing.tensors();
}

json tiny(const std::string& arch) {
  auto config = preset_config(arch, "tiny", 0);
  EXPECT_TRUE(config.is_ok()) << config.message();
  return config.is_ok() ? *config : json{};
}

ModelConfig parsed(const json& config) {
  auto c = parse_model_config(config);
  EXPECT_TRUE(c.is_ok()) << c.message();
  return c.is_ok() ? *c : ModelConfig{};
}

// Sizes past 31 bits, a token id past int32 and a rotary factor far out of range are refused by
// name before any product of them is formed (the model fuzz target found each overflowing).
TEST(Architectures, OutOfRangeNumbersAreRefusedByName) {
  const std::pair<const char*, json> cases[] = {
      {"num_attention_heads", json(int64_t{1} << 62)},
      {"hidden_size", json(uint64_t{1} << 63)},
      {"num_attention_heads", json(-(int64_t{1} << 40))},
      {"eos_token_id", json(int64_t{1} << 40)},
      {"bos_token_id", json(-1)},
  };
  for (const auto& [field, value] : cases) {
    json config = tiny("qwen3_moe");
    config[field] = value;
    auto refused = parse_model_config(config);
    ASSERT_FALSE(refused.is_ok()) << field << " = " << value.dump();
    EXPECT_NE(refused.message().find(field), std::string::npos) << refused.message();
  }
  json eos_list = tiny("qwen3_moe");
  eos_list["eos_token_id"] = json::array({1, uint64_t{1} << 40});
  EXPECT_FALSE(parse_model_config(eos_list).is_ok());
  json qwen35 = tiny("qwen3_5_moe");
  json& body = qwen35.contains("text_config") ? qwen35["text_config"] : qwen35;
  body["rope_parameters"]["partial_rotary_factor"] = 1e20;
  auto refused = parse_model_config(qwen35);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.message().find("partial_rotary_factor"), std::string::npos)
      << refused.message();
  EXPECT_TRUE(parse_model_config(tiny("qwen3_moe")).is_ok());
}

TEST(Architectures, UnknownModelTypeListsEverySupportedOne) {
  auto c =
      parse_model_config(json{{"model_type", "llama"}, {"architectures", {"LlamaForCausalLM"}}});
  ASSERT_FALSE(c.is_ok());
  for (const Architecture& arch : architectures()) {
    EXPECT_NE(c.message().find(std::string(arch.model_type)), std::string::npos) << c.message();
    EXPECT_NE(c.message().find(std::string(arch.class_name)), std::string::npos) << c.message();
  }
  EXPECT_NE(c.message().find("llama"), std::string::npos);
}

TEST(Architectures, ClassNameAloneFindsTheAdapter) {
  json config = tiny("mixtral");
  config.erase("model_type");
  EXPECT_EQ(parsed(config).model_type, "mixtral");
}

TEST(Architectures, MixtralDescription) {
  const ModelConfig c = parsed(tiny("mixtral"));
  ASSERT_EQ(c.layers.size(), 3u);
  EXPECT_EQ(c.moe_layers(), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(c.num_experts, 8);
  EXPECT_EQ(c.moe_intermediate_size, 40) << "Mixtral's intermediate_size is the expert width";
  EXPECT_TRUE(c.router.renormalize);
  for (const LayerSpec& layer : c.layers) {
    EXPECT_EQ(layer.attention.sliding_window, 20);
    EXPECT_EQ(layer.attention.qk_norm, QkNorm::kNone);
    EXPECT_FALSE(layer.attention.qkv_bias);
    EXPECT_FALSE(layer.shared_expert);
  }
  json no_window = tiny("mixtral");
  no_window["sliding_window"] = nullptr;
  EXPECT_EQ(parsed(no_window).layers[0].attention.sliding_window, 0);
}

TEST(Architectures, OlmoeDescription) {
  const ModelConfig c = parsed(tiny("olmoe"));
  EXPECT_EQ(c.moe_layers(), (std::vector<int>{0, 1, 2}));
  EXPECT_FALSE(c.router.renormalize);
  for (const LayerSpec& layer : c.layers) {
    EXPECT_EQ(layer.attention.qk_norm, QkNorm::kWholeProjection);
    EXPECT_EQ(layer.attention.sliding_window, 0);
  }
  json clipped = tiny("olmoe");
  clipped["clip_qkv"] = 8.0;
  auto refused = parse_model_config(clipped);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.message().find("clip_qkv"), std::string::npos);
}

TEST(Architectures, Qwen2MoeDescription) {
  const ModelConfig c = parsed(tiny("qwen2_moe"));
  EXPECT_EQ(c.moe_layers(), (std::vector<int>{0, 2})) << "layer 1 is in mlp_only_layers";
  EXPECT_TRUE(c.layers[0].shared_expert && c.layers[0].shared_expert_gate);
  EXPECT_FALSE(c.layers[1].shared_expert);
  EXPECT_TRUE(c.layers[1].attention.qkv_bias);
  EXPECT_EQ(c.layers[0].attention.sliding_window, 20);
  EXPECT_EQ(c.layers[1].attention.sliding_window, 0);
  EXPECT_EQ(c.widest_dense_mlp(), 88);
  json off = tiny("qwen2_moe");
  off["use_sliding_window"] = false;
  EXPECT_EQ(parsed(off).layers[0].attention.sliding_window, 0)
      << "layer_types only count with the window on";
  json ambiguous = tiny("qwen2_moe");
  ambiguous.erase("layer_types");
  auto refused = parse_model_config(ambiguous);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.message().find("layer_types"), std::string::npos);
  json step = tiny("qwen2_moe");
  step["mlp_only_layers"] = json::array();
  step["decoder_sparse_step"] = 2;
  EXPECT_EQ(parsed(step).moe_layers(), (std::vector<int>{1}));
}

TEST(Architectures, GptOssDescription) {
  const ModelConfig c = parsed(tiny("gpt_oss"));
  ASSERT_EQ(c.layers.size(), 3u);
  EXPECT_EQ(c.moe_layers(), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(c.moe_intermediate_size, 96) << "gpt-oss's intermediate_size is the expert width";
  EXPECT_EQ(c.widest_dense_mlp(), 0);
  for (size_t i = 0; i < c.layers.size(); ++i) {
    EXPECT_TRUE(c.layers[i].attention.sinks);
    EXPECT_TRUE(c.layers[i].attention.qkv_bias);
    EXPECT_EQ(c.layers[i].attention.sliding_window, i == 1 ? 0 : 20) << "layer " << i;
  }
  EXPECT_TRUE(c.router.softmax_after_topk && c.router.has_logit_bias);
  EXPECT_FALSE(c.router.renormalize || c.router.has_selection_bias);
  EXPECT_EQ(c.experts.activation, moe::ExpertActivation::kClampedSwiGlu);
  EXPECT_EQ(c.experts.limit, 7.0f);
  EXPECT_TRUE(c.experts.has_biases);
  EXPECT_EQ(c.experts.format, moe::ExpertFormat::kMxfp4Interleaved)
      << "quantization_config decides";
  EXPECT_EQ(c.rope_scaling.kind, RopeKind::kYarn);
  EXPECT_EQ(c.rope_scaling.factor, 8.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 32);
  EXPECT_FALSE(c.rope_scaling.truncate);

  json bf16 = tiny("gpt_oss");
  bf16.erase("quantization_config");
  bf16["swiglu_limit"] = 5.5;
  const ModelConfig b = parsed(bf16);
  EXPECT_EQ(b.experts.format, moe::ExpertFormat::kTransposedInterleaved);
  EXPECT_EQ(b.experts.limit, 5.5f);
  json defaults = tiny("gpt_oss");
  defaults.erase("layer_types");
  defaults.erase("sliding_window");
  const ModelConfig d = parsed(defaults);
  EXPECT_EQ(d.layers[0].attention.sliding_window, 128) << "GptOssConfig's defaults";
  EXPECT_EQ(d.layers[1].attention.sliding_window, 0);
  EXPECT_EQ(d.layers[2].attention.sliding_window, 128);

  auto refused = [&](json config, const std::string& field) {
    auto c = parse_model_config(config);
    ASSERT_FALSE(c.is_ok()) << field;
    EXPECT_NE(c.message().find(field), std::string::npos) << c.message();
  };
  json other_quant = tiny("gpt_oss");
  other_quant["quantization_config"]["quant_method"] = "fp8";
  refused(other_quant, "quant_method");
  json odd = tiny("gpt_oss");
  odd["intermediate_size"] = 40;
  refused(odd, "multiple of 32");
  json no_original = tiny("gpt_oss");
  no_original["rope_scaling"].erase("original_max_position_embeddings");
  refused(no_original, "original_max_position_embeddings");
  json longrope = tiny("gpt_oss");
  longrope["rope_scaling"]["rope_type"] = "longrope";
  refused(longrope, "longrope");
  // transformers 5 spells it rope_parameters.
  json v5 = tiny("gpt_oss");
  v5["rope_parameters"] = v5["rope_scaling"];
  v5["rope_parameters"]["rope_theta"] = 150000;
  v5.erase("rope_scaling");
  EXPECT_EQ(parsed(v5).rope_scaling.kind, RopeKind::kYarn);
}

TEST(Architectures, Qwen3MoeDescriptionIsUnchanged) {
  const ModelConfig c = parsed(tiny("qwen3_moe"));
  EXPECT_EQ(c.moe_layers(), (std::vector<int>{0, 2, 3}));
  for (const LayerSpec& layer : c.layers) EXPECT_EQ(layer.attention.qk_norm, QkNorm::kPerHead);
  EXPECT_TRUE(c.router.renormalize);
  EXPECT_FALSE(c.router.uses_extended_options());
}

TEST(Architectures, DeepseekV3Description) {
  const ModelConfig c = parsed(tiny("deepseek_v3"));
  EXPECT_EQ(c.model_type, "deepseek_v3");
  ASSERT_EQ(c.layers.size(), 4u);
  EXPECT_EQ(c.layers[0].mlp, MlpKind::kDense) << "first_k_dense_replace 1";
  for (int layer = 1; layer < 4; ++layer) {
    EXPECT_EQ(c.layers[static_cast<size_t>(layer)].mlp, MlpKind::kMoe);
    EXPECT_TRUE(c.layers[static_cast<size_t>(layer)].shared_expert);
    EXPECT_FALSE(c.layers[static_cast<size_t>(layer)].shared_expert_gate);
  }
  for (const LayerSpec& layer : c.layers) EXPECT_TRUE(layer.attention.latent);
  EXPECT_EQ(c.head_dim, 22) << "nope 12 + rope 10";
  EXPECT_EQ(c.num_key_value_heads, c.num_attention_heads);
  EXPECT_EQ(c.rope_dim(), 10);
  EXPECT_EQ(c.latent_attention.q_lora_rank, 40);
  EXPECT_EQ(c.latent_attention.cache_row(), 34);
  EXPECT_TRUE(c.latent_attention.interleave);
  EXPECT_EQ(c.shared_expert_intermediate_size, 40) << "2 shared experts of 20";
  EXPECT_EQ(c.kv_cache_values_per_token(), 4 * 34) << "latent + k_pe per layer, not K/V";
  // Softmax scale: 1/sqrt(22) times yarn_mscale(4, 0.8)^2 = (0.1 * 0.8 * ln 4 + 1)^2.
  const double m = 0.1 * 0.8 * std::log(4.0) + 1.0;
  EXPECT_NEAR(c.attention_scale, m * m / std::sqrt(22.0), 1e-12);
  EXPECT_EQ(c.router.scoring, moe::RouterScoring::kSigmoid);
  EXPECT_TRUE(c.router.has_selection_bias);
  EXPECT_EQ(c.router.num_groups, 4);
  EXPECT_EQ(c.router.topk_groups, 2);
  EXPECT_EQ(c.router.group_scoring, moe::GroupScoring::kTopTwoSum);
  EXPECT_TRUE(c.router.renormalize);
  EXPECT_FLOAT_EQ(c.router.routed_scaling_factor, 2.5f);

  json variant = tiny("deepseek_v3");
  variant["q_lora_rank"] = nullptr;  // Moonlight / DeepSeek-V2-Lite: q_proj straight
  variant["moe_layer_freq"] = 2;
  variant["rope_scaling"] = nullptr;
  variant["model_type"] = "kimi_k2";
  const ModelConfig v = parsed(variant);
  EXPECT_EQ(v.model_type, "kimi_k2");
  EXPECT_EQ(v.latent_attention.q_lora_rank, 0);
  EXPECT_EQ(v.moe_layers(), (std::vector<int>{2})) << "layer >= 1 and layer % 2 == 0";
  EXPECT_NEAR(v.attention_scale, 1.0 / std::sqrt(22.0), 1e-12);
  bool q_proj = false;
  for (const TensorSpec& t : preset_tensors(variant)) {
    q_proj |= t.name == "model.layers.0.self_attn.q_proj.weight";
    EXPECT_EQ(t.name.find("q_a_proj"), std::string::npos) << t.name;
  }
  EXPECT_TRUE(q_proj);
  bool bias = false, kv_b = false;
  for (const TensorSpec& t : preset_tensors(tiny("deepseek_v3"))) {
    bias |= t.name == "model.layers.1.mlp.gate.e_score_correction_bias";
    if (t.name == "model.layers.0.self_attn.kv_b_proj.weight") {
      kv_b = true;
      EXPECT_EQ(t.shape, (std::vector<int64_t>{3 * (12 + 14), 24}));
    }
  }
  EXPECT_TRUE(bias && kv_b);

  // FP8 block-quantised checkpoints (tests/model/fp8_checkpoint_test.cpp loads them); other
  // quantisation methods are refused.
  json fp8 = tiny("deepseek_v3");
  fp8["quantization_config"] = {{"quant_method", "fp8"}, {"weight_block_size", {128, 128}}};
  const ModelConfig q = parsed(fp8);
  EXPECT_EQ(q.fp8_blocks.rows, 128);
  EXPECT_EQ(q.fp8_blocks.cols, 128);
  fp8["quantization_config"]["quant_method"] = "awq";
  auto refused = parse_model_config(fp8);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.message().find("awq"), std::string::npos) << refused.message();
}

TEST(Architectures, Glm4MoeDescription) {
  const ModelConfig c = parsed(tiny("glm4_moe"));
  EXPECT_EQ(c.model_type, "glm4_moe");
  ASSERT_EQ(c.layers.size(), 3u);
  EXPECT_EQ(c.moe_layers(), (std::vector<int>{1, 2})) << "first_k_dense_replace 1";
  for (const LayerSpec& layer : c.layers) {
    EXPECT_TRUE(layer.attention.qkv_bias);
    EXPECT_EQ(layer.attention.qk_norm, QkNorm::kPerHead);
    EXPECT_FALSE(layer.attention.latent);
    EXPECT_FALSE(layer.shared_expert_gate);
  }
  EXPECT_TRUE(c.layers[1].shared_expert && c.layers[2].shared_expert);
  EXPECT_EQ(c.head_dim, 20);
  EXPECT_EQ(c.rotary_dim, 10) << "int(20 x 0.5)";
  EXPECT_EQ(c.rope_dim(), 10);
  EXPECT_EQ(c.shared_expert_intermediate_size, 20);
  EXPECT_EQ(c.kv_cache_values_per_token(), 3 * 2 * 2 * 20);
  EXPECT_EQ(c.router.scoring, moe::RouterScoring::kSigmoid);
  EXPECT_TRUE(c.router.has_selection_bias);
  EXPECT_EQ(c.router.num_groups, 1);
  EXPECT_TRUE(c.router.renormalize);
  EXPECT_FLOAT_EQ(c.router.routed_scaling_factor, 2.5f);
  EXPECT_FALSE(c.fp8_blocks.enabled());
  bool bias = false, q_bias = false, o_bias = false, q_norm = false;
  for (const TensorSpec& t : preset_tensors(tiny("glm4_moe"))) {
    bias |= t.name == "model.layers.1.mlp.gate.e_score_correction_bias";
    q_bias |= t.name == "model.layers.0.self_attn.q_proj.bias";
    o_bias |= t.name.find("o_proj.bias") != std::string::npos;
    q_norm |=
        t.name == "model.layers.0.self_attn.q_norm.weight" && t.shape == std::vector<int64_t>{20};
    EXPECT_EQ(t.name.find("model.layers.3."), std::string::npos) << "the MTP layer is not loaded";
  }
  EXPECT_TRUE(bias && q_bias && q_norm);
  EXPECT_FALSE(o_bias) << "transformers' o_proj has no bias";

  // Defaults of Glm4MoeConfig, and transformers 5's spelling of the factor.
  json defaults = tiny("glm4_moe");
  for (const char* key :
       {"partial_rotary_factor", "first_k_dense_replace", "n_shared_experts", "use_qk_norm",
        "attention_bias", "norm_topk_prob", "n_group", "topk_group", "routed_scaling_factor"})
    defaults.erase(key);
  const ModelConfig d = parsed(defaults);
  EXPECT_EQ(d.rotary_dim, 10) << "partial_rotary_factor defaults to 0.5";
  EXPECT_EQ(d.moe_layers(), (std::vector<int>{1, 2}));
  EXPECT_TRUE(d.layers[1].shared_expert);
  EXPECT_EQ(d.layers[0].attention.qk_norm, QkNorm::kNone);
  EXPECT_FALSE(d.layers[0].attention.qkv_bias);
  EXPECT_TRUE(d.router.renormalize);
  EXPECT_FLOAT_EQ(d.router.routed_scaling_factor, 1.0f);
  json v5 = tiny("glm4_moe");
  v5.erase("partial_rotary_factor");
  v5["rope_parameters"] = {
      {"rope_type", "default"}, {"rope_theta", 10000.0}, {"partial_rotary_factor", 0.4}};
  EXPECT_EQ(parsed(v5).rotary_dim, 8) << "int(20 x 0.4)";
  json whole = tiny("glm4_moe");
  whole["partial_rotary_factor"] = 1.0;
  EXPECT_EQ(parsed(whole).rotary_dim, 0) << "every dim: plain RoPE";
  EXPECT_EQ(parsed(whole).rope_dim(), 20);
  json grouped = tiny("glm4_moe");
  grouped["n_group"] = 3;
  grouped["topk_group"] = 2;
  EXPECT_EQ(parsed(grouped).router.num_groups, 3);

  auto refused = [&](json config, const std::string& field) {
    auto r = parse_model_config(config);
    ASSERT_FALSE(r.is_ok()) << field;
    EXPECT_NE(r.message().find(field), std::string::npos) << r.message();
  };
  json odd = tiny("glm4_moe");
  odd["partial_rotary_factor"] = 0.25;
  refused(odd, "partial_rotary_factor");
  json negative = tiny("glm4_moe");
  negative["partial_rotary_factor"] = -0.5;
  refused(negative, "partial_rotary_factor");
  json quant = tiny("glm4_moe");
  quant["quantization_config"] = {{"quant_method", "compressed-tensors"}};
  refused(quant, "quant_method");
  json act = tiny("glm4_moe");
  act["hidden_act"] = "gelu";
  refused(act, "hidden_act");
}

// A family's tiny checkpoint written by make-model's writer, on the CPU backend.
class FamilyModel : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("sy_arch_" + std::string(GetParam()) + "_" + std::to_string(::getpid()));
    Status written =
        write_random_checkpoint(tiny(GetParam()), json::object(), dir_.string(), 7, false);
    ASSERT_TRUE(written.is_ok()) << written.message();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  // cpu-fused runs every family's router but DeepSeek-V3's and GLM's (selection bias, groups).
  static bool fused_runs_family() {
    return std::string(GetParam()) != "deepseek_v3" && std::string(GetParam()) != "glm4_moe";
  }

  struct Run {
    std::unique_ptr<backend::Backend> backend = backend::make_cpu_backend({2});
    moe::ExpertsKernelRegistry registry;
    std::unique_ptr<Model> model;
    std::unique_ptr<Decoder> decoder;
    int32_t state_parity = 0;  // linear attention: the state buffer the next step reads
  };
  std::unique_ptr<Run> start(const std::string& dir, const std::string& kernel = "cpu-modular") {
    auto run = std::make_unique<Run>();
    run->backend->register_kernels(run->registry);
    auto loaded = Model::load(dir, *run->backend);
    EXPECT_TRUE(loaded.is_ok()) << loaded.message();
    if (!loaded) return nullptr;
    run->model = std::move(loaded).value();
    auto chosen = run->registry.select(kernel, {Device::kCpu, true, true});
    EXPECT_TRUE(chosen.is_ok()) << chosen.message();
    run->decoder = std::make_unique<Decoder>(*run->backend, KernelChoice{*chosen, nullptr, 0}, 16);
    Status allocated = run->decoder->allocate(run->model->config(), 16, {128, 1, 16, 128});
    EXPECT_TRUE(allocated.is_ok()) << allocated.message();
    return run;
  }
  // Tokens [from, to) of one sequence in one step (earlier ones already in the cache); the
  // logits of every token of the step and their routes.
  static void step(Run& run, const std::vector<int32_t>& tokens, int32_t from, int32_t to,
                   std::vector<float>& logits, std::vector<int32_t>& routes) {
    StepInputs in;
    for (int32_t p = from; p < to; ++p) {
      in.token_ids.push_back(tokens[static_cast<size_t>(p)]);
      in.positions.push_back(p);
      in.token_seq.push_back(0);
      in.slot_mapping.push_back(p);
      in.logits_rows.push_back(p - from);
    }
    in.num_seqs = 1;
    in.max_blocks_per_seq = (to + 15) / 16;
    for (int b = 0; b < in.max_blocks_per_seq; ++b) in.block_tables.push_back(b);
    in.capture_routes = true;
    if (run.decoder->state_buffers() >
        0) {  // the sequence's state: read one buffer, write the other
      in.state_read = {run.state_parity};
      in.state_write = {1 - run.state_parity};
    }
    StepOutputs out;
    ASSERT_TRUE(run.decoder->forward(*run.model, in, out).is_ok());
    Status finished = run.decoder->finish_step(*run.model, out);
    ASSERT_TRUE(finished.is_ok()) << finished.message();
    run.state_parity = 1 - run.state_parity;
    logits.resize(static_cast<size_t>(out.logits.numel()));
    run.backend->download(out.logits, logits.data());
    routes = out.routes;
  }
  static std::vector<int32_t> prompt(int n, int32_t first = 1000) {
    std::vector<int32_t> tokens;
    for (int i = 0; i < n; ++i) tokens.push_back(first + (i * 7919) % 5000);
    return tokens;
  }
  std::filesystem::path dir_;
};

TEST_P(FamilyModel, RunsAndPrefillEqualsDecodeBitForBit) {
  auto run = start(dir_.string());
  ASSERT_TRUE(run);
  const ModelConfig& c = run->model->config();
  const std::vector<int32_t> tokens = prompt(40);
  std::vector<float> whole, last;
  std::vector<int32_t> routes, step_routes;
  step(*run, tokens, 0, 40, whole, routes);
  for (float value : whole) ASSERT_TRUE(std::isfinite(value));
  // Routes: every MoE row a valid, distinct set; dense rows 0.
  const int64_t L = c.num_hidden_layers, K = c.experts_per_token;
  std::set<int32_t> seen;
  for (int64_t t = 0; t < 40; ++t)
    for (int64_t l = 0; l < L; ++l) {
      const int32_t* row = routes.data() + (t * L + l) * K;
      if (!c.is_moe_layer(static_cast<int>(l))) {
        for (int64_t k = 0; k < K; ++k) EXPECT_EQ(row[k], 0);
        continue;
      }
      EXPECT_TRUE(moe::validate_route_row(row, c.router_spec()).is_ok());
      seen.insert(row, row + K);
    }
  EXPECT_GT(seen.size(), static_cast<size_t>(K)) << "routing should spread over experts";
  // The same sequence as a 30-token prefill then one token at a time: the CPU is
  // batch-invariant, so the last rows match bit for bit (the window crosses KV blocks).
  auto again = start(dir_.string());
  std::vector<float> part;
  step(*again, tokens, 0, 30, part, step_routes);
  for (int32_t p = 30; p < 40; ++p) {
    step(*again, tokens, p, p + 1, last, step_routes);
    const int64_t vocab = c.vocab_size;
    ASSERT_EQ(std::memcmp(last.data(), whole.data() + p * vocab, static_cast<size_t>(vocab) * 4), 0)
        << "position " << p;
    ASSERT_TRUE(std::equal(step_routes.begin(), step_routes.end(), routes.begin() + p * L * K));
  }
}

// Chunked prefill: the same prompt in three uneven chunks (each one's KV read back by the next)
// gives each row's logits and routes bit for bit as one whole prefill does.
TEST_P(FamilyModel, ChunkedPrefillEqualsOnePiece) {
  auto whole_run = start(dir_.string()), chunked_run = start(dir_.string());
  ASSERT_TRUE(whole_run && chunked_run);
  const ModelConfig& c = whole_run->model->config();
  const int64_t row_routes = c.num_hidden_layers * c.experts_per_token, vocab = c.vocab_size;
  const std::vector<int32_t> tokens = prompt(45);
  std::vector<float> whole, part;
  std::vector<int32_t> routes, part_routes;
  step(*whole_run, tokens, 0, 45, whole, routes);
  for (auto [from, to] : {std::pair{0, 13}, std::pair{13, 31}, std::pair{31, 45}}) {
    step(*chunked_run, tokens, from, to, part, part_routes);
    ASSERT_EQ(std::memcmp(part.data(), whole.data() + from * vocab,
                          static_cast<size_t>((to - from) * vocab) * 4),
              0)
        << "chunk [" << from << ", " << to << ")";
    ASSERT_TRUE(
        std::equal(part_routes.begin(), part_routes.end(), routes.begin() + from * row_routes))
        << "chunk [" << from << ", " << to << ")";
  }
}

// Replay on both CPU kernels: the captured routes forced back give the same logits and routes;
// other forced ids come back as given (poison-checked by finish_step) and change the logits.
TEST_P(FamilyModel, ReplayReproducesCaptureAndHonoursForcedIds) {
  for (const char* kernel : {"cpu-modular", "cpu-fused"}) {
    if (!fused_runs_family() && std::string(kernel) == "cpu-fused") continue;  // refuses it
    auto run = start(dir_.string(), kernel);
    ASSERT_TRUE(run);
    const ModelConfig& c = run->model->config();
    const int64_t L = c.num_hidden_layers, K = c.experts_per_token, n = 24;
    const std::vector<int32_t> tokens = prompt(static_cast<int>(n));
    auto forward = [&](const std::vector<int32_t>* forced, std::vector<float>& logits,
                       std::vector<int32_t>& routes) {
      StepInputs in;
      for (int32_t p = 0; p < n; ++p) {
        in.token_ids.push_back(tokens[static_cast<size_t>(p)]);
        in.positions.push_back(p);
        in.token_seq.push_back(0);
        in.slot_mapping.push_back(p);
        in.logits_rows.push_back(p);
      }
      in.num_seqs = 1;
      in.max_blocks_per_seq = 2;
      in.block_tables = {0, 1};
      in.capture_routes = true;
      if (run->decoder->state_buffers() > 0) in.state_read = {0}, in.state_write = {1};
      if (forced) {
        in.forced.assign(static_cast<size_t>(n), 1);
        in.forced_routes = *forced;
      }
      StepOutputs out;
      ASSERT_TRUE(run->decoder->forward(*run->model, in, out).is_ok());
      Status finished = run->decoder->finish_step(*run->model, out);
      ASSERT_TRUE(finished.is_ok()) << finished.message();
      logits.resize(static_cast<size_t>(out.logits.numel()));
      run->backend->download(out.logits, logits.data());
      routes = out.routes;
    };
    std::vector<float> free_logits, replayed_logits, forced_logits;
    std::vector<int32_t> routes, replayed, echoed;
    forward(nullptr, free_logits, routes);
    forward(&routes, replayed_logits, replayed);
    EXPECT_EQ(replayed, routes) << kernel;
    EXPECT_EQ(replayed_logits, free_logits) << kernel;
    // Forced: each MoE row rotated to other experts (k distinct ids), dense rows 0.
    std::vector<int32_t> forced(routes.size(), 0);
    for (int64_t t = 0; t < n; ++t)
      for (int64_t l = 0; l < L; ++l)
        if (c.is_moe_layer(static_cast<int>(l)))
          for (int64_t k = 0; k < K; ++k)
            forced[static_cast<size_t>((t * L + l) * K + k)] =
                static_cast<int32_t>((routes[static_cast<size_t>((t * L + l) * K)] + 1 + k) % c.num_experts);
    forward(&forced, forced_logits, echoed);
    EXPECT_EQ(echoed, forced) << kernel;
    EXPECT_NE(forced_logits, free_logits) << kernel;
  }
}

TEST_P(FamilyModel, ModularAndFusedKernelsAgree) {
  if (!fused_runs_family()) {
    // DeepSeek-V3's correction bias and groups: cpu-fused refuses the router at allocation.
    auto run = std::make_unique<Run>();
    run->backend->register_kernels(run->registry);
    auto loaded = Model::load(dir_.string(), *run->backend);
    ASSERT_TRUE(loaded.is_ok()) << loaded.message();
    auto fused = run->registry.select("cpu-fused", {Device::kCpu, true, true});
    ASSERT_TRUE(fused.is_ok());
    Decoder decoder(*run->backend, KernelChoice{*fused, nullptr, 0}, 16);
    Status allocated = decoder.allocate((*loaded)->config(), 16, {128, 1, 16, 128});
    ASSERT_FALSE(allocated.is_ok());
    EXPECT_NE(allocated.message().find("cpu-fused"), std::string::npos) << allocated.message();
    return;
  }
  auto modular = start(dir_.string(), "cpu-modular"), fused = start(dir_.string(), "cpu-fused");
  ASSERT_TRUE(modular && fused);
  std::vector<float> a, b;
  std::vector<int32_t> routes_a, routes_b;
  step(*modular, prompt(33), 0, 33, a, routes_a);
  step(*fused, prompt(33), 0, 33, b, routes_b);
  EXPECT_EQ(routes_a, routes_b);
  EXPECT_EQ(a, b);
}

TEST_P(FamilyModel, SlidingWindowHidesTokensOutsideIt) {
  const ModelConfig c = parsed(tiny(GetParam()));
  int64_t window = 0;
  for (const LayerSpec& layer : c.layers) window = std::max(window, layer.attention.sliding_window);
  // Past the receptive field (layers x (window - 1)) a token cannot see the first token.
  const int n = static_cast<int>(c.num_hidden_layers * std::max<int64_t>(window - 1, 1) + 6);
  std::vector<int32_t> first = prompt(n), changed = first;
  changed[0] = 77;
  auto run_a = start(dir_.string()), run_b = start(dir_.string());
  std::vector<float> a, b;
  std::vector<int32_t> routes;
  step(*run_a, first, 0, n, a, routes);
  step(*run_b, changed, 0, n, b, routes);
  const int64_t vocab = c.vocab_size;
  const bool same_last =
      std::memcmp(a.data() + (n - 1) * vocab, b.data() + (n - 1) * vocab, vocab * 4) == 0;
  if (c.model_type == "mixtral") {
    EXPECT_TRUE(same_last) << "every layer slides: the last token never sees token 0";
  } else {
    EXPECT_FALSE(same_last) << "a full-attention layer sees token 0";
  }
  EXPECT_NE(std::memcmp(a.data() + 1 * vocab, b.data() + 1 * vocab, vocab * 4), 0)
      << "token 1 sees token 0";
}

TEST_P(FamilyModel, MissingAndMisshapenTensorsAreNamed) {
  json top = tiny(GetParam());
  // A multimodal wrapper's (Qwen3.5) text model fields are in text_config.
  json* body = top.contains("text_config") ? &top["text_config"] : &top;
  json& config = *body;
  const bool gpt_oss = std::string(GetParam()) == "gpt_oss";
  const std::string experts_key = config.contains("num_local_experts")  ? "num_local_experts"
                                  : config.contains("n_routed_experts") ? "n_routed_experts"
                                                                        : "num_experts";
  // One more expert (one more group of them where the router groups experts).
  config[experts_key] =
      config[experts_key].get<int>() + (config.contains("n_group") ? config["n_group"].get<int>() : 1);
  std::ofstream(dir_ / "config.json") << top.dump();
  auto backend = backend::make_cpu_backend({1});
  auto missing = Model::load(dir_.string(), *backend);
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.message().find(gpt_oss ? "router.weight" : "gate.weight"), std::string::npos)
      << missing.message();
  EXPECT_NE(missing.message().find("shape"), std::string::npos) << missing.message();
  top = tiny(GetParam());
  body = top.contains("text_config") ? &top["text_config"] : &top;
  // The dense or expert width (MXFP4: whole blocks); Qwen3.5 has experts only.
  const std::string width_key =
      body->contains("intermediate_size") ? "intermediate_size" : "moe_intermediate_size";
  (*body)[width_key] = (*body)[width_key].get<int>() + (gpt_oss ? 32 : 2);
  std::ofstream(dir_ / "config.json") << top.dump();
  auto misshapen = Model::load(dir_.string(), *backend);
  ASSERT_FALSE(misshapen.is_ok());
  EXPECT_NE(misshapen.message().find("layers."), std::string::npos) << misshapen.message();
  EXPECT_NE(misshapen.message().find("has shape"), std::string::npos) << misshapen.message();
  EXPECT_NE(misshapen.message().find("model.safetensors"), std::string::npos) << "names the file";
}

TEST_P(FamilyModel, RandomWeightsBuildTheSameTensors) {
  auto backend = backend::make_cpu_backend({1});
  auto model = Model::random((dir_ / "config.json").string(), *backend, 3);
  ASSERT_TRUE(model.is_ok()) << model.message();
  auto loaded = Model::load(dir_.string(), *backend);
  ASSERT_TRUE(loaded.is_ok());
  const auto &a = (*model)->weights().layers, &b = (*loaded)->weights().layers;
  ASSERT_EQ(a.size(), b.size());
  for (size_t l = 0; l < a.size(); ++l) {
    EXPECT_EQ(a[l].is_moe, b[l].is_moe);
    EXPECT_EQ(a[l].moe.gate_up.numel(), b[l].moe.gate_up.numel());
    EXPECT_EQ(a[l].shared_expert_gate.numel(), b[l].shared_expert_gate.numel());
    EXPECT_EQ(a[l].attention.q_norm.numel(), b[l].attention.q_norm.numel());
    EXPECT_EQ(a[l].attention.q_bias.numel(), b[l].attention.q_bias.numel());
  }
}

INSTANTIATE_TEST_SUITE_P(Families, FamilyModel,
                         ::testing::Values("qwen3_moe", "mixtral", "olmoe", "qwen2_moe", "gpt_oss",
                                           "deepseek_v3", "glm4_moe", "qwen3_5_moe"));

// A tensor of the wrong dtype is refused naming file and tensor: MXFP4 blocks must be U8, and a
// U8 tensor where a float one belongs is no weight either.
TEST(GptOssCheckpoint, WrongDtypeIsNamed) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("sy_gptoss_dtype_" + std::to_string(::getpid()));
  const json config = tiny("gpt_oss");
  ASSERT_TRUE(parse_model_config(config).is_ok());
  auto listed = preset_tensors(config);
  for (const char* swapped :
       {"model.layers.1.mlp.experts.gate_up_proj_blocks", "model.layers.1.mlp.router.bias"}) {
    std::vector<TensorSpec> specs = listed;
    for (TensorSpec& spec : specs)
      if (spec.name == swapped) spec.dtype = spec.dtype == DType::kU8 ? DType::kBF16 : DType::kU8;
    auto zeros = [](const TensorSpec&, uint8_t* out, size_t n) { std::memset(out, 0, n); };
    ASSERT_TRUE(write_checkpoint(dir.string(), specs, zeros).is_ok());
    std::ofstream(dir / "config.json") << config.dump();
    auto backend = backend::make_cpu_backend({1});
    auto refused = Model::load(dir.string(), *backend);
    ASSERT_FALSE(refused.is_ok()) << swapped;
    EXPECT_NE(refused.message().find(swapped), std::string::npos) << refused.message();
    EXPECT_NE(refused.message().find("model.safetensors"), std::string::npos) << refused.message();
    EXPECT_NE(refused.message().find("has dtype"), std::string::npos) << refused.message();
  }
  std::filesystem::remove_all(dir);
}

// The MXFP4 checkpoint and the bf16 checkpoint transformers would save from it (gate_up
// [E, H, 2I] with gate/up interleaved columns, down [E, I, H]), decoded here by the e2m1 formula:
// the same model, so the same logits (bit for bit: both are dequantised to f32 then multiplied
// in one order) and routes.
TEST(GptOssCheckpoint, Mxfp4AndItsBf16ExpansionRunTheSameModel) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("sy_gptoss_mx_" + std::to_string(::getpid()));
  const std::string bf16_dir = dir.string() + "_bf16";
  json config = tiny("gpt_oss");
  config["num_hidden_layers"] = 2;
  config["layer_types"] = {"sliding_attention", "full_attention"};
  ASSERT_TRUE(write_random_checkpoint(config, json::object(), dir.string(), 9, false).is_ok());
  auto checkpoint = Checkpoint::open(dir.string());
  ASSERT_TRUE(checkpoint.is_ok()) << checkpoint.message();
  auto decode = [](uint8_t code) {
    const double sign = (code & 8) ? -1.0 : 1.0;
    const int exponent = (code >> 1) & 3, mantissa = code & 1;
    return sign * (exponent == 0 ? 0.5 * mantissa : std::ldexp(1.0 + 0.5 * mantissa, exponent - 1));
  };
  // Decoded [E, out, in] of a blocks/scales pair, written transposed as bf16 [E, in, out].
  std::map<std::string, std::vector<uint16_t>> expanded;
  std::vector<TensorSpec> specs;
  for (const TensorInfo& info : checkpoint->tensors()) {
    const std::string& name = info.name;
    if (name.find("_scales") != std::string::npos) continue;
    const auto blocks_at = name.find("_blocks");
    if (blocks_at == std::string::npos) {
      specs.push_back({name, info.dtype, info.shape});
      continue;
    }
    const std::string base = name.substr(0, blocks_at);
    const TensorInfo* scales = checkpoint->find(base + "_scales");
    ASSERT_NE(scales, nullptr);
    const int64_t E = info.shape[0], out = info.shape[1], in = info.shape[2] * 32;
    std::vector<uint16_t>& dst = expanded[base];
    dst.resize(static_cast<size_t>(E * out * in));
    for (int64_t e = 0; e < E; ++e)
      for (int64_t o = 0; o < out; ++o)
        for (int64_t i = 0; i < in; ++i) {
          const uint8_t byte = info.data[((e * out + o) * (in / 32) + i / 32) * 16 + (i % 32) / 2];
          const double value =
              decode(i % 2 ? byte >> 4 : byte & 15) *
              std::pow(2.0, scales->data[(e * out + o) * (in / 32) + i / 32] - 127.0);
          dst[static_cast<size_t>((e * in + i) * out + o)] = f32_to_bf16(static_cast<float>(value));
        }
    specs.push_back({base, DType::kBF16, {E, in, out}});
  }
  auto fill = [&](const TensorSpec& spec, uint8_t* out, size_t nbytes) {
    if (auto it = expanded.find(spec.name); it != expanded.end())
      std::memcpy(out, it->second.data(), nbytes);
    else
      std::memcpy(out, checkpoint->find(spec.name)->data, nbytes);
  };
  ASSERT_TRUE(write_checkpoint(bf16_dir, specs, fill).is_ok());
  json bf16 = config;
  bf16.erase("quantization_config");
  std::ofstream(bf16_dir + "/config.json") << bf16.dump();

  auto backend = backend::make_cpu_backend({2});
  moe::ExpertsKernelRegistry registry;
  backend->register_kernels(registry);
  std::vector<std::vector<float>> logits;
  std::vector<std::vector<int32_t>> routes;
  for (const std::string& folder : {dir.string(), bf16_dir}) {
    auto model = Model::load(folder, *backend);
    ASSERT_TRUE(model.is_ok()) << model.message();
    EXPECT_EQ((*model)->config().experts.format, folder == bf16_dir
                                                     ? moe::ExpertFormat::kTransposedInterleaved
                                                     : moe::ExpertFormat::kMxfp4Interleaved);
    Decoder decoder(*backend, KernelChoice{*registry.select("cpu-modular", {}), nullptr, 0}, 16);
    ASSERT_TRUE(decoder.allocate((*model)->config(), 8, {64, 1, 8, 64}).is_ok());
    StepInputs in;
    for (int32_t p = 0; p < 30; ++p) {
      in.token_ids.push_back(100 + (p * 7919) % 3000);
      in.positions.push_back(p);
      in.token_seq.push_back(0);
      in.slot_mapping.push_back(p);
      in.logits_rows.push_back(p);
    }
    in.num_seqs = 1;
    in.max_blocks_per_seq = 2;
    in.block_tables = {0, 1};
    in.capture_routes = true;
    StepOutputs out;
    ASSERT_TRUE(decoder.forward(**model, in, out).is_ok());
    ASSERT_TRUE(decoder.finish_step(**model, out).is_ok());
    logits.emplace_back(static_cast<size_t>(out.logits.numel()));
    backend->download(out.logits, logits.back().data());
    routes.push_back(out.routes);
  }
  EXPECT_EQ(routes[0], routes[1]);
  EXPECT_EQ(logits[0], logits[1]);
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(bf16_dir);
}

// A kernel that predates the extended router options refuses a spec that uses them.
class LegacyKernel final : public moe::ExpertsKernel {
 public:
  std::string_view name() const override { return "legacy"; }
  Device device() const override { return Device::kCpu; }
  bool routes_inside() const override { return false; }
  bool captures_routes() const override { return true; }
  bool replays_routes() const override { return true; }
  Status forward(const moe::MoeForwardArgs&) override { return Status::ok(); }
};

TEST(Architectures, KernelsWithoutTheExtendedRouterRefuseIt) {
  LegacyKernel kernel;
  moe::RouterSpec spec{8, 2, moe::RouterScoring::kSoftmax, true};
  EXPECT_TRUE(kernel.supports(spec).is_ok());
  spec.has_selection_bias = true;
  Status refused = kernel.supports(spec);
  EXPECT_EQ(refused.code(), ErrorCode::kUnsupported);
  EXPECT_NE(refused.message().find("legacy"), std::string::npos);
  // gpt-oss's experts (biases, clamped SwiGLU, MXFP4) likewise.
  EXPECT_TRUE(kernel.supports_experts(moe::ExpertSpec{}).is_ok());
  Status experts = kernel.supports_experts(parsed(tiny("gpt_oss")).experts);
  EXPECT_EQ(experts.code(), ErrorCode::kUnsupported);
  EXPECT_NE(experts.message().find("legacy"), std::string::npos);
  EXPECT_NE(experts.message().find("MXFP4"), std::string::npos);
}

// A backend with none of the optional features (as the CUDA backend is today): only name() and
// supports() may be called before the refusal.
class FeaturelessBackend final : public backend::Backend {
 public:
  std::string name() const override { return "featureless"; }
  Device device() const override { return Device::kCpu; }
  Tensor alloc(DType, std::initializer_list<int64_t>) override { std::abort(); }
  void free_buffer(Tensor&) override { std::abort(); }
  Result<Tensor> load_weight(const Tensor&) override { std::abort(); }
  Result<Tensor> load_stacked(const std::vector<Tensor>&) override { std::abort(); }
  void fill_random(Tensor&, uint64_t, float, float) override { std::abort(); }
  void fill_random_bytes(Tensor&, uint64_t, int, float) override { std::abort(); }
  void upload(const void*, Tensor&) override { std::abort(); }
  void download(const Tensor&, void*) override { std::abort(); }
  void fill_i32(Tensor&, int32_t) override { std::abort(); }
  void embedding(const Tensor&, const Tensor&, Tensor&) override { std::abort(); }
  void rms_norm(const Tensor&, const Tensor&, float, Tensor&) override { std::abort(); }
  void matmul(const Tensor&, const Tensor&, const Tensor*, Tensor&) override { std::abort(); }
  void add_inplace(Tensor&, const Tensor&) override { std::abort(); }
  void silu_mul(const Tensor&, const Tensor&, Tensor&) override { std::abort(); }
  void rope(Tensor&, const backend::AttentionBatch&, const backend::RopeSpec&) override {
    std::abort();
  }
  void write_kv(const Tensor&, const Tensor&, Tensor&, Tensor&,
                const backend::AttentionBatch&) override {
    std::abort();
  }
  void attention(const Tensor&, const Tensor&, const Tensor&, const backend::AttentionBatch&, float,
                 Tensor&) override {
    std::abort();
  }
  void gather_rows(const Tensor&, const Tensor&, Tensor&) override { std::abort(); }
  void sample(const Tensor&, const std::vector<backend::SamplingRow>&,
              std::vector<backend::SampledToken>&) override {
    std::abort();
  }
  void score_tokens(const Tensor&, const std::vector<int32_t>&, int,
                    std::vector<backend::SampledToken>&) override {
    std::abort();
  }
  void register_kernels(moe::ExpertsKernelRegistry&) override {}
  bool supports(backend::BackendFeature feature) const override {
    return std::find(features.begin(), features.end(), feature) != features.end();
  }
  Status supports_shape(const LatentShape&) const override {
    return shape_refusal.empty() ? Status::ok() : Status::error("latent " + shape_refusal);
  }
  Status supports_shape(const LinearShape&) const override {
    return shape_refusal.empty() ? Status::ok() : Status::error("linear " + shape_refusal);
  }
  std::vector<backend::BackendFeature> features;  // none unless a test gives some
  std::string shape_refusal;                      // refuse latent/linear attention shapes so
};

// A backend that has the features but whose kernels do not take the model's latent or linear
// attention shapes (CUDA's limits) refuses it when it loads, naming the shape, before any weight
// is read (this backend aborts on any allocation).
TEST(Architectures, ABackendRefusesLatentAndLinearShapesItsKernelsDoNotTakeBeforeLoading) {
  for (const auto& [arch, kind, needs] :
       std::vector<std::tuple<const char*, const char*, std::vector<backend::BackendFeature>>>{
           {"deepseek_v3", "latent", {backend::BackendFeature::kLatentAttention, backend::BackendFeature::kScaledRope}},
           {"qwen3_5_moe",
            "linear",
            {backend::BackendFeature::kGatedDeltaNet, backend::BackendFeature::kGatedAttention,
             backend::BackendFeature::kPartialRotary, backend::BackendFeature::kSigmoidGatedAdd}}}) {
    const auto dir = std::filesystem::temp_directory_path() /
                     (std::string("sy_shape_refuse_") + arch + "_" + std::to_string(::getpid()));
    ASSERT_TRUE(write_random_checkpoint(tiny(arch), json::object(), dir.string(), 1, false).is_ok());
    FeaturelessBackend backend;
    backend.features = needs;
    backend.shape_refusal = "shape outside the test kernel's limits";
    auto refused = Model::load(dir.string(), backend);
    ASSERT_FALSE(refused.is_ok()) << arch;
    EXPECT_EQ(refused.status().code(), ErrorCode::kUnsupported) << arch;
    for (const std::string named : {std::string("config.json"), std::string(kind) + " shape outside"})
      EXPECT_NE(refused.message().find(named), std::string::npos) << named << ": " << refused.message();
    std::filesystem::remove_all(dir);
  }
}

TEST(Architectures, ABackendWithoutGptOssFeaturesRefusesItBeforeLoadingNamingThemAll) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("sy_gptoss_refuse_" + std::to_string(::getpid()));
  ASSERT_TRUE(
      write_random_checkpoint(tiny("gpt_oss"), json::object(), dir.string(), 1, false).is_ok());
  FeaturelessBackend backend;
  auto refused = Model::load(dir.string(), backend);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_EQ(refused.status().code(), ErrorCode::kUnsupported);
  for (const char* named : {"featureless", "gpt_oss", "sliding-window attention", "attention sinks",
                            "YaRN"})
    EXPECT_NE(refused.message().find(named), std::string::npos)
        << named << ": " << refused.message();
  // Its MXFP4 experts are not refused: a backend whose kernels read only stacked bf16 experts
  // gets them restacked at load (the CPU, which reads them as stored, keeps them).
  EXPECT_EQ(refused.message().find("MXFP4"), std::string::npos) << refused.message();
  auto config = load_model_config(dir.string());
  ASSERT_TRUE(config.is_ok()) << config.message();
  EXPECT_EQ(config->experts.stored, moe::ExpertFormat::kMxfp4Interleaved);
  ModelConfig adapted = *config;
  adapt_experts_to_backend(adapted, backend);
  EXPECT_EQ(adapted.experts.format, moe::ExpertFormat::kStacked);
  auto cpu = backend::make_cpu_backend({1});
  ModelConfig kept = *config;
  adapt_experts_to_backend(kept, *cpu);
  EXPECT_EQ(kept.experts.format, moe::ExpertFormat::kMxfp4Interleaved);
  // A backend whose kernels read MXFP4 as stored but not the bf16 transposed layout (CUDA's
  // cuda-modular) keeps MXFP4 packed and restacks the bf16 layout; without U8 weights it restacks.
  FeaturelessBackend mxfp4_reader;
  mxfp4_reader.features = {backend::BackendFeature::kMxfp4Weights, backend::BackendFeature::kMxfp4Experts};
  ModelConfig packed = *config;
  adapt_experts_to_backend(packed, mxfp4_reader);
  EXPECT_EQ(packed.experts.format, moe::ExpertFormat::kMxfp4Interleaved);
  ModelConfig transposed = *config;
  transposed.experts.stored = transposed.experts.format = moe::ExpertFormat::kTransposedInterleaved;
  adapt_experts_to_backend(transposed, mxfp4_reader);
  EXPECT_EQ(transposed.experts.format, moe::ExpertFormat::kStacked);
  FeaturelessBackend no_u8;
  no_u8.features = {backend::BackendFeature::kMxfp4Experts};
  ModelConfig unpacked = *config;
  adapt_experts_to_backend(unpacked, no_u8);
  EXPECT_EQ(unpacked.experts.format, moe::ExpertFormat::kStacked);
  auto random = Model::random((dir / "config.json").string(), backend, 1);
  ASSERT_FALSE(random.is_ok());
  EXPECT_EQ(random.status().code(), ErrorCode::kUnsupported);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace sy::model

namespace sy::model {
namespace {

TEST(Architectures, ABackendWithoutPartialRotaryRefusesGlm4MoeBeforeLoading) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("sy_glm_refuse_" + std::to_string(::getpid()));
  ASSERT_TRUE(
      write_random_checkpoint(tiny("glm4_moe"), json::object(), dir.string(), 1, false).is_ok());
  FeaturelessBackend backend;
  auto refused = Model::load(dir.string(), backend);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_EQ(refused.status().code(), ErrorCode::kUnsupported);
  for (const char* named : {"featureless", "glm4_moe", "partial rotary embedding"})
    EXPECT_NE(refused.message().find(named), std::string::npos)
        << named << ": " << refused.message();
  std::filesystem::remove_all(dir);
  // FP8 block-quantised weights likewise (the CPU dequantises them into host buffers).
  json fp8 = tiny("glm4_moe");
  fp8["partial_rotary_factor"] = 1.0;
  fp8["quantization_config"] = {{"quant_method", "fp8"}, {"weight_block_size", {128, 128}}};
  Status fp8_refused = check_backend_features(parsed(fp8), backend);
  EXPECT_EQ(fp8_refused.code(), ErrorCode::kUnsupported);
  EXPECT_NE(fp8_refused.message().find("FP8 block-quantised weights"), std::string::npos)
      << fp8_refused.message();
  EXPECT_EQ(fp8_refused.message().find("partial rotary"), std::string::npos)
      << "partial_rotary_factor 1 rotates whole heads";
}

TEST(Architectures, ABackendWithoutLatentAttentionRefusesDeepseekV3BeforeLoading) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("sy_dsv3_refuse_" + std::to_string(::getpid()));
  ASSERT_TRUE(
      write_random_checkpoint(tiny("deepseek_v3"), json::object(), dir.string(), 1, false).is_ok());
  FeaturelessBackend backend;
  auto refused = Model::load(dir.string(), backend);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_EQ(refused.status().code(), ErrorCode::kUnsupported);
  for (const char* named : {"featureless", "deepseek_v3", "multi-head latent attention", "YaRN"})
    EXPECT_NE(refused.message().find(named), std::string::npos)
        << named << ": " << refused.message();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace sy::model

namespace sy::model {
namespace {

TEST(Architectures, ABackendWithoutGatedDeltaNetRefusesQwen35BeforeLoading) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("sy_qwen35_refuse_" + std::to_string(::getpid()));
  ASSERT_TRUE(
      write_random_checkpoint(tiny("qwen3_5_moe"), json::object(), dir.string(), 1, false).is_ok());
  FeaturelessBackend backend;
  auto refused = Model::load(dir.string(), backend);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_EQ(refused.status().code(), ErrorCode::kUnsupported);
  for (const char* named :
       {"featureless", "qwen3_5_moe", "gated DeltaNet", "gated attention", "sigmoid-gated"})
    EXPECT_NE(refused.message().find(named), std::string::npos)
        << named << ": " << refused.message();
  std::filesystem::remove_all(dir);
}

// Qwen3.5's config: the text model from text_config (or flat for Qwen3_5MoeForCausalLM), layer
// types given or by full_attention_interval, partial rotary, and clear refusals.
TEST(Architectures, Qwen35ConfigLayerTypesPartialRotaryAndRefusals) {
  const json wrapper = tiny("qwen3_5_moe");
  const ModelConfig c = parsed(wrapper);
  EXPECT_EQ(c.model_type, "qwen3_5_moe");
  EXPECT_EQ(c.hidden_size, 72);
  EXPECT_TRUE(c.layers[0].attention.linear && c.layers[1].attention.linear);
  EXPECT_TRUE(!c.layers[2].attention.linear && c.layers[2].attention.output_gate);
  EXPECT_EQ(c.layers[2].attention.rotary_dim, 6);  // int(24 * 0.25)
  EXPECT_EQ(c.linear_attention.conv_dim(), 2 * 2 * 12 + 4 * 10);
  EXPECT_TRUE(c.router.renormalize);
  EXPECT_EQ(c.kv_cache_values_per_token(), 2 * 2 * 24) << "only the full-attention layer has KV";
  // The text model alone, flat, without layer_types: every 4th layer full.
  json flat = wrapper["text_config"];
  flat.erase("layer_types");
  flat["num_hidden_layers"] = 8;
  const ModelConfig f = parsed(flat);
  EXPECT_EQ(f.model_type, "qwen3_5_moe_text");
  for (int layer = 0; layer < 8; ++layer)
    EXPECT_EQ(f.layers[layer].attention.linear, layer % 4 != 3) << layer;
  auto refused = [](json config, const std::string& key, json value, const char* named) {
    config[key] = value;
    auto result = parse_model_config(config);
    ASSERT_FALSE(result.is_ok()) << key;
    EXPECT_NE(result.message().find(named), std::string::npos) << result.message();
  };
  json text = wrapper["text_config"];
  refused(text, "linear_num_value_heads", 3, "linear_num_value_heads");
  refused(text, "layer_types", json{"linear_attention", "sliding_attention", "full_attention", "linear_attention"},
          "layer_types[1]");
  refused(text, "rope_parameters", json{{"rope_type", "default"}, {"partial_rotary_factor", 0.01}},
          "partial_rotary_factor");
}

}  // namespace
}  // namespace sy::model
