// Sampling and scoring on CUDA: one block of 1024 threads per logits row, no sort over the
// vocabulary. The host turns a row's penalties, bias and bans into a short list of (token, what to
// apply), uploaded with the rows' parameters in one copy; the kernel applies it while it reads the
// row. min_p/top_k/top_p become a cut on the adjusted value: the k-th best of the 1024 per-thread
// maxima bounds the top k from below, so one more pass collects a short candidate list (k plus a
// few) that is sorted in shared memory; exact radix-select passes are the fallback (top_k > 1024,
// a nucleus wider than the top ~512, a list past 4096 entries). The draw walks the kept tokens in
// a fixed order (list rank, or thread-major), so a seed gives the same token in any batch.
// Floor: one pass reads rows * vocab * 4 bytes. Pass 1 always (normaliser, argmax); pass 2 for
// sampling or top logprobs (candidates, masses); the fallback adds 4-9.
// A row that needs pass 1 alone (greedy or scored, no top logprobs) is read by several blocks
// instead, two tiles each (split_count: 19 for a 151,936 vocabulary), and the last of them to
// arrive merges their partials in a fixed order: one block alone took ~63 us a row (latency and
// issue bound on one SM), the largest of a batch-1 decode step's small kernels. The split count
// depends on the vocabulary only, so a row's result does not depend on its batch.
// fmt (via util/status.h) turns its constexpr off under nvcc, and then its C++20 code does not
// compile (gcc 12, fmt 9); host code here is plain C++, so keep it on.
#ifndef FMT_USE_CONSTEXPR
#define FMT_USE_CONSTEXPR 1
#endif
#include "backend/cuda/sampler.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>

namespace sy::backend::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kGroup = 4;                  // consecutive ids a thread reads per tile (one float4)
constexpr int kTile = kThreads * kGroup;   // ids per tile of the block
constexpr int kUnroll = 2;                 // tiles in flight per thread: 8 loads outstanding
constexpr int kListCap = kThreads * 4;     // candidates kept in shared memory (4 per thread)
constexpr int kMaxTopLogprobs = 20;        // the API's limit (server/api.cpp)
constexpr int kFastTopK = kThreads;        // top_k up to this uses the candidate list
constexpr int kProbeTopP = 512;            // top_p alone: try the top ~512 candidates first
constexpr int kRadixBins = 2048;           // 11-bit digits: 3 passes per exact 32-bit key
static_assert(kWarps == 32, "block scans assume 32 warps");

// The adjustments of one token, applied in vLLM's order: repetition, frequency/presence, bias, ban.
enum AdjustFlags : uint32_t { kRepetition = 1, kPenalty = 2, kBias = 4, kBan = 8 };
struct Adjust {
  int32_t id;
  uint32_t flags;
  float penalty;  // frequency * count + presence
  float bias;     // logit_bias (summed over repeats of the id)
};

struct RowParams {
  double u;  // uniform01(seed, draw_index), drawn on the host
  float temperature;
  float top_p;
  float min_p;
  float repetition_penalty;
  int32_t top_k;         // 0: no top-k cut (also when >= vocab)
  int32_t top_logprobs;  // alternatives to report, <= kMaxTopLogprobs
  int32_t target;        // score(): the scored token
  int32_t score;         // 1: a score() row (raw logits, no sampling)
  int32_t adjust_begin;  // this row's entries in the adjustment list, sorted by (thread, id)
  int32_t adjust_count;
};

struct RowResult {
  int32_t token;
  float logprob;
  int32_t top_count;
  int32_t reserved;
  int32_t top_ids[kMaxTopLogprobs];
  float top_logprobs[kMaxTopLogprobs];
};

// A split block's pass 1 over its tiles (pass-1-only rows read by several blocks).
struct SplitPartial {
  uint64_t best;   // best adjusted rank
  float max, sum;  // raw online softmax
  int32_t first_nan;
  int32_t reserved;
};
constexpr int kMaxSplits = 32;
static_assert(kMaxSplits <= 32, "split_finish merges with warp 0, a partial a lane");
constexpr int kSplitTiles = 2;  // tiles a split block reads (kUnroll: one round of loads)

struct SamplerLaunch {
  const float* logits;
  int vocab;
  bool vec4;  // rows are 16-byte aligned: read float4
  const RowParams* params;
  const Adjust* adjust;
  RowResult* results;
  SplitPartial* partials;  // [rows, gridDim.y]
  unsigned* arrivals;      // [rows], zero between launches
};

// Blocks per pass-1-only row (the launch's gridDim.y when it has such a row; other rows' extra
// blocks return at once).
__host__ __device__ inline int split_count(int vocab) {
  const int tiles = (vocab + kTile - 1) / kTile;
  const int splits = (tiles + kSplitTiles - 1) / kSplitTiles;
  return splits < 1 ? 1 : splits > kMaxSplits ? kMaxSplits : splits;
}
// Rows that need only pass 1: no sampling (greedy, or scored) and no top logprobs.
__host__ __device__ inline bool pass1_only(const RowParams& p) {
  return (p.score || !(p.temperature > 0.0f)) && p.top_logprobs <= 0;
}

// Which thread of the block reads token `id` (every pass reads the row in this one order).
__host__ __device__ inline int thread_of(int32_t id) { return (id / kGroup) % kThreads; }

// ---- keys --------------------------------------------------------------------------------------

// Float -> uint32 with the same order; NaN lowest (never a candidate), -0 equal to +0.
__device__ __forceinline__ uint32_t order_key(float v) {
  if (isnan(v)) return 0u;
  uint32_t bits = __float_as_uint(v);
  if (bits == 0x80000000u) bits = 0u;
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}
__device__ __forceinline__ float key_value(uint32_t key) {
  return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}
// (value desc, id asc) as one descending u64: value key in the top 32 bits, ~id in the bottom.
// 0 is below every real element (an empty slot).
__device__ __forceinline__ uint64_t rank_key(float v, int id) {
  return (static_cast<uint64_t>(order_key(v)) << 32) | (0xffffffffu - static_cast<uint32_t>(id));
}
__device__ __forceinline__ int rank_id(uint64_t rank) {
  return static_cast<int>(0xffffffffu - static_cast<uint32_t>(rank));
}
__device__ __forceinline__ float rank_value(uint64_t rank) {
  return key_value(static_cast<uint32_t>(rank >> 32));
}

