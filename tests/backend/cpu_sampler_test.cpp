// The CPU sampler against an independent reference written here in double precision, in vLLM's
// order (temperature, min_p against the most likely token, top_k, top_p by vLLM's ascending-cumsum
// rule): sampled frequencies within 5 sigma of the reference distribution and never outside its
// support; greedy, penalties, logit bias, bans and seeds checked on small exact cases.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <set>

#include "backend/backend.h"
#include "../test_seed.h"

namespace sy::backend {
namespace {

struct Filters {
  float temperature = 1.0f;
  int top_k = -1;
  float top_p = 1.0f;
  float min_p = 0.0f;
};

// vLLM v1's sampler, spelled out: probabilities of each id after all filters.
std::vector<double> reference(const std::vector<float>& logits, const Filters& f) {
  const size_t n = logits.size();
  std::vector<double> l(n);
  for (size_t i = 0; i < n; ++i) l[i] = static_cast<double>(logits[i]) / f.temperature;
  const double max_l = *std::max_element(l.begin(), l.end());
  std::vector<bool> kept(n, true);
  if (f.min_p > 0) {
    double z = 0;
    for (double x : l) z += std::exp(x - max_l);
    const double p_max = 1.0 / z;
    for (size_t i = 0; i < n; ++i) kept[i] = std::exp(l[i] - max_l) / z >= f.min_p * p_max;
  }
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return l[a] > l[b]; });
  if (f.top_k > 0) {
    int seen = 0;
    for (size_t id : order)
      if (kept[id] && ++seen > f.top_k) kept[id] = false;
  }
  auto normalised = [&] {
    std::vector<double> p(n, 0.0);
    double z = 0;
    for (size_t i = 0; i < n; ++i)
      if (kept[i]) z += p[i] = std::exp(l[i] - max_l);
    for (double& x : p) x /= z;
    return p;
  };
  std::vector<double> p = normalised();
  if (f.top_p < 1.0f) {
    // Ascending by probability; drop while the cumulative sum (this one included) <= 1 - top_p;
    // the most likely token always stays.
    std::vector<size_t> ascending(order.rbegin(), order.rend());
    double cumulative = 0;
    for (size_t j = 0; j + 1 < ascending.size(); ++j) {
      size_t id = ascending[j];
      if (!kept[id]) continue;
      cumulative += p[id];
      if (cumulative <= 1.0 - f.top_p) kept[id] = false;
    }
    p = normalised();
  }
  return p;
}

struct Sampler {
  std::unique_ptr<Backend> backend = make_cpu_backend({2});

  // One row per draw, all the same logits, draw indices 0..draws-1.
  std::vector<SampledToken> sample(const std::vector<float>& logits,
                                   std::vector<SamplingRow> rows) {
    const int64_t vocab = static_cast<int64_t>(logits.size());
    Tensor t = backend->alloc(DType::kF32, {static_cast<int64_t>(rows.size()), vocab});
    std::vector<float> all;
    for (size_t r = 0; r < rows.size(); ++r) all.insert(all.end(), logits.begin(), logits.end());
    backend->upload(all.data(), t);
    std::vector<SampledToken> out(rows.size() + 3);  // poisoned size: sample must resize
    for (auto& token : out) token.token_id = -7;
    backend->sample(t, rows, out);
    backend->free_buffer(t);
    return out;
  }
  std::vector<SampledToken> draws(const std::vector<float>& logits, const Filters& f, int count,
                                  uint64_t seed) {
    std::vector<SamplingRow> rows(static_cast<size_t>(count));
    for (int i = 0; i < count; ++i) {
      rows[i].temperature = f.temperature;
      rows[i].top_k = f.top_k;
      rows[i].top_p = f.top_p;
      rows[i].min_p = f.min_p;
      rows[i].seed = seed;
      rows[i].draw_index = static_cast<uint64_t>(i);
    }
    return sample(logits, rows);
  }
};

std::vector<float> random_logits(std::mt19937& rng, int n, float scale) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> logits(static_cast<size_t>(n));
  for (float& x : logits) x = normal(rng);
  return logits;
}

