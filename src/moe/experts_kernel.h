// ExpertsKernel: one implementation of a MoE block's Route -> Forward -> Combine, with its
// capabilities; and the registry that picks one (`--moe-kernel auto|<name>`), with the guard
// that refuses a kernel lacking a capability the run needs.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "moe/router_spec.h"
#include "tensor/tensor.h"
#include "util/status.h"

namespace sy::moe {

// One MoE layer's weights as views on the backend's buffers. Experts are one tensor each
// ([out, in], as checkpoints store them).
struct MoeLayerWeights {
  Tensor router;                   // [num_experts, hidden]
  std::vector<Tensor> gate_proj;   // per expert [moe_intermediate, hidden]
  std::vector<Tensor> up_proj;     // per expert [moe_intermediate, hidden]
  std::vector<Tensor> down_proj;   // per expert [hidden, moe_intermediate]
};

// The step's route buffers (DESIGN.md RouteSink / RouteSource), all [step_tokens, num_layers,
// top_k] int32 on the kernel's device. `sink` is poisoned before the step; a capturing kernel
// writes every token's row of its layer. `source` rows with `forced[t] != 0` must be used as given.
struct RouteBuffers {
  Tensor sink;    // undefined (data == nullptr) when capture is off
  Tensor source;  // undefined when nothing in the step is replayed
  Tensor forced;  // [step_tokens] uint8
};

struct MoeForwardArgs {
  int layer = 0;
  Tensor hidden;  // [T, hidden] f32, already normed
  Tensor out;     // [T, hidden] f32, overwritten
  const MoeLayerWeights* weights = nullptr;
  RouterSpec spec;
  RouteBuffers routes;
};

class ExpertsKernel {
 public:
  virtual ~ExpertsKernel() = default;
  virtual std::string_view name() const = 0;
  virtual Device device() const = 0;
  virtual bool routes_inside() const = 0;    // monolithic: routing happens inside the kernel
  virtual bool captures_routes() const = 0;  // writes RouteBuffers::sink
  virtual bool replays_routes() const = 0;   // honours RouteBuffers::source
  virtual Status forward(const MoeForwardArgs& args) = 0;
};

struct KernelNeeds {
  Device device = Device::kCpu;
  bool capture = false;
  bool replay = false;
};

// An ordinary object built at start-up from an explicit list (no static registration).
class ExpertsKernelRegistry {
 public:
  void add(std::unique_ptr<ExpertsKernel> kernel);
  // "auto" picks the first registered kernel for the device that has every needed capability.
  // A named kernel lacking one is refused with a message naming kernels that have it.
  Result<ExpertsKernel*> select(std::string_view name, const KernelNeeds& needs) const;
  std::vector<std::string> names(Device device) const;

 private:
  std::vector<std::unique_ptr<ExpertsKernel>> kernels_;
};

}  // namespace sy::moe
