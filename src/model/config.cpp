#include "model/config.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "model/architecture.h"
#include "model/config_json.h"
#include "moe/router.h"

namespace sy::model {

namespace config_json {

using nlohmann::json;

Result<int64_t> get_int(const json& config, std::initializer_list<const char*> keys, bool required,
                        int64_t fallback) {
  for (const char* key : keys) {
    auto it = config.find(key);
    if (it == config.end() || it->is_null()) continue;
    if (!it->is_number_integer() && !it->is_number_unsigned())
      return Status::errorf("config.json: field '{}' must be an integer, got {}", key, it->dump());
    // Every count and size of a config fits 31 bits, so that products of two or three of them
    // (head count x head size, a state's elements) cannot overflow before the checks that
    // compare them with the tensors.
    if (it->is_number_unsigned()
            ? it->get<uint64_t>() > uint64_t{kMaxConfigInt}
            : it->get<int64_t>() > kMaxConfigInt || it->get<int64_t>() < -kMaxConfigInt)
      return Status::errorf("config.json: field '{}' is out of range ({}; at most {})", key,
                            it->dump(), kMaxConfigInt);
    return it->get<int64_t>();
  }
  if (required) return Status::errorf("config.json: missing required field '{}'", *keys.begin());
  return fallback;
}

Result<double> get_number(const json& config, const char* key, double fallback) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return fallback;
  if (!it->is_number()) return Status::errorf("config.json: field '{}' must be a number", key);
  return it->get<double>();
}

Result<bool> get_bool(const json& config, const char* key, bool fallback) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return fallback;
  if (!it->is_boolean())
    return Status::errorf("config.json: field '{}' must be true or false", key);
  return it->get<bool>();
}

Status require_positive(const char* field, int64_t value) {
  if (value <= 0)
    return Status::errorf("config.json: field '{}' must be > 0, got {}", field, value);
  return Status::ok();
}

Result<std::vector<int>> get_layer_list(const json& config, const char* key, int64_t layers) {
  std::vector<int> list;
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return list;
  if (!it->is_array())
    return Status::errorf("config.json: '{}' must be a list of layer indices", key);
  for (const auto& layer : *it) {
    if (!layer.is_number_integer() || layer.get<int64_t>() < 0 || layer.get<int64_t>() >= layers)
      return Status::errorf("config.json: '{}' entry {} is not a layer index in [0, {})", key,
                            layer.dump(), layers);
    list.push_back(layer.get<int>());
  }
  return list;
}

}  // namespace config_json

using namespace config_json;
using nlohmann::json;

bool sparse_step_layer(const ModelConfig& c, int layer) {
  if (c.num_experts <= 0) return false;
  if (std::find(c.mlp_only_layers.begin(), c.mlp_only_layers.end(), layer) !=
      c.mlp_only_layers.end())
    return false;
  return (layer + 1) % c.decoder_sparse_step == 0;
}

int64_t ModelConfig::kv_cache_values_per_token() const {
  int64_t values = 0;
  for (const LayerSpec& layer : layers)
    values += layer.attention.linear   ? 0
              : layer.attention.latent ? latent_attention.cache_row()
                                       : 2 * num_key_value_heads * head_dim;
  return values;
}

bool ModelConfig::is_moe_layer(int layer) const {
  return layer >= 0 && layer < static_cast<int>(layers.size()) &&
         layers[static_cast<size_t>(layer)].mlp == MlpKind::kMoe;
}

std::vector<int> ModelConfig::moe_layers() const {
  std::vector<int> moe;
  for (int layer = 0; layer < num_hidden_layers; ++layer)
    if (is_moe_layer(layer)) moe.push_back(layer);
  return moe;
}

int64_t ModelConfig::widest_dense_mlp() const {
  int64_t widest = 0;
  for (const LayerSpec& layer : layers) {
    if (layer.mlp == MlpKind::kDense) widest = std::max(widest, intermediate_size);
    if (layer.mlp == MlpKind::kMoe && layer.shared_expert)
      widest = std::max(widest, shared_expert_intermediate_size);
  }
  return widest;
}