// ---- shared memory -----------------------------------------------------------------------------

struct Shared {
  uint64_t list_s[kListCap];  // sampling candidates (rank keys of adjusted / temperature)
  union {
    uint64_t list_r[kListCap];  // top-logprob candidates (rank keys of raw logits)
    struct {
      unsigned count[kRadixBins];
      double mass[kRadixBins];
    } hist;  // radix passes (only once list_r is done with)
  };
  double scan_d[kWarps + 1];
  int scan_i[kWarps + 1];
  float warp_max[kWarps], warp_sum[kWarps];
  uint64_t warp_raw_best[kWarps], warp_best[kWarps];
  float row_max, row_sum;
  uint64_t row_raw_best, row_best;
  int first_nan;
  int count_s, count_r;
  int index_a, index_b, chosen, tie_id;
  double value_a, value_b;
  int sel_bin, sel_count_above, sel_total;
  double sel_mass_above, sel_target;
};

// ---- block primitives (every thread calls them) ------------------------------------------------

template <class T>
__device__ T block_exclusive_scan(T value, T& total, T* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  T inclusive = value;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const T up = __shfl_up_sync(0xffffffffu, inclusive, o);
    if (lane >= o) inclusive += up;
  }
  T exclusive = __shfl_up_sync(0xffffffffu, inclusive, 1);
  if (lane == 0) exclusive = T(0);
  if (lane == 31) scratch[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    const T mine = scratch[lane];
    T inc = mine;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const T up = __shfl_up_sync(0xffffffffu, inc, o);
      if (lane >= o) inc += up;
    }
    T exc = __shfl_up_sync(0xffffffffu, inc, 1);
    if (lane == 0) exc = T(0);
    scratch[lane] = exc;
    if (lane == 31) scratch[kWarps] = inc;
  }
  __syncthreads();
  const T result = scratch[warp] + exclusive;
  total = scratch[kWarps];
  __syncthreads();
  return result;
}

// Bitonic sort, descending, of a[0, n) (and b[0, n) alongside); n a power of two. The caller
// synchronises before; the sort ends synchronised.
__device__ void sort_desc(uint64_t* a, int n, uint64_t* b = nullptr) {
  const int total = b ? 2 * n : n;
  for (int size = 2; size <= n; size <<= 1)
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int t = threadIdx.x; t < total; t += kThreads) {
        uint64_t* arr = t < n ? a : b;
        const int i = t < n ? t : t - n;
        const int j = i ^ stride;
        if (j > i) {
          const uint64_t x = arr[i], y = arr[j];
          if ((i & size) == 0 ? x < y : x > y) {
            arr[i] = y;
            arr[j] = x;
          }
        }
      }
      __syncthreads();
    }
}

__device__ inline int pow2_at_least(int n) {
  int p = 1;
  while (p < n) p <<= 1;
  return p;
}

// Appends to a shared list; the count may run past the capacity (overflow, checked by the caller).
__device__ __forceinline__ void push(uint64_t* list, int* count, uint64_t key) {
  const int slot = atomicAdd(count, 1);
  if (slot < kListCap) list[slot] = key;
}

// ---- reading a row -----------------------------------------------------------------------------

struct RowReader {
  const float* raw;
  int vocab;
  bool vec4;
  bool adjusted;      // false: v = raw (score(), or a pass that needs only raw logits)
  float temperature;  // > 0: v = adjusted / temperature; else v = adjusted (greedy)
  float repetition_penalty;
  const Adjust* adjust;  // this thread's entries, by increasing id
  int adjust_count;
};

struct Cursor {
  int index;
  int next_id;
};

__device__ __forceinline__ Cursor start_cursor(const RowReader& row, int from_id = 0) {
  int index = 0;
  while (index < row.adjust_count && row.adjust[index].id < from_id) ++index;
  return {index, index < row.adjust_count ? row.adjust[index].id : INT_MAX};
}

__device__ __forceinline__ void load_group(const RowReader& row, int base, float (&x)[kGroup]) {
  if (row.vec4 && base + kGroup <= row.vocab) {
    const float4 q = __ldg(reinterpret_cast<const float4*>(row.raw + base));
    x[0] = q.x;
    x[1] = q.y;
    x[2] = q.z;
    x[3] = q.w;
  } else {
#pragma unroll
    for (int j = 0; j < kGroup; ++j) x[j] = base + j < row.vocab ? __ldg(row.raw + base + j) : 0.0f;
  }
}

// The value the filters see. Explicit _rn ops: no FMA contraction, the CPU's roundings.
__device__ __forceinline__ float row_value(const RowReader& row, Cursor& cursor, int id, float x) {
  if (!row.adjusted) return x;
  float a = x;
  if (id == cursor.next_id) {
    const Adjust e = row.adjust[cursor.index];
    if (e.flags & kRepetition)
      a = a > 0.0f ? __fdiv_rn(a, row.repetition_penalty) : __fmul_rn(a, row.repetition_penalty);
    if (e.flags & kPenalty) a = __fsub_rn(a, e.penalty);
    if (e.flags & kBias) a = __fadd_rn(a, e.bias);
    if (e.flags & kBan) a = -INFINITY;
    ++cursor.index;
    cursor.next_id = cursor.index < row.adjust_count ? row.adjust[cursor.index].id : INT_MAX;
  }
  return row.temperature > 0.0f ? __fdiv_rn(a, row.temperature) : a;
}

// Calls visit(id, raw, value) for this thread's ids in [begin, end) (begin a multiple of kTile)
// in increasing order: thread t reads ids 4t..4t+3 of every 4096-id tile, kUnroll tiles in flight.
template <class Visit>
__device__ __forceinline__ void scan_row(const RowReader& row, Visit&& visit, int begin = 0,
                                         int end = INT_MAX) {
  end = min(end, row.vocab);
  Cursor cursor = start_cursor(row, begin);
  for (int base = begin + threadIdx.x * kGroup; base < end; base += kTile * kUnroll) {
    float x[kUnroll][kGroup];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) load_group(row, base + u * kTile, x[u]);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int j = 0; j < kGroup; ++j) {
        const int id = base + u * kTile + j;
        if (id < end) visit(id, x[u][j], row_value(row, cursor, id, x[u][j]));
      }
  }
}

// ---- filters -----------------------------------------------------------------------------------

