// Routing on CUDA, shared by every MoE kernel so that all of them choose bitwise the same experts
// from the same hidden states: router logits (one fixed sum on tensor cores, below), softmax or
// sigmoid scores, top-k by (score desc, id asc), gating weights as the CPU reference
// router (moe/router.cpp) computes them, forced ids for replayed rows. NaN scores never select
// an invalid id. Floor: reading the router matrix (E * H * 2 bytes) once per step.
#pragma once

#include <cstdint>

#include "backend/cuda/cuda_context.h"
#include "backend/cuda/mma_ptx.cuh"
#include "backend/cuda/norm_row.cuh"
#include "moe/experts_kernel.h"
#include "moe/router_spec.h"

namespace sy::backend::cuda {

constexpr int kMaxRouteExperts = 1024;
constexpr int kMaxRouteTopK = 32;
constexpr int kMaxRouteGroups = 32;  // group-limited top-k: one bit per group

// How an expert's gate/up become its activation, and the biases (ExpertSpec; experts kStacked,
// or MXFP4 as stored for cuda-modular, whose gate_up rows and bias interleave gate and up). The
// CPU's arithmetic (backend/cpu/moe_experts.cpp): biases added to the projections in f32, then
// SwiGLU or gpt-oss's clamped SwiGLU.
struct ExpertParams {
  const __nv_bfloat16* gate_up_bias = nullptr;  // [E, 2I]: gate then up (interleaved: 2r, 2r+1), or nullptr
  const __nv_bfloat16* down_bias = nullptr;     // [E, H] or nullptr
  bool clamped = false;
  bool interleaved = false;  // gate_up rows and bias as gpt-oss stores them (kMxfp4Interleaved)
  float alpha = 1.702f, limit = 7.0f;
  static ExpertParams from(const moe::ExpertSpec& spec, const moe::MoeLayerWeights& w) {
    ExpertParams p;
    if (spec.has_biases) {
      p.gate_up_bias = w.gate_up_bias.ptr<__nv_bfloat16>();
      p.down_bias = w.down_bias.ptr<__nv_bfloat16>();
    }
    p.clamped = spec.activation == moe::ExpertActivation::kClampedSwiGlu;
    p.interleaved = spec.format == moe::ExpertFormat::kMxfp4Interleaved;
    p.alpha = spec.alpha;
    p.limit = spec.limit;
    return p;
  }
  // What both CUDA kernels compute: stacked bf16 experts, either activation, biases or not
  // (cuda-modular also reads MXFP4: implements_mxfp4).
  static bool implements(const moe::ExpertSpec& spec) { return spec.format == moe::ExpertFormat::kStacked; }
  static bool implements_mxfp4(const moe::ExpertSpec& spec) {
    return spec.format == moe::ExpertFormat::kMxfp4Interleaved;
  }
  // Expert e's activation of column r from its gate and up dot products.
  __device__ __forceinline__ float activate(int64_t e, int r, int I, float gate, float up) const {
    if (gate_up_bias) {
      const int64_t gate_at = e * 2 * I + (interleaved ? 2 * r : r);
      gate += __bfloat162float(gate_up_bias[gate_at]);
      up += __bfloat162float(gate_up_bias[interleaved ? gate_at + 1 : gate_at + I]);
    }
    if (clamped) {
      gate = fminf(gate, limit);
      up = fminf(fmaxf(up, -limit), limit);
      return (up + 1.0f) * (gate / (1.0f + expf(-gate * alpha)));
    }
    return gate / (1.0f + expf(-gate)) * up;
  }
  // Expert e's down-projection bias of hidden row h (0 without biases).
  __device__ __forceinline__ float down_bias_of(int64_t e, int h, int H) const {
    return down_bias ? __bfloat162float(down_bias[e * H + h]) : 0.0f;
  }
};

struct RouteParams {
  int num_experts = 0;
  int top_k = 0;
  int hidden = 0;
  bool sigmoid = false;
  bool renormalize = false;
  bool softmax_after_topk = false;
  float scaling = 1.0f;
  // The extended options (RouterSpec::uses_extended_options): [E] f32 device vectors or
  // nullptr, and group-limited top-k (num_groups > 1).
  const float* logit_bias = nullptr;      // added to the logits (gpt-oss)
  const float* selection_bias = nullptr;  // added to the scores for selection only (DeepSeek-V3)
  int num_groups = 1, topk_groups = 1;
  bool group_top_two = false;  // a group's score: the sum of its two best (else its best)
  // Whether the CUDA router implements `spec` (every option, groups up to kMaxRouteGroups).
  static bool implements(const moe::RouterSpec& spec) {
    return spec.num_groups >= 1 && spec.num_groups <= kMaxRouteGroups && spec.num_experts % spec.num_groups == 0;
  }
  static RouteParams from(const moe::RouterSpec& spec, int64_t hidden, const moe::MoeLayerWeights& w) {
    RouteParams p = from(spec, hidden);
    if (spec.has_logit_bias) p.logit_bias = w.router_bias.ptr<float>();
    if (spec.has_selection_bias) p.selection_bias = w.selection_bias.ptr<float>();
    p.num_groups = static_cast<int>(spec.num_groups);
    p.topk_groups = static_cast<int>(spec.topk_groups);
    p.group_top_two = spec.group_scoring == moe::GroupScoring::kTopTwoSum;
    return p;
  }
  static RouteParams from(const moe::RouterSpec& spec, int64_t hidden) {
    RouteParams p;
    p.num_experts = static_cast<int>(spec.num_experts);
    p.top_k = static_cast<int>(spec.top_k);
    p.hidden = static_cast<int>(hidden);
    p.sigmoid = spec.scoring == moe::RouterScoring::kSigmoid;
    p.renormalize = spec.renormalize;
    p.softmax_after_topk = spec.softmax_after_topk;
    p.scaling = spec.routed_scaling_factor;
    return p;
  }
};

// ---- Router logits on tensor cores ----
// Every router logit on CUDA is this one sum, whichever kernel computes it, so all of them route
// bitwise alike. x (f32) is split exactly into three bf16 terms (hi: its top 16 bits;
// mid: those of x - hi; lo: the rest, at most 8 significant bits; a non-finite x is hi alone), the
// router row is bf16, so every product is exact. The sum runs on tensor cores (mma.sync m16n8k16,
// f32 accumulation) over k groups of kRouterGroup elements: a group's 16-wide k steps in order,
// each step's hi, mid and lo terms in that order, into an accumulator that starts at zero; the
// logit is then ((0 + group 0) + group 1) + ... in group order (router_logits_fill). A group
// is one accumulator's chain and a row's sum never depends on the other rows or columns of its
// tile (an mma computes each output from its own row and column: assumed of the hardware, and
// checked by the harness, whose fused-vs-modular cases tile the same rows differently), so a
// kernel may give each group its own warp (few tokens: many short chains) or run a
// tile's groups in turn in one warp (prefill): the same bits either way. Within a k step, lane
// quad q holds elements 4q .. 4q+3 in its mma k slots 2q, 2q+1, 2q+8, 2q+9 (A and B agree on the
// permutation, so the product is the plain dot): one float4 of x and one 8-byte load of the
// router row. H is a multiple of 8: a last step of 8 elements has lanes q >= 2 zero.
// (It replaced a warp's f32 FMA chain per logit, session 24, H200: a Qwen3 batch-64 decode step
// 22.86 -> 20.75 ms, a Qwen3.5 8 x 1,024 prefill 219.5 -> 198.9 ms, batch 1 3.81 -> 3.88 ms;
// BENCHMARKS.md.)
constexpr int kRouterGroup = 128;
constexpr int kRouterGroupSteps = kRouterGroup / 16;
__host__ __device__ constexpr int router_groups(int hidden) {
  return (hidden + kRouterGroup - 1) / kRouterGroup;
}

// v as hi + mid + lo; the terms' bf16 bits in the low 16 bits of each.
__device__ __forceinline__ void router_split(float v, uint32_t& hi, uint32_t& mid, uint32_t& lo) {
  if (!isfinite(v)) {
    hi = __bfloat16_as_ushort(__float2bfloat16_rn(v));
    mid = lo = 0;
    return;
  }
  const uint32_t bits = __float_as_uint(v);
  const float r = v - __uint_as_float(bits & 0xffff0000u);  // exact: v's low 16 bits
  const uint32_t r_bits = __float_as_uint(r);
  const float r2 = r - __uint_as_float(r_bits & 0xffff0000u);  // exact, fits a bf16
  hi = bits >> 16;
  mid = r_bits >> 16;
  lo = __float_as_uint(r2) >> 16;
}

// Lane (g = lane / 4, q = lane % 4)'s A operand terms of one 16-wide k step of a 16-row tile:
// row0/row1 are x[g][k .. k+3] and x[g+8][k .. k+3] at k = step + 4q.
struct RouterTerms {
  uint32_t hi[4], mid[4], lo[4];
};
__device__ __forceinline__ RouterTerms router_terms(const float4& row0, const float4& row1) {
  RouterTerms t;
  const float a[4][2] = {{row0.x, row0.y}, {row1.x, row1.y}, {row0.z, row0.w}, {row1.z, row1.w}};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    uint32_t h0, m0, l0, h1, m1, l1;
    router_split(a[i][0], h0, m0, l0);
    router_split(a[i][1], h1, m1, l1);
    t.hi[i] = h0 | h1 << 16;
    t.mid[i] = m0 | m1 << 16;
    t.lo[i] = l0 | l1 << 16;
  }
  return t;
}
// The step's three mma into a 16 x 8 tile's accumulator; w: the router row e0 + g at k.
__device__ __forceinline__ void router_mma_step(float (&acc)[4], const RouterTerms& t,
                                                const uint2& w) {
  mma_bf16(acc, t.hi, w.x, w.y);
  mma_bf16(acc, t.mid, w.x, w.y);
  mma_bf16(acc, t.lo, w.x, w.y);
}

