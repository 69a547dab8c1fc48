// The engine under faults (issue 15): KV reservations that fail part-way, preemption in the
// middle of a chunked prefill, weight updates with preempted sequences, one request's failure in
// a shared step. Each test first builds the situation deterministically, asserts that it
// happened (so it cannot pass by not getting there), then asserts what a user would notice.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <mutex>
#include <set>
#include <thread>

#include "../test_seed.h"
#include "backend/backend.h"
#include "engine/engine.h"
#include "engine_harness.h"
#include "model/presets.h"
#include "moe/router.h"
#include "util/status.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

namespace sy {
namespace {

using namespace std::chrono_literals;

// Holds the engine thread inside a request's callback, so that everything submitted meanwhile
// arrives in the same step: release() lets it go. The callback shares the state (the engine
// thread may still be leaving wait() when the gate goes out of scope).
class EngineGate {
 public:
  explicit EngineGate(engine::Engine& engine) {
    engine::GenerationRequest request = greedy({1}, 1);
    request.return_routes = false;
    std::promise<void> entered;
    std::future<void> entered_future = entered.get_future();
    auto shared_entered = std::make_shared<std::promise<void>>(std::move(entered));
    std::shared_future<void> released = release_->get_future().share();
    auto id = engine.submit(request, [shared_entered, released](const engine::Event& event) {
      if (event.finished) {
        shared_entered->set_value();
        released.wait();
      }
      return engine::Continuation::kContinue;
    });
    EXPECT_TRUE(id.is_ok()) << id.message();
    entered_future.wait();
  }
  void release() { release_->set_value(); }

