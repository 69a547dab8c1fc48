#include "backend/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_matmul.h"
#include "backend/random_fill.h"

namespace sy::backend::cpu {

CpuBackend::CpuBackend(const CpuBackendOptions& options) : pool_(options.num_threads) {}
CpuBackend::~CpuBackend() = default;

Tensor CpuBackend::alloc(DType dtype, std::initializer_list<int64_t> shape) {
  Tensor tensor(nullptr, dtype, shape);
  size_t bytes = std::max<size_t>(64, (tensor.nbytes() + 63) / 64 * 64);
  tensor.data = std::aligned_alloc(64, bytes);
  return tensor;
}

void CpuBackend::free_buffer(Tensor& tensor) {
  std::free(tensor.data);
  tensor.data = nullptr;
}

Result<Tensor> CpuBackend::load_weight(const Tensor& host) {
  // BF16/F32 as they are; U8 (MXFP4 blocks and scales) too: the experts kernels read it packed.
  if (host.dtype == DType::kBF16 || host.dtype == DType::kF32 || host.dtype == DType::kU8)
    return host;
  if (host.dtype == DType::kF16) {
    Tensor converted = host;
    converted.dtype = DType::kF32;
    converted.data = std::aligned_alloc(64, std::max<size_t>(64, (converted.nbytes() + 63) / 64 * 64));
    const uint16_t* src = host.ptr<uint16_t>();
    float* dst = converted.ptr<float>();
    for (int64_t i = 0; i < host.numel(); ++i) dst[i] = f16_to_f32(src[i]);
    return converted;  // owned by the caller's weight store (freed with free_buffer)
  }
  return Status::errorf("cpu backend: weight dtype {} is not supported", dtype_name(host.dtype));
}

Result<Tensor> CpuBackend::load_stacked(const std::vector<Tensor>& parts) {
  if (parts.empty()) return Status::error("load_stacked: no tensors");
  const Tensor& first = parts.front();
  if (first.rank > Tensor::kMaxRank - 1) return Status::error("load_stacked: rank too high");
  for (const Tensor& part : parts)
    if (part.dtype != first.dtype || part.numel() != first.numel())
      return Status::error("load_stacked: tensors differ in dtype or shape");
  if (first.dtype != DType::kBF16 && first.dtype != DType::kF32 && first.dtype != DType::kF16)
    return Status::errorf("cpu backend: weight dtype {} is not supported", dtype_name(first.dtype));
  const DType dtype = first.dtype == DType::kF16 ? DType::kF32 : first.dtype;
  Tensor stacked(nullptr, dtype, {static_cast<int64_t>(parts.size())});
  stacked.rank = first.rank + 1;
  for (int i = 0; i < first.rank; ++i) stacked.shape[static_cast<size_t>(i + 1)] = first.shape[static_cast<size_t>(i)];
  stacked.data = std::aligned_alloc(64, std::max<size_t>(64, (stacked.nbytes() + 63) / 64 * 64));
  if (!stacked.data) return Status::error(ErrorCode::kResourceExhausted, "out of memory stacking expert weights");
  const size_t part_bytes = static_cast<size_t>(first.numel()) * dtype_size(dtype);
  for (size_t p = 0; p < parts.size(); ++p) {
    char* dst = static_cast<char*>(stacked.data) + p * part_bytes;
    if (first.dtype == DType::kF16) {
      const uint16_t* src = parts[p].ptr<uint16_t>();
      float* out = reinterpret_cast<float*>(dst);
      for (int64_t i = 0; i < first.numel(); ++i) out[i] = f16_to_f32(src[i]);
    } else {
      std::memcpy(dst, parts[p].data, part_bytes);
    }
  }
  return stacked;
}

void CpuBackend::fill_random(Tensor& dst, uint64_t seed, float scale, float offset) {
  const int64_t n = dst.numel();
  pool_.parallel_for(n, 1 << 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float value = random_fill_value(seed, static_cast<uint64_t>(i), scale, offset);
      if (dst.dtype == DType::kBF16) dst.ptr<uint16_t>()[i] = f32_to_bf16(value);
      else dst.ptr<float>()[i] = value;
    }
  });
}

void CpuBackend::fill_random_bytes(Tensor& dst, uint64_t seed, int lo, float span) {
  uint8_t* bytes = dst.ptr<uint8_t>();
  pool_.parallel_for(dst.numel(), 1 << 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      bytes[i] = random_fill_byte(seed, static_cast<uint64_t>(i), lo, span);
  });
}

