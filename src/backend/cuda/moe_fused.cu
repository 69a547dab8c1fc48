// cuda-fused: the monolithic MoE kernel for small decode steps. One cooperative launch per layer
// runs Gate -> Route -> Forward -> Combine: router logits, top-k with the shared routing device
// functions (moe_route.cuh, so routes equal cuda-modular's bitwise), the route sink written by
// the kernel itself (the write other engines' fused kernels forgot, DESIGN.md), the chosen
// experts' SwiGLU MLPs and the weighted combine. Deterministic: no float atomics.
// fmt (via util/status.h) turns its constexpr off under nvcc, and then its C++20 code does not
// compile (gcc 12, fmt 9); host code here is plain C++, so keep it on.
#ifndef FMT_USE_CONSTEXPR
#define FMT_USE_CONSTEXPR 1
#endif

#include <cooperative_groups.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "backend/cuda/moe_kernels.h"
#include "backend/cuda/moe_route.cuh"
#include "backend/cuda/mxfp4.cuh"
#include "backend/cuda/norm_row.cuh"

namespace sy::backend::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
// Tokens per launch: steps beyond this run as several launches (cuda-modular is the kernel for
// them; this only keeps a named cuda-fused correct on a prefill).
constexpr int kChunkTokens = 64;
// gate_up work item: gate row r and up row r, 8 slabs of 256 columns each per load round
// (H = 2048 is one round: 16 x 16-byte loads in flight per lane), dotted with up to 4 pairs'
// vectors per load (more pairs re-read the rows, from L2, for the next group).
constexpr int kGateUpSlabs = 8;
constexpr int kGateUpPairs = 4;
// down work item: 4 consecutive rows of one expert, 3 slabs per load round (I = 768 is one
// round: 12 loads), 2 pairs per load. More pairs or slabs here spill at 128 registers.
constexpr int kDownRows = 4;
constexpr int kDownSlabs = 3;
constexpr int kDownPairs = 2;
constexpr int64_t kMaxComboBytes = 64 << 10;  // cap of the per-block down results buffer

struct FusedLaunch {
  const float* hidden = nullptr;  // [T, H]
  float* out = nullptr;           // [T, H]
  const __nv_bfloat16* router = nullptr;
  const __nv_bfloat16* gate_up = nullptr;
  const __nv_bfloat16* down = nullptr;
  // MXFP4 experts instead (fused_moe_kernel<*, true>): blocks and e8m0 scales as stored, gate_up
  // rows interleaving gate and up (2r, 2r + 1).
  const uint8_t* gate_up_blocks = nullptr;  // [E, 2I, H/32, 16]
  const uint8_t* gate_up_scales = nullptr;  // [E, 2I, H/32]
  const uint8_t* down_blocks = nullptr;     // [E, H, I/32, 16]
  const uint8_t* down_scales = nullptr;     // [E, H, I/32]
  RouteParams route;  // num_experts, top_k, hidden, scoring
  ExpertParams experts;  // activation and biases
  int tokens = 0;
  int intermediate = 0;
  const uint8_t* forced = nullptr;  // [T] or nullptr
  const int32_t* source = nullptr;  // offset to this layer and chunk
  int32_t* sink = nullptr;          // offset to this layer and chunk, or nullptr
  float* weight_sink = nullptr;     // the gating weights, indexed like sink, or nullptr
  int64_t route_row_stride = 0;     // L * K
  float* logits = nullptr;          // [router groups, T, E] scratch: the logits' group sums
  float* act = nullptr;             // [T * K, I] scratch: silu(gate) * up per (token, k)
  int tile_rows = 0;                // hidden rows each block combines: ceil(H / grid)
  int pass_rows = 0;                // rows per pass so that combo (T*K x pass_rows) fits
  int pair_capacity = 0;            // shared layout: kChunkTokens(or less) * K
  int combo_floats = 0;
  // One-token steps with the input norm fused (fused_moe_kernel<VEC>, VEC > 0): the input is
  // rms_norm(residual + earlier_delta + delta) * norm_weight (hidden unused), and each block
  // writes its combine rows' residual + out back into residual.
  float* residual = nullptr;
  const float* earlier_delta = nullptr;  // or nullptr
  const float* delta = nullptr;
  const float* norm_weight = nullptr;
  float eps = 0.0f;
  unsigned long long* stamps = nullptr;  // SY_FUSED_STAMPS=1: [grid, kStamps] %globaltimer per phase
  bool general_grouping = false;  // SY_FUSED_GENERAL_GROUPING=1 (experiments): no few-pairs path
};
constexpr int kStamps = 11;

__device__ __forceinline__ void stamp(const FusedLaunch& a, int phase) {
  if (a.stamps && threadIdx.x == 0) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    a.stamps[blockIdx.x * kStamps + phase] = t;
  }
}

// Dynamic shared memory, in 4-byte words; the same function on host (sizing) and device.
struct SharedLayout {
  int scores, ids, weights, sorted, slot_expert, slot_begin, cursor, slot_count, combo, normed, ring, words;
  __host__ __device__ static SharedLayout make(int experts, int pair_capacity, int combo_floats,
                                               int normed_floats, int ring_words) {
    auto round4 = [](int n) { return (n + 3) & ~3; };
    const int slot_capacity = experts < pair_capacity ? experts : pair_capacity;
    SharedLayout l{};
    int at = 0;
    l.scores = at, at += round4(kWarps * experts);       // one score row per warp
    l.ids = at, at += round4(pair_capacity);             // [T, K] chosen ids
    l.weights = at, at += round4(pair_capacity);         // [T, K] gating weights
    l.sorted = at, at += round4(pair_capacity);          // pairs t*K+k grouped by expert
    l.slot_expert = at, at += round4(slot_capacity);     // distinct experts, ascending
    l.slot_begin = at, at += round4(slot_capacity + 1);  // their ranges in sorted
    l.cursor = at, at += round4(experts);                // per-expert count, then fill cursor
    l.slot_count = at, at += 4;
    l.combo = at, at += round4(combo_floats);  // down results [pair, row of pass]
    l.normed = at, at += round4(normed_floats);  // the fused input norm's row, or nothing
    l.ring = at, at += round4(ring_words);       // gate_up_ring's stages, or nothing
    l.words = at;
    return l;
  }
};

__device__ __forceinline__ bool valid_expert(int32_t id, int experts) {
  return static_cast<uint32_t>(id) < static_cast<uint32_t>(experts);
}

// Weights are read once per step: bypass L1, ask L2 for 256-byte lines and mark them first to
// evict, leaving L2 to what is read more than once. The predicate lives inside the asm,
// so a skipped (out-of-range) load can never become a speculative one; skipped lanes get zeros.
__device__ __forceinline__ uint64_t evict_first_policy() {
  uint64_t policy;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}