TEST(CpuSampler, FrequenciesMatchTheReferenceUnderEveryFilter) {
  const uint64_t seed = test::test_seed();
  SY_SEED_TRACE(seed);
  std::mt19937 rng(static_cast<uint32_t>(seed));
  const std::vector<Filters> cases = {{1.0f, -1, 1.0f, 0.0f},  {0.7f, 5, 1.0f, 0.0f},
                                      {1.0f, -1, 0.8f, 0.0f},  {1.3f, -1, 1.0f, 0.1f},
                                      {1.0f, -1, 0.7f, 0.05f}, {0.9f, 10, 0.9f, 0.02f},
                                      {2.0f, 3, 0.5f, 0.0f}};
  Sampler sampler;
  const int draws = 20000;
  for (const Filters& f : cases) {
    const std::vector<float> logits = random_logits(rng, 40, 1.5f);
    const std::vector<double> expected = reference(logits, f);
    auto out = sampler.draws(logits, f, draws, rng());
    ASSERT_EQ(out.size(), static_cast<size_t>(draws));
    std::vector<int> counts(logits.size(), 0);
    for (const auto& token : out) {
      ASSERT_GE(token.token_id, 0);
      ASSERT_LT(token.token_id, 40);
      ++counts[token.token_id];
    }
    const std::string what =
        "T=" + std::to_string(f.temperature) + " top_k=" + std::to_string(f.top_k) +
        " top_p=" + std::to_string(f.top_p) + " min_p=" + std::to_string(f.min_p);
    for (size_t id = 0; id < logits.size(); ++id) {
      const double p = expected[id], frequency = counts[id] / static_cast<double>(draws);
      if (p == 0.0) {
        EXPECT_EQ(counts[id], 0) << what << ": id " << id << " is filtered out";
      } else {
        EXPECT_NEAR(frequency, p, 5.0 * std::sqrt(p * (1 - p) / draws) + 1e-4)
            << what << ": id " << id;
      }
    }
  }
}

TEST(CpuSampler, TiedLogitsAtTheTopPBoundaryResolveByLowerIdAsTheReference) {
  // Logits on a coarse grid: many exact ties, some straddling the top_p cut.
  const uint64_t seed = test::test_seed();
  SY_SEED_TRACE(seed);
  std::mt19937 rng(static_cast<uint32_t>(seed));
  Sampler sampler;
  for (float top_p : {0.3f, 0.6f, 0.9f}) {
    std::vector<float> logits = random_logits(rng, 60, 1.5f);
    for (float& x : logits) x = std::round(x * 2.0f) / 2.0f;
    Filters f{1.0f, -1, top_p, 0.0f};
    const std::vector<double> expected = reference(logits, f);
    const int draws = 20000;
    std::vector<int> counts(logits.size(), 0);
    for (const auto& token : sampler.draws(logits, f, draws, rng())) ++counts[token.token_id];
    for (size_t id = 0; id < logits.size(); ++id) {
      const double p = expected[id];
      if (p == 0.0) {
        EXPECT_EQ(counts[id], 0) << "top_p " << top_p << ": id " << id << " is past the cut";
      } else {
        EXPECT_NEAR(counts[id] / static_cast<double>(draws), p,
                    5.0 * std::sqrt(p * (1 - p) / draws) + 1e-4)
            << "top_p " << top_p << ": id " << id;
      }
    }
  }
}

TEST(CpuSampler, MinPComesBeforeTopPAsInVllm) {
  // p = (0.5, 0.3, 0.2). vLLM: min_p 0.5 drops 0.2 (< 0.25), renormalised (0.625, 0.375); then
  // top_p 0.6 keeps only the first. top_p before min_p would have kept two.
  const std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  Filters f{1.0f, -1, 0.6f, 0.5f};
  const std::vector<double> expected = reference(logits, f);
  EXPECT_EQ(expected[0], 1.0);
  Sampler sampler;
  for (const auto& token : sampler.draws(logits, f, 2000, 11)) ASSERT_EQ(token.token_id, 0);
}

TEST(CpuSampler, WideNucleusOverALargeFlatVocabulary) {
  // Nearly flat logits: the top_p=0.5 nucleus holds about half of 20,000 ids, far beyond any small
  // prefix the sampler sorts first.
  const uint64_t seed = test::test_seed();
  SY_SEED_TRACE(seed);
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::uniform_real_distribution<float> flat(0.0f, 0.01f);
  std::vector<float> logits(20000);
  for (float& x : logits) x = flat(rng);
  Filters f{1.0f, -1, 0.5f, 0.0f};
  const std::vector<double> expected = reference(logits, f);
  const auto support =
      std::count_if(expected.begin(), expected.end(), [](double p) { return p > 0; });
  EXPECT_GT(support, 9000);
  EXPECT_LT(support, 11000);
  Sampler sampler;
  std::set<int32_t> seen;
  for (const auto& token : sampler.draws(logits, f, 1000, rng())) {
    ASSERT_GT(expected[token.token_id], 0.0)
        << "id " << token.token_id << " is outside the nucleus";
    seen.insert(token.token_id);
  }
  // 1,000 draws over ~10,000 nearly equally likely ids: ~950 distinct expected; a nucleus cut
  // short (say at the first sorted prefix) would give far fewer.
  EXPECT_GT(seen.size(), 850u);
}

