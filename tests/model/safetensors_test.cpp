// Safetensors reader/writer: every malformed-file case the reference implementation rejects is an
// error value naming the file and the tensor; the writer round-trips through the reader.
#include "model/safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>
#include "../test_seed.h"

namespace sy::model {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;

// 8-byte little-endian length, the header text, then data_bytes of data.
std::string file_bytes(std::string_view header, size_t data_bytes, char fill = '\0') {
  std::string out;
  uint64_t length = header.size();
  for (int i = 0; i < 8; ++i) out += static_cast<char>((length >> (8 * i)) & 0xff);
  out += header;
  out.append(data_bytes, fill);
  return out;
}

Result<SafetensorsFile> parse_bytes(const std::string& bytes, const std::string& name) {
  return SafetensorsFile::parse(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), name);
}

// With SY_DUMP_SAFETENSORS_CASES=dir set, every case is also written there, so the reference
// implementation can be run over exactly these bytes (scripts/golden/npy_safetensors.py).
void maybe_dump(const std::string& name, const std::string& bytes) {
  const char* dir = std::getenv("SY_DUMP_SAFETENSORS_CASES");
  if (dir == nullptr) return;
  std::ofstream(fs::path(dir) / (name + ".safetensors"), std::ios::binary) << bytes;
}

// Parses bytes that must be rejected; the message must name the file and contain each part.
std::string expect_rejected(const std::string& case_name, const std::string& bytes) {
  maybe_dump("bad_" + case_name, bytes);
  std::string file_name = "case/" + case_name + ".safetensors";
  auto result = parse_bytes(bytes, file_name);
  EXPECT_FALSE(result.is_ok()) << case_name << " was accepted";
  if (result.is_ok()) return "";
  EXPECT_THAT(result.message(), HasSubstr(file_name));
  return result.message();
}

SafetensorsFile expect_accepted(const std::string& case_name, const std::string& bytes) {
  maybe_dump("ok_" + case_name, bytes);
  auto result = parse_bytes(bytes, case_name);
  EXPECT_TRUE(result.is_ok()) << result.message();
  return std::move(result).value();
}

TEST(SafetensorsParse, ValidFileGivesTensorsMetadataAndData) {
  std::string header =
      R"({"__metadata__":{"format":"pt"},"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("a":{"dtype":"BF16","shape":[1,3],"data_offsets":[8,14]}})";
  std::string bytes = file_bytes(header, 14);
  for (int i = 0; i < 14; ++i) bytes[8 + header.size() + i] = static_cast<char>(i);
  auto file = expect_accepted("two_tensors", bytes);
  ASSERT_EQ(file.tensors().size(), 2u);
  EXPECT_EQ(file.tensors()[0].name, "a");  // sorted by name
  EXPECT_EQ(file.metadata().at("format"), "pt");
  const TensorInfo* a = file.find("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->dtype, DType::kBF16);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(a->numel(), 3);
  EXPECT_EQ(a->nbytes, 6u);
  EXPECT_EQ(a->data[0], 8);  // a's bytes start at offset 8 of the data section
  EXPECT_EQ(a->file, "two_tensors");
  EXPECT_EQ(file.find("b")->data[7], 7);
  EXPECT_EQ(file.find("c"), nullptr);
}

TEST(SafetensorsParse, AcceptsEmptyHeaderTrailingSpacesAndZeroSizedTensors) {
  EXPECT_TRUE(expect_accepted("empty", file_bytes("{}", 0)).tensors().empty());
  EXPECT_EQ(expect_accepted("padded", file_bytes(R"({"x":{"dtype":"U8","shape":[3],"data_offsets":[0,3]}})"
                                                 "       ",
                                                 3))
                .tensors()
                .size(),
            1u);
  auto file = expect_accepted(
      "zero_sized",
      file_bytes(R"({"e":{"dtype":"F32","shape":[0,4],"data_offsets":[0,0]},)"
                 R"("s":{"dtype":"F32","shape":[],"data_offsets":[0,4]}})",
                 4));
  EXPECT_EQ(file.find("e")->nbytes, 0u);
  EXPECT_EQ(file.find("s")->numel(), 1);  // a scalar
}

