// cpu-fused: the monolithic shape. Each token's routing is computed inside the kernel's own
// expert loop (its own scoring and selection, not the modular router), and the kernel writes the
// route sink itself — the case where other engines returned all-zero routes.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_matmul.h"

namespace sy::backend::cpu {
namespace {

class FusedKernel final : public moe::ExpertsKernel {
 public:
  explicit FusedKernel(ThreadPool& pool) : pool_(pool) {}
  std::string_view name() const override { return "cpu-fused"; }
  Device device() const override { return Device::kCpu; }
  bool routes_inside() const override { return true; }
  bool captures_routes() const override { return true; }
  bool replays_routes() const override { return true; }
  bool captures_weights() const override { return true; }
  Status supports(const moe::RouterSpec& spec) const override {
    if (spec.scoring != moe::RouterScoring::kSoftmax || spec.has_selection_bias ||
        spec.num_groups > 1)
      return Status::error(
          ErrorCode::kUnsupported,
          "cpu-fused supports softmax routing (before or after top-k, with a logit bias) without "
          "selection biases or groups only (cpu-modular runs every router)");
    return Status::ok();
  }
  Status supports_experts(const moe::ExpertSpec&) const override { return Status::ok(); }

  Status forward(const moe::MoeForwardArgs& args) override {
    const moe::MoeLayerWeights& w = *args.weights;
    const int64_t tokens = args.hidden.dim(0), hidden = args.hidden.dim(1);
    const int64_t experts = args.spec.num_experts, top_k = args.spec.top_k;
    const int64_t layers = args.routes.sink.data      ? args.routes.sink.dim(1)
                           : args.routes.weights.data ? args.routes.weights.dim(1)
                           : args.routes.source.data  ? args.routes.source.dim(1)
                                                      : 0;
    SY_TRY(supports(args.spec));

    const std::vector<float> logit_bias = vector_f32(w.router_bias);
    if (args.spec.has_logit_bias && static_cast<int64_t>(logit_bias.size()) != experts)
      return Status::error(ErrorCode::kInternal,
                           "cpu-fused: the router spec needs a logit bias of num_experts");
    const bool after_topk = args.spec.softmax_after_topk;

    pool_.parallel_for(tokens, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> probs(static_cast<size_t>(experts)), y(static_cast<size_t>(hidden));
      std::vector<int32_t> chosen(static_cast<size_t>(top_k));
      std::vector<float> gates(static_cast<size_t>(top_k));
      for (int64_t t = begin; t < end; ++t) {
        const float* x = args.hidden.ptr<float>() + t * hidden;
        // Score every expert: logits (+ bias), then a softmax in f32 unless the softmax comes
        // after top-k (gpt-oss: selection on the logits themselves).
        float max_logit = -INFINITY;
        for (int64_t e = 0; e < experts; ++e) {
          probs[e] = dot_row(x, w.router, e);
          if (args.spec.has_logit_bias) probs[e] += logit_bias[e];
          if (probs[e] > max_logit) max_logit = probs[e];
        }
        if (!after_topk) {
          float sum = 0.0f;
          for (int64_t e = 0; e < experts; ++e) sum += probs[e] = std::exp(probs[e] - max_logit);
          for (int64_t e = 0; e < experts; ++e) probs[e] /= sum;
        }

        bool forced = args.routes.forced.data && args.routes.forced.ptr<uint8_t>()[t];
        if (forced) {
          const int32_t* given = args.routes.source.ptr<int32_t>() + (t * layers + args.layer) * top_k;
          for (int64_t k = 0; k < top_k; ++k) chosen[k] = given[k];
        } else {
          // Insertion into a descending list of length k; an equal score never displaces a
          // lower id (ties -> lower id first).
          int64_t filled = 0;
          for (int32_t e = 0; e < experts; ++e) {
            int64_t at = filled;
            while (at > 0 && probs[e] > probs[chosen[at - 1]]) --at;
            if (at >= top_k) continue;
            for (int64_t j = std::min(filled, top_k - 1); j > at; --j) chosen[j] = chosen[j - 1];
            chosen[at] = e;
            if (filled < top_k) ++filled;
          }
        }
        float gate_sum = 0.0f;
        if (after_topk) {  // softmax over the chosen logits
          float chosen_max = probs[chosen[0]];
          for (int64_t k = 1; k < top_k; ++k) chosen_max = std::max(chosen_max, probs[chosen[k]]);
          float sum = 0.0f;
          for (int64_t k = 0; k < top_k; ++k)
            sum += gates[k] = std::exp(probs[chosen[k]] - chosen_max);
          for (int64_t k = 0; k < top_k; ++k) gate_sum += gates[k] /= sum;
        } else {
          for (int64_t k = 0; k < top_k; ++k) gate_sum += gates[k] = probs[chosen[k]];
        }
        if (args.spec.renormalize)
          for (int64_t k = 0; k < top_k; ++k) gates[k] /= gate_sum;
        if (args.spec.routed_scaling_factor != 1.0f)
          for (int64_t k = 0; k < top_k; ++k) gates[k] *= args.spec.routed_scaling_factor;
        if (args.routes.sink.data) {
          int32_t* sink = args.routes.sink.ptr<int32_t>() + (t * layers + args.layer) * top_k;
          for (int64_t k = 0; k < top_k; ++k) sink[k] = chosen[k];
        }
        if (args.routes.weights.data) {
          float* sink = args.routes.weights.ptr<float>() + (t * layers + args.layer) * top_k;
          for (int64_t k = 0; k < top_k; ++k) sink[k] = gates[k];
        }
        float* dst = args.out.ptr<float>() + t * hidden;
        std::fill_n(dst, hidden, 0.0f);
        for (int64_t k = 0; k < top_k; ++k) {
          expert_forward(x, 1, w, chosen[k], args.experts, y.data(), nullptr);
          for (int64_t i = 0; i < hidden; ++i) dst[i] += gates[k] * y[i];
        }
      }
    });
    return Status::ok();
  }

 private:
  ThreadPool& pool_;
};

}  // namespace

std::unique_ptr<moe::ExpertsKernel> make_fused_kernel(ThreadPool& pool) {
  return std::make_unique<FusedKernel>(pool);
}

}  // namespace sy::backend::cpu
