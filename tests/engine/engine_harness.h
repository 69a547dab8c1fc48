// What the engine tests share: a runner that submits and waits, greedy requests, random prompts.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <future>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace sy {

inline const std::string kModel =
    std::string(SY_SOURCE_DIR) + "/tests/golden/hf_qwen3_moe/qwen3moe_dense_nonorm";

struct Outcome {
  std::vector<int32_t> tokens;
  std::vector<engine::TokenLogprob> prompt_logprobs;  // from every event (only the first has any)
  int64_t cached_prompt_tokens = -1;                  // from the first event
  engine::Event final_event;
  std::chrono::steady_clock::time_point finished_at;
};

inline bool on_cuda() {
  const char* device = std::getenv("SY_TEST_DEVICE");
  return device && std::string(device) == "cuda";
}

// Submits one request whose events are collected into an Outcome. `hold`, when valid, is waited
// on at the request's first event: events are delivered on the engine thread, so the engine plans
// no further step until `hold` is ready.
inline std::future<Outcome> submit_collecting(engine::Engine& engine,
                                              engine::GenerationRequest request,
                                              std::shared_future<void> hold = {}) {
  auto promise = std::make_shared<std::promise<Outcome>>();
  auto outcome = std::make_shared<Outcome>();
  auto first = std::make_shared<bool>(true);
  auto id = engine.submit(
      std::move(request), [promise, outcome, first, hold](const engine::Event& event) {
        if (*first) {
          *first = false;
          if (hold.valid()) hold.wait();
          outcome->cached_prompt_tokens = event.cached_prompt_tokens;
        }
        outcome->tokens.insert(outcome->tokens.end(), event.new_token_ids.begin(),
                               event.new_token_ids.end());
        outcome->prompt_logprobs.insert(outcome->prompt_logprobs.end(),
                                        event.prompt_logprobs.begin(), event.prompt_logprobs.end());
        if (event.finished) {
          outcome->final_event = event;
          outcome->finished_at = std::chrono::steady_clock::now();
          promise->set_value(*outcome);
        }
        return engine::Continuation::kContinue;
      });
  EXPECT_TRUE(id.is_ok()) << id.message();
  return promise->get_future();
}

// Submits every request so that all of them are waiting together, however slowly this thread
// submits: the first request's first event holds the engine until the last one is in. Tests that
// need a crowded cache (preemption) use this; submitting one by one let a loaded CI machine finish
// the first requests before the last arrived, and the cache meant to be too small never was.
inline std::vector<std::future<Outcome>> start_together(
    engine::Engine& engine, const std::vector<engine::GenerationRequest>& requests) {
  std::promise<void> all_in;
  std::shared_future<void> hold = all_in.get_future().share();
  std::vector<std::future<Outcome>> pending;
  for (size_t i = 0; i < requests.size(); ++i)
    pending.push_back(
        submit_collecting(engine, requests[i], i == 0 ? hold : std::shared_future<void>{}));
  all_in.set_value();
  return pending;
}

// An engine of the test model (or config.model_dir) on the test device; run() submits and waits.
struct Runner {
  std::unique_ptr<engine::Engine> engine;

  explicit Runner(engine::EngineConfig config) {
    config.model_dir = config.model_dir.empty() ? kModel : config.model_dir;
    config.num_threads = 2;
    // SY_TEST_DEVICE=cuda runs the engine's end-to-end checks on the GPU (scripts/gpu-check.sh).
    if (on_cuda()) config.device = Device::kCuda;
    auto created = engine::create_engine(config);
    EXPECT_TRUE(created.is_ok()) << created.message();
    engine = std::move(created).value();
  }

  std::future<Outcome> start(engine::GenerationRequest request) {
    return submit_collecting(*engine, std::move(request));
  }
  std::vector<std::future<Outcome>> start_together(
      const std::vector<engine::GenerationRequest>& requests) {
    return ::sy::start_together(*engine, requests);
  }
  Outcome run(engine::GenerationRequest request) { return start(std::move(request)).get(); }
};

inline engine::GenerationRequest greedy(std::vector<int32_t> prompt, int max_tokens) {
  engine::GenerationRequest request;
  request.prompt_ids = std::move(prompt);
  request.sampling.temperature = 0.0f;
  request.sampling.max_tokens = max_tokens;
  request.sampling.ignore_eos = true;
  request.return_routes = true;
  return request;
}

template <class Rng>
inline std::vector<int32_t> random_prompt(Rng& rng, int length) {
  std::uniform_int_distribution<int32_t> token(1, 500);
  std::vector<int32_t> prompt(static_cast<size_t>(length));
  for (auto& id : prompt) id = token(rng);
  return prompt;
}

// A fixed prompt per seed (scenarios that need exact lengths, not random content).
inline std::vector<int32_t> seeded_prompt(uint64_t seed, int length) {
  std::mt19937_64 rng(seed);
  return random_prompt(rng, length);
}

inline engine::EngineConfig capture_config() {
  engine::EngineConfig config;
  config.capture_routes = true;
  return config;
}

inline void expect_same(const Outcome& a, const Outcome& b, const std::string& what) {
  EXPECT_EQ(a.tokens, b.tokens) << what;
  ASSERT_TRUE(a.final_event.routes && b.final_event.routes) << what;
  EXPECT_EQ(a.final_event.routes->rows, b.final_event.routes->rows) << what;
  EXPECT_EQ(a.final_event.routes->ids, b.final_event.routes->ids) << what;
}

}  // namespace sy
