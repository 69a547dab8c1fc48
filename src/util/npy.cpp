#include "util/npy.h"

#include <bit>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>

namespace sy {
namespace {

static_assert(std::endian::native == std::endian::little, "npy code assumes a little-endian host");

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicBytes = 6;

struct NpyKind {
  DType dtype;
  std::string_view code;  // type char and size, as in numpy's descr without the byte order
};
constexpr NpyKind kKinds[] = {
    {DType::kBool, "b1"}, {DType::kU8, "u1"},  {DType::kI8, "i1"},  {DType::kU16, "u2"},
    {DType::kI16, "i2"},  {DType::kU32, "u4"}, {DType::kI32, "i4"}, {DType::kU64, "u8"},
    {DType::kI64, "i8"},  {DType::kF16, "f2"}, {DType::kF32, "f4"}, {DType::kF64, "f8"},
};
constexpr std::string_view kSupportedDescrs =
    "|b1 |u1 |i1 <u2 <i2 <u4 <i4 <u8 <i8 <f2 <f4 <f8 ('=' for native order is also accepted)";

std::optional<std::string_view> npy_code(DType dtype) {
  for (const auto& kind : kKinds)
    if (kind.dtype == dtype) return kind.code;
  return std::nullopt;
}

Result<DType> dtype_from_descr(std::string_view descr) {
  if (descr.size() == 3) {
    char order = descr[0];
    std::string_view code = descr.substr(1);
    for (const auto& kind : kKinds) {
      if (kind.code != code) continue;
      bool one_byte = code[1] == '1';
      if (order == '<' || order == '=' || (order == '|' && one_byte)) return kind.dtype;
      if (order == '>' && !one_byte)
        return Status::error(ErrorCode::kUnsupported,
                             fmt::format("npy: big-endian dtype '{}' is not supported (supported: {})",
                                         descr, kSupportedDescrs));
      if (order == '>') return kind.dtype;  // byte order is meaningless for one byte
    }
  }
  return Status::error(ErrorCode::kUnsupported,
                       fmt::format("npy: dtype '{}' is not supported (supported: {})", descr,
                                   kSupportedDescrs));
}

Result<int64_t> checked_numel(const std::vector<int64_t>& shape) {
  int64_t numel = 1;
  for (int64_t dim : shape) {
    if (dim < 0) return Status::errorf("npy: negative dimension {} in shape", dim);
    if (dim != 0 && numel > std::numeric_limits<int64_t>::max() / dim)
      return Status::error("npy: shape has more elements than fit in 64 bits");
    numel *= dim;
  }
  return numel;
}

// The header is a Python dict literal, e.g. {'descr': '<u2', 'fortran_order': False, 'shape': (3, 4), }
// This parses exactly the subset numpy writes: string keys; string, bool and int-tuple values.
class HeaderParser {
 public:
  explicit HeaderParser(std::string_view text) : text_(text) {}

  struct Fields {
    std::optional<std::string> descr;
    std::optional<bool> fortran_order;
    std::optional<std::vector<int64_t>> shape;
  };

  Result<Fields> parse() {
    Fields fields;
    skip_space();
    if (!consume('{')) return error("expected '{' at the start of the header dict");
    while (true) {
      skip_space();
      if (consume('}')) break;
      SY_ASSIGN(std::string key, parse_string());
      skip_space();
      if (!consume(':')) return error(fmt::format("expected ':' after key '{}'", key));
      skip_space();
      if (key == "descr") {
        if (fields.descr) return error("duplicate key 'descr'");
        if (peek() == '[')
          return Status::error(ErrorCode::kUnsupported, "npy: structured dtypes are not supported");
        SY_ASSIGN(fields.descr, parse_string());
      } else if (key == "fortran_order") {
        if (fields.fortran_order) return error("duplicate key 'fortran_order'");
        SY_ASSIGN(fields.fortran_order, parse_bool());
      } else if (key == "shape") {
        if (fields.shape) return error("duplicate key 'shape'");
        SY_ASSIGN(fields.shape, parse_shape());
      } else {
        return error(fmt::format("unexpected key '{}' (valid: descr, fortran_order, shape)", key));
      }
      skip_space();
      if (consume(',')) continue;
      skip_space();
      if (consume('}')) break;
      return error("expected ',' or '}' in the header dict");
    }
    skip_space();
    if (position_ != text_.size()) return error("unexpected text after the header dict");
    if (!fields.descr) return error("header has no 'descr'");
    if (!fields.fortran_order) return error("header has no 'fortran_order'");
    if (!fields.shape) return error("header has no 'shape'");
    return fields;
  }

