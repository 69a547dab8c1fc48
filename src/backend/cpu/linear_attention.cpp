// Qwen3.5's two token mixers on the CPU: the gated DeltaNet (causal conv1d + the gated delta rule
// run token by token over each sequence's recurrent state, then the silu(z)-gated RMSNorm) and
// gated full attention (query and output gate interleaved per head, partial rotary, sigmoid
// gate on the output). The recurrent form is exact; the chunked form transformers uses for
// prefill is the same sum reordered.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_backend.h"

namespace sy::backend::cpu {
namespace {

float softplus(float x) {
  return x > 20.0f ? x : std::log1p(std::exp(x));
}  // torch's threshold
float sigmoid(float x) {
  return 1.0f / (1.0f + std::exp(-x));
}
float silu(float x) {
  return x / (1.0f + std::exp(-x));
}

}  // namespace

void CpuBackend::gated_delta_net(const Tensor& qkv, const Tensor& z, const Tensor& b,
                                 const Tensor& a, const LinearWeights& weights,
                                 const LinearShape& shape, float eps, const AttentionBatch& batch,
                                 const LinearState& state, Tensor& out) {
  const int64_t tokens = qkv.dim(0);
  const int64_t kh = shape.key_heads, vh = shape.value_heads, kd = shape.key_head_dim,
                vd = shape.value_head_dim, kernel = shape.kernel;
  const int64_t key_dim = kh * kd, value_dim = vh * vd, conv_dim = 2 * key_dim + value_dim;
  const int64_t history = kernel - 1, group = vh / kh;
  const int64_t seqs = state.read.numel();
  const int32_t* positions = batch.positions.ptr<int32_t>();
  const int32_t* token_seq = batch.token_seq.ptr<int32_t>();
  const int32_t* read = state.read.ptr<int32_t>();
  const int32_t* write = state.write.ptr<int32_t>();
  float* conv_states = state.conv->ptr<float>();
  float* recurrent = state.recurrent->ptr<float>();
  const std::vector<float> conv_w = vector_f32(*weights.conv1d), a_log = vector_f32(*weights.a_log),
                           dt_bias = vector_f32(*weights.dt_bias), norm = vector_f32(*weights.norm);

  // Each sequence's tokens in step order (the engine lists them by increasing position).
  std::vector<std::vector<int64_t>> seq_tokens(static_cast<size_t>(seqs));
  for (int64_t t = 0; t < tokens; ++t)
    if (token_seq[t] >= 0 && token_seq[t] < seqs && read[token_seq[t]] >= 0)
      seq_tokens[static_cast<size_t>(token_seq[t])].push_back(t);
  auto fresh = [&](int64_t s) {
    const auto& list = seq_tokens[static_cast<size_t>(s)];
    return !list.empty() && positions[list.front()] == 0;
  };

  // Causal depthwise conv1d over [history | this step's inputs] per channel, then SiLU; the last
  // `history` inputs become the written conv state.
  std::vector<float> mixed(static_cast<size_t>(tokens * conv_dim), 0.0f);
  pool_.parallel_for(seqs * conv_dim, 64, [&](int64_t begin, int64_t end) {
    std::vector<float> window;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t s = task / conv_dim, c = task % conv_dim;
      const auto& list = seq_tokens[static_cast<size_t>(s)];
      if (list.empty()) continue;
      const float* old = conv_states + (read[s] * conv_dim + c) * history;
      window.assign(static_cast<size_t>(history + static_cast<int64_t>(list.size())), 0.0f);
      if (!fresh(s)) std::copy_n(old, history, window.begin());
      for (size_t i = 0; i < list.size(); ++i)
        window[static_cast<size_t>(history) + i] = qkv.ptr<float>()[list[i] * conv_dim + c];
      const float* w = conv_w.data() + c * kernel;
      for (size_t i = 0; i < list.size(); ++i) {
        float acc = 0.0f;
        for (int64_t j = 0; j < kernel; ++j) acc += w[j] * window[i + static_cast<size_t>(j)];
        mixed[static_cast<size_t>(list[i] * conv_dim + c)] = silu(acc);
      }
      std::copy_n(window.end() - history, history,
                  conv_states + (write[s] * conv_dim + c) * history);
    }
  });

