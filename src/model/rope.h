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

}  // namespace sy::model