TEST(SafetensorsParse, KnowsEverySafetensorsDtype) {
  struct Case {
    const char* name;
    int64_t elements;
    size_t bytes;
  };
  for (Case c : {Case{"BOOL", 3, 3}, {"U8", 3, 3}, {"I8", 3, 3}, {"U16", 3, 6}, {"I16", 3, 6},
                 {"U32", 3, 12}, {"I32", 3, 12}, {"U64", 3, 24}, {"I64", 3, 24}, {"F16", 3, 6},
                 {"BF16", 3, 6}, {"F32", 3, 12}, {"F64", 3, 24}, {"C64", 3, 24}, {"F8_E4M3", 3, 3},
                 {"F8_E5M2", 3, 3}, {"F8_E8M0", 3, 3}, {"F8_E4M3FNUZ", 3, 3}, {"F8_E5M2FNUZ", 3, 3},
                 {"F4", 4, 2}, {"F6_E2M3", 4, 3}, {"F6_E3M2", 4, 3}}) {
    std::string header = fmt::format(R"({{"t":{{"dtype":"{}","shape":[{}],"data_offsets":[0,{}]}}}})",
                                     c.name, c.elements, c.bytes);
    auto file = expect_accepted(std::string("dtype_") + c.name, file_bytes(header, c.bytes));
    ASSERT_EQ(file.tensors().size(), 1u) << c.name;
    EXPECT_EQ(dtype_name(file.tensors()[0].dtype), c.name);
  }
  std::string odd_f4 = R"({"t":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}})";
  EXPECT_THAT(expect_rejected("f4_odd_count", file_bytes(odd_f4, 2)),
              AllOf(HasSubstr("'t'"), HasSubstr("whole number of bytes")));
}

TEST(SafetensorsParse, RejectsTruncatedLength) {
  EXPECT_THAT(expect_rejected("truncated_length", std::string("\x10\x00\x00", 3)),
              HasSubstr("too short for the 8-byte header length"));
  EXPECT_THAT(expect_rejected("empty_file", ""), HasSubstr("0 bytes"));
}

TEST(SafetensorsParse, RejectsHeaderLengthPastEndOfFile) {
  std::string bytes = file_bytes(R"({"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 1);
  bytes[0] = static_cast<char>(bytes[0] + 2);  // claims two bytes more than the file has
  EXPECT_THAT(expect_rejected("header_past_eof", bytes), HasSubstr("runs past the end of the file"));
}

TEST(SafetensorsParse, RejectsHugeHeaderLength) {
  for (uint64_t length : {uint64_t{100'000'001}, ~uint64_t{0}}) {
    std::string bytes(8, '\0');
    for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((length >> (8 * i)) & 0xff);
    bytes += "{}";
    EXPECT_THAT(expect_rejected(fmt::format("header_huge_{}", length), bytes),
                AllOf(HasSubstr(std::to_string(length)), HasSubstr("larger than the limit")));
  }
}

TEST(SafetensorsParse, RejectsOffsetsPastEndOfFile) {
  std::string header = R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})";
  std::string bytes = file_bytes(header, 16);
  bytes.resize(bytes.size() - 5);  // a download cut short
  EXPECT_THAT(expect_rejected("offsets_past_eof", bytes),
              AllOf(HasSubstr("tensor 'w'"), HasSubstr("run past the end of the data section")));
}

TEST(SafetensorsParse, RejectsOverlappingSpans) {
  std::string header = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                       R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})";
  EXPECT_THAT(expect_rejected("overlap", file_bytes(header, 12)),
              AllOf(HasSubstr("tensor 'b'"), HasSubstr("overlap tensor 'a'")));
  std::string same = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                     R"("b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  EXPECT_THAT(expect_rejected("same_span", file_bytes(same, 8)), HasSubstr("overlap"));
}

TEST(SafetensorsParse, RejectsHoles) {
  std::string gap = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                    R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})";
  EXPECT_THAT(expect_rejected("hole_between", file_bytes(gap, 12)),
              AllOf(HasSubstr("tensor 'b'"), HasSubstr("hole"), HasSubstr("[4, 8)")));
  std::string late = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})";
  EXPECT_THAT(expect_rejected("hole_at_start", file_bytes(late, 8)), HasSubstr("tensor 'a'"));
  std::string tail = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  EXPECT_THAT(expect_rejected("trailing_bytes", file_bytes(tail, 6)),
              HasSubstr("2 bytes belong to no tensor"));
}

TEST(SafetensorsParse, RejectsShapeByteMismatch) {
  std::string header = R"({"w":{"dtype":"BF16","shape":[3,3],"data_offsets":[0,16]}})";
  EXPECT_THAT(expect_rejected("shape_mismatch", file_bytes(header, 16)),
              AllOf(HasSubstr("tensor 'w'"), HasSubstr("span 16 bytes"), HasSubstr("needs 18 bytes")));
  std::string backwards = R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}})";
  EXPECT_THAT(expect_rejected("offsets_backwards", file_bytes(backwards, 4)),
              AllOf(HasSubstr("tensor 'w'"), HasSubstr("end before")));
}

