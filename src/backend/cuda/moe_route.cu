#include <cstdlib>

#include "backend/cuda/moe_route.cuh"

namespace sy::backend::cuda {
namespace {

// One block per token; its warps share the E router rows (router_logits_block). THREADS: 128 for
// steps with enough tokens to fill the GPU; up to 1024 for a few-token step, where one block's
// four warps walking E rows one after another were a chain of dependent DRAM latencies (gpt-oss
// batch-1 decode, ncu: 57 us per layer for 184 KB of router weights).
// Token t's selection from its logits (shared memory, turned into scores in place), by one whole
// warp: ids and weights into the step's [T, K] arrays and the sinks.
__device__ __forceinline__ void select_and_write(const RouteLaunch& a, int64_t t, float* logits,
                                                 int32_t* ids, float* weights) {
  const int lane = threadIdx.x & 31;
  const bool is_forced = a.forced && a.forced[t];
  const int32_t* forced = is_forced ? a.source + t * a.route_row_stride : nullptr;
  route_select_warp(logits, a.params, forced, ids, weights);
  const int K = a.params.top_k;
  if (lane < K) {
    a.ids[t * K + lane] = ids[lane];
    a.weights[t * K + lane] = weights[lane];
    if (a.sink) a.sink[t * a.route_row_stride + lane] = ids[lane];
    if (a.weight_sink) a.weight_sink[t * a.route_row_stride + lane] = weights[lane];
  }
}

template <int THREADS>
__global__ void __launch_bounds__(THREADS) route_kernel(RouteLaunch a) {
  __shared__ float logits[kMaxRouteExperts];
  __shared__ int32_t ids[kMaxRouteTopK];
  __shared__ float weights[kMaxRouteTopK];
  const int64_t t = blockIdx.x;
  router_logits_block(a.hidden + t * a.params.hidden, a.router, a.params, logits);
  __syncthreads();
  if (threadIdx.x < 32) select_and_write(a, t, logits, ids, weights);
}

// Steps of many tokens (prefill): a block per kTileTokens tokens. A warp takes kTileExperts
// router rows at a time and dots each with every token of the tile, so the router matrix is read
// once a tile, not once a token (1,024 tokens of Qwen3.5's 256 x 2,048 router were ~1 GB of L2
// reads a layer), and each x slab loaded serves kTileExperts rows. Every (token, expert) sum is
// router_logit_warp's (router_dot8 steps in slab order, the same butterfly): the logits, and so
// the routes, are bitwise those of route_kernel. Then a warp per token selects. (Tried on an H100,
// 8f3a420, alternating: 8 rows a warp (226 registers, one block an SM) and 16 tokens a tile (120
// registers): a Qwen3.5 8 x 1,024 prefill 251.1-251.6 and 248.8-249.3 ms against this shape's
// 248.2-248.4, a Qwen3 4k 161.8-162.7 and 159.7-160.6 against 159.4-159.8 ms.)
constexpr int kTileTokens = 8;
constexpr int kTileExperts = 4;
constexpr int kTileThreads = 256;
static_assert(kTileThreads / 32 >= kTileTokens, "a warp per token selects");

__global__ void __launch_bounds__(kTileThreads) route_tile_kernel(RouteLaunch a) {
  __shared__ float logits[kTileTokens][kMaxRouteExperts];
  __shared__ int32_t ids[kTileTokens][kMaxRouteTopK];
  __shared__ float weights[kTileTokens][kMaxRouteTopK];
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * kTileTokens;
  const int rows = static_cast<int>(min(static_cast<int64_t>(kTileTokens), a.tokens - t0));
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = kTileThreads / 32;
  const int H = a.params.hidden, E = a.params.num_experts;
  const float* x = a.hidden + t0 * H;
  for (int e0 = warp * kTileExperts; e0 < E; e0 += warps * kTileExperts) {
    float acc[kTileExperts][kTileTokens];
#pragma unroll
    for (int j = 0; j < kTileExperts; ++j)
#pragma unroll
      for (int m = 0; m < kTileTokens; ++m) acc[j][m] = 0.0f;
    for (int base = lane * 8; base < H; base += 256) {
      uint4 packed[kTileExperts];
#pragma unroll
      for (int j = 0; j < kTileExperts; ++j)
        packed[j] = e0 + j < E ? *reinterpret_cast<const uint4*>(
                                     a.router + static_cast<int64_t>(e0 + j) * H + base)
                               : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int m = 0; m < kTileTokens; ++m) {
        if (m >= rows) break;  // (uniform)
#pragma unroll
        for (int j = 0; j < kTileExperts; ++j)
          acc[j][m] = router_dot8(packed[j], x + m * H + base, acc[j][m]);
      }
    }
#pragma unroll
    for (int j = 0; j < kTileExperts; ++j)
#pragma unroll
      for (int m = 0; m < kTileTokens; ++m) {
        float v = acc[j][m];
        for (int offset = 16; offset > 0; offset >>= 1)
          v += __shfl_xor_sync(0xffffffffu, v, offset);
        if (lane == 0 && m < rows && e0 + j < E) logits[m][e0 + j] = v;
      }
  }
  __syncthreads();
  if (warp < rows) select_and_write(a, t0 + warp, logits[warp], ids[warp], weights[warp]);
}

}  // namespace

void launch_route(const RouteLaunch& launch, cudaStream_t stream) {
  if (launch.tokens == 0) return;
  // route_tile_kernel for steps of more than 16 tokens (H100, 2026-12-06: a Qwen3 4k prefill
  // 180.0 -> 162.5 ms, Qwen3.5 1k 130.4 -> 122.6 ms; BENCHMARKS.md); SY_ROUTE_TILE=0 keeps
  // route_kernel for them (the same logits bit for bit).
  static const bool tile = !env_off("SY_ROUTE_TILE");
  if (tile && launch.tokens > 16) {
    const unsigned tiles = static_cast<unsigned>((launch.tokens + kTileTokens - 1) / kTileTokens);
    route_tile_kernel<<<tiles, kTileThreads, 0, stream>>>(launch);
    SY_CUDA_LAUNCH_CHECK("route_tile_kernel");
    return;
  }
  const unsigned grid = static_cast<unsigned>(launch.tokens);
  if (launch.tokens <= 16)
    route_kernel<1024><<<grid, 1024, 0, stream>>>(launch);
  else if (launch.tokens <= 128)
    route_kernel<512><<<grid, 512, 0, stream>>>(launch);
  else
    route_kernel<128><<<grid, 128, 0, stream>>>(launch);
  SY_CUDA_LAUNCH_CHECK("route_kernel");
}

}  // namespace sy::backend::cuda
