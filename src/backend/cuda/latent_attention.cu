#include "backend/cuda/latent_attention.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <vector>

#include "backend/cuda/attention.h"
#include "backend/cuda/mma_ptx.cuh"

namespace sy::backend::cuda {
namespace {

constexpr int kThreads = 256, kWarps = kThreads / 32;
constexpr int kGroup = 2 * kWarps;  // heads per attention block (a warp scores two per row)
constexpr int kTile = 32;           // cached rows per step of the attention loop (a lane each)
constexpr int kMaxCols = 4;         // latent columns per thread: kv_lora <= 1024
constexpr int kMaxRow = 1152;       // kv_lora + rope: the attention block's shared memory (150 KB)
constexpr int kMaxNope = 512;  // the absorb kernel's query tile (32 KB, + 12 KB of partial sums)
constexpr int kAbsorbTokens = 16, kOutTokens = 8, kOutChunk = 16;
constexpr int kAbsorbCols = 64, kAbsorbSlices = kThreads / kAbsorbCols;
constexpr int kCombineCols = 64;  // latent columns per combine block (its threads)
constexpr int kMaxSplits = 64;

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

// Bits of a bf16 pair as two floats (a bf16 is the top half of an f32).
__device__ __forceinline__ float2 bf16x2_to_float2(uint32_t pair) {
  return make_float2(__uint_as_float(pair << 16), __uint_as_float(pair & 0xffff0000u));
}

__device__ float warp_max(float v) {
  for (int offset = 16; offset > 0; offset >>= 1)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// The scratch of one chunk of tokens (latent_attention_scratch_bytes).
struct Chunk {
  int64_t first = 0;          // the chunk's first token of the step
  int n = 0;                  // its tokens
  int splits = 1;             // context splits per (token, head group)
  float* q_abs = nullptr;     // [n, heads, kv_lora + rope]: W_k^T q_nope | q_pe
  float* o_latent = nullptr;  // [n, heads, kv_lora]: softmax-weighted latent rows
  float* part_acc = nullptr;  // [n, heads, splits, kv_lora]: a split's unnormalised sum
  float* part_ml = nullptr;   // [n, heads, splits, 2]: its running max and sum
};

// W_k^T q_nope per (token, head), and q_pe beside it. Grid (column chunks of kAbsorbCols,
// heads, token tiles of kAbsorbTokens), so that a few-token step still has a block per SM: a
// thread owns one latent column and a quarter of nope (kAbsorbSlices) for the tile's tokens, so
// kv_b_proj's W_k is read once per tile; the quarters' sums are added in order (a token's
// arithmetic does not depend on the tile's other tokens).
__global__ void __launch_bounds__(kThreads) latent_absorb_kernel(LatentParams p, Chunk chunk) {
  extern __shared__ float
      q_nope[];  // [kAbsorbTokens, nope], then [kAbsorbSlices - 1, kAbsorbTokens, kAbsorbCols]
  float* partial = q_nope + kAbsorbTokens * p.nope;
  const int h = blockIdx.y, lora = p.kv_lora, row_width = lora + p.rope, q_row = p.nope + p.rope;
  const int t0 = blockIdx.z * kAbsorbTokens, count = min(kAbsorbTokens, chunk.n - t0);
  for (int i = threadIdx.x; i < kAbsorbTokens * p.nope; i += kThreads) {
    const int tt = i / p.nope, j = i % p.nope;
    q_nope[i] = tt < count ? p.q[((chunk.first + t0 + tt) * p.heads + h) * q_row + j] : 0.0f;
  }
  __syncthreads();
  const int c = threadIdx.x % kAbsorbCols, slice = threadIdx.x / kAbsorbCols;
  const int l = blockIdx.x * kAbsorbCols + c;
  const int per_slice = (p.nope + kAbsorbSlices - 1) / kAbsorbSlices;
  const int j0 = slice * per_slice, j1 = min(p.nope, j0 + per_slice);
  float acc[kAbsorbTokens] = {};
  if (l < lora) {
    const __nv_bfloat16* w_k =
        p.kv_b_proj + static_cast<int64_t>(h) * (p.nope + p.v_dim) * lora + l;
#pragma unroll 4
    for (int j = j0; j < j1; ++j) {
      const float w = __bfloat162float(w_k[static_cast<int64_t>(j) * lora]);
#pragma unroll
      for (int tt = 0; tt < kAbsorbTokens; ++tt) acc[tt] += q_nope[tt * p.nope + j] * w;
    }
  }
  if (slice > 0)
#pragma unroll
    for (int tt = 0; tt < kAbsorbTokens; ++tt)
      partial[((slice - 1) * kAbsorbTokens + tt) * kAbsorbCols + c] = acc[tt];
  __syncthreads();
  if (slice == 0 && l < lora)
    for (int tt = 0; tt < count; ++tt) {
      float sum = acc[tt];
      for (int q = 1; q < kAbsorbSlices; ++q)
        sum += partial[((q - 1) * kAbsorbTokens + tt) * kAbsorbCols + c];
      chunk.q_abs[(static_cast<int64_t>(t0 + tt) * p.heads + h) * row_width + l] = sum;
    }
  if (blockIdx.x == 0)
    for (int i = threadIdx.x; i < count * p.rope; i += kThreads) {
      const int tt = i / p.rope, r = i % p.rope;
      chunk.q_abs[(static_cast<int64_t>(t0 + tt) * p.heads + h) * row_width + lora + r] =
          p.q[((chunk.first + t0 + tt) * p.heads + h) * q_row + p.nope + r];
    }
}

// Attention in the latent space: a block per (token, group of up to kGroup heads, context
// split), so a cached row is read once for all the group's heads (not once per head). Per tile
// of kTile rows: the rows into shared memory (bf16), the scores (warp w, lane r: heads w and
// w + kWarps against row r), an online-softmax update per head, then each thread adds the
// weighted rows into its latent columns for every head (registers). One split writes the
// normalised result; several write partials for latent_combine_kernel.
__global__ void __launch_bounds__(kThreads) latent_attention_kernel(LatentParams p, Chunk chunk) {
  extern __shared__ float smem[];
  const int lora = p.kv_lora, row_width = lora + p.rope, words = row_width / 2, stride = words + 1;
  float* q_s = smem;                                                       // [kGroup, row_width]
  uint32_t* tile = reinterpret_cast<uint32_t*>(q_s + kGroup * row_width);  // [kTile, stride]
  float* weights = reinterpret_cast<float*>(tile + kTile * stride);        // [kTile, kGroup]
  float* run_max = weights + kTile * kGroup;                               // [kGroup]
  float* run_sum = run_max + kGroup;
  float* correction = run_sum + kGroup;
  const int local = blockIdx.z, split = blockIdx.x;
  const int64_t t = chunk.first + local;
  const int h0 = blockIdx.y * kGroup, group = min(kGroup, p.heads - h0);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int i = threadIdx.x; i < kGroup * row_width; i += kThreads) {
    const int hh = i / row_width, c = i % row_width;
    q_s[i] = hh < group
                 ? chunk.q_abs[(static_cast<int64_t>(local) * p.heads + h0 + hh) * row_width + c]
                 : 0.0f;
  }
  if (threadIdx.x < kGroup) {
    run_max[threadIdx.x] = -INFINITY;
    run_sum[threadIdx.x] = 0.0f;
  }
  // Padding tokens (position -1) have no context: zeros out.
  const int64_t context = static_cast<int64_t>(p.positions[t]) + 1;
  const int64_t span = (context + chunk.splits - 1) / chunk.splits;
  const int64_t begin = split * span, end = context < begin + span ? context : begin + span;
  const int32_t* table =
      p.block_tables + static_cast<int64_t>(p.token_seq[t]) * p.block_table_stride;
  float acc[kGroup][kMaxCols];
#pragma unroll
  for (int hh = 0; hh < kGroup; ++hh)
#pragma unroll
    for (int k = 0; k < kMaxCols; ++k) acc[hh][k] = 0.0f;
  __syncthreads();

  for (int64_t p0 = begin; p0 < end; p0 += kTile) {
    const int rows = static_cast<int>(end - p0 < kTile ? end - p0 : kTile);
    for (int i = threadIdx.x; i < kTile * words; i += kThreads) {
      const int r = i / words, w = i % words;
      uint32_t pair = 0;
      if (r < rows) {
        const int64_t position = p0 + r;
        const int64_t slot = static_cast<int64_t>(table[position / p.block_size]) * p.block_size +
                             position % p.block_size;
        pair = reinterpret_cast<const uint32_t*>(p.cache + slot * row_width)[w];
      }
      tile[r * stride + w] = pair;
    }
    __syncthreads();
    {
      const float2* qa = reinterpret_cast<const float2*>(q_s + warp * row_width);
      const float2* qb = reinterpret_cast<const float2*>(q_s + (warp + kWarps) * row_width);
      const uint32_t* row = tile + lane * stride;
      float sa = 0.0f, sb = 0.0f;
      for (int w = 0; w < words; ++w) {
        const float2 kv = bf16x2_to_float2(row[w]), a = qa[w], b = qb[w];
        sa = fmaf(a.x, kv.x, fmaf(a.y, kv.y, sa));
        sb = fmaf(b.x, kv.x, fmaf(b.y, kv.y, sb));
      }
      const bool valid = lane < rows;
      weights[lane * kGroup + warp] = valid ? sa * p.scale : -INFINITY;
      weights[lane * kGroup + warp + kWarps] = valid ? sb * p.scale : -INFINITY;
    }
    __syncthreads();
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int hh = warp + half * kWarps;
      const float score = weights[lane * kGroup + hh];
      const float old_max = run_max[hh];
      const float new_max = fmaxf(old_max, warp_max(score));  // row 0 of a tile is always valid
      const float e = score == -INFINITY ? 0.0f : expf(score - new_max);
      weights[lane * kGroup + hh] = e;
      const float sum = warp_sum(e);
      if (lane == 0) {
        const float c = expf(old_max - new_max);  // 0 on the first tile
        correction[hh] = c;
        run_sum[hh] = run_sum[hh] * c + sum;
        run_max[hh] = new_max;
      }
    }
    __syncthreads();
#pragma unroll
    for (int hh = 0; hh < kGroup; ++hh) {
      const float c = correction[hh];
#pragma unroll
      for (int k = 0; k < kMaxCols; ++k) acc[hh][k] *= c;
    }
    const __nv_bfloat16* values = reinterpret_cast<const __nv_bfloat16*>(tile);
    for (int r = 0; r < rows; ++r) {
      float w[kGroup];
      const float4* wr = reinterpret_cast<const float4*>(weights + r * kGroup);
#pragma unroll
      for (int i = 0; i < kGroup / 4; ++i) {
        const float4 v = wr[i];
        w[4 * i] = v.x, w[4 * i + 1] = v.y, w[4 * i + 2] = v.z, w[4 * i + 3] = v.w;
      }
#pragma unroll
      for (int k = 0; k < kMaxCols; ++k) {
        const int col = threadIdx.x + k * kThreads;
        if (col < lora) {
          const float v = __bfloat162float(values[2 * r * stride + col]);
#pragma unroll
          for (int hh = 0; hh < kGroup; ++hh) acc[hh][k] = fmaf(w[hh], v, acc[hh][k]);
        }
      }
    }
    __syncthreads();
  }

#pragma unroll
  for (int hh = 0; hh < kGroup; ++hh) {
    if (hh >= group) break;
    const int64_t head_row = static_cast<int64_t>(local) * p.heads + h0 + hh;
    if (chunk.splits == 1) {
      const float inv = run_sum[hh] > 0.0f ? 1.0f / run_sum[hh] : 0.0f;
#pragma unroll
      for (int k = 0; k < kMaxCols; ++k) {
        const int col = threadIdx.x + k * kThreads;
        if (col < lora) chunk.o_latent[head_row * lora + col] = acc[hh][k] * inv;
      }
    } else {
      const int64_t part = head_row * chunk.splits + split;
#pragma unroll
      for (int k = 0; k < kMaxCols; ++k) {
        const int col = threadIdx.x + k * kThreads;
        if (col < lora) chunk.part_acc[part * lora + col] = acc[hh][k];
      }
      if (threadIdx.x == 0) {
        chunk.part_ml[2 * part] = run_max[hh];
        chunk.part_ml[2 * part + 1] = run_sum[hh];
      }
    }
  }
}

// The splits of one (token, head) merged: weights exp(max_s - max), normalised by the merged
// sum. Grid (heads, tokens, column chunks of kCombineCols), a thread per latent column.
__global__ void __launch_bounds__(kCombineCols) latent_combine_kernel(LatentParams p, Chunk chunk) {
  __shared__ float factor[kMaxSplits];
  __shared__ float inv;
  const int64_t head_row = static_cast<int64_t>(blockIdx.y) * p.heads + blockIdx.x;
  const int64_t part0 = head_row * chunk.splits;
  if (threadIdx.x == 0) {
    float top = -INFINITY;
    for (int s = 0; s < chunk.splits; ++s) top = fmaxf(top, chunk.part_ml[2 * (part0 + s)]);
    float total = 0.0f;
    for (int s = 0; s < chunk.splits; ++s) {
      const float m = chunk.part_ml[2 * (part0 + s)];
      factor[s] = m != -INFINITY ? expf(m - top) : 0.0f;
      total += chunk.part_ml[2 * (part0 + s) + 1] * factor[s];
    }
    inv = total > 0.0f ? 1.0f / total : 0.0f;
  }
  __syncthreads();
  const int col = blockIdx.z * kCombineCols + threadIdx.x;
  if (col >= p.kv_lora) return;
  float value = 0.0f;
  for (int s = 0; s < chunk.splits; ++s)
    if (factor[s] != 0.0f) value += chunk.part_acc[(part0 + s) * p.kv_lora + col] * factor[s];
  chunk.o_latent[head_row * p.kv_lora + col] = value * inv;
}

// W_v o_latent: grid (output chunks of kOutChunk, heads, token tiles of kOutTokens); a warp per
// output value at a time, its lanes over the latent in bf16 pairs, the tile's latent rows in
// shared memory, so W_v is read once per tile.
__global__ void __launch_bounds__(kThreads) latent_output_kernel(LatentParams p, Chunk chunk) {
  extern __shared__ float o_s[];  // [kOutTokens, kv_lora]
  const int h = blockIdx.y, lora = p.kv_lora, pairs = lora / 2;
  const int t0 = blockIdx.z * kOutTokens, count = min(kOutTokens, chunk.n - t0);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int i = threadIdx.x; i < kOutTokens * lora; i += kThreads) {
    const int tt = i / lora, l = i % lora;
    o_s[i] = tt < count ? chunk.o_latent[(static_cast<int64_t>(t0 + tt) * p.heads + h) * lora + l]
                        : 0.0f;
  }
  __syncthreads();
  const int last = min(p.v_dim, static_cast<int>(blockIdx.x + 1) * kOutChunk);
  for (int i = static_cast<int>(blockIdx.x) * kOutChunk + warp; i < last; i += kWarps) {
    const uint32_t* w_v = reinterpret_cast<const uint32_t*>(
        p.kv_b_proj + (static_cast<int64_t>(h) * (p.nope + p.v_dim) + p.nope + i) * lora);
    float acc[kOutTokens] = {};
    for (int j = lane; j < pairs; j += 32) {
      const float2 w = bf16x2_to_float2(w_v[j]);
#pragma unroll
      for (int tt = 0; tt < kOutTokens; ++tt) {
        const float2 o = reinterpret_cast<const float2*>(o_s + tt * lora)[j];
        acc[tt] = fmaf(w.x, o.x, fmaf(w.y, o.y, acc[tt]));
      }
    }
#pragma unroll
    for (int tt = 0; tt < kOutTokens; ++tt) {
      const float value = warp_sum(acc[tt]);
      if (lane == 0 && tt < count)
        p.out[((chunk.first + t0 + tt) * p.heads + h) * p.v_dim + i] = value;
    }
  }
}

