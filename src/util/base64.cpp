#include "util/base64.h"

#include <array>
#include <cstdint>

namespace sy {
namespace {

constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
constexpr int8_t kInvalid = -1;

constexpr std::array<int8_t, 256> make_decode_table() {
  std::array<int8_t, 256> table{};
  for (auto& entry : table) entry = kInvalid;
  for (int i = 0; i < 64; ++i) table[static_cast<uint8_t>(kAlphabet[i])] = static_cast<int8_t>(i);
  return table;
}
constexpr auto kDecode = make_decode_table();

std::string describe_char(char c) {
  auto byte = static_cast<unsigned char>(c);
  if (byte >= 0x21 && byte < 0x7f) return fmt::format("'{}'", c);
  return fmt::format("byte 0x{:02x}", byte);
}

}  // namespace

std::string base64_encode(std::string_view bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    uint32_t group = static_cast<uint8_t>(bytes[i]) << 16 | static_cast<uint8_t>(bytes[i + 1]) << 8 |
                     static_cast<uint8_t>(bytes[i + 2]);
    out += kAlphabet[group >> 18];
    out += kAlphabet[(group >> 12) & 63];
    out += kAlphabet[(group >> 6) & 63];
    out += kAlphabet[group & 63];
  }
  size_t rest = bytes.size() - i;
  if (rest > 0) {
    uint32_t group = static_cast<uint32_t>(static_cast<uint8_t>(bytes[i])) << 16;
    if (rest == 2) group |= static_cast<uint32_t>(static_cast<uint8_t>(bytes[i + 1])) << 8;
    out += kAlphabet[group >> 18];
    out += kAlphabet[(group >> 12) & 63];
    out += rest == 2 ? kAlphabet[(group >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

Result<std::string> base64_decode(std::string_view text) {
  if (text.size() % 4 != 0)
    return Status::errorf(
        "base64 text has length {}, which is not a multiple of 4 (padding with '=' is required)",
        text.size());
  size_t padding = 0;
  if (!text.empty() && text.back() == '=') padding = text[text.size() - 2] == '=' ? 2 : 1;
  std::string out;
  out.reserve(text.size() / 4 * 3);
  for (size_t i = 0; i < text.size(); i += 4) {
    bool last_group = i + 4 == text.size();
    size_t data_chars = last_group ? 4 - padding : 4;  // the rest were counted as '=' above
    uint32_t group = 0;
    for (size_t j = 0; j < data_chars; ++j) {
      char c = text[i + j];
      int8_t value = kDecode[static_cast<uint8_t>(c)];
      if (value == kInvalid) {
        if (c == '=')
          return Status::errorf("base64: '=' at position {} is padding before the end of the text",
                                i + j);
        return Status::errorf(
            "base64: invalid character {} at position {} (valid: A-Z a-z 0-9 + / and '=' padding)",
            describe_char(c), i + j);
      }
      group |= static_cast<uint32_t>(value) << (18 - 6 * j);
    }
    out += static_cast<char>(group >> 16);
    if (data_chars >= 3) out += static_cast<char>((group >> 8) & 0xff);
    if (data_chars == 4) out += static_cast<char>(group & 0xff);
  }
  return out;
}

}  // namespace sy
