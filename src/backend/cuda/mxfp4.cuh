// MXFP4 on CUDA (gpt-oss's experts as stored: 32-value blocks of e2m1 codes, two a byte, low
// nibble first, and one e8m0 scale a block), shared by cuda-modular's grouped GEMM and GEMV and
// cuda-fused: exact decodes to bf16, the bf16x8 dot (also cuda-fused's bf16 path), and a warp's
// dot of MXFP4 rows with an f32 vector.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace sy::backend::cuda {

// e2m1 code (sign in bit 3) times 2^(scale - 127), as mxfp4_decode_row (tensor/mxfp4.h) computes
// it: the magnitude's f32 bits, times the block's power of two (exact; inf and 0 as ldexp gives).
__device__ __forceinline__ float mxfp4_value(uint32_t code, float block_scale) {
  const uint32_t c = code & 7u;
  const float magnitude = c < 2u ? 0.5f * static_cast<float>(c) : __uint_as_float((((c >> 1) + 126u) << 23) | ((c & 1u) << 22));
  const float v = c ? magnitude * block_scale : 0.0f;
  return code & 8u ? -v : v;
}
// 8 consecutive MXFP4 values (4 packed bytes, element j in bits 4j..4j+3) as 8 bf16, through
// mxfp4_value (f32, then rounded to bf16): the reference for the fast path below, and the path
// for the scales it does not cover.
__device__ __forceinline__ uint4 mxfp4_to_bf16x8_exact(uint32_t packed, uint8_t scale) {
  const float block_scale = ldexpf(1.0f, static_cast<int>(scale) - 127);
  uint4 out;
  uint32_t* words = reinterpret_cast<uint32_t*>(&out);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const __nv_bfloat162 pair = __floats2bfloat162_rn(mxfp4_value(packed >> (8 * j), block_scale),
                                                      mxfp4_value(packed >> (8 * j + 4), block_scale));
    words[j] = *reinterpret_cast<const uint32_t*>(&pair);
  }
  return out;
}
// The 8 e2m1 values of `packed` as bf16 pairs (element 2i low, 2i + 1 high of word i), unscaled:
// byte permutes look the magnitude's bf16 bytes up (codes 0..7: 0, 0.5, 1, 1.5, 2, 3, 4, 6; high
// bytes 00 3F 3F 3F 40 40 40 40, low bytes 00 00 80 C0 00 40 80 C0), each half's four sign bits go
// into its four high bytes (bit 7) before the pairs are formed. Exact (every e2m1 value is a bf16).
// ~18 integer instructions for 8 values (the sign merged per pair instead: ~22; the same bits, by
// a host emulation of the permutes over 20M words).
__device__ __forceinline__ uint4 mxfp4_unscaled_bf16x8(uint32_t packed) {
  const uint32_t evens = (packed << 4) & 0x80808080u;  // byte m, bit 7: sign of element 2m
  const uint32_t odds = packed & 0x80808080u;          // byte m, bit 7: sign of element 2m + 1
  uint4 out;
  uint32_t* words = reinterpret_cast<uint32_t*>(&out);
#pragma unroll
  for (int half = 0; half < 2; ++half) {  // elements 4 half .. 4 half + 3
    const uint32_t codes =
        (packed >> (16 * half)) & 0x7777u;  // 4 selectors (bit 3, PRMT's sign mode, cleared)
    const uint32_t signs =
        __byte_perm(evens, odds, half ? 0x7362u : 0x5140u);  // byte i: element 4 half + i
    const uint32_t high = __byte_perm(0x3F3F3F00u, 0x40404040u, codes) | signs;
    const uint32_t low = __byte_perm(0xC0800000u, 0xC0804000u, codes);
    words[2 * half] = __byte_perm(low, high, 0x5140u);
    words[2 * half + 1] = __byte_perm(low, high, 0x7362u);
  }
  return out;
}
// The 8 e2m1 values of `packed` as f16 pairs times 2^-14, by bit placement alone: a code's
// magnitude bits (e1 e0 m) go to f16 bits 9..11 and its sign to bit 15, which reads as
// 2^(E - 15) (1 + m/2) for E = e1e0 >= 1 and as the subnormal m 2^-15 for E = 0: every value is
// the e2m1 value times 2^-14, exactly (the caller scales the sums back). Word i holds elements i
// (low half) and i + 4 (high half), so a consumer's other operand must hold x in that order. Two
// shifts, an and, a three-input op a word: 15 instructions for 8 values, no constants in registers.
__device__ __forceinline__ uint4 mxfp4_f16x8_times_2m14(uint32_t packed) {
  constexpr uint32_t kMagnitudes = 0x0E000E00u, kSigns = 0x80008000u;
  uint4 out;
  out.x = ((packed << 9) & kMagnitudes) | ((packed << 12) & kSigns);
  out.y = ((packed << 5) & kMagnitudes) | ((packed << 8) & kSigns);
  out.z = ((packed << 1) & kMagnitudes) | ((packed << 4) & kSigns);
  out.w = ((packed >> 3) & kMagnitudes) | (packed & kSigns);
  return out;
}
// The same 8 values scaled: one bf16x2 multiply by 2^(scale - 127) per pair. Exact: a normal bf16
// times a power of two whose product is normal or infinite both ways; scales 0, 1 (subnormal
// products) and 255 (no zero times it) take the exact path.
__device__ __forceinline__ uint4 mxfp4_to_bf16x8(uint32_t packed, uint8_t scale) {
  if (scale < 2 || scale == 255) return mxfp4_to_bf16x8_exact(packed, scale);
  const uint32_t scale_bits = static_cast<uint32_t>(scale) << 7;
  const uint32_t scale_word = scale_bits | scale_bits << 16;
  const __nv_bfloat162 scale2 = *reinterpret_cast<const __nv_bfloat162*>(&scale_word);
  uint4 out = mxfp4_unscaled_bf16x8(packed);
  uint32_t* words = reinterpret_cast<uint32_t*>(&out);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __nv_bfloat162 value =
        __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&words[i]), scale2);
    words[i] = *reinterpret_cast<const uint32_t*>(&value);
  }
  return out;
}

