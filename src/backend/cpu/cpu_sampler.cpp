// Sampling and scoring on the CPU. Randomness is counter-based (seed, draw index) so a seeded
// request draws the same numbers alone or in any batch.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "backend/cpu/cpu_backend.h"

namespace sy::backend::cpu {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

double uniform01(uint64_t seed, uint64_t index) {
  uint64_t bits = splitmix64(seed ^ splitmix64(index + 0x632be59bd9b4e019ull));
  return static_cast<double>(bits >> 11) * (1.0 / 9007199254740992.0);
}

// log-softmax normaliser of a row: max + log(sum(exp(x - max))).
float log_normaliser(const float* row, int64_t n) {
  float max_value = *std::max_element(row, row + n);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(row[i] - max_value));
  return max_value + static_cast<float>(std::log(sum));
}

// Top-k (id, logprob) by descending logit, ties lower id.
void top_logprobs(const float* row, int64_t n, float normaliser, int k,
                  std::vector<std::pair<int32_t, float>>& top) {
  top.clear();
  if (k <= 0) return;
  std::vector<int32_t> ids(static_cast<size_t>(n));
  std::iota(ids.begin(), ids.end(), 0);
  auto by_logit = [row](int32_t a, int32_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); };
  int64_t count = std::min<int64_t>(k, n);
  std::partial_sort(ids.begin(), ids.begin() + count, ids.end(), by_logit);
  for (int64_t i = 0; i < count; ++i) top.emplace_back(ids[i], row[ids[i]] - normaliser);
}


// Samples from softmax(adjusted / temperature) filtered as vLLM does, in its order: min_p (against
// the most likely token), then top_k, then top_p (keep a token while the mass ranked above it is
// below top_p). Only as much of the vocabulary is sorted as the filters need: nothing without
// top_k/top_p, top_k entries for top_k, a growing prefix for top_p (the nucleus is usually small).
int32_t sample_filtered(std::vector<float>& adjusted, const SamplingRow& params,
                        std::vector<int32_t>& candidates, std::vector<double>& weights,
                        std::vector<double>& probs) {
  for (float& value : adjusted) value /= params.temperature;
  const float max_value = *std::max_element(adjusted.begin(), adjusted.end());
  const int32_t vocab = static_cast<int32_t>(adjusted.size());
  weights.resize(adjusted.size());
  for (int32_t id = 0; id < vocab; ++id) weights[id] = std::exp(static_cast<double>(adjusted[id] - max_value));
  auto weight = [&](int32_t id) { return weights[id]; };
  candidates.clear();
  for (int32_t id = 0; id < vocab; ++id)
    if (params.min_p <= 0.0f || weights[id] >= params.min_p) candidates.push_back(id);
  auto by_value = [&](int32_t a, int32_t b) {
    return adjusted[a] > adjusted[b] || (adjusted[a] == adjusted[b] && a < b);
  };
  size_t keep = candidates.size(), sorted = 0;
  if (params.top_k > 0 && static_cast<size_t>(params.top_k) < keep) {
    keep = sorted = static_cast<size_t>(params.top_k);
    std::partial_sort(candidates.begin(), candidates.begin() + keep, candidates.end(), by_value);
    candidates.resize(keep);
  }
  probs.resize(keep);
  double total = 0.0;
  for (size_t i = 0; i < keep; ++i) total += probs[i] = weight(candidates[i]);
  size_t cut = keep;
  if (params.top_p < 1.0f) {
    const double target_mass = params.top_p * total;
    double before = 0.0;
    size_t i = 0;
    for (size_t prefix = std::min<size_t>(keep, 64);; prefix = std::min(keep, prefix * 4)) {
      if (sorted < prefix) {
        std::partial_sort(candidates.begin() + sorted, candidates.begin() + prefix, candidates.end(), by_value);
        for (size_t j = sorted; j < prefix; ++j) probs[j] = weight(candidates[j]);
        sorted = prefix;
      }
      for (; i < prefix && before < target_mass; ++i) before += probs[i];
      if (before >= target_mass || prefix == keep) break;
    }
    cut = std::max<size_t>(i, 1);
  }
  double mass = 0.0;
  for (size_t i = 0; i < cut; ++i) mass += probs[i];
  const double target = uniform01(params.seed, params.draw_index) * mass;
  double cumulative = 0.0;
  for (size_t i = 0; i < cut; ++i) {
    cumulative += probs[i];
    if (target < cumulative) return candidates[i];
  }
  return candidates[cut - 1];
}

}  // namespace

void CpuBackend::score_tokens(const Tensor& logits, const std::vector<int32_t>& targets, int top_k,
                              std::vector<SampledToken>& out) {
  const int64_t vocab = logits.dim(1);
  out.resize(targets.size());
  pool_.parallel_for(static_cast<int64_t>(targets.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* row = logits.ptr<float>() + r * vocab;
      float normaliser = log_normaliser(row, vocab);
      out[r].token_id = targets[r];
      out[r].logprob = row[targets[r]] - normaliser;
      top_logprobs(row, vocab, normaliser, top_k, out[r].top);
    }
  });
}

void CpuBackend::sample(const Tensor& logits, const std::vector<SamplingRow>& rows,
                        std::vector<SampledToken>& out) {
  const int64_t vocab = logits.dim(1);
  out.resize(rows.size());
  pool_.parallel_for(static_cast<int64_t>(rows.size()), 1, [&](int64_t begin, int64_t end) {
    std::vector<float> adjusted(static_cast<size_t>(vocab));
    std::vector<int32_t> candidates;
    std::vector<double> weights, probs;
    std::vector<int32_t> counts;
    for (int64_t r = begin; r < end; ++r) {
      const SamplingRow& params = rows[r];
      const float* row = logits.ptr<float>() + r * vocab;
      std::copy(row, row + vocab, adjusted.begin());

      // Penalties as vLLM applies them: repetition over prompt+output, then frequency/presence
      // over output counts, then logit bias and bans.
      if (params.repetition_penalty != 1.0f) {
        auto penalise = [&](const std::vector<int32_t>* tokens) {
          if (!tokens) return;
          for (int32_t id : *tokens) {
            float& value = adjusted[id];
            if (value == row[id]) value = value > 0 ? value / params.repetition_penalty : value * params.repetition_penalty;
          }
        };
        penalise(params.prompt_tokens);
        penalise(params.output_tokens);
      }
      if ((params.frequency_penalty != 0.0f || params.presence_penalty != 0.0f) && params.output_tokens) {
        counts.assign(static_cast<size_t>(vocab), 0);
        for (int32_t id : *params.output_tokens) ++counts[id];
        for (int32_t id = 0; id < vocab; ++id)
          if (counts[id]) adjusted[id] -= params.frequency_penalty * counts[id] + params.presence_penalty;
      }
      if (params.logit_bias)
        for (auto [id, bias] : *params.logit_bias) adjusted[id] += bias;
      for (int32_t id : params.banned_tokens) adjusted[id] = -INFINITY;

      int32_t chosen = 0;
      if (params.temperature <= 0.0f) {
        for (int32_t id = 1; id < vocab; ++id)
          if (adjusted[id] > adjusted[chosen]) chosen = id;
      } else {
        chosen = sample_filtered(adjusted, params, candidates, weights, probs);
      }
      float normaliser = log_normaliser(row, vocab);
      out[r].token_id = chosen;
      out[r].logprob = row[chosen] - normaliser;
      top_logprobs(row, vocab, normaliser, params.logprobs, out[r].top);
    }
  });
}

}  // namespace sy::backend::cpu
