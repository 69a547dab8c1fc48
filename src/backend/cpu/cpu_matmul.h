// The CPU reference GEMM: out[r, o] = dot(x[r, :], w[o, :]) over f32 activations and BF16/F32
// weights. Each dot product runs in one fixed order whatever the batch, so results are
// batch-invariant. Floor: decode is bound by streaming the weights once (2 bytes/param for BF16).
#pragma once

#include <cstdint>

#include "tensor/tensor.h"
#include "util/thread_pool.h"

namespace sy::backend::cpu {

// x: [rows, in] f32 (row stride in elements = x_stride); w: [out, in] BF16 or F32;
// out: [rows, out] f32 (row stride out_stride). Optional bias [out] f32.
void matmul_rows(const float* x, int64_t x_stride, int64_t rows, const Tensor& w, const float* bias,
                 float* out, int64_t out_stride, ThreadPool* pool);

// One dot product in the same order matmul_rows uses (for kernels that compute single rows).
float dot_row(const float* x, const Tensor& w, int64_t w_row);

}  // namespace sy::backend::cpu
