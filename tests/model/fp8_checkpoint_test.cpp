// FP8 block-quantised checkpoints (quantization_config quant_method fp8, weight_block_size):
// F8_E4M3 weights with F32 `weight_scale_inv` block grids dequantise at load to exactly the bf16
// model a checkpoint of the dequantised values (decoded here bit by bit from the e4m3 layout,
// times the block's scale, rounded to bf16) holds: the same logits and routes bit for bit. Bad
// scales are refused naming tensor and file.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "model/decoder.h"
#include "model/presets.h"

namespace sy::model {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// e4m3fn from its bits, built as an f32 bit pattern (independent of the loader's arithmetic):
// sign | exponent (bias 7) | 3 mantissa bits; exponent 0 is subnormal (mantissa x 2^-9).
float e4m3(uint8_t code) {
  const uint32_t sign = (code & 0x80u) << 24, exponent = (code >> 3) & 15u, mantissa = code & 7u;
  float value;
  if (exponent == 0) {
    value = static_cast<float>(mantissa) / 512.0f;
    return sign ? -value : value;
  }
  const uint32_t bits = sign | ((exponent - 7u + 127u) << 23) | (mantissa << 20);
  std::memcpy(&value, &bits, 4);
  return value;
}

// Linear weights (rank 2) other than the embedding, lm_head and the router are FP8 in published
// DeepSeek-V3 checkpoints (transformers' FP8Linear replaces nn.Linear modules; the router gate is
// a plain parameter, lm_head is left out).
bool quantised(const TensorInfo& t) {
  return t.shape.size() == 2 && t.name.ends_with(".weight") && t.name != "lm_head.weight" &&
         t.name != "model.embed_tokens.weight" && !t.name.ends_with("mlp.gate.weight");
}

struct Fp8Pair {
  fs::path fp8, bf16;
  // The bf16 model a loader would make that scaled every block by the first block's scale: the
  // per-block scales must matter for the test to mean anything.
  fs::path one_scale;
};

// From a make-model checkpoint: an FP8 one (random codes, random per-block scales, blocks of
// rows x cols) and the bf16 checkpoint of its dequantised values; other tensors copied.
// `mangle` may edit the FP8 checkpoint's tensor list before it is written.
Fp8Pair write_pair(const fs::path& base, const json& config, int64_t rows, int64_t cols,
                   const std::function<void(std::vector<TensorSpec>&)>& mangle = {}) {
  Fp8Pair pair{base.string() + "_fp8", base.string() + "_bf16", base.string() + "_one_scale"};
  EXPECT_TRUE(write_random_checkpoint(config, json::object(), base.string(), 5, false).is_ok());
  auto source = Checkpoint::open(base.string());
  EXPECT_TRUE(source.is_ok()) << source.message();
  std::map<std::string, std::vector<uint8_t>> fp8_bytes;
  std::map<std::string, std::vector<float>> scales;
  std::map<std::string, std::vector<uint16_t>> dequantised, one_scale;
  std::vector<TensorSpec> fp8_specs, bf16_specs;
  uint64_t state = 0x9e3779b97f4a7c15ull;
  auto next = [&] {
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;
    return state;
  };
  for (const TensorInfo& t : source->tensors()) {
    bf16_specs.push_back({t.name, t.dtype, t.shape});
    if (!quantised(t)) {
      fp8_specs.push_back({t.name, t.dtype, t.shape});
      continue;
    }
    const int64_t out = t.shape[0], in = t.shape[1];
    const int64_t grid_rows = (out + rows - 1) / rows, grid_cols = (in + cols - 1) / cols;
    std::vector<uint8_t>& codes = fp8_bytes[t.name];
    std::vector<float>& grid = scales[t.name + "_scale_inv"];
    for (int64_t i = 0; i < grid_rows * grid_cols; ++i)
      grid.push_back(std::ldexp(1.0f + static_cast<float>(next() % 1000) / 1000.0f, -15));
    std::vector<uint16_t>& values = dequantised[t.name];
    std::vector<uint16_t>& first_scale = one_scale[t.name];
    for (int64_t r = 0; r < out; ++r)
      for (int64_t c = 0; c < in; ++c) {
        uint8_t code = static_cast<uint8_t>(next());
        if ((code & 0x7f) == 0x7f) code = 0x7e;  // not NaN
        codes.push_back(code);
        values.push_back(f32_to_bf16(e4m3(code) * grid[(r / rows) * grid_cols + c / cols]));
        first_scale.push_back(f32_to_bf16(e4m3(code) * grid[0]));
      }
    fp8_specs.push_back({t.name, DType::kF8E4M3, t.shape});
    fp8_specs.push_back({t.name + "_scale_inv", DType::kF32, {grid_rows, grid_cols}});
  }
  if (mangle) mangle(fp8_specs);
  auto fill = [&](const TensorSpec& spec, uint8_t* out, size_t nbytes) {
    std::memset(out, 0, nbytes);
    if (auto it = fp8_bytes.find(spec.name); it != fp8_bytes.end() && spec.dtype == DType::kF8E4M3)
      std::memcpy(out, it->second.data(), nbytes);
    else if (auto s = scales.find(spec.name); s != scales.end())
      std::memcpy(out, s->second.data(), std::min(nbytes, s->second.size() * 4));
    else if (auto d = dequantised.find(spec.name); d != dequantised.end())
      std::memcpy(out, d->second.data(), nbytes);
    else
      std::memcpy(out, source->find(spec.name)->data, nbytes);
  };
  EXPECT_TRUE(write_checkpoint(pair.fp8.string(), fp8_specs, fill).is_ok());
  // The bf16 twin: every quantised name maps to its dequantised values.
  auto fill_bf16 = [&](const TensorSpec& spec, uint8_t* out, size_t nbytes) {
    if (auto d = dequantised.find(spec.name); d != dequantised.end())
      std::memcpy(out, d->second.data(), nbytes);
    else
      std::memcpy(out, source->find(spec.name)->data, nbytes);
  };
  EXPECT_TRUE(write_checkpoint(pair.bf16.string(), bf16_specs, fill_bf16).is_ok());
  auto fill_one_scale = [&](const TensorSpec& spec, uint8_t* out, size_t nbytes) {
    if (auto d = one_scale.find(spec.name); d != one_scale.end())
      std::memcpy(out, d->second.data(), nbytes);
    else
      std::memcpy(out, source->find(spec.name)->data, nbytes);
  };
  EXPECT_TRUE(write_checkpoint(pair.one_scale.string(), bf16_specs, fill_one_scale).is_ok());
  json quantized = config;
  quantized["quantization_config"] = {{"activation_scheme", "dynamic"},
                                      {"fmt", "e4m3"},
                                      {"quant_method", "fp8"},
                                      {"weight_block_size", {rows, cols}}};
  std::ofstream(pair.fp8 / "config.json") << quantized.dump();
  std::ofstream(pair.bf16 / "config.json") << config.dump();
  std::ofstream(pair.one_scale / "config.json") << config.dump();
  return pair;
}

struct Outputs {
  std::vector<float> logits;
  std::vector<int32_t> routes;
};

// SY_TEST_DEVICE=cuda (scripts/gpu-check.sh): the same checks with the CUDA backend, which
// copies the host-dequantised values to the device like any bf16 weight.
bool on_cuda() {
  const char* device = std::getenv("SY_TEST_DEVICE");
  return device && std::string(device) == "cuda";
}

Outputs run(const fs::path& dir) {
  Outputs result;
  auto made = backend::make_backend({on_cuda() ? Device::kCuda : Device::kCpu, 2, 0});
  EXPECT_TRUE(made.is_ok()) << made.message();
  if (!made) return result;
  std::unique_ptr<backend::Backend> backend = std::move(made).value();
  moe::ExpertsKernelRegistry registry;
  backend->register_kernels(registry);
  auto model = Model::load(dir.string(), *backend);
  EXPECT_TRUE(model.is_ok()) << model.message();
  if (!model) return result;
  const char* kernel = on_cuda() ? "cuda-modular" : "cpu-modular";
  Decoder decoder(*backend, KernelChoice{*registry.select(kernel, {backend->device()}), nullptr, 0}, 16);
  EXPECT_TRUE(decoder.allocate((*model)->config(), 4, {32, 1, 2, 32}).is_ok());
  StepInputs in;
  for (int32_t p = 0; p < 24; ++p) {
    in.token_ids.push_back(200 + (p * 7919) % 3000);
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
  EXPECT_TRUE(decoder.forward(**model, in, out).is_ok());
  EXPECT_TRUE(decoder.finish_step(**model, out).is_ok());
  result.logits.resize(static_cast<size_t>(out.logits.numel()));
  backend->download(out.logits, result.logits.data());
  result.routes = out.routes;
  return result;
}

class Fp8Checkpoint : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    base_ = fs::temp_directory_path() /
            ("sy_fp8_" + std::string(GetParam()) + "_" + std::to_string(::getpid()));
    auto config = preset_config(GetParam(), "tiny", 2);
    ASSERT_TRUE(config.is_ok());
    config_ = *config;
    config_["vocab_size"] = 4096;  // small files; the prompt's ids stay below it
  }
  void TearDown() override {
    for (const char* tail : {"", "_fp8", "_bf16", "_one_scale"})
      fs::remove_all(base_.string() + tail);
  }
  std::string load_error(const Fp8Pair& pair) {
    auto made = backend::make_backend({on_cuda() ? Device::kCuda : Device::kCpu, 1, 0});
    EXPECT_TRUE(made.is_ok()) << made.message();
    if (!made) return "";
    auto model = Model::load(pair.fp8.string(), **made);
    EXPECT_FALSE(model.is_ok());
    return model.is_ok() ? "" : model.message();
  }
  fs::path base_;
  json config_;
};

