// The CPU reference engine against HF transformers: logits, greedy tokens, routes, and replay.
// Qwen3-MoE goldens by tools/gpu/model_goldens.py (transformers 5.17, f32 reference); Mixtral,
// OLMoE, Qwen2-MoE, gpt-oss (MXFP4 and bf16), GLM-4.5 MoE and DeepSeek-V3 goldens by
// tools/gpu/family_goldens.py (float64 reference), each under
// tests/golden/hf_<family>/<checkpoint>/. A family whose folder is not committed yet is skipped
// with a message naming the folder.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <future>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "hf_golden.h"
#include "model/config.h"
#include "model/rope.h"

namespace sy {
namespace {

using namespace golden;

// Folder under tests/golden/ of each checkpoint (the family's goldens folder / checkpoint).
const char* kCheckpoints[] = {"hf_qwen3_moe/qwen3moe_sharded",
                              "hf_qwen3_moe/qwen3moe_dense_nonorm",
                              "hf_qwen3_moe/qwen3moe_sparse_step",
                              "hf_mixtral/mixtral_window",
                              "hf_olmoe/olmoe_nonorm",
                              "hf_qwen2_moe/qwen2moe_shared_window",
                              "hf_gpt_oss/gptoss_mxfp4",
                              "hf_gpt_oss/gptoss_bf16",
                              "hf_glm4_moe/glm4moe_partial_rotary",
                              "hf_deepseek_v3/deepseekv3_groups",
                              "hf_deepseek_v3/deepseekv3_mla24",
                              "hf_qwen3_5_moe/qwen35moe_hybrid"};

// transformers selects GLM-4.5's and DeepSeek-V3's experts with topk(sorted=False): their
// fixtures say "route_order": "set", and their routes are compared as sets (ours keep DESIGN.md's
// order, checked against the double-precision references in tests/model/*_reference_test.cpp).
bool routes_as_sets(const nlohmann::json& fixture) {
  return fixture.value("route_order", std::string("ordered")) == "set";
}
// cpu-fused runs softmax routers only; the sigmoid routers with a selection bias it refuses.
bool fused_runs(const nlohmann::json& fixture) {
  return !routes_as_sets(fixture);
}

// Whether the fused kernel of the device under test reads this model's experts as the loader
// keeps them for that device (CUDA keeps MXFP4 packed, which only cuda-modular reads) and takes
// their shapes (cuda-fused: widths that are multiples of 8; the golden models' 20 is not).
bool fused_reads_experts(const std::string& dir) {
  auto config = model::load_model_config(dir);
  auto made = backend::make_backend({test_device(), 1, 0});
  if (!config || !made) return false;
  moe::ExpertsKernelRegistry registry;
  (*made)->register_kernels(registry);
  model::adapt_experts_to_backend(*config, **made);
  auto kernel = registry.select(kernel_name("fused"), {test_device(), true, true});
  return kernel && (*kernel)->supports_experts(config->experts).is_ok() &&
         (*kernel)
             ->reserve(8, config->router_spec(), config->hidden_size, config->moe_intermediate_size)
             .code() != ErrorCode::kUnsupported;
}

class HfGolden : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(dir() + "/fixture.json"))
      GTEST_SKIP() << "golden folder " << dir()
                   << " is missing: make it on the GPU machine with tools/gpu/family_goldens.py "
                      "and commit it";
    if (on_cuda()) {
      // A family that needs what the CUDA backend lacks (MXFP4 or interleaved experts, MLA,
      // DeltaNet, ...) is refused at start-up by name: skipped here with that message. Any other
      // failure to start is a failure.
      engine::EngineConfig config;
      config.model_dir = dir();
      config.device = test_device();
      config.capture_routes = true;
      auto created = engine::create_engine(config);
      if (!created.is_ok() && created.status().code() == ErrorCode::kUnsupported)
        GTEST_SKIP() << GetParam() << ": " << created.message();
      ASSERT_TRUE(created.is_ok()) << created.message();
    }
  }
  std::string dir() const { return kGoldenRoot + "/" + GetParam(); }
};