TEST(SafetensorsParse, RejectsOverflowInShapeProduct) {
  // 2^32 * 2^32 wraps to 0 in 64 bits, which would "match" a 0-byte span without the check.
  std::string wraps = R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})";
  EXPECT_THAT(expect_rejected("shape_overflow", file_bytes(wraps, 0)),
              AllOf(HasSubstr("tensor 'w'"), HasSubstr("more elements than fit in 64 bits")));
  // Fits as a count, overflows once multiplied by 32 bits per element.
  std::string bytes_wrap = R"({"w":{"dtype":"F32","shape":[1152921504606846976],"data_offsets":[0,0]}})";
  EXPECT_THAT(expect_rejected("bytes_overflow", file_bytes(bytes_wrap, 0)),
              AllOf(HasSubstr("tensor 'w'"), HasSubstr("fit in 64 bits")));
  std::string too_big = R"({"w":{"dtype":"U8","shape":[18446744073709551615],"data_offsets":[0,0]}})";
  EXPECT_THAT(expect_rejected("dim_over_int64", file_bytes(too_big, 0)),
              AllOf(HasSubstr("tensor 'w'"), HasSubstr("shape[0]")));
}

TEST(SafetensorsParse, RejectsUnknownDtype) {
  std::string header = R"({"w":{"dtype":"Q4_K","shape":[1],"data_offsets":[0,1]}})";
  EXPECT_THAT(expect_rejected("unknown_dtype", file_bytes(header, 1)),
              AllOf(HasSubstr("tensor 'w'"), HasSubstr("unknown dtype \"Q4_K\""), HasSubstr("BF16")));
  std::string lower = R"({"w":{"dtype":"bf16","shape":[1],"data_offsets":[0,2]}})";
  EXPECT_THAT(expect_rejected("lowercase_dtype", file_bytes(lower, 2)), HasSubstr("\"bf16\""));
}

TEST(SafetensorsParse, RejectsDuplicateNames) {
  // nlohmann would silently keep the second entry; the file is ambiguous and must be refused.
  std::string header = R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                       R"("w":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})";
  EXPECT_THAT(expect_rejected("duplicate_tensor", file_bytes(header, 2)),
              AllOf(HasSubstr("duplicate key \"w\"")));
  std::string field = R"({"w":{"dtype":"U8","dtype":"I8","shape":[1],"data_offsets":[0,1]}})";
  EXPECT_THAT(expect_rejected("duplicate_field", file_bytes(field, 1)), HasSubstr("duplicate key \"dtype\""));
}

TEST(SafetensorsParse, RejectsMalformedAndNonUtf8Json) {
  EXPECT_THAT(expect_rejected("malformed_json",
                              file_bytes(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]})", 1)),
              HasSubstr("not valid JSON"));
  EXPECT_THAT(expect_rejected("trailing_garbage", file_bytes(R"({}x)", 0)), HasSubstr("not valid JSON"));
  EXPECT_THAT(expect_rejected("nul_padding", file_bytes(std::string("{}\0\0", 4), 0)),
              HasSubstr("not valid JSON"));
  std::string latin1 = "{\"w\xe9\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}";
  EXPECT_THAT(expect_rejected("latin1_name", file_bytes(latin1, 1)), HasSubstr("not valid UTF-8 (byte 3"));
  std::string overlong = "{\"\xc0\xaf\":{}}";  // overlong '/'
  EXPECT_THAT(expect_rejected("overlong_utf8", file_bytes(overlong, 0)), HasSubstr("UTF-8"));
  std::string surrogate = "{\"\xed\xa0\x80\":{}}";
  EXPECT_THAT(expect_rejected("surrogate_utf8", file_bytes(surrogate, 0)), HasSubstr("UTF-8"));
  std::string deep(2000, '[');
  EXPECT_THAT(expect_rejected("deep_nesting", file_bytes("{\"w\":" + deep, 0)), HasSubstr("not valid JSON"));
  // Valid UTF-8 names are fine.
  std::string utf8 = "{\"w\xc3\xa9\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}";
  EXPECT_NE(expect_accepted("utf8_name", file_bytes(utf8, 1)).find("w\xc3\xa9"), nullptr);
}

TEST(SafetensorsParse, RejectsNonObjectJson) {
  EXPECT_THAT(expect_rejected("array_header", file_bytes("[]", 0)), HasSubstr("must be a JSON object"));
  EXPECT_THAT(expect_rejected("string_header", file_bytes("\"x\"", 0)), HasSubstr("must be a JSON object"));
  EXPECT_THAT(expect_rejected("empty_header", file_bytes("", 0)), HasSubstr("not valid JSON"));
  // Like the reference (serde_json), leading whitespace before the object is fine.
  EXPECT_TRUE(parse_bytes(file_bytes("  {}", 0), "leading_spaces").is_ok());
  EXPECT_THAT(expect_rejected("tensor_not_object", file_bytes(R"({"w":[1,2]})", 0)),
              AllOf(HasSubstr("tensor 'w'"), HasSubstr("got array")));
  EXPECT_THAT(expect_rejected("metadata_not_strings", file_bytes(R"({"__metadata__":{"n":1}})", 0)),
              AllOf(HasSubstr("__metadata__ \"n\""), HasSubstr("must be a string")));
  EXPECT_THAT(expect_rejected("metadata_array", file_bytes(R"({"__metadata__":[]})", 0)),
              HasSubstr("__metadata__ must be an object"));
}

