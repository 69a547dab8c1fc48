// CudaBackend: the Backend interface over one CUDA stream. Weights are bf16 matrices and f32
// vectors on the device; activations f32; the KV cache bf16. Small steps (<= kGemvMaxRows rows)
// multiply with our GEMV, larger ones with cuBLAS (activations rounded to bf16, f32 out).
#include "backend/cuda/cuda_backend.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/cuda/attention.h"
#include "backend/cuda/cuda_context.h"
#include "backend/cuda/elementwise.h"
#include "backend/cuda/latent_attention.h"
#include "backend/cuda/linear_attention.h"
#include "backend/cuda/moe_kernels.h"
#include "backend/cuda/sampler.h"
#include "backend/sequence_runs.h"

namespace sy::backend::cuda {
namespace {
// SY_SKIP_OPS=attention,matmul,norm_matmul (timing experiments only: the step's output is then
// wrong): the named ops launch nothing, so a same-run A/B shows what each costs inside the graph.
// "matmul" skips the small-step GEMVs except the LM head (out_features >= 65536).
bool skip_op(const char* op) {
  const char* value = std::getenv("SY_SKIP_OPS");
  if (!value) return false;
  const std::string list = std::string(",") + value + ",";
  return list.find(std::string(",") + op + ",") != std::string::npos;
}


class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, bool batch_invariant) : invariant_(batch_invariant), sampler_(context_) {
    context_.device = device;
    context_.batch_invariant = batch_invariant;
    SY_CUDA_CHECK(cudaSetDevice(device));
    SY_CUDA_CHECK(cudaStreamCreateWithFlags(&context_.stream, cudaStreamNonBlocking));
    SY_CUBLAS_CHECK(cublasCreate(&context_.cublas));
    SY_CUBLAS_CHECK(cublasSetStream(context_.cublas, context_.stream));
    SY_CUBLAS_CHECK(cublasLtCreate(&context_.cublas_lt));
    context_.cublas_workspace_bytes = size_t{64} << 20;
    SY_CUDA_CHECK(cudaMalloc(&context_.cublas_workspace, context_.cublas_workspace_bytes));
    SY_CUBLAS_CHECK(cublasSetWorkspace(context_.cublas, context_.cublas_workspace, context_.cublas_workspace_bytes));
    cudaDeviceProp prop{};
    SY_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    context_.sm_count = prop.multiProcessorCount;
    context_.shared_memory_per_block_optin = prop.sharedMemPerBlockOptin;
    device_name_ = prop.name;
  }

  ~CudaBackend() override {
    clear_graphs();
    cudaStreamSynchronize(context_.stream);
    for (cudaEvent_t mark : marks_)
      if (mark) cudaEventDestroy(mark);
    if (matmul_scratch_) cudaFree(matmul_scratch_);
    if (dense_plan_) cudaFree(dense_plan_);
    if (attention_scratch_) cudaFree(attention_scratch_);
    if (latent_scratch_) cudaFree(latent_scratch_);
    if (conv_scratch_) cudaFree(conv_scratch_);
    latent_expand_release(latent_expand_);
    if (attention_arrivals_) cudaFree(attention_arrivals_);
    cudaFree(context_.cublas_workspace);
    cublasLtDestroy(context_.cublas_lt);
    cublasDestroy(context_.cublas);
    cudaStreamDestroy(context_.stream);
  }

  std::string name() const override { return "cuda"; }
  Device device() const override { return Device::kCuda; }
  DType kv_cache_dtype() const override { return DType::kBF16; }
  int64_t free_memory_bytes() const override {
    size_t free_bytes = 0, total = 0;
    SY_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
    return static_cast<int64_t>(free_bytes);
  }
  int64_t total_memory_bytes() const override {
    size_t free_bytes = 0, total = 0;
    SY_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
    return static_cast<int64_t>(total);
  }
  std::string small_batch_kernel() const override { return "cuda-fused"; }
  void* native_stream() const override { return context_.stream; }
  int64_t small_batch_max_tokens() const override { return kFusedMaxTokens; }
  bool batch_invariant() const override { return invariant_; }

  Status reserve(const StepLimits& limits) override {
    limits_ = limits;
    matmul_scratch_elems_ = limits.max_tokens * std::max<int64_t>(limits.max_feature_dim, 1);
    if (cudaMalloc(&matmul_scratch_, static_cast<size_t>(matmul_scratch_elems_) * 2) != cudaSuccess)
      return Status::error(ErrorCode::kResourceExhausted, "cuda: out of memory for the matmul scratch");
    if (invariant_) {
      const size_t ints = dense_gemm_plan_ints(limits.max_tokens);
      if (cudaMalloc(&dense_plan_, ints * sizeof(int32_t)) != cudaSuccess)
        return Status::error(ErrorCode::kResourceExhausted, "cuda: out of memory for the dense GEMM plan");
    }
    attention_scratch_bytes_ = attention_scratch_bytes(std::min(limits.max_tokens, limits.max_seqs),
                                                       static_cast<int>(limits.num_heads),
                                                       static_cast<int>(limits.head_dim));
    if (attention_scratch_bytes_ > 0 &&
        cudaMalloc(&attention_scratch_, attention_scratch_bytes_) != cudaSuccess)
      return Status::error(ErrorCode::kResourceExhausted, "cuda: out of memory for the attention scratch");
    attention_decode_tokens_ = std::min(limits.max_tokens, limits.max_seqs);
    const size_t arrivals = attention_arrivals_count(attention_decode_tokens_, static_cast<int>(limits.num_heads));
    if (cudaMalloc(&attention_arrivals_, arrivals * sizeof(int)) != cudaSuccess)
      return Status::error(ErrorCode::kResourceExhausted, "cuda: out of memory for the attention counters");
    SY_CUDA_CHECK(cudaMemset(attention_arrivals_, 0, arrivals * sizeof(int)));
    if (limits.vocab_size > 0) sampler_.reserve(limits.max_logits_rows, limits.vocab_size);
    prepare_gated_delta_net(context_.device);
    if (limits.linear_conv_dim > 0) {
      conv_scratch_elems_ = limits.max_tokens * limits.linear_conv_dim;
      if (conv_scratch_) cudaFree(conv_scratch_);
      if (cudaMalloc(&conv_scratch_, static_cast<size_t>(conv_scratch_elems_) * sizeof(float)) !=
          cudaSuccess)
        return Status::error(ErrorCode::kResourceExhausted,
                             "cuda: out of memory for the DeltaNet conv scratch");
    }
    if (limits.latent_kv_lora > 0) {
      latent_scratch_bytes_ = latent_attention_scratch_bytes(
          static_cast<int>(limits.num_heads), static_cast<int>(limits.latent_kv_lora),
          static_cast<int>(limits.latent_rope));
      if (latent_scratch_) cudaFree(latent_scratch_);
      if (cudaMalloc(&latent_scratch_, latent_scratch_bytes_) != cudaSuccess)
        return Status::error(ErrorCode::kResourceExhausted,
                             "cuda: out of memory for the latent attention scratch");
      prepare_latent_attention(context_.device);
      // The expanded prefill path (not in batch-invariant mode: a row's arithmetic would then
      // depend on how many query tokens its sequence has in the step). Contexts up to
      // kLatentExpandContext; longer ones, or no room for the scratch, stay absorbed.
      const int64_t context = std::min(limits.max_context, kLatentExpandContext);
      if (!invariant_ && context > 0 &&
          latent_expand_supported(static_cast<int>(limits.latent_nope),
                                  static_cast<int>(limits.latent_rope),
                                  static_cast<int>(limits.latent_v_dim)) &&
          !latent_expand_reserve(static_cast<int>(limits.num_heads),
                                 static_cast<int>(limits.latent_kv_lora),
                                 static_cast<int>(limits.latent_nope),
                                 static_cast<int>(limits.latent_rope), context, latent_expand_))
        return Status::error(ErrorCode::kResourceExhausted,
                             "cuda: out of memory for the latent attention's prefill scratch");
    }
    return Status::ok();
  }