// A token is kept when its weight exp(v - max) is > 0 and >= min_p, and it ranks at or above
// the top-k and top-p cuts: (key, id) with key > cut key, or key == cut key and id <= cut id.
struct KeepFilter {
  float max_value;
  float min_p;
  bool has_k = false, has_p = false;
  uint32_t key_k = 0, key_p = 0;
  int id_k = INT_MAX, id_p = INT_MAX;
  __device__ bool operator()(int id, float, float v, uint32_t& key, float& w) const {
    w = expf(v - max_value);
    if (!(w > 0.0f) || w < min_p) return false;  // banned (-inf), underflow, NaN, below min_p
    key = order_key(v);
    if (has_k && (key < key_k || (key == key_k && id > id_k))) return false;
    if (has_p && (key < key_p || (key == key_p && id > id_p))) return false;
    return true;
  }
};

// Every element by its raw logit (the top-logprobs fallback).
struct RawKey {
  __device__ bool operator()(int, float x, float, uint32_t& key, float& w) const {
    key = order_key(x);
    w = 0.0f;
    return true;
  }
};

struct Selection {
  bool active;
  uint32_t key;
  int id_cut;
};

// Among included elements with key == `key`, the id of the keep-th lowest (1-based): one pass in
// id order, a block scan per tile, stopping at the tile that holds it.
template <class Classify>
__device__ int tie_select(Shared& sh, const RowReader& row, const Classify& classify, uint32_t key,
                          int keep) {
  Cursor cursor = start_cursor(row);
  int running = 0;
  if (threadIdx.x == 0) sh.tie_id = INT_MAX;  // ordered before any write by the scan's barrier
  for (int tile = 0; tile < row.vocab; tile += kTile) {
    const int base = tile + threadIdx.x * kGroup;
    float x[kGroup];
    load_group(row, base, x);
    unsigned mask = 0;
#pragma unroll
    for (int j = 0; j < kGroup; ++j) {
      const int id = base + j;
      if (id >= row.vocab) continue;
      const float v = row_value(row, cursor, id, x[j]);
      uint32_t k;
      float w;
      if (classify(id, x[j], v, k, w) && k == key) mask |= 1u << j;
    }
    int total;
    const int mine = __popc(mask);
    const int before = block_exclusive_scan(mine, total, sh.scan_i);
    if (running + total >= keep) {
      const int need = keep - running - before;
      if (need >= 1 && need <= mine) {
        unsigned m = mask;
        for (int n = 1; n < need; ++n) m &= m - 1;
        sh.tie_id = base + __ffs(m) - 1;
      }
      __syncthreads();
      const int id_cut = sh.tie_id;
      __syncthreads();
      return id_cut;
    }
    running += total;
  }
  return INT_MAX;
}

// Exact cut by radix select over the 32-bit value key of the included elements (3 passes of 11,
// 11, 10 bits), then the id cut within the boundary key's ties (tie_select) when needed.
// by_mass false: the k-th largest (inactive when k >= the included count).
// by_mass true: vLLM's top-p boundary, the first token (by rank) whose inclusive mass reaches
// top_p of the included mass.
template <class Classify>
__device__ Selection radix_select(Shared& sh, const RowReader& row, const Classify& classify,
                                  bool by_mass, int k, float top_p, float max_value) {
  const int lane = threadIdx.x & 31;
  uint32_t prefix = 0;
  int count_above = 0, tie_count = 0;
  double mass_above = 0.0, target = 0.0;
  for (int level = 0; level < 3; ++level) {
    const int shift = level == 0 ? 21 : level == 1 ? 10 : 0;
    const int bits = level == 2 ? 10 : 11;
    const int bins = 1 << bits;
    const uint32_t high_mask = level == 0 ? 0u : ~0u << (shift + bits);
    for (int b = threadIdx.x; b < bins; b += kThreads) {
      sh.hist.count[b] = 0;
      sh.hist.mass[b] = 0.0;
    }
    __syncthreads();
    scan_row(row, [&](int id, float x, float v) {
      uint32_t key;
      float w;
      if (!classify(id, x, v, key, w) || (key & high_mask) != prefix) return;
      const int bin = (key >> shift) & (bins - 1);
      atomicAdd(&sh.hist.count[bin], 1u);
      if (by_mass) atomicAdd(&sh.hist.mass[bin], static_cast<double>(w));
    });
    __syncthreads();
    if (threadIdx.x < 32) {
      // Lane l sums bins [hi - per_lane, hi] (descending value order across lanes), a warp scan
      // finds the lane where the cumulative count / mass crosses, that lane walks its bins.
      const int per_lane = bins / 32;
      const int hi = bins - 1 - lane * per_lane;
      int lane_count = 0;
      double lane_mass = 0.0;
      for (int b = hi; b > hi - per_lane; --b) {
        lane_count += sh.hist.count[b];
        if (by_mass) lane_mass += sh.hist.mass[b];
      }
      int inc_count = lane_count;
      double inc_mass = lane_mass;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int c = __shfl_up_sync(0xffffffffu, inc_count, o);
        const double m = __shfl_up_sync(0xffffffffu, inc_mass, o);
        if (lane >= o) {
          inc_count += c;
          inc_mass += m;
        }
      }
      double exc_mass = __shfl_up_sync(0xffffffffu, inc_mass, 1);
      if (lane == 0) exc_mass = 0.0;
      if (level == 0) {
        const int total_count = __shfl_sync(0xffffffffu, inc_count, 31);
        const double total_mass = __shfl_sync(0xffffffffu, inc_mass, 31);
        target = by_mass ? static_cast<double>(top_p) * total_mass : 0.0;
        if (lane == 0) {
          sh.sel_total = total_count;
          sh.sel_target = target;
        }
      }
      auto crosses = [&](int c, double m) {
        return by_mass ? mass_above + m >= target : count_above + c >= k;
      };
      if (lane == 0) {
        sh.sel_bin = 0;
        sh.sel_count_above = 0;
        sh.sel_mass_above = 0.0;
      }
      __syncwarp();
      const unsigned hit = __ballot_sync(0xffffffffu, lane_count > 0 && crosses(inc_count, inc_mass));
      const unsigned nonempty = __ballot_sync(0xffffffffu, lane_count > 0);
      // No crossing only by rounding of the masses: take the lowest non-empty bin (keep all).
      const int chosen_lane = hit ? __ffs(hit) - 1 : (nonempty ? 31 - __clz(nonempty) : -1);
      if (lane == chosen_lane) {
        int c = inc_count - lane_count;
        double m = exc_mass;
        int bin = -1, bin_count_above = 0;
        double bin_mass_above = 0.0;
        for (int b = hi; b > hi - per_lane; --b) {
          const int bc = sh.hist.count[b];
          if (bc == 0) continue;
          const double bm = by_mass ? sh.hist.mass[b] : 0.0;
          bin = b;
          bin_count_above = c;
          bin_mass_above = m;
          if (hit && crosses(c + bc, m + bm)) break;
          c += bc;
          m += bm;
        }
        if (bin >= 0) {
          sh.sel_bin = bin;
          sh.sel_count_above = bin_count_above;
          sh.sel_mass_above = bin_mass_above;
        }
      }
    }
    __syncthreads();
    if (level == 0) {
      target = sh.sel_target;
      if (!by_mass && k >= sh.sel_total) return {false, 0u, INT_MAX};
    }
    count_above += sh.sel_count_above;
    mass_above += sh.sel_mass_above;
    prefix |= static_cast<uint32_t>(sh.sel_bin) << shift;
    tie_count = static_cast<int>(sh.hist.count[sh.sel_bin]);
    __syncthreads();
  }
  int keep;
  if (by_mass) {
    // Tied tokens weigh the same w: the j-th (0-based) stays while mass_above + j w < target.
    const double w = expf(key_value(prefix) - max_value);
    const double q = ceil((target - mass_above) / w);
    keep = !(q < tie_count) ? tie_count : max(1, static_cast<int>(q));
  } else {
    keep = k - count_above;
  }
  if (tie_count <= 0 || keep >= tie_count) return {true, prefix, INT_MAX};
  return {true, prefix, tie_select(sh, row, classify, prefix, keep)};
}

