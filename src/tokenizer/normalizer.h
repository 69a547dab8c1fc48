// tokenizer.json "normalizer": Unicode normal forms, Lowercase, and Sequences of them, applied as
// HF tokenizers applies them (Rust's unicode-normalization and char::to_lowercase).
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <string>
#include <string_view>
#include <vector>

#include "util/status.h"

namespace sy::tokenizer {

class Normalizer {
 public:
  // `config` is the "normalizer" value (null: no normalizer). Unknown types fail, naming them.
  static Result<Normalizer> from_json(const nlohmann::json& config);
  // `text` must be valid UTF-8.
  std::string normalize(std::string_view text) const;
  bool is_identity() const { return steps_.empty(); }
  // True when the normalizer is exactly NFC (what decode(encode(s)) round-trips to).
  bool is_nfc() const { return steps_.size() == 1 && steps_[0] == Step::kNFC; }

 private:
  enum class Step { kNFC, kNFD, kNFKC, kNFKD, kLowercase };
  static Status add_steps(const nlohmann::json& config, std::vector<Step>& steps);
  std::vector<Step> steps_;
};

}  // namespace sy::tokenizer
