// What every CUDA kernel file shares: the backend's stream and library handles, and the error
// check. A device error is not recoverable in-process (the context is lost): it aborts with
// the failing call named.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <utility>

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
  bool batch_invariant =
      false;  // --batch-invariant: kernels take no path that follows the step's size
};

[[noreturn]] inline void cuda_fail(const char* what, const char* error, const char* file, int line) {
  std::fprintf(stderr, "switchyard: CUDA error in %s at %s:%d: %s\n", what, file, line, error);
  std::abort();
}

// An experiment or opt-in switch: the environment variable `name` set to 1.
inline bool env_flag(const char* name) {
  const char* value = std::getenv(name);
  return value && value[0] == '1';
}
// A default that the environment variable `name` set to 0 turns off (A/B against the old path).
inline bool env_off(const char* name) {
  const char* value = std::getenv(name);
  return value && value[0] == '0';
}

// Whether p is 16-byte aligned (what 4-float and 8-bf16 vector loads need).
inline bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

// Whether `stream` is recording a graph (the phase-stamp experiments skip those launches).
inline bool stream_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  cudaStreamIsCapturing(stream, &status);
  return status != cudaStreamCaptureStatusNone;
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

#ifdef __CUDACC__
namespace sy::backend::cuda {

// Programmatic dependent launch (sm_90): a kernel started with launch_overlapped may become
// resident while the kernel before it in the stream drains, hiding the launch gap of a chain of
// small decode kernels. Such a kernel calls overlap_prologue() before it touches memory that
// the step writes: that waits until the previous kernel has finished and its writes are visible
// (no-op when not launched overlapped, or on older GPUs), and lets the next kernel start its own
// launch. Before it a kernel may read only what no kernel of the running chain writes (weights,
// the step's uploaded inputs, KV rows of earlier steps) and must write nothing global: that is
// how a GEMV's weight loads or attention's KV loads overlap the previous kernel's tail. Only
// the previous kernel can still be running then (it has passed its own wait, or, launched plain,
// it has finished), so what a kernel two or more back wrote may be read too (the MXFP4 down
// GEMV's expert ids, written by the router before gate_up).
__device__ __forceinline__ void overlap_prologue() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// launch_overlapped in clusters of `cluster_z` blocks along z (1: no clusters; the grid's z a
// multiple of it; sm_90).
template <typename... Params, typename... Args>
void launch_overlapped_in_clusters(unsigned cluster_z, void (*kernel)(Params...), dim3 grid,
                                   dim3 block, size_t shared_bytes, cudaStream_t stream,
                                   Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  // SY_NO_PDL=1 (experiments): plain stream order, so that a kernel's phases can be timed without
  // the next kernel's pre-wait loads beside them.
  static const bool no_pdl = [] {
    const char* value = std::getenv("SY_NO_PDL");
    return value && value[0] == '1';
  }();
  cudaLaunchAttribute attribute[2];
  unsigned count = 0;
  if (!no_pdl) {
    attribute[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute[count++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cluster_z > 1) {
    attribute[count].id = cudaLaunchAttributeClusterDimension;
    attribute[count].val.clusterDim.x = 1;
    attribute[count].val.clusterDim.y = 1;
    attribute[count++].val.clusterDim.z = cluster_z;
  }
  config.attrs = attribute;
  config.numAttrs = count;
  SY_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

template <typename... Params, typename... Args>
void launch_overlapped(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
                       cudaStream_t stream, Args&&... args) {
  launch_overlapped_in_clusters(1, kernel, grid, block, shared_bytes, stream,
                                std::forward<Args>(args)...);
}

}  // namespace sy::backend::cuda
#endif
