// A hybrid model (Qwen3.5: gated DeltaNet layers with per-sequence state beside full attention)
// through the engine: tokens and routes of each request are the same alone, with chunked prefill
// of several chunk sizes, in a batch of concurrent requests, and with preemption forced by a
// small KV cache (the recompute restarts the state from position 0 and replays the logged
// routes); a step that fails and is rerun request by request reads the state it read the first
// time; the prefix cache resumes a hit from a snapshot of the state (without snapshots it is off).
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <future>
#include <random>
#include <thread>

#include "engine_harness.h"
#include "model/presets.h"
#include "moe/experts_kernel.h"

namespace sy {
namespace {

class HybridEngine : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::filesystem::path(std::filesystem::temp_directory_path() /
                                     ("sy_qwen35_engine_" + std::to_string(::getpid())));
    auto config = model::preset_config("qwen3_5_moe", "tiny", 0);
    ASSERT_TRUE(config.is_ok()) << config.message();
    if (on_cuda()) {
      // CUDA's batch-invariant GEMM takes widths that are multiples of 8 (the engine refuses
      // others): the tiny preset's odd widths rounded up (the DeltaNet gets 8 value heads).
      nlohmann::json& text = (*config)["text_config"];
      text["moe_intermediate_size"] = 24;
      text["shared_expert_intermediate_size"] = 32;
      text["linear_num_value_heads"] = 8;
    }
    ASSERT_TRUE(
        model::write_random_checkpoint(*config, nlohmann::json::object(), dir_->string(), 7, false)
            .is_ok());
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*dir_);
    delete dir_;
  }
  static engine::EngineConfig config() {
    engine::EngineConfig config = capture_config();
    config.model_dir = dir_->string();
    // Sized from memory, the cache of this model's one small attention layer would be millions
    // of tokens, zero-filled by every engine the tests start.
    config.kv_cache_tokens = 16 * 64;
    // Every test compares runs of different step shapes token for token: on CUDA that needs the
    // batch-invariant mode (its GEMMs and attention split work independently of the step).
    config.batch_invariant = on_cuda();
    return config;
  }
  static std::vector<engine::GenerationRequest> requests() {
    std::vector<engine::GenerationRequest> list;
    for (int i = 0; i < 6; ++i)
      list.push_back(greedy(seeded_prompt(100 + i, 3 + 13 * i), 5 + i % 3));
    return list;
  }
  static inline std::filesystem::path* dir_ = nullptr;
};

TEST_F(HybridEngine, ChunkedPrefillConcurrencyAndPreemptionGiveTheTokensAndRoutesOfEachAlone) {
  const auto list = requests();
  std::vector<Outcome> alone;
  {
    Runner runner(config());
    for (const auto& request : list) alone.push_back(runner.run(request));
  }
  for (size_t i = 0; i < alone.size(); ++i) {
    ASSERT_TRUE(alone[i].final_event.routes);
    EXPECT_EQ(alone[i].final_event.routes->rows,
              static_cast<int64_t>(list[i].prompt_ids.size() + alone[i].tokens.size()) - 1);
  }
  // Chunked prefill: every prompt over several steps, the state carried between them.
  for (int chunk : {5, 16, 29}) {
    engine::EngineConfig chunked = config();
    chunked.max_num_batched_tokens = chunk;
    Runner runner(chunked);
    for (size_t i = 0; i < list.size(); ++i)
      expect_same(alone[i], runner.run(list[i]),
                  "chunk " + std::to_string(chunk) + ", request " + std::to_string(i));
  }
  // Concurrently, in small steps and a cache too small for all of them: preemption.
  engine::EngineConfig small = config();
  small.max_num_batched_tokens = 24;
  small.kv_cache_tokens = 16 * 8;
  small.block_size_tokens = 16;
  Runner runner(small);
  std::vector<std::future<Outcome>> pending = runner.start_together(list);
  for (size_t i = 0; i < list.size(); ++i)
    expect_same(alone[i], pending[i].get(), "together, request " + std::to_string(i));
  EXPECT_GT(runner.engine->metrics().preemptions_total, 0) << "the cache was meant to be too small";
}

