// CUDA against the CPU reference on whole golden checkpoints, one model feature at a time.
// The CPU matches transformers to ~3e-5 on every family (hf_golden_test.cpp), so a CPU-CUDA
// difference far above the other families' is either a CUDA defect or a model more sensitive to
// bf16 rounding. Switching the checkpoint's features off one by one (copies written to a
// temporary folder) shows whether one feature carries it. (On gpt-oss none does: every variant
// stays at 0.13-0.19, one layer 0.045, and transformers' own bf16 run is 0.14 from float64 on it,
// tests/golden/bf16_sensitivity.json: the model's sensitivity, not a defect.)
// The CUDA pass replays the CPU's routes, so a flipped near-tie cannot move the logits.
// Runs with SY_TEST_DEVICE=cuda (scripts/gpu-check.sh golden); skipped on the CPU. Also here, on
// every device: the measured bf16 sensitivity those tolerances read is present (Bf16Sensitivity).
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>

#include <nlohmann/json.hpp>

#include "hf_golden.h"
#include "model/safetensors.h"
#include "tensor/dtype.h"

namespace sy {
namespace {

using namespace golden;
namespace fs = std::filesystem;

// One feature switched off: config edits, and tensors overwritten with a constant.
struct Variant {
  std::string name;
  std::function<void(nlohmann::json&)> edit_config;  // may be empty
  std::function<bool(const std::string&)> overwrite;  // may be empty
  float value = 0.0f;
  int keep_layers = -1;  // drop the layers from this one on (-1: keep all)
};

bool contains(const std::string& s, const char* part) {
  return s.find(part) != std::string::npos;
}

int layer_of(const std::string& name) {
  const std::string key = "model.layers.";
  if (name.rfind(key, 0) != 0) return -1;
  return std::stoi(name.substr(key.size()));
}

// `source` (a bf16 checkpoint folder) with `v` applied, written to `out`.
void write_variant(const std::string& source, const Variant& v, const std::string& out) {
  fs::create_directories(out);
  nlohmann::json config = read_json(source + "/config.json");
  if (v.keep_layers >= 0) {
    config["num_hidden_layers"] = v.keep_layers;
    if (config.contains("layer_types")) {
      auto types = config["layer_types"];
      config["layer_types"] = nlohmann::json(std::vector<nlohmann::json>(types.begin(), types.begin() + v.keep_layers));
    }
  }
  if (v.edit_config) v.edit_config(config);
  std::ofstream(out + "/config.json") << config.dump(1);
  auto checkpoint = model::Checkpoint::open(source);
  ASSERT_TRUE(checkpoint.is_ok()) << checkpoint.message();
  std::vector<model::TensorSpec> specs;
  std::map<std::string, const model::TensorInfo*> by_name;
  for (const model::TensorInfo& t : checkpoint->tensors()) {
    if (v.keep_layers >= 0 && layer_of(t.name) >= v.keep_layers) continue;
    specs.push_back({t.name, t.dtype, t.shape});
    by_name[t.name] = &t;
  }
  Status written = model::write_checkpoint(out, specs, [&](const model::TensorSpec& spec, uint8_t* dst, size_t nbytes) {
    const model::TensorInfo& t = *by_name.at(spec.name);
    if (!v.overwrite || !v.overwrite(spec.name)) {
      std::memcpy(dst, t.data, nbytes);
      return;
    }
    ASSERT_EQ(t.dtype, DType::kBF16) << t.name;
    const uint16_t bits = f32_to_bf16(v.value);
    for (size_t i = 0; i < nbytes / 2; ++i) std::memcpy(dst + 2 * i, &bits, 2);
  });
  ASSERT_TRUE(written.is_ok()) << written.message();
}

struct Agreement {
  float modular = 0.0f, fused = 0.0f;
};

// The fixture's sequences on the CPU (free routing) and on CUDA replaying the CPU's routes.
Agreement agreement(const std::string& dir, const nlohmann::json& fixture) {
  Agreement a;
  Harness cpu(dir, "modular", 512, Device::kCpu);
  Harness modular(dir, "modular", 512, Device::kCuda);
  Harness fused(dir, "fused", 512, Device::kCuda);
  EXPECT_TRUE(cpu.model && modular.model && fused.model) << dir;
  if (!cpu.model || !modular.model || !fused.model) return {INFINITY, INFINITY};
  for (const auto& prompt : fixture["prompts"]) {
    const std::vector<int32_t> sequence = ids_of(prompt["sequence_ids"]);
    std::vector<float> reference, logits;
    std::vector<int32_t> routes, replayed;
    EXPECT_TRUE(cpu.run(sequence, reference, routes).is_ok());
    EXPECT_TRUE(modular.run(sequence, logits, replayed, &routes).is_ok());
    a.modular = std::max(a.modular, max_abs_diff(logits, reference));
    EXPECT_TRUE(fused.run(sequence, logits, replayed, &routes).is_ok());
    a.fused = std::max(a.fused, max_abs_diff(logits, reference));
  }
  return a;
}

class CudaAgreement : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!on_cuda()) GTEST_SKIP() << "CUDA against the CPU: run with SY_TEST_DEVICE=cuda";
  }
};

