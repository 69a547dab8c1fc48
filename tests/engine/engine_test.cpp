// The engine's route guarantees on the CPU backend: routes under batching, chunked prefill,
// prefix-cache hits and preemption equal the routes of the request run alone; the poison check
// catches a kernel that skips a layer; the capability guard refuses a kernel that cannot capture.
#include <gtest/gtest.h>

#include <cstdlib>

#include <future>
#include <set>
#include <random>
#include <thread>

#include "backend/backend.h"
#include "engine/engine.h"
#include "engine_harness.h"
#include "../test_seed.h"
#include "model/decoder.h"

namespace sy {
namespace {

TEST(Engine, RoutesUnderConcurrencyChunkingPrefixHitsAndPreemptionEqualRoutesAlone) {
  // Bitwise alone-vs-batched equality is the CPU backend's batch invariance; CUDA steps are not
  // batch-invariant (GEMV vs GEMM by batch size) until the --batch-invariant mode exists.
  if (on_cuda()) GTEST_SKIP() << "CUDA is not batch-invariant (DESIGN.md)";
  const uint64_t seed = test::test_seed();
  SY_SEED_TRACE(seed);
  std::mt19937_64 rng(seed);
  std::vector<engine::GenerationRequest> requests;
  const std::vector<int32_t> shared = random_prompt(rng, 40);
  for (int i = 0; i < 12; ++i) {
    std::vector<int32_t> prompt = i % 3 == 0 ? shared : random_prompt(rng, 5 + 9 * i);
    if (i % 3 == 0) {
      auto suffix = random_prompt(rng, 3 + i);
      prompt.insert(prompt.end(), suffix.begin(), suffix.end());
    }
    requests.push_back(greedy(prompt, 6 + i % 5));
  }
  // Alone: one request at a time, no prefix cache, big token budget.
  std::vector<Outcome> alone;
  {
    engine::EngineConfig config = capture_config();
    config.enable_prefix_caching = false;
    Runner runner(config);
    for (const auto& request : requests) alone.push_back(runner.run(request));
  }
  for (size_t i = 0; i < alone.size(); ++i) {
    ASSERT_TRUE(alone[i].final_event.routes);
    EXPECT_EQ(alone[i].final_event.routes->rows,
              static_cast<int64_t>(requests[i].prompt_ids.size() + alone[i].tokens.size()) - 1);
  }
  // Together, in a small cache with small steps: chunked prefill, prefix hits, preemption.
  engine::EngineConfig config = capture_config();
  config.max_num_batched_tokens = 24;
  config.kv_cache_tokens = 16 * 12;
  config.block_size_tokens = 16;
  Runner runner(config);
  std::vector<std::future<Outcome>> pending = runner.start_together(requests);
  for (size_t i = 0; i < requests.size(); ++i) expect_same(alone[i], pending[i].get(), "request " + std::to_string(i));
  // Repeat after they finished: full prefix-cache hits, routes restored from the blocks.
  const engine::EngineMetrics before = runner.engine->metrics();
  for (size_t i = 0; i < requests.size(); i += 3) expect_same(alone[i], runner.run(requests[i]), "repeat " + std::to_string(i));
  // Metrics are published after the step that delivered the final event: let it settle.
  engine::EngineMetrics after = runner.engine->metrics();
  for (int i = 0; i < 200 && after.kv_blocks_used != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    after = runner.engine->metrics();
  }
  EXPECT_GT(after.preemptions_total, 0) << "the cache was meant to be too small";
  EXPECT_GT(after.prefix_cache_hits_tokens, before.prefix_cache_hits_tokens);
  EXPECT_LT(after.prompt_tokens_computed - before.prompt_tokens_computed,
            after.prompt_tokens_total - before.prompt_tokens_total)
      << "a prefix hit skips prefill compute";
  EXPECT_EQ(after.kv_blocks_used, 0) << "finished requests hold no blocks";
  // The engine's host timers (routes_cost_bench splits capture's cost with them): each part ran,
  // and the route total is its two parts.
  EXPECT_GT(after.route_check_seconds_total, 0);
  EXPECT_GT(after.route_log_seconds_total, 0);
  EXPECT_GT(after.prefix_publish_seconds_total, 0);
  EXPECT_NEAR(after.route_host_seconds_total, after.route_check_seconds_total + after.route_log_seconds_total,
              1e-9 * after.step_seconds_total);
  EXPECT_LT(after.route_host_seconds_total + after.prefix_publish_seconds_total, after.step_seconds_total);
}

TEST(Engine, PromptLogprobsOncePerPositionUnderChunkingAndPreemption) {
  // Bitwise alone-vs-batched equality is the CPU backend's batch invariance; CUDA steps are not
  // batch-invariant (GEMV vs GEMM by batch size) until the --batch-invariant mode exists.
  if (on_cuda()) GTEST_SKIP() << "CUDA is not batch-invariant (DESIGN.md)";
  const uint64_t seed = test::test_seed();
  SY_SEED_TRACE(seed);
  std::mt19937_64 rng(seed);
  std::vector<engine::GenerationRequest> requests;
  for (int i = 0; i < 10; ++i) {
    engine::GenerationRequest request = greedy(random_prompt(rng, 20 + 7 * i), 4 + i % 3);
    if (i % 4 != 3) request.sampling.prompt_logprobs = i % 3;
    requests.push_back(request);
  }
  std::vector<Outcome> alone;
  {
    engine::EngineConfig config = capture_config();
    config.enable_prefix_caching = false;
    Runner runner(config);
    for (const auto& request : requests) alone.push_back(runner.run(request));
  }
  // Small steps, at most 5 scored prompt positions a step, a cache too small for all of them.
  engine::EngineConfig config = capture_config();
  config.max_num_batched_tokens = 24;
  config.max_prompt_logprob_rows = 5;
  config.kv_cache_tokens = 16 * 12;
  config.block_size_tokens = 16;
  Runner runner(config);
  std::vector<std::future<Outcome>> pending = runner.start_together(requests);
  for (size_t i = 0; i < requests.size(); ++i) {
    const Outcome together = pending[i].get();
    const std::string what = "request " + std::to_string(i);
    expect_same(alone[i], together, what);
    const size_t expected = requests[i].sampling.prompt_logprobs >= 0 ? requests[i].prompt_ids.size() - 1 : 0;
    ASSERT_EQ(alone[i].prompt_logprobs.size(), expected) << what;
    ASSERT_EQ(together.prompt_logprobs.size(), expected) << what << ": one entry per prompt position 1..P-1";
    for (size_t p = 0; p < expected; ++p) {
      const auto& a = alone[i].prompt_logprobs[p];
      const auto& b = together.prompt_logprobs[p];
      EXPECT_EQ(a.token_id, requests[i].prompt_ids[p + 1]) << what << " position " << p + 1;
      EXPECT_EQ(b.token_id, a.token_id) << what << " position " << p + 1;
      EXPECT_EQ(b.logprob, a.logprob) << what << " position " << p + 1 << " (batch-invariant)";
      ASSERT_EQ(b.top.size(), a.top.size()) << what;
      ASSERT_EQ(a.top.size(), static_cast<size_t>(requests[i].sampling.prompt_logprobs)) << what;
      for (size_t k = 0; k < a.top.size(); ++k) {
        EXPECT_EQ(b.top[k].token_id, a.top[k].token_id) << what;
        EXPECT_EQ(b.top[k].logprob, a.top[k].logprob) << what;
      }
    }
  }
  EXPECT_GT(runner.engine->metrics().preemptions_total, 0) << "the cache was meant to be too small";
}

TEST(Engine, RouteRowsCoverEveryInputPosition) {
  Runner runner(capture_config());
  Outcome outcome = runner.run(greedy({5, 6, 7}, 4));
  ASSERT_TRUE(outcome.final_event.routes);
  const auto& routes = *outcome.final_event.routes;
  EXPECT_EQ(routes.rows, 3 + 4 - 1);  // N - 1: the last sampled token never went in
  EXPECT_EQ(routes.layers, 4);
  EXPECT_EQ(routes.top_k, 4);
  for (int64_t row = 0; row < routes.rows; ++row) {
    for (int k = 0; k < 4; ++k) EXPECT_EQ(routes.at(row, 1, k), 0) << "layer 1 is dense";
    for (int layer : {0, 2, 3}) {
      std::set<int32_t> ids;
      for (int k = 0; k < 4; ++k) ids.insert(routes.at(row, layer, k));
      EXPECT_EQ(ids.size(), 4u);
      EXPECT_LT(*ids.rbegin(), 16);
    }
  }
}

TEST(Engine, ReplayThroughTheEngineForcesTheGivenRoutes) {
  Runner runner(capture_config());
  Outcome free_run = runner.run(greedy({11, 12, 13, 14, 15}, 5));
  // Replay the rollout: same tokens, same routes.
  engine::GenerationRequest replay = greedy({11, 12, 13, 14, 15}, 5);
  moe::RouteArray rows = *free_run.final_event.routes;
  rows.rows = 5;
  rows.ids.resize(static_cast<size_t>(5 * rows.layers * rows.top_k));
  replay.replay = rows;
  expect_same(free_run, runner.run(replay), "replayed");
  // Different routes: the returned rows are the given ones.
  engine::GenerationRequest other = greedy({11, 12, 13, 14, 15}, 2);
  moe::RouteArray forced = rows;
  for (int64_t row = 0; row < 5; ++row)
    for (int layer : {0, 2, 3})
      for (int k = 0; k < 4; ++k) forced.ids[(row * 4 + layer) * 4 + k] = static_cast<int32_t>((row + layer + 3 * k) % 16);
  other.replay = forced;
  Outcome forced_run = runner.run(other);
  for (int64_t i = 0; i < 5 * 16; ++i) EXPECT_EQ(forced_run.final_event.routes->ids[i], forced.ids[i]);
}

TEST(Engine, InvalidReplayAndRequestsAreErrors) {
  Runner runner(capture_config());
  auto submit = [&](engine::GenerationRequest request) {
    return runner.engine->submit(std::move(request), [](const engine::Event&) { return engine::Continuation::kContinue; });
  };
  engine::GenerationRequest request = greedy({1, 2, 3}, 2);
  request.replay = moe::RouteArray{2, 4, 4, std::vector<int32_t>(32, 0)};
  for (int64_t i = 0; i < 32; ++i) request.replay->ids[i] = static_cast<int32_t>(i % 4);
  EXPECT_TRUE(submit(request).is_ok());
  request.replay->ids[0] = 16;  // id >= experts
  auto bad_id = submit(request);
  ASSERT_FALSE(bad_id.is_ok());
  EXPECT_NE(bad_id.message().find("out of range"), std::string::npos) << bad_id.message();
  request.replay->ids[0] = request.replay->ids[1];  // duplicate in a row
  auto duplicate = submit(request);
  ASSERT_FALSE(duplicate.is_ok());
  EXPECT_NE(duplicate.message().find("twice"), std::string::npos) << duplicate.message();
  request.replay = moe::RouteArray{2, 3, 4, std::vector<int32_t>(24, 0)};  // wrong shape
  EXPECT_FALSE(submit(request).is_ok());
  request.replay = moe::RouteArray{4, 4, 4, std::vector<int32_t>(64, 0)};  // more rows than prompt
  EXPECT_FALSE(submit(request).is_ok());
  EXPECT_FALSE(submit(greedy({}, 2)).is_ok());
  EXPECT_FALSE(submit(greedy({1, 100000}, 2)).is_ok());
  EXPECT_FALSE(submit(greedy({1}, 5000)).is_ok());
}

TEST(Engine, SeededSamplingIsReproducibleAloneAndInABatch) {
  // Bitwise alone-vs-batched equality is the CPU backend's batch invariance; CUDA steps are not
  // batch-invariant (GEMV vs GEMM by batch size) until the --batch-invariant mode exists.
  if (on_cuda()) GTEST_SKIP() << "CUDA is not batch-invariant (DESIGN.md)";
  engine::EngineConfig config;
  Runner runner(config);
  engine::GenerationRequest request = greedy({3, 4, 5, 6}, 10);
  request.return_routes = false;
  request.sampling.temperature = 1.0f;
  request.sampling.top_p = 0.9f;
  request.sampling.seed = 1234;
  Outcome alone = runner.run(request);
  std::vector<std::future<Outcome>> batch;
  std::mt19937_64 rng(7);
  for (int i = 0; i < 6; ++i) {
    engine::GenerationRequest noise = greedy(random_prompt(rng, 9 + i), 10);
    noise.return_routes = false;
    noise.sampling.temperature = 1.0f;
    batch.push_back(runner.start(noise));
    if (i == 2) batch.push_back(runner.start(request));
  }
  Outcome together = batch[3].get();
  for (size_t i = 0; i < batch.size(); ++i)
    if (i != 3) batch[i].wait();
  EXPECT_EQ(alone.tokens, together.tokens);
  request.sampling.seed = 99;
  EXPECT_NE(runner.run(request).tokens, alone.tokens);
}

TEST(Engine, CancelFreesBlocks) {
  engine::EngineConfig config;
  config.max_num_batched_tokens = 8;
  Runner runner(config);
  std::promise<void> started;
  bool signalled = false;
  engine::GenerationRequest request = greedy(std::vector<int32_t>(64, 7), 200);
  request.return_routes = false;
  auto id = runner.engine->submit(request, [&](const engine::Event& event) {
    if (!signalled && !event.new_token_ids.empty()) {
      signalled = true;
      started.set_value();
    }
    return engine::Continuation::kContinue;
  });
  ASSERT_TRUE(id.is_ok());
  started.get_future().wait();
  runner.engine->cancel(*id);
  for (int i = 0; i < 200 && runner.engine->metrics().kv_blocks_used != 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(runner.engine->metrics().kv_blocks_used, 0);
  EXPECT_EQ(runner.engine->metrics().running_requests, 0);
}

TEST(Engine, StopFromTheCallbackEndsWithRoutes) {
  Runner runner(capture_config());
  std::promise<engine::Event> done;
  int events = 0;
  auto id = runner.engine->submit(greedy({1, 2, 3}, 50), [&](const engine::Event& event) {
    if (event.finished) {
      done.set_value(event);
      return engine::Continuation::kContinue;
    }
    return ++events == 3 ? engine::Continuation::kStop : engine::Continuation::kContinue;
  });
  ASSERT_TRUE(id.is_ok());
  engine::Event final_event = done.get_future().get();
  EXPECT_EQ(final_event.finish_reason, engine::FinishReason::kStop);
  ASSERT_TRUE(final_event.routes);
  EXPECT_EQ(final_event.routes->rows, 3 + 3 - 1);
}

// ---- Deliberately broken kernels (test-only) ----

// Delegates to cpu-modular but leaves one layer's routes unwritten.
// Leaves layer `skipped`'s routes unwritten in steps of at least `min_tokens` tokens.
class SkipsLayerKernel final : public moe::ExpertsKernel {
 public:
  SkipsLayerKernel(moe::ExpertsKernel& inner, int skipped, int64_t min_tokens = 0)
      : inner_(inner), skipped_(skipped), min_tokens_(min_tokens) {}
  std::string_view name() const override { return "test-skips-layer"; }
  Device device() const override { return Device::kCpu; }
  bool routes_inside() const override { return false; }
  bool captures_routes() const override { return true; }  // it claims to, and fails to
  bool replays_routes() const override { return true; }   // cpu-modular's replay, passed through
  Status forward(const moe::MoeForwardArgs& args) override {
    moe::MoeForwardArgs copy = args;
    if (args.layer == skipped_ && args.hidden.dim(0) >= min_tokens_) copy.routes.sink = Tensor();
    return inner_.forward(copy);
  }

 private:
  moe::ExpertsKernel& inner_;
  int skipped_;
  int64_t min_tokens_;
};

class NoCaptureKernel final : public moe::ExpertsKernel {
 public:
  explicit NoCaptureKernel(moe::ExpertsKernel& inner) : inner_(inner) {}
  std::string_view name() const override { return "test-no-capture"; }
  Device device() const override { return Device::kCpu; }
  bool routes_inside() const override { return true; }
  bool captures_routes() const override { return false; }
  bool replays_routes() const override { return false; }
  Status forward(const moe::MoeForwardArgs& args) override { return inner_.forward(args); }

 private:
  moe::ExpertsKernel& inner_;
};

TEST(RouteCapture, AnUnwrittenRouteIsAnErrorNamingLayerAndKernel) {
  auto backend = backend::make_cpu_backend({1});
  moe::ExpertsKernelRegistry registry;
  backend->register_kernels(registry);
  auto modular = registry.select("cpu-modular", {Device::kCpu, true, false});
  ASSERT_TRUE(modular.is_ok());
  SkipsLayerKernel broken(**modular, 2);
  auto model = model::Model::load(kModel, *backend);
  ASSERT_TRUE(model.is_ok()) << model.message();
  model::Decoder decoder(*backend, {&broken, nullptr, 0}, 16);
  ASSERT_TRUE(decoder.allocate((*model)->config(), 4, {16, 1, 4, 16}).is_ok());
  model::StepInputs in;
  in.token_ids = {1, 2, 3};
  in.positions = {0, 1, 2};
  in.token_seq = {0, 0, 0};
  in.slot_mapping = {0, 1, 2};
  in.block_tables = {0};
  in.num_seqs = 1;
  in.max_blocks_per_seq = 1;
  in.logits_rows = {2};
  in.capture_routes = true;
  model::StepOutputs out;
  Status status = decoder.forward(**model, in, out);
  if (status) status = decoder.finish_step(**model, out);
  ASSERT_FALSE(status.is_ok());
  EXPECT_EQ(status.code(), ErrorCode::kInternal);
  EXPECT_NE(status.message().find("layer 2"), std::string::npos) << status.message();
  EXPECT_NE(status.message().find("test-skips-layer"), std::string::npos) << status.message();
  // The same kernel with layer 2 intact passes: the check is about the skipped layer.
  SkipsLayerKernel skips_nothing(**modular, -1);
  model::Decoder good(*backend, {&skips_nothing, nullptr, 0}, 16);
  ASSERT_TRUE(good.allocate((*model)->config(), 4, {16, 1, 4, 16}).is_ok());
  EXPECT_TRUE(good.forward(**model, in, out).is_ok());
  EXPECT_TRUE(good.finish_step(**model, out).is_ok());
}

TEST(RouteCapture, TheEngineFailsTheRequestAndKeepsServing) {
  moe::ExpertsKernel* modular = nullptr;
  engine::EngineConfig config = capture_config();
  config.moe_kernel = "test-skips-layer";
  config.register_extra_kernels = [&](moe::ExpertsKernelRegistry& registry) {
    modular = *registry.select("cpu-modular", {Device::kCpu, true, false});
    registry.add(std::make_unique<SkipsLayerKernel>(*modular, 3));
  };
  Runner runner(config);
  Outcome outcome = runner.run(greedy({1, 2, 3}, 3));
  EXPECT_EQ(outcome.final_event.finish_reason, engine::FinishReason::kError);
  EXPECT_NE(outcome.final_event.error.message().find("layer 3"), std::string::npos);
  EXPECT_FALSE(outcome.final_event.routes != nullptr) << "poison never reaches a client";
  EXPECT_EQ(runner.engine->metrics().route_capture_errors_total, 1);
  EXPECT_EQ(runner.engine->metrics().kv_blocks_used, 0);
}

// A large step's routes are collected and logged in pieces of layers (Decoder::
// collect_route_piece; the tiny model's MoE layers 0, 2, 3 make three). A kernel that leaves layer
// 2 unwritten in steps of 64 tokens or more poisons the middle piece of the step that holds a
// 100-token prompt beside a running request: the first piece was already logged into the running
// request's log, so the failure must undo it; the rerun alone (a one-token step, not poisoned)
// then logs it once. The running request's tokens and routes equal a healthy engine's.
TEST(RouteCapture, APoisonedMiddlePieceUndoesTheLogsItsFirstPieceGrew) {
  const engine::GenerationRequest running = greedy({5, 9, 2, 7, 11}, 40);
  std::vector<int32_t> long_prompt;
  for (int i = 0; i < 100; ++i) long_prompt.push_back(1 + (i * 37) % 400);
  Outcome reference;
  {
    Runner healthy(capture_config());
    reference = healthy.run(running);
  }
  moe::ExpertsKernel* modular = nullptr;
  engine::EngineConfig config = capture_config();
  config.moe_kernel = "test-skips-layer";
  config.register_extra_kernels = [&](moe::ExpertsKernelRegistry& registry) {
    modular = *registry.select("cpu-modular", {Device::kCpu, true, false});
    registry.add(std::make_unique<SkipsLayerKernel>(*modular, 2, 64));
  };
  Runner runner(config);
  auto survivor = runner.start(running);
  auto poisoned = runner.start(greedy(long_prompt, 3));
  const Outcome failed = poisoned.get();
  EXPECT_EQ(failed.final_event.finish_reason, engine::FinishReason::kError);
  EXPECT_NE(failed.final_event.error.message().find("layer 2"), std::string::npos)
      << failed.final_event.error.message();
  const Outcome kept = survivor.get();
  EXPECT_EQ(kept.final_event.finish_reason, engine::FinishReason::kLength);
  expect_same(kept, reference, "the running request beside the poisoned step");
  EXPECT_GE(runner.engine->metrics().route_capture_errors_total, 1);
}

TEST(KernelGuard, CaptureWithAKernelThatCannotIsRefusedNamingThoseThatCan) {
  engine::EngineConfig config = capture_config();
  config.model_dir = kModel;
  config.moe_kernel = "test-no-capture";
  config.register_extra_kernels = [](moe::ExpertsKernelRegistry& registry) {
    static auto backend = backend::make_cpu_backend({1});
    moe::ExpertsKernelRegistry inner;
    backend->register_kernels(inner);
    registry.add(std::make_unique<NoCaptureKernel>(**inner.select("cpu-modular", {Device::kCpu, false, false})));
  };
  auto refused = engine::create_engine(config);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.message().find("cannot capture"), std::string::npos) << refused.message();
  EXPECT_NE(refused.message().find("cpu-modular"), std::string::npos) << refused.message();
  EXPECT_NE(refused.message().find("cpu-fused"), std::string::npos) << refused.message();
  // Without capture the same kernel is accepted, and auto never picks it for capture.
  moe::ExpertsKernelRegistry registry;
  auto backend = backend::make_cpu_backend({1});
  moe::ExpertsKernelRegistry base;
  backend->register_kernels(base);
  registry.add(std::make_unique<NoCaptureKernel>(**base.select("cpu-modular", {Device::kCpu, false, false})));
  backend->register_kernels(registry);
  EXPECT_TRUE(registry.select("test-no-capture", {Device::kCpu, false, false}).is_ok());
  auto chosen = registry.select("auto", {Device::kCpu, true, false});
  ASSERT_TRUE(chosen.is_ok());
  EXPECT_EQ((*chosen)->name(), "cpu-modular");
}

// --max-num-seqs / --max-num-batched-tokens 0: vLLM's large-GPU defaults on a device, the old
// ones on the CPU, and a linear-attention model's sequences capped by its state memory.
TEST(StepDefaults, FollowTheDeviceAndCapLinearAttentionState) {
  constexpr int64_t kGB = 1000 * 1000 * 1000;
  using engine::StepDefaults;
  EXPECT_EQ((StepDefaults{Device::kCpu, 8 * kGB, 0}.max_num_seqs()), 256);
  EXPECT_EQ((StepDefaults{Device::kCpu, 8 * kGB, 66'000'000}.max_num_seqs()), 256);
  EXPECT_EQ((StepDefaults{Device::kCpu, 8 * kGB, 0}.max_num_batched_tokens()), 2048);
  EXPECT_EQ((StepDefaults{Device::kCuda, 60 * kGB, 0}.max_num_seqs()), 1024);
  EXPECT_EQ((StepDefaults{Device::kCuda, 60 * kGB, 0}.max_num_batched_tokens()), 8192);
  // Qwen3.5-35B-A3B's ~66 MB a copy: 66 GB free -> 33 GB for 2 copies a sequence -> 250 -> 248.
  EXPECT_EQ((StepDefaults{Device::kCuda, 66 * kGB, 66'000'000}.max_num_seqs()), 248);
  // An 80 GB card after 70 GB of weights: 5 GB free -> 2.5 GB for 2 copies a sequence -> 18 -> 16.
  EXPECT_EQ((StepDefaults{Device::kCuda, 5 * kGB, 66'000'000}.max_num_seqs()), 16);
  // Never fewer than 8, never more than 1024.
  EXPECT_EQ((StepDefaults{Device::kCuda, 100'000'000, 66'000'000}.max_num_seqs()), 8);
  EXPECT_EQ((StepDefaults{Device::kCuda, -1, 66'000'000}.max_num_seqs()), 8);
  EXPECT_EQ((StepDefaults{Device::kCuda, 10'000 * kGB, 1'000'000}.max_num_seqs()), 1024);
}

// The KV cache's share of a device: 90% of what is free after the weights, or (vLLM's
// --gpu-memory-utilization) the engine's share of the whole memory less what it already holds.
TEST(DeviceKvBudget, FollowsTheUtilizationShareAndRefusesOneTooSmall) {
  constexpr int64_t kGB = 1000 * 1000 * 1000;
  using engine::device_kv_budget;
  // 80 GB card, 78 free before 14 GB of weights, 64 free now, 4 GB of workspace reserved.
  const engine::DeviceMemory memory{80 * kGB, 78 * kGB, 64 * kGB};
  auto unset = device_kv_budget(memory, 4 * kGB, 0.0);
  ASSERT_TRUE(unset) << unset.message();
  EXPECT_EQ(*unset, 54 * kGB);  // 0.9 x (64 - 4)
  auto half = device_kv_budget(memory, 4 * kGB, 0.5);
  ASSERT_TRUE(half) << half.message();
  EXPECT_EQ(*half, 22 * kGB);  // 40 - 14 held - 4 reserved
  // A share above what is free is capped by it.
  auto all = device_kv_budget(memory, 4 * kGB, 1.0);
  ASSERT_TRUE(all) << all.message();
  EXPECT_EQ(*all, 60 * kGB);  // min(80 - 14 - 4, 64 - 4)
  // Another process's memory (free before load below total) is not the engine's to count.
  const engine::DeviceMemory shared{80 * kGB, 40 * kGB, 26 * kGB};
  auto share = device_kv_budget(shared, 4 * kGB, 0.4);
  ASSERT_TRUE(share) << share.message();
  EXPECT_EQ(*share, 14 * kGB);  // min(32 - 14 - 4, 26 - 4)
  // A share the weights and workspace already fill: refused, naming the flag.
  auto tiny = device_kv_budget(memory, 4 * kGB, 0.2);
  ASSERT_FALSE(tiny);
  EXPECT_NE(tiny.message().find("--gpu-memory-utilization 0.2"), std::string::npos)
      << tiny.message();
}

}  // namespace
}  // namespace sy
