// The whole Qwen3.5-MoE forward pass against a double-precision reference written here from the
// architecture's definition (transformers' Qwen3_5Moe modeling, read, not the engine's code; the
// DeltaNet in the matrix form S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,
// where the engine runs the decay / read / delta / write steps): zero-centred RMSNorms (1 + w);
// linear-attention layers with in_proj_qkv -> causal depthwise conv1d (4 taps) -> SiLU, q and k
// l2-normalised per key head, q / sqrt(d_k), beta = sigmoid(b), g = -exp(A_log) softplus(a +
// dt_bias), each key head serving value_heads / key_heads consecutive value heads, the output
// RMSNormed per value head (plain weight) times silu(z), out_proj; full-attention layers with
// q_proj emitting query and gate per head, zero-centred q/k norms, RoPE on the first
// partial_rotary_factor of each head, GQA, the output times sigmoid(gate), o_proj; every layer a
// softmax top-k router renormalised plus a sigmoid-gated shared expert. Leaving the decay, the
// l2 norm, the output gate or the zero-centring out of the reference makes it disagree.
//
// Also here: the decoder's per-sequence state buffers (chunked prefill, the position-0 reset, a
// rerun of a step).
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>

#include "backend/backend.h"
#include "model/decoder.h"
#include "model/presets.h"

namespace sy::model {
namespace {

// Pieces of the definition the reference can leave out, to show that each one matters.
struct Omit {
  bool decay = false;         // g = 0: the state never decays
  bool l2_norm = false;       // q and k as the conv gives them
  bool output_gate = false;   // attention output not multiplied by sigmoid(gate)
  bool zero_centred = false;  // norms applied as w, not 1 + w
  bool grouping = false;      // value head h reads key head h % key_heads (tiling, not repeat)
};

using Vec = std::vector<double>;

struct Reference {
  const Checkpoint& ckpt;
  const ModelConfig& c;
  Omit omit;
  std::map<std::string, Vec>& cache;
  std::string root = "model.language_model.";

  static double value(const TensorInfo* t, int64_t i) {
    if (t->dtype == DType::kBF16) return bf16_to_f32(reinterpret_cast<const uint16_t*>(t->data)[i]);
    return reinterpret_cast<const float*>(t->data)[i];
  }
  const TensorInfo* tensor(const std::string& name) const {
    const TensorInfo* t = ckpt.find(name);
    EXPECT_NE(t, nullptr) << name;
    return t;
  }
  // A checkpoint tensor in double, converted once.
  const Vec& values(const std::string& name) const {
    auto it = cache.find(name);
    if (it != cache.end()) return it->second;
    const TensorInfo* t = tensor(name);
    Vec converted(t ? static_cast<size_t>(t->numel()) : 0);
    for (size_t i = 0; i < converted.size(); ++i) converted[i] = value(t, static_cast<int64_t>(i));
    return cache.emplace(name, std::move(converted)).first->second;
  }
  double at(const std::string& name, int64_t i) const {
    return values(name)[static_cast<size_t>(i)];
  }
  Vec linear(const std::string& w, const Vec& x, int64_t out) const {
    const int64_t in = static_cast<int64_t>(x.size());
    const Vec& weight = values(w);
    Vec y(static_cast<size_t>(out));
    for (int64_t o = 0; o < out; ++o) {
      double acc = 0.0;
      for (int64_t i = 0; i < in; ++i) acc += weight[static_cast<size_t>(o * in + i)] * x[i];
      y[o] = acc;
    }
    return y;
  }
  // RMSNorm of x[offset, offset + n) with weight w (as 1 + w when zero-centred).
  Vec rms_norm(const Vec& x, const std::string& w, bool zero_centred, int64_t offset = 0,
               int64_t n = -1) const {
    if (n < 0) n = static_cast<int64_t>(x.size());
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += x[offset + i] * x[offset + i];
    const double scale = 1.0 / std::sqrt(ss / static_cast<double>(n) + c.rms_norm_eps);
    Vec y(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i)
      y[i] = ((zero_centred && !omit.zero_centred ? 1.0 : 0.0) + at(w, i)) * x[offset + i] * scale;
    return y;
  }
  static double sigmoid(double x) { return 1 / (1 + std::exp(-x)); }
  static double silu(double x) { return x * sigmoid(x); }
  Vec swiglu(const std::string& p, const Vec& h, int64_t width) const {
    const Vec g = linear(p + "gate_proj.weight", h, width),
              u = linear(p + "up_proj.weight", h, width);
    Vec act(static_cast<size_t>(width));
    for (int64_t i = 0; i < width; ++i) act[i] = silu(g[i]) * u[i];
    return linear(p + "down_proj.weight", act, c.hidden_size);
  }

