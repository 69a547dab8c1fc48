// The gating-weight sink of the CPU MoE kernels: every kernel writes, for each token, layer and
// slot, the weight it multiplied that expert's output by. Checked against an independent
// double-precision router (softmax or sigmoid, selection bias, softmax after top-k, top-k,
// renormalisation, scaling) and against the block's own output: out = sum_k w_k * expert_k(x)
// with the experts recomputed in double.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <ostream>
#include <random>
#include <vector>

#include "../test_seed.h"
#include "backend/backend.h"
#include "moe/router.h"

namespace sy::backend {
namespace {

struct Layer {
  int64_t experts, hidden, intermediate;
  std::vector<uint16_t> router, gate_up, down;  // bf16 bits
  double w(const std::vector<uint16_t>& m, size_t i) const { return bf16_to_f32(m[i]); }
};

Layer random_layer(std::mt19937_64& rng, int64_t experts, int64_t hidden, int64_t intermediate) {
  Layer layer{experts, hidden, intermediate, {}, {}, {}};
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  auto fill = [&](std::vector<uint16_t>& m, size_t n, float scale) {
    m.resize(n);
    for (auto& v : m) v = f32_to_bf16(u(rng) * scale);
  };
  fill(layer.router, static_cast<size_t>(experts * hidden), 2.0f);  // decisive routing
  fill(layer.gate_up, static_cast<size_t>(experts * 2 * intermediate * hidden), 0.3f);
  fill(layer.down, static_cast<size_t>(experts * hidden * intermediate), 0.3f);
  return layer;
}

// The router in double: softmax over all experts, top-k by probability (ties: lower id).
struct Routed {
  std::vector<int32_t> ids;
  std::vector<double> weights;
  double margin = 1.0;  // gap between the k-th and (k+1)-th probability: tiny = ambiguous
};
// Scoring: softmax or sigmoid; selection by score + selection bias (DeepSeek-V3's correction,
// which steers selection only); weights = the chosen scores (or, softmax after top-k, a softmax
// over the chosen logits), renormalised and scaled.
Routed route_double(const Layer& layer, const float* x, const moe::RouterSpec& spec,
                    const int32_t* forced, const std::vector<float>& selection_bias) {
  std::vector<double> logits(static_cast<size_t>(layer.experts));
  for (int64_t e = 0; e < layer.experts; ++e) {
    double dot = 0;
    for (int64_t i = 0; i < layer.hidden; ++i)
      dot += layer.w(layer.router, static_cast<size_t>(e * layer.hidden + i)) * x[i];
    logits[e] = dot;
  }
  const double top = *std::max_element(logits.begin(), logits.end());
  std::vector<double> probs(logits.size());
  if (spec.softmax_after_topk) {
    probs = logits;  // selection on the logits
  } else if (spec.scoring == moe::RouterScoring::kSigmoid) {
    for (size_t e = 0; e < logits.size(); ++e) probs[e] = 1.0 / (1.0 + std::exp(-logits[e]));
  } else {
    double sum = 0;
    for (size_t e = 0; e < logits.size(); ++e) sum += probs[e] = std::exp(logits[e] - top);
    for (double& p : probs) p /= sum;
  }
  std::vector<double> choice = probs;
  for (size_t e = 0; e < selection_bias.size(); ++e) choice[e] += selection_bias[e];
  std::vector<int32_t> order(probs.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return choice[a] > choice[b]; });
  Routed routed;
  if (forced) {
    routed.ids.assign(forced, forced + spec.top_k);
  } else {
    routed.ids.assign(order.begin(), order.begin() + spec.top_k);
    routed.margin = choice[order[spec.top_k - 1]] - choice[order[spec.top_k]];
  }
  if (spec.softmax_after_topk) {
    double m = -INFINITY, z = 0;
    for (int32_t id : routed.ids) m = std::max(m, logits[id]);
    for (int32_t id : routed.ids) z += std::exp(logits[id] - m);
    for (int32_t id : routed.ids) probs[id] = std::exp(logits[id] - m) / z;
  }
  double chosen = 0;
  for (int32_t id : routed.ids) chosen += probs[id];
  for (int32_t id : routed.ids)
    routed.weights.push_back((spec.renormalize ? probs[id] / chosen : probs[id]) *
                             spec.routed_scaling_factor);
  return routed;
}

// Expert e's SwiGLU MLP in double.
std::vector<double> expert_double(const Layer& layer, int64_t e, const float* x) {
  const int64_t h = layer.hidden, inter = layer.intermediate;
  std::vector<double> act(static_cast<size_t>(inter));
  for (int64_t j = 0; j < inter; ++j) {
    double g = 0, u = 0;
    for (int64_t i = 0; i < h; ++i) {
      g += layer.w(layer.gate_up, static_cast<size_t>((e * 2 * inter + j) * h + i)) * x[i];
      u += layer.w(layer.gate_up, static_cast<size_t>((e * 2 * inter + inter + j) * h + i)) * x[i];
    }
    act[j] = g / (1.0 + std::exp(-g)) * u;
  }
  std::vector<double> y(static_cast<size_t>(h));
  for (int64_t i = 0; i < h; ++i) {
    double dot = 0;
    for (int64_t j = 0; j < inter; ++j)
      dot += layer.w(layer.down, static_cast<size_t>((e * h + i) * inter + j)) * act[j];
    y[i] = dot;
  }
  return y;
}

struct Case {
  const char* kernel;
  bool renormalize;
  float scaling;
  bool forced;
  // cpu-modular only (the router options cpu-fused refuses):
  bool sigmoid = false;
  bool selection_bias = false;
  // both kernels (gpt-oss's order):
  bool softmax_after_topk = false;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.kernel << (c.renormalize ? " renormalised" : "") << " scaling " << c.scaling
      << (c.forced ? " forced" : "") << (c.sigmoid ? " sigmoid" : "")
      << (c.selection_bias ? " selection-bias" : "")
      << (c.softmax_after_topk ? " softmax-after-top-k" : "");
}

class MoeWeights : public ::testing::TestWithParam<Case> {};

TEST_P(MoeWeights, AreTheNumbersTheBlockMultipliedBy) {
  const Case c = GetParam();
  const uint64_t seed = test::test_seed();
  SY_SEED_TRACE(seed);
  std::mt19937_64 rng(seed);
  // Dimensions that are not multiples of 16; the layer under test is not layer 0.
  const int64_t experts = 19, top_k = 3, hidden = 37, intermediate = 21, tokens = 23, layers = 3;
  const int layer_index = 1;
  Layer layer = random_layer(rng, experts, hidden, intermediate);
  moe::RouterSpec spec{experts,
                       top_k,
                       c.sigmoid ? moe::RouterScoring::kSigmoid : moe::RouterScoring::kSoftmax,
                       c.renormalize,
                       c.softmax_after_topk,
                       c.scaling};
  spec.has_selection_bias = c.selection_bias;
  std::vector<float> selection_bias;
  if (c.selection_bias) {
    std::uniform_real_distribution<float> bias(-0.3f, 0.3f);
    for (int64_t e = 0; e < experts; ++e) selection_bias.push_back(bias(rng));
  }

  auto backend = make_cpu_backend({1});
  moe::ExpertsKernelRegistry registry;
  backend->register_kernels(registry);
  auto kernel = registry.select(c.kernel, {Device::kCpu, true, true});
  ASSERT_TRUE(kernel.is_ok()) << kernel.message();
  ASSERT_TRUE((*kernel)->captures_weights());

  moe::MoeLayerWeights weights;
  weights.router = Tensor(layer.router.data(), DType::kBF16, {experts, hidden});
  weights.gate_up = Tensor(layer.gate_up.data(), DType::kBF16, {experts, 2 * intermediate, hidden});
  weights.down = Tensor(layer.down.data(), DType::kBF16, {experts, hidden, intermediate});
  if (c.selection_bias)
    weights.selection_bias = Tensor(selection_bias.data(), DType::kF32, {experts});

  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(tokens * hidden)), out(x.size(), NAN);
  for (float& v : x) v = normal(rng);
  // Poisoned sinks, as the decoder leaves them before a step.
  std::vector<int32_t> ids(static_cast<size_t>(tokens * layers * top_k), moe::kRoutePoison);
  std::vector<int32_t> weight_bits(ids.size(), moe::kRouteWeightPoisonBits);
  std::vector<uint8_t> forced_flags(static_cast<size_t>(tokens), 0);
  std::vector<int32_t> forced_ids(ids.size(), 0);
  if (c.forced) {
    // Every other token gets a random distinct set of experts in a random order.
    for (int64_t t = 0; t < tokens; t += 2) {
      forced_flags[t] = 1;
      std::vector<int32_t> all(static_cast<size_t>(experts));
      std::iota(all.begin(), all.end(), 0);
      std::shuffle(all.begin(), all.end(), rng);
      std::copy_n(all.begin(), top_k, forced_ids.begin() + (t * layers + layer_index) * top_k);
    }
  }

