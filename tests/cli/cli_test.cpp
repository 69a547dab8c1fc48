// The `switchyard` binary end to end: make-model, inspect (and its refusals of bad model files),
// generate with --routes-out / --routes-in / --json, and the kernel guard.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>

#include <nlohmann/json.hpp>

#include "model/safetensors.h"
#include "util/npy.h"

namespace sy {
namespace {

namespace fs = std::filesystem;

struct CommandResult {
  int exit_code;
  std::string out;  // stdout + stderr
};

std::string binary() {
  const char* bin = std::getenv("SWITCHYARD_BIN");
  return bin ? bin : std::string(SY_BINARY_DIR) + "/switchyard";
}

CommandResult run(const std::string& args) {
  std::string command = binary() + " " + args + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  std::string out;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof buffer, pipe)) > 0) out.append(buffer, n);
  int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

class Cli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(fs::temp_directory_path() / ("sy_cli_" + std::to_string(std::random_device{}())));
    fs::create_directories(*dir_);
    CommandResult made = run("make-model --preset tiny --seed 3 --out " + model().string());
    ASSERT_EQ(made.exit_code, 0) << made.out;
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
  }
  static fs::path model() { return *dir_ / "tiny"; }
  static fs::path path(const std::string& name) { return *dir_ / name; }
  // A copy of the tiny model whose safetensors file is replaced by `tensors` (from the original).
  static fs::path broken_copy(const std::string& name) {
    fs::path copy = path(name);
    fs::create_directories(copy);
    for (const char* file : {"config.json", "tokenizer.json", "tokenizer_config.json"})
      fs::copy_file(model() / file, copy / file, fs::copy_options::overwrite_existing);
    return copy;
  }
  static fs::path* dir_;
};
fs::path* Cli::dir_ = nullptr;

TEST_F(Cli, InspectDescribesTheTinyModel) {
  CommandResult r = run("inspect " + model().string());
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("moe_layers: [0,2,3]"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("experts: 32, top_k 4"), std::string::npos) << r.out;
}

TEST_F(Cli, GenerateWritesRoutesAndReplayReproducesThem) {
  const std::string routes = path("routes.npy").string();
  CommandResult first = run("generate --model " + model().string() +
                  " --prompt-ids 9707,11,847,829,374 --max-tokens 6 --temperature 0 --ignore-eos --json --routes-out " + routes);
  ASSERT_EQ(first.exit_code, 0) << first.out;
  auto json = nlohmann::json::parse(first.out.substr(first.out.find('{')));
  ASSERT_EQ(json["completion_token_ids"].size(), 6u);
  EXPECT_EQ(json["finish_reason"], "length");
  auto array = npy_read_file(routes);
  ASSERT_TRUE(array.is_ok()) << array.message();
  EXPECT_EQ(array->dtype, DType::kU8);  // 32 experts <= 256
  EXPECT_EQ(array->shape, (std::vector<int64_t>{5 + 6 - 1, 4, 4}));
  for (int64_t row = 0; row < array->shape[0]; ++row)
    for (int64_t k = 0; k < 4; ++k) EXPECT_EQ(array->data[(row * 4 + 1) * 4 + k], 0) << "dense layer 1";

  // Replay the prompt's rows: same tokens, same routes.
  std::vector<uint8_t> prompt_rows(array->data.begin(), array->data.begin() + 5 * 16);
  const std::string replay = path("replay.npy").string();
  ASSERT_TRUE(npy_write_file(replay, DType::kU8, {5, 4, 4}, prompt_rows.data()).is_ok());
  const std::string routes2 = path("routes2.npy").string();
  CommandResult second = run("generate --model " + model().string() +
                   " --prompt-ids 9707,11,847,829,374 --max-tokens 6 --temperature 0 --ignore-eos --json --routes-in " +
                   replay + " --routes-out " + routes2 + " --moe-kernel cpu-fused");
  ASSERT_EQ(second.exit_code, 0) << second.out;
  auto json2 = nlohmann::json::parse(second.out.substr(second.out.find('{')));
  EXPECT_EQ(json2["completion_token_ids"], json["completion_token_ids"]);
  auto array2 = npy_read_file(routes2);
  ASSERT_TRUE(array2.is_ok());
  EXPECT_EQ(array2->data, array->data);
}