// One whole warp: group `group`'s sum for the 16 rows x[0 .. rows) (row stride x_stride; rows
// past `rows` are zero) and the 8 router rows e0 .. e0+7 (rows past E are zero). acc is the
// lane's m16n8 fragment: rows g and g+8, experts e0 + 2q and e0 + 2q + 1.
__device__ __forceinline__ void router_group_tile(const float* x, int64_t x_stride, int rows,
                                                  const __nv_bfloat16* __restrict__ router, int H,
                                                  int E, int e0, int group, float (&acc)[4]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  const float* x0 = g < rows ? x + g * x_stride : nullptr;
  const float* x1 = g + 8 < rows ? x + (g + 8) * x_stride : nullptr;
  const __nv_bfloat16* w = e0 + g < E ? router + static_cast<int64_t>(e0 + g) * H : nullptr;
  for (int i = 0; i < 4; ++i) acc[i] = 0.0f;
  const int k_begin = group * kRouterGroup;
  // The group's router loads all at once (one round trip), x in batches of four steps ahead of
  // their mma (the chain's order is unchanged).
  uint2 wv[kRouterGroupSteps];
#pragma unroll
  for (int s = 0; s < kRouterGroupSteps; ++s) {
    const int k = k_begin + s * 16 + 4 * q;
    wv[s] = w && k < H ? *reinterpret_cast<const uint2*>(w + k) : make_uint2(0u, 0u);
  }
#pragma unroll
  for (int s0 = 0; s0 < kRouterGroupSteps; s0 += 4) {
    float4 r0[4], r1[4];
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const int k = k_begin + (s0 + s) * 16 + 4 * q;
      const bool in = k < H;
      r0[s] = x0 && in ? *reinterpret_cast<const float4*>(x0 + k) : make_float4(0.f, 0.f, 0.f, 0.f);
      r1[s] = x1 && in ? *reinterpret_cast<const float4*>(x1 + k) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int s = 0; s < 4; ++s)
      if (k_begin + (s0 + s) * 16 < H) router_mma_step(acc, router_terms(r0[s], r1[s]), wv[s0 + s]);
  }
}

