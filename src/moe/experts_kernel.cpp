#include "moe/experts_kernel.h"

namespace sy::moe {
namespace {

std::string join(const std::vector<std::string>& names) {
  std::string text;
  for (const auto& name : names) text += (text.empty() ? "" : ", ") + name;
  return text.empty() ? "(none)" : text;
}

}  // namespace

void ExpertsKernelRegistry::add(std::unique_ptr<ExpertsKernel> kernel) {
  kernels_.push_back(std::move(kernel));
}

std::vector<std::string> ExpertsKernelRegistry::names(Device device) const {
  std::vector<std::string> names;
  for (const auto& kernel : kernels_)
    if (kernel->device() == device) names.emplace_back(kernel->name());
  return names;
}

Result<ExpertsKernel*> ExpertsKernelRegistry::select(std::string_view name,
                                                     const KernelNeeds& needs) const {
  auto satisfies = [&](const ExpertsKernel& kernel) {
    return kernel.device() == needs.device && (!needs.capture || kernel.captures_routes()) &&
           (!needs.replay || kernel.replays_routes());
  };
  auto capable = [&] {
    std::vector<std::string> names;
    for (const auto& kernel : kernels_)
      if (satisfies(*kernel)) names.emplace_back(kernel->name());
    return names;
  };
  std::string wanted = needs.capture && needs.replay ? "route capture and replay"
                       : needs.capture               ? "route capture"
                                                     : "route replay";
  if (name == "auto") {
    for (const auto& kernel : kernels_)
      if (satisfies(*kernel)) return kernel.get();
    return Status::errorf("no MoE kernel on this backend supports {}", wanted);
  }
  for (const auto& kernel : kernels_) {
    if (kernel->name() != name || kernel->device() != needs.device) continue;
    if (needs.capture && !kernel->captures_routes())
      return Status::errorf("--moe-kernel {} cannot capture routes; kernels that can: {}", name,
                            join(capable()));
    if (needs.replay && !kernel->replays_routes())
      return Status::errorf("--moe-kernel {} cannot replay routes; kernels that can: {}", name,
                            join(capable()));
    return kernel.get();
  }
  return Status::errorf("unknown --moe-kernel '{}'; available: auto, {}", name,
                        join(names(needs.device)));
}

}  // namespace sy::moe
