// cuda-modular: Route (moe_route.cuh, the router every CUDA kernel shares) -> Align (the T*K
// (token, slot) pairs grouped by expert, each expert padded to the GEMM's M tile) -> Forward
// (grouped GEMM gate_up with SiLU(gate)*up in its epilogue, grouped GEMM down) -> Combine
// (weighted sum in top-k order). Deterministic: no float atomics, every sum in a fixed order.
// Graph-safe: grids depend only on T and the shapes; CTAs past the real work exit early.
// fmt (via util/status.h) turns its constexpr off under nvcc, and then its C++20 code does not
// compile (gcc 12, fmt 9); host code here is plain C++, so keep it on.
#ifndef FMT_USE_CONSTEXPR
#define FMT_USE_CONSTEXPR 1
#endif

#include <cuda_fp16.h>

#include <algorithm>
#include <cfloat>
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <type_traits>

#include "backend/cuda/moe_kernels.h"
#include "backend/cuda/moe_route.cuh"
#include "backend/cuda/mxfp4.cuh"
#include "backend/cuda/wgmma_ptx.cuh"

namespace sy::backend::cuda {
namespace {

// ---- PTX wrappers (sm_80+: cp.async, ldmatrix, mma.sync bf16) ----

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// 16 bytes global -> shared, bypassing L1; `valid == false` writes 16 zero bytes (tile tails,
// padding rows) and reads nothing.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  const int bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(address));
}
// c += a (16x16, row) * b (16x8, col), bf16 in, f32 accumulate.
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4],
                                         const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// ---- Tiles ----

// One CTA computes a kM x kN tile of one expert (for gate_up: kN/2 gate rows and the kN/2 up
// rows of the same output columns, so SiLU*up happens in registers). Warps tile it kWarpsM x
// kWarpsN; each warp holds (kWarpM/16) x (kWarpN/8) m16n8 accumulators. Shared rows carry 8
// halves (16 bytes) of padding so the 8 rows one ldmatrix phase reads fall in distinct banks.
template <int M, int N, int K, int WarpsM, int WarpsN, int Stages, int MinBlocks>
struct Tile {
  static constexpr int kM = M, kN = N, kK = K, kWarpsM = WarpsM, kWarpsN = WarpsN;
  static constexpr int kStages = Stages, kMinBlocks = MinBlocks;
  static constexpr int kThreads = WarpsM * WarpsN * 32;
  static constexpr int kWarpM = M / WarpsM, kWarpN = N / WarpsN;
  static constexpr int kFragsM = kWarpM / 16, kFragsN = kWarpN / 8;
  static constexpr int kRowHalves = K + 8;
  static constexpr int kChunksPerRow = K / 8;                    // 16-byte cp.async chunks
  static constexpr int kAChunks = M * kChunksPerRow / kThreads;  // per thread per stage
  static constexpr int kBChunks = N * kChunksPerRow / kThreads;
  static constexpr size_t kSmemBytes =
      static_cast<size_t>(Stages) * (M + N) * kRowHalves * 2 + static_cast<size_t>(M) * 4;

  static_assert(kWarpM * kWarpsM == kM && kWarpN * kWarpsN == kN, "warps tile the CTA tile");
  static_assert(kWarpM % 16 == 0 && kWarpN % 16 == 0, "warp tile: m16 rows, an even count of n8");
  static_assert(K % 16 == 0 && kThreads % kChunksPerRow == 0, "k chunks fixed per thread");
  static_assert(M * kChunksPerRow % kThreads == 0 && N * kChunksPerRow % kThreads == 0,
                "even loads");
};
// Few rows per expert (decode-sized steps): bound by streaming the touched experts' weights, so
// a short M tile, a deep pipeline and many CTAs. Larger steps: bound by tensor-core FLOPs.
using SmallTile = Tile<32, 64, 64, 1, 4, 5, 3>;
// Larger steps: k tiles of 64 in three stages (two blocks an SM; the large tile's 221 KB).
// Large, on an H100 (88d8eed, alternating): a Qwen3.5 8 x 1,024 prefill 247.7 -> 234.8 ms and a
// Qwen3 8k 406.8 -> 387.9 ms against k tiles of 32 in four stages (a warp of 64 x 64 with k 64:
// no faster; 128 x 256 tiles of eight such warps: slower). Medium (bf16 experts: 24 to 96 pairs
// an expert, Qwen3.5's 768 to 3,072 tokens, serving steps of decodes and a prefill piece) and
// MXFP4's large steps, on an H100 (712e2b3, two rounds alternating): Qwen3.5 2 x 1,024 prefill
// 95.7 -> 87.8 ms, Qwen3 1,024 41.8 -> 38.7 ms, gpt-oss 4,096 147.2 -> 133.5 ms.
using MediumTile = Tile<64, 128, 64, 2, 4, 3, 2>;
using LargeTile = Tile<128, 128, 64, 2, 4, 3, 2>;
// The k-32 tiles before session 23. MXFP4's medium steps and the batch-invariant dense GEMM keep
// them (their k-64 variants have not been measured; SY_GEMM_TILE=k64 puts MXFP4's medium steps on
// MediumTile), and SY_GEMM_TILE=k32 puts every expert step back on them (A/B). Every tile sums a
// product's k in the same order (k tiles ascending, m16n8k16 steps within): bitwise the same
// results.
using MediumK32Tile = Tile<64, 128, 32, 2, 4, 4, 2>;
using LargeK32Tile = Tile<128, 128, 32, 2, 4, 4, 2>;

// Shared memory of grouped_gemm_kernel<Cfg, *, kMxfp4>, in bytes: A stages; bf16 B stages (bf16
// weights: cp.async'd; MXFP4: one buffer, the tile in use, decoded from its packed stage); the
// MXFP4 packed stages (cp.async'd, k/2 bytes a row); the tile's row -> pair table; and, MXFP4 only,
// every e8m0 scale of the block's weight rows (k_dim / 32 bytes a row, loaded once).
template <class Cfg, bool kMxfp4>
struct SmemPlan {
  static constexpr size_t kA = static_cast<size_t>(Cfg::kStages) * Cfg::kM * Cfg::kRowHalves * 2;
  static constexpr size_t kB =
      static_cast<size_t>(kMxfp4 ? 1 : Cfg::kStages) * Cfg::kN * Cfg::kRowHalves * 2;
  static constexpr size_t kPackedStage = kMxfp4 ? static_cast<size_t>(Cfg::kN) * Cfg::kK / 2 : 0;
  static constexpr size_t kPacked = static_cast<size_t>(Cfg::kStages) * kPackedStage;
  static constexpr size_t kRowPair = static_cast<size_t>(Cfg::kM) * 4;
  static constexpr size_t kScalesAt = kA + kB + kPacked + kRowPair;
  static constexpr size_t bytes(int64_t k_dim) {
    return kScalesAt +
           (kMxfp4 ? (static_cast<size_t>(Cfg::kN) * static_cast<size_t>(k_dim / 32) + 15) / 16 * 16
                   : 0);
  }
  static_assert(!kMxfp4 || Cfg::kK % 32 == 0, "MXFP4 k tiles hold whole 32-value blocks");
};

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// Upper bound of M tiles over all experts for `pairs` (token, slot) pairs: sum_e ceil(c_e / M) <=
// pairs / M + (experts with c_e > 0). Grids use it so that they never depend on the counts.
int64_t m_tiles_bound(int64_t pairs, int64_t experts, int64_t tile_m) {
  return ceil_div(pairs, tile_m) + std::min(experts, pairs);
}

// ---- Align ----

constexpr int kAlignThreads = 256;
constexpr int kAlignPairsPerThread = 8;

// One block per expert. Pass 1 counts the pairs of experts <= this one (shared-memory histogram)
// to find where this expert's tiles start; pass 2 lists this expert's pairs in pair order
// (stable: a block-wide scan, no atomics) into perm, padding its last tile with -1, and writes
// its entries of the tile table. Floor: every block reads the T*K ids twice from L2 (0.5 MB at
// T = 8192, K = 8): a few microseconds, negligible against the GEMMs.
__global__ void __launch_bounds__(kAlignThreads)
    align_kernel(const int32_t* __restrict__ ids, int pairs, int experts, int tile_m,
                 int32_t* __restrict__ perm, int32_t* __restrict__ tile_expert,
                 int32_t* tile_count) {
  __shared__ int32_t count_of[kMaxRouteExperts];
  __shared__ int32_t warp_totals[kAlignThreads / 32];
  __shared__ int32_t tiles_before;
  const int expert = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  for (int e = tid; e <= expert; e += kAlignThreads) count_of[e] = 0;
  if (tid == 0) tiles_before = 0;
  __syncthreads();
  for (int i = tid; i < pairs; i += kAlignThreads) {
    const int32_t id = ids[i];
    if (id >= 0 && id <= expert) atomicAdd(&count_of[id], 1);
  }
  __syncthreads();
  int before = 0;
  for (int e = tid; e < expert; e += kAlignThreads) before += (count_of[e] + tile_m - 1) / tile_m;
  for (int o = 16; o > 0; o >>= 1) before += __shfl_xor_sync(0xffffffffu, before, o);
  if (lane == 0 && before) atomicAdd(&tiles_before, before);  // integer: order does not matter
  __syncthreads();
  const int count = count_of[expert];
  const int tiles = (count + tile_m - 1) / tile_m;
  const int first_tile = tiles_before;
  for (int j = tid; j < tiles; j += kAlignThreads) tile_expert[first_tile + j] = expert;
  if (expert == experts - 1 && tid == 0) *tile_count = first_tile + tiles;
  if (count == 0) return;  // uniform over the block

  int32_t* rows = perm + static_cast<int64_t>(first_tile) * tile_m;
  int written = 0;  // the same in every thread
  for (int chunk = 0; chunk < pairs; chunk += kAlignThreads * kAlignPairsPerThread) {
    const int first = chunk + tid * kAlignPairsPerThread;  // this thread's 8 consecutive pairs
    uint32_t mine = 0;
    if (first + kAlignPairsPerThread <= pairs) {
      const int4 lo = *reinterpret_cast<const int4*>(ids + first);
      const int4 hi = *reinterpret_cast<const int4*>(ids + first + 4);
      const int32_t v[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
      for (int j = 0; j < 8; ++j) mine |= static_cast<uint32_t>(v[j] == expert) << j;
    } else {
      for (int j = 0; j < kAlignPairsPerThread && first + j < pairs; ++j)
        mine |= static_cast<uint32_t>(ids[first + j] == expert) << j;
    }
    const int n = __popc(mine);
    int inclusive = n;
    for (int o = 1; o < 32; o <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, inclusive, o);
      if (lane >= o) inclusive += v;
    }
    if (lane == 31) warp_totals[warp] = inclusive;
    __syncthreads();
    int offset = written + inclusive - n, total = 0;
    for (int w = 0; w < kAlignThreads / 32; ++w) {
      const int t = warp_totals[w];
      if (w < warp) offset += t;
      total += t;
    }
    for (int j = 0; j < kAlignPairsPerThread; ++j)
      if (mine >> j & 1u) rows[offset++] = first + j;
    written += total;
    __syncthreads();  // warp_totals is rewritten by the next chunk
  }
  for (int r = count + tid; r < tiles * tile_m; r += kAlignThreads) rows[r] = -1;
}

// Bytes: T*H*(4 read + 2 written). H % 8 == 0: one 16-byte store per 8 elements.
__global__ void to_bf16_kernel(const float* __restrict__ x, int64_t chunks,
                               __nv_bfloat16* __restrict__ out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < chunks;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float4 lo = reinterpret_cast<const float4*>(x)[2 * i];
    const float4 hi = reinterpret_cast<const float4*>(x)[2 * i + 1];
    __nv_bfloat162 packed[4] = {
        __floats2bfloat162_rn(lo.x, lo.y), __floats2bfloat162_rn(lo.z, lo.w),
        __floats2bfloat162_rn(hi.x, hi.y), __floats2bfloat162_rn(hi.z, hi.w)};
    reinterpret_cast<uint4*>(out)[i] = *reinterpret_cast<const uint4*>(packed);
  }
}

// x as hi and lo bf16 rows (the streamed MXFP4 GEMV's input): out [T, 2H], hi = x rounded,
// lo = x - hi rounded. H % 8 == 0.
__global__ void split_bf16_kernel(const float* __restrict__ x, int64_t tokens, int hidden,
                                  __nv_bfloat16* __restrict__ out) {
  overlap_prologue();  // (launched overlapped: x is the previous kernel's output)
  const int64_t chunks = tokens * hidden / 4;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < chunks;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float4 v = reinterpret_cast<const float4*>(x)[i];
    const int64_t t = 4 * i / hidden, h = 4 * i - t * hidden;
    const __nv_bfloat162 hi01 = __floats2bfloat162_rn(v.x, v.y), hi23 = __floats2bfloat162_rn(v.z, v.w);
    const float2 f01 = __bfloat1622float2(hi01), f23 = __bfloat1622float2(hi23);
    const __nv_bfloat162 lo01 = __floats2bfloat162_rn(v.x - f01.x, v.y - f01.y),
                         lo23 = __floats2bfloat162_rn(v.z - f23.x, v.w - f23.y);
    __nv_bfloat16* row = out + t * 2 * hidden;
    *reinterpret_cast<uint2*>(row + h) = make_uint2(*reinterpret_cast<const uint32_t*>(&hi01), *reinterpret_cast<const uint32_t*>(&hi23));
    *reinterpret_cast<uint2*>(row + hidden + h) =
        make_uint2(*reinterpret_cast<const uint32_t*>(&lo01), *reinterpret_cast<const uint32_t*>(&lo23));
  }
}

// ---- Forward: grouped GEMMs ----

struct GroupedGemm {
  // gate_up: x_bf16 [T, H], row of pair p is p / top_k. down: act [padded rows, I], in perm order.
  const __nv_bfloat16* a = nullptr;
  const __nv_bfloat16* w = nullptr;  // gate_up [E, 2I, H] or down [E, H, I]
  // MXFP4 weights instead (kMxfp4Interleaved): the same [E, rows, k] matrices as 32-value blocks
  // (k/2 bytes a row, low nibble first) and e8m0 scales (k/32 bytes a row); gate_up rows
  // interleave gate and up (2r, 2r+1).
  const uint8_t* w_blocks = nullptr;
  const uint8_t* w_scales = nullptr;
  int k_dim = 0;                     // H or I
  int n_dim = 0;                     // output columns: I or H
  int top_k = 0;
  const int32_t* perm = nullptr;         // [padded rows]: pair index, -1 for padding
  const int32_t* tile_expert = nullptr;  // [M tiles]
  const int32_t* tile_count = nullptr;   // [1]
  __nv_bfloat16* act = nullptr;          // gate_up output [padded rows, I]
  float* y = nullptr;                    // down output [T*K, H], row = pair
  ExpertParams experts;                  // activation and biases
};

// The expert weight row behind a CTA's B row j, -1 past n_dim. The CTA covers output columns
// [n0, n0 + n_per_cta); gate_up's B rows [0, n_per_cta) are gate rows and [n_per_cta, 2
// n_per_cta) the up rows of the same columns (MXFP4: gpt-oss's interleaved gate 2n, up 2n + 1).
template <bool kGateUp, bool kMxfp4>
__device__ __forceinline__ int64_t expert_weight_row(const GroupedGemm& g, int expert, int n0,
                                                     int n_per_cta, int j) {
  const int n = n0 + j % n_per_cta;
  if (n >= g.n_dim) return -1;
  if constexpr (kGateUp && kMxfp4)
    return static_cast<int64_t>(expert) * 2 * g.n_dim + 2 * n + (j >= n_per_cta ? 1 : 0);
  else if constexpr (kGateUp)
    return static_cast<int64_t>(expert) * 2 * g.n_dim + (j >= n_per_cta ? g.n_dim : 0) + n;
  else
    return static_cast<int64_t>(expert) * g.n_dim + n;
}

// MXFP4: every e8m0 scale of a CTA's `rows` B rows (k_dim / 32 a row) into shared memory, 127
// (a scale of 1) for rows past n_dim.
template <bool kGateUp, int kThreads>
__device__ __forceinline__ void load_block_scales(const GroupedGemm& g, int expert, int n0,
                                                  int n_per_cta, int rows, uint8_t* scale_smem) {
  const int scales_per_row = g.k_dim / 32;
  for (int idx = threadIdx.x; idx < rows * scales_per_row; idx += kThreads) {
    const int j = idx / scales_per_row;
    const int64_t w_row = expert_weight_row<kGateUp, true>(g, expert, n0, n_per_cta, j);
    scale_smem[idx] =
        w_row >= 0 ? g.w_scales[w_row * scales_per_row + (idx - j * scales_per_row)] : uint8_t{127};
  }
}

