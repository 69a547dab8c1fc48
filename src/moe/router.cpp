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

// Softmax over the chosen logits only (gpt-oss order of operations).
void softmax_chosen(const float* logits, const int32_t* ids, int64_t top_k, float* weights) {
  float max_logit = logits[ids[0]];
  for (int64_t k = 1; k < top_k; ++k) max_logit = std::max(max_logit, logits[ids[k]]);
  float sum = 0.0f;
  for (int64_t k = 0; k < top_k; ++k) sum += weights[k] = std::exp(logits[ids[k]] - max_logit);
  for (int64_t k = 0; k < top_k; ++k) weights[k] /= sum;
}

// The logits with the router bias added (into `out`), or the logits themselves.
const float* biased_logits(const float* logits, const RouterSpec& spec, const RouterBiases& biases,
                           float* out) {
  if (!spec.has_logit_bias) return logits;
  for (int64_t e = 0; e < spec.num_experts; ++e) out[e] = logits[e] + biases.logit[e];
  return out;
}

// Top-k of `choice` by (value desc, id asc) among experts whose group is kept (all when `kept`
// is null): k passes over the experts, k is small.
void select_top_k(const float* choice, const RouterSpec& spec, const float* kept, int32_t* ids) {
  const int64_t group_size = spec.num_experts / std::max<int64_t>(spec.num_groups, 1);
  for (int64_t k = 0; k < spec.top_k; ++k) {
    int32_t best = -1;
    for (int32_t e = 0; e < spec.num_experts; ++e) {
      if (kept && kept[e / group_size] == 0.0f) continue;
      bool taken = false;
      for (int64_t j = 0; j < k; ++j) taken |= ids[j] == e;
      if (taken) continue;
      if (best < 0 || choice[e] > choice[best]) best = e;
    }
    ids[k] = best;
  }
}

// Marks (1.0f) the topk_groups groups with the best group scores (ties -> lower group id).
void keep_groups(const float* choice, const RouterSpec& spec, float* group_score, float* kept) {
  const int64_t groups = spec.num_groups, size = spec.num_experts / groups;
  for (int64_t g = 0; g < groups; ++g) {
    const float* member = choice + g * size;
    float first = -INFINITY, second = -INFINITY;
    for (int64_t i = 0; i < size; ++i) {
      if (member[i] > first) {
        second = first;
        first = member[i];
      } else if (member[i] > second) {
        second = member[i];
      }
    }
    group_score[g] = spec.group_scoring == GroupScoring::kMax ? first : first + second;
    kept[g] = 0.0f;
  }
  for (int64_t round = 0; round < spec.topk_groups; ++round) {
    int64_t best = -1;
    for (int64_t g = 0; g < groups; ++g)
      if (kept[g] == 0.0f && (best < 0 || group_score[g] > group_score[best])) best = g;
    kept[best] = 1.0f;
  }
}

}  // namespace

int64_t router_scratch_floats(const RouterSpec& spec) {
  return spec.uses_extended_options() ? 3 * spec.num_experts + 2 * spec.num_groups
                                      : spec.num_experts;
}

Status validate_router_spec(const RouterSpec& spec) {
  if (spec.num_experts < 1)
    return Status::errorf("router: num_experts must be >= 1, got {}", spec.num_experts);
  if (spec.top_k < 1 || spec.top_k > spec.num_experts)
    return Status::errorf("router: top_k must be in [1, num_experts = {}], got {}",
                          spec.num_experts, spec.top_k);
  if (spec.num_groups < 1 || spec.num_experts % spec.num_groups != 0)
    return Status::errorf("router: n_group ({}) must divide num_experts ({})", spec.num_groups,
                          spec.num_experts);
  if (spec.num_groups > 1) {
    const int64_t size = spec.num_experts / spec.num_groups;
    if (spec.topk_groups < 1 || spec.topk_groups > spec.num_groups)
      return Status::errorf("router: topk_group must be in [1, n_group = {}], got {}",
                            spec.num_groups, spec.topk_groups);
    if (spec.top_k > spec.topk_groups * size)
      return Status::errorf(
          "router: top_k ({}) is more than the {} experts of the topk_group ({}) kept groups",
          spec.top_k, spec.topk_groups * size, spec.topk_groups);
    if (spec.group_scoring == GroupScoring::kTopTwoSum && size < 2)
      return Status::errorf("router: groups of {} expert cannot be scored by their two best", size);
  }
  if (!std::isfinite(spec.routed_scaling_factor))
    return Status::error("router: routed_scaling_factor must be finite");
  return Status::ok();
}

void route_token(const float* raw_logits, const RouterSpec& spec, const RouterBiases& biases,
                 int32_t* ids, float* weights, float* scratch) {
  const int64_t n = spec.num_experts;
  if (!spec.uses_extended_options()) {
    // Qwen3-MoE's router (and gpt-oss's order without its bias): kept exactly as it always was.
    const float* scores = raw_logits;
    if (!spec.softmax_after_topk) {
      score_experts(raw_logits, spec, scratch);
      scores = scratch;
    }
    select_top_k(scores, spec, nullptr, ids);
    if (spec.softmax_after_topk) {
      softmax_chosen(raw_logits, ids, spec.top_k, weights);
    } else {
      for (int64_t k = 0; k < spec.top_k; ++k) weights[k] = scores[ids[k]];
    }
    finish_weights(spec, weights);
    return;
  }
  float* logits_buf = scratch;
  float* scores = scratch + n;
  float* choice = scratch + 2 * n;
  float* group_score = scratch + 3 * n;
  float* kept = group_score + spec.num_groups;
  const float* logits = biased_logits(raw_logits, spec, biases, logits_buf);
  if (spec.softmax_after_topk) {
    std::copy(logits, logits + n, choice);
  } else {
    score_experts(logits, spec, scores);
    std::copy(scores, scores + n, choice);
  }
  if (spec.has_selection_bias)
    for (int64_t e = 0; e < n; ++e) choice[e] += biases.selection[e];
  if (spec.num_groups > 1) keep_groups(choice, spec, group_score, kept);
  select_top_k(choice, spec, spec.num_groups > 1 ? kept : nullptr, ids);
  if (spec.softmax_after_topk) {
    softmax_chosen(logits, ids, spec.top_k, weights);
  } else {
    for (int64_t k = 0; k < spec.top_k; ++k) weights[k] = scores[ids[k]];
  }
  finish_weights(spec, weights);
}

void gate_forced(const float* raw_logits, const RouterSpec& spec, const RouterBiases& biases,
                 const int32_t* forced_ids, float* weights, float* scratch) {
  const int64_t n = spec.num_experts;
  float* logits_buf = scratch;
  float* scores = spec.uses_extended_options() ? scratch + n : scratch;
  const float* logits = biased_logits(raw_logits, spec, biases, logits_buf);
  if (spec.softmax_after_topk) {
    softmax_chosen(logits, forced_ids, spec.top_k, weights);
  } else {
    score_experts(logits, spec, scores);
    for (int64_t k = 0; k < spec.top_k; ++k) weights[k] = scores[forced_ids[k]];
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
