// Parses lexed tokens into statements with jinja2's grammar and operator precedence. Everything
// outside the supported subset (docs/chat-templates.md) fails here, naming the construct and line.
#pragma once

#include <string>
#include <vector>

#include "chat/ast.h"
#include "chat/lexer.h"
#include "util/status.h"

namespace sy::chat {

// Nesting deeper than this (brackets, operators, blocks) is refused: no real template comes close,
// and a hostile one must not exhaust the stack.
inline constexpr int kMaxParseDepth = 100;

Result<Body> parse(std::vector<Token> tokens);

}  // namespace sy::chat