// The grouped GEMM's epilogue for one tile row's output columns col, col + 1 (n_dim % 8 == 0: both
// in or both out). gate_up: the activation of the gate and up sums into the row's act (bf16);
// down: the sums plus the down bias into the pair's row of y (f32).
__device__ __forceinline__ void store_gate_up_pair(const GroupedGemm& g, int expert,
                                                   __nv_bfloat16* act_row, int col, float g0,
                                                   float g1, float u0, float u1) {
  const float h0 = g.experts.activate(expert, col, g.n_dim, g0, u0),
              h1 = g.experts.activate(expert, col + 1, g.n_dim, g1, u1);
  *reinterpret_cast<__nv_bfloat162*>(act_row + col) = __floats2bfloat162_rn(h0, h1);
}
__device__ __forceinline__ void store_down_pair(const GroupedGemm& g, int expert, float* y_row,
                                                int col, float y0, float y1) {
  *reinterpret_cast<float2*>(y_row + col) =
      make_float2(y0 + g.experts.down_bias_of(expert, col, g.n_dim),
                  y1 + g.experts.down_bias_of(expert, col + 1, g.n_dim));
}

// grid (N tiles, M-tile bound). One (expert, M tile, N tile) per CTA; cp.async multi-stage
// pipeline over k; ldmatrix + mma.sync m16n8k16. Floor, gate_up: max(touched experts x 2*I*H*2
// bytes, 2*T*K*2I*H FLOPs); down: max(touched experts x H*I*2 bytes, 2*T*K*H*I FLOPs).
// kMxfp4: the weights are MXFP4 (a quarter of the bytes, plus k/32 scale bytes a row). Each
// thread loads its packed chunks of k tile kt + kStages - 1 into registers before the mma work
// of tile kt and decodes them into the bf16 stage after it: the same k order as bf16, so the
// accumulation is the bf16 kernel's on the decoded values.
template <class Cfg, bool kGateUp, bool kMxfp4 = false>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks)
    grouped_gemm_kernel(GroupedGemm g) {
  const int m_tile = blockIdx.y;
  if (m_tile >= *g.tile_count) return;  // past the real tiles of this step
  const int expert = g.tile_expert[m_tile];
  const int64_t row_base = static_cast<int64_t>(m_tile) * Cfg::kM;

  using Plan = SmemPlan<Cfg, kMxfp4>;
  extern __shared__ __align__(16) unsigned char smem[];
  __nv_bfloat16* a_smem = reinterpret_cast<__nv_bfloat16*>(smem);
  __nv_bfloat16* b_smem = reinterpret_cast<__nv_bfloat16*>(smem + Plan::kA);
  unsigned char* packed_smem = smem + Plan::kA + Plan::kB;
  int32_t* row_pair = reinterpret_cast<int32_t*>(smem + Plan::kA + Plan::kB + Plan::kPacked);
  uint8_t* scale_smem = smem + Plan::kScalesAt;

  const int tid = threadIdx.x;
  for (int r = tid; r < Cfg::kM; r += Cfg::kThreads) row_pair[r] = g.perm[row_base + r];
  __syncthreads();

  // Each thread copies the same k chunk of fixed rows at every stage: resolve the rows once.
  constexpr int kRowsPerPass = Cfg::kThreads / Cfg::kChunksPerRow;
  const int k_chunk = (tid % Cfg::kChunksPerRow) * 8;
  const int row0 = tid / Cfg::kChunksPerRow;
  const __nv_bfloat16* a_src[Cfg::kAChunks];  // nullptr: padding row, zero-filled
#pragma unroll
  for (int i = 0; i < Cfg::kAChunks; ++i) {
    const int r = row0 + i * kRowsPerPass;
    const int32_t pair = row_pair[r];
    const int64_t src_row = kGateUp ? pair / g.top_k : row_base + r;
    a_src[i] = pair >= 0 ? g.a + src_row * g.k_dim : nullptr;
  }
  const int n_per_cta = kGateUp ? Cfg::kN / 2 : Cfg::kN;
  const int n0 = blockIdx.x * n_per_cta;
  auto weight_row = [&](int j) {
    return expert_weight_row<kGateUp, kMxfp4>(g, expert, n0, n_per_cta, j);
  };
  const __nv_bfloat16* b_src[Cfg::kBChunks];  // bf16 weights; nullptr: past n_dim, zero-filled
#pragma unroll
  for (int i = 0; i < Cfg::kBChunks; ++i) {
    const int64_t w_row = weight_row(row0 + i * kRowsPerPass);
    b_src[i] = w_row >= 0 && !kMxfp4 ? g.w + w_row * g.k_dim : nullptr;
  }
  // MXFP4: a k tile of a row is kK / 32 16-byte chunks (32 values each) of packed bytes, copied
  // like the bf16 tiles into a packed stage; this thread's chunks are fixed across stages.
  constexpr int kPackedPerRow = Cfg::kK / 32;
  constexpr int kPackedChunks = kMxfp4 ? Cfg::kN * kPackedPerRow : 0;
  constexpr int kPChunks = (kPackedChunks + Cfg::kThreads - 1) / Cfg::kThreads;
  const uint8_t* p_src[kPChunks > 0 ? kPChunks : 1];  // row start + chunk, nullptr: past n_dim
  int p_dst[kPChunks > 0 ? kPChunks : 1];             // offset in a packed stage, -1: no chunk
  int p_k[kPChunks > 0 ? kPChunks : 1];               // the chunk's first k within the tile
#pragma unroll
  for (int i = 0; i < kPChunks; ++i) {
    const int c = tid + i * Cfg::kThreads;
    const int j = c / kPackedPerRow, q = c % kPackedPerRow;
    const int64_t w_row = c < kPackedChunks ? weight_row(j) : -1;
    p_src[i] = w_row >= 0 ? g.w_blocks + w_row * (g.k_dim / 2) + q * 16 : nullptr;
    p_dst[i] = c < kPackedChunks ? j * (Cfg::kK / 2) + q * 16 : -1;
    p_k[i] = q * 32;
  }

  auto load_stage = [&](int stage, int k0) {
    const int k = k0 + k_chunk;
    const bool k_ok = k < g.k_dim;  // k_dim % 8 == 0: a chunk is all in or all out
    __nv_bfloat16* a_stage = a_smem + stage * Cfg::kM * Cfg::kRowHalves;
#pragma unroll
    for (int i = 0; i < Cfg::kAChunks; ++i) {
      const bool ok = k_ok && a_src[i];
      cp_async_16(smem_address(a_stage + (row0 + i * kRowsPerPass) * Cfg::kRowHalves + k_chunk),
                  ok ? a_src[i] + k : g.a, ok);
    }
    if constexpr (kMxfp4) {
      unsigned char* packed_stage = packed_smem + stage * Plan::kPackedStage;
#pragma unroll
      for (int i = 0; i < kPChunks; ++i) {
        if (p_dst[i] < 0) continue;
        const bool ok = p_src[i] && k0 + p_k[i] < g.k_dim;  // k_dim % 32 == 0: whole chunks
        cp_async_16(smem_address(packed_stage + p_dst[i]), ok ? p_src[i] + k0 / 2 : g.w_blocks, ok);
      }
    } else {
      __nv_bfloat16* b_stage = b_smem + stage * Cfg::kN * Cfg::kRowHalves;
#pragma unroll
      for (int i = 0; i < Cfg::kBChunks; ++i) {
        const bool ok = k_ok && b_src[i];
        cp_async_16(smem_address(b_stage + (row0 + i * kRowsPerPass) * Cfg::kRowHalves + k_chunk),
                    ok ? b_src[i] + k : g.w, ok);
      }
    }
  };
  // MXFP4: tile kt's packed stage decoded into the one bf16 B buffer (the same k order as the
  // bf16 kernel, so the accumulation is the bf16 kernel's on the decoded values).
  auto decode_b = [&](int stage, int k0) {
    const unsigned char* packed_stage = packed_smem + stage * Plan::kPackedStage;
    const int scales_per_row = g.k_dim / 32;
    const int k = k0 + k_chunk;
#pragma unroll
    for (int i = 0; i < Cfg::kBChunks; ++i) {
      const int j = row0 + i * kRowsPerPass;
      const uint32_t packed =
          *reinterpret_cast<const uint32_t*>(packed_stage + j * (Cfg::kK / 2) + k_chunk / 2);
      const uint8_t scale = k < g.k_dim ? scale_smem[j * scales_per_row + k / 32] : uint8_t{127};
      *reinterpret_cast<uint4*>(b_smem + j * Cfg::kRowHalves + k_chunk) =
          mxfp4_to_bf16x8(packed, scale);
    }
  };

  const int warp = tid >> 5, lane = tid & 31;
  const int warp_m = warp / Cfg::kWarpsN, warp_n = warp % Cfg::kWarpsN;
  constexpr int kHalfFrags = Cfg::kFragsN / 2;
  // Shared-memory row of the warp's n8 fragment j: for gate_up, fragments [0, kHalfFrags) are
  // gate rows and [kHalfFrags, kFragsN) the up rows of the same output columns.
  auto b_frag_row = [&](int j) {
    if constexpr (kGateUp)
      return (j < kHalfFrags ? 0 : Cfg::kN / 2) + warp_n * kHalfFrags * 8 + (j % kHalfFrags) * 8;
    else
      return warp_n * Cfg::kWarpN + j * 8;
  };

  float acc[Cfg::kFragsM][Cfg::kFragsN][4];
#pragma unroll
  for (int mf = 0; mf < Cfg::kFragsM; ++mf)
#pragma unroll
    for (int j = 0; j < Cfg::kFragsN; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[mf][j][c] = 0.0f;

  const int k_tiles = (g.k_dim + Cfg::kK - 1) / Cfg::kK;
#pragma unroll
  for (int s = 0; s < Cfg::kStages - 1; ++s) {
    if (s < k_tiles) load_stage(s, s * Cfg::kK);
    cp_async_commit();  // always commit: the group count stays uniform
  }
  if constexpr (kMxfp4)  // every scale of the block's rows, while the first stages load
    load_block_scales<kGateUp, Cfg::kThreads>(g, expert, n0, n_per_cta, Cfg::kN, scale_smem);
  for (int kt = 0; kt < k_tiles; ++kt) {
    cp_async_wait<Cfg::kStages - 2>();  // tile kt has landed (this thread's copies)
    __syncthreads();                    // ... everyone's; and stage (kt - 1) is free again
    const int next = kt + Cfg::kStages - 1;
    if (next < k_tiles) load_stage(next % Cfg::kStages, next * Cfg::kK);
    cp_async_commit();

    const int stage = kt % Cfg::kStages;
    const __nv_bfloat16* a_stage = a_smem + stage * Cfg::kM * Cfg::kRowHalves;
    const __nv_bfloat16* b_stage = kMxfp4 ? b_smem : b_smem + stage * Cfg::kN * Cfg::kRowHalves;
    if constexpr (kMxfp4) {  // the previous tile's mma work is done (the barrier above)
      decode_b(stage, kt * Cfg::kK);
      __syncthreads();
    }
#pragma unroll
    for (int kk = 0; kk < Cfg::kK; kk += 16) {
      uint32_t a_frag[Cfg::kFragsM][4];
      uint32_t b_frag[Cfg::kFragsN][2];
#pragma unroll
      for (int mf = 0; mf < Cfg::kFragsM; ++mf) {
        const int r = warp_m * Cfg::kWarpM + mf * 16 + (lane & 15);
        ldmatrix_x4(a_frag[mf], smem_address(a_stage + r * Cfg::kRowHalves + kk + (lane >> 4) * 8));
      }
#pragma unroll
      for (int j = 0; j < Cfg::kFragsN; ++j) {
        const int r = b_frag_row(j) + (lane & 7);
        ldmatrix_x2(b_frag[j],
                    smem_address(b_stage + r * Cfg::kRowHalves + kk + ((lane >> 3) & 1) * 8));
      }
#pragma unroll
      for (int mf = 0; mf < Cfg::kFragsM; ++mf)
#pragma unroll
        for (int j = 0; j < Cfg::kFragsN; ++j) mma_bf16(acc[mf][j], a_frag[mf], b_frag[j]);
    }
  }

  // Epilogue. Accumulator c of fragment (mf, j): row mf*16 + lane/4 + 8*(c/2), column
  // j*8 + 2*(lane%4) + c%2. n_dim % 8 == 0, so a column pair is all in or all out.
#pragma unroll
  for (int mf = 0; mf < Cfg::kFragsM; ++mf) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = warp_m * Cfg::kWarpM + mf * 16 + (lane >> 2) + half * 8;
      const int32_t pair = row_pair[r];
      if (pair < 0) continue;  // padding row
      if constexpr (kGateUp) {
        __nv_bfloat16* out_row = g.act + (row_base + r) * g.n_dim;
#pragma unroll
        for (int j = 0; j < kHalfFrags; ++j) {
          const int col = n0 + warp_n * kHalfFrags * 8 + j * 8 + (lane & 3) * 2;
          if (col >= g.n_dim) continue;
          store_gate_up_pair(g, expert, out_row, col, acc[mf][j][half * 2],
                             acc[mf][j][half * 2 + 1], acc[mf][j + kHalfFrags][half * 2],
                             acc[mf][j + kHalfFrags][half * 2 + 1]);
        }
      } else {
        float* out_row = g.y + static_cast<int64_t>(pair) * g.n_dim;
#pragma unroll
        for (int j = 0; j < Cfg::kFragsN; ++j) {
          const int col = n0 + warp_n * Cfg::kWarpN + j * 8 + (lane & 3) * 2;
          if (col >= g.n_dim) continue;
          store_down_pair(g, expert, out_row, col, acc[mf][j][half * 2], acc[mf][j][half * 2 + 1]);
        }
      }
    }
  }
}

// ---- Large steps on Hopper: the grouped GEMM on wgmma (default on sm_90; SY_GEMM_WGMMA=0: off)
// ----
//
// The work of grouped_gemm_kernel<LargeTile, *, *> (a 128-row M tile of one expert's pairs, 128
// B rows: gate_up's 64 gate and 64 up rows of the same output columns, or down's 128 hidden rows)
// with the products on warpgroup MMA: two warpgroups, each 64 of the tile's rows against all 128
// B rows, m64n128k16 from shared memory. Tiles of k 64 in the 128-byte swizzle (wgmma_ptx.cuh),
// copied with cp.async by every thread in kWgStages stages. The sum over k runs in the same tile
// order, and wgmma's k16 step rounds as mma.sync's does: the op harness's invariance check (a
// 40-token step on the small mma.sync tile against the same rows in a wgmma step) found every
// output bit equal in all four wgmma cases (H100, 2026-12-07), and enforces it from then on.
constexpr int kWgM = 128, kWgN = 128, kWgK = 64, kWgStages = 3, kWgThreads = 256;
constexpr size_t kWgTileBytes = static_cast<size_t>(kWgM) * kWgK * 2;    // A or B, bf16, one stage
constexpr size_t kWgPackedBytes = static_cast<size_t>(kWgN) * kWgK / 2;  // B, MXFP4, one stage
static_assert(kWgM == LargeTile::kM, "the wgmma GEMM walks LargeTile's M tiles (align_kernel)");
static_assert(kWgM == kWgN, "a thread copies the same rows of A and B");

// Shared memory, in bytes from a 1024-byte boundary (the first 1024 bytes of the allocation are
// slack for that alignment): the A stages; bf16 B: its stages, MXFP4 B: two decoded bf16 tiles,
// then the packed stages; the tile's row -> pair table; MXFP4: every e8m0 scale of the block's B
// rows (k_dim / 32 a row).
template <bool kMxfp4>
struct WgPlan {
  static constexpr size_t kA = kWgStages * kWgTileBytes;
  static constexpr size_t kB = (kMxfp4 ? 2 : kWgStages) * kWgTileBytes;
  static constexpr size_t kPacked = kMxfp4 ? kWgStages * kWgPackedBytes : 0;
  static constexpr size_t kRowPairAt = kA + kB + kPacked;
  static constexpr size_t kScalesAt = kRowPairAt + kWgM * 4;
  static constexpr size_t bytes(int64_t k_dim) {
    return 1024 + kScalesAt + (kMxfp4 ? kWgN * static_cast<size_t>(k_dim / 32) : 0);
  }
};

// The tile's outputs from the accumulators: acc[4j + c] is tile row 64 group + 16 (warp % 4) +
// lane / 4 + 8 (c / 2), B row 8j + 2 (lane % 4) + c % 2 (gate_up: j < 8 gate, j >= 8 the up rows
// of the same columns). The grouped GEMM's epilogue (activation and biases).
template <bool kGateUp>
__device__ __forceinline__ void wgmma_epilogue(const GroupedGemm& g, const float (&acc)[64],
                                               const int32_t* row_pair, int expert,
                                               int64_t row_base, int n0) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = (warp / 4) * 64 + (warp % 4) * 16 + (lane >> 2) + half * 8;
    const int32_t pair = row_pair[r];
    if (pair < 0) continue;  // padding row
    if constexpr (kGateUp) {
      __nv_bfloat16* out_row = g.act + (row_base + r) * g.n_dim;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int col = n0 + j * 8 + (lane & 3) * 2;
        if (col >= g.n_dim) continue;
        store_gate_up_pair(g, expert, out_row, col, acc[4 * j + 2 * half],
                           acc[4 * j + 2 * half + 1], acc[4 * (j + 8) + 2 * half],
                           acc[4 * (j + 8) + 2 * half + 1]);
      }
    } else {
      float* out_row = g.y + static_cast<int64_t>(pair) * g.n_dim;
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const int col = n0 + j * 8 + (lane & 3) * 2;
        if (col >= g.n_dim) continue;
        store_down_pair(g, expert, out_row, col, acc[4 * j + 2 * half], acc[4 * j + 2 * half + 1]);
      }
    }
  }
}

