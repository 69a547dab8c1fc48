// libFuzzer: tokenizer.json is a model file, so untrusted input. Tokenizer::from_json on it must
// refuse with a message naming what it lacks or load; a tokenizer it loads must encode a few
// fixed texts (ASCII, accents, CJK, emoji, whitespace runs, added-token spellings, invalid UTF-8)
// to ids inside its vocabulary, decode them, and stream-decode them to the same text.
//
// Input: byte 0's low 2 bits pick what the rest is: 0..2, edits (fuzz/json_edits.h) of one of
// three small real tokenizer.json files (the golden checkpoints' byte-level BPE, trained_a with
// NFKC + lowercase, trained_b with a Split sequence); 3, tokenizer.json's bytes themselves.
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "json_edits.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer_checks.h"

namespace {

struct Seed {
  nlohmann::json doc;
  std::vector<nlohmann::json::json_pointer> nodes;
};

std::vector<Seed>& seeds() {
  static std::vector<Seed> loaded = [] {
    std::vector<Seed> out;
    for (const char* path : {"/tests/golden/hf_qwen3_moe/qwen3moe_sharded/tokenizer.json",
                             "/tests/tokenizer/trained_a/tokenizer.json",
                             "/tests/tokenizer/trained_b/tokenizer.json"}) {
      std::ifstream in(std::string(SY_SOURCE_DIR) + path);
      if (!in) std::abort();  // a setup problem, not a finding
      Seed seed;
      seed.doc = nlohmann::json::parse(in);
      seed.nodes = sy::fuzz::json_nodes(seed.doc);
      out.push_back(std::move(seed));
    }
    return out;
  }();
  return loaded;
}

// The format's own words: model, normalizer, pre-tokenizer, decoder and post-processor types,
// Split behaviours and a few regexes (the GPT-2 and Qwen2 splits among them).
const std::vector<std::string> kWords = {
    "BPE",
    "WordPiece",
    "WordLevel",
    "Unigram",
    "ByteLevel",
    "Split",
    "Metaspace",
    "Whitespace",
    "WhitespaceSplit",
    "Punctuation",
    "Digits",
    "Sequence",
    "NFC",
    "NFD",
    "NFKC",
    "NFKD",
    "Lowercase",
    "Replace",
    "Strip",
    "Prepend",
    "ByteFallback",
    "Fuse",
    "TemplateProcessing",
    "RobertaProcessing",
    "Isolated",
    "Removed",
    "MergedWithPrevious",
    "MergedWithNext",
    "Contiguous",
    "Regex",
    "String",
    " ",
    "",
    "\xe2\x96\x81",
    "<|endoftext|>",
    "<unk>",
    "(a*)*b",
    "\\p{L}+",
    "[^\\s\\p{L}\\p{N}]+",
    "\\s+(?!\\S)",
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+",
    "[",
    "(?<=a)b"};

const char* const kTexts[] = {
    "Hello, world! It's 2026-12-07; x=3.14  \n\tdone",
    "h\xc3\xa9llo W\xc3\x96RLD \xef\xac\x81 \xe2\x91\xa0",  // accents, a ligature, a circled digit
    "\xe4\xbd\xa0\xe5\xa5\xbd\xef\xbc\x8c\xe4\xb8\x96\xe7\x95\x8c "
    "\xf0\x9f\x98\x80\xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd",
    "<|endoftext|><|im_start|>user\n<unk>   end   ",
    "\xff\xfe broken \xc3 utf8 \xe2\x82",
    "",
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const unsigned mode = data[0] & 3;
  std::string text;
  if (mode == 3) {
    text.assign(reinterpret_cast<const char*>(data + 1), size - 1);
  } else {
    const Seed& seed = seeds()[mode];
    text = sy::fuzz::apply_json_edits(seed.doc, seed.nodes, kWords, data + 1, size - 1)
               .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  auto loaded = sy::tokenizer::Tokenizer::from_json(text);
  if (!loaded.is_ok()) {
    if (loaded.message().empty()) std::abort();  // every refusal says what is wrong
    return 0;
  }
  const sy::tokenizer::Tokenizer& tok = *loaded;
  for (const char* sample : kTexts) {
    for (bool special : {false, true}) {
      sy::fuzz::check_encoding(tok, sample, special);
    }
    (void)tok.normalize(sample);
  }
  return 0;
}
