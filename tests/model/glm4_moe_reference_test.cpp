// The whole GLM-4.5 MoE forward pass against a double-precision reference written here from the
// architecture's definition (transformers' modeling_glm4_moe.py, read, not the engine's code):
// embeddings; per layer RMSNorm, q/k/v projections with their biases, per-head q/k RMSNorm
// (use_qk_norm), RoPE rotate-half over the first int(head_dim x partial_rotary_factor) dims of
// each head with frequencies theta^(-2i/rotary_dim), the other dims passed through, causal GQA
// softmax scaled by 1/sqrt(head_dim), o_proj without bias; RMSNorm, a dense SwiGLU below
// first_k_dense_replace, elsewhere sigmoid scores, e_score_correction_bias added for selection
// only, top-k (n_group 1), weights from the unbiased scores renormalised and times
// routed_scaling_factor, plus the shared expert; final norm and lm_head. The checkpoint holds a
// multi-token-prediction layer the loader must leave alone. Each of partial rotary, its
// frequencies, the correction bias and the q/k norm, left out of the reference, makes it disagree
// with the engine.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <set>

#include "backend/backend.h"
#include "model/decoder.h"
#include "model/presets.h"

namespace sy::model {
namespace {

// Pieces of the definition the reference can leave out, to show that each one matters.
struct Omit {
  bool partial_rotary = false;  // rotate every dim of the head
  bool rotary_freq = false;     // frequencies over head_dim instead of the rotary dims
  bool selection_bias = false;  // select on the unbiased scores
  bool qk_norm = false;         // no per-head q/k RMSNorm
};

struct Reference {
  const Checkpoint& ckpt;
  const ModelConfig& c;
  Omit omit;
  int64_t vocab_stride = 1;  // logits of every vocab_stride-th id (the lm_head dominates the cost)

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
  std::vector<double> linear(const std::string& w, const std::vector<double>& x, int64_t out,
                             const std::string& bias = "") const {
    const int64_t in = static_cast<int64_t>(x.size());
    const TensorInfo* weight = tensor(w);
    std::vector<double> y(static_cast<size_t>(out));
    for (int64_t o = 0; o < out; ++o) {
      double acc = bias.empty() ? 0.0 : at(bias, o);
      for (int64_t i = 0; i < in; ++i) acc += value(weight, o * in + i) * x[static_cast<size_t>(i)];
      y[static_cast<size_t>(o)] = acc;
    }
    return y;
  }
  // RMSNorm of x[from, from + width) with weight w (whole vector when width is 0).
  void rms_norm_in_place(std::vector<double>& x, const std::string& w, int64_t from,
                         int64_t width) const {
    double ss = 0;
    for (int64_t i = 0; i < width; ++i) ss += x[from + i] * x[from + i];
    const double scale = 1.0 / std::sqrt(ss / static_cast<double>(width) + c.rms_norm_eps);
    for (int64_t i = 0; i < width; ++i) x[from + i] = at(w, i) * x[from + i] * scale;
  }
  std::vector<double> rms_norm(std::vector<double> x, const std::string& w) const {
    rms_norm_in_place(x, w, 0, static_cast<int64_t>(x.size()));
    return x;
  }
  std::vector<double> swiglu(const std::string& p, const std::vector<double>& h,
                             int64_t width) const {
    const auto g = linear(p + "gate_proj.weight", h, width),
               u = linear(p + "up_proj.weight", h, width);
    std::vector<double> act(static_cast<size_t>(width));
    for (int64_t i = 0; i < width; ++i) act[i] = g[i] / (1 + std::exp(-g[i])) * u[i];
    return linear(p + "down_proj.weight", act, c.hidden_size);
  }

