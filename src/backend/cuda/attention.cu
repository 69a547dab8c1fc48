// Paged attention on tensor cores. One kernel serves decode and prefill: a block owns up to 64
// query rows, (token, query head) pairs of one sequence that share a KV head, and streams that
// sequence's keys from the paged bf16 cache through shared memory in tiles (cp.async, two
// stages), with mma.sync m16n8k16 bf16 -> f32 for QK^T and PV and an online softmax in the
// log2 domain.
//   decode: a block per (token, kv head, split). The GQA group's heads fill one m16 tile and the
//     four warps split every key tile four ways, so each K/V byte is read once. The number of
//     splits depends only on tokens, kv heads and SMs; a split finds its key range from
//     positions[t] on the device, so a recorded graph replays for any context. Splits write
//     (max, sum, acc) partials; the last split block of each token to finish merges them.
//   prefill: a block per (query tile, kv head), a tile being up to 64 / group consecutive tokens
//     of one sequence; blocks find their tile on the device (see find_prefill_tile).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "backend/cuda/attention.h"
#include "backend/cuda/mma_ptx.cuh"
#include "backend/cuda/rope_table.h"

namespace sy::backend::cuda {
namespace {

constexpr int kThreads = 128;  // four warps
constexpr int kWarps = kThreads / 32;
constexpr int kPrefillRows = 64;  // query rows of a prefill block: one m16 tile per warp
// Decode splits: tokens * splits stays within max(tokens, kSplitBudget), so the scratch reserved
// once (attention_scratch_bytes) bounds every step. Two blocks per SM, each with a 32 KB tile in
// flight, cover the latency-bandwidth product (~26 KB per SM on an H200).
constexpr int kSplitBudget = 512;
constexpr int kMaxSplits = 128;
constexpr int kDecodeBlocksPerSm = 2;
// Clustered decode (Hopper): the splits of a (token, kv head) run as clusters of kCluster blocks
// (a non-portable size; Hopper allows 16) that merge through distributed shared memory, one
// cluster barrier instead of a global write, a fence, an atomic and the L2 round trips of the
// last block's merge. A split then takes at least min(kClusterTiles, tiles / kCluster) key tiles
// (SY_ATTN_CLUSTER_TILES=N: N instead, for A/Bs), so a context of up to kCluster * kClusterTiles
// tiles (4,096 keys) stays in one cluster and needs no global merge at all; longer ones merge one
// partial per cluster as before.
// Measured (H100, 2026-12-07, one binary with and without): batch 1 gpt-oss-20b 2.6%, Qwen3.5
// 0.9%, Qwen3 0.3% faster; batches 2-3 within +-0.5% (gpt-oss batch 2 +2% once); Qwen3 batch 4
// 3.8% slower (16 clusters of 16 busy at once), so steps of more than kClusterMaxTokens decode
// tokens keep the global merge.
constexpr int kCluster = 16;  // (SY_ATTN_CLUSTER_SIZE=2|4|8: smaller clusters, for A/Bs)
constexpr int kClusterTiles = 4;
constexpr int kClusterMaxTokens = 3;
constexpr float kLog2e = 1.4426950408889634f;
// RoPE's rotate-half pairs per lane (head_dim <= 256). The frequencies (rope_table.h) are
// computed once on the host and passed by value in the launch parameters: a per-block double
// pow was the longest dependent chain at the start of the decode kernels.
constexpr int kPrepPairs = 4;
constexpr int kMaxHalf = 32 * kPrepPairs;
static_assert(kMaxHalf == kRopeMaxHalf, "a lane's pairs cover the table");

__host__ __device__ constexpr int ceil_div(int a, int b) {
  return (a + b - 1) / b;
}

// Shared-memory layout of one instantiation. DPAD is head_dim rounded up to 64/128/256 (padding
// columns are zero, so they add nothing to q.k); MT is the number of m16 row tiles, 1 for
// decode with groups <= 16 (the other three warps then split the keys) and 4 otherwise.
template <int DPAD, int MT>
struct Tiling {
  static constexpr int kRows = MT * 16;
  static constexpr int kSlices = kWarps / MT;  // warps that share an m16 tile, each a key slice
  static constexpr int kKeys = (DPAD == 256 && MT > 1) ? 32 : 64;  // keys per tile (registers)
  static constexpr int kKeysPerWarp = kKeys / kSlices;
  static constexpr int kChunks = DPAD / 8;  // 16-byte chunks of a padded bf16 row
  // +8 elements (16 bytes) per row: the eight rows an ldmatrix reads fall in distinct banks.
  static constexpr int kStride = DPAD + 8;
  static constexpr int kOutStride = DPAD + 8;  // f32 rows of the final combine
  static constexpr size_t kQBytes = size_t{kRows} * kStride * 2;
  static constexpr size_t kTileBytes = size_t{2} * kKeys * kStride * 2;  // K and V of one stage
  static constexpr size_t kOutBytes = size_t{kWarps} * 16 * kOutStride * 4;
  static constexpr size_t kSmemBytes =
      kQBytes + (2 * kTileBytes > kOutBytes ? 2 * kTileBytes : kOutBytes);
  static_assert(kKeysPerWarp % 16 == 0, "a warp's key slice is a whole k16 step of PV");
  static_assert((kKeys * kChunks) % kThreads == 0, "tile loads divide evenly among threads");
};

struct KernelArgs {
  AttentionParams p;
  int group = 1;        // query heads per kv head
  int row_chunks = 1;   // blocks along one tile's rows (only groups wider than a block)
  int tile_tokens = 1;  // prefill: tokens per tile window
  int splits = 1;       // decode: key splits per token; 1 writes `out` directly
  bool decode = true;
  float2* partial_ml = nullptr;  // [tokens * heads * splits] (max in log2 units, sum)
  float* partial_o = nullptr;    // [tokens * heads * splits, head_dim], unnormalised
  int* arrivals = nullptr;       // [tokens * kv_heads * row_chunks] splits done; the last resets it
  bool early_merge = true;  // SY_ATTN_EARLY_MERGE=0 (A/B): the merge's two round trips as before
  int cluster = 1;          // decode: splits per cluster (<= kCluster, or 1: no clusters)
  int cluster_tiles = kClusterTiles;  // clustered: a split's least key tiles (see split_chunk)
  // Decode with the q/k prep fused (prep.q set): q rows are normed and rotated from the raw
  // projection as they are loaded, and the split holding a token's own key computes that K/V
  // row itself (into the cache and its tile). p.q is then unused.
  QkvPrepParams prep;
  RopeTable rope;  // prep only
  unsigned long long* stamps = nullptr;  // SY_ATTN_STAMPS=1 (experiments): [blocks, kAttnStamps]
};

// Phase timer of the one-token decode launches (SY_ATTN_STAMPS=1, no graphs): thread 0 of each
// block writes %globaltimer at each phase; a phase a block never reaches stays 0.
constexpr int kAttnStamps = 12;
__device__ __forceinline__ void attn_stamp(const KernelArgs& a, int phase) {
  if (a.stamps && threadIdx.x == 0) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    const unsigned block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    a.stamps[block * kAttnStamps + phase] = t;
  }
}

// The PTX wrappers (cp.async, ldmatrix, mma.sync bf16): mma_ptx.cuh.

// One head's per-head RMSNorm (norm optional) and rotate-half RoPE, by one whole warp: lane l
// returns the rotated pair (i, i + half) for i = l + 32 j in lo[j], hi[j] (i < half <= 128).
// The arithmetic of rms_norm_kernel and rope_kernel; qk_norm_rope_write_kv_kernel and the
// decode attention with the prep fused both call it, so they compute bitwise the same values.
// cosf and sinf out of line: inlined, each brings its large-argument reduction along, and the
// unrolled prep would carry dozens of copies (instruction-cache misses in a latency-bound kernel).
__device__ __noinline__ float2 rope_cos_sin(float angle) {
  return make_float2(cosf(angle), sinf(angle));
}
__device__ __forceinline__ void prep_load(const float* x, int D, float (&lo)[kPrepPairs], float (&hi)[kPrepPairs]) {
  const int lane = threadIdx.x & 31, half = D / 2;
#pragma unroll
  for (int j = 0; j < kPrepPairs; ++j) {
    const int i = lane + 32 * j;
    lo[j] = i < half ? x[i] : 0.0f;
    hi[j] = i < half ? x[i + half] : 0.0f;
  }
}
// cos/sin of lane l's pairs i = l + 32 j at `position` (launch constants: kernels compute them
// before waiting for the previous kernel).
__device__ __forceinline__ void rope_cs(const RopeTable& rope, int D, float position, float2 (&cs)[kPrepPairs]) {
  const int lane = threadIdx.x & 31, half = D / 2;
#pragma unroll
  for (int j = 0; j < kPrepPairs; ++j) {
    const int i = lane + 32 * j;
    if (i < half) {
      const float2 c = rope_cos_sin(position * rope.inv_freq[i]);
      cs[j] = make_float2(c.x * rope.factor, c.y * rope.factor);
    } else {
      cs[j] = make_float2(1.0f, 0.0f);
    }
  }
}
__device__ __forceinline__ void prep_finish(const float* norm, int D, float eps, const float2 (&cs)[kPrepPairs],
                                            float (&lo)[kPrepPairs], float (&hi)[kPrepPairs]) {
  const int lane = threadIdx.x & 31, half = D / 2;
  float sum_squares = 0.0f;
#pragma unroll
  for (int j = 0; j < kPrepPairs; ++j) sum_squares += lo[j] * lo[j] + hi[j] * hi[j];
  if (norm) {
    for (int o = 16; o > 0; o >>= 1) sum_squares += __shfl_xor_sync(0xffffffffu, sum_squares, o);
    const float scale = rsqrtf(sum_squares / static_cast<float>(D) + eps);
#pragma unroll
    for (int j = 0; j < kPrepPairs; ++j) {
      const int i = lane + 32 * j;
      if (i < half) {
        lo[j] = norm[i] * (lo[j] * scale);
        hi[j] = norm[i + half] * (hi[j] * scale);
      }
    }
  }
#pragma unroll
  for (int j = 0; j < kPrepPairs; ++j) {
    const int i = lane + 32 * j;
    if (i >= half) continue;
    const float c = cs[j].x, sn = cs[j].y;
    const float a = lo[j] * c - hi[j] * sn, b = hi[j] * c + lo[j] * sn;
    lo[j] = a;
    hi[j] = b;
  }
}
// prep_load then prep_finish (the loads of several heads can be issued before any finish).
__device__ __forceinline__ void prep_head(const float* x, const float* norm, int D, float eps,
                                          const float2 (&cs)[kPrepPairs], float (&lo)[kPrepPairs],
                                          float (&hi)[kPrepPairs]) {
  prep_load(x, D, lo, hi);
  prep_finish(norm, D, eps, cs, lo, hi);
}

// Eight consecutive floats, times `scale`, as eight bf16 in one 16-byte word.
__device__ __forceinline__ uint4 load_bf16x8(const float* src, float scale) {
  const float4 lo = *reinterpret_cast<const float4*>(src);
  const float4 hi = *reinterpret_cast<const float4*>(src + 4);
  return make_uint4(pack_bf16(lo.x * scale, lo.y * scale), pack_bf16(lo.z * scale, lo.w * scale),
                    pack_bf16(hi.x * scale, hi.y * scale), pack_bf16(hi.z * scale, hi.w * scale));
}

// A decode split's keys: the context cut into `splits` chunks of whole key tiles; splits past
// the context are empty. Clustered (cluster > 1), a chunk is at least min(cluster_tiles,
// tiles / cluster) tiles, so that short contexts fill the first cluster only. The merge uses the
// same rule to know how many splits wrote.
struct KeyRange {
  int begin = 0, end = 0;
};
__device__ inline int split_chunk(int context, int key_tile, const KernelArgs& a) {
  const int tiles = ceil_div(context, key_tile);
  int per_split = ceil_div(tiles, a.splits);
  if (a.cluster > 1) per_split = max(per_split, min(a.cluster_tiles, ceil_div(tiles, a.cluster)));
  return per_split * key_tile;
}
__device__ inline KeyRange split_range(int context, int split, int key_tile, const KernelArgs& a) {
  if (context <= 0) return {};
  const int chunk = split_chunk(context, key_tile, a);
  const int begin = split * chunk;
  return {begin, min(context, begin + chunk)};
}

// Distributed shared memory of a thread block cluster (sm_90; clustered decode only).
__device__ __forceinline__ unsigned cluster_rank() {
  unsigned rank = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
#endif
  return rank;
}
// Every thread of every block of the cluster arrives; what each wrote to shared memory before
// is visible to the others after (release / acquire).
__device__ __forceinline__ void cluster_barrier() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;" ::: "memory");
#endif
}
// The address of `local` (this block's shared memory) in block `rank`'s shared memory.
__device__ __forceinline__ uint32_t cluster_address(const void* local, unsigned rank) {
  uint32_t remote = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
               : "=r"(remote)
               : "r"(static_cast<uint32_t>(__cvta_generic_to_shared(local))), "r"(rank));