// Writes the valid entries of a tile's fragment into out[t * row_stride + e] (t from row t0,
// e from e0).
__device__ __forceinline__ void router_store_tile(const float (&acc)[4], float* out,
                                                  int64_t row_stride, int t0, int rows, int e0,
                                                  int E) {
  const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int t = g + (i >= 2 ? 8 : 0), e = e0 + 2 * q + (i & 1);
    if (t < rows && e < E) out[static_cast<int64_t>(t0 + t) * row_stride + e] = acc[i];
  }
}

// Token t's logits from its groups' sums, stored [groups][tokens][E]: row[e] = ((0 + g0) + g1)
// + ... (a kernel that summed the groups itself stores that total as its one "group"), for e =
// first, first + stride, ... < E. Four experts' sixteen groups (H = 2,048's all) are loaded at
// once before they are added in order: the sums were just written by other SMs, and a chain of
// such loads would cost a round trip (~1 us) each. (Not __restrict__: cuda-fused reads sums other
// blocks wrote in the same launch, which a non-coherent load could miss.)
__device__ __forceinline__ void router_logits_fill(const float* sums, int groups, int64_t tokens,
                                                   int E, int64_t t, float* row, int first,
                                                   int stride) {
  constexpr int kExperts = 4, kGroups = 16;
  for (int e0 = first; e0 < E; e0 += kExperts * stride) {
    float logit[kExperts];
#pragma unroll
    for (int i = 0; i < kExperts; ++i) logit[i] = 0.0f;
    for (int g0 = 0; g0 < groups; g0 += kGroups) {
      float v[kExperts][kGroups];
#pragma unroll
      for (int i = 0; i < kExperts; ++i)
#pragma unroll
        for (int j = 0; j < kGroups; ++j) {
          const int e = e0 + i * stride, g = g0 + j;
          v[i][j] =
              e < E && g < groups ? sums[(static_cast<int64_t>(g) * tokens + t) * E + e] : 0.0f;
        }
#pragma unroll
      for (int i = 0; i < kExperts; ++i)
#pragma unroll
        for (int j = 0; j < kGroups; ++j)
          if (g0 + j < groups) logit[i] += v[i][j];
    }
#pragma unroll
    for (int i = 0; i < kExperts; ++i)
      if (e0 + i * stride < E) row[e0 + i * stride] = logit[i];
  }
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Scores in place (one whole warp): softmax or sigmoid over logits[0:E], unless the router
// selects on logits (softmax_after_topk).
__device__ __forceinline__ void route_scores_warp(float* scores, const RouteParams& p) {
  const int lane = threadIdx.x & 31;
  const int E = p.num_experts;
  if (p.logit_bias) {  // logits + bias in f32, as the CPU router adds them
    for (int e = lane; e < E; e += 32) scores[e] = scores[e] + p.logit_bias[e];
    __syncwarp();
  }
  if (!p.softmax_after_topk) {
    if (p.sigmoid) {
      for (int e = lane; e < E; e += 32) scores[e] = 1.0f / (1.0f + expf(-scores[e]));
    } else {
      float m = -INFINITY;
      for (int e = lane; e < E; e += 32) m = fmaxf(m, scores[e]);
      m = warp_max(m);
      float s = 0.0f;
      for (int e = lane; e < E; e += 32) {
        const float v = expf(scores[e] - m);
        scores[e] = v;
        s += v;
      }
      s = warp_sum(s);
      for (int e = lane; e < E; e += 32) scores[e] = scores[e] / s;
    }
    __syncwarp();
  }
}

// The selection order: (score desc, id asc), NaN as -inf. a ranks before b.
__device__ __forceinline__ float route_key(float v) {
  return v != v ? -INFINITY : v;
}

// What selection ranks expert e by: its score, plus the selection-only bias where the router
// has one (the CPU router's `choice`).
__device__ __forceinline__ float route_choice(const float* scores, const RouteParams& p, int e) {
  return p.selection_bias ? scores[e] + p.selection_bias[e] : scores[e];
}

// Group-limited top-k (one whole warp, num_groups > 1): the kept groups as a bit mask, lane g
// scoring group g by its best choice (or its two best summed) as the CPU router's keep_groups
// does, then topk_groups rounds of (score desc, group asc). Without groups: every bit set.
__device__ __forceinline__ uint32_t route_kept_groups_warp(const float* scores, const RouteParams& p) {
  if (p.num_groups <= 1) return ~0u;
  const int lane = threadIdx.x & 31, size = p.num_experts / p.num_groups;
  float group_score = -INFINITY;
  if (lane < p.num_groups) {
    float first = -INFINITY, second = -INFINITY;
    for (int i = 0; i < size; ++i) {
      const float v = route_choice(scores, p, lane * size + i);
      if (v > first) {
        second = first;
        first = v;
      } else if (v > second) {
        second = v;
      }
    }
    group_score = p.group_top_two ? first + second : first;
  }
  uint32_t kept = 0;
  for (int round = 0; round < p.topk_groups; ++round) {
    float best = -INFINITY;
    int best_group = p.num_groups;
    if (lane < p.num_groups && !(kept >> lane & 1u)) {
      best = group_score;
      best_group = lane;
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, best, o);
      const int og = __shfl_xor_sync(0xffffffffu, best_group, o);
      if (og != p.num_groups && (best_group == p.num_groups || ov > best || (ov == best && og < best_group))) {
        best = ov;
        best_group = og;
      }
    }
    if (best_group < p.num_groups) kept |= 1u << best_group;
  }
  return kept;
}
__device__ __forceinline__ bool route_group_kept(uint32_t kept, const RouteParams& p, int e) {
  return p.num_groups <= 1 || (kept >> (e / (p.num_experts / p.num_groups)) & 1u);
}

