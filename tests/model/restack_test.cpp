// gpt-oss's experts restacked at load (WeightSource::restacked, for backends whose kernels read
// only bf16 kStacked, e.g. CUDA): on the committed transformers checkpoints (bf16 transposed-
// interleaved and MXFP4), one MoE layer computed by cpu-modular from the restacked tensors with
// ExpertSpec kStacked equals the same layer computed from the tensors as stored with the stored
// format. (Which backends restack: adapt_experts_to_backend; the CUDA goldens exercise it.)
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/random_fill.h"
#include "model/decoder.h"
#include "model/model.h"
#include "model/weights.h"

namespace sy::model {
namespace {

const std::string kGoldens = std::string(SY_SOURCE_DIR) + "/tests/golden/hf_gpt_oss/";

class Restack : public ::testing::TestWithParam<const char*> {};

TEST_P(Restack, RestackedExpertsComputeTheSameLayer) {
  const std::string dir = kGoldens + GetParam();
  if (!std::filesystem::exists(dir + "/config.json")) GTEST_SKIP() << dir << " is not committed";
  auto backend = backend::make_cpu_backend({1});
  auto loaded = Model::load(dir, *backend);
  ASSERT_TRUE(loaded.is_ok()) << loaded.message();
  const Model& model = **loaded;
  const ModelConfig& c = model.config();
  ASSERT_NE(c.experts.stored, moe::ExpertFormat::kStacked) << "a gpt-oss checkpoint stores interleaved experts";
  ASSERT_EQ(c.experts.format, c.experts.stored) << "the CPU reads the stored layout";

  auto checkpoint = Checkpoint::open(dir);
  ASSERT_TRUE(checkpoint.is_ok()) << checkpoint.message();
  std::vector<Tensor> owned;
  struct FreeOwned {  // the restacked buffers (a Model frees its own), also on an early return
    backend::Backend& backend;
    std::vector<Tensor>& owned;
    ~FreeOwned() {
      for (Tensor& tensor : owned) backend.free_buffer(tensor);
    }
  } free_owned{*backend, owned};
  CheckpointSource source(*checkpoint, *backend, owned);
  moe::ExpertsKernelRegistry registry;
  backend->register_kernels(registry);
  auto kernel = registry.select("cpu-modular", {Device::kCpu, true, false});
  ASSERT_TRUE(kernel.is_ok()) << kernel.message();
  const int64_t H = c.hidden_size, I = c.moe_intermediate_size, E = c.num_experts, T = 9;
  for (int layer = 0; layer < c.num_hidden_layers; ++layer) {
    const moe::MoeLayerWeights& stored = model.weights().layers[static_cast<size_t>(layer)].moe;
    moe::MoeLayerWeights restacked = stored;
    const WeightSource::StoredExperts what{fmt::format("model.layers.{}.mlp.experts.", layer), c.experts.stored, E, H,
                                           I};
    auto gate_up = source.restacked(what, WeightSource::RestackedPart::kGateUp);
    auto down = source.restacked(what, WeightSource::RestackedPart::kDown);
    auto bias = source.restacked(what, WeightSource::RestackedPart::kGateUpBias);
    ASSERT_TRUE(gate_up.is_ok() && down.is_ok() && bias.is_ok())
        << gate_up.message() << down.message() << bias.message();
    restacked.gate_up = *gate_up, restacked.down = *down, restacked.gate_up_bias = *bias;
    restacked.gate_up_scales = restacked.down_scales = Tensor();
    moe::ExpertSpec stacked_spec = c.experts;
    stacked_spec.format = moe::ExpertFormat::kStacked;

    std::vector<float> x(static_cast<size_t>(T * H));
    for (size_t i = 0; i < x.size(); ++i)
      x[i] = backend::random_fill_value(17u + static_cast<uint64_t>(layer), i, 1.0f, 0.0f);
    std::vector<float> out[2];
    for (int pass = 0; pass < 2; ++pass) {
      Tensor hidden(x.data(), DType::kF32, {T, H}, Device::kCpu);
      out[pass].assign(static_cast<size_t>(T * H), std::nanf(""));  // poisoned
      moe::MoeForwardArgs args;
      args.layer = layer;
      args.hidden = hidden;
      args.out = Tensor(out[pass].data(), DType::kF32, {T, H}, Device::kCpu);
      args.weights = pass == 0 ? &stored : &restacked;
      args.spec = c.router;
      args.experts = pass == 0 ? c.experts : stacked_spec;
      ASSERT_TRUE((*kernel)->reserve(T, c.router, H, I).is_ok());
      Status ran = (*kernel)->forward(args);
      ASSERT_TRUE(ran.is_ok()) << ran.message();
    }
    double worst = 0, scale = 0;
    for (size_t i = 0; i < out[0].size(); ++i) {
      ASSERT_TRUE(std::isfinite(out[1][i])) << "layer " << layer << " element " << i;
      worst = std::max(worst, std::fabs(static_cast<double>(out[0][i]) - out[1][i]));
      scale = std::max(scale, std::fabs(static_cast<double>(out[0][i])));
    }
    EXPECT_GT(scale, 1e-3) << "the layer's output should not vanish";
    EXPECT_LE(worst, 1e-5 * scale) << "layer " << layer;
  }
}

INSTANTIATE_TEST_SUITE_P(Checkpoints, Restack, ::testing::Values("gptoss_bf16", "gptoss_mxfp4"));

}  // namespace
}  // namespace sy::model