// One draw from the kept tokens in thread-major order: each thread's kept mass (`mine`, summed in
// scan order), a block scan, and the thread holding u * total walks its ids again. Returns -1
// when nothing has weight.
__device__ int draw_thread_major(Shared& sh, const RowReader& row, float mine, double u,
                                 const KeepFilter& keep) {
  double total;
  const double before = block_exclusive_scan(static_cast<double>(mine), total, sh.scan_d);
  const double target = u * total;
  if (threadIdx.x == 0) {
    sh.index_a = INT_MAX;
    sh.index_b = -1;
    sh.chosen = -1;
  }
  __syncthreads();
  if (mine > 0.0f) {
    if (target < before + static_cast<double>(mine)) atomicMin(&sh.index_a, threadIdx.x);
    atomicMax(&sh.index_b, threadIdx.x);
  }
  __syncthreads();
  const int owner = sh.index_a != INT_MAX ? sh.index_a : sh.index_b;
  if (static_cast<int>(threadIdx.x) == owner) {
    const double local = target - before;
    float cumulative = 0.0f;
    int pick = -1, last = -1;
    scan_row(row, [&](int id, float x, float v) {
      uint32_t key;
      float w;
      if (pick < 0 && keep(id, x, v, key, w)) {
        cumulative += w;
        last = id;
        if (local < static_cast<double>(cumulative)) pick = id;
      }
    });
    sh.chosen = pick >= 0 ? pick : last;
  }
  __syncthreads();
  const int chosen = sh.chosen;
  __syncthreads();
  return chosen;
}

// The filtered draw over the sorted candidate list (the top c candidates by rank): top_k keeps the
// first min(top_k, c), top_p keeps while the mass ranked above is below top_p of their total,
// then u picks by cumulative mass in rank order. Returns -1 when the list (top_p alone) does not
// reach the top_p mass.
__device__ int draw_from_list(Shared& sh, int c, const RowParams& p, float max_value,
                              int cand_count, double cand_mass) {
  const int padded = pow2_at_least(c);
  for (int i = c + threadIdx.x; i < padded; i += kThreads) sh.list_s[i] = 0;
  __syncthreads();
  sort_desc(sh.list_s, padded);
  float w[4];
  double local[4];
  double partial = 0.0;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int i = threadIdx.x * 4 + j;
    w[j] = i < c ? expf(rank_value(sh.list_s[i]) - max_value) : 0.0f;
    local[j] = partial;
    partial += w[j];
  }
  double list_mass;
  const double base = block_exclusive_scan(partial, list_mass, sh.scan_d);
  const bool top_k_cut = p.top_k > 0;
  const bool top_p_cut = p.top_p < 1.0f;
  if (!top_k_cut && c < cand_count && list_mass < static_cast<double>(p.top_p) * cand_mass)
    return -1;
  const int m = top_k_cut ? min(p.top_k, c) : c;
  if (threadIdx.x == 0) {
    sh.index_a = m;
    sh.index_b = INT_MAX;
  }
#pragma unroll
  for (int j = 0; j < 4; ++j)
    if (threadIdx.x * 4 + j == m - 1) sh.value_a = base + local[j] + w[j];
  __syncthreads();
  if (top_p_cut) {
    const double total = top_k_cut ? sh.value_a : cand_mass;
    const double target = static_cast<double>(p.top_p) * total;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int i = threadIdx.x * 4 + j;
      if (i >= 1 && i < m && base + local[j] >= target) atomicMin(&sh.index_a, i);
    }
    __syncthreads();
  }
  const int keep = sh.index_a;
#pragma unroll
  for (int j = 0; j < 4; ++j)
    if (threadIdx.x * 4 + j == keep - 1) sh.value_b = base + local[j] + w[j];
  __syncthreads();
  const double target = p.u * sh.value_b;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int i = threadIdx.x * 4 + j;
    if (i < keep && target < base + local[j] + w[j]) atomicMin(&sh.index_b, i);
  }
  __syncthreads();
  const int pick = sh.index_b != INT_MAX ? sh.index_b : keep - 1;
  const int chosen = rank_id(sh.list_s[pick]);
  __syncthreads();
  return chosen;
}

// Block-wide combine of the per-thread online softmax (max, sum) and the two rank maxima.
__device__ __forceinline__ void combine_softmax(float& m, float& s, float om, float os) {
  const float nm = fmaxf(m, om);
  if (nm == -INFINITY) {
    s += os;
    return;
  }
  s = s * expf(m - nm) + os * expf(om - nm);
  m = nm;
}

