// libFuzzer: a checkpoint folder whose config.json is arbitrary bytes, beside the safetensors of
// a real tiny checkpoint of one family. Model::load must refuse what it cannot run with an error
// that says what is wrong (never crash, never read outside a tensor, never allocate from an
// unchecked size), and a model it accepts must run a short step on the CPU backend (prefill of a
// few tokens with route capture, then one decode token) or refuse it with an error.
//
// Input: byte 0 picks the family (low 3 bits: the order of kFamilies), the MoE kernel (bit 3:
// cpu-fused instead of cpu-modular) and what the rest is (bit 4):
//   0  config.json's bytes. The seeds in fuzz/corpus/model are each family's own tiny config.json
//      behind its byte, so mutations start from configs that load.
//   1  edits of the family's own config.json (fuzz/json_edits.h): byte mutations of JSON text
//      mostly break its syntax; edits reach the checks behind the parser.
#include <unistd.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "json_edits.h"
#include "model/decoder.h"
#include "model/model.h"
#include "model/presets.h"
#include "moe/experts_kernel.h"

namespace {

namespace fs = std::filesystem;
using namespace sy;

constexpr std::array<const char*, 8> kFamilies = {"qwen3_moe", "mixtral",    "olmoe",
                                                  "qwen2_moe", "gpt_oss",    "deepseek_v3",
                                                  "glm4_moe",  "qwen3_5_moe"};

struct Fixture {
  fs::path root;
  std::array<nlohmann::json, kFamilies.size()> configs;                            // as written
  std::array<std::vector<nlohmann::json::json_pointer>, kFamilies.size()> fields;  // every node
  std::unique_ptr<backend::Backend> backend;
  moe::ExpertsKernelRegistry registry;
  ~Fixture() {
    std::error_code ignored;
    fs::remove_all(root, ignored);
  }
};

Fixture* fixture = nullptr;

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "model_fuzz set-up: %s\n", what.c_str());
  std::abort();
}

// The family's config with `edits` applied (fuzz/json_edits.h).
nlohmann::json edited(size_t family, const uint8_t* edits, size_t size) {
  static const std::vector<std::string> words = {
      "yarn",   "default", "linear",         "sigmoid",           "softmax",          "noaux_tc",
      "mxfp4",  "fp8",     "full_attention", "sliding_attention", "linear_attention", "bfloat16",
      "float32"};
  return fuzz::apply_json_edits(fixture->configs[family], fixture->fields[family], words, edits,
                                size);
}

// One step of `tokens` tokens of one sequence starting at `start` (KV slots = positions).
Status run_step(model::Decoder& decoder, const model::Model& m, int start, int tokens) {
  model::StepInputs in;
  const int64_t vocab = m.config().vocab_size;
  for (int p = start; p < start + tokens; ++p) {
    in.token_ids.push_back(static_cast<int32_t>((p * 7919 + 13) % vocab));
    in.positions.push_back(p);
    in.token_seq.push_back(0);
    in.slot_mapping.push_back(p);
  }
  in.logits_rows.push_back(tokens - 1);
  in.num_seqs = 1;
  in.max_blocks_per_seq = 2;
  in.block_tables = {0, 1};
  in.capture_routes = true;
  if (decoder.state_buffers() > 0) {
    in.state_read = {start == 0 ? 0 : 1};
    in.state_write = {start == 0 ? 1 : 0};
  }
  model::StepOutputs out;
  SY_TRY(decoder.forward(m, in, out));
  return decoder.finish_step(m, out);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fixture = new Fixture;
  std::atexit([] { delete fixture; });
  fixture->root = fs::temp_directory_path() / ("sy_model_fuzz_" + std::to_string(::getpid()));
  fs::create_directories(fixture->root);
  for (size_t f = 0; f < kFamilies.size(); ++f) {
    const char* family = kFamilies[f];
    auto config = model::preset_config(family, "tiny", 0);
    if (!config.is_ok()) fail(config.message());
    const fs::path dir = fixture->root / family;
    Status written =
        model::write_random_checkpoint(*config, nlohmann::json::object(), dir.string(), 1, false);
    if (!written.is_ok()) fail(written.message());
    fixture->configs[f] = nlohmann::json::parse(std::ifstream(dir / "config.json"));
    fixture->fields[f] = fuzz::json_nodes(fixture->configs[f]);
  }
  fixture->backend = backend::make_cpu_backend({1});
  fixture->backend->register_kernels(fixture->registry);
  return 0;
}

// SY_MODEL_FUZZ_TRACE=1: one line per input saying how far it got (run the seeds with it to see
// that each family loads and steps).
static void trace(const char* family, const char* kernel, const std::string& outcome) {
  static const bool on = std::getenv("SY_MODEL_FUZZ_TRACE") != nullptr;
  if (on) std::fprintf(stderr, "model_fuzz %s %s: %s\n", family, kernel, outcome.c_str());
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const char* family = kFamilies[data[0] & 7];
  const fs::path dir = fixture->root / family;
  const char* kernel_name = data[0] & 8 ? "cpu-fused" : "cpu-modular";
  {
    std::ofstream out(dir / "config.json", std::ios::binary | std::ios::trunc);
    if (data[0] & 16)
      out << edited(data[0] & 7, data + 1, size - 1).dump();
    else
      out.write(reinterpret_cast<const char*>(data + 1), static_cast<std::streamsize>(size - 1));
  }

  auto loaded = model::Model::load(dir.string(), *fixture->backend);
  if (!loaded.is_ok()) {
    if (loaded.message().empty()) std::abort();  // every refusal says what is wrong
    trace(family, kernel_name, "load refused: " + loaded.message());
    return 0;
  }
  const model::Model& m = **loaded;
  auto kernel = fixture->registry.select(kernel_name, {});
  if (!kernel.is_ok()) std::abort();
  model::Decoder decoder(*fixture->backend, model::KernelChoice{*kernel, nullptr, 0}, 16);
  Status allocated = decoder.allocate(m.config(), 2, {8, 1, 2, 8});
  if (!allocated.is_ok()) {
    if (allocated.message().empty()) std::abort();
    trace(family, kernel_name, "allocate refused: " + allocated.message());
    return 0;
  }
  for (auto [start, tokens] : {std::pair{0, 5}, std::pair{5, 1}}) {
    Status step = run_step(decoder, m, start, tokens);
    if (!step.is_ok()) {
      if (step.message().empty()) std::abort();
      trace(family, kernel_name, "step refused: " + step.message());
      return 0;
    }
  }
  trace(family, kernel_name, "loaded and stepped");
  return 0;
}
