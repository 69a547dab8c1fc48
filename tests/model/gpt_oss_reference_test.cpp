// The whole gpt-oss forward pass against a double-precision reference written here from the model
// card's definition (not from the engine's code): embeddings; per layer RMSNorm, q/k/v with biases,
// YaRN RoPE (frequencies and the cos/sin factor), attention with per-head sinks and the sliding
// window on the layers layer_types marks, o_proj with bias; RMSNorm, the router with its bias,
// top-k on the logits, softmax over the k, MXFP4 experts (decoded from the bit fields) with biases,
// gate/up interleaved and the clamped SwiGLU; final norm and lm_head. On make-model's tiny
// checkpoint, whose prompt is longer than the window.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <numeric>

#include "backend/backend.h"
#include "model/decoder.h"
#include "model/presets.h"

namespace sy::model {
namespace {

struct Reference {
  const Checkpoint& ckpt;
  const ModelConfig& c;

  static double value(const TensorInfo* t, int64_t i) {
    if (t->dtype == DType::kBF16) return bf16_to_f32(reinterpret_cast<const uint16_t*>(t->data)[i]);
    return reinterpret_cast<const float*>(t->data)[i];
  }
  const TensorInfo* tensor(const std::string& name) const {
    const TensorInfo* t = ckpt.find(name);
    EXPECT_NE(t, nullptr) << name;
    return t;
  }
  double at(const std::string& name, int64_t i) const { return value(tensor(name), i); }
  // y = W x (+ b), W [out, in] row-major.
  std::vector<double> linear(const std::string& w, const std::string& b,
                             const std::vector<double>& x, int64_t out) const {
    const int64_t in = static_cast<int64_t>(x.size());
    const TensorInfo* weight = tensor(w);
    const TensorInfo* bias = b.empty() ? nullptr : tensor(b);
    std::vector<double> y(static_cast<size_t>(out));
    for (int64_t o = 0; o < out; ++o) {
      double acc = bias ? value(bias, o) : 0.0;
      for (int64_t i = 0; i < in; ++i) acc += value(weight, o * in + i) * x[static_cast<size_t>(i)];
      y[static_cast<size_t>(o)] = acc;
    }
    return y;
  }
  std::vector<double> rms_norm(const std::vector<double>& x, const std::string& w) const {
    double ss = 0;
    for (double v : x) ss += v * v;
    const double scale = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + c.rms_norm_eps);
    std::vector<double> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = at(w, static_cast<int64_t>(i)) * x[i] * scale;
    return y;
  }
  // MXFP4 matrix [E, out, in] entry, from the e2m1 bit fields and the e8m0 scale.
  double mxfp4(const std::string& base, int64_t e, int64_t out_rows, int64_t in, int64_t row,
               int64_t col) const {
    const uint8_t* blocks = ckpt.find(base + "_blocks")->data;
    const uint8_t* scales = ckpt.find(base + "_scales")->data;
    const int64_t group = ((e * out_rows + row) * (in / 32) + col / 32);
    const uint8_t byte = blocks[group * 16 + (col % 32) / 2];
    const unsigned code = col % 2 ? byte >> 4 : byte & 15;
    const unsigned exponent = (code >> 1) & 3, mantissa = code & 1;
    const double magnitude =
        exponent == 0 ? 0.5 * mantissa : std::ldexp(1.0 + 0.5 * mantissa, exponent - 1);
    return (code & 8 ? -magnitude : magnitude) * std::pow(2.0, scales[group] - 127.0);
  }
  std::vector<double> inv_freq() const {
    const RopeScaling& y = c.rope_scaling;
    const double dim = static_cast<double>(c.head_dim), base = c.rope_theta;
    auto correction = [&](double rotations) {
      return dim * std::log(y.original_max_position_embeddings / (rotations * 2 * M_PI)) /
             (2 * std::log(base));
    };
    double low = std::max(correction(y.beta_fast), 0.0),
           high = std::min(correction(y.beta_slow), dim - 1);
    std::vector<double> f;
    for (int64_t i = 0; i < c.head_dim / 2; ++i) {
      const double plain = std::pow(base, -2.0 * static_cast<double>(i) / dim);
      const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
      f.push_back(plain / y.factor * ramp + plain * (1 - ramp));
    }
    return f;
  }