// Gating weights of the chosen ids (one whole warp; lane k < K holds choice k in `chosen`),
// written with the ids by lanes 0..K-1.
__device__ __forceinline__ void route_weights_warp(const float* scores, const RouteParams& p, int32_t chosen,
                                                   int32_t* ids, float* weights) {
  const int lane = threadIdx.x & 31;
  const int K = p.top_k;
  const float* logits = scores;  // softmax_after_topk selected on logits and kept them
  float w = 0.0f;
  if (p.softmax_after_topk) {
    float m = lane < K ? logits[chosen] : -INFINITY;
    m = warp_max(m);
    float e = lane < K ? expf(logits[chosen] - m) : 0.0f;
    const float s = warp_sum(e);
    w = e / s;
  } else {
    w = lane < K ? scores[chosen] : 0.0f;
  }
  if (p.renormalize) {
    const float s = warp_sum(w);
    w = w / s;
  }
  if (p.scaling != 1.0f) w *= p.scaling;
  if (lane < K) {
    ids[lane] = chosen;
    weights[lane] = w;
  }
  __syncwarp();
}

// Run by one whole warp once a token's logits are in shared memory. logits[] is
// turned into scores in place; ids/weights (K each) are written by lane 0..K-1. `forced` (K ids,
// or nullptr) replaces the selection; weights are then recomputed from the scores at those ids.
__device__ __forceinline__ void route_select_warp(float* scores, const RouteParams& p,
                                                  const int32_t* forced, int32_t* ids, float* weights) {
  const int lane = threadIdx.x & 31;
  const int E = p.num_experts, K = p.top_k;
  route_scores_warp(scores, p);
  const uint32_t kept = forced ? ~0u : route_kept_groups_warp(scores, p);
  // Selection: K rounds of a warp argmax by (choice desc, id asc); NaN counts as -inf; experts
  // of dropped groups are never chosen.
  int32_t chosen = -1;  // lane k keeps the k-th choice
  // Bit j: expert lane + 32 j is taken. A register (a dynamically indexed array would live in
  // local memory); a forced id out of range marks nothing.
  static_assert(kMaxRouteExperts <= 32 * 32, "one 32-bit taken mask per lane");
  uint32_t taken = 0;
  for (int k = 0; k < K; ++k) {
    int32_t id = -1;
    if (forced) {
      id = forced[k];
    } else {
      float best = -INFINITY;
      int32_t best_id = E;
      for (int e = lane, j = 0; e < E; e += 32, ++j) {
        if (taken >> j & 1u || !route_group_kept(kept, p, e)) continue;
        const float v = route_key(route_choice(scores, p, e));
        if (best_id == E || v > best || (v == best && e < best_id)) {
          best = v;
          best_id = e;
        }
      }
      for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, best, o);
        const int32_t oid = __shfl_xor_sync(0xffffffffu, best_id, o);
        if (oid != E && (best_id == E || ov > best || (ov == best && oid < best_id))) {
          best = ov;
          best_id = oid;
        }
      }
      id = best_id;
    }
    if (id >= 0 && id < E && (id & 31) == lane) taken |= 1u << (id >> 5);
    if (lane == k) chosen = id;
  }
  route_weights_warp(scores, p, chosen, ids, weights);
}

