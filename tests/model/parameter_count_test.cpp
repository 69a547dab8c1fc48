// Model::parameter_count (shown by `inspect`) counts parameters, not stored elements: a gpt-oss
// MXFP4 block byte holds two e2m1 weights and its e8m0 scales are not parameters. The expected
// count is computed here from config.json's dimensions alone (gpt-oss's layer layout as
// transformers builds it), a formula that reproduces the published totals of gpt-oss-20b and
// -120b, and checked on the checkpoints transformers wrote.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "backend/backend.h"
#include "model/model.h"
#include "model/presets.h"

namespace sy::model {
namespace {

using nlohmann::json;

// gpt-oss's parameters from its config: untied embedding and head, per layer two norms, q/k/v/o
// with biases, one sink per head, a router with bias, and E experts with a gate/up projection
// (2I x H, bias 2I) and a down projection (H x I, bias H); the final norm.
int64_t gpt_oss_parameters(const json& c) {
  const int64_t hidden = c["hidden_size"], vocab = c["vocab_size"],
                heads = c["num_attention_heads"], kv_heads = c["num_key_value_heads"],
                head_dim = c["head_dim"], experts = c["num_local_experts"],
                inter = c["intermediate_size"], layers = c["num_hidden_layers"];
  const int64_t q = heads * head_dim, kv = kv_heads * head_dim;
  const int64_t attention =
      (q * hidden + q) + 2 * (kv * hidden + kv) + (hidden * q + hidden) + heads;
  const int64_t router = experts * hidden + experts;
  const int64_t expert = (2 * inter * hidden + 2 * inter) + (hidden * inter + hidden);
  const int64_t layer = 2 * hidden + attention + router + experts * expert;
  return 2 * vocab * hidden + layers * layer + hidden;
}

TEST(ParameterCount, FormulaGivesThePublishedGptOssTotals) {
  // gpt-oss-20b / -120b config.json dimensions; the model card gives 20.91B and 116.83B total.
  json c = {{"hidden_size", 2880},       {"vocab_size", 201088},   {"num_attention_heads", 64},
            {"num_key_value_heads", 8},  {"head_dim", 64},         {"num_local_experts", 32},
            {"intermediate_size", 2880}, {"num_hidden_layers", 24}};
  EXPECT_EQ((gpt_oss_parameters(c) + 5'000'000) / 10'000'000, 2091);
  c["num_local_experts"] = 128;
  c["num_hidden_layers"] = 36;
  EXPECT_EQ((gpt_oss_parameters(c) + 5'000'000) / 10'000'000, 11683);
}

// make-model's gpt-oss-20b preset (--config-only folders for --random-weights on a GPU): the
// published total, MXFP4 experts, and the alternating 128-token windows.
TEST(ParameterCount, GptOss20bPresetHasThePublishedShape) {
  auto preset = preset_config("gpt_oss", "gpt-oss-20b", 0);
  ASSERT_TRUE(preset.is_ok()) << preset.message();
  EXPECT_EQ((gpt_oss_parameters(*preset) + 5'000'000) / 10'000'000, 2091);
  auto config = parse_model_config(*preset);
  ASSERT_TRUE(config.is_ok()) << config.message();
  EXPECT_EQ(config->experts.stored, moe::ExpertFormat::kMxfp4Interleaved);
  EXPECT_EQ(config->num_experts, 32);
  EXPECT_EQ(config->experts_per_token, 4);
  ASSERT_EQ(config->layers.size(), 24u);
  for (size_t layer = 0; layer < config->layers.size(); ++layer)
    EXPECT_EQ(config->layers[layer].attention.sliding_window, layer % 2 ? 0 : 128) << layer;
  auto cut = preset_config("gpt_oss", "gpt-oss-20b", 2);
  ASSERT_TRUE(cut.is_ok());
  EXPECT_EQ((*cut)["layer_types"].size(), 2u);
  EXPECT_FALSE(preset_config("mixtral", "gpt-oss-20b", 0).is_ok());
}

// Mixtral's parameters from its config: untied embedding and head, per layer two norms, q/k/v/o
// without biases, a router, and E experts of w1/w3 (I x H) and w2 (H x I); the final norm.
int64_t mixtral_parameters(const json& c) {
  const int64_t hidden = c["hidden_size"], vocab = c["vocab_size"],
                heads = c["num_attention_heads"], kv_heads = c["num_key_value_heads"],
                experts = c["num_local_experts"], inter = c["intermediate_size"],
                layers = c["num_hidden_layers"];
  const int64_t head_dim = hidden / heads;
  const int64_t attention = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim;
  const int64_t layer = 2 * hidden + attention + experts * hidden + experts * 3 * inter * hidden;
  return 2 * vocab * hidden + layers * layer + hidden;
}

// make-model's mixtral-8x7b preset (issue 13 benches its 16-layer cut on one GPU): Mixtral-8x7B's
// published total (46,702,792,704), 8 experts top-2, head_dim 128, no sliding window.
TEST(ParameterCount, Mixtral8x7bPresetHasThePublishedShape) {
  auto preset = preset_config("mixtral", "mixtral-8x7b", 0);
  ASSERT_TRUE(preset.is_ok()) << preset.message();
  EXPECT_EQ(mixtral_parameters(*preset), 46'702'792'704);
  auto config = parse_model_config(*preset);
  ASSERT_TRUE(config.is_ok()) << config.message();
  EXPECT_EQ(config->num_experts, 8);
  EXPECT_EQ(config->experts_per_token, 2);
  EXPECT_EQ(config->head_dim, 128);
  ASSERT_EQ(config->layers.size(), 32u);
  for (const auto& layer : config->layers) EXPECT_EQ(layer.attention.sliding_window, 0);
  auto cut = preset_config("mixtral", "mixtral-8x7b", 16);
  ASSERT_TRUE(cut.is_ok());
  EXPECT_EQ((*cut)["num_hidden_layers"], 16);
  EXPECT_FALSE(preset_config("olmoe", "mixtral-8x7b", 0).is_ok());
}

int64_t stored_elements(const std::string& dir) {
  auto checkpoint = Checkpoint::open(dir);
  EXPECT_TRUE(checkpoint) << checkpoint.message();
  int64_t stored = 0;
  if (checkpoint)
    for (const auto& tensor : checkpoint->tensors()) stored += tensor.numel();
  return stored;
}

std::string inspect_output(const std::string& dir) {
  const char* bin = std::getenv("SWITCHYARD_BIN");
  const std::string binary = bin ? bin : std::string(SY_BINARY_DIR) + "/switchyard";
  std::string output;
  if (FILE* pipe = popen(("'" + binary + "' inspect '" + dir + "' 2>&1").c_str(), "r")) {
    char buffer[4096];
    size_t n;
    while ((n = fread(buffer, 1, sizeof buffer, pipe)) > 0) output.append(buffer, n);
    EXPECT_EQ(pclose(pipe), 0) << output;
  }
  return output;
}

// The tiny gpt-oss checkpoints transformers itself wrote (tools/gpu/family_goldens.py): one with
// MXFP4 experts, one in bf16, same dimensions. Both hold the same number of parameters.
TEST(ParameterCount, GptOssMxfp4CountsParametersNotBytes) {
  const std::string golden = std::string(SY_SOURCE_DIR) + "/tests/golden/hf_gpt_oss/";
  auto backend = backend::make_cpu_backend({1});
  int64_t expected = 0;
  for (const char* name : {"gptoss_mxfp4", "gptoss_bf16"}) {
    SCOPED_TRACE(name);
    const std::string dir = golden + name;
    const json config = json::parse(std::ifstream(dir + "/config.json"));
    expected = gpt_oss_parameters(config);
    auto loaded = Model::load(dir, *backend);
    ASSERT_TRUE(loaded) << loaded.message();
    EXPECT_EQ((*loaded)->parameter_count(), expected);
    // bf16: every stored element is a parameter. MXFP4: counting stored elements (the old
    // answer) gives U8 bytes and scales instead of weights.
    if (config.contains("quantization_config"))
      EXPECT_NE(stored_elements(dir), expected);
    else
      EXPECT_EQ(stored_elements(dir), expected);
    EXPECT_NE(inspect_output(dir).find("parameters: " + std::to_string(expected) + " "),
              std::string::npos)
        << inspect_output(dir);
  }

  // Random MXFP4 weights of the same config (no checkpoint) count the same way, less the o_proj
  // biases, which random weights never make (RandomSource makes no optional tensor).
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("sy_param_count_gpt_oss_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(golden + "gptoss_mxfp4/config.json", dir / "config.json");
  auto random = Model::random((dir / "config.json").string(), *backend, 1);
  ASSERT_TRUE(random) << random.message();
  const int64_t o_proj_biases = 3 * 64;  // layers x hidden
  EXPECT_EQ((*random)->parameter_count(), expected - o_proj_biases);
  std::filesystem::remove_all(dir);
}

// A bf16 family's checkpoint: every stored element is a parameter.
TEST(ParameterCount, Bf16CheckpointCountsEveryTensor) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("sy_param_count_qwen2_moe_" + std::to_string(::getpid()));
  auto config = preset_config("qwen2_moe", "tiny", 0);
  ASSERT_TRUE(config) << config.message();
  ASSERT_TRUE(write_random_checkpoint(*config, json::object(), dir.string(), 5, false).is_ok());
  auto backend = backend::make_cpu_backend({1});
  auto loaded = Model::load(dir.string(), *backend);
  ASSERT_TRUE(loaded) << loaded.message();
  EXPECT_EQ((*loaded)->parameter_count(), stored_elements(dir.string()));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace sy::model
