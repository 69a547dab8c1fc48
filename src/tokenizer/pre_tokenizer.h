// tokenizer.json "pre_tokenizer": Split (Oniguruma regex or literal, every delimiter behaviour,
// invert), ByteLevel (prefix space, the GPT-2 regex, byte-to-character mapping) and Sequence.
// Each step runs on every piece the previous step produced, as in HF tokenizers.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/regex.h"
#include "util/status.h"

namespace sy::tokenizer {

// The 256 byte-level characters (GPT-2's bytes_to_unicode), as UTF-8.
const std::vector<std::string>& byte_level_chars();

class PreTokenizer {
 public:
  // `config` is the "pre_tokenizer" value (null: the whole piece is one word).
  static Result<PreTokenizer> from_json(const nlohmann::json& config);
  // Appends the words of `text` (valid UTF-8) to `words`; empty words are never produced.
  void pre_tokenize(std::string_view text, std::vector<std::string>& words) const;

 private:
  enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };
  struct Step {
    bool byte_level = false;
    // Split
    bool literal = false;
    std::string literal_text;
    Regex regex;
    Behavior behavior = Behavior::kIsolated;
    bool invert = false;
    // ByteLevel
    bool add_prefix_space = false;
    bool use_regex = false;
  };
  static Status add_steps(const nlohmann::json& config, std::vector<Step>& steps);
  static void split(const Step& step, std::string_view piece, std::vector<std::string>& out);
  static void byte_level(const Step& step, std::string_view piece, std::vector<std::string>& out);
  std::vector<Step> steps_;
  Regex gpt2_regex_;
};

}  // namespace sy::tokenizer