__device__ __forceinline__ uint4 load_weights(const __nv_bfloat16* p, bool in_range,
                                              uint64_t policy) {
  uint4 v;
  asm("{\n"
      "  .reg .pred in_range;\n"
      "  setp.ne.b32 in_range, %5, 0;\n"
      "  mov.b32 %0, 0;\n"
      "  mov.b32 %1, 0;\n"
      "  mov.b32 %2, 0;\n"
      "  mov.b32 %3, 0;\n"
      "  @in_range ld.global.nc.L1::no_allocate.L2::cache_hint.L2::256B.v4.u32 {%0, %1, %2, %3}, "
      "[%4], %6;\n"
      "}\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p), "r"(static_cast<int>(in_range)), "l"(policy));
  return v;
}

// One warp streams R bf16 rows (row i at rows + i * row_stride, n columns, n % 8 == 0; rows past
// valid_rows are not read) and dots each with the f32 vector of every pair in pairs[0:count]
// (vector of pair p at vectors + (p / vector_div) * vector_stride). A round loads S slabs of
// 256 columns of all R rows (R * S 16-byte loads in flight per lane) before using them.
// M pairs share one load of the rows. finish(pair, values[R]) runs on lane 0.
template <int R, int S, int M, typename Finish>
__device__ __forceinline__ void warp_rows_dot(const __nv_bfloat16* rows, int64_t row_stride,
                                              int valid_rows, int n, const float* vectors,
                                              int64_t vector_stride, int vector_div,
                                              const int32_t* pairs, int count, Finish finish) {
  const int lane = threadIdx.x & 31;
  const uint64_t policy = evict_first_policy();
  for (int group = 0; group < count; group += M) {
    const int in_group = min(M, count - group);
    const float* vec[M];
#pragma unroll
    for (int m = 0; m < M; ++m)
      vec[m] = vectors + static_cast<int64_t>(pairs[group + min(m, in_group - 1)] / vector_div) *
                             vector_stride;
    float acc[R][M];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int m = 0; m < M; ++m) acc[r][m] = 0.0f;

    for (int round = 0; round < n; round += S * 256) {
      uint4 w[R][S];
#pragma unroll
      for (int s = 0; s < S; ++s) {
        const int col = round + s * 256 + lane * 8;
#pragma unroll
        for (int r = 0; r < R; ++r)
          w[r][s] = load_weights(rows + r * row_stride + col, r < valid_rows && col < n, policy);
      }
#pragma unroll
      for (int m = 0; m < M; ++m) {
        if (m < in_group) {
#pragma unroll
          for (int s = 0; s < S; ++s) {
            const int col = round + s * 256 + lane * 8;
            if (col < n) {
              const float4 a = *reinterpret_cast<const float4*>(vec[m] + col);
              const float4 b = *reinterpret_cast<const float4*>(vec[m] + col + 4);
#pragma unroll
              for (int r = 0; r < R; ++r) acc[r][m] = dot8(w[r][s], a, b, acc[r][m]);
            }
          }
        }
      }
    }
#pragma unroll
    for (int m = 0; m < M; ++m) {
      if (m < in_group) {
        float values[R];
#pragma unroll
        for (int r = 0; r < R; ++r) values[r] = warp_sum(acc[r][m]);
        if (lane == 0) finish(pairs[group + m], values);
      }
    }
  }
}

// gate_up of a one-token step through a per-warp ring of kRingStages shared-memory stages, each
// half an item (gate and up row, kRingSlabs slabs of 256 columns), filled by cp.async: a warp
// keeps up to three stages in flight while it uses the oldest, instead of one register round
// per item that waits a whole DRAM latency. Each lane reads back only the 16-byte chunks it
// copied (no warp barrier). Same slab order per row as warp_rows_dot: the same bits.
constexpr int kRingStages = 3;
constexpr int kRingSlabs = kGateUpSlabs / 2;
constexpr int kRingStageChunks = 2 * kRingSlabs * 32;  // 16-byte chunks of one warp's stage
constexpr int kRingWordsPerWarp = kRingStages * kRingStageChunks * 4;
// The ring's shared words in fused_moe_kernel<norm_vec>: the one-token kernels whose rows are
// one round (norm_vec 1, 2: H <= 2048 = kGateUpSlabs * 256).
__host__ __device__ constexpr int ring_words(int norm_vec) {
  return norm_vec == 1 || norm_vec == 2 ? kWarps * kRingWordsPerWarp : 0;
}

__device__ __forceinline__ void ring_copy_16(void* dst, const void* src, bool fill) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(static_cast<unsigned>(__cvta_generic_to_shared(dst))),
               "l"(src), "r"(fill ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void ring_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void ring_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kRingStages - 1) : "memory");
}

// Items [begin, end) of (slot j, row r); H <= kGateUpSlabs * 256 (one round per item).
__device__ void gate_up_ring(const __nv_bfloat16* gate_up, const float* hidden, float* act, int64_t begin,
                             int64_t end, int I, int H, const int32_t* slot_expert, const int32_t* slot_begin,
                             const int32_t* sorted, uint4* ring, const ExpertParams& experts) {
  const int lane = threadIdx.x & 31;
  const int64_t stages = 2 * (end - begin);
  auto issue = [&](int64_t q) {
    if (q < stages) {
      const int64_t item = begin + q / 2;
      const int half = static_cast<int>(q & 1);
      const int j = static_cast<int>(item / I), r = static_cast<int>(item - static_cast<int64_t>(j) * I);
      const __nv_bfloat16* gate = gate_up + (static_cast<int64_t>(slot_expert[j]) * 2 * I + r) * H;
      uint4* stage = ring + (q % kRingStages) * kRingStageChunks;
#pragma unroll
      for (int row = 0; row < 2; ++row)
#pragma unroll
        for (int s = 0; s < kRingSlabs; ++s) {
          const int col = (half * kRingSlabs + s) * 256 + lane * 8;
          const __nv_bfloat16* src = gate + (row ? static_cast<int64_t>(I) * H : 0);
          ring_copy_16(stage + (row * kRingSlabs + s) * 32 + lane, col < H ? src + col : src, col < H);
        }
    }
    ring_commit();  // possibly empty: one group per stage keeps the wait count fixed
  };
#pragma unroll
  for (int q = 0; q < kRingStages; ++q) issue(q);
  float acc_gate = 0.0f, acc_up = 0.0f;
  for (int64_t q = 0; q < stages; ++q) {
    ring_wait();  // stage q's chunks of this lane have landed
    const int half = static_cast<int>(q & 1);
    const uint4* stage = ring + (q % kRingStages) * kRingStageChunks;
#pragma unroll
    for (int s = 0; s < kRingSlabs; ++s) {
      const int col = (half * kRingSlabs + s) * 256 + lane * 8;
      if (col < H) {
        const float4 x0 = *reinterpret_cast<const float4*>(hidden + col);
        const float4 x1 = *reinterpret_cast<const float4*>(hidden + col + 4);
        acc_gate = dot8(stage[s * 32 + lane], x0, x1, acc_gate);
        acc_up = dot8(stage[(kRingSlabs + s) * 32 + lane], x0, x1, acc_up);
      }
    }
    issue(q + kRingStages);  // into the stage just used: this lane's own chunks only
    if (half == 1) {
      const float g = warp_sum(acc_gate), u = warp_sum(acc_up);
      acc_gate = acc_up = 0.0f;
      if (lane == 0) {
        const int64_t item = begin + q / 2;
        const int j = static_cast<int>(item / I), r = static_cast<int>(item - static_cast<int64_t>(j) * I);
        const float value = experts.activate(slot_expert[j], r, I, g, u);
        for (int p = slot_begin[j]; p < slot_begin[j + 1]; ++p) act[static_cast<int64_t>(sorted[p]) * I + r] = value;
      }
    }
  }
}

