// The random dataset's view of a real tokenizer (sy::tokenizer), with vLLM's conventions:
// prompts are re-encoded without special tokens; special ids are never sampled.
#pragma once

#include <string>

#include "loadgen/dataset.h"
#include "tokenizer/tokenizer.h"

namespace sy::loadgen {

TokenCodec make_token_codec(const tokenizer::Tokenizer& tokenizer);

// Tokens of generated text as vLLM counts them when a server sends no usage.
int count_output_tokens(const tokenizer::Tokenizer& tokenizer, const std::string& text);

}  // namespace sy::loadgen
