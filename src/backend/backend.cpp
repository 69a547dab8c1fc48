#include "backend/backend.h"

#include <unistd.h>

#include <cstdlib>

#ifdef SWITCHYARD_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace sy::backend {

Result<Device> parse_device(const std::string& text) {
  if (text == "cpu") return Device::kCpu;
  if (text == "cuda") return Device::kCuda;
  return Status::errorf("--device must be cpu or cuda, got '{}'", text);
}

Result<std::unique_ptr<Backend>> make_backend(const BackendOptions& options) {
  if (options.device == Device::kCpu) return make_cpu_backend({options.num_threads});
#ifdef SWITCHYARD_HAVE_CUDA
  return make_cuda_backend({options.device_index, options.batch_invariant});
#else
  return Status::error(ErrorCode::kUnsupported,
                       "--device cuda: this build has no CUDA backend (build with nvcc present, "
                       "cmake -DSWITCHYARD_CUDA=ON)");
#endif
}

}  // namespace sy::backend