// Warp 0's selection for one token without expert groups (after route_scores_warp; keys[0:E)
// hold the selection keys, NaN as -inf): the experts ranked K and below into slots[0:K).
// tau = the smallest of W group maxima (W >= K a power of two, group g: the experts of the lanes
// l with l % W == g) has at least K keys >= it, so an expert below tau ranks K or later, and every
// expert ordered before a candidate (key >= tau) is a candidate: ranking the candidates among
// themselves (by (key desc, id asc); compacted in id order, so "id below" is "index below") gives
// the ranks of the whole order. candidates / candidate_keys: E words of shared scratch each.
// Typically ~20 of 128 Qwen3 experts are candidates; with every key equal, all of them are.
__device__ __forceinline__ void route_rank_candidates_warp(const float* keys, int E, int K,
                                                           int32_t* candidates,
                                                           float* candidate_keys, int32_t* slots) {
  const int lane = threadIdx.x & 31;
  float tau = -INFINITY;
  for (int e = lane; e < E; e += 32) tau = fmaxf(tau, keys[e]);
  int width = 1;
  while (width < K) width <<= 1;
  for (int o = 16; o >= width; o >>= 1) tau = fmaxf(tau, __shfl_xor_sync(0xffffffffu, tau, o));
  for (int o = width >> 1; o > 0; o >>= 1) tau = fminf(tau, __shfl_xor_sync(0xffffffffu, tau, o));
  int n = 0;
  for (int base = 0; base < E; base += 32) {  // uniform trip count
    const int e = base + lane;
    const float v = e < E ? keys[e] : -INFINITY;
    const bool in = e < E && v >= tau;
    const uint32_t mask = __ballot_sync(0xffffffffu, in);
    if (in) {
      const int at = n + __popc(mask & ((1u << lane) - 1u));
      candidates[at] = e;
      candidate_keys[at] = v;
    }
    n += __popc(mask);
  }
  __syncwarp();
  for (int i = lane; i < n; i += 32) {
    const float v = candidate_keys[i];
    int before = 0;
#pragma unroll 4
    for (int c = 0; c < n; ++c) {
      const float u = candidate_keys[c];
      before += (u > v || (u == v && c < i)) ? 1 : 0;
    }
    if (before < K) slots[before] = candidates[i];
  }
  __syncwarp();
}

