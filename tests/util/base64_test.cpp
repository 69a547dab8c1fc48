// Base64: RFC 4648 vectors, round trips of fresh random data, agreement with Node's Buffer (an
// independent implementation), and clear errors on malformed text.
#include "util/base64.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include "../test_seed.h"

namespace sy {
namespace {

using ::testing::HasSubstr;

TEST(Base64, Rfc4648Vectors) {
  const std::pair<const char*, const char*> vectors[] = {
      {"", ""},         {"f", "Zg=="},         {"fo", "Zm8="},        {"foo", "Zm9v"},
      {"foob", "Zm9vYg=="}, {"fooba", "Zm9vYmE="}, {"foobar", "Zm9vYmFy"},
  };
  for (auto [plain, encoded] : vectors) {
    EXPECT_EQ(base64_encode(plain), encoded);
    auto decoded = base64_decode(encoded);
    ASSERT_TRUE(decoded.is_ok()) << decoded.message();
    EXPECT_EQ(*decoded, plain);
  }
  EXPECT_EQ(base64_encode(std::string("\xff\xfe\x00", 3)), "//4A");
}

TEST(Base64, RoundTripsRandomBytes) {
  const uint64_t seed = test::test_seed();
  SY_SEED_TRACE(seed);
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 500; ++trial) {
    std::string bytes(rng() % 300, '\0');
    for (auto& byte : bytes) byte = static_cast<char>(rng());
    std::string text = base64_encode(bytes);
    EXPECT_EQ(text.size(), (bytes.size() + 2) / 3 * 4);
    auto decoded = base64_decode(text);
    ASSERT_TRUE(decoded.is_ok()) << decoded.message();
    EXPECT_EQ(*decoded, bytes);
  }
}

TEST(Base64, AgreesWithNodeBuffer) {
  if (std::system("node --version > /dev/null 2>&1") != 0)
    FAIL() << "node not found: install Node 20 (scripts/setup.sh)";
  const uint64_t seed = test::test_seed();
  SY_SEED_TRACE(seed);
  std::mt19937_64 rng(seed);
  std::string bytes(4099, '\0');
  for (auto& byte : bytes) byte = static_cast<char>(rng());
  auto dir = std::filesystem::temp_directory_path();
  std::string input = (dir / ("sy_b64_" + std::to_string(seed))).string();
  std::ofstream(input, std::ios::binary) << bytes;
  std::string command = "node -e \"process.stdout.write(require('fs').readFileSync(process.argv[1]).toString('base64'))\" " + input;
  std::FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string node_text;
  char chunk[4096];
  for (size_t n; (n = std::fread(chunk, 1, sizeof chunk, pipe)) > 0;) node_text.append(chunk, n);
  ASSERT_EQ(pclose(pipe), 0);
  std::filesystem::remove(input);
  EXPECT_EQ(base64_encode(bytes), node_text);
  auto decoded = base64_decode(node_text);
  ASSERT_TRUE(decoded.is_ok());
  EXPECT_EQ(*decoded, bytes);
}

TEST(Base64, RejectsMalformedText) {
  EXPECT_THAT(base64_decode("Zm9").message(), HasSubstr("length 3, which is not a multiple of 4"));
  EXPECT_THAT(base64_decode("Zm!v").message(), HasSubstr("invalid character '!' at position 2"));
  EXPECT_THAT(base64_decode("Zm9\n").message(), HasSubstr("byte 0x0a at position 3"));
  EXPECT_THAT(base64_decode("Zm-_").message(), HasSubstr("'-'"));  // URL-safe alphabet is not accepted
  EXPECT_THAT(base64_decode("Zg==Zg==").message(), HasSubstr("'=' at position 2 is padding before the end"));
  EXPECT_THAT(base64_decode("Z===").message(), HasSubstr("position 1"));
  EXPECT_THAT(base64_decode("====").message(), HasSubstr("position 0"));
  EXPECT_THAT(base64_decode("Zm=v").message(), HasSubstr("position 2"));
}

}  // namespace
}  // namespace sy
