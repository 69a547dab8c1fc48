#include "backend/cuda/latent_attention.h"

#include <cmath>

namespace sy::backend::cuda {
namespace {

constexpr int kThreads = 256, kWarps = kThreads / 32;

__device__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Rotates `rope` values at v by `position` (pair i: (2i, 2i+1) interleaved, else (i, i + half)),
// pairs [first, rope / 2) stepping by `step`.
__device__ void rotate_pairs(float* v, int rope, bool interleave, float position,
                             const RopeTable& table, int first, int step) {
  const int half = rope / 2;
  for (int i = first; i < half; i += step) {
    const float angle = position * table.inv_freq[i];
    const float c = cosf(angle) * table.factor, s = sinf(angle) * table.factor;
    const int ia = interleave ? 2 * i : i, ib = interleave ? 2 * i + 1 : i + half;
    const float a = v[ia], b = v[ib];
    v[ia] = a * c - b * s;
    v[ib] = b * c + a * s;
  }
}

// One block per token: latent RMSNorm, RoPE of k_pe and of every head's q_pe, the cache row.
__global__ void __launch_bounds__(kThreads)
    latent_prep_kernel(LatentParams p, const __grid_constant__ RopeTable table) {
  __shared__ float partial[kWarps];
  const int64_t t = blockIdx.x;
  const int lora = p.kv_lora, rope = p.rope, row_width = lora + rope;
  float* row = p.kv_latent + t * row_width;
  float sum = 0.0f;
  for (int i = threadIdx.x; i < lora; i += kThreads) sum += row[i] * row[i];
  sum = warp_sum(sum);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = sum;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < kWarps; ++w) total += partial[w];
  const float norm = 1.0f / sqrtf(total / static_cast<float>(lora) + p.eps);
  for (int i = threadIdx.x; i < lora; i += kThreads) row[i] = p.kv_norm[i] * (row[i] * norm);
  const float position = static_cast<float>(p.positions[t]);
  // k_pe: the first warp; q_pe of each head: the other threads, a head per warp at a time.
  if (threadIdx.x < 32)
    rotate_pairs(row + lora, rope, p.interleave, position, table, threadIdx.x, 32);
  const int q_row = p.nope + rope;
  for (int h = threadIdx.x / 32 - 1; h >= 0 && h < p.heads; h += kWarps - 1)
    rotate_pairs(p.q + (t * p.heads + h) * q_row + p.nope, rope, p.interleave, position, table,
                 threadIdx.x % 32, 32);
  __syncthreads();
  const int32_t slot = p.slot_mapping[t];
  if (slot < 0) return;
  __nv_bfloat16* dst = p.cache + static_cast<int64_t>(slot) * row_width;
  for (int i = threadIdx.x; i < row_width; i += kThreads) dst[i] = __float2bfloat16(row[i]);
}

// One block per (token, head). Shared: q_latent [lora] (then o_latent), q_pe [rope], per warp
// an output accumulator [lora] and its running max and sum.
__global__ void __launch_bounds__(kThreads) latent_attention_kernel(LatentParams p) {
  extern __shared__ float smem[];
  const int lora = p.kv_lora, rope = p.rope, row_width = lora + rope;
  float* q_latent = smem;
  float* q_pe = q_latent + lora;
  float* acc = q_pe + rope;               // [kWarps, lora]
  float* warp_max = acc + kWarps * lora;  // [kWarps]
  float* warp_sum_exp = warp_max + kWarps;
  const int64_t t = blockIdx.x / p.heads;
  const int h = blockIdx.x % p.heads;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int q_row = p.nope + rope, b_rows = p.nope + p.v_dim;
  const float* qv = p.q + (t * p.heads + h) * q_row;
  const __nv_bfloat16* w_k = p.kv_b_proj + static_cast<int64_t>(h) * b_rows * lora;
  const __nv_bfloat16* w_v = w_k + static_cast<int64_t>(p.nope) * lora;

  // W_k^T q_nope (over nope in order, as the CPU sums it).
  for (int l = threadIdx.x; l < lora; l += kThreads) {
    float value = 0.0f;
    for (int j = 0; j < p.nope; ++j)
      value += qv[j] * __bfloat162float(w_k[static_cast<int64_t>(j) * lora + l]);
    q_latent[l] = value;
  }
  for (int i = threadIdx.x; i < rope; i += kThreads) q_pe[i] = qv[p.nope + i];
  float* mine = acc + warp * lora;
  for (int l = lane; l < lora; l += 32) mine[l] = 0.0f;
  __syncthreads();

  // Online softmax: warp w takes cached rows w, w + kWarps, ...
  const int64_t context = static_cast<int64_t>(p.positions[t]) + 1;
  const int32_t* table =
      p.block_tables + static_cast<int64_t>(p.token_seq[t]) * p.block_table_stride;
  float running_max = -INFINITY, running_sum = 0.0f;
  for (int64_t position = warp; position < context; position += kWarps) {
    const int64_t slot = static_cast<int64_t>(table[position / p.block_size]) * p.block_size +
                         position % p.block_size;
    const __nv_bfloat16* kv = p.cache + slot * row_width;
    float dot = 0.0f;
    for (int l = lane; l < lora; l += 32) dot += q_latent[l] * __bfloat162float(kv[l]);
    for (int i = lane; i < rope; i += 32) dot += q_pe[i] * __bfloat162float(kv[lora + i]);
    const float score = warp_sum(dot) * p.scale;
    const float new_max = fmaxf(running_max, score);
    const float correction = expf(running_max - new_max), weight = expf(score - new_max);
    running_sum = running_sum * correction + weight;
    for (int l = lane; l < lora; l += 32)
      mine[l] = mine[l] * correction + weight * __bfloat162float(kv[l]);
    running_max = new_max;
  }
  if (lane == 0) {
    warp_max[warp] = running_max;
    warp_sum_exp[warp] = running_sum;
  }
  __syncthreads();
  float block_max = -INFINITY;
  for (int w = 0; w < kWarps; ++w) block_max = fmaxf(block_max, warp_max[w]);
  float total = 0.0f;
  for (int w = 0; w < kWarps; ++w) total += warp_sum_exp[w] * expf(warp_max[w] - block_max);
  float* o_latent = q_latent;  // q_latent is no longer read
  __syncthreads();
  for (int l = threadIdx.x; l < lora; l += kThreads) {
    float value = 0.0f;
    for (int w = 0; w < kWarps; ++w) value += acc[w * lora + l] * expf(warp_max[w] - block_max);
    o_latent[l] = value / total;
  }
  __syncthreads();
  // W_v o_latent: a warp per output value.
  float* out = p.out + (t * p.heads + h) * p.v_dim;
  for (int i = warp; i < p.v_dim; i += kWarps) {
    float value = 0.0f;
    for (int l = lane; l < lora; l += 32)
      value += __bfloat162float(w_v[static_cast<int64_t>(i) * lora + l]) * o_latent[l];
    value = warp_sum(value);
    if (lane == 0) out[i] = value;
  }
}

size_t attention_smem(int lora, int rope) {
  return (static_cast<size_t>(lora) * (1 + kWarps) + rope + 2 * kWarps) * sizeof(float);
}

}  // namespace

