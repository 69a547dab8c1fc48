// The reference router against a brute-force oracle in double precision: softmax top-k with ties
// to the lower id, renormalisation on and off, forced gating, and replay-row validation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "moe/router.h"

namespace sy::moe {
namespace {

struct Oracle {
  std::vector<int32_t> ids;
  std::vector<double> weights;
};

Oracle brute_force(const std::vector<float>& logits, const RouterSpec& spec) {
  const int64_t n = spec.num_experts;
  double max_logit = *std::max_element(logits.begin(), logits.end());
  std::vector<double> probs(static_cast<size_t>(n));
  double sum = 0;
  for (int64_t e = 0; e < n; ++e) sum += probs[e] = std::exp(static_cast<double>(logits[e]) - max_logit);
  for (auto& p : probs) p /= sum;
  std::vector<int32_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  Oracle oracle;
  oracle.ids.assign(order.begin(), order.begin() + spec.top_k);
  double chosen = 0;
  for (int32_t id : oracle.ids) chosen += probs[id];
  for (int32_t id : oracle.ids) oracle.weights.push_back(spec.renormalize ? probs[id] / chosen : probs[id]);
  return oracle;
}

TEST(Router, MatchesBruteForceOnFreshRandomLogits) {
  std::mt19937 rng(std::random_device{}());
  for (bool renormalize : {false, true}) {
    for (int trial = 0; trial < 300; ++trial) {
      RouterSpec spec{std::uniform_int_distribution<int64_t>(2, 160)(rng), 0, RouterScoring::kSoftmax, renormalize};
      spec.top_k = std::uniform_int_distribution<int64_t>(1, std::min<int64_t>(spec.num_experts, 8))(rng);
      std::vector<float> logits(static_cast<size_t>(spec.num_experts));
      std::normal_distribution<float> normal(0.0f, 3.0f);
      for (auto& l : logits) l = normal(rng);
      std::vector<int32_t> ids(static_cast<size_t>(spec.top_k), -7);
      std::vector<float> weights(static_cast<size_t>(spec.top_k), NAN), scratch(logits.size());
      route_token(logits.data(), spec, ids.data(), weights.data(), scratch.data());
      Oracle oracle = brute_force(logits, spec);
      EXPECT_EQ(ids, oracle.ids);
      for (int64_t k = 0; k < spec.top_k; ++k) EXPECT_NEAR(weights[k], oracle.weights[k], 1e-6);
      std::vector<float> forced(static_cast<size_t>(spec.top_k), NAN);
      gate_forced(logits.data(), spec, oracle.ids.data(), forced.data(), scratch.data());
      EXPECT_EQ(forced, weights) << "forced gating at the chosen ids equals free gating";
    }
  }
}

TEST(Router, TiesGoToTheLowerId) {
  RouterSpec spec{6, 3, RouterScoring::kSoftmax, true};
  std::vector<float> logits = {0.5f, 2.0f, 1.0f, 2.0f, 1.0f, 2.0f};
  std::vector<int32_t> ids(3);
  std::vector<float> weights(3), scratch(6);
  route_token(logits.data(), spec, ids.data(), weights.data(), scratch.data());
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 3, 5}));
  logits = {1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f};
  route_token(logits.data(), spec, ids.data(), weights.data(), scratch.data());
  EXPECT_EQ(ids, (std::vector<int32_t>{0, 1, 2}));
}

TEST(Router, ForcedGatingRenormalisesAtTheGivenIds) {
  RouterSpec spec{4, 2, RouterScoring::kSoftmax, true};
  std::vector<float> logits = {3.0f, 0.0f, 1.0f, -1.0f};
  std::vector<int32_t> forced = {3, 1};
  std::vector<float> weights(2), scratch(4);
  gate_forced(logits.data(), spec, forced.data(), weights.data(), scratch.data());
  const double p3 = std::exp(-1.0), p1 = std::exp(0.0);
  EXPECT_NEAR(weights[0], p3 / (p3 + p1), 1e-6);
  EXPECT_NEAR(weights[1], p1 / (p3 + p1), 1e-6);
}

TEST(Router, ReplayRowValidation) {
  RouterSpec spec{8, 3, RouterScoring::kSoftmax, false};
  std::vector<int32_t> good = {7, 0, 3}, out_of_range = {1, 8, 2}, negative = {-1, 2, 3}, duplicate = {4, 2, 4};
  EXPECT_TRUE(validate_route_row(good.data(), spec).is_ok());
  EXPECT_FALSE(validate_route_row(out_of_range.data(), spec).is_ok());
  EXPECT_FALSE(validate_route_row(negative.data(), spec).is_ok());
  EXPECT_FALSE(validate_route_row(duplicate.data(), spec).is_ok());
}

}  // namespace
}  // namespace sy::moe
