// One rank's shard of a loaded model (dist/sharding.h's RankShard): sliced copies of the
// tensor-parallel weights in buffers of the rank's backend, replicated tensors (router, norms,
// embedding, lm_head) as views of the full model, which must outlive the shard.
#pragma once

#include <memory>

#include "backend/backend.h"
#include "dist/sharding.h"
#include "model/model.h"

namespace sy::dist {

// The shard's config has its heads, kv heads and MLP widths (and, with expert parallel, the
// layer's expert weights hold experts [shard.experts) only; num_experts stays the router's
// count). kUnsupported, naming it, for what this sharding does not cover yet (a q/k norm over
// the whole projection, expert biases or packed expert layouts). `full` must be host-readable
// (loaded on the CPU backend).
Result<std::unique_ptr<model::Model>> shard_model(const model::Model& full,
                                                  const ParallelConfig& parallel, int rank,
                                                  backend::Backend& backend);

}  // namespace sy::dist
