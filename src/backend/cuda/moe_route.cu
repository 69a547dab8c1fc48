#include <algorithm>

#include "backend/cuda/moe_route.cuh"

namespace sy::backend::cuda {
namespace {

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

// The logits of a step (tensor cores; the sum moe_route.cuh defines) into a.sums. A block takes
// kM tokens x kN experts: 8 warps of WM m16 tiles x 4 n8 tiles; x is staged in shared memory a
// group at a time (cp.async; rows padded by 16 floats so a quarter-warp's float4 reads fall in
// distinct banks), the router rows come from L2 a step ahead of their mma. PER_GROUP: a block per
// group (blockIdx.z), its sums into a.sums[group]; else a block runs every group in turn, two
// stages, and stores their total (one "group").
template <int WM, int WARP_ROWS, bool PER_GROUP>
struct RouteTile {
  static constexpr int kWM = WM;
  static constexpr bool kPerGroup = PER_GROUP;
  static constexpr int kThreads = 256, kWarps = 8, kWarpCols = kWarps / WARP_ROWS;
  static constexpr int kM = 16 * WM * WARP_ROWS, kN = 32 * kWarpCols;
  static constexpr int kRowFloats = kRouterGroup + 16;
  static constexpr int kStages = PER_GROUP ? 1 : 2;
  static constexpr size_t kSmemBytes = static_cast<size_t>(kStages) * kM * kRowFloats * 4;
};
// Steps of up to 16 tokens: 16 x 256 a block, a block a group; up to kPerGroupMaxTokens: 64 x
// 128, a block a group; larger steps: 64 x 128, every group.
using SmallRouteTile = RouteTile<1, 1, true>;
using GroupRouteTile = RouteTile<2, 2, true>;
using TotalRouteTile = RouteTile<2, 2, false>;
constexpr int64_t kPerGroupMaxTokens = 1024;

template <int WM>
__device__ __forceinline__ void zero_tiles(float (&tiles)[WM][4][4]) {
#pragma unroll
  for (int mt = 0; mt < WM; ++mt)
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) tiles[mt][nt][i] = 0.0f;
}

// NORM_VEC > 0 (one token, a block a group, RouteLaunch::norm_weight): the block's x tile is
// its group's slice of the normed row, computed here instead of staged from hidden.
template <class Cfg, int NORM_VEC = 0>
__global__ void __launch_bounds__(256, 2) route_logits_kernel(const RouteLaunch a) {
  static_assert(NORM_VEC == 0 || (Cfg::kPerGroup && Cfg::kThreads == 256), "a block a group");
  [[maybe_unused]] NormRow<NORM_VEC == 0 ? 1 : NORM_VEC> norm;
  if constexpr (NORM_VEC > 0) norm.load_weight(a.norm_weight, a.params.hidden / 4);
  overlap_prologue();  // (launched overlapped: hidden is the previous kernel's output)
  constexpr int WM = Cfg::kWM;
  constexpr bool PER_GROUP = Cfg::kPerGroup;
  extern __shared__ float4 route_shared[];
  float* const xs = reinterpret_cast<float*>(route_shared);
  const int H = a.params.hidden, E = a.params.num_experts;
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * Cfg::kM;
  const int rows = static_cast<int>(min(static_cast<int64_t>(Cfg::kM), a.tokens - t0));
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  const int m_base = (warp / Cfg::kWarpCols) * WM * 16;
  const int e_base = static_cast<int>(blockIdx.x) * Cfg::kN + (warp % Cfg::kWarpCols) * 32;
  const int g_begin = PER_GROUP ? static_cast<int>(blockIdx.z) : 0;
  const int g_end = PER_GROUP ? g_begin + 1 : router_groups(H);
  const __nv_bfloat16* w_row[4];
#pragma unroll
  for (int nt = 0; nt < 4; ++nt) {
    const int e = e_base + nt * 8 + g;
    w_row[nt] = e < E ? a.router + static_cast<int64_t>(e) * H : nullptr;
  }
  auto stage = [&](int group, int buffer) {
    float* const dst = xs + buffer * Cfg::kM * Cfg::kRowFloats;
    const int k0 = group * kRouterGroup;
    constexpr int kChunks = kRouterGroup / 4;  // 16-byte chunks a row
    for (int c = threadIdx.x; c < Cfg::kM * kChunks; c += Cfg::kThreads) {
      const int r = c / kChunks, col = (c % kChunks) * 4;
      const bool fill = r < rows && k0 + col < H;
      cp_async_16(dst + r * Cfg::kRowFloats + col,
                  fill ? a.hidden + (t0 + r) * H + k0 + col : a.hidden, fill);
    }
    cp_async_commit();
  };
  auto load_w = [&](uint2(&w)[4], int k) {
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
      w[nt] =
          w_row[nt] && k < H ? *reinterpret_cast<const uint2*>(w_row[nt] + k) : make_uint2(0u, 0u);
  };

  float total[WM][4][4];
  if constexpr (!PER_GROUP) zero_tiles(total);
  if constexpr (NORM_VEC > 0) {
    // Row 0 = the group's slice of the normed row (zeros past H), rows 1.. zeros.
    __shared__ float partial[Cfg::kWarps];
    const int64_t chunks = H / 4;
    norm.load_row(a.residual.residual, a.residual.earlier_delta, a.residual.delta, chunks);
    const float s = norm.scale(H, a.eps, partial);
    for (int i = threadIdx.x; i < Cfg::kM * Cfg::kRowFloats; i += Cfg::kThreads) xs[i] = 0.0f;
    __syncthreads();
    const int c0 = g_begin * kRouterGroup / 4;  // the group's chunks [c0, c0 + kRouterGroup / 4)
#pragma unroll
    for (int j = 0; j < NORM_VEC; ++j) {
      const int c = threadIdx.x + 256 * j;
      if (c >= c0 && c < c0 + kRouterGroup / 4 && c < chunks) {
        const float4 v = norm.normed(j, s);
        *reinterpret_cast<float4*>(xs + 4 * (c - c0)) = v;
        if (blockIdx.x == 0) reinterpret_cast<float4*>(a.normed)[c] = v;
      }
    }
  } else {
    stage(g_begin, 0);
  }
  for (int group = g_begin; group < g_end; ++group) {
    const int buffer = (group - g_begin) % Cfg::kStages;
    if (!PER_GROUP && group + 1 < g_end) {
      stage(group + 1, buffer ^ 1);
      cp_async_wait<1>();
    } else if constexpr (NORM_VEC == 0) {
      cp_async_wait<0>();
    }
    __syncthreads();
    const float* const tile = xs + buffer * Cfg::kM * Cfg::kRowFloats;
    const int k_begin = group * kRouterGroup;
    float acc[WM][4][4];
    zero_tiles(acc);
    uint2 w[4], w_next[4];
    load_w(w, k_begin + 4 * q);
#pragma unroll
    for (int s = 0; s < kRouterGroupSteps; ++s) {
      if (k_begin + s * 16 >= H) break;  // (uniform) the steps router_group_tile skips
      if (s + 1 < kRouterGroupSteps) load_w(w_next, k_begin + (s + 1) * 16 + 4 * q);
#pragma unroll
      for (int mt = 0; mt < WM; ++mt) {
        const float* r0 = tile + (m_base + mt * 16 + g) * Cfg::kRowFloats + s * 16 + 4 * q;
        const RouterTerms terms =
            router_terms(*reinterpret_cast<const float4*>(r0),
                         *reinterpret_cast<const float4*>(r0 + 8 * Cfg::kRowFloats));
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) router_mma_step(acc[mt][nt], terms, w[nt]);
      }
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) w[nt] = w_next[nt];
    }
#pragma unroll
    for (int mt = 0; mt < WM; ++mt)
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        if constexpr (PER_GROUP)
          router_store_tile(acc[mt][nt], a.sums + static_cast<int64_t>(group) * a.tokens * E, E,
                            static_cast<int>(t0) + m_base + mt * 16, rows - m_base - mt * 16,
                            e_base + nt * 8, E);
        else
#pragma unroll
          for (int i = 0; i < 4; ++i) total[mt][nt][i] += acc[mt][nt][i];
      }
    __syncthreads();  // every warp is done with this buffer before it is staged again
  }
  if constexpr (!PER_GROUP)