// ---- The same attention on tensor cores (mma.sync m16n8k16 bf16 -> f32) ----
//
// Absorbed MLA is multi-query attention with one KV "head", K = the cached row (kv_lora + rope)
// and V = its first kv_lora columns: the 16 heads of a block are exactly an m16 tile. Per tile
// of kMmaKeys cached rows (cp.async, two stages): S = Q K^T with each of the four warps taking 8
// keys, the online softmax's row maxima exchanged through shared memory (every warp then holds
// the same running max), P (bf16) through shared memory, and O += P V with each warp owning a
// quarter of the kv_lora output columns. Q (W_k^T q_nope | q_pe) and P are rounded to bf16, as
// the paged attention rounds them. Writes what latent_attention_kernel writes (a split's
// unnormalised sum and (max, sum), max in natural-log units).
constexpr int kMmaThreads = 128, kMmaWarps = kMmaThreads / 32;
constexpr int kMmaHeads = 16, kMmaKeys = 32, kPStride = kMmaKeys + 8;
constexpr int kMmaMaxLora = 512, kMmaMaxRow = 1024;
constexpr int kMmaTiles = kMmaMaxLora / kMmaWarps / 8;  // n8 tiles of a warp's output columns
constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

bool latent_mma_supported(int kv_lora, int rope) {
  const int row = kv_lora + rope;
  return kv_lora % (16 * kMmaWarps) == 0 && kv_lora <= kMmaMaxLora && row % 32 == 0 &&
         row <= kMmaMaxRow;
}

