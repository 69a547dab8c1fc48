// RMSNorm of one row held in registers by a block of 256 threads, shared by every kernel that
// normalises a decode row (rms_norm_vec_kernel, the norm-fused GEMV, cuda-fused's input norm) so
// that each gives bitwise the same normed row: thread i holds float4 chunks i, i + 256, ... (VEC
// of them; width % 4 == 0, width <= VEC * 1024), one block reduction in a fixed order.
#pragma once

#include <type_traits>

#include "backend/cuda/cuda_context.h"

namespace sy::backend::cuda {

// Sum over the block (blockDim.x a multiple of 32, <= 1024), the same order in every thread.
__device__ __forceinline__ float block_sum(float v, float* shared) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < warps; ++w) total += shared[w];  // same order in every thread
  __syncthreads();
  return total;
}

// The fused input norm's residual update (MoeInputNorm): residual = ((residual + earlier_delta) +
// delta) + out, written by the kernel that writes out, each element read before out is written
// (earlier_delta may be out itself); the route kernel norms the same sum. residual == nullptr:
// none.
struct ResidualAdd {
  float* residual = nullptr;
  const float* earlier_delta = nullptr;  // or nullptr
  const float* delta = nullptr;
  __device__ __forceinline__ float before(int64_t i) const {
    float x = residual[i];
    if (earlier_delta) x += earlier_delta[i];
    return x + delta[i];
  }
};

// One round of loads (x and the deltas together), one block reduction, one round of stores:
// where the latency of each dependent round is the cost.
template <int VEC>
struct NormRow {
  float4 g[VEC], v[VEC];
  // The norm weight: constant over the step, so fetched before waiting for the previous kernel.
  __device__ __forceinline__ void load_weight(const float* weight, int64_t chunks) {
    const float4* w = reinterpret_cast<const float4*>(weight);
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const int64_t c = threadIdx.x + 256 * j;
      g[j] = c < chunks ? w[c] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  }
  __device__ __forceinline__ static void add(float4& a, const float4& b) {
    a.x += b.x, a.y += b.y, a.z += b.z, a.w += b.w;
  }
  // v = x (+ d1) (+ d2), added in that order.
  __device__ __forceinline__ void load_row(const float* x, const float* d1, const float* d2, int64_t chunks) {
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const int64_t c = threadIdx.x + 256 * j;
      v[j] = c < chunks ? reinterpret_cast<const float4*>(x)[c] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (d1 && c < chunks) add(v[j], reinterpret_cast<const float4*>(d1)[c]);
      if (d2 && c < chunks) add(v[j], reinterpret_cast<const float4*>(d2)[c]);
    }
  }
  // rsqrt(mean(v^2) + eps); every thread of the block calls it.
  __device__ __forceinline__ float scale(int64_t width, float eps, float* partial) const {
    float sum_squares = 0.0f;
#pragma unroll
    for (int j = 0; j < VEC; ++j)
      sum_squares += v[j].x * v[j].x + v[j].y * v[j].y + v[j].z * v[j].z + v[j].w * v[j].w;
    const float total = block_sum(sum_squares, partial);
    return rsqrtf(total / static_cast<float>(width) + eps);
  }
  __device__ __forceinline__ void store_row(float* dst, int64_t chunks) const {
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const int64_t c = threadIdx.x + 256 * j;
      if (c < chunks) reinterpret_cast<float4*>(dst)[c] = v[j];
    }
  }
  // The normed chunk j (chunk threadIdx.x + 256 j of the row).
  __device__ __forceinline__ float4 normed(int j, float s) const {
    return make_float4(g[j].x * (v[j].x * s), g[j].y * (v[j].y * s), g[j].z * (v[j].z * s),
                       g[j].w * (v[j].w * s));
  }
  __device__ __forceinline__ void store_normed(float* dst, int64_t chunks, float s) const {
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const int64_t c = threadIdx.x + 256 * j;
      if (c < chunks) reinterpret_cast<float4*>(dst)[c] = normed(j, s);
    }
  }
};

// VEC for a width (launch_rms_norm's choice; the fused kernels must pick the same).
__host__ __device__ constexpr int norm_row_vec(int64_t width) {
  return width <= 1024 ? 1 : width <= 2048 ? 2 : width <= 4096 ? 4 : 8;
}

// f(std::integral_constant<int, norm_row_vec(width)>{}): every launcher of a NormRow kernel picks
// its instantiation here.
template <class F>
void with_norm_row_vec(int64_t width, F&& f) {
  switch (norm_row_vec(width)) {
    case 1:
      f(std::integral_constant<int, 1>{});
      break;
    case 2:
      f(std::integral_constant<int, 2>{});
      break;
    case 4:
      f(std::integral_constant<int, 4>{});
      break;
    default:
      f(std::integral_constant<int, 8>{});
      break;
  }
}

}  // namespace sy::backend::cuda
