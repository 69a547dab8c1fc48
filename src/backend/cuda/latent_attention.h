// DeepSeek-V3's multi-head latent attention on CUDA (the CPU reference: CpuBackend::
// latent_attention), in the absorbed form: the cache holds one bf16 row of [RMSNormed latent |
// roped k_pe] per token (kv_lora + rope values, not expanded K/V), each head's query is taken
// into the latent space (W_k^T q_nope) and its output out of it (W_v o_latent).
// Two kernels: the prep (latent norm, RoPE of k_pe and of q's rope part, the cache write), then
// one block per (token, head): the absorption, an online softmax over the sequence's cached rows
// (a warp per row at a time), the output projection.
// Floor per decode token and head: its context's cache rows (kv_lora + rope) x 2 bytes, read
// once per head (the heads of a token share them through L2), plus kv_b_proj's head slice.
#pragma once

#include <cstdint>

#include "backend/cuda/cuda_context.h"
#include "backend/cuda/rope_table.h"

namespace sy::backend::cuda {

struct LatentParams {
  float* q = nullptr;              // [tokens, heads, nope + rope]: the rope part roped in place
  float* kv_latent = nullptr;      // [tokens, kv_lora + rope]: normed and roped in place
  const float* kv_norm = nullptr;  // [kv_lora]
  const __nv_bfloat16* kv_b_proj = nullptr;  // [heads * (nope + v_dim), kv_lora]
  __nv_bfloat16* cache = nullptr;            // [slots, kv_lora + rope]
  const int32_t* positions = nullptr;        // [tokens]
  const int32_t* token_seq = nullptr;        // [tokens]
  const int32_t* slot_mapping = nullptr;     // [tokens] (-1: not written)
  const int32_t* block_tables = nullptr;     // [seqs, block_table_stride]
  int block_table_stride = 0, block_size = 0;
  float* out = nullptr;  // [tokens, heads * v_dim]
  int64_t tokens = 0;
  int heads = 0, kv_lora = 0, nope = 0, rope = 0, v_dim = 0;
  bool interleave = true;  // rope pairs (2i, 2i+1), else (i, i + rope/2)
  float eps = 0, scale = 0;
};
// Shapes the kernels take: kv_lora <= 1024, rope even and <= 256, nope and v_dim <= 1024.
bool latent_attention_supported(int kv_lora, int nope, int rope, int v_dim);
void launch_latent_attention(const LatentParams& p, const RopeTable& table, cudaStream_t stream);

}  // namespace sy::backend::cuda
