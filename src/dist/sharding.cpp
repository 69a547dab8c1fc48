#include "dist/sharding.h"

#include <fmt/format.h>

namespace sy::dist {

namespace {

Result<Range> split(int64_t total, int ranks, int rank, const char* what) {
  if (total % ranks != 0)
    return Status::error(
        ErrorCode::kInvalidArgument,
        fmt::format("--tensor-parallel {} does not divide {} ({})", ranks, what, total));
  const int64_t each = total / ranks;
  return Range{rank * each, each};
}

}  // namespace

Result<RankShard> shard_for_rank(const model::ModelConfig& config, const ParallelConfig& parallel,
                                 int rank) {
  const int n = parallel.tensor_parallel;
  if (n < 1 || rank < 0 || rank >= n)
    return Status::error(ErrorCode::kInvalidArgument,
                         fmt::format("rank {} is outside a tensor-parallel group of {}", rank, n));
  RankShard shard;
  shard.rank = rank;
  SY_ASSIGN(shard.heads, split(config.num_attention_heads, n, rank, "num_attention_heads"));
  SY_ASSIGN(shard.kv_heads, split(config.num_key_value_heads, n, rank, "num_key_value_heads"));
  if (config.intermediate_size > 0) {
    SY_ASSIGN(shard.mlp_columns, split(config.intermediate_size, n, rank, "intermediate_size"));
  }
  if (config.num_experts > 0) {
    if (parallel.expert_parallel) {
      SY_ASSIGN(shard.experts, split(config.num_experts, n, rank, "num_experts"));
      shard.moe_columns = Range{0, config.moe_intermediate_size};
    } else {
      SY_ASSIGN(shard.moe_columns,
                split(config.moe_intermediate_size, n, rank, "moe_intermediate_size"));
      shard.experts = Range{0, config.num_experts};
    }
  }
  return shard;
}

int expert_owner(int64_t expert, int64_t num_experts, int ranks) {
  return static_cast<int>(expert / (num_experts / ranks));
}

Result<ExpertDispatch> plan_dispatch(const int32_t* ids, int64_t tokens, int64_t top_k,
                                     int64_t num_experts, int ranks) {
  if (ranks < 1 || num_experts % ranks != 0)
    return Status::error(
        ErrorCode::kInvalidArgument,
        fmt::format("{} experts cannot be split over {} ranks", num_experts, ranks));
  ExpertDispatch plan;
  plan.by_rank.resize(ranks);
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t k = 0; k < top_k; ++k) {
      const int32_t e = ids[t * top_k + k];
      if (e < 0 || e >= num_experts)
        return Status::error(
            ErrorCode::kInternal,
            fmt::format("token {} slot {}: expert {} outside [0, {})", t, k, e, num_experts));
      plan.by_rank[expert_owner(e, num_experts, ranks)].push_back(
          {static_cast<int32_t>(t), static_cast<int32_t>(k), e});
    }
  return plan;
}

std::vector<int64_t> ExpertDispatch::send_counts(int source_rank, int64_t token_begin,
                                                 int64_t token_end) const {
  (void)source_rank;
  std::vector<int64_t> counts(by_rank.size(), 0);
  for (size_t d = 0; d < by_rank.size(); ++d)
    for (const RoutedPair& p : by_rank[d])
      if (p.token >= token_begin && p.token < token_end) ++counts[d];
  return counts;
}

}  // namespace sy::dist
