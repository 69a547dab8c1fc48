// RouterSpec: how a model turns router logits into (expert ids, gating weights). The CPU
// reference router (moe/router.h) implements every option and is the oracle for every kernel.
//
// The stages, in order (each option names the families that need it):
//   logits  = x . router^T  (+ router bias: gpt-oss)                      [has_logit_bias]
//   scores  = softmax(logits) | sigmoid(logits)                            [scoring]
//             (skipped with softmax_after_topk: gpt-oss selects on the logits)
//   choice  = scores (+ selection-only bias: DeepSeek-V3's correction bias) [has_selection_bias]
//   groups  = keep the topk_groups best of num_groups expert groups         [num_groups]
//   ids     = top-k of choice (descending, ties -> lower id)
//   weights = scores at ids (softmax over the chosen logits with softmax_after_topk),
//             renormalised to sum 1 (renormalize), times routed_scaling_factor
#pragma once

#include <cstdint>

namespace sy::moe {

enum class RouterScoring { kSoftmax, kSigmoid };
// How a group of experts is ranked for group-limited top-k: by its best expert (DeepSeek-V2)
// or the sum of its two best (DeepSeek-V3).
enum class GroupScoring { kMax, kTopTwoSum };

struct RouterSpec {
  int64_t num_experts = 0;
  int64_t top_k = 0;
  RouterScoring scoring = RouterScoring::kSoftmax;
  bool renormalize = false;            // divide the chosen weights by their sum (norm_topk_prob)
  bool softmax_after_topk = false;     // gpt-oss: top-k on the logits, softmax over the chosen
  float routed_scaling_factor = 1.0f;  // multiplies the final gating weights
  bool has_logit_bias = false;         // MoeLayerWeights::router_bias is added to the logits
  bool has_selection_bias = false;     // MoeLayerWeights::selection_bias steers selection only
  int64_t num_groups = 1;              // > 1: group-limited top-k over equal expert groups
  int64_t topk_groups = 1;             // groups kept when num_groups > 1
  GroupScoring group_scoring = GroupScoring::kMax;

  // The options kernels written for Qwen3-MoE (softmax/sigmoid, renormalise, softmax after
  // top-k, scaling) do not cover; such kernels refuse a spec that uses one.
  bool uses_extended_options() const {
    return has_logit_bias || has_selection_bias || num_groups > 1;
  }
};

}  // namespace sy::moe
