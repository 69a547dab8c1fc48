// Qwen3.5's two token mixers on CUDA (the CPU reference: backend/cpu/linear_attention.cpp).
// Gated DeltaNet: one block per (sequence, value head) runs the sequence's tokens of the step in
// order — causal conv1d + SiLU of the head's q, k and v channels, l2-normalised q and k, the
// gated delta rule over the head's [key_head_dim, value_head_dim] state (a thread per column;
// the column in registers for key_head_dim 128, else the state in shared memory), then the
// silu(z)-gated RMSNorm of its output — in the CPU's summation order per column. The block finds
// its sequence's tokens a pass of the step at a time (token_seq read coalesced) and requests each
// token's inputs one token ahead. The recurrent form, token by token: exact, and as fast as
// decode needs. Prefill of long prompts wants the chunked form (the same sums reordered into
// matmuls): delta_net_chunk_kernel, chunks of 32 tokens on the CUDA cores in f32, heads of 128,
// the default for steps with 32+ tokens of a sequence (SY_DELTA_CHUNKED=0 turns it off; Qwen3.5
// prefill on an H100: BENCHMARKS.md, sessions 19 to 22).
// Floor per decode step and layer: the states read and written once, 2 * value_heads *
// key_head_dim * value_head_dim * 4 bytes per sequence.
#pragma once

#include <cstdint>

#include "backend/cuda/cuda_context.h"

namespace sy::backend::cuda {

struct DeltaNetParams {
  const float* qkv = nullptr;             // [tokens, conv_dim] (q | k | v channels)
  const float* z = nullptr;               // [tokens, value_heads * value_head_dim]
  const float* b = nullptr;               // [tokens, value_heads]
  const float* a = nullptr;               // [tokens, value_heads]
  const __nv_bfloat16* conv_w = nullptr;  // [conv_dim, kernel]
  const float* a_log = nullptr;           // [value_heads]
  const float* dt_bias = nullptr;         // [value_heads]
  const float* norm = nullptr;            // [value_head_dim]
  const int32_t* positions = nullptr;     // [tokens]
  const int32_t* token_seq = nullptr;     // [tokens]
  const int32_t* state_read = nullptr;    // [seqs] (-1: a padding sequence)
  const int32_t* state_write = nullptr;   // [seqs]
  float* conv_state = nullptr;            // [buffers, conv_dim, kernel - 1]
  float* recurrent = nullptr;             // [buffers, value_heads, key_head_dim, value_head_dim]
  float* out = nullptr;                   // [tokens, value_heads * value_head_dim]
  // The chunked kernels' conv outputs, [tokens, conv_dim] (the backend's scratch; the recurrent
  // kernel, for steps without 32+ tokens of a sequence, needs none).
  float* conv_out = nullptr;
  // SY_DELTA_STAMPS=1 (experiments): the chunked kernel adds each phase's clock64 cycles (thread
  // 0, barrier to barrier) over its blocks and chunks here, then the chunk count
  // ([kDeltaPhases + 1]); set by launch_gated_delta_net.
  unsigned long long* phase_cycles = nullptr;
  // SY_DELTA_TC=1 (an option: it passes the op harness on an H100 and cuts a chunk 31.1 -> 28.7
  // us, but no prefill step measured faster, and its products leave ~2^-16 out): the chunked
  // kernel's matmul phases on tensor cores (delta_chunk.cuh); set by launch_gated_delta_net.
  bool tensor_cores = false;
  int64_t tokens = 0;
  int64_t max_query_len = 0;  // the most tokens of one sequence in the step (AttentionBatch)
  int seqs = 0, key_heads = 0, value_heads = 0, key_head_dim = 0, value_head_dim = 0, kernel = 0;
  float eps = 0;
  // Channels of qkv and of the conv (q and k of every key head, then v of every value head).
  __host__ __device__ int64_t conv_dim() const {
    return 2 * int64_t{key_heads} * key_head_dim + int64_t{value_heads} * value_head_dim;
  }
};
// Shapes the kernel takes (head dims up to 1024, conv kernel 1..8, the state in shared memory).
bool delta_net_supported(int key_head_dim, int value_head_dim, int kernel);
// Lets the kernel take its state's shared memory (what the device allows a block: 227 KB on
// Hopper); once, outside graph recording.
void prepare_gated_delta_net(int device);
void launch_gated_delta_net(const DeltaNetParams& p, cudaStream_t stream);

// Gated attention's two elementwise ends: q[r] = q_gate[r, :head_dim] for rows r of
// [tokens * heads], and out[r] *= sigmoid(q_gate[r, head_dim:]).
void launch_split_query(const float* q_gate, int64_t rows, int64_t head_dim, float* q,
                        cudaStream_t stream);
void launch_sigmoid_gate(const float* q_gate, int64_t rows, int64_t head_dim, float* out,
                         cudaStream_t stream);

}  // namespace sy::backend::cuda