size_t mma_smem(int row_width) {
  const size_t stride = static_cast<size_t>(row_width) + 8;
  return (kMmaHeads * stride + 2 * kMmaKeys * stride + kMmaHeads * kPStride) *
             sizeof(__nv_bfloat16) +
         2 * kMmaWarps * kMmaHeads * sizeof(float);
}

__global__ void __launch_bounds__(kMmaThreads)
    latent_attention_mma_kernel(LatentParams p, Chunk chunk) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int lora = p.kv_lora, row_width = lora + p.rope, stride = row_width + 8;
  __nv_bfloat16* q_s = reinterpret_cast<__nv_bfloat16*>(smem_raw);      // [kMmaHeads, stride]
  __nv_bfloat16* k_s = q_s + kMmaHeads * stride;                        // [2, kMmaKeys, stride]
  __nv_bfloat16* p_s = k_s + 2 * kMmaKeys * stride;                     // [kMmaHeads, kPStride]
  float* w_max = reinterpret_cast<float*>(p_s + kMmaHeads * kPStride);  // [kMmaWarps, kMmaHeads]
  float* w_sum = w_max + kMmaWarps * kMmaHeads;
  const int local = blockIdx.z, split = blockIdx.x;
  const int64_t t = chunk.first + local;
  const int h0 = blockIdx.y * kMmaHeads, group = min(kMmaHeads, p.heads - h0);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  for (int i = tid; i < kMmaHeads * row_width; i += kMmaThreads) {
    const int hh = i / row_width, c = i % row_width;
    const float v =
        hh < group ? chunk.q_abs[(static_cast<int64_t>(local) * p.heads + h0 + hh) * row_width + c]
                   : 0.0f;
    q_s[hh * stride + c] = __float2bfloat16(v);
  }
  // Padding tokens (position -1) have no context: zeros out.
  const int64_t context = static_cast<int64_t>(p.positions[t]) + 1;
  const int64_t span = (context + chunk.splits - 1) / chunk.splits;
  const int64_t begin = split * span, end = context < begin + span ? context : begin + span;
  const int tiles = end > begin ? static_cast<int>((end - begin + kMmaKeys - 1) / kMmaKeys) : 0;
  const int32_t* table =
      p.block_tables + static_cast<int64_t>(p.token_seq[t]) * p.block_table_stride;
  const int chunks = row_width / 8;  // 16-byte pieces of a cached row
  auto load_tile = [&](int tile, int stage) {
    __nv_bfloat16* dst = k_s + stage * kMmaKeys * stride;
    for (int i = tid; i < kMmaKeys * chunks; i += kMmaThreads) {
      const int key = i / chunks, c = i % chunks;
      const int64_t position = begin + static_cast<int64_t>(tile) * kMmaKeys + key;
      const bool ok = position < end;
      const int64_t slot =
          ok ? static_cast<int64_t>(table[position / p.block_size]) * p.block_size +
                   position % p.block_size
             : 0;
      cp_async_16(dst + key * stride + c * 8, p.cache + slot * row_width + c * 8, ok);
    }
  };
  const int matrix = lane >> 3, matrix_row = lane & 7;
  const int row_a = lane >> 2, row_b = row_a + 8;
  const int cols = lora / kMmaWarps, col0 = warp * cols;
  const float scale2 = p.scale * kLog2e;
  float acc[kMmaTiles][4] = {};
  float max_a = -INFINITY, max_b = -INFINITY, sum_a = 0.0f, sum_b = 0.0f;
  if (tiles > 0) load_tile(0, 0);
  cp_async_commit();
  for (int tile = 0; tile < tiles; ++tile) {
    const int stage = tile & 1;
    if (tile + 1 < tiles) load_tile(tile + 1, stage ^ 1);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();  // this tile's rows (and, on the first, q_s) are in place
    const __nv_bfloat16* k_tile = k_s + stage * kMmaKeys * stride;
    // S = Q K^T for this warp's 8 keys, two k16 steps per ldmatrix of the keys.
    float score[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int kk = 0; kk < row_width / 16; kk += 2) {
      uint32_t kb[4], qa[4];
      ldmatrix_x4(kb, k_tile + (warp * 8 + matrix_row) * stride + kk * 16 + matrix * 8);
      ldmatrix_x4(qa, q_s + ((matrix & 1) * 8 + matrix_row) * stride + kk * 16 + (matrix >> 1) * 8);
      mma_bf16(score, qa, kb[0], kb[1]);
      ldmatrix_x4(
          qa, q_s + ((matrix & 1) * 8 + matrix_row) * stride + (kk + 1) * 16 + (matrix >> 1) * 8);
      mma_bf16(score, qa, kb[2], kb[3]);
    }
    const int64_t key = begin + static_cast<int64_t>(tile) * kMmaKeys + warp * 8 + 2 * (lane & 3);
    float tile_a = -INFINITY, tile_b = -INFINITY;
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const bool valid = key + e < end;
      score[e] = valid ? score[e] * scale2 : -INFINITY;
      score[2 + e] = valid ? score[2 + e] * scale2 : -INFINITY;
      tile_a = fmaxf(tile_a, score[e]);
      tile_b = fmaxf(tile_b, score[2 + e]);
    }
