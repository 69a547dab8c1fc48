// .npy: round trips of fresh random arrays, exact header layout, strict decoding errors, and two
// checks against numpy itself (tests/util/golden, made by tests/util/golden/make_goldens.py on a
// machine with numpy): files numpy wrote decode to numpy's values, and files we wrote are what
// numpy read back.
#include "util/npy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>
#include "../test_seed.h"

namespace sy {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

const DType kNpyDTypes[] = {DType::kU8,  DType::kI8,  DType::kU16, DType::kI16, DType::kU32, DType::kI32,
                            DType::kU64, DType::kI64, DType::kF16, DType::kF32, DType::kF64, DType::kBool};

TEST(Npy, RoundTripsRandomArrays) {
  const uint64_t seed = test::test_seed();
  SY_SEED_TRACE(seed);
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 200; ++trial) {
    DType dtype = kNpyDTypes[rng() % std::size(kNpyDTypes)];
    std::vector<int64_t> shape(rng() % 5);
    for (auto& dim : shape) dim = static_cast<int64_t>(rng() % 6);  // includes 0-row arrays
    int64_t numel = 1;
    for (auto dim : shape) numel *= dim;
    std::vector<uint8_t> data(static_cast<size_t>(numel) * dtype_size(dtype));
    for (auto& byte : data) byte = static_cast<uint8_t>(dtype == DType::kBool ? rng() % 2 : rng());
    std::string bytes = npy_encode(dtype, shape, data.data());
    EXPECT_EQ((bytes.size() - data.size()) % 64, 0u) << "data must start 64-byte aligned";
    auto decoded = npy_decode(bytes);
    ASSERT_TRUE(decoded.is_ok()) << decoded.message();
    EXPECT_EQ(decoded->dtype, dtype);
    EXPECT_EQ(decoded->shape, shape);
    EXPECT_EQ(decoded->data, data);
    EXPECT_EQ(decoded->numel(), numel);
  }
}

TEST(Npy, WritesNumpysHeaderLayout) {
  uint8_t data[32] = {1, 2, 3, 4, 5, 6};
  std::string bytes = npy_encode(DType::kU8, {2, 3}, data);
  std::string header = "{'descr': '|u1', 'fortran_order': False, 'shape': (2, 3), }";
  header.append(128 - 10 - header.size() - 1, ' ');  // numpy pads magic+length+header to 64 bytes
  header += '\n';
  ASSERT_EQ(header.size(), 118u);
  std::string expected = std::string("\x93NUMPY\x01\x00", 8) + static_cast<char>(header.size()) + '\0' + header +
                         std::string(reinterpret_cast<char*>(data), 6);
  EXPECT_EQ(bytes, expected);
  EXPECT_THAT(npy_encode(DType::kI32, {5}, data), HasSubstr("'descr': '<i4', 'fortran_order': False, 'shape': (5,), }"));
  EXPECT_THAT(npy_encode(DType::kF32, {}, data), HasSubstr("'shape': (), }"));
}

TEST(Npy, ReadsVersion2And3Headers) {
  uint16_t data[2] = {7, 65535};
  std::string v1 = npy_encode(DType::kU16, {2}, data);
  size_t header_bytes = static_cast<uint8_t>(v1[8]) | static_cast<uint8_t>(v1[9]) << 8;
  for (char major : {'\x02', '\x03'}) {
    std::string v2 = std::string("\x93NUMPY", 6) + major + '\0';
    for (int i = 0; i < 4; ++i) v2 += static_cast<char>((header_bytes >> (8 * i)) & 0xff);
    v2 += v1.substr(10);
    auto decoded = npy_decode(v2);
    ASSERT_TRUE(decoded.is_ok()) << decoded.message();
    EXPECT_EQ(*npy_to_int64(*decoded), (std::vector<int64_t>{7, 65535}));
  }
}

// Replaces the header dict of a valid file (keeping the length field consistent).
std::string with_header(std::string dict, size_t data_bytes) {
  dict += '\n';
  std::string out = std::string("\x93NUMPY\x01\x00", 8);
  out += static_cast<char>(dict.size() & 0xff);
  out += static_cast<char>(dict.size() >> 8);
  return out + dict + std::string(data_bytes, '\0');
}