// Blocks of 16 x 24 (not square, so a swapped grid fails; the tiny dims are no multiples of them,
// so partial edge blocks are exercised).
TEST_P(Fp8Checkpoint, DequantisesToTheSameModelAsItsBf16Values) {
  const Fp8Pair pair = write_pair(base_, config_, 16, 24);
  auto checkpoint = Checkpoint::open(pair.fp8.string());
  ASSERT_TRUE(checkpoint.is_ok()) << checkpoint.message();
  int quantised_tensors = 0;
  for (const TensorInfo& t : checkpoint->tensors()) quantised_tensors += t.dtype == DType::kF8E4M3;
  EXPECT_GT(quantised_tensors, 10);
  const Outputs fp8 = run(pair.fp8), bf16 = run(pair.bf16);
  ASSERT_FALSE(fp8.logits.empty());
  EXPECT_EQ(fp8.routes, bf16.routes);
  EXPECT_EQ(fp8.logits, bf16.logits) << "bit for bit";
  for (float value : fp8.logits) ASSERT_TRUE(std::isfinite(value));
  EXPECT_NE(run(pair.one_scale).logits, fp8.logits) << "each block has its own scale";
}

TEST_P(Fp8Checkpoint, BadScalesAreRefusedNamingTensorAndFile) {
  const std::string weight = "model.layers.0.mlp.down_proj.weight";
  {
    const Fp8Pair pair = write_pair(base_, config_, 16, 24, [&](std::vector<TensorSpec>& specs) {
      for (TensorSpec& spec : specs)
        if (spec.name == weight + "_scale_inv") spec.shape[1] += 1;
    });
    const std::string message = load_error(pair);
    EXPECT_NE(message.find(weight + "_scale_inv"), std::string::npos) << message;
    EXPECT_NE(message.find("model.safetensors"), std::string::npos) << message;
    EXPECT_NE(message.find("expected"), std::string::npos) << message;
  }
  {
    const Fp8Pair pair = write_pair(base_, config_, 16, 24, [&](std::vector<TensorSpec>& specs) {
      std::erase_if(specs,
                    [&](const TensorSpec& spec) { return spec.name == weight + "_scale_inv"; });
    });
    const std::string message = load_error(pair);
    EXPECT_NE(message.find(weight), std::string::npos) << message;
    EXPECT_NE(message.find("no block scales"), std::string::npos) << message;
  }
  {
    // The same scales read with another block size no longer fit.
    const Fp8Pair pair = write_pair(base_, config_, 16, 24);
    json config = json::parse(std::ifstream(pair.fp8 / "config.json"));
    config["quantization_config"]["weight_block_size"] = {24, 16};
    std::ofstream(pair.fp8 / "config.json") << config.dump();
    EXPECT_NE(load_error(pair).find("_scale_inv"), std::string::npos);
    // Without quantization_config, an F8_E4M3 weight is refused.
    config.erase("quantization_config");
    std::ofstream(pair.fp8 / "config.json") << config.dump();
    const std::string message = load_error(pair);
    EXPECT_NE(message.find("F8_E4M3"), std::string::npos) << message;
    EXPECT_NE(message.find("quantization_config"), std::string::npos) << message;
  }
  for (const json& bad :
       {json{{"quant_method", "fp8"}}, json{{"quant_method", "fp8"}, {"weight_block_size", {128}}},
        json{{"quant_method", "fp8"}, {"weight_block_size", {128, 128}}, {"fmt", "e5m2"}},
        json{{"quant_method", "fp8"},
             {"weight_block_size", {128, 128}},
             {"activation_scheme", "static"}}}) {
    json config = config_;
    config["quantization_config"] = bad;
    auto parsed = parse_model_config(config);
    ASSERT_FALSE(parsed.is_ok()) << bad.dump();
    EXPECT_NE(parsed.message().find("quantization_config"), std::string::npos) << parsed.message();
  }
}

INSTANTIATE_TEST_SUITE_P(Families, Fp8Checkpoint, ::testing::Values("deepseek_v3", "glm4_moe"));

}  // namespace
}  // namespace sy::model
