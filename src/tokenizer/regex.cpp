#include "tokenizer/regex.h"

#include <oniguruma.h>

#include <mutex>

namespace sy::tokenizer {

struct Regex::Compiled {
  regex_t* regex = nullptr;
  ~Compiled() { onig_free(regex); }
};

namespace {
void initialize_oniguruma() {
  static std::once_flag once;
  std::call_once(once, [] {
    OnigEncoding encodings[] = {ONIG_ENCODING_UTF8};
    onig_initialize(encodings, 1);
  });
}
}  // namespace

Result<Regex> Regex::compile(const std::string& pattern) {
  initialize_oniguruma();
  auto compiled = std::make_shared<Compiled>();
  OnigErrorInfo error_info;
  const auto* begin = reinterpret_cast<const OnigUChar*>(pattern.data());
  const int rc = onig_new(&compiled->regex, begin, begin + pattern.size(), ONIG_OPTION_NONE, ONIG_ENCODING_UTF8,
                          ONIG_SYNTAX_DEFAULT, &error_info);
  if (rc != ONIG_NORMAL) {
    OnigUChar message[ONIG_MAX_ERROR_MESSAGE_LEN];
    onig_error_code_to_str(message, rc, &error_info);
    compiled->regex = nullptr;
    return Status::errorf("regex {:?} does not compile: {}", pattern, reinterpret_cast<const char*>(message));
  }
  Regex regex;
  regex.compiled_ = std::move(compiled);
  return regex;
}

std::vector<std::pair<size_t, size_t>> Regex::find_all(std::string_view text) const {
  std::vector<std::pair<size_t, size_t>> matches;
  OnigRegion* region = onig_region_new();
  const auto* begin = reinterpret_cast<const OnigUChar*>(text.data());
  const auto* end = begin + text.size();
  size_t search_from = 0;
  bool have_last = false;
  size_t last_match_end = 0;
  while (search_from <= text.size()) {
    onig_region_clear(region);
    const int found = onig_search(compiled_->regex, begin, end, begin + search_from, end, region, ONIG_OPTION_NONE);
    if (found < 0) break;
    const auto match_begin = static_cast<size_t>(region->beg[0]);
    const auto match_end = static_cast<size_t>(region->end[0]);
    if (match_begin == match_end && have_last && last_match_end == match_end) {
      // Step over one character so an empty match cannot repeat forever.
      size_t step = 1;
      if (search_from < text.size()) {
        const auto lead = static_cast<unsigned char>(text[search_from]);
        step = lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
      }
      search_from += step;
      continue;
    }
    search_from = match_end;
    have_last = true;
    last_match_end = match_end;
    matches.emplace_back(match_begin, match_end);
  }
  onig_region_free(region, 1);
  return matches;
}

}  // namespace sy::tokenizer