#pragma unroll
    for (int offset = 1; offset < 4; offset <<= 1) {
      tile_a = fmaxf(tile_a, __shfl_xor_sync(~0u, tile_a, offset));
      tile_b = fmaxf(tile_b, __shfl_xor_sync(~0u, tile_b, offset));
    }
    if ((lane & 3) == 0) {
      w_max[warp * kMmaHeads + row_a] = tile_a;
      w_max[warp * kMmaHeads + row_b] = tile_b;
    }
    __syncthreads();
    for (int w = 0; w < kMmaWarps; ++w) {
      tile_a = fmaxf(tile_a, w_max[w * kMmaHeads + row_a]);
      tile_b = fmaxf(tile_b, w_max[w * kMmaHeads + row_b]);
    }
    const float new_a = fmaxf(max_a, tile_a), new_b = fmaxf(max_b, tile_b);
    const float base_a = new_a == -INFINITY ? 0.0f : new_a,
                base_b = new_b == -INFINITY ? 0.0f : new_b;
    const float rescale_a = exp2f(max_a - base_a), rescale_b = exp2f(max_b - base_b);
    max_a = new_a;
    max_b = new_b;
    const float p0 = exp2f(score[0] - base_a), p1 = exp2f(score[1] - base_a);
    const float p2 = exp2f(score[2] - base_b), p3 = exp2f(score[3] - base_b);
    sum_a = sum_a * rescale_a + p0 + p1;
    sum_b = sum_b * rescale_b + p2 + p3;
    const int p_col = warp * 8 + 2 * (lane & 3);
    *reinterpret_cast<uint32_t*>(p_s + row_a * kPStride + p_col) = pack_bf16(p0, p1);
    *reinterpret_cast<uint32_t*>(p_s + row_b * kPStride + p_col) = pack_bf16(p2, p3);
