#include "backend/cuda/elementwise.h"

#include "backend/cuda/norm_row.cuh"

#include "backend/random_fill.h"

namespace sy::backend::cuda {
namespace {

constexpr int kThreads = 256;

// Bytes: tokens * hidden * (2 read + 4 written).
__global__ void embedding_kernel(const __nv_bfloat16* table, const int32_t* ids, int64_t hidden, float* out) {
  const int64_t t = blockIdx.y;
  const __nv_bfloat16* row = table + static_cast<int64_t>(ids[t]) * hidden;
  for (int64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < hidden; i += gridDim.x * blockDim.x)
    out[t * hidden + i] = __bfloat162float(row[i]);
}

// One block per row; the row stays in registers/L1 between the two passes. Bytes: rows * width *
// 8 (12 with the residual).
__global__ void rms_norm_kernel(float* x, const float* residual, const float* weight, int64_t width,
                                float eps, float* out, const float* earlier) {
  __shared__ float partial[32];
  overlap_prologue();
  float* row = x + blockIdx.x * width;
  float sum_squares = 0.0f;
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) {
    float v = row[i];
    if (earlier) v += earlier[blockIdx.x * width + i];
    if (residual) {
      v += residual[blockIdx.x * width + i];
      row[i] = v;
    }
    sum_squares += v * v;
  }
  const float total = block_sum(sum_squares, partial);
  const float scale = rsqrtf(total / static_cast<float>(width) + eps);
  float* dst = out + blockIdx.x * width;
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) dst[i] = weight[i] * (row[i] * scale);
}

// The same norm with the row in registers (NormRow, norm_row.cuh): the small-batch decode path.
template <int VEC>
__global__ void __launch_bounds__(256)
    rms_norm_vec_kernel(float* x, const float* residual, const float* weight, int64_t width,
                        float eps, float* out, const float* earlier) {
  __shared__ float partial[32];
  const int64_t chunks = width / 4;
  NormRow<VEC> n;
  n.load_weight(weight, chunks);
  overlap_prologue();
  float* row = x + blockIdx.x * width;
  // (earlier is set only with residual: x + earlier + residual, in that order.)
  n.load_row(row, earlier ? earlier + blockIdx.x * width : nullptr,
             residual ? residual + blockIdx.x * width : nullptr, chunks);
  if (residual) n.store_row(row, chunks);
  const float s = n.scale(width, eps, partial);
  n.store_normed(out + blockIdx.x * width, chunks, s);
}

__global__ void add_kernel(float* x, const float* y, int64_t count) {
  overlap_prologue();  // (launched overlapped)
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] += y[i];
}

__global__ void add_bias_kernel(float* out, const float* bias, int64_t rows, int64_t width) {
  const int64_t count = rows * width;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] += bias[i % width];
}

// silu(g) * u as silu_mul_kernel computes it.
__device__ __forceinline__ float silu_times(float g, float u) {
  return g / (1.0f + expf(-g)) * u;
}
// The shared expert's gate, as add_sigmoid_gated_kernel computes it.
__device__ __forceinline__ float sigmoid_of(float logit) {
  return 1.0f / (1.0f + expf(-logit));
}

__global__ void silu_mul_kernel(const float* gate, const float* up, int64_t count, float* out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = silu_times(gate[i], up[i]);
  }
}

// Qwen2-MoE's shared expert: out[r] += sigmoid(gate_logit[r]) * y[r], the CPU backend's arithmetic.
__global__ void add_sigmoid_gated_kernel(float* out, const float* y, const float* gate_logit, int64_t count,
                                         int64_t width) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] += sigmoid_of(gate_logit[i / width]) * y[i];
  }
}

// Rotate-half RoPE as transformers computes it in f32: angle = f32(position) * inv_freq (the
// table's: theta's computed in double on the host, or YaRN's), cos and sin times the table's
// attention factor; only the first rotary_dims dims of each head turn (partial rotary), pairs
// (i, i + rotary_dims / 2), the rest pass through.
__global__ void rope_kernel(float* x, const int32_t* positions, int64_t heads, int64_t head_dim, int rotary_dims,
                            const __grid_constant__ RopeTable table) {
  const int64_t t = blockIdx.x;
  const int64_t half = rotary_dims / 2;
  const float position = static_cast<float>(positions[t]);
  for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
    const float angle = position * table.inv_freq[i];
    const float c = cosf(angle) * table.factor, s = sinf(angle) * table.factor;
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + (t * heads + h) * head_dim;
      const float a = v[i], b = v[i + half];
      v[i] = a * c - b * s;
      v[i + half] = b * c + a * s;
    }
  }
}

