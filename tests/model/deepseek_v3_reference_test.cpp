// The whole DeepSeek-V3 forward pass against a double-precision reference written here from the
// architecture's definition (not from the engine's code, and in the expanded form: per-head K and
// V built from the latent, where the engine attends in the latent space): embeddings; per layer
// RMSNorm, q through q_a_proj -> q_a_layernorm -> q_b_proj, the kv latent and k_pe from
// kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj's per-head k_nope and v, RoPE on the rope dims
// only (de-interleaved, then rotate-half, with YaRN's frequencies and cos/sin factor), softmax
// scaled by 1/sqrt(qk_head_dim) x mscale(mscale_all_dim)^2, o_proj; RMSNorm, a dense SwiGLU on the
// first_k_dense_replace layers, elsewhere the sigmoid router with the correction bias for
// selection only, group-limited top-k (groups ranked by their two best), weights from the
// unbiased scores renormalised and times routed_scaling_factor, plus the shared experts; final
// norm and lm_head. Each of those pieces, left out of the reference, makes it disagree with the
// engine (the test shows it for the correction bias, the groups, the interleave and the mscale).
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <set>

#include "backend/backend.h"
#include "model/decoder.h"
#include "model/presets.h"

namespace sy::model {
namespace {

// Pieces of the definition the reference can leave out, to show that each one matters.
struct Omit {
  bool selection_bias = false;  // select on the unbiased scores
  bool groups = false;          // plain top-k over every expert
  bool interleave = false;      // rotate (i, i + d/2) on the dims as stored
  bool mscale = false;          // softmax scale 1/sqrt(qk_head_dim) only
};

struct Reference {
  const Checkpoint& ckpt;
  const ModelConfig& c;
  Omit omit;

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
  std::vector<double> linear(const std::string& w, const std::vector<double>& x,
                             int64_t out) const {
    const int64_t in = static_cast<int64_t>(x.size());
    const TensorInfo* weight = tensor(w);
    std::vector<double> y(static_cast<size_t>(out));
    for (int64_t o = 0; o < out; ++o) {
      double acc = 0.0;
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
  std::vector<double> swiglu(const std::string& p, const std::vector<double>& h,
                             int64_t width) const {
    const auto g = linear(p + "gate_proj.weight", h, width),
               u = linear(p + "up_proj.weight", h, width);
    std::vector<double> act(static_cast<size_t>(width));
    for (int64_t i = 0; i < width; ++i) act[i] = g[i] / (1 + std::exp(-g[i])) * u[i];
    return linear(p + "down_proj.weight", act, c.hidden_size);
  }
  static double mscale(double factor, double m) {
    return factor <= 1 ? 1.0 : 0.1 * m * std::log(factor) + 1.0;
  }
  // YaRN over the rope dims (DeepSeek's rope_scaling; transformers' truncated ramp).
  std::vector<double> inv_freq() const {
    const RopeScaling& y = c.rope_scaling;
    const double dim = static_cast<double>(c.latent_attention.qk_rope_head_dim),
                 base = c.rope_theta;
    std::vector<double> f;
    auto correction = [&](double rotations) {
      return dim * std::log(y.original_max_position_embeddings / (rotations * 2 * M_PI)) /
             (2 * std::log(base));
    };
    const double low = std::max(std::floor(correction(y.beta_fast)), 0.0),
                 high = std::min(std::ceil(correction(y.beta_slow)), dim - 1);
    for (int64_t i = 0; i < c.latent_attention.qk_rope_head_dim / 2; ++i) {
      const double plain = std::pow(base, -2.0 * static_cast<double>(i) / dim);
      const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
      f.push_back(plain / y.factor * ramp + plain * (1 - ramp));
    }
    return f;
  }

  void run(const std::vector<int32_t>& tokens, std::vector<double>& logits,
           std::vector<int32_t>& ids, std::vector<std::vector<double>>& choice_scores) const {
    const LatentAttentionSpec& mla = c.latent_attention;
    const int64_t n = static_cast<int64_t>(tokens.size()), H = c.hidden_size,
                  heads = c.num_attention_heads;
    const int64_t nope = mla.qk_nope_head_dim, rope = mla.qk_rope_head_dim, vd = mla.v_head_dim;
    const int64_t lora = mla.kv_lora_rank, E = c.num_experts, K = c.experts_per_token,
                  L = c.num_hidden_layers;
    const std::vector<double> freq = inv_freq();
    const RopeScaling& y = c.rope_scaling;
    const double cos_sin_factor = mscale(y.factor, y.mscale) / mscale(y.factor, y.mscale_all_dim);
    double scale = 1.0 / std::sqrt(static_cast<double>(nope + rope));
    if (!omit.mscale)
      scale *= mscale(y.factor, y.mscale_all_dim) * mscale(y.factor, y.mscale_all_dim);
    // As transformers' rope_interleave: de-interleave (evens, then odds), then rotate halves.
    auto apply_rope = [&](std::vector<double> v, int64_t pos) {
      std::vector<double> x = v;
      if (!omit.interleave)
        for (int64_t i = 0; i < rope / 2; ++i) x[i] = v[2 * i], x[i + rope / 2] = v[2 * i + 1];
      std::vector<double> out(static_cast<size_t>(rope));
      for (int64_t i = 0; i < rope / 2; ++i) {
        const double angle = static_cast<double>(pos) * freq[i];
        const double cs = std::cos(angle) * cos_sin_factor, sn = std::sin(angle) * cos_sin_factor;
        out[i] = x[i] * cs - x[i + rope / 2] * sn;
        out[i + rope / 2] = x[i + rope / 2] * cs + x[i] * sn;
      }
      return out;
    };
    std::vector<std::vector<double>> x(static_cast<size_t>(n),
                                       std::vector<double>(static_cast<size_t>(H)));
    for (int64_t t = 0; t < n; ++t)
      for (int64_t i = 0; i < H; ++i) x[t][i] = at("model.embed_tokens.weight", tokens[t] * H + i);
    ids.assign(static_cast<size_t>(n * L * K), 0);
    choice_scores.assign(static_cast<size_t>(n * L), {});
    for (int64_t l = 0; l < L; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".", a = p + "self_attn.";
      // q [heads][nope + rope] and k [heads][nope + rope], v [heads][vd] per token.
      std::vector<std::vector<double>> q(n), k(n), v(n);
      for (int64_t t = 0; t < n; ++t) {
        const auto h = rms_norm(x[t], p + "input_layernorm.weight");
        const auto q_low =
            rms_norm(linear(a + "q_a_proj.weight", h, mla.q_lora_rank), a + "q_a_layernorm.weight");
        q[t] = linear(a + "q_b_proj.weight", q_low, heads * (nope + rope));
        const auto compressed = linear(a + "kv_a_proj_with_mqa.weight", h, lora + rope);
        const auto latent =
            rms_norm(std::vector<double>(compressed.begin(), compressed.begin() + lora),
                     a + "kv_a_layernorm.weight");
        const auto k_pe =
            apply_rope(std::vector<double>(compressed.begin() + lora, compressed.end()), t);
        const auto kv = linear(a + "kv_b_proj.weight", latent, heads * (nope + vd));
        for (int64_t hd = 0; hd < heads; ++hd) {
          const double* row = kv.data() + hd * (nope + vd);
          k[t].insert(k[t].end(), row, row + nope);
          k[t].insert(k[t].end(), k_pe.begin(), k_pe.end());
          v[t].insert(v[t].end(), row + nope, row + nope + vd);
          double* qh = q[t].data() + hd * (nope + rope);
          const auto q_pe = apply_rope(std::vector<double>(qh + nope, qh + nope + rope), t);
          std::copy(q_pe.begin(), q_pe.end(), qh + nope);
        }
      }
      for (int64_t t = 0; t < n; ++t) {
        std::vector<double> attn(static_cast<size_t>(heads * vd), 0.0);
        for (int64_t hd = 0; hd < heads; ++hd) {
          std::vector<double> w;
          double denom = 0;
          for (int64_t s = 0; s <= t; ++s) {
            double dot = 0;
            for (int64_t i = 0; i < nope + rope; ++i)
              dot += q[t][hd * (nope + rope) + i] * k[s][hd * (nope + rope) + i];
            w.push_back(std::exp(dot * scale));
            denom += w.back();
          }
          for (int64_t s = 0; s <= t; ++s)
            for (int64_t i = 0; i < vd; ++i) attn[hd * vd + i] += w[s] / denom * v[s][hd * vd + i];
        }
        const auto o = linear(a + "o_proj.weight", attn, H);
        for (int64_t i = 0; i < H; ++i) x[t][i] += o[i];
      }
      for (int64_t t = 0; t < n; ++t) {
        const auto h = rms_norm(x[t], p + "post_attention_layernorm.weight");
        if (!c.is_moe_layer(static_cast<int>(l))) {
          const auto y_dense = swiglu(p + "mlp.", h, c.intermediate_size);
          for (int64_t i = 0; i < H; ++i) x[t][i] += y_dense[i];
          continue;
        }
        const auto logit = linear(p + "mlp.gate.weight", h, E);
        std::vector<double> score(static_cast<size_t>(E)), choice(static_cast<size_t>(E));
        for (int64_t e = 0; e < E; ++e) {
          score[e] = 1 / (1 + std::exp(-logit[e]));
          choice[e] = score[e] +
                      (omit.selection_bias ? 0.0 : at(p + "mlp.gate.e_score_correction_bias", e));
        }
        // Keep the topk_group groups whose two best choice scores sum highest.
        const int64_t groups = omit.groups ? 1 : c.router.num_groups, size = E / groups;
        std::vector<std::pair<double, int64_t>> ranked;
        for (int64_t g = 0; g < groups; ++g) {
          std::vector<double> members(choice.begin() + g * size, choice.begin() + (g + 1) * size);
          std::sort(members.begin(), members.end(), std::greater<>());
          ranked.push_back({-(members[0] + (size > 1 ? members[1] : 0.0)), g});
        }
        std::sort(ranked.begin(), ranked.end());
        std::set<int64_t> kept;
        for (int64_t g = 0; g < (omit.groups ? 1 : c.router.topk_groups); ++g)
          kept.insert(ranked[g].second);
        std::vector<int32_t> order;
        for (int64_t e = 0; e < E; ++e)
          if (kept.count(e / size)) order.push_back(static_cast<int32_t>(e));
        std::stable_sort(order.begin(), order.end(),
                         [&](int32_t i, int32_t j) { return choice[i] > choice[j]; });
        std::vector<double> candidates;
        for (int32_t e : order) candidates.push_back(choice[e]);
        choice_scores[static_cast<size_t>(l * n + t)] = candidates;
        double sum = 0;
        for (int64_t j = 0; j < K; ++j) sum += score[order[j]];
        for (int64_t j = 0; j < K; ++j) {
          const int32_t e = order[j];
          ids[static_cast<size_t>((t * L + l) * K + j)] = e;
          const double weight = score[e] / sum * c.router.routed_scaling_factor;
          const auto y_e =
              swiglu(p + "mlp.experts." + std::to_string(e) + ".", h, c.moe_intermediate_size);
          for (int64_t i = 0; i < H; ++i) x[t][i] += weight * y_e[i];
        }
        const auto shared = swiglu(p + "mlp.shared_experts.", h, c.shared_expert_intermediate_size);
        for (int64_t i = 0; i < H; ++i) x[t][i] += shared[i];
      }
    }
    logits.clear();
    for (int64_t t = 0; t < n; ++t) {
      const auto row = linear("lm_head.weight", rms_norm(x[t], "model.norm.weight"), c.vocab_size);
      logits.insert(logits.end(), row.begin(), row.end());
    }
  }
};

class DeepseekV3Reference : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("sy_dsv3_ref_" + std::to_string(::getpid()));
    auto config = preset_config("deepseek_v3", "tiny", 0);
    ASSERT_TRUE(config.is_ok());
    ASSERT_TRUE(write_random_checkpoint(*config, nlohmann::json::object(), dir_.string(), 21, false)
                    .is_ok());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

TEST_F(DeepseekV3Reference, TheWholeForwardPassMatchesADoublePrecisionReference) {
  auto backend = backend::make_cpu_backend({2});
  moe::ExpertsKernelRegistry registry;
  backend->register_kernels(registry);
  auto model = Model::load(dir_.string(), *backend);
  ASSERT_TRUE(model.is_ok()) << model.message();
  const ModelConfig& c = (*model)->config();
  auto checkpoint = Checkpoint::open(dir_.string());
  ASSERT_TRUE(checkpoint.is_ok());
  // Past YaRN's original context of 32, over three KV blocks.
  const int32_t n = 40;
  std::vector<int32_t> tokens;
  for (int32_t i = 0; i < n; ++i) tokens.push_back(500 + (i * 7919) % 9000);

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
  in.max_blocks_per_seq = 3;
  in.block_tables = {0, 1, 2};
  in.capture_routes = true;
  StepOutputs out;
  ASSERT_TRUE(decoder.forward(**model, in, out).is_ok());
  ASSERT_TRUE(decoder.finish_step(**model, out).is_ok());
  std::vector<float> got(static_cast<size_t>(out.logits.numel()));
  backend->download(out.logits, got.data());
  const int64_t K = c.experts_per_token, L = c.num_hidden_layers;

  // (worst logit difference, rows compared, rows whose routes differ) against a reference.
  struct Agreement {
    double worst = 0, top = 0;
    int compared = 0, differing = 0;
  };
  auto compare = [&](Omit omit) {
    std::vector<double> want;
    std::vector<int32_t> want_ids;
    std::vector<std::vector<double>> choice;
    Reference{*checkpoint, c, omit}.run(tokens, want, want_ids, choice);
    Agreement agreement;
    EXPECT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
      agreement.worst = std::max(agreement.worst, std::fabs(got[i] - want[i]));
      agreement.top = std::max(agreement.top, std::fabs(want[i]));
    }
    for (int64_t t = 0; t < n; ++t)
      for (int64_t l = 0; l < L; ++l) {
        if (!c.is_moe_layer(static_cast<int>(l))) continue;
        const std::vector<double>& sorted = choice[static_cast<size_t>(l * n + t)];
        if (sorted[K - 1] - sorted[K] < 1e-4) continue;  // a near-tie
        const size_t at = static_cast<size_t>((t * L + l) * K);
        ++agreement.compared;
        agreement.differing +=
            !std::equal(want_ids.begin() + at, want_ids.begin() + at + K, out.routes.begin() + at);
      }
    return agreement;
  };
  const Agreement exact = compare({});
  std::printf(
      "[ deepseek_v3 tiny ] logits max |diff| %.3g (max |logit| %.3g), %d route rows compared\n",
      exact.worst, exact.top, exact.compared);
  EXPECT_LT(exact.worst, 1e-4 * std::max(1.0, exact.top));
  EXPECT_EQ(exact.differing, 0);
  EXPECT_GT(exact.compared, n * (L - 1) * 9 / 10);

  // Each piece matters: the reference without it disagrees with the engine.
  const Agreement no_bias = compare({.selection_bias = true});
  EXPECT_GT(no_bias.differing, 0) << "the correction bias must steer selection";
  const Agreement no_groups = compare({.groups = true});
  EXPECT_GT(no_groups.differing, 0) << "group-limited top-k must change some selections";
  const Agreement no_interleave = compare({.interleave = true});
  EXPECT_GT(no_interleave.worst, 100 * exact.worst + 1e-5) << "rope_interleave's pairs";
  const Agreement no_mscale = compare({.mscale = true});
  EXPECT_GT(no_mscale.worst, 100 * exact.worst + 1e-5) << "mscale_all_dim's softmax scale";
  std::printf(
      "[ deepseek_v3 tiny ] without bias: %d/%d rows differ; without groups: %d/%d; "
      "logits without interleave %.3g, without mscale %.3g\n",
      no_bias.differing, no_bias.compared, no_groups.differing, no_groups.compared,
      no_interleave.worst, no_mscale.worst);
}

}  // namespace
}  // namespace sy::model