 private:
  Status error(std::string_view what) const {
    return Status::errorf("npy: malformed header at offset {}: {}", position_, what);
  }
  char peek() const { return position_ < text_.size() ? text_[position_] : '\0'; }
  bool consume(char c) {
    if (peek() != c || position_ >= text_.size()) return false;
    ++position_;
    return true;
  }
  void skip_space() {
    while (position_ < text_.size() &&
           (text_[position_] == ' ' || text_[position_] == '\t' || text_[position_] == '\n' ||
            text_[position_] == '\r'))
      ++position_;
  }
  Result<std::string> parse_string() {
    char quote = peek();
    if (quote != '\'' && quote != '"') return error("expected a quoted string");
    ++position_;
    size_t end = text_.find(quote, position_);
    if (end == std::string_view::npos) return error("unterminated string");
    std::string value(text_.substr(position_, end - position_));
    if (value.find('\\') != std::string::npos) return error("escapes in strings are not supported");
    position_ = end + 1;
    return value;
  }
  Result<bool> parse_bool() {
    if (text_.substr(position_, 4) == "True") {
      position_ += 4;
      return true;
    }
    if (text_.substr(position_, 5) == "False") {
      position_ += 5;
      return false;
    }
    return error("expected True or False");
  }
  Result<std::vector<int64_t>> parse_shape() {
    if (!consume('(')) return error("expected '(' to start the shape tuple");
    std::vector<int64_t> shape;
    bool comma_after_last = false;
    while (true) {
      skip_space();
      if (consume(')')) break;
      size_t start = position_;
      uint64_t value = 0;
      while (position_ < text_.size() && text_[position_] >= '0' && text_[position_] <= '9') {
        uint64_t digit = static_cast<uint64_t>(text_[position_] - '0');
        if (value > (static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) - digit) / 10)
          return error("shape dimension too large");
        value = value * 10 + digit;
        ++position_;
      }
      if (position_ == start) return error("expected a non-negative integer in the shape tuple");
      consume('L');  // Python 2 long suffix
      shape.push_back(static_cast<int64_t>(value));
      skip_space();
      comma_after_last = consume(',');
      if (comma_after_last) continue;
      if (consume(')')) break;
      return error("expected ',' or ')' in the shape tuple");
    }
    // In Python "(3)" is the integer 3, not a tuple.
    if (shape.size() == 1 && !comma_after_last)
      return error("a one-element shape tuple needs a trailing comma, e.g. (3,)");
    return shape;
  }

  std::string_view text_;
  size_t position_ = 0;
};

uint32_t read_le(const uint8_t* bytes, size_t count) {
  uint32_t value = 0;
  for (size_t i = 0; i < count; ++i) value |= static_cast<uint32_t>(bytes[i]) << (8 * i);
  return value;
}

}  // namespace

int64_t NpyArray::numel() const {
  int64_t numel = 1;
  for (int64_t dim : shape) numel *= dim;
  return numel;
}

std::string npy_encode(DType dtype, const std::vector<int64_t>& shape, const void* data) {
  auto code = npy_code(dtype);
  assert(code && "npy_encode: dtype has no numpy equivalent");
  if (!code) return {};
  std::string shape_text;
  for (int64_t dim : shape) shape_text += fmt::format("{}, ", dim);
  if (shape.size() > 1) shape_text.resize(shape_text.size() - 2);  // (3, 4) but (3,)
  if (shape.size() == 1) shape_text.pop_back();
  std::string header = fmt::format("{{'descr': '{}{}', 'fortran_order': False, 'shape': ({}), }}",
                                   (*code)[1] == '1' ? '|' : '<', *code, shape_text);
  // numpy pads with spaces and ends with '\n' so that the data starts 64-byte aligned.
  bool version2 = header.size() + 1 + kMagicBytes + 4 > 65535;
  size_t prefix_bytes = kMagicBytes + 2 + (version2 ? 4 : 2);
  size_t padded = (prefix_bytes + header.size() + 1 + 63) / 64 * 64 - prefix_bytes;
  header.append(padded - header.size() - 1, ' ');
  header += '\n';

  int64_t numel = 1;
  for (int64_t dim : shape) numel *= dim;
  size_t data_bytes = static_cast<size_t>(numel) * dtype_size(dtype);
  std::string out;
  out.reserve(prefix_bytes + header.size() + data_bytes);
  out.append(kMagic, kMagicBytes);
  out += static_cast<char>(version2 ? 2 : 1);
  out += '\0';
  size_t header_len = header.size();
  for (size_t i = 0; i < (version2 ? 4u : 2u); ++i) out += static_cast<char>((header_len >> (8 * i)) & 0xff);
  out += header;
  if (data_bytes > 0) out.append(static_cast<const char*>(data), data_bytes);
  return out;
}