// bf16 weights: B's tiles are cp.async'd like A's; the wgmma batch of tile kt completes before
// the barrier that frees its stage. MXFP4 weights: B's packed tiles are cp.async'd (one 16-byte
// chunk, 32 values of one row, a thread) and each thread decodes its own chunk (no barrier
// between landing and decoding) into one of two bf16 tiles: tile kt + 1 is decoded while the
// wgmma batch of tile kt runs. Decoding as grouped_gemm_kernel's (mxfp4_to_bf16x8 per 8 values
// with the block's scale), so the products are of the same bf16 values.
template <bool kGateUp, bool kMxfp4>
__global__ void __launch_bounds__(kWgThreads, 1) grouped_gemm_wgmma_kernel(GroupedGemm g) {
#if SY_HAS_WGMMA
  const int m_tile = blockIdx.y;
  if (m_tile >= *g.tile_count) return;
  const int expert = g.tile_expert[m_tile];
  const int64_t row_base = static_cast<int64_t>(m_tile) * kWgM;

  using Plan = WgPlan<kMxfp4>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const uint32_t raw_address = smem_address(smem_raw);
  const uint32_t base = (raw_address + 1023u) & ~1023u;  // swizzle atoms start on 1024 bytes
  unsigned char* base_ptr = smem_raw + (base - raw_address);
  int32_t* row_pair = reinterpret_cast<int32_t*>(base_ptr + Plan::kRowPairAt);
  uint8_t* scale_smem = base_ptr + Plan::kScalesAt;
  auto a_stage = [&](int s) { return base + static_cast<uint32_t>(s * kWgTileBytes); };
  auto b_tile = [&](int s) { return base + static_cast<uint32_t>(Plan::kA + s * kWgTileBytes); };
  auto packed_stage = [&](int s) {
    return base_ptr + Plan::kA + Plan::kB + static_cast<size_t>(s) * kWgPackedBytes;
  };

  const int tid = threadIdx.x;
  for (int r = tid; r < kWgM; r += kWgThreads) row_pair[r] = g.perm[row_base + r];
  __syncthreads();

  // Thread tid copies bf16 chunk tid % 8 of rows tid / 8 + 32 i (i < 4) of A (and of bf16 B)
  // every stage; MXFP4 B: packed chunk tid % 2 of row tid / 2.
  constexpr int kChunksPerRow = kWgK / 8, kRowsPerPass = kWgThreads / kChunksPerRow;
  constexpr int kLoads = kWgM / kRowsPerPass;
  const int chunk = tid % kChunksPerRow, row0 = tid / kChunksPerRow;
  const int n_per_cta = kGateUp ? kWgN / 2 : kWgN;
  const int n0 = blockIdx.x * n_per_cta;
  auto weight_row = [&](int j) {
    return expert_weight_row<kGateUp, kMxfp4>(g, expert, n0, n_per_cta, j);
  };
  const __nv_bfloat16* a_src[kLoads];  // nullptr: padding row, zero-filled
  const __nv_bfloat16* b_src[kLoads];  // bf16 B; nullptr: past n_dim, zero-filled
#pragma unroll
  for (int i = 0; i < kLoads; ++i) {
    const int r = row0 + i * kRowsPerPass;
    const int32_t pair = row_pair[r];
    const int64_t src_row = kGateUp ? pair / g.top_k : row_base + r;
    a_src[i] = pair >= 0 ? g.a + src_row * g.k_dim : nullptr;
    const int64_t w_row = kMxfp4 ? -1 : weight_row(r);
    b_src[i] = w_row >= 0 ? g.w + w_row * g.k_dim : nullptr;
  }
  const int p_row = tid / 2, p_half = tid % 2;  // MXFP4: this thread's packed chunk
  const int64_t p_weight_row = kMxfp4 ? weight_row(p_row) : -1;
  const uint8_t* p_src =
      p_weight_row >= 0 ? g.w_blocks + p_weight_row * (g.k_dim / 2) + p_half * 16 : nullptr;

  auto load_stage = [&](int s, int k0) {
    const int k = k0 + chunk * 8;
    const bool k_ok = k < g.k_dim;  // k_dim % 8 == 0: a chunk is all in or all out
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
      const uint32_t at = wgmma::swizzled_chunk(row0 + i * kRowsPerPass, chunk);
      const bool a_ok = k_ok && a_src[i];
      cp_async_16(a_stage(s) + at, a_ok ? a_src[i] + k : g.a, a_ok);
      if constexpr (!kMxfp4) {
        const bool b_ok = k_ok && b_src[i];
        cp_async_16(b_tile(s) + at, b_ok ? b_src[i] + k : g.w, b_ok);
      }
    }
    if constexpr (kMxfp4) {  // k_dim % 32 == 0: a 32-value chunk is all in or all out
      const bool ok = p_src && k0 + p_half * 32 < g.k_dim;
      cp_async_16(smem_address(packed_stage(s) + tid * 16), ok ? p_src + k0 / 2 : g.w_blocks, ok);
    }
  };
  // MXFP4: this thread's packed chunk of tile kt (stage s) as bf16 into decoded tile `to`: its
  // row's bf16 chunks 4 p_half .. 4 p_half + 3.
  auto decode_own = [&](int s, int kt, int to) {
    const uint4 packed = *reinterpret_cast<const uint4*>(packed_stage(s) + tid * 16);
    const int scales_per_row = g.k_dim / 32;
    const int block = kt * (kWgK / 32) + p_half;
    const uint8_t scale =
        block < scales_per_row ? scale_smem[p_row * scales_per_row + block] : uint8_t{127};
    unsigned char* tile = base_ptr + Plan::kA + static_cast<size_t>(to) * kWgTileBytes;
    const uint32_t words[4] = {packed.x, packed.y, packed.z, packed.w};
#pragma unroll
    for (int i = 0; i < 4; ++i)
      *reinterpret_cast<uint4*>(tile + wgmma::swizzled_chunk(p_row, p_half * 4 + i)) =
          mxfp4_to_bf16x8(words[i], scale);
  };

  const int group = (tid >> 5) / 4;  // warpgroup: tile rows [64 group, 64 group + 64)
  float acc[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = 0.0f;

  const int k_tiles = (g.k_dim + kWgK - 1) / kWgK;
#pragma unroll
  for (int s = 0; s < kWgStages - 1; ++s) {
    if (s < k_tiles) load_stage(s, s * kWgK);
    cp_async_commit();
  }
  if constexpr (kMxfp4) {  // every scale of the block's rows, then tile 0 decoded
    load_block_scales<kGateUp, kWgThreads>(g, expert, n0, n_per_cta, kWgN, scale_smem);
    __syncthreads();
    cp_async_wait<kWgStages - 2>();  // tile 0 (this thread's chunk)
    decode_own(0, 0, 0);
  }
  for (int kt = 0; kt < k_tiles; ++kt) {
    cp_async_wait<kWgStages - 2>();  // tile kt has landed (this thread's copies)
    wgmma::fence_proxy_async();      // ... visible to the async proxy (and decoded tile kt)
    __syncthreads();                 // ... everyone's; tile kt - 1's wgmma batch completed
    const int next = kt + kWgStages - 1;
    if (next < k_tiles) load_stage(next % kWgStages, next * kWgK);
    cp_async_commit();

    const int s = kt % kWgStages;
    const uint32_t a_rows = a_stage(s) + static_cast<uint32_t>(group * 64 * kWgK * 2);
    const uint32_t b_rows = kMxfp4 ? b_tile(kt % 2) : b_tile(s);
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < kWgK; kk += 16)
      wgmma::mma_m64n128k16(acc, wgmma::tile_descriptor(a_rows, kk),
                            wgmma::tile_descriptor(b_rows, kk));
    wgmma::commit_group();
    if constexpr (kMxfp4) {
      // Tile kt + 1 into the other decoded tile (tile kt - 1's, whose batch completed before the
      // barrier) while this batch runs. Committed groups now reach tile kt + kWgStages - 1, so
      // kWgStages - 2 pending leaves tile kt + 1 landed.
      if (kt + 1 < k_tiles) {
        cp_async_wait<kWgStages - 2>();
        decode_own((kt + 1) % kWgStages, kt + 1, (kt + 1) % 2);
      }
    }
    wgmma::wait_group<0>();
  }
  wgmma_epilogue<kGateUp>(g, acc, row_pair, expert, row_base, n0);
#else
  __trap();  // launched only on sm_90 (ModularKernel::wgmma_)
#endif
}

// ---- Expert widths that are not a multiple of 8 (tiny test models only) ----
//
// The grouped GEMM's 16-byte loads need rows of a multiple of 8 bf16. For other widths, one
// thread per output element of the same aligned rows (perm, tile_expert from align_kernel):
// a plain dot over k in order, the same epilogues (ExpertParams). Slow and exact enough; no
// published model has such a width.
__global__ void simple_gate_up_kernel(GroupedGemm g, int tile_m, int64_t padded_rows) {
  const int n = blockIdx.x * blockDim.x + threadIdx.x;
  for (int64_t r = blockIdx.y; r < padded_rows; r += gridDim.y) {
    const int m_tile = static_cast<int>(r / tile_m);
    if (m_tile >= *g.tile_count || n >= g.n_dim) return;
    const int32_t pair = g.perm[r];
    if (pair < 0) continue;
    const int64_t expert = g.tile_expert[m_tile], k_dim = g.k_dim, n_dim = g.n_dim;
    const __nv_bfloat16* x = g.a + static_cast<int64_t>(pair / g.top_k) * k_dim;
    const __nv_bfloat16* w_gate = g.w + (expert * 2 * n_dim + n) * k_dim;
    const __nv_bfloat16* w_up = w_gate + n_dim * k_dim;
    float gate = 0.0f, up = 0.0f;
    for (int64_t k = 0; k < k_dim; ++k) {
      const float xv = __bfloat162float(x[k]);
      gate += xv * __bfloat162float(w_gate[k]);
      up += xv * __bfloat162float(w_up[k]);
    }
    g.act[r * n_dim + n] = __float2bfloat16(g.experts.activate(expert, n, g.n_dim, gate, up));
  }
}

__global__ void simple_down_kernel(GroupedGemm g, int tile_m, int64_t padded_rows) {
  const int n = blockIdx.x * blockDim.x + threadIdx.x;
  for (int64_t r = blockIdx.y; r < padded_rows; r += gridDim.y) {
    const int m_tile = static_cast<int>(r / tile_m);
    if (m_tile >= *g.tile_count || n >= g.n_dim) return;
    const int32_t pair = g.perm[r];
    if (pair < 0) continue;
    const int64_t expert = g.tile_expert[m_tile], k_dim = g.k_dim, n_dim = g.n_dim;
    const __nv_bfloat16* a = g.a + r * k_dim;
    const __nv_bfloat16* w = g.w + (expert * n_dim + n) * k_dim;
    float acc = 0.0f;
    for (int64_t k = 0; k < k_dim; ++k) acc += __bfloat162float(a[k]) * __bfloat162float(w[k]);
    g.y[static_cast<int64_t>(pair) * n_dim + n] = acc + g.experts.down_bias_of(expert, n, g.n_dim);
  }
}

// ---- Few-token MXFP4 experts: warp-per-rows GEMV (where the tensor-core ones cannot run;
// Mxfp4Path) ----
//
// A decode step of a few tokens has one row per (token, slot) pair: the grouped GEMM's 16-row mma
// tiles and per-k-tile barriers then bound it by latency (gpt-oss-20b batch 1: 56 + 45 us a layer,
// 643 and 390 GB/s, ncu at e4a1e63). Here each warp streams a few MXFP4 weight rows of one pair's
// expert, every lane with all of its 16-byte chunks (32 values) of those rows in flight, decodes
// them to f32 (mxfp4_unscaled_bf16x8; the block's 2^(s - 127) scales each 32-value partial sum,
// exactly), and dots them with the pair's f32 input. Floor: the touched experts' MXFP4 bytes once
// per pair; pairs of one expert re-read its rows (from L2 when they run together).
constexpr int kGemvMaxTokens = 8;
constexpr int kGemvThreads = 256;
constexpr int kGemvWarps = kGemvThreads / 32;

struct Mxfp4Gemv {
  const uint8_t* blocks = nullptr;  // [E, rows, k/32, 16]
  const uint8_t* scales = nullptr;  // [E, rows, k/32]
  const float* x =
      nullptr;           // gate_up: hidden [T, H], row of pair p = p / top_k; down: act [pairs, I]
  float* out = nullptr;  // gate_up: act [pairs, I]; down: y [pairs, H]
  const int32_t* ids = nullptr;  // [pairs]
  // The streamed kernel's input and gate_up output instead: rows of hi then lo bf16 (x = hi + lo,
  // lo = x - hi rounded), [x rows, 2k] and [pairs, 2n].
  const __nv_bfloat16* x_split = nullptr;
  __nv_bfloat16* out_split = nullptr;
  int top_k = 0, experts = 0;
  int k = 0;  // H (gate_up) or I (down)
  int n = 0;  // output columns: I (gate_up) or H (down)
  ExpertParams params;
};

// grid (ceil(n / (outputs a warp * kGemvWarps)), pairs): a warp streams 4 weight rows of pair
// blockIdx.y's expert. kGateUp: gpt-oss's interleaved rows 2r .. 2r + 3 (gate, up, gate, up) give
// output columns r, r + 1, activation and bias as the grouped GEMM's epilogue, into act (f32);
// else hidden rows h .. h + 3, down bias added, into y. A pair never routed (an invalid id) reads
// no weights and writes zeros.
template <bool kGateUp>
__global__ void __launch_bounds__(kGemvThreads) mxfp4_gemv_kernel(const __grid_constant__ Mxfp4Gemv g) {
  // Launched overlapped (launch_overlapped). gate_up's ids come from the kernel just before it (the
  // router), so it waits first. down's come from the router two kernels back, complete once this
  // kernel may start (gate_up has passed its own wait): down requests its expert rows first and
  // waits (for gate_up's activations) only before reading x, so their DRAM latency overlaps
  // gate_up's tail.
  if (kGateUp) overlap_prologue();
  constexpr int kOutputs = kGateUp ? 2 : 4;
  const int pair = blockIdx.y;
  const int first = (static_cast<int>(blockIdx.x) * kGemvWarps + (threadIdx.x >> 5)) * kOutputs;
  if (first >= g.n) {
    if (!kGateUp) overlap_prologue();
    return;
  }
  const int outputs = min(kOutputs, g.n - first);
  const int32_t e = g.ids[pair];
  float* out = g.out + static_cast<int64_t>(pair) * g.n;
  const bool lead = (threadIdx.x & 31) == 0;
  if (static_cast<uint32_t>(e) >= static_cast<uint32_t>(g.experts)) {
    if (!kGateUp) overlap_prologue();
    if (lead)
      for (int j = 0; j < outputs; ++j) out[first + j] = 0.0f;
    return;
  }
  const int64_t first_row =
      kGateUp ? static_cast<int64_t>(e) * 2 * g.n + 2 * first : static_cast<int64_t>(e) * g.n + first;
  const int64_t x_row = kGateUp ? pair / g.top_k : pair;
  float acc[4];
  mxfp4_rows_dot<4>(g.blocks + first_row * (g.k / 2), g.scales + first_row * (g.k / 32),
                    kGateUp ? 2 * outputs : outputs, g.k, g.x + x_row * g.k, acc, [] {
                      if (!kGateUp) overlap_prologue();
                    });
  if (lead)
    for (int j = 0; j < outputs; ++j)
      out[first + j] = kGateUp ? g.params.activate(e, first + j, g.n, acc[2 * j], acc[2 * j + 1])
                               : acc[j] + g.params.down_bias_of(e, first + j, g.n);
}

// ---- Few-token MXFP4 experts on tensor cores, streamed (SY_MXFP4_GEMV=stream; Mxfp4Path) ----
//
// Why not the warp GEMV above: it loads a warp's rows once and then decodes and multiplies with
// nothing in flight, and its f32 FMAs cost ~5.5 instructions a weight (gpt-oss-20b batch 1: 29-38%
// of bandwidth, ncu at 2fc0bc9). Here each warp owns 16 weight rows of one pair's expert and
// streams them over k through a kStreamStages-deep cp.async ring in shared memory (its own; no
// block barrier in the loop), so loads stay in flight while it computes; the products run as
// m16n8k16 bf16 mma with the decoded rows as A. B carries the pair's input split in two bf16
// columns (x = hi + lo, lo = x - hi rounded; column 0 hi, column 1 lo, the rest zero), so the sum
// keeps ~16 bits of x's mantissa, not bf16's 8, for no extra mma.
//
// k order: within a 32-value MXFP4 block the four lanes of one row group (q = lane % 4) each take
// one 4-byte word (8 values); mma step s in {0, 1} feeds lane q's values 4s..4s+3 as the tile's
// k = 2q, 2q+1, 2q+8, 2q+9, and B is fed the same x values in the same places. So every mma sums
// one MXFP4 block of each row: it runs on the unscaled e2m1 values (exact in bf16) and its result
// is scaled by the block's 2^(s - 127) in f32 (exact), added to the row's f32 sum in block order.
// Rows: gate_up puts gpt-oss's interleaved gate row 2c in mma row c and up row 2c + 1 in c + 8
// (outputs c = 0..7 of the tile), so the lane holding both applies the activation; down: rows
// in order.
constexpr int kStreamWarps = 2;
constexpr int kStreamThreads = kStreamWarps * 32;
constexpr int kStreamStages = 4;
// 128 bytes of each row a stage, the successor issued after computing it: wider stages (256, 512
// bytes) and issuing before computing measured slower (gpt-oss-20b, H100, BENCHMARKS.md session
// 19).
constexpr int kStreamStageBlocks = 8;                     // MXFP4 blocks (32 values) a stage
constexpr int kStreamRowBytes = kStreamStageBlocks * 16;  // 128 packed bytes of a row a stage
constexpr int kStreamRowStride = kStreamRowBytes + 16;    // padded: rows g fall in distinct banks
constexpr int kStreamStageBytes = 16 * kStreamRowStride;
constexpr int kStreamMaxK = 8192;  // x (hi, lo) and scales in shared memory