__device__ void reduce_pass1(Shared& sh, float& max, float& sum, uint64_t& raw_best, uint64_t& best) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    combine_softmax(max, sum, __shfl_xor_sync(0xffffffffu, max, o), __shfl_xor_sync(0xffffffffu, sum, o));
    raw_best = ::max(raw_best, __shfl_xor_sync(0xffffffffu, raw_best, o));
    best = ::max(best, __shfl_xor_sync(0xffffffffu, best, o));
  }
  if (lane == 0) {
    sh.warp_max[warp] = max;
    sh.warp_sum[warp] = sum;
    sh.warp_raw_best[warp] = raw_best;
    sh.warp_best[warp] = best;
  }
  __syncthreads();
  if (warp == 0) {
    max = sh.warp_max[lane];
    sum = sh.warp_sum[lane];
    raw_best = sh.warp_raw_best[lane];
    best = sh.warp_best[lane];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      combine_softmax(max, sum, __shfl_xor_sync(0xffffffffu, max, o), __shfl_xor_sync(0xffffffffu, sum, o));
      raw_best = ::max(raw_best, __shfl_xor_sync(0xffffffffu, raw_best, o));
      best = ::max(best, __shfl_xor_sync(0xffffffffu, best, o));
    }
    if (lane == 0) {
      sh.row_max = max;
      sh.row_sum = sum;
      sh.row_raw_best = raw_best;
      sh.row_best = best;
    }
  }
  __syncthreads();
  max = sh.row_max;
  sum = sh.row_sum;
  raw_best = sh.row_raw_best;
  best = sh.row_best;
}

