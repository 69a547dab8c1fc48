#include "moe/router.h"

#include <algorithm>
#include <cmath>

namespace sy::moe {
namespace {

// Softmax (or sigmoid) scores of all experts into `scores`.
void score_experts(const float* logits, const RouterSpec& spec, float* scores) {
  const int64_t n = spec.num_experts;
  if (spec.scoring == RouterScoring::kSigmoid) {
    for (int64_t e = 0; e < n; ++e) scores[e] = 1.0f / (1.0f + std::exp(-logits[e]));
    return;
  }
  float max_logit = logits[0];
  for (int64_t e = 1; e < n; ++e) max_logit = std::max(max_logit, logits[e]);
  float sum = 0.0f;
  for (int64_t e = 0; e < n; ++e) {
    scores[e] = std::exp(logits[e] - max_logit);
    sum += scores[e];
  }
  for (int64_t e = 0; e < n; ++e) scores[e] /= sum;
}

void finish_weights(const RouterSpec& spec, float* weights) {
  if (spec.renormalize) {
    float sum = 0.0f;
    for (int64_t k = 0; k < spec.top_k; ++k) sum += weights[k];
    for (int64_t k = 0; k < spec.top_k; ++k) weights[k] /= sum;
  }
  if (spec.routed_scaling_factor != 1.0f)
    for (int64_t k = 0; k < spec.top_k; ++k) weights[k] *= spec.routed_scaling_factor;
}

// Softmax over the chosen logits only (gpt-oss / Mixtral order of operations).
void softmax_chosen(const float* logits, const int32_t* ids, int64_t top_k, float* weights) {
  float max_logit = logits[ids[0]];
  for (int64_t k = 1; k < top_k; ++k) max_logit = std::max(max_logit, logits[ids[k]]);
  float sum = 0.0f;
  for (int64_t k = 0; k < top_k; ++k) sum += weights[k] = std::exp(logits[ids[k]] - max_logit);
  for (int64_t k = 0; k < top_k; ++k) weights[k] /= sum;
}

}  // namespace

void route_token(const float* logits, const RouterSpec& spec, int32_t* ids, float* weights,
                 float* scratch) {
  const float* scores = logits;
  if (!spec.softmax_after_topk) {
    score_experts(logits, spec, scratch);
    scores = scratch;
  }
  // Partial selection by (score desc, id asc): k passes over the experts, k is small.
  for (int64_t k = 0; k < spec.top_k; ++k) {
    int32_t best = -1;
    for (int32_t e = 0; e < spec.num_experts; ++e) {
      bool taken = false;
      for (int64_t j = 0; j < k; ++j) taken |= ids[j] == e;
      if (taken) continue;
      if (best < 0 || scores[e] > scores[best]) best = e;
    }
    ids[k] = best;
  }
  if (spec.softmax_after_topk) {
    softmax_chosen(logits, ids, spec.top_k, weights);
  } else {
    for (int64_t k = 0; k < spec.top_k; ++k) weights[k] = scores[ids[k]];
  }
  finish_weights(spec, weights);
}

void gate_forced(const float* logits, const RouterSpec& spec, const int32_t* forced_ids,
                 float* weights, float* scratch) {
  if (spec.softmax_after_topk) {
    softmax_chosen(logits, forced_ids, spec.top_k, weights);
  } else {
    score_experts(logits, spec, scratch);
    for (int64_t k = 0; k < spec.top_k; ++k) weights[k] = scratch[forced_ids[k]];
  }
  finish_weights(spec, weights);
}

Status validate_route_row(const int32_t* ids, const RouterSpec& spec) {
  for (int64_t k = 0; k < spec.top_k; ++k) {
    if (ids[k] < 0 || ids[k] >= spec.num_experts)
      return Status::errorf("expert id {} out of range [0, {})", ids[k], spec.num_experts);
    for (int64_t j = 0; j < k; ++j)
      if (ids[j] == ids[k]) return Status::errorf("expert id {} appears twice in one row", ids[k]);
  }
  return Status::ok();
}

}  // namespace sy::moe
