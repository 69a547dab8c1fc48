#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/json_fields.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "tokenizer/utf8.h"

namespace sy::tokenizer {
namespace {

// GPT-2's word regex, the one HF's ByteLevel uses when use_regex is true.
constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

struct Segment {
  size_t begin, end;
  bool flag;  // "is a match" before the behaviour is applied, "remove" after
};

}  // namespace

const std::vector<std::string>& byte_level_chars() {
  static const std::vector<std::string> chars = [] {
    // Printable Latin-1 bytes map to themselves; the rest to U+0100 upward, in byte order.
    std::vector<std::string> table(256);
    char32_t next_free = 0x100;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      utf8::append(table[b], printable ? static_cast<char32_t>(b) : next_free++);
    }
    return table;
  }();
  return chars;
}

Status PreTokenizer::add_steps(const nlohmann::json& config, std::vector<Step>& steps) {
  if (config.is_null()) return Status::ok();
  if (!config.is_object() || !config.contains("type") || !config["type"].is_string()) {
    return Status::error("pre_tokenizer must be an object with a string \"type\"");
  }
  const std::string type = config["type"];
  if (type == "Sequence") {
    if (!config.contains("pretokenizers") || !config["pretokenizers"].is_array()) {
      return Status::error("pre_tokenizer Sequence needs an array \"pretokenizers\"");
    }
    for (const auto& child : config["pretokenizers"]) SY_TRY(add_steps(child, steps));
    return Status::ok();
  }
  Step step;
  if (type == "ByteLevel") {
    step.byte_level = true;
    SY_ASSIGN(step.add_prefix_space,
              optional_bool(config, "add_prefix_space", true, "pre_tokenizer ByteLevel"));
    SY_ASSIGN(step.use_regex, optional_bool(config, "use_regex", true, "pre_tokenizer ByteLevel"));
  } else if (type == "Split") {
    const auto& pattern = config.value("pattern", nlohmann::json());
    if (pattern.is_object() && pattern.contains("Regex") && pattern["Regex"].is_string()) {
      SY_ASSIGN(step.regex, Regex::compile(pattern["Regex"].get<std::string>()));
    } else if (pattern.is_object() && pattern.contains("String") && pattern["String"].is_string()) {
      step.literal = true;
      step.literal_text = pattern["String"].get<std::string>();
    } else {
      return Status::error("pre_tokenizer Split needs \"pattern\": {\"Regex\": ...} or {\"String\": ...}");
    }
    SY_ASSIGN(const std::string behavior,
              optional_string(config, "behavior", "pre_tokenizer Split"));
    if (behavior == "Removed") step.behavior = Behavior::kRemoved;
    else if (behavior == "Isolated") step.behavior = Behavior::kIsolated;
    else if (behavior == "MergedWithPrevious") step.behavior = Behavior::kMergedWithPrevious;
    else if (behavior == "MergedWithNext") step.behavior = Behavior::kMergedWithNext;
    else if (behavior == "Contiguous") step.behavior = Behavior::kContiguous;
    else {
      return Status::errorf("pre_tokenizer Split behavior {:?} is not one of Removed, Isolated, "
                            "MergedWithPrevious, MergedWithNext, Contiguous", behavior);
    }
    SY_ASSIGN(step.invert, optional_bool(config, "invert", false, "pre_tokenizer Split"));
  } else {
    return Status::error(ErrorCode::kUnsupported,
                         fmt::format("unsupported pre_tokenizer type {:?} (supported: Split, ByteLevel, Sequence)",
                                     type));
  }
  steps.push_back(std::move(step));
  return Status::ok();
}

Result<PreTokenizer> PreTokenizer::from_json(const nlohmann::json& config) {
  PreTokenizer pre_tokenizer;
  SY_TRY(add_steps(config, pre_tokenizer.steps_));
  SY_ASSIGN(pre_tokenizer.gpt2_regex_, Regex::compile(kGpt2Pattern));
  for (auto& step : pre_tokenizer.steps_) {
    if (step.byte_level) step.regex = pre_tokenizer.gpt2_regex_;
  }
  return pre_tokenizer;
}