// Finds this thread's slice of the row's adjustment list (sorted by (thread_of(id), id)).
__device__ int first_entry_of_thread(const Adjust* entries, int count, int thread) {
  int lo = 0, hi = count;
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    if (thread_of(entries[mid].id) < thread) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

// A split block's end: its partial out, then the last of the row's blocks to arrive merges the
// partials (warp 0, in a fixed butterfly order: the same bits every launch) and writes the result.
__device__ void split_finish(Shared& sh, const SamplerLaunch& launch, const RowParams& p,
                             float raw_max, float raw_sum, uint64_t best, RowResult& result) {
  const int splits = static_cast<int>(gridDim.y);
  SplitPartial* const partials = launch.partials + static_cast<int64_t>(blockIdx.x) * splits;
  if (threadIdx.x == 0) {
    partials[blockIdx.y] = {best, raw_max, raw_sum, sh.first_nan, 0};
    __threadfence();
    sh.count_s = atomicAdd(launch.arrivals + blockIdx.x, 1u) == static_cast<unsigned>(splits - 1);
  }
  __syncthreads();
  if (!sh.count_s || threadIdx.x >= 32) return;
  __threadfence();
  const int lane = threadIdx.x;
  float m = -INFINITY, sum = 0.0f;
  uint64_t b = 0;
  int nan0 = 0;
  if (lane < splits) {  // L2, not this SM's L1: other blocks wrote them
    m = __ldcg(&partials[lane].max);
    sum = __ldcg(&partials[lane].sum);
    b = __ldcg(reinterpret_cast<const unsigned long long*>(&partials[lane].best));
    nan0 = __ldcg(&partials[lane].first_nan);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    combine_softmax(m, sum, __shfl_xor_sync(0xffffffffu, m, o),
                    __shfl_xor_sync(0xffffffffu, sum, o));
    b = ::max(b, static_cast<uint64_t>(
                     __shfl_xor_sync(0xffffffffu, static_cast<unsigned long long>(b), o)));
    nan0 |= __shfl_xor_sync(0xffffffffu, nan0, o);
  }
  if (lane == 0) {
    launch.arrivals[blockIdx.x] = 0;  // for the next launch (stream order)
    const int chosen = p.score ? p.target : (nan0 ? 0 : rank_id(b));
    const float normaliser = m + logf(sum);
    result.token = chosen;
    result.logprob =
        chosen >= 0 && chosen < launch.vocab
            ? __ldg(launch.logits + static_cast<int64_t>(blockIdx.x) * launch.vocab + chosen) -
                  normaliser
            : -INFINITY;
    result.top_count = 0;
  }
}

__global__ void __launch_bounds__(kThreads, 1) sampler_kernel(const SamplerLaunch launch) {
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  Shared& sh = *reinterpret_cast<Shared*>(shared_bytes);
  const int tid = threadIdx.x;
  const RowParams p = launch.params[blockIdx.x];
  RowResult& result = launch.results[blockIdx.x];
  const int vocab = launch.vocab;
  // A pass-1-only row in a launch with splits: this block reads tiles [t0, t1) of it.
  const bool split = gridDim.y > 1 && pass1_only(p);
  if (!split && blockIdx.y > 0) return;
  int begin = 0, end = vocab;
  if (split) {
    const int tiles = (vocab + kTile - 1) / kTile, splits = static_cast<int>(gridDim.y);
    begin = tiles * static_cast<int>(blockIdx.y) / splits * kTile;
    end = min(vocab, tiles * (static_cast<int>(blockIdx.y) + 1) / splits * kTile);
  }
  if (tid == 0) sh.first_nan = 0;  // (tid 0 is also the thread that reads id 0)

  RowReader row;
  row.raw = launch.logits + static_cast<int64_t>(blockIdx.x) * vocab;
  row.vocab = vocab;
  row.vec4 = launch.vec4;
  row.adjusted = !p.score;
  row.temperature = p.temperature;
  row.repetition_penalty = p.repetition_penalty;
  {
    const Adjust* entries = launch.adjust + p.adjust_begin;
    const int lo = first_entry_of_thread(entries, p.adjust_count, tid);
    const int hi = first_entry_of_thread(entries, p.adjust_count, tid + 1);
    row.adjust = entries + lo;
    row.adjust_count = hi - lo;
  }
  RowReader raw_row = row;
  raw_row.adjusted = false;
  const int top_n = min(max(p.top_logprobs, 0), min(kMaxTopLogprobs, vocab));

  // Pass 1: the raw log-softmax normaliser (online max/sum), the best raw and adjusted ranks.
  float raw_max = -INFINITY, raw_sum = 0.0f;
  uint64_t raw_best = 0, best = 0;
  scan_row(
      row,
      [&](int id, float x, float v) {
        if (x > raw_max) {
          raw_sum = raw_sum * expf(raw_max - x) + 1.0f;
          raw_max = x;
        } else if (x != -INFINITY) {
          raw_sum += expf(x - raw_max);  // -inf adds nothing (and -inf - -inf would be NaN)
        }
        raw_best = max(raw_best, rank_key(x, id));
        best = max(best, rank_key(v, id));
        if (id == 0) sh.first_nan = isnan(v);  // the CPU's argmax keeps a NaN at id 0
      },
      begin, end);
  // Keep the per-thread maxima for the candidate thresholds below.
  const uint64_t thread_raw_best = raw_best, thread_best = best;
  reduce_pass1(sh, raw_max, raw_sum, raw_best, best);
  if (split) {
    split_finish(sh, launch, p, raw_max, raw_sum, best, result);
    return;
  }
  const float normaliser = raw_max + logf(raw_sum);
  const float max_value = rank_value(best);

  const bool sampling = !p.score && p.temperature > 0.0f && isfinite(max_value);
  int chosen = p.score ? p.target : (sh.first_nan ? 0 : rank_id(best));
  const bool top_p_cut = p.top_p < 1.0f;
  int k_fast = 0;
  if (sampling) {
    if (p.top_k > 0 && p.top_k <= kFastTopK) k_fast = p.top_k;
    else if (p.top_k <= 0 && top_p_cut) k_fast = kProbeTopP;
  }

  // Thresholds from the per-thread maxima: the k-th best of 1024 distinct threads' best ranks
  // L has at least k elements ranked >= L, so the top k (of the candidates, or of the raw row)
  // all rank >= L; collecting ranks >= L is typically k plus a few.
  uint64_t limit_r = 0, limit_s = 0;
  if (top_n > 0 || k_fast > 0) {
    sh.list_r[tid] = thread_raw_best;
    sh.list_s[tid] = thread_best;
    __syncthreads();
    sort_desc(sh.list_r, kThreads, sh.list_s);
    if (top_n > 0) limit_r = sh.list_r[top_n - 1];
    if (k_fast > 0) limit_s = sh.list_s[k_fast - 1];
    __syncthreads();
  }
  if (tid == 0) {
    sh.count_r = 0;
    sh.count_s = 0;
  }
  __syncthreads();

  // Pass 2: collect the candidates (top logprobs, sampling), each thread's candidate mass.
  float mass = 0.0f;
  int candidates = 0;
  if (top_n > 0 || sampling) {
    scan_row(sampling ? row : raw_row, [&](int id, float x, float v) {
      if (top_n > 0) {
        const uint64_t key = rank_key(x, id);
        if (key >= limit_r) push(sh.list_r, &sh.count_r, key);
      }
      if (sampling) {
        const float w = expf(v - max_value);
        if (w > 0.0f && w >= p.min_p) {
          mass += w;
          ++candidates;
          if (k_fast > 0) {
            const uint64_t key = rank_key(v, id);
            if (key >= limit_s) push(sh.list_s, &sh.count_s, key);
          }
        }
      }
    });
    __syncthreads();
  }

  // Top logprobs: sort the raw list; on overflow (massive ties at the limit), the exact cut by
  // radix select, then collect exactly top_n.
  if (top_n > 0) {
    int c = sh.count_r;
    if (c > kListCap) {
      const Selection cut = radix_select(sh, raw_row, RawKey{}, false, top_n, 0.0f, 0.0f);
      if (tid == 0) sh.count_r = 0;
      __syncthreads();
      scan_row(raw_row, [&](int id, float x, float) {
        const uint32_t key = order_key(x);
        if (!cut.active || key > cut.key || (key == cut.key && id <= cut.id_cut))
          push(sh.list_r, &sh.count_r, rank_key(x, id));
      });
      __syncthreads();
      c = min(sh.count_r, kListCap);
    }
    const int padded = pow2_at_least(c);
    for (int i = c + tid; i < padded; i += kThreads) sh.list_r[i] = 0;
    __syncthreads();
    sort_desc(sh.list_r, padded);
    const int count = min(top_n, c);
    if (tid < count) {
      const uint64_t key = sh.list_r[tid];
      result.top_ids[tid] = rank_id(key);
      result.top_logprobs[tid] = rank_value(key) - normaliser;
    }
    if (tid == 0) result.top_count = count;
    __syncthreads();  // list_r is reused as the radix histogram below
  } else if (tid == 0) {
    result.top_count = 0;
  }

  if (sampling) {
    KeepFilter keep{max_value, p.min_p};
    int drawn = -1;
    if (p.top_k <= 0 && !top_p_cut) {
      // No cut: the draw over all candidates, from pass 2's per-thread masses.
      drawn = draw_thread_major(sh, row, mass, p.u, keep);
    } else {
      double cand_mass;
      int cand_count;
      block_exclusive_scan(static_cast<double>(mass), cand_mass, sh.scan_d);
      block_exclusive_scan(candidates, cand_count, sh.scan_i);
      const int c = sh.count_s;
      if (k_fast > 0 && c >= 1 && c <= kListCap)
        drawn = draw_from_list(sh, c, p, max_value, cand_count, cand_mass);
      if (drawn < 0) {
        // Fallback: exact cuts by radix select, then a draw pass over the kept tokens.
        if (p.top_k > 0) {
          const Selection cut = radix_select(sh, row, keep, false, p.top_k, 0.0f, max_value);
          keep.has_k = cut.active;
          keep.key_k = cut.key;
          keep.id_k = cut.id_cut;
        }
        if (top_p_cut) {
          const Selection cut = radix_select(sh, row, keep, true, 0, p.top_p, max_value);
          keep.has_p = cut.active;
          keep.key_p = cut.key;
          keep.id_p = cut.id_cut;
        }
        float kept_mass = 0.0f;
        scan_row(row, [&](int id, float x, float v) {
          uint32_t key;
          float w;
          if (keep(id, x, v, key, w)) kept_mass += w;
        });
        drawn = draw_thread_major(sh, row, kept_mass, p.u, keep);
      }
    }
    if (drawn >= 0 && drawn < vocab) chosen = drawn;
  }

  if (tid == 0) {
    result.token = chosen;
    result.logprob = chosen >= 0 && chosen < vocab ? __ldg(row.raw + chosen) - normaliser : -INFINITY;
  }
}

// ---- host --------------------------------------------------------------------------------------

// Must match backend/cpu/cpu_sampler.cpp: the same (seed, draw index) gives the same u.
uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

double uniform01(uint64_t seed, uint64_t index) {
  uint64_t bits = splitmix64(seed ^ splitmix64(index + 0x632be59bd9b4e019ull));
  return static_cast<double>(bits >> 11) * (1.0 / 9007199254740992.0);
}

size_t align16(size_t bytes) { return (bytes + 15) & ~size_t{15}; }

}  // namespace


