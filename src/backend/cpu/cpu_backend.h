// The CPU backend: host memory, f32 compute over BF16/F32 weights, multi-threaded, batch-invariant.
#pragma once

#include <cstring>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "util/thread_pool.h"

namespace sy::backend::cpu {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const CpuBackendOptions& options);
  ~CpuBackend() override;

  std::string name() const override { return "cpu"; }
  Device device() const override { return Device::kCpu; }
  ThreadPool& pool() { return pool_; }
  bool supports(BackendFeature) const override { return true; }
  bool batch_invariant() const override { return true; }  // fixed per-row reduction orders

  Tensor alloc(DType dtype, std::initializer_list<int64_t> shape) override;
  void free_buffer(Tensor& tensor) override;
  Result<Tensor> load_weight(const Tensor& host) override;
  Result<Tensor> load_stacked(const std::vector<Tensor>& host_parts) override;
  void fill_random(Tensor& dst, uint64_t seed, float scale, float offset) override;
  void fill_random_bytes(Tensor& dst, uint64_t seed, int lo, float span) override;
  void upload(const void* host, Tensor& dst) override;
  void download(const Tensor& src, void* host) override;
  void copy(const Tensor& src, Tensor& dst) override;
  void download_columns_async(const Tensor& src, void* host, int64_t rows, int64_t row_bytes,
                              int64_t begin, int64_t width) override {
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(static_cast<char*>(host) + r * row_bytes + begin,
                  static_cast<const char*>(src.data) + r * row_bytes + begin,
                  static_cast<size_t>(width));
  }
  void fill_i32(Tensor& dst, int32_t value) override;

  void embedding(const Tensor& table, const Tensor& ids, Tensor& out) override;
  void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) override;
  void matmul(const Tensor& x, const Tensor& weight, const Tensor* bias, Tensor& out) override;
  void add_inplace(Tensor& x, const Tensor& y) override;
  void add_sigmoid_gated(Tensor& out, const Tensor& y, const Tensor& gate_logit) override;
  void silu_mul(const Tensor& gate, const Tensor& up, Tensor& out) override;
  void rope(Tensor& x, const AttentionBatch& batch, const RopeSpec& spec) override;
  void write_kv(const Tensor& k, const Tensor& v, Tensor& k_cache, Tensor& v_cache,
                const AttentionBatch& batch) override;
  void attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                 const AttentionBatch& batch, float scale, Tensor& out) override;
  void latent_attention(Tensor& q, Tensor& kv_latent, const Tensor& kv_norm, float eps,
                        const Tensor& kv_b_proj, const LatentShape& shape,
                        const AttentionBatch& batch, const RopeSpec& rope, Tensor& cache,
                        float scale, Tensor& out) override;
  // Qwen3.5's token mixers (linear_attention.cpp).
  void gated_attention(const Tensor& q_gate, Tensor& q, Tensor& k, const Tensor& v,
                       const Tensor& q_norm, const Tensor& k_norm, float eps,
                       const AttentionBatch& batch, const RopeSpec& rope, Tensor& k_cache,
                       Tensor& v_cache, float scale, Tensor& out) override;
  void gated_delta_net(const Tensor& qkv, const Tensor& z, const Tensor& b, const Tensor& a,
                       const LinearWeights& weights, const LinearShape& shape, float eps,
                       const AttentionBatch& batch, const LinearState& state, Tensor& out) override;
  void gather_rows(const Tensor& x, const Tensor& rows, Tensor& out) override;
  void sample(const Tensor& logits, const std::vector<SamplingRow>& rows,
              std::vector<SampledToken>& out) override;
  void score_tokens(const Tensor& logits, const std::vector<int32_t>& targets, int top_k,
                    std::vector<SampledToken>& out) override;
  void register_kernels(moe::ExpertsKernelRegistry& registry) override;

 private:
  ThreadPool pool_;
};

// The CPU MoE kernels (explicit list; see register_kernels).
std::unique_ptr<moe::ExpertsKernel> make_modular_kernel(ThreadPool& pool);
std::unique_ptr<moe::ExpertsKernel> make_fused_kernel(ThreadPool& pool);

// Shared by the kernels: one expert's SwiGLU MLP for `rows` token rows of x (stride hidden).
void expert_mlp(const float* x, int64_t rows, const Tensor& gate, const Tensor& up,
                const Tensor& down, float* out, ThreadPool* pool);
// Expert e of a layer for any ExpertSpec (moe/expert_spec.h): expert_mlp for the default, else
// biases, the clamped SwiGLU and interleaved / MXFP4 weights read as stored (moe_experts.cpp).
void expert_forward(const float* x, int64_t rows, const moe::MoeLayerWeights& weights, int64_t e,
                    const moe::ExpertSpec& spec, float* out, ThreadPool* pool);
// A bf16 or f32 tensor's values as f32 (empty when undefined).
std::vector<float> vector_f32(const Tensor& tensor);

}  // namespace sy::backend::cpu