  // Logits [n, vocab] and, per token and layer, the chosen ids and the router logits.
  void run(const std::vector<int32_t>& tokens, std::vector<double>& logits,
           std::vector<int32_t>& ids, std::vector<std::vector<double>>& router_logits) const {
    const int64_t n = static_cast<int64_t>(tokens.size()), H = c.hidden_size, D = c.head_dim;
    const int64_t heads = c.num_attention_heads, kv = c.num_key_value_heads, E = c.num_experts;
    const int64_t K = c.experts_per_token, I = c.moe_intermediate_size;
    const std::vector<double> freq = inv_freq();
    const double mscale = 0.1 * std::log(c.rope_scaling.factor) + 1.0;
    std::vector<std::vector<double>> x(static_cast<size_t>(n),
                                       std::vector<double>(static_cast<size_t>(H)));
    for (int64_t t = 0; t < n; ++t)
      for (int64_t i = 0; i < H; ++i) x[t][i] = at("model.embed_tokens.weight", tokens[t] * H + i);
    auto rope = [&](std::vector<double>& v, int64_t count, int64_t pos) {
      for (int64_t h = 0; h < count; ++h)
        for (int64_t i = 0; i < D / 2; ++i) {
          double& a = v[h * D + i];
          double& b = v[h * D + i + D / 2];
          const double angle = static_cast<double>(pos) * freq[i], ca = a, cb = b;
          a = mscale * (ca * std::cos(angle) - cb * std::sin(angle));
          b = mscale * (cb * std::cos(angle) + ca * std::sin(angle));
        }
    };
    ids.assign(static_cast<size_t>(n * c.num_hidden_layers * K), 0);
    router_logits.clear();
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      const int64_t window = c.layers[l].attention.sliding_window;
      std::vector<std::vector<double>> q(n), k(n), v(n);
      for (int64_t t = 0; t < n; ++t) {
        const auto h = rms_norm(x[t], p + "input_layernorm.weight");
        q[t] = linear(p + "self_attn.q_proj.weight", p + "self_attn.q_proj.bias", h, heads * D);
        k[t] = linear(p + "self_attn.k_proj.weight", p + "self_attn.k_proj.bias", h, kv * D);
        v[t] = linear(p + "self_attn.v_proj.weight", p + "self_attn.v_proj.bias", h, kv * D);
        rope(q[t], heads, t);
        rope(k[t], kv, t);
      }
      for (int64_t t = 0; t < n; ++t) {
        std::vector<double> attn(static_cast<size_t>(heads * D), 0.0);
        for (int64_t h = 0; h < heads; ++h) {
          const int64_t g = h / (heads / kv);
          const int64_t first = window > 0 ? std::max<int64_t>(0, t - window + 1) : 0;
          std::vector<double> w;
          const double sink = at(p + "self_attn.sinks", h);
          double denom = std::exp(sink);
          for (int64_t s = first; s <= t; ++s) {
            double dot = 0;
            for (int64_t i = 0; i < D; ++i) dot += q[t][h * D + i] * k[s][g * D + i];
            w.push_back(std::exp(dot / std::sqrt(static_cast<double>(D))));
            denom += w.back();
          }
          for (int64_t s = first; s <= t; ++s)
            for (int64_t i = 0; i < D; ++i)
              attn[h * D + i] += w[s - first] / denom * v[s][g * D + i];
        }
        const auto o = linear(p + "self_attn.o_proj.weight", "", attn, H);
        for (int64_t i = 0; i < H; ++i) x[t][i] += o[i];  // (make-model writes no o_proj bias)
      }
      for (int64_t t = 0; t < n; ++t) {
        const auto h = rms_norm(x[t], p + "post_attention_layernorm.weight");
        const auto r = linear(p + "mlp.router.weight", p + "mlp.router.bias", h, E);
        router_logits.push_back(r);
        std::vector<int32_t> order(static_cast<size_t>(E));
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(),
                         [&](int32_t a, int32_t b) { return r[a] > r[b]; });
        double top = r[order[0]], sum = 0;
        std::vector<double> gate(static_cast<size_t>(K));
        for (int64_t j = 0; j < K; ++j) sum += gate[j] = std::exp(r[order[j]] - top);
        for (int64_t j = 0; j < K; ++j) {
          const int64_t e = order[j];
          ids[static_cast<size_t>((t * c.num_hidden_layers + l) * K + j)] = static_cast<int32_t>(e);
          std::vector<double> act(static_cast<size_t>(I));
          for (int64_t i = 0; i < I; ++i) {
            double g = at(p + "mlp.experts.gate_up_proj_bias", e * 2 * I + 2 * i);
            double u = at(p + "mlp.experts.gate_up_proj_bias", e * 2 * I + 2 * i + 1);
            for (int64_t col = 0; col < H; ++col) {
              g += mxfp4(p + "mlp.experts.gate_up_proj", e, 2 * I, H, 2 * i, col) * h[col];
              u += mxfp4(p + "mlp.experts.gate_up_proj", e, 2 * I, H, 2 * i + 1, col) * h[col];
            }
            g = std::min(g, 7.0);
            u = std::clamp(u, -7.0, 7.0);
            act[i] = (u + 1) * g / (1 + std::exp(-1.702 * g));
          }
          for (int64_t o = 0; o < H; ++o) {
            double y = at(p + "mlp.experts.down_proj_bias", e * H + o);
            for (int64_t i = 0; i < I; ++i)
              y += mxfp4(p + "mlp.experts.down_proj", e, H, I, o, i) * act[i];
            x[t][o] += gate[j] / sum * y;
          }
        }
      }
    }
    logits.clear();
    for (int64_t t = 0; t < n; ++t) {
      const auto h = rms_norm(x[t], "model.norm.weight");
      const auto row = linear("lm_head.weight", "", h, c.vocab_size);
      logits.insert(logits.end(), row.begin(), row.end());
    }
  }
};

