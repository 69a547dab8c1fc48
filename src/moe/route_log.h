// Routes by token position: RouteArray is the (rows, layers, top_k) block of expert ids that the
// API returns and replays (DESIGN.md "Route semantics and wire format").
#pragma once

#include <cstdint>
#include <vector>

#include "util/status.h"

namespace sy::moe {

// Row r = experts chosen for input position (first_row + r); axis 1 = every hidden layer (dense
// layers' entries are 0 on the wire); axis 2 = top_k ids by descending selection score.
struct RouteArray {
  int64_t rows = 0;
  int64_t layers = 0;
  int64_t top_k = 0;
  std::vector<int32_t> ids;  // rows * layers * top_k, row-major
  // The gating weight each id's expert output was multiplied by, parallel to `ids`; empty when
  // not asked for (return_routed_experts_weights). Dense layers' entries are 0.
  std::vector<float> weights{};
  int64_t first_row = 0;  // input position of row 0 (a streamed piece starts past 0)

  int32_t at(int64_t row, int64_t layer, int64_t k) const {
    return ids[static_cast<size_t>((row * layers + layer) * top_k + k)];
  }
  int32_t* row_ptr(int64_t row) { return ids.data() + static_cast<size_t>(row * layers * top_k); }
  const int32_t* row_ptr(int64_t row) const {
    return ids.data() + static_cast<size_t>(row * layers * top_k);
  }
};

}  // namespace sy::moe
