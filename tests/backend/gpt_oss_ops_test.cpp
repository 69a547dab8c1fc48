// gpt-oss's blocks on the CPU backend against double-precision references written here
// independently of the engine: the MoE layer (router bias, top-k on logits then softmax over the
// k, expert biases, the clamped SwiGLU with (up + 1), gate/up interleaved, MXFP4 blocks decoded by
// the e2m1 formula with the e8m0 bias 127, and the same weights as a bf16 checkpoint stores them),
// attention sinks, and YaRN RoPE. Each test also shows that ignoring the field changes the output.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <random>
#include <vector>

#include "../test_seed.h"
#include "backend/backend.h"
#include "model/rope.h"
#include "moe/router.h"

namespace sy::backend {
namespace {

// e2m1 by its bit fields (sign, 2 exponent bits with bias 1, 1 mantissa bit), not a table.
double e2m1(unsigned code) {
  const double sign = (code & 8) ? -1.0 : 1.0;
  const unsigned exponent = (code >> 1) & 3, mantissa = code & 1;
  return sign * (exponent == 0 ? 0.5 * mantissa : std::ldexp(1.0 + 0.5 * mantissa, exponent - 1));
}

// What a reference may get wrong, one field at a time.
struct Ignore {
  bool nibble_order = false;  // high nibble first
  bool scale_bias = false;    // bias 128 instead of 127
  bool interleave = false;    // gate rows first, then up rows
  bool clamp = false;
  bool plus_one = false;  // up instead of (up + 1)
  bool biases = false;
};

struct GptOssLayer {
  int64_t experts = 4, hidden = 64, inter = 32, top_k = 2;
  std::vector<uint8_t> gate_up_blocks, gate_up_scales, down_blocks, down_scales;
  std::vector<float> router, router_bias, gate_up_bias, down_bias;

  // Decoded matrix value [e, row, col] of an MXFP4 matrix with `in` columns.
  static double mxfp4(const std::vector<uint8_t>& blocks, const std::vector<uint8_t>& scales,
                      int64_t rows, int64_t in, int64_t e, int64_t row, int64_t col,
                      const Ignore& ignore) {
    const int64_t group = col / 32, within = col % 32;
    const uint8_t byte =
        blocks[static_cast<size_t>(((e * rows + row) * (in / 32) + group) * 16 + within / 2)];
    const bool high = (within % 2 == 1) != ignore.nibble_order;
    const int scale = scales[static_cast<size_t>((e * rows + row) * (in / 32) + group)];
    return e2m1(high ? byte >> 4 : byte & 15) *
           std::pow(2.0, scale - (ignore.scale_bias ? 128 : 127));
  }
  double gate_up(int64_t e, int64_t row, int64_t col, const Ignore& ig = {}) const {
    return mxfp4(gate_up_blocks, gate_up_scales, 2 * inter, hidden, e, row, col, ig);
  }
  double down(int64_t e, int64_t row, int64_t col, const Ignore& ig = {}) const {
    return mxfp4(down_blocks, down_scales, hidden, inter, e, row, col, ig);
  }

  // One expert in double; `clamped` counts the entries the limit cut.
  std::vector<double> expert(const float* x, int64_t e, const Ignore& ig, int* clamped) const {
    std::vector<double> h(static_cast<size_t>(inter)), y(static_cast<size_t>(hidden));
    for (int64_t i = 0; i < inter; ++i) {
      const int64_t gate_row = ig.interleave ? i : 2 * i,
                    up_row = ig.interleave ? inter + i : 2 * i + 1;
      double gate = ig.biases ? 0 : gate_up_bias[static_cast<size_t>(e * 2 * inter + gate_row)];
      double up = ig.biases ? 0 : gate_up_bias[static_cast<size_t>(e * 2 * inter + up_row)];
      for (int64_t c = 0; c < hidden; ++c) {
        gate += gate_up(e, gate_row, c, ig) * x[c];
        up += gate_up(e, up_row, c, ig) * x[c];
      }
      if (clamped) *clamped += (gate > 9.0) + (std::fabs(up) > 9.0);  // well past the limit
      if (!ig.clamp) {
        gate = std::min(gate, 7.0);
        up = std::max(-7.0, std::min(up, 7.0));
      }
      h[static_cast<size_t>(i)] =
          (ig.plus_one ? up : up + 1.0) * gate / (1.0 + std::exp(-1.702 * gate));
    }
    for (int64_t o = 0; o < hidden; ++o) {
      double acc = ig.biases ? 0 : down_bias[static_cast<size_t>(e * hidden + o)];
      for (int64_t i = 0; i < inter; ++i) acc += down(e, o, i, ig) * h[static_cast<size_t>(i)];
      y[static_cast<size_t>(o)] = acc;
    }
    return y;
  }