#pragma unroll
    for (int nt = 0; nt < kMmaTiles; ++nt) {
      acc[nt][0] *= rescale_a;
      acc[nt][1] *= rescale_a;
      acc[nt][2] *= rescale_b;
      acc[nt][3] *= rescale_b;
    }
    __syncthreads();  // P complete
                      // O += P V for this warp's columns (V: the rows' first kv_lora columns).
#pragma unroll
    for (int ks = 0; ks < kMmaKeys / 16; ++ks) {
      uint32_t pa[4];
      ldmatrix_x4(pa,
                  p_s + ((matrix & 1) * 8 + matrix_row) * kPStride + ks * 16 + (matrix >> 1) * 8);
#pragma unroll
      for (int dp = 0; dp < kMmaTiles / 2; ++dp) {
        if (dp * 16 >= cols) break;
        uint32_t vb[4];
        ldmatrix_x4_trans(vb, k_tile + (ks * 16 + (matrix & 1) * 8 + matrix_row) * stride + col0 +
                                  dp * 16 + (matrix >> 1) * 8);
        mma_bf16(acc[2 * dp], pa, vb[0], vb[1]);
        mma_bf16(acc[2 * dp + 1], pa, vb[2], vb[3]);
      }
    }
    __syncthreads();  // every warp is done with this stage and with P before they are refilled
  }
  cp_async_wait<0>();
#pragma unroll
  for (int offset = 1; offset < 4; offset <<= 1) {
    sum_a += __shfl_xor_sync(~0u, sum_a, offset);
    sum_b += __shfl_xor_sync(~0u, sum_b, offset);
  }
  if ((lane & 3) == 0) {
    w_sum[warp * kMmaHeads + row_a] = sum_a;
    w_sum[warp * kMmaHeads + row_b] = sum_b;
  }
  __syncthreads();
  float total_a = 0.0f, total_b = 0.0f;
  for (int w = 0; w < kMmaWarps; ++w) {
    total_a += w_sum[w * kMmaHeads + row_a];
    total_b += w_sum[w * kMmaHeads + row_b];
  }
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int hh = half ? row_b : row_a;
    if (hh >= group) continue;
    const float total = half ? total_b : total_a, running_max = half ? max_b : max_a;
    const int64_t head_row = static_cast<int64_t>(local) * p.heads + h0 + hh;
    const float inv = total > 0.0f ? 1.0f / total : 0.0f;
#pragma unroll
    for (int nt = 0; nt < kMmaTiles; ++nt) {
      if (nt * 8 >= cols) break;
      const int col = col0 + nt * 8 + 2 * (lane & 3);
      const float v0 = acc[nt][2 * half], v1 = acc[nt][2 * half + 1];
      if (chunk.splits == 1) {
        *reinterpret_cast<float2*>(chunk.o_latent + head_row * lora + col) =
            make_float2(v0 * inv, v1 * inv);
      } else {
        const int64_t part = head_row * chunk.splits + split;
        *reinterpret_cast<float2*>(chunk.part_acc + part * lora + col) = make_float2(v0, v1);
      }
    }
    if (chunk.splits > 1 && warp == 0 && (lane & 3) == 0) {
      const int64_t part = head_row * chunk.splits + split;
      chunk.part_ml[2 * part] = running_max == -INFINITY ? -INFINITY : running_max * kLn2;
      chunk.part_ml[2 * part + 1] = total;
    }
  }
}

