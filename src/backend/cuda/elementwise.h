// The CUDA backend's small kernels: embedding, norms, residual, SiLU*mul, RoPE, gathers, fills,
// dtype conversion and the small-batch GEMV. All are memory-bound: each note gives its bytes.
#pragma once

#include <cstdint>

#include "backend/cuda/cuda_context.h"
#include "backend/cuda/rope_table.h"

namespace sy::backend::cuda {

void launch_embedding(const __nv_bfloat16* table, const int32_t* ids, int64_t tokens, int64_t hidden, float* out,
                      cudaStream_t stream);
// out = x / rms(x) * weight per row of `width`; out may alias x. With `residual`: x += residual
// first (x is updated in place), then the norm; `earlier` (only with `residual`): x += earlier
// before that (the same two f32 adds as two launches).
void launch_rms_norm(float* x, const float* residual, const float* weight, int64_t rows,
                     int64_t width, float eps, float* out, cudaStream_t stream,
                     const float* earlier = nullptr);
void launch_add(float* x, const float* y, int64_t count, cudaStream_t stream);
void launch_add_bias(float* out, const float* bias, int64_t rows, int64_t width, cudaStream_t stream);
void launch_silu_mul(const float* gate, const float* up, int64_t count, float* out, cudaStream_t stream);
// RoPE over the first rotary_dims dims of each head of x [tokens, heads, head_dim].
void launch_rope(float* x, const int32_t* positions, int64_t tokens, int64_t heads, int64_t head_dim,
                 int rotary_dims, const RopeTable& table, cudaStream_t stream);
// out[t] += sigmoid(gate_logit[t]) * y[t] over rows of `width`.
void launch_add_sigmoid_gated(float* out, const float* y, const float* gate_logit, int64_t rows, int64_t width,
                              cudaStream_t stream);
void launch_gather_rows(const float* x, const int32_t* rows, int64_t count, int64_t width, float* out,
                        cudaStream_t stream);
void launch_fill_i32(int32_t* dst, int64_t count, int32_t value, cudaStream_t stream);
void launch_fill_random(void* dst, bool bf16, int64_t count, uint64_t seed, float scale, float offset,
                        cudaStream_t stream);
// U8 elements: random_fill_byte(seed, i, lo, span) (random_fill.h).
void launch_fill_random_bytes(uint8_t* dst, int64_t count, uint64_t seed, int lo, float span,
                              cudaStream_t stream);
void launch_f32_to_bf16(const float* src, int64_t count, __nv_bfloat16* dst, cudaStream_t stream);
// out[r, o] = sum_i x[r, i] * w[o, i] for rows <= kGemvMaxRows: one warp per output feature,
// streaming w once (the floor: out * in * 2 bytes / bandwidth). in must be a multiple of 8.
constexpr int64_t kGemvMaxRows = 8;
void launch_gemv(const float* x, int64_t rows, int64_t in, const __nv_bfloat16* w, int64_t out_features,
                 float* out, cudaStream_t stream);
// Several weights over the same x in one launch (q, k, v): part p writes its own out.
constexpr int kGemvMaxParts = 4;
struct GemvPart {
  const __nv_bfloat16* w = nullptr;
  float* out = nullptr;
  int64_t out_features = 0;
  // [out_features] f32 added to the dot (as add_bias would), or nullptr.
  const float* bias = nullptr;
};
void launch_gemv_parts(const float* x, int64_t rows, int64_t in, const GemvPart* parts, int count,
                       cudaStream_t stream);
// One row: out_p = rms_norm(x + delta) * norm_weight times part p's weight (delta optional),
// the residual add and norm inside the GEMV (x and the normed row are not written). Bitwise
// launch_rms_norm then launch_gemv_parts. For widths where norm_gemv_supported(in).
bool norm_gemv_supported(int64_t in);
// A shared expert's end for rows <= kGemvMaxRows (in % 8 == 0): out[r] += s_r * (silu(gate[r]) *
// up[r]) w^T, s_r = sigmoid(gate_logit[r]) (nullptr: 1); bitwise launch_silu_mul,
// launch_gemv_parts and launch_add_sigmoid_gated (launch_add) in a row.
void launch_shared_down_gemv(const float* gate, const float* up, int64_t rows, int64_t in,
                             const __nv_bfloat16* w, int64_t out_features, const float* gate_logit,
                             float* out, cudaStream_t stream);
void launch_norm_gemv_parts(const float* x, const float* delta, const float* norm_weight, float eps, int64_t in,
                            const GemvPart* parts, int count, cudaStream_t stream);

}  // namespace sy::backend::cuda
