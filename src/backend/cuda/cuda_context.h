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

// Weights the next latency-bound kernel asks L2 for while it waits (Backend::prefetch): a batch-1
// decode step's attention and routing leave the memory bus idle for microseconds, and the bytes
// read right after them (o_proj, the next layer's input projections) are known in advance.
struct L2Prefetch {
  static constexpr int kMax = 4;
  const void* ptr[kMax] = {};
  uint64_t bytes[kMax] = {};  // multiples of 16, ptr 16-byte aligned
  int count = 0;
};

struct CudaContext {
  int device = 0;
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  cublasLtHandle_t cublas_lt = nullptr;
  void* cublas_workspace = nullptr;  // set once so cuBLAS never allocates (graphs)
  size_t cublas_workspace_bytes = 0;
  int sm_count = 0;
  size_t shared_memory_per_block_optin = 0;
  // SY_PREFETCH (experiments, bits): 1 = the decoder's hints go to the attention decode kernel and
  // cuda-fused; 2 = cuda-fused asks L2 for its down rows before its second barrier; 4 = those
  // requests with an evict-last policy.
  int prefetch_mode = 0;
  L2Prefetch prefetch;  // the pending hint (bit 1), taken by the kernel that issues it

  // The pending hint, cleared: for the launch about to run.
  L2Prefetch take_prefetch() {
    L2Prefetch taken = prefetch;
    prefetch = L2Prefetch{};
    return taken;
  }
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
// the previous kernel can still be running then (it has passed its own wait).
__device__ __forceinline__ void overlap_prologue() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Asks L2 for `bytes` at `p` (16-byte aligned, a multiple of 16) without waiting: the TMA
// unit's bulk prefetch. Weights only (nothing a running kernel writes). sm_90; a no-op before.
__device__ __forceinline__ void l2_prefetch_bulk(const void* p, uint64_t bytes, bool evict_last) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint64_t policy = 0;
  if (evict_last)
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  const char* at = static_cast<const char*>(p);
  for (uint64_t done = 0; done < bytes;) {
    const uint32_t n = static_cast<uint32_t>(bytes - done < (1u << 20) ? bytes - done : (1u << 20));
    if (evict_last)
      asm volatile("cp.async.bulk.prefetch.L2.global.L2::cache_hint [%0], %1, %2;" ::"l"(at + done),
                   "r"(n), "l"(policy)
                   : "memory");
    else
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(at + done), "r"(n)
                   : "memory");
    done += n;
  }
#endif
}

// This block's share of every region of `hint`: the regions split evenly over the grid, one
// request per region from threads 0..count-1.
__device__ __forceinline__ void issue_l2_prefetch(const L2Prefetch& hint, bool evict_last) {
  if (static_cast<int>(threadIdx.x) >= hint.count) return;
  const uint64_t blocks = static_cast<uint64_t>(gridDim.x) * gridDim.y * gridDim.z;
  const uint64_t block =
      blockIdx.x + static_cast<uint64_t>(gridDim.x) *
                       (blockIdx.y + static_cast<uint64_t>(gridDim.y) * blockIdx.z);
  const uint64_t bytes = hint.bytes[threadIdx.x];
  const uint64_t share = ((bytes + blocks - 1) / blocks + 15) & ~uint64_t{15};
  const uint64_t begin = block * share;
  if (begin >= bytes) return;
  l2_prefetch_bulk(static_cast<const char*>(hint.ptr[threadIdx.x]) + begin,
                   min(share, bytes - begin), evict_last);
}

template <typename... Params, typename... Args>
void launch_overlapped(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
                       Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  // SY_NO_PDL=1 (experiments): plain stream order, so that a kernel's phases can be timed without
  // the next kernel's pre-wait loads beside them.
  static const bool no_pdl = [] {
    const char* value = std::getenv("SY_NO_PDL");
    return value && value[0] == '1';
  }();
  config.numAttrs = no_pdl ? 0 : 1;
  SY_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

}  // namespace sy::backend::cuda
#endif