TEST(SafetensorsParse, RejectsMissingOrMistypedFields) {
  struct Case {
    const char* name;
    const char* entry;
    const char* expected;
  };
  for (Case c : {Case{"missing_dtype", R"({"shape":[1],"data_offsets":[0,1]})", "missing \"dtype\""},
                 {"missing_shape", R"({"dtype":"U8","data_offsets":[0,1]})", "missing \"shape\""},
                 {"missing_offsets", R"({"dtype":"U8","shape":[1]})", "missing \"data_offsets\""},
                 {"dtype_number", R"({"dtype":1,"shape":[1],"data_offsets":[0,1]})", "must be a string"},
                 {"shape_string", R"({"dtype":"U8","shape":"1","data_offsets":[0,1]})", "\"shape\" must be an array"},
                 {"shape_negative", R"({"dtype":"U8","shape":[-1],"data_offsets":[0,1]})", "shape[0] must be a non-negative integer, got -1"},
                 {"shape_float", R"({"dtype":"U8","shape":[1.0],"data_offsets":[0,1]})", "shape[0]"},
                 {"offsets_three", R"({"dtype":"U8","shape":[1],"data_offsets":[0,1,2]})", "must be [begin, end]"},
                 {"offsets_negative", R"({"dtype":"U8","shape":[1],"data_offsets":[-1,0]})", "non-negative integers"}}) {
    std::string header = fmt::format(R"({{"w":{}}})", c.entry);
    EXPECT_THAT(expect_rejected(c.name, file_bytes(header, 1)), AllOf(HasSubstr("tensor 'w'"), HasSubstr(c.expected)))
        << c.name;
  }
}

// A fresh folder under the test temp dir, removed at the end.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "sy_safetensors_XXXXXX").string();
    path_ = mkdtemp(pattern.data());
  }
  ~TempDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// Deterministic bytes per (seed, tensor name), so a reader can recompute what the writer wrote.
void fill_bytes(uint64_t seed, const TensorSpec& spec, uint8_t* out, size_t nbytes) {
  std::mt19937_64 rng(seed ^ std::hash<std::string>{}(spec.name));
  for (size_t i = 0; i < nbytes; ++i) out[i] = static_cast<uint8_t>(rng());
}

std::vector<TensorSpec> random_specs(std::mt19937_64& rng, int count) {
  std::vector<TensorSpec> specs;
  const DType dtypes[] = {DType::kBF16, DType::kF16, DType::kF32};
  for (int i = 0; i < count; ++i) {
    TensorSpec spec{fmt::format("model.layers.{}.w{}", i / 3, i % 3), dtypes[rng() % 3], {}};
    int rank = static_cast<int>(rng() % 4);
    for (int axis = 0; axis < rank; ++axis) spec.shape.push_back(static_cast<int64_t>(rng() % 37));
    specs.push_back(spec);
  }
  return specs;
}

void expect_round_trip(const Checkpoint& checkpoint, const std::vector<TensorSpec>& specs, uint64_t seed) {
  ASSERT_EQ(checkpoint.tensors().size(), specs.size());
  uint64_t total = 0;
  for (const auto& spec : specs) {
    const TensorInfo* tensor = checkpoint.find(spec.name);
    ASSERT_NE(tensor, nullptr) << spec.name;
    EXPECT_EQ(tensor->dtype, spec.dtype);
    EXPECT_EQ(tensor->shape, spec.shape);
    std::vector<uint8_t> expected(static_cast<size_t>(tensor->numel()) * dtype_size(spec.dtype));
    fill_bytes(seed, spec, expected.data(), expected.size());
    ASSERT_EQ(tensor->nbytes, expected.size()) << spec.name;
    if (!expected.empty())  // empty tensors: no bytes to compare (memcmp on null is UB)
      EXPECT_EQ(std::memcmp(tensor->data, expected.data(), expected.size()), 0) << spec.name;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(tensor->data) % dtype_size(spec.dtype), 0u)
        << spec.name << " is not aligned to its element size";
    total += expected.size();
  }
  EXPECT_EQ(checkpoint.total_bytes(), total);
  for (size_t i = 1; i < checkpoint.tensors().size(); ++i)
    EXPECT_LT(checkpoint.tensors()[i - 1].name, checkpoint.tensors()[i].name);
}