  // Router in double: logits + bias, top-k on the logits (ties: lower id), softmax over the k.
  std::vector<int32_t> route(const float* x, const int32_t* forced,
                             std::vector<double>& weights) const {
    std::vector<double> logits(static_cast<size_t>(experts));
    for (int64_t e = 0; e < experts; ++e) {
      double dot = router_bias[static_cast<size_t>(e)];
      for (int64_t c = 0; c < hidden; ++c)
        dot += double(router[static_cast<size_t>(e * hidden + c)]) * x[c];
      logits[static_cast<size_t>(e)] = dot;
    }
    std::vector<int32_t> ids(static_cast<size_t>(experts));
    std::iota(ids.begin(), ids.end(), 0);
    std::stable_sort(ids.begin(), ids.end(),
                     [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
    ids.resize(static_cast<size_t>(top_k));
    if (forced) ids.assign(forced, forced + top_k);
    double top = -INFINITY, sum = 0;
    for (int32_t id : ids) top = std::max(top, logits[id]);
    weights.clear();
    for (int32_t id : ids) sum += weights.emplace_back(std::exp(logits[id] - top));
    for (double& w : weights) w /= sum;
    return ids;
  }

  std::vector<double> block(const std::vector<float>& x, int64_t tokens, const Ignore& ig,
                            const std::vector<int32_t>* forced, int* clamped) const {
    std::vector<double> out(static_cast<size_t>(tokens * hidden), 0.0);
    for (int64_t t = 0; t < tokens; ++t) {
      std::vector<double> w;
      const auto ids =
          route(x.data() + t * hidden, forced ? forced->data() + t * top_k : nullptr, w);
      for (int64_t k = 0; k < top_k; ++k) {
        const auto y = expert(x.data() + t * hidden, ids[static_cast<size_t>(k)], ig, clamped);
        for (int64_t o = 0; o < hidden; ++o)
          out[static_cast<size_t>(t * hidden + o)] +=
              w[static_cast<size_t>(k)] * y[static_cast<size_t>(o)];
      }
    }
    return out;
  }
};

GptOssLayer random_layer(std::mt19937_64& rng) {
  GptOssLayer l;
  std::uniform_int_distribution<int> byte(0, 255), scale(124, 126);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  auto bytes = [&](std::vector<uint8_t>& v, size_t n, bool scales) {
    v.resize(n);
    for (auto& b : v) b = static_cast<uint8_t>(scales ? scale(rng) : byte(rng));
  };
  bytes(l.gate_up_blocks, static_cast<size_t>(l.experts * 2 * l.inter * l.hidden / 2), false);
  bytes(l.gate_up_scales, static_cast<size_t>(l.experts * 2 * l.inter * l.hidden / 32), true);
  bytes(l.down_blocks, static_cast<size_t>(l.experts * l.hidden * l.inter / 2), false);
  bytes(l.down_scales, static_cast<size_t>(l.experts * l.hidden * l.inter / 32), true);
  auto floats = [&](std::vector<float>& v, size_t n, float s) {
    v.resize(n);
    for (auto& f : v) f = u(rng) * s;
  };
  floats(l.router, static_cast<size_t>(l.experts * l.hidden), 0.5f);
  floats(l.router_bias, static_cast<size_t>(l.experts), 1.0f);
  floats(l.gate_up_bias, static_cast<size_t>(l.experts * 2 * l.inter), 1.0f);
  floats(l.down_bias, static_cast<size_t>(l.experts * l.hidden), 1.0f);
  return l;
}

Tensor view(void* data, DType dtype, std::initializer_list<int64_t> shape) {
  return Tensor(data, dtype, shape);
}

double max_diff(const std::vector<float>& a, const std::vector<double>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
  return worst;
}
// Relative to the reference's largest magnitude (the MoE fixture's outputs reach the hundreds).
double rel_diff(const std::vector<float>& a, const std::vector<double>& b) {
  double top = 1.0;
  for (double v : b) top = std::max(top, std::fabs(v));
  return max_diff(a, b) / top;
}

class GptOssMoe : public ::testing::TestWithParam<const char*> {};

TEST_P(GptOssMoe, MatchesTheDoubleReferenceInBothStorageFormatsAndEveryFieldMatters) {
  const uint64_t seed = test::test_seed();
  SY_SEED_TRACE(seed);
  std::mt19937_64 rng(seed);
  GptOssLayer l = random_layer(rng);
  const int64_t tokens = 7, E = l.experts, H = l.hidden, I = l.inter;
  std::vector<float> x(static_cast<size_t>(tokens * H));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (float& v : x) v = u(rng);
  int clamped = 0;
  const std::vector<double> reference = l.block(x, tokens, {}, nullptr, &clamped);
  ASSERT_GT(clamped, 5) << "the fixture must drive activations past swiglu_limit";

  // The same values as transformers saves them unquantised: gate_up [E, H, 2I], down [E, I, H].
  std::vector<uint16_t> gate_up_t(static_cast<size_t>(E * H * 2 * I)),
      down_t(static_cast<size_t>(E * I * H));
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t o = 0; o < 2 * I; ++o)
      for (int64_t c = 0; c < H; ++c)
        gate_up_t[static_cast<size_t>((e * H + c) * 2 * I + o)] =
            f32_to_bf16(static_cast<float>(l.gate_up(e, o, c)));
    for (int64_t o = 0; o < H; ++o)
      for (int64_t c = 0; c < I; ++c)
        down_t[static_cast<size_t>((e * I + c) * H + o)] =
            f32_to_bf16(static_cast<float>(l.down(e, o, c)));
  }

