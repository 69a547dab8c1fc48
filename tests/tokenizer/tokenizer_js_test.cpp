// Our ids against @lenml/tokenizers (node) on random strings generated afresh each run (the seed
// is printed). Known divergences of the JavaScript port from HF are excluded by rule, below.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "tokenizer/utf8.h"
#include "tokenizer_test_util.h"
#include "../test_seed.h"

namespace sy::tokenizer {
namespace {

using nlohmann::json;

// Pieces random strings are built from: every regex branch and added-token path of the real models.
const std::vector<std::string>& pieces() {
  static const std::vector<std::string> all = {
      "hello", "Hello", "WORLD", "naïve", "Zürich", "don", "'s", "'S", "'ll", "'RE", "'", " ", "  ", "   ", "\t", "\n",
      "\r\n", "\r", "\n\n", "\u00a0", "\u3000", "\u2003", "0", "12", "345", "67890", "3.14", "1,000", "١٢٣", "²",
      "½", "(", ")", "{", "}", "->", "::", "//", "#", "!", "?", "...", "—", "«", "»", "\"", "$x", "_", "-", "@",
      "你好", "世界", "日本語", "カタカナ", "ひらがな", "한국어", "Привет", "мир", "γειά", "مرحبا", "שלום", "नमस्ते",
      "สวัสดี", "ქართ", "e\u0301", "a\u0308", "\u212b", "ﬁ", "Ａ", "😀", "👍🏽", "👩\u200d💻", "🇺🇸", "1\ufe0f\u20e3",
      "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<|start|>", "<|message|>",
      "<|channel|>", "<|begin_of_text|>", "<|eot_id|>", "<|im_", "|>", "<|", "<think", "\ufeff",
  };
  return all;
}

std::string random_text(std::mt19937_64& rng) {
  std::string text;
  const int count = std::uniform_int_distribution<int>(1, 24)(rng);
  for (int i = 0; i < count; ++i) {
    if (std::uniform_int_distribution<int>(0, 9)(rng) == 0) {
      // A random code point from the BMP's long-assigned blocks (Unicode <= 6): both sides' tables agree.
      static const std::pair<char32_t, char32_t> blocks[] = {{0x20, 0x7E}, {0xA1, 0x24F}, {0x370, 0x3FF},
                                                              {0x400, 0x4FF}, {0x4E00, 0x9FA5}, {0x3040, 0x30FF},
                                                              {0x2000, 0x206F}, {0x2190, 0x22FF}, {0xAC00, 0xD7A3}};
      const auto& [lo, hi] = blocks[std::uniform_int_distribution<size_t>(0, std::size(blocks) - 1)(rng)];
      utf8::append(text, std::uniform_int_distribution<char32_t>(lo, hi)(rng));
    } else {
      text += pieces()[std::uniform_int_distribution<size_t>(0, pieces().size() - 1)(rng)];
    }
  }
  return text;
}

// Rules for the JavaScript port's known divergences from HF tokenizers (Rust):
//  - JavaScript's \s matches U+FEFF; HF's Oniguruma \s does not.
bool known_js_divergence(const std::string& text) { return text.find("\xEF\xBB\xBF") != std::string::npos; }

std::string run_command(const std::string& command, int* status) {
  std::string output;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (!pipe) {
    *status = -1;
    return output;
  }
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof buffer, pipe)) > 0) output.append(buffer, n);
  *status = pclose(pipe);
  return output;
}

class JsOracleTest : public ::testing::TestWithParam<std::string> {};

TEST_P(JsOracleTest, FreshRandomStringsMatchTransformersJs) {
  const std::string name = GetParam();
  ASSERT_TRUE(test::deps_installed()) << test::kRunSetup;
  int status = 0;
  run_command("node --version", &status);
  ASSERT_EQ(status, 0) << "node is needed for this test (scripts/setup.sh installs it)";
  const Tokenizer* tokenizer = test::load_tokenizer(name);
  ASSERT_NE(tokenizer, nullptr);

  const uint64_t seed = sy::test::test_seed();
  SY_SEED_TRACE(seed);
  std::mt19937_64 rng(seed);
  std::printf("[%s] %s\n", name.c_str(), sy::test::seed_note(seed).c_str());
  std::vector<std::string> texts;
  int excluded = 0;
  while (texts.size() < 400) {
    std::string text = random_text(rng);
    if (known_js_divergence(text)) {
      ++excluded;
      continue;
    }
    texts.push_back(std::move(text));
  }
  const auto dir = std::filesystem::temp_directory_path() / ("sy_tok_js_" + name + std::to_string(seed));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "in.json") << json(texts).dump();
  const std::string command = "node " + test::source_dir() + "/tests/tokenizer/js_oracle.js " + test::source_dir() +
                              "/deps/node_modules " + test::model_dir(name) + " " + (dir / "in.json").string() +
                              " " + (dir / "out.json").string();
  const std::string output = run_command(command, &status);
  ASSERT_EQ(status, 0) << command << "\n" << output;
  std::ifstream in(dir / "out.json");
  const json expected = json::parse(in);
  std::filesystem::remove_all(dir);
  ASSERT_EQ(expected.size(), texts.size());
  int equal = 0, shown = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const auto want = expected[i].get<std::vector<int32_t>>();
    const auto got = tokenizer->encode(texts[i]);
    equal += got == want;
    if (got != want && shown++ < 3) {
      ADD_FAILURE() << name << " seed " << seed << " text " << json(texts[i]).dump() << "\n  JS:   " << json(want).dump()
                    << "\n  ours: " << json(got).dump();
    }
  }
  std::printf("[%s] equal %d/%zu (excluded by rule: %d)\n", name.c_str(), equal, texts.size(), excluded);
  EXPECT_EQ(equal, static_cast<int>(texts.size()));
}

INSTANTIATE_TEST_SUITE_P(RealTokenizers, JsOracleTest, ::testing::Values("qwen3", "gptoss", "llama3"));

}  // namespace
}  // namespace sy::tokenizer