// Shared memory of one block for k: per warp the ring and its rows' scales; x's hi and lo.
constexpr int64_t stream_gemv_smem(int64_t k) {
  return kStreamWarps * (kStreamStages * kStreamStageBytes + 16 * (k / 32)) + (2 * k + 32) * 2;
}

// The tensor-core GEMVs' results of mma rows gr and gr + 8 (sums acc_lo, acc_hi), from the lane
// holding them: gate_up's activation of output out0 + gr as hi and lo bf16 into out_split, down's
// two outputs with their bias into out.
template <bool kGateUp>
__device__ __forceinline__ void store_mma_gemv_rows(const Mxfp4Gemv& g, int32_t e, int out0, int gr,
                                                    float acc_lo, float acc_hi, float* out,
                                                    __nv_bfloat16* out_split) {
  if (kGateUp) {
    const int col = out0 + gr;
    if (col < g.n) {
      const float a = g.params.activate(e, col, g.n, acc_lo, acc_hi);
      const __nv_bfloat16 hi = __float2bfloat16_rn(a);
      out_split[col] = hi;
      out_split[g.n + col] = __float2bfloat16_rn(a - __bfloat162float(hi));
    }
  } else {
    if (out0 + gr < g.n) out[out0 + gr] = acc_lo + g.params.down_bias_of(e, out0 + gr, g.n);
    if (out0 + gr + 8 < g.n)
      out[out0 + gr + 8] = acc_hi + g.params.down_bias_of(e, out0 + gr + 8, g.n);
  }
}

// grid (ceil(rows / (16 * kStreamWarps)), pairs), kStreamThreads threads, stream_gemv_smem(k)
// bytes: rows = 2n (gate_up) or n (down) of pair blockIdx.y's expert. Reads x_split (hi, lo);
// gate_up writes the activations to out_split (hi, lo), down writes y (out) as
// mxfp4_gemv_kernel does (zeros for a pair never routed).
template <bool kGateUp>
__global__ void __launch_bounds__(kStreamThreads)
    mxfp4_stream_gemv_kernel(const __grid_constant__ Mxfp4Gemv g) {
  extern __shared__ __align__(16) uint8_t smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int pair = blockIdx.y;
  const int k = g.k, kb = k / 32;
  const int rows = kGateUp ? 2 * g.n : g.n;
  const int row0 = (static_cast<int>(blockIdx.x) * kStreamWarps + warp) * 16;  // this warp's first row
  const int32_t e = g.ids[pair];
  float* out = g.out + static_cast<int64_t>(pair) * g.n;                  // down
  __nv_bfloat16* out_split = g.out_split + static_cast<int64_t>(pair) * 2 * g.n;  // gate_up
  const int out0 = kGateUp ? row0 / 2 : row0;  // first output column of this warp
  const int outs = kGateUp ? 8 : 16;
  if (static_cast<uint32_t>(e) >= static_cast<uint32_t>(g.experts)) {  // whole block: one pair
    if (lane < outs && out0 + lane < g.n) {
      if (kGateUp) out_split[out0 + lane] = out_split[g.n + out0 + lane] = __float2bfloat16_rn(0.0f);
      else out[out0 + lane] = 0.0f;
    }
    return;
  }
  uint8_t* ring = smem + warp * kStreamStages * kStreamStageBytes;
  uint8_t* scales = smem + kStreamWarps * kStreamStages * kStreamStageBytes + warp * 16 * kb;
  __nv_bfloat16* x_hi =
      reinterpret_cast<__nv_bfloat16*>(smem + kStreamWarps * (kStreamStages * kStreamStageBytes + 16 * kb));
  __nv_bfloat16* x_lo = x_hi + k + 32;  // 64 bytes on: lanes reading hi and lo hit other banks

  // mma row r's weight row.
  auto row_of = [&](int r) { return kGateUp ? row0 + 2 * (r & 7) + (r >> 3) : row0 + r; };
  const uint8_t* expert_blocks = g.blocks + static_cast<int64_t>(e) * rows * (k / 2);
  const int stages = (kb + kStreamStageBlocks - 1) / kStreamStageBlocks;
  const bool live = row0 < rows;  // rows is a multiple of 16: a live warp's 16 rows all exist
  // Stage st: 16 rows x 8 chunks of 16 bytes, 4 a lane (8 lanes read one row's 128 bytes).
  auto issue = [&](int st) {
    if (live && st < stages) {
      uint8_t* buf = ring + (st % kStreamStages) * kStreamStageBytes;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int c = lane + 32 * j, r = c >> 3, col = c & 7;
        const int block = st * kStreamStageBlocks + col;
        const bool ok = block < kb;
        const uint8_t* src = ok ? expert_blocks + static_cast<int64_t>(row_of(r)) * (k / 2) + block * 16 : g.blocks;
        cp_async_16(smem_address(buf + r * kStreamRowStride + col * 16), src, ok);
      }
    }
    cp_async_commit();  // possibly empty: one group per stage keeps the wait count fixed
  };
  // Group 0 also brings this warp's scales: its 16 rows' are 16 * kb contiguous bytes (a multiple
  // of 16, at a multiple of 16 from the aligned tensor), kept in row order.
  if (live) {
    const uint8_t* src = g.scales + (static_cast<int64_t>(e) * rows + row0) * kb;
    for (int c = lane; c < kb; c += 32) cp_async_16(smem_address(scales + c * 16), src + c * 16, true);
  }
  // And the block's x, hi and lo (k / 8 chunks each).
  const __nv_bfloat16* xs = g.x_split + static_cast<int64_t>(kGateUp ? pair / g.top_k : pair) * 2 * k;
  for (int c = threadIdx.x; c < k / 4; c += kStreamThreads) {
    const int half = c >= k / 8, at = (c - half * (k / 8)) * 8;
    cp_async_16(smem_address((half ? x_lo : x_hi) + at), xs + half * k + at, true);
  }
#pragma unroll
  for (int st = 0; st < kStreamStages - 1; ++st) issue(st);

  cp_async_wait<kStreamStages - 2>();  // group 0: x, scales, stage 0
  __syncthreads();                     // x came in by every thread's copies

  const int q = lane & 3, gr = lane >> 2;  // gr: the A rows gr, gr + 8 and B's column
  // Scales of mma rows gr and gr + 8 (row order in shared memory: gate_up's row 2c is mma row c).
  const uint8_t* scale_lo = scales + (kGateUp ? 2 * gr : gr) * kb;
  const uint8_t* scale_hi = scales + (kGateUp ? 2 * gr + 1 : gr + 8) * kb;
  float acc_lo = 0.0f, acc_hi = 0.0f;  // rows gr and gr + 8 (columns 0 + 1 summed)
  for (int st = 0; st < stages; ++st) {
    cp_async_wait<kStreamStages - 2>();
    __syncwarp();
    const uint8_t* buf = ring + (st % kStreamStages) * kStreamStageBytes;
    // Unrolled: the blocks' loads, decodes and mma pairs are independent until the sums, which
    // stay in block order.
    float part_lo[kStreamStageBlocks], part_hi[kStreamStageBlocks];
#pragma unroll
    for (int b = 0; b < kStreamStageBlocks; ++b) {
      const int block = st * kStreamStageBlocks + b;
      const uint4 w_lo = mxfp4_unscaled_bf16x8(
          *reinterpret_cast<const uint32_t*>(buf + gr * kStreamRowStride + b * 16 + q * 4));
      const uint4 w_hi = mxfp4_unscaled_bf16x8(
          *reinterpret_cast<const uint32_t*>(buf + (gr + 8) * kStreamRowStride + b * 16 + q * 4));
      uint4 xv = make_uint4(0, 0, 0, 0);
      if (gr < 2 && block < kb)
        xv = *reinterpret_cast<const uint4*>((gr ? x_lo : x_hi) + block * 32 + q * 8);
      float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      const uint32_t a0[4] = {w_lo.x, w_hi.x, w_lo.y, w_hi.y},
                     a1[4] = {w_lo.z, w_hi.z, w_lo.w, w_hi.w};
      const uint32_t b0[2] = {xv.x, xv.y}, b1[2] = {xv.z, xv.w};
      mma_bf16(d, a0, b0);
      mma_bf16(d, a1, b1);
      const bool in = block < kb;
      part_lo[b] = in ? (d[0] + d[1]) * e8m0_scale(scale_lo[block]) : 0.0f;
      part_hi[b] = in ? (d[2] + d[3]) * e8m0_scale(scale_hi[block]) : 0.0f;
    }
#pragma unroll
    for (int b = 0; b < kStreamStageBlocks; ++b) {
      acc_lo += part_lo[b];
      acc_hi += part_hi[b];
    }
    __syncwarp();  // every lane is done with this buffer before it is refilled
    issue(st + kStreamStages - 1);
  }
  cp_async_wait<0>();
  if (q != 0) return;  // lanes q = 0 hold columns 0 and 1 of rows gr, gr + 8
  store_mma_gemv_rows<kGateUp>(g, e, out0, gr, acc_lo, acc_hi, out, out_split);
}

// ---- Few-token MXFP4 experts on tensor cores, loads straight to registers (the default) ----
//
// Each warp owns 16 weight rows of one pair's expert; lane (g, q) loads the whole 16-byte MXFP4
// block 4s + q of its rows g and g + 8 (row_of) for steps s = 0, 1, ..., kRegDepth steps ahead in
// registers, so one warp load reads 64 contiguous bytes of each of 16 rows. The weights become f16
// by bit placement alone (mxfp4_f16x8_times_2m14: the e2m1 values times 2^-14, ~1.75 instructions
// a weight; the byte-table bf16 decode this kernel first had cost 4.75 a weight in all, and the
// warp GEMV, issue-bound, 6.5: ncu, BENCHMARKS.md session 31). One step's 8 mma (k 16 each: lane
// q's words in its k slots 2q, 2q+1, 2q+8, 2q+9) mix four lanes' different blocks, so B keeps them
// apart: column 2q holds x's hi of lane q's block in lane q's k slots, column 2q + 1 its lo, every
// other entry zero. Then C[row][2q] + C[row][2q + 1] is block 4s + q of that row dotted with x:
// exactly what lane (g, q) holds in c0 + c1 (row g) and c2 + c3 (row g + 8), scaled by the block's
// 2^(s - 127) (it loaded those scales) and added to its row sums in block order. The four lanes'
// sums (blocks = q mod 4) are added at the end, then scaled back (reg_gemv_split_x). x (hi, lo)
// comes from shared memory; the 8 lanes with nonzero B read it.
constexpr int kRegWarps = 4;
constexpr int kRegThreads = kRegWarps * 32;
constexpr int kRegDepth = 4;  // steps (two 16-byte blocks a lane) in flight

// x's hi and lo halves (f16), k + 32 apart (other banks).
constexpr int64_t reg_gemv_smem(int64_t k) { return (2 * k + 32) * 2; }