// An empty tensor's host side may be a null pointer (an empty vector's data()): memcpy must
// not see it, even for 0 bytes.
void CpuBackend::upload(const void* host, Tensor& dst) {
  if (dst.nbytes() > 0) std::memcpy(dst.data, host, dst.nbytes());
}
void CpuBackend::download(const Tensor& src, void* host) {
  if (src.nbytes() > 0) std::memcpy(host, src.data, src.nbytes());
}
void CpuBackend::copy(const Tensor& src, Tensor& dst) {
  if (src.nbytes() > 0) std::memmove(dst.data, src.data, src.nbytes());
}
void CpuBackend::fill_i32(Tensor& dst, int32_t value) {
  std::fill_n(dst.ptr<int32_t>(), dst.numel(), value);
}

void CpuBackend::embedding(const Tensor& table, const Tensor& ids, Tensor& out) {
  const int64_t hidden = table.dim(1);
  const int32_t* token_ids = ids.ptr<int32_t>();
  for (int64_t t = 0; t < ids.numel(); ++t) {
    float* row = out.ptr<float>() + t * hidden;
    if (table.dtype == DType::kBF16) {
      const uint16_t* src = table.ptr<uint16_t>() + token_ids[t] * hidden;
      for (int64_t i = 0; i < hidden; ++i) row[i] = bf16_to_f32(src[i]);
    } else {
      std::memcpy(row, table.ptr<float>() + token_ids[t] * hidden, hidden * sizeof(float));
    }
  }
}

void CpuBackend::rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) {
  const int64_t width = weight.numel(), rows = x.numel() / width;
  pool_.parallel_for(rows, 64, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* in = x.ptr<float>() + r * width;
      float* dst = out.ptr<float>() + r * width;
      float sum_squares = 0.0f;
      for (int64_t i = 0; i < width; ++i) sum_squares += in[i] * in[i];
      float scale = 1.0f / std::sqrt(sum_squares / static_cast<float>(width) + eps);
      for (int64_t i = 0; i < width; ++i) {
        float w = weight.dtype == DType::kBF16 ? bf16_to_f32(weight.ptr<uint16_t>()[i])
                                               : weight.ptr<float>()[i];
        dst[i] = w * (in[i] * scale);
      }
    }
  });
}

void CpuBackend::matmul(const Tensor& x, const Tensor& weight, const Tensor* bias, Tensor& out) {
  std::vector<float> bias_f32;
  const float* bias_ptr = nullptr;
  if (bias && bias->data) {
    bias_f32.resize(static_cast<size_t>(bias->numel()));
    for (int64_t i = 0; i < bias->numel(); ++i)
      bias_f32[i] = bias->dtype == DType::kBF16 ? bf16_to_f32(bias->ptr<uint16_t>()[i])
                                                : bias->ptr<float>()[i];
    bias_ptr = bias_f32.data();
  }
  const int64_t in = weight.dim(1), out_features = weight.dim(0);
  matmul_rows(x.ptr<float>(), in, x.numel() / in, weight, bias_ptr, out.ptr<float>(), out_features,
              &pool_);
}

void CpuBackend::add_inplace(Tensor& x, const Tensor& y) {
  float* dst = x.ptr<float>();
  const float* src = y.ptr<float>();
  for (int64_t i = 0; i < x.numel(); ++i) dst[i] += src[i];
}

