#include "tokenizer/normalizer.h"

#include <utf8proc.h>

#include <cstdlib>
#include <nlohmann/json.hpp>

#include "tokenizer/utf8.h"

namespace sy::tokenizer {
namespace {

// HF normalises with the unicode-normalization-alignments crate, whose tables predate Unicode 15
// (the goldens show it leaves e.g. U+1E06C undecomposed and Nag Mundari marks unreordered), while
// utf8proc 2.8 knows Unicode 15.0. Characters new in 15.0 (utf8proc assigned, Python 3.11's
// Unicode 14.0 unicodedata not) therefore pass through unnormalised, as they do in HF.
constexpr std::pair<char32_t, char32_t> kNewerThanHfNormalizer[] = {
    {0xCF3, 0xCF3}, {0xECE, 0xECE}, {0x10EFD, 0x10EFF}, {0x1123F, 0x11241}, {0x11B00, 0x11B09},
    {0x11F00, 0x11F10}, {0x11F12, 0x11F3A}, {0x11F3E, 0x11F59}, {0x1342F, 0x1342F}, {0x13439, 0x13455},
    {0x1B132, 0x1B132}, {0x1B155, 0x1B155}, {0x1D2C0, 0x1D2D3}, {0x1DF25, 0x1DF2A}, {0x1E030, 0x1E06D},
    {0x1E08F, 0x1E08F}, {0x1E4D0, 0x1E4F9}, {0x1F6DC, 0x1F6DC}, {0x1F774, 0x1F776}, {0x1F77B, 0x1F77F},
    {0x1F7D9, 0x1F7D9}, {0x1FA75, 0x1FA77}, {0x1FA87, 0x1FA88}, {0x1FAAD, 0x1FAAF}, {0x1FABB, 0x1FABD},
    {0x1FABF, 0x1FABF}, {0x1FACE, 0x1FACF}, {0x1FADA, 0x1FADB}, {0x1FAE8, 0x1FAE8}, {0x1FAF7, 0x1FAF8},
    {0x2B739, 0x2B739}, {0x31350, 0x323AF},
};

bool newer_than_hf_normalizer(char32_t cp) {
  if (cp < 0xCF3) return false;
  for (const auto& [first, last] : kNewerThanHfNormalizer) {
    if (cp >= first && cp <= last) return true;
  }
  return false;
}

// Rust's char::to_lowercase knows Unicode 16; these pairs are newer than utf8proc 2.8's tables.
char32_t lowercase_newer_than_utf8proc(char32_t cp) {
  if (cp >= 0x10D50 && cp <= 0x10D65) return cp + 0x20;  // Garay
  switch (cp) {
    case 0x1C89: return 0x1C8A;
    case 0xA7CB: return 0x264;
    case 0xA7CC: return 0xA7CD;
    case 0xA7DA: return 0xA7DB;
    case 0xA7DC: return 0x19B;
    default: return 0;
  }
}

std::string utf8proc_form(std::string_view text, int options) {
  utf8proc_uint8_t* mapped = nullptr;
  const auto length = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                                   static_cast<utf8proc_ssize_t>(text.size()), &mapped,
                                   static_cast<utf8proc_option_t>(options | UTF8PROC_STABLE));
  if (length < 0) return std::string(text);  // only on invalid UTF-8, which callers never pass
  std::string out(reinterpret_cast<const char*>(mapped), static_cast<size_t>(length));
  std::free(mapped);
  return out;
}

// Normalises the stretches between characters HF's tables do not know; those stay as they are
// (to a normaliser they are starters that neither decompose nor compose).
std::string unicode_form(std::string_view text, int options) {
  std::string out;
  size_t stretch_begin = 0, pos = 0;
  while (pos < text.size()) {
    const size_t char_begin = pos;
    const char32_t cp = utf8::next(text, pos);
    if (!newer_than_hf_normalizer(cp)) continue;
    out += utf8proc_form(text.substr(stretch_begin, char_begin - stretch_begin), options);
    out.append(text.substr(char_begin, pos - char_begin));
    stretch_begin = pos;
  }
  if (stretch_begin == 0) return utf8proc_form(text, options);
  out += utf8proc_form(text.substr(stretch_begin), options);
  return out;
}

// Rust's char::to_lowercase: the full mapping, whose only multi-character case is U+0130.
std::string lowercase(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    const char32_t cp = utf8::next(text, pos);
    if (cp == 0x130) {
      out.append("i\xCC\x87");
    } else if (const char32_t newer = lowercase_newer_than_utf8proc(cp)) {
      utf8::append(out, newer);
    } else {
      utf8::append(out, static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp))));
    }
  }
  return out;
}

}  // namespace

Status Normalizer::add_steps(const nlohmann::json& config, std::vector<Step>& steps) {
  if (config.is_null()) return Status::ok();
  if (!config.is_object() || !config.contains("type") || !config["type"].is_string()) {
    return Status::error("normalizer must be an object with a string \"type\"");
  }
  const std::string type = config["type"];
  if (type == "NFC") {
    steps.push_back(Step::kNFC);
  } else if (type == "NFD") {
    steps.push_back(Step::kNFD);
  } else if (type == "NFKC") {
    steps.push_back(Step::kNFKC);
  } else if (type == "NFKD") {
    steps.push_back(Step::kNFKD);
  } else if (type == "Lowercase") {
    steps.push_back(Step::kLowercase);
  } else if (type == "Sequence") {
    if (!config.contains("normalizers") || !config["normalizers"].is_array()) {
      return Status::error("normalizer Sequence needs an array \"normalizers\"");
    }
    for (const auto& child : config["normalizers"]) SY_TRY(add_steps(child, steps));
  } else {
    return Status::error(ErrorCode::kUnsupported,
                         fmt::format("unsupported normalizer type {:?} (supported: NFC, NFD, NFKC, NFKD, "
                                     "Lowercase, Sequence)", type));
  }
  return Status::ok();
}

Result<Normalizer> Normalizer::from_json(const nlohmann::json& config) {
  Normalizer normalizer;
  SY_TRY(add_steps(config, normalizer.steps_));
  return normalizer;
}

std::string Normalizer::normalize(std::string_view text) const {
  bool ascii = true;  // ASCII is invariant under every normal form: skip the tables
  for (const char c : text) ascii &= static_cast<unsigned char>(c) < 0x80;
  std::string current(text);
  for (const Step step : steps_) {
    if (ascii && step != Step::kLowercase) continue;
    switch (step) {
      case Step::kNFC: current = unicode_form(current, UTF8PROC_COMPOSE); break;
      case Step::kNFD: current = unicode_form(current, UTF8PROC_DECOMPOSE); break;
      case Step::kNFKC: current = unicode_form(current, UTF8PROC_COMPOSE | UTF8PROC_COMPAT); break;
      case Step::kNFKD: current = unicode_form(current, UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT); break;
      case Step::kLowercase: current = lowercase(current); break;
    }
  }
  return current;
}

}  // namespace sy::tokenizer
