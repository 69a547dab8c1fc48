// What the tokenizer fuzz targets check of one text: every id inside the vocabulary, try_encode
// agreeing with encode where it accepts the text, and streaming detokenization giving decode's
// text. A violation aborts (a finding).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace sy::fuzz {

inline void check_encoding(const tokenizer::Tokenizer& tok, std::string_view text,
                           bool add_special) {
  const std::vector<int32_t> ids = tok.encode(text, add_special);
  for (const int32_t id : ids)
    if (id < 0 || id >= tok.vocab_size()) std::abort();
  const auto checked = tok.try_encode(text, add_special);
  if (checked.is_ok() && checked.value() != ids) std::abort();
  const std::string decoded = tok.decode(ids);
  tokenizer::StreamDecoder stream(tok);
  std::string streamed;
  for (const int32_t id : ids) streamed += stream.push(id);
  streamed += stream.flush();
  if (streamed != decoded) std::abort();
  (void)tok.decode(ids, /*skip_special_tokens=*/true);
}

}  // namespace sy::fuzz