TEST(Npy, RejectsMalformedFiles) {
  auto error = [](const std::string& bytes) {
    auto result = npy_decode(bytes);
    EXPECT_FALSE(result.is_ok());
    return result.is_ok() ? std::string() : result.message();
  };
  const std::string ok = "{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }";
  ASSERT_TRUE(npy_decode(with_header(ok, 8)).is_ok());
  EXPECT_THAT(error(""), HasSubstr("not a .npy file"));
  EXPECT_THAT(error("PK\x03\x04 a zip archive"), HasSubstr("not a .npy file"));
  std::string v4 = with_header(ok, 8);
  v4[6] = 4;
  EXPECT_THAT(error(v4), HasSubstr("version 4.0 is not supported"));
  EXPECT_THAT(error(with_header(ok, 8).substr(0, 30)), HasSubstr("runs past the end"));
  EXPECT_THAT(error(with_header(ok, 7)), HasSubstr("needs 2 elements of 4 bytes but only 7 data bytes"));
  EXPECT_THAT(error(with_header(ok, 9)), HasSubstr("1 bytes follow the data"));
  EXPECT_THAT(error(with_header("{'descr': '<i4', 'fortran_order': True, 'shape': (2,), }", 8)),
              HasSubstr("fortran_order True is not supported"));
  EXPECT_THAT(error(with_header("{'descr': '>i4', 'fortran_order': False, 'shape': (2,), }", 8)),
              HasSubstr("big-endian dtype '>i4'"));
  EXPECT_THAT(error(with_header("{'descr': '<c8', 'fortran_order': False, 'shape': (1,), }", 8)),
              HasSubstr("dtype '<c8' is not supported (supported: |b1 |u1"));
  EXPECT_THAT(error(with_header("{'descr': '|u2', 'fortran_order': False, 'shape': (1,), }", 2)),
              HasSubstr("'|u2'"));
  EXPECT_THAT(error(with_header("{'descr': [('a', '<i4')], 'fortran_order': False, 'shape': (1,), }", 4)),
              HasSubstr("structured dtypes"));
  EXPECT_THAT(error(with_header("{'descr': '<i4', 'shape': (2,), }", 8)), HasSubstr("no 'fortran_order'"));
  EXPECT_THAT(error(with_header("{'descr': '<i4', 'fortran_order': False, 'shape': (2,), 'x': 1}", 8)),
              HasSubstr("unexpected key 'x'"));
  EXPECT_THAT(error(with_header("{'descr': '<i4', 'descr': '<i4', 'fortran_order': False, 'shape': (2,)}", 8)),
              HasSubstr("duplicate key 'descr'"));
  EXPECT_THAT(error(with_header("{'descr': '<i4', 'fortran_order': False, 'shape': (2), }", 8)),
              HasSubstr("needs a trailing comma"));
  EXPECT_THAT(error(with_header("{'descr': '<i4', 'fortran_order': False, 'shape': (-2,), }", 8)),
              HasSubstr("non-negative integer"));
  EXPECT_THAT(error(with_header("{'descr': '<i4', 'fortran_order': False, 'shape': (4294967296, 4294967296), }", 0)),
              HasSubstr("more elements than fit in 64 bits"));
  EXPECT_THAT(error(with_header("{'descr': '<i4', 'fortran_order': False, 'shape': (99999999999999999999,), }", 0)),
              HasSubstr("too large"));
  EXPECT_THAT(error(with_header("{'descr': '<i4', 'fortran_order': False, 'shape': (2,), } x", 8)),
              HasSubstr("unexpected text after"));
  EXPECT_THAT(error(with_header("{'descr': '<i4\xc3\xa9', 'fortran_order': False, 'shape': (2,), }", 8)),
              HasSubstr("must be ASCII"));
  EXPECT_THAT(error(with_header("{'descr': '<i4", 8)), HasSubstr("unterminated string"));
}

TEST(Npy, ConvertsIntegerArraysToInt64) {
  int16_t values[3] = {-5, 0, 32767};
  auto array = npy_decode(npy_encode(DType::kI16, {3}, values));
  ASSERT_TRUE(array.is_ok());
  EXPECT_EQ(*npy_to_int64(*array), (std::vector<int64_t>{-5, 0, 32767}));
  uint64_t big[1] = {uint64_t{1} << 63};
  EXPECT_THAT(npy_to_int64(*npy_decode(npy_encode(DType::kU64, {1}, big))).message(),
              HasSubstr("larger than int64"));
  float floats[1] = {1.0f};
  EXPECT_THAT(npy_to_int64(*npy_decode(npy_encode(DType::kF32, {1}, floats))).message(),
              HasSubstr("expected an integer array, got dtype F32"));
}

