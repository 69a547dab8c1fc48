// A model's generation_config.json sets the default sampling of every request: out-of-range or
// mistyped fields are refused at load, naming the file and the field, never passed on.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "engine/generation_defaults.h"

namespace sy::engine {
namespace {

namespace fs = std::filesystem;

class GenerationDefaults : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("sy_gen_defaults_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  Result<SamplingParams> load(const std::string& text) {
    std::ofstream(dir_ / "generation_config.json") << text;
    return load_generation_defaults(dir_.string());
  }
  fs::path dir_;
};

TEST_F(GenerationDefaults, ReadsTheFieldsAndTopKZeroMeansOff) {
  auto params = load(R"({"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.05,
                         "repetition_penalty": 1.1, "eos_token_id": [1, 2]})");
  ASSERT_TRUE(params.is_ok()) << params.message();
  EXPECT_FLOAT_EQ(params->temperature, 0.6f);
  EXPECT_FLOAT_EQ(params->top_p, 0.95f);
  EXPECT_EQ(params->top_k, 20);
  EXPECT_FLOAT_EQ(params->min_p, 0.05f);
  EXPECT_FLOAT_EQ(params->repetition_penalty, 1.1f);
  auto off = load(R"({"top_k": 0})");
  ASSERT_TRUE(off.is_ok()) << off.message();
  EXPECT_EQ(off->top_k, -1);
  auto missing = load_generation_defaults((dir_ / "nowhere").string());
  ASSERT_TRUE(missing.is_ok());
  EXPECT_EQ(missing->top_k, -1);
  EXPECT_FLOAT_EQ(missing->temperature, 1.0f);
}

TEST_F(GenerationDefaults, OutOfRangeOrMistypedFieldsNameFileAndField) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"temperature": -1})", "temperature"},
      {R"({"temperature": "hot"})", "temperature"},
      {R"({"top_p": 0})", "top_p"},
      {R"({"top_p": 1.5})", "top_p"},
      {R"({"min_p": 2})", "min_p"},
      {R"({"repetition_penalty": 0})", "repetition_penalty"},
      {R"({"top_k": -5})", "top_k"},
      {R"({"top_k": 2.5})", "top_k"},
      {R"({"top_k": 1e300})", "top_k"},
      {R"({"top_k": 4294967296})", "top_k"},
      {R"([1, 2])", "not a JSON object"},
  };
  for (const auto& [text, field] : cases) {
    auto params = load(text);
    ASSERT_FALSE(params.is_ok()) << text;
    EXPECT_NE(params.message().find(field), std::string::npos) << params.message();
    EXPECT_NE(params.message().find("generation_config.json"), std::string::npos)
        << params.message();
  }
}

}  // namespace
}  // namespace sy::engine
