// MXFP4 (OCP MX) as gpt-oss checkpoints store it: 32-value blocks of e2m1 codes, two a byte (low
// nibble first), one e8m0 scale per block (2^(scale - 127)). One decoder for every reader (the CPU
// expert kernels, the loader's restack to bf16).
#pragma once

#include <cmath>
#include <cstdint>

namespace sy {

// e2m1 code -> value (sign in bit 3), as the OCP MX spec and transformers' FP4_VALUES.
inline constexpr float kE2m1Values[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                          -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

// One row of `in` values (in % 32 == 0) from its in / 32 blocks of 16 bytes and in / 32 scales.
inline void mxfp4_decode_row(const uint8_t* blocks, const uint8_t* scales, int64_t in, float* dst) {
  for (int64_t g = 0; g < in / 32; ++g) {
    const int exponent = static_cast<int>(scales[g]) - 127;  // e8m0
    for (int64_t j = 0; j < 16; ++j) {
      const uint8_t byte = blocks[g * 16 + j];
      dst[g * 32 + 2 * j] = std::ldexp(kE2m1Values[byte & 0x0f], exponent);
      dst[g * 32 + 2 * j + 1] = std::ldexp(kE2m1Values[byte >> 4], exponent);
    }
  }
}

}  // namespace sy