// Run by warp 0: groups the T*K pairs (p = t*K + k) by expert. Slots are the distinct experts in
// ascending id and pairs keep ascending p inside a slot, so every block builds the same lists
// (the grid-wide work split depends on it). Pairs with an invalid (replayed) id join no slot.
__device__ void group_pairs_by_expert(const int32_t* ids, int pairs, int experts, int32_t* sorted,
                                      int32_t* slot_expert, int32_t* slot_begin, int32_t* cursor,
                                      int32_t* slot_count) {
  const int lane = threadIdx.x & 31;
  const unsigned lanes_below = (1u << lane) - 1u;
  for (int e = lane; e < experts; e += 32) cursor[e] = 0;
  __syncwarp();
  for (int p = lane; p < pairs; p += 32)
    if (valid_expert(ids[p], experts)) atomicAdd(&cursor[ids[p]], 1);
  __syncwarp();
  int slots = 0, placed = 0;
  for (int base = 0; base < experts; base += 32) {
    const int e = base + lane;
    const int count = e < experts ? cursor[e] : 0;
    int count_scan = count;  // inclusive scans over the 32 experts of this round
    for (int o = 1; o < 32; o <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, count_scan, o);
      if (lane >= o) count_scan += v;
    }
    const unsigned used = __ballot_sync(0xffffffffu, count > 0);
    const int slot = slots + __popc(used & lanes_below);
    const int begin = placed + count_scan - count;
    if (count > 0) {
      slot_expert[slot] = e;
      slot_begin[slot] = begin;
    }
    if (e < experts) cursor[e] = begin;
    slots += __popc(used);
    placed += __shfl_sync(0xffffffffu, count_scan, 31);
  }
  if (lane == 0) {
    slot_begin[slots] = placed;
    *slot_count = slots;
  }
  __syncwarp();
  for (int base = 0; base < pairs; base += 32) {
    const int p = base + lane;
    const int32_t id = p < pairs ? ids[p] : -1;
    const bool active = p < pairs && valid_expert(id, experts);
    const unsigned active_mask = __ballot_sync(0xffffffffu, active);
    if (active) {
      const unsigned same = __match_any_sync(active_mask, id);
      const int at = cursor[id] + __popc(same & lanes_below);
      sorted[at] = p;
      __syncwarp(active_mask);  // every lane has read cursor[id] before its leader moves it
      if (lane == 31 - __clz(same)) cursor[id] += __popc(same);
    }
    __syncwarp();
  }
}

// group_pairs_by_expert for pairs <= 32 (a batch-1 step's K pairs), the same lists without the
// per-expert counters: lane p ranks its pair against every other lane's (shuffles only).
__device__ void group_few_pairs_by_expert(const int32_t* ids, int pairs, int experts, int32_t* sorted,
                                          int32_t* slot_expert, int32_t* slot_begin, int32_t* slot_count) {
  const int lane = threadIdx.x & 31;
  const int32_t id = lane < pairs ? ids[lane] : -1;
  const bool valid = lane < pairs && valid_expert(id, experts);
  const unsigned valid_mask = __ballot_sync(0xffffffffu, valid);
  const unsigned same = __match_any_sync(0xffffffffu, valid ? id : -1) & valid_mask;
  const bool first = valid && lane == __ffs(same) - 1;  // the slot's first pair
  const unsigned first_mask = __ballot_sync(0xffffffffu, first);
  int below = 0, distinct_below = 0;  // valid pairs / slots of smaller experts
  for (int j = 0; j < pairs; ++j) {
    const int32_t other = __shfl_sync(0xffffffffu, id, j);
    if (((valid_mask >> j) & 1u) && other < id) {
      ++below;
      distinct_below += (first_mask >> j) & 1u;
    }
  }
  if (valid) {
    sorted[below + __popc(same & ((1u << lane) - 1u))] = lane;
    if (first) {
      slot_expert[distinct_below] = id;
      slot_begin[distinct_below] = below;
    }
  }
  if (lane == 0) {
    const int slots = __popc(first_mask);
    slot_begin[slots] = __popc(valid_mask);
    *slot_count = slots;
  }
  __syncwarp();
}

// The down work of one pass: item it -> slot j and kDownRows rows starting at h.
struct DownItem {
  int slot, h, rows;
};
__device__ __forceinline__ DownItem down_item(int it, int pass_begin, int rows_here) {
  const int groups = (rows_here + kDownRows - 1) / kDownRows;
  DownItem item;
  item.slot = it / groups;
  item.h = pass_begin + (it - item.slot * groups) * kDownRows;
  item.rows = min(kDownRows, pass_begin + rows_here - item.h);
  return item;
}

