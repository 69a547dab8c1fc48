// `routes diff`: every input format reads to the same array, and the agreement counts match a
// brute-force count over freshly perturbed random routes.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "../test_seed.h"
#include "moe/route_diff.h"
#include "util/base64.h"
#include "util/npy.h"

namespace sy::moe {
namespace {

RouteArray random_routes(std::mt19937_64& rng, int64_t rows, int64_t layers, int64_t top_k,
                         int64_t experts, int dense_layer) {
  RouteArray r{rows, layers, top_k,
               std::vector<int32_t>(static_cast<size_t>(rows * layers * top_k), 0)};
  std::vector<int32_t> all(static_cast<size_t>(experts));
  std::iota(all.begin(), all.end(), 0);
  for (int64_t row = 0; row < rows; ++row)
    for (int64_t layer = 0; layer < layers; ++layer) {
      if (layer == dense_layer) continue;
      std::shuffle(all.begin(), all.end(), rng);
      std::copy_n(all.begin(), top_k, r.row_ptr(row) + layer * top_k);
    }
  return r;
}

TEST(RouteDiff, CountsMatchABruteForceCountOnPerturbedRoutes) {
  const uint64_t seed = test::test_seed();
  SY_SEED_TRACE(seed);
  std::mt19937_64 rng(seed);
  const int64_t rows = 50 + static_cast<int64_t>(rng() % 50), layers = 5, top_k = 4, experts = 12;
  RouteArray a = random_routes(rng, rows, layers, top_k, experts, /*dense_layer=*/1);
  RouteArray b = a;
  // Perturb: some rows swap two slots (order only), some replace an expert (set differs).
  std::vector<std::vector<int>> kind(static_cast<size_t>(rows), std::vector<int>(layers, 0));
  for (int64_t row = 0; row < rows; ++row)
    for (int64_t layer = 0; layer < layers; ++layer) {
      if (layer == 1) continue;
      int32_t* rb = b.row_ptr(row) + layer * top_k;
      const int roll = static_cast<int>(rng() % 10);
      if (roll == 0) {
        std::swap(rb[0], rb[1 + rng() % (top_k - 1)]);
        kind[row][layer] = 1;
      } else if (roll == 1) {
        std::set<int32_t> used(rb, rb + top_k);
        int32_t fresh = 0;
        while (used.count(fresh)) ++fresh;
        rb[rng() % top_k] = fresh;
        kind[row][layer] = 2;
      }
    }
  Result<RouteDiff> diff = diff_routes(a, b);
  ASSERT_TRUE(diff) << diff.message();
  int64_t order = 0, set = 0, token_rows = 0;
  for (int64_t row = 0; row < rows; ++row) {
    bool any = false;
    for (int64_t layer = 0; layer < layers; ++layer) {
      order += kind[row][layer] == 1;
      set += kind[row][layer] == 2;
      any |= kind[row][layer] == 2;
    }
    token_rows += any;
  }
  EXPECT_EQ(diff->order_differs, order);
  EXPECT_EQ(diff->set_differs, set);
  EXPECT_EQ(diff->compared, rows * (layers - 1));
  EXPECT_EQ(diff->rows_with_set_difference, token_rows);
  ASSERT_EQ(diff->per_layer.size(), 5u);
  EXPECT_TRUE(diff->per_layer[1].dense);
  for (int64_t layer : {0, 2, 3, 4}) {
    int64_t o = 0, s = 0;
    for (int64_t row = 0; row < rows; ++row) {
      o += kind[row][layer] == 1;
      s += kind[row][layer] == 2;
    }
    EXPECT_FALSE(diff->per_layer[layer].dense);
    EXPECT_EQ(diff->per_layer[layer].rows, rows);
    EXPECT_EQ(diff->per_layer[layer].order_differs, o) << layer;
    EXPECT_EQ(diff->per_layer[layer].set_differs, s) << layer;
  }
  // Identical arrays agree everywhere; different shapes are an error naming both.
  Result<RouteDiff> same = diff_routes(a, a);
  EXPECT_EQ(same->set_differs + same->order_differs, 0);
  RouteArray shorter = a;
  shorter.rows -= 1;
  shorter.ids.resize(static_cast<size_t>(shorter.rows * layers * top_k));
  Result<RouteDiff> mismatch = diff_routes(a, shorter);
  ASSERT_FALSE(mismatch);
  EXPECT_NE(mismatch.message().find(fmt::format("({}, 5, 4) and ({}, 5, 4)", rows, rows - 1)),
            std::string::npos)
      << mismatch.message();
}

TEST(RouteDiff, EveryFormatReadsToTheSameArray) {
  const uint64_t seed = test::test_seed();
  SY_SEED_TRACE(seed);
  std::mt19937_64 rng(seed);
  RouteArray r = random_routes(rng, 7, 3, 2, 300, -1);  // > 256 experts: uint16 .npy
  const RouteShape shape{-1, 3, 2};
  std::vector<uint16_t> narrow(r.ids.begin(), r.ids.end());
  const std::string npy = npy_encode(DType::kU16, {7, 3, 2}, narrow.data());
  const std::string int32(reinterpret_cast<const char*>(r.ids.data()), r.ids.size() * 4);
  nlohmann::json nested = nlohmann::json::array(), flat = nlohmann::json::array();
  for (int64_t row = 0; row < 7; ++row) {
    nlohmann::json rl = nlohmann::json::array();
    for (int64_t layer = 0; layer < 3; ++layer)
      rl.push_back({r.at(row, layer, 0), r.at(row, layer, 1)});
    nested.push_back(rl);
  }
  for (int32_t id : r.ids) flat.push_back(id);
  struct Input {
    const char* name;
    std::string bytes;
    std::optional<RouteShape> shape;
  };
  const std::vector<Input> inputs = {
      {"npy", npy, std::nullopt},
      {"base64 npy (vLLM's field)", base64_encode(npy) + "\n", std::nullopt},
      {"raw int32 + shape", int32, shape},
      {"base64 int32 (SGLang's field)", base64_encode(int32), RouteShape{7, 3, 2}},
      {"nested JSON", nested.dump(), std::nullopt},
      {"flat JSON + shape", flat.dump(), shape}};
  for (const Input& in : inputs) {
    Result<RouteArray> parsed = parse_route_file(in.bytes, in.shape);
    ASSERT_TRUE(parsed) << in.name << ": " << parsed.message();
    EXPECT_EQ(parsed->rows, 7) << in.name;
    EXPECT_EQ(parsed->layers, 3) << in.name;
    EXPECT_EQ(parsed->top_k, 2) << in.name;
    EXPECT_EQ(parsed->ids, r.ids) << in.name;
  }
  // Refusals name what is wrong.
  EXPECT_NE(parse_route_file(int32, std::nullopt).message().find("--shape"), std::string::npos);
  EXPECT_NE(parse_route_file(int32, RouteShape{8, 3, 2}).message().find("needs 48 values"),
            std::string::npos);
  EXPECT_NE(parse_route_file("[[1, 2], [3]]", shape).message().find("ragged"), std::string::npos);
  EXPECT_NE(parse_route_file("[1.5, 2]", shape).message().find("not an integer"),
            std::string::npos);
  EXPECT_NE(parse_route_file(int32.substr(0, 5), shape).message().find("int32"), std::string::npos);
  EXPECT_FALSE(parse_route_shape("3,x"));
  EXPECT_FALSE(parse_route_shape("0,2"));
  EXPECT_EQ(parse_route_shape("4,3,2")->rows, 4);
  EXPECT_EQ(parse_route_shape("3,2")->rows, -1);
}

}  // namespace
}  // namespace sy::moe