// The exponent e of the largest |x| of x[0:k] (f32, 16-byte aligned, k a multiple of 4): m =
// f 2^e, f in [0.5, 1); 0 when every x is 0 or m is not finite. Every thread of the block calls it.
template <int kThreads>
__device__ __forceinline__ int row_max_exponent(const float4* __restrict__ x4, int k) {
  constexpr int kWarps = kThreads / 32;
  __shared__ float s_max[kWarps];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float m = 0.0f;
  for (int i = threadIdx.x; i < k / 4; i += kThreads) {
    const float4 v = x4[i];
    m = fmaxf(m, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
  if (lane == 0) s_max[warp] = m;
  __syncthreads();
  m = s_max[0];
#pragma unroll
  for (int w = 1; w < kWarps; ++w) m = fmaxf(m, s_max[w]);
  int e = 0;
  if (m > 0.0f && m <= FLT_MAX) frexpf(m, &e);
  return e;
}

// 2^(15 - e) as two factors, each a normal float (|15 - e| < 275), so that x * f.x * f.y is exact:
// what puts a row whose largest |x| has exponent e (row_max_exponent) in [2^14, 2^15).
__device__ __forceinline__ float2 f16_range_factors(int e) {
  return make_float2(ldexpf(1.0f, (15 - e) / 2), ldexpf(1.0f, 15 - e - (15 - e) / 2));
}

// The block's x, split in the block itself: x 2^a = hi + lo (f16 each, ~22 bits), a putting the
// row's largest |x| in [2^14, 2^15), stored in the decode's pair order (word i: elements i and
// i + 4 of each 8); the row sums are scaled back by 2^(14 - a) (the decode's 2^-14 too). So no
// split kernel runs before the GEMV: gate_up reads the f32 hidden and writes f32 activations, down
// reads those. Leaves that factor in *back (shared; the __syncthreads after the split publishes
// it, and keeps it out of the main loop's registers). x: k f32 (16-byte aligned, k a multiple of
// 8).
__device__ __forceinline__ void reg_gemv_split_x(const float* __restrict__ x, int k, uint8_t* smem,
                                                 float* back) {
  const float4* x4 = reinterpret_cast<const float4*>(x);
  const int e = row_max_exponent<kRegThreads>(x4, k);
  const float2 up = f16_range_factors(e);
  const float up0 = up.x, up1 = up.y;
  __half* x_hi = reinterpret_cast<__half*>(smem);
  __half* x_lo = x_hi + k + 32;
  for (int g = threadIdx.x; g < k / 8; g += kRegThreads) {  // 8 values, two 16-byte stores each
    const float4 a = x4[2 * g], b = x4[2 * g + 1];
    const float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
    uint32_t hi[4], lo[4];  // word i: elements i and i + 4
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float s0 = v[i] * up0 * up1, s1 = v[i + 4] * up0 * up1;
      const __half2 h = __floats2half2_rn(s0, s1);
      const float2 hf = __half22float2(h);
      const __half2 l = __floats2half2_rn(s0 - hf.x, s1 - hf.y);
      hi[i] = *reinterpret_cast<const uint32_t*>(&h);
      lo[i] = *reinterpret_cast<const uint32_t*>(&l);
    }
    *reinterpret_cast<uint4*>(x_hi + 8 * g) = make_uint4(hi[0], hi[1], hi[2], hi[3]);
    *reinterpret_cast<uint4*>(x_lo + 8 * g) = make_uint4(lo[0], lo[1], lo[2], lo[3]);
  }
  if (threadIdx.x == 0) *back = ldexpf(1.0f, e - 1);  // 2^14 times 2^-(15 - e)
}

// grid (ceil(rows / (16 * kRegWarps)), pairs), kRegThreads threads, reg_gemv_smem(k) bytes; the
// warp GEMV's arguments and results (x in; gate_up out as f32 activations, down out). kSplit (down
// only; SY_GEMV_SPLIT, experiment): grid.z parts of k's steps, part z writing its sums to
// out + z * pairs * n, the expert's bias in part 0 only (combine_kernel adds the parts).
// kDepth: steps in flight (SY_GEMV_DEPTH=8, experiment: twice the bytes in flight a warp, three
// blocks an SM for the registers).
template <bool kGateUp, bool kSplit = false, int kDepth = kRegDepth>
__global__ void __launch_bounds__(kRegThreads, kDepth > kRegDepth ? 3 : 4)
    mxfp4_reg_gemv_kernel(const __grid_constant__ Mxfp4Gemv g) {
  static_assert(!(kGateUp && kSplit), "gate_up's activation needs the whole sum");
  extern __shared__ __align__(16) uint8_t smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int pair = blockIdx.y;
  const int k = g.k, kb = k / 32;
  const int rows = kGateUp ? 2 * g.n : g.n;
  const int row0 = (static_cast<int>(blockIdx.x) * kRegWarps + warp) * 16;
  const int part = kSplit ? static_cast<int>(blockIdx.z) : 0;
  float* out = g.out + (static_cast<int64_t>(part) * gridDim.y + pair) * g.n;
  const int out0 = kGateUp ? row0 / 2 : row0;
  const int outs = kGateUp ? 8 : 16;
  // Launched overlapped. gate_up follows the router, so it waits before reading the ids. down's
  // ids come from the router two kernels back, complete once it may start, so its first kDepth
  // steps of weights are requested before the wait; x (gate_up's activations) only after it. (In
  // the PTX they are; ptxas 13 schedules the wait, ACQBULK, above them, tools/sass.sh showed for
  // the bf16 kernel, so only the launch itself may overlap.)
  if (kGateUp) overlap_prologue();
  const int32_t e = g.ids[pair];
  if (static_cast<uint32_t>(e) >= static_cast<uint32_t>(g.experts)) {  // whole block: one pair
    overlap_prologue();
    if (lane < outs && out0 + lane < g.n) out[out0 + lane] = 0.0f;
    return;
  }
  const bool live = row0 < rows;  // rows is a multiple of 16: a live warp's 16 rows all exist
  const int q = lane & 3, gr = lane >> 2;
  auto row_of = [&](int r) { return kGateUp ? row0 + 2 * (r & 7) + (r >> 3) : row0 + r; };
  const int64_t expert_row = static_cast<int64_t>(e) * rows;
  const int row_lo = live ? row_of(gr) : 0, row_hi = live ? row_of(gr + 8) : 0;
  const uint8_t* blocks_lo = g.blocks + (expert_row + row_lo) * (k / 2);
  const uint8_t* blocks_hi = g.blocks + (expert_row + row_hi) * (k / 2);
  const uint8_t* scales_lo = g.scales + (expert_row + row_lo) * kb;
  const uint8_t* scales_hi = g.scales + (expert_row + row_hi) * kb;
  // This part's steps [s_begin, s_end) and blocks below kb_end (all of them unless kSplit).
  const int all_steps = (kb + 3) / 4;
  const int part_steps = kSplit ? (all_steps + gridDim.z - 1) / gridDim.z : all_steps;
  const int s_begin = part * part_steps;
  const int s_end = kSplit ? min(all_steps, s_begin + part_steps) : all_steps;
  const int kb_end = kSplit ? min(kb, 4 * s_end) : kb;

  uint4 w_lo[kDepth], w_hi[kDepth];
  uint32_t s_lo[kDepth], s_hi[kDepth];
  // Unconditional loads (a block past the last reads the last block again; its B is zero and
  // e2m1 values are finite, so it adds 0): no predicated loads into zeroed registers.
  auto load = [&](int slot, int step) {  // (past the part: its last block again, cached)
    const int block = min(4 * step + q, kb_end - 1);
    w_lo[slot] = __ldg(reinterpret_cast<const uint4*>(blocks_lo + block * 16));
    w_hi[slot] = __ldg(reinterpret_cast<const uint4*>(blocks_hi + block * 16));
    s_lo[slot] = __ldg(scales_lo + block);
    s_hi[slot] = __ldg(scales_hi + block);
  };
#pragma unroll
  for (int slot = 0; slot < kDepth; ++slot)
    load(slot, s_begin + slot);  // (a dead warp: expert row 0)
  overlap_prologue();

  // x's hi and lo (f16 bits), k + 32 apart.
  const uint16_t* x_hi = reinterpret_cast<const uint16_t*>(smem);
  const uint16_t* x_lo = x_hi + k + 32;
  __shared__ float x_back;  // the factor the row sums take back
  reg_gemv_split_x(g.x + (kGateUp ? pair / g.top_k : pair) * static_cast<int64_t>(k), k, smem,
                   &x_back);
  __syncthreads();
  if (!live) return;
  // B: lanes (2q, q) and (2q + 1, q) carry x's hi and lo of lane q's block; the rest zeros.
  const bool b_lane = (gr >> 1) == q;
  const uint16_t* x_b = (gr & 1) ? x_lo : x_hi;

  float acc_lo = 0.0f, acc_hi = 0.0f;  // rows gr and gr + 8, blocks = q mod 4
  // Each slot is decoded before its refill is issued, so the refill lands in the registers just
  // freed (issued first, it needed a second set and a move at the loop's end that waited for the
  // load: ncu, H100, 2026-12-07). Steps past the last (at most kDepth - 1) load nothing and add
  // 0.
  for (int s0 = s_begin; s0 < s_end; s0 += kDepth) {
#pragma unroll
    for (int slot = 0; slot < kDepth; ++slot) {
      const int step = s0 + slot;
      uint32_t a[4][2][4];  // word, mma step, A registers
      const uint32_t lo_words[4] = {w_lo[slot].x, w_lo[slot].y, w_lo[slot].z, w_lo[slot].w},
                     hi_words[4] = {w_hi[slot].x, w_hi[slot].y, w_hi[slot].z, w_hi[slot].w};
#pragma unroll
      for (int word = 0; word < 4;
           ++word) {  // values 8 word .. 8 word + 7: mma steps 2 word, 2 word + 1
        const uint4 a_lo = mxfp4_f16x8_times_2m14(lo_words[word]);
        const uint4 a_hi = mxfp4_f16x8_times_2m14(hi_words[word]);
        a[word][0][0] = a_lo.x, a[word][0][1] = a_hi.x, a[word][0][2] = a_lo.y,
        a[word][0][3] = a_hi.y;
        a[word][1][0] = a_lo.z, a[word][1][1] = a_hi.z, a[word][1][2] = a_lo.w,
        a[word][1][3] = a_hi.w;
      }
      const float scale_lo = e8m0_scale(static_cast<uint8_t>(s_lo[slot]));
      const float scale_hi = e8m0_scale(static_cast<uint8_t>(s_hi[slot]));
      load(slot, step + kDepth);
      const int block = 4 * step + q;
      uint4 xb[4] = {};
      if (b_lane && block < kb_end) {
#pragma unroll
        for (int i = 0; i < 4; ++i)
          xb[i] = *reinterpret_cast<const uint4*>(x_b + block * 32 + 8 * i);
      }
      const uint32_t* xw = reinterpret_cast<const uint32_t*>(xb);  // word i: x values 2i, 2i + 1
      float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int word = 0; word < 4; ++word) {
        const uint32_t b0[2] = {xw[4 * word], xw[4 * word + 1]},
                       b1[2] = {xw[4 * word + 2], xw[4 * word + 3]};
        mma_f16(d, a[word][0], b0[0], b0[1]);
        mma_f16(d, a[word][1], b1[0], b1[1]);
      }
      acc_lo += (d[0] + d[1]) * scale_lo;
      acc_hi += (d[2] + d[3]) * scale_hi;
    }
  }
  acc_lo += __shfl_xor_sync(0xffffffffu, acc_lo, 1);
  acc_hi += __shfl_xor_sync(0xffffffffu, acc_hi, 1);
  acc_lo += __shfl_xor_sync(0xffffffffu, acc_lo, 2);
  acc_hi += __shfl_xor_sync(0xffffffffu, acc_hi, 2);
  if (q != 0) return;
  acc_lo *= x_back;  // (a power of two: exact unless the sum leaves float's range)
  acc_hi *= x_back;
  if (kGateUp) {
    if (out0 + gr < g.n) out[out0 + gr] = g.params.activate(e, out0 + gr, g.n, acc_lo, acc_hi);
    return;
  }
  if (part > 0) {  // (kSplit) the bias is part 0's
    if (out0 + gr < g.n) out[out0 + gr] = acc_lo;
    if (out0 + gr + 8 < g.n) out[out0 + gr + 8] = acc_hi;
    return;
  }
  store_mma_gemv_rows<false>(g, e, out0, gr, acc_lo, acc_hi, out, nullptr);
}

// ---- Small MXFP4 steps on tensor cores, weights decoded in registers (the default) ----
//
// The grouped GEMM's small tile spends ~0.28 warp instructions a weight (decode to bf16 in shared
// memory: byte permutes, a scale multiply, a store, then ldmatrix), so gpt-oss's batch-64 step is
// bound by issue, not by its weight bytes (15.1 ms against a 4.7 ms floor on an H100, session 32).
// Here the weights are the mma's A operand straight from registers, as in the register GEMV, and
// the tokens its B: a warp owns 16 weight rows of one M tile's expert and all kRegGemmTokens of its
// pairs (two n8 fragments). Lane (g, q) loads word q (values 8q .. 8q + 7) of each 32-value block
// of its rows g and g + 8 (row_of) and decodes it by bit placement (mxfp4_f16x8_times_2m14, the
// values times 2^-14); its word pairs (i, i + 4) fill its k slots 2q, 2q + 1 (then 2q + 8, 2q + 9)
// of the block's two k16 steps, so the B operand holds each token's x in that same order (x16: the
// decode's pair order within every 8 values, 16 bytes a lane a block). A block's two mma start
// from zero and the result is scaled by the row's 2^(s - 127) into the accumulators (the four lanes
// of a row all work on the same block). 63 SASS instructions a block of 16 rows x 32 values in the
// main loop (sm_90a). H100, 2026-12-07, two rounds against the grouped GEMM: gpt-oss-20b decode
// batch 16 7.39/7.40 against 12.55/12.56 ms, batch 64 9.72/9.74 against 15.09/15.12, batch 128
// 13.08/13.14 against 17.03/17.02 (BENCHMARKS.md session 33). Its arithmetic is not the grouped
// GEMM's, so the batch-invariant backend leaves it out.
// gate_up's B: x in f16, each token's row scaled by a power of two putting its largest |x| in
// [2^14, 2^15) (mxfp4_x16_kernel; its back factor in x_back). down's B: gate_up's activations in
// f16, unscaled (gpt-oss's clamped SwiGLU bounds them by (limit + 1) limit: the host checks it).
constexpr int kRegGemmWarps = 4;
constexpr int kRegGemmThreads = kRegGemmWarps * 32;
constexpr int kRegGemmTokens = 16;  // an M tile: two n8 fragments of pairs (or kRegGemmWide)
constexpr int kRegGemmWide = 32;    // four, for steps of more than kRegGemmNarrowMax pairs an expert
constexpr int kRegGemmNarrowMax = 24;

struct Mxfp4RegGemm {
  const uint8_t* blocks = nullptr;  // [E, rows, k/32, 16]
  const uint8_t* scales = nullptr;  // [E, rows, k/32]
  const __half* x = nullptr;        // gate_up: x16 [T, k]; down: act16 [padded rows, k]
  const float* x_back = nullptr;    // gate_up: [T] (x16's back factors, 2^14 included)
  __half* act = nullptr;            // gate_up out: act16 [padded rows, n], the x16 order
  float* y = nullptr;               // down out: [T*K, n], row = pair
  const int32_t* perm = nullptr;    // [padded rows]: pair, -1 padding
  const int32_t* tile_expert = nullptr;
  const int32_t* tile_count = nullptr;
  int top_k = 0, k = 0, n = 0;  // k: H or I; n: output columns I or H
  ExpertParams params;
};

// Where element i of a row sits in the x16 order (within each 8: 0, 4, 1, 5, 2, 6, 3, 7).
__device__ __forceinline__ int x16_slot(int i) {
  return (i & ~7) | ((i & 3) << 1) | ((i >> 2) & 1);
}

// grid T, kRegGemmThreads: x [T, k] f32 -> x16 [T, k] (x16_slot order), x 2^a rounded to f16 with
// a putting the row's largest |x| in [2^14, 2^15); back[t] = 2^(14 - a) (the decode's 2^-14 too).
__global__ void __launch_bounds__(kRegGemmThreads)
    mxfp4_x16_kernel(const float* __restrict__ x, int k, __half* __restrict__ x16,
                     float* __restrict__ back) {
  const float4* x4 = reinterpret_cast<const float4*>(x + static_cast<int64_t>(blockIdx.x) * k);
  const int e = row_max_exponent<kRegGemmThreads>(x4, k);
  const float2 up = f16_range_factors(e);
  const float up0 = up.x, up1 = up.y;
  uint4* out = reinterpret_cast<uint4*>(x16 + static_cast<int64_t>(blockIdx.x) * k);
  for (int g = threadIdx.x; g < k / 8; g += kRegGemmThreads) {
    const float4 a = x4[2 * g], b = x4[2 * g + 1];
    const float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
    uint32_t words[4];  // word i: elements i and i + 4
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const __half2 h = __floats2half2_rn(v[i] * up0 * up1, v[i + 4] * up0 * up1);
      words[i] = *reinterpret_cast<const uint32_t*>(&h);
    }
    out[g] = make_uint4(words[0], words[1], words[2], words[3]);
  }
  if (threadIdx.x == 0) back[blockIdx.x] = ldexpf(1.0f, e - 1);  // 2^14 times 2^-(15 - e)
}

// grid (rows / (16 kRegGemmWarps), M-tile bound of kTokens), kRegGemmThreads. kGateUp:
// gpt-oss's interleaved rows (a warp's rows g and g + 8: the gate and up of output column
// row0 / 2 + g), the activation and bias as the grouped GEMM's epilogue, into act (f16, x16
// order); else hidden rows, the down bias added, into y.
template <bool kGateUp, int kTokens>
__global__ void __launch_bounds__(kRegGemmThreads, 3)
    mxfp4_reg_gemm_kernel(const __grid_constant__ Mxfp4RegGemm g) {
  // Weight blocks in flight a lane: 8 of two fragments, 6 of four (the wide tile's registers); x
  // blocks (dividing that): 4 of two, 2 of four.
  constexpr int kRegGemmFrags = kTokens / 8;
  constexpr int kRegGemmDepth = kTokens <= 16 ? 8 : 6, kRegGemmXDepth = kTokens <= 16 ? 4 : 2;
  const int m_tile = blockIdx.y;
  if (m_tile >= *g.tile_count) return;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int rows = kGateUp ? 2 * g.n : g.n;  // a multiple of 16 (the host checks)
  const int row0 = (static_cast<int>(blockIdx.x) * kRegGemmWarps + warp) * 16;
  if (row0 >= rows) return;
  const int e = g.tile_expert[m_tile];
  const int64_t row_base = static_cast<int64_t>(m_tile) * kTokens;
  const int q = lane & 3, gr = lane >> 2;
  const int k = g.k, kb = k / 32;
  auto row_of = [&](int r) { return kGateUp ? row0 + 2 * (r & 7) + (r >> 3) : row0 + r; };
  const int64_t expert_row = static_cast<int64_t>(e) * rows;
  const uint32_t* words_lo =
      reinterpret_cast<const uint32_t*>(g.blocks + (expert_row + row_of(gr)) * (k / 2)) + q;
  const uint32_t* words_hi =
      reinterpret_cast<const uint32_t*>(g.blocks + (expert_row + row_of(gr + 8)) * (k / 2)) + q;
  const uint8_t* scales_lo = g.scales + (expert_row + row_of(gr)) * kb;
  const uint8_t* scales_hi = g.scales + (expert_row + row_of(gr + 8)) * kb;
  // B: token gr of each fragment (a padding pair reads a real row; its column is never stored).
  const uint4* x_rows[kRegGemmFrags];
#pragma unroll
  for (int f = 0; f < kRegGemmFrags; ++f) {
    const int32_t pair = g.perm[row_base + f * 8 + gr];
    const int64_t x_row = kGateUp ? (pair >= 0 ? pair / g.top_k : 0) : row_base + f * 8 + gr;
    x_rows[f] = reinterpret_cast<const uint4*>(g.x + x_row * k) + q;
  }

  // Loads at immediate offsets from pointers that advance a round (kRegGemmDepth blocks) at a time;
  // blocks past the last are not loaded (their slots are never used).
  uint32_t w_lo[kRegGemmDepth] = {}, w_hi[kRegGemmDepth] = {};
  uint32_t s_lo[kRegGemmDepth] = {}, s_hi[kRegGemmDepth] = {};
  uint4 xv[kRegGemmXDepth][kRegGemmFrags] = {};
  auto load_w = [&](int slot, int at) {  // block (pointers' block) + at into slot
    w_lo[slot] = __ldg(words_lo + 4 * at);
    w_hi[slot] = __ldg(words_hi + 4 * at);
    s_lo[slot] = __ldg(scales_lo + at);
    s_hi[slot] = __ldg(scales_hi + at);
  };
  auto load_x = [&](int slot, int at) {
#pragma unroll
    for (int f = 0; f < kRegGemmFrags; ++f) xv[slot][f] = __ldg(x_rows[f] + 4 * at);
  };
#pragma unroll
  for (int slot = 0; slot < kRegGemmDepth; ++slot)
    if (slot < kb) load_w(slot, slot);
#pragma unroll
  for (int slot = 0; slot < kRegGemmXDepth; ++slot)
    if (slot < kb) load_x(slot, slot);

  float acc[kRegGemmFrags][4] = {};
  // One round: kRegGemmDepth blocks from b0. kGuard: the round may pass the last block, or its
  // refills may (the last two rounds); else no checks.
  auto round = [&](int b0, auto guard) {
    constexpr bool kGuard = decltype(guard)::value;
    // From here words_* and scales_* point kRegGemmDepth blocks past b0; x_rows at b0.
    words_lo += 4 * kRegGemmDepth, words_hi += 4 * kRegGemmDepth;
    scales_lo += kRegGemmDepth, scales_hi += kRegGemmDepth;
#pragma unroll
    for (int slot = 0; slot < kRegGemmDepth; ++slot) {
      const int block = b0 + slot;
      if (kGuard && block >= kb) break;  // (uniform: the last round's slots past the end)
      const uint4 a_lo = mxfp4_f16x8_times_2m14(w_lo[slot]);
      const uint4 a_hi = mxfp4_f16x8_times_2m14(w_hi[slot]);
      const float scale_lo = e8m0_scale(static_cast<uint8_t>(s_lo[slot]));
      const float scale_hi = e8m0_scale(static_cast<uint8_t>(s_hi[slot]));
      if (!kGuard || block + kRegGemmDepth < kb) load_w(slot, slot);
      const uint32_t a0[4] = {a_lo.x, a_hi.x, a_lo.y, a_hi.y};
      const uint32_t a1[4] = {a_lo.z, a_hi.z, a_lo.w, a_hi.w};
      const int x_slot = slot % kRegGemmXDepth;
#pragma unroll
      for (int f = 0; f < kRegGemmFrags; ++f) {
        const uint4 b = xv[x_slot][f];
        float d[4];
        mma_f16_from_zero(d, a0, b.x, b.y);
        mma_f16(d, a1, b.z, b.w);
        acc[f][0] = fmaf(d[0], scale_lo, acc[f][0]);
        acc[f][1] = fmaf(d[1], scale_lo, acc[f][1]);
        acc[f][2] = fmaf(d[2], scale_hi, acc[f][2]);
        acc[f][3] = fmaf(d[3], scale_hi, acc[f][3]);
      }
      if (!kGuard || block + kRegGemmXDepth < kb) load_x(x_slot, slot + kRegGemmXDepth);
    }
#pragma unroll
    for (int f = 0; f < kRegGemmFrags; ++f) x_rows[f] += 4 * kRegGemmDepth;
  };
  int b0 = 0;
  for (; b0 + 2 * kRegGemmDepth <= kb; b0 += kRegGemmDepth) round(b0, std::false_type{});
  for (; b0 < kb; b0 += kRegGemmDepth) round(b0, std::true_type{});

    // Epilogue: lane (gr, q) holds, for fragment f, rows gr (c0, c1) and gr + 8 (c2, c3) of tokens
    // f * 8 + 2q and f * 8 + 2q + 1.
#pragma unroll
  for (int f = 0; f < kRegGemmFrags; ++f) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int t = f * 8 + 2 * q + h;
      const int32_t pair = g.perm[row_base + t];
      if (pair < 0) continue;
      if constexpr (kGateUp) {
        const float back = g.x_back[pair / g.top_k];
        const int col = row0 / 2 + gr;
        const float a = g.params.activate(e, col, g.n, acc[f][h] * back, acc[f][2 + h] * back);
        g.act[(row_base + t) * g.n + x16_slot(col)] = __float2half_rn(a);
      } else {
        constexpr float kBack = 16384.0f;  // the decode's 2^-14 (act is unscaled)
        float* y = g.y + static_cast<int64_t>(pair) * g.n;
        y[row0 + gr] = acc[f][h] * kBack + g.params.down_bias_of(e, row0 + gr, g.n);
        y[row0 + gr + 8] = acc[f][2 + h] * kBack + g.params.down_bias_of(e, row0 + gr + 8, g.n);
      }
    }
  }
}

