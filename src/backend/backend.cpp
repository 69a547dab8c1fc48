#include "backend/backend.h"

#include <unistd.h>

#include <cstdlib>

#ifdef SWITCHYARD_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace sy::backend {

int64_t Backend::free_memory_bytes() const {
  long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : int64_t{4} << 30;
}

void* Backend::alloc_host(size_t bytes) { return std::aligned_alloc(64, (std::max<size_t>(bytes, 64) + 63) / 64 * 64); }
void Backend::free_host(void* host) { std::free(host); }

Result<Device> parse_device(const std::string& text) {
  if (text == "cpu") return Device::kCpu;
  if (text == "cuda") return Device::kCuda;
  return Status::errorf("--device must be cpu or cuda, got '{}'", text);
}

Result<std::unique_ptr<Backend>> make_backend(const BackendOptions& options) {
  if (options.device == Device::kCpu) return make_cpu_backend({options.num_threads});
#ifdef SWITCHYARD_HAVE_CUDA
  return make_cuda_backend({options.device_index});
#else
  return Status::error(ErrorCode::kUnsupported,
                       "--device cuda: this build has no CUDA backend (build with nvcc present, "
                       "cmake -DSWITCHYARD_CUDA=ON)");
#endif
}

}  // namespace sy::backend
