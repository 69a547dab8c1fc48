// RoPE's frequencies as a launch parameter (by value: no device table to keep in sync, and a
// recorded graph carries them): inv_freq[i] for the rotary_dims / 2 rotate-half pairs, either
// the model's own (YaRN: RopeSpec::inv_freq) or f32(1 / theta^(2i / rotary_dims)) computed in
// double as the CPU backend computes it, and YaRN's attention factor that multiplies cos and sin.
#pragma once

#include <cmath>

namespace sy::backend::cuda {

constexpr int kRopeMaxHalf = 128;  // head_dim <= 256

struct RopeTable {
  float inv_freq[kRopeMaxHalf];
  float factor = 1.0f;
};

// `rotary_dims`: the dims that turn (all of a head's unless partial rotary), even, <= 256.
inline RopeTable make_rope_table(double theta, int rotary_dims, const float* inv_freq, float factor) {
  RopeTable table{};
  for (int i = 0; i < rotary_dims / 2 && i < kRopeMaxHalf; ++i)
    table.inv_freq[i] = inv_freq ? inv_freq[i]
                                 : static_cast<float>(1.0 / std::pow(theta, static_cast<double>(2 * i) /
                                                                                static_cast<double>(rotary_dims)));
  table.factor = factor;
  return table;
}

}  // namespace sy::backend::cuda