  moe::MoeForwardArgs args;
  args.layer = layer_index;
  args.hidden = Tensor(x.data(), DType::kF32, {tokens, hidden});
  args.out = Tensor(out.data(), DType::kF32, {tokens, hidden});
  args.weights = &weights;
  args.spec = spec;
  args.routes.sink = Tensor(ids.data(), DType::kI32, {tokens, layers, top_k});
  args.routes.weights = Tensor(weight_bits.data(), DType::kF32, {tokens, layers, top_k});
  if (c.forced) {
    args.routes.source = Tensor(forced_ids.data(), DType::kI32, {tokens, layers, top_k});
    args.routes.forced = Tensor(forced_flags.data(), DType::kU8, {tokens});
  }
  ASSERT_TRUE((*kernel)->forward(args).is_ok());

  const float* w = reinterpret_cast<const float*>(weight_bits.data());
  int checked_ids = 0;
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t l = 0; l < layers; ++l) {
      for (int64_t k = 0; k < top_k; ++k) {
        const size_t at = static_cast<size_t>((t * layers + l) * top_k + k);
        if (l != layer_index) {  // other layers' entries are not this kernel call's to write
          EXPECT_EQ(ids[at], moe::kRoutePoison);
          EXPECT_EQ(weight_bits[at], moe::kRouteWeightPoisonBits);
        } else {
          EXPECT_NE(weight_bits[at], moe::kRouteWeightPoisonBits) << "token " << t << " slot " << k;
        }
      }
    }
    const float* xt = x.data() + t * hidden;
    const size_t row = static_cast<size_t>((t * layers + layer_index) * top_k);
    Routed ref = route_double(layer, xt, spec, forced_flags[t] ? forced_ids.data() + row : nullptr,
                              selection_bias);
    if (forced_flags[t] || ref.margin > 1e-4) {
      ++checked_ids;
      for (int64_t k = 0; k < top_k; ++k) {
        ASSERT_EQ(ids[row + k], ref.ids[k]) << "token " << t << " slot " << k;
        EXPECT_NEAR(w[row + k], ref.weights[k], 1e-5 * std::max(1.0, ref.weights[k]))
            << "token " << t << " slot " << k;
      }
    }
    // The block's output is the weighted sum of the chosen experts' outputs with these weights.
    std::vector<double> expected(static_cast<size_t>(hidden), 0.0);
    double scale = 0;
    for (int64_t k = 0; k < top_k; ++k) {
      std::vector<double> y = expert_double(layer, ids[row + k], xt);
      for (int64_t i = 0; i < hidden; ++i) expected[i] += w[row + k] * y[i];
    }
    for (double v : expected) scale = std::max(scale, std::abs(v));
    for (int64_t i = 0; i < hidden; ++i)
      ASSERT_NEAR(out[static_cast<size_t>(t * hidden + i)], expected[i],
                  2e-5 * std::max(1.0, scale))
          << "token " << t << " dim " << i;
  }
  EXPECT_GT(checked_ids, tokens / 2) << "too many near-ties to check the ids";
}