size_t attention_smem(int row_width) {
  const int stride = row_width / 2 + 1;
  return (static_cast<size_t>(kGroup) * row_width + kTile * kGroup + 3 * kGroup) * sizeof(float) +
         static_cast<size_t>(kTile) * stride * sizeof(uint32_t);
}

// Tokens per chunk (the scratch holds one chunk's queries, results and partials) and the
// (token, split) pairs its partials hold.
int chunk_tokens(int heads) {
  return std::clamp(4096 / std::max(heads, 1), 16, 256);
}
int chunk_pairs(int heads) {
  return 8 * chunk_tokens(heads);
}

}  // namespace

bool latent_attention_supported(int kv_lora, int nope, int rope, int v_dim) {
  return kv_lora > 0 && kv_lora % 2 == 0 && kv_lora <= kThreads * kMaxCols && rope >= 0 &&
         rope % 2 == 0 && rope <= 2 * kRopeMaxHalf && kv_lora + rope <= kMaxRow && nope >= 0 &&
         nope <= kMaxNope && v_dim > 0 && v_dim <= 1024;
}

size_t latent_attention_scratch_bytes(int heads, int kv_lora, int rope) {
  const size_t tokens = static_cast<size_t>(chunk_tokens(heads)), pairs = chunk_pairs(heads);
  return (tokens * heads * (2 * kv_lora + rope) + pairs * heads * (kv_lora + 2)) * sizeof(float);
}

void prepare_latent_attention(int device) {
  int bytes = 0;
  SY_CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  const int needed = static_cast<int>(attention_smem(kMaxRow));
  SY_CUDA_CHECK(cudaFuncSetAttribute(latent_attention_kernel,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     std::min(bytes, needed)));
  SY_CUDA_CHECK(cudaFuncSetAttribute(latent_attention_mma_kernel,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     std::min(bytes, static_cast<int>(mma_smem(kMmaMaxRow)))));
}

void launch_latent_prep(const LatentParams& p, const RopeTable& table, cudaStream_t stream) {
  if (p.tokens == 0) return;
  if (!latent_attention_supported(p.kv_lora, p.nope, p.rope, p.v_dim))
    cuda_fail("latent_attention", "unsupported shape (see latent_attention_supported)", __FILE__,
              __LINE__);
  latent_prep_kernel<<<static_cast<unsigned>(p.tokens), kThreads, 0, stream>>>(p, table);
  SY_CUDA_LAUNCH_CHECK("latent_prep_kernel");
}

void launch_latent_absorbed(const LatentParams& p, int64_t first, int64_t count,
                            cudaStream_t stream) {
  if (count <= 0) return;
  if (!p.scratch || latent_attention_scratch_bytes(p.heads, p.kv_lora, p.rope) > p.scratch_bytes)
    cuda_fail("latent_attention", "shape larger than the scratch reserved (StepLimits::latent_*)",
              __FILE__, __LINE__);
  const int row_width = p.kv_lora + p.rope, tokens_per_chunk = chunk_tokens(p.heads);
  const int pairs = chunk_pairs(p.heads), groups = (p.heads + kGroup - 1) / kGroup;
  Chunk chunk;
  chunk.q_abs = p.scratch;
  chunk.o_latent = chunk.q_abs + static_cast<int64_t>(tokens_per_chunk) * p.heads * row_width;
  chunk.part_acc = chunk.o_latent + static_cast<int64_t>(tokens_per_chunk) * p.heads * p.kv_lora;
  chunk.part_ml = chunk.part_acc + static_cast<int64_t>(pairs) * p.heads * p.kv_lora;
  const int64_t end = first + count;
  static_assert(kGroup == kMmaHeads, "both attention kernels take 16 heads a block");
  // The tensor-core kernel where the shape allows (SY_LATENT_MMA=0: the CUDA-core one, for A/B).
  static const bool mma_allowed = [] {
    const char* v = std::getenv("SY_LATENT_MMA");
    return !(v && v[0] == '0');
  }();
  const bool mma = mma_allowed && latent_mma_supported(p.kv_lora, p.rope);
  for (chunk.first = first; chunk.first < end; chunk.first += tokens_per_chunk) {
    chunk.n = static_cast<int>(std::min<int64_t>(tokens_per_chunk, end - chunk.first));
    // Enough blocks for two waves over the SMs, within the partials' room. Depends only on
    // the step's token count (graphs replay it with other context lengths).
    const int wanted = (2 * std::max(p.sm_count, 1) + chunk.n * groups - 1) / (chunk.n * groups);
    chunk.splits = std::clamp(wanted, 1, std::min(kMaxSplits, pairs / chunk.n));
    const unsigned n = static_cast<unsigned>(chunk.n), heads = static_cast<unsigned>(p.heads);
    latent_absorb_kernel<<<dim3((p.kv_lora + kAbsorbCols - 1) / kAbsorbCols, heads,
                                (n + kAbsorbTokens - 1) / kAbsorbTokens),
                           kThreads,
                           (kAbsorbTokens * p.nope +
                            (kAbsorbSlices - 1) * kAbsorbTokens * kAbsorbCols) *
                               sizeof(float),
                           stream>>>(p, chunk);
    SY_CUDA_LAUNCH_CHECK("latent_absorb_kernel");
    if (mma) {
      latent_attention_mma_kernel<<<dim3(static_cast<unsigned>(chunk.splits),
                                         static_cast<unsigned>(groups), n),
                                    kMmaThreads, mma_smem(row_width), stream>>>(p, chunk);
      SY_CUDA_LAUNCH_CHECK("latent_attention_mma_kernel");
    } else {
      latent_attention_kernel<<<dim3(static_cast<unsigned>(chunk.splits),
                                     static_cast<unsigned>(groups), n),
                                kThreads, attention_smem(row_width), stream>>>(p, chunk);
      SY_CUDA_LAUNCH_CHECK("latent_attention_kernel");
    }
    if (chunk.splits > 1) {
      latent_combine_kernel<<<dim3(heads, n, (p.kv_lora + kCombineCols - 1) / kCombineCols),
                              kCombineCols, 0, stream>>>(p, chunk);
      SY_CUDA_LAUNCH_CHECK("latent_combine_kernel");
    }
    latent_output_kernel<<<dim3((p.v_dim + kOutChunk - 1) / kOutChunk, heads,
                                (n + kOutTokens - 1) / kOutTokens),
                           kThreads, kOutTokens * p.kv_lora * sizeof(float), stream>>>(p, chunk);
    SY_CUDA_LAUNCH_CHECK("latent_output_kernel");
  }
}