// Floor: the chosen experts' weights, distinct(ids) * 3 * I * H * 2 bytes, plus the router
// E * H * 2 once (Qwen3-30B-A3B, T = 1: 76 MB, ~18 us at 4.3 TB/s on an H200).
// Phases, two grid barriers: (a) router logits, one warp per (token tile, expert tile, k group)
// over the whole grid; (b) every block selects all T tokens' top-k itself (route_select_warp) and
// groups the pairs by expert, block 0 writes the sink; (c) gate_up: (slot, row) items split evenly
// over all warps, silu(gate) * up into act; (d) down: block b owns hidden rows [b * tile, ...), its
// warps dot every chosen expert's rows with act into shared memory, then each (token, row)
// sums its k = 0..K-1 terms in order.
// NORM_VEC > 0: the one-token kernel with the input norm fused (NormRow<NORM_VEC>); for
// H <= kGateUpSlabs * 256 (NORM_VEC <= 2) its gate_up runs through gate_up_ring.
// MXFP4: the experts are read packed (SY_FUSED_MXFP4=1 until a GPU visit checks it): phase (c)
// and (d) dot each pair's vector with the chosen rows through mxfp4_rows_dot (a pair at a time;
// a slot's further pairs re-read its rows from L1/L2).
template <int NORM_VEC, bool MXFP4>
__global__ void __launch_bounds__(kThreads, 2)
    fused_moe_kernel(const __grid_constant__ FusedLaunch a) {
  extern __shared__ float4 shared_words[];
  int32_t* const words = reinterpret_cast<int32_t*>(shared_words);
  const SharedLayout layout = SharedLayout::make(a.route.num_experts, a.pair_capacity, a.combo_floats,
                                                 NORM_VEC > 0 ? a.route.hidden : 0, ring_words(NORM_VEC));
  float* const scores = reinterpret_cast<float*>(words + layout.scores);
  int32_t* const ids = words + layout.ids;
  float* const weights = reinterpret_cast<float*>(words + layout.weights);
  int32_t* const sorted = words + layout.sorted;
  int32_t* const slot_expert = words + layout.slot_expert;
  int32_t* const slot_begin = words + layout.slot_begin;
  int32_t* const cursor = words + layout.cursor;
  int32_t* const slot_count = words + layout.slot_count;
  float* const combo = reinterpret_cast<float*>(words + layout.combo);

  cg::grid_group grid = cg::this_grid();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int E = a.route.num_experts, K = a.route.top_k, H = a.route.hidden;
  // The one-token kernel knows T at compile time: its dead multi-token paths are not compiled,
  // which keeps the code it runs small (its misses in the instruction cache were the largest
  // stall reason of this kernel, per ncu, at ~120 KB of SASS).
  constexpr bool kOneToken = NORM_VEC > 0;
  const int I = a.intermediate, T = kOneToken ? 1 : a.tokens, pairs = T * K;
  const int total_warps = static_cast<int>(gridDim.x) * kWarps;

  stamp(a, 0);
  // The input row: every block normalises residual + deltas itself (no launch, no barrier).
  const float* hidden = a.hidden;
  if constexpr (NORM_VEC > 0) {
    float* const normed = reinterpret_cast<float*>(words + layout.normed);
    NormRow<NORM_VEC> n;
    n.load_weight(a.norm_weight, H / 4);
    n.load_row(a.residual, a.earlier_delta, a.delta, H / 4);
    n.store_normed(normed, H / 4, n.scale(H, a.eps, scores));  // scores: scratch until (b)
    __syncthreads();
    hidden = normed;
  }
  // (a) Router logits (moe_route.cuh's sum): a warp per (16-token tile, 8-expert tile, k group)
  // task, its sums into a.logits [groups, T, E], summed over the groups when read.
  const int logit_groups = router_groups(H);
  const int per_m = (E + 7) / 8 * logit_groups, m_tiles = (T + 15) / 16;
  for (int q = warp * gridDim.x + blockIdx.x; q < m_tiles * per_m; q += total_warps) {
    const int mt = q / per_m, rest = q - mt * per_m, et = rest / logit_groups,
              group = rest - et * logit_groups;
    float acc[4];
    router_group_tile(hidden + static_cast<int64_t>(mt) * 16 * H, H, T - mt * 16, a.router, H, E,
                      et * 8, group, acc);
    router_store_tile(acc, a.logits + static_cast<int64_t>(group) * T * E, E, mt * 16, T - mt * 16,
                      et * 8, E);
  }
  stamp(a, 1);
  grid.sync();
  stamp(a, 2);

  // (b) Route: the same selection in every block (cheap next to the weights), so no third
  // barrier is needed to share it.
  // One token (batch-1 decode): route_select_block (the same choice as route_select_warp).
  float* const my_scores = scores + warp * E;
  // A token ranked by warp 0 alone (route_ranks_candidates): its K experts are distinct and
  // valid, a slot each in rank order (the order of slots changes no sum), so warp 0 writes the
  // grouping with the weights, and the block skips a barrier and group_few_pairs_by_expert.
  bool slots_written = false;
  if (T == 1) {
    router_logits_fill(a.logits, logit_groups, 1, E, 0, scores, threadIdx.x, kThreads);
    __syncthreads();
    const int32_t* forced = a.forced && a.forced[0] ? a.source : nullptr;
    slots_written = route_ranks_candidates(a.route, forced) && !a.general_grouping;
    stamp(a, 7);
    // (scores + E: warps 1..3's score rows, free when T = 1, hold the selection keys and the
    // candidates.)
    route_select_block(
        scores, scores + E, a.route, forced, cursor, ids,
        weights,  // cursor: scratch until grouping
        [&](int phase) { stamp(a, 9 + phase); },
        [&](int l) {
          if (!slots_written) return;
          if (l < K) {
            sorted[l] = l;
            slot_expert[l] = ids[l];
            slot_begin[l] = l;
          }
          if (l == 0) {
            slot_begin[K] = K;
            *slot_count = K;
          }
        });
    stamp(a, 8);
  } else {
    for (int t = warp; t < T; t += kWarps) {
      router_logits_fill(a.logits, logit_groups, T, E, t, my_scores, lane, 32);
      __syncwarp();
      const int32_t* forced =
          a.forced && a.forced[t] ? a.source + static_cast<int64_t>(t) * a.route_row_stride : nullptr;
      route_select_warp(my_scores, a.route, forced, ids + t * K, weights + t * K);
    }
  }
  if (!slots_written) __syncthreads();
  if (blockIdx.x == 0 && a.sink)
    for (int i = threadIdx.x; i < pairs; i += kThreads)
    {
      a.sink[static_cast<int64_t>(i / K) * a.route_row_stride + i % K] = ids[i];
      if (a.weight_sink) a.weight_sink[static_cast<int64_t>(i / K) * a.route_row_stride + i % K] = weights[i];
    }
  if (!slots_written) {
    if (warp == 0) {
      if (pairs <= 32 && !a.general_grouping)
        group_few_pairs_by_expert(ids, pairs, E, sorted, slot_expert, slot_begin, slot_count);
      else
        group_pairs_by_expert(ids, pairs, E, sorted, slot_expert, slot_begin, cursor, slot_count);
    }
    __syncthreads();
  }
  stamp(a, 3);
  const int slots = *slot_count;

  // (c) gate_up with SiLU(gate) * up, items (slot, row r) in contiguous even shares per warp.
  {
    const int64_t items = static_cast<int64_t>(slots) * I;
    const int me = static_cast<int>(blockIdx.x) * kWarps + warp;
    const int64_t end = items * (me + 1) / total_warps;
    if constexpr (MXFP4) {
      for (int64_t item = items * me / total_warps; item < end; ++item) {
        const int j = static_cast<int>(item / I), r = static_cast<int>(item - static_cast<int64_t>(j) * I);
        const int64_t e = slot_expert[j];
        const int64_t row = e * 2 * I + 2 * r;  // gate 2r, up 2r + 1
        for (int q = slot_begin[j]; q < slot_begin[j + 1]; ++q) {
          const int pair = sorted[q];
          float v[2];
          mxfp4_rows_dot<2, 2>(a.gate_up_blocks + row * (H / 2), a.gate_up_scales + row * (H / 32), 2, H,
                            hidden + static_cast<int64_t>(pair / K) * H, v);
          if (lane == 0) a.act[static_cast<int64_t>(pair) * I + r] = a.experts.activate(e, r, I, v[0], v[1]);
        }
      }
    } else if constexpr (ring_words(NORM_VEC) > 0) {
      gate_up_ring(
          a.gate_up, hidden, a.act, items * me / total_warps, end, I, H, slot_expert, slot_begin,
          sorted,
          reinterpret_cast<uint4*>(words + layout.ring) + warp * kRingStages * kRingStageChunks,
          a.experts);
    } else {
    for (int64_t item = items * me / total_warps; item < end; ++item) {
      const int j = static_cast<int>(item / I),
                r = static_cast<int>(item - static_cast<int64_t>(j) * I);
      const int64_t e = slot_expert[j];
      const int first = slot_begin[j];
      warp_rows_dot<2, kGateUpSlabs, kGateUpPairs>(
          a.gate_up + (e * 2 * I + r) * H, static_cast<int64_t>(I) * H, 2, H, hidden, H, K,
          sorted + first, slot_begin[j + 1] - first, [&](int pair, const float(&v)[2]) {
            a.act[static_cast<int64_t>(pair) * I + r] = a.experts.activate(e, r, I, v[0], v[1]);
          });
    }
    }
  }
  stamp(a, 4);
  grid.sync();
  stamp(a, 5);

  // (d) down and combine.
  for (int tile = static_cast<int>(blockIdx.x) * a.tile_rows; tile < H;
       tile += static_cast<int>(gridDim.x) * a.tile_rows) {
    const int tile_end = min(H, tile + a.tile_rows);
    for (int pass = tile; pass < tile_end; pass += a.pass_rows) {
      const int rows_here = min(a.pass_rows, tile_end - pass);
      const int down_items = slots * ((rows_here + kDownRows - 1) / kDownRows);
      for (int it = warp; it < down_items; it += kWarps) {
        const DownItem d = down_item(it, pass, rows_here);
        const int first = slot_begin[d.slot];
        const int row_in_pass = d.h - pass, rows = d.rows;
        const int64_t e = slot_expert[d.slot];
        // A pair's kDownRows results (+ bias) into the pass's combine buffer.
        auto store = [&](int pair, const float(&v)[kDownRows]) {
#pragma unroll
          for (int r = 0; r < kDownRows; ++r)
            if (r < rows)
              combo[pair * rows_here + row_in_pass + r] =
                  v[r] + a.experts.down_bias_of(e, d.h + r, H);
        };
        if constexpr (MXFP4) {
          const int64_t row = e * H + d.h;
          for (int q = first; q < slot_begin[d.slot + 1]; ++q) {
            const int pair = sorted[q];
            float v[kDownRows];
            mxfp4_rows_dot<kDownRows, 2>(a.down_blocks + row * (I / 2), a.down_scales + row * (I / 32), rows, I,
                                      a.act + static_cast<int64_t>(pair) * I, v);
            if (lane == 0) store(pair, v);
          }
          continue;
        }
        warp_rows_dot<kDownRows, kDownSlabs, kOneToken ? 1 : kDownPairs>(
            a.down + (e * H + d.h) * I, I, rows, I, a.act, I, 1, sorted + first,
            slot_begin[d.slot + 1] - first, store);
      }
      __syncthreads();
      for (int i = threadIdx.x; i < T * rows_here; i += kThreads) {
        const int t = i / rows_here, row = i - t * rows_here;
        float sum = 0.0f;
        for (int k = 0; k < K; ++k) {
          const int pair = t * K + k;
          if (valid_expert(ids[pair], E))
            sum = fmaf(weights[pair], combo[pair * rows_here + row], sum);
        }
        const int64_t at = static_cast<int64_t>(t) * H + pass + row;
        if constexpr (NORM_VEC > 0) {
          // The residual adds in the unfused order: ((x + earlier_delta) + delta) + out. Every
          // block read these inputs before barrier 1; this block alone writes these rows, and
          // reads them before writing out (earlier_delta may be out's own buffer: the decoder
          // passes the previous feed-forward output, which this call overwrites).
          float x = a.residual[at];
          if (a.earlier_delta) x += a.earlier_delta[at];
          const float updated = (x + a.delta[at]) + sum;
          a.out[at] = sum;
          a.residual[at] = updated;
        } else {
          a.out[at] = sum;
        }
      }
      __syncthreads();
    }
  }
  stamp(a, 6);
}

