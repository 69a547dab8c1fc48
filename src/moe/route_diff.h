// Routing agreement between two route arrays (`switchyard routes diff`): per layer and overall,
// the fraction of rows whose expert sets differ, and of rows whose sets agree but whose order
// (descending selection score) differs. Reads our .npy, SGLang's flat int32 (raw or base64) with a
// shape, and JSON nested lists, so an RL team can compare trainer and engine routing.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "moe/route_log.h"
#include "util/status.h"

namespace sy::moe {

// The shape a flat array is read with: (rows, layers, top_k), or (layers, top_k) with the rows
// implied by the length. Parsed from "N,L,K" or "L,K".
struct RouteShape {
  int64_t rows = -1;  // -1: from the data's length
  int64_t layers = 0;
  int64_t top_k = 0;
};
Result<RouteShape> parse_route_shape(std::string_view text);

// A routes file's bytes -> (rows, L, K) ids. Recognised by content: a .npy (any integer dtype,
// 3-D); JSON (a nested (rows, L, K) list, or a flat list with `shape`); base64 text of either of
// those or of SGLang's flat int32; otherwise raw little-endian int32 with `shape`.
Result<RouteArray> parse_route_file(std::string_view bytes, const std::optional<RouteShape>& shape);
Result<RouteArray> read_route_file(const std::string& path, const std::optional<RouteShape>& shape);

struct LayerAgreement {
  int64_t layer = 0;
  int64_t rows = 0;           // rows compared on this layer
  int64_t set_differs = 0;    // the two rows choose different experts
  int64_t order_differs = 0;  // same experts, different order
  bool dense = false;         // every row is all zero in both (a dense layer): not counted
};

struct RouteDiff {
  int64_t rows = 0, layers = 0, top_k = 0;
  std::vector<LayerAgreement> per_layer;
  // Over every (row, MoE layer) pair.
  int64_t compared = 0, set_differs = 0, order_differs = 0;
  // Token rows where at least one layer's set differs.
  int64_t rows_with_set_difference = 0;
};

// The arrays must have the same shape (the error says both).
Result<RouteDiff> diff_routes(const RouteArray& a, const RouteArray& b);

}  // namespace sy::moe