void launch_latent_attention(const LatentParams& p, const RopeTable& table, cudaStream_t stream) {
  launch_latent_prep(p, table, stream);
  launch_latent_absorbed(p, 0, p.tokens, stream);
}

// ---- The expanded path (prefill) ----

namespace {

constexpr int kExpandMaxGroup = 16;
constexpr int kExpandBlock = 16;          // block size of the contiguous expanded K/V
constexpr int64_t kExpandQueries = 1024;  // query tokens per attention launch

// The largest divisor of heads up to `capacity`.
int expand_group(int heads, int capacity) {
  for (int g = std::min(heads, capacity); g > 1; --g)
    if (heads % g == 0) return g;
  return 1;
}

// Context row c of sequence `seq`: its latent into latent[c] (the GEMMs' input) and its roped
// k_pe into every head's rope columns of k[c].
__global__ void __launch_bounds__(128)
    latent_gather_kernel(LatentParams p, int32_t seq, LatentExpandScratch s) {
  const int64_t c = blockIdx.x;
  const int lora = p.kv_lora, row_width = lora + p.rope, q_row = p.nope + p.rope;
  const int32_t* table = p.block_tables + static_cast<int64_t>(seq) * p.block_table_stride;
  const int64_t slot =
      static_cast<int64_t>(table[c / p.block_size]) * p.block_size + c % p.block_size;
  const __nv_bfloat16* src = p.cache + slot * row_width;
  for (int i = threadIdx.x; i < lora; i += blockDim.x) s.latent[c * lora + i] = src[i];
  for (int i = threadIdx.x; i < s.group * p.rope; i += blockDim.x) {
    const int g = i / p.rope, r = i % p.rope;
    s.k[(c * s.group + g) * q_row + p.nope + r] = src[lora + r];
  }
}

// q rows [first, first + n) of heads [h0, h0 + group) into the scratch's dense [n, group, q_row].
__global__ void latent_gather_q_kernel(LatentParams p, int64_t first, int h0,
                                       LatentExpandScratch s) {
  const int64_t i = blockIdx.x;
  const int q_row = p.nope + p.rope, width = s.group * q_row;
  const float* src = p.q + ((first + i) * p.heads + h0) * q_row;
  for (int j = threadIdx.x; j < width; j += blockDim.x) s.q[i * width + j] = src[j];
}

// The attention's [n, group, q_row] rows into out's [tokens, heads, v_dim] (first v_dim columns).
__global__ void latent_scatter_out_kernel(LatentParams p, int64_t first, int h0,
                                          LatentExpandScratch s) {
  const int64_t i = blockIdx.x;
  const int q_row = p.nope + p.rope;
  for (int j = threadIdx.x; j < s.group * p.v_dim; j += blockDim.x) {
    const int g = j / p.v_dim, col = j % p.v_dim;
    p.out[((first + i) * p.heads + h0 + g) * p.v_dim + col] =
        s.out[(i * s.group + g) * q_row + col];
  }
}

}  // namespace

bool latent_expand_supported(int nope, int rope, int v_dim) {
  const int q_row = nope + rope;
  return q_row % 8 == 0 && q_row <= 256 && v_dim > 0 && v_dim <= q_row;
}

bool latent_expand_fits(const LatentParams& p, int64_t context, const LatentExpandScratch& s) {
  return s.group > 0 && latent_expand_supported(p.nope, p.rope, p.v_dim) &&
         p.nope + p.rope <= s.max_q_row && p.kv_lora <= s.max_lora && context <= s.max_context;
}

void latent_expand_release(LatentExpandScratch& s) {
  for (void* ptr : {static_cast<void*>(s.latent), static_cast<void*>(s.k), static_cast<void*>(s.v),
                    static_cast<void*>(s.q), static_cast<void*>(s.out), static_cast<void*>(s.table),
                    static_cast<void*>(s.zeros)})
    if (ptr) cudaFree(ptr);
  s = LatentExpandScratch{};
}

