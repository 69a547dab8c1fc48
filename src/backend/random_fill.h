// The deterministic weight generator behind --random-weights: element i of a tensor seeded with
// `seed` is offset + scale * u, u uniform in [-1, 1) from a counter hash of (seed, i), so every
// backend (and the CUDA kernels, which include this header) produces the same numbers.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define SY_HOST_DEVICE __host__ __device__
#else
#define SY_HOST_DEVICE
#endif

namespace sy::backend {

SY_HOST_DEVICE inline uint64_t random_fill_hash(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

SY_HOST_DEVICE inline float random_fill_value(uint64_t seed, uint64_t index, float scale, float offset) {
  const uint64_t bits = random_fill_hash(random_fill_hash(seed) ^ index);
  const float u = static_cast<float>(bits >> 40) * (2.0f / 16777216.0f) - 1.0f;  // [-1, 1)
  return offset + scale * u;
}

// A byte of a packed (U8) tensor: lo + floor(u * span), u = random_fill_value(seed, index, 0.5,
// 0.5) in [0, 1) (MXFP4 blocks: lo 0, span 255.999; their e8m0 scales: lo 117, span 3.999).
SY_HOST_DEVICE inline uint8_t random_fill_byte(uint64_t seed, uint64_t index, int lo, float span) {
  const float u = random_fill_value(seed, index, 0.5f, 0.5f);
  return static_cast<uint8_t>(lo + static_cast<int>(u * span));
}

}  // namespace sy::backend