__global__ void gather_rows_kernel(const float* x, const int32_t* rows, int64_t width, float* out) {
  const int64_t r = blockIdx.y;
  const float* src = x + static_cast<int64_t>(rows[r]) * width;
  for (int64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < width; i += gridDim.x * blockDim.x)
    out[r * width + i] = src[i];
}

__global__ void fill_i32_kernel(int32_t* dst, int64_t count, int32_t value) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[i] = value;
}

__global__ void fill_random_kernel(void* dst, bool bf16, int64_t count, uint64_t seed, float scale, float offset) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float value = random_fill_value(seed, static_cast<uint64_t>(i), scale, offset);
    if (bf16) static_cast<__nv_bfloat16*>(dst)[i] = __float2bfloat16_rn(value);
    else static_cast<float*>(dst)[i] = value;
  }
}

__global__ void fill_random_bytes_kernel(uint8_t* dst, int64_t count, uint64_t seed, int lo,
                                         float span) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[i] = random_fill_byte(seed, static_cast<uint64_t>(i), lo, span);
}

__global__ void f32_to_bf16_kernel(const float* src, int64_t count, __nv_bfloat16* dst) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[i] = __float2bfloat16_rn(src[i]);
}

// One warp per output feature; lane l reads 8 consecutive weights (16 bytes) of each 256-wide
// slab, up to eight slabs in flight (a 2048-wide row is one round of loads). x rows (f32, at most
// kGemvMaxRows) come from L1/L2. Blocks [block_begin[p], block_begin[p + 1]) serve part p, so
// q, k and v (one input, several weights) are one launch.
struct GemvParts {
  const __nv_bfloat16* w[kGemvMaxParts];
  float* out[kGemvMaxParts];
  const float* bias[kGemvMaxParts];  // or nullptr
  int64_t features[kGemvMaxParts];
  int block_begin[kGemvMaxParts + 1];
  int count;
};

__device__ __forceinline__ void bf16x8_to_f32(const uint4& packed, float (&wf)[8]) {
  const __nv_bfloat162* w2 = reinterpret_cast<const __nv_bfloat162*>(&packed);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float2 f = __bfloat1622float2(w2[j]);
    wf[2 * j] = f.x;
    wf[2 * j + 1] = f.y;
  }
}

// acc += x . w for 8 columns (the one expression every GEMV here uses: the same bits).
__device__ __forceinline__ float dot8(float acc, const float4& a, const float4& b,
                                      const float (&wf)[8]) {
  return acc + (a.x * wf[0] + a.y * wf[1] + a.z * wf[2] + a.w * wf[3] + b.x * wf[4] + b.y * wf[5] +
                b.z * wf[6] + b.w * wf[7]);
}

// A lane's next kUnroll slabs of a weight row (8 bf16 each, slabs 256 apart from `base`; past
// `in`: zeros, nothing read), and a warp's sum of its lanes' partial dots: every GEMV here
// loads and reduces alike.
template <int kUnroll>
__device__ __forceinline__ void load_slabs(uint4 (&packed)[kUnroll], const __nv_bfloat16* row,
                                           int64_t base, int64_t in, bool active = true) {
#pragma unroll
  for (int u = 0; u < kUnroll; ++u)
    packed[u] = active && base + u * 256 < in
                    ? __ldg(reinterpret_cast<const uint4*>(row + base + u * 256))
                    : make_uint4(0, 0, 0, 0);
}
__device__ __forceinline__ float warp_total(float v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

template <int ROWS>
__device__ __forceinline__ void gemv_slab(const float* __restrict__ x, int64_t in, int64_t col,
                                          const uint4& packed, float (&acc)[ROWS]) {
  float wf[8];
  bf16x8_to_f32(packed, wf);
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    const float4 a = *reinterpret_cast<const float4*>(x + r * in + col);
    const float4 b = *reinterpret_cast<const float4*>(x + r * in + col + 4);
    acc[r] = dot8(acc[r], a, b, wf);
  }
}

__device__ __forceinline__ float4 silu_times4(const float4& g, const float4& u) {
  return make_float4(silu_times(g.x, u.x), silu_times(g.y, u.y), silu_times(g.z, u.z),
                     silu_times(g.w, u.w));
}

