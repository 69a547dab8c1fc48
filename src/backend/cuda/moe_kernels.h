// The CUDA MoE kernels (ExpertsKernel implementations; explicit list in CudaBackend).
//   cuda-modular: router kernel (moe_route.cuh: logits, softmax, top-k, renormalise, ids into the
//     route sink or forced ids from the source) -> align tokens by expert -> grouped GEMM
//     gate_up with fused SiLU*mul -> grouped GEMM down -> weighted combine.
//   cuda-fused: monolithic, for small decode steps: one kernel computes router scores, selects
//     top-k (the same device functions, so routes equal cuda-modular's bitwise), runs the chosen
//     experts and combines, writing the route sink itself and honouring forced ids.
// Weights (moe::MoeLayerWeights) are bf16 on the device: router [E, H], gate_up [E, 2I, H]
// (rows [0, I) gate, [I, 2I) up), down [E, H, I]. hidden/out are f32 [T, H].
#pragma once

#include <memory>

#include "backend/cuda/cuda_context.h"
#include "moe/experts_kernel.h"

namespace sy::backend::cuda {

std::unique_ptr<moe::ExpertsKernel> make_cuda_modular_kernel(CudaContext& context);
std::unique_ptr<moe::ExpertsKernel> make_cuda_fused_kernel(CudaContext& context);

// out[rows, n] = x[rows, k] . w[n, k]^T (x, w bf16; out f32) with cuda-modular's grouped GEMM as
// one expert: every row is accumulated in the same k order whatever `rows` is (no split-K, the
// tile shapes change only M), so it serves --batch-invariant. k and n multiples of 8. `plan`
// holds dense_gemm_plan_ints(max_rows) ints.
size_t dense_gemm_plan_ints(int64_t max_rows);
void launch_dense_gemm(const __nv_bfloat16* x, int64_t rows, int64_t k, const __nv_bfloat16* w, int64_t n, float* out,
                       int32_t* plan, cudaStream_t stream);

}  // namespace sy::backend::cuda
