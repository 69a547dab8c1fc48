// What every CUDA kernel file shares: the backend's stream and library handles, and the error
// check. A device error is not recoverable in-process (the context is lost): it aborts with
// the failing call named.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

namespace sy::backend::cuda {

struct CudaContext {
  int device = 0;
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  cublasLtHandle_t cublas_lt = nullptr;
  void* cublas_workspace = nullptr;  // set once so cuBLAS never allocates (graphs)
  size_t cublas_workspace_bytes = 0;
  int sm_count = 0;
  size_t shared_memory_per_block_optin = 0;
};

[[noreturn]] inline void cuda_fail(const char* what, const char* error, const char* file, int line) {
  std::fprintf(stderr, "switchyard: CUDA error in %s at %s:%d: %s\n", what, file, line, error);
  std::abort();
}

}  // namespace sy::backend::cuda

#define SY_CUDA_CHECK(expr)                                                                   \
  do {                                                                                        \
    cudaError_t sy_cuda_status_ = (expr);                                                     \
    if (sy_cuda_status_ != cudaSuccess)                                                       \
      ::sy::backend::cuda::cuda_fail(#expr, cudaGetErrorString(sy_cuda_status_), __FILE__, __LINE__); \
  } while (0)

// After every kernel launch: launch-configuration errors surface here, not steps later.
#define SY_CUDA_LAUNCH_CHECK(name) SY_CUDA_CHECK(cudaGetLastError())

#define SY_CUBLAS_CHECK(expr)                                                                 \
  do {                                                                                        \
    cublasStatus_t sy_cublas_status_ = (expr);                                                \
    if (sy_cublas_status_ != CUBLAS_STATUS_SUCCESS)                                           \
      ::sy::backend::cuda::cuda_fail(#expr, cublasGetStatusString(sy_cublas_status_), __FILE__, __LINE__); \
  } while (0)