// UNROLL: slabs of 256 columns in flight per lane (0: 8 for one or two rows, else 4); 16 for one
// row of 2048 < in <= 4096 (the output projection: the whole row in one round).
template <int ROWS, int UNROLL = 0>
__global__ void __launch_bounds__(256) gemv_kernel(const float* __restrict__ x, int64_t in,
                                                   const __grid_constant__ GemvParts parts) {
  int part = 0;
  while (part + 1 < parts.count && static_cast<int>(blockIdx.x) >= parts.block_begin[part + 1]) ++part;
  const int64_t out_features = parts.features[part];
  const int64_t o = (static_cast<int64_t>(blockIdx.x) - parts.block_begin[part]) * 8 + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (o >= out_features) return;  // reads nothing the previous kernel writes: no wait needed
  const __nv_bfloat16* row = parts.w[part] + o * in;
  float acc[ROWS];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) acc[r] = 0.0f;
  // Eight slabs in flight for one or two rows (a 2048-wide row is one round), four for more
  // rows (their x values need the registers); out-of-range slabs load nothing.
  constexpr int kUnroll = UNROLL > 0 ? UNROLL : ROWS <= 2 ? 8 : 4;
  // The weights are not written by any kernel of the step, so the first round is requested
  // before waiting for the previous kernel (which writes x): under a programmatic launch the
  // DRAM latency of that round hides behind the previous kernel's tail.
  uint4 packed[kUnroll];
  int64_t base = lane * 8;
  load_slabs(packed, row, base, in);
  overlap_prologue();
  while (true) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (base + u * 256 < in) gemv_slab<ROWS>(x, in, base + u * 256, packed[u], acc);
    base += kUnroll * 256;
    if (base >= in) break;
    load_slabs(packed, row, base, in);
  }
  float* out = parts.out[part];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    const float v = warp_total(acc[r]);
    if (lane == 0) out[r * out_features + o] = parts.bias[part] ? v + parts.bias[part][o] : v;
  }
}

// gemv_kernel<1> on rms_norm(x + delta) * norm_weight (one row, the batch-1 decode), the norm
// computed by every block into shared memory (NormRow: bitwise the unfused norm) while its
// first round of weights is in flight; x is not written. Dynamic shared memory: in floats.
template <int VEC>
__global__ void __launch_bounds__(256)
    norm_gemv_kernel(const float* __restrict__ x, const float* __restrict__ delta,
                     const float* __restrict__ norm_weight, float eps, int64_t in,
                     const __grid_constant__ GemvParts parts) {
  extern __shared__ float4 s_normed4[];
  float* s_normed = reinterpret_cast<float*>(s_normed4);
  __shared__ float partial[32];
  int part = 0;
  while (part + 1 < parts.count && static_cast<int>(blockIdx.x) >= parts.block_begin[part + 1]) ++part;
  const int64_t out_features = parts.features[part];
  const int64_t o =
      (static_cast<int64_t>(blockIdx.x) - parts.block_begin[part]) * 8 + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  const bool active = o < out_features;  // every warp joins the norm's block reduction
  const __nv_bfloat16* row = parts.w[part] + (active ? o : 0) * in;
  constexpr int kUnroll = 8;
  uint4 packed[kUnroll];
  const int64_t chunks = in / 4;
  NormRow<VEC> n;
  load_slabs(packed, row, lane * 8, in, active);
  n.load_weight(norm_weight, chunks);
  overlap_prologue();
  n.load_row(x, delta, nullptr, chunks);
  n.store_normed(s_normed, chunks, n.scale(in, eps, partial));
  __syncthreads();
  if (!active) return;
  float acc[1] = {0.0f};
  for (int64_t base = lane * 8; base < in; base += kUnroll * 256) {
    if (base != lane * 8) load_slabs(packed, row, base, in);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (base + u * 256 < in) gemv_slab<1>(s_normed, in, base + u * 256, packed[u], acc);
  }
  const float v = warp_total(acc[0]);
  if (lane == 0) parts.out[part][o] = parts.bias[part] ? v + parts.bias[part][o] : v;
}