#endif
  return remote;
}
__device__ __forceinline__ float4 load_cluster_f4(uint32_t address) {
  float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(address));
#endif
  return v;
}
__device__ __forceinline__ float2 load_cluster_f2(uint32_t address) {
  float2 v = make_float2(0.0f, 0.0f);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("ld.shared::cluster.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "r"(address));
#endif
  return v;
}

// Prefill tiles: the step's tokens are cut into windows of `tile_tokens` and every window again
// at sequence boundaries (token_seq is nondecreasing with consecutive ids, as the decoder packs
// it). key(t) = seq ordinal + t / tile_tokens is the same for every token of a tile and strictly
// increases from tile to tile, so tile b starts at the first token with key >= b if its key is b
// (and does not exist otherwise). Keys stay below seqs + ceil(tokens / tile_tokens), which the
// host bounds with max_query_len. Warp 0 searches 32-ary: three rounds for 32k tokens.
__device__ void find_prefill_tile(const AttentionParams& p, int tile_tokens, int target,
                                  int* first_token, int* tile_token_count) {
  const int lane = threadIdx.x & 31, tokens = static_cast<int>(p.tokens);
  const int32_t* seq = p.token_seq;
  const int seq_base = seq[0];
  auto key = [&](int t) { return seq[t] - seq_base + t / tile_tokens; };
  int lo = 0, hi = tokens;  // the answer lies in [lo, hi]; hi = tokens means none
  while (lo < hi) {
    const int step = ceil_div(hi - lo, 32);
    const int probe = lo + lane * step;
    const unsigned at_or_past = __ballot_sync(~0u, probe >= hi || key(probe) >= target);
    if (at_or_past == 0) {
      lo += 31 * step + 1;
      continue;
    }
    const int first = __ffs(at_or_past) - 1;
    if (first == 0) break;  // key(lo) >= target
    hi = min(hi, lo + first * step);
    lo += (first - 1) * step + 1;
  }
  const int t0 = lo;
  if (t0 >= tokens || key(t0) != target) {
    if (lane == 0) *first_token = -1;
    return;
  }
  const int window_end = min(tokens, (t0 / tile_tokens + 1) * tile_tokens);
  int count = 0;
  for (int base = t0; base < window_end; base += 32) {
    const int t = base + lane;
    count += __popc(__ballot_sync(~0u, t < window_end && seq[t] == seq[t0]));
  }
  if (lane == 0) {
    *first_token = t0;
    *tile_token_count = count;
  }
}

// 1 / the softmax denominator of a row whose keys gave (max, sum) in log2 units, the
// unnormalised output having been accumulated against max (or 0 when max is -inf: no keys).
// With sinks the head's sink logit joins the denominator: the result is then exp2(max - m) /
// (sum * exp2(max - m) + exp2(sink - m)), m = max(max, sink), so nothing overflows.
__device__ __forceinline__ float normaliser(const AttentionParams& p, int head, float row_max, float row_sum) {
  if (!p.sinks) return row_sum > 0.0f ? 1.0f / row_sum : 0.0f;
  const float sink = p.sinks[head] * kLog2e;
  const float m = fmaxf(row_max, sink);
  const float keep = exp2f(row_max - m);
  return keep / (row_sum * keep + exp2f(sink - m));
}

// Floor (decode): K/V bytes of the contexts / bandwidth. Floor (prefill): 4 * rows * context *
// head_dim FLOPs on tensor cores (about half of it masked away by causality).
// o += part * w, component by component (a merge's one step).
__device__ __forceinline__ void add_weighted(float4& o, const float4& part, float w) {
  o.x += part.x * w;
  o.y += part.y * w;
  o.z += part.z * w;
  o.w += part.w * w;
}

// The merge of N partials of one row slice (max in log2 units, sum; the unnormalised slice), in
// order: the weighted slice, with the row's max and sum.
template <int N>
__device__ __forceinline__ float4 merge_partials(const float2 (&ml)[N], const float4 (&part)[N],
                                                 float& row_max, float& row_sum) {
  row_max = -INFINITY;
#pragma unroll
  for (int s = 0; s < N; ++s) row_max = fmaxf(row_max, ml[s].x);
  const float base = row_max == -INFINITY ? 0.0f : row_max;
  row_sum = 0.0f;
  float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
  for (int s = 0; s < N; ++s) {
    const float w = exp2f(ml[s].x - base);
    row_sum += ml[s].y * w;
    add_weighted(o, part[s], w);
  }
  return o;
}

// A merged row slice: normalised into p.out (`final`), else the partial `part` of a later merge.
__device__ __forceinline__ void store_merged(const KernelArgs& a, int head, int64_t out_row,
                                             int64_t part, int d, const float4& o, float row_max,
                                             float row_sum, bool final) {
  const int head_dim = a.p.head_dim;
  if (final) {
    const float inv = normaliser(a.p, head, row_max, row_sum);  // no keys (position < 0): zeros
    *reinterpret_cast<float4*>(a.p.out + out_row * head_dim + d) =
        make_float4(o.x * inv, o.y * inv, o.z * inv, o.w * inv);
  } else {
    *reinterpret_cast<float4*>(a.partial_o + part * head_dim + d) = o;
    if (d == 0) a.partial_ml[part] = make_float2(row_max, row_sum);
  }
}

// The merge of a decode token's split partials, run by the last split block of each (token, kv
// head) to finish (so no second launch): a warp per (token, head) row. Lanes take the splits for
// the max and the sum (warp reductions), each split's weight goes to shared memory, then the
// partials are summed in split order. The lane's first head_dim slice of the first kEarlySplits
// partials is requested together with the (max, sum) pairs (one L2 round trip, not two: the
// merge is a chain of them). The partials come from other blocks: loads bypass L1 (__ldcg).
// Floor: (head_dim + 2) * 4 bytes read per written split.
// (EARLY: the decode-only kernel; the prefill one's registers are already at their limit.)
constexpr int kEarlySplits = 16;
template <bool EARLY>
__device__ void combine_split_row(const KernelArgs& a, int64_t pair, int written, float* weight,
                                  bool first_row) {
  const AttentionParams& p = a.p;
  const int lane = threadIdx.x & 31, head_dim = p.head_dim;
  const float2* ml = a.partial_ml + pair * a.splits;
  const float* partial = a.partial_o + pair * a.splits * head_dim;
  constexpr int kEarly = EARLY ? kEarlySplits : 1;
  const bool use_early = EARLY && a.early_merge;
  float4 early[kEarly];
#pragma unroll
  for (int s = 0; s < kEarly; ++s)
    early[s] = use_early && s < written && lane * 4 < head_dim
                   ? __ldcg(reinterpret_cast<const float4*>(partial + s * head_dim + lane * 4))
                   : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  // One read of the (max, sum) pairs, kept in registers (up to kMaxSplits / 32 per lane).
  constexpr int kPerLane = kMaxSplits / 32;
  float2 m[kPerLane];
  float row_max = -INFINITY;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int s = lane + 32 * i;
    m[i] = s < written ? __ldcg(&ml[s]) : make_float2(-INFINITY, 0.0f);
    if (s < written) row_max = fmaxf(row_max, m[i].x);
  }
  for (int o = 16; o > 0; o >>= 1) row_max = fmaxf(row_max, __shfl_xor_sync(0xffffffffu, row_max, o));
  const float base = row_max == -INFINITY ? 0.0f : row_max;
  float row_sum = 0.0f;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int s = lane + 32 * i;
    if (s < written) {
      const float w = exp2f(m[i].x - base);
      weight[s] = w;
      row_sum += m[i].y * w;
    }
  }
  for (int o = 16; o > 0; o >>= 1) row_sum += __shfl_xor_sync(0xffffffffu, row_sum, o);
  const float inv = normaliser(p, static_cast<int>(pair % p.heads), row_max, row_sum);
  if (first_row) attn_stamp(a, 9);
  __syncwarp();
  // The partials: 16 splits' loads in flight at once (a short context writes about that many).
  // Measured against fewer in flight (unroll 4: +1.0% per batch-1 step, unroll 1: +6.6%) and
  // predicated batches of 16 (+1.4%): the merge waits on L2 round trips, not on its code size.
  for (int d = lane * 4; d < head_dim; d += 128) {
    float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    int s = 0;
    if (use_early && d == lane * 4) {  // the early slice: the same sum in the same order
#pragma unroll
      for (; s < kEarly; ++s) {
        if (s >= written) break;
        add_weighted(o, early[s], weight[s] * inv);
      }
    }
#pragma unroll 16
    for (; s < written; ++s) {
      add_weighted(o, __ldcg(reinterpret_cast<const float4*>(partial + s * head_dim + d)), weight[s] * inv);
    }
    *reinterpret_cast<float4*>(p.out + pair * head_dim + d) = o;
  }
  if (first_row) attn_stamp(a, 10);
  __syncwarp();
}