class FusedKernel final : public moe::ExpertsKernel {
 public:
  explicit FusedKernel(CudaContext& context) : context_(context) {}
  ~FusedKernel() override {
    report_stamps();
    release();
  }
  FusedKernel(const FusedKernel&) = delete;
  FusedKernel& operator=(const FusedKernel&) = delete;

  std::string_view name() const override { return "cuda-fused"; }
  Device device() const override { return Device::kCuda; }
  bool routes_inside() const override { return true; }
  bool captures_routes() const override { return true; }
  bool captures_weights() const override { return true; }
  bool batch_invariant() const override { return false; }  // its work split follows the step's size
  // Stacked bf16 experts with SwiGLU or gpt-oss's clamped SwiGLU, biases or not (ExpertParams);
  // gpt-oss's bf16 interleaved layout is restacked at load (ExpertSpec::stored). MXFP4 experts
  // (kept packed on CUDA) only with SY_FUSED_MXFP4=1 (fused_moe_kernel<*, true>, not yet checked
  // on a GPU); otherwise auto runs every such step on cuda-modular.
  Status supports_experts(const moe::ExpertSpec& spec) const override {
    if (ExpertParams::implements(spec) || (mxfp4_enabled_ && ExpertParams::implements_mxfp4(spec)))
      return Status::ok();
    return Status::error(ErrorCode::kUnsupported,
                         "MoE kernel cuda-fused reads stacked bf16 experts only (MXFP4 experts: use cuda-modular)");
  }
  // Every router option (moe_route.cuh), groups up to kMaxRouteGroups.
  Status supports(const moe::RouterSpec& spec) const override {
    if (!RouteParams::implements(spec))
      return Status::error(ErrorCode::kUnsupported,
                           fmt::format("MoE kernel cuda-fused: n_group must divide num_experts and be at most {}, got {}",
                                       kMaxRouteGroups, spec.num_groups));
    return Status::ok();
  }
  bool replays_routes() const override { return true; }
  bool fuses_input_norm(int64_t tokens) const override { return tokens == 1 && norm_vec_ > 0 && !no_norm_fusion_; }

