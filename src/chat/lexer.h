// Splits a template into text and tag tokens the way jinja2's lexer does with transformers'
// settings (trim_blocks, lstrip_blocks, keep_trailing_newline=False): whitespace control is
// applied here, so the parser only sees the text that will be printed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "util/status.h"

namespace sy::chat {

enum class TokenType {
  kText,
  kVariableBegin,
  kVariableEnd,
  kBlockBegin,
  kBlockEnd,
  kName,
  kString,
  kInteger,
  kFloat,
  kOperator,
  kEnd
};

struct Token {
  TokenType type;
  std::string value;  // text, name, decoded string literal, operator spelling
  int64_t integer = 0;
  double number = 0;
  int line = 1;
};

struct LexOptions {
  bool trim_blocks = true;
  bool lstrip_blocks = true;
};

Result<std::vector<Token>> lex(const std::string& source, const LexOptions& options = {});

}  // namespace sy::chat
