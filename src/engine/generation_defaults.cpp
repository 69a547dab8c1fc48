#include "engine/generation_defaults.h"

#include <cmath>
#include <fstream>
#include <limits>
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
  // Each field in the range a request's own value must have (server/api.cpp), so that a bad file
  // is refused here, naming it, instead of failing every request (or reaching the sampler).
  auto number = [&](const char* key, float& field, double low, bool low_open,
                    double high) -> Status {
    auto it = config.find(key);
    if (it == config.end() || it->is_null()) return Status::ok();
    if (!it->is_number()) return Status::errorf("{}: '{}' must be a number", path, key);
    const double value = it->get<double>();
    if (value < low || (low_open && value == low) || value > high)
      return Status::errorf("{}: '{}' is {}; it must be in {}{}, {}]", path, key, it->dump(),
                            low_open ? "(" : "[", low, high);
    field = static_cast<float>(value);
    return Status::ok();
  };
  SY_TRY(number("temperature", params.temperature, 0, false, 2));
  SY_TRY(number("top_p", params.top_p, 0, true, 1));
  SY_TRY(number("min_p", params.min_p, 0, false, 1));
  SY_TRY(number("repetition_penalty", params.repetition_penalty, 0, true, 2));
  if (auto it = config.find("top_k"); it != config.end() && !it->is_null()) {
    const double value = it->is_number() ? it->get<double>() : std::nan("");
    if (!(value >= -1 && value <= std::numeric_limits<int32_t>::max()) ||
        value != std::floor(value))
      return Status::errorf("{}: 'top_k' is {}; it must be -1 (off), 0 (off) or a positive integer",
                            path, it->dump());
    params.top_k = value == 0 ? -1 : static_cast<int>(value);  // 0: HF's "off"
  }
  return params;
}

}  // namespace sy::engine
