// cpu-modular: Gate (router logits) -> Route (reference router, or forced ids) -> Forward (tokens
// grouped by expert, one batched MLP per expert) -> Combine (weighted sum in top-k order).
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_matmul.h"
#include "moe/router.h"

namespace sy::backend::cpu {
namespace {

class ModularKernel final : public moe::ExpertsKernel {
 public:
  explicit ModularKernel(ThreadPool& pool) : pool_(pool) {}
  std::string_view name() const override { return "cpu-modular"; }
  Device device() const override { return Device::kCpu; }
  bool routes_inside() const override { return false; }
  bool captures_routes() const override { return true; }
  bool replays_routes() const override { return true; }
  bool captures_weights() const override { return true; }
  bool computes_expert_subset() const override { return true; }
  Status supports(const moe::RouterSpec&) const override {
    return Status::ok();
  }  // the reference router
  Status supports_experts(const moe::ExpertSpec&) const override { return Status::ok(); }

  Status forward(const moe::MoeForwardArgs& args) override {
    const moe::MoeLayerWeights& w = *args.weights;
    const int64_t tokens = args.hidden.dim(0), hidden = args.hidden.dim(1);
    const int64_t experts = args.spec.num_experts, top_k = args.spec.top_k;

    for (const Tensor* bias : {&w.router_bias, &w.selection_bias})
      if (bias->data &&
          ((bias->dtype != DType::kF32 && bias->dtype != DType::kBF16) || bias->numel() != experts))
        return Status::error(ErrorCode::kInternal,
                             "cpu-modular: router bias vectors must be f32/bf16 [num_experts]");
    const std::vector<float> logit_bias = vector_f32(w.router_bias),
                             selection_bias = vector_f32(w.selection_bias);
    if ((args.spec.has_logit_bias && logit_bias.empty()) ||
        (args.spec.has_selection_bias && selection_bias.empty()))
      return Status::error(ErrorCode::kInternal,
                           "cpu-modular: the router spec needs a bias the layer lacks");
    // Gate.
    std::vector<float> logits(static_cast<size_t>(tokens * experts));
    matmul_rows(args.hidden.ptr<float>(), hidden, tokens, w.router, nullptr, logits.data(), experts, &pool_);

    // Route.
    std::vector<int32_t> ids(static_cast<size_t>(tokens * top_k));
    std::vector<float> weights(static_cast<size_t>(tokens * top_k));
    std::vector<float> scratch(static_cast<size_t>(moe::router_scratch_floats(args.spec)));
    const moe::RouterBiases biases{logit_bias.empty() ? nullptr : logit_bias.data(),
                                   selection_bias.empty() ? nullptr : selection_bias.data()};
    const int64_t layers = args.routes.sink.data      ? args.routes.sink.dim(1)
                           : args.routes.weights.data ? args.routes.weights.dim(1)
                           : args.routes.source.data  ? args.routes.source.dim(1)
                                                      : 0;
    for (int64_t t = 0; t < tokens; ++t) {
      const float* row = logits.data() + t * experts;
      int32_t* token_ids = ids.data() + t * top_k;
      float* token_weights = weights.data() + t * top_k;
      bool forced = args.routes.forced.data && args.routes.forced.ptr<uint8_t>()[t];
      if (forced) {
        const int32_t* given = args.routes.source.ptr<int32_t>() + (t * layers + args.layer) * top_k;
        std::copy(given, given + top_k, token_ids);
        moe::gate_forced(row, args.spec, biases, token_ids, token_weights, scratch.data());
      } else {
        moe::route_token(row, args.spec, biases, token_ids, token_weights, scratch.data());
      }
      if (args.routes.sink.data)
        std::copy(token_ids, token_ids + top_k,
                  args.routes.sink.ptr<int32_t>() + (t * layers + args.layer) * top_k);
      if (args.routes.weights.data)  // the very numbers Combine multiplies by, below
        std::copy(token_weights, token_weights + top_k,
                  args.routes.weights.ptr<float>() + (t * layers + args.layer) * top_k);
    }

    // Forward: group (token, slot) pairs by expert, run each expert once over its rows.
    std::vector<std::vector<int64_t>> assigned(static_cast<size_t>(experts));
    for (int64_t i = 0; i < tokens * top_k; ++i) assigned[ids[i]].push_back(i);
    std::vector<float> expert_out(static_cast<size_t>(tokens * top_k * hidden));
    std::vector<float> rows_in, rows_out;
    // Expert parallel: only this rank's experts; the other pairs add nothing here.
    const int64_t first = w.first_expert, last = w.local_experts < 0 ? experts : first + w.local_experts;
    auto owned = [&](int32_t e) { return e >= first && e < last; };
    for (int64_t e = first; e < last; ++e) {
      const auto& slots = assigned[e];
      if (slots.empty()) continue;
      const int64_t count = static_cast<int64_t>(slots.size());
      rows_in.resize(static_cast<size_t>(count * hidden));
      rows_out.resize(static_cast<size_t>(count * hidden));
      for (int64_t r = 0; r < count; ++r) {
        const float* src = args.hidden.ptr<float>() + (slots[r] / top_k) * hidden;
        std::copy(src, src + hidden, rows_in.data() + r * hidden);
      }
      expert_forward(rows_in.data(), count, w, e - first, args.experts, rows_out.data(), &pool_);
      for (int64_t r = 0; r < count; ++r)
        std::copy(rows_out.data() + r * hidden, rows_out.data() + (r + 1) * hidden,
                  expert_out.data() + slots[r] * hidden);
    }

    // Combine.
    for (int64_t t = 0; t < tokens; ++t) {
      float* dst = args.out.ptr<float>() + t * hidden;
      std::fill_n(dst, hidden, 0.0f);
      for (int64_t k = 0; k < top_k; ++k) {
        if (!owned(ids[t * top_k + k])) continue;
        const float* y = expert_out.data() + (t * top_k + k) * hidden;
        const float weight = weights[t * top_k + k];
        for (int64_t i = 0; i < hidden; ++i) dst[i] += weight * y[i];
      }
    }
    return Status::ok();
  }

 private:
  ThreadPool& pool_;
};

}  // namespace

std::unique_ptr<moe::ExpertsKernel> make_modular_kernel(ThreadPool& pool) {
  return std::make_unique<ModularKernel>(pool);
}

}  // namespace sy::backend::cpu
