// Hugging Face tokenizer.json (byte-level BPE and what the supported models use around it), giving
// exactly the ids HF `tokenizers` gives, plus streaming detokenization that never splits a character.
// Tokenizer is cheap to copy (shared, immutable state) and safe to use from many threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "util/status.h"

namespace sy::tokenizer {

class Tokenizer {
 public:
  // Reads model_dir/tokenizer.json (and tokenizer_config.json when present). A feature this
  // implementation lacks (model type, normalizer, pre-tokenizer, decoder, post-processor,
  // truncation, padding) fails here with a message naming it.
  static Result<Tokenizer> load(const std::string& model_dir);
  // The same from the text of a tokenizer.json (and optionally of a tokenizer_config.json).
  static Result<Tokenizer> from_json(std::string_view tokenizer_json, std::string_view tokenizer_config_json = {});

  // HF's Tokenizer::encode(text, add_special_tokens).ids. Invalid UTF-8 is first repaired the way
  // String::from_utf8_lossy does (HF itself cannot take such input); use try_encode to reject it.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const;
  Result<std::vector<int32_t>> try_encode(std::string_view text, bool add_special_tokens = true) const;

  // HF's Tokenizer::decode: unknown ids are skipped; invalid UTF-8 from byte tokens becomes U+FFFD.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens = false) const;

  int64_t vocab_size() const;  // model vocab and added tokens: max id + 1
  std::optional<int32_t> token_to_id(std::string_view token) const;
  std::string id_to_token(int32_t id) const;  // "" for an id with no token
  bool is_special(int32_t id) const;          // an added token marked "special"
  // Text of a named token in tokenizer_config.json ("bos_token", "eos_token", ...), if given.
  std::optional<std::string> config_token(std::string_view key) const;
  // What decode(encode(s)) gives back for valid s without added tokens: the normalizer's output.
  std::string normalize(std::string_view text) const;

  // The bytes one id contributes to decoded text (before UTF-8 repair); empty for unknown ids
  // and, when skip_special_tokens, for special tokens. Used by StreamDecoder.
  std::string_view token_bytes(int32_t id, bool skip_special_tokens) const;
  bool joins_with_spaces() const;  // no decoder: HF joins tokens with " "

 private:
  struct Impl;
  std::shared_ptr<const Impl> impl_;
};

// Incremental detokenization for streaming: the concatenation of everything push() and flush()
// return equals decode(all ids), and no push() ever returns a broken UTF-8 sequence.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens = false);
  std::string push(int32_t id);  // newly complete text (maybe empty)
  std::string flush();           // whatever remains, invalid bytes as U+FFFD

 private:
  Tokenizer tokenizer_;
  bool skip_special_tokens_;
  bool emitted_any_ = false;
  std::string pending_;  // bytes not yet returned: at most an incomplete character
};

}  // namespace sy::tokenizer
