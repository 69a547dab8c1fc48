#include "model/safetensors.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>
#include <unordered_map>

#include <nlohmann/json.hpp>

namespace sy::model {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The reference implementation's limit (safetensors MAX_HEADER_SIZE).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
// A valid header nests three levels ({name: {shape: [..]}}); anything much deeper is hostile.
constexpr int kMaxJsonDepth = 16;
// U8: MXFP4 blocks and e8m0 scales (gpt-oss); F8_E4M3: FP8 block-quantised weights (DeepSeek-V3,
// GLM), loaded only with their block scales. Each adapter says which tensors may be which.
constexpr DType kLoadableDTypes[] = {DType::kBF16, DType::kF16, DType::kF32, DType::kU8,
                                     DType::kF8E4M3};
constexpr std::string_view kLoadableNames = "BF16, F16, F32, U8, F8_E4M3";
constexpr std::string_view kAllDTypeNames =
    "BOOL, U8, I8, U16, I16, U32, I32, U64, I64, F16, BF16, F32, F64, C64, F8_E4M3, F8_E5M2, "
    "F8_E8M0, F8_E4M3FNUZ, F8_E5M2FNUZ, F4, F6_E2M3, F6_E3M2";

// Offset of the first byte that is not part of well-formed UTF-8 (no overlongs, no surrogates,
// nothing above U+10FFFF), or npos.
size_t invalid_utf8_offset(std::string_view text) {
  const auto* bytes = reinterpret_cast<const uint8_t*>(text.data());
  size_t size = text.size(), i = 0;
  while (i < size) {
    uint8_t lead = bytes[i];
    if (lead < 0x80) {
      ++i;
      continue;
    }
    size_t length;
    uint8_t second_min = 0x80, second_max = 0xbf;
    if (lead >= 0xc2 && lead <= 0xdf) {
      length = 2;
    } else if (lead >= 0xe0 && lead <= 0xef) {
      length = 3;
      if (lead == 0xe0) second_min = 0xa0;
      if (lead == 0xed) second_max = 0x9f;
    } else if (lead >= 0xf0 && lead <= 0xf4) {
      length = 4;
      if (lead == 0xf0) second_min = 0x90;
      if (lead == 0xf4) second_max = 0x8f;
    } else {
      return i;
    }
    if (size - i < length) return i;
    if (bytes[i + 1] < second_min || bytes[i + 1] > second_max) return i;
    for (size_t k = 2; k < length; ++k)
      if (bytes[i + k] < 0x80 || bytes[i + k] > 0xbf) return i;
    i += length;
  }
  return std::string_view::npos;
}

struct JsonRejected {
  std::string message;
};

// nlohmann keeps the last of duplicate keys silently; a checkpoint with two entries for one name
// is ambiguous, so duplicates (at any level) are an error here. Depth is bounded too.
Result<json> parse_json_strict(std::string_view text) {
  std::vector<std::set<std::string>> keys_per_object;
  auto callback = [&](int depth, json::parse_event_t event, json& parsed) {
    if (depth > kMaxJsonDepth)
      throw JsonRejected{fmt::format("nesting deeper than {} levels", kMaxJsonDepth)};
    switch (event) {
      case json::parse_event_t::object_start: keys_per_object.emplace_back(); break;
      case json::parse_event_t::object_end:
        if (!keys_per_object.empty()) keys_per_object.pop_back();
        break;
      case json::parse_event_t::key: {
        const auto& key = parsed.get_ref<const std::string&>();
        if (!keys_per_object.empty() && !keys_per_object.back().insert(key).second)
          throw JsonRejected{fmt::format("duplicate key \"{}\"", key)};
        break;
      }
      default: break;
    }
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), callback);
  } catch (const JsonRejected& rejected) {
    return Status::error(rejected.message);
  } catch (const json::exception& error) {
    std::string_view message = error.what();
    if (auto bracket = message.find("] "); bracket != std::string_view::npos)
      message.remove_prefix(bracket + 2);  // drop "[json.exception.parse_error.101] "
    return Status::error(std::string(message));
  }
}

