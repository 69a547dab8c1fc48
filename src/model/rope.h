// RoPE's inverse frequencies and cos/sin factor for a model's RopeScaling, computed in f32 the
// way transformers does (modeling_rope_utils: _compute_yarn_parameters), once at start-up.
#pragma once

#include <vector>

#include "model/config.h"

namespace sy::model {

struct RopeTable {
  std::vector<float> inv_freq;  // head_dim / 2 entries; empty for plain RoPE (theta's)
  float attention_factor = 1.0f;
};

RopeTable rope_table(const ModelConfig& config);

// The dims partial rotary turns, as transformers derives them: int(head_dim x
// partial_rotary_factor), the factor read from rope_parameters (transformers 5), else the top
// level (4), else `default_factor` (the family's config class default). Refused unless even and
// in (0, head_dim]; head_dim itself means every dim.
Result<int64_t> partial_rotary_dim(const nlohmann::json& config, int64_t head_dim,
                                   double default_factor);

}  // namespace sy::model
