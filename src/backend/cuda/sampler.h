// Sampling and scoring on CUDA, where the logits are: the host uploads each row's parameters
// (and its sparse logit adjustments: bias, penalties, bans) and gets back only the sampled ids
// and, when asked for, logprobs. Same semantics and filter order as the CPU sampler
// (backend/cpu/cpu_sampler.cpp, vLLM's order); the same counter-based random draw per
// (seed, draw index), so a seeded request samples the same token alone or in any batch.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_context.h"

namespace sy::backend::cuda {

class CudaSampler {
 public:
  explicit CudaSampler(CudaContext& context);
  ~CudaSampler();
  // Scratch for up to `max_rows` rows of `vocab` logits (called once, before any step).
  void reserve(int64_t max_rows, int64_t vocab);
  // logits: device f32 [rows, vocab]. Synchronises the stream (results come back to the host);
  // with `wait` false it only enqueues, and complete() (or the next sample/score) waits and fills
  // `out`, which the caller keeps alive until then.
  void sample(const Tensor& logits, const std::vector<SamplingRow>& rows,
              std::vector<SampledToken>& out, bool wait = true);
  void complete();
  void score(const Tensor& logits, const std::vector<int32_t>& targets, int top_k,
             std::vector<SampledToken>& out);

 private:
  struct State;
  CudaContext& context_;
  std::unique_ptr<State> state_;
};

}  // namespace sy::backend::cuda