TEST(CpuSampler, GreedyLogprobsPenaltiesBiasBansAndSeeds) {
  Sampler sampler;
  auto greedy = [&](const std::vector<float>& logits, SamplingRow row) {
    row.temperature = 0.0f;
    return sampler.sample(logits, {row})[0];
  };
  // Argmax, ties to the lower id; logprob and top-k under the raw distribution.
  SamplingRow plain;
  plain.logprobs = 2;
  SampledToken t = greedy({0.5f, 2.0f, 2.0f, -1.0f}, plain);
  EXPECT_EQ(t.token_id, 1);
  const double z = std::log(std::exp(0.5) + 2 * std::exp(2.0) + std::exp(-1.0));
  EXPECT_NEAR(t.logprob, 2.0 - z, 1e-5);
  ASSERT_EQ(t.top.size(), 2u);
  EXPECT_EQ(t.top[0].first, 1);
  EXPECT_EQ(t.top[1].first, 2);
  EXPECT_NEAR(t.top[1].second, 2.0 - z, 1e-5);

  const std::vector<int32_t> zero = {0}, zero_twice = {0, 0};
  SamplingRow repetition;
  repetition.repetition_penalty = 1.1f;
  repetition.prompt_tokens = &zero;  // 2.0 / 1.1 = 1.818 < 1.9
  EXPECT_EQ(greedy({2.0f, 1.9f}, repetition).token_id, 1);
  EXPECT_EQ(greedy({-1.0f, -1.05f}, repetition).token_id, 1) << "negative logits are multiplied";
  SamplingRow frequency;
  frequency.frequency_penalty = 0.06f;
  frequency.output_tokens = &zero;  // 1.94 > 1.9
  EXPECT_EQ(greedy({2.0f, 1.9f}, frequency).token_id, 0);
  frequency.output_tokens = &zero_twice;  // 1.88 < 1.9
  EXPECT_EQ(greedy({2.0f, 1.9f}, frequency).token_id, 1);
  SamplingRow presence;
  presence.presence_penalty = 0.2f;
  presence.output_tokens = &zero_twice;  // once, not per occurrence: 1.8
  EXPECT_EQ(greedy({2.0f, 1.9f, 1.85f}, presence).token_id, 1);
  const std::vector<std::pair<int32_t, float>> bias = {{1, 0.2f}};
  SamplingRow biased;
  biased.logit_bias = &bias;
  EXPECT_EQ(greedy({2.0f, 1.9f}, biased).token_id, 1);
  SamplingRow banned;
  banned.banned_tokens = {0};
  EXPECT_EQ(greedy({2.0f, 1.9f}, banned).token_id, 1);
  banned.temperature = 1.0f;
  for (const auto& token :
       sampler.sample({5.0f, 1.0f, 1.0f}, std::vector<SamplingRow>(200, banned)))
    EXPECT_NE(token.token_id, 0);
  // A banned token is -inf: with top_p and min_p too it is never drawn, and the rest keep their
  // reference probabilities (here: the ban leaves 1 and 2 with equal mass, top_p 0.9 keeps both).
  banned.top_p = 0.9f;
  std::vector<SamplingRow> banned_rows(2000, banned);
  for (size_t i = 0; i < banned_rows.size(); ++i) banned_rows[i].draw_index = i;
  int ones = 0;
  for (const auto& token : sampler.sample({5.0f, 1.0f, 1.0f}, banned_rows)) {
    ASSERT_NE(token.token_id, 0);
    ones += token.token_id == 1;
  }
  EXPECT_NEAR(ones / 2000.0, 0.5, 5 * std::sqrt(0.25 / 2000));
  banned.min_p = 0.5f;
  for (const auto& token : sampler.sample({5.0f, 1.0f, 1.0f}, std::vector<SamplingRow>(50, banned)))
    EXPECT_NE(token.token_id, 0);
  SamplingRow all_banned;
  all_banned.banned_tokens = {0, 1, 2};
  all_banned.top_p = 0.5f;
  const SampledToken fallback = sampler.sample({5.0f, 1.0f, 1.0f}, {all_banned})[0];
  EXPECT_GE(fallback.token_id, 0) << "a row with every token banned still returns an id";
  EXPECT_LT(fallback.token_id, 3);

  // Seeds: the same (seed, draw index) gives the same token at any position of any batch.
  std::mt19937 rng(7);
  const std::vector<float> logits = random_logits(rng, 1000, 1.0f);
  std::vector<SamplingRow> rows(64);
  for (size_t i = 0; i < rows.size(); ++i) {
    rows[i].seed = 1234 + i % 4;
    rows[i].draw_index = i / 4;
    rows[i].top_p = 0.9f;
  }
  auto batch = sampler.sample(logits, rows);
  for (size_t i = 0; i < rows.size(); i += 9)
    EXPECT_EQ(sampler.sample(logits, {rows[i]})[0].token_id, batch[i].token_id) << "row " << i;
}

}  // namespace
}  // namespace sy::backend