#pragma unroll
    for (int mt = 0; mt < WM; ++mt)
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
        router_store_tile(total[mt][nt], a.sums, E, static_cast<int>(t0) + m_base + mt * 16,
                          rows - m_base - mt * 16, e_base + nt * 8, E);
}

// A warp per token: its logits from the groups' sums, then the selection.
constexpr int kSelectWarps = 4;
__global__ void __launch_bounds__(kSelectWarps * 32)
    route_select_kernel(const RouteLaunch a, int groups) {
  overlap_prologue();  // (launched overlapped: the sums are route_logits_kernel's output)
  __shared__ float logits[kSelectWarps][kMaxRouteExperts];
  __shared__ int32_t ids[kSelectWarps][kMaxRouteTopK];
  __shared__ float weights[kSelectWarps][kMaxRouteTopK];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kSelectWarps + warp;
  if (t >= a.tokens) return;  // (whole warps)
  const int E = a.params.num_experts;
  router_logits_fill(a.sums, groups, a.tokens, E, t, logits[warp], lane, 32);
  __syncwarp();
  select_and_write(a, t, logits[warp], ids[warp], weights[warp]);
}

template <class Cfg, int NORM_VEC = 0>
void launch_logits(const RouteLaunch& a, cudaStream_t stream) {
  const int E = a.params.num_experts;
  const dim3 grid(static_cast<unsigned>((E + Cfg::kN - 1) / Cfg::kN),
                  static_cast<unsigned>((a.tokens + Cfg::kM - 1) / Cfg::kM),
                  Cfg::kPerGroup ? static_cast<unsigned>(router_groups(a.params.hidden)) : 1u);
  launch_overlapped(route_logits_kernel<Cfg, NORM_VEC>, grid, dim3(Cfg::kThreads), Cfg::kSmemBytes,
                    stream, a);
  SY_CUDA_LAUNCH_CHECK("route_logits_kernel");
}

}  // namespace

