#include "backend/cpu/cpu_matmul.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>

namespace sy::backend::cpu {
namespace {

// The accumulation order every path shares: 16 lanes (two 8-lane halves without AVX-512) over
// full blocks of 16, a fixed-order lane reduction, then the tail in index order.
#if defined(__AVX512F__)
inline __m512 load16(const uint16_t* w) {
  __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}
inline __m512 load16(const float* w) { return _mm512_loadu_ps(w); }

template <int kRows, typename W>
inline void dot_block(const float* const* x, const W* w, int64_t in, float* results) {
  __m512 acc[kRows];
  for (int r = 0; r < kRows; ++r) acc[r] = _mm512_setzero_ps();
  int64_t full = in & ~int64_t{15};
  for (int64_t i = 0; i < full; i += 16) {
    __m512 wv = load16(w + i);
    for (int r = 0; r < kRows; ++r) acc[r] = _mm512_fmadd_ps(_mm512_loadu_ps(x[r] + i), wv, acc[r]);
  }
  for (int r = 0; r < kRows; ++r) {
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, acc[r]);
    float sum = 0.0f;
    for (int l = 0; l < 16; ++l) sum += lanes[l];
    for (int64_t i = full; i < in; ++i) {
      float wi;
      if constexpr (sizeof(W) == 2) wi = bf16_to_f32(w[i]); else wi = w[i];
      sum += x[r][i] * wi;
    }
    results[r] = sum;
  }
}
#else
template <int kRows, typename W>
inline void dot_block(const float* const* x, const W* w, int64_t in, float* results) {
  for (int r = 0; r < kRows; ++r) {
    float lanes[16] = {};
    int64_t full = in & ~int64_t{15};
    for (int64_t i = 0; i < full; i += 16)
      for (int l = 0; l < 16; ++l) {
        float wi;
        if constexpr (sizeof(W) == 2) wi = bf16_to_f32(w[i + l]); else wi = w[i + l];
        lanes[l] = __builtin_fmaf(x[r][i + l], wi, lanes[l]);
      }
    float sum = 0.0f;
    for (int l = 0; l < 16; ++l) sum += lanes[l];
    for (int64_t i = full; i < in; ++i) {
      float wi;
      if constexpr (sizeof(W) == 2) wi = bf16_to_f32(w[i]); else wi = w[i];
      sum += x[r][i] * wi;
    }
    results[r] = sum;
  }
}
#endif

template <typename W>
void matmul_range(const float* x, int64_t x_stride, int64_t rows, const W* w, int64_t in,
                  const float* bias, float* out, int64_t out_stride, int64_t o_begin,
                  int64_t o_end) {
  constexpr int kBlock = 4;
  // Walk 64 output rows at a time so their weights stay in L1/L2 across the row blocks.
  constexpr int64_t kTile = 64;
  for (int64_t o0 = o_begin; o0 < o_end; o0 += kTile) {
    int64_t o1 = std::min(o_end, o0 + kTile);
    int64_t r = 0;
    for (; r + kBlock <= rows; r += kBlock) {
      const float* xs[kBlock];
      for (int b = 0; b < kBlock; ++b) xs[b] = x + (r + b) * x_stride;
      for (int64_t o = o0; o < o1; ++o) {
        float results[kBlock];
        dot_block<kBlock>(xs, w + o * in, in, results);
        for (int b = 0; b < kBlock; ++b)
          out[(r + b) * out_stride + o] = bias ? results[b] + bias[o] : results[b];
      }
    }
    for (; r < rows; ++r) {
      const float* xs[1] = {x + r * x_stride};
      for (int64_t o = o0; o < o1; ++o) {
        float result;
        dot_block<1>(xs, w + o * in, in, &result);
        out[r * out_stride + o] = bias ? result + bias[o] : result;
      }
    }
  }
}

}  // namespace

void matmul_rows(const float* x, int64_t x_stride, int64_t rows, const Tensor& w, const float* bias,
                 float* out, int64_t out_stride, ThreadPool* pool) {
  const int64_t out_features = w.dim(0), in = w.dim(1);
  auto body = [&](int64_t begin, int64_t end) {
    if (w.dtype == DType::kBF16)
      matmul_range(x, x_stride, rows, w.ptr<uint16_t>(), in, bias, out, out_stride, begin, end);
    else
      matmul_range(x, x_stride, rows, w.ptr<float>(), in, bias, out, out_stride, begin, end);
  };
  // Enough work per thread to pay for waking it: ~64k multiply-adds.
  int64_t grain = std::max<int64_t>(16, 65536 / std::max<int64_t>(1, in * rows));
  if (pool) pool->parallel_for(out_features, grain, body);
  else body(0, out_features);
}

float dot_row(const float* x, const Tensor& w, int64_t w_row) {
  const int64_t in = w.dim(1);
  const float* xs[1] = {x};
  float result;
  if (w.dtype == DType::kBF16) dot_block<1>(xs, w.ptr<uint16_t>() + w_row * in, in, &result);
  else dot_block<1>(xs, w.ptr<float>() + w_row * in, in, &result);
  return result;
}

}  // namespace sy::backend::cpu