template <int DPAD, int MT>
__global__ void __launch_bounds__(kThreads) attention_kernel(const __grid_constant__ KernelArgs a) {
  using L = Tiling<DPAD, MT>;
  constexpr int kKeys = L::kKeys, kKeysPerWarp = L::kKeysPerWarp, kStride = L::kStride;
  extern __shared__ __align__(16) unsigned char smem[];
  __nv_bfloat16* s_q = reinterpret_cast<__nv_bfloat16*>(smem);
  __nv_bfloat16* s_kv = reinterpret_cast<__nv_bfloat16*>(smem + L::kQBytes);  // [stage][K,V][key]
  float* s_out = reinterpret_cast<float*>(smem + L::kQBytes);  // reuses s_kv after the key loop
  // Decode waits for the previous kernel (which writes q and this step's K/V row) only after it
  // has looked up its keys and requested every earlier step's K/V row of its first tile; prefill
  // (whose chunk's keys were all written just before) waits first.
  // MT = 1 runs decode only (prefill launches MT = 4): decode as a compile-time fact there keeps
  // the prefill code out of the small decode kernel (its instruction-cache misses cost latency).
  const bool decode = MT == 1 || a.decode;
  attn_stamp(a, 0);
  // Decode: the block's token is blockIdx.x. Its sequence, position and slot are requested here,
  // together, so that the block-table lookup below waits for one round trip, not a chain of them.
  int own_seq = 0, own_pos = 0;
  int32_t own_slot = -1;
  if (decode) {
    own_seq = a.p.token_seq[blockIdx.x];
    own_pos = a.p.positions[blockIdx.x];
    if (a.prep.q) own_slot = a.prep.slot_mapping[blockIdx.x];
  }
  if (!decode) overlap_prologue();
  __shared__ int s_pos[L::kRows], s_token[L::kRows], s_head[L::kRows];
  __shared__ int64_t s_key_offset[2][kKeys];  // element offset of each tile key's row, -1 = none
  __shared__ float s_max[kWarps][16], s_sum[kWarps][16];
  __shared__ int s_first_token, s_tile_tokens, s_context;

  const AttentionParams& p = a.p;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int head_dim = p.head_dim, group = a.group, chunks = head_dim / 8;
  const int kv_head = blockIdx.y / a.row_chunks;
  const int row0 = static_cast<int>(blockIdx.y % a.row_chunks) * L::kRows;

  if (tid == 0) s_context = 0;
  if (decode) {
    if (tid == 0) {
      s_first_token = blockIdx.x;
      s_tile_tokens = 1;
    }
  } else if (warp == 0) {
    // Reversed so that the late tiles of a sequence, which see the longest contexts, start first.
    find_prefill_tile(p, a.tile_tokens, gridDim.x - 1 - blockIdx.x, &s_first_token, &s_tile_tokens);
  }
  __syncthreads();
  const int t0 = s_first_token;
  if (t0 < 0) return;
  const int rows = min(L::kRows, s_tile_tokens * group - row0);
  if (rows <= 0) return;

  // Rows: row r is (token t0 + (row0 + r) / group, head kv_head * group + (row0 + r) % group).
  if (tid < L::kRows) {
    int pos = -1, token = t0, head = 0;
    if (tid < rows) {
      token = t0 + (row0 + tid) / group;
      head = kv_head * group + (row0 + tid) % group;
      pos = p.positions[token];
      atomicMax(&s_context, pos + 1);
    }
    s_pos[tid] = pos;
    s_token[tid] = token;
    s_head[tid] = head;
  }
  // Q in bf16, pre-scaled by scale * log2(e) so the softmax runs on exp2. Rows past `rows` and
  // columns past head_dim are zero. (Decode loads it after its wait, below.)
  const float q_scale = p.scale * kLog2e;
  auto load_q = [&] {
    for (int c = tid; c < L::kRows * L::kChunks; c += kThreads) {
      const int r = c / L::kChunks, col = c % L::kChunks;
      uint4 packed = make_uint4(0, 0, 0, 0);
      if (r < rows && col < chunks) {
        const int flat = row0 + r;
        const int64_t row =
            static_cast<int64_t>(t0 + flat / group) * p.heads + kv_head * group + flat % group;
        packed = load_bf16x8(p.q + row * head_dim + col * 8, q_scale);
      }
      *reinterpret_cast<uint4*>(s_q + r * kStride + col * 8) = packed;
    }
  };
  if (!decode) load_q();
  // Padding columns of the K/V tiles are never copied into; zero them once (NaN garbage there
  // would poison q.k and p.v even against zero weights).
  if (chunks < L::kChunks) {
    for (int c = tid; c < 4 * kKeys * L::kChunks; c += kThreads) {
      const int col = c % L::kChunks;
      if (col >= chunks)
        *reinterpret_cast<uint4*>(s_kv + (c / L::kChunks) * kStride + col * 8) =
            make_uint4(0, 0, 0, 0);
    }
  }
  __syncthreads();
  attn_stamp(a, 1);

  const int context = s_context;
  // Sliding window: no row of the block sees keys before key_lo (row 0 has the block's lowest
  // position; a decode block has one token). Decode splits cut [key_lo, context).
  const int window = p.sliding_window;
  int key_lo = window > 0 ? max(0, s_pos[0] - window + 1) : 0;
  // Batch invariance: key tiles at multiples of kKeys whatever the block's rows (the tiles
  // before a row's window are fully masked for it, and such a tile changes nothing).
  if (p.batch_invariant) key_lo = key_lo / kKeys * kKeys;
  const int span = context - key_lo;
  KeyRange range{key_lo, context};
  if (decode) {
    range = split_range(span, blockIdx.z, kKeys, a);
    // Clustered, an empty split of a cluster with keys still takes part in its merge (with no
    // tiles it leaves max -inf, sum 0, zeros); a cluster without keys leaves as a whole.
    const bool leave =
        a.cluster > 1
            ? split_range(span, blockIdx.z / a.cluster * a.cluster, kKeys, a).begin >= span
            : range.begin >= range.end;
    range.begin += key_lo;
    range.end += key_lo;
    if (a.splits > 1 && leave) {
      // No keys at all (no split writes): split 0 writes the zeros a single pass would.
      overlap_prologue();
      if (context == 0 && blockIdx.z == 0)
        for (int i = tid; i < rows * head_dim; i += kThreads)
          p.out[(static_cast<int64_t>(s_token[i / head_dim]) * p.heads + s_head[i / head_dim]) * head_dim +
                i % head_dim] = 0.0f;
      return;  // the last split to finish merges the others
    }
  }
  const int tiles = range.end > range.begin ? ceil_div(range.end - range.begin, kKeys) : 0;
  const int seq = decode ? own_seq : p.token_seq[t0];
  const int32_t* table = p.block_tables + static_cast<int64_t>(seq) * p.block_table_stride;
  const int64_t slot_elems = static_cast<int64_t>(p.kv_heads) * head_dim;
  const int64_t head_elems = static_cast<int64_t>(kv_head) * head_dim;

  // Where tile `tile`'s keys live: one block-table lookup per key, shared by all the chunks.
  auto plan_tile = [&](int tile, int stage) {
    if (tid < kKeys) {
      const int key = range.begin + tile * kKeys + tid;
      int64_t offset = -1;
      if (tile < tiles && key < range.end) {
        const int64_t slot =
            static_cast<int64_t>(table[key / p.block_size]) * p.block_size + key % p.block_size;
        offset = slot * slot_elems + head_elems;
      }
      s_key_offset[stage][tid] = offset;
    }
  };
  // Keys past the range are zero-filled (their scores are masked; zero V keeps P.V finite).
  // Tile key `skip` (-1: none) is left out, to be loaded by load_key.
  auto load_tile = [&](int stage, int skip) {
    __nv_bfloat16* k_tile = s_kv + stage * 2 * kKeys * kStride;
    __nv_bfloat16* v_tile = k_tile + kKeys * kStride;
#pragma unroll
    for (int i = 0; i < kKeys * L::kChunks / kThreads; ++i) {
      const int c = tid + i * kThreads, key = c / L::kChunks, col = c % L::kChunks;
      if (col < chunks && key != skip) {
        const int64_t offset = s_key_offset[stage][key];
        const int64_t src = offset < 0 ? 0 : offset + col * 8;
        cp_async_16(k_tile + key * kStride + col * 8, p.k_cache + src, offset >= 0);
        cp_async_16(v_tile + key * kStride + col * 8, p.v_cache + src, offset >= 0);
      }
    }
  };
  // Fused prep: this token's RoPE cos/sin, before the wait (position and table are inputs).
  float2 cs[kPrepPairs];
  if (a.prep.q) rope_cs(a.rope, head_dim, static_cast<float>(own_pos), cs);  // prep: decode only
  // Fused prep (decode, MT = 1): q rows from the raw projection, normed and rotated as
  // qk_norm_rope_write_kv_kernel does (prep_head), a warp per row; padding rows and columns zero.
  // With `own`, the last warp also makes this token's K/V row for kv_head: into the cache at its
  // slot, and into tile 0's row `skip` when it is there (else a later tile load reads it from the
  // cache: fenced here). Every row's loads (q rows, own k and v) go out before any arithmetic.
  // own_slot (above): this token's KV slot, an input, read before the wait.
  auto prep_rows = [&](bool own, int skip) {
    for (int c = tid; c < L::kRows * L::kChunks; c += kThreads) {
      const int r = c / L::kChunks, col = c % L::kChunks;
      if (r >= rows || col >= chunks) *reinterpret_cast<uint4*>(s_q + r * kStride + col * 8) = make_uint4(0, 0, 0, 0);
    }
    const int half = head_dim / 2;
    constexpr int kRowsPerWarp = L::kRows / kWarps;
    float lo[kRowsPerWarp][kPrepPairs], hi[kRowsPerWarp][kPrepPairs];
#pragma unroll
    for (int n = 0; n < kRowsPerWarp; ++n) {
      const int r = warp + n * kWarps;
      if (r < rows)
        prep_load(a.prep.q + (static_cast<int64_t>(t0) * p.heads + kv_head * group + row0 + r) * head_dim, head_dim,
                  lo[n], hi[n]);
    }
    const bool kv_warp = own && warp == kWarps - 1 && own_slot >= 0;
    const int64_t kv_row = static_cast<int64_t>(t0) * p.kv_heads + kv_head;
    float k_lo[kPrepPairs], k_hi[kPrepPairs], v_lo[kPrepPairs], v_hi[kPrepPairs];
    if (kv_warp) {
      prep_load(a.prep.k + kv_row * head_dim, head_dim, k_lo, k_hi);
      prep_load(a.prep.v + kv_row * head_dim, head_dim, v_lo, v_hi);
    }
#pragma unroll
    for (int n = 0; n < kRowsPerWarp; ++n) {
      const int r = warp + n * kWarps;
      if (r >= rows) continue;
      prep_finish(a.prep.q_norm, head_dim, a.prep.eps, cs, lo[n], hi[n]);
#pragma unroll
      for (int j = 0; j < kPrepPairs; ++j) {
        const int i = lane + 32 * j;
        if (i >= half) continue;
        s_q[r * kStride + i] = __float2bfloat16_rn(lo[n][j] * q_scale);
        s_q[r * kStride + i + half] = __float2bfloat16_rn(hi[n][j] * q_scale);
      }
    }
    if (!own || warp != kWarps - 1) return;
    if (own_slot < 0) {  // padding: nothing to write; a defined (zero) row in the tile
      if (skip >= 0)
        for (int i = lane; i < head_dim; i += 32)
          s_kv[skip * kStride + i] = s_kv[(kKeys + skip) * kStride + i] = __float2bfloat16_rn(0.0f);
      return;
    }
    prep_finish(a.prep.k_norm, head_dim, a.prep.eps, cs, k_lo, k_hi);
    const int64_t at = (static_cast<int64_t>(own_slot) * p.kv_heads + kv_head) * head_dim;
    __nv_bfloat16* k_tile = s_kv + skip * kStride;  // stage 0
    __nv_bfloat16* v_tile = s_kv + (kKeys + skip) * kStride;
#pragma unroll
    for (int j = 0; j < kPrepPairs; ++j) {
      const int i = lane + 32 * j;
      if (i >= half) continue;
      const __nv_bfloat16 k0 = __float2bfloat16_rn(k_lo[j]), k1 = __float2bfloat16_rn(k_hi[j]);
      const __nv_bfloat16 v0 = __float2bfloat16_rn(v_lo[j]), v1 = __float2bfloat16_rn(v_hi[j]);
      a.prep.k_cache[at + i] = k0;
      a.prep.k_cache[at + i + half] = k1;
      a.prep.v_cache[at + i] = v0;
      a.prep.v_cache[at + i + half] = v1;
      if (skip >= 0) {
        k_tile[i] = k0, k_tile[i + half] = k1;
        v_tile[i] = v0, v_tile[i + half] = v1;
      }
    }
    if (skip < 0) __threadfence();
  };
  auto load_key = [&](int stage, int key) {
    __nv_bfloat16* k_tile = s_kv + stage * 2 * kKeys * kStride;
    __nv_bfloat16* v_tile = k_tile + kKeys * kStride;
    const int64_t offset = s_key_offset[stage][key];
    for (int col = tid; col < chunks; col += kThreads) {
      const int64_t src = offset < 0 ? 0 : offset + col * 8;
      cp_async_16(k_tile + key * kStride + col * 8, p.k_cache + src, offset >= 0);
      cp_async_16(v_tile + key * kStride + col * 8, p.v_cache + src, offset >= 0);
    }
  };

  // Warp state: m16 tile `m_tile` of the rows, keys [slice * kKeysPerWarp, +kKeysPerWarp) of
  // every tile. A thread holds rows lane/4 and lane/4 + 8 of the m16 tile (mma C layout).
  const int m_tile = warp % MT, slice = warp / MT;
  const int row_a = m_tile * 16 + (lane >> 2), row_b = row_a + 8;
  const int limit_a = min(s_pos[row_a], range.end - 1), limit_b = min(s_pos[row_b], range.end - 1);
  const int warp_limit = __reduce_max_sync(~0u, max(limit_a, limit_b));
  // The window's first key of each row (0 without one); rows past `rows` have position -1.
  const int lower_a = window > 0 ? s_pos[row_a] - window + 1 : 0;
  const int lower_b = window > 0 ? s_pos[row_b] - window + 1 : 0;
  const int warp_lower = __reduce_min_sync(~0u, min(lower_a, lower_b));
  const bool warp_has_rows = m_tile * 16 < rows;
  // ldmatrix.x4: lanes 8i..8i+7 give the row addresses of matrix i.
  const int matrix = lane >> 3, matrix_row = lane & 7;
  float acc[DPAD / 8][4] = {};
  float max_a = -INFINITY, max_b = -INFINITY, sum_a = 0.0f, sum_b = 0.0f;

  plan_tile(0, 0);
  __syncthreads();
  attn_stamp(a, 2);
  if (decode) {
    // This step's key (the token's own position, context - 1) was written by the previous
    // kernel; every other key by an earlier step. Request those now, then wait, then the rest.
    const int fresh = context - 1 - range.begin;
    const int skip = tiles > 0 && fresh >= 0 && fresh < kKeys ? fresh : -1;
    load_tile(0, skip);
    cp_async_commit();
    overlap_prologue();
    attn_stamp(a, 3);
    if (a.prep.q) {
      const int own = context - 1;  // this step's key, written by the split that holds it
      prep_rows(tiles > 0 && own >= range.begin && own < range.end, skip);
    } else {
      load_q();
      if (skip >= 0) load_key(0, skip);
    }
    attn_stamp(a, 4);
  } else {
    load_tile(0, -1);
  }
  cp_async_commit();
  for (int tile = 0; tile < tiles; ++tile) {
    const int stage = tile & 1;
    plan_tile(tile + 1, stage ^ 1);
    __syncthreads();  // offsets of tile+1 ready; every warp is done with tile-1's buffer
    if (tile + 1 < tiles) load_tile(stage ^ 1, -1);
    cp_async_commit();  // possibly empty: keeps one group per iteration
    cp_async_wait<1>();
    __syncthreads();  // tile's copies from every thread have landed

    const int key0 = range.begin + tile * kKeys + slice * kKeysPerWarp;
    // All masked (past every row's position or before every row's window): nothing to add.
    if (!warp_has_rows || key0 > warp_limit || key0 + kKeysPerWarp <= warp_lower) continue;
    const __nv_bfloat16* k_tile = s_kv + (stage * 2 * kKeys + slice * kKeysPerWarp) * kStride;
    const __nv_bfloat16* v_tile = k_tile + kKeys * kStride;

    // S = Q K^T for 16 rows x kKeysPerWarp keys.
    float score[kKeysPerWarp / 8][4] = {};
#pragma unroll
    for (int kk = 0; kk < DPAD / 16; ++kk) {
      if (kk * 16 >= head_dim) break;
      uint32_t qa[4];
      ldmatrix_x4(qa, s_q + (m_tile * 16 + (matrix & 1) * 8 + matrix_row) * kStride + kk * 16 +
                          (matrix >> 1) * 8);
#pragma unroll
      for (int np = 0; np < kKeysPerWarp / 16; ++np) {
        uint32_t kb[4];
        ldmatrix_x4(kb, k_tile + (np * 16 + (matrix >> 1) * 8 + matrix_row) * kStride + kk * 16 +
                            (matrix & 1) * 8);
        mma_bf16(score[2 * np], qa, kb[0], kb[1]);
        mma_bf16(score[2 * np + 1], qa, kb[2], kb[3]);
      }
    }

    // Causal mask and the online softmax; a row's max is shared by the four lanes of a quad.
    float tile_max_a = -INFINITY, tile_max_b = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < kKeysPerWarp / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int key = key0 + nt * 8 + 2 * (lane & 3) + e;
        if (key > limit_a || key < lower_a) score[nt][e] = -INFINITY;
        if (key > limit_b || key < lower_b) score[nt][2 + e] = -INFINITY;
        tile_max_a = fmaxf(tile_max_a, score[nt][e]);
        tile_max_b = fmaxf(tile_max_b, score[nt][2 + e]);
      }
    }