namespace {

// YaRN's fields as transformers' _compute_yarn_parameters reads them (`key` names the object).
Status parse_yarn(const json& rope, const char* key, ModelConfig& c) {
  RopeScaling& y = c.rope_scaling;
  y.kind = RopeKind::kYarn;
  SY_ASSIGN(y.original_max_position_embeddings,
            get_int(rope, {"original_max_position_embeddings"}, false, 0));
  if (y.original_max_position_embeddings <= 0)
    return Status::errorf(
        "config.json: {}.original_max_position_embeddings must be a positive integer for yarn",
        key);
  // No factor: transformers takes max_position_embeddings / original_max_position_embeddings.
  SY_ASSIGN(y.factor, get_number(rope, "factor", 0.0));
  if (y.factor == 0.0)
    y.factor = static_cast<double>(c.max_position_embeddings) /
               static_cast<double>(y.original_max_position_embeddings);
  if (!(y.factor > 0.0))
    return Status::errorf("config.json: {}.factor must be > 0, got {}", key, y.factor);
  // transformers: `beta_fast or 32`, `beta_slow or 1` (0 and null both mean the default).
  SY_ASSIGN(y.beta_fast, get_number(rope, "beta_fast", 0.0));
  SY_ASSIGN(y.beta_slow, get_number(rope, "beta_slow", 0.0));
  if (y.beta_fast == 0.0) y.beta_fast = 32.0;
  if (y.beta_slow == 0.0) y.beta_slow = 1.0;
  SY_ASSIGN(y.truncate, get_bool(rope, "truncate", true));
  SY_ASSIGN(y.attention_factor, get_number(rope, "attention_factor", 0.0));
  SY_ASSIGN(y.mscale, get_number(rope, "mscale", 0.0));
  SY_ASSIGN(y.mscale_all_dim, get_number(rope, "mscale_all_dim", 0.0));
  SY_ASSIGN(double partial, get_number(rope, "partial_rotary_factor", 1.0));
  if (partial != 1.0)
    return Status::errorf("config.json: {}.partial_rotary_factor {} is not supported (only 1)", key,
                          partial);
  return Status::ok();
}

// The shapes every family shares (the adapter reads the rest).
Status parse_shared_fields(const json& config, ModelConfig& c) {
  SY_ASSIGN(c.vocab_size, get_int(config, {"vocab_size"}, true));
  SY_ASSIGN(c.hidden_size, get_int(config, {"hidden_size"}, true));
  SY_ASSIGN(c.num_hidden_layers, get_int(config, {"num_hidden_layers"}, true));
  SY_ASSIGN(c.num_attention_heads, get_int(config, {"num_attention_heads"}, true));
  SY_ASSIGN(c.num_key_value_heads,
            get_int(config, {"num_key_value_heads"}, false, c.num_attention_heads));
  SY_TRY(require_positive("hidden_size", c.hidden_size));
  SY_TRY(require_positive("num_attention_heads", c.num_attention_heads));
  SY_TRY(require_positive("num_hidden_layers", c.num_hidden_layers));
  if (c.num_hidden_layers > 100000)
    return Status::errorf("config.json: num_hidden_layers ({}) is implausibly large",
                          c.num_hidden_layers);
  SY_ASSIGN(c.head_dim,
            get_int(config, {"head_dim"}, false, c.hidden_size / c.num_attention_heads));
  SY_ASSIGN(c.max_position_embeddings, get_int(config, {"max_position_embeddings"}, false, 32768));
  SY_ASSIGN(c.tie_word_embeddings, get_bool(config, "tie_word_embeddings", false));
  SY_ASSIGN(double eps, get_number(config, "rms_norm_eps", 1e-6));
  c.rms_norm_eps = static_cast<float>(eps);

  // RoPE: transformers 4 writes rope_theta (+ rope_scaling); 5 writes rope_parameters.
  SY_ASSIGN(c.rope_theta, get_number(config, "rope_theta", 10000.0));
  if (auto it = config.find("rope_parameters"); it != config.end() && it->is_object()) {
    SY_ASSIGN(c.rope_theta, get_number(*it, "rope_theta", c.rope_theta));
  }
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    auto it = config.find(key);
    if (it == config.end() || it->is_null()) continue;
    if (!it->is_object()) return Status::errorf("config.json: '{}' must be an object", key);
    std::string type = "default";
    for (const char* type_key : {"rope_type", "type"})
      if (auto t = it->find(type_key); t != it->end() && t->is_string())
        type = t->get<std::string>();
    if (type == "yarn") {
      SY_TRY(parse_yarn(*it, key, c));
    } else if (type != "default") {
      return Status::errorf(
          "config.json: {}.rope_type '{}' is not supported yet (supported: default, yarn)", key,
          type);
    }
  }
  for (const char* key : {"torch_dtype", "dtype"})
    if (auto it = config.find(key); it != config.end() && it->is_string()) {
      c.torch_dtype = it->get<std::string>();
      break;
    }
  // Token ids: integers in [0, 2^31) (a vocabulary's range is checked where the tokenizer is).
  auto token_id = [](const char* key, const json& id) -> Result<int32_t> {
    if (id.is_number_unsigned() ? id.get<uint64_t>() > uint64_t{kMaxConfigInt}
                                : id.get<int64_t>() < 0 || id.get<int64_t>() > kMaxConfigInt)
      return Status::errorf("config.json: {} {} is not a token id", key, id.dump());
    return static_cast<int32_t>(id.get<int64_t>());
  };
  if (auto it = config.find("eos_token_id"); it != config.end()) {
    if (it->is_number_integer()) {
      SY_ASSIGN(int32_t id, token_id("eos_token_id", *it));
      c.eos_token_ids.push_back(id);
    } else if (it->is_array()) {
      for (const auto& entry : *it)
        if (entry.is_number_integer()) {
          SY_ASSIGN(int32_t id, token_id("eos_token_id", entry));
          c.eos_token_ids.push_back(id);
        }
    }
  }
  if (auto it = config.find("bos_token_id"); it != config.end() && it->is_number_integer()) {
    SY_ASSIGN(c.bos_token_id, token_id("bos_token_id", *it));
  }
  return Status::ok();
}

