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

}  // namespace sy::backend::cuda