#pragma unroll
    for (int offset = 1; offset < 4; offset <<= 1) {
      tile_max_a = fmaxf(tile_max_a, __shfl_xor_sync(~0u, tile_max_a, offset));
      tile_max_b = fmaxf(tile_max_b, __shfl_xor_sync(~0u, tile_max_b, offset));
    }
    const float new_max_a = fmaxf(max_a, tile_max_a), new_max_b = fmaxf(max_b, tile_max_b);
    // A row with nothing unmasked yet keeps max -inf; exp2 against 0 then gives 0, not NaN.
    const float base_a = new_max_a == -INFINITY ? 0.0f : new_max_a;
    const float base_b = new_max_b == -INFINITY ? 0.0f : new_max_b;
    const float rescale_a = exp2f(max_a - base_a), rescale_b = exp2f(max_b - base_b);
    max_a = new_max_a;
    max_b = new_max_b;
    float tile_sum_a = 0.0f, tile_sum_b = 0.0f;
#pragma unroll
    for (int nt = 0; nt < kKeysPerWarp / 8; ++nt) {
      score[nt][0] = exp2f(score[nt][0] - base_a);
      score[nt][1] = exp2f(score[nt][1] - base_a);
      score[nt][2] = exp2f(score[nt][2] - base_b);
      score[nt][3] = exp2f(score[nt][3] - base_b);
      tile_sum_a += score[nt][0] + score[nt][1];
      tile_sum_b += score[nt][2] + score[nt][3];
    }
    sum_a = sum_a * rescale_a + tile_sum_a;  // per-lane partial; the quad sums at the end
    sum_b = sum_b * rescale_b + tile_sum_b;
