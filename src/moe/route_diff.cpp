#include "moe/route_diff.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "util/base64.h"
#include "util/npy.h"

namespace sy::moe {
namespace {

Result<RouteArray> from_values(const std::vector<int64_t>& values, const RouteShape& shape) {
  if (shape.layers <= 0 || shape.top_k <= 0)
    return Status::errorf("shape must have positive layers and top_k, got ({}, {})", shape.layers,
                          shape.top_k);
  const int64_t row_ints = shape.layers * shape.top_k;
  const int64_t count = static_cast<int64_t>(values.size());
  if (count % row_ints != 0)
    return Status::errorf("{} values do not make whole rows of ({}, {})", count, shape.layers,
                          shape.top_k);
  const int64_t rows = count / row_ints;
  if (shape.rows >= 0 && shape.rows != rows)
    return Status::errorf("shape ({}, {}, {}) needs {} values, the data has {}", shape.rows,
                          shape.layers, shape.top_k, shape.rows * row_ints, count);
  RouteArray out;
  out.rows = rows;
  out.layers = shape.layers;
  out.top_k = shape.top_k;
  out.ids.reserve(values.size());
  for (int64_t v : values) {
    if (v < 0 || v > INT32_MAX) return Status::errorf("expert id {} is not a valid id", v);
    out.ids.push_back(static_cast<int32_t>(v));
  }
  return out;
}

Result<RouteArray> from_npy(std::string_view bytes, const std::optional<RouteShape>& shape) {
  SY_ASSIGN(NpyArray array, npy_decode(bytes));
  SY_ASSIGN(std::vector<int64_t> values, npy_to_int64(array));
  if (array.shape.size() == 3) {
    if (shape && (shape->layers != array.shape[1] || shape->top_k != array.shape[2]))
      return Status::errorf("the .npy has shape ({}, {}, {}), not the --shape given",
                            array.shape[0], array.shape[1], array.shape[2]);
    return from_values(values, {array.shape[0], array.shape[1], array.shape[2]});
  }
  if (!shape)
    return Status::errorf("a {}-D .npy needs --shape (rows, layers, top_k)", array.shape.size());
  return from_values(values, *shape);
}

Result<RouteArray> from_json(std::string_view text, const std::optional<RouteShape>& shape) {
  nlohmann::json value = nlohmann::json::parse(text, nullptr, false);
  if (value.is_discarded() || !value.is_array()) return Status::error("not a JSON list");
  std::vector<int64_t> values;
  std::vector<int64_t> dims;
  // Flattens a regular nested list, recording its dimensions.
  std::function<Status(const nlohmann::json&, size_t)> walk = [&](const nlohmann::json& node,
                                                                  size_t depth) -> Status {
    if (node.is_array()) {
      if (dims.size() == depth)
        dims.push_back(static_cast<int64_t>(node.size()));
      else if (dims[depth] != static_cast<int64_t>(node.size()))
        return Status::errorf("ragged JSON list: {} and {} entries at depth {}", dims[depth],
                              node.size(), depth);
      for (const auto& child : node) SY_TRY(walk(child, depth + 1));
      return Status::ok();
    }
    if (!node.is_number_integer())
      return Status::errorf("JSON entry {} is not an integer", node.dump());
    if (depth != dims.size()) return Status::error("ragged JSON list: numbers at different depths");
    values.push_back(node.get<int64_t>());
    return Status::ok();
  };
  SY_TRY(walk(value, 0));
  if (dims.size() == 3) return from_values(values, {dims[0], dims[1], dims[2]});
  if (dims.size() == 1 && dims[0] == 0)
    return from_values(values, shape.value_or(RouteShape{0, 1, 1}));
  if (!shape)
    return Status::errorf("a {}-D JSON list needs --shape (rows, layers, top_k)", dims.size());
  return from_values(values, *shape);
}

Result<RouteArray> from_int32(std::string_view bytes, const std::optional<RouteShape>& shape) {
  if (!shape) return Status::error("raw int32 routes (SGLang's format) need --shape N,L,K or L,K");
  if (bytes.size() % 4 != 0)
    return Status::errorf("{} bytes is not a whole number of int32 values", bytes.size());
  std::vector<int64_t> values(bytes.size() / 4);
  for (size_t i = 0; i < values.size(); ++i) {
    int32_t v;
    std::memcpy(&v, bytes.data() + 4 * i, 4);
    values[i] = v;
  }
  return from_values(values, *shape);
}

bool looks_base64(std::string_view text) {
  size_t chars = 0;
  for (char c : text) {
    if (std::isspace(static_cast<unsigned char>(c))) continue;
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '+' && c != '/' && c != '=')
      return false;
    ++chars;
  }
  return chars > 0 && chars % 4 == 0;
}

std::string_view trim(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front())))
    text.remove_prefix(1);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back())))
    text.remove_suffix(1);
  return text;
}

}  // namespace

