// Sharding of a decoder over a tensor-parallel group: which attention heads, MLP columns and
// experts each rank holds, and the expert-parallel dispatch of a step's routed (token, slot)
// pairs to the ranks that own their experts. Pure functions of the config and the routes, so
// every rank computes the same plan without talking.
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"
#include "util/status.h"

namespace sy::dist {

struct ParallelConfig {
  int tensor_parallel = 1;       // ranks in the group
  bool expert_parallel = false;  // experts partitioned whole across the ranks (else each sliced)
};

struct Range {
  int64_t begin = 0;
  int64_t count = 0;
  int64_t end() const { return begin + count; }
};

// What one rank holds. Attention: query heads and their kv heads (column-parallel q/k/v rows,
// row-parallel o_proj columns, all-reduce after o_proj); the KV cache holds kv_heads only.
// Dense MLP: intermediate columns (gate/up rows, down columns, all-reduce after down). MoE:
// with expert_parallel the experts [experts.begin, end) whole, else every expert's
// intermediate slice moe_columns; all-reduce after the combine either way. Router, norms,
// embedding and lm_head are replicated, so every rank routes from the same hidden states.
struct RankShard {
  int rank = 0;
  Range heads, kv_heads, mlp_columns, moe_columns, experts;
};

// kInvalidArgument naming the dimension that the group size does not divide.
Result<RankShard> shard_for_rank(const model::ModelConfig& config, const ParallelConfig& parallel,
                                 int rank);

// The rank that owns logical expert `expert` when `num_experts` are split in contiguous blocks.
int expert_owner(int64_t expert, int64_t num_experts, int ranks);

// A step's routed pairs grouped by owning rank, token order within each rank (deterministic).
struct RoutedPair {
  int32_t token = 0;
  int32_t slot = 0;    // which of the token's top_k choices
  int32_t expert = 0;  // logical id
};
struct ExpertDispatch {
  std::vector<std::vector<RoutedPair>> by_rank;
  // Rows each rank sends to (and receives back from) each other rank in an all-to-all where
  // `source_rank` holds tokens [token_begin, token_end) of the step (data-parallel attention).
  std::vector<int64_t> send_counts(int source_rank, int64_t token_begin, int64_t token_end) const;
};
// ids: [tokens, top_k] logical expert ids (a layer's slice of the route buffer).
Result<ExpertDispatch> plan_dispatch(const int32_t* ids, int64_t tokens, int64_t top_k,
                                     int64_t num_experts, int ranks);

}  // namespace sy::dist