  // Gated DeltaNet over the whole sequence of normed inputs h.
  std::vector<Vec> delta_net(const std::string& p, const std::vector<Vec>& h) const {
    const LinearAttentionSpec& lin = c.linear_attention;
    const int64_t n = static_cast<int64_t>(h.size()), kh = lin.num_key_heads,
                  vh = lin.num_value_heads, kd = lin.key_head_dim, vd = lin.value_head_dim,
                  K = lin.conv_kernel;
    const int64_t key_dim = kh * kd, conv_dim = lin.conv_dim();
    std::vector<Vec> qkv, z, b, a;
    for (const Vec& row : h) {
      qkv.push_back(linear(p + "in_proj_qkv.weight", row, conv_dim));
      z.push_back(linear(p + "in_proj_z.weight", row, lin.value_dim()));
      b.push_back(linear(p + "in_proj_b.weight", row, vh));
      a.push_back(linear(p + "in_proj_a.weight", row, vh));
    }
    // y_t[c] = silu(sum_j w[c, 0, j] x_{t - (K - 1) + j}[c]), zeros before the first token.
    std::vector<Vec> conv(static_cast<size_t>(n), Vec(static_cast<size_t>(conv_dim)));
    for (int64_t t = 0; t < n; ++t)
      for (int64_t ch = 0; ch < conv_dim; ++ch) {
        double acc = 0;
        for (int64_t j = 0; j < K; ++j) {
          const int64_t src = t - (K - 1) + j;
          if (src >= 0) acc += at(p + "conv1d.weight", ch * K + j) * qkv[src][ch];
        }
        conv[t][ch] = silu(acc);
      }
    std::vector<Vec> core(static_cast<size_t>(n), Vec(static_cast<size_t>(lin.value_dim()), 0.0));
    for (int64_t h_v = 0; h_v < vh; ++h_v) {
      const int64_t h_k = omit.grouping ? h_v % kh : h_v / (vh / kh);
      std::vector<Vec> S(static_cast<size_t>(kd), Vec(static_cast<size_t>(vd), 0.0));  // [kd][vd]
      for (int64_t t = 0; t < n; ++t) {
        Vec q(conv[t].begin() + h_k * kd, conv[t].begin() + (h_k + 1) * kd);
        Vec k(conv[t].begin() + key_dim + h_k * kd, conv[t].begin() + key_dim + (h_k + 1) * kd);
        const Vec v(conv[t].begin() + 2 * key_dim + h_v * vd,
                    conv[t].begin() + 2 * key_dim + (h_v + 1) * vd);
        if (!omit.l2_norm) {
          double qq = 0, kk = 0;
          for (int64_t i = 0; i < kd; ++i) qq += q[i] * q[i], kk += k[i] * k[i];
          for (int64_t i = 0; i < kd; ++i)
            q[i] /= std::sqrt(qq + 1e-6), k[i] /= std::sqrt(kk + 1e-6);
        }
        for (double& x : q) x /= std::sqrt(static_cast<double>(kd));
        const double beta = sigmoid(b[t][h_v]);
        const double pre = a[t][h_v] + at(p + "dt_bias", h_v);
        const double g =
            omit.decay ? 0.0 : -std::exp(at(p + "A_log", h_v)) * std::log1p(std::exp(pre));
        // S <- exp(g) (I - beta k k^T) S + beta k v^T
        Vec ktS(static_cast<size_t>(vd), 0.0);
        for (int64_t i = 0; i < kd; ++i)
          for (int64_t j = 0; j < vd; ++j) ktS[j] += k[i] * S[i][j];
        for (int64_t i = 0; i < kd; ++i)
          for (int64_t j = 0; j < vd; ++j)
            S[i][j] = std::exp(g) * (S[i][j] - beta * k[i] * ktS[j]) + beta * k[i] * v[j];
        for (int64_t j = 0; j < vd; ++j) {
          double o = 0;
          for (int64_t i = 0; i < kd; ++i) o += S[i][j] * q[i];
          core[t][h_v * vd + j] = o;
        }
      }
    }
    std::vector<Vec> out;
    for (int64_t t = 0; t < n; ++t) {
      Vec gated(static_cast<size_t>(lin.value_dim()));
      for (int64_t h_v = 0; h_v < vh; ++h_v) {
        const Vec normed = rms_norm(core[t], p + "norm.weight", false, h_v * vd, vd);
        for (int64_t j = 0; j < vd; ++j) gated[h_v * vd + j] = normed[j] * silu(z[t][h_v * vd + j]);
      }
      out.push_back(linear(p + "out_proj.weight", gated, c.hidden_size));
    }
    return out;
  }