// routes diff: a generate run's routes against a JSON copy with one row's order swapped and
// SGLang's raw int32 with one expert replaced.
TEST_F(Cli, RoutesDiffCountsSetAndOrderDifferences) {
  const std::string routes = path("diff_a.npy").string();
  CommandResult made = run(
      "generate --model " + model().string() +
      " --prompt-ids 5,6,7,8 --max-tokens 5 --temperature 0 --ignore-eos --routes-out " + routes);
  ASSERT_EQ(made.exit_code, 0) << made.out;
  auto array = npy_read_file(routes);
  ASSERT_TRUE(array.is_ok()) << array.message();
  const int64_t rows = array->shape[0];  // 8 rows x 4 layers x top-4, layer 1 dense
  std::vector<int32_t> ids(array->data.begin(), array->data.end());
  auto at = [&](int64_t row, int64_t layer, int64_t k) -> int32_t& {
    return ids[(row * 4 + layer) * 4 + k];
  };

  std::vector<int32_t> swapped = ids;
  std::swap(swapped[(2 * 4 + 3) * 4 + 0],
            swapped[(2 * 4 + 3) * 4 + 2]);  // row 2, layer 3: order only
  nlohmann::json nested = nlohmann::json::array();
  for (int64_t row = 0; row < rows; ++row) {
    nlohmann::json layers = nlohmann::json::array();
    for (int64_t layer = 0; layer < 4; ++layer)
      layers.push_back(std::vector<int32_t>(swapped.begin() + (row * 4 + layer) * 4,
                                            swapped.begin() + (row * 4 + layer + 1) * 4));
    nested.push_back(layers);
  }
  const std::string json_path = path("diff_b.json").string();
  std::ofstream(json_path) << nested.dump();
  CommandResult order = run("routes diff " + routes + " " + json_path + " --json");
  ASSERT_EQ(order.exit_code, 0) << order.out;
  auto report = nlohmann::json::parse(order.out);
  EXPECT_EQ(report["compared"], rows * 3);
  EXPECT_EQ(report["order_differs"], 1);
  EXPECT_EQ(report["set_differs"], 0);
  EXPECT_EQ(report["layers"][1]["dense"], true);
  EXPECT_EQ(report["layers"][3]["order_differs"], 1);

  // SGLang's flat int32 (raw bytes) with the shape: row 5 layer 0 gets an unused expert.
  std::vector<int32_t> replaced = ids;
  std::set<int32_t> used(&at(5, 0, 0), &at(5, 0, 0) + 4);
  int32_t fresh = 0;
  while (used.count(fresh)) ++fresh;
  replaced[(5 * 4 + 0) * 4 + 1] = fresh;
  const std::string raw_path = path("diff_c.bin").string();
  std::ofstream(raw_path, std::ios::binary)
      .write(reinterpret_cast<const char*>(replaced.data()),
             static_cast<std::streamsize>(replaced.size() * 4));
  CommandResult set = run("routes diff " + routes + " " + raw_path + " --shape 4,4");
  ASSERT_EQ(set.exit_code, 0) << set.out;
  EXPECT_NE(set.out.find("token rows with any layer's set differing: 1 of " + std::to_string(rows)),
            std::string::npos)
      << set.out;
  // Without the shape a raw file is refused, naming the flag.
  CommandResult refused = run("routes diff " + routes + " " + raw_path);
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_NE(refused.out.find("--shape"), std::string::npos) << refused.out;
}

TEST_F(Cli, GenerateFromTextPrintsText) {
  CommandResult r = run("generate --model " + model().string() + " --prompt 'Hello there' --max-tokens 3 --temperature 0");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_FALSE(r.out.empty());
}

