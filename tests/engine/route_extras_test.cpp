// Routes for RL trainers through the engine: streamed route pieces add up to the whole log,
// gating weights come with the routes (and are what the kernels wrote), a kernel that leaves a
// weight unwritten fails the request, and the route counters and expert load add up.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>

#include "../test_seed.h"
#include "engine_harness.h"

namespace sy {
namespace {

// Collects every event's streamed piece.
struct Streamed {
  std::vector<moe::RouteArray> pieces;
  Outcome outcome;
};

Streamed run_streamed(Runner& runner, engine::GenerationRequest request) {
  auto promise = std::make_shared<std::promise<Streamed>>();
  auto streamed = std::make_shared<Streamed>();
  auto id =
      runner.engine->submit(std::move(request), [promise, streamed](const engine::Event& event) {
        EXPECT_TRUE(event.new_routes != nullptr) << "every event carries its piece";
        if (event.new_routes) streamed->pieces.push_back(*event.new_routes);
        streamed->outcome.tokens.insert(streamed->outcome.tokens.end(), event.new_token_ids.begin(),
                                        event.new_token_ids.end());
        if (event.finished) {
          streamed->outcome.final_event = event;
          promise->set_value(*streamed);
        }
        return engine::Continuation::kContinue;
      });
  EXPECT_TRUE(id.is_ok()) << id.message();
  return promise->get_future().get();
}

moe::RouteArray concatenate(const std::vector<moe::RouteArray>& pieces) {
  moe::RouteArray all;
  for (const moe::RouteArray& piece : pieces) {
    EXPECT_EQ(piece.first_row, all.rows) << "pieces are contiguous and in order";
    all.layers = piece.layers;
    all.top_k = piece.top_k;
    all.rows += piece.rows;
    all.ids.insert(all.ids.end(), piece.ids.begin(), piece.ids.end());
    all.weights.insert(all.weights.end(), piece.weights.begin(), piece.weights.end());
  }
  return all;
}

TEST(RouteStream, PiecesInOrderEqualTheWholeLogWithWeights) {
  const uint64_t seed = test::test_seed();
  SY_SEED_TRACE(seed);
  std::mt19937_64 rng(seed);
  engine::EngineConfig config = capture_config();
  config.max_num_batched_tokens = 16;  // chunked prefill: the first piece spans several steps
  Runner runner(config);
  ASSERT_TRUE(runner.engine->model_info().route_weights);
  for (int round = 0; round < 3; ++round) {
    engine::GenerationRequest request = greedy(random_prompt(rng, 20 + round * 7), 6 + round);
    request.return_route_weights = true;
    Outcome whole = runner.run(request);
    ASSERT_TRUE(whole.final_event.routes);
    const moe::RouteArray& expected = *whole.final_event.routes;
    ASSERT_EQ(expected.weights.size(), expected.ids.size());

    request.stream_routes = true;
    Streamed streamed = run_streamed(runner, request);
    EXPECT_FALSE(streamed.outcome.final_event.routes) << "streamed: no second copy at the end";
    EXPECT_EQ(streamed.outcome.tokens, whole.tokens);
    ASSERT_GE(streamed.pieces.size(), 2u);
    EXPECT_EQ(streamed.pieces[0].rows, static_cast<int64_t>(request.prompt_ids.size()))
        << "the first piece is the prompt's rows";
    moe::RouteArray joined = concatenate(streamed.pieces);
    EXPECT_EQ(joined.rows, expected.rows);
    EXPECT_EQ(joined.ids, expected.ids);
    EXPECT_EQ(joined.weights, expected.weights);
  }
}

TEST(RouteWeights, AreTheRoutersAndDenseLayersAreZero) {
  // The golden model: 16 experts, top-4, no renormalisation, layer 1 dense. Each MoE row's
  // weights are softmax probabilities of its own ids: positive, descending like the ids'
  // selection order, summing to at most 1.
  Runner runner(capture_config());
  engine::GenerationRequest request = greedy(seeded_prompt(test::test_seed(), 13), 5);
  request.return_route_weights = true;
  Outcome outcome = runner.run(request);
  ASSERT_TRUE(outcome.final_event.routes);
  const moe::RouteArray& r = *outcome.final_event.routes;
  ASSERT_EQ(r.weights.size(), r.ids.size());
  const std::vector<int> moe_layers = runner.engine->model_info().moe_layers;
  for (int64_t row = 0; row < r.rows; ++row) {
    for (int64_t layer = 0; layer < r.layers; ++layer) {
      const bool is_moe =
          std::find(moe_layers.begin(), moe_layers.end(), layer) != moe_layers.end();
      double sum = 0;
      for (int64_t k = 0; k < r.top_k; ++k) {
        const float w = r.weights[static_cast<size_t>((row * r.layers + layer) * r.top_k + k)];
        if (!is_moe) {
          EXPECT_EQ(w, 0.0f);
          continue;
        }
        EXPECT_GT(w, 0.0f);
        if (k > 0) {
          EXPECT_LE(w, r.weights[static_cast<size_t>((row * r.layers + layer) * r.top_k + k - 1)]);
        }
        sum += w;
      }
      if (is_moe) {
        EXPECT_LE(sum, 1.0 + 1e-5);
      }
    }
  }
}

// cpu-modular's routes, but a kernel that says it writes weights and leaves one layer's unwritten.
class SkipsWeightsKernel final : public moe::ExpertsKernel {
 public:
  SkipsWeightsKernel(moe::ExpertsKernel& inner, int skipped) : inner_(inner), skipped_(skipped) {}
  std::string_view name() const override { return "test-skips-weights"; }
  Device device() const override { return Device::kCpu; }
  bool routes_inside() const override { return false; }
  bool captures_routes() const override { return true; }
  bool replays_routes() const override { return true; }
  bool captures_weights() const override { return true; }  // it claims to, and fails to
  Status forward(const moe::MoeForwardArgs& args) override {
    moe::MoeForwardArgs copy = args;
    if (args.layer == skipped_) copy.routes.weights = Tensor();
    return inner_.forward(copy);
  }