  auto backend = make_cpu_backend({2});
  moe::ExpertsKernelRegistry registry;
  backend->register_kernels(registry);
  auto kernel = registry.select(GetParam(), {Device::kCpu, true, true});
  ASSERT_TRUE(kernel.is_ok()) << kernel.message();
  moe::RouterSpec spec;
  spec.num_experts = E;
  spec.top_k = l.top_k;
  spec.softmax_after_topk = true;
  spec.has_logit_bias = true;
  ASSERT_TRUE((*kernel)->supports(spec).is_ok());

  for (auto format :
       {moe::ExpertFormat::kMxfp4Interleaved, moe::ExpertFormat::kTransposedInterleaved}) {
    const bool mxfp4 = format == moe::ExpertFormat::kMxfp4Interleaved;
    moe::MoeLayerWeights w;
    w.router = view(l.router.data(), DType::kF32, {E, H});
    w.router_bias = view(l.router_bias.data(), DType::kF32, {E});
    w.gate_up_bias = view(l.gate_up_bias.data(), DType::kF32, {E, 2 * I});
    w.down_bias = view(l.down_bias.data(), DType::kF32, {E, H});
    if (mxfp4) {
      w.gate_up = view(l.gate_up_blocks.data(), DType::kU8, {E, 2 * I, H / 32, 16});
      w.gate_up_scales = view(l.gate_up_scales.data(), DType::kU8, {E, 2 * I, H / 32});
      w.down = view(l.down_blocks.data(), DType::kU8, {E, H, I / 32, 16});
      w.down_scales = view(l.down_scales.data(), DType::kU8, {E, H, I / 32});
    } else {
      w.gate_up = view(gate_up_t.data(), DType::kBF16, {E, H, 2 * I});
      w.down = view(down_t.data(), DType::kBF16, {E, I, H});
    }
    moe::ExpertSpec experts;
    experts.activation = moe::ExpertActivation::kClampedSwiGlu;
    experts.has_biases = true;
    experts.format = format;
    ASSERT_TRUE((*kernel)->supports_experts(experts).is_ok());

    std::vector<float> out(static_cast<size_t>(tokens * H));
    std::vector<int32_t> sink(static_cast<size_t>(tokens * l.top_k), moe::kRoutePoison);
    moe::MoeForwardArgs args;
    args.hidden = view(x.data(), DType::kF32, {tokens, H});
    args.out = view(out.data(), DType::kF32, {tokens, H});
    args.weights = &w;
    args.spec = spec;
    args.experts = experts;
    args.routes.sink = view(sink.data(), DType::kI32, {tokens, 1, l.top_k});
    ASSERT_TRUE((*kernel)->forward(args).is_ok());
    const double diff = rel_diff(out, reference);
    EXPECT_LT(diff, 1e-5) << (mxfp4 ? "mxfp4" : "bf16");
    // The captured routes are the reference router's.
    for (int64_t t = 0; t < tokens; ++t) {
      std::vector<double> weights;
      const auto ids = l.route(x.data() + t * H, nullptr, weights);
      EXPECT_TRUE(std::equal(ids.begin(), ids.end(), sink.begin() + t * l.top_k)) << "token " << t;
    }

    // Replay: forced ids give the reference output at those ids.
    std::vector<int32_t> forced(static_cast<size_t>(tokens * l.top_k));
    for (int64_t t = 0; t < tokens; ++t) {
      forced[static_cast<size_t>(t * 2)] = static_cast<int32_t>(t % E);
      forced[static_cast<size_t>(t * 2 + 1)] = static_cast<int32_t>((t + 1 + t / E) % E);
    }
    std::vector<uint8_t> flags(static_cast<size_t>(tokens), 1);
    args.routes.source = view(forced.data(), DType::kI32, {tokens, 1, l.top_k});
    args.routes.forced = view(flags.data(), DType::kU8, {tokens});
    ASSERT_TRUE((*kernel)->forward(args).is_ok());
    EXPECT_LT(rel_diff(out, l.block(x, tokens, {}, &forced, nullptr)), 1e-5);
    EXPECT_EQ(sink, forced);
    args.routes = {};
    ASSERT_TRUE((*kernel)->forward(args).is_ok());
    ASSERT_LT(rel_diff(out, reference), 1e-5);

    // Every field the reference could ignore moves the output far past the tolerance.
    const std::vector<std::pair<const char*, Ignore>> ignored = {
        {"nibble order", {true, false, false, false, false, false}},
        {"scale bias", {false, true, false, false, false, false}},
        {"interleave", {false, false, true, false, false, false}},
        {"clamp", {false, false, false, true, false, false}},
        {"(up + 1)", {false, false, false, false, true, false}},
        {"expert biases", {false, false, false, false, false, true}}};
    for (const auto& [name, ig] : ignored)
      EXPECT_GT(rel_diff(out, l.block(x, tokens, ig, nullptr, nullptr)), 1e-3) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, GptOssMoe, ::testing::Values("cpu-modular", "cpu-fused"));

// Attention with a learned sink logit per head, against softmax([scores, sink]) in double.
TEST(GptOssAttention, SinksJoinTheSoftmaxDenominator) {
  const uint64_t seed = test::test_seed();
  SY_SEED_TRACE(seed);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const int64_t T = 9, heads = 4, kv_heads = 2, D = 8;
  std::vector<float> q(static_cast<size_t>(T * heads * D)),
      k(static_cast<size_t>(16 * kv_heads * D)), v(k.size()), sinks(static_cast<size_t>(heads)),
      out(static_cast<size_t>(T * heads * D));
  for (auto* vec : {&q, &k, &v})
    for (float& f : *vec) f = 2.0f * u(rng);
  for (float& s : sinks) s = 1.5f + u(rng);
  std::vector<int32_t> positions(T), seq(T, 0), slots(T), table = {0};
  std::iota(positions.begin(), positions.end(), 0);
  std::iota(slots.begin(), slots.end(), 0);
  auto backend = make_cpu_backend({1});
  AttentionBatch batch;
  batch.positions = view(positions.data(), DType::kI32, {T});
  batch.token_seq = view(seq.data(), DType::kI32, {T});
  batch.slot_mapping = view(slots.data(), DType::kI32, {T});
  batch.block_tables = view(table.data(), DType::kI32, {1, 1});
  batch.block_size = 16;
  for (int64_t window : {0, 4}) {
    batch.sliding_window = window;
    Tensor sink_tensor = view(sinks.data(), DType::kF32, {heads});
    Tensor q_t = view(q.data(), DType::kF32, {T, heads, D}),
           k_t = view(k.data(), DType::kF32, {16, kv_heads, D}),
           v_t = view(v.data(), DType::kF32, {16, kv_heads, D}),
           out_t = view(out.data(), DType::kF32, {T, heads * D});
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    auto reference = [&](bool with_sinks) {
      std::vector<double> ref(out.size());
      for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < heads; ++h) {
          const int64_t g = h / (heads / kv_heads),
                        first = window ? std::max<int64_t>(0, t - window + 1) : 0;
          std::vector<double> s;
          for (int64_t p = first; p <= t; ++p) {
            double dot = 0;
            for (int64_t i = 0; i < D; ++i)
              dot += double(q[(t * heads + h) * D + i]) * k[(p * kv_heads + g) * D + i];
            s.push_back(dot * scale);
          }
          double denom = with_sinks ? std::exp(double(sinks[h])) : 0.0;
          for (double& e : s) denom += (e = std::exp(e));
          for (int64_t i = 0; i < D; ++i) {
            double acc = 0;
            for (int64_t p = first; p <= t; ++p)
              acc += s[p - first] / denom * v[(p * kv_heads + g) * D + i];
            ref[(t * heads + h) * D + i] = acc;
          }
        }
      return ref;
    };
    batch.sinks = &sink_tensor;
    backend->attention(q_t, k_t, v_t, batch, scale, out_t);
    const double diff = max_diff(out, reference(true));
    EXPECT_LT(diff, 1e-5) << "window " << window;
    EXPECT_GT(max_diff(out, reference(false)), 1e-2) << "ignoring the sinks must show";
    batch.sinks = nullptr;
    backend->attention(q_t, k_t, v_t, batch, scale, out_t);
    EXPECT_LT(max_diff(out, reference(false)), 1e-5);
  }
}

// YaRN as transformers' _compute_yarn_parameters defines it, in double.
struct Yarn {
  double theta, factor, beta_fast, beta_slow;
  int64_t original, dim;
  bool truncate;
  std::vector<double> inv_freq() const {
    auto correction = [&](double rotations) {
      return dim * std::log(original / (rotations * 2 * M_PI)) / (2 * std::log(theta));
    };
    double low = correction(beta_fast), high = correction(beta_slow);
    if (truncate) low = std::floor(low), high = std::ceil(high);
    low = std::max(low, 0.0), high = std::min(high, double(dim - 1));
    if (low == high) high += 0.001;
    std::vector<double> out;
    for (int64_t i = 0; i < dim / 2; ++i) {
      const double base_freq = std::pow(theta, -2.0 * i / dim);
      const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
      out.push_back(base_freq / factor * ramp + base_freq * (1 - ramp));
    }
    return out;
  }
  double attention_factor() const { return factor <= 1 ? 1.0 : 0.1 * std::log(factor) + 1.0; }
};

TEST(GptOssRope, YarnFrequenciesAndAttentionFactorMatchTransformersFormula) {
  for (const Yarn yarn :
       {Yarn{150000, 32, 32, 1, 4096, 64, false}, Yarn{150000, 8, 32, 1, 32, 24, false},
        Yarn{10000, 4, 32, 1, 512, 24, true}}) {
    model::ModelConfig c;
    c.head_dim = yarn.dim;
    c.rope_theta = yarn.theta;
    c.rope_scaling.kind = model::RopeKind::kYarn;
    c.rope_scaling.factor = yarn.factor;
    c.rope_scaling.beta_fast = yarn.beta_fast;
    c.rope_scaling.beta_slow = yarn.beta_slow;
    c.rope_scaling.original_max_position_embeddings = yarn.original;
    c.rope_scaling.truncate = yarn.truncate;
    const model::RopeTable table = model::rope_table(c);
    const std::vector<double> expected = yarn.inv_freq();
    ASSERT_EQ(table.inv_freq.size(), expected.size());
    for (size_t i = 0; i < expected.size(); ++i)
      EXPECT_NEAR(table.inv_freq[i], expected[i], 2e-6 * expected[i]) << "i " << i;
    EXPECT_NEAR(table.attention_factor, yarn.attention_factor(), 1e-6);
    // truncate changes the ramp (so ignoring it would show).
    Yarn flipped = yarn;
    flipped.truncate = !yarn.truncate;
    double moved = 0;
    for (size_t i = 0; i < expected.size(); ++i)
      moved = std::max(moved, std::fabs(flipped.inv_freq()[i] - expected[i]) / expected[i]);
    EXPECT_GT(moved, 1e-3);

    // Applied by the backend: rotate-half with cos and sin times the attention factor.
    const int64_t D = yarn.dim, heads = 2;
    std::vector<float> x(static_cast<size_t>(heads * D)), original;
    std::mt19937_64 rng(test::test_seed());
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (float& f : x) f = u(rng);
    original = x;
    int32_t position = 57;
    AttentionBatch batch;
    batch.positions = view(&position, DType::kI32, {1});
    auto backend = make_cpu_backend({1});
    Tensor xt = view(x.data(), DType::kF32, {1, heads, D});
    backend->rope(xt, batch,
                  RopeSpec{yarn.theta, D, table.inv_freq.data(), table.attention_factor});
    std::vector<double> ref(x.size()), plain(x.size());
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < D / 2; ++i) {
        const double a = original[h * D + i], b = original[h * D + i + D / 2];
        const double angle = position * expected[i], m = yarn.attention_factor();
        ref[h * D + i] = m * (a * std::cos(angle) - b * std::sin(angle));
        ref[h * D + i + D / 2] = m * (b * std::cos(angle) + a * std::sin(angle));
        const double plain_angle = position * std::pow(yarn.theta, -2.0 * i / D);
        plain[h * D + i] = a * std::cos(plain_angle) - b * std::sin(plain_angle);
        plain[h * D + i + D / 2] = b * std::cos(plain_angle) + a * std::sin(plain_angle);
      }
    EXPECT_LT(max_diff(x, ref), 1e-4);
    EXPECT_GT(max_diff(x, plain), 1e-2) << "plain RoPE (yarn ignored) must differ";
  }
}

}  // namespace
}  // namespace sy::backend
