#include "tokenizer/normalizer.h"

#include <utf8proc.h>

#include <cstdlib>
#include <nlohmann/json.hpp>

#include "tokenizer/utf8.h"

namespace sy::tokenizer {
namespace {

std::string unicode_form(std::string_view text, int options) {
  utf8proc_uint8_t* mapped = nullptr;
  const auto length = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                                   static_cast<utf8proc_ssize_t>(text.size()), &mapped,
                                   static_cast<utf8proc_option_t>(options | UTF8PROC_STABLE));
  if (length < 0) return std::string(text);  // only on invalid UTF-8, which callers never pass
  std::string out(reinterpret_cast<const char*>(mapped), static_cast<size_t>(length));
  std::free(mapped);
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