void CpuBackend::silu_mul(const Tensor& gate, const Tensor& up, Tensor& out) {
  const float* g = gate.ptr<float>();
  const float* u = up.ptr<float>();
  float* dst = out.ptr<float>();
  for (int64_t i = 0; i < out.numel(); ++i) dst[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

void CpuBackend::rope(Tensor& x, const AttentionBatch& batch, const RopeSpec& spec) {
  const int64_t tokens = x.dim(0), heads = x.dim(1), head_dim = x.dim(2);
  // Partial rotary: only the first `rotary` dims of each head turn (and set the frequencies);
  // the rest pass through.
  const int64_t rotary = spec.head_dim > 0 ? std::min(spec.head_dim, head_dim) : head_dim,
                half = rotary / 2;
  // As transformers computes it in f32: inv_freq = 1 / theta^(2i/d) (or YaRN's, given), angle =
  // position * inv_freq; cos and sin times YaRN's attention factor.
  std::vector<float> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    inv_freq[i] =
        spec.inv_freq
            ? spec.inv_freq[i]
            : static_cast<float>(1.0 / std::pow(spec.theta, static_cast<double>(2 * i) /
                                                                static_cast<double>(rotary)));
  const float factor = spec.attention_factor;
  const int32_t* positions = batch.positions.ptr<int32_t>();
  pool_.parallel_for(tokens, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> cos_v(static_cast<size_t>(half)), sin_v(static_cast<size_t>(half));
    for (int64_t t = begin; t < end; ++t) {
      float position = static_cast<float>(positions[t]);
      for (int64_t i = 0; i < half; ++i) {
        float angle = position * inv_freq[i];
        cos_v[i] = std::cos(angle);
        sin_v[i] = std::sin(angle);
        if (factor != 1.0f) {
          cos_v[i] *= factor;
          sin_v[i] *= factor;
        }
      }
      for (int64_t h = 0; h < heads; ++h) {
        float* v = x.ptr<float>() + (t * heads + h) * head_dim;
        for (int64_t i = 0; i < half; ++i) {
          float a = v[i], b = v[i + half];
          v[i] = a * cos_v[i] - b * sin_v[i];
          v[i + half] = b * cos_v[i] + a * sin_v[i];
        }
      }
    }
  });
}

void CpuBackend::write_kv(const Tensor& k, const Tensor& v, Tensor& k_cache, Tensor& v_cache,
                          const AttentionBatch& batch) {
  const int64_t row = k.numel() / k.dim(0);
  const int32_t* slots = batch.slot_mapping.ptr<int32_t>();
  for (int64_t t = 0; t < k.dim(0); ++t) {
    if (slots[t] < 0) continue;  // padding
    std::memcpy(k_cache.ptr<float>() + slots[t] * row, k.ptr<float>() + t * row, row * sizeof(float));
    std::memcpy(v_cache.ptr<float>() + slots[t] * row, v.ptr<float>() + t * row, row * sizeof(float));
  }
}

void CpuBackend::attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                           const AttentionBatch& batch, float scale, Tensor& out) {
  const int64_t tokens = q.dim(0), heads = q.dim(1), head_dim = q.dim(2);
  const int64_t kv_heads = k_cache.dim(1), group = heads / kv_heads;
  const int64_t max_blocks = batch.block_tables.dim(1);
  const int32_t* positions = batch.positions.ptr<int32_t>();
  const int32_t* token_seq = batch.token_seq.ptr<int32_t>();
  const int32_t* tables = batch.block_tables.ptr<int32_t>();
  const int block_size = batch.block_size;
  const int64_t window = batch.sliding_window;
  // Attention sinks: one more logit per head in each softmax, whose value weights nothing.
  std::vector<float> sinks;
  if (batch.sinks)
    for (int64_t h = 0; h < heads; ++h)
      sinks.push_back(batch.sinks->dtype == DType::kBF16
                          ? bf16_to_f32(batch.sinks->ptr<uint16_t>()[h])
                          : batch.sinks->ptr<float>()[h]);
  pool_.parallel_for(tokens * heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t t = task / heads, h = task % heads, kv_head = h / group;
      const int64_t context = positions[t] + 1;
      const int64_t first = window > 0 ? std::max<int64_t>(0, context - window) : 0;
      const int32_t* table = tables + token_seq[t] * max_blocks;
      const float* qv = q.ptr<float>() + (t * heads + h) * head_dim;
      scores.resize(static_cast<size_t>(context));
      float max_score = -INFINITY;
      for (int64_t p = first; p < context; ++p) {
        int64_t slot = static_cast<int64_t>(table[p / block_size]) * block_size + p % block_size;
        const float* kv = k_cache.ptr<float>() + (slot * kv_heads + kv_head) * head_dim;
        float dot = 0.0f;
        for (int64_t i = 0; i < head_dim; ++i) dot += qv[i] * kv[i];
        scores[p] = dot * scale;
        max_score = std::max(max_score, scores[p]);
      }
      if (!sinks.empty()) max_score = std::max(max_score, sinks[h]);
      float sum = 0.0f;
      for (int64_t p = first; p < context; ++p) sum += scores[p] = std::exp(scores[p] - max_score);
      if (!sinks.empty()) sum += std::exp(sinks[h] - max_score);
      float* dst = out.ptr<float>() + (t * heads + h) * head_dim;
      std::fill_n(dst, head_dim, 0.0f);
      for (int64_t p = first; p < context; ++p) {
        int64_t slot = static_cast<int64_t>(table[p / block_size]) * block_size + p % block_size;
        const float* vv = v_cache.ptr<float>() + (slot * kv_heads + kv_head) * head_dim;
        float weight = scores[p] / sum;
        for (int64_t i = 0; i < head_dim; ++i) dst[i] += weight * vv[i];
      }
    }
  });
}