// launch_shared_down_gemv: gemv_kernel<ROWS> on silu(gate) * up computed as it loads (as
// silu_mul_kernel would have written it), the result added into out times sigmoid(gate_logit[r])
// (as add_sigmoid_gated_kernel; without gate_logit, as add_kernel). The slabs summed in column
// order as in gemv_kernel whatever its unroll: the same bits as the three kernels in a row.
template <int ROWS>
__global__ void __launch_bounds__(256)
    shared_down_gemv_kernel(const float* __restrict__ gate, const float* __restrict__ up,
                            int64_t in, const __nv_bfloat16* __restrict__ w, int64_t out_features,
                            const float* __restrict__ gate_logit, float* __restrict__ out) {
  const int64_t o = static_cast<int64_t>(blockIdx.x) * 8 + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (o >= out_features) return;
  const __nv_bfloat16* row = w + o * in;
  float acc[ROWS];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) acc[r] = 0.0f;
  constexpr int kUnroll = ROWS <= 2 ? 8 : 4;
  uint4 packed[kUnroll];
  int64_t base = lane * 8;
  load_slabs(packed, row, base, in);  // (weights: no kernel of the step writes them)
  overlap_prologue();
  while (true) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t col = base + u * 256;
      if (col >= in) continue;
      float wf[8];
      bf16x8_to_f32(packed[u], wf);
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        const float* g = gate + r * in + col;
        const float* v = up + r * in + col;
        const float4 a =
            silu_times4(*reinterpret_cast<const float4*>(g), *reinterpret_cast<const float4*>(v));
        const float4 b = silu_times4(*reinterpret_cast<const float4*>(g + 4),
                                     *reinterpret_cast<const float4*>(v + 4));
        acc[r] = dot8(acc[r], a, b, wf);
      }
    }
    base += kUnroll * 256;
    if (base >= in) break;
    load_slabs(packed, row, base, in);
  }
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    const float v = warp_total(acc[r]);
    if (lane == 0) {
      float& dst = out[r * out_features + o];
      if (gate_logit)
        dst += sigmoid_of(gate_logit[r]) * v;
      else
        dst += v;
    }
  }
}

unsigned grid_stride_blocks(int64_t count) {
  return static_cast<unsigned>(std::min<int64_t>((count + kThreads - 1) / kThreads, 132 * 16));
}

}  // namespace

void launch_embedding(const __nv_bfloat16* table, const int32_t* ids, int64_t tokens, int64_t hidden, float* out,
                      cudaStream_t stream) {
  if (tokens == 0) return;
  dim3 grid(static_cast<unsigned>(std::min<int64_t>((hidden + kThreads - 1) / kThreads, 8)), static_cast<unsigned>(tokens));
  embedding_kernel<<<grid, kThreads, 0, stream>>>(table, ids, hidden, out);
  SY_CUDA_LAUNCH_CHECK("embedding");
}

void launch_rms_norm(float* x, const float* residual, const float* weight, int64_t rows,
                     int64_t width, float eps, float* out, cudaStream_t stream,
                     const float* earlier) {
  if (rows == 0) return;
  const bool aligned =
      ((reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(out) |
        reinterpret_cast<uintptr_t>(weight) | reinterpret_cast<uintptr_t>(residual) |
        reinterpret_cast<uintptr_t>(earlier)) &
       15u) == 0;
  if (width % 4 == 0 && aligned && width <= 8 * 1024) {
    auto launch_vec = [&](auto kernel) {
      launch_overlapped(kernel, dim3(static_cast<unsigned>(rows)), dim3(256), 0, stream, x,
                        residual, weight, width, eps, out, earlier);
    };
    with_norm_row_vec(width,
                      [&](auto vec) { launch_vec(rms_norm_vec_kernel<decltype(vec)::value>); });
    SY_CUDA_LAUNCH_CHECK("rms_norm");
    return;
  }
  const int threads = width >= 1024 ? 512 : width >= 256 ? 256 : width >= 128 ? 128 : 64;
  launch_overlapped(rms_norm_kernel, dim3(static_cast<unsigned>(rows)), dim3(threads), 0, stream, x,
                    residual, weight, width, eps, out, earlier);
  SY_CUDA_LAUNCH_CHECK("rms_norm");
}

void launch_add(float* x, const float* y, int64_t count, cudaStream_t stream) {
  if (count == 0) return;
  launch_overlapped(add_kernel, dim3(grid_stride_blocks(count)), dim3(kThreads), 0, stream, x, y,
                    count);
  SY_CUDA_LAUNCH_CHECK("add");
}

void launch_add_bias(float* out, const float* bias, int64_t rows, int64_t width, cudaStream_t stream) {
  if (rows * width == 0) return;
  add_bias_kernel<<<grid_stride_blocks(rows * width), kThreads, 0, stream>>>(out, bias, rows, width);
  SY_CUDA_LAUNCH_CHECK("add_bias");
}