  // Gated full attention over the whole sequence of normed inputs h.
  std::vector<Vec> gated_attention(const std::string& p, const std::vector<Vec>& h,
                                   int64_t rotary) const {
    const int64_t n = static_cast<int64_t>(h.size()), heads = c.num_attention_heads,
                  kv_heads = c.num_key_value_heads, hd = c.head_dim;
    std::vector<Vec> q(n), gate(n), k(n), v(n);
    auto rope = [&](Vec& x, int64_t offset, int64_t pos) {
      for (int64_t i = 0; i < rotary / 2; ++i) {
        const double freq =
            std::pow(c.rope_theta, -2.0 * static_cast<double>(i) / static_cast<double>(rotary));
        const double cs = std::cos(pos * freq), sn = std::sin(pos * freq);
        const double x1 = x[offset + i], x2 = x[offset + i + rotary / 2];
        x[offset + i] = x1 * cs - x2 * sn;
        x[offset + i + rotary / 2] = x2 * cs + x1 * sn;
      }
    };
    for (int64_t t = 0; t < n; ++t) {
      const Vec qg = linear(p + "q_proj.weight", h[t], heads * 2 * hd);
      const Vec kr = linear(p + "k_proj.weight", h[t], kv_heads * hd);
      v[t] = linear(p + "v_proj.weight", h[t], kv_heads * hd);
      for (int64_t hh = 0; hh < heads; ++hh) {
        const Vec head(qg.begin() + hh * 2 * hd, qg.begin() + hh * 2 * hd + hd);
        const Vec normed = rms_norm(head, p + "q_norm.weight", true);
        q[t].insert(q[t].end(), normed.begin(), normed.end());
        gate[t].insert(gate[t].end(), qg.begin() + hh * 2 * hd + hd,
                       qg.begin() + (hh + 1) * 2 * hd);
        rope(q[t], hh * hd, t);
      }
      for (int64_t hh = 0; hh < kv_heads; ++hh) {
        const Vec normed = rms_norm(kr, p + "k_norm.weight", true, hh * hd, hd);
        k[t].insert(k[t].end(), normed.begin(), normed.end());
        rope(k[t], hh * hd, t);
      }
    }
    std::vector<Vec> out;
    for (int64_t t = 0; t < n; ++t) {
      Vec attn(static_cast<size_t>(heads * hd), 0.0);
      for (int64_t hh = 0; hh < heads; ++hh) {
        const int64_t kv = hh / (heads / kv_heads);
        Vec w;
        double denom = 0;
        for (int64_t s = 0; s <= t; ++s) {
          double dot = 0;
          for (int64_t i = 0; i < hd; ++i) dot += q[t][hh * hd + i] * k[s][kv * hd + i];
          w.push_back(std::exp(dot / std::sqrt(static_cast<double>(hd))));
          denom += w.back();
        }
        for (int64_t s = 0; s <= t; ++s)
          for (int64_t i = 0; i < hd; ++i) attn[hh * hd + i] += w[s] / denom * v[s][kv * hd + i];
        if (!omit.output_gate)
          for (int64_t i = 0; i < hd; ++i) attn[hh * hd + i] *= sigmoid(gate[t][hh * hd + i]);
      }
      out.push_back(linear(p + "o_proj.weight", attn, c.hidden_size));
    }
    return out;
  }

