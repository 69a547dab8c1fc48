// libFuzzer: a checkpoint folder whose config.json is arbitrary bytes, beside the safetensors of
// a real tiny checkpoint of one family. Model::load must refuse what it cannot run with an error
// that says what is wrong (never crash, never read outside a tensor, never allocate from an
// unchecked size), and a model it accepts must run a short step on the CPU backend (prefill of a
// few tokens with route capture, then one decode token) or refuse it with an error.
//
// Input: byte 0 picks the family (low 3 bits: the order of kFamilies), the MoE kernel (bit 3:
// cpu-fused instead of cpu-modular) and what the rest is (bit 4):
//   0  config.json's bytes. The seeds in fuzz/corpus/model are each family's own tiny config.json
//      behind its byte, so mutations start from configs that load.
//   1  edits of the family's own config.json (fuzz/json_edits.h): byte mutations of JSON text
//      mostly break its syntax; edits reach the checks behind the parser.
// Bit 5: the config is the family's own and the edits apply to model.safetensors' header instead
// (a tensor's dtype, shape, name, or the tensor gone); the file is rebuilt around the edited
// header with consistent offsets, each tensor's old bytes cut or zero-padded to its new size, so
// that what is tested is the loader's checks of dtypes and shapes against the config, not the
// container's (safetensors_fuzz has those).
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "json_edits.h"
#include "model/decoder.h"
#include "model/model.h"
#include "model/presets.h"
#include "moe/experts_kernel.h"
#include "tensor/dtype.h"

namespace {

namespace fs = std::filesystem;
using namespace sy;

constexpr std::array<const char*, 8> kFamilies = {"qwen3_moe", "mixtral",    "olmoe",
                                                  "qwen2_moe", "gpt_oss",    "deepseek_v3",
                                                  "glm4_moe",  "qwen3_5_moe"};

struct Fixture {
  fs::path root;
  std::array<nlohmann::json, kFamilies.size()> configs;                            // as written
  std::array<std::vector<nlohmann::json::json_pointer>, kFamilies.size()> fields;  // every node
  std::array<std::string, kFamilies.size()> config_text;  // config.json as written
  std::array<nlohmann::json, kFamilies.size()> header;    // model.safetensors' header
  std::array<std::vector<nlohmann::json::json_pointer>, kFamilies.size()> header_nodes;
  std::array<std::string, kFamilies.size()> tensors_file;  // model.safetensors as written
  std::array<bool, kFamilies.size()> tensors_edited{};     // the file on disk is an edited one
  std::unique_ptr<backend::Backend> backend;
  moe::ExpertsKernelRegistry registry;
  ~Fixture() {
    std::error_code ignored;
    fs::remove_all(root, ignored);
  }
};

Fixture* fixture = nullptr;

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "model_fuzz set-up: %s\n", what.c_str());
  std::abort();
}

// The family's config with `edits` applied (fuzz/json_edits.h).
nlohmann::json edited(size_t family, const uint8_t* edits, size_t size) {
  static const std::vector<std::string> words = {
      "yarn",   "default", "linear",         "sigmoid",           "softmax",          "noaux_tc",
      "mxfp4",  "fp8",     "full_attention", "sliding_attention", "linear_attention", "bfloat16",
      "float32"};
  return fuzz::apply_json_edits(fixture->configs[family], fixture->fields[family], words, edits,
                                size);
}