void CpuBackend::latent_attention(Tensor& q, Tensor& kv_latent, const Tensor& kv_norm, float eps,
                                  const Tensor& kv_b_proj, const LatentShape& shape,
                                  const AttentionBatch& batch, const RopeSpec& rope_spec,
                                  Tensor& cache, float scale, Tensor& out) {
  const int64_t tokens = q.dim(0), heads = q.dim(1);
  const int64_t lora = shape.kv_lora_rank, nope = shape.nope, rope = shape.rope,
                v_dim = shape.v_dim, half = rope / 2;
  const int64_t q_row = nope + rope, cache_row = lora + rope, b_rows = nope + v_dim;
  const int32_t* positions = batch.positions.ptr<int32_t>();
  const int32_t* slots = batch.slot_mapping.ptr<int32_t>();
  std::vector<float> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    inv_freq[i] = rope_spec.inv_freq ? rope_spec.inv_freq[i]
                                     : static_cast<float>(1.0 / std::pow(rope_spec.theta,
                                                                         static_cast<double>(2 * i) /
                                                                             static_cast<double>(rope)));
  // Rotates `rope` values in place at `position`: pair i is (2i, 2i+1) interleaved (transformers
  // de-interleaves, then rotates halves: the same pairs, a permuted output order that every dot
  // product ignores), else (i, i + half).
  auto rotate = [&](float* v, float position) {
    for (int64_t i = 0; i < half; ++i) {
      const float angle = position * inv_freq[i];
      const float c = std::cos(angle) * rope_spec.attention_factor,
                  s = std::sin(angle) * rope_spec.attention_factor;
      const int64_t ia = shape.interleave ? 2 * i : i, ib = shape.interleave ? 2 * i + 1 : i + half;
      const float a = v[ia], b = v[ib];
      v[ia] = a * c - b * s;
      v[ib] = b * c + a * s;
    }
  };
  // Latent RMSNorm, RoPE of k_pe and q's rope part, the latent row into the cache.
  for (int64_t t = 0; t < tokens; ++t) {
    float* row = kv_latent.ptr<float>() + t * cache_row;
    float sum_squares = 0.0f;
    for (int64_t i = 0; i < lora; ++i) sum_squares += row[i] * row[i];
    const float norm = 1.0f / std::sqrt(sum_squares / static_cast<float>(lora) + eps);
    for (int64_t i = 0; i < lora; ++i) {
      const float w = kv_norm.dtype == DType::kBF16 ? bf16_to_f32(kv_norm.ptr<uint16_t>()[i])
                                                    : kv_norm.ptr<float>()[i];
      row[i] = w * (row[i] * norm);
    }
    const float position = static_cast<float>(positions[t]);
    rotate(row + lora, position);
    for (int64_t h = 0; h < heads; ++h) rotate(q.ptr<float>() + (t * heads + h) * q_row + nope, position);
    if (slots[t] >= 0) std::memcpy(cache.ptr<float>() + slots[t] * cache_row, row, cache_row * sizeof(float));
  }
  // kv_b_proj in f32 (bf16 weights are widened once per call).
  std::vector<float> kv_b(static_cast<size_t>(kv_b_proj.numel()));
  for (int64_t i = 0; i < kv_b_proj.numel(); ++i)
    kv_b[i] = kv_b_proj.dtype == DType::kBF16 ? bf16_to_f32(kv_b_proj.ptr<uint16_t>()[i]) : kv_b_proj.ptr<float>()[i];
  const int64_t max_blocks = batch.block_tables.dim(1);
  const int32_t* token_seq = batch.token_seq.ptr<int32_t>();
  const int32_t* tables = batch.block_tables.ptr<int32_t>();
  const int block_size = batch.block_size;
  // Attention in the latent space (the up-projections absorbed): score = (W_k^T q_nope) . latent
  // + q_pe . k_pe, the output W_v (sum of weights x latent). Floor: 2 * context * (lora + rope)
  // FLOPs per head and token, plus 2 * lora * (nope + v_dim) for the two absorptions.
  pool_.parallel_for(tokens * heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores, q_latent(static_cast<size_t>(lora)), o_latent(static_cast<size_t>(lora));
    for (int64_t task = begin; task < end; ++task) {
      const int64_t t = task / heads, h = task % heads;
      const int64_t context = positions[t] + 1;
      const int32_t* table = tables + token_seq[t] * max_blocks;
      const float* qv = q.ptr<float>() + (t * heads + h) * q_row;
      const float* w_k = kv_b.data() + h * b_rows * lora;
      const float* w_v = w_k + nope * lora;
      std::fill(q_latent.begin(), q_latent.end(), 0.0f);
      for (int64_t j = 0; j < nope; ++j)
        for (int64_t l = 0; l < lora; ++l) q_latent[l] += qv[j] * w_k[j * lora + l];
      scores.resize(static_cast<size_t>(context));
      float max_score = -INFINITY;
      for (int64_t p = 0; p < context; ++p) {
        const int64_t slot = static_cast<int64_t>(table[p / block_size]) * block_size + p % block_size;
        const float* kv = cache.ptr<float>() + slot * cache_row;
        float dot = 0.0f;
        for (int64_t l = 0; l < lora; ++l) dot += q_latent[l] * kv[l];
        for (int64_t i = 0; i < rope; ++i) dot += qv[nope + i] * kv[lora + i];
        scores[p] = dot * scale;
        max_score = std::max(max_score, scores[p]);
      }
      float sum = 0.0f;
      for (int64_t p = 0; p < context; ++p) sum += scores[p] = std::exp(scores[p] - max_score);
      std::fill(o_latent.begin(), o_latent.end(), 0.0f);
      for (int64_t p = 0; p < context; ++p) {
        const int64_t slot = static_cast<int64_t>(table[p / block_size]) * block_size + p % block_size;
        const float* kv = cache.ptr<float>() + slot * cache_row;
        const float weight = scores[p] / sum;
        for (int64_t l = 0; l < lora; ++l) o_latent[l] += weight * kv[l];
      }
      float* dst = out.ptr<float>() + (t * heads + h) * v_dim;
      for (int64_t i = 0; i < v_dim; ++i) {
        float value = 0.0f;
        for (int64_t l = 0; l < lora; ++l) value += w_v[i * lora + l] * o_latent[l];
        dst[i] = value;
      }
    }
  });
}