// gpt-oss (bf16 checkpoint) as a whole and with each of its own features switched off; Mixtral
// as the control. Every row is printed; the whole model must stay within its golden tolerance.
TEST_F(CudaAgreement, GptOssFeatureByFeature) {
  const std::string source = kGoldenRoot + "/hf_gpt_oss/gptoss_bf16";
  const nlohmann::json fixture = read_json(source + "/fixture.json");
  auto tensor = [](std::initializer_list<const char*> parts) {
    std::vector<const char*> list(parts);
    return [list](const std::string& name) {
      for (const char* part : list)
        if (contains(name, part)) return true;
      return false;
    };
  };
  std::vector<Variant> variants = {
      {"whole model", {}, {}, 0.0f, -1},
      {"one layer", {}, {}, 0.0f, 1},
      {"two layers", {}, {}, 0.0f, 2},
      {"sinks -> -100 (no sink mass)", {}, tensor({"self_attn.sinks"}), -100.0f, -1},
      {"no sliding window", [](nlohmann::json& c) { c["sliding_window"] = 100000; }, {}, 0.0f, -1},
      {"no YaRN", [](nlohmann::json& c) { c.erase("rope_parameters"); c["rope_theta"] = 150000.0; }, {}, 0.0f, -1},
      {"expert biases zero", {}, tensor({"experts.gate_up_proj_bias", "experts.down_proj_bias"}), 0.0f, -1},
      {"no SwiGLU clamp (limit 1e4)", [](nlohmann::json& c) { c["swiglu_limit"] = 10000.0; }, {}, 0.0f, -1},
      {"router bias zero", {}, tensor({"router.bias"}), 0.0f, -1},
      {"attention biases zero", {}, tensor({"q_proj.bias", "k_proj.bias", "v_proj.bias", "o_proj.bias"}), 0.0f, -1},
  };
  const std::string root = (fs::temp_directory_path() / "sy_cuda_agreement").string();
  fs::remove_all(root);
  float whole = 0.0f;
  for (size_t i = 0; i < variants.size(); ++i) {
    const std::string dir = root + "/v" + std::to_string(i);
    write_variant(source, variants[i], dir);
    const Agreement a = agreement(dir, fixture);
    std::printf("[ gpt-oss %-30s ] CUDA vs CPU logits max |diff|: cuda-modular %.4f, cuda-fused %.4f\n",
                variants[i].name.c_str(), a.modular, a.fused);
    if (i == 0) whole = std::max(a.modular, a.fused);
  }
  const std::string control = kGoldenRoot + "/hf_mixtral/mixtral_window";
  const Agreement m = agreement(control, read_json(control + "/fixture.json"));
  std::printf("[ mixtral (control)                       ] CUDA vs CPU logits max |diff|: cuda-modular %.4f, cuda-fused %.4f\n",
              m.modular, m.fused);
  fs::remove_all(root);
  // About as far from the CPU (which matches float64 to ~3e-5) as transformers' own bf16 run is
  // from float64 on this checkpoint (logits_tolerance; bf16_sensitivity: 0.14, Mixtral 0.03).
  EXPECT_LE(whole, logits_tolerance("hf_gpt_oss/gptoss_bf16"));
}

// The measured bf16 sensitivity the CUDA tolerances read (tests/golden/bf16_sensitivity.json):
// every committed golden checkpoint has its figure (the MXFP4 folder through its bf16 sibling),
// and the ones the fixed tolerances were set on stay under kBf16ErrorOfTheBaseModels. Runs on the
// CPU too, so a golden added without a measurement is noticed in CI.
TEST(Bf16Sensitivity, EveryGoldenCheckpointHasAMeasurement) {
  for (const char* checkpoint :
       {"hf_qwen3_moe/qwen3moe_sharded", "hf_qwen3_moe/qwen3moe_dense_nonorm", "hf_qwen3_moe/qwen3moe_sparse_step",
        "hf_mixtral/mixtral_window", "hf_olmoe/olmoe_nonorm", "hf_qwen2_moe/qwen2moe_shared_window",
        "hf_long/qwen3moe_long", "hf_long/qwen3moe_long_fused"}) {
    const double error = bf16_sensitivity(checkpoint);
    EXPECT_GT(error, 0.0) << checkpoint;
    EXPECT_LE(error, kBf16ErrorOfTheBaseModels) << checkpoint;
    EXPECT_EQ(bf16_scale(checkpoint), 1.0) << checkpoint;
  }
  EXPECT_GT(bf16_sensitivity("hf_gpt_oss/gptoss_bf16"), kBf16ErrorOfTheBaseModels);
  EXPECT_EQ(bf16_sensitivity("hf_gpt_oss/gptoss_mxfp4"), bf16_sensitivity("hf_gpt_oss/gptoss_bf16"));
  EXPECT_EQ(bf16_sensitivity("hf_none/not_a_checkpoint"), 0.0);
}

}  // namespace
}  // namespace sy