#pragma unroll
    for (int nt = 0; nt < DPAD / 8; ++nt) {
      if (nt * 8 >= head_dim) break;
      acc[nt][0] *= rescale_a;
      acc[nt][1] *= rescale_a;
      acc[nt][2] *= rescale_b;
      acc[nt][3] *= rescale_b;
    }

    // O += P V: the score accumulators of two n8 tiles are exactly the A fragment of a k16 step.
#pragma unroll
    for (int ks = 0; ks < kKeysPerWarp / 16; ++ks) {
      const uint32_t pa[4] = {pack_bf16(score[2 * ks][0], score[2 * ks][1]),
                              pack_bf16(score[2 * ks][2], score[2 * ks][3]),
                              pack_bf16(score[2 * ks + 1][0], score[2 * ks + 1][1]),
                              pack_bf16(score[2 * ks + 1][2], score[2 * ks + 1][3])};
#pragma unroll
      for (int dp = 0; dp < DPAD / 16; ++dp) {
        if (dp * 16 >= head_dim) break;
        uint32_t vb[4];
        ldmatrix_x4_trans(vb, v_tile + (ks * 16 + (matrix & 1) * 8 + matrix_row) * kStride +
                                  dp * 16 + (matrix >> 1) * 8);
        mma_bf16(acc[2 * dp], pa, vb[0], vb[1]);
        mma_bf16(acc[2 * dp + 1], pa, vb[2], vb[3]);
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // s_out overwrites the K/V tiles
  attn_stamp(a, 5);

  // Each warp leaves (max, sum, unnormalised acc) per row; the block then merges its key slices
  // (decode, MT = 1) and writes out or, for a decode split, the partial.
#pragma unroll
  for (int offset = 1; offset < 4; offset <<= 1) {
    sum_a += __shfl_xor_sync(~0u, sum_a, offset);
    sum_b += __shfl_xor_sync(~0u, sum_b, offset);
  }
  float* warp_out = s_out + warp * 16 * L::kOutStride;
  const int quad_row = lane >> 2, quad_col = 2 * (lane & 3);
#pragma unroll
  for (int nt = 0; nt < DPAD / 8; ++nt) {
    if (nt * 8 >= head_dim) break;
    *reinterpret_cast<float2*>(warp_out + quad_row * L::kOutStride + nt * 8 + quad_col) =
        make_float2(acc[nt][0], acc[nt][1]);
    *reinterpret_cast<float2*>(warp_out + (quad_row + 8) * L::kOutStride + nt * 8 + quad_col) =
        make_float2(acc[nt][2], acc[nt][3]);
  }
  if ((lane & 3) == 0) {
    s_max[warp][quad_row] = max_a;
    s_max[warp][quad_row + 8] = max_b;
    s_sum[warp][quad_row] = sum_a;
    s_sum[warp][quad_row + 8] = sum_b;
  }
  __syncthreads();

  const int quads = head_dim / 4;
  // Clustered decode: this split's partial stays in shared memory, after s_out (free K/V space).
  const bool clustered = MT == 1 && a.cluster > 1;
  float* s_part = s_out + kWarps * 16 * L::kOutStride;                      // [kRows][DPAD]
  float2* s_part_ml = reinterpret_cast<float2*>(s_part + L::kRows * DPAD);  // [kRows]
  static_assert(MT != 1 || L::kOutBytes + L::kRows * (DPAD * 4 + 8) <= 2 * L::kTileBytes,
                "a clustered split's partial fits beside s_out");
  for (int i = tid; i < rows * quads; i += kThreads) {
    const int r = i / quads, d = (i % quads) * 4, mt = r / 16, rr = r % 16;
    float2 ml[L::kSlices];
    float4 part[L::kSlices];
#pragma unroll
    for (int s = 0; s < L::kSlices; ++s) {
      const int w = s * MT + mt;
      ml[s] = make_float2(s_max[w][rr], s_sum[w][rr]);
      part[s] = *reinterpret_cast<const float4*>(s_out + (w * 16 + rr) * L::kOutStride + d);
    }
    float row_max, row_sum;
    const float4 o = merge_partials(ml, part, row_max, row_sum);
    const int64_t out_row = static_cast<int64_t>(s_token[r]) * p.heads + s_head[r];
    if (clustered) {
      *reinterpret_cast<float4*>(s_part + r * DPAD + d) = o;
      if (d == 0) s_part_ml[r] = make_float2(row_max, row_sum);
    } else {
      store_merged(a, s_head[r], out_row, out_row * a.splits + blockIdx.z, d, o, row_max, row_sum,
                   a.splits == 1);
    }
  }
  // Splits (clustered: clusters) that wrote a partial for the global merge below.
  int written = a.splits > 1 ? ceil_div(span, split_chunk(span, kKeys, a)) : 1;
  if (clustered) {
    // Rank 0 sums the cluster's partials, in rank order, from the blocks' shared memory: the
    // result, or the cluster's partial when more than one cluster has keys.
    written = ceil_div(written, a.cluster);
    cluster_barrier();  // every split's partial is in its shared memory
    attn_stamp(a, 6);
    if (cluster_rank() == 0) {
      const int64_t cluster_index = blockIdx.z / a.cluster;
      for (int i = tid; i < rows * quads; i += kThreads) {
        const int r = i / quads, d = (i % quads) * 4;
        // Every rank's pair and slice requested before any is used (32 loads in flight).
        float2 ml[kCluster];
        float4 part[kCluster];
#pragma unroll
        for (int s = 0; s < kCluster; ++s) {
          const bool rank = s < a.cluster;  // (past the cluster: weight 0)
          ml[s] = rank ? load_cluster_f2(cluster_address(&s_part_ml[r], s))
                       : make_float2(-INFINITY, 0.0f);
          part[s] = rank ? load_cluster_f4(cluster_address(s_part + r * DPAD + d, s))
                         : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
        float row_max, row_sum;
        const float4 o = merge_partials(ml, part, row_max, row_sum);
        const int64_t out_row = static_cast<int64_t>(s_token[r]) * p.heads + s_head[r];
        store_merged(a, s_head[r], out_row, out_row * a.splits + cluster_index, d, o, row_max,
                     row_sum, written == 1);
      }
    }
    cluster_barrier();  // rank 0 has read every block's shared memory: the others may leave
    attn_stamp(a, 7);
    if (cluster_rank() != 0 || written == 1) return;
  }
  if (a.splits > 1) {
    // Publish this split's partials, then count it; the block that completes the count merges.
    __shared__ int s_last;
    __shared__ float s_split_weight[kWarps][kMaxSplits];
    __threadfence();
    __syncthreads();
    if (!clustered) attn_stamp(a, 6);
    if (tid == 0) {
      int* arrivals = a.arrivals + static_cast<int64_t>(t0) * gridDim.y + blockIdx.y;
      const int done = atomicAdd(arrivals, 1) + 1;
      s_last = done == written;
      if (done == written) *arrivals = 0;  // ready for the next launch (graphs replay this one)
    }
    __syncthreads();
    attn_stamp(a, 7);
    if (!s_last) return;
    __threadfence();
    attn_stamp(a, 8);
    for (int r = warp; r < rows; r += kWarps)
      combine_split_row<MT == 1>(a, static_cast<int64_t>(s_token[r]) * p.heads + s_head[r], written,
                                 s_split_weight[warp], r == warp);
    __syncthreads();
    attn_stamp(a, 11);
  }
}

// Floor: 12 bytes per element (f32 K and V read, bf16 written). A thread per 8 elements.
__global__ void write_kv_kernel(const float* k, const float* v, __nv_bfloat16* k_cache,
                                __nv_bfloat16* v_cache, const int32_t* slot_mapping, int64_t tokens,
                                int row_chunks) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= tokens * row_chunks) return;
  const int64_t t = i / row_chunks;
  const int32_t slot = slot_mapping[t];
  if (slot < 0) return;  // padding
  const int64_t src = i * 8, dst = (static_cast<int64_t>(slot) * row_chunks + i % row_chunks) * 8;
  *reinterpret_cast<uint4*>(k_cache + dst) = load_bf16x8(k + src, 1.0f);
  *reinterpret_cast<uint4*>(v_cache + dst) = load_bf16x8(v + src, 1.0f);
}