bool latent_attention_supported(int kv_lora, int nope, int rope, int v_dim) {
  return kv_lora > 0 && kv_lora <= 1024 && rope >= 0 && rope % 2 == 0 && rope <= 2 * kRopeMaxHalf &&
         nope >= 0 && nope <= 1024 && v_dim > 0 && v_dim <= 1024 &&
         attention_smem(kv_lora, rope) <= 48 * 1024;
}

void launch_latent_attention(const LatentParams& p, const RopeTable& table, cudaStream_t stream) {
  if (p.tokens == 0) return;
  if (!latent_attention_supported(p.kv_lora, p.nope, p.rope, p.v_dim))
    cuda_fail("latent_attention", "unsupported shape (see latent_attention_supported)", __FILE__,
              __LINE__);
  latent_prep_kernel<<<static_cast<unsigned>(p.tokens), kThreads, 0, stream>>>(p, table);
  SY_CUDA_LAUNCH_CHECK("latent_prep_kernel");
  const unsigned blocks = static_cast<unsigned>(p.tokens * p.heads);
  latent_attention_kernel<<<blocks, kThreads, attention_smem(p.kv_lora, p.rope), stream>>>(p);
  SY_CUDA_LAUNCH_CHECK("latent_attention_kernel");
}

}  // namespace sy::backend::cuda
