// Checks a routed-experts payload the way a trainer would use it: it decodes, has one row per
// input position (N-1 rows for N = prompt + completion tokens), a consistent (L, K), and ids that
// are valid experts.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "util/status.h"

namespace sy::loadgen {

struct RouteExpectation {
  std::optional<int64_t> layers;       // L, when known (--route-layers)
  std::optional<int64_t> top_k;        // K, when known (--route-top-k)
  std::optional<int64_t> num_experts;  // ids must be below this when known
};

struct RouteShape {
  int64_t rows = 0, layers = 0, top_k = 0;
};

// vLLM's format: base64 of a .npy, uint8 (<= 256 experts) or uint16, shape (rows, L, K).
// Every (row, layer) must hold K distinct ids or be all zero (a dense layer in vLLM's layout).
Result<RouteShape> check_npy_routes(const std::string& base64_text, int64_t expected_rows,
                                    const RouteExpectation& expectation);
// SGLang's format: base64 of flat little-endian int32; L and K come from the expectation, or the
// row width is inferred from the length (which must then divide evenly).
Result<RouteShape> check_flat_routes(const std::string& base64_text, int64_t expected_rows,
                                     const RouteExpectation& expectation);

}  // namespace sy::loadgen