TEST(SafetensorsWriter, SingleFileRoundTrip) {
  const uint64_t seed = test::test_seed();
  SY_SEED_TRACE(seed);
  std::mt19937_64 rng(seed);
  auto specs = random_specs(rng, 20);
  TempDir dir;
  auto fill = [&](const TensorSpec& spec, uint8_t* out, size_t n) { fill_bytes(seed, spec, out, n); };
  ASSERT_TRUE(write_checkpoint(dir.path().string(), specs, fill, 0, {{"format", "pt"}, {"k", "v"}}).is_ok());
  auto checkpoint = Checkpoint::open(dir.path().string());
  ASSERT_TRUE(checkpoint.is_ok()) << checkpoint.message();
  EXPECT_EQ(checkpoint->files(), std::vector<std::string>{dir / "model.safetensors"});
  expect_round_trip(*checkpoint, specs, seed);
  auto file = SafetensorsFile::open(dir / "model.safetensors");
  ASSERT_TRUE(file.is_ok());
  EXPECT_EQ(file->metadata().at("k"), "v");
  EXPECT_EQ(file->header_bytes() % 8, 0u);
  EXPECT_FALSE(fs::exists(dir / "model.safetensors.tmp"));
}

TEST(SafetensorsWriter, ShardedRoundTrip) {
  const uint64_t seed = test::test_seed();
  SY_SEED_TRACE(seed);
  std::mt19937_64 rng(seed);
  auto specs = random_specs(rng, 30);
  specs.push_back({"big", DType::kF32, {40, 40}});  // larger than a shard: gets one of its own
  TempDir dir;
  auto fill = [&](const TensorSpec& spec, uint8_t* out, size_t n) { fill_bytes(seed, spec, out, n); };
  const uint64_t shard_bytes = 4096;
  ASSERT_TRUE(write_checkpoint(dir.path().string(), specs, fill, shard_bytes).is_ok());
  auto checkpoint = Checkpoint::open(dir.path().string());
  ASSERT_TRUE(checkpoint.is_ok()) << checkpoint.message();
  expect_round_trip(*checkpoint, specs, seed);
  auto files = checkpoint->files();
  ASSERT_GE(files.size(), 2u);
  EXPECT_EQ(fs::path(files[0]).filename(), fmt::format("model-00001-of-{:05d}.safetensors", files.size()));
  for (const auto& path : files) {
    auto shard = SafetensorsFile::open(path);
    ASSERT_TRUE(shard.is_ok()) << shard.message();
    uint64_t bytes = 0;
    for (const auto& tensor : shard->tensors()) bytes += tensor.nbytes;
    EXPECT_TRUE(bytes <= shard_bytes || shard->tensors().size() == 1) << path << " holds " << bytes;
  }
  auto index = nlohmann::json::parse(std::ifstream(dir / "model.safetensors.index.json"));
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), checkpoint->total_bytes());
  EXPECT_EQ(index["weight_map"].size(), specs.size());
  EXPECT_EQ(index["weight_map"]["big"].get<std::string>(),
            fs::path(checkpoint->find("big")->file).filename().string());
}

TEST(SafetensorsWriter, ReplacesTheOtherLayout) {
  TempDir dir;
  std::vector<TensorSpec> specs = {{"a", DType::kF32, {2}}, {"b", DType::kF32, {2}}};
  auto fill = [](const TensorSpec&, uint8_t* out, size_t n) { std::memset(out, 1, n); };
  ASSERT_TRUE(write_checkpoint(dir.path().string(), specs, fill).is_ok());
  ASSERT_TRUE(write_checkpoint(dir.path().string(), specs, fill, 8).is_ok());
  EXPECT_FALSE(fs::exists(dir / "model.safetensors"));  // it would shadow the new index
  auto checkpoint = Checkpoint::open(dir.path().string());
  ASSERT_TRUE(checkpoint.is_ok()) << checkpoint.message();
  EXPECT_EQ(checkpoint->files().size(), 2u);
}

TEST(SafetensorsWriter, RejectsBadSpecs) {
  TempDir dir;
  auto fill = [](const TensorSpec&, uint8_t*, size_t) {};
  auto twice = write_checkpoint(dir.path().string(), {{"a", DType::kF32, {1}}, {"a", DType::kF32, {1}}}, fill);
  EXPECT_THAT(twice.message(), HasSubstr("tensor 'a' is listed twice"));
  auto negative = write_checkpoint(dir.path().string(), {{"n", DType::kF32, {-1}}}, fill);
  EXPECT_THAT(negative.message(), AllOf(HasSubstr("tensor 'n'"), HasSubstr("negative")));
}