Result<RouteShape> parse_route_shape(std::string_view text) {
  std::vector<int64_t> dims;
  std::string token;
  std::stringstream in{std::string(text)};
  while (std::getline(in, token, ',')) {
    try {
      size_t used = 0;
      const long long v = std::stoll(token, &used);
      if (used != token.size() || v <= 0) throw std::invalid_argument(token);
      dims.push_back(v);
    } catch (const std::exception&) {
      return Status::errorf("--shape must be N,L,K or L,K of positive integers, got \"{}\"", text);
    }
  }
  if (dims.size() == 3) return RouteShape{dims[0], dims[1], dims[2]};
  if (dims.size() == 2) return RouteShape{-1, dims[0], dims[1]};
  return Status::errorf("--shape must be N,L,K or L,K of positive integers, got \"{}\"", text);
}

Result<RouteArray> parse_route_file(std::string_view bytes,
                                    const std::optional<RouteShape>& shape) {
  if (bytes.substr(0, 6) == "\x93NUMPY") return from_npy(bytes, shape);
  const std::string_view text = trim(bytes);
  if (!text.empty() && text.front() == '[') return from_json(text, shape);
  if (looks_base64(text)) {
    Result<std::string> decoded = base64_decode(std::string(text));
    if (decoded) {
      if (decoded->substr(0, 6) == "\x93NUMPY") return from_npy(*decoded, shape);
      return from_int32(*decoded, shape);
    }
  }
  return from_int32(bytes, shape);
}

Result<RouteArray> read_route_file(const std::string& path,
                                   const std::optional<RouteShape>& shape) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::error(ErrorCode::kNotFound, fmt::format("{}: cannot open", path));
  std::ostringstream buffer;
  buffer << in.rdbuf();
  Result<RouteArray> routes = parse_route_file(buffer.str(), shape);
  if (!routes) return routes.status().with_context(path + ": ");
  return routes;
}

Result<RouteDiff> diff_routes(const RouteArray& a, const RouteArray& b) {
  if (a.rows != b.rows || a.layers != b.layers || a.top_k != b.top_k)
    return Status::errorf("the arrays differ in shape: ({}, {}, {}) and ({}, {}, {})", a.rows,
                          a.layers, a.top_k, b.rows, b.layers, b.top_k);
  RouteDiff diff;
  diff.rows = a.rows;
  diff.layers = a.layers;
  diff.top_k = a.top_k;
  const size_t k = static_cast<size_t>(a.top_k);
  std::vector<char> row_differs(static_cast<size_t>(a.rows), 0);
  std::vector<int32_t> sorted_a(k), sorted_b(k);
  for (int64_t layer = 0; layer < a.layers; ++layer) {
    LayerAgreement agreement;
    agreement.layer = layer;
    bool all_zero = true;
    for (int64_t row = 0; row < a.rows && all_zero; ++row)
      for (size_t j = 0; j < k; ++j)
        all_zero &= a.at(row, layer, static_cast<int64_t>(j)) == 0 &&
                    b.at(row, layer, static_cast<int64_t>(j)) == 0;
    agreement.dense = all_zero && a.rows > 0 && a.top_k > 1;  // K zeros cannot be a MoE route
    if (!agreement.dense) {
      for (int64_t row = 0; row < a.rows; ++row) {
        const int32_t* ra = a.row_ptr(row) + layer * a.top_k;
        const int32_t* rb = b.row_ptr(row) + layer * b.top_k;
        ++agreement.rows;
        if (std::equal(ra, ra + k, rb)) continue;
        std::copy(ra, ra + k, sorted_a.begin());
        std::copy(rb, rb + k, sorted_b.begin());
        std::sort(sorted_a.begin(), sorted_a.end());
        std::sort(sorted_b.begin(), sorted_b.end());
        if (sorted_a == sorted_b) {
          ++agreement.order_differs;
        } else {
          ++agreement.set_differs;
          row_differs[static_cast<size_t>(row)] = 1;
        }
      }
      diff.compared += agreement.rows;
      diff.set_differs += agreement.set_differs;
      diff.order_differs += agreement.order_differs;
    }
    diff.per_layer.push_back(agreement);
  }
  diff.rows_with_set_difference = std::count(row_differs.begin(), row_differs.end(), 1);
  return diff;
}

}  // namespace sy::moe
