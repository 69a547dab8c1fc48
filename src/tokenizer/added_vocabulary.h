// Added tokens ("added_tokens" of tokenizer.json): found in the text before the model sees it,
// leftmost-longest and non-overlapping like HF's Aho-Corasick, honouring single_word, lstrip,
// rstrip; `normalized` tokens are matched in the normalized text, the others in the raw text.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace sy::tokenizer {

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
  bool special = false;
};

// A text split by added tokens: each piece is either a token (id >= 0) or text for the model.
struct Piece {
  std::string_view text;  // view into the string that was split
  int32_t added_id = -1;
};

// Matches one set of added tokens (HF keeps two: raw and normalized).
class AddedTokenMatcher {
 public:
  // `patterns[i]` is what to look for; `tokens[i]` the token it stands for (outlives this).
  void build(const std::vector<std::string>& patterns, const std::vector<const AddedToken*>& tokens);
  bool empty() const { return tokens_.empty(); }
  // Splits `text` into pieces covering it (an empty text gives no pieces).
  void split(std::string_view text, std::vector<Piece>& pieces) const;

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> children;
    int32_t token = -1;  // index into tokens_ of the pattern ending here
  };
  int32_t child(int32_t node, unsigned char byte) const;
  std::vector<Node> nodes_;
  std::vector<int32_t> root_children_ = std::vector<int32_t>(256, -1);
  std::vector<const AddedToken*> tokens_;
};

}  // namespace sy::tokenizer