TEST_F(Cli, GenerateChatUsesTheModelsTemplate) {
  CommandResult r = run("generate --model " + model().string() +
                        " --chat '[{\"role\":\"user\",\"content\":\"Hi there\"}]' --max-tokens 2 --temperature 0 --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto json = nlohmann::json::parse(r.out.substr(r.out.find('{')));
  // The rendered prompt, tokenized without extra special tokens, through the other subcommands.
  std::ofstream(path("chat.json")) << R"({"messages":[{"role":"user","content":"Hi there"}],"add_generation_prompt":true})";
  CommandResult rendered = run("render-chat --model " + model().string() + " < " + path("chat.json").string());
  ASSERT_EQ(rendered.exit_code, 0) << rendered.out;
  EXPECT_NE(rendered.out.find("<|im_start|>assistant"), std::string::npos) << rendered.out;
  std::ofstream(path("rendered.jsonl")) << nlohmann::json(rendered.out).dump() << "\n";
  CommandResult ids = run("tokenize --no-special-tokens --model " + model().string() + " < " + path("rendered.jsonl").string());
  ASSERT_EQ(ids.exit_code, 0) << ids.out;
  EXPECT_EQ(json["prompt_token_ids"], nlohmann::json::parse(ids.out));
}

// vLLM's names for the shared flags work (a launch script written for vLLM runs unchanged);
// --dtype offers only what runs.
TEST_F(Cli, VllmFlagNamesAreAccepted) {
  CommandResult r =
      run("generate --model " + model().string() +
          " --prompt-ids 1,2,3 --max-tokens 2 --tensor-parallel-size 1 --enforce-eager "
          "--dtype bfloat16 --trust-remote-code");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  CommandResult half =
      run("generate --model " + model().string() + " --prompt-ids 1,2 --dtype float16");
  EXPECT_NE(half.exit_code, 0);
  EXPECT_NE(half.out.find("--dtype"), std::string::npos) << half.out;
}

TEST_F(Cli, BadReplayAndUnknownKernelAreRefused) {
  std::vector<uint8_t> rows(2 * 16, 0);  // duplicate ids in every MoE row
  const std::string bad = path("bad_replay.npy").string();
  ASSERT_TRUE(npy_write_file(bad, DType::kU8, {2, 4, 4}, rows.data()).is_ok());
  CommandResult dup = run("generate --model " + model().string() + " --prompt-ids 1,2,3 --routes-in " + bad);
  EXPECT_NE(dup.exit_code, 0);
  EXPECT_NE(dup.out.find("twice"), std::string::npos) << dup.out;
  CommandResult kernel = run("generate --model " + model().string() + " --prompt-ids 1,2 --moe-kernel nope --routes-out " +
                   path("x.npy").string());
  EXPECT_NE(kernel.exit_code, 0);
  EXPECT_NE(kernel.out.find("cpu-modular"), std::string::npos) << kernel.out;
}

TEST_F(Cli, InspectRefusesBadModelFiles) {
  auto original = model::Checkpoint::open(model().string());
  ASSERT_TRUE(original.is_ok());
  auto rewrite = [&](const fs::path& dir, auto&& edit) {
    std::vector<model::TensorSpec> specs;
    for (const auto& t : original->tensors()) specs.push_back({t.name, t.dtype, t.shape});
    edit(specs);
    Status s = model::write_checkpoint(dir.string(), specs, [&](const model::TensorSpec& spec, uint8_t* out, size_t n) {
      const model::TensorInfo* info = original->find(spec.name);
      if (info && info->nbytes == n) std::memcpy(out, info->data, n);
      else std::memset(out, 0, n);
    });
    ASSERT_TRUE(s.is_ok()) << s.message();
  };
  // Missing tensor.
  fs::path missing = broken_copy("missing");
  rewrite(missing, [](auto& specs) {
    std::erase_if(specs, [](const auto& s) { return s.name == "model.layers.2.mlp.experts.5.up_proj.weight"; });
  });
  CommandResult r1 = run("inspect " + missing.string());
  EXPECT_EQ(r1.exit_code, 1);
  EXPECT_NE(r1.out.find("model.layers.2.mlp.experts.5.up_proj.weight"), std::string::npos) << r1.out;
  // Wrong shape.
  fs::path shape = broken_copy("shape");
  rewrite(shape, [](auto& specs) {
    for (auto& s : specs)
      if (s.name == "model.layers.0.self_attn.k_proj.weight") s.shape = {32, 64};
  });
  CommandResult r2 = run("inspect " + shape.string());
  EXPECT_EQ(r2.exit_code, 1);
  EXPECT_NE(r2.out.find("model.layers.0.self_attn.k_proj.weight"), std::string::npos) << r2.out;
  EXPECT_NE(r2.out.find("expected [64, 64]"), std::string::npos) << r2.out;
  // Truncated file.
  fs::path truncated = broken_copy("truncated");
  fs::copy_file(model() / "model.safetensors", truncated / "model.safetensors", fs::copy_options::overwrite_existing);
  fs::resize_file(truncated / "model.safetensors", fs::file_size(model() / "model.safetensors") - 100);
  CommandResult r3 = run("inspect " + truncated.string());
  EXPECT_EQ(r3.exit_code, 1);
  EXPECT_NE(r3.out.find("model.safetensors"), std::string::npos) << r3.out;
  // Inconsistent config: top-k > experts; unknown architecture; malformed JSON.
  auto edit_config = [&](const std::string& name, auto&& edit) {
    fs::path dir = broken_copy(name);
    fs::copy_file(model() / "model.safetensors", dir / "model.safetensors", fs::copy_options::overwrite_existing);
    std::ifstream in(model() / "config.json");
    std::string text((std::istreambuf_iterator<char>(in)), {});
    edit(text);
    std::ofstream(dir / "config.json") << text;
    return run("inspect " + dir.string());
  };
  CommandResult r4 = edit_config("topk", [](std::string& t) {
    auto j = nlohmann::json::parse(t);
    j["num_experts_per_tok"] = 64;
    t = j.dump();
  });
  EXPECT_EQ(r4.exit_code, 1);
  EXPECT_NE(r4.out.find("num_experts_per_tok"), std::string::npos) << r4.out;
  CommandResult r5 = edit_config("arch", [](std::string& t) {
    auto j = nlohmann::json::parse(t);
    j["model_type"] = "llama";
    t = j.dump();
  });
  EXPECT_EQ(r5.exit_code, 1);
  EXPECT_NE(r5.out.find("unsupported architecture"), std::string::npos) << r5.out;
  CommandResult r6 = edit_config("json", [](std::string& t) { t.resize(t.size() / 2); });
  EXPECT_EQ(r6.exit_code, 1);
  EXPECT_NE(r6.out.find("config.json"), std::string::npos) << r6.out;
}

}  // namespace
}  // namespace sy