std::string shape_string(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

// A JSON number that is a non-negative integer fitting in int64.
std::optional<uint64_t> as_index(const json& value) {
  if (value.is_number_unsigned()) {
    uint64_t number = value.get<uint64_t>();
    if (number <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return number;
    return std::nullopt;
  }
  if (value.is_number_integer() && value.get<int64_t>() >= 0) return value.get<uint64_t>();
  return std::nullopt;
}

// Element count and byte size of shape x dtype, overflow-checked.
Result<uint64_t> checked_nbytes(const std::vector<int64_t>& shape, DType dtype) {
  uint64_t numel = 1;
  for (int64_t dim : shape)
    if (__builtin_mul_overflow(numel, static_cast<uint64_t>(dim), &numel))
      return Status::errorf("shape {} has more elements than fit in 64 bits", shape_string(shape));
  uint64_t bits;
  if (__builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_bits(dtype)), &bits))
    return Status::errorf("shape {} of {} is more bytes than fit in 64 bits", shape_string(shape),
                          dtype_name(dtype));
  if (bits % 8 != 0)
    return Status::errorf("shape {} of {} ({} bits each) is not a whole number of bytes",
                          shape_string(shape), dtype_name(dtype), dtype_bits(dtype));
  return bits / 8;
}

struct ParsedEntry {
  TensorInfo info;
  uint64_t begin = 0, end = 0;
};

// One tensor's header entry: {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}.
Result<ParsedEntry> parse_entry(const std::string& name, const json& value, uint64_t data_bytes) {
  if (!value.is_object())
    return Status::errorf("expected an object with dtype, shape and data_offsets, got {}",
                          value.type_name());
  ParsedEntry entry;
  entry.info.name = name;
  auto dtype_field = value.find("dtype");
  if (dtype_field == value.end()) return Status::error("missing \"dtype\"");
  if (!dtype_field->is_string())
    return Status::errorf("\"dtype\" must be a string, got {}", dtype_field->type_name());
  const auto& dtype_text = dtype_field->get_ref<const std::string&>();
  auto dtype = dtype_from_name(dtype_text);
  if (!dtype) return Status::errorf("unknown dtype \"{}\" (valid: {})", dtype_text, kAllDTypeNames);
  entry.info.dtype = *dtype;

  auto shape_field = value.find("shape");
  if (shape_field == value.end()) return Status::error("missing \"shape\"");
  if (!shape_field->is_array())
    return Status::errorf("\"shape\" must be an array of non-negative integers, got {}",
                          shape_field->type_name());
  for (size_t axis = 0; axis < shape_field->size(); ++axis) {
    auto dim = as_index((*shape_field)[axis]);
    if (!dim)
      return Status::errorf("shape[{}] must be a non-negative integer, got {}", axis,
                            (*shape_field)[axis].dump());
    entry.info.shape.push_back(static_cast<int64_t>(*dim));
  }

  auto offsets_field = value.find("data_offsets");
  if (offsets_field == value.end()) return Status::error("missing \"data_offsets\"");
  if (!offsets_field->is_array() || offsets_field->size() != 2)
    return Status::errorf("\"data_offsets\" must be [begin, end], got {}", offsets_field->dump());
  auto begin = as_index((*offsets_field)[0]), end = as_index((*offsets_field)[1]);
  if (!begin || !end)
    return Status::errorf("\"data_offsets\" must be two non-negative integers, got {}",
                          offsets_field->dump());
  entry.begin = *begin;
  entry.end = *end;
  if (entry.end < entry.begin)
    return Status::errorf("data_offsets [{}, {}) end before they begin", entry.begin, entry.end);

  SY_ASSIGN(uint64_t nbytes, checked_nbytes(entry.info.shape, entry.info.dtype));
  if (entry.end - entry.begin != nbytes)
    return Status::errorf("data_offsets [{}, {}) span {} bytes but shape {} of {} needs {} bytes",
                          entry.begin, entry.end, entry.end - entry.begin,
                          shape_string(entry.info.shape), dtype_text, nbytes);
  if (entry.end > data_bytes)
    return Status::errorf(
        "data_offsets [{}, {}) run past the end of the data section ({} bytes; truncated file?)",
        entry.begin, entry.end, data_bytes);
  entry.info.nbytes = static_cast<size_t>(nbytes);
  return entry;
}

bool is_loadable(DType dtype) {
  return std::find(std::begin(kLoadableDTypes), std::end(kLoadableDTypes), dtype) !=
         std::end(kLoadableDTypes);
}

