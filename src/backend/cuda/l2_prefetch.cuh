// PrefetchHint on CUDA: an op whose own memory traffic is light for a while (a one-token decode
// attention after its key loads, a one-token MoE step's top-k and grouping) issues bulk L2
// prefetches (sm_90) of the weights the ops after it read first, each block one share, so that
// those ops find them in L2 instead of waiting on DRAM. The weights' later readers must not be
// flushed out by streams that pass through L2 meanwhile: those use evict-first loads.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "backend/cuda/cuda_context.h"
#include "tensor/tensor.h"

namespace sy::backend::cuda {

// Steps of at most this many tokens issue the hints; wider ones keep DRAM busy themselves.
constexpr int64_t kPrefetchMaxTokens = 8;

struct L2Prefetch {
  static constexpr int kMax = PrefetchHint::kMaxWeights;
  const char* base[kMax] = {};
  int64_t bytes[kMax] = {};  // multiples of 16
  int64_t total = 0;
};

// The hint's device weights, at most `limit` bytes in all (the rest is not prefetched: more
// than the cache holds would evict its own start). SY_L2_PREFETCH=0 (experiments): none.
inline L2Prefetch make_l2_prefetch(const PrefetchHint& hint, int64_t limit) {
  static const bool off = [] {
    const char* value = std::getenv("SY_L2_PREFETCH");
    return value && value[0] == '0';
  }();
  L2Prefetch p;
  if (off) return p;
  int n = 0;
  for (const Tensor* w : hint.weights) {
    if (!w || !w->data || w->device != Device::kCuda) continue;
    if ((reinterpret_cast<uintptr_t>(w->data) & 15u) != 0) continue;  // bulk copies need 16-byte alignment
    const int64_t bytes = std::min<int64_t>(static_cast<int64_t>(w->nbytes()), limit - p.total) & ~int64_t{15};
    if (bytes <= 0) break;
    p.base[n] = static_cast<const char*>(w->data);
    p.bytes[n++] = bytes;
    p.total += bytes;
  }
  return p;
}

// Share `part` of `parts` of the ranges, issued by the calling thread (one thread a block).
__device__ __forceinline__ void issue_l2_prefetch(const L2Prefetch& p, int part, int parts) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (p.total == 0) return;
  constexpr int64_t kPiece = int64_t{1} << 20;  // the instruction's size is 32-bit
  const int64_t lo = p.total * part / parts & ~int64_t{15};
  const int64_t hi = part + 1 == parts ? p.total : p.total * (part + 1) / parts & ~int64_t{15};
  int64_t offset = 0;
#pragma unroll
  for (int i = 0; i < L2Prefetch::kMax; ++i) {
    const int64_t end = min(hi, offset + p.bytes[i]);
    for (int64_t at = max(lo, offset); at < end; at += kPiece) {
      const unsigned size = static_cast<unsigned>(min(end - at, kPiece));
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p.base[i] + (at - offset)), "r"(size)
                   : "memory");
    }
    offset += p.bytes[i];
  }
#else
  (void)p, (void)part, (void)parts;
#endif
}

}  // namespace sy::backend::cuda