INSTANTIATE_TEST_SUITE_P(
    Kernels, MoeWeights,
    ::testing::Values(Case{"cpu-modular", true, 1.0f, false},
                      Case{"cpu-modular", false, 2.5f, false},
                      Case{"cpu-modular", true, 1.0f, true}, Case{"cpu-fused", true, 1.0f, false},
                      Case{"cpu-fused", false, 2.5f, false}, Case{"cpu-fused", false, 1.0f, true},
                      Case{"cpu-modular", true, 2.5f, false, true, true},
                      Case{"cpu-modular", true, 2.5f, true, true, true},
                      Case{"cpu-modular", false, 1.0f, false, false, false, true},
                      Case{"cpu-fused", false, 1.0f, false, false, false, true},
                      Case{"cpu-fused", false, 1.0f, true, false, false, true}),
    [](const auto& info) {
      std::string name = info.param.kernel;
      std::replace(name.begin(), name.end(), '-', '_');
      return name + (info.param.renormalize ? "_renorm" : "_raw") +
             (info.param.scaling != 1.0f ? "_scaled" : "") + (info.param.forced ? "_forced" : "") +
             (info.param.sigmoid ? "_sigmoid" : "") +
             (info.param.selection_bias ? "_selection_bias" : "") +
             (info.param.softmax_after_topk ? "_softmax_after_topk" : "");
    });

}  // namespace
}  // namespace sy::backend