Status check_loadable(const TensorInfo& tensor) {
  if (is_loadable(tensor.dtype)) return Status::ok();
  return Status::error(ErrorCode::kUnsupported,
                       fmt::format("{}: tensor '{}': dtype {} is not supported yet (supported: {})",
                                   tensor.file, tensor.name, dtype_name(tensor.dtype),
                                   kLoadableNames));
}

// Model files are untrusted: a shard name must stay inside the model folder.
bool is_plain_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." &&
         name.find_first_of(std::string_view("/\\\0", 3)) == std::string::npos;
}

const TensorInfo* find_sorted(const std::vector<TensorInfo>& tensors, std::string_view name) {
  auto it = std::lower_bound(tensors.begin(), tensors.end(), name,
                             [](const TensorInfo& tensor, std::string_view key) { return tensor.name < key; });
  return it != tensors.end() && it->name == name ? &*it : nullptr;
}

void sort_by_name(std::vector<TensorInfo>& tensors) {
  std::sort(tensors.begin(), tensors.end(),
            [](const TensorInfo& a, const TensorInfo& b) { return a.name < b.name; });
}

Result<std::string> read_small_file(const std::string& path, uint64_t max_bytes) {
  SY_ASSIGN(MappedFile file, MappedFile::open(path));
  if (file.size() > max_bytes)
    return Status::errorf("{}: {} bytes is larger than the {}-byte limit", path, file.size(), max_bytes);
  return std::string(reinterpret_cast<const char*>(file.data()), file.size());
}

}  // namespace

int64_t TensorInfo::numel() const {
  int64_t numel = 1;
  for (int64_t dim : shape) numel *= dim;
  return numel;
}

Result<SafetensorsFile> SafetensorsFile::parse(const uint8_t* data, size_t size,
                                               const std::string& name_for_errors) {
  const std::string& path = name_for_errors;
  auto fail = [&](std::string_view message) { return Status::errorf("{}: {}", path, message); };
  if (size < 8)
    return fail(fmt::format("file is {} bytes, too short for the 8-byte header length (truncated?)", size));
  uint64_t header_length = 0;
  for (int i = 0; i < 8; ++i) header_length |= static_cast<uint64_t>(data[i]) << (8 * i);
  if (header_length > kMaxHeaderBytes)
    return fail(fmt::format("header length {} is larger than the limit of {} bytes", header_length,
                            kMaxHeaderBytes));
  if (header_length > size - 8)
    return fail(fmt::format("header length {} runs past the end of the file ({} bytes follow the length; truncated?)",
                            header_length, size - 8));
  std::string_view header(reinterpret_cast<const char*>(data + 8), header_length);
  if (size_t bad = invalid_utf8_offset(header); bad != std::string_view::npos)
    return fail(fmt::format("header is not valid UTF-8 (byte {} of the header)", bad));
  // JSON never contains a raw NUL, and nlohmann's lexer would take one as the end of input.
  if (size_t nul = header.find('\0'); nul != std::string_view::npos)
    return fail(fmt::format("header is not valid JSON: NUL byte at byte {} of the header", nul));
  auto parsed = parse_json_strict(header);
  if (!parsed) return fail(fmt::format("header is not valid JSON: {}", parsed.message()));
  const json& root = *parsed;
  if (!root.is_object()) return fail(fmt::format("header must be a JSON object, got {}", root.type_name()));

  SafetensorsFile file;
  file.path_ = path;
  file.header_bytes_ = 8 + static_cast<size_t>(header_length);
  const uint8_t* data_section = data + file.header_bytes_;
  uint64_t data_bytes = size - file.header_bytes_;
  std::vector<ParsedEntry> entries;
  for (const auto& [key, value] : root.items()) {
    if (key == "__metadata__") {
      if (value.is_null()) continue;
      if (!value.is_object())
        return fail(fmt::format("__metadata__ must be an object of strings, got {}", value.type_name()));
      for (const auto& [meta_key, meta_value] : value.items()) {
        if (!meta_value.is_string())
          return fail(fmt::format("__metadata__ \"{}\" must be a string, got {}", meta_key,
                                  meta_value.type_name()));
        file.metadata_[meta_key] = meta_value.get<std::string>();
      }
      continue;
    }
    auto entry = parse_entry(key, value, data_bytes);
    if (!entry) return fail(fmt::format("tensor '{}': {}", key, entry.message()));
    entries.push_back(std::move(entry).value());
  }

  // The spans, in offset order, must tile the data section exactly: no overlap, no hole.
  std::sort(entries.begin(), entries.end(), [](const ParsedEntry& a, const ParsedEntry& b) {
    return std::tie(a.begin, a.end) < std::tie(b.begin, b.end);
  });
  uint64_t covered = 0;
  const ParsedEntry* previous = nullptr;
  for (const auto& entry : entries) {
    if (entry.begin < covered)
      return fail(fmt::format("tensor '{}': data_offsets [{}, {}) overlap tensor '{}' at [{}, {})",
                              entry.info.name, entry.begin, entry.end, previous->info.name,
                              previous->begin, previous->end));
    if (entry.begin > covered)
      return fail(fmt::format("tensor '{}': data_offsets [{}, {}) leave a hole: bytes [{}, {}) belong to no tensor",
                              entry.info.name, entry.begin, entry.end, covered, entry.begin));
    covered = entry.end;
    previous = &entry;
  }
  if (covered != data_bytes)
    return fail(fmt::format("data section is {} bytes but the tensors cover only [0, {}): {} bytes belong to no tensor",
                            data_bytes, covered, data_bytes - covered));

  file.tensors_.reserve(entries.size());
  for (auto& entry : entries) {
    entry.info.data = data_section + entry.begin;
    entry.info.file = path;
    file.tensors_.push_back(std::move(entry.info));
  }
  sort_by_name(file.tensors_);
  return file;
}