  // The gated delta rule per (sequence, value head), token by token. Floor: ~4 * kd * vd FLOPs
  // per token and value head (decay, read, update, output), the state read and written once a
  // step.
  std::vector<float> core(static_cast<size_t>(tokens * value_dim), 0.0f);
  pool_.parallel_for(seqs * vh, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> S(static_cast<size_t>(kd * vd)), q(static_cast<size_t>(kd)),
        k(static_cast<size_t>(kd)), kv_mem(static_cast<size_t>(vd));
    for (int64_t task = begin; task < end; ++task) {
      const int64_t s = task / vh, h = task % vh, key_head = h / group;
      const auto& list = seq_tokens[static_cast<size_t>(s)];
      if (list.empty()) continue;
      const float* old = recurrent + (read[s] * vh + h) * kd * vd;
      if (fresh(s))
        std::fill(S.begin(), S.end(), 0.0f);
      else
        std::copy_n(old, kd * vd, S.begin());
      const float A = std::exp(a_log[h]);
      for (int64_t t : list) {
        const float* row = mixed.data() + t * conv_dim;
        // q and k l2-normalised (x / sqrt(sum x^2 + 1e-6), as transformers' l2norm), q scaled.
        float qq = 0.0f, kk = 0.0f;
        for (int64_t i = 0; i < kd; ++i) {
          q[i] = row[key_head * kd + i];
          k[i] = row[key_dim + key_head * kd + i];
          qq += q[i] * q[i];
          kk += k[i] * k[i];
        }
        const float q_scale = 1.0f / std::sqrt(qq + 1e-6f) / std::sqrt(static_cast<float>(kd));
        const float k_scale = 1.0f / std::sqrt(kk + 1e-6f);
        for (int64_t i = 0; i < kd; ++i) q[i] *= q_scale, k[i] *= k_scale;
        const float* v = row + 2 * key_dim + h * vd;
        const float beta = sigmoid(b.ptr<float>()[t * vh + h]);
        const float decay = std::exp(-A * softplus(a.ptr<float>()[t * vh + h] + dt_bias[h]));
        for (float& value : S) value *= decay;
        std::fill(kv_mem.begin(), kv_mem.end(), 0.0f);
        for (int64_t i = 0; i < kd; ++i)
          for (int64_t j = 0; j < vd; ++j) kv_mem[j] += S[i * vd + j] * k[i];
        for (int64_t j = 0; j < vd; ++j) kv_mem[j] = (v[j] - kv_mem[j]) * beta;  // the delta
        float* o = core.data() + t * value_dim + h * vd;
        for (int64_t i = 0; i < kd; ++i)
          for (int64_t j = 0; j < vd; ++j) {
            S[i * vd + j] += k[i] * kv_mem[j];
            o[j] += S[i * vd + j] * q[i];
          }
      }
      std::copy(S.begin(), S.end(), recurrent + (write[s] * vh + h) * kd * vd);
    }
  });

  // RMSNorm per value head, times silu(z).
  pool_.parallel_for(tokens * vh, 64, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const float* x = core.data() + task * vd;
      const float* gate = z.ptr<float>() + task * vd;
      float sum_squares = 0.0f;
      for (int64_t j = 0; j < vd; ++j) sum_squares += x[j] * x[j];
      const float scale = 1.0f / std::sqrt(sum_squares / static_cast<float>(vd) + eps);
      float* dst = out.ptr<float>() + task * vd;
      for (int64_t j = 0; j < vd; ++j) dst[j] = norm[j] * (x[j] * scale) * silu(gate[j]);
    }
  });
}

void CpuBackend::gated_attention(const Tensor& q_gate, Tensor& q, Tensor& k, const Tensor& v,
                                 const Tensor& q_norm, const Tensor& k_norm, float eps,
                                 const AttentionBatch& batch, const RopeSpec& rope_spec,
                                 Tensor& k_cache, Tensor& v_cache, float scale, Tensor& out) {
  const int64_t tokens = q.dim(0), heads = q.dim(1), head_dim = q.dim(2), kv_heads = k.dim(1);
  for (int64_t r = 0; r < tokens * heads; ++r)
    std::memcpy(q.ptr<float>() + r * head_dim, q_gate.ptr<float>() + r * 2 * head_dim,
                head_dim * sizeof(float));
  rms_norm(q, q_norm, eps, q);
  rms_norm(k, k_norm, eps, k);
  // Partial rotary: rotate-half over the first `rotary` dims, frequencies theta^(-2i/rotary)
  // (transformers' partial_rotary_factor), the remaining dims passed through.
  const int64_t rotary =
      rope_spec.head_dim > 0 && rope_spec.head_dim < head_dim ? rope_spec.head_dim : head_dim;
  const int64_t half = rotary / 2;
  std::vector<float> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    inv_freq[i] =
        rope_spec.inv_freq
            ? rope_spec.inv_freq[i]
            : static_cast<float>(1.0 / std::pow(rope_spec.theta, static_cast<double>(2 * i) /
                                                                     static_cast<double>(rotary)));
  const int32_t* positions = batch.positions.ptr<int32_t>();
  pool_.parallel_for(tokens, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> cos_v(static_cast<size_t>(half)), sin_v(static_cast<size_t>(half));
    for (int64_t t = begin; t < end; ++t) {
      const float position = static_cast<float>(positions[t]);
      for (int64_t i = 0; i < half; ++i) {
        const float angle = position * inv_freq[i];
        cos_v[i] = std::cos(angle) * rope_spec.attention_factor;
        sin_v[i] = std::sin(angle) * rope_spec.attention_factor;
      }
      auto rotate = [&](float* x) {
        for (int64_t i = 0; i < half; ++i) {
          const float x1 = x[i], x2 = x[i + half];
          x[i] = x1 * cos_v[i] - x2 * sin_v[i];
          x[i + half] = x2 * cos_v[i] + x1 * sin_v[i];
        }
      };
      for (int64_t h = 0; h < heads; ++h) rotate(q.ptr<float>() + (t * heads + h) * head_dim);
      for (int64_t h = 0; h < kv_heads; ++h) rotate(k.ptr<float>() + (t * kv_heads + h) * head_dim);
    }
  });
  write_kv(k, v, k_cache, v_cache, batch);
  attention(q, k_cache, v_cache, batch, scale, out);
  for (int64_t r = 0; r < tokens * heads; ++r) {
    const float* gate = q_gate.ptr<float>() + r * 2 * head_dim + head_dim;
    float* dst = out.ptr<float>() + r * head_dim;
    for (int64_t i = 0; i < head_dim; ++i) dst[i] *= sigmoid(gate[i]);
  }
}

}  // namespace sy::backend::cpu