TEST_P(HfGolden, LogitsAndRoutesMatchTransformers) {
  const nlohmann::json fixture = read_json(dir() + "/fixture.json");
  Harness harness(dir());
  const int64_t layers = harness.model->config().num_hidden_layers, top_k = fixture["top_k"];
  if (fixture.contains("rope_inv_freq")) {
    // The frequencies transformers used (YaRN for gpt-oss) against ours, before any logits.
    const model::RopeTable rope = model::rope_table(harness.model->config());
    const std::vector<float> theirs = fixture["rope_inv_freq"].get<std::vector<float>>();
    ASSERT_EQ(rope.inv_freq.size(), theirs.size());
    for (size_t i = 0; i < theirs.size(); ++i)
      EXPECT_NEAR(rope.inv_freq[i], theirs[i], 1e-6 * std::fabs(theirs[i])) << "inv_freq " << i;
    EXPECT_NEAR(rope.attention_factor, fixture["rope_attention_scaling"].get<double>(), 1e-6);
  }
  if (fixture.contains("rotary_dim")) {  // partial rotary (GLM): the dims transformers rotates
    EXPECT_EQ(harness.model->config().rope_dim(), fixture["rotary_dim"].get<int64_t>());
  }
  const bool as_sets = routes_as_sets(fixture);
  int64_t compared_rows = 0, excluded_rows = 0, set_rows = 0, after_flips = 0;
  float worst_logits = 0.0f;
  for (size_t p = 0; p < fixture["prompts"].size(); ++p) {
    const auto& prompt = fixture["prompts"][p];
    const std::vector<int32_t> sequence = ids_of(prompt["sequence_ids"]);
    const int64_t prompt_len = static_cast<int64_t>(prompt["prompt_ids"].size());
    std::vector<float> logits;
    std::vector<int32_t> routes;
    ASSERT_TRUE(harness.run(sequence, logits, routes).is_ok());

    const std::string prefix = dir() + "/p" + std::to_string(p) + "_";
    const std::vector<int> moe_layers = fixture["moe_layers"].get<std::vector<int>>();
    if (on_cuda()) {
      // The logits from a pass that replays transformers' routes (a near-tie that bf16 rounding
      // flipped would otherwise move every later logit of its row); the free pass's routes below.
      std::vector<float> free_logits = logits;
      std::vector<int32_t> replayed;
      const std::vector<int32_t> theirs = transformers_routes(
          prefix, moe_layers, static_cast<int64_t>(sequence.size()), layers, top_k);
      ASSERT_TRUE(harness.run(sequence, logits, replayed, &theirs).is_ok());
      std::printf("  prompt %zu: free-routing logits max |diff| %.3g (informational)\n", p,
                  max_abs_diff(free_logits, read_f32(prefix + "logits_all.npy")));
    }
    const std::vector<float> hf_all = read_f32(prefix + "logits_all.npy");
    const float diff_all = max_abs_diff(logits, hf_all);
    worst_logits = std::max(worst_logits, diff_all);
    EXPECT_LE(diff_all, logits_tolerance(GetParam())) << "prompt " << p;
    const std::vector<float> hf_last = read_f32(prefix + "logits_last.npy");
    const int64_t vocab = static_cast<int64_t>(hf_last.size());
    std::vector<float> ours_last(logits.begin() + (prompt_len - 1) * vocab,
                                 logits.begin() + prompt_len * vocab);
    EXPECT_LE(max_abs_diff(ours_last, hf_last), logits_tolerance(GetParam())) << "prompt " << p;

    FlipTracker flips(sequence.size(), harness.model->config().has_linear_attention());
    for (int layer : moe_layers) {
      flips.next_layer();
      std::vector<int64_t> shape;
      const std::vector<float> router =
          read_f32(prefix + "router_logits_l" + std::to_string(layer) + ".npy", &shape);
      const std::vector<int64_t> hf_topk =
          read_ints(prefix + "topk_l" + std::to_string(layer) + ".npy");
      const std::vector<float> group_gap = group_gaps(prefix, layer);
      const int64_t experts = shape[1];
      for (size_t t = 0; t < sequence.size(); ++t) {
        if (flips.skip(t)) continue;
        const int32_t* ours = routes.data() + (t * layers + layer) * top_k;
        const RouteRowResult row = compare_route_row(
            router.data() + t * experts, experts, ours, hf_topk.data() + t * top_k, top_k, as_sets,
            near_tie_gap(GetParam()), t < group_gap.size() ? group_gap[t] : INFINITY);
        flips.note(t, row);
        if (row.excluded) {
          ++excluded_rows;
          if (on_cuda())
            std::printf(
                "  near-tie excluded: prompt %zu layer %d row %zu gap %.3g group gap %.3g\n", p,
                layer, t, row.kth_gap, row.group_gap);
          continue;
        }
        set_rows += row.as_set;
        EXPECT_TRUE(row.equal) << "prompt " << p << " layer " << layer << " row " << t << ": ours "
                               << route_row_text(ours, top_k) << ", transformers "
                               << route_row_text(hf_topk.data() + t * top_k, top_k) << " (k-th gap "
                               << row.kth_gap << ", smallest inner gap " << row.inner_gap << ")";
        ++compared_rows;
      }
    }
    after_flips += flips.skipped;
  }
  std::printf(
      "[ %s ] logits max |diff| %.3g%s; route rows compared %lld, compared as sets %lld, excluded as "
      "near-ties %lld, after a flipped near-tie %lld\n",
      GetParam(), worst_logits, on_cuda() ? " (replaying transformers' routes)" : "",
      static_cast<long long>(compared_rows), static_cast<long long>(set_rows),
      static_cast<long long>(excluded_rows), static_cast<long long>(after_flips));
  EXPECT_GT(compared_rows, 0);
}