// write_kv for rows whose width is not a multiple of 8 (tiny test models): a thread per element.
__global__ void write_kv_plain_kernel(const float* k, const float* v, __nv_bfloat16* k_cache,
                                      __nv_bfloat16* v_cache, const int32_t* slot_mapping, int64_t tokens,
                                      int64_t row) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= tokens * row) return;
  const int32_t slot = slot_mapping[i / row];
  if (slot < 0) return;
  const int64_t dst = static_cast<int64_t>(slot) * row + i % row;
  k_cache[dst] = __float2bfloat16_rn(k[i]);
  v_cache[dst] = __float2bfloat16_rn(v[i]);
}

// Attention for head widths the tensor-core kernel does not tile (not a multiple of 8: tiny
// test models), with the same semantics (causal, GQA, sliding window, sinks): a warp per
// (token, head) walks its keys one at a time with an online softmax in f32, lane l holding dims
// l + 32 j. Correctness path only: a dot product per key is a warp reduction.
__global__ void __launch_bounds__(128) attention_plain_kernel(const __grid_constant__ AttentionParams p) {
  constexpr int kDims = 8;  // 32 * 8 = 256 >= head_dim
  const int64_t warp_id = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (warp_id >= p.tokens * p.heads) return;
  const int64_t t = warp_id / p.heads;
  const int head = static_cast<int>(warp_id % p.heads), D = p.head_dim;
  const int kv_head = head / (p.heads / p.kv_heads);
  const int pos = p.positions[t];
  const int32_t* table = p.block_tables + static_cast<int64_t>(p.token_seq[t]) * p.block_table_stride;
  const int lo = p.sliding_window > 0 ? max(0, pos - p.sliding_window + 1) : 0;
  const float* q = p.q + (t * p.heads + head) * D;
  float qv[kDims], acc[kDims];
#pragma unroll
  for (int j = 0; j < kDims; ++j) {
    const int d = lane + 32 * j;
    qv[j] = d < D ? q[d] : 0.0f;
    acc[j] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  for (int key = lo; key <= pos; ++key) {
    const int64_t slot = static_cast<int64_t>(table[key / p.block_size]) * p.block_size + key % p.block_size;
    const int64_t base = (slot * p.kv_heads + kv_head) * D;
    float dot = 0.0f;
#pragma unroll
    for (int j = 0; j < kDims; ++j) {
      const int d = lane + 32 * j;
      if (d < D) dot += qv[j] * __bfloat162float(p.k_cache[base + d]);
    }
    for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
    const float score = dot * p.scale;
    const float m_new = fmaxf(m, score);
    const float keep = expf(m - m_new), weight = expf(score - m_new);
    l = l * keep + weight;
#pragma unroll
    for (int j = 0; j < kDims; ++j) {
      const int d = lane + 32 * j;
      if (d < D) acc[j] = acc[j] * keep + weight * __bfloat162float(p.v_cache[base + d]);
    }
    m = m_new;
  }
  if (p.sinks) {
    const float sink = p.sinks[head];
    const float m_new = fmaxf(m, sink);
    const float keep = expf(m - m_new);
    l = l * keep + expf(sink - m_new);
#pragma unroll
    for (int j = 0; j < kDims; ++j) acc[j] *= keep;
  }
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  float* out = p.out + (t * p.heads + head) * D;
#pragma unroll
  for (int j = 0; j < kDims; ++j) {
    const int d = lane + 32 * j;
    if (d < D) out[d] = acc[j] * inv;
  }
}

// A warp per (token, head): heads [0, heads) are q's, [heads, heads + kv_heads) k's (whose
// warp also copies v). Lane l holds the rotate-half pairs (i, i + half) for i = l + 32 j. The
// arithmetic is rms_norm_kernel's and rope_kernel's, so results equal the unfused ops.
__global__ void __launch_bounds__(128) qk_norm_rope_write_kv_kernel(const __grid_constant__ QkvPrepParams p,
                                                                     const __grid_constant__ RopeTable rope) {
  const int64_t warp_id = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  const int per_token = p.heads + p.kv_heads;
  const bool active = warp_id < p.tokens * per_token;
  float2 cs[kPrepPairs];
  if (active) rope_cs(rope, p.head_dim, static_cast<float>(p.positions[warp_id / per_token]), cs);
  overlap_prologue();
  if (!active) return;
  const int64_t t = warp_id / per_token;
  const int head = static_cast<int>(warp_id - t * per_token);
  const bool is_q = head < p.heads;
  const int kh = head - p.heads;
  const int D = p.head_dim, half = D / 2;
  float* x = is_q ? p.q + (t * p.heads + head) * D : p.k + (t * p.kv_heads + kh) * D;
  float lo[kPrepPairs], hi[kPrepPairs];
  prep_head(x, is_q ? p.q_norm : p.k_norm, D, p.eps, cs, lo, hi);
  const int32_t slot = is_q ? -1 : p.slot_mapping[t];
#pragma unroll
  for (int j = 0; j < kPrepPairs; ++j) {
    const int i = lane + 32 * j;
    if (i >= half) continue;
    x[i] = lo[j];
    x[i + half] = hi[j];
    if (slot >= 0) {
      const int64_t at = (static_cast<int64_t>(slot) * p.kv_heads + kh) * D;
      const float* v = p.v + (t * p.kv_heads + kh) * D;
      p.k_cache[at + i] = __float2bfloat16_rn(lo[j]);
      p.k_cache[at + i + half] = __float2bfloat16_rn(hi[j]);
      p.v_cache[at + i] = __float2bfloat16_rn(v[i]);
      p.v_cache[at + i + half] = __float2bfloat16_rn(v[i + half]);
    }
  }
}

// The table of a prep launch, cached per thread (each launch of a prefill step would otherwise
// pay D / 2 pow calls per layer on the host).
const RopeTable& rope_table(const QkvPrepParams& p) {
  thread_local double cached_theta = -1.0;
  thread_local int cached_d = -1;
  thread_local const float* cached_freq = nullptr;
  thread_local float cached_factor = 0.0f;
  thread_local RopeTable table;
  if (p.theta != cached_theta || p.head_dim != cached_d || p.inv_freq != cached_freq ||
      p.attention_factor != cached_factor) {
    table = make_rope_table(p.theta, p.head_dim, p.inv_freq, p.attention_factor);
    cached_theta = p.theta;
    cached_d = p.head_dim;
    cached_freq = p.inv_freq;
    cached_factor = p.attention_factor;
  }
  return table;
}

[[noreturn]] void invalid_shape(const AttentionParams& p) {
  std::fprintf(stderr,
               "switchyard: attention: head_dim must be in [1, 256] and heads a "
               "multiple of kv_heads, got head_dim %d, heads %d, kv_heads %d\n",
               p.head_dim, p.heads, p.kv_heads);
  std::abort();
}

template <int DPAD, int MT>
int launch_tiled(const KernelArgs& args, dim3 grid, cudaStream_t stream) {
  using L = Tiling<DPAD, MT>;
  SY_CUDA_CHECK(cudaFuncSetAttribute(attention_kernel<DPAD, MT>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(L::kSmemBytes)));
  launch_overlapped_in_clusters(static_cast<unsigned>(args.cluster), attention_kernel<DPAD, MT>,
                                grid, dim3(kThreads), L::kSmemBytes, stream, args);
  SY_CUDA_LAUNCH_CHECK("attention_kernel");
  return L::kKeys;
}

// The decode clusters' size: kCluster, or SY_ATTN_CLUSTER_SIZE (2, 4 or 8) for A/Bs.
int decode_cluster_size() {
  static const int size = [] {
    const char* value = std::getenv("SY_ATTN_CLUSTER_SIZE");
    const int n = value ? std::atoi(value) : kCluster;
    return n == 2 || n == 4 || n == 8 ? n : kCluster;
  }();
  return size;
}

// Whether the decode kernel of this DPAD can run in clusters of decode_cluster_size() here:
// Hopper, a non-portable size allowed, at least one such cluster resident (cudaOccupancy), and
// not SY_ATTN_CLUSTER=0 (A/B). Asked once per process (one device per process).
template <int DPAD>
bool decode_clusters_here() {
  static const bool ok = [] {
    const unsigned size = static_cast<unsigned>(decode_cluster_size());
    if (env_off("SY_ATTN_CLUSTER")) return false;
    int device = 0, major = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
        major < 9)
      return false;
    using L = Tiling<DPAD, 1>;
    const auto kernel = attention_kernel<DPAD, 1>;
    int clusters = 0;
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(1, 1, size);
    config.blockDim = dim3(kThreads);
    config.dynamicSmemBytes = L::kSmemBytes;
    cudaLaunchAttribute attribute{};
    attribute.id = cudaLaunchAttributeClusterDimension;
    attribute.val.clusterDim.x = 1;
    attribute.val.clusterDim.y = 1;
    attribute.val.clusterDim.z = size;
    config.attrs = &attribute;
    config.numAttrs = 1;
    const bool usable = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(L::kSmemBytes)) == cudaSuccess &&
                        cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed,
                                             1) == cudaSuccess &&
                        cudaOccupancyMaxActiveClusters(&clusters, kernel, &config) == cudaSuccess &&
                        clusters > 0;
    if (!usable) (void)cudaGetLastError();  // (a refused query leaves its error behind)
    return usable;
  }();
  return ok;
}
bool decode_clusters_here(int head_dim) {
  if (head_dim <= 64) return decode_clusters_here<64>();
  if (head_dim <= 128) return decode_clusters_here<128>();
  return decode_clusters_here<256>();
}

