// Paged attention on CUDA over a bf16 KV cache ([slots, kv_heads, head_dim] per layer, slot =
// block * block_size + offset, blocks from each sequence's row of the block table).
//   write: this step's K/V (f32) into the cache at slot_mapping (slot -1 = padding, skipped).
//   attention: causal, GQA; a token at position p of sequence s attends to positions 0..p of s,
//   all read from the cache (this step's K/V are written first). Two kernels: decode (every
//   sequence has one query token) splits each context across blocks (flash-decoding) with a
//   grid that does not depend on context lengths (CUDA graphs replay it), the last split of a
//   token to finish merging the partials; prefill is
//   flash-attention style over cached blocks (chunked prefill: queries at any positions).
// Floors: decode reads each token's K/V once (bytes / bandwidth); prefill does
// 4 * q_tokens * context * head_dim * heads FLOPs (causal: about half of that).
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend/cuda/cuda_context.h"

namespace sy::backend::cuda {

void launch_write_kv(const float* k, const float* v, __nv_bfloat16* k_cache, __nv_bfloat16* v_cache,
                     const int32_t* slot_mapping, int64_t tokens, int kv_heads, int head_dim,
                     cudaStream_t stream);

// The attention block's work between the projections and attention, one launch: per-head
// RMSNorm of q and k (each optional), RoPE (as launch_rope), k and v into the cache at
// slot_mapping; q and k updated in place. A warp per (token, head); head_dim <= 256, even.
struct QkvPrepParams {
  float* q = nullptr;        // [tokens, heads, head_dim]
  float* k = nullptr;        // [tokens, kv_heads, head_dim]
  const float* v = nullptr;  // [tokens, kv_heads, head_dim]
  const float* q_norm = nullptr;  // [head_dim] or nullptr
  const float* k_norm = nullptr;
  float eps = 1e-6f;
  const int32_t* positions = nullptr;
  const int32_t* slot_mapping = nullptr;
  __nv_bfloat16* k_cache = nullptr;
  __nv_bfloat16* v_cache = nullptr;
  int64_t tokens = 0;
  int heads = 0, kv_heads = 0, head_dim = 0;
  double theta = 10000.0;
  // YaRN (RopeSpec): the head_dim / 2 frequencies (host memory, read at launch) replacing
  // theta's, and the factor cos and sin are multiplied by.
  const float* inv_freq = nullptr;
  float attention_factor = 1.0f;
};
void launch_qk_norm_rope_write_kv(const QkvPrepParams& params, cudaStream_t stream);

struct AttentionParams {
  const float* q = nullptr;  // [tokens, heads, head_dim], RoPE applied
  const __nv_bfloat16* k_cache = nullptr;
  const __nv_bfloat16* v_cache = nullptr;
  const int32_t* positions = nullptr;     // [tokens]
  const int32_t* token_seq = nullptr;     // [tokens]
  const int32_t* block_tables = nullptr;  // [seqs, block_table_stride]
  int block_table_stride = 0;
  int block_size = 16;
  int64_t tokens = 0;
  int heads = 0;
  int kv_heads = 0;
  // <= 256. Multiples of 8 (64, 80, 96, 128, 256, ...) run on tensor cores; other even or odd
  // widths (tiny test models) on a plain kernel, a warp per (token, head), same semantics.
  int head_dim = 0;
  float scale = 1.0f;
  // W > 0: a query at position p sees only keys at positions > p - W (transformers' sliding
  // window); 0: every earlier key.
  int sliding_window = 0;
  // [heads] f32 or nullptr: attention sinks (gpt-oss), a logit per head that joins each query's
  // softmax denominator in natural units (not scaled by `scale`).
  const float* sinks = nullptr;
  // --batch-invariant: every step runs the prefill tiling (a row's keys in one warp, in key tiles
  // at fixed multiples of the tile size, no decode splits), so a row's output never depends on
  // the step's other tokens.
  bool batch_invariant = false;
  float* out = nullptr;  // [tokens, heads * head_dim] f32
  // Host-side facts about the step: 1 = every sequence has one query token (decode kernel).
  int64_t max_query_len = 1;
  int64_t max_context_len = 0;  // prefill kernel only (decode must not depend on it)
};

// Scratch the decode kernel needs for up to `max_decode_tokens` tokens (reserved once), and its
// arrival counters (int32, zeroed once at reserve; every launch leaves them zero).
size_t attention_scratch_bytes(int64_t max_decode_tokens, int heads, int head_dim);
size_t attention_arrivals_count(int64_t max_decode_tokens, int heads);
// `scratch` holds attention_scratch_bytes(...) and `arrivals` attention_arrivals_count(...) for
// at least params.tokens decode tokens (either null: no key splits).
void launch_attention(const AttentionParams& params, void* scratch, int* arrivals, cudaStream_t stream);
// launch_qk_norm_rope_write_kv(prep) then launch_attention(params) as one decode kernel
// (params.q unused; prep's q and k are not updated in place): bitwise the same output and
// cache. Returns false, having launched nothing, for a step it does not fuse (prefill, a GQA
// group wider than 16).
bool launch_prep_attention(const QkvPrepParams& prep, const AttentionParams& params, void* scratch, int* arrivals,
                           cudaStream_t stream);

}  // namespace sy::backend::cuda