TEST_P(HfGolden, GreedyContinuationThroughTheEngineMatches) {
  const nlohmann::json fixture = read_json(dir() + "/fixture.json");
  engine::EngineConfig config;
  config.model_dir = dir();
  config.device = test_device();
  config.capture_routes = true;
  config.num_threads = 2;
  auto created = engine::create_engine(config);
  ASSERT_TRUE(created.is_ok()) << created.message();
  auto& engine = *created;
  for (size_t p = 0; p < fixture["prompts"].size(); ++p) {
    const auto& prompt = fixture["prompts"][p];
    const std::string prefix = dir() + "/p" + std::to_string(p) + "_";
    const std::vector<int> moe_layers = fixture["moe_layers"].get<std::vector<int>>();
    const int64_t top_k = fixture["top_k"], prompt_len = static_cast<int64_t>(prompt["prompt_ids"].size());
    engine::GenerationRequest request;
    request.prompt_ids = ids_of(prompt["prompt_ids"]);
    if (on_cuda()) {
      // The prompt replays transformers' routes (a near-tie flipped by bf16 rounding would
      // otherwise carry into every later token); the continuation routes itself.
      moe::RouteArray replay;
      replay.rows = prompt_len;
      replay.layers = engine->model_info().num_hidden_layers;
      replay.top_k = top_k;
      replay.ids = transformers_routes(prefix, moe_layers, static_cast<int64_t>(prompt["sequence_ids"].size()),
                                       replay.layers, top_k);
      replay.ids.resize(static_cast<size_t>(prompt_len * replay.layers * top_k));
      request.replay = std::move(replay);
    }
    request.sampling.temperature = 0.0f;
    request.sampling.max_tokens = static_cast<int>(prompt["continuation_ids"].size());
    request.sampling.ignore_eos = true;
    request.return_routes = true;
    std::vector<int32_t> tokens;
    std::promise<engine::Event> done;
    auto id = engine->submit(request, [&](const engine::Event& event) {
      tokens.insert(tokens.end(), event.new_token_ids.begin(), event.new_token_ids.end());
      if (event.finished) done.set_value(event);
      return engine::Continuation::kContinue;
    });
    ASSERT_TRUE(id.is_ok()) << id.message();
    engine::Event final_event = done.get_future().get();
    ASSERT_TRUE(final_event.routes != nullptr);
    EXPECT_EQ(final_event.routes->rows, static_cast<int64_t>(prompt["sequence_ids"].size()));
    const std::vector<int32_t> expected = ids_of(prompt["continuation_ids"]);
    if (!on_cuda() || tokens == expected) {
      EXPECT_EQ(tokens, expected);
      continue;
    }
    // CUDA: the tokens may part where transformers' own choice was close (its top-2 logit margin
    // within twice the logits tolerance) or after a continuation row's near-tie route went the
    // other way; anywhere else is a failure. Nothing after the first parting is compared.
    size_t j = 0;
    while (j < tokens.size() && j < expected.size() && tokens[j] == expected[j]) ++j;
    ASSERT_LT(j, expected.size()) << "fewer tokens than transformers' continuation";
    const std::vector<float> hf_all = read_f32(prefix + "logits_all.npy");
    const int64_t vocab = static_cast<int64_t>(hf_all.size()) / static_cast<int64_t>(prompt["sequence_ids"].size());
    std::vector<float> row(hf_all.begin() + (prompt_len - 1 + static_cast<int64_t>(j)) * vocab,
                           hf_all.begin() + (prompt_len + static_cast<int64_t>(j)) * vocab);
    std::partial_sort(row.begin(), row.begin() + 2, row.end(), std::greater<>());
    const float margin = row[0] - row[1];
    bool flipped = false;
    const moe::RouteArray& ours = *final_event.routes;
    for (int layer : moe_layers) {
      std::vector<int64_t> shape;
      const std::vector<float> router = read_f32(prefix + "router_logits_l" + std::to_string(layer) + ".npy", &shape);
      const std::vector<int64_t> hf_topk = read_ints(prefix + "topk_l" + std::to_string(layer) + ".npy");
      const std::vector<float> group_gap = group_gaps(prefix, layer);
      for (int64_t r = prompt_len; r < prompt_len + static_cast<int64_t>(j) && r < ours.rows; ++r)
        flipped |=
            compare_route_row(router.data() + r * shape[1], shape[1],
                              ours.row_ptr(r) + layer * top_k, hf_topk.data() + r * top_k, top_k,
                              routes_as_sets(fixture), near_tie_gap(GetParam()),
                              static_cast<size_t>(r) < group_gap.size() ? group_gap[r] : INFINITY)
                .flipped;
    }
    std::printf("  prompt %zu: tokens part from transformers' at step %zu (its top-2 margin %.3g%s)\n", p, j,
                margin, flipped ? ", after a flipped near-tie route" : "");
    EXPECT_TRUE(margin < 2 * logits_tolerance(GetParam()) || flipped)
        << "prompt " << p << ": the continuation parts from transformers' at step " << j
        << " where its choice was decisive (margin " << margin << ")";
  }
}