TEST(Checkpoint, RejectsUnsupportedDtypeNamingFileAndTensor) {
  TempDir dir;
  auto fill = [](const TensorSpec&, uint8_t* out, size_t n) { std::memset(out, 0, n); };
  ASSERT_TRUE(write_checkpoint(dir.path().string(), {{"ok", DType::kBF16, {2}}, {"q", DType::kI8, {4}}}, fill).is_ok());
  auto checkpoint = Checkpoint::open(dir.path().string());
  ASSERT_FALSE(checkpoint.is_ok());
  EXPECT_EQ(checkpoint.status().code(), ErrorCode::kUnsupported);
  EXPECT_THAT(checkpoint.message(),
              AllOf(HasSubstr(dir / "model.safetensors"), HasSubstr("tensor 'q'"),
                    HasSubstr("dtype I8 is not supported yet (supported: BF16, F16, F32, U8, F8_E4M3)")));
  // The file itself is valid: SafetensorsFile reads any dtype.
  EXPECT_TRUE(SafetensorsFile::open(dir / "model.safetensors").is_ok());
}

TEST(Checkpoint, RejectsMissingFolderOrFiles) {
  TempDir dir;
  auto empty = Checkpoint::open(dir.path().string());
  EXPECT_EQ(empty.status().code(), ErrorCode::kNotFound);
  EXPECT_THAT(empty.message(), AllOf(HasSubstr(dir.path().string()), HasSubstr("no model.safetensors")));
  EXPECT_THAT(Checkpoint::open(dir / "absent").message(), HasSubstr(dir / "absent"));
}

// A folder with shards written as raw bytes, and an index written as given.
class ShardedFolder : public ::testing::Test {
 protected:
  void shard(const std::string& name, const std::vector<std::string>& tensors) {
    std::string header = "{";
    for (size_t i = 0; i < tensors.size(); ++i)
      header += fmt::format(R"({}"{}":{{"dtype":"F32","shape":[1],"data_offsets":[{},{}]}})", i ? "," : "",
                            tensors[i], 4 * i, 4 * i + 4);
    header += "}";
    write_text(dir_ / name, file_bytes(header, 4 * tensors.size()));
  }
  void index(const std::string& weight_map) {
    write_text(dir_ / "model.safetensors.index.json",
               R"({"metadata":{"total_size":0},"weight_map":)" + weight_map + "}");
  }
  Result<Checkpoint> open() { return Checkpoint::open(dir_.path().string()); }
  TempDir dir_;
};

TEST_F(ShardedFolder, Opens) {
  shard("s1.safetensors", {"a", "b"});
  shard("s2.safetensors", {"c"});
  index(R"({"a":"s1.safetensors","b":"s1.safetensors","c":"s2.safetensors"})");
  auto checkpoint = open();
  ASSERT_TRUE(checkpoint.is_ok()) << checkpoint.message();
  EXPECT_EQ(checkpoint->tensors().size(), 3u);
  EXPECT_EQ(checkpoint->find("c")->file, dir_ / "s2.safetensors");
}

TEST_F(ShardedFolder, RejectsMissingShard) {
  shard("s1.safetensors", {"a"});
  index(R"({"a":"s1.safetensors","b":"gone.safetensors"})");
  EXPECT_THAT(open().message(),
              AllOf(HasSubstr(dir_ / "gone.safetensors"), HasSubstr("cannot open"), HasSubstr("tensor 'b'"),
                    HasSubstr("model.safetensors.index.json")));
}

TEST_F(ShardedFolder, RejectsTensorInTwoShards) {
  shard("s1.safetensors", {"a", "b"});
  shard("s2.safetensors", {"b"});
  index(R"({"a":"s1.safetensors","b":"s2.safetensors"})");
  EXPECT_THAT(open().message(), AllOf(HasSubstr("tensor 'b' is in two shards"), HasSubstr(dir_ / "s1.safetensors"),
                                      HasSubstr(dir_ / "s2.safetensors")));
}

TEST_F(ShardedFolder, RejectsIndexNamingTensorAbsentFromItsShard) {
  shard("s1.safetensors", {"a"});
  shard("s2.safetensors", {"b"});
  index(R"({"a":"s1.safetensors","b":"s1.safetensors"})");
  EXPECT_THAT(open().message(), AllOf(HasSubstr(dir_ / "s1.safetensors"), HasSubstr("tensor 'b' is not in this shard")));
}

TEST_F(ShardedFolder, RejectsShardNamesOutsideTheFolder) {
  fs::create_directories(dir_.path() / "sub");
  shard("sub/s.safetensors", {"a"});
  shard("s1.safetensors", {"a"});
  for (std::string name : {"../s1.safetensors", "sub/s.safetensors", "/etc/passwd", "..", ".", "",
                           "sub\\\\s.safetensors"}) {
    index(fmt::format(R"({{"a":"{}"}})", name));
    auto result = open();
    EXPECT_FALSE(result.is_ok()) << name;
    EXPECT_THAT(result.message(), AllOf(HasSubstr("model.safetensors.index.json"), HasSubstr("\"a\""),
                                        HasSubstr("not a plain file name")))
        << name;
  }
}