Result<NpyArray> npy_decode(std::string_view bytes) {
  const auto* raw = reinterpret_cast<const uint8_t*>(bytes.data());
  if (bytes.size() < kMagicBytes + 4 || std::memcmp(raw, kMagic, kMagicBytes) != 0)
    return Status::error("npy: not a .npy file (expected the magic \\x93NUMPY at the start)");
  uint8_t major = raw[6], minor = raw[7];
  if (major < 1 || major > 3 || minor != 0)
    return Status::errorf("npy: format version {}.{} is not supported (supported: 1.0, 2.0, 3.0)",
                          major, minor);
  size_t length_bytes = major == 1 ? 2 : 4;
  size_t prefix_bytes = kMagicBytes + 2 + length_bytes;
  if (bytes.size() < prefix_bytes)
    return Status::errorf("npy: truncated: {} bytes, the header length alone needs {}", bytes.size(),
                          prefix_bytes);
  size_t header_bytes = read_le(raw + 8, length_bytes);
  if (header_bytes > bytes.size() - prefix_bytes)
    return Status::errorf("npy: header length {} runs past the end of the {}-byte input", header_bytes,
                          bytes.size());
  std::string_view header = bytes.substr(prefix_bytes, header_bytes);
  if (major < 3) {
    for (char c : header)
      if (static_cast<unsigned char>(c) >= 0x80)
        return Status::errorf("npy: format {}.0 header must be ASCII", major);
  }
  SY_ASSIGN(auto fields, HeaderParser(header).parse());
  if (*fields.fortran_order)
    return Status::error(ErrorCode::kUnsupported,
                         "npy: fortran_order True is not supported (write the array in C order)");
  NpyArray array;
  SY_ASSIGN(array.dtype, dtype_from_descr(*fields.descr));
  array.shape = *fields.shape;
  SY_ASSIGN(int64_t numel, checked_numel(array.shape));
  size_t element_bytes = dtype_size(array.dtype);
  size_t available = bytes.size() - prefix_bytes - header_bytes;
  if (static_cast<uint64_t>(numel) > available / element_bytes)
    return Status::errorf("npy: shape needs {} elements of {} bytes but only {} data bytes follow the header",
                          numel, element_bytes, available);
  size_t data_bytes = static_cast<size_t>(numel) * element_bytes;
  if (data_bytes != available)
    return Status::errorf("npy: {} bytes follow the data that the shape describes ({} bytes expected)",
                          available - data_bytes, data_bytes);
  array.data.assign(raw + prefix_bytes + header_bytes, raw + bytes.size());
  return array;
}

Status npy_write_file(const std::string& path, DType dtype, const std::vector<int64_t>& shape,
                      const void* data) {
  if (!npy_code(dtype))
    return Status::errorf("{}: dtype {} has no .npy equivalent (supported: {})", path, dtype_name(dtype),
                          kSupportedDescrs);
  auto numel = checked_numel(shape);
  if (!numel) return numel.status().with_context(path + ": ");
  std::string bytes = npy_encode(dtype, shape, data);
  std::FILE* file = std::fopen(path.c_str(), "wb");
  if (file == nullptr) return Status::errorf("{}: cannot create: {}", path, std::strerror(errno));
  bool written = std::fwrite(bytes.data(), 1, bytes.size(), file) == bytes.size();
  bool closed = std::fclose(file) == 0;
  if (!written || !closed) return Status::errorf("{}: write failed: {}", path, std::strerror(errno));
  return Status::ok();
}

Result<NpyArray> npy_read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return Status::error(ErrorCode::kNotFound, fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return Status::errorf("{}: read failed", path);
  auto array = npy_decode(bytes);
  if (!array) return array.status().with_context(path + ": ");
  return array;
}

Result<std::vector<int64_t>> npy_to_int64(const NpyArray& array) {
  size_t element_bytes = dtype_size(array.dtype);
  size_t count = element_bytes ? array.data.size() / element_bytes : 0;
  std::vector<int64_t> values(count);
  const uint8_t* data = array.data.data();
  auto convert = [&]<typename T>(T) {
    for (size_t i = 0; i < count; ++i) {
      T value;
      std::memcpy(&value, data + i * sizeof(T), sizeof(T));
      values[i] = static_cast<int64_t>(value);
    }
  };
  switch (array.dtype) {
    case DType::kBool:
    case DType::kU8: convert(uint8_t{}); break;
    case DType::kI8: convert(int8_t{}); break;
    case DType::kU16: convert(uint16_t{}); break;
    case DType::kI16: convert(int16_t{}); break;
    case DType::kU32: convert(uint32_t{}); break;
    case DType::kI32: convert(int32_t{}); break;
    case DType::kI64: convert(int64_t{}); break;
    case DType::kU64:
      for (size_t i = 0; i < count; ++i) {
        uint64_t value;
        std::memcpy(&value, data + i * 8, 8);
        if (value > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
          return Status::errorf("npy: uint64 element {} is {}, larger than int64 can hold", i, value);
        values[i] = static_cast<int64_t>(value);
      }
      break;
    default:
      return Status::errorf("npy: expected an integer array, got dtype {}", dtype_name(array.dtype));
  }
  return values;
}

}  // namespace sy
