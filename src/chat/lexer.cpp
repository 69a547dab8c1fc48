#include "chat/lexer.h"

#include <fmt/format.h>

#include <cstring>

#include "chat/value.h"

namespace sy::chat {
namespace {

bool valid_utf8(const std::string& s, size_t& bad_offset) {
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    size_t len = c < 0x80           ? 1
                 : (c >> 5) == 0x6  ? 2
                 : (c >> 4) == 0xe  ? 3
                 : (c >> 3) == 0x1e ? 4
                                    : 0;
    if (len == 0 || i + len > s.size()) {
      bad_offset = i;
      return false;
    }
    uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1f) : len == 3 ? (c & 0x0f) : (c & 0x07);
    for (size_t k = 1; k < len; ++k) {
      unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xc0) != 0x80) {
        bad_offset = i;
        return false;
      }
      cp = (cp << 6) | (cc & 0x3f);
    }
    bool overlong =
        (len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000);
    if (overlong || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) {
      bad_offset = i;
      return false;
    }
    i += len;
  }
  return true;
}

void append_utf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xc0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xe0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Python's "unicode-escape" decoding, which jinja2 applies to string literals.
Result<std::string> decode_string_literal(std::string_view raw, int line) {
  std::string out;
  for (size_t i = 0; i < raw.size(); ++i) {
    char c = raw[i];
    if (c != '\\' || i + 1 >= raw.size()) {
      out += c;
      continue;
    }
    char e = raw[++i];
    switch (e) {
      case '\n':
        break;
      case '\\':
        out += '\\';
        break;
      case '\'':
        out += '\'';
        break;
      case '"':
        out += '"';
        break;
      case 'a':
        out += '\a';
        break;
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      case 'n':
        out += '\n';
        break;
      case 'r':
        out += '\r';
        break;
      case 't':
        out += '\t';
        break;
      case 'v':
        out += '\v';
        break;
      case 'x':
      case 'u':
      case 'U': {
        size_t digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
        uint32_t cp = 0;
        for (size_t k = 0; k < digits; ++k) {
          int h = i + 1 + k < raw.size() ? hex_value(raw[i + 1 + k]) : -1;
          if (h < 0)
            return Status::errorf("line {}: truncated \\{} escape in a string literal", line, e);
          cp = cp * 16 + static_cast<uint32_t>(h);
        }
        i += digits;
        if (cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
          return Status::errorf("line {}: escape \\{} gives an invalid code point U+{:X}", line, e,
                                cp);
        append_utf8(cp, out);
        break;
      }
      case 'N':
        return Status::errorf("line {}: \\N{{...}} escapes are not supported", line);
      default:
        if (e >= '0' && e <= '7') {
          uint32_t cp = static_cast<uint32_t>(e - '0');
          for (int k = 0; k < 2 && i + 1 < raw.size() && raw[i + 1] >= '0' && raw[i + 1] <= '7';
               ++k)
            cp = cp * 8 + static_cast<uint32_t>(raw[++i] - '0');
          append_utf8(cp, out);
        } else if (static_cast<unsigned char>(e) >= 0x80) {
          return Status::errorf(
              "line {}: a backslash before a non-ASCII character in a string literal is not "
              "supported",
              line);
        } else {
          out += '\\';
          out += e;
        }
    }
  }
  return out;
}

std::string rstrip_python_space(const std::string& text) {
  auto points = code_points(text);
  size_t keep = points.size();
  while (keep > 0 && is_python_space(points[keep - 1])) --keep;
  if (keep == points.size()) return text;
  return keep == 0
             ? std::string()
             : text.substr(0, points[keep - 1].data() + points[keep - 1].size() - text.data());
}

bool all_python_space(std::string_view text) {
  if (text.empty()) return false;
  for (std::string_view cp : code_points(text))
    if (!is_python_space(cp)) return false;
  return true;
}

class Lexer {
 public:
  Lexer(std::string source, const LexOptions& options)
      : src_(std::move(source)), options_(options) {}

  Result<std::vector<Token>> run() {
    bool line_starting = true;
    while (pos_ < src_.size()) {
      size_t start = find_tag_start(pos_);
      std::string text =
          src_.substr(pos_, start == std::string::npos ? std::string::npos : start - pos_);
      if (start == std::string::npos) {
        emit_text(text);
        pos_ = src_.size();
        break;
      }
      char kind = src_[start + 1];  // '{' variable, '%' block, '#' comment
      size_t after = start + 2;
      char modifier =
          after < src_.size() && (src_[after] == '-' || src_[after] == '+') ? src_[after] : 0;
      if (modifier) ++after;
      if (modifier == '-') {
        text = rstrip_python_space(text);
      } else if (modifier != '+' && options_.lstrip_blocks && kind != '{') {
        size_t line_start = text.rfind('\n');
        line_start = line_start == std::string::npos ? 0 : line_start + 1;
        if ((line_start > 0 || line_starting) &&
            all_python_space(std::string_view(text).substr(line_start)))
          text.resize(line_start);
      }
      count_lines(pos_, start);
      emit_text(text);
      pos_ = after;
      if (kind == '#') {
        SY_TRY(skip_comment());
      } else {
        SY_TRY(lex_tag(kind == '{'));
      }
      line_starting = pos_ > 0 && src_[pos_ - 1] == '\n';
    }
    tokens_.push_back(Token{TokenType::kEnd, "", 0, 0, line_});
    return std::move(tokens_);
  }

 private:
  size_t find_tag_start(size_t from) const {
    for (size_t i = src_.find('{', from); i != std::string::npos; i = src_.find('{', i + 1)) {
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#'))
        return i;
    }
    return std::string::npos;
  }

  void count_lines(size_t from, size_t to) {
    for (size_t i = from; i < to && i < src_.size(); ++i)
      if (src_[i] == '\n') ++line_;
  }

  void emit_text(const std::string& text) {
    if (!text.empty()) tokens_.push_back(Token{TokenType::kText, text, 0, 0, line_});
  }

  // After a block or comment end: "-" eats all following whitespace, "+" nothing, else trim_blocks
  // eats one newline.
  void consume_end_suffix(char modifier, bool block_like) {
    if (modifier == '-') {
      while (pos_ < src_.size()) {
        size_t len = code_points(std::string_view(src_).substr(pos_, 4)).front().size();
        if (!is_python_space(std::string_view(src_).substr(pos_, len))) break;
        if (src_[pos_] == '\n') ++line_;
        pos_ += len;
      }
    } else if (modifier != '+' && block_like && options_.trim_blocks && pos_ < src_.size() &&
               src_[pos_] == '\n') {
      ++pos_;
      ++line_;
    }
  }

  Status skip_comment() {
    int begin_line = line_;
    size_t end = src_.find("#}", pos_);
    if (end == std::string::npos)
      return Status::errorf("line {}: missing end of comment tag", begin_line);
    char modifier = 0;
    if (end > pos_ && (src_[end - 1] == '-' || src_[end - 1] == '+')) modifier = src_[end - 1];
    count_lines(pos_, end);
    pos_ = end + 2;
    consume_end_suffix(modifier, true);
    return Status::ok();
  }

  Status lex_tag(bool variable) {
    int begin_line = line_;
    tokens_.push_back(
        Token{variable ? TokenType::kVariableBegin : TokenType::kBlockBegin, "", 0, 0, line_});
    std::string brackets;
    while (true) {
      while (pos_ < src_.size()) {
        size_t len = code_points(std::string_view(src_).substr(pos_, 4)).front().size();
        if (!is_python_space(std::string_view(src_).substr(pos_, len))) break;
        if (src_[pos_] == '\n') ++line_;
        pos_ += len;
      }
      if (pos_ >= src_.size())
        return Status::errorf(
            "line {}: unexpected end of template inside a {} tag opened on line {}", line_,
            variable ? "{{ }}" : "{% %}", begin_line);
      if (brackets.empty()) {
        const char* close = variable ? "}}" : "%}";
        char modifier = 0;
        size_t close_at = std::string::npos;
        if ((src_[pos_] == '-' || (!variable && src_[pos_] == '+')) &&
            src_.compare(pos_ + 1, 2, close) == 0) {
          modifier = src_[pos_];
          close_at = pos_ + 1;
        } else if (src_.compare(pos_, 2, close) == 0) {
          close_at = pos_;
        }
        if (close_at != std::string::npos) {
          tokens_.push_back(
              Token{variable ? TokenType::kVariableEnd : TokenType::kBlockEnd, "", 0, 0, line_});
          pos_ = close_at + 2;
          consume_end_suffix(modifier, !variable);
          return Status::ok();
        }
      }
      SY_TRY(lex_one(brackets));
    }
  }

  Status lex_one(std::string& brackets) {
    char c = src_[pos_];
    if (c >= '0' && c <= '9') return lex_number();
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_') {
      size_t end = pos_;
      while (end < src_.size() &&
             (std::isalnum(static_cast<unsigned char>(src_[end])) || src_[end] == '_'))
        ++end;
      tokens_.push_back(Token{TokenType::kName, src_.substr(pos_, end - pos_), 0, 0, line_});
      pos_ = end;
      return Status::ok();
    }
    if (c == '\'' || c == '"') {
      size_t i = pos_ + 1;
      while (i < src_.size() && src_[i] != c) i += src_[i] == '\\' ? 2 : 1;
      if (i >= src_.size()) return Status::errorf("line {}: unterminated string literal", line_);
      SY_ASSIGN(
          std::string value,
          decode_string_literal(std::string_view(src_).substr(pos_ + 1, i - pos_ - 1), line_));
      tokens_.push_back(Token{TokenType::kString, std::move(value), 0, 0, line_});
      count_lines(pos_, i);
      pos_ = i + 1;
      return Status::ok();
    }
    static const char* kTwoChar[] = {"//", "**", "==", "!=", ">=", "<="};
    for (const char* op : kTwoChar) {
      if (src_.compare(pos_, 2, op) == 0) {
        tokens_.push_back(Token{TokenType::kOperator, op, 0, 0, line_});
        pos_ += 2;
        return Status::ok();
      }
    }
    if (std::strchr("+-/*%~[](){}><=.:|,;", c) && c != '\0') {
      if (c == '(' || c == '[' || c == '{') brackets += c;
      if (c == ')' || c == ']' || c == '}') {
        char open = c == ')' ? '(' : c == ']' ? '[' : '{';
        if (brackets.empty() || brackets.back() != open)
          return Status::errorf("line {}: unexpected '{}'", line_, c);
        brackets.pop_back();
      }
      tokens_.push_back(Token{TokenType::kOperator, std::string(1, c), 0, 0, line_});
      ++pos_;
      return Status::ok();
    }
    std::string_view shown = code_points(std::string_view(src_).substr(pos_, 4)).front();
    return Status::errorf("line {}: unexpected character '{}' in a tag", line_, shown);
  }

  Status lex_number() {
    auto digits = [&](size_t i) {
      size_t start = i;
      while (i < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[i])) ||
                                 (src_[i] == '_' && i > start && i + 1 < src_.size() &&
                                  std::isdigit(static_cast<unsigned char>(src_[i + 1])))))
        ++i;
      return i;
    };
    size_t end = digits(pos_);
    bool is_float = false;
    bool after_dot = pos_ > 0 && src_[pos_ - 1] == '.';  // `x.0.1` indexes; never a float there
    if (!after_dot && end + 1 < src_.size() && src_[end] == '.' &&
        std::isdigit(static_cast<unsigned char>(src_[end + 1]))) {
      end = digits(end + 1);
      is_float = true;
    }
    if (!after_dot && end < src_.size() && (src_[end] == 'e' || src_[end] == 'E')) {
      size_t e = end + 1;
      if (e < src_.size() && (src_[e] == '+' || src_[e] == '-')) ++e;
      if (e < src_.size() && std::isdigit(static_cast<unsigned char>(src_[e]))) {
        end = digits(e);
        is_float = true;
      }
    }
    std::string text;
    for (size_t i = pos_; i < end; ++i)
      if (src_[i] != '_') text += src_[i];
    Token token{is_float ? TokenType::kFloat : TokenType::kInteger, text, 0, 0, line_};
    if (is_float) {
      token.number = std::strtod(text.c_str(), nullptr);
    } else {
      errno = 0;
      char* parse_end = nullptr;
      long long value = std::strtoll(text.c_str(), &parse_end, 10);
      if (errno == ERANGE)
        return Status::errorf("line {}: integer literal {} is too large (limit 2^63-1)", line_,
                              text);
      token.integer = value;
    }
    tokens_.push_back(std::move(token));
    pos_ = end;
    return Status::ok();
  }

  std::string src_;
  LexOptions options_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> tokens_;
};

}  // namespace

Result<std::vector<Token>> lex(const std::string& source, const LexOptions& options) {
  size_t bad_offset = 0;
  if (!valid_utf8(source, bad_offset))
    return Status::errorf("template is not valid UTF-8 (byte offset {})", bad_offset);
  // jinja2 normalises every newline to "\n" and drops one trailing newline
  // (keep_trailing_newline=False).
  std::string normalized;
  normalized.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      normalized += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      normalized += source[i];
    }
  }
  if (!normalized.empty() && normalized.back() == '\n') normalized.pop_back();
  return Lexer(std::move(normalized), options).run();
}

}  // namespace sy::chat