// 8 bf16 (one uint4; element 2i in the low half of word i) times 8 f32, added to acc.
__device__ __forceinline__ float dot8(uint4 w, float4 a, float4 b, float acc) {
  acc = fmaf(__uint_as_float(w.x << 16), a.x, acc);
  acc = fmaf(__uint_as_float(w.x & 0xffff0000u), a.y, acc);
  acc = fmaf(__uint_as_float(w.y << 16), a.z, acc);
  acc = fmaf(__uint_as_float(w.y & 0xffff0000u), a.w, acc);
  acc = fmaf(__uint_as_float(w.z << 16), b.x, acc);
  acc = fmaf(__uint_as_float(w.z & 0xffff0000u), b.y, acc);
  acc = fmaf(__uint_as_float(w.w << 16), b.z, acc);
  acc = fmaf(__uint_as_float(w.w & 0xffff0000u), b.w, acc);
  return acc;
}

// 16-byte chunks (32 values) per lane per row in flight in mxfp4_rows_dot: k <= 4096 in one round.
constexpr int kMxfp4DotChunks = 4;

__device__ __forceinline__ float e8m0_scale(uint8_t s) {
  return s ? __uint_as_float(static_cast<uint32_t>(s) << 23)
           : __uint_as_float(0x00400000u);  // 2^(s-127)
}

// ROWS weight rows starting at `rows` (row stride k/2 bytes; rows past `valid` not read) dotted
// with x[0:k]; lane sums, reduced over the warp (every lane returns the totals). CHUNKS: 16-byte
// chunks per lane per row loaded before use (CHUNKS * ROWS * 4 registers). `loaded()` runs once,
// after the first round's weight and scale loads are issued and before x is read (a programmatic
// launch's wait goes there: the weights' DRAM latency then overlaps the previous kernel's tail).
struct NothingToWait {
  __device__ void operator()() const {}
};
template <int ROWS, int CHUNKS = kMxfp4DotChunks, typename Loaded = NothingToWait>
__device__ __forceinline__ void mxfp4_rows_dot(const uint8_t* __restrict__ rows,
                                               const uint8_t* __restrict__ row_scales, int valid,
                                               int k, const float* __restrict__ x,
                                               float (&acc)[ROWS], Loaded loaded = {}) {
  const int lane = threadIdx.x & 31;
  const int chunks = k / 32;
#pragma unroll
  for (int r = 0; r < ROWS; ++r) acc[r] = 0.0f;
  for (int base = 0; base < chunks; base += 32 * CHUNKS) {
    uint4 w[CHUNKS][ROWS];
    uint8_t sc[CHUNKS][ROWS];
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) {
      const int chunk = base + c * 32 + lane;
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        const bool ok = r < valid && chunk < chunks;
        w[c][r] = ok ? __ldg(reinterpret_cast<const uint4*>(
                           rows + static_cast<int64_t>(r) * (k / 2) + chunk * 16))
                     : make_uint4(0, 0, 0, 0);
        sc[c][r] = ok ? row_scales[static_cast<int64_t>(r) * chunks + chunk] : uint8_t{127};
      }
    }
    if (base == 0) loaded();
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) {
      const int chunk = base + c * 32 + lane;
      if (chunk >= chunks) continue;
      float partial[ROWS];
#pragma unroll
      for (int r = 0; r < ROWS; ++r) partial[r] = 0.0f;
      const float* xs = x + chunk * 32;
#pragma unroll
      for (int word = 0; word < 4; ++word) {
        const float4 x0 = *reinterpret_cast<const float4*>(xs + word * 8);
        const float4 x1 = *reinterpret_cast<const float4*>(xs + word * 8 + 4);
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
          const uint32_t packed = word == 0   ? w[c][r].x
                                  : word == 1 ? w[c][r].y
                                  : word == 2 ? w[c][r].z
                                              : w[c][r].w;
          partial[r] = dot8(mxfp4_unscaled_bf16x8(packed), x0, x1, partial[r]);
        }
      }
#pragma unroll
      for (int r = 0; r < ROWS; ++r) acc[r] = fmaf(partial[r], e8m0_scale(sc[c][r]), acc[r]);
    }
  }
#pragma unroll
  for (int r = 0; r < ROWS; ++r)
    for (int offset = 16; offset > 0; offset >>= 1)
      acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], offset);
}

}  // namespace sy::backend::cuda
