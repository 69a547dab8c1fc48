#include "tensor/dtype.h"

#include <cmath>

namespace sy {
namespace {
struct DTypeInfo {
  DType dtype;
  std::string_view name;
  size_t bits;
};
constexpr DTypeInfo kDTypes[] = {
    {DType::kF32, "F32", 32},         {DType::kF16, "F16", 16},
    {DType::kBF16, "BF16", 16},       {DType::kF64, "F64", 64},
    {DType::kI64, "I64", 64},         {DType::kI32, "I32", 32},
    {DType::kI16, "I16", 16},         {DType::kI8, "I8", 8},
    {DType::kU8, "U8", 8},            {DType::kU16, "U16", 16},
    {DType::kU32, "U32", 32},         {DType::kU64, "U64", 64},
    {DType::kBool, "BOOL", 8},        {DType::kF8E4M3, "F8_E4M3", 8},
    {DType::kF8E5M2, "F8_E5M2", 8},   {DType::kF8E8M0, "F8_E8M0", 8},
    {DType::kF8E4M3FNUZ, "F8_E4M3FNUZ", 8}, {DType::kF8E5M2FNUZ, "F8_E5M2FNUZ", 8},
    {DType::kF4, "F4", 4},            {DType::kF6E2M3, "F6_E2M3", 6},
    {DType::kF6E3M2, "F6_E3M2", 6},   {DType::kC64, "C64", 64},
};
}  // namespace

size_t dtype_bits(DType dtype) {
  for (const auto& info : kDTypes)
    if (info.dtype == dtype) return info.bits;
  return 0;
}
size_t dtype_size(DType dtype) {
  size_t bits = dtype_bits(dtype);
  return bits % 8 == 0 ? bits / 8 : 0;
}
std::string_view dtype_name(DType dtype) {
  for (const auto& info : kDTypes)
    if (info.dtype == dtype) return info.name;
  return "?";
}
std::optional<DType> dtype_from_name(std::string_view name) {
  for (const auto& info : kDTypes)
    if (info.name == name) return info.dtype;
  return std::nullopt;
}

float f16_to_f32(uint16_t bits) {
  uint32_t sign = (bits >> 15) & 1, exponent = (bits >> 10) & 0x1f, mantissa = bits & 0x3ff;
  float value;
  if (exponent == 0) {
    value = std::ldexp(static_cast<float>(mantissa), -24);
  } else if (exponent == 31) {
    value = mantissa ? NAN : INFINITY;
  } else {
    value = std::ldexp(static_cast<float>(mantissa | 0x400), static_cast<int>(exponent) - 25);
  }
  return sign ? -value : value;
}

uint16_t f32_to_f16(float value) {
  uint32_t word;
  std::memcpy(&word, &value, sizeof word);
  uint32_t sign = (word >> 16) & 0x8000;
  int32_t exponent = static_cast<int32_t>((word >> 23) & 0xff) - 127 + 15;
  uint32_t mantissa = word & 0x7fffff;
  if (((word >> 23) & 0xff) == 0xff) return static_cast<uint16_t>(sign | 0x7c00 | (mantissa ? 0x200 : 0));
  if (exponent >= 31) return static_cast<uint16_t>(sign | 0x7c00);
  if (exponent <= 0) {
    if (exponent < -10) return static_cast<uint16_t>(sign);
    mantissa |= 0x800000;
    uint32_t shift = static_cast<uint32_t>(14 - exponent);
    uint32_t half = mantissa >> shift;
    uint32_t rest = mantissa & ((1u << shift) - 1), halfway = 1u << (shift - 1);
    if (rest > halfway || (rest == halfway && (half & 1))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = sign | (static_cast<uint32_t>(exponent) << 10) | (mantissa >> 13);
  uint32_t rest = mantissa & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (half & 1))) ++half;
  return static_cast<uint16_t>(half);
}

}  // namespace sy
