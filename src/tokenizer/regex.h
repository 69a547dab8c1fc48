// Oniguruma regexes compiled the way HF tokenizers compiles them (the `onig` crate's Regex::new:
// UTF-8, ONIG_OPTION_NONE, Oniguruma's default syntax), and their find-all iteration.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "util/status.h"

namespace sy::tokenizer {

// `pattern` with each \p{..}/\P{..} general-category class replaced by explicit code point ranges
// from HF's own Unicode tables (exposed for tests).
std::string spell_out_categories(const std::string& pattern);

class Regex {
 public:
  static Result<Regex> compile(const std::string& pattern);
  // Non-overlapping matches as [begin, end) byte offsets, left to right, with the onig crate's
  // rule for empty matches (one right after the previous match is skipped by one character).
  // Thread-safe: each call uses its own match region.
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view text) const;

 private:
  struct Compiled;
  std::shared_ptr<const Compiled> compiled_;
};

}  // namespace sy::tokenizer