TEST(Npy, FilesRoundTripAndErrorsNameThePath) {
  auto path = (fs::temp_directory_path() / ("sy_npy_" + std::to_string(std::random_device{}()) + ".npy")).string();
  int32_t values[4] = {1, -2, 3, -4};
  ASSERT_TRUE(npy_write_file(path, DType::kI32, {2, 2}, values).is_ok());
  auto array = npy_read_file(path);
  ASSERT_TRUE(array.is_ok()) << array.message();
  EXPECT_EQ(*npy_to_int64(*array), (std::vector<int64_t>{1, -2, 3, -4}));
  std::ofstream(path, std::ios::binary) << "junk";
  EXPECT_THAT(npy_read_file(path).message(), HasSubstr(path + ": npy: not a .npy file"));
  fs::remove(path);
  EXPECT_THAT(npy_read_file(path).message(), HasSubstr(path));
  EXPECT_THAT(npy_write_file(path, DType::kBF16, {1}, values).message(), HasSubstr("BF16 has no .npy equivalent"));
}

// --- checks against numpy --------------------------------------------------------------------

uint64_t fnv1a64(const void* data, size_t size) {
  uint64_t hash = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < size; ++i) hash = (hash ^ static_cast<const uint8_t*>(data)[i]) * 0x100000001b3ull;
  return hash;
}

double element_as_double(const NpyArray& array, size_t i) {
  const uint8_t* p = array.data.data() + i * dtype_size(array.dtype);
  auto load = [p]<typename T>(T) {
    T value;
    std::memcpy(&value, p, sizeof value);
    return static_cast<double>(value);
  };
  switch (array.dtype) {
    case DType::kF16: return f16_to_f32(static_cast<uint16_t>(load(uint16_t{})));
    case DType::kF32: return load(float{});
    case DType::kF64: return load(double{});
    default: return static_cast<double>(npy_to_int64(array).value()[i]);
  }
}

// Compares the decoded elements with numpy's tolist() values (bools as true/false).
void expect_values(const NpyArray& array, const nlohmann::json& values, const std::string& what) {
  ASSERT_EQ(static_cast<int64_t>(values.size()), array.numel()) << what;
  bool integer = array.dtype != DType::kF16 && array.dtype != DType::kF32 && array.dtype != DType::kF64;
  // uint64 values above int64's range are compared as uint64 below.
  auto ints = integer && array.dtype != DType::kU64 ? npy_to_int64(array).value() : std::vector<int64_t>{};
  for (size_t i = 0; i < values.size(); ++i) {
    if (values[i].is_boolean()) {
      EXPECT_EQ(ints[i], values[i].get<bool>() ? 1 : 0) << what << " element " << i;
    } else if (array.dtype == DType::kU64) {
      uint64_t mine;
      std::memcpy(&mine, array.data.data() + 8 * i, 8);
      EXPECT_EQ(mine, values[i].get<uint64_t>()) << what << " element " << i;
    } else if (integer) {
      EXPECT_EQ(ints[i], values[i].get<int64_t>()) << what << " element " << i;
    } else {
      EXPECT_EQ(element_as_double(array, i), values[i].get<double>()) << what << " element " << i;
    }
  }
}

fs::path golden_dir() { return fs::path(SY_SOURCE_DIR) / "tests/util/golden"; }

nlohmann::json read_json(const fs::path& path) {
  std::ifstream in(path);
  if (!in) ADD_FAILURE() << path << " is missing; regenerate with tests/util/golden/make_goldens.py";
  return in ? nlohmann::json::parse(in) : nlohmann::json::object();
}

TEST(NpyGolden, DecodesFilesNumpyWrote) {
  auto manifest = read_json(golden_dir() / "numpy/manifest.json");
  ASSERT_FALSE(manifest["files"].empty());
  for (const auto& [name, entry] : manifest["files"].items()) {
    auto array = npy_read_file((golden_dir() / "numpy" / name).string());
    if (entry["expect"] == "reject") {
      EXPECT_FALSE(array.is_ok()) << name << " (" << entry["why"] << ") was accepted";
      continue;
    }
    ASSERT_TRUE(array.is_ok()) << name << ": " << array.message();
    EXPECT_EQ(array->shape, entry["shape"].get<std::vector<int64_t>>()) << name;
    EXPECT_EQ(dtype_name(array->dtype), entry["sy_dtype"].get<std::string>()) << name;
    expect_values(*array, entry["values"], name);
  }
}