  void run(const std::vector<int32_t>& tokens, std::vector<double>& logits,
           std::vector<int32_t>& ids, std::vector<std::vector<double>>& choice_scores) const {
    const int64_t n = static_cast<int64_t>(tokens.size()), H = c.hidden_size,
                  heads = c.num_attention_heads, kv_heads = c.num_key_value_heads, hd = c.head_dim,
                  group = heads / kv_heads;
    const int64_t E = c.num_experts, K = c.experts_per_token, L = c.num_hidden_layers;
    // transformers: dim = int(head_dim * partial_rotary_factor), read here from the config.
    const int64_t rotary =
        omit.partial_rotary ? hd : static_cast<int64_t>(static_cast<double>(hd) * partial_factor);
    const int64_t freq_dim = omit.rotary_freq ? hd : rotary, half = rotary / 2;
    auto apply_rope = [&](double* v, int64_t pos) {
      for (int64_t i = 0; i < half; ++i) {
        const double angle =
            static_cast<double>(pos) *
            std::pow(c.rope_theta, -2.0 * static_cast<double>(i) / static_cast<double>(freq_dim));
        const double a = v[i], b = v[i + half];
        v[i] = a * std::cos(angle) - b * std::sin(angle);
        v[i + half] = b * std::cos(angle) + a * std::sin(angle);
      }
    };
    std::vector<std::vector<double>> x(static_cast<size_t>(n),
                                       std::vector<double>(static_cast<size_t>(H)));
    for (int64_t t = 0; t < n; ++t)
      for (int64_t i = 0; i < H; ++i) x[t][i] = at("model.embed_tokens.weight", tokens[t] * H + i);
    ids.assign(static_cast<size_t>(n * L * K), 0);
    choice_scores.assign(static_cast<size_t>(n * L), {});
    for (int64_t l = 0; l < L; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".", a = p + "self_attn.";
      std::vector<std::vector<double>> q(n), k(n), v(n);
      for (int64_t t = 0; t < n; ++t) {
        const auto h = rms_norm(x[t], p + "input_layernorm.weight");
        q[t] = linear(a + "q_proj.weight", h, heads * hd, a + "q_proj.bias");
        k[t] = linear(a + "k_proj.weight", h, kv_heads * hd, a + "k_proj.bias");
        v[t] = linear(a + "v_proj.weight", h, kv_heads * hd, a + "v_proj.bias");
        for (int64_t hh = 0; hh < heads; ++hh) {
          if (!omit.qk_norm) rms_norm_in_place(q[t], a + "q_norm.weight", hh * hd, hd);
          apply_rope(q[t].data() + hh * hd, t);
        }
        for (int64_t hh = 0; hh < kv_heads; ++hh) {
          if (!omit.qk_norm) rms_norm_in_place(k[t], a + "k_norm.weight", hh * hd, hd);
          apply_rope(k[t].data() + hh * hd, t);
        }
      }
      const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
      for (int64_t t = 0; t < n; ++t) {
        std::vector<double> attn(static_cast<size_t>(heads * hd), 0.0);
        for (int64_t hh = 0; hh < heads; ++hh) {
          const int64_t kv = hh / group;
          std::vector<double> w;
          double top = -INFINITY, denom = 0;
          for (int64_t s = 0; s <= t; ++s) {
            double dot = 0;
            for (int64_t i = 0; i < hd; ++i) dot += q[t][hh * hd + i] * k[s][kv * hd + i];
            w.push_back(dot * scale);
            top = std::max(top, w.back());
          }
          for (double& e : w) denom += e = std::exp(e - top);
          for (int64_t s = 0; s <= t; ++s)
            for (int64_t i = 0; i < hd; ++i) attn[hh * hd + i] += w[s] / denom * v[s][kv * hd + i];
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
        // n_group 1: one group holding every expert, top-k of the choice scores; DESIGN.md's
        // order (descending, ties to the lower id).
        std::vector<int32_t> order(static_cast<size_t>(E));
        for (int64_t e = 0; e < E; ++e) order[e] = static_cast<int32_t>(e);
        std::stable_sort(order.begin(), order.end(),
                         [&](int32_t i, int32_t j) { return choice[i] > choice[j]; });
        std::vector<double> sorted;
        for (int32_t e : order) sorted.push_back(choice[e]);
        choice_scores[static_cast<size_t>(l * n + t)] = sorted;
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
    const TensorInfo* head = tensor("lm_head.weight");
    for (int64_t t = 0; t < n; ++t) {
      const auto normed = rms_norm(x[t], "model.norm.weight");
      for (int64_t id = 0; id < c.vocab_size; id += vocab_stride) {
        double acc = 0;
        for (int64_t i = 0; i < H; ++i) acc += value(head, id * H + i) * normed[i];
        logits.push_back(acc);
      }
    }
  }
  double partial_factor = 0.5;
};

class Glm4MoeReference : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("sy_glm_ref_" + std::to_string(::getpid()));
    auto config = preset_config("glm4_moe", "tiny", 0);
    ASSERT_TRUE(config.is_ok());
    config_ = *config;
    ASSERT_TRUE(write_random_checkpoint(*config, nlohmann::json::object(), dir_.string(), 23, false)
                    .is_ok());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
  nlohmann::json config_;
};

TEST_F(Glm4MoeReference, TheWholeForwardPassMatchesADoublePrecisionReference) {
  auto backend = backend::make_cpu_backend({2});
  moe::ExpertsKernelRegistry registry;
  backend->register_kernels(registry);
  auto model = Model::load(dir_.string(), *backend);
  ASSERT_TRUE(model.is_ok()) << model.message();
  const ModelConfig& c = (*model)->config();
  auto checkpoint = Checkpoint::open(dir_.string());
  ASSERT_TRUE(checkpoint.is_ok());
  // The MTP layer (index num_hidden_layers) is in the file and was not asked for.
  const std::string mtp = "model.layers." + std::to_string(c.num_hidden_layers) + ".";
  EXPECT_NE(checkpoint->find(mtp + "eh_proj.weight"), nullptr);
  EXPECT_NE(checkpoint->find(mtp + "mlp.gate.e_score_correction_bias"), nullptr);
  ASSERT_EQ(c.rope_dim(), 10) << "head_dim 20 x partial_rotary_factor 0.5";
  const double factor = config_["partial_rotary_factor"].get<double>();

  // 64 tokens over four KV blocks.
  const int32_t n = 64;
  std::vector<int32_t> tokens;
  for (int32_t i = 0; i < n; ++i) tokens.push_back(300 + (i * 7919) % 9000);
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
  in.max_blocks_per_seq = 4;
  in.block_tables = {0, 1, 2, 3};
  in.capture_routes = true;
  StepOutputs out;
  ASSERT_TRUE(decoder.forward(**model, in, out).is_ok());
  ASSERT_TRUE(decoder.finish_step(**model, out).is_ok());
  std::vector<float> got(static_cast<size_t>(out.logits.numel()));
  backend->download(out.logits, got.data());
  const int64_t K = c.experts_per_token, L = c.num_hidden_layers, V = c.vocab_size;

  struct Agreement {
    double worst = 0, top = 0;
    int compared = 0, differing = 0, differing_sets = 0;
  };
  auto compare = [&](Omit omit, int64_t stride) {
    std::vector<double> want;
    std::vector<int32_t> want_ids;
    std::vector<std::vector<double>> choice;
    Reference reference{*checkpoint, c, omit, stride};
    reference.partial_factor = factor;
    reference.run(tokens, want, want_ids, choice);
    Agreement agreement;
    const int64_t per_row = (V + stride - 1) / stride;
    EXPECT_EQ(static_cast<int64_t>(want.size()), n * per_row);
    for (int64_t t = 0; t < n; ++t)
      for (int64_t j = 0; j < per_row; ++j) {
        const double expected = want[static_cast<size_t>(t * per_row + j)];
        agreement.worst = std::max(
            agreement.worst, std::fabs(got[static_cast<size_t>(t * V + j * stride)] - expected));
        agreement.top = std::max(agreement.top, std::fabs(expected));
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
        agreement.differing_sets +=
            std::set<int32_t>(want_ids.begin() + at, want_ids.begin() + at + K) !=
            std::set<int32_t>(out.routes.begin() + at, out.routes.begin() + at + K);
      }
    return agreement;
  };
  const Agreement exact = compare({}, 1);
  std::printf(
      "[ glm4_moe tiny ] logits max |diff| %.3g (max |logit| %.3g), %d route rows compared\n",
      exact.worst, exact.top, exact.compared);
  EXPECT_LT(exact.worst, 1e-4 * std::max(1.0, exact.top));
  EXPECT_EQ(exact.differing_sets, 0) << "routes as sets";
  EXPECT_EQ(exact.differing, 0) << "routes in DESIGN.md's order";
  EXPECT_GT(exact.compared, n * (L - 1) * 9 / 10);

  // Each piece matters: the reference without it disagrees with the engine (logits sampled on
  // every 61st vocabulary id to keep the test quick).
  const Agreement sampled = compare({}, 61);
  const Agreement full_rotary = compare({.partial_rotary = true}, 61);
  EXPECT_GT(full_rotary.worst, 100 * sampled.worst + 1e-5) << "partial rotary";
  const Agreement head_freq = compare({.rotary_freq = true}, 61);
  EXPECT_GT(head_freq.worst, 100 * sampled.worst + 1e-5) << "frequencies over the rotary dims";
  const Agreement no_norm = compare({.qk_norm = true}, 61);
  EXPECT_GT(no_norm.worst, 100 * sampled.worst + 1e-5) << "per-head q/k norm";
  const Agreement no_bias = compare({.selection_bias = true}, 61);
  EXPECT_GT(no_bias.differing_sets, 0) << "the correction bias must steer selection";
  std::printf(
      "[ glm4_moe tiny ] logits |diff| without partial rotary %.3g, with head_dim frequencies "
      "%.3g, without q/k norm %.3g; without the bias %d/%d route sets differ\n",
      full_rotary.worst, head_freq.worst, no_norm.worst, no_bias.differing_sets, no_bias.compared);
}

}  // namespace
}  // namespace sy::model
