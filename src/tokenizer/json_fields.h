// Typed fields of tokenizer.json objects. tokenizer.json is untrusted input: a field of the wrong
// type is an error naming it (nlohmann's value() and get() would throw or truncate instead).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "util/status.h"

namespace sy::tokenizer {

// `object`[key] as a bool: absent or null gives `fallback`. `where` names the object.
inline Result<bool> optional_bool(const nlohmann::json& object, const char* key, bool fallback,
                                  std::string_view where) {
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) return fallback;
  if (!it->is_boolean())
    return Status::errorf("tokenizer.json: {}.{} must be true or false, got {}", where, key,
                          it->dump());
  return it->get<bool>();
}

// `object`[key] as a string: absent or null gives "".
inline Result<std::string> optional_string(const nlohmann::json& object, const char* key,
                                           std::string_view where) {
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) return std::string();
  if (!it->is_string())
    return Status::errorf("tokenizer.json: {}.{} must be a string, got {}", where, key, it->dump());
  return it->get<std::string>();
}

// The largest token id a tokenizer may hold: tables are sized by the largest id, so an id near
// 2^31 would ask for gigabytes. Published vocabularies are under 2^18.
inline constexpr int64_t kMaxTokenId = (int64_t{1} << 22) - 1;

// A token id: an integer in [0, kMaxTokenId].
inline Result<int32_t> token_id(const nlohmann::json& value, std::string_view where) {
  const bool ok = value.is_number_unsigned() ? value.get<uint64_t>() <= uint64_t{kMaxTokenId}
                  : value.is_number_integer()
                      ? value.get<int64_t>() >= 0 && value.get<int64_t>() <= kMaxTokenId
                      : false;
  if (!ok)
    return Status::errorf("tokenizer.json: {} must be a token id in [0, 2^22), got {}", where,
                          value.dump());
  return static_cast<int32_t>(value.get<int64_t>());
}

}  // namespace sy::tokenizer
