// UTF-8 and character-class helpers with the exact semantics of the Rust code HF tokenizers runs:
// std's validation and from_utf8_lossy (one U+FFFD per maximal invalid subpart), char::is_whitespace,
// and the `regex` crate's Unicode \w (used for added tokens' single_word).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace sy::tokenizer::utf8 {

// Length of the valid UTF-8 sequence starting at `pos`; 0 if the bytes there are invalid (or
// truncated). `*subpart` receives how many bytes form the maximal invalid subpart (>= 1) then.
size_t valid_sequence_length(std::string_view text, size_t pos, size_t* subpart = nullptr);

// Offset of the first invalid byte, or npos when `text` is valid UTF-8.
size_t first_invalid(std::string_view text);

// Valid UTF-8 copy: each maximal invalid subpart becomes U+FFFD (Rust's String::from_utf8_lossy).
std::string lossy(std::string_view text);

// Decodes the code point at `pos` of valid UTF-8 and advances `pos`.
char32_t next(std::string_view text, size_t& pos);
// The code point ending at `end` (exclusive) of valid UTF-8; `*start` gets its first byte.
char32_t previous(std::string_view text, size_t end, size_t* start);
void append(std::string& out, char32_t cp);

// Rust char::is_whitespace (the White_Space property).
bool is_whitespace(char32_t cp);
// The regex crate's Unicode \w: Alphabetic, marks, decimal digits, connector punctuation, joiners.
bool is_word_char(char32_t cp);

}  // namespace sy::tokenizer::utf8
