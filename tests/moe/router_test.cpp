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

// Each RouterSpec option on a fixture where ignoring it changes what the router returns.
struct Routed {
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

Routed route(const std::vector<float>& logits, const RouterSpec& spec,
             const RouterBiases& biases = {}) {
  Routed out{std::vector<int32_t>(static_cast<size_t>(spec.top_k), -7),
             std::vector<float>(static_cast<size_t>(spec.top_k), NAN)};
  std::vector<float> scratch(static_cast<size_t>(router_scratch_floats(spec)), NAN);
  EXPECT_TRUE(validate_router_spec(spec).is_ok()) << validate_router_spec(spec).message();
  route_token(logits.data(), spec, biases, out.ids.data(), out.weights.data(), scratch.data());
  return out;
}

float sigmoid(float x) {
  return 1.0f / (1.0f + std::exp(-x));
}

TEST(RouterOptions, LogitBiasIsAddedBeforeScoringAndSelection) {
  const std::vector<float> logits = {1.0f, 0.9f, 0.0f, -1.0f}, bias = {0.0f, 0.5f, 0.0f, 0.0f};
  RouterSpec spec{4, 1, RouterScoring::kSoftmax, false};
  EXPECT_EQ(route(logits, spec).ids, (std::vector<int32_t>{0}));
  spec.has_logit_bias = true;
  const Routed biased = route(logits, spec, {bias.data(), nullptr});
  EXPECT_EQ(biased.ids, (std::vector<int32_t>{1}));
  const double z = std::exp(1.0) + std::exp(1.4) + std::exp(0.0) + std::exp(-1.0);
  EXPECT_NEAR(biased.weights[0], std::exp(1.4) / z, 1e-6) << "weights come from the biased logits";
  std::vector<float> forced(1), scratch(static_cast<size_t>(router_scratch_floats(spec)));
  const int32_t id = 2;
  gate_forced(logits.data(), spec, {bias.data(), nullptr}, &id, forced.data(), scratch.data());
  EXPECT_NEAR(forced[0], 1.0 / z, 1e-6) << "replay gates with the bias too";
}

TEST(RouterOptions, SoftmaxAfterTopKWeighsOnlyTheChosen) {
  const std::vector<float> logits = {2.0f, 1.0f, 0.5f, -1.0f};
  RouterSpec spec{4, 2, RouterScoring::kSoftmax, false};
  const Routed before = route(logits, spec);
  spec.softmax_after_topk = true;
  const Routed after = route(logits, spec);
  EXPECT_EQ(before.ids, after.ids);
  EXPECT_NEAR(after.weights[0], 1.0 / (1.0 + std::exp(-1.0)), 1e-6);
  EXPECT_NEAR(after.weights[0] + after.weights[1], 1.0, 1e-6);
  EXPECT_LT(before.weights[0] + before.weights[1], 0.95f)
      << "without it the weights are the full softmax's";
}

TEST(RouterOptions, RenormaliseAndScalingFactor) {
  const std::vector<float> logits = {2.0f, 1.0f, 0.5f, -1.0f};
  RouterSpec spec{4, 2, RouterScoring::kSigmoid, false};
  const Routed plain = route(logits, spec);
  EXPECT_NEAR(plain.weights[0], sigmoid(2.0f), 1e-6);
  spec.renormalize = true;
  const Routed renormalised = route(logits, spec);
  EXPECT_NEAR(renormalised.weights[0], sigmoid(2.0f) / (sigmoid(2.0f) + sigmoid(1.0f)), 1e-6);
  spec.routed_scaling_factor = 2.5f;
  const Routed scaled = route(logits, spec);
  EXPECT_NEAR(scaled.weights[0], 2.5f * renormalised.weights[0], 1e-6);
  EXPECT_NEAR(scaled.weights[1], 2.5f * renormalised.weights[1], 1e-6);
}

TEST(RouterOptions, SelectionBiasSteersSelectionButNotWeights) {
  const std::vector<float> logits = {1.0f, 0.8f, -0.5f, -2.0f},
                           correction = {0.0f, 0.3f, 0.0f, 0.0f};
  RouterSpec spec{4, 1, RouterScoring::kSigmoid, false};
  EXPECT_EQ(route(logits, spec).ids, (std::vector<int32_t>{0}));
  spec.has_selection_bias = true;
  const Routed biased = route(logits, spec, {nullptr, correction.data()});
  EXPECT_EQ(biased.ids, (std::vector<int32_t>{1}));
  EXPECT_NEAR(biased.weights[0], sigmoid(0.8f), 1e-6) << "the weight is the unbiased score";
  std::vector<float> forced(1), scratch(static_cast<size_t>(router_scratch_floats(spec)));
  const int32_t id = 0;
  gate_forced(logits.data(), spec, {nullptr, correction.data()}, &id, forced.data(),
              scratch.data());
  EXPECT_NEAR(forced[0], sigmoid(1.0f), 1e-6);
}

TEST(RouterOptions, GroupLimitedTopKKeepsTheBestGroups) {
  // Four groups of two. Sigmoid scores: group 0 {0.90, 0.10}, group 1 {0.80, 0.70}, the rest low.
  const std::vector<float> logits = {2.2f, -2.2f, 1.386f, 0.847f, -3.0f, -3.0f, -3.0f, -3.0f};
  RouterSpec spec{8, 2, RouterScoring::kSigmoid, false};
  EXPECT_EQ(route(logits, spec).ids, (std::vector<int32_t>{0, 2})) << "no groups: the global top-2";
  spec.num_groups = 4;
  spec.topk_groups = 1;
  spec.group_scoring = GroupScoring::kMax;
  EXPECT_EQ(route(logits, spec).ids, (std::vector<int32_t>{0, 1}))
      << "best group by its best expert";
  spec.group_scoring = GroupScoring::kTopTwoSum;
  const Routed two = route(logits, spec);
  EXPECT_EQ(two.ids, (std::vector<int32_t>{2, 3})) << "best group by its two best";
  EXPECT_NEAR(two.weights[0], sigmoid(1.386f), 1e-6);
  // Group scores see the selection bias (DeepSeek-V3 ranks groups on the corrected scores).
  std::vector<float> correction(8, 0.0f);
  correction[4] = correction[5] = 1.0f;
  spec.has_selection_bias = true;
  EXPECT_EQ(route(logits, spec, {nullptr, correction.data()}).ids, (std::vector<int32_t>{4, 5}));
}

TEST(RouterOptions, SpecValidationNamesTheField) {
  RouterSpec spec{8, 2, RouterScoring::kSigmoid, false};
  EXPECT_TRUE(validate_router_spec(spec).is_ok());
  spec.num_groups = 3;
  EXPECT_NE(validate_router_spec(spec).message().find("n_group"), std::string::npos);
  spec.num_groups = 4;
  spec.topk_groups = 5;
  EXPECT_NE(validate_router_spec(spec).message().find("topk_group"), std::string::npos);
  spec.topk_groups = 1;
  spec.top_k = 3;
  EXPECT_NE(validate_router_spec(spec).message().find("top_k"), std::string::npos)
      << "3 > the 2 experts kept";
  spec = RouterSpec{8, 9, RouterScoring::kSoftmax, false};
  EXPECT_FALSE(validate_router_spec(spec).is_ok());
}

}  // namespace
}  // namespace sy::moe