// Every thread of the block ranks experts in parallel (the rank of e under (key desc, id asc)
// is the number of experts ordered before it; ranks < K are the choices, in order) into
// slots[0:K). An expert of a dropped group (not in `kept`) ranks after every kept one.
// tpe adjacent lanes share an expert's scan (a power of two <= 32, blockDim / tpe >= E when E
// is small); each sums its share of "ordered before" counts, then a butterfly. Used for grouped
// routers (without groups route_select_block ranks with warp 0's candidates).
__device__ __forceinline__ void route_rank_block(const float* keys, const RouteParams& p,
                                                 uint32_t kept, int32_t* slots) {
  const int E = p.num_experts, K = p.top_k;
  int tpe = 1;
  while (tpe < 32 && tpe * 2 * E <= static_cast<int>(blockDim.x)) tpe *= 2;
  const int groups = blockDim.x / tpe, sub = threadIdx.x & (tpe - 1);
  for (int base = 0; base < E; base += groups) {  // uniform trip count: shuffles stay converged
    const int e = base + static_cast<int>(threadIdx.x) / tpe;
    // (A dropped group's expert is never a choice: top_k <= the kept groups' experts, checked
    // at start-up.)
    const bool e_in = e < E && route_group_kept(kept, p, e);
    const float v = e < E ? keys[e] : 0.0f;
    int before = 0;
    if (e < E) {
      for (int j = sub; j < E; j += tpe) {
        const bool j_in = route_group_kept(kept, p, j);
        const float u = keys[j];
        before += (j_in != e_in ? j_in : (u > v || (u == v && j < e))) ? 1 : 0;
      }
    }
    for (int o = 1; o < tpe; o <<= 1) before += __shfl_xor_sync(0xffffffffu, before, o);
    if (e_in && sub == 0 && before < K) slots[before] = e;
  }
}

