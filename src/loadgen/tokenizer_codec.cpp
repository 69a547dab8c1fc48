#include "loadgen/tokenizer_codec.h"

namespace sy::loadgen {

TokenCodec make_token_codec(const tokenizer::Tokenizer& tokenizer) {
  TokenCodec codec;
  codec.vocab_size = static_cast<int>(tokenizer.vocab_size());
  for (int32_t id = 0; id < codec.vocab_size; ++id) {
    if (tokenizer.is_special(id) || tokenizer.id_to_token(id).empty()) codec.special_ids.push_back(id);
  }
  // What the server's own encode adds around a text prompt (BOS for Llama, nothing for Qwen3):
  // HF's num_special_tokens_to_add.
  codec.special_tokens_added = static_cast<int>(tokenizer.encode("", true).size());
  codec.encode = [tokenizer](const std::string& text) -> Result<std::vector<int32_t>> {
    return tokenizer.try_encode(text, /*add_special_tokens=*/false);
  };
  codec.decode = [tokenizer](const std::vector<int32_t>& ids) -> Result<std::string> {
    return tokenizer.decode(ids);
  };
  return codec;
}

int count_output_tokens(const tokenizer::Tokenizer& tokenizer, const std::string& text) {
  return static_cast<int>(tokenizer.encode(text, /*add_special_tokens=*/false).size());
}

}  // namespace sy::loadgen