 private:
  std::shared_ptr<std::promise<void>> release_ = std::make_shared<std::promise<void>>();
};

engine::EngineMetrics settled_metrics(engine::Engine& engine) {
  engine::EngineMetrics metrics = engine.metrics();
  for (int i = 0; i < 400 && (metrics.kv_blocks_used != 0 || metrics.running_requests != 0); ++i) {
    std::this_thread::sleep_for(5ms);
    metrics = engine.metrics();
  }
  return metrics;
}

// Bug 1: a waiting sequence whose reservation failed part-way kept the blocks it had taken, so a
// running sequence that then needed one more block was preempted and, finding the cache held by
// a sequence that was not even running, failed with "KV cache too small" although it fits alone.
TEST(EngineFaults, AFailedReservationGivesBackTheBlocksItTook) {
  if (on_cuda()) GTEST_SKIP() << "the scenario depends on the CPU's block count";
  engine::EngineConfig config = capture_config();
  config.block_size_tokens = 16;
  config.kv_cache_tokens = 16 * 6;  // 6 blocks
  config.enable_prefix_caching = false;
  Runner runner(config);
  // A: 40 prompt + 50 generated = 90 tokens, 6 blocks: fits alone, and needs a 4th block at 48.
  engine::GenerationRequest a = greedy(seeded_prompt(1, 40), 50);
  // B: 80 prompt tokens need 5 blocks; while A holds 3 it can take only 3.
  engine::GenerationRequest b = greedy(seeded_prompt(2, 80), 1);
  const Outcome a_alone = runner.run(a);
  ASSERT_EQ(a_alone.final_event.finish_reason, engine::FinishReason::kLength)
      << a_alone.final_event.error.message();
  const Outcome b_alone = runner.run(b);
  ASSERT_EQ(b_alone.final_event.finish_reason, engine::FinishReason::kLength)
      << b_alone.final_event.error.message();

  std::promise<void> a_started;
  std::atomic<bool> signalled{false};
  auto a_done = std::make_shared<std::promise<Outcome>>();
  auto a_outcome = std::make_shared<Outcome>();
  auto a_id = runner.engine->submit(a, [&, a_done, a_outcome](const engine::Event& event) {
    a_outcome->tokens.insert(a_outcome->tokens.end(), event.new_token_ids.begin(),
                             event.new_token_ids.end());
    if (!signalled.exchange(true)) a_started.set_value();
    if (event.finished) {
      a_outcome->final_event = event;
      a_outcome->finished_at = std::chrono::steady_clock::now();
      a_done->set_value(*a_outcome);
    }
    return engine::Continuation::kContinue;
  });
  ASSERT_TRUE(a_id.is_ok());
  a_started.get_future().wait();  // A is running with 3 blocks
  std::future<Outcome> b_future = runner.start(b);
  const Outcome a_together = a_done->get_future().get();
  const Outcome b_together = b_future.get();
  EXPECT_EQ(a_together.final_event.finish_reason, engine::FinishReason::kLength)
      << "A fits the cache alone and must not fail: " << a_together.final_event.error.message();
  EXPECT_EQ(b_together.final_event.finish_reason, engine::FinishReason::kLength)
      << b_together.final_event.error.message();
  if (a_together.final_event.finish_reason == engine::FinishReason::kLength)
    expect_same(a_alone, a_together, "A");
  if (b_together.final_event.finish_reason == engine::FinishReason::kLength)
    expect_same(b_alone, b_together, "B");
  // B could not fit beside A (the reservation that failed part-way): it ran after A.
  EXPECT_LT(a_together.finished_at, b_together.finished_at) << "the scenario needs B to wait for A";
  EXPECT_EQ(settled_metrics(*runner.engine).kv_blocks_used, 0);
}

// Bug 3: a sequence preempted in the middle of its chunked prefill looked the prefix cache up
// again on readmission and counted its own published blocks as cached prompt tokens (and the
// lookup again in the prefix-cache metrics).
TEST(EngineFaults, CachedTokensAreCountedOnceAfterPreemptionInAChunkedPrefill) {
  if (on_cuda()) GTEST_SKIP() << "the scenario depends on the CPU's block count";
  engine::EngineConfig config = capture_config();
  config.block_size_tokens = 16;
  config.kv_cache_tokens = 16 * 5;  // 5 blocks
  config.max_num_batched_tokens = 32;
  Runner runner(config);
  // Step 1: A 32 tokens. Step 2: A 8 (3 blocks) + B 24 (2 blocks, one full and published).
  // Step 3: A decodes, B wants 32 more (4 blocks): none free, B (newest) is preempted.
  engine::GenerationRequest a = greedy(seeded_prompt(3, 40), 3);
  engine::GenerationRequest b = greedy(seeded_prompt(4, 60), 2);
  const engine::EngineMetrics before = runner.engine->metrics();
  std::future<Outcome> a_future, b_future;
  {
    EngineGate gate(*runner.engine);
    a_future = runner.start(a);
    b_future = runner.start(b);
    gate.release();
  }
  const Outcome a_out = a_future.get(), b_out = b_future.get();
  ASSERT_EQ(a_out.final_event.finish_reason, engine::FinishReason::kLength)
      << a_out.final_event.error.message();
  ASSERT_EQ(b_out.final_event.finish_reason, engine::FinishReason::kLength)
      << b_out.final_event.error.message();
  const engine::EngineMetrics after = settled_metrics(*runner.engine);
  ASSERT_GT(after.preemptions_total, before.preemptions_total)
      << "the scenario needs B to be preempted";
  EXPECT_EQ(a_out.cached_prompt_tokens, 0);
  EXPECT_EQ(b_out.cached_prompt_tokens, 0) << "B's own blocks are not cached prompt tokens";
  EXPECT_EQ(after.prefix_cache_hits_tokens - before.prefix_cache_hits_tokens, 0)
      << "no prompt shares a prefix with another: nothing was served from the cache";
  EXPECT_EQ(after.prefix_cache_queries_tokens - before.prefix_cache_queries_tokens,
            static_cast<int64_t>(a.prompt_ids.size() + b.prompt_ids.size() + 1))
      << "each prompt is looked up once (the gate's 1-token prompt included)";
}

// A random-weight checkpoint with kModel's shapes (made once per seed, in the build folder).
std::string random_model(uint64_t seed) {
  const std::string dir =
      std::string(SY_BINARY_DIR) + "/engine_faults_model_" + std::to_string(seed);
  if (std::filesystem::exists(dir + "/model.safetensors")) return dir;
  std::ifstream config_file(kModel + "/config.json");
  const nlohmann::json config = nlohmann::json::parse(config_file);
  Status status =
      model::write_random_checkpoint(config, nlohmann::json::object(), dir, seed, false);
  EXPECT_TRUE(status.is_ok()) << status.message();
  return dir;
}

// Bug 2: a weight update waited for running sequences only; a sequence preempted meanwhile (its
// KV and route log computed with the old weights) resumed on the new ones, so its tokens and
// routes came from two models. Every result must equal the request run alone on one of them.
TEST(EngineFaults, AWeightUpdateDrainsPreemptedSequences) {
  if (on_cuda())
    GTEST_SKIP() << "compares batched results with results alone (CPU batch invariance)";
  const std::string old_model = random_model(11), new_model = random_model(12);
  std::vector<engine::GenerationRequest> requests;
  for (int i = 0; i < 8; ++i) requests.push_back(greedy(seeded_prompt(100 + i, 20 + 3 * i), 40));
  std::vector<Outcome> on_old, on_new;
  {
    engine::EngineConfig config = capture_config();
    config.model_dir = old_model;
    Runner runner(config);
    for (const auto& request : requests) on_old.push_back(runner.run(request));
    ASSERT_TRUE(runner.engine->update_weights_from_disk(new_model).is_ok());
    for (const auto& request : requests) on_new.push_back(runner.run(request));
  }
  for (size_t i = 0; i < requests.size(); ++i)
    ASSERT_NE(on_old[i].final_event.routes->ids, on_new[i].final_event.routes->ids)
        << "the two models must tell their outputs apart";
  // A cache far too small for all of them (each fits alone): preemption all along.
  engine::EngineConfig config = capture_config();
  config.model_dir = old_model;
  config.block_size_tokens = 16;
  config.kv_cache_tokens = 16 * 12;
  config.max_num_batched_tokens = 32;
  Runner runner(config);
  std::vector<std::future<Outcome>> pending = runner.start_together(requests);
  // Update once the cache is contended and sequences have been preempted.
  for (int i = 0; i < 2000 && runner.engine->metrics().preemptions_total < 2; ++i)
    std::this_thread::sleep_for(1ms);
  ASSERT_GE(runner.engine->metrics().preemptions_total, 2)
      << "the scenario needs preempted sequences";
  ASSERT_TRUE(runner.engine->update_weights_from_disk(new_model).is_ok());
  int old_count = 0, new_count = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    const Outcome together = pending[i].get();
    ASSERT_EQ(together.final_event.finish_reason, engine::FinishReason::kLength)
        << together.final_event.error.message();
    ASSERT_TRUE(together.final_event.routes);
    const bool is_old = together.tokens == on_old[i].tokens &&
                        together.final_event.routes->ids == on_old[i].final_event.routes->ids;
    const bool is_new = together.tokens == on_new[i].tokens &&
                        together.final_event.routes->ids == on_new[i].final_event.routes->ids;
    EXPECT_TRUE(is_old || is_new) << "request " << i << " mixes the old and the new weights";
    old_count += is_old;
    new_count += is_new;
  }
  EXPECT_GT(old_count, 0) << "some requests were in flight at the update";
  std::printf("weight update mid-flight: %d requests on the old weights, %d on the new\n",
              old_count, new_count);
}

// Forced routes are part of the prefix hash, over prompts longer than one block: the same prompt
// with the same replay hits the cache (routes as given), with another replay or none it does not.
TEST(EngineFaults, ForcedRoutesSeparatePrefixHitsAcrossSeveralBlocks) {
  Runner runner(capture_config());
  const std::vector<int32_t> prompt = seeded_prompt(41, 40);  // two full blocks and a part
  auto replay_of = [](int salt) {
    moe::RouteArray routes{40, 4, 4, std::vector<int32_t>(40 * 16)};
    for (int64_t row = 0; row < 40; ++row)
      for (int layer = 0; layer < 4; ++layer)
        for (int k = 0; k < 4; ++k)
          routes.ids[(row * 4 + layer) * 4 + k] =
              static_cast<int32_t>((row + layer + salt + 4 * k) % 16);
    return routes;
  };
  auto forced = [&](int salt) {
    engine::GenerationRequest request = greedy(prompt, 3);
    request.replay = replay_of(salt);
    return request;
  };
  auto given_rows_returned = [&](const Outcome& out, int salt) {
    const moe::RouteArray expected = replay_of(salt);
    for (int64_t row = 0; row < 40; ++row)
      for (int layer : {0, 2, 3})
        for (int k = 0; k < 4; ++k)
          if (out.final_event.routes->at(row, layer, k) != expected.at(row, layer, k)) return false;
    return true;
  };
  const Outcome first = runner.run(forced(1));
  EXPECT_EQ(first.cached_prompt_tokens, 0);
  ASSERT_TRUE(first.final_event.routes);
  EXPECT_TRUE(given_rows_returned(first, 1));
  const Outcome again = runner.run(forced(1));
  EXPECT_EQ(again.cached_prompt_tokens, 32) << "same tokens, same forced routes: two blocks hit";
  expect_same(first, again, "same replay");
  const Outcome other = runner.run(forced(2));
  EXPECT_EQ(other.cached_prompt_tokens, 0) << "other forced routes: no block may hit";
  EXPECT_TRUE(given_rows_returned(other, 2));
  const Outcome free_run = runner.run(greedy(prompt, 3));
  EXPECT_EQ(free_run.cached_prompt_tokens, 0)
      << "free routing does not hit blocks computed under a replay";
  const Outcome free_again = runner.run(greedy(prompt, 3));
  EXPECT_EQ(free_again.cached_prompt_tokens, 32);
  expect_same(free_run, free_again, "free");
}

// ---- Deliberately broken kernels (test-only) ----

// Delegates to cpu-modular; claims replay but fails at it: `poison` leaves the forced rows'
// routes unwritten (the poison stays), otherwise it refuses the step with an error.
class FailsReplayKernel final : public moe::ExpertsKernel {
 public:
  FailsReplayKernel(moe::ExpertsKernel& inner, bool poison) : inner_(inner), poison_(poison) {}
  std::string_view name() const override {
    return poison_ ? "test-poisons-replay" : "test-refuses-replay";
  }
  Device device() const override { return Device::kCpu; }
  bool routes_inside() const override { return false; }
  bool captures_routes() const override { return true; }
  bool replays_routes() const override { return true; }
  Status forward(const moe::MoeForwardArgs& args) override {
    const int64_t tokens = args.hidden.dim(0);
    const auto* forced = static_cast<const uint8_t*>(args.routes.forced.data);
    bool any_forced = false;
    for (int64_t t = 0; forced && t < tokens; ++t) any_forced |= forced[t] != 0;
    if (any_forced && !poison_)
      return Status::error(ErrorCode::kUnsupported, "test-refuses-replay cannot replay this row");
    SY_TRY(inner_.forward(args));
    if (!any_forced || !args.routes.sink.data) return Status::ok();
    auto* sink = static_cast<int32_t*>(args.routes.sink.data);
    const int64_t layers = args.routes.sink.dim(1), top_k = args.routes.sink.dim(2);
    for (int64_t t = 0; t < tokens; ++t)
      if (forced[t])
        std::fill_n(sink + (t * layers + args.layer) * top_k, top_k, moe::kRoutePoison);
    return Status::ok();
  }