TEST_P(HfGolden, ModularAndFusedKernelsAgreeExactly) {
  const nlohmann::json fixture = read_json(dir() + "/fixture.json");
  if (!fused_runs(fixture)) GTEST_SKIP() << "the fused kernel refuses this family's router";
  if (!fused_reads_experts(dir()))
    GTEST_SKIP() << "the fused kernel refuses this model's experts as loaded for this device (CUDA keeps MXFP4 "
                    "packed, which only cuda-modular reads; cuda-fused takes widths that are multiples of 8; "
                    "auto then runs every step on cuda-modular)";
  Harness modular(dir(), "modular"), fused(dir(), "fused");
  for (const auto& prompt : fixture["prompts"]) {
    std::vector<float> logits_a, logits_b;
    std::vector<int32_t> routes_a, routes_b;
    ASSERT_TRUE(modular.run(ids_of(prompt["sequence_ids"]), logits_a, routes_a).is_ok());
    ASSERT_TRUE(fused.run(ids_of(prompt["sequence_ids"]), logits_b, routes_b).is_ok());
    if (on_cuda()) {
      // Whole-model runs: the kernels' outputs differ by rounding, so later layers' hidden states
      // differ slightly; their routes may then part only where transformers' router logits are a
      // near-tie (same-hidden-state equality is the op harness's bitwise check).
      const int64_t layers = modular.model->config().num_hidden_layers,
                    k = modular.model->config().experts_per_token;
      const std::string prefix =
          dir() + "/p" + std::to_string(&prompt - &fixture["prompts"][0]) + "_";
      int64_t differing = 0;
      for (int layer : modular.model->config().moe_layers()) {
        std::vector<int64_t> shape;
        const std::vector<float> router =
            read_f32(prefix + "router_logits_l" + std::to_string(layer) + ".npy", &shape);
        for (int64_t t = 0; t < shape[0]; ++t) {
          const auto a = routes_a.begin() + (t * layers + layer) * k,
                     b = routes_b.begin() + (t * layers + layer) * k;
          if (std::equal(a, a + k, b)) continue;
          ++differing;
          std::vector<float> sorted(router.begin() + t * shape[1],
                                    router.begin() + (t + 1) * shape[1]);
          std::sort(sorted.begin(), sorted.end(), std::greater<>());
          float gap = INFINITY;
          for (int64_t j = 0; j < std::min<int64_t>(k, shape[1] - 1); ++j)
            gap = std::min(gap, sorted[j] - sorted[j + 1]);
          EXPECT_LT(gap, near_tie_gap(GetParam())) << "layer " << layer << " row " << t
                                         << ": modular and fused differ on a decisive row";
        }
      }
      std::printf("[ %s ] modular vs fused: %lld route rows differ (all near-ties)\n", GetParam(),
                  static_cast<long long>(differing));
      // A row whose routes parted (a near-tie) changes its own later layers and, through the KV
      // cache, every later row: logits are compared on the rows before the first such row.
      int64_t first = static_cast<int64_t>(prompt["sequence_ids"].size());
      for (int64_t t = 0; t < first; ++t)
        if (!std::equal(routes_a.begin() + t * layers * k, routes_a.begin() + (t + 1) * layers * k,
                        routes_b.begin() + t * layers * k))
          first = t;
      const size_t vocab = logits_a.size() / prompt["sequence_ids"].size();
      logits_a.resize(static_cast<size_t>(first) * vocab);
      logits_b.resize(static_cast<size_t>(first) * vocab);
    } else {
      EXPECT_EQ(routes_a, routes_b);
    }
    // The CPU kernels share one accumulation order; CUDA's differ (GEMM tiles vs GEMV) while
    // their routes, computed by the same device functions, must still be identical.
    EXPECT_LE(max_abs_diff(logits_a, logits_b), on_cuda() ? logits_tolerance(GetParam()) : 0.0f);
  }
}

