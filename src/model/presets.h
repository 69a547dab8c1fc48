// Model presets for `make-model`: Hugging Face config.json contents for the shapes we build
// random checkpoints of (the built-in default `tiny`, and the real Qwen3-30B-A3B shapes).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "util/status.h"

namespace sy::model {

// `layers` > 0 cuts the depth (keeping the preset's dense/MoE pattern for the kept layers).
Result<nlohmann::json> preset_config(const std::string& arch, const std::string& preset, int layers);
nlohmann::json preset_generation_config(const std::string& preset);

// Writes a checkpoint with seeded random weights (router weights scaled so routing is decisive)
// for `config` into model_dir: config.json, safetensors, generation_config.json. Tokenizer files
// are the caller's job.
Status write_random_checkpoint(const nlohmann::json& config, const nlohmann::json& generation_config,
                               const std::string& model_dir, uint64_t seed, bool show_progress);

}  // namespace sy::model