void launch_silu_mul(const float* gate, const float* up, int64_t count, float* out, cudaStream_t stream) {
  if (count == 0) return;
  silu_mul_kernel<<<grid_stride_blocks(count), kThreads, 0, stream>>>(gate, up, count, out);
  SY_CUDA_LAUNCH_CHECK("silu_mul");
}

void launch_add_sigmoid_gated(float* out, const float* y, const float* gate_logit, int64_t rows, int64_t width,
                              cudaStream_t stream) {
  if (rows == 0 || width == 0) return;
  add_sigmoid_gated_kernel<<<grid_stride_blocks(rows * width), kThreads, 0, stream>>>(out, y, gate_logit,
                                                                                      rows * width, width);
  SY_CUDA_LAUNCH_CHECK("add_sigmoid_gated");
}

void launch_rope(float* x, const int32_t* positions, int64_t tokens, int64_t heads, int64_t head_dim,
                 int rotary_dims, const RopeTable& table, cudaStream_t stream) {
  if (tokens == 0) return;
  if (rotary_dims <= 0 || rotary_dims % 2 != 0 || rotary_dims > head_dim || rotary_dims > 2 * kRopeMaxHalf)
    cuda_fail("rope", "rotary dims must be even, <= head_dim and <= 256", __FILE__, __LINE__);
  const int threads = static_cast<int>(std::min<int64_t>(128, std::max<int64_t>(32, rotary_dims / 2)));
  rope_kernel<<<static_cast<unsigned>(tokens), threads, 0, stream>>>(x, positions, heads, head_dim, rotary_dims,
                                                                       table);
  SY_CUDA_LAUNCH_CHECK("rope");
}

void launch_gather_rows(const float* x, const int32_t* rows, int64_t count, int64_t width, float* out,
                        cudaStream_t stream) {
  if (count == 0) return;
  dim3 grid(static_cast<unsigned>(std::min<int64_t>((width + kThreads - 1) / kThreads, 64)), static_cast<unsigned>(count));
  gather_rows_kernel<<<grid, kThreads, 0, stream>>>(x, rows, width, out);
  SY_CUDA_LAUNCH_CHECK("gather_rows");
}

void launch_fill_i32(int32_t* dst, int64_t count, int32_t value, cudaStream_t stream) {
  if (count == 0) return;
  fill_i32_kernel<<<grid_stride_blocks(count), kThreads, 0, stream>>>(dst, count, value);
  SY_CUDA_LAUNCH_CHECK("fill_i32");
}

void launch_fill_random(void* dst, bool bf16, int64_t count, uint64_t seed, float scale, float offset,
                        cudaStream_t stream) {
  if (count == 0) return;
  fill_random_kernel<<<grid_stride_blocks(count), kThreads, 0, stream>>>(dst, bf16, count, seed, scale, offset);
  SY_CUDA_LAUNCH_CHECK("fill_random");
}

void launch_fill_random_bytes(uint8_t* dst, int64_t count, uint64_t seed, int lo, float span,
                              cudaStream_t stream) {
  if (count == 0) return;
  fill_random_bytes_kernel<<<grid_stride_blocks(count), kThreads, 0, stream>>>(dst, count, seed, lo,
                                                                               span);
  SY_CUDA_LAUNCH_CHECK("fill_random_bytes");
}

void launch_f32_to_bf16(const float* src, int64_t count, __nv_bfloat16* dst, cudaStream_t stream) {
  if (count == 0) return;
  f32_to_bf16_kernel<<<grid_stride_blocks(count), kThreads, 0, stream>>>(src, count, dst);
  SY_CUDA_LAUNCH_CHECK("f32_to_bf16");
}

namespace {
// The parts' rows back to back, 8 per block; returns the block count.
int gemv_table(const GemvPart* parts, int count, GemvParts& table) {
  if (count > kGemvMaxParts) cuda_fail("launch_gemv_parts", "more than kGemvMaxParts parts", __FILE__, __LINE__);
  table = GemvParts{};
  table.count = count;
  int blocks = 0;
  for (int p = 0; p < count; ++p) {
    table.w[p] = parts[p].w;
    table.out[p] = parts[p].out;
    table.bias[p] = parts[p].bias;
    table.features[p] = parts[p].out_features;
    table.block_begin[p] = blocks;
    blocks += static_cast<int>((parts[p].out_features + 7) / 8);
  }
  table.block_begin[count] = blocks;
  return blocks;
}
}  // namespace

