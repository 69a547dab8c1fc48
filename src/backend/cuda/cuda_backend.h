// The CUDA backend: device memory, one stream, cuBLASLt for large dense GEMMs, our own kernels
// for everything else (GEMV for small steps, norms, RoPE, paged attention, MoE, sampling), and
// CUDA graphs for decode steps. Implements backend/backend.h; nothing here is visible to the engine.
#pragma once

#include <memory>

#include "backend/backend.h"

namespace sy::backend {

struct CudaBackendOptions {
  int device_index = 0;
  bool batch_invariant = false;  // BackendOptions::batch_invariant
};
Result<std::unique_ptr<Backend>> make_cuda_backend(const CudaBackendOptions& options);

}  // namespace sy::backend