TEST_F(ShardedFolder, RejectsMalformedIndex) {
  shard("s1.safetensors", {"a"});
  index(R"({"a":"s1.safetensors","a":"s1.safetensors"})");
  EXPECT_THAT(open().message(), AllOf(HasSubstr("model.safetensors.index.json"), HasSubstr("duplicate key \"a\"")));
  index(R"({"a":1})");
  EXPECT_THAT(open().message(), HasSubstr("weight_map \"a\" must be a shard file name"));
  index(R"({})");
  EXPECT_THAT(open().message(), HasSubstr("lists no tensors"));
  write_text(dir_ / "model.safetensors.index.json", "{\"weight_map\": ");
  EXPECT_THAT(open().message(), HasSubstr("not valid JSON"));
  write_text(dir_ / "model.safetensors.index.json", "{}");
  EXPECT_THAT(open().message(), HasSubstr("missing \"weight_map\""));
}

TEST_F(ShardedFolder, ReportsBadShardByPath) {
  write_text(dir_ / "s1.safetensors", file_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 4));
  index(R"({"a":"s1.safetensors"})");
  EXPECT_THAT(open().message(), AllOf(HasSubstr(dir_ / "s1.safetensors"), HasSubstr("tensor 'a'"), HasSubstr("needs 8 bytes")));
}

// --- checks against the reference implementation (huggingface safetensors, torch, transformers) --
// Goldens in tests/model/safetensors_golden were made by tests/util/golden/make_goldens.py.

uint64_t fnv1a64(const uint8_t* data, size_t size) {
  uint64_t hash = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < size; ++i) hash = (hash ^ data[i]) * 0x100000001b3ull;
  return hash;
}

fs::path golden_dir() { return fs::path(SY_SOURCE_DIR) / "tests/model/safetensors_golden"; }

nlohmann::json read_golden(const fs::path& path) {
  std::ifstream in(path);
  if (!in) ADD_FAILURE() << path << " is missing; regenerate with tests/util/golden/make_goldens.py";
  return in ? nlohmann::json::parse(in) : nlohmann::json::object();
}

void expect_tensor_matches(const TensorInfo* tensor, const nlohmann::json& expected, const std::string& name) {
  ASSERT_NE(tensor, nullptr) << name;
  EXPECT_EQ(dtype_name(tensor->dtype), expected["dtype"].get<std::string>()) << name;
  EXPECT_EQ(tensor->shape, expected["shape"].get<std::vector<int64_t>>()) << name;
  EXPECT_EQ(tensor->nbytes, expected["nbytes"].get<size_t>()) << name;
  EXPECT_EQ(fnv1a64(tensor->data, tensor->nbytes), expected["fnv1a64"].get<uint64_t>()) << name;
  if (expected.contains("file")) {
    EXPECT_EQ(fs::path(tensor->file).filename(), expected["file"].get<std::string>()) << name;
  }
}

TEST(SafetensorsGolden, ReadsAFileSafetensorsWrote) {
  auto manifest = read_golden(golden_dir() / "hf_single/manifest.json");
  std::string path = (golden_dir() / "hf_single/model.safetensors").string();
  auto file = SafetensorsFile::open(path);
  ASSERT_TRUE(file.is_ok()) << file.message();
  ASSERT_EQ(file->tensors().size(), manifest["tensors"].size());
  for (const auto& [name, expected] : manifest["tensors"].items()) expect_tensor_matches(file->find(name), expected, name);
  EXPECT_EQ(nlohmann::json(file->metadata()), manifest["metadata"]);
  // It holds I32/I8/BOOL tensors, which a model checkpoint may not (yet).
  EXPECT_THAT(Checkpoint::open(path).message(), AllOf(HasSubstr(path), HasSubstr("not supported yet")));
}

TEST(SafetensorsGolden, OpensACheckpointTransformersSharded) {
  auto manifest = read_golden(golden_dir() / "hf_sharded/manifest.json");
  auto checkpoint = Checkpoint::open((golden_dir() / "hf_sharded").string());
  ASSERT_TRUE(checkpoint.is_ok()) << checkpoint.message();
  EXPECT_GE(checkpoint->files().size(), 2u);
  ASSERT_EQ(checkpoint->tensors().size(), manifest["tensors"].size());
  for (const auto& [name, expected] : manifest["tensors"].items()) expect_tensor_matches(checkpoint->find(name), expected, name);
  auto index = read_golden(golden_dir() / "hf_sharded/model.safetensors.index.json");
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), checkpoint->total_bytes());
}