void CpuBackend::add_sigmoid_gated(Tensor& out, const Tensor& y, const Tensor& gate_logit) {
  const int64_t rows = out.dim(0), width = out.numel() / rows;
  for (int64_t r = 0; r < rows; ++r) {
    const float gate = 1.0f / (1.0f + std::exp(-gate_logit.ptr<float>()[r]));
    float* dst = out.ptr<float>() + r * width;
    const float* src = y.ptr<float>() + r * width;
    for (int64_t i = 0; i < width; ++i) dst[i] += gate * src[i];
  }
}

void CpuBackend::gather_rows(const Tensor& x, const Tensor& rows, Tensor& out) {
  const int64_t width = x.numel() / x.dim(0);
  const int32_t* index = rows.ptr<int32_t>();
  for (int64_t r = 0; r < rows.numel(); ++r)
    std::memcpy(out.ptr<float>() + r * width, x.ptr<float>() + index[r] * width, width * sizeof(float));
}

void CpuBackend::register_kernels(moe::ExpertsKernelRegistry& registry) {
  registry.add(make_modular_kernel(pool_));
  registry.add(make_fused_kernel(pool_));
}

void expert_mlp(const float* x, int64_t rows, const Tensor& gate, const Tensor& up,
                const Tensor& down, float* out, ThreadPool* pool) {
  const int64_t hidden = gate.dim(1), inter = gate.dim(0);
  std::vector<float> g(static_cast<size_t>(rows * inter)), u(static_cast<size_t>(rows * inter));
  matmul_rows(x, hidden, rows, gate, nullptr, g.data(), inter, pool);
  matmul_rows(x, hidden, rows, up, nullptr, u.data(), inter, pool);
  for (size_t i = 0; i < g.size(); ++i) g[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
  matmul_rows(g.data(), inter, rows, down, nullptr, out, hidden, pool);
}

std::unique_ptr<Backend> make_cpu_backend_impl(const CpuBackendOptions& options) {
  return std::make_unique<CpuBackend>(options);
}

}  // namespace sy::backend::cpu

namespace sy::backend {
std::unique_ptr<Backend> make_cpu_backend(const CpuBackendOptions& options) {
  return cpu::make_cpu_backend_impl(options);
}
}  // namespace sy::backend