  // Logits [n * vocab], route ids [n, L, K], and each (layer, token)'s sorted router probabilities.
  void run(const std::vector<int32_t>& tokens, Vec& logits, std::vector<int32_t>& ids,
           std::vector<Vec>& sorted_probs) const {
    const int64_t n = static_cast<int64_t>(tokens.size()), H = c.hidden_size, E = c.num_experts,
                  K = c.experts_per_token, L = c.num_hidden_layers;
    std::vector<Vec> x(static_cast<size_t>(n), Vec(static_cast<size_t>(H)));
    for (int64_t t = 0; t < n; ++t)
      for (int64_t i = 0; i < H; ++i) x[t][i] = at(root + "embed_tokens.weight", tokens[t] * H + i);
    ids.assign(static_cast<size_t>(n * L * K), 0);
    sorted_probs.assign(static_cast<size_t>(n * L), {});
    for (int64_t l = 0; l < L; ++l) {
      const std::string p = root + "layers." + std::to_string(l) + ".";
      const AttentionSpec& spec = c.layers[static_cast<size_t>(l)].attention;
      std::vector<Vec> h;
      for (const Vec& row : x) h.push_back(rms_norm(row, p + "input_layernorm.weight", true));
      const std::vector<Vec> mixed = spec.linear
                                         ? delta_net(p + "linear_attn.", h)
                                         : gated_attention(p + "self_attn.", h, spec.rotary_dim);
      for (int64_t t = 0; t < n; ++t)
        for (int64_t i = 0; i < H; ++i) x[t][i] += mixed[t][i];
      for (int64_t t = 0; t < n; ++t) {
        const Vec hn = rms_norm(x[t], p + "post_attention_layernorm.weight", true);
        const Vec logit = linear(p + "mlp.gate.weight", hn, E);
        double top = *std::max_element(logit.begin(), logit.end()), sum = 0;
        Vec prob(static_cast<size_t>(E));
        for (int64_t e = 0; e < E; ++e) sum += prob[e] = std::exp(logit[e] - top);
        for (double& pr : prob) pr /= sum;
        std::vector<int32_t> order(static_cast<size_t>(E));
        for (int64_t e = 0; e < E; ++e) order[e] = static_cast<int32_t>(e);
        std::stable_sort(order.begin(), order.end(),
                         [&](int32_t i, int32_t j) { return prob[i] > prob[j]; });
        Vec sorted;
        for (int32_t e : order) sorted.push_back(prob[e]);
        sorted_probs[static_cast<size_t>(l * n + t)] = sorted;
        double chosen = 0;
        for (int64_t j = 0; j < K; ++j) chosen += prob[order[j]];
        for (int64_t j = 0; j < K; ++j) {
          const int32_t e = order[j];
          ids[static_cast<size_t>((t * L + l) * K + j)] = e;
          const Vec y =
              swiglu(p + "mlp.experts." + std::to_string(e) + ".", hn, c.moe_intermediate_size);
          for (int64_t i = 0; i < H; ++i) x[t][i] += prob[e] / chosen * y[i];
        }
        const Vec shared = swiglu(p + "mlp.shared_expert.", hn, c.shared_expert_intermediate_size);
        const double gate = sigmoid(linear(p + "mlp.shared_expert_gate.weight", hn, 1)[0]);
        for (int64_t i = 0; i < H; ++i) x[t][i] += gate * shared[i];
      }
    }
    logits.clear();
    for (int64_t t = 0; t < n; ++t) {
      const Vec row =
          linear("lm_head.weight", rms_norm(x[t], root + "norm.weight", true), c.vocab_size);
      logits.insert(logits.end(), row.begin(), row.end());
    }
  }
};

class Qwen35MoeReference : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("sy_qwen35_ref_" + std::to_string(::getpid()));
    auto config = preset_config("qwen3_5_moe", "tiny", 0);
    ASSERT_TRUE(config.is_ok()) << config.message();
    ASSERT_TRUE(write_random_checkpoint(*config, nlohmann::json::object(), dir_.string(), 35, false)
                    .is_ok());
    backend_ = backend::make_cpu_backend({2});
    backend_->register_kernels(registry_);
    auto model = Model::load(dir_.string(), *backend_);
    ASSERT_TRUE(model.is_ok()) << model.message();
    model_ = std::move(model).value();
    for (int32_t i = 0; i < kTokens; ++i) tokens_.push_back(500 + (i * 7919) % 9000);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Runs tokens [begin, end) of the sequence as one step, reading state buffer `read` and writing
  // `write`; returns the logits of every row, or with `sparse` of positions 7, 15, ... only (the
  // vocabulary is large: fewer rows keep the test quick).
  std::vector<float> step(Decoder& decoder, int64_t begin, int64_t end, int32_t read, int32_t write,
                          StepOutputs& out, bool sparse = false) {
    StepInputs in;
    for (int64_t p = begin; p < end; ++p) {
      in.token_ids.push_back(tokens_[p]);
      in.positions.push_back(static_cast<int32_t>(p));
      in.token_seq.push_back(0);
      in.slot_mapping.push_back(static_cast<int32_t>(p));
      if (!sparse || p % 8 == 7) in.logits_rows.push_back(static_cast<int32_t>(p - begin));
    }
    in.num_seqs = 1;
    in.max_blocks_per_seq = 5;
    in.block_tables = {0, 1, 2, 3, 4};
    in.capture_routes = true;
    in.state_read = {read};
    in.state_write = {write};
    Status status = decoder.forward(*model_, in, out);
    EXPECT_TRUE(status.is_ok()) << status.message();
    status = decoder.finish_step(*model_, out);
    EXPECT_TRUE(status.is_ok()) << status.message();
    std::vector<float> logits(static_cast<size_t>(out.logits.numel()));
    backend_->download(out.logits, logits.data());
    return logits;
  }
  std::unique_ptr<Decoder> decoder() {
    auto decoder = std::make_unique<Decoder>(
        *backend_, KernelChoice{*registry_.select("cpu-modular", {}), nullptr, 0}, 16);
    Status status = decoder->allocate(model_->config(), 5, {kTokens, 2, 5, kTokens});
    EXPECT_TRUE(status.is_ok()) << status.message();
    return decoder;
  }