// Fixed contents for the checkpoints the reference reads back (hf_read_sy.json).
std::vector<TensorSpec> specs_for_reference() {
  return {{"model.embed_tokens.weight", DType::kBF16, {8, 4}}, {"model.norm.weight", DType::kF16, {5}},
          {"model.layers.0.mlp.gate.weight", DType::kF32, {3, 4}}, {"scalar", DType::kF32, {}},
          {"empty", DType::kBF16, {0, 3}}, {"lm_head.weight", DType::kBF16, {8, 4}},
          {"model.layers.0.q", DType::kI8, {7}}, {"model.layers.0.ids", DType::kI32, {2, 3}},
          {"f64", DType::kF64, {2}}};
}
void fill_for_reference(const TensorSpec& spec, uint8_t* out, size_t nbytes) {
  for (size_t i = 0; i < nbytes; ++i) out[i] = static_cast<uint8_t>(i * 31 + spec.name.size() * 7 + 1);
}

TEST(SafetensorsGolden, ReferenceReadWhatWeWrote) {
  auto dir = golden_dir() / "sy_written";
  const std::map<std::string, uint64_t> layouts = {{"single", 0}, {"sharded", 100}};
  std::map<std::string, std::string> metadata = {{"format", "pt"}, {"writer", "switchyard"}};
  if (std::getenv("SY_WRITE_SAFETENSORS_FOR_HF")) {
    for (const auto& [layout, shard_bytes] : layouts) {
      fs::remove_all(dir / layout);
      ASSERT_TRUE(write_checkpoint((dir / layout).string(), specs_for_reference(), fill_for_reference, shard_bytes,
                                   metadata));
    }
  }
  auto report = read_golden(golden_dir() / "hf_read_sy.json");
  for (const auto& [layout, shard_bytes] : layouts) {
    SCOPED_TRACE(layout);
    const auto& seen = report["layouts"][layout];
    ASSERT_EQ(seen["tensors"].size(), specs_for_reference().size());
    // Today's writer makes byte-identical files to the ones the reference read.
    TempDir fresh;
    ASSERT_TRUE(write_checkpoint(fresh.path().string(), specs_for_reference(), fill_for_reference, shard_bytes, metadata));
    size_t compared = 0;
    for (const auto& entry : fs::directory_iterator(dir / layout)) {
      auto name = entry.path().filename().string();
      std::ifstream committed(entry.path(), std::ios::binary), rewritten(fresh / name, std::ios::binary);
      std::string a((std::istreambuf_iterator<char>(committed)), {}), b((std::istreambuf_iterator<char>(rewritten)), {});
      EXPECT_EQ(a, b) << name << " differs from what the writer makes today";
      ++compared;
    }
    EXPECT_GE(compared, 1u);
    // And what the reference saw is what we meant.
    for (const auto& spec : specs_for_reference()) {
      const auto& tensor = seen["tensors"][spec.name];
      ASSERT_TRUE(tensor.is_object()) << spec.name;
      EXPECT_EQ(tensor["dtype"].get<std::string>(), dtype_name(spec.dtype)) << spec.name;
      EXPECT_EQ(tensor["shape"].get<std::vector<int64_t>>(), spec.shape) << spec.name;
      std::vector<uint8_t> bytes(tensor["nbytes"].get<size_t>());
      fill_for_reference(spec, bytes.data(), bytes.size());
      EXPECT_EQ(tensor["fnv1a64"].get<uint64_t>(), fnv1a64(bytes.data(), bytes.size())) << spec.name;
      if (layout == "sharded") {
        EXPECT_EQ(seen["index"]["weight_map"][spec.name], tensor["file"]) << spec.name;
      }
    }
    for (const auto& [file, file_metadata] : seen["metadata"].items())
      EXPECT_EQ(file_metadata, nlohmann::json(metadata)) << file;
  }
}

// Where we deliberately differ from the reference, and why.
const std::map<std::string, std::string> kKnownDivergences = {};

TEST(SafetensorsGolden, AgreesWithTheReferenceOnEveryCorpusCase) {
  auto verdicts = read_golden(golden_dir() / "reference_verdicts.json");
  ASSERT_FALSE(verdicts["cases"].empty());
  auto corpus = fs::path(SY_SOURCE_DIR) / "fuzz/corpus/safetensors";
  for (const auto& [name, verdict] : verdicts["cases"].items()) {
    std::ifstream in(corpus / name, std::ios::binary);
    ASSERT_TRUE(in) << corpus / name;
    std::string bytes((std::istreambuf_iterator<char>(in)), {});
    auto ours = parse_bytes(bytes, name);
    bool reference_accepted = verdict["accepted"].get<bool>();
    if (kKnownDivergences.count(name)) {
      EXPECT_NE(ours.is_ok(), reference_accepted) << name << ": divergence gone? " << kKnownDivergences.at(name);
      continue;
    }
    EXPECT_EQ(ours.is_ok(), reference_accepted)
        << name << ": reference " << verdict.dump() << "; ours: " << (ours.is_ok() ? "accepted" : ours.message());
  }
}

}  // namespace
}  // namespace sy::model