  Status reserve(int64_t max_tokens, const moe::RouterSpec& spec, int64_t hidden,
                 int64_t intermediate) override {
    if (max_tokens <= 0)
      return Status::errorf("cuda-fused: max_tokens must be positive, got {}", max_tokens);
    if (spec.num_experts < 1 || spec.num_experts > kMaxRouteExperts)
      return Status::errorf("cuda-fused: num_experts must be in [1, {}], got {}", kMaxRouteExperts,
                            spec.num_experts);
    if (spec.top_k < 1 || spec.top_k > std::min<int64_t>(kMaxRouteTopK, spec.num_experts))
      return Status::errorf("cuda-fused: top_k must be in [1, min({}, num_experts = {})], got {}",
                            kMaxRouteTopK, spec.num_experts, spec.top_k);
    if (hidden <= 0 || hidden % 8 != 0 || hidden > (1 << 24))
      return Status::error(ErrorCode::kUnsupported, fmt::format("cuda-fused: hidden size must be a multiple of 8 in [8, 2^24], got {}",
                                                                 hidden));
    if (intermediate <= 0 || intermediate % 8 != 0 || intermediate > (1 << 24))
      return Status::error(ErrorCode::kUnsupported, fmt::format(
          "cuda-fused: moe_intermediate_size must be a multiple of 8 in [8, 2^24], got {}",
          intermediate));
    int cooperative = 0;
    SY_CUDA_CHECK(
        cudaDeviceGetAttribute(&cooperative, cudaDevAttrCooperativeLaunch, context_.device));
    if (!cooperative)
      return Status::error(ErrorCode::kUnsupported,
                           "cuda-fused needs cooperative launches, which this GPU lacks");
    int sm_count = context_.sm_count;
    if (sm_count <= 0)
      SY_CUDA_CHECK(
          cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, context_.device));