TEST(GptOssReference, TheWholeForwardPassMatchesADoublePrecisionReference) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("sy_gptoss_ref_" + std::to_string(::getpid()));
  auto config = preset_config("gpt_oss", "tiny", 0);
  ASSERT_TRUE(config.is_ok());
  ASSERT_TRUE(
      write_random_checkpoint(*config, nlohmann::json::object(), dir.string(), 21, false).is_ok());
  auto backend = backend::make_cpu_backend({2});
  moe::ExpertsKernelRegistry registry;
  backend->register_kernels(registry);
  auto model = Model::load(dir.string(), *backend);
  ASSERT_TRUE(model.is_ok()) << model.message();
  const ModelConfig& c = (*model)->config();
  ASSERT_FALSE(c.rope_scaling.truncate) << "the reference's ramp is the untruncated one";
  auto checkpoint = Checkpoint::open(dir.string());
  ASSERT_TRUE(checkpoint.is_ok());
  const int32_t n = 30;  // longer than the window of 20
  ASSERT_GT(n, c.layers[0].attention.sliding_window);
  std::vector<int32_t> tokens;
  for (int32_t i = 0; i < n; ++i) tokens.push_back(500 + (i * 7919) % 9000);
  std::vector<double> want;
  std::vector<int32_t> want_ids;
  std::vector<std::vector<double>> router_logits;
  Reference{*checkpoint, c}.run(tokens, want, want_ids, router_logits);

  Decoder decoder(*backend, KernelChoice{*registry.select("cpu-modular", {}), nullptr, 0}, 16);
  ASSERT_TRUE(decoder.allocate(c, 4, {64, 1, 4, 64}).is_ok());
  StepInputs in;
  in.token_ids = tokens;
  for (int32_t p = 0; p < n; ++p) {
    in.positions.push_back(p);
    in.token_seq.push_back(0);
    in.slot_mapping.push_back(p);
    in.logits_rows.push_back(p);
  }
  in.num_seqs = 1;
  in.max_blocks_per_seq = 2;
  in.block_tables = {0, 1};
  in.capture_routes = true;
  StepOutputs out;
  ASSERT_TRUE(decoder.forward(**model, in, out).is_ok());
  ASSERT_TRUE(decoder.finish_step(**model, out).is_ok());
  std::vector<float> got(static_cast<size_t>(out.logits.numel()));
  backend->download(out.logits, got.data());
  ASSERT_EQ(got.size(), want.size());
  double worst = 0, top = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    worst = std::max(worst, std::fabs(got[i] - want[i]));
    top = std::max(top, std::fabs(want[i]));
  }
  // f32 against double: ~3e-7 here; ignoring YaRN's cos/sin factor alone moves the logits ~1e-2.
  EXPECT_LT(worst, 1e-4 * std::max(1.0, top)) << "max |logit| " << top;
  std::printf("[ gpt_oss tiny ] logits max |diff| %.3g (max |logit| %.3g)\n", worst, top);
  // Routes: identical except where the reference's k-th and (k+1)-th logits nearly tie.
  const int64_t K = c.experts_per_token, L = c.num_hidden_layers;
  int compared = 0;
  for (int64_t t = 0; t < n; ++t)
    for (int64_t l = 0; l < L; ++l) {
      std::vector<double> sorted = router_logits[static_cast<size_t>(l * n + t)];
      std::sort(sorted.begin(), sorted.end(), std::greater<>());
      if (sorted[K - 1] - sorted[K] < 1e-4) continue;
      const size_t at = static_cast<size_t>((t * L + l) * K);
      EXPECT_TRUE(
          std::equal(want_ids.begin() + at, want_ids.begin() + at + K, out.routes.begin() + at))
          << "token " << t << " layer " << l;
      ++compared;
    }
  EXPECT_GT(compared, n * L * 9 / 10);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace sy::model