// The same choice as route_select_warp for one token, with the whole block (blockDim.x a
// multiple of 32, >= 64); ids/weights are valid after it returns (it ends with a barrier), and
// every thread calls it. keys: 3 * E floats of shared scratch; slots: K ints. Warp 0 computes
// the scores exactly as route_select_warp does and each expert's selection key into `keys`;
// then, without groups (the common router), warp 0 alone ranks the candidates
// (route_rank_candidates_warp) before the block's next barrier (the whole block's count, in
// every block of the grid, was issue-bound: ~2.6 us of a Qwen3 layer on an H100, session 25's
// stamps; the candidates took Qwen3 48-layer batch 1 from 4.63 to 4.53 ms, session 30);
// with groups, after a barrier, the whole block ranks every expert (route_rank_block); forced
// ids replace the selection. Then warp 0 computes the weights.
// `on_phase(0)` runs after the scores, `on_phase(1)` after the ranking (phase timers);
// `on_chosen(lane)` in warp 0 once ids/weights are written, before the last barrier.
struct NoPhase {
  __device__ void operator()(int) const {}
};
// Whether route_select_block's ranking is warp 0's alone (its grouping of the K choices can then
// be written by warp 0 too, with one barrier fewer).
__device__ __forceinline__ bool route_ranks_candidates(const RouteParams& p,
                                                       const int32_t* forced) {
  return !forced && p.num_groups <= 1;
}
template <typename OnPhase = NoPhase, typename OnChosen = NoPhase>
__device__ __forceinline__ void route_select_block(float* scores, float* keys, const RouteParams& p,
                                                   const int32_t* forced, int32_t* slots,
                                                   int32_t* ids, float* weights,
                                                   OnPhase on_phase = {}, OnChosen on_chosen = {}) {
  const int E = p.num_experts, K = p.top_k;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __shared__ uint32_t s_kept;
  if (warp == 0) {
    route_scores_warp(scores, p);
    const uint32_t kept = forced ? ~0u : route_kept_groups_warp(scores, p);
    for (int e = lane; e < E; e += 32) keys[e] = route_key(route_choice(scores, p, e));
    if (lane == 0) s_kept = kept;
  }
  if (route_ranks_candidates(p, forced)) {
    if (warp == 0) {
      __syncwarp();
      on_phase(0);
      route_rank_candidates_warp(keys, E, K, reinterpret_cast<int32_t*>(keys + E), keys + 2 * E,
                                 slots);
    }
  } else {
    __syncthreads();
    on_phase(0);
    if (forced) {
      if (threadIdx.x < K) slots[threadIdx.x] = forced[threadIdx.x];
    } else {
      route_rank_block(keys, p, s_kept, slots);
    }
    __syncthreads();
  }
  on_phase(1);
  if (warp == 0) {
    route_weights_warp(scores, p, lane < K ? slots[lane] : -1, ids, weights);
    on_chosen(lane);
  }
  __syncthreads();
}

// The router stage as its own kernels (cuda-modular): the logits into `sums`, then a warp per
// token selects. Writes ids/weights [T, K]; with a
// sink, also ids into sink[t * route_row_stride + k] (the layer's column of the step's [T, L, K]
// route buffer); a token with forced[t] != 0 uses source's row instead.
struct RouteLaunch {
  const float* hidden = nullptr;  // [T, H]
  int64_t tokens = 0;
  const __nv_bfloat16* router = nullptr;  // [E, H]
  RouteParams params;
  const uint8_t* forced = nullptr;   // [T] or nullptr
  const int32_t* source = nullptr;   // already offset to this layer
  int32_t* sink = nullptr;           // already offset to this layer, or nullptr
  float* weight_sink = nullptr;      // the gating weights, indexed like sink, or nullptr
  int64_t route_row_stride = 0;      // L * K
  int32_t* ids = nullptr;            // [T, K]
  float* weights = nullptr;          // [T, K]
  float* sums = nullptr;             // scratch: route_sums_floats(T, E, H)
  // One-token steps with the input norm fused (norm_weight set; H % 4 == 0, H <= 8192): `hidden`
  // is unread; every block normalises residual.before(), the sum the combine then stores,
  // itself (NormRow<norm_row_vec(H)>: bitwise add_rms_norm's) and writes its group's slice of the
  // normed row to `normed` [1, H].
  ResidualAdd residual;
  const float* norm_weight = nullptr;
  float eps = 0.0f;
  float* normed = nullptr;
};
// The scratch a step of `tokens` needs (its groups' sums, or the totals).
size_t route_sums_floats(int64_t tokens, int64_t experts, int64_t hidden);
void launch_route(const RouteLaunch& launch, cudaStream_t stream);
// Whether launch_route takes RouteLaunch::norm_weight for such a step.
bool route_fuses_norm(int64_t tokens, int64_t hidden);
// Once, before the first launch_route (its large-step kernel's shared memory above 48 KB).
void prepare_route_kernels();

}  // namespace sy::backend::cuda
