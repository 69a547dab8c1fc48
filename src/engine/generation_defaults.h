// Default sampling parameters from a model's generation_config.json, as vLLM applies them
// (temperature, top_p, top_k, min_p, repetition_penalty); a request's own values override.
#pragma once

#include <string>

#include "engine/engine.h"

namespace sy::engine {

// Missing file -> SamplingParams{} defaults. A malformed file is an error naming it.
Result<SamplingParams> load_generation_defaults(const std::string& model_dir);

}  // namespace sy::engine