 private:
  moe::ExpertsKernel& inner_;
  int skipped_;
};

TEST(RouteWeights, AnUnwrittenWeightFailsTheRequestAndCountsAsPoisoned) {
  engine::EngineConfig config = capture_config();
  config.moe_kernel = "test-skips-weights";
  config.register_extra_kernels = [](moe::ExpertsKernelRegistry& registry) {
    moe::ExpertsKernel* modular = *registry.select("cpu-modular", {Device::kCpu, true, false});
    registry.add(std::make_unique<SkipsWeightsKernel>(*modular, 2));
  };
  Runner runner(config);
  engine::GenerationRequest request = greedy({5, 6, 7, 8}, 3);
  request.return_route_weights = true;
  Outcome outcome = runner.run(request);
  EXPECT_EQ(outcome.final_event.finish_reason, engine::FinishReason::kError);
  EXPECT_NE(outcome.final_event.error.message().find("gating weight"), std::string::npos)
      << outcome.final_event.error.message();
  EXPECT_NE(outcome.final_event.error.message().find("layer 2"), std::string::npos);
  EXPECT_EQ(runner.engine->metrics().routes_poisoned_total, 4) << "the prompt's 4 rows";
  // Without weights the same kernel's routes are fine: the check is about the weight sink.
  Outcome plain = runner.run(greedy({5, 6, 7, 8}, 3));
  EXPECT_EQ(plain.final_event.finish_reason, engine::FinishReason::kLength);
  ASSERT_TRUE(plain.final_event.routes);
}

// A kernel that captures routes but not weights: the engine says so, and refuses such requests.
class NoWeightsKernel final : public moe::ExpertsKernel {
 public:
  explicit NoWeightsKernel(moe::ExpertsKernel& inner) : inner_(inner) {}
  std::string_view name() const override { return "test-no-weights"; }
  Device device() const override { return Device::kCpu; }
  bool routes_inside() const override { return false; }
  bool captures_routes() const override { return true; }
  bool replays_routes() const override { return true; }
  Status forward(const moe::MoeForwardArgs& args) override { return inner_.forward(args); }