// Consistency of the whole description: counts positive, GQA divisible, one LayerSpec per
// layer, a router every stage can run.
Status check_description(const ModelConfig& c) {
  SY_TRY(require_positive("vocab_size", c.vocab_size));
  SY_TRY(require_positive("num_key_value_heads", c.num_key_value_heads));
  SY_TRY(require_positive("head_dim", c.head_dim));
  if (c.head_dim % 2)
    return Status::errorf("config.json: head_dim must be even for RoPE, got {}", c.head_dim);
  if (c.num_attention_heads % c.num_key_value_heads)
    return Status::errorf(
        "config.json: num_attention_heads ({}) must be a multiple of num_key_value_heads ({})",
        c.num_attention_heads, c.num_key_value_heads);
  if (static_cast<int64_t>(c.layers.size()) != c.num_hidden_layers)
    return Status::errorf("internal: the {} adapter described {} layers of {}", c.model_type,
                          c.layers.size(), c.num_hidden_layers);
  if (c.num_experts < 0)
    return Status::errorf("config.json: num_experts must be >= 0, got {}", c.num_experts);
  bool any_moe = false, any_dense = false;
  for (const LayerSpec& layer : c.layers) {
    any_moe |= layer.mlp == MlpKind::kMoe;
    any_dense |= layer.mlp == MlpKind::kDense;
    if (layer.attention.sliding_window < 0)
      return Status::errorf("config.json: sliding_window must be >= 0, got {}",
                            layer.attention.sliding_window);
    if (layer.shared_expert)
      SY_TRY(
          require_positive("shared_expert_intermediate_size", c.shared_expert_intermediate_size));
  }
  if (any_moe) {
    SY_TRY(require_positive("num_experts", c.num_experts));
    SY_TRY(require_positive("num_experts_per_tok", c.experts_per_token));
    SY_TRY(require_positive("moe_intermediate_size", c.moe_intermediate_size));
    if (c.experts_per_token > c.num_experts)
      return Status::errorf("config.json: num_experts_per_tok ({}) must be <= num_experts ({})",
                            c.experts_per_token, c.num_experts);
    if (c.num_experts > 65536)
      return Status::errorf("config.json: num_experts ({}) must be <= 65536", c.num_experts);
    if (c.router.num_experts != c.num_experts || c.router.top_k != c.experts_per_token)
      return Status::errorf("internal: the {} adapter's router does not match num_experts / top_k",
                            c.model_type);
    auto router = moe::validate_router_spec(c.router);
    if (!router) return Status::errorf("config.json: {}", router.message());
  }
  if (any_dense) SY_TRY(require_positive("intermediate_size", c.intermediate_size));
  return Status::ok();
}

}  // namespace

Result<ModelConfig> parse_model_config(const json& config) {
  if (!config.is_object()) return Status::error("config.json: expected a JSON object");
  ModelConfig c;
  auto archs = config.find("architectures");
  if (archs != config.end() && archs->is_array() && !archs->empty() && (*archs)[0].is_string())
    c.architecture = (*archs)[0].get<std::string>();
  if (auto it = config.find("model_type"); it != config.end() && it->is_string())
    c.model_type = it->get<std::string>();
  SY_ASSIGN(const Architecture* arch, find_architecture(c.model_type, c.architecture));
  c.model_type = std::string(arch->model_type);
  if (c.architecture.empty()) c.architecture = std::string(arch->class_name);
  // A multimodal wrapper (Qwen3.5) keeps the text model's fields in text_config: those, over the
  // wrapper's own (tie_word_embeddings, token ids), describe the model served.
  json fields = config;
  if (auto text = config.find("text_config"); text != config.end() && text->is_object()) {
    fields.erase("text_config");
    fields.erase("vision_config");
    for (auto it = text->begin(); it != text->end(); ++it) fields[it.key()] = it.value();
  }
  SY_TRY(parse_shared_fields(fields, c));
  SY_TRY(arch->parse(fields, c));
  SY_TRY(check_description(c));
  return c;
}

Result<ModelConfig> load_model_config(const std::string& model_dir) {
  std::string path = model_dir + "/config.json";
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::errorf("{}: cannot open (is '{}' a model folder?)", path, model_dir);
  std::stringstream text;
  text << in.rdbuf();
  json config = json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded()) return Status::errorf("{}: not valid JSON", path);
  auto parsed = parse_model_config(config);
  if (!parsed) return parsed.status().with_context(model_dir + "/");
  return parsed;
}

}  // namespace sy::model
