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
  auto by_logit = [row](int32_t a, int32_t b) {
    return row[a] > row[b] || (row[a] == row[b] && a < b);
  };
  int64_t count = std::min<int64_t>(k, n);
  std::partial_sort(ids.begin(), ids.begin() + count, ids.end(), by_logit);
  for (int64_t i = 0; i < count; ++i) top.emplace_back(ids[i], row[ids[i]] - normaliser);
}

// Samples from softmax(adjusted / temperature) filtered as vLLM does, in its order: min_p (against
// the most likely token), then top_k, then top_p (a token stays while the mass ranked above it is
// below top_p of the total). Nothing is sorted without top_k/top_p; top_k sorts k entries; top_p
// buckets the candidates by logit, keeps every bucket wholly above the one where the mass crosses
// top_p, and sorts only that boundary bucket. The draw walks the kept tokens in a fixed order
// (kept buckets by id, then the boundary bucket by rank), so a seed gives the same token anywhere.
int32_t sample_filtered(std::vector<float>& adjusted, const SamplingRow& params,
                        std::vector<int32_t>& candidates, std::vector<double>& weights,
                        std::vector<double>& bucket_mass) {
  for (float& value : adjusted) value /= params.temperature;
  const auto max_at = std::max_element(adjusted.begin(), adjusted.end());
  const float max_value = *max_at;
  const int32_t vocab = static_cast<int32_t>(adjusted.size());
  // Everything banned (or a non-finite model output): nothing to weigh; take the argmax.
  if (!std::isfinite(max_value)) return static_cast<int32_t>(max_at - adjusted.begin());
  weights.resize(adjusted.size());
  for (int32_t id = 0; id < vocab; ++id)
    weights[id] = std::exp(static_cast<double>(adjusted[id] - max_value));
  const double u = uniform01(params.seed, params.draw_index);
  auto draw = [&](const int32_t* ids, size_t count, double mass) {
    const double target = u * mass;
    double cumulative = 0.0;
    for (size_t i = 0; i < count; ++i) {
      cumulative += weights[ids[i]];
      if (target < cumulative) return ids[i];
    }
    return ids[count - 1];
  };

  candidates.clear();
  for (int32_t id = 0; id < vocab; ++id)
    // Weight 0 (a banned token, -inf) can never be drawn; NaN fails both tests.
    if (weights[id] > 0.0 && (params.min_p <= 0.0f || weights[id] >= params.min_p))
      candidates.push_back(id);
  auto by_value = [&](int32_t a, int32_t b) {
    return adjusted[a] > adjusted[b] || (adjusted[a] == adjusted[b] && a < b);
  };
  bool sorted = false;
  if (params.top_k > 0 && static_cast<size_t>(params.top_k) < candidates.size()) {
    std::partial_sort(candidates.begin(), candidates.begin() + params.top_k, candidates.end(),
                      by_value);
    candidates.resize(static_cast<size_t>(params.top_k));
    sorted = true;
  }
  double total = 0.0;
  for (int32_t id : candidates) total += weights[id];
  if (params.top_p >= 1.0f) return draw(candidates.data(), candidates.size(), total);

  const double target_mass = params.top_p * total;
  if (!sorted) {
    // Bucket b holds logits in (hi - (b+1) w, hi - b w]: a larger logit never lands in a later
    // bucket, so bucket order is rank order.
    constexpr int kBuckets = 4096;
    float lo = max_value;
    for (int32_t id : candidates) lo = std::min(lo, adjusted[id]);
    const float range = max_value - lo;
    auto bucket_of = [&](int32_t id) {
      if (!(range > 0.0f)) return 0;
      return std::min(kBuckets - 1,
                      static_cast<int>((max_value - adjusted[id]) / range * kBuckets));
    };
    bucket_mass.assign(kBuckets, 0.0);
    for (int32_t id : candidates) bucket_mass[bucket_of(id)] += weights[id];
    int boundary = 0;
    double before = 0.0;
    while (boundary + 1 < kBuckets && before + bucket_mass[boundary] < target_mass)
      before += bucket_mass[boundary++];
    // Kept: every bucket above the boundary (id order), then the boundary bucket by rank while
    // the mass before a token is below the target.
    std::vector<int32_t>& kept = candidates;  // compacted in place
    size_t head = 0;
    std::vector<int32_t> edge;
    for (int32_t id : candidates) {
      const int b = bucket_of(id);
      if (b < boundary)
        kept[head++] = id;
      else if (b == boundary)
        edge.push_back(id);
    }
    std::sort(edge.begin(), edge.end(), by_value);
    double mass = before;
    for (int32_t id : edge) {
      if (mass >= target_mass && head > 0) break;
      kept[head++] = id;
      mass += weights[id];
    }
    double kept_mass = 0.0;
    for (size_t i = 0; i < head; ++i) kept_mass += weights[kept[i]];
    return draw(kept.data(), head, kept_mass);
  }
  // top_k already ranked the candidates.
  size_t cut = 0;
  double mass = 0.0;
  while (cut < candidates.size() && (cut == 0 || mass < target_mass))
    mass += weights[candidates[cut++]];
  return draw(candidates.data(), cut, mass);
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
    std::vector<double> weights, bucket_mass;
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
            if (value == row[id])
              value =
                  value > 0 ? value / params.repetition_penalty : value * params.repetition_penalty;
          }
        };
        penalise(params.prompt_tokens);
        penalise(params.output_tokens);
      }
      if ((params.frequency_penalty != 0.0f || params.presence_penalty != 0.0f) &&
          params.output_tokens) {
        counts.assign(static_cast<size_t>(vocab), 0);
        for (int32_t id : *params.output_tokens) ++counts[id];
        for (int32_t id = 0; id < vocab; ++id)
          if (counts[id])
            adjusted[id] -= params.frequency_penalty * counts[id] + params.presence_penalty;
      }
      if (params.logit_bias)
        for (auto [id, bias] : *params.logit_bias) adjusted[id] += bias;
      for (int32_t id : params.banned_tokens) adjusted[id] = -INFINITY;

      int32_t chosen = 0;
      if (params.temperature <= 0.0f) {
        for (int32_t id = 1; id < vocab; ++id)
          if (adjusted[id] > adjusted[chosen]) chosen = id;
      } else {
        chosen = sample_filtered(adjusted, params, candidates, weights, bucket_mass);
      }
      float normaliser = log_normaliser(row, vocab);
      out[r].token_id = chosen;
      out[r].logprob = row[chosen] - normaliser;
      top_logprobs(row, vocab, normaliser, params.logprobs, out[r].top);
    }
  });
}

}  // namespace sy::backend::cpu