struct CudaSampler::State {
  int64_t max_rows = 0;
  int64_t vocab = 0;
  int64_t adjust_capacity = 0;           // entries per launch (>= vocab: any one row fits)
  unsigned char* upload_host = nullptr;  // pinned: RowParams[rows], then Adjust[entries]
  unsigned char* upload_device = nullptr;
  RowResult* results_host = nullptr;  // pinned
  RowResult* results_device = nullptr;
  SplitPartial* partials = nullptr;  // [max_rows, kMaxSplits]
  unsigned* arrivals = nullptr;      // [max_rows], zeroed; the merging block re-zeroes its row's
  // Host staging of one launch, sized in reserve().
  std::vector<RowParams> params;
  std::vector<Adjust> adjust;
  std::vector<Adjust> row_adjust;
  std::vector<int32_t> row_counts;
  std::vector<int32_t> slot_of_id;  // id -> index in row_adjust, -1 when absent
  // The launch whose results complete() fills (sample with wait = false), or none.
  std::vector<SampledToken>* pending_out = nullptr;
  int64_t pending_first = 0;
  size_t pending_rows = 0;

  void release() {
    if (upload_host) cudaFreeHost(upload_host);
    if (upload_device) cudaFree(upload_device);
    if (results_host) cudaFreeHost(results_host);
    if (results_device) cudaFree(results_device);
    if (partials) cudaFree(partials);
    if (arrivals) cudaFree(arrivals);
    upload_host = upload_device = nullptr;
    results_host = results_device = nullptr;
    partials = nullptr;
    arrivals = nullptr;
  }

  // One entry per distinct adjusted token of `row`, sorted by (reading thread, id).
  void build_row(const SamplingRow& row, int64_t row_vocab) {
    row_adjust.clear();
    row_counts.clear();
    auto entry = [&](int32_t id) -> Adjust* {
      if (id < 0 || id >= row_vocab) return nullptr;
      int32_t& slot = slot_of_id[static_cast<size_t>(id)];
      if (slot < 0) {
        slot = static_cast<int32_t>(row_adjust.size());
        row_adjust.push_back({id, 0u, 0.0f, 0.0f});
        row_counts.push_back(0);
      }
      return &row_adjust[static_cast<size_t>(slot)];
    };
    if (row.repetition_penalty != 1.0f)
      for (const std::vector<int32_t>* tokens : {row.prompt_tokens, row.output_tokens})
        if (tokens)
          for (int32_t id : *tokens)
            if (Adjust* a = entry(id)) a->flags |= kRepetition;
    if ((row.frequency_penalty != 0.0f || row.presence_penalty != 0.0f) && row.output_tokens) {
      for (int32_t id : *row.output_tokens)
        if (Adjust* a = entry(id)) ++row_counts[static_cast<size_t>(a - row_adjust.data())];
      for (size_t e = 0; e < row_adjust.size(); ++e)
        if (row_counts[e] > 0) {
          row_adjust[e].flags |= kPenalty;
          row_adjust[e].penalty = row.frequency_penalty * row_counts[e] + row.presence_penalty;
        }
    }
    if (row.logit_bias)
      for (auto [id, bias] : *row.logit_bias)
        if (Adjust* a = entry(id)) {
          a->bias = (a->flags & kBias) ? a->bias + bias : bias;
          a->flags |= kBias;
        }
    for (int32_t id : row.banned_tokens)
      if (Adjust* a = entry(id)) a->flags |= kBan;
    for (const Adjust& a : row_adjust) slot_of_id[static_cast<size_t>(a.id)] = -1;
    std::sort(row_adjust.begin(), row_adjust.end(), [](const Adjust& a, const Adjust& b) {
      const int ta = thread_of(a.id), tb = thread_of(b.id);
      return ta != tb ? ta < tb : a.id < b.id;
    });
  }

  // Runs the staged rows on logits rows [first_row, first_row + params.size()) and fills their
  // results: one upload, one launch, one download, one synchronisation.
  void run(CudaContext& context, const Tensor& logits, int64_t first_row, std::vector<SampledToken>& out) {
    launch(context, logits, first_row, out);
    complete(context);
  }
  // The first half of run(): enqueues the upload, the launch and the download; complete() waits
  // and fills `out` (which the caller keeps alive until then).
  void launch(CudaContext& context, const Tensor& logits, int64_t first_row,
              std::vector<SampledToken>& out) {
    complete(context);  // one launch in flight: the results buffer is reused
    const size_t rows = params.size();
    if (rows == 0) return;
    const int64_t row_vocab = logits.dim(1);
    const size_t params_bytes = align16(rows * sizeof(RowParams));
    std::memcpy(upload_host, params.data(), rows * sizeof(RowParams));
    if (!adjust.empty())
      std::memcpy(upload_host + params_bytes, adjust.data(), adjust.size() * sizeof(Adjust));
    SY_CUDA_CHECK(cudaMemcpyAsync(upload_device, upload_host, params_bytes + adjust.size() * sizeof(Adjust),
                                  cudaMemcpyHostToDevice, context.stream));
    SamplerLaunch launch;
    launch.logits = logits.ptr<float>() + first_row * row_vocab;
    launch.vocab = static_cast<int>(row_vocab);
    launch.vec4 = row_vocab % kGroup == 0 && reinterpret_cast<uintptr_t>(launch.logits) % 16 == 0;
    launch.params = reinterpret_cast<const RowParams*>(upload_device);
    launch.adjust = reinterpret_cast<const Adjust*>(upload_device + params_bytes);
    launch.results = results_device;
    launch.partials = partials;
    launch.arrivals = arrivals;
    const bool any_split = std::any_of(params.begin(), params.end(), pass1_only);
    const dim3 grid(static_cast<unsigned>(rows),
                    static_cast<unsigned>(any_split ? split_count(launch.vocab) : 1));
    sampler_kernel<<<grid, kThreads, sizeof(Shared), context.stream>>>(launch);
    SY_CUDA_LAUNCH_CHECK("sampler_kernel");
    SY_CUDA_CHECK(cudaMemcpyAsync(results_host, results_device, rows * sizeof(RowResult),
                                  cudaMemcpyDeviceToHost, context.stream));
    pending_out = &out;
    pending_first = first_row;
    pending_rows = rows;
    params.clear();
    adjust.clear();
  }
  void complete(CudaContext& context) {
    if (!pending_out) return;
    SY_CUDA_CHECK(cudaStreamSynchronize(context.stream));
    std::vector<SampledToken>& out = *pending_out;
    const int64_t first_row = pending_first;
    const size_t rows = pending_rows;
    pending_out = nullptr;
    for (size_t r = 0; r < rows; ++r) {
      const RowResult& result = results_host[r];
      SampledToken& token = out[static_cast<size_t>(first_row) + r];
      token.token_id = result.token;
      token.logprob = result.logprob;
      token.top.clear();
      for (int i = 0; i < result.top_count; ++i)
        token.top.emplace_back(result.top_ids[i], result.top_logprobs[i]);
    }
  }
};