// Returns the key tile of the kernel it ran (the split granularity).
template <int MT>
int launch_for_head_dim(const KernelArgs& args, dim3 grid, cudaStream_t stream) {
  const int head_dim = args.p.head_dim;
  if (head_dim <= 64) return launch_tiled<64, MT>(args, grid, stream);
  if (head_dim <= 128) return launch_tiled<128, MT>(args, grid, stream);
  return launch_tiled<256, MT>(args, grid, stream);
}

// SY_ATTN_STAMPS=1: the phase stamps of every one-token decode launch outside graph capture,
// summarised at exit: per phase, over the blocks that reached it, the median and the latest
// block, in microseconds since the grid's first block started.
class AttentionStamps {
 public:
  static AttentionStamps* get() {
    static AttentionStamps* instance = [] {
      const char* value = std::getenv("SY_ATTN_STAMPS");
      return value && value[0] == '1' ? new AttentionStamps() : nullptr;
    }();
    return instance;
  }
  // The buffer for a launch of `blocks` on `stream`, or nullptr (capturing, or too many blocks).
  unsigned long long* begin(int64_t blocks, cudaStream_t stream) {
    if (stream_capturing(stream) || blocks > kMaxBlocks) return nullptr;
    if (!buffer_ && cudaMalloc(&buffer_, sizeof(unsigned long long) * kMaxBlocks * kAttnStamps) != cudaSuccess)
      return buffer_ = nullptr;
    SY_CUDA_CHECK(cudaMemsetAsync(buffer_, 0, sizeof(unsigned long long) * blocks * kAttnStamps, stream));
    return buffer_;
  }
  void end(int64_t blocks, cudaStream_t stream) {
    std::vector<unsigned long long> host(static_cast<size_t>(blocks) * kAttnStamps);
    SY_CUDA_CHECK(cudaMemcpyAsync(host.data(), buffer_, host.size() * 8, cudaMemcpyDeviceToHost, stream));
    SY_CUDA_CHECK(cudaStreamSynchronize(stream));
    unsigned long long start = ~0ull;
    for (int64_t b = 0; b < blocks; ++b) start = std::min(start, host[static_cast<size_t>(b) * kAttnStamps]);
    for (int ph = 0; ph < kAttnStamps; ++ph) {
      std::vector<double> t;
      for (int64_t b = 0; b < blocks; ++b) {
        const unsigned long long v = host[static_cast<size_t>(b) * kAttnStamps + ph];
        if (v != 0 && (ph == 0 || host[static_cast<size_t>(b) * kAttnStamps + 2] != 0))  // blocks with keys
          t.push_back(static_cast<double>(v - start) * 1e-3);
      }
      if (t.empty()) continue;
      std::sort(t.begin(), t.end());
      median_[ph] += t[t.size() / 2];
      max_[ph] += t.back();
      count_[ph] += static_cast<double>(t.size());
    }
    ++launches_;
  }
  ~AttentionStamps() = default;