void PreTokenizer::split(const Step& step, std::string_view piece, std::vector<std::string>& out) {
  // 1. Matches and the gaps between them, covering the piece.
  std::vector<Segment> segments;
  std::vector<std::pair<size_t, size_t>> matches;
  if (step.literal) {
    if (!step.literal_text.empty()) {
      for (size_t at = piece.find(step.literal_text); at != std::string_view::npos;
           at = piece.find(step.literal_text, at + step.literal_text.size())) {
        matches.emplace_back(at, at + step.literal_text.size());
      }
    }
  } else {
    matches = step.regex.find_all(piece);
  }
  size_t previous_end = 0;
  for (const auto& [begin, end] : matches) {
    if (previous_end != begin) segments.push_back({previous_end, begin, false});
    segments.push_back({begin, end, true});
    previous_end = end;
  }
  if (previous_end != piece.size()) segments.push_back({previous_end, piece.size(), false});
  if (step.invert) {
    for (auto& segment : segments) segment.flag = !segment.flag;
  }
  // 2. The delimiter behaviour: which segments merge, and which are removed.
  std::vector<Segment> kept;
  bool previous_match = false;
  switch (step.behavior) {
    case Behavior::kIsolated:
      for (auto segment : segments) kept.push_back({segment.begin, segment.end, false});
      break;
    case Behavior::kRemoved:
      kept = segments;
      break;
    case Behavior::kContiguous:
      for (const auto& segment : segments) {
        if (segment.flag == previous_match && !kept.empty()) kept.back().end = segment.end;
        else kept.push_back({segment.begin, segment.end, false});
        previous_match = segment.flag;
      }
      break;
    case Behavior::kMergedWithPrevious:
      for (const auto& segment : segments) {
        if (segment.flag && !previous_match && !kept.empty()) kept.back().end = segment.end;
        else kept.push_back({segment.begin, segment.end, false});
        previous_match = segment.flag;
      }
      break;
    case Behavior::kMergedWithNext:
      for (auto it = segments.rbegin(); it != segments.rend(); ++it) {
        if (it->flag && !previous_match && !kept.empty()) kept.back().begin = it->begin;
        else kept.push_back({it->begin, it->end, false});
        previous_match = it->flag;
      }
      std::reverse(kept.begin(), kept.end());
      break;
  }
  for (const auto& segment : kept) {
    if (!segment.flag && segment.end > segment.begin) {
      out.emplace_back(piece.substr(segment.begin, segment.end - segment.begin));
    }
  }
}

void PreTokenizer::byte_level(const Step& step, std::string_view piece, std::vector<std::string>& out) {
  std::string prefixed;
  if (step.add_prefix_space && (piece.empty() || piece[0] != ' ')) {
    prefixed.reserve(piece.size() + 1);
    prefixed.push_back(' ');
    prefixed.append(piece);
    piece = prefixed;
  }
  const auto& chars = byte_level_chars();
  const auto map_bytes = [&](std::string_view word) {
    std::string mapped;
    mapped.reserve(word.size() * 2);
    for (const char c : word) mapped.append(chars[static_cast<unsigned char>(c)]);
    out.push_back(std::move(mapped));
  };
  if (!step.use_regex) {
    if (!piece.empty()) map_bytes(piece);
    return;
  }
  size_t previous_end = 0;
  for (const auto& [begin, end] : step.regex.find_all(piece)) {
    if (previous_end != begin) map_bytes(piece.substr(previous_end, begin - previous_end));
    if (end > begin) map_bytes(piece.substr(begin, end - begin));
    previous_end = end;
  }
  if (previous_end != piece.size()) map_bytes(piece.substr(previous_end));
}

void PreTokenizer::pre_tokenize(std::string_view text, std::vector<std::string>& words) const {
  if (text.empty()) return;
  if (steps_.empty()) {
    words.emplace_back(text);
    return;
  }
  std::vector<std::string> pieces{std::string(text)};
  std::vector<std::string> next;
  for (size_t i = 0; i < steps_.size(); ++i) {
    const bool last = i + 1 == steps_.size();
    auto& target = last ? words : next;
    for (const auto& piece : pieces) {
      if (steps_[i].byte_level) byte_level(steps_[i], piece, target);
      else split(steps_[i], piece, target);
    }
    if (!last) {
      pieces.swap(next);
      next.clear();
    }
  }
}

}  // namespace sy::tokenizer