bool route_fuses_norm(int64_t tokens, int64_t hidden) {
  return tokens == 1 && hidden % 4 == 0 && hidden <= 8192;
}

size_t route_sums_floats(int64_t tokens, int64_t experts, int64_t hidden) {
  const int64_t groups = router_groups(static_cast<int>(hidden));
  return static_cast<size_t>(std::max(groups * std::min(tokens, kPerGroupMaxTokens), tokens) *
                             experts);
}

void prepare_route_kernels() {
  SY_CUDA_CHECK(cudaFuncSetAttribute(
      reinterpret_cast<const void*>(route_logits_kernel<TotalRouteTile>),
      cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(TotalRouteTile::kSmemBytes)));
}

void launch_route(const RouteLaunch& launch, cudaStream_t stream) {
  if (launch.tokens == 0) return;
  // Few tokens: a block per (256 experts, group); up to kPerGroupMaxTokens: a block per (64
  // tokens, 128 experts, group); then a block per (64 tokens, 128 experts) over every group.
  int groups = router_groups(launch.params.hidden);
  if (launch.norm_weight) {  // (one token; route_fuses_norm)
    with_norm_row_vec(launch.params.hidden, [&](auto vec) {
      launch_logits<SmallRouteTile, decltype(vec)::value>(launch, stream);
    });
  } else if (launch.tokens <= SmallRouteTile::kM) {
    launch_logits<SmallRouteTile>(launch, stream);
  } else if (launch.tokens <= kPerGroupMaxTokens) {
    launch_logits<GroupRouteTile>(launch, stream);
  } else {
    launch_logits<TotalRouteTile>(launch, stream);
    groups = 1;
  }
  const unsigned grid = static_cast<unsigned>((launch.tokens + kSelectWarps - 1) / kSelectWarps);
  launch_overlapped(route_select_kernel, dim3(grid), dim3(kSelectWarps * 32), 0, stream, launch, groups);
  SY_CUDA_LAUNCH_CHECK("route_select_kernel");
}

}  // namespace sy::backend::cuda