  Tensor alloc(DType dtype, std::initializer_list<int64_t> shape) override {
    Tensor tensor(nullptr, dtype, shape, Device::kCuda);
    void* data = nullptr;
    if (cudaMalloc(&data, std::max<size_t>(tensor.nbytes(), 16)) != cudaSuccess) {
      cudaGetLastError();  // an out-of-memory answer is not sticky: clear it
      return tensor;       // data == nullptr: the caller reports it
    }
    tensor.data = data;
    return tensor;
  }
  void free_buffer(Tensor& tensor) override {
    if (tensor.data) SY_CUDA_CHECK(cudaFree(tensor.data));
    tensor.data = nullptr;
  }

  // First loads allocate, then copy as a weight update does: one copy path for both.
  Result<Tensor> load_weight(const Tensor& host) override {
    std::vector<uint8_t> probe;
    SY_ASSIGN(DType dtype, convert_weight(host, probe, /*probe_only=*/true));
    Tensor tensor = host;
    tensor.device = Device::kCuda;
    tensor.dtype = dtype;
    Tensor allocated = alloc_like(tensor);
    if (!allocated.data) return Status::error(ErrorCode::kResourceExhausted, "cuda: out of device memory for weights");
    if (Status copied = load_weight_into(host, allocated); !copied) {
      free_buffer(allocated);
      return copied;
    }
    return allocated;
  }

  bool updates_weights_in_place() const override { return true; }
  Status load_weight_into(const Tensor& host, Tensor& dst) override {
    std::vector<uint8_t> converted;
    SY_ASSIGN(DType dtype, convert_weight(host, converted));
    if (dtype != dst.dtype || host.numel() != dst.numel() || !dst.data)
      return Status::errorf("cuda: weight update: {} {} does not match the loaded {} {}", dtype_name(dtype),
                            host.shape_string(), dtype_name(dst.dtype), dst.shape_string());
    SY_CUDA_CHECK(cudaMemcpy(dst.data, converted.empty() ? host.data : converted.data(), dst.nbytes(),
                             cudaMemcpyHostToDevice));
    return Status::ok();
  }

  Status load_stacked_into(const std::vector<Tensor>& parts, Tensor& dst) override {
    if (parts.empty()) return Status::error("load_stacked_into: no tensors");
    const Tensor& first = parts.front();
    for (const Tensor& part : parts)
      if (part.dtype != first.dtype || part.numel() != first.numel())
        return Status::error("load_stacked_into: tensors differ in dtype or shape");
    std::vector<uint8_t> converted;
    Tensor stacked = first;
    stacked.rank = first.rank + 1;
    SY_ASSIGN(DType dtype, convert_weight(stacked, converted, /*probe_only=*/true));
    if (dtype != dst.dtype || first.numel() * static_cast<int64_t>(parts.size()) != dst.numel() || !dst.data)
      return Status::errorf("cuda: weight update: {} x {} {} does not match the loaded {} {}", parts.size(),
                            dtype_name(dtype), first.shape_string(), dtype_name(dst.dtype), dst.shape_string());
    const size_t part_bytes = static_cast<size_t>(first.numel()) * dtype_size(dst.dtype);
    for (size_t p = 0; p < parts.size(); ++p) {
      SY_ASSIGN(DType part_dtype, convert_weight(parts[p], converted, false, stacked.rank));
      (void)part_dtype;
      SY_CUDA_CHECK(cudaMemcpy(static_cast<char*>(dst.data) + p * part_bytes,
                               converted.empty() ? parts[p].data : converted.data(), part_bytes,
                               cudaMemcpyHostToDevice));
    }
    return Status::ok();
  }

  Result<Tensor> load_stacked(const std::vector<Tensor>& parts) override {
    if (parts.empty()) return Status::error("load_stacked: no tensors");
    const Tensor& first = parts.front();
    for (const Tensor& part : parts)
      if (part.dtype != first.dtype || part.numel() != first.numel())
        return Status::error("load_stacked: tensors differ in dtype or shape");
    Tensor stacked = first;
    stacked.rank = first.rank + 1;
    stacked.shape[0] = static_cast<int64_t>(parts.size());
    for (int i = 0; i < first.rank; ++i) stacked.shape[static_cast<size_t>(i + 1)] = first.shape[static_cast<size_t>(i)];
    std::vector<uint8_t> probe;
    SY_ASSIGN(stacked.dtype, convert_weight(stacked, probe, /*probe_only=*/true));
    stacked.device = Device::kCuda;
    Tensor allocated = alloc_like(stacked);
    if (!allocated.data) return Status::error(ErrorCode::kResourceExhausted, "cuda: out of device memory for weights");
    if (Status copied = load_stacked_into(parts, allocated); !copied) {
      free_buffer(allocated);
      return copied;
    }
    return allocated;
  }

