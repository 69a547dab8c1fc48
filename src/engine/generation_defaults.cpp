#include "engine/generation_defaults.h"

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

namespace sy::engine {

Result<SamplingParams> load_generation_defaults(const std::string& model_dir) {
  SamplingParams params;
  const std::string path = model_dir + "/generation_config.json";
  std::ifstream in(path);
  if (!in) return params;
  std::stringstream text;
  text << in.rdbuf();
  auto config = nlohmann::json::parse(text.str(), nullptr, false);
  if (config.is_discarded() || !config.is_object()) return Status::errorf("{}: not a JSON object", path);
  auto number = [&](const char* key, auto& field) -> Status {
    auto it = config.find(key);
    if (it == config.end() || it->is_null()) return Status::ok();
    if (!it->is_number()) return Status::errorf("{}: '{}' must be a number", path, key);
    field = it->get<std::decay_t<decltype(field)>>();
    return Status::ok();
  };
  SY_TRY(number("temperature", params.temperature));
  SY_TRY(number("top_p", params.top_p));
  SY_TRY(number("top_k", params.top_k));
  SY_TRY(number("min_p", params.min_p));
  SY_TRY(number("repetition_penalty", params.repetition_penalty));
  if (params.top_k == 0) params.top_k = -1;  // HF's "off"
  return params;
}

}  // namespace sy::engine
