// Behaviour a user of the tokenizer would notice: errors that name the problem, invalid UTF-8,
// streaming detokenization, concurrent use, added-token flags, and the `switchyard tokenize` CLI.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "tokenizer/regex.h"
#include "tokenizer_test_util.h"

namespace sy::tokenizer {
namespace {

using nlohmann::json;

// A tiny byte-level BPE written out here; `extra` is merged into the top-level object.
std::string tiny_tokenizer(const json& extra = json::object()) {
  json vocab = json::object();
  int id = 0;
  for (const char* token : {"a", "b", "c", "Ġ", "ab", "abc", "Ġa", "<", ">", "x"}) vocab[token] = id++;
  json root = {{"version", "1.0"},
               {"truncation", nullptr},
               {"padding", nullptr},
               {"added_tokens", json::array({{{"id", 10}, {"content", "<eos>"}, {"special", true},
                                              {"normalized", false}}})},
               {"normalizer", nullptr},
               {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
               {"post_processor", nullptr},
               {"decoder", {{"type", "ByteLevel"}}},
               {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array({"a b", "ab c", "Ġ a"})}}}};
  root.merge_patch(extra);
  return root.dump();
}

TEST(TokenizerLoad, UnsupportedFeaturesFailNamingThem) {
  const std::pair<json, std::string> cases[] = {
      {{{"model", {{"type", "WordPiece"}}}}, "model type \"WordPiece\""},
      {{{"normalizer", {{"type", "BertNormalizer"}}}}, "normalizer type \"BertNormalizer\""},
      {{{"pre_tokenizer", {{"type", "Metaspace"}}}}, "pre_tokenizer type \"Metaspace\""},
      {{{"decoder", {{"type", "WordPiece"}}}}, "decoder \"WordPiece\""},
      {{{"post_processor", {{"type", "Fancy"}}}}, "post_processor type \"Fancy\""},
      {{{"truncation", {{"max_length", 8}}}}, "\"truncation\""},
      {{{"padding", {{"strategy", "BatchLongest"}}}}, "\"padding\""},
      {{{"model", {{"dropout", 0.1}}}}, "dropout"},
      {{{"model", {{"continuing_subword_prefix", "##"}}}}, "continuing_subword_prefix"},
  };
  for (const auto& [patch, feature] : cases) {
    const auto result = Tokenizer::from_json(tiny_tokenizer(patch));
    ASSERT_FALSE(result) << patch.dump();
    EXPECT_NE(result.message().find(feature), std::string::npos) << result.message();
    EXPECT_NE(result.message().find("unsupported"), std::string::npos) << result.message();
  }
}

TEST(TokenizerLoad, MalformedFilesAreErrorsNotCrashes) {
  EXPECT_FALSE(Tokenizer::from_json("{not json"));
  EXPECT_FALSE(Tokenizer::from_json("[]"));
  EXPECT_FALSE(Tokenizer::from_json(tiny_tokenizer({{"model", {{"merges", json::array({"a q"})}}}})));
  EXPECT_FALSE(Tokenizer::from_json(tiny_tokenizer({{"model", {{"merges", json::array({"a b c"})}}}})));
  EXPECT_FALSE(Tokenizer::from_json(
      tiny_tokenizer({{"pre_tokenizer", {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}}}})));
  const auto missing = Tokenizer::load("/nonexistent/model");
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.message().find("/nonexistent/model/tokenizer.json"), std::string::npos) << missing.message();
}