 private:
  static constexpr int64_t kMaxBlocks = 4096;
  AttentionStamps() {
    std::atexit([] {
      AttentionStamps* s = get();
      if (!s || s->launches_ == 0) return;
      std::fprintf(stderr,
                   "decode attention phase stamps over %d one-token launches (us since the first block started; "
                   "median / last block with keys; blocks):\n",
                   s->launches_);
      const char* names[kAttnStamps] = {"start", "context known", "tile 0 planned", "wait released", "q prepped",
                                        "keys done", "partial written", "arrival counted", "merge fenced",
                                        "row 0 weighed", "row 0 written", "merged"};
      for (int ph = 0; ph < kAttnStamps; ++ph)
        std::fprintf(stderr, "  %-16s %8.2f %8.2f %8.1f\n", names[ph], s->median_[ph] / s->launches_,
                     s->max_[ph] / s->launches_, s->count_[ph] / s->launches_);
    });
  }
  unsigned long long* buffer_ = nullptr;
  double median_[kAttnStamps] = {}, max_[kAttnStamps] = {}, count_[kAttnStamps] = {};
  int launches_ = 0;
};

int max_decode_splits(int64_t tokens) {
  const int64_t by_budget = kSplitBudget / std::max<int64_t>(tokens, 1);
  return static_cast<int>(std::clamp<int64_t>(by_budget, 1, kMaxSplits));
}

}  // namespace

void launch_write_kv(const float* k, const float* v, __nv_bfloat16* k_cache, __nv_bfloat16* v_cache,
                     const int32_t* slot_mapping, int64_t tokens, int kv_heads, int head_dim,
                     cudaStream_t stream) {
  if (tokens == 0) return;
  if ((kv_heads * head_dim) % 8 != 0) {
    const int64_t elements = tokens * kv_heads * head_dim;
    write_kv_plain_kernel<<<static_cast<unsigned>((elements + 255) / 256), 256, 0, stream>>>(
        k, v, k_cache, v_cache, slot_mapping, tokens, static_cast<int64_t>(kv_heads) * head_dim);
    SY_CUDA_LAUNCH_CHECK("write_kv_plain_kernel");
    return;
  }
  const int row_chunks = kv_heads * head_dim / 8;
  const int64_t threads = tokens * row_chunks;
  write_kv_kernel<<<static_cast<unsigned>((threads + 255) / 256), 256, 0, stream>>>(
      k, v, k_cache, v_cache, slot_mapping, tokens, row_chunks);
  SY_CUDA_LAUNCH_CHECK("write_kv_kernel");
}

void launch_qk_norm_rope_write_kv(const QkvPrepParams& params, cudaStream_t stream) {
  if (params.tokens == 0) return;
  if (params.head_dim <= 0 || params.head_dim % 2 != 0 || params.head_dim > 256)
    cuda_fail("qk_norm_rope_write_kv", "head_dim must be even and <= 256", __FILE__, __LINE__);
  const int64_t warps = params.tokens * (params.heads + params.kv_heads);
  launch_overlapped(qk_norm_rope_write_kv_kernel, dim3(static_cast<unsigned>((warps + 3) / 4)), dim3(128), 0, stream,
                    params, rope_table(params));
  SY_CUDA_LAUNCH_CHECK("qk_norm_rope_write_kv_kernel");
}

size_t attention_scratch_bytes(int64_t max_decode_tokens, int heads, int head_dim) {
  // tokens * max_decode_splits(tokens) <= max(tokens, kSplitBudget) for every tokens.
  const int64_t parts = std::max<int64_t>(max_decode_tokens, kSplitBudget) * heads;
  const size_t ml_bytes = (static_cast<size_t>(parts) * sizeof(float2) + 255) / 256 * 256;
  return ml_bytes + static_cast<size_t>(parts) * head_dim * sizeof(float);
}

size_t attention_arrivals_count(int64_t max_decode_tokens, int heads) {
  return static_cast<size_t>(std::max<int64_t>(max_decode_tokens, 1)) * heads;  // >= tokens * kv_heads * row_chunks
}

namespace {
// `prep` (decode only, else nullptr): the q/k prep fused into the decode kernel. Returns false,
// having launched nothing, when prep is given for a step it cannot fuse.
bool launch_attention_impl(const AttentionParams& params, const QkvPrepParams* prep, void* scratch, int* arrivals,
                           cudaStream_t stream) {
  if (params.tokens == 0) return true;
  if (params.head_dim <= 0 || params.head_dim > 256 || params.kv_heads <= 0 || params.heads % params.kv_heads != 0)
    invalid_shape(params);
  if (params.head_dim % 8 != 0) {  // not tiled: the plain kernel (no fused prep)
    if (prep) return false;
    const int64_t warps = params.tokens * params.heads;
    attention_plain_kernel<<<static_cast<unsigned>((warps + 3) / 4), 128, 0, stream>>>(params);
    SY_CUDA_LAUNCH_CHECK("attention_plain_kernel");
    return true;
  }
  KernelArgs args;
  args.p = params;
  args.group = params.heads / params.kv_heads;
  const int tokens = static_cast<int>(params.tokens);

  if (params.max_query_len > 1 || params.batch_invariant) {
    if (prep) return false;
    // Prefill: tiles <= seqs + windows, and seqs <= tokens - max_query_len + 1.
    args.decode = false;
    args.tile_tokens = std::max(1, kPrefillRows / args.group);
    args.row_chunks = ceil_div(args.tile_tokens * args.group, kPrefillRows);
    const int64_t query_len = std::min<int64_t>(params.max_query_len, tokens);
    const int64_t tile_slots = (tokens - query_len + 1) + ceil_div(tokens, args.tile_tokens);
    const dim3 grid(static_cast<unsigned>(tile_slots),
                    static_cast<unsigned>(params.kv_heads * args.row_chunks));
    launch_for_head_dim<4>(args, grid, stream);
    return true;
  }

  // Decode: enough (token, kv head, split) blocks to give every SM kDecodeBlocksPerSm of them.
  const int mt = args.group <= 16 ? 1 : 4;
  if (prep && (mt != 1 || prep->head_dim != params.head_dim || params.head_dim % 2 != 0)) return false;
  if (prep) {
    args.prep = *prep;
    args.rope = rope_table(*prep);
  }
  args.row_chunks = ceil_div(args.group, 16 * mt);
  int device = 0, sms = 0;
  SY_CUDA_CHECK(cudaGetDevice(&device));
  SY_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int64_t pairs = params.tokens * params.kv_heads * args.row_chunks;
  int64_t wanted = (static_cast<int64_t>(sms) * kDecodeBlocksPerSm + pairs - 1) / pairs;
  // SY_ATTN_SPLITS=N (experiments): N key splits per (token, kv head) instead.
  static const int forced_splits = [] {
    const char* value = std::getenv("SY_ATTN_SPLITS");
    return value ? std::atoi(value) : 0;
  }();
  if (forced_splits > 0) wanted = forced_splits;
  args.splits =
      scratch && arrivals ? static_cast<int>(std::clamp<int64_t>(wanted, 1, max_decode_splits(params.tokens)))
              : 1;
  // Clustered (MT = 1 on Hopper, steps of up to kClusterMaxTokens tokens): whole clusters of
  // kCluster splits.
  const int cluster = decode_cluster_size();
  if (mt == 1 && tokens <= kClusterMaxTokens && args.splits >= cluster &&
      decode_clusters_here(params.head_dim)) {
    args.splits = args.splits / cluster * cluster;
    args.cluster = cluster;
    static const int cluster_tiles = [] {
      const char* value = std::getenv("SY_ATTN_CLUSTER_TILES");
      return value ? std::clamp(std::atoi(value), 1, 64) : kClusterTiles;
    }();
    args.cluster_tiles = cluster_tiles;
  }
  if (args.splits > 1) {
    const int64_t parts = params.tokens * params.heads * args.splits;
    args.partial_ml = static_cast<float2*>(scratch);
    const size_t ml_bytes = (static_cast<size_t>(parts) * sizeof(float2) + 255) / 256 * 256;
    args.partial_o = reinterpret_cast<float*>(static_cast<char*>(scratch) + ml_bytes);
    args.arrivals = arrivals;
    static const bool early_merge = !env_off("SY_ATTN_EARLY_MERGE");
    args.early_merge = early_merge;
  }
  const dim3 grid(static_cast<unsigned>(tokens),
                  static_cast<unsigned>(params.kv_heads * args.row_chunks),
                  static_cast<unsigned>(args.splits));
  AttentionStamps* stamps = tokens == 1 ? AttentionStamps::get() : nullptr;
  const int64_t blocks = static_cast<int64_t>(grid.x) * grid.y * grid.z;
  if (stamps) args.stamps = stamps->begin(blocks, stream);
  if (mt == 1) launch_for_head_dim<1>(args, grid, stream);
  else launch_for_head_dim<4>(args, grid, stream);
  if (args.stamps) stamps->end(blocks, stream);
  return true;
}
}  // namespace

void launch_attention(const AttentionParams& params, void* scratch, int* arrivals, cudaStream_t stream) {
  launch_attention_impl(params, nullptr, scratch, arrivals, stream);
}

bool launch_prep_attention(const QkvPrepParams& prep, const AttentionParams& params, void* scratch, int* arrivals,
                           cudaStream_t stream) {
  if (prep.head_dim <= 0 || prep.head_dim % 2 != 0 || prep.head_dim > 256) return false;
  return launch_attention_impl(params, &prep, scratch, arrivals, stream);
}

}  // namespace sy::backend::cuda