// Delegates to the device's modular kernel but refuses any step with a forced (replayed) row.
class RefusesReplayKernel final : public moe::ExpertsKernel {
 public:
  explicit RefusesReplayKernel(moe::ExpertsKernel& inner) : inner_(inner) {}
  std::string_view name() const override { return "test-refuses-replay"; }
  Device device() const override { return inner_.device(); }
  bool batch_invariant() const override { return inner_.batch_invariant(); }
  bool routes_inside() const override { return inner_.routes_inside(); }
  bool captures_routes() const override { return true; }
  bool replays_routes() const override { return true; }
  Status supports(const moe::RouterSpec& spec) const override { return inner_.supports(spec); }
  Status supports_experts(const moe::ExpertSpec& spec) const override {
    return inner_.supports_experts(spec);
  }
  Status reserve(int64_t max_tokens, const moe::RouterSpec& spec, int64_t hidden,
                 int64_t intermediate) override {
    return inner_.reserve(max_tokens, spec, hidden, intermediate);
  }
  Status forward(const moe::MoeForwardArgs& args) override {
    // (The source is bound only when some row of the step is replayed; the forced flags
    // themselves live in device memory on CUDA, which the host must not read.)
    if (args.routes.source.data)
      return Status::error(ErrorCode::kUnsupported, "test kernel refuses replay");
    return inner_.forward(args);
  }

 private:
  moe::ExpertsKernel& inner_;
};

// A decodes; the step where B (whose replay the kernel refuses) joins it fails, and the engine
// reruns each request alone: A's rerun must read the linear-attention state the failed step
// read (a step writes the other buffer), else its tokens would differ from A alone.
TEST_F(HybridEngine, AFailedStepRerunReadsTheSameState) {
  engine::EngineConfig refusing = config();
  refusing.moe_kernel = "test-refuses-replay";
  refusing.register_extra_kernels = [](moe::ExpertsKernelRegistry& registry) {
    const Device device = on_cuda() ? Device::kCuda : Device::kCpu;
    registry.add(std::make_unique<RefusesReplayKernel>(
        **registry.select(on_cuda() ? "cuda-modular" : "cpu-modular", {device, true, true})));
  };
  Runner runner(refusing);
  const engine::GenerationRequest a = greedy(seeded_prompt(31, 20), 10);
  const Outcome a_alone = runner.run(a);
  ASSERT_EQ(a_alone.final_event.finish_reason, engine::FinishReason::kLength);
  engine::GenerationRequest b = greedy(seeded_prompt(32, 9), 4);
  b.replay = moe::RouteArray{2, 4, 3, std::vector<int32_t>(2 * 4 * 3)};
  for (size_t i = 0; i < b.replay->ids.size(); ++i) b.replay->ids[i] = static_cast<int32_t>(i % 3);

  // Hold the engine thread in A's callback after its third token, submit B, then let go: B's
  // prefill and A's next decode step run together.
  auto entered = std::make_shared<std::promise<void>>();
  auto release = std::make_shared<std::promise<void>>();
  std::shared_future<void> released = release->get_future().share();
  auto done = std::make_shared<std::promise<Outcome>>();
  auto outcome = std::make_shared<Outcome>();
  engine::GenerationRequest held = a;
  auto id = runner.engine->submit(held, [=](const engine::Event& event) {
    outcome->tokens.insert(outcome->tokens.end(), event.new_token_ids.begin(),
                           event.new_token_ids.end());
    if (outcome->tokens.size() == 3 && !event.finished) {
      entered->set_value();
      released.wait();
    }
    if (event.finished) {
      outcome->final_event = event;
      done->set_value(*outcome);
    }
    return engine::Continuation::kContinue;
  });
  ASSERT_TRUE(id.is_ok()) << id.message();
  entered->get_future().wait();
  std::future<Outcome> b_future = runner.start(b);
  release->set_value();
  const Outcome b_out = b_future.get();
  EXPECT_EQ(b_out.final_event.finish_reason, engine::FinishReason::kError);
  const Outcome a_out = done->get_future().get();
  ASSERT_EQ(a_out.final_event.finish_reason, engine::FinishReason::kLength)
      << a_out.final_event.error.message();
  expect_same(a_alone, a_out, "A after the failed step's rerun");
}

TEST_F(HybridEngine, WithoutStateSnapshotsThePrefixCacheIsOffAndARepeatedPromptIsComputedAgain) {
  engine::EngineConfig on = config();
  on.enable_prefix_caching = true;  // asked for, turned off at start-up: no snapshots
  on.state_snapshots = 0;
  Runner runner(on);
  const auto request = greedy(seeded_prompt(5, 50), 4);
  const Outcome first = runner.run(request);
  const Outcome second = runner.run(request);
  expect_same(first, second, "repeat");
  EXPECT_EQ(second.cached_prompt_tokens, 0);
  EXPECT_EQ(runner.engine->metrics().prefix_cache_hits_tokens, 0);
}

// The cold outcome of each request: an engine without a prefix cache, each request alone.
std::vector<Outcome> cold_outcomes(const engine::EngineConfig& base,
                                   const std::vector<engine::GenerationRequest>& list) {
  engine::EngineConfig off = base;
  off.enable_prefix_caching = false;
  Runner runner(off);
  std::vector<Outcome> outcomes;
  for (const auto& request : list) outcomes.push_back(runner.run(request));
  return outcomes;
}

