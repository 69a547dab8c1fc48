// Readers for config.json fields, shared by the common parser and the architecture adapters:
// every error names the field and what was expected.
#pragma once

#include <cstdint>
#include <initializer_list>

#include <nlohmann/json.hpp>

#include "util/status.h"

namespace sy::model::config_json {

// The largest magnitude an integer field may have (get_int refuses more).
inline constexpr int64_t kMaxConfigInt = (int64_t{1} << 31) - 1;

// An integer field that may be spelled several ways; the first present wins. At most
// kMaxConfigInt in magnitude.
Result<int64_t> get_int(const nlohmann::json& config, std::initializer_list<const char*> keys,
                        bool required, int64_t fallback = 0);
Result<double> get_number(const nlohmann::json& config, const char* key, double fallback);
Result<bool> get_bool(const nlohmann::json& config, const char* key, bool fallback);
Status require_positive(const char* field, int64_t value);
// A list of layer indices in [0, layers) (mlp_only_layers).
Result<std::vector<int>> get_layer_list(const nlohmann::json& config, const char* key,
                                        int64_t layers);

}  // namespace sy::model::config_json