// ---- Combine ----

constexpr int kCombineThreads = 128;

// grid (ceil(H / 4 / 128), T): out[t] = sum over k = 0..K-1, in order, of weight[t, k] * y[t*K +
// k]; with a residual update (ResidualAdd) that too. Bytes: T*K*H*4 read + T*H*4 written.
// kParts: y in parts (the split down GEMV's), part p at y + p * part_stride, summed in order first.
template <bool kResidual, bool kParts = false>
__global__ void __launch_bounds__(kCombineThreads)
    combine_kernel(const float* __restrict__ y, const float* __restrict__ weights, int top_k,
                   int hidden, float* out, const ResidualAdd residual, int parts = 1,
                   int64_t part_stride = 0) {
  overlap_prologue();  // (launched overlapped)
  const int64_t t = blockIdx.y;
  const int h = (blockIdx.x * kCombineThreads + threadIdx.x) * 4;
  if (h >= hidden) return;
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  for (int k = 0; k < top_k; ++k) {
    const float w = weights[t * top_k + k];
    float4 v = *reinterpret_cast<const float4*>(y + (t * top_k + k) * hidden + h);
    if constexpr (kParts)
      for (int p = 1; p < parts; ++p) {
        const float4 u =
            *reinterpret_cast<const float4*>(y + p * part_stride + (t * top_k + k) * hidden + h);
        v = make_float4(v.x + u.x, v.y + u.y, v.z + u.z, v.w + u.w);
      }
    acc.x += w * v.x;
    acc.y += w * v.y;
    acc.z += w * v.z;
    acc.w += w * v.w;
  }
  const int64_t i = t * hidden + h;
  float x[4] = {};
  if constexpr (kResidual)
    for (int c = 0; c < 4; ++c) x[c] = residual.before(i + c);
  *reinterpret_cast<float4*>(out + i) = acc;
  if constexpr (kResidual)
    *reinterpret_cast<float4*>(residual.residual + i) =
        make_float4(x[0] + acc.x, x[1] + acc.y, x[2] + acc.z, x[3] + acc.w);
}

// ---- Dense GEMM (--batch-invariant) ----

// The plan of one expert over `rows`: perm = identity (-1 past rows, to the last tile's end),
// every tile on expert 0, and the tile count. Plan layout: [count | tile experts | perm].
__global__ void dense_plan_kernel(int32_t* plan, int64_t rows, int tile_m, int64_t max_tiles) {
  const int64_t tiles = (rows + tile_m - 1) / tile_m;
  int32_t* tile_expert = plan + 1;
  int32_t* perm = plan + 1 + max_tiles;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < tiles * tile_m;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    perm[i] = i < rows ? static_cast<int32_t>(i) : -1;
    if (i < tiles) tile_expert[i] = 0;
    if (i == 0) plan[0] = static_cast<int32_t>(tiles);
  }
}

template <class Cfg>
void dense_gemm(const __nv_bfloat16* x, int64_t rows, int64_t k, const __nv_bfloat16* w, int64_t n, float* out,
                int32_t* plan, int64_t max_tiles, cudaStream_t stream) {
  const int64_t tiles = ceil_div(rows, Cfg::kM);
  dense_plan_kernel<<<static_cast<unsigned>(std::min<int64_t>(ceil_div(tiles * Cfg::kM, 256), 1024)), 256, 0,
                      stream>>>(plan, rows, Cfg::kM, max_tiles);
  SY_CUDA_LAUNCH_CHECK("dense_plan_kernel");
  GroupedGemm gemm;
  gemm.a = x;
  gemm.w = w;
  gemm.k_dim = static_cast<int>(k);
  gemm.n_dim = static_cast<int>(n);
  gemm.top_k = 1;
  gemm.tile_count = plan;
  gemm.tile_expert = plan + 1;
  gemm.perm = plan + 1 + max_tiles;
  gemm.y = out;
  SY_CUDA_CHECK(cudaFuncSetAttribute(grouped_gemm_kernel<Cfg, false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(Cfg::kSmemBytes)));
  const dim3 grid(static_cast<unsigned>(ceil_div(n, Cfg::kN)), static_cast<unsigned>(tiles));
  grouped_gemm_kernel<Cfg, false><<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(gemm);
  SY_CUDA_LAUNCH_CHECK("grouped_gemm_kernel<dense>");
}

// ---- The kernel object ----

// The streamed MXFP4 GEMV above 48 KB of shared memory (k past ~5k, up to kStreamMaxK) needs the
// opt-in.
void allow_stream_shared_memory(int64_t max_k) {
  for (const void* kernel : {reinterpret_cast<const void*>(mxfp4_stream_gemv_kernel<true>),
                             reinterpret_cast<const void*>(mxfp4_stream_gemv_kernel<false>)})
    SY_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(stream_gemv_smem(max_k))));
}

// max_k: the largest k_dim an MXFP4 launch will have (its scales live in shared memory).
template <class Cfg, bool kWithMxfp4 = true>
void allow_shared_memory(int64_t max_k) {
  for (const void* kernel : {reinterpret_cast<const void*>(grouped_gemm_kernel<Cfg, true, false>),
                             reinterpret_cast<const void*>(grouped_gemm_kernel<Cfg, false, false>)})
    SY_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(Cfg::kSmemBytes)));
  if constexpr (kWithMxfp4)
    for (const void* kernel :
         {reinterpret_cast<const void*>(grouped_gemm_kernel<Cfg, true, true>),
          reinterpret_cast<const void*>(grouped_gemm_kernel<Cfg, false, true>)})
      SY_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(SmemPlan<Cfg, true>::bytes(max_k))));
}

class ModularKernel final : public moe::ExpertsKernel {
 public:
  explicit ModularKernel(CudaContext& context) : context_(context) {}
  ~ModularKernel() override { release(); }
  ModularKernel(const ModularKernel&) = delete;
  ModularKernel& operator=(const ModularKernel&) = delete;

  std::string_view name() const override { return "cuda-modular"; }
  Device device() const override { return Device::kCuda; }
  bool routes_inside() const override { return false; }
  bool captures_routes() const override { return true; }
  bool captures_weights() const override { return true; }
  // Stacked bf16 experts or gpt-oss's MXFP4 experts as stored, with SwiGLU or gpt-oss's clamped
  // SwiGLU, biases or not (ExpertParams); gpt-oss's bf16 transposed-interleaved layout is
  // restacked at load (ExpertSpec::stored).
  Status supports_experts(const moe::ExpertSpec& spec) const override {
    if (!ExpertParams::implements(spec) && !ExpertParams::implements_mxfp4(spec))
      return Status::error(ErrorCode::kUnsupported,
                           "MoE kernel cuda-modular reads stacked bf16 or MXFP4 experts (the loader restacks "
                           "gpt-oss's transposed bf16 layout)");
    return Status::ok();
  }
  // Every router option (moe_route.cuh), groups up to kMaxRouteGroups.
  Status supports(const moe::RouterSpec& spec) const override {
    if (!RouteParams::implements(spec))
      return Status::error(ErrorCode::kUnsupported,
                           fmt::format("MoE kernel cuda-modular: n_group must divide num_experts and be at most {}, got {}",
                                       kMaxRouteGroups, spec.num_groups));
    return Status::ok();
  }
  bool replays_routes() const override { return true; }
  // Every tile, the wgmma one included, sums a row's k in the same order with the same rounding
  // (the op harness checks it on every 256+ token step). MXFP4 experts only on the batch-invariant
  // backend (CudaContext::batch_invariant): else few-token steps take the GEMVs and small ones
  // the register GEMM, each with its own arithmetic.
  bool batch_invariant() const override { return true; }
  // One-token steps: the route kernel norms the row (NormRow: bitwise add_rms_norm's),
  // combine_kernel adds the residual.
  bool fuses_input_norm(int64_t tokens) const override {
    return hidden_ > 0 && route_fuses_norm(tokens, hidden_) && !no_norm_fusion_;
  }