std::string read_all(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot read " + path.string());
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// model.safetensors around `header` (edited): every well-formed entry gets fresh offsets and its
// old bytes (by its old name) cut or zero-padded; false if the file would pass 64 MiB.
bool rebuild_tensors(size_t family, nlohmann::json header, std::string& file) {
  const std::string& old = fixture->tensors_file[family];
  uint64_t old_header = 0;
  std::memcpy(&old_header, old.data(), 8);
  const std::string_view old_data = std::string_view(old).substr(8 + old_header);
  const nlohmann::json& old_entries = fixture->header[family];
  std::string data;
  for (auto it = header.begin(); it != header.end(); ++it) {
    nlohmann::json& entry = it.value();
    if (it.key() == "__metadata__" || !entry.is_object() || !entry.contains("dtype") ||
        !entry["dtype"].is_string() || !entry.contains("shape") || !entry["shape"].is_array())
      continue;  // left as the edit made it: the container's parser refuses it
    const std::optional<DType> dtype = dtype_from_name(entry["dtype"].get<std::string>());
    int64_t bytes = dtype ? static_cast<int64_t>(dtype_size(*dtype)) : 0;
    bool ok = bytes > 0;  // (sub-byte types left to the container's checks)
    for (const auto& dim : entry["shape"])
      ok = ok && dim.is_number_unsigned() && dim.get<uint64_t>() <= (uint64_t{1} << 26) &&
           !__builtin_mul_overflow(bytes, dim.get<int64_t>(), &bytes);
    if (!ok) continue;
    if (data.size() + static_cast<uint64_t>(bytes) > (uint64_t{64} << 20)) return false;
    const size_t begin = data.size();
    data.resize(begin + static_cast<size_t>(bytes));
    // The tensor's old bytes, if one of its name had offsets there.
    if (auto was = old_entries.find(it.key());
        was != old_entries.end() && was->contains("data_offsets")) {
      const uint64_t from = (*was)["data_offsets"][0], to = (*was)["data_offsets"][1];
      std::memcpy(data.data() + begin, old_data.data() + from,
                  std::min<uint64_t>(to - from, bytes));
    }
    entry["data_offsets"] = {begin, data.size()};
  }
  std::string text = header.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  text.resize((text.size() + 7) / 8 * 8, ' ');
  const uint64_t length = text.size();
  file.assign(reinterpret_cast<const char*>(&length), 8);
  file += text;
  file += data;
  return true;
}

void write_file(const fs::path& path, std::string_view bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// One step of `tokens` tokens of one sequence starting at `start` (KV slots = positions).
Status run_step(model::Decoder& decoder, const model::Model& m, int start, int tokens) {
  model::StepInputs in;
  const int64_t vocab = m.config().vocab_size;
  for (int p = start; p < start + tokens; ++p) {
    in.token_ids.push_back(static_cast<int32_t>((p * 7919 + 13) % vocab));
    in.positions.push_back(p);
    in.token_seq.push_back(0);
    in.slot_mapping.push_back(p);
  }
  in.logits_rows.push_back(tokens - 1);
  in.num_seqs = 1;
  in.max_blocks_per_seq = 2;
  in.block_tables = {0, 1};
  in.capture_routes = true;
  if (decoder.state_buffers() > 0) {
    in.state_read = {start == 0 ? 0 : 1};
    in.state_write = {start == 0 ? 1 : 0};
  }
  model::StepOutputs out;
  SY_TRY(decoder.forward(m, in, out));
  return decoder.finish_step(m, out);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fixture = new Fixture;
  std::atexit([] { delete fixture; });
  fixture->root = fs::temp_directory_path() / ("sy_model_fuzz_" + std::to_string(::getpid()));
  fs::create_directories(fixture->root);
  for (size_t f = 0; f < kFamilies.size(); ++f) {
    const char* family = kFamilies[f];
    auto config = model::preset_config(family, "tiny", 0);
    if (!config.is_ok()) fail(config.message());
    // A small vocabulary keeps the checkpoint near a megabyte, cheap to rewrite per input.
    (config->contains("text_config") ? (*config)["text_config"] : *config)["vocab_size"] = 300;
    const fs::path dir = fixture->root / family;
    Status written =
        model::write_random_checkpoint(*config, nlohmann::json::object(), dir.string(), 1, false);
    if (!written.is_ok()) fail(written.message());
    fixture->config_text[f] = read_all(dir / "config.json");
    fixture->configs[f] = nlohmann::json::parse(fixture->config_text[f]);
    fixture->fields[f] = fuzz::json_nodes(fixture->configs[f]);
    if (!fs::exists(dir / "model.safetensors"))
      fail(std::string(family) + ": not one model.safetensors");
    fixture->tensors_file[f] = read_all(dir / "model.safetensors");
    uint64_t length = 0;
    std::memcpy(&length, fixture->tensors_file[f].data(), 8);
    fixture->header[f] = nlohmann::json::parse(fixture->tensors_file[f].substr(8, length));
    fixture->header_nodes[f] = fuzz::json_nodes(fixture->header[f]);
  }
  fixture->backend = backend::make_cpu_backend({1});
  fixture->backend->register_kernels(fixture->registry);
  return 0;
}

// SY_MODEL_FUZZ_TRACE=1: one line per input saying how far it got (run the seeds with it to see
// that each family loads and steps).
static void trace(const char* family, const char* kernel, const std::string& outcome) {
  static const bool on = std::getenv("SY_MODEL_FUZZ_TRACE") != nullptr;
  if (on) std::fprintf(stderr, "model_fuzz %s %s: %s\n", family, kernel, outcome.c_str());
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const size_t f = data[0] & 7;
  const char* family = kFamilies[f];
  const fs::path dir = fixture->root / family;
  const char* kernel_name = data[0] & 8 ? "cpu-fused" : "cpu-modular";
  if (data[0] & 32) {
    static const std::vector<std::string> words = {
        "BF16",          "F16", "F32",  "U8",  "I8",
        "F8_E4M3",       "I32", "BOOL", "F64", "model.layers.0.mlp.gate.weight",
        "lm_head.weight"};
    std::string file;
    if (!rebuild_tensors(f,
                         fuzz::apply_json_edits(fixture->header[f], fixture->header_nodes[f], words,
                                                data + 1, size - 1),
                         file))
      return 0;
    write_file(dir / "model.safetensors", file);
    fixture->tensors_edited[f] = true;
    write_file(dir / "config.json", fixture->config_text[f]);
  } else {
    if (fixture->tensors_edited[f]) {
      write_file(dir / "model.safetensors", fixture->tensors_file[f]);
      fixture->tensors_edited[f] = false;
    }
    if (data[0] & 16)
      write_file(dir / "config.json", edited(f, data + 1, size - 1).dump());
    else
      write_file(dir / "config.json",
                 std::string_view(reinterpret_cast<const char*>(data + 1), size - 1));
  }

  auto loaded = model::Model::load(dir.string(), *fixture->backend);
  if (!loaded.is_ok()) {
    if (loaded.message().empty()) std::abort();  // every refusal says what is wrong
    trace(family, kernel_name, "load refused: " + loaded.message());
    return 0;
  }
  const model::Model& m = **loaded;
  auto kernel = fixture->registry.select(kernel_name, {});
  if (!kernel.is_ok()) std::abort();
  model::Decoder decoder(*fixture->backend, model::KernelChoice{*kernel, nullptr, 0}, 16);
  Status allocated = decoder.allocate(m.config(), 2, {8, 1, 2, 8});
  if (!allocated.is_ok()) {
    if (allocated.message().empty()) std::abort();
    trace(family, kernel_name, "allocate refused: " + allocated.message());
    return 0;
  }
  for (auto [start, tokens] : {std::pair{0, 5}, std::pair{5, 1}}) {
    Status step = run_step(decoder, m, start, tokens);
    if (!step.is_ok()) {
      if (step.message().empty()) std::abort();
      trace(family, kernel_name, "step refused: " + step.message());
      return 0;
    }
  }
  trace(family, kernel_name, "loaded and stepped");
  return 0;
}