  static constexpr int32_t kTokens = 64;
  std::filesystem::path dir_;
  std::unique_ptr<backend::Backend> backend_;
  moe::ExpertsKernelRegistry registry_;
  std::unique_ptr<Model> model_;
  std::vector<int32_t> tokens_;
};

TEST_F(Qwen35MoeReference, TheWholeForwardPassMatchesADoublePrecisionReference) {
  const ModelConfig& c = model_->config();
  ASSERT_EQ(c.num_hidden_layers, 4);
  ASSERT_TRUE(c.layers[0].attention.linear && c.layers[2].attention.output_gate);
  ASSERT_EQ(c.layers[2].attention.rotary_dim, 6);
  auto checkpoint = Checkpoint::open(dir_.string());
  ASSERT_TRUE(checkpoint.is_ok());
  auto dec = decoder();
  StepOutputs out;
  const std::vector<float> got = step(*dec, 0, kTokens, 0, 1, out);
  const int64_t K = c.experts_per_token, L = c.num_hidden_layers;
  std::map<std::string, Vec> weights;  // the checkpoint in double, shared by the references

  struct Agreement {
    double worst = 0, top = 0;
    int compared = 0, differing = 0;
  };
  auto compare = [&](Omit omit) {
    Vec want;
    std::vector<int32_t> want_ids;
    std::vector<Vec> sorted;
    Reference{*checkpoint, c, omit, weights}.run(tokens_, want, want_ids, sorted);
    Agreement agreement;
    EXPECT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
      agreement.worst = std::max(agreement.worst, std::fabs(got[i] - want[i]));
      agreement.top = std::max(agreement.top, std::fabs(want[i]));
    }
    for (int64_t t = 0; t < kTokens; ++t)
      for (int64_t l = 0; l < L; ++l) {
        const Vec& probs = sorted[static_cast<size_t>(l * kTokens + t)];
        if (probs[K - 1] - probs[K] < 1e-5) continue;  // a near-tie
        const size_t at = static_cast<size_t>((t * L + l) * K);
        ++agreement.compared;
        agreement.differing +=
            !std::equal(want_ids.begin() + at, want_ids.begin() + at + K, out.routes.begin() + at);
      }
    return agreement;
  };
  const Agreement exact = compare({});
  std::printf(
      "[ qwen3_5_moe tiny ] %d tokens: logits max |diff| %.3g (max |logit| %.3g), %d of %lld route "
      "rows compared\n",
      kTokens, exact.worst, exact.top, exact.compared, static_cast<long long>(kTokens * L));
  EXPECT_LT(exact.worst, 1e-4 * std::max(1.0, exact.top));
  EXPECT_EQ(exact.differing, 0);
  EXPECT_GT(exact.compared, kTokens * L * 9 / 10);

