// ExpertLoadCounter: the totals after any sequence of hand-overs equal a direct count of the
// rows handed over (only the MoE layers, only the first `rows` rows of each vector), totals()
// waits for the counting thread, and the vectors come back as spares with their capacity.
#include "engine/expert_load.h"

#include <gtest/gtest.h>

#include <random>

#include "../test_seed.h"

namespace sy::engine {
namespace {

TEST(ExpertLoadCounter, TotalsEqualADirectCountOfEveryRowHandedOver) {
  const uint64_t seed = test::test_seed();
  SY_SEED_TRACE(seed);
  std::mt19937_64 rng(seed);
  for (const int64_t top_k : {int64_t{1}, int64_t{3}, int64_t{8}}) {
    const int64_t layers = 5, experts = 13;
    const std::vector<int> moe_layers = {1, 2, 4};  // layers 0 and 3 dense: never counted
    ExpertLoadCounter counter(moe_layers, experts, layers, top_k);
    std::vector<int64_t> expected(moe_layers.size() * experts, 0);
    for (int step = 0; step < 40; ++step) {
      const int64_t rows = static_cast<int64_t>(rng() % 300) + 1;
      std::vector<int32_t> routes = counter.spare();
      const size_t capacity_before = routes.capacity();
      // Extra rows past `rows` (a reused vector's tail) must not count.
      routes.assign(static_cast<size_t>((rows + 3) * layers * top_k), 0);
      for (int32_t& id : routes) id = static_cast<int32_t>(rng() % experts);
      for (int64_t r = 0; r < rows; ++r)
        for (size_t m = 0; m < moe_layers.size(); ++m)
          for (int64_t k = 0; k < top_k; ++k)
            ++expected[m * experts + routes[(r * layers + moe_layers[m]) * top_k + k]];
      if (step > 2) EXPECT_GE(routes.capacity(), capacity_before);
      counter.add(std::move(routes), rows);
      if (step % 7 == 0) EXPECT_EQ(counter.totals(), expected) << "top_k " << top_k << " step " << step;
    }
    EXPECT_EQ(counter.totals(), expected) << "top_k " << top_k;
  }
}

TEST(ExpertLoadCounter, SparesComeBackAfterCounting) {
  ExpertLoadCounter counter({0}, 4, 1, 2);
  EXPECT_TRUE(counter.spare().empty());  // nothing handed over yet
  std::vector<int32_t> routes(2000, 1);
  counter.add(std::move(routes), 1000);
  EXPECT_EQ(counter.totals(), (std::vector<int64_t>{0, 2000, 0, 0}));
  const std::vector<int32_t> spare = counter.spare();  // counted: back, emptied, capacity kept
  EXPECT_TRUE(spare.empty());
  EXPECT_GE(spare.capacity(), 2000u);
}

}  // namespace
}  // namespace sy::engine