// Runs `request` and expects its cold outcome and, unless -1, `cached` prompt tokens from the
// prefix cache.
void expect_run(Runner& runner, const engine::GenerationRequest& request, const Outcome& cold,
                int64_t cached, const std::string& what) {
  const Outcome outcome = runner.run(request);
  expect_same(cold, outcome, what);
  if (cached >= 0) {
    EXPECT_EQ(outcome.cached_prompt_tokens, cached) << what;
  }
}

// A prefix hit on a hybrid model resumes from the snapshot of the linear-attention state taken
// after the prompt's last full block (blocks of 16: a 50-token prompt is snapshotted after 48),
// and gives the tokens and routes of a cold run. A prompt that shares only shorter leading
// blocks (no snapshot there) gets no hit and is computed from position 0.
TEST_F(HybridEngine, APrefixHitResumesFromTheStateSnapshotAfterThePromptsLastFullBlock) {
  engine::EngineConfig cached = config();
  cached.block_size_tokens = 16;
  const std::vector<int32_t> a_prompt = seeded_prompt(41, 50);
  std::vector<int32_t> b_prompt(a_prompt.begin(), a_prompt.begin() + 40);  // blocks 0-1 shared
  const std::vector<int32_t> tail = seeded_prompt(42, 20);
  b_prompt.insert(b_prompt.end(), tail.begin(), tail.end());
  const std::vector<engine::GenerationRequest> list = {greedy(a_prompt, 8), greedy(b_prompt, 8)};
  const std::vector<Outcome> cold = cold_outcomes(cached, list);

  Runner runner(cached);
  expect_run(runner, list[0], cold[0], -1, "A, first");
  expect_run(runner, list[0], cold[0], 48, "A, a prefix hit");
  expect_run(runner, list[1], cold[1], 0, "B, sharing two blocks with A but not A's snapshot");
  expect_run(runner, list[1], cold[1], 48, "B, a prefix hit");
  const engine::EngineMetrics metrics = runner.engine->metrics();
  EXPECT_EQ(metrics.state_snapshots_taken, 2);
  EXPECT_EQ(metrics.state_snapshots_restored, 2);
  EXPECT_EQ(metrics.prefix_cache_hits_tokens, 96);
}

// With one snapshot, a second prompt's evicts the first's: the first, repeated, is computed
// again (no hit on its still-cached KV blocks, whose state is gone), exactly, and takes it back.
TEST_F(HybridEngine, AnEvictedSnapshotMeansNoHitEvenWithTheBlocksStillCached) {
  engine::EngineConfig one = config();
  one.block_size_tokens = 16;
  one.state_snapshots = 1;
  const std::vector<engine::GenerationRequest> list = {greedy(seeded_prompt(51, 40), 6),
                                                       greedy(seeded_prompt(52, 37), 6)};
  const std::vector<Outcome> cold = cold_outcomes(one, list);
  Runner runner(one);
  expect_run(runner, list[0], cold[0], -1, "A");
  expect_run(runner, list[1], cold[1], -1, "C, taking the one snapshot");
  expect_run(runner, list[0], cold[0], 0, "A again");
  // A again took the snapshot back: A hits, then C (evicted) does not.
  expect_run(runner, list[0], cold[0], 32, "A a third time");
  expect_run(runner, list[1], cold[1], 0, "C again");
}

// Hits, snapshots and preemption together: prompts that repeat and share prefixes, run
// concurrently in small steps in a cache too small for all of them; each gives its cold outcome.
TEST_F(HybridEngine, HitsSnapshotsAndPreemptionTogetherGiveTheColdOutcomes) {
  engine::EngineConfig small = config();
  small.block_size_tokens = 16;
  small.max_num_batched_tokens = 24;
  small.kv_cache_tokens = 16 * 10;
  small.state_snapshots = 2;
  std::vector<engine::GenerationRequest> list;
  for (int i = 0; i < 3; ++i) list.push_back(greedy(seeded_prompt(60 + i, 35 + 7 * i), 6 + i));
  for (int i = 0; i < 3; ++i) list.push_back(list[static_cast<size_t>(i)]);  // repeats
  const std::vector<Outcome> cold = cold_outcomes(small, list);
  Runner runner(small);
  expect_same(cold[0], runner.run(list[0]), "first alone");
  std::vector<std::future<Outcome>> pending = runner.start_together(list);
  for (size_t i = 0; i < list.size(); ++i)
    expect_same(cold[i], pending[i].get(), "together, request " + std::to_string(i));
  const engine::EngineMetrics metrics = runner.engine->metrics();
  EXPECT_GT(metrics.preemptions_total, 0) << "the cache was meant to be too small";
  EXPECT_GT(metrics.state_snapshots_restored, 0) << "no request resumed from a snapshot";
}

}  // namespace
}  // namespace sy