bool latent_expand_reserve(int heads, int kv_lora, int nope, int rope, int64_t max_context,
                           LatentExpandScratch& s) {
  latent_expand_release(s);
  s.group = std::clamp(heads, 1, kExpandMaxGroup);
  s.max_q_row = nope + rope;
  s.max_lora = kv_lora;
  s.max_context = (max_context + kExpandBlock - 1) / kExpandBlock * kExpandBlock;
  s.max_queries = kExpandQueries;
  s.table_stride = static_cast<int>(s.max_context / kExpandBlock);
  const size_t q_row = static_cast<size_t>(nope + rope), rows = static_cast<size_t>(s.max_context);
  const size_t kv_bytes = rows * s.group * q_row * sizeof(__nv_bfloat16);
  const size_t q_bytes = static_cast<size_t>(s.max_queries) * s.group * q_row * sizeof(float);
  bool ok = cudaMalloc(&s.latent, rows * kv_lora * sizeof(__nv_bfloat16)) == cudaSuccess &&
            cudaMalloc(&s.k, kv_bytes) == cudaSuccess &&
            cudaMalloc(&s.v, kv_bytes) == cudaSuccess && cudaMalloc(&s.q, q_bytes) == cudaSuccess &&
            cudaMalloc(&s.out, q_bytes) == cudaSuccess &&
            cudaMalloc(&s.table, s.table_stride * sizeof(int32_t)) == cudaSuccess &&
            cudaMalloc(&s.zeros, s.max_queries * sizeof(int32_t)) == cudaSuccess;
  if (ok) {
    std::vector<int32_t> table(static_cast<size_t>(s.table_stride));
    for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>(i);
    ok = cudaMemcpy(s.table, table.data(), table.size() * sizeof(int32_t),
                    cudaMemcpyHostToDevice) == cudaSuccess &&
         cudaMemset(s.zeros, 0, s.max_queries * sizeof(int32_t)) == cudaSuccess &&
         cudaMemset(s.v, 0, kv_bytes) == cudaSuccess;  // V's padding columns are never written
  }
  if (!ok) {
    cudaGetLastError();
    latent_expand_release(s);
  }
  return ok;
}

void launch_latent_expanded(const LatentParams& p, int64_t first, int64_t count, int32_t seq,
                            int64_t context, const LatentExpandScratch& s, cublasHandle_t cublas,
                            cudaStream_t stream) {
  if (count <= 0) return;
  if (!latent_expand_fits(p, context, s))
    cuda_fail("latent_attention", "expanded run outside its reserved scratch", __FILE__, __LINE__);
  // This launch's layout: G heads side by side (its kernels read s.group as G).
  LatentExpandScratch s_run = s;
  s_run.group = expand_group(p.heads, s.group);
  const int q_row = p.nope + p.rope, G = s_run.group;
  latent_gather_kernel<<<static_cast<unsigned>(context), 128, 0, stream>>>(p, seq, s_run);
  SY_CUDA_LAUNCH_CHECK("latent_gather_kernel");
  const float alpha = 1.0f, beta = 0.0f;
  const int64_t head_rows = static_cast<int64_t>(p.nope + p.v_dim) * p.kv_lora;
  for (int h0 = 0; h0 < p.heads; h0 += G) {
    // Per head h of the group (batch index), column-major C_h[j, c] = W_h[j, :] . latent[c, :]:
    // row c of K (and V) holds the group's heads side by side (ldc = G * q_row).
    const __nv_bfloat16* w = p.kv_b_proj + h0 * head_rows;
    SY_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
        cublas, CUBLAS_OP_T, CUBLAS_OP_N, p.nope, static_cast<int>(context), p.kv_lora, &alpha, w,
        CUDA_R_16BF, p.kv_lora, head_rows, s_run.latent, CUDA_R_16BF, p.kv_lora, 0, &beta, s_run.k,
        CUDA_R_16BF, G * q_row, q_row, G, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    SY_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
        cublas, CUBLAS_OP_T, CUBLAS_OP_N, p.v_dim, static_cast<int>(context), p.kv_lora, &alpha,
        w + static_cast<int64_t>(p.nope) * p.kv_lora, CUDA_R_16BF, p.kv_lora, head_rows,
        s_run.latent, CUDA_R_16BF, p.kv_lora, 0, &beta, s_run.v, CUDA_R_16BF, G * q_row, q_row, G,
        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    for (int64_t off = 0; off < count; off += s_run.max_queries) {
      const int64_t n = std::min(s_run.max_queries, count - off);
      const float* q = p.q + ((first + off) * p.heads + h0) * q_row;
      if (G != p.heads) {
        latent_gather_q_kernel<<<static_cast<unsigned>(n), 256, 0, stream>>>(p, first + off, h0,
                                                                             s_run);
        SY_CUDA_LAUNCH_CHECK("latent_gather_q_kernel");
        q = s_run.q;
      }
      AttentionParams a;
      a.q = q;
      a.k_cache = s_run.k;
      a.v_cache = s_run.v;
      a.positions = p.positions + first + off;
      a.token_seq = s_run.zeros;
      a.block_tables = s_run.table;
      a.block_table_stride = s_run.table_stride;
      a.block_size = kExpandBlock;
      a.tokens = n;
      a.heads = G;
      a.kv_heads = G;
      a.head_dim = q_row;
      a.scale = p.scale;
      a.out = s_run.out;
      a.max_query_len = n;
      a.max_context_len = context;
      launch_attention(a, nullptr, nullptr, stream);
      latent_scatter_out_kernel<<<static_cast<unsigned>(n), 256, 0, stream>>>(p, first + off, h0,
                                                                              s_run);
      SY_CUDA_LAUNCH_CHECK("latent_scatter_out_kernel");
    }
  }
}

}  // namespace sy::backend::cuda