 private:
  moe::ExpertsKernel& inner_;
};

TEST(RouteWeights, AKernelWithoutThemIsNamedAndTheRequestRefused) {
  engine::EngineConfig config = capture_config();
  config.moe_kernel = "test-no-weights";
  config.register_extra_kernels = [](moe::ExpertsKernelRegistry& registry) {
    moe::ExpertsKernel* modular = *registry.select("cpu-modular", {Device::kCpu, true, false});
    registry.add(std::make_unique<NoWeightsKernel>(*modular));
  };
  Runner runner(config);
  engine::ModelInfo info = runner.engine->model_info();
  EXPECT_FALSE(info.route_weights);
  EXPECT_NE(info.route_weights_unavailable.find("test-no-weights"), std::string::npos);
  EXPECT_NE(info.route_weights_unavailable.find("cpu-modular"), std::string::npos)
      << "names kernels that can: " << info.route_weights_unavailable;
  engine::GenerationRequest request = greedy({1, 2, 3}, 2);
  request.return_route_weights = true;
  auto refused = runner.engine->submit(
      request, [](const engine::Event&) { return engine::Continuation::kContinue; });
  ASSERT_FALSE(refused.is_ok());
  EXPECT_EQ(refused.status().code(), ErrorCode::kUnsupported);
}

TEST(RouteMetrics, CountersAndExpertLoadAddUpToTheRoutesReturned) {
  const uint64_t seed = test::test_seed();
  SY_SEED_TRACE(seed);
  std::mt19937_64 rng(seed);
  engine::EngineConfig config = capture_config();
  config.enable_prefix_caching = false;
  Runner runner(config);
  engine::EngineMetrics before = runner.engine->metrics();
  const engine::ModelInfo info = runner.engine->model_info();
  ASSERT_EQ(before.moe_layers, info.moe_layers);
  ASSERT_EQ(before.expert_load_tokens.size(),
            info.moe_layers.size() * static_cast<size_t>(info.num_experts));
  for (int64_t load : before.expert_load_tokens) EXPECT_EQ(load, 0);

  // Two plain requests and one that replays 5 rows of the first one's routes.
  std::map<std::pair<int, int32_t>, int64_t> expected_load;  // (moe layer index, expert) -> tokens
  int64_t rows_total = 0;
  auto account = [&](const moe::RouteArray& r) {
    rows_total += r.rows;
    for (int64_t row = 0; row < r.rows; ++row)
      for (size_t m = 0; m < info.moe_layers.size(); ++m)
        for (int64_t k = 0; k < r.top_k; ++k)
          ++expected_load[{static_cast<int>(m), r.at(row, info.moe_layers[m], k)}];
  };
  Outcome first = runner.run(greedy(random_prompt(rng, 17), 4));
  ASSERT_TRUE(first.final_event.routes);
  account(*first.final_event.routes);
  Outcome second = runner.run(greedy(random_prompt(rng, 9), 3));
  ASSERT_TRUE(second.final_event.routes);
  account(*second.final_event.routes);
  engine::GenerationRequest replay = greedy(random_prompt(rng, 8), 2);
  moe::RouteArray given = *first.final_event.routes;
  given.rows = 5;
  given.ids.resize(static_cast<size_t>(5 * given.layers * given.top_k));
  replay.replay = given;
  Outcome replayed = runner.run(replay);
  ASSERT_TRUE(replayed.final_event.routes);
  account(*replayed.final_event.routes);

  engine::EngineMetrics after = runner.engine->metrics();
  EXPECT_EQ(after.routes_replayed_total, 5);
  EXPECT_EQ(after.routes_captured_total, rows_total - 5);
  EXPECT_EQ(after.routes_poisoned_total, 0);
  for (size_t m = 0; m < info.moe_layers.size(); ++m)
    for (int32_t e = 0; e < info.num_experts; ++e) {
      auto it = expected_load.find({static_cast<int>(m), e});
      EXPECT_EQ(after.expert_load_tokens[m * static_cast<size_t>(info.num_experts) + e],
                it == expected_load.end() ? 0 : it->second)
          << "layer " << info.moe_layers[m] << " expert " << e;
    }
}

}  // namespace
}  // namespace sy
