#include "loadgen/route_check.h"

#include <cstring>
#include <vector>

#include "tensor/dtype.h"
#include "util/base64.h"
#include "util/npy.h"

namespace sy::loadgen {

namespace {

// Ids in range; and when the row layout is known, each (row, layer) holds K distinct ids or is
// all zero (a dense layer in vLLM's layout).
Status check_ids(const std::vector<int64_t>& ids, const RouteShape& shape,
                 const RouteExpectation& expectation, bool layout_known) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || (expectation.num_experts && ids[i] >= *expectation.num_experts)) {
      const int64_t row_width = shape.layers * shape.top_k;
      return Status::errorf("route id {} at row {} is not an expert id (valid: 0..{})", ids[i],
                            row_width ? static_cast<int64_t>(i) / row_width : 0,
                            expectation.num_experts ? *expectation.num_experts - 1 : 65535);
    }
  }
  if (!layout_known) return Status::ok();
  for (int64_t row = 0; row < shape.rows; ++row) {
    for (int64_t layer = 0; layer < shape.layers; ++layer) {
      const int64_t* choice = &ids[static_cast<size_t>((row * shape.layers + layer) * shape.top_k)];
      bool all_zero = true;
      for (int64_t k = 0; k < shape.top_k; ++k) all_zero = all_zero && choice[k] == 0;
      if (all_zero) continue;
      for (int64_t k = 1; k < shape.top_k; ++k) {
        for (int64_t earlier = 0; earlier < k; ++earlier) {
          if (choice[earlier] == choice[k]) {
            return Status::errorf("routes[{}, {}] picks expert {} twice", row, layer, choice[k]);
          }
        }
      }
    }
  }
  return Status::ok();
}

Status check_layout(const RouteShape& shape, int64_t expected_rows,
                    const RouteExpectation& expectation) {
  if (shape.rows != expected_rows) {
    return Status::errorf("routes have {} rows, expected N-1 = {} (prompt + completion - 1)",
                          shape.rows, expected_rows);
  }
  if (expectation.layers && shape.layers != *expectation.layers) {
    return Status::errorf("routes have {} layers, expected {}", shape.layers, *expectation.layers);
  }
  if (expectation.top_k && shape.top_k != *expectation.top_k) {
    return Status::errorf("routes have top_k {}, expected {}", shape.top_k, *expectation.top_k);
  }
  return Status::ok();
}

}  // namespace

Result<RouteShape> check_npy_routes(const std::string& base64_text, int64_t expected_rows,
                                    const RouteExpectation& expectation) {
  SY_ASSIGN(std::string bytes, base64_decode(base64_text));
  SY_ASSIGN(NpyArray array, npy_decode(bytes));
  if (array.dtype != DType::kU8 && array.dtype != DType::kU16) {
    return Status::errorf("routes dtype is {}, expected uint8 or uint16", dtype_name(array.dtype));
  }
  if (array.shape.size() != 3) {
    return Status::errorf("routes have {} dimensions, expected 3 (N-1, L, K)", array.shape.size());
  }
  const RouteShape shape{array.shape[0], array.shape[1], array.shape[2]};
  SY_TRY(check_layout(shape, expected_rows, expectation));
  SY_ASSIGN(std::vector<int64_t> ids, npy_to_int64(array));
  SY_TRY(check_ids(ids, shape, expectation, /*layout_known=*/true));
  return shape;
}

Result<RouteShape> check_flat_routes(const std::string& base64_text, int64_t expected_rows,
                                     const RouteExpectation& expectation) {
  SY_ASSIGN(std::string bytes, base64_decode(base64_text));
  if (bytes.size() % 4 != 0) {
    return Status::errorf("flat int32 routes have {} bytes, not a multiple of 4", bytes.size());
  }
  const int64_t count = static_cast<int64_t>(bytes.size() / 4);
  RouteShape shape;
  shape.rows = expected_rows;
  if (expectation.layers && expectation.top_k) {
    shape.layers = *expectation.layers;
    shape.top_k = *expectation.top_k;
  } else if (expected_rows > 0 && count % expected_rows == 0) {
    shape.layers = 1;  // without L and K only the row width L*K is known
    shape.top_k = count / expected_rows;
  } else if (expected_rows == 0 && count == 0) {
    return shape;
  } else {
    return Status::errorf("flat routes hold {} ids, not a multiple of N-1 = {} rows", count,
                          expected_rows);
  }
  if (count != shape.rows * shape.layers * shape.top_k) {
    return Status::errorf("flat routes hold {} ids, expected (N-1)*L*K = {} rows * {} * {}", count,
                          shape.rows, shape.layers, shape.top_k);
  }
  std::vector<int64_t> ids(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    int32_t id;
    std::memcpy(&id, bytes.data() + i * 4, 4);  // little-endian hosts only, like the server
    ids[static_cast<size_t>(i)] = id;
  }
  SY_TRY(check_ids(ids, shape, expectation, expectation.layers && expectation.top_k));
  return shape;
}

}  // namespace sy::loadgen
