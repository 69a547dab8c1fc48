// Sequence: one request's state inside the engine — its tokens, KV blocks and route log.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "engine/engine.h"

namespace sy::engine {

struct Sequence {
  RequestId id = 0;
  GenerationRequest request;
  EventCallback on_event;
  uint64_t seed = 0;

  std::vector<int32_t> tokens;  // prompt + generated
  std::vector<int32_t> output_ids;  // generated (the sampler's penalties read it every step)
  int64_t prompt_len = 0;
  int64_t num_computed = 0;     // positions whose KV is in the cache
  std::vector<int32_t> blocks;  // block table
  int64_t published_blocks = 0;  // leading full blocks already offered to the prefix cache
  // Per offered block, the block the prefix cache holds for it and that block's registration: the
  // sequence's own, or (when the same content was there first) the cached one, whose chain the
  // next blocks continue; -1 when neither (the chain stops there).
  std::vector<int32_t> cached_blocks;
  std::vector<uint64_t> cached_generations;
  std::vector<uint64_t> block_hashes;  // chained hashes of the leading full blocks

  // Route log by position (DESIGN.md): rows [0, route_rows) are known, [route_rows*row_ints).
  // A known row is replayed whenever its position is computed again.
  std::vector<int32_t> routes;
  int64_t route_rows = 0;
  int64_t user_forced_rows = 0;  // rows [0, user_forced_rows) came from the request's replay
  // Gating weights by position (return_route_weights only), rows [0, weight_rows): the weights
  // of the forward pass that first computed each position.
  std::vector<float> route_weights;
  int64_t weight_rows = 0;
  int64_t routes_streamed = 0;  // rows already delivered in Event::new_routes

  // Pending output for the next event.
  std::vector<int32_t> new_tokens;
  std::vector<TokenLogprob> new_logprobs;
  std::vector<TokenLogprob> prompt_logprobs;
  // Prompt positions [0, prompt_scored) have their prompt_logprobs entry; a preempted sequence
  // recomputes them without scoring them again.
  int64_t prompt_scored = 0;
  int64_t cached_prompt_tokens = 0;
  bool first_event_sent = false;
  bool prefix_lookup_done = false;
  bool prefix_counted = false;  // cached_prompt_tokens and the prefix-cache metrics, once
  bool started = false;         // admitted once: a weight update waits for it to finish
  // Models with linear attention: the state slot held while running (-1: none) and which of its
  // two buffers holds the state after positions [0, num_computed) (a step reads that one and
  // writes the other; a successful step flips it). Preemption gives the slot back: the
  // recompute starts at position 0, from zeros.
  int32_t state_slot = -1;
  int32_t state_parity = 0;
  int32_t state_read_buffer() const { return 2 * state_slot + state_parity; }
  int32_t state_write_buffer() const { return 2 * state_slot + 1 - state_parity; }
  // A prefix-cache hit resumes from the state snapshot taken after its last hit block: that
  // snapshot (-1: none), pinned until its copy into the read buffer has run.
  int32_t restore_snapshot = -1;

  int64_t output_len() const { return static_cast<int64_t>(tokens.size()) - prompt_len; }
};

// Prompt positions 0 .. prompt_len-2 are scored for prompt_logprobs (each predicts the next
// prompt token), once: a recompute after preemption does not score them again.
inline bool scores_prompt(const Sequence& seq) {
  return seq.request.sampling.prompt_logprobs >= 0 && seq.prompt_scored + 1 < seq.prompt_len;
}
inline bool scores_position(const Sequence& seq, int64_t p) {
  return seq.request.sampling.prompt_logprobs >= 0 && p >= seq.prompt_scored && p + 1 < seq.prompt_len;
}
inline int64_t prompt_rows_to_score(const Sequence& seq, int64_t begin, int64_t count) {
  if (seq.request.sampling.prompt_logprobs < 0) return 0;
  return std::max<int64_t>(0, std::min(begin + count, seq.prompt_len - 1) - std::max(begin, seq.prompt_scored));
}

}  // namespace sy::engine