  // Each piece matters: the reference without it disagrees with the engine.
  for (auto [name, omit] :
       {std::pair{"the decay", Omit{.decay = true}},
        std::pair{"the l2 norm", Omit{.l2_norm = true}},
        std::pair{"the output gate", Omit{.output_gate = true}},
        std::pair{"the zero-centring", Omit{.zero_centred = true}},
        std::pair{"repeat-interleaved head grouping", Omit{.grouping = true}}}) {
    const Agreement without = compare(omit);
    std::printf(
        "[ qwen3_5_moe tiny ] without %s: logits max |diff| %.3g, %d/%d route rows differ\n", name,
        without.worst, without.differing, without.compared);
    EXPECT_GT(without.worst, 100 * exact.worst + 1e-5) << name;
  }
}

TEST_F(Qwen35MoeReference, ChunkedPrefillCarriesTheStateAndPositionZeroStartsFresh) {
  auto dec = decoder();
  StepOutputs whole_out;
  const std::vector<float> whole = step(*dec, 0, kTokens, 0, 1, whole_out, true);
  const std::vector<int32_t> whole_routes = whole_out.routes;
  const int64_t vocab = model_->config().vocab_size;
  // The same sequence in uneven chunks, the state buffers alternating (1 -> 2 -> 3 ...): buffer 1
  // holds the whole run's final state, which position 0 must ignore.
  for (const std::vector<int64_t>& bounds :
       {std::vector<int64_t>{0, 13, 30, 31, 64}, std::vector<int64_t>{0, 1, 2, 3, 40, 64}}) {
    std::vector<float> logits;
    std::vector<int32_t> routes;
    int32_t read = 1;
    for (size_t i = 0; i + 1 < bounds.size(); ++i) {
      const int32_t write = read == 3 ? 2 : read + 1;
      StepOutputs out;
      const std::vector<float> part = step(*dec, bounds[i], bounds[i + 1], read, write, out, true);
      if (i == 1) {
        // A failed step is rerun from the same read buffer: the same result.
        StepOutputs again_out;
        const std::vector<float> again =
            step(*dec, bounds[i], bounds[i + 1], read, write, again_out, true);
        EXPECT_EQ(again, part);
        EXPECT_EQ(again_out.routes, out.routes);
      }
      logits.insert(logits.end(), part.begin(), part.end());
      routes.insert(routes.end(), out.routes.begin(), out.routes.end());
      read = write;
    }
    ASSERT_EQ(logits.size(), static_cast<size_t>(kTokens / 8 * vocab));
    EXPECT_EQ(logits, whole) << "chunked prefill must give the one-step logits bit for bit";
    EXPECT_EQ(routes, whole_routes);
  }
  // Without the carried state (a chunk that starts from the wrong buffer) the logits change.
  StepOutputs first_out, wrong_out;
  step(*dec, 0, 20, 0, 1, first_out, true);
  step(*dec, 0, 30, 2, 3, first_out, true);  // buffer 3: the state after 30 tokens
  const std::vector<float> wrong = step(*dec, 20, kTokens, 3, 2, wrong_out, true);
  EXPECT_NE(std::vector<float>(wrong.end() - vocab, wrong.end()),
            std::vector<float>(whole.end() - vocab, whole.end()));
}

}  // namespace
}  // namespace sy::model