  Status reserve(int64_t max_tokens, const moe::RouterSpec& spec, int64_t hidden,
                 int64_t intermediate) override {
    const int64_t experts = spec.num_experts, top_k = spec.top_k;
    if (experts < 1 || experts > kMaxRouteExperts)
      return Status::errorf("cuda-modular: num_experts must be in [1, {}], got {}",
                            kMaxRouteExperts, experts);
    if (top_k < 1 || top_k > std::min<int64_t>(kMaxRouteTopK, experts))
      return Status::errorf("cuda-modular: top_k must be in [1, {}], got {}",
                            std::min<int64_t>(kMaxRouteTopK, experts), top_k);
    // (moe_intermediate not a multiple of 8: forward_experts_simple.)
    if (hidden < 8 || hidden % 8 != 0 || intermediate < 1)
      return Status::error(
          ErrorCode::kUnsupported,
          fmt::format("cuda-modular: hidden must be a multiple of 8 and moe_intermediate positive, "
                      "got {} and {}",
                      hidden, intermediate));
    if (max_tokens < 1 || max_tokens > 65535)  // combine's grid.y
      return Status::errorf("cuda-modular: max_tokens must be in [1, 65535], got {}", max_tokens);
    const int64_t pairs = max_tokens * top_k;
    if (m_tiles_bound(pairs, experts, SmallTile::kM) > 65535 || hidden > (1 << 30) ||
        intermediate > (1 << 30))
      return Status::errorf("cuda-modular: a step of {} tokens x top_k {} is too large", max_tokens,
                            top_k);

    release();
    max_tokens_ = max_tokens;
    experts_ = experts;
    top_k_ = top_k;
    hidden_ = hidden;
    intermediate_ = intermediate;
    int64_t padded_rows = 0, tiles = 0;
    for (int64_t tile_m : {kRegGemmTokens, kRegGemmWide, SmallTile::kM, MediumTile::kM, LargeTile::kM}) {
      tiles = std::max(tiles, m_tiles_bound(pairs, experts, tile_m));
      padded_rows = std::max(padded_rows, m_tiles_bound(pairs, experts, tile_m) * tile_m);
    }
    const bool ok =
        allocate(&ids_, pairs * 4) && allocate(&weights_, pairs * 4) &&
        allocate(&route_sums_, route_sums_floats(max_tokens, experts, hidden) * 4) &&
        allocate(&x_bf16_, max_tokens * hidden * 2) && allocate(&perm_, padded_rows * 4) &&
        allocate(&tile_expert_, tiles * 4) && allocate(&tile_count_, 4) &&
        allocate(&x_normed_, hidden * 4) && allocate(&x_back_, max_tokens * 4) &&
        allocate(&act_, padded_rows * intermediate * 2) && allocate(&y_, pairs * hidden * 4) &&
        allocate(&act_f32_,
                 std::min<int64_t>(max_tokens, kGemvMaxTokens) * top_k * intermediate * 4) &&
        allocate(&x_split_, std::min<int64_t>(max_tokens, kGemvMaxTokens) * 2 * hidden * 2) &&
        allocate(&act_split_,
                 std::min<int64_t>(max_tokens, kGemvMaxTokens) * top_k * 2 * intermediate * 2);
    if (!ok) {
      release();
      return Status::error(
          ErrorCode::kResourceExhausted,
          fmt::format("cuda-modular: out of device memory for the scratch of {} tokens",
                      max_tokens));
    }
    const int64_t max_k = std::max(hidden, intermediate);
    prepare_route_kernels();
    allow_shared_memory<SmallTile>(max_k);
    allow_shared_memory<MediumTile>(max_k);
    allow_shared_memory<LargeTile>(max_k);
    allow_shared_memory<MediumK32Tile>(max_k);
    allow_shared_memory<LargeK32Tile>(max_k);
    int major = 0;
    wgmma_ = !env_off("SY_GEMM_WGMMA") &&
             cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, context_.device) ==
                 cudaSuccess &&
             major == 9;
    if (wgmma_) {
      for (const void* kernel :
           {reinterpret_cast<const void*>(grouped_gemm_wgmma_kernel<true, false>),
            reinterpret_cast<const void*>(grouped_gemm_wgmma_kernel<false, false>)})
        SY_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(WgPlan<false>::bytes(max_k))));
      for (const void* kernel :
           {reinterpret_cast<const void*>(grouped_gemm_wgmma_kernel<true, true>),
            reinterpret_cast<const void*>(grouped_gemm_wgmma_kernel<false, true>)})
        SY_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(WgPlan<true>::bytes(max_k))));
    }
    const int64_t stream_k = std::min<int64_t>(max_k, kStreamMaxK);
    allow_stream_shared_memory(stream_k);
    return Status::ok();
  }

  Status forward(const moe::MoeForwardArgs& args) override {
    SY_TRY(check(args));
    const int64_t tokens = args.hidden.dim(0);
    if (tokens == 0) return Status::ok();
    const moe::MoeLayerWeights& w = *args.weights;
    const int64_t pairs = tokens * top_k_;
    cudaStream_t stream = context_.stream;

    // Gate and Route: router logits, top-k, gating weights; ids into the sink, forced ids from the
    // source.
    const moe::RouteBuffers& routes = args.routes;
    const int64_t layers = routes.sink.data     ? routes.sink.dim(1)
                           : routes.source.data ? routes.source.dim(1)
                                                : 0;
    // The fused input norm (one token): the route kernel norms the row into x_normed_, the combine
    // updates the residual.
    const moe::MoeInputNorm& norm = args.input_norm;
    ResidualAdd residual;
    if (norm.residual) {
      if (!fuses_input_norm(tokens) || !norm.delta || !norm.weight)
        return Status::error(ErrorCode::kInternal,
                             "cuda-modular: input_norm given for a step it does not fuse");
      residual.residual = norm.residual->ptr<float>();
      residual.earlier_delta = norm.earlier_delta ? norm.earlier_delta->ptr<float>() : nullptr;
      residual.delta = norm.delta->ptr<float>();
    }
    const float* hidden = norm.residual ? x_normed_ : args.hidden.ptr<float>();
    RouteLaunch route;
    route.hidden = hidden;
    if (norm.residual) {
      route.residual = residual;
      route.norm_weight = norm.weight->ptr<float>();
      route.eps = norm.eps;
      route.normed = x_normed_;
    }
    route.tokens = tokens;
    route.router = w.router.ptr<__nv_bfloat16>();
    route.params = RouteParams::from(args.spec, hidden_, w);
    route.forced = routes.forced.data ? routes.forced.ptr<uint8_t>() : nullptr;
    route.source =
        routes.source.data ? routes.source.ptr<int32_t>() + args.layer * top_k_ : nullptr;
    route.sink = routes.sink.data ? routes.sink.ptr<int32_t>() + args.layer * top_k_ : nullptr;
    route.weight_sink = routes.weights.data && routes.sink.data ? routes.weights.ptr<float>() + args.layer * top_k_ : nullptr;
    route.route_row_stride = layers * top_k_;
    route.ids = ids_;
    route.weights = weights_;
    route.sums = route_sums_;
    launch_route(route, stream);

    const ExpertParams experts = ExpertParams::from(args.experts, w);
    const bool mxfp4 = ExpertParams::implements_mxfp4(args.experts);
    // (Not under --batch-invariant: the GEMVs' arithmetic differs from the grouped GEMM's, so a
    // token's output would depend on whether its step has more than kGemvMaxTokens tokens.)
    const bool gemv = mxfp4 && mxfp4_gemv_ != Mxfp4Path::kOff && tokens <= kGemvMaxTokens &&
                      !context_.batch_invariant;  // reads the f32 rows itself
    // MXFP4 steps of up to reg_gemm_max_ pairs an expert: the register GEMM (it converts x).
    const bool reg_gemm =
        mxfp4 && !gemv && pairs <= reg_gemm_max_ * experts_ && reg_gemm_fits(w, experts);
    if (!gemv && !reg_gemm) {
      // The bf16 copy of the hidden states; the gate_up GEMM gathers its rows in expert order.
      const int64_t chunks = tokens * hidden_ / 8;
      const int64_t convert_blocks =
          std::min<int64_t>(ceil_div(chunks, 256), 8 * std::max(context_.sm_count, 1));
      to_bf16_kernel<<<static_cast<unsigned>(convert_blocks), 256, 0, stream>>>(hidden, chunks,
                                                                                x_bf16_);
      SY_CUDA_LAUNCH_CHECK("to_bf16_kernel");
    }

    // Align + Forward, with the tile picked by the mean rows per expert (T and shapes only,
    // never the device-side counts).
    int64_t parts = 1;  // y_'s parts (the split down GEMV's; the combine adds them)
    if (gemv)
      parts = forward_mxfp4_gemv(w, experts, hidden, pairs, stream);
    else if (reg_gemm)
      forward_mxfp4_reg_gemm(w, experts, hidden, tokens, pairs, stream);
    else if (intermediate_ % 8 != 0)  // (bf16 only: MXFP4 widths are multiples of 32)
      forward_experts_simple(w, experts, pairs, stream);
    else if (pairs <= 24 * experts_)
      forward_experts<SmallTile>(mxfp4, w, experts, pairs, stream);
    else if (pairs <= 96 * experts_ && (tiles_ == "k32" || (mxfp4 && tiles_ != "k64")))
      forward_experts<MediumK32Tile>(mxfp4, w, experts, pairs, stream);
    else if (pairs <= 96 * experts_)
      forward_experts<MediumTile>(mxfp4, w, experts, pairs, stream);
    else if (tiles_ == "k32")
      forward_experts<LargeK32Tile>(mxfp4, w, experts, pairs, stream);
    else if (wgmma_ && mxfp4)
      forward_experts<LargeTile, true, true>(w, experts, pairs, stream);
    else if (wgmma_)
      forward_experts<LargeTile, false, true>(w, experts, pairs, stream);
    else
      forward_experts<LargeTile>(mxfp4, w, experts, pairs, stream);

    // Combine (of y_'s parts where the down GEMV left it in parts).
    const dim3 combine_grid(static_cast<unsigned>(ceil_div(hidden_ / 4, kCombineThreads)),
                            static_cast<unsigned>(tokens));
    const auto combine =
        parts > 1 ? (residual.residual ? combine_kernel<true, true> : combine_kernel<false, true>)
                  : (residual.residual ? combine_kernel<true> : combine_kernel<false>);
    launch_overlapped(combine, combine_grid, dim3(kCombineThreads), 0, stream,
                      static_cast<const float*>(y_), static_cast<const float*>(weights_),
                      static_cast<int>(top_k_), static_cast<int>(hidden_), args.out.ptr<float>(),
                      residual, static_cast<int>(parts), pairs * hidden_);
    SY_CUDA_LAUNCH_CHECK("combine_kernel");
    return Status::ok();
  }

 private:
  // The register GEMM takes MXFP4 steps of up to reg_gemm_max_ pairs an expert (SY_REG_GEMM_MAX=n;
  // default 96, the small and medium tiles' range). Session 34, H100, gpt-oss-20b decode batch 256
  // (32 pairs an expert): 19.4 ms/step against the medium tile's 25.0.
  const int64_t reg_gemm_max_ = [] {
    const char* v = std::getenv("SY_REG_GEMM_MAX");
    const int n = v ? std::atoi(v) : 0;
    return int64_t{n > 0 && n <= 4096 ? n : 96};
  }();
  // Its M tiles: 16 pairs up to kRegGemmNarrowMax pairs an expert, 32 above (SY_REG_GEMM_TOKENS=16
  // or 32 forces one). Session 34, H100: 16-pair tiles 7.4/9.8/13.1 ms at batch 16/64/128 against
  // 9.1/11.7/13.4 for 32-pair tiles; at batch 256, 20.4 against 19.4.
  const int reg_gemm_tokens_ = [] {
    const char* v = std::getenv("SY_REG_GEMM_TOKENS");
    const int n = v ? std::atoi(v) : 0;
    return n == kRegGemmTokens || n == kRegGemmWide ? n : 0;
  }();
  // Those steps on the register GEMM; SY_MXFP4_GEMM=tile: on the grouped GEMM.
  const bool reg_gemm_ = [] {
    const char* v = std::getenv("SY_MXFP4_GEMM");
    return !(v && std::string_view(v) == "tile");
  }();
  // SY_GEMM_TILE=k32|k64 (A/B and experiment; see MediumK32Tile).
  const std::string_view tiles_ = [] {
    const char* value = std::getenv("SY_GEMM_TILE");
    return std::string_view(value ? value : "");
  }();
  template <class Cfg>
  void forward_experts(bool mxfp4, const moe::MoeLayerWeights& w, const ExpertParams& experts,
                       int64_t pairs, cudaStream_t stream) {
    mxfp4 ? forward_experts<Cfg, true>(w, experts, pairs, stream)
          : forward_experts<Cfg, false>(w, experts, pairs, stream);
  }
  // Large steps on grouped_gemm_wgmma_kernel on a Hopper GPU (compute capability 9.x) unless
  // SY_GEMM_WGMMA=0 (the mma.sync LargeTile, for A/Bs); set by reserve().
  bool wgmma_ = false;
  // kWgmma: grouped_gemm_wgmma_kernel (Cfg = LargeTile for the alignment).
  template <class Cfg, bool kMxfp4, bool kWgmma = false>
  void forward_experts(const moe::MoeLayerWeights& w, const ExpertParams& experts, int64_t pairs,
                       cudaStream_t stream) {
    static_assert(!kWgmma || Cfg::kM == kWgM, "wgmma: LargeTile's M tiles");
    align(pairs, Cfg::kM, stream);

    const unsigned m_tiles = static_cast<unsigned>(m_tiles_bound(pairs, experts_, Cfg::kM));
    GroupedGemm gemm;
    gemm.top_k = static_cast<int>(top_k_);
    gemm.perm = perm_;
    gemm.tile_expert = tile_expert_;
    gemm.tile_count = tile_count_;
    gemm.experts = experts;

    gemm.a = x_bf16_;
    if constexpr (kMxfp4) {
      gemm.w_blocks = w.gate_up.ptr<uint8_t>();
      gemm.w_scales = w.gate_up_scales.ptr<uint8_t>();
    } else {
      gemm.w = w.gate_up.ptr<__nv_bfloat16>();
    }
    gemm.k_dim = static_cast<int>(hidden_);
    gemm.n_dim = static_cast<int>(intermediate_);
    gemm.act = act_;
    if constexpr (kWgmma) {
      const dim3 grid(static_cast<unsigned>(ceil_div(intermediate_, kWgN / 2)), m_tiles);
      grouped_gemm_wgmma_kernel<true, kMxfp4>
          <<<grid, kWgThreads, WgPlan<kMxfp4>::bytes(hidden_), stream>>>(gemm);
      SY_CUDA_LAUNCH_CHECK("grouped_gemm_wgmma_kernel<gate_up>");
    } else {
      const dim3 grid(static_cast<unsigned>(ceil_div(intermediate_, Cfg::kN / 2)), m_tiles);
      grouped_gemm_kernel<Cfg, true, kMxfp4>
          <<<grid, Cfg::kThreads, SmemPlan<Cfg, kMxfp4>::bytes(hidden_), stream>>>(gemm);
      SY_CUDA_LAUNCH_CHECK("grouped_gemm_kernel<gate_up>");
    }

    gemm.a = act_;
    if constexpr (kMxfp4) {
      gemm.w_blocks = w.down.ptr<uint8_t>();
      gemm.w_scales = w.down_scales.ptr<uint8_t>();
    } else {
      gemm.w = w.down.ptr<__nv_bfloat16>();
    }
    gemm.k_dim = static_cast<int>(intermediate_);
    gemm.n_dim = static_cast<int>(hidden_);
    gemm.act = nullptr;
    gemm.y = y_;
    if constexpr (kWgmma) {
      const dim3 grid(static_cast<unsigned>(ceil_div(hidden_, kWgN)), m_tiles);
      grouped_gemm_wgmma_kernel<false, kMxfp4>
          <<<grid, kWgThreads, WgPlan<kMxfp4>::bytes(intermediate_), stream>>>(gemm);
      SY_CUDA_LAUNCH_CHECK("grouped_gemm_wgmma_kernel<down>");
    } else {
      const dim3 grid(static_cast<unsigned>(ceil_div(hidden_, Cfg::kN)), m_tiles);
      grouped_gemm_kernel<Cfg, false, kMxfp4>
          <<<grid, Cfg::kThreads, SmemPlan<Cfg, kMxfp4>::bytes(intermediate_), stream>>>(gemm);
      SY_CUDA_LAUNCH_CHECK("grouped_gemm_kernel<down>");
    }
  }

  // Expert widths the grouped GEMM does not tile (simple_gate_up_kernel / simple_down_kernel).
  void forward_experts_simple(const moe::MoeLayerWeights& w, const ExpertParams& experts,
                              int64_t pairs, cudaStream_t stream) {
    constexpr int tile_m = SmallTile::kM;
    align(pairs, tile_m, stream);
    const int64_t padded_rows = m_tiles_bound(pairs, experts_, tile_m) * tile_m;
    const unsigned rows_grid = static_cast<unsigned>(std::min<int64_t>(padded_rows, 65535));
    GroupedGemm gemm;
    gemm.top_k = static_cast<int>(top_k_);
    gemm.perm = perm_;
    gemm.tile_expert = tile_expert_;
    gemm.tile_count = tile_count_;
    gemm.experts = experts;
    gemm.a = x_bf16_;
    gemm.w = w.gate_up.ptr<__nv_bfloat16>();
    gemm.k_dim = static_cast<int>(hidden_);
    gemm.n_dim = static_cast<int>(intermediate_);
    gemm.act = act_;
    simple_gate_up_kernel<<<dim3(static_cast<unsigned>(ceil_div(intermediate_, 64)), rows_grid), 64,
                            0, stream>>>(gemm, tile_m, padded_rows);
    SY_CUDA_LAUNCH_CHECK("simple_gate_up_kernel");
    gemm.a = act_;
    gemm.w = w.down.ptr<__nv_bfloat16>();
    gemm.k_dim = static_cast<int>(intermediate_);
    gemm.n_dim = static_cast<int>(hidden_);
    gemm.act = nullptr;
    gemm.y = y_;
    simple_down_kernel<<<dim3(static_cast<unsigned>(ceil_div(hidden_, 64)), rows_grid), 64, 0,
                         stream>>>(gemm, tile_m, padded_rows);
    SY_CUDA_LAUNCH_CHECK("simple_down_kernel");
  }

  // Few-token MXFP4 steps (unless SY_MXFP4_GEMV=0): route ids straight to the GEMV kernels, no
  // align. Returns the parts y_ is left in (1 unless SY_GEMV_SPLIT).
  int64_t forward_mxfp4_gemv(const moe::MoeLayerWeights& w, const ExpertParams& experts,
                             const float* hidden, int64_t pairs, cudaStream_t stream) {
    Mxfp4Gemv g;
    g.ids = ids_;
    g.top_k = static_cast<int>(top_k_);
    g.experts = static_cast<int>(experts_);
    g.params = experts;
    auto bind = [&](const Tensor& blocks, const Tensor& scales, int64_t k, int64_t n) {
      g.blocks = blocks.ptr<uint8_t>();
      g.scales = scales.ptr<uint8_t>();
      g.k = static_cast<int>(k);
      g.n = static_cast<int>(n);
    };
    // The tensor-core kernels need their k in shared memory, 16-byte aligned rows and scales, and
    // row counts (2I, H) that are multiples of 16 (I is a multiple of 32 already); else the warp
    // GEMV runs.
    if (mxfp4_gemv_ != Mxfp4Path::kWarp && std::max(hidden_, intermediate_) <= kStreamMaxK &&
        hidden_ % 16 == 0 && aligned16(w.gate_up.data) && aligned16(w.down.data) &&
        aligned16(w.gate_up_scales.data) && aligned16(w.down_scales.data)) {
      if (mxfp4_gemv_ == Mxfp4Path::kReg) {  // no split kernel: the blocks split x themselves
        auto launch = [&](auto kernel, int64_t rows, const float* x, float* out, int parts) {
          g.x = x;
          g.out = out;
          const dim3 grid(static_cast<unsigned>(ceil_div(rows, 16 * kRegWarps)),
                          static_cast<unsigned>(pairs), static_cast<unsigned>(parts));
          launch_overlapped(kernel, grid, dim3(kRegThreads),
                            static_cast<size_t>(reg_gemv_smem(g.k)), stream, g);
          SY_CUDA_LAUNCH_CHECK("mxfp4_reg_gemv_kernel");
        };
        // down in gemv_split_ parts of k where y_ holds them (combine_kernel<., true> adds them).
        const int64_t parts =
            gemv_split_ > 1 && gemv_split_ * pairs <= max_tokens_ * top_k_ ? gemv_split_ : 1;
        auto run = [&](auto depth) {
          constexpr int kDepth = decltype(depth)::value;
          bind(w.gate_up, w.gate_up_scales, hidden_, intermediate_);
          launch(mxfp4_reg_gemv_kernel<true, false, kDepth>, 2 * intermediate_, hidden, act_f32_,
                 1);
          bind(w.down, w.down_scales, intermediate_, hidden_);
          if (parts > 1)
            launch(mxfp4_reg_gemv_kernel<false, true, kDepth>, hidden_, act_f32_, y_, parts);
          else
            launch(mxfp4_reg_gemv_kernel<false, false, kDepth>, hidden_, act_f32_, y_, 1);
        };
        gemv_deep_ ? run(std::integral_constant<int, 2 * kRegDepth>{})
                   : run(std::integral_constant<int, kRegDepth>{});
        return parts;
      }
      const int64_t tokens = pairs / top_k_;
      auto launch = [&](auto kernel, int64_t rows) {
        const dim3 grid(static_cast<unsigned>(ceil_div(rows, 16 * kStreamWarps)),
                        static_cast<unsigned>(pairs));
        kernel<<<grid, kStreamThreads, static_cast<size_t>(stream_gemv_smem(g.k)), stream>>>(g);
        SY_CUDA_LAUNCH_CHECK("mxfp4_stream_gemv_kernel");
      };
      launch_overlapped(split_bf16_kernel,
                        dim3(static_cast<unsigned>(ceil_div(tokens * hidden_ / 4, 256))), dim3(256),
                        0, stream, hidden, tokens, static_cast<int>(hidden_), x_split_);
      SY_CUDA_LAUNCH_CHECK("split_bf16_kernel");
      bind(w.gate_up, w.gate_up_scales, hidden_, intermediate_);
      g.x_split = x_split_;
      g.out_split = act_split_;
      launch(mxfp4_stream_gemv_kernel<true>, 2 * intermediate_);
      bind(w.down, w.down_scales, intermediate_, hidden_);
      g.x_split = act_split_;
      g.out = y_;
      launch(mxfp4_stream_gemv_kernel<false>, hidden_);
      return 1;
    }
    auto launch = [&](auto kernel, int outputs_per_warp, const float* x, float* out) {
      g.x = x;
      g.out = out;
      const dim3 grid(static_cast<unsigned>(ceil_div(g.n, outputs_per_warp * kGemvWarps)),
                      static_cast<unsigned>(pairs));
      launch_overlapped(kernel, grid, dim3(kGemvThreads), 0, stream, g);
      SY_CUDA_LAUNCH_CHECK("mxfp4_gemv_kernel");
    };
    bind(w.gate_up, w.gate_up_scales, hidden_, intermediate_);
    launch(mxfp4_gemv_kernel<true>, 2, hidden, act_f32_);
    bind(w.down, w.down_scales, intermediate_, hidden_);
    launch(mxfp4_gemv_kernel<false>, 4, act_f32_, y_);
    return 1;
  }

  // The step's pairs in expert order, in M tiles of tile_m: perm_, tile_expert_, tile_count_.
  void align(int64_t pairs, int tile_m, cudaStream_t stream) {
    align_kernel<<<static_cast<unsigned>(experts_), kAlignThreads, 0, stream>>>(
        ids_, static_cast<int>(pairs), static_cast<int>(experts_), tile_m, perm_, tile_expert_,
        tile_count_);
    SY_CUDA_LAUNCH_CHECK("align_kernel");
  }
  // Whether the register GEMM takes this layer's MXFP4 steps (up to reg_gemm_max_ pairs an
  // expert): not turned off (SY_MXFP4_GEMM), not batch-invariant (its arithmetic is not the grouped
  // GEMM's), row counts that are multiples of 16, 16-byte aligned weights, and activations that f16
  // holds (the clamped SwiGLU's |act| <= (limit + 1) limit).
  bool reg_gemm_fits(const moe::MoeLayerWeights& w, const ExpertParams& experts) const {
    return reg_gemm_ && !context_.batch_invariant && hidden_ % 16 == 0 && intermediate_ % 8 == 0 &&
           experts.clamped && experts.limit > 0.0f && experts.limit <= 200.0f &&
           aligned16(w.gate_up.data) && aligned16(w.down.data);
  }
  // Align to M tiles of kTokens pairs, x to x16, then gate_up and down on the register GEMM
  // (act_ holds the f16 activations, x_bf16_ the f16 x).
  void forward_mxfp4_reg_gemm(const moe::MoeLayerWeights& w, const ExpertParams& experts,
                              const float* hidden, int64_t tokens, int64_t pairs,
                              cudaStream_t stream) {
    const bool wide = reg_gemm_tokens_ ? reg_gemm_tokens_ == kRegGemmWide
                                       : pairs > kRegGemmNarrowMax * experts_;
    wide ? forward_mxfp4_reg_gemm<kRegGemmWide>(w, experts, hidden, tokens, pairs, stream)
         : forward_mxfp4_reg_gemm<kRegGemmTokens>(w, experts, hidden, tokens, pairs, stream);
  }
  template <int kTokens>
  void forward_mxfp4_reg_gemm(const moe::MoeLayerWeights& w, const ExpertParams& experts,
                              const float* hidden, int64_t tokens, int64_t pairs,
                              cudaStream_t stream) {
    align(pairs, kTokens, stream);
    __half* x16 = reinterpret_cast<__half*>(x_bf16_);
    __half* act16 = reinterpret_cast<__half*>(act_);
    mxfp4_x16_kernel<<<static_cast<unsigned>(tokens), kRegGemmThreads, 0, stream>>>(
        hidden, static_cast<int>(hidden_), x16, x_back_);
    SY_CUDA_LAUNCH_CHECK("mxfp4_x16_kernel");
    const unsigned m_tiles = static_cast<unsigned>(m_tiles_bound(pairs, experts_, kTokens));
    Mxfp4RegGemm g;
    g.perm = perm_;
    g.tile_expert = tile_expert_;
    g.tile_count = tile_count_;
    g.top_k = static_cast<int>(top_k_);
    g.params = experts;
    g.blocks = w.gate_up.ptr<uint8_t>();
    g.scales = w.gate_up_scales.ptr<uint8_t>();
    g.x = x16;
    g.x_back = x_back_;
    g.act = act16;
    g.k = static_cast<int>(hidden_);
    g.n = static_cast<int>(intermediate_);
    const dim3 gate_up_grid(static_cast<unsigned>(ceil_div(2 * intermediate_, 16 * kRegGemmWarps)),
                            m_tiles);
    mxfp4_reg_gemm_kernel<true, kTokens><<<gate_up_grid, kRegGemmThreads, 0, stream>>>(g);
    SY_CUDA_LAUNCH_CHECK("mxfp4_reg_gemm_kernel<gate_up>");
    g.blocks = w.down.ptr<uint8_t>();
    g.scales = w.down_scales.ptr<uint8_t>();
    g.x = act16;
    g.x_back = nullptr;
    g.act = nullptr;
    g.y = y_;
    g.k = static_cast<int>(intermediate_);
    g.n = static_cast<int>(hidden_);
    const dim3 down_grid(static_cast<unsigned>(ceil_div(hidden_, 16 * kRegGemmWarps)), m_tiles);
    mxfp4_reg_gemm_kernel<false, kTokens><<<down_grid, kRegGemmThreads, 0, stream>>>(g);
    SY_CUDA_LAUNCH_CHECK("mxfp4_reg_gemm_kernel<down>");
  }

  // Everything forward() needs to be true of its arguments, as errors naming the offender.
  Status check(const moe::MoeForwardArgs& args) const {
    if (!ids_) return Status::error(ErrorCode::kInternal, "cuda-modular: forward before reserve");
    SY_TRY(supports_experts(args.experts));
    const Tensor& x = args.hidden;
    if (x.rank != 2 || x.dtype != DType::kF32 || x.dim(1) != hidden_)
      return Status::errorf("cuda-modular: hidden must be f32 [T, {}], got {}", hidden_,
                            x.shape_string());
    const int64_t tokens = x.dim(0);
    if (tokens > max_tokens_)
      return Status::errorf("cuda-modular: {} tokens exceed the reserved {}", tokens, max_tokens_);
    if (args.out.dtype != DType::kF32 || args.out.numel() != x.numel() ||
        (tokens && !args.out.data))
      return Status::errorf("cuda-modular: out must be f32 of hidden's shape, got {}",
                            args.out.shape_string());
    if (args.spec.num_experts != experts_ || args.spec.top_k != top_k_)
      return Status::errorf("cuda-modular: reserved for {} experts top-{}, got {} top-{}", experts_,
                            top_k_, args.spec.num_experts, args.spec.top_k);
    const moe::MoeLayerWeights* w = args.weights;
    if (!w) return Status::error(ErrorCode::kInternal, "cuda-modular: no weights");
    auto bad_weight = [](const Tensor& t, int64_t d0, int64_t d1, int64_t d2) {
      const bool shape_ok = d2 ? t.rank == 3 && t.dim(0) == d0 && t.dim(1) == d1 && t.dim(2) == d2
                               : t.rank == 2 && t.dim(0) == d0 && t.dim(1) == d1;
      return !shape_ok || t.dtype != DType::kBF16 || t.device != Device::kCuda || !t.data;
    };
    if (ExpertParams::implements_mxfp4(args.experts)) {
      if (bad_weight(w->router, experts_, hidden_, 0) ||
          !mxfp4_experts_readable(w->gate_up, w->gate_up_scales, experts_, 2 * intermediate_, hidden_) ||
          !mxfp4_experts_readable(w->down, w->down_scales, experts_, hidden_, intermediate_))
        return Status::errorf(
            "cuda-modular: MXFP4 experts need hidden and moe_intermediate multiples of 32 and U8 "
            "blocks (16-byte "
            "aligned)/scales on cuda for gate_up [{}, {}, {}/32] and down [{}, {}, {}/32]; got "
            "gate_up {} / {}, down {} / {}",
            experts_, 2 * intermediate_, hidden_, experts_, hidden_, intermediate_,
            w->gate_up.shape_string(), w->gate_up_scales.shape_string(), w->down.shape_string(),
            w->down_scales.shape_string());
    } else if (bad_weight(w->router, experts_, hidden_, 0) ||
        bad_weight(w->gate_up, experts_, 2 * intermediate_, hidden_) ||
        bad_weight(w->down, experts_, hidden_, intermediate_))
      return Status::errorf(
          "cuda-modular: weights must be bf16 on cuda: router [{}, {}], gate_up [{}, {}, {}], down "
          "[{}, {}, {}]; got {}, "
          "{}, {}",
          experts_, hidden_, experts_, 2 * intermediate_, hidden_, experts_, hidden_, intermediate_,
          w->router.shape_string(), w->gate_up.shape_string(), w->down.shape_string());
    const moe::RouteBuffers& routes = args.routes;
    auto bad_routes = [&](const Tensor& t) {
      return t.rank != 3 || t.dtype != DType::kI32 || t.dim(0) < tokens || t.dim(2) != top_k_ ||
             args.layer < 0 || args.layer >= t.dim(1);
    };
    if (routes.weights.data &&
        (routes.weights.dtype != DType::kF32 || !routes.sink.data || routes.weights.rank != 3 ||
         routes.weights.dim(0) != routes.sink.dim(0) || routes.weights.dim(1) != routes.sink.dim(1) ||
         routes.weights.dim(2) != top_k_))
      return Status::errorf("cuda-modular: the weight sink must be f32 shaped like the route sink, got {}",
                            routes.weights.shape_string());
    if (routes.sink.data && bad_routes(routes.sink))
      return Status::errorf(
          "cuda-modular: route sink must be int32 [>= {}, > layer {}, {}], got {}", tokens,
          args.layer, top_k_, routes.sink.shape_string());
    if (routes.source.data && (bad_routes(routes.source) ||
                               (routes.sink.data && routes.source.dim(1) != routes.sink.dim(1))))
      return Status::errorf(
          "cuda-modular: route source must be int32 [>= {}, > layer {}, {}] like the sink, got {}",
          tokens, args.layer, top_k_, routes.source.shape_string());
    if (routes.forced.data && (!routes.source.data || routes.forced.dtype != DType::kU8 ||
                               routes.forced.numel() < tokens))
      return Status::errorf(
          "cuda-modular: forced must be uint8 [>= {}] with a route source, got {}", tokens,
          routes.forced.shape_string());
    return Status::ok();
  }

  template <class T>
  bool allocate(T** ptr, int64_t bytes) {
    return cudaMalloc(reinterpret_cast<void**>(ptr),
                      static_cast<size_t>(std::max<int64_t>(bytes, 16))) == cudaSuccess;
  }
  void release() {
    for (void* p :
         {static_cast<void*>(ids_), static_cast<void*>(weights_), static_cast<void*>(x_bf16_),
          static_cast<void*>(perm_), static_cast<void*>(tile_expert_),
          static_cast<void*>(tile_count_), static_cast<void*>(act_), static_cast<void*>(y_),
          static_cast<void*>(act_f32_), static_cast<void*>(x_split_),
          static_cast<void*>(act_split_), static_cast<void*>(route_sums_),
          static_cast<void*>(x_normed_), static_cast<void*>(x_back_)})
      if (p) cudaFree(p);
    x_split_ = nullptr, act_split_ = nullptr, route_sums_ = nullptr;
    x_normed_ = nullptr, x_back_ = nullptr;
    ids_ = nullptr, weights_ = nullptr, x_bf16_ = nullptr, perm_ = nullptr, tile_expert_ = nullptr;
    tile_count_ = nullptr, act_ = nullptr, y_ = nullptr, act_f32_ = nullptr;
  }

  CudaContext& context_;
  int64_t max_tokens_ = 0, experts_ = 0, top_k_ = 0, hidden_ = 0, intermediate_ = 0;
  // Scratch, sized by reserve() for max_tokens (T*K pairs, P padded rows = max over tiles of
  // m_tiles_bound * tile M):
  int32_t* ids_ = nullptr;           // [T, K] chosen experts
  float* weights_ = nullptr;         // [T, K] gating weights
  float* route_sums_ = nullptr;      // the router logits' group sums (route_sums_floats)
  float* x_normed_ = nullptr;        // [1, H] the fused input norm's row (route_fuses_norm)
  float* x_back_ = nullptr;          // [T] the register GEMM's x16 back factors (mxfp4_x16_kernel)
  // One-token steps fuse the input norm (H100, 2026-12-07, two rounds: gpt-oss-20b batch 1
  // 2.501/2.510 ms against 2.541/2.540, BENCHMARKS.md session 33); SY_MODULAR_NORM=0 or
  // SY_NO_NORM_FUSION=1 (which also unfuses the norm + GEMV elsewhere) keep the separate norm.
  const bool no_norm_fusion_ = env_off("SY_MODULAR_NORM") || env_flag("SY_NO_NORM_FUSION");
  __nv_bfloat16* x_bf16_ = nullptr;  // [T, H] hidden in bf16
  int32_t* perm_ = nullptr;          // [P] pair index by padded row, experts in order, -1 padding
  int32_t* tile_expert_ = nullptr;   // [M tiles] expert of each M tile
  int32_t* tile_count_ = nullptr;    // [1] M tiles of this step
  __nv_bfloat16* act_ = nullptr;     // [P, I] SiLU(gate) * up
  float* y_ = nullptr;               // [T*K, H] each pair's expert output
  float* act_f32_ = nullptr;         // [min(T, kGemvMaxTokens) * K, I] the MXFP4 GEMV's activations
  __nv_bfloat16* x_split_ = nullptr;    // [min(T, kGemvMaxTokens), 2H] the streamed GEMV's hidden (hi, lo)
  __nv_bfloat16* act_split_ = nullptr;  // [min(T, kGemvMaxTokens) * K, 2I] its activations (hi, lo)
  // Few-token MXFP4 steps run on the GEMV kernels (gpt-oss-20b batch 1 on an H100, 2026-12-06:
  // 42.2% of floor against 29.5% on the grouped GEMM). Which kernel: by default the register-direct
  // tensor-core GEMV on f16 (mxfp4_reg_gemv_kernel; H100, 2026-12-07, alternating in one visit:
  // batch 1 2.56 against 2.80 ms, batch 8 7.91 against 9.24 ms for the previous default, the warp
  // GEMV at one token and the streamed one at 2..8). SY_MXFP4_GEMV=stream or =warp: always that
  // one (A/Bs); SY_MXFP4_GEMV=0: the register GEMM (with SY_MXFP4_GEMM=tile, the grouped GEMM). The
  // warp GEMV also runs where the tensor-core kernels cannot (k > kStreamMaxK, unaligned rows or
  // scales).
  enum class Mxfp4Path { kOff, kReg, kWarp, kStream };
  // SY_GEMV_SPLIT=2..4: the register GEMV's down in that many parts of k, one block each, summed
  // by the combine (experiment: gpt-oss-20b's batch-1 down launches 180 blocks of 128 threads on
  // 132 SMs and reached 37% of the copy rate, gate_up's 360 blocks 55%; ncu, session 32).
  const int64_t gemv_split_ = [] {
    const char* v = std::getenv("SY_GEMV_SPLIT");
    const int n = v ? std::atoi(v) : 1;
    return int64_t{n >= 2 && n <= 4 ? n : 1};
  }();
  // SY_GEMV_DEPTH=8: the register GEMV with 8 steps in flight, not 4 (experiment: the batch-1
  // gate_up reached 55% of the copy rate with 4 KB in flight a warp; session 32's ncu table).
  const bool gemv_deep_ = [] {
    const char* v = std::getenv("SY_GEMV_DEPTH");
    return v && std::string_view(v) == "8";
  }();
  const Mxfp4Path mxfp4_gemv_ = [] {
    const char* v = std::getenv("SY_MXFP4_GEMV");
    const std::string_view value = v ? v : "";
    return value == "0"        ? Mxfp4Path::kOff
           : value == "warp"   ? Mxfp4Path::kWarp
           : value == "stream" ? Mxfp4Path::kStream
                               : Mxfp4Path::kReg;
  }();
};

}  // namespace

