// ExpertsKernel: one implementation of a MoE block's Route -> Forward -> Combine, with its
// capabilities; and the registry that picks one (`--moe-kernel auto|<name>`), with the guard
// that refuses a kernel lacking a capability the run needs.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "moe/expert_spec.h"
#include "moe/router_spec.h"
#include "tensor/tensor.h"
#include "util/status.h"

namespace sy::moe {

// One MoE layer's weights on the backend, experts stacked per layer (the layout grouped GEMMs
// and fused checkpoints use; per-expert checkpoint tensors are stacked at load).
struct MoeLayerWeights {
  Tensor router;   // [num_experts, hidden]
  Tensor gate_up;  // [num_experts, 2 * moe_intermediate, hidden]: rows [0, I) gate, [I, 2I) up
  Tensor down;     // [num_experts, hidden, moe_intermediate]
  // [num_experts] f32, present when the RouterSpec says so (has_logit_bias / has_selection_bias).
  Tensor router_bias;
  Tensor selection_bias;
  // ExpertSpec::has_biases: [E, 2I] (in gate_up's row order) and [E, H], bf16 or f32.
  Tensor gate_up_bias, down_bias;
  // ExpertFormat::kMxfp4Interleaved: gate_up / down hold the U8 blocks, these the U8 scales.
  Tensor gate_up_scales, down_scales;
  // Expert parallel (dist/shard_model.h): gate_up and down hold only the experts
  // [first_expert, first_expert + local_experts) of this rank; a kernel that
  // computes_expert_subset() runs those and leaves the other pairs to their owners (the
  // decoder's all-reduce sums the ranks' partial combines). -1: every expert is here.
  int64_t first_expert = 0;
  int64_t local_experts = -1;

  // (kTransposedInterleaved stores gate_up as [E, H, 2I]: the width is on axis 2.)
  int64_t intermediate(ExpertFormat format = ExpertFormat::kStacked) const {
    return (format == ExpertFormat::kTransposedInterleaved ? gate_up.dim(2) : gate_up.dim(1)) / 2;
  }
  // Expert e's matrices as 2-D [out, in] views (ExpertFormat::kStacked only).
  Tensor gate(int64_t e) const { return expert_rows(gate_up, e, 0, intermediate()); }
  Tensor up(int64_t e) const { return expert_rows(gate_up, e, intermediate(), intermediate()); }
  Tensor down_of(int64_t e) const { return expert_rows(down, e, 0, down.dim(1)); }

  static Tensor expert_rows(const Tensor& stacked, int64_t e, int64_t begin, int64_t count) {
    Tensor view = stacked;
    view.rank = 2;
    view.shape = {count, stacked.shape[2], 0, 0};
    const size_t offset = static_cast<size_t>((e * stacked.shape[1] + begin) * stacked.shape[2]);
    view.data = static_cast<char*>(stacked.data) + offset * dtype_size(stacked.dtype);
    return view;
  }
};

// The step's route buffers (DESIGN.md RouteSink / RouteSource), all [step_tokens, num_layers,
// top_k] on the kernel's device. `sink` (int32) is poisoned before the step; a capturing kernel
// writes every token's row of its layer. `weights` (f32, same indexing as `sink`) is the gating
// weight sink: when defined, a kernel that captures_weights() writes the combine weight it
// multiplied expert `sink[t, layer, k]`'s output by, poisoned like the ids
// (kRouteWeightPoisonBits). It lies right behind the id sink in the decoder's step workspace, so
// one copy takes both. `source` rows with `forced[t] != 0` must be used as given.
struct RouteBuffers {
  Tensor sink;     // undefined (data == nullptr) when capture is off
  Tensor weights;  // undefined when no request in the step asked for gating weights
  Tensor source;   // undefined when nothing in the step is replayed
  Tensor forced;   // [step_tokens] uint8
};

// The residual adds around the block, for a kernel that fuses them (fuses_input_norm): its
// input is rms_norm(x) * weight with x = residual + earlier_delta (if given) + delta, added in
// that order, and it writes x + out back into residual (out is written too).
struct MoeInputNorm {
  Tensor* residual = nullptr;  // [T, hidden] f32; nullptr: MoeForwardArgs::hidden is the input
  const Tensor* earlier_delta = nullptr;
  const Tensor* delta = nullptr;
  const Tensor* weight = nullptr;  // [hidden] f32
  float eps = 1e-6f;
};

struct MoeForwardArgs {
  int layer = 0;
  Tensor hidden;  // [T, hidden] f32, already normed (unless input_norm.residual is set)
  MoeInputNorm input_norm;
  Tensor out;     // [T, hidden] f32, overwritten
  const MoeLayerWeights* weights = nullptr;
  RouterSpec spec;
  ExpertSpec experts;
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
  virtual bool captures_weights() const { return false; }  // writes RouteBuffers::weights
  // A row's outputs never depend on the step's other rows (--batch-invariant uses only these).
  virtual bool batch_invariant() const { return true; }
  // Honours MoeLayerWeights::local_experts (expert parallel); others refuse such weights.
  virtual bool computes_expert_subset() const { return false; }
  // Whether this kernel runs `spec`; checked at start-up before reserve. Kernels written for
  // Qwen3-MoE's router keep this default and refuse the options they predate.
  virtual Status supports(const RouterSpec& spec) const {
    if (spec.uses_extended_options())
      return Status::error(
          ErrorCode::kUnsupported,
          fmt::format("MoE kernel {} does not implement router biases or group-limited top-k "
                      "(the model's router needs them; cpu-modular does)",
                      name()));
    return Status::ok();
  }
  // Whether this kernel computes experts of `spec` (activation, biases, storage); checked at
  // start-up with supports(). Kernels written for Qwen3-MoE keep this default.
  virtual Status supports_experts(const ExpertSpec& spec) const {
    if (!spec.is_default())
      return Status::error(
          ErrorCode::kUnsupported,
          fmt::format("MoE kernel {} does not implement expert biases, the clamped SwiGLU or "
                      "interleaved/MXFP4 expert weights (the model's experts need them; "
                      "cpu-modular and cpu-fused do)",
                      name()));
    return Status::ok();
  }
  // Called once at start-up with the largest step: a device kernel sizes its scratch here.
  virtual Status reserve(int64_t max_tokens, const RouterSpec& spec, int64_t hidden, int64_t intermediate) {
    (void)max_tokens, (void)spec, (void)hidden, (void)intermediate;
    return Status::ok();
  }
  // Enqueues the layer's work (a device kernel need not finish before returning). Must not
  // synchronise with the host or allocate: steps may be recorded as graphs.
  virtual Status forward(const MoeForwardArgs& args) = 0;
  // Whether forward() takes MoeForwardArgs::input_norm for steps of `tokens` tokens.
  virtual bool fuses_input_norm(int64_t tokens) const {
    (void)tokens;
    return false;
  }
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
