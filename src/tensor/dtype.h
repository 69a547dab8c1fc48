// Element types the engine knows, with their safetensors names and sizes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace sy {

enum class DType : uint8_t {
  kF32, kF16, kBF16, kF64, kI64, kI32, kI16, kI8, kU8, kU16, kU32, kU64, kBool, kF8E4M3, kF8E5M2,
  // Known to the safetensors reader for validation; nothing computes with them yet.
  kF8E8M0, kF8E4M3FNUZ, kF8E5M2FNUZ, kF4, kF6E2M3, kF6E3M2, kC64,
};

// Bytes per element; 0 for the sub-byte types (F4, F6_*): use dtype_bits for those.
size_t dtype_size(DType dtype);
// Bits per element (4 for F4, 6 for F6_*, 8 * dtype_size otherwise).
size_t dtype_bits(DType dtype);
// Safetensors spelling ("BF16", "F32", ...).
std::string_view dtype_name(DType dtype);
std::optional<DType> dtype_from_name(std::string_view name);

inline float bf16_to_f32(uint16_t bits) {
  uint32_t word = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &word, sizeof value);
  return value;
}
// Round to nearest even, as torch does; NaN stays NaN.
inline uint16_t f32_to_bf16(float value) {
  uint32_t word;
  std::memcpy(&word, &value, sizeof word);
  if ((word & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((word >> 16) | 0x40);
  word += 0x7fffu + ((word >> 16) & 1u);
  return static_cast<uint16_t>(word >> 16);
}
float f16_to_f32(uint16_t bits);
uint16_t f32_to_f16(float value);

}  // namespace sy