Result<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  SY_ASSIGN(MappedFile map, MappedFile::open(path));
  SY_ASSIGN(SafetensorsFile file, parse(map.data(), map.size(), path));
  // Moving the map into the heap keeps its address, so the tensors' pointers stay valid.
  file.map_ = std::make_unique<MappedFile>(std::move(map));
  return file;
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const { return find_sorted(tensors_, name); }

Result<Checkpoint> Checkpoint::open(const std::string& model_dir) {
  fs::path dir(model_dir);
  std::error_code error;
  Checkpoint checkpoint;
  auto open_single = [&](const std::string& path) -> Result<Checkpoint> {
    SY_ASSIGN(SafetensorsFile file, SafetensorsFile::open(path));
    for (const auto& tensor : file.tensors()) SY_TRY(check_loadable(tensor));
    checkpoint.tensors_ = file.tensors();
    checkpoint.files_.push_back(std::move(file));
    return std::move(checkpoint);
  };
  // Like transformers: a single model.safetensors wins over an index beside it.
  if (fs::is_regular_file(dir, error) && dir.extension() == ".safetensors") return open_single(model_dir);
  fs::path single = dir / "model.safetensors";
  if (fs::is_regular_file(single, error)) return open_single(single.string());
  fs::path index_path = dir / "model.safetensors.index.json";
  std::string index_name = index_path.string();
  if (!fs::exists(index_path, error)) {
    if (!fs::is_directory(dir, error))
      return Status::error(ErrorCode::kNotFound,
                           fmt::format("{}: not a model folder (expected a folder holding model.safetensors "
                                       "or model.safetensors.index.json, or a .safetensors file)",
                                       model_dir));
    return Status::error(ErrorCode::kNotFound,
                         fmt::format("{}: no model.safetensors or model.safetensors.index.json in this folder",
                                     model_dir));
  }

  SY_ASSIGN(std::string index_text, read_small_file(index_name, kMaxHeaderBytes));
  if (size_t nul = index_text.find('\0'); nul != std::string::npos)
    return Status::errorf("{}: not valid JSON: NUL byte at byte {}", index_name, nul);
  auto index = parse_json_strict(index_text);
  if (!index) return Status::errorf("{}: not valid JSON: {}", index_name, index.message());
  if (!index->is_object()) return Status::errorf("{}: must be a JSON object, got {}", index_name, index->type_name());
  auto weight_map = index->find("weight_map");
  if (weight_map == index->end() || !weight_map->is_object())
    return Status::errorf("{}: missing \"weight_map\" (an object of tensor name to shard file)", index_name);
  if (weight_map->empty()) return Status::errorf("{}: \"weight_map\" lists no tensors", index_name);

  std::map<std::string, std::vector<std::string>> tensors_by_shard;
  for (const auto& [tensor, shard] : weight_map->items()) {
    if (!shard.is_string())
      return Status::errorf("{}: weight_map \"{}\" must be a shard file name, got {}", index_name, tensor,
                            shard.dump());
    const auto& shard_name = shard.get_ref<const std::string&>();
    if (!is_plain_file_name(shard_name))
      return Status::errorf("{}: weight_map \"{}\" names shard \"{}\", which is not a plain file name in the model folder",
                            index_name, tensor, shard_name);
    tensors_by_shard[shard_name].push_back(tensor);
  }

  std::unordered_map<std::string, std::string> file_of_tensor;
  for (const auto& [shard_name, listed] : tensors_by_shard) {
    std::string shard_path = (dir / shard_name).string();
    auto shard = SafetensorsFile::open(shard_path);
    if (!shard)
      return Status::error(shard.status().code(),
                           fmt::format("{} (shard of {}, holding e.g. tensor '{}')", shard.message(),
                                       index_name, listed.front()));
    for (const auto& tensor : listed)
      if (!shard->find(tensor))
        return Status::errorf("{}: tensor '{}' is not in this shard, but {} says it is", shard_path, tensor,
                              index_name);
    for (const auto& tensor : shard->tensors()) {
      auto [it, inserted] = file_of_tensor.emplace(tensor.name, shard_path);
      if (!inserted)
        return Status::errorf("tensor '{}' is in two shards: {} and {}", tensor.name, it->second, shard_path);
      SY_TRY(check_loadable(tensor));
      checkpoint.tensors_.push_back(tensor);
    }
    checkpoint.files_.push_back(std::move(shard).value());
  }
  sort_by_name(checkpoint.tensors_);
  return checkpoint;
}

