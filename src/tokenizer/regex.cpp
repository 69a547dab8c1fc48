#include "tokenizer/regex.h"

#include <oniguruma.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <mutex>
#include <optional>

namespace sy::tokenizer {
namespace {

// General categories exactly as the Oniguruma inside HF tokenizers has them (its Unicode version
// is newer than Debian's libonig: e.g. U+1FACF is \p{S} there and unassigned here). Patterns get
// their \p{..} general-category classes spelled out as code point ranges from this table.
struct CategoryRun {
  char32_t first;
  uint8_t category;
};
constexpr CategoryRun kCategoryRuns[] = {
#include "tokenizer/unicode_categories.inc"
};
enum Category : uint8_t { Lu, Ll, Lt, Lm, Lo, Mn, Mc, Me, Nd, Nl, No, Pc, Pd, Ps, Pe, Pi, Pf, Po, Sm, Sc, Sk, So,
                          Zs, Zl, Zp, Cc, Cf, Co, Cn };
constexpr uint32_t bit(Category c) { return 1u << c; }

// The categories a property name stands for (Oniguruma ignores case, spaces, '_' and '-').
std::optional<uint32_t> category_mask(std::string name) {
  std::string key;
  for (const char c : name) {
    if (c != '_' && c != ' ' && c != '-') key.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  }
  const uint32_t letters = bit(Lu) | bit(Ll) | bit(Lt) | bit(Lm) | bit(Lo);
  const uint32_t marks = bit(Mn) | bit(Mc) | bit(Me);
  const uint32_t numbers = bit(Nd) | bit(Nl) | bit(No);
  const uint32_t punctuation = bit(Pc) | bit(Pd) | bit(Ps) | bit(Pe) | bit(Pi) | bit(Pf) | bit(Po);
  const uint32_t symbols = bit(Sm) | bit(Sc) | bit(Sk) | bit(So);
  const uint32_t separators = bit(Zs) | bit(Zl) | bit(Zp);
  const uint32_t others = bit(Cc) | bit(Cf) | bit(Co) | bit(Cn);
  static const std::pair<const char*, uint32_t> kNames[] = {
      {"l", letters}, {"letter", letters}, {"lc", bit(Lu) | bit(Ll) | bit(Lt)}, {"l&", bit(Lu) | bit(Ll) | bit(Lt)},
      {"casedletter", bit(Lu) | bit(Ll) | bit(Lt)}, {"lu", bit(Lu)}, {"uppercaseletter", bit(Lu)},
      {"ll", bit(Ll)}, {"lowercaseletter", bit(Ll)}, {"lt", bit(Lt)}, {"titlecaseletter", bit(Lt)},
      {"lm", bit(Lm)}, {"modifierletter", bit(Lm)}, {"lo", bit(Lo)}, {"otherletter", bit(Lo)},
      {"m", marks}, {"mark", marks}, {"combiningmark", marks}, {"mn", bit(Mn)}, {"nonspacingmark", bit(Mn)},
      {"mc", bit(Mc)}, {"spacingmark", bit(Mc)}, {"me", bit(Me)}, {"enclosingmark", bit(Me)},
      {"n", numbers}, {"number", numbers}, {"nd", bit(Nd)}, {"decimalnumber", bit(Nd)}, {"nl", bit(Nl)},
      {"letternumber", bit(Nl)}, {"no", bit(No)}, {"othernumber", bit(No)},
      {"p", punctuation}, {"punctuation", punctuation}, {"pc", bit(Pc)}, {"connectorpunctuation", bit(Pc)},
      {"pd", bit(Pd)}, {"dashpunctuation", bit(Pd)}, {"ps", bit(Ps)}, {"openpunctuation", bit(Ps)},
      {"pe", bit(Pe)}, {"closepunctuation", bit(Pe)}, {"pi", bit(Pi)}, {"initialpunctuation", bit(Pi)},
      {"pf", bit(Pf)}, {"finalpunctuation", bit(Pf)}, {"po", bit(Po)}, {"otherpunctuation", bit(Po)},
      {"s", symbols}, {"symbol", symbols}, {"sm", bit(Sm)}, {"mathsymbol", bit(Sm)}, {"sc", bit(Sc)},
      {"currencysymbol", bit(Sc)}, {"sk", bit(Sk)}, {"modifiersymbol", bit(Sk)}, {"so", bit(So)},
      {"othersymbol", bit(So)}, {"z", separators}, {"separator", separators}, {"zs", bit(Zs)},
      {"spaceseparator", bit(Zs)}, {"zl", bit(Zl)}, {"lineseparator", bit(Zl)}, {"zp", bit(Zp)},
      {"paragraphseparator", bit(Zp)}, {"c", others}, {"other", others}, {"cc", bit(Cc)}, {"control", bit(Cc)},
      {"cf", bit(Cf)}, {"format", bit(Cf)}, {"co", bit(Co)}, {"privateuse", bit(Co)}, {"cn", bit(Cn)},
      {"unassigned", bit(Cn)},
  };
  for (const auto& [known, mask] : kNames) {
    if (key == known) return mask;
  }
  return std::nullopt;  // a script or binary property: left to Oniguruma
}

// "\x{41}-\x{5A}\x{61}-..." for every code point whose category is in `mask`.
std::string class_ranges(uint32_t mask) {
  std::string out;
  constexpr size_t kRunCount = sizeof(kCategoryRuns) / sizeof(kCategoryRuns[0]);
  for (size_t i = 0; i < kRunCount;) {
    if (!(mask & (1u << kCategoryRuns[i].category))) {
      ++i;
      continue;
    }
    const char32_t first = kCategoryRuns[i].first;
    size_t j = i;
    while (j < kRunCount && (mask & (1u << kCategoryRuns[j].category))) ++j;
    char32_t last = j < kRunCount ? kCategoryRuns[j].first - 1 : 0x10FFFF;
    // Surrogates share Cn's slot in the table but cannot be written in a UTF-8 pattern.
    const auto emit = [&](char32_t lo, char32_t hi) {
      if (lo > hi) return;
      out += fmt::format("\\x{{{:X}}}", static_cast<uint32_t>(lo));
      if (hi > lo) out += fmt::format("-\\x{{{:X}}}", static_cast<uint32_t>(hi));
    };
    if (first <= 0xDFFF && last >= 0xD800) {
      emit(first, std::min<char32_t>(last, 0xD7FF));
      emit(std::max<char32_t>(first, 0xE000), last);
    } else {
      emit(first, last);
    }
    i = j;
  }
  return out;
}

}  // namespace

std::string spell_out_categories(const std::string& pattern) {
  std::string out;
  int class_depth = 0;
  for (size_t i = 0; i < pattern.size();) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char escaped = pattern[i + 1];
      if ((escaped == 'p' || escaped == 'P') && i + 2 < pattern.size() && pattern[i + 2] == '{') {
        const size_t close = pattern.find('}', i + 3);
        if (close != std::string::npos) {
          std::string name = pattern.substr(i + 3, close - i - 3);
          bool negate = escaped == 'P';
          if (!name.empty() && name[0] == '^') {
            negate = !negate;
            name.erase(0, 1);
          }
          if (const auto mask = category_mask(name)) {
            const std::string ranges = class_ranges(*mask);
            if (class_depth > 0 && !negate) out += ranges;  // already inside [...]
            else out += (negate ? "[^" : "[") + ranges + "]";
            i = close + 1;
            continue;
          }
        }
      }
      out += c;
      out += escaped;
      i += 2;
      continue;
    }
    if (c == '[') ++class_depth;
    else if (c == ']' && class_depth > 0) --class_depth;
    out += c;
    ++i;
  }
  return out;
}

struct Regex::Compiled {
  regex_t* regex = nullptr;
  ~Compiled() {
    if (regex) onig_free(regex);
  }
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
  const std::string spelled = spell_out_categories(pattern);
  const auto* begin = reinterpret_cast<const OnigUChar*>(spelled.data());
  const int rc = onig_new(&compiled->regex, begin, begin + spelled.size(), ONIG_OPTION_NONE, ONIG_ENCODING_UTF8,
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
