// DeepSeek-V3's multi-head latent attention on CUDA (the CPU reference: CpuBackend::
// latent_attention), in the absorbed form: the cache holds one bf16 row of [RMSNormed latent |
// roped k_pe] per token (kv_lora + rope values, not expanded K/V), each head's query is taken
// into the latent space (W_k^T q_nope) and its output out of it (W_v o_latent).
// Kernels: the prep (latent norm, RoPE of k_pe and of q's rope part, the cache write); then per
// chunk of tokens the absorption (W_k read once per 16 tokens), the attention (a block per
// token, group of 16 heads and context split: each cached row read once for the group, an
// online softmax per head; the split count depends only on the token count, so graphs replay
// it), the merge of the splits, and the output projection (W_v read once per 8 tokens).
// Floor per decode token: its context's cache rows, (kv_lora + rope) x 2 bytes each, read once
// per group of 16 heads; the absorptions' kv_b_proj reads are shared by a chunk's tokens.
// 2 x heads x (2 kv_lora + rope) FLOPs per cached row: on tensor cores (the 16 heads one m16
// tile; kv_lora a multiple of 64 up to 512, kv_lora + rope a multiple of 32 up to 1024, so
// DeepSeek-V3/Kimi/Moonlight's 512 + 64), else, and with SY_LATENT_MMA=0, on CUDA cores.
// Prefill (launch_latent_expanded): for a sequence with many query tokens in the step, the
// absorbed form costs that per query token and cached row. Instead its context's
// latent rows are expanded once into per-head K (nope | rope) and V (v, zero-padded) in bf16 by
// two strided-batched cuBLAS GEMMs (2 x context x kv_lora x heads x (nope + v_dim) FLOPs), and
// the paged tensor-core attention kernel (attention.cu) runs on them as ordinary multi-head
// attention of head_dim nope + rope, in groups of up to 16 heads.
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
  float* scratch = nullptr;  // latent_attention_scratch_bytes(heads, kv_lora, rope) or more
  size_t scratch_bytes = 0;
  int sm_count = 0;  // sizes the context splits
};
// Shapes the kernels take: kv_lora even and <= 1024, rope even and <= 256, kv_lora + rope <=
// 1152, nope <= 512, v_dim <= 1024.
bool latent_attention_supported(int kv_lora, int nope, int rope, int v_dim);
// The scratch a step of any size needs (one chunk of tokens at a time).
size_t latent_attention_scratch_bytes(int heads, int kv_lora, int rope);
// Once per device, before the first launch (the attention kernel's shared memory opt-in).
void prepare_latent_attention(int device);
// The whole op on CUDA cores: launch_latent_prep, then launch_latent_absorbed over every token.
void launch_latent_attention(const LatentParams& p, const RopeTable& table, cudaStream_t stream);
// Its pieces: the prep (latent norm, RoPE, cache write) of every token, then the absorbed
// attention of tokens [first, first + count) (their output rows written, the others untouched).
void launch_latent_prep(const LatentParams& p, const RopeTable& table, cudaStream_t stream);
void launch_latent_absorbed(const LatentParams& p, int64_t first, int64_t count,
                            cudaStream_t stream);

// The expanded path's buffers, reserved once (latent_expand_reserve) for contexts up to
// max_context and query pieces of up to max_queries tokens.
struct LatentExpandScratch {
  __nv_bfloat16* latent = nullptr;  // [max_context, kv_lora]: the run's cached latent rows
  __nv_bfloat16* k = nullptr;       // [max_context, group, nope + rope]
  // [max_context, group, nope + rope]: columns >= v_dim are zeroed at reserve and never written by
  // a launch of the same shape (another shape's data there only reaches output columns >= v_dim,
  // which are dropped).
  __nv_bfloat16* v = nullptr;
  float* q = nullptr;               // [max_queries, group, nope + rope] (heads > group only)
  float* out = nullptr;             // [max_queries, group, nope + rope]
  int32_t* table = nullptr;         // block table of the contiguous K/V: 0, 1, 2, ...
  int32_t* zeros = nullptr;         // [max_queries]: token_seq of one sequence
  int64_t max_context = 0, max_queries = 0;
  // Capacity: heads per attention launch (<= 16; a launch takes the largest divisor of its heads
  // up to it; 0: not reserved), the widest q row (nope + rope) and latent.
  int group = 0;
  int max_q_row = 0, max_lora = 0;
  int table_stride = 0;
};
// Shapes the expanded path takes (the attention kernel's tensor-core head dims; V padded to
// the K width).
bool latent_expand_supported(int nope, int rope, int v_dim);
// Whether launch_latent_expanded can take p's shape and a run of `context` keys with scratch `s`.
bool latent_expand_fits(const LatentParams& p, int64_t context, const LatentExpandScratch& s);
// Allocates (cudaMalloc; false on failure, nothing left allocated) and frees the scratch.
bool latent_expand_reserve(int heads, int kv_lora, int nope, int rope, int64_t max_context,
                           LatentExpandScratch& s);  // heads: the most of one launch's op
void latent_expand_release(LatentExpandScratch& s);
// Tokens [first, first + count) of the step, all of sequence `seq` at consecutive positions
// ending at context - 1 (latent_expand_fits), after launch_latent_prep: their output rows.
void launch_latent_expanded(const LatentParams& p, int64_t first, int64_t count, int32_t seq,
                            int64_t context, const LatentExpandScratch& s, cublasHandle_t cublas,
                            cudaStream_t stream);

}  // namespace sy::backend::cuda