size_t dense_gemm_plan_ints(int64_t max_rows) {
  // [count | a tile entry per shortest M tile | perm to the largest M tile's multiple]
  const int64_t rows = std::max<int64_t>(max_rows, 1);
  return static_cast<size_t>(1 + ceil_div(rows, SmallTile::kM) +
                             ceil_div(rows, LargeK32Tile::kM) * LargeK32Tile::kM);
}

void launch_dense_gemm(const __nv_bfloat16* x, int64_t rows, int64_t k, const __nv_bfloat16* w, int64_t n, float* out,
                       int32_t* plan, cudaStream_t stream) {
  if (rows == 0) return;
  if (k % 8 != 0 || n % 8 != 0 || !plan)
    cuda_fail("dense_gemm", "k and n must be multiples of 8 (batch-invariant GEMM)", __FILE__, __LINE__);
  // The plan was sized for max_rows with the shortest tile; any M tile fits within it.
  const int64_t max_tiles = ceil_div(rows, SmallTile::kM);
  // Tiles by size only for speed: every tile shape accumulates each row in the same k order.
  if (rows <= 64) dense_gemm<SmallTile>(x, rows, k, w, n, out, plan, max_tiles, stream);
  else if (rows <= 1024)
    dense_gemm<MediumK32Tile>(x, rows, k, w, n, out, plan, max_tiles, stream);
  else
    dense_gemm<LargeK32Tile>(x, rows, k, w, n, out, plan, max_tiles, stream);
}

std::unique_ptr<moe::ExpertsKernel> make_cuda_modular_kernel(CudaContext& context) {
  return std::make_unique<ModularKernel>(context);
}

}  // namespace sy::backend::cuda
