// Route payload checks: encoded with the util .npy/base64 writers, broken on purpose.
#include "loadgen/route_check.h"

#include <gtest/gtest.h>

#include "tensor/dtype.h"
#include "util/base64.h"
#include "util/npy.h"

namespace sy::loadgen {
namespace {

std::vector<uint8_t> good_ids(int64_t rows, int64_t layers, int64_t top_k, int experts) {
  std::vector<uint8_t> ids;
  for (int64_t row = 0; row < rows; ++row)
    for (int64_t layer = 0; layer < layers; ++layer)
      for (int64_t k = 0; k < top_k; ++k) ids.push_back(static_cast<uint8_t>((row + layer * 5 + k) % experts));
  return ids;
}

std::string npy_b64(DType dtype, std::vector<int64_t> shape, const void* data) {
  return base64_encode(npy_encode(dtype, shape, data));
}

TEST(CheckNpyRoutes, AcceptsAGoodPayload) {
  const auto ids = good_ids(9, 4, 8, 128);
  auto shape = check_npy_routes(npy_b64(DType::kU8, {9, 4, 8}, ids.data()), 9,
                                RouteExpectation{4, 8, 128});
  ASSERT_TRUE(shape) << shape.message();
  EXPECT_EQ(shape->rows, 9);
  EXPECT_EQ(shape->layers, 4);
  EXPECT_EQ(shape->top_k, 8);
  // uint16 for models with more than 256 experts
  std::vector<uint16_t> wide(ids.begin(), ids.end());
  wide[3] = 300;
  EXPECT_TRUE(check_npy_routes(npy_b64(DType::kU16, {9, 4, 8}, wide.data()), 9, RouteExpectation{4, 8, 384}));
  // an empty (0, L, K) array when N - 1 = 0
  EXPECT_TRUE(check_npy_routes(npy_b64(DType::kU8, {0, 4, 8}, ids.data()), 0, RouteExpectation{}));
}

TEST(CheckNpyRoutes, DenseLayerRowsOfZerosAreAllowed) {
  auto ids = good_ids(3, 2, 4, 16);
  for (int row = 0; row < 3; ++row)
    for (int k = 0; k < 4; ++k) ids[static_cast<size_t>(row * 8 + k)] = 0;  // layer 0 is dense
  EXPECT_TRUE(check_npy_routes(npy_b64(DType::kU8, {3, 2, 4}, ids.data()), 3, RouteExpectation{2, 4, 16}));
}

TEST(CheckNpyRoutes, RejectsWhatATrainerCouldNotUse) {
  const auto ids = good_ids(9, 4, 8, 128);
  const std::string good = npy_b64(DType::kU8, {9, 4, 8}, ids.data());
  auto rows = check_npy_routes(good, 10, {});
  ASSERT_FALSE(rows);
  EXPECT_NE(rows.message().find("9 rows, expected N-1 = 10"), std::string::npos) << rows.message();
  EXPECT_FALSE(check_npy_routes(good, 9, RouteExpectation{5, std::nullopt, std::nullopt}));
  EXPECT_FALSE(check_npy_routes(good, 9, RouteExpectation{std::nullopt, 4, std::nullopt}));
  auto range = check_npy_routes(good, 9, RouteExpectation{4, 8, 10});
  ASSERT_FALSE(range);
  EXPECT_NE(range.message().find("not an expert id"), std::string::npos);

  auto twice = ids;
  twice[1] = twice[0];
  auto duplicate = check_npy_routes(npy_b64(DType::kU8, {9, 4, 8}, twice.data()), 9, {});
  ASSERT_FALSE(duplicate);
  EXPECT_NE(duplicate.message().find("twice"), std::string::npos);
  auto zeros = ids;  // a row of two zeros among non-zeros is a duplicate, not a dense layer
  zeros[0] = 0;
  zeros[1] = 0;
  zeros[2] = 3;
  EXPECT_FALSE(check_npy_routes(npy_b64(DType::kU8, {9, 4, 8}, zeros.data()), 9, {}));

  std::vector<int32_t> wide(ids.begin(), ids.end());
  EXPECT_FALSE(check_npy_routes(npy_b64(DType::kI32, {9, 4, 8}, wide.data()), 9, {}));  // dtype
  EXPECT_FALSE(check_npy_routes(npy_b64(DType::kU8, {9, 32}, ids.data()), 9, {}));      // rank
  EXPECT_FALSE(check_npy_routes("not base64!", 9, {}));
  EXPECT_FALSE(check_npy_routes(base64_encode("not an npy file"), 9, {}));
}

TEST(CheckFlatRoutes, SglangInt32) {
  const auto narrow = good_ids(5, 2, 4, 64);
  std::vector<int32_t> ids(narrow.begin(), narrow.end());
  const std::string payload = base64_encode(
      std::string_view(reinterpret_cast<const char*>(ids.data()), ids.size() * 4));
  auto known = check_flat_routes(payload, 5, RouteExpectation{2, 4, 64});
  ASSERT_TRUE(known) << known.message();
  EXPECT_EQ(known->layers, 2);
  auto inferred = check_flat_routes(payload, 5, {});
  ASSERT_TRUE(inferred);
  EXPECT_EQ(inferred->layers * inferred->top_k, 8);
  EXPECT_FALSE(check_flat_routes(payload, 6, {}));                            // 40 ids, 6 rows
  EXPECT_FALSE(check_flat_routes(payload, 5, RouteExpectation{2, 8, 64}));    // L*K wrong
  EXPECT_FALSE(check_flat_routes(payload, 5, RouteExpectation{2, 4, 8}));     // ids too large
  EXPECT_FALSE(check_flat_routes(base64_encode("abc"), 1, {}));               // not int32s
}

}  // namespace
}  // namespace sy::loadgen