// The arrays this test writes for numpy to read: fixed contents, one per dtype and shape kind.
struct WrittenArray {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;
};

std::vector<WrittenArray> arrays_for_numpy() {
  std::vector<WrittenArray> arrays;
  auto add = [&](std::string name, DType dtype, std::vector<int64_t> shape, auto make_value) {
    WrittenArray array{std::move(name), dtype, std::move(shape), {}};
    int64_t numel = 1;
    for (auto dim : array.shape) numel *= dim;
    for (int64_t i = 0; i < numel; ++i) {
      auto value = make_value(i);
      const auto* bytes = reinterpret_cast<const uint8_t*>(&value);
      array.data.insert(array.data.end(), bytes, bytes + sizeof value);
    }
    arrays.push_back(std::move(array));
  };
  add("u8_3x4", DType::kU8, {3, 4}, [](int64_t i) { return static_cast<uint8_t>(i * 37 + 5); });
  add("u8_0x3x2", DType::kU8, {0, 3, 2}, [](int64_t) { return uint8_t{0}; });
  add("u16_2x3x5", DType::kU16, {2, 3, 5}, [](int64_t i) { return static_cast<uint16_t>(i * 4099 + 1); });
  add("i32_0x4", DType::kI32, {0, 4}, [](int64_t) { return int32_t{0}; });
  add("i32_5", DType::kI32, {5}, [](int64_t i) { return static_cast<int32_t>(i * -1000003); });
  add("i64_scalar", DType::kI64, {}, [](int64_t) { return int64_t{-1234567890123}; });
  add("u64_2", DType::kU64, {2}, [](int64_t i) { return (uint64_t{1} << 63) + static_cast<uint64_t>(i); });
  add("i8_4", DType::kI8, {4}, [](int64_t i) { return static_cast<int8_t>(-128 + 85 * i); });
  add("i16_3", DType::kI16, {3}, [](int64_t i) { return static_cast<int16_t>(-32768 + 30000 * i); });
  add("u32_2", DType::kU32, {2}, [](int64_t i) { return static_cast<uint32_t>(4000000000u + i); });
  add("f16_2x2", DType::kF16, {2, 2}, [](int64_t i) { return f32_to_f16(static_cast<float>(i) * 0.5f - 0.75f); });
  add("f32_7", DType::kF32, {7}, [](int64_t i) { return static_cast<float>(i - 3) * 0.375f; });
  add("f64_2", DType::kF64, {2}, [](int64_t i) { return 1.0 / 3.0 + static_cast<double>(i); });
  add("bool_5", DType::kBool, {5}, [](int64_t i) { return static_cast<uint8_t>(i % 2); });
  return arrays;
}

// With SY_WRITE_NPY_FOR_NUMPY=1 this (re)writes golden/sy_written/*.npy for make_goldens.py.
TEST(NpyGolden, NumpyReadWhatWeWrote) {
  auto dir = golden_dir() / "sy_written";
  if (std::getenv("SY_WRITE_NPY_FOR_NUMPY")) {
    fs::create_directories(dir);
    for (const auto& array : arrays_for_numpy())
      ASSERT_TRUE(npy_write_file((dir / (array.name + ".npy")).string(), array.dtype, array.shape, array.data.data()));
  }
  auto report = read_json(golden_dir() / "numpy_read_sy.json");
  ASSERT_EQ(report["files"].size(), arrays_for_numpy().size());
  for (const auto& array : arrays_for_numpy()) {
    std::string file = array.name + ".npy";
    const auto& seen = report["files"][file];
    ASSERT_TRUE(seen.is_object()) << file << " is not in numpy_read_sy.json";
    std::string bytes = npy_encode(array.dtype, array.shape, array.data.data());
    // numpy read exactly these bytes (the encoder has not changed since) ...
    EXPECT_EQ(seen["fnv1a64"].get<uint64_t>(), fnv1a64(bytes.data(), bytes.size())) << file;
    // ... and saw the dtype, shape and values we meant.
    EXPECT_EQ(seen["shape"].get<std::vector<int64_t>>(), array.shape) << file;
    EXPECT_EQ(seen["sy_dtype"].get<std::string>(), dtype_name(array.dtype)) << file;
    NpyArray mine{array.dtype, array.shape, array.data};
    expect_values(mine, seen["values"], file);
  }
}

}  // namespace
}  // namespace sy