// Fields of the wrong type and ids past the supported range are errors naming the field (the
// tokenizer-file fuzz target found the first one throwing through from_json).
TEST(TokenizerLoad, WrongTypesAndHugeIdsNameTheField) {
  json added_huge = json::parse(tiny_tokenizer())["added_tokens"];
  added_huge[0]["id"] = int64_t{1} << 40;
  json added_flag = json::parse(tiny_tokenizer())["added_tokens"];
  added_flag[0]["special"] = "yes";
  const std::pair<json, std::string> cases[] = {
      {{{"model", {{"ignore_merges", 1}}}}, "model.ignore_merges"},
      {{{"model", {{"type", 7}}}}, "model.type"},
      {{{"model", {{"vocab", {{"a", int64_t{1} << 31}}}}}}, "vocab entry \"a\""},
      {{{"model", {{"vocab", {{"a", 4194304}}}}}},
       "vocab entry \"a\""},  // 2^22: tables would be huge
      {{{"pre_tokenizer", {{"type", "ByteLevel"}, {"use_regex", "true"}}}}, "use_regex"},
      {{{"pre_tokenizer", {{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", 3}}}},
       "behavior"},
      {{{"added_tokens", added_huge}}, "<eos>"},
      {{{"added_tokens", added_flag}}, "special"},
      {{{"post_processor", {{"type", "TemplateProcessing"}, {"single", json::array({1})}}}},
       "TemplateProcessing"},
      {{{"post_processor",
         {{"type", "TemplateProcessing"},
          {"single",
           json::array({{{"SpecialToken", {{"id", "<s>"}}}}, {{"Sequence", {{"id", "A"}}}}})},
          {"special_tokens", {{"<s>", {{"ids", json::array({-1})}}}}}}}},
       "\"<s>\" id"},
  };
  for (const auto& [patch, field] : cases) {
    const auto result = Tokenizer::from_json(tiny_tokenizer(patch));
    ASSERT_FALSE(result) << patch.dump();
    EXPECT_NE(result.message().find(field), std::string::npos) << result.message();
  }
}

TEST(Tokenizer, BothMergeEncodingsGiveTheSameIds) {
  const auto legacy = Tokenizer::from_json(tiny_tokenizer());
  const auto pairs = Tokenizer::from_json(
      tiny_tokenizer({{"model", {{"merges", json::array({json::array({"a", "b"}), json::array({"ab", "c"}),
                                                          json::array({"Ġ", "a"})})}}}}));
  ASSERT_TRUE(legacy && pairs) << legacy.message() << pairs.message();
  EXPECT_EQ(legacy->encode("abc a<eos>"), (std::vector<int32_t>{5, 6, 10}));
  EXPECT_EQ(pairs->encode("abc a<eos>"), legacy->encode("abc a<eos>"));
  EXPECT_EQ(legacy->vocab_size(), 11);
  EXPECT_EQ(legacy->token_to_id("<eos>"), 10);
  EXPECT_EQ(legacy->id_to_token(5), "abc");
  EXPECT_TRUE(legacy->is_special(10));
  EXPECT_FALSE(legacy->is_special(5));
  EXPECT_EQ(legacy->decode({5, 6, 10}), "abc a<eos>");
  EXPECT_EQ(legacy->decode({5, 6, 10}, true), "abc a");
  EXPECT_EQ(legacy->decode({5, 999, -3}), "abc");  // unknown ids are skipped, like HF
}

TEST(Tokenizer, InvalidUtf8IsRejectedByTryEncodeAndRepairedByEncode) {
  const Tokenizer* qwen = test::load_tokenizer("qwen3");
  ASSERT_NE(qwen, nullptr);
  const std::string bad = std::string("ok") + "\xFF" + "\xC3";
  const auto rejected = qwen->try_encode(bad);
  ASSERT_FALSE(rejected);
  EXPECT_NE(rejected.message().find("offset 2"), std::string::npos) << rejected.message();
  EXPECT_EQ(qwen->encode(bad), qwen->encode("ok\xEF\xBF\xBD\xEF\xBF\xBD"));
  EXPECT_EQ(qwen->decode(qwen->encode(bad)), "ok\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(StreamDecoder, ConcatenationEqualsDecodeAndEveryChunkIsValidUtf8) {
  const Tokenizer* qwen = test::load_tokenizer("qwen3");
  ASSERT_NE(qwen, nullptr);
  const std::string text = "Emoji 👩‍💻🇺🇸 and 你好世界, e\u0301 <|im_end|> done";
  for (const bool skip : {false, true}) {
    const auto ids = qwen->encode(text);
    StreamDecoder stream(*qwen, skip);
    std::string streamed;
    int multi_byte_held = 0;
    for (const int32_t id : ids) {
      const std::string chunk = stream.push(id);
      EXPECT_EQ(qwen->try_encode(chunk).is_ok(), true) << "push returned broken UTF-8";
      multi_byte_held += chunk.empty();
      streamed += chunk;
    }
    streamed += stream.flush();
    EXPECT_EQ(streamed, qwen->decode(ids, skip));
    EXPECT_GT(multi_byte_held, 0);  // some tokens end mid-character, so the decoder had to wait
  }
  // Random id sequences: byte tokens that never form a character come out as U+FFFD, as in decode.
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<int32_t> ids;
    for (int i = 0; i < 12; ++i) ids.push_back(std::uniform_int_distribution<int32_t>(0, 400)(rng));
    StreamDecoder stream(*qwen);
    std::string streamed;
    for (const int32_t id : ids) {
      const std::string chunk = stream.push(id);
      ASSERT_TRUE(qwen->try_encode(chunk).is_ok());
      streamed += chunk;
    }
    streamed += stream.flush();
    ASSERT_EQ(streamed, qwen->decode(ids)) << json(ids).dump();
  }
}

TEST(Tokenizer, ConcurrentEncodesAgreeWithSerialOnes) {
  const Tokenizer* gptoss = test::load_tokenizer("gptoss");
  ASSERT_NE(gptoss, nullptr);
  std::vector<std::string> texts;
  for (int i = 0; i < 64; ++i) texts.push_back("request " + std::to_string(i * 7919) + " naïve café 🚀 <|start|>x");
  std::vector<std::vector<int32_t>> serial;
  for (const auto& text : texts) serial.push_back(gptoss->encode(text));
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      Tokenizer copy = *gptoss;  // copies share state
      for (int round = 0; round < 20; ++round) {
        for (size_t i = 0; i < texts.size(); ++i) mismatches[t] += copy.encode(texts[i]) != serial[i];
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (const int m : mismatches) EXPECT_EQ(m, 0);
}

TEST(Regex, CategoryClassesUseHfsUnicodeTables) {
  // U+1FACF (Unicode 15) is So for HF's Oniguruma; Debian's libonig 6.9.8 does not know it.
  const auto regex = Regex::compile(R"(\p{S}+|[^\p{L}\P{N}]+)");
  ASSERT_TRUE(regex) << regex.message();
  const auto matches = regex->find_all("a\xF0\x9F\xAB\x8F" "12");
  ASSERT_EQ(matches.size(), 2u);
  EXPECT_EQ(matches[0], (std::pair<size_t, size_t>{1, 5}));
  EXPECT_EQ(matches[1], (std::pair<size_t, size_t>{5, 7}));
  EXPECT_EQ(spell_out_categories(R"(\\p{L})"), R"(\\p{L})");  // an escaped backslash, not a class
}

// The CLI, through the built binary (ctest sets SWITCHYARD_BIN).
std::string run(const std::string& command, int* status) {
  std::string output;
  FILE* pipe = popen(command.c_str(), "r");
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof buffer, pipe)) > 0) output.append(buffer, n);
  *status = pclose(pipe);
  return output;
}

TEST(TokenizeCli, EncodesAndDecodesJsonLinesFromAFolderWithOnlyTheTokenizerFiles) {
  const char* bin = std::getenv("SWITCHYARD_BIN");
  ASSERT_NE(bin, nullptr) << "run through ctest, which sets SWITCHYARD_BIN";
  const Tokenizer* qwen = test::load_tokenizer("qwen3");
  ASSERT_NE(qwen, nullptr);
  const auto dir = std::filesystem::temp_directory_path() / "sy_tokenize_cli";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "in.jsonl") << json("Hello <|im_start|>world").dump() << "\n" << json("你好 👍🏽").dump() << "\n";
  int status = 0;
  const std::string model = test::model_dir("qwen3");
  const std::string encoded =
      run(std::string(bin) + " tokenize --model " + model + " < " + (dir / "in.jsonl").string(), &status);
  ASSERT_EQ(status, 0) << encoded;
  const std::string expected =
      json(qwen->encode("Hello <|im_start|>world")).dump() + "\n" + json(qwen->encode("你好 👍🏽")).dump() + "\n";
  EXPECT_EQ(encoded, expected);
  std::ofstream(dir / "ids.jsonl") << encoded;
  const std::string decoded =
      run(std::string(bin) + " tokenize --decode --model " + model + " < " + (dir / "ids.jsonl").string(), &status);
  ASSERT_EQ(status, 0) << decoded;
  EXPECT_EQ(decoded, json("Hello <|im_start|>world").dump() + "\n" + json("你好 👍🏽").dump() + "\n");

  std::ofstream(dir / "bad.jsonl") << "\"fine\"\n[1, 2]\n";
  const std::string bad = run(std::string(bin) + " tokenize --model " + model + " < " + (dir / "bad.jsonl").string() +
                              " 2>&1", &status);
  EXPECT_NE(status, 0);
  EXPECT_NE(bad.find("line 2"), std::string::npos) << bad;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace sy::tokenizer