bool norm_gemv_supported(int64_t in) {
  return in > 0 && in % 8 == 0 && in <= 8 * 1024;
}

void launch_norm_gemv_parts(const float* x, const float* delta, const float* norm_weight, float eps, int64_t in,
                            const GemvPart* parts, int count, cudaStream_t stream) {
  if (!norm_gemv_supported(in)) cuda_fail("launch_norm_gemv_parts", "unsupported width", __FILE__, __LINE__);
  if (count == 0) return;
  GemvParts table;
  const int blocks = gemv_table(parts, count, table);
  if (blocks == 0) return;
  const dim3 grid(static_cast<unsigned>(blocks)), block(256);
  const size_t shared = static_cast<size_t>(in) * sizeof(float);
  // The same VEC as launch_rms_norm picks for this width: the same reduction, bitwise.
  with_norm_row_vec(in, [&](auto vec) {
    launch_overlapped(norm_gemv_kernel<decltype(vec)::value>, grid, block, shared, stream, x, delta,
                      norm_weight, eps, in, table);
  });
  SY_CUDA_LAUNCH_CHECK("norm_gemv");
}

void launch_gemv_parts(const float* x, int64_t rows, int64_t in, const GemvPart* parts, int count,
                       cudaStream_t stream) {
  if (rows == 0 || count == 0) return;
  GemvParts table;
  const int blocks = gemv_table(parts, count, table);
  if (blocks == 0) return;
  const unsigned grid = static_cast<unsigned>(blocks);
  if (rows == 1 && in > 2048 && in <= 4096) {
    launch_overlapped(gemv_kernel<1, 16>, dim3(grid), dim3(256), 0, stream, x, in, table);
    SY_CUDA_LAUNCH_CHECK("gemv");
    return;
  }
  switch (rows) {
#define SY_GEMV_CASE(R) \
  case R: launch_overlapped(gemv_kernel<R>, dim3(grid), dim3(256), 0, stream, x, in, table); break;
    SY_GEMV_CASE(1) SY_GEMV_CASE(2) SY_GEMV_CASE(3) SY_GEMV_CASE(4)
    SY_GEMV_CASE(5) SY_GEMV_CASE(6) SY_GEMV_CASE(7) SY_GEMV_CASE(8)
#undef SY_GEMV_CASE
    default: cuda_fail("launch_gemv", "rows > kGemvMaxRows", __FILE__, __LINE__);
  }
  SY_CUDA_LAUNCH_CHECK("gemv");
}

void launch_gemv(const float* x, int64_t rows, int64_t in, const __nv_bfloat16* w, int64_t out_features, float* out,
                 cudaStream_t stream) {
  const GemvPart part{w, out, out_features};
  launch_gemv_parts(x, rows, in, &part, 1, stream);
}

void launch_shared_down_gemv(const float* gate, const float* up, int64_t rows, int64_t in,
                             const __nv_bfloat16* w, int64_t out_features, const float* gate_logit,
                             float* out, cudaStream_t stream) {
  if (rows == 0 || out_features == 0) return;
  if (in % 8 != 0) cuda_fail("launch_shared_down_gemv", "in % 8 != 0", __FILE__, __LINE__);
  const dim3 grid(static_cast<unsigned>((out_features + 7) / 8)), block(256);
  if (rows > kGemvMaxRows)
    cuda_fail("launch_shared_down_gemv", "rows > kGemvMaxRows", __FILE__, __LINE__);
  using Kernel = void (*)(const float*, const float*, int64_t, const __nv_bfloat16*, int64_t,
                          const float*, float*);
  const Kernel kernels[kGemvMaxRows] = {shared_down_gemv_kernel<1>, shared_down_gemv_kernel<2>,
                                        shared_down_gemv_kernel<3>, shared_down_gemv_kernel<4>,
                                        shared_down_gemv_kernel<5>, shared_down_gemv_kernel<6>,
                                        shared_down_gemv_kernel<7>, shared_down_gemv_kernel<8>};
  launch_overlapped(kernels[rows - 1], grid, block, 0, stream, gate, up, in, w, out_features,
                    gate_logit, out);
  SY_CUDA_LAUNCH_CHECK("shared_down_gemv");
}

}  // namespace sy::backend::cuda
