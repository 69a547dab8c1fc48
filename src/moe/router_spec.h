// RouterSpec: how a model turns router logits into (expert ids, gating weights). The CPU
// reference router (moe/router.h) implements it and is the oracle for every kernel.
#pragma once

#include <cstdint>

namespace sy::moe {

enum class RouterScoring { kSoftmax, kSigmoid };

struct RouterSpec {
  int64_t num_experts = 0;
  int64_t top_k = 0;
  RouterScoring scoring = RouterScoring::kSoftmax;
  bool renormalize = false;            // divide the chosen weights by their sum (norm_topk_prob)
  bool softmax_after_topk = false;     // gpt-oss / Mixtral: softmax over the chosen logits only
  float routed_scaling_factor = 1.0f;  // multiplies the final gating weights
};

}  // namespace sy::moe