 private:
  moe::ExpertsKernel& inner_;
  bool poison_;
};

class CapturesButCannotReplayKernel final : public moe::ExpertsKernel {
 public:
  explicit CapturesButCannotReplayKernel(moe::ExpertsKernel& inner) : inner_(inner) {}
  std::string_view name() const override { return "test-no-replay"; }
  Device device() const override { return Device::kCpu; }
  bool routes_inside() const override { return false; }
  bool captures_routes() const override { return true; }
  bool replays_routes() const override { return false; }
  Status forward(const moe::MoeForwardArgs& args) override { return inner_.forward(args); }

 private:
  moe::ExpertsKernel& inner_;
};

// Bug 5 (first half): with capture on, a kernel that captures but cannot replay was accepted; a
// sequence recomputed after preemption then ran free and its KV came from routes other than the
// ones it returns. Capture now needs replay; without capture the kernel is fine.
TEST(EngineFaults, CaptureWithAKernelThatCannotReplayIsRefused) {
  auto add_kernel = [](moe::ExpertsKernelRegistry& registry) {
    registry.add(std::make_unique<CapturesButCannotReplayKernel>(
        **registry.select("cpu-modular", {Device::kCpu, false, false})));
  };
  engine::EngineConfig config = capture_config();
  config.model_dir = kModel;
  config.moe_kernel = "test-no-replay";
  config.register_extra_kernels = add_kernel;
  auto refused = engine::create_engine(config);
  ASSERT_FALSE(refused.is_ok()) << "capture with a kernel that cannot replay must be refused";
  EXPECT_NE(refused.message().find("cannot replay"), std::string::npos) << refused.message();
  EXPECT_NE(refused.message().find("preemption"), std::string::npos) << refused.message();
  EXPECT_NE(refused.message().find("cpu-modular"), std::string::npos) << refused.message();
  config.capture_routes = false;
  auto accepted = engine::create_engine(config);
  EXPECT_TRUE(accepted.is_ok()) << accepted.message();
}

// Bug 9: one request's failure in the forward pass failed every request in the step. A replay
// the kernel cannot honour (poisoned routes, or an error) now fails that request alone; the
// others in the same step finish with the results they get alone.
class OneFailureInAStep : public ::testing::TestWithParam<bool> {};

TEST_P(OneFailureInAStep, FailsThatRequestAloneAndKeepsTheOthers) {
  const bool poison = GetParam();
  engine::EngineConfig config = capture_config();
  config.moe_kernel = poison ? "test-poisons-replay" : "test-refuses-replay";
  config.register_extra_kernels = [poison](moe::ExpertsKernelRegistry& registry) {
    registry.add(std::make_unique<FailsReplayKernel>(
        **registry.select("cpu-modular", {Device::kCpu, true, true}), poison));
  };
  Runner runner(config);
  const engine::GenerationRequest a = greedy(seeded_prompt(21, 12), 8),
                                  c = greedy(seeded_prompt(23, 30), 5);
  engine::GenerationRequest b = greedy(seeded_prompt(22, 9), 4);
  b.replay = moe::RouteArray{3, 4, 4, std::vector<int32_t>(3 * 16)};
  for (size_t i = 0; i < b.replay->ids.size(); ++i) b.replay->ids[i] = static_cast<int32_t>(i % 4);
  const Outcome a_alone = runner.run(a), c_alone = runner.run(c);
  ASSERT_EQ(a_alone.final_event.finish_reason, engine::FinishReason::kLength);
  const engine::EngineMetrics before = runner.engine->metrics();
  std::future<Outcome> a_future, b_future, c_future;
  {
    EngineGate gate(*runner.engine);  // all three arrive in the same step
    a_future = runner.start(a);
    b_future = runner.start(b);
    c_future = runner.start(c);
    gate.release();
  }
  const Outcome b_out = b_future.get();
  EXPECT_EQ(b_out.final_event.finish_reason, engine::FinishReason::kError);
  EXPECT_FALSE(b_out.final_event.routes != nullptr);
  if (poison)
    EXPECT_NE(b_out.final_event.error.message().find("MoE layer"), std::string::npos)
        << b_out.final_event.error.message();
  else
    EXPECT_NE(b_out.final_event.error.message().find("cannot replay"), std::string::npos)
        << b_out.final_event.error.message();
  const Outcome a_out = a_future.get(), c_out = c_future.get();
  ASSERT_EQ(a_out.final_event.finish_reason, engine::FinishReason::kLength)
      << "A shared B's step and must not fail with it: " << a_out.final_event.error.message();
  ASSERT_EQ(c_out.final_event.finish_reason, engine::FinishReason::kLength)
      << c_out.final_event.error.message();
  expect_same(a_alone, a_out, "A");
  expect_same(c_alone, c_out, "C");
  const engine::EngineMetrics after = settled_metrics(*runner.engine);
  EXPECT_EQ(after.route_capture_errors_total - before.route_capture_errors_total, poison ? 1 : 0);
  EXPECT_EQ(after.kv_blocks_used, 0);
}

INSTANTIATE_TEST_SUITE_P(PoisonOrError, OneFailureInAStep, ::testing::Bool());

// Bug 6 (per-step copy of each output): the sampler still sees every output token. A strong
// frequency penalty under greedy decoding never repeats a generated token.
TEST(EngineFaults, PenaltiesSeeEveryOutputToken) {
  Runner runner(engine::EngineConfig{});
  engine::GenerationRequest request = greedy(seeded_prompt(31, 5), 40);
  request.return_routes = false;
  request.sampling.frequency_penalty = 1000.0f;
  const Outcome out = runner.run(request);
  ASSERT_EQ(out.tokens.size(), 40u);
  std::set<int32_t> distinct(out.tokens.begin(), out.tokens.end());
  EXPECT_EQ(distinct.size(), out.tokens.size()) << "a penalised token came back";
  request.sampling.frequency_penalty = 0.0f;
  const Outcome free_run = runner.run(request);
  std::set<int32_t> free_distinct(free_run.tokens.begin(), free_run.tokens.end());
  EXPECT_LT(free_distinct.size(), free_run.tokens.size())
      << "without the penalty this model repeats itself";
}

}  // namespace
}  // namespace sy
