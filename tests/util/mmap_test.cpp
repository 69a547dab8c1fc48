// MappedFile: maps whole files read-only; errors name the path; moves hand over the mapping.
#include "util/mmap.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include "../test_seed.h"

namespace sy {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

fs::path temp_path(const std::string& stem) {
  return fs::temp_directory_path() / (stem + std::to_string(std::random_device{}()));
}

TEST(MappedFile, MapsTheFileContents) {
  auto path = temp_path("sy_mmap_");
  std::string content(10000, '\0');
  const uint64_t seed = test::test_seed();
  SY_SEED_TRACE(seed);
  std::mt19937_64 rng(seed);
  for (auto& c : content) c = static_cast<char>(rng());
  std::ofstream(path, std::ios::binary) << content;
  auto file = MappedFile::open(path.string());
  ASSERT_TRUE(file.is_ok()) << file.message();
  ASSERT_EQ(file->size(), content.size());
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(file->data()), file->size()), content);

  MappedFile moved = std::move(file).value();
  EXPECT_EQ(moved.size(), content.size());
  MappedFile assigned;
  assigned = std::move(moved);
  EXPECT_EQ(moved.data(), nullptr);  // NOLINT: checking the moved-from state on purpose
  EXPECT_EQ(assigned.data()[0], static_cast<uint8_t>(content[0]));
  fs::remove(path);
  EXPECT_EQ(assigned.data()[9999], static_cast<uint8_t>(content[9999]));  // the map outlives the name
}

TEST(MappedFile, EmptyFileIsValid) {
  auto path = temp_path("sy_mmap_empty_");
  std::ofstream(path, std::ios::binary).close();
  auto file = MappedFile::open(path.string());
  ASSERT_TRUE(file.is_ok()) << file.message();
  EXPECT_EQ(file->size(), 0u);
  fs::remove(path);
}

TEST(MappedFile, ErrorsNameThePath) {
  auto missing = temp_path("sy_mmap_missing_").string();
  auto result = MappedFile::open(missing);
  EXPECT_EQ(result.status().code(), ErrorCode::kNotFound);
  EXPECT_THAT(result.message(), HasSubstr(missing + ": cannot open"));
  auto dir = fs::temp_directory_path().string();
  EXPECT_THAT(MappedFile::open(dir).message(), HasSubstr(dir));
}

}  // namespace
}  // namespace sy
