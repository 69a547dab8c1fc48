#include "tokenizer/added_vocabulary.h"

#include <algorithm>

#include "tokenizer/utf8.h"

namespace sy::tokenizer {
namespace {

bool ends_with_word_char(std::string_view text) {
  if (text.empty()) return false;
  return utf8::is_word_char(utf8::previous(text, text.size(), nullptr));
}

bool starts_with_word_char(std::string_view text) {
  if (text.empty()) return false;
  size_t pos = 0;
  return utf8::is_word_char(utf8::next(text, pos));
}

// Start of the whitespace run that ends `text` (text.size() when there is none).
size_t trailing_space_start(std::string_view text) {
  size_t end = text.size();
  while (end > 0) {
    size_t start = 0;
    if (!utf8::is_whitespace(utf8::previous(text, end, &start))) break;
    end = start;
  }
  return end;
}

// Length of the whitespace run that starts `text`.
size_t leading_space_length(std::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    size_t next = pos;
    if (!utf8::is_whitespace(utf8::next(text, next))) break;
    pos = next;
  }
  return pos;
}

}  // namespace

void AddedTokenMatcher::build(const std::vector<std::string>& patterns,
                              const std::vector<const AddedToken*>& tokens) {
  nodes_.assign(1, Node{});
  std::fill(root_children_.begin(), root_children_.end(), -1);
  tokens_ = tokens;
  for (size_t i = 0; i < patterns.size(); ++i) {
    const std::string& pattern = patterns[i];
    if (pattern.empty()) continue;
    int32_t node = 0;
    for (const char c : pattern) {
      const auto byte = static_cast<unsigned char>(c);
      int32_t next = child(node, byte);
      if (next < 0) {
        next = static_cast<int32_t>(nodes_.size());
        nodes_.push_back(Node{});
        if (node == 0) root_children_[byte] = next;
        else nodes_[node].children.emplace_back(byte, next);
      }
      node = next;
    }
    // The first of equal patterns wins, like the first pattern id in Aho-Corasick.
    if (nodes_[node].token < 0) nodes_[node].token = static_cast<int32_t>(i);
  }
}

int32_t AddedTokenMatcher::child(int32_t node, unsigned char byte) const {
  if (node == 0) return root_children_[byte];
  for (const auto& [b, next] : nodes_[node].children) {
    if (b == byte) return next;
  }
  return -1;
}

void AddedTokenMatcher::split(std::string_view text, std::vector<Piece>& pieces) const {
  if (text.empty()) return;
  size_t start_offset = 0;  // end of what has been emitted
  size_t pos = 0;           // where the next match may begin (the automaton's position)
  while (pos < text.size()) {
    // Longest pattern starting at pos, if any.
    int32_t node = 0, best_token = -1;
    size_t best_end = 0;
    for (size_t i = pos; i < text.size(); ++i) {
      node = child(node, static_cast<unsigned char>(text[i]));
      if (node < 0) break;
      if (nodes_[node].token >= 0) {
        best_token = nodes_[node].token;
        best_end = i + 1;
      }
    }
    if (best_token < 0) {
      ++pos;
      continue;
    }
    size_t start = pos, stop = best_end;
    pos = best_end;
    const AddedToken& token = *tokens_[best_token];
    if (token.single_word) {
      const bool space_before = start == 0 || !ends_with_word_char(text.substr(0, start));
      const bool space_after = stop == text.size() || !starts_with_word_char(text.substr(stop));
      if (!space_before || !space_after) continue;
    }
    if (token.lstrip) start = std::max(trailing_space_start(text.substr(0, start)), start_offset);
    if (token.rstrip) stop += leading_space_length(text.substr(stop));
    if (start_offset < start) pieces.push_back({text.substr(start_offset, start - start_offset), -1});
    pieces.push_back({text.substr(start, stop - start), token.id});
    start_offset = stop;
  }
  if (start_offset != text.size()) pieces.push_back({text.substr(start_offset), -1});
}

}  // namespace sy::tokenizer