const TensorInfo* Checkpoint::find(std::string_view name) const { return find_sorted(tensors_, name); }

uint64_t Checkpoint::total_bytes() const {
  uint64_t total = 0;
  for (const auto& tensor : tensors_) total += tensor.nbytes;
  return total;
}

std::vector<std::string> Checkpoint::files() const {
  std::vector<std::string> paths;
  for (const auto& file : files_) paths.push_back(file.path());
  return paths;
}

namespace {

struct PlannedTensor {
  const TensorSpec* spec;
  uint64_t nbytes;
};

// Writes one .safetensors file through a temporary name, so a crash never leaves a file that
// looks complete. Tensors are laid out by descending element size (as the reference writer does)
// so every tensor starts aligned to its element size; the header is padded to 8 bytes.
Status write_one_file(const std::string& path, std::vector<PlannedTensor> tensors,
                      const std::map<std::string, std::string>& metadata, const TensorFiller& fill,
                      std::vector<uint8_t>& buffer) {
  std::stable_sort(tensors.begin(), tensors.end(), [](const PlannedTensor& a, const PlannedTensor& b) {
    return dtype_bits(a.spec->dtype) > dtype_bits(b.spec->dtype);
  });
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& tensor : tensors) {
    header[tensor.spec->name] = {{"dtype", dtype_name(tensor.spec->dtype)},
                                 {"shape", tensor.spec->shape},
                                 {"data_offsets", {offset, offset + tensor.nbytes}}};
    offset += tensor.nbytes;
  }
  std::string header_text = header.dump();
  header_text.append((8 - header_text.size() % 8) % 8, ' ');
  if (header_text.size() > kMaxHeaderBytes)
    return Status::errorf("{}: header would be {} bytes, over the {}-byte limit; use more shards", path,
                          header_text.size(), kMaxHeaderBytes);

