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

#include <cstdint>
#include <memory>

#include "backend/cuda/cuda_context.h"
#include "moe/experts_kernel.h"

namespace sy::backend::cuda {

std::unique_ptr<moe::ExpertsKernel> make_cuda_modular_kernel(CudaContext& context);

// Whether MXFP4 experts (moe/expert_spec.h) are as both kernels read them: U8 blocks
// [experts, rows, k/32, 16] on the device, 16-byte aligned (copied and loaded in 16-byte chunks),
// and U8 scales [experts, rows, k/32]; k a multiple of 32.
inline bool mxfp4_experts_readable(const Tensor& blocks, const Tensor& scales, int64_t experts, int64_t rows,
                                   int64_t k) {
  return k % 32 == 0 && blocks.dtype == DType::kU8 && scales.dtype == DType::kU8 && blocks.data && scales.data &&
         reinterpret_cast<uintptr_t>(blocks.data) % 16 == 0 && blocks.device == Device::kCuda &&
         scales.device == Device::kCuda && blocks.numel() == experts * rows * k / 2 &&
         scales.numel() == experts * rows * (k / 32);
}
std::unique_ptr<moe::ExpertsKernel> make_cuda_fused_kernel(CudaContext& context);

// out[rows, n] = x[rows, k] . w[n, k]^T (x, w bf16; out f32) with cuda-modular's grouped GEMM as
// one expert: every row is accumulated in the same k order whatever `rows` is (no split-K, the
// tile shapes change only M), so it serves --batch-invariant. k and n multiples of 8. `plan`
// holds dense_gemm_plan_ints(max_rows) ints.
size_t dense_gemm_plan_ints(int64_t max_rows);
void launch_dense_gemm(const __nv_bfloat16* x, int64_t rows, int64_t k, const __nv_bfloat16* w, int64_t n, float* out,
                       int32_t* plan, cudaStream_t stream);

}  // namespace sy::backend::cuda