  void fill_random_bytes(Tensor& dst, uint64_t seed, int lo, float span) override {
    launch_fill_random_bytes(dst.ptr<uint8_t>(), dst.numel(), seed, lo, span, context_.stream);
  }
  void fill_random(Tensor& dst, uint64_t seed, float scale, float offset) override {
    launch_fill_random(dst.data, dst.dtype == DType::kBF16, dst.numel(), seed, scale, offset, context_.stream);
  }

  void upload(const void* host, Tensor& dst) override {
    check_not_capturing("upload");
    if (dst.nbytes() == 0) return;
    SY_CUDA_CHECK(cudaMemcpyAsync(dst.data, host, dst.nbytes(), cudaMemcpyHostToDevice, context_.stream));
    SY_CUDA_CHECK(cudaStreamSynchronize(context_.stream));
  }
  void download(const Tensor& src, void* host) override {
    check_not_capturing("download");
    if (src.nbytes() == 0) return;
    SY_CUDA_CHECK(cudaMemcpyAsync(host, src.data, src.nbytes(), cudaMemcpyDeviceToHost, context_.stream));
    SY_CUDA_CHECK(cudaStreamSynchronize(context_.stream));
  }
  void copy(const Tensor& src, Tensor& dst) override {
    if (src.nbytes() == 0) return;
    SY_CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, src.nbytes(), cudaMemcpyDeviceToDevice,
                                  context_.stream));
  }
  void download_async(const Tensor& src, void* host) override {
    if (src.nbytes() == 0) return;
    SY_CUDA_CHECK(cudaMemcpyAsync(host, src.data, src.nbytes(), cudaMemcpyDeviceToHost, context_.stream));
  }
  void synchronize() override {
    SY_CUDA_CHECK(cudaStreamSynchronize(context_.stream));
    sampler_.complete();
  }
  void download_columns_async(const Tensor& src, void* host, int64_t rows, int64_t row_bytes,
                              int64_t begin, int64_t width) override {
    if (rows == 0 || width == 0) return;
    SY_CUDA_CHECK(
        cudaMemcpy2DAsync(static_cast<char*>(host) + begin, static_cast<size_t>(row_bytes),
                          static_cast<const char*>(src.data) + begin,
                          static_cast<size_t>(row_bytes), static_cast<size_t>(width),
                          static_cast<size_t>(rows), cudaMemcpyDeviceToHost, context_.stream));
  }
  void record_mark(int slot) override {
    check_not_capturing("record_mark");
    if (slot < 0 || slot >= kMaxMarks)
      cuda_fail("record_mark", "slot out of range", __FILE__, __LINE__);
    if (!marks_[slot])
      SY_CUDA_CHECK(cudaEventCreateWithFlags(&marks_[slot], cudaEventDisableTiming));
    SY_CUDA_CHECK(cudaEventRecord(marks_[slot], context_.stream));
  }
  void wait_mark(int slot) override {
    if (slot >= 0 && slot < kMaxMarks && marks_[slot])
      SY_CUDA_CHECK(cudaEventSynchronize(marks_[slot]));
  }
  void* alloc_host(size_t bytes) override {
    void* host = nullptr;
    if (cudaMallocHost(&host, std::max<size_t>(bytes, 64)) != cudaSuccess) {
      cudaGetLastError();
      return nullptr;
    }
    return host;
  }
  void free_host(void* host) override {
    if (host) SY_CUDA_CHECK(cudaFreeHost(host));
  }
  void fill_i32(Tensor& dst, int32_t value) override {
    launch_fill_i32(dst.ptr<int32_t>(), static_cast<int64_t>(dst.nbytes() / 4), value, context_.stream);
  }

  // Matmuls, norms and MoE kernels already serve these families; the features below are the
  // attention and rope options of Mixtral, OLMoE, Qwen2-MoE, gpt-oss and GLM (attention.cu,
  // elementwise.cu), Qwen3.5's DeltaNet and gated attention (linear_attention.cu) and
  // DeepSeek-V3's MLA (latent_attention.cu); FP8 checkpoints are dequantised at load.
  bool supports(BackendFeature feature) const override {
    switch (feature) {
      case BackendFeature::kSlidingWindow:
      case BackendFeature::kSigmoidGatedAdd:
      case BackendFeature::kAttentionSinks:
      case BackendFeature::kScaledRope:
      case BackendFeature::kPartialRotary:
      case BackendFeature::kMxfp4Weights:  // U8 blocks and scales copied as they are
      case BackendFeature::kMxfp4Experts:  // cuda-modular reads them (cuda-fused refuses MXFP4)
      case BackendFeature::kLatentAttention:  // kv_lora <= 1024, rope <= 256, nope <= 512
                                              // (latent_attention_supported)
      case BackendFeature::kGatedAttention:
      case BackendFeature::kGatedDeltaNet:  // head dims <= 1024, conv kernel <= 8
                                            // (delta_net_supported)
      case BackendFeature::kFp8BlockWeights:  // dequantised on the host, copied as bf16
        return true;
      default:
        return false;
    }
  }

  bool supports_graphs() const override { return true; }
  void clear_graphs() override {
    for (auto& [key, exec] : graphs_) cudaGraphExecDestroy(exec);
    graphs_.clear();
  }
  void run_graph(uint64_t key, const std::function<void()>& body) override {
    auto found = graphs_.find(key);
    if (found == graphs_.end()) {
      capturing_ = true;
      SY_CUDA_CHECK(cudaStreamBeginCapture(context_.stream, cudaStreamCaptureModeThreadLocal));
      body();
      cudaGraph_t graph = nullptr;
      SY_CUDA_CHECK(cudaStreamEndCapture(context_.stream, &graph));
      capturing_ = false;
      cudaGraphExec_t exec = nullptr;
      SY_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
      SY_CUDA_CHECK(cudaGraphDestroy(graph));
      found = graphs_.emplace(key, exec).first;
    }
    SY_CUDA_CHECK(cudaGraphLaunch(found->second, context_.stream));
  }

  void embedding(const Tensor& table, const Tensor& ids, Tensor& out) override {
    launch_embedding(table.ptr<__nv_bfloat16>(), ids.ptr<int32_t>(), ids.numel(), table.dim(1), out.ptr<float>(),
                     context_.stream);
  }
  void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) override {
    const int64_t width = weight.numel();
    launch_rms_norm(x.ptr<float>(), nullptr, weight.ptr<float>(), x.numel() / width, width, eps, out.ptr<float>(),
                    context_.stream);
  }
  void add_rms_norm(Tensor& x, const Tensor& delta, const Tensor& weight, float eps, Tensor& out) override {
    const int64_t width = weight.numel();
    launch_rms_norm(x.ptr<float>(), delta.ptr<float>(), weight.ptr<float>(), x.numel() / width, width, eps,
                    out.ptr<float>(), context_.stream);
  }
  void add2_rms_norm(Tensor& x, const Tensor& earlier, const Tensor& delta, const Tensor& weight,
                     float eps, Tensor& out) override {
    const int64_t width = weight.numel();
    launch_rms_norm(x.ptr<float>(), delta.ptr<float>(), weight.ptr<float>(), x.numel() / width,
                    width, eps, out.ptr<float>(), context_.stream, earlier.ptr<float>());
  }
  void matmul(const Tensor& x, const Tensor& weight, const Tensor* bias, Tensor& out) override {
    const int64_t in = weight.dim(1), out_features = weight.dim(0), rows = x.numel() / in;
    if (rows == 0) return;
    if (skip_matmul_ && rows <= kGemvMaxRows && out_features < 65536) return;
    if (gemm_takes(rows, in, out_features))
      return gemm(bf16_rows(x, rows, in), rows, in, weight, bias, out);
    // The GEMV, a warp per output summing its row in a fixed order whatever the rows beside it.
    // Batch-invariant mode sends it only the output widths the GEMM does not take (a shared
    // expert's sigmoid gate: 1), in chunks; otherwise it takes every step of few rows, the bias
    // added in its epilogue (the same f32 sum as add_bias after it).
    for (int64_t first = 0; first < rows; first += kGemvMaxRows) {
      const GemvPart part{weight.ptr<__nv_bfloat16>(), out.ptr<float>() + first * out_features,
                          out_features, bias && bias->data ? bias->ptr<float>() : nullptr};
      launch_gemv_parts(x.ptr<float>() + first * in, std::min(kGemvMaxRows, rows - first), in,
                        &part, 1, context_.stream);
    }
  }
  // Whether a matmul of these shapes goes to the GEMM (else the GEMV). (Rows whose width is not a
  // multiple of 8, tiny test models' expert widths, go to the GEMM.)
  bool gemm_takes(int64_t rows, int64_t in, int64_t out_features) const {
    if (in % 8 != 0) return true;
    return invariant_ ? out_features % 8 == 0 : rows > kGemvMaxRows;
  }
  // x's rows rounded to bf16 (the GEMM's operand) in the matmul scratch.
  const __nv_bfloat16* bf16_rows(const Tensor& x, int64_t rows, int64_t in) {
    if (rows * in > matmul_scratch_elems_)
      cuda_fail("matmul", "step larger than reserved", __FILE__, __LINE__);
    auto* x_bf16 = static_cast<__nv_bfloat16*>(matmul_scratch_);
    launch_f32_to_bf16(x.ptr<float>(), rows * in, x_bf16, context_.stream);
    return x_bf16;
  }
  // out[rows, out] = x[rows, in] W^T (+ bias) from bf16 rows. Batch-invariant: our GEMM (fixed k
  // order, no split-K) for every row count, so a row's result is the same in any step.
  void gemm(const __nv_bfloat16* x_bf16, int64_t rows, int64_t in, const Tensor& weight,
            const Tensor* bias, Tensor& out) {
    const int64_t out_features = weight.dim(0);
    if (invariant_) {
      launch_dense_gemm(x_bf16, rows, in, weight.ptr<__nv_bfloat16>(), out_features,
                        out.ptr<float>(), static_cast<int32_t*>(dense_plan_), context_.stream);
    } else {
      // Row-major out[rows, out] = x[rows, in] * W[out, in]^T is column-major C[out, rows] =
      // W'^T * x' with W' = W as column-major [in, out].
      const float alpha = 1.0f, beta = 0.0f;
      SY_CUBLAS_CHECK(cublasGemmEx(context_.cublas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(out_features),
                                   static_cast<int>(rows), static_cast<int>(in), &alpha, weight.data, CUDA_R_16BF,
                                   static_cast<int>(in), x_bf16, CUDA_R_16BF, static_cast<int>(in), &beta, out.data,
                                   CUDA_R_32F, static_cast<int>(out_features), CUBLAS_COMPUTE_32F,
                                   CUBLAS_GEMM_DEFAULT));
    }
    if (bias && bias->data)
      launch_add_bias(out.ptr<float>(), bias->ptr<float>(), rows, out_features, context_.stream);
  }
  // A part's bias, if any, as the GEMV epilogue takes it: f32, one per output feature.
  static bool bias_ok(const MatmulPart& part) {
    return !(part.bias && part.bias->data) ||
           (part.bias->dtype == DType::kF32 && part.bias->numel() == part.weight->dim(0));
  }
  static const float* bias_of(const MatmulPart& part) {
    return part.bias && part.bias->data ? part.bias->ptr<float>() : nullptr;
  }
  void matmul_parts(const Tensor& x, const std::vector<MatmulPart>& parts) override {
    // Small steps: one GEMV launch over every part (the weights' rows back to back).
    const int64_t in = parts.empty() ? 0 : parts[0].weight->dim(1);
    const int64_t rows = in > 0 ? x.numel() / in : 0;
    bool one_launch = !invariant_ && rows > 0 && rows <= kGemvMaxRows && in % 8 == 0 &&
                      parts.size() <= static_cast<size_t>(kGemvMaxParts);
    GemvPart gemv[kGemvMaxParts];
    for (size_t p = 0; one_launch && p < parts.size(); ++p) {
      const MatmulPart& part = parts[p];
      one_launch = part.weight->dim(1) == in && part.weight->dtype == DType::kBF16 && bias_ok(part);
      gemv[p] = {part.weight->ptr<__nv_bfloat16>(), part.out->ptr<float>(), part.weight->dim(0),
                 bias_of(part)};
    }
    if (one_launch)
      return launch_gemv_parts(x.ptr<float>(), rows, in, gemv, static_cast<int>(parts.size()),
                               context_.stream);
    // Large steps: x rounded to bf16 once for every part's GEMM (not once a part).
    bool shared_rows = rows > 0;
    for (const MatmulPart& part : parts)
      shared_rows = shared_rows && part.weight->dim(1) == in &&
                    part.weight->dtype == DType::kBF16 && gemm_takes(rows, in, part.weight->dim(0));
    if (!shared_rows) return Backend::matmul_parts(x, parts);
    const __nv_bfloat16* x_bf16 = bf16_rows(x, rows, in);
    for (const MatmulPart& part : parts) gemm(x_bf16, rows, in, *part.weight, part.bias, *part.out);
  }
  bool norm_matmul_parts(const Tensor& x, const Tensor* delta, const Tensor& weight, float eps,
                         const std::vector<MatmulPart>& parts) override {
    // One row (batch-1 decode), bf16 parts (f32 biases added in the epilogue) over a width the
    // fused GEMV takes, pointers aligned as launch_rms_norm's vector path needs (the unfused path
    // it must equal).
    const int64_t in = weight.numel();
    if (no_norm_fusion_ || invariant_) return false;  // SY_NO_NORM_FUSION=1 (experiments): the unfused ops
    if (x.numel() != in || !norm_gemv_supported(in) || parts.empty() ||
        parts.size() > static_cast<size_t>(kGemvMaxParts))
      return false;
    if (!aligned16(x.data) || !aligned16(weight.data) ||
        (delta && (!aligned16(delta->data) || delta->numel() != in)))
      return false;
    GemvPart gemv[kGemvMaxParts];
    for (size_t p = 0; p < parts.size(); ++p) {
      const MatmulPart& part = parts[p];
      if (part.weight->dim(1) != in || part.weight->dtype != DType::kBF16 || !bias_ok(part))
        return false;
      gemv[p] = {part.weight->ptr<__nv_bfloat16>(), part.out->ptr<float>(), part.weight->dim(0),
                 bias_of(part)};
    }
    if (skip_norm_matmul_) return true;
    launch_norm_gemv_parts(x.ptr<float>(), delta ? delta->ptr<float>() : nullptr, weight.ptr<float>(), eps, in, gemv,
                           static_cast<int>(parts.size()), context_.stream);
    return true;
  }
  void add_inplace(Tensor& x, const Tensor& y) override {
    launch_add(x.ptr<float>(), y.ptr<float>(), x.numel(), context_.stream);
  }
  void add_sigmoid_gated(Tensor& out, const Tensor& y, const Tensor& gate_logit) override {
    const int64_t rows = out.dim(0);
    if (rows == 0) return;
    launch_add_sigmoid_gated(out.ptr<float>(), y.ptr<float>(), gate_logit.ptr<float>(), rows, out.numel() / rows,
                             context_.stream);
  }
  void add_shared_expert_down(Tensor& gate, const Tensor& up, const Tensor& down_proj,
                              const Tensor* gate_logit, Tensor& scratch, Tensor& out) override {
    // Decode steps: one GEMV (silu·mul as it loads, the gated add in its epilogue).
    const int64_t in = down_proj.dim(1), rows = in > 0 ? gate.numel() / in : 0;
    if (invariant_ || skip_matmul_ || rows == 0 || rows > kGemvMaxRows || in % 8 != 0 ||
        down_proj.dtype != DType::kBF16)
      return Backend::add_shared_expert_down(gate, up, down_proj, gate_logit, scratch, out);
    launch_shared_down_gemv(gate.ptr<float>(), up.ptr<float>(), rows, in,
                            down_proj.ptr<__nv_bfloat16>(), down_proj.dim(0),
                            gate_logit ? gate_logit->ptr<float>() : nullptr, out.ptr<float>(),
                            context_.stream);
  }
  void silu_mul(const Tensor& gate, const Tensor& up, Tensor& out) override {
    launch_silu_mul(gate.ptr<float>(), up.ptr<float>(), out.numel(), out.ptr<float>(), context_.stream);
  }
  void rope(Tensor& x, const AttentionBatch& batch, const RopeSpec& spec) override {
    const int rotary = static_cast<int>(rotary_dims(spec, x.dim(2)));
    launch_rope(x.ptr<float>(), batch.positions.ptr<int32_t>(), x.dim(0), x.dim(1), x.dim(2), rotary,
                make_rope_table(spec.theta, rotary, spec.inv_freq, spec.attention_factor), context_.stream);
  }
  void write_kv(const Tensor& k, const Tensor& v, Tensor& k_cache, Tensor& v_cache,
                const AttentionBatch& batch) override {
    launch_write_kv(k.ptr<float>(), v.ptr<float>(), k_cache.ptr<__nv_bfloat16>(), v_cache.ptr<__nv_bfloat16>(),
                    batch.slot_mapping.ptr<int32_t>(), k.dim(0), static_cast<int>(k.dim(1)),
                    static_cast<int>(k.dim(2)), context_.stream);
  }
  // The dims RoPE turns: the spec's (partial rotary) or the whole head.
  static int64_t rotary_dims(const RopeSpec& spec, int64_t head_dim) {
    return spec.head_dim > 0 ? std::min(spec.head_dim, head_dim) : head_dim;
  }
  static QkvPrepParams prep_params(Tensor& q, Tensor& k, const Tensor& v, const Tensor* q_norm, const Tensor* k_norm,
                                   float eps, const AttentionBatch& batch, const RopeSpec& spec, Tensor& k_cache,
                                   Tensor& v_cache) {
    QkvPrepParams p;
    p.q = q.ptr<float>();
    p.k = k.ptr<float>();
    p.v = v.ptr<float>();
    p.q_norm = q_norm && q_norm->data ? q_norm->ptr<float>() : nullptr;
    p.k_norm = k_norm && k_norm->data ? k_norm->ptr<float>() : nullptr;
    p.eps = eps;
    p.positions = batch.positions.ptr<int32_t>();
    p.slot_mapping = batch.slot_mapping.ptr<int32_t>();
    p.k_cache = k_cache.ptr<__nv_bfloat16>();
    p.v_cache = v_cache.ptr<__nv_bfloat16>();
    p.tokens = q.dim(0);
    p.heads = static_cast<int>(q.dim(1));
    p.kv_heads = static_cast<int>(k.dim(1));
    p.head_dim = static_cast<int>(q.dim(2));
    p.theta = spec.theta;
    p.inv_freq = spec.inv_freq;
    p.attention_factor = spec.attention_factor;
    return p;
  }
  AttentionParams attention_params(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                                   const AttentionBatch& batch, float scale, Tensor& out) const {
    AttentionParams p;
    p.q = q.ptr<float>();
    p.k_cache = k_cache.ptr<__nv_bfloat16>();
    p.v_cache = v_cache.ptr<__nv_bfloat16>();
    p.positions = batch.positions.ptr<int32_t>();
    p.token_seq = batch.token_seq.ptr<int32_t>();
    p.block_tables = batch.block_tables.ptr<int32_t>();
    p.block_table_stride = static_cast<int>(batch.block_tables.dim(1));
    p.block_size = batch.block_size;
    p.tokens = q.dim(0);
    p.heads = static_cast<int>(q.dim(1));
    p.kv_heads = static_cast<int>(k_cache.dim(1));
    p.head_dim = static_cast<int>(q.dim(2));
    p.scale = scale;
    p.sliding_window = static_cast<int>(batch.sliding_window);
    p.batch_invariant = invariant_;
    if (batch.sinks && batch.sinks->data) {
      if (batch.sinks->dtype != DType::kF32 || batch.sinks->numel() != p.heads)
        cuda_fail("attention", "sinks must be f32 [heads] (loaded as a vector)", __FILE__, __LINE__);
      p.sinks = batch.sinks->ptr<float>();
    }
    p.out = out.ptr<float>();
    p.max_query_len = std::max<int64_t>(batch.max_query_len, 1);
    p.max_context_len = batch.max_context_len;
    if (p.max_query_len == 1 && p.tokens > attention_decode_tokens_)
      cuda_fail("attention", "decode step larger than reserved", __FILE__, __LINE__);
    return p;
  }
  void qk_norm_rope_write_kv(Tensor& q, Tensor& k, const Tensor& v, const Tensor* q_norm, const Tensor* k_norm,
                             float eps, const AttentionBatch& batch, const RopeSpec& spec, Tensor& k_cache,
                             Tensor& v_cache) override {
    if (rotary_dims(spec, q.dim(2)) != q.dim(2))  // partial rotary: the composition of the three ops
      return Backend::qk_norm_rope_write_kv(q, k, v, q_norm, k_norm, eps, batch, spec, k_cache, v_cache);
    launch_qk_norm_rope_write_kv(prep_params(q, k, v, q_norm, k_norm, eps, batch, spec, k_cache, v_cache),
                                 context_.stream);
  }
  Status supports_shape(const LatentShape& shape) const override {
    if (latent_attention_supported(static_cast<int>(shape.kv_lora_rank), static_cast<int>(shape.nope),
                                   static_cast<int>(shape.rope), static_cast<int>(shape.v_dim)))
      return Status::ok();
    return Status::errorf(
        "multi-head latent attention (kv_lora_rank {}, qk_nope_head_dim {}, qk_rope_head_dim {}, "
        "v_head_dim {}) "
        "is outside what the CUDA kernels take (an even kv_lora_rank <= 1024, an even "
        "qk_rope_head_dim <= 256, "
        "their sum <= 1152, qk_nope_head_dim <= 512, v_head_dim <= 1024)",
        shape.kv_lora_rank, shape.nope, shape.rope, shape.v_dim);
  }
  Status supports_shape(const LinearShape& shape) const override {
    if (shape.key_heads > 0 && shape.value_heads % shape.key_heads == 0 &&
        delta_net_supported(static_cast<int>(shape.key_head_dim), static_cast<int>(shape.value_head_dim),
                            static_cast<int>(shape.kernel)))
      return Status::ok();
    return Status::errorf(
        "gated DeltaNet ({} key / {} value heads of {} / {}, conv kernel {}) is outside what the CUDA kernel "
        "takes (value heads a multiple of key heads, head dims <= 1024 with a key_head_dim x value_head_dim "
        "state that fits shared memory, conv kernel <= 8)",
        shape.key_heads, shape.value_heads, shape.key_head_dim, shape.value_head_dim, shape.kernel);
  }
  // DeepSeek-V3's multi-head latent attention, absorbed (latent_attention.cu).
  void latent_attention(Tensor& q, Tensor& kv_latent, const Tensor& kv_norm, float eps,
                        const Tensor& kv_b_proj, const LatentShape& shape,
                        const AttentionBatch& batch, const RopeSpec& rope, Tensor& cache,
                        float scale, Tensor& out) override {
    if (kv_norm.dtype != DType::kF32 || kv_b_proj.dtype != DType::kBF16 ||
        cache.dtype != DType::kBF16)
      cuda_fail("latent_attention", "kv_norm must be f32, kv_b_proj and the cache bf16", __FILE__,
                __LINE__);
    LatentParams p;
    p.q = q.ptr<float>();
    p.kv_latent = kv_latent.ptr<float>();
    p.kv_norm = kv_norm.ptr<float>();
    p.kv_b_proj = kv_b_proj.ptr<__nv_bfloat16>();
    p.cache = cache.ptr<__nv_bfloat16>();
    p.positions = batch.positions.ptr<int32_t>();
    p.token_seq = batch.token_seq.ptr<int32_t>();
    p.slot_mapping = batch.slot_mapping.ptr<int32_t>();
    p.block_tables = batch.block_tables.ptr<int32_t>();
    p.block_table_stride = static_cast<int>(batch.block_tables.dim(1));
    p.block_size = batch.block_size;
    p.out = out.ptr<float>();
    p.tokens = q.dim(0);
    p.heads = static_cast<int>(q.dim(1));
    p.kv_lora = static_cast<int>(shape.kv_lora_rank);
    p.nope = static_cast<int>(shape.nope);
    p.rope = static_cast<int>(shape.rope);
    p.v_dim = static_cast<int>(shape.v_dim);
    p.interleave = shape.interleave;
    p.eps = eps;
    p.scale = scale;
    p.scratch = latent_scratch_;
    p.scratch_bytes = latent_scratch_bytes_;
    p.sm_count = context_.sm_count;
    launch_latent_prep(p, make_rope_table(rope.theta, p.rope, rope.inv_freq, rope.attention_factor),
                       context_.stream);
    const int64_t T = p.tokens;
    if (latent_expand_.group == 0 || batch.max_query_len < kLatentExpandMinQueries ||
        !batch.host_positions || !batch.host_token_seq ||
        static_cast<int64_t>(batch.host_positions->size()) != T ||
        static_cast<int64_t>(batch.host_token_seq->size()) != T) {
      launch_latent_absorbed(p, 0, T, context_.stream);
      return;
    }
    // Runs of one sequence's consecutive positions: long ones expanded (tensor cores), the
    // tokens between them absorbed.
    int64_t absorbed_from = 0;
    for (const SequenceRun& run : sequence_runs(*batch.host_positions, *batch.host_token_seq)) {
      const bool padding = run.seq < 0 || run.context < run.count;  // a negative first position
      if (padding || run.count < kLatentExpandMinQueries ||
          !latent_expand_fits(p, run.context, latent_expand_))
        continue;
      launch_latent_absorbed(p, absorbed_from, run.first - absorbed_from, context_.stream);
      launch_latent_expanded(p, run.first, run.count, run.seq, run.context, latent_expand_,
                             context_.cublas, context_.stream);
      absorbed_from = run.first + run.count;
    }
    launch_latent_absorbed(p, absorbed_from, T - absorbed_from, context_.stream);
  }
  // Qwen3.5's token mixers (linear_attention.cu). Gated attention: the query split from its
  // gate, then the usual q/k norm + (partial) rope + cache write and attention, then the gate.
  void gated_attention(const Tensor& q_gate, Tensor& q, Tensor& k, const Tensor& v,
                       const Tensor& q_norm, const Tensor& k_norm, float eps,
                       const AttentionBatch& batch, const RopeSpec& rope, Tensor& k_cache,
                       Tensor& v_cache, float scale, Tensor& out) override {
    const int64_t rows = q.dim(0) * q.dim(1), head_dim = q.dim(2);
    launch_split_query(q_gate.ptr<float>(), rows, head_dim, q.ptr<float>(), context_.stream);
    qk_norm_rope_write_kv(q, k, v, &q_norm, &k_norm, eps, batch, rope, k_cache, v_cache);
    attention(q, k_cache, v_cache, batch, scale, out);
    launch_sigmoid_gate(q_gate.ptr<float>(), rows, head_dim, out.ptr<float>(), context_.stream);
  }
  void gated_delta_net(const Tensor& qkv, const Tensor& z, const Tensor& b, const Tensor& a,
                       const LinearWeights& weights, const LinearShape& shape, float eps,
                       const AttentionBatch& batch, const LinearState& state,
                       Tensor& out) override {
    if (weights.conv1d->dtype != DType::kBF16 || weights.a_log->dtype != DType::kF32 ||
        weights.dt_bias->dtype != DType::kF32 || weights.norm->dtype != DType::kF32)
      cuda_fail("gated_delta_net",
                "conv1d must be bf16 and A_log, dt_bias, norm f32 (as load_weight makes them)",
                __FILE__, __LINE__);
    DeltaNetParams p;
    p.qkv = qkv.ptr<float>();
    p.z = z.ptr<float>();
    p.b = b.ptr<float>();
    p.a = a.ptr<float>();
    p.conv_w = weights.conv1d->ptr<__nv_bfloat16>();
    p.a_log = weights.a_log->ptr<float>();
    p.dt_bias = weights.dt_bias->ptr<float>();
    p.norm = weights.norm->ptr<float>();
    p.positions = batch.positions.ptr<int32_t>();
    p.token_seq = batch.token_seq.ptr<int32_t>();
    p.state_read = state.read.ptr<int32_t>();
    p.state_write = state.write.ptr<int32_t>();
    p.conv_state = state.conv->ptr<float>();
    p.recurrent = state.recurrent->ptr<float>();
    p.out = out.ptr<float>();
    p.tokens = qkv.dim(0);
    p.max_query_len = batch.max_query_len;
    p.seqs = static_cast<int>(state.read.numel());
    p.key_heads = static_cast<int>(shape.key_heads);
    p.value_heads = static_cast<int>(shape.value_heads);
    p.key_head_dim = static_cast<int>(shape.key_head_dim);
    p.value_head_dim = static_cast<int>(shape.value_head_dim);
    p.kernel = static_cast<int>(shape.kernel);
    p.eps = eps;
    if (p.tokens * p.conv_dim() <= conv_scratch_elems_)
      p.conv_out = conv_scratch_;  // (else: recurrent)
    launch_gated_delta_net(p, context_.stream);
  }
  void attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const AttentionBatch& batch,
                 float scale, Tensor& out) override {
    if (skip_attention_) return;
    launch_attention(attention_params(q, k_cache, v_cache, batch, scale, out), attention_scratch_,
                     attention_arrivals_, context_.stream);
  }
  bool qk_prep_attention(Tensor& q, Tensor& k, const Tensor& v, const Tensor* q_norm, const Tensor* k_norm, float eps,
                         const AttentionBatch& batch, const RopeSpec& rope, Tensor& k_cache, Tensor& v_cache,
                         float scale, Tensor& out) override {
    if (std::max<int64_t>(batch.max_query_len, 1) != 1 || q.dim(0) == 0 ||
        batch.sliding_window > 0 || rotary_dims(rope, q.dim(2)) != q.dim(2))
      return false;
    // SY_NO_PREP_FUSION=1 (experiments) and batch invariance: the two-kernel path.
    if (no_prep_fusion_ || invariant_) return false;
    if (skip_attention_) return true;
    return launch_prep_attention(prep_params(q, k, v, q_norm, k_norm, eps, batch, rope, k_cache, v_cache),
                                 attention_params(q, k_cache, v_cache, batch, scale, out), attention_scratch_,
                                 attention_arrivals_, context_.stream);
  }
  void gather_rows(const Tensor& x, const Tensor& rows, Tensor& out) override {
    launch_gather_rows(x.ptr<float>(), rows.ptr<int32_t>(), rows.numel(), x.numel() / x.dim(0), out.ptr<float>(),
                       context_.stream);
  }
  void sample(const Tensor& logits, const std::vector<SamplingRow>& rows, std::vector<SampledToken>& out) override {
    check_not_capturing("sample");
    sampler_.sample(logits, rows, out);
  }
  void sample_async(const Tensor& logits, const std::vector<SamplingRow>& rows,
                    std::vector<SampledToken>& out) override {
    check_not_capturing("sample");
    sampler_.sample(logits, rows, out, /*wait=*/false);
  }
  void score_tokens(const Tensor& logits, const std::vector<int32_t>& targets, int top_k,
                    std::vector<SampledToken>& out) override {
    check_not_capturing("score_tokens");
    sampler_.score(logits, targets, top_k, out);
  }
  void register_kernels(moe::ExpertsKernelRegistry& registry) override {
    registry.add(make_cuda_modular_kernel(context_));
    registry.add(make_cuda_fused_kernel(context_));
  }

 private:
  // The largest step cuda-fused runs under --moe-kernel auto (crossover: BENCHMARKS.md).
  static constexpr int64_t kFusedMaxTokens = 8;
  // MLA: a sequence with at least this many query tokens in a step is expanded (tensor cores)
  // rather than absorbed (CUDA cores, whose cost grows with its query tokens x context), for
  // contexts up to kLatentExpandContext (the scratch: ~29 KB per context row for 16 heads of
  // 128 + 64 with latent 512, so 16,384 rows ~ 0.5 GB).
  static constexpr int64_t kLatentExpandMinQueries = 32;
  static constexpr int64_t kLatentExpandContext = 16384;

  void check_not_capturing(const char* what) const {
    if (capturing_) cuda_fail(what, "host transfer while recording a graph", __FILE__, __LINE__);
  }

  Tensor alloc_like(const Tensor& like) {
    Tensor tensor = like;
    tensor.data = nullptr;
    void* data = nullptr;
    if (cudaMalloc(&data, std::max<size_t>(tensor.nbytes(), 16)) != cudaSuccess) {
      cudaGetLastError();
      return tensor;
    }
    tensor.data = data;
    return tensor;
  }

  // Weights on the device: vectors (norms, biases) as f32, matrices as bf16. Fills `converted`
  // when the host bytes need converting (left empty when they can be copied as they are).
  static Result<DType> convert_weight(const Tensor& host, std::vector<uint8_t>& converted, bool probe_only = false,
                                      int rank_of_result = -1) {
    converted.clear();
    if (host.dtype == DType::kU8) return DType::kU8;  // MXFP4 blocks and scales: bytes as stored
    const bool vector = (rank_of_result >= 0 ? rank_of_result : host.rank) <= 1;
    const DType target = vector ? DType::kF32 : DType::kBF16;
    if (host.dtype != DType::kBF16 && host.dtype != DType::kF32 && host.dtype != DType::kF16)
      return Status::errorf("cuda backend: weight dtype {} is not supported", dtype_name(host.dtype));
    if (probe_only || host.dtype == target) return target;
    const int64_t n = host.numel();
    converted.resize(static_cast<size_t>(n) * dtype_size(target));
    auto read = [&](int64_t i) -> float {
      switch (host.dtype) {
        case DType::kBF16: return bf16_to_f32(host.ptr<uint16_t>()[i]);
        case DType::kF16: return f16_to_f32(host.ptr<uint16_t>()[i]);
        default: return host.ptr<float>()[i];
      }
    };
    if (target == DType::kF32) {
      float* dst = reinterpret_cast<float*>(converted.data());
      for (int64_t i = 0; i < n; ++i) dst[i] = read(i);
    } else {
      uint16_t* dst = reinterpret_cast<uint16_t*>(converted.data());
      for (int64_t i = 0; i < n; ++i) dst[i] = f32_to_bf16(read(i));
    }
    return target;
  }

  const bool invariant_;         // --batch-invariant
  void* dense_plan_ = nullptr;  // launch_dense_gemm's row plan (batch-invariant only)
  CudaContext context_;
  CudaSampler sampler_;
  std::string device_name_;
  StepLimits limits_;
  void* matmul_scratch_ = nullptr;
  int64_t matmul_scratch_elems_ = 0;
  void* attention_scratch_ = nullptr;
  float* latent_scratch_ = nullptr;  // latent_attention.cu's (StepLimits::latent_*)
  // The chunked DeltaNet's conv outputs (StepLimits::linear_conv_dim).
  float* conv_scratch_ = nullptr;
  int64_t conv_scratch_elems_ = 0;
  LatentExpandScratch latent_expand_;  // its expanded prefill path (group 0: not reserved)
  size_t latent_scratch_bytes_ = 0;
  int* attention_arrivals_ = nullptr;
  size_t attention_scratch_bytes_ = 0;
  int64_t attention_decode_tokens_ = 0;
  std::unordered_map<uint64_t, cudaGraphExec_t> graphs_;
  bool capturing_ = false;
  cudaEvent_t marks_[kMaxMarks] = {};  // record_mark / wait_mark
  // Experiment knobs (read once): SY_NO_NORM_FUSION=1, SY_NO_PREP_FUSION=1 run the unfused ops.
  const bool no_norm_fusion_ = env_flag("SY_NO_NORM_FUSION"),
             no_prep_fusion_ = env_flag("SY_NO_PREP_FUSION");
  const bool skip_attention_ = skip_op("attention"), skip_matmul_ = skip_op("matmul"),
             skip_norm_matmul_ = skip_op("norm_matmul");
};

}  // namespace
}  // namespace sy::backend::cuda

namespace sy::backend {

Result<std::unique_ptr<Backend>> make_cuda_backend(const CudaBackendOptions& options) {
  int count = 0;
  cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0)
    return Status::error(ErrorCode::kUnavailable,
                         fmt::format("--device cuda: no CUDA device is available ({})",
                                     status != cudaSuccess ? cudaGetErrorString(status) : "0 devices"));
  if (options.device_index < 0 || options.device_index >= count)
    return Status::errorf("--device cuda: device index {} out of range (found {})", options.device_index, count);
  return std::unique_ptr<Backend>(std::make_unique<cuda::CudaBackend>(options.device_index, options.batch_invariant));
}

}  // namespace sy::backend