TEST_P(HfGolden, ReplayReproducesCaptureAndForcedRoutesMatchTheHfOracle) {
  const nlohmann::json fixture = read_json(dir() + "/fixture.json");
  for (const char* family : {"modular", "fused"}) {
    if ((!fused_runs(fixture) || !fused_reads_experts(dir())) && std::string(family) == "fused") continue;
    const std::string kernel = kernel_name(family);
    Harness harness(dir(), family);
    for (size_t p = 0; p < fixture["prompts"].size(); ++p) {
      const std::vector<int32_t> sequence = ids_of(fixture["prompts"][p]["sequence_ids"]);
      std::vector<float> logits, replayed_logits, forced_logits;
      std::vector<int32_t> routes, replayed_routes, forced_echo;
      ASSERT_TRUE(harness.run(sequence, logits, routes).is_ok());
      // Replaying the captured routes gives the same logits and routes.
      ASSERT_TRUE(harness.run(sequence, replayed_logits, replayed_routes, &routes).is_ok());
      EXPECT_EQ(max_abs_diff(logits, replayed_logits), 0.0f) << kernel;
      EXPECT_EQ(routes, replayed_routes) << kernel;
      // Replaying different routes gives the logits of HF's forward pass run with those ids.
      const std::string prefix = dir() + "/p" + std::to_string(p) + "_";
      const std::vector<int64_t> forced64 = read_ints(prefix + "forced_routes.npy");
      std::vector<int32_t> forced(forced64.begin(), forced64.end());
      ASSERT_TRUE(harness.run(sequence, forced_logits, forced_echo, &forced).is_ok());
      const std::vector<float> hf_forced = read_f32(prefix + "forced_logits_all.npy");
      EXPECT_LE(max_abs_diff(forced_logits, hf_forced), forced_logits_tolerance(GetParam()))
          << kernel << " prompt " << p;
      EXPECT_GT(max_abs_diff(forced_logits, logits), 1e-2f)
          << "forced routes must change the logits";
      // Replayed rows come back as given (dense layers' rows are 0).
      const auto moe_layers = harness.model->config().moe_layers();
      const int64_t row =
          harness.model->config().num_hidden_layers * harness.model->config().experts_per_token;
      const int64_t k = harness.model->config().experts_per_token;
      for (size_t t = 0; t < sequence.size(); ++t)
        for (int layer : moe_layers)
          for (int64_t j = 0; j < k; ++j)
            ASSERT_EQ(forced_echo[t * row + layer * k + j], forced[t * row + layer * k + j]);
    }
  }
}

std::string checkpoint_name(const ::testing::TestParamInfo<const char*>& info) {
  std::string name = std::strchr(info.param, '/') + 1;
  return name;
}

INSTANTIATE_TEST_SUITE_P(Checkpoints, HfGolden, ::testing::ValuesIn(kCheckpoints), checkpoint_name);

}  // namespace
}  // namespace sy