    release();
    max_tokens_ = max_tokens;
    experts_ = spec.num_experts, top_k_ = spec.top_k, hidden_ = hidden,
    intermediate_ = intermediate;
    chunk_tokens_ = static_cast<int>(std::min<int64_t>(max_tokens, kChunkTokens));
    pair_capacity_ = chunk_tokens_ * static_cast<int>(top_k_);
    // Combine buffer for the largest tile (one block per SM); passes split a tile beyond the cap.
    const int64_t largest_tile = (hidden + sm_count - 1) / sm_count;
    combo_floats_ = static_cast<int>(std::max<int64_t>(
        pair_capacity_, std::min<int64_t>(pair_capacity_ * largest_tile, kMaxComboBytes / 4)));
    shared_bytes_ =
        static_cast<size_t>(
            SharedLayout::make(static_cast<int>(experts_), pair_capacity_, combo_floats_, 0, 0).words) *
        4;
    const size_t optin = context_.shared_memory_per_block_optin;
    if (shared_bytes_ > optin && optin > 0)
      return Status::errorf("cuda-fused: needs {} bytes of shared memory per block, the GPU has {}",
                            shared_bytes_, optin);
    int blocks_per_sm = 0;
    // Co-resident blocks of the kernel for `vec`: the least over the expert formats it may run
    // (one grid size serves every launch, and a cooperative launch needs all of it resident).
    auto fit = [&](int vec, size_t bytes) {
      int least = 1 << 30;
      for (const bool mxfp4 : {false, true}) {
        if (mxfp4 && !mxfp4_enabled_) continue;
        const void* kernel = kernel_for(vec, mxfp4);
        SY_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(bytes)));
        int blocks = 0;
        SY_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kThreads, bytes));
        least = std::min(least, blocks);
      }
      return least;
    };
    blocks_per_sm = fit(0, shared_bytes_);
    // The one-token kernel (input norm fused, where NormRow covers the width): a layout for one
    // token's K pairs, plus gate_up's ring where a row is one round. Taken only where it is
    // co-resident as often as the plain kernel (one grid size serves both); else the ring goes,
    // then the fusion.
    norm_vec_ = hidden % 4 == 0 && hidden <= 4096 ? norm_row_vec(hidden) : 0;
    one_combo_floats_ = static_cast<int>(std::max<int64_t>(top_k_, top_k_ * largest_tile));
    if (norm_vec_) {
      norm_shared_bytes_ = static_cast<size_t>(SharedLayout::make(static_cast<int>(experts_), static_cast<int>(top_k_),
                                                                  one_combo_floats_, static_cast<int>(hidden),
                                                                  ring_words(norm_vec_))
                                                   .words) *
                           4;
      if ((norm_shared_bytes_ > optin && optin > 0) || fit(norm_vec_, norm_shared_bytes_) < blocks_per_sm)
        norm_vec_ = 0;
    }
    if (blocks_per_sm < 1)
      return Status::errorf(
          "cuda-fused: no block of {} threads with {} bytes of shared memory fits an SM", kThreads,
          shared_bytes_);
    // SY_FUSED_BLOCKS_PER_SM (experiments): fewer co-resident blocks than fit.
    if (const char* cap = std::getenv("SY_FUSED_BLOCKS_PER_SM"); cap && std::atoi(cap) > 0)
      blocks_per_sm = std::min(blocks_per_sm, std::atoi(cap));
    grid_ = sm_count * blocks_per_sm;

    if (cudaMalloc(&logits_, sizeof(float) * router_groups(static_cast<int>(hidden)) *
                                 chunk_tokens_ * experts_) != cudaSuccess ||
        cudaMalloc(&act_, sizeof(float) * pair_capacity_ * intermediate_) != cudaSuccess) {
      cudaGetLastError();  // an allocation failure is not sticky: clear it for the next check
      release();
      return Status::error(
          ErrorCode::kResourceExhausted,
          fmt::format("cuda-fused: out of device memory for the scratch of {} tokens",
                      chunk_tokens_));
    }
    const char* want_stamps = std::getenv("SY_FUSED_STAMPS");
    if (want_stamps && want_stamps[0] == '1' &&
        cudaMalloc(&stamps_, sizeof(unsigned long long) * grid_ * kStamps) != cudaSuccess) {
      cudaGetLastError();
      stamps_ = nullptr;
    }
    return Status::ok();
  }

  Status forward(const moe::MoeForwardArgs& args) override {
    SY_TRY(check(args));
    const moe::MoeLayerWeights& w = *args.weights;
    const int64_t tokens = args.hidden.dim(0);
    const RouteBuffers& routes = args.routes;
    const Tensor& layered = routes.sink.data ? routes.sink : routes.source;
    const int64_t row_stride = layered.data ? layered.dim(1) * top_k_ : 0;
    const bool replay = routes.source.data && routes.forced.data;

    FusedLaunch launch;
    launch.router = w.router.ptr<__nv_bfloat16>();
    const bool mxfp4 = ExpertParams::implements_mxfp4(args.experts);
    if (mxfp4) {
      launch.gate_up_blocks = w.gate_up.ptr<uint8_t>();
      launch.gate_up_scales = w.gate_up_scales.ptr<uint8_t>();
      launch.down_blocks = w.down.ptr<uint8_t>();
      launch.down_scales = w.down_scales.ptr<uint8_t>();
    } else {
      launch.gate_up = w.gate_up.ptr<__nv_bfloat16>();
      launch.down = w.down.ptr<__nv_bfloat16>();
    }
    launch.route = RouteParams::from(args.spec, hidden_, w);
    launch.experts = ExpertParams::from(args.experts, w);
    launch.intermediate = static_cast<int>(intermediate_);
    launch.route_row_stride = row_stride;
    launch.logits = logits_;
    launch.act = act_;
    launch.tile_rows = static_cast<int>((hidden_ + grid_ - 1) / grid_);
    launch.pair_capacity = pair_capacity_;
    launch.combo_floats = combo_floats_;
    launch.stamps = stamps_;
    launch.general_grouping = general_grouping_;
    const moe::MoeInputNorm& norm = args.input_norm;
    const int vec = norm.residual ? norm_vec_ : 0;
    if (norm.residual) {
      launch.pair_capacity = static_cast<int>(top_k_);  // the one-token layout
      launch.combo_floats = one_combo_floats_;
      launch.residual = norm.residual->ptr<float>();
      launch.earlier_delta = norm.earlier_delta ? norm.earlier_delta->ptr<float>() : nullptr;
      launch.delta = norm.delta->ptr<float>();
      launch.norm_weight = norm.weight->ptr<float>();
      launch.eps = norm.eps;
    }
    for (int64_t begin = 0; begin < tokens; begin += chunk_tokens_) {
      const int count = static_cast<int>(std::min<int64_t>(chunk_tokens_, tokens - begin));
      launch.tokens = count;
      launch.hidden = args.hidden.ptr<float>() + begin * hidden_;
      launch.out = args.out.ptr<float>() + begin * hidden_;
      launch.forced = replay ? routes.forced.ptr<uint8_t>() + begin : nullptr;
      launch.source = replay
                          ? routes.source.ptr<int32_t>() + begin * row_stride + args.layer * top_k_
                          : nullptr;
      launch.sink = routes.sink.data
                        ? routes.sink.ptr<int32_t>() + begin * row_stride + args.layer * top_k_
                        : nullptr;
      launch.weight_sink = routes.sink.data && routes.weights.data
                               ? routes.weights.ptr<float>() + begin * row_stride + args.layer * top_k_
                               : nullptr;
      launch.pass_rows = std::max(
          1, std::min(launch.tile_rows, launch.combo_floats / (count * static_cast<int>(top_k_))));
      void* kernel_args[] = {&launch};
      SY_CUDA_CHECK(cudaLaunchCooperativeKernel(kernel_for(vec, mxfp4), dim3(static_cast<unsigned>(grid_)),
                                                dim3(kThreads), kernel_args,
                                                vec ? norm_shared_bytes_ : shared_bytes_, context_.stream));
      SY_CUDA_LAUNCH_CHECK("fused_moe_kernel");
      if (count == 1) collect_stamps();  // the batch-1 decode launches only
    }
    return Status::ok();
  }

 private:
  using RouteBuffers = moe::RouteBuffers;

  static const void* kernel_for(int norm_vec, bool mxfp4) {
    if (mxfp4) {
      switch (norm_vec) {
        case 1: return reinterpret_cast<const void*>(fused_moe_kernel<1, true>);
        case 2: return reinterpret_cast<const void*>(fused_moe_kernel<2, true>);
        case 4: return reinterpret_cast<const void*>(fused_moe_kernel<4, true>);
        default: return reinterpret_cast<const void*>(fused_moe_kernel<0, true>);
      }
    }
    switch (norm_vec) {
      case 1: return reinterpret_cast<const void*>(fused_moe_kernel<1, false>);
      case 2: return reinterpret_cast<const void*>(fused_moe_kernel<2, false>);
      case 4: return reinterpret_cast<const void*>(fused_moe_kernel<4, false>);
      default: return reinterpret_cast<const void*>(fused_moe_kernel<0, false>);
    }
  }

  Status check(const moe::MoeForwardArgs& args) const {
    if (!logits_) return Status::error(ErrorCode::kInternal, "cuda-fused: forward before reserve");
    SY_TRY(supports_experts(args.experts));  // (MXFP4 without SY_FUSED_MXFP4=1: kUnsupported, as at start-up)
    const moe::MoeLayerWeights* w = args.weights;
    if (!w) return Status::error(ErrorCode::kInternal, "cuda-fused: no layer weights");
    const int64_t tokens = args.hidden.dim(0);
    if (args.hidden.dtype != DType::kF32 || args.hidden.rank != 2 || args.hidden.dim(1) != hidden_)
      return Status::errorf("cuda-fused: hidden must be f32 [T, {}], got {}", hidden_,
                            args.hidden.shape_string());
    if (args.out.dtype != DType::kF32 || args.out.rank != 2 || args.out.dim(0) != tokens ||
        args.out.dim(1) != hidden_)
      return Status::errorf("cuda-fused: out must be f32 [{}, {}], got {}", tokens, hidden_,
                            args.out.shape_string());
    if (tokens > max_tokens_)
      return Status::errorf("cuda-fused: step of {} tokens, reserved for at most {}", tokens,
                            max_tokens_);
    if (args.spec.num_experts != experts_ || args.spec.top_k != top_k_)
      return Status::errorf("cuda-fused: reserved for {} experts, top_k {}; got {}, top_k {}",
                            experts_, top_k_, args.spec.num_experts, args.spec.top_k);
    const Tensor& r = w->router;
    const Tensor& gu = w->gate_up;
    const Tensor& d = w->down;
    if (r.dtype != DType::kBF16 || r.rank != 2 || r.dim(0) != experts_ || r.dim(1) != hidden_)
      return Status::errorf("cuda-fused: router must be bf16 [{}, {}], got {}", experts_, hidden_,
                            r.shape_string());
    if (ExpertParams::implements_mxfp4(args.experts)) {
      if (!mxfp4_experts_readable(gu, w->gate_up_scales, experts_, 2 * intermediate_, hidden_) ||
          !mxfp4_experts_readable(d, w->down_scales, experts_, hidden_, intermediate_))
        return Status::errorf(
            "cuda-fused: MXFP4 experts need hidden and moe_intermediate multiples of 32 and U8 blocks (16-byte "
            "aligned)/scales for gate_up [{}, {}, {}/32] and down [{}, {}, {}/32]; got gate_up {} / {}, down {} / {}",
            experts_, 2 * intermediate_, hidden_, experts_, hidden_, intermediate_, gu.shape_string(),
            w->gate_up_scales.shape_string(), d.shape_string(), w->down_scales.shape_string());
    } else {
      if (gu.dtype != DType::kBF16 || gu.rank != 3 || gu.dim(0) != experts_ ||
          gu.dim(1) != 2 * intermediate_ || gu.dim(2) != hidden_)
        return Status::errorf("cuda-fused: gate_up must be bf16 [{}, {}, {}], got {}", experts_,
                              2 * intermediate_, hidden_, gu.shape_string());
      if (d.dtype != DType::kBF16 || d.rank != 3 || d.dim(0) != experts_ || d.dim(1) != hidden_ ||
          d.dim(2) != intermediate_)
        return Status::errorf("cuda-fused: down must be bf16 [{}, {}, {}], got {}", experts_, hidden_,
                              intermediate_, d.shape_string());
    }
    for (const void* p : {args.hidden.data, args.out.data, r.data, gu.data, d.data})
      if (tokens > 0 && !aligned16(p))
        return Status::error(ErrorCode::kInternal, "cuda-fused: tensors must be 16-byte aligned");
    const RouteBuffers& routes = args.routes;
    for (const Tensor* buffer : {&routes.sink, &routes.source}) {
      if (!buffer->data) continue;
      if (buffer->dtype != DType::kI32 || buffer->rank != 3 || buffer->dim(0) < tokens ||
          buffer->dim(2) != top_k_ || args.layer < 0 || args.layer >= buffer->dim(1))
        return Status::errorf(
            "cuda-fused: route buffer must be int32 [>= {}, > layer {}, {}], got {}", tokens,
            args.layer, top_k_, buffer->shape_string());
    }
    if (routes.weights.data &&
        (routes.weights.dtype != DType::kF32 || !routes.sink.data || routes.weights.rank != 3 ||
         routes.weights.dim(0) != routes.sink.dim(0) || routes.weights.dim(1) != routes.sink.dim(1) ||
         routes.weights.dim(2) != top_k_))
      return Status::errorf("cuda-fused: the weight sink must be f32 shaped like the route sink, got {}",
                            routes.weights.shape_string());
    const moe::MoeInputNorm& norm = args.input_norm;
    if (norm.residual) {
      if (!fuses_input_norm(tokens) || !norm.delta || !norm.weight)
        return Status::error(ErrorCode::kInternal, "cuda-fused: input norm given for a step it does not fuse");
      for (const Tensor* t : std::initializer_list<const Tensor*>{norm.residual, norm.earlier_delta, norm.delta})
        if (t && (t->dtype != DType::kF32 || t->numel() != hidden_ || !aligned16(t->data)))
          return Status::errorf("cuda-fused: fused input norm rows must be aligned f32 [1, {}], got {}", hidden_,
                                t->shape_string());
      if (norm.weight->dtype != DType::kF32 || norm.weight->numel() != hidden_ || !aligned16(norm.weight->data))
        return Status::errorf("cuda-fused: input norm weight must be aligned f32 [{}]", hidden_);
    }
    if (routes.sink.data && routes.source.data && routes.sink.dim(1) != routes.source.dim(1))
      return Status::error(ErrorCode::kInternal,
                           "cuda-fused: route sink and source disagree on layers");
    if (routes.source.data && routes.forced.data &&
        (routes.forced.dtype != DType::kU8 || routes.forced.numel() < tokens))
      return Status::errorf("cuda-fused: forced must be uint8 [>= {}], got {}", tokens,
                            routes.forced.shape_string());
    return Status::ok();
  }

  // SY_FUSED_STAMPS=1 (no graphs): per-phase times of every launch, printed at exit. Stamp p of
  // each block minus the earliest block's start; the median and the latest block per phase.
  void collect_stamps() {
    if (!stamps_) return;
    if (stream_capturing(context_.stream)) return;
    std::vector<unsigned long long> host(static_cast<size_t>(grid_) * kStamps);
    SY_CUDA_CHECK(cudaMemcpyAsync(host.data(), stamps_, host.size() * 8, cudaMemcpyDeviceToHost, context_.stream));
    SY_CUDA_CHECK(cudaStreamSynchronize(context_.stream));
    unsigned long long start = ~0ull;
    for (int b = 0; b < grid_; ++b) start = std::min(start, host[static_cast<size_t>(b) * kStamps]);
    for (int p = 0; p < kStamps; ++p) {
      std::vector<double> t(static_cast<size_t>(grid_));
      for (int b = 0; b < grid_; ++b) t[static_cast<size_t>(b)] = static_cast<double>(host[static_cast<size_t>(b) * kStamps + p] - start) * 1e-3;
      std::sort(t.begin(), t.end());
      stamp_median_[p] += t[t.size() / 2];
      stamp_max_[p] += t.back();
    }
    ++stamp_launches_;
  }
  void report_stamps() const {
    if (!stamps_ || stamp_launches_ == 0) return;
    std::fprintf(stderr, "cuda-fused phase stamps over %d one-token launches (us since the first block started; median block / last block):\n",
                 stamp_launches_);
    const char* names[kStamps] = {"start", "router logits", "barrier 1", "route+group", "gate_up", "barrier 2",
                                  "down+combine", "(logits read)", "(selected)", "(scored)", "(ranked)"};
    for (int p = 0; p < kStamps; ++p)
      std::fprintf(stderr, "  %-14s %8.2f %8.2f\n", names[p], stamp_median_[p] / stamp_launches_, stamp_max_[p] / stamp_launches_);
  }

  void release() {
    if (stamps_) cudaFree(stamps_);
    stamps_ = nullptr;
    if (logits_) cudaFree(logits_);
    if (act_) cudaFree(act_);
    logits_ = nullptr, act_ = nullptr;
  }

  CudaContext& context_;
  int64_t max_tokens_ = 0, experts_ = 0, top_k_ = 0, hidden_ = 0, intermediate_ = 0;
  int chunk_tokens_ = 0, pair_capacity_ = 0, combo_floats_ = 0, grid_ = 0;
  size_t shared_bytes_ = 0, norm_shared_bytes_ = 0;
  int norm_vec_ = 0;  // NormRow width class of the fused input norm; 0: none
  int one_combo_floats_ = 0;  // the one-token kernel's combine buffer
  const bool general_grouping_ = env_flag("SY_FUSED_GENERAL_GROUPING");
  // SY_FUSED_MXFP4=1: MXFP4 experts read packed (fused_moe_kernel<*, true>), opt-in until a GPU
  // visit has checked it (gpu-check.sh mxfp4-gemv).
  const bool mxfp4_enabled_ = env_flag("SY_FUSED_MXFP4");
  // SY_NO_NORM_FUSION=1 (experiments): the input norm as its own launch.
  const bool no_norm_fusion_ = env_flag("SY_NO_NORM_FUSION");
  float* logits_ = nullptr;  // [router groups, chunk_tokens, E]
  unsigned long long* stamps_ = nullptr;
  double stamp_median_[kStamps] = {}, stamp_max_[kStamps] = {};
  int stamp_launches_ = 0;
  float* act_ = nullptr;     // [chunk_tokens * K, I]
};

}  // namespace

std::unique_ptr<moe::ExpertsKernel> make_cuda_fused_kernel(CudaContext& context) {
  return std::make_unique<FusedKernel>(context);
}

}  // namespace sy::backend::cuda
