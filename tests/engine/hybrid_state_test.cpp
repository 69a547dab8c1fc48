// A hybrid model (Qwen3.5: gated DeltaNet layers with per-sequence state beside full attention)
// through the engine: tokens and routes of each request are the same alone, with chunked prefill
// of several chunk sizes, in a batch of concurrent requests, and with preemption forced by a
// small KV cache (the recompute restarts the state from position 0 and replays the logged
// routes); the prefix cache is off for such a model, so a repeated prompt is computed again.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <future>
#include <random>
#include <thread>

#include "engine_harness.h"
#include "model/presets.h"

namespace sy {
namespace {

class HybridEngine : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::filesystem::path(std::filesystem::temp_directory_path() /
                                     ("sy_qwen35_engine_" + std::to_string(::getpid())));
    auto config = model::preset_config("qwen3_5_moe", "tiny", 0);
    ASSERT_TRUE(config.is_ok()) << config.message();
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
  if (on_cuda()) GTEST_SKIP() << "the CUDA backend has no gated DeltaNet";
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
  std::vector<std::future<Outcome>> pending;
  for (const auto& request : list) pending.push_back(runner.start(request));
  for (size_t i = 0; i < list.size(); ++i)
    expect_same(alone[i], pending[i].get(), "together, request " + std::to_string(i));
  EXPECT_GT(runner.engine->metrics().preemptions_total, 0) << "the cache was meant to be too small";
}

TEST_F(HybridEngine, ThePrefixCacheIsOffAndARepeatedPromptIsComputedAgain) {
  if (on_cuda()) GTEST_SKIP() << "the CUDA backend has no gated DeltaNet";
  engine::EngineConfig on = config();
  on.enable_prefix_caching = true;  // asked for, turned off at start-up for this model
  Runner runner(on);
  const auto request = greedy(seeded_prompt(5, 50), 4);
  const Outcome first = runner.run(request);
  const Outcome second = runner.run(request);
  expect_same(first, second, "repeat");
  EXPECT_EQ(second.cached_prompt_tokens, 0);
  EXPECT_EQ(runner.engine->metrics().prefix_cache_hits_tokens, 0);
}

}  // namespace
}  // namespace sy