  std::string temporary = path + ".tmp";
  std::FILE* out = std::fopen(temporary.c_str(), "wb");
  if (out == nullptr) return Status::errorf("{}: cannot create: {}", temporary, std::strerror(errno));
  uint8_t length_bytes[8];
  for (int i = 0; i < 8; ++i) length_bytes[i] = static_cast<uint8_t>(header_text.size() >> (8 * i));
  bool ok = std::fwrite(length_bytes, 1, 8, out) == 8 &&
            std::fwrite(header_text.data(), 1, header_text.size(), out) == header_text.size();
  for (size_t i = 0; ok && i < tensors.size(); ++i) {
    buffer.assign(tensors[i].nbytes, 0);  // one tensor in memory at a time
    fill(*tensors[i].spec, buffer.data(), buffer.size());
    if (!buffer.empty()) ok = std::fwrite(buffer.data(), 1, buffer.size(), out) == buffer.size();  // empty: data() may be null
  }
  int write_errno = errno;
  if (std::fclose(out) != 0 && ok) {
    ok = false;
    write_errno = errno;
  }
  if (!ok) {
    std::remove(temporary.c_str());
    return Status::errorf("{}: write failed: {}", temporary, std::strerror(write_errno));
  }
  std::error_code error;
  fs::rename(temporary, path, error);
  if (error) return Status::errorf("{}: cannot rename to {}: {}", temporary, path, error.message());
  return Status::ok();
}

}  // namespace

Status write_checkpoint(const std::string& model_dir, const std::vector<TensorSpec>& tensors,
                        const TensorFiller& fill, uint64_t shard_bytes,
                        const std::map<std::string, std::string>& metadata) {
  std::vector<PlannedTensor> planned;
  std::set<std::string_view> names;
  for (const auto& spec : tensors) {
    if (spec.name == "__metadata__")
      return Status::errorf("{}: a tensor may not be named \"__metadata__\"", model_dir);
    if (!names.insert(spec.name).second)
      return Status::errorf("{}: tensor '{}' is listed twice", model_dir, spec.name);
    for (int64_t dim : spec.shape)
      if (dim < 0)
        return Status::errorf("{}: tensor '{}': negative dimension in shape {}", model_dir, spec.name,
                              shape_string(spec.shape));
    auto nbytes = checked_nbytes(spec.shape, spec.dtype);
    if (!nbytes) return Status::errorf("{}: tensor '{}': {}", model_dir, spec.name, nbytes.message());
    planned.push_back({&spec, *nbytes});
  }

  // Greedy, in the caller's order: a new shard starts when the next tensor would overflow this one.
  std::vector<std::vector<PlannedTensor>> shards(1);
  uint64_t shard_total = 0;
  for (const auto& tensor : planned) {
    if (shard_bytes > 0 && !shards.back().empty() && shard_total + tensor.nbytes > shard_bytes) {
      shards.emplace_back();
      shard_total = 0;
    }
    shards.back().push_back(tensor);
    shard_total += tensor.nbytes;
  }

  fs::path dir(model_dir);
  std::error_code error;
  fs::create_directories(dir, error);
  if (error) return Status::errorf("{}: cannot create folder: {}", model_dir, error.message());
  std::vector<uint8_t> buffer;
  fs::path single = dir / "model.safetensors", index_path = dir / "model.safetensors.index.json";
  if (shard_bytes == 0) {
    SY_TRY(write_one_file(single.string(), shards[0], metadata, fill, buffer));
    fs::remove(index_path, error);  // a stale index must not describe this folder
    return Status::ok();
  }

  json weight_map = json::object();
  uint64_t total_size = 0;
  for (size_t i = 0; i < shards.size(); ++i) {
    std::string shard_name = fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, shards.size());
    SY_TRY(write_one_file((dir / shard_name).string(), shards[i], metadata, fill, buffer));
    for (const auto& tensor : shards[i]) {
      weight_map[tensor.spec->name] = shard_name;
      total_size += tensor.nbytes;
    }
  }
  fs::remove(single, error);  // it would take precedence over the index
  json index = {{"metadata", {{"total_size", total_size}}}, {"weight_map", weight_map}};
  std::string index_text = index.dump(2) + "\n";
  std::string temporary = index_path.string() + ".tmp";
  std::FILE* out = std::fopen(temporary.c_str(), "wb");
  if (out == nullptr) return Status::errorf("{}: cannot create: {}", temporary, std::strerror(errno));
  bool ok = std::fwrite(index_text.data(), 1, index_text.size(), out) == index_text.size();
  ok = std::fclose(out) == 0 && ok;
  if (!ok) return Status::errorf("{}: write failed: {}", temporary, std::strerror(errno));
  fs::rename(temporary, index_path, error);
  if (error) return Status::errorf("{}: cannot rename: {}", temporary, error.message());
  return Status::ok();
}

}  // namespace sy::model