CudaSampler::CudaSampler(CudaContext& context) : context_(context), state_(std::make_unique<State>()) {}

CudaSampler::~CudaSampler() { state_->release(); }

void CudaSampler::reserve(int64_t max_rows, int64_t vocab) {
  State& s = *state_;
  if (max_rows <= s.max_rows && vocab <= s.vocab) return;
  if (vocab >= (int64_t{1} << 30)) cuda_fail("CudaSampler::reserve", "vocab too large", __FILE__, __LINE__);
  SY_CUDA_CHECK(cudaSetDevice(context_.device));
  s.release();
  s.max_rows = std::max<int64_t>({max_rows, s.max_rows, 1});
  s.vocab = std::max<int64_t>({vocab, s.vocab, 1});
  s.adjust_capacity = std::max<int64_t>(s.vocab, std::min<int64_t>(s.max_rows * 1024, int64_t{1} << 19));
  const size_t upload_bytes = align16(static_cast<size_t>(s.max_rows) * sizeof(RowParams)) +
                              static_cast<size_t>(s.adjust_capacity) * sizeof(Adjust);
  const size_t result_bytes = static_cast<size_t>(s.max_rows) * sizeof(RowResult);
  SY_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&s.upload_host), upload_bytes));
  SY_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&s.upload_device), upload_bytes));
  SY_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&s.results_host), result_bytes));
  SY_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&s.results_device), result_bytes));
  SY_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&s.partials),
                           static_cast<size_t>(s.max_rows) * kMaxSplits * sizeof(SplitPartial)));
  SY_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&s.arrivals),
                           static_cast<size_t>(s.max_rows) * sizeof(unsigned)));
  SY_CUDA_CHECK(cudaMemsetAsync(s.arrivals, 0, static_cast<size_t>(s.max_rows) * sizeof(unsigned),
                                context_.stream));
  SY_CUDA_CHECK(cudaFuncSetAttribute(sampler_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(sizeof(Shared))));
  s.params.reserve(static_cast<size_t>(s.max_rows));
  s.adjust.reserve(static_cast<size_t>(s.adjust_capacity));
  s.row_adjust.reserve(static_cast<size_t>(s.vocab));
  s.row_counts.reserve(static_cast<size_t>(s.vocab));
  s.slot_of_id.assign(static_cast<size_t>(s.vocab), -1);
}

void CudaSampler::sample(const Tensor& logits, const std::vector<SamplingRow>& rows,
                         std::vector<SampledToken>& out, bool wait) {
  State& s = *state_;
  s.complete(context_);
  const int64_t n = static_cast<int64_t>(rows.size());
  const int64_t vocab = logits.dim(1);
  out.resize(rows.size());
  if (n == 0) return;
  if (n > s.max_rows || vocab > s.vocab) reserve(n, vocab);  // only when the caller's reserve() was short
  int64_t first = 0;
  for (int64_t r = 0; r < n; ++r) {
    const SamplingRow& row = rows[static_cast<size_t>(r)];
    s.build_row(row, vocab);
    if (static_cast<int64_t>(s.adjust.size() + s.row_adjust.size()) > s.adjust_capacity) {
      s.run(context_, logits, first, out);  // rare: a launch's adjustments overflow the buffer
      first = r;
    }
    RowParams p{};
    p.u = uniform01(row.seed, row.draw_index);
    p.temperature = row.temperature;
    p.top_p = row.top_p;
    p.min_p = row.min_p;
    p.repetition_penalty = row.repetition_penalty;
    p.top_k = row.top_k > 0 && row.top_k < vocab ? row.top_k : 0;
    p.top_logprobs = std::clamp(row.logprobs, 0, kMaxTopLogprobs);
    p.target = -1;
    p.score = 0;
    p.adjust_begin = static_cast<int32_t>(s.adjust.size());
    p.adjust_count = static_cast<int32_t>(s.row_adjust.size());
    s.adjust.insert(s.adjust.end(), s.row_adjust.begin(), s.row_adjust.end());
    s.params.push_back(p);
  }
  s.launch(context_, logits, first, out);
  if (wait) s.complete(context_);
}

void CudaSampler::complete() {
  state_->complete(context_);
}

void CudaSampler::score(const Tensor& logits, const std::vector<int32_t>& targets, int top_k,
                        std::vector<SampledToken>& out) {
  State& s = *state_;
  s.complete(context_);
  const int64_t n = static_cast<int64_t>(targets.size());
  const int64_t vocab = logits.dim(1);
  out.resize(targets.size());
  if (n == 0) return;
  if (n > s.max_rows || vocab > s.vocab) reserve(n, vocab);
  for (int32_t target : targets) {
    RowParams p{};
    p.temperature = 0.0f;
    p.top_p = 1.0f;
    p.repetition_penalty = 1.0f;
    p.top_logprobs = std::clamp(top_k, 0, kMaxTopLogprobs);
    p.target = target;
    p.score = 1;
    s.params.push_back(p);
  }
  s.run(context_, logits, 0, out);
}

}  // namespace sy::backend::cuda
