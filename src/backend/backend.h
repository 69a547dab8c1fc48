// Backend: the operations the decoder's forward pass needs, on buffers the backend owns, each
// batched over the step's tokens. The CPU backend is the reference; a CUDA backend implements
// the same interface. Within a step nothing returns to the host except through download().
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "moe/experts_kernel.h"
#include "tensor/tensor.h"
#include "util/status.h"

namespace sy::backend {

// Where each of the step's tokens sits in the paged KV cache, uploaded once per step.
struct AttentionBatch {
  Tensor positions;     // [T] int32: the token's position in its sequence
  Tensor token_seq;     // [T] int32: which of the step's sequences it belongs to
  Tensor slot_mapping;  // [T] int32: KV slot written for this token (block * block_size + offset)
  Tensor block_tables;  // [S, max_blocks_per_seq] int32
  int block_size = 16;
  // Host-side facts about the step (kernel choice): the most query tokens of one sequence (1 =
  // pure decode) and the longest context. A graph-recorded step must not depend on the second.
  int64_t max_query_len = 0;
  int64_t max_context_len = 0;
  // Host copies of positions and token_seq (nullptr where the caller has none): a backend may
  // split a prefill step by sequence with them. A graph-recorded step must not read them.
  // (Pointers, not spans: the CUDA files compile as C++17.)
  const std::vector<int32_t>* host_positions = nullptr;
  const std::vector<int32_t>* host_token_seq = nullptr;
  // The layer's attention window (set per layer by the decoder): 0 attends to every earlier
  // position; W > 0 only to positions p with position - p < W (transformers' sliding window).
  // Only backends that report BackendFeature::kSlidingWindow read it.
  int64_t sliding_window = 0;
  // The layer's attention sinks (gpt-oss), [heads] f32 or bf16, or nullptr: one learned logit per
  // head joins each query's softmax denominator (weights over the keys then sum to < 1). Only
  // backends that report BackendFeature::kAttentionSinks read it.
  const Tensor* sinks = nullptr;
};

// Operations added for architectures beyond Qwen3-MoE. A backend lists those it implements; the
// decoder refuses at start-up (kUnsupported, naming the feature) a model that needs one it lacks.
enum class BackendFeature {
  kSlidingWindow,    // attention() honours AttentionBatch::sliding_window
  kSigmoidGatedAdd,  // add_sigmoid_gated (Qwen2-MoE's shared expert gate)
  kAttentionSinks,   // attention() honours AttentionBatch::sinks (gpt-oss)
  kScaledRope,       // rope() honours RopeSpec::inv_freq and attention_factor (YaRN)
  kMxfp4Weights,     // load_weight() keeps U8 tensors (MXFP4 blocks and scales) as they are
  kLatentAttention,  // latent_attention (DeepSeek-V3's multi-head latent attention)
  kGatedDeltaNet,    // gated_delta_net (Qwen3.5's linear-attention layers)
  kGatedAttention,   // gated_attention (Qwen3.5's output-gated, partially rotary attention)
  kPartialRotary,    // rope() turns only the first RopeSpec::head_dim dims of wider heads (GLM)
  kFp8BlockWeights,  // FP8 block-quantised checkpoints load (dequantised to bf16 at load)
  // The MoE kernels read gpt-oss's experts as stored (transposed-interleaved bf16; MXFP4 too
  // with kMxfp4Weights). Without it the loader restacks them to bf16 kStacked (ExpertSpec::stored).
  kInterleavedExperts,
  // The MoE kernels read MXFP4 experts (kMxfp4Interleaved) as stored, blocks and scales, but not
  // the transposed-interleaved bf16 layout (that one is restacked). Needs kMxfp4Weights.
  kMxfp4Experts,
};
inline const char* backend_feature_name(BackendFeature feature) {
  switch (feature) {
    case BackendFeature::kSlidingWindow: return "sliding-window attention";
    case BackendFeature::kSigmoidGatedAdd: return "sigmoid-gated shared expert";
    case BackendFeature::kAttentionSinks: return "attention sinks";
    case BackendFeature::kScaledRope: return "YaRN RoPE (scaled frequencies and attention factor)";
    case BackendFeature::kMxfp4Weights: return "MXFP4 expert weights";
    case BackendFeature::kLatentAttention: return "multi-head latent attention (MLA)";
    case BackendFeature::kGatedDeltaNet:
      return "gated DeltaNet linear attention";
    case BackendFeature::kGatedAttention:
      return "gated attention (sigmoid output gate, partial rotary)";
    case BackendFeature::kPartialRotary:
      return "partial rotary embedding (partial_rotary_factor)";
    case BackendFeature::kInterleavedExperts:
      return "gpt-oss's interleaved expert layouts as stored";
    case BackendFeature::kMxfp4Experts:
      return "MXFP4 experts read as stored by the MoE kernels";
    case BackendFeature::kFp8BlockWeights:
      return "FP8 block-quantised weights (weight_scale_inv)";
  }
  return "unknown feature";
}

struct RopeSpec {
  double theta = 10000.0;
  // The dims RoPE rotates and its frequencies span (theta^(-2i/head_dim)): every dim of a head,
  // or (BackendFeature::kPartialRotary) the first head_dim dims of wider heads, rotate-half
  // over those dims (pairs (i, i + head_dim/2)), the rest passed through (transformers'
  // partial_rotary_factor).
  int64_t head_dim = 0;
  // Scaled RoPE (YaRN; BackendFeature::kScaledRope): the head_dim / 2 inverse frequencies (host
  // memory, f32, as transformers computes them) replacing theta's, and the factor cos and sin
  // are multiplied by. nullptr / 1: plain RoPE of theta.
  const float* inv_freq = nullptr;
  float attention_factor = 1.0f;
};

// One step's sampling parameters, a row per sampled sequence (host side; a device backend
// uploads what it needs).
struct SamplingRow {
  float temperature = 1.0f;
  float top_p = 1.0f;
  int top_k = -1;
  float min_p = 0.0f;
  uint64_t seed = 0;
  uint64_t draw_index = 0;  // which random draw of this request: same seed+index -> same token
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;
  const std::vector<std::pair<int32_t, float>>* logit_bias = nullptr;
  const std::vector<int32_t>* prompt_tokens = nullptr;  // for the repetition penalty
  const std::vector<int32_t>* output_tokens = nullptr;  // for all penalties
  std::vector<int32_t> banned_tokens;                   // e.g. EOS before min_tokens
  int logprobs = -1;  // top-k alternatives to report (-1: none)
};

struct SampledToken {
  int32_t token_id = 0;
  float logprob = 0.0f;                          // under the raw model distribution
  std::vector<std::pair<int32_t, float>> top;    // (id, logprob) descending, `logprobs` entries
};

// The largest step the engine will run, fixed at start-up: the backend sizes its step workspace
// (scratch of kernels, graphs) from it once, so no step allocates and addresses stay stable.
struct StepLimits {
  int64_t max_tokens = 0;          // tokens per step
  int64_t max_seqs = 0;            // sequences per step
  int64_t max_blocks_per_seq = 0;  // KV blocks of the longest sequence
  int64_t max_logits_rows = 0;     // rows of logits per step
  // The model's shapes that size kernels' scratch.
  int64_t vocab_size = 0;
  int64_t num_heads = 0;
  int64_t head_dim = 0;
  int64_t max_feature_dim = 0;  // widest matmul input (hidden, heads * head_dim, MLP widths)
  // Multi-head latent attention's kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim and
  // v_head_dim (0: no latent layers), and the longest context (max_blocks_per_seq x block size).
  int64_t latent_kv_lora = 0, latent_rope = 0, latent_nope = 0, latent_v_dim = 0;
  int64_t max_context = 0;
  int64_t linear_conv_dim = 0;  // linear attention's conv channels (0: no linear layers)
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual Device device() const = 0;
  // The dtype the paged KV cache is kept in (CPU: f32; CUDA: bf16).
  virtual DType kv_cache_dtype() const { return DType::kF32; }
  // Memory the backend's device has free now (CPU: available physical memory).
  virtual int64_t free_memory_bytes() const {
    const long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : int64_t{4} << 30;
  }
  // All of the device's memory (CPU: physical memory).
  virtual int64_t total_memory_bytes() const {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : int64_t{4} << 30;
  }
  // A monolithic MoE kernel for small steps that `--moe-kernel auto` uses up to this many
  // tokens (crossover measured per backend); empty: none.
  virtual std::string small_batch_kernel() const { return ""; }
  virtual int64_t small_batch_max_tokens() const { return 0; }
  // Whether a row's results (logits, routes) never depend on the step's other rows.
  virtual bool batch_invariant() const { return false; }
  // The device queue the backend's work goes to (a cudaStream_t on CUDA), for a communicator
  // whose collectives must be ordered with that work; nullptr on the CPU.
  virtual void* native_stream() const { return nullptr; }
  virtual bool supports(BackendFeature feature) const {
    (void)feature;
    return false;
  }
  // Called once before the first step.
  virtual Status reserve(const StepLimits& limits) {
    (void)limits;
    return Status::ok();
  }

  // Buffers owned by the backend, valid until free_buffer or the backend's end.
  virtual Tensor alloc(DType dtype, std::initializer_list<int64_t> shape) = 0;
  virtual void free_buffer(Tensor& tensor) = 0;
  // Weights: makes a checkpoint tensor (host memory, e.g. an mmap) usable by this backend. The
  // CPU backend keeps BF16/F32 as views and converts F16 to F32.
  virtual Result<Tensor> load_weight(const Tensor& host) = 0;
  // Stacks equally shaped host tensors into one [parts, ...] backend tensor (per-expert
  // checkpoint tensors -> the stacked expert layout).
  virtual Result<Tensor> load_stacked(const std::vector<Tensor>& host_parts) = 0;
  // The same, into a tensor an earlier load_weight/load_stacked of the same shape returned (a
  // weight update in place: no second copy of the model). kUnsupported where weights are not
  // backend-owned copies (the CPU keeps views of the mapped checkpoint).
  virtual bool updates_weights_in_place() const { return false; }
  virtual Status load_weight_into(const Tensor& host, Tensor& dst) {
    (void)host, (void)dst;
    return Status::error(ErrorCode::kUnsupported, "this backend does not update weights in place");
  }
  virtual Status load_stacked_into(const std::vector<Tensor>& host_parts, Tensor& dst) {
    (void)host_parts, (void)dst;
    return Status::error(ErrorCode::kUnsupported, "this backend does not update weights in place");
  }
  // Deterministic pseudo-random weights (--random-weights): offset + uniform [-scale, scale)
  // from (seed, element index) (backend/random_fill.h), the same numbers on every backend.
  virtual void fill_random(Tensor& dst, uint64_t seed, float scale, float offset) = 0;
  // The same for a U8 tensor's bytes: random_fill_byte(seed, i, lo, span), filled where the
  // tensor lives (gpt-oss-20b's MXFP4 experts are ~12 GB of bytes: ~45 s on one host thread).
  virtual void fill_random_bytes(Tensor& dst, uint64_t seed, int lo, float span) = 0;
  // upload/download are synchronous. download_async may return before the copy is done: `host`
  // (from alloc_host) is valid after the next synchronize().
  virtual void upload(const void* host, Tensor& dst) = 0;
  virtual void download(const Tensor& src, void* host) = 0;
  virtual void download_async(const Tensor& src, void* host) { download(src, host); }
  virtual void synchronize() {}
  // dst = src on the device, in stream order (same byte count; views of backend buffers). The
  // default goes through the host; backends with their own memory copy directly.
  virtual void copy(const Tensor& src, Tensor& dst) {
    std::vector<char> staged(src.nbytes());
    download(src, staged.data());
    upload(staged.data(), dst);
  }
  // download_async of some columns: bytes [begin, begin + width) of each of `rows` rows of
  // `row_bytes` in src, to the same offsets of `host` (laid out like src). This default copies
  // all of src (correct, not lean).
  virtual void download_columns_async(const Tensor& src, void* host, int64_t rows,
                                      int64_t row_bytes, int64_t begin, int64_t width) {
    (void)rows, (void)row_bytes, (void)begin, (void)width;
    download_async(src, host);
  }
  // Points in the enqueued work the host can wait for while the work behind them still runs
  // (a step's routes are on the host before its logits and sampling are done; a prefill step's
  // first layers' routes before its last layers are). kMaxMarks slots: record_mark(slot)
  // replaces that slot's last mark; wait_mark(slot) returns once everything enqueued before it
  // is done (outside graph recording only). Synchronous backends: nothing to do.
  static constexpr int kMaxMarks = 8;
  virtual void record_mark(int slot) { (void)slot; }
  virtual void wait_mark(int slot) { (void)slot; }
  virtual void* alloc_host(size_t bytes) {  // pinned on devices that have it
    return std::aligned_alloc(64, (std::max<size_t>(bytes, 64) + 63) / 64 * 64);
  }
  virtual void free_host(void* host) { std::free(host); }
  virtual void fill_i32(Tensor& dst, int32_t value) = 0;

  // Graphs: runs `body` (device work only, on buffers with stable addresses) and, where the
  // backend supports it, records it under `key` the first time and replays the record after.
  virtual bool supports_graphs() const { return false; }
  virtual void clear_graphs() {}
  virtual void run_graph(uint64_t key, const std::function<void()>& body) {
    (void)key;
    body();
  }

  // out[t] = table[ids[t]]; out is f32 [T, hidden].
  virtual void embedding(const Tensor& table, const Tensor& ids, Tensor& out) = 0;
  // Row-wise RMSNorm over the last dimension: out = x / rms(x) * weight.
  virtual void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) = 0;
  // out[r, o] = sum_i x[r, i] * weight[o, i] (+ bias[o]); batch-invariant per row.
  virtual void matmul(const Tensor& x, const Tensor& weight, const Tensor* bias, Tensor& out) = 0;
  // Several projections of one input (q, k and v of attention): out_i = matmul(x, weight_i,
  // bias_i). A device backend may run them as one launch; the results are those of matmul.
  struct MatmulPart {
    const Tensor* weight = nullptr;
    const Tensor* bias = nullptr;  // or nullptr
    Tensor* out = nullptr;
  };
  virtual void matmul_parts(const Tensor& x, const std::vector<MatmulPart>& parts) {
    for (const MatmulPart& part : parts) matmul(x, *part.weight, part.bias, *part.out);
  }
  // The residual add and input norm fused into the projections that consume them: out_i =
  // matmul(rms_norm(x + delta) * weight, weight_i), delta optional, x and the normed rows left
  // unwritten (the caller adds delta into x later). Results equal add_rms_norm then
  // matmul_parts bitwise. Returns false, having done nothing, where the backend does not fuse
  // this shape; the caller then runs the two ops.
  virtual bool norm_matmul_parts(const Tensor& x, const Tensor* delta, const Tensor& weight, float eps,
                                 const std::vector<MatmulPart>& parts) {
    (void)x, (void)delta, (void)weight, (void)eps, (void)parts;
    return false;
  }
  virtual void add_inplace(Tensor& x, const Tensor& y) = 0;
  // The residual step: x += delta, then out = rms_norm(x) (fused on devices).
  virtual void add_rms_norm(Tensor& x, const Tensor& delta, const Tensor& weight, float eps, Tensor& out) {
    add_inplace(x, delta);
    rms_norm(x, weight, eps, out);
  }
  // The same with an earlier delta still pending (the decoder's post-attention step after a
  // feed-forward output it did not add yet): x += earlier, x += delta, out = rms_norm(x). A
  // device backend runs it as one launch, the same adds in the same order.
  virtual void add2_rms_norm(Tensor& x, const Tensor& earlier, const Tensor& delta,
                             const Tensor& weight, float eps, Tensor& out) {
    add_inplace(x, earlier);
    add_rms_norm(x, delta, weight, eps, out);
  }
  // out[t] += sigmoid(gate_logit[t]) * y[t] for rows t; gate_logit is [T, 1] f32
  // (BackendFeature::kSigmoidGatedAdd; the decoder never calls it on a backend without it).
  virtual void add_sigmoid_gated(Tensor& out, const Tensor& y, const Tensor& gate_logit) {
    (void)out, (void)y, (void)gate_logit;
    std::fprintf(stderr, "backend %s: add_sigmoid_gated is not implemented\n", name().c_str());
    std::abort();
  }
  // out = silu(gate) * up, element-wise.
  virtual void silu_mul(const Tensor& gate, const Tensor& up, Tensor& out) = 0;
  // A shared expert's end, its gate and up projections done: out[t] += s_t * (silu(gate[t]) *
  // up[t]) down_proj^T with s_t = sigmoid(gate_logit[t]) (gate_logit nullptr: 1). Here as
  // silu_mul into gate, matmul into scratch [T, out width], add_sigmoid_gated (add_inplace);
  // a device backend may fuse them (decode steps: one GEMV) into the same results bitwise. gate
  // may be overwritten.
  virtual void add_shared_expert_down(Tensor& gate, const Tensor& up, const Tensor& down_proj,
                                      const Tensor* gate_logit, Tensor& scratch, Tensor& out) {
    silu_mul(gate, up, gate);
    matmul(gate, down_proj, nullptr, scratch);
    if (gate_logit)
      add_sigmoid_gated(out, scratch, *gate_logit);
    else
      add_inplace(out, scratch);
  }
  // Rotary embedding (rotate-half) on x [T, heads, head_dim] at the batch's positions, over the
  // first spec.head_dim dims of each head (all of them unless partial rotary).
  virtual void rope(Tensor& x, const AttentionBatch& batch, const RopeSpec& spec) = 0;
  // Writes this step's K/V ([T, kv_heads, head_dim]) into the layer's cache
  // ([slots, kv_heads, head_dim]) at batch.slot_mapping; a slot of -1 (padding) is skipped.
  virtual void write_kv(const Tensor& k, const Tensor& v, Tensor& k_cache, Tensor& v_cache,
                        const AttentionBatch& batch) = 0;
  // The attention block between projections and attention: per-head RMSNorm of q and k (each
  // norm optional), RoPE on both, then k and v into the cache. q and k are updated in place,
  // exactly as the composition of rms_norm, rope and write_kv below (fused on devices).
  virtual void qk_norm_rope_write_kv(Tensor& q, Tensor& k, const Tensor& v, const Tensor* q_norm,
                                     const Tensor* k_norm, float eps, const AttentionBatch& batch,
                                     const RopeSpec& spec, Tensor& k_cache, Tensor& v_cache) {
    if (q_norm) rms_norm(q, *q_norm, eps, q);
    if (k_norm) rms_norm(k, *k_norm, eps, k);
    rope(q, batch, spec);
    rope(k, batch, spec);
    write_kv(k, v, k_cache, v_cache, batch);
  }
  // Causal attention of q [T, heads, head_dim] over positions 0..position of each token's own
  // sequence (the last batch.sliding_window of them where the backend supports windows);
  // out [T, heads * head_dim]. GQA by heads / kv_heads.
  virtual void attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                         const AttentionBatch& batch, float scale, Tensor& out) = 0;
  // qk_norm_rope_write_kv then attention as one op, where the device fuses them (decode
  // steps): bitwise the same out and caches, q and k not updated in place. Returns false,
  // having done nothing, where it does not; the caller then runs the two ops.
  virtual bool qk_prep_attention(Tensor& q, Tensor& k, const Tensor& v, const Tensor* q_norm, const Tensor* k_norm,
                                 float eps, const AttentionBatch& batch, const RopeSpec& rope, Tensor& k_cache,
                                 Tensor& v_cache, float scale, Tensor& out) {
    (void)q, (void)k, (void)v, (void)q_norm, (void)k_norm, (void)eps, (void)batch, (void)rope, (void)k_cache,
        (void)v_cache, (void)scale, (void)out;
    return false;
  }
  // Multi-head latent attention (BackendFeature::kLatentAttention), after the projections:
  // kv_latent [T, kv_lora + rope] (kv_a_proj's output) has its latent RMSNormed by kv_norm and
  // its k_pe roped; that row goes into the layer's cache [slots, 1, kv_lora + rope] at
  // batch.slot_mapping. q [T, heads, nope + rope] has its last `rope` dims roped (pairs (2i,
  // 2i+1) with `interleave`, else (i, i + rope/2)), both in place. Then causal attention of
  // each head over its sequence's cached rows, k = [kv_b_k(latent) | k_pe] and v = kv_b_v(latent)
  // per head (kv_b_proj [heads * (nope + v_dim), kv_lora]: each head's nope k rows, then its
  // v_dim v rows); out [T, heads * v_dim].
  struct LatentShape {
    int64_t kv_lora_rank = 0, nope = 0, rope = 0, v_dim = 0;
    bool interleave = true;
  };
  virtual void latent_attention(Tensor& q, Tensor& kv_latent, const Tensor& kv_norm, float eps,
                                const Tensor& kv_b_proj, const LatentShape& shape,
                                const AttentionBatch& batch, const RopeSpec& rope, Tensor& cache,
                                float scale, Tensor& out) {
    (void)q, (void)kv_latent, (void)kv_norm, (void)eps, (void)kv_b_proj, (void)shape, (void)batch,
        (void)rope, (void)cache, (void)scale, (void)out;
  }
  // Gated full attention (BackendFeature::kGatedAttention), after the projections: q_gate
  // [T, heads, 2 * head_dim] holds per head the query, then its output gate. The query goes to
  // q [T, heads, head_dim]; q and k [T, kv_heads, head_dim] are RMSNormed per head (q_norm,
  // k_norm), the first rope.head_dim dims of each head roped (rotate-half over those dims, the
  // rest passed through: partial rotary), k and v written to the cache; then attention() and out
  // [T, heads * head_dim] multiplied by sigmoid(gate).
  virtual void gated_attention(const Tensor& q_gate, Tensor& q, Tensor& k, const Tensor& v,
                               const Tensor& q_norm, const Tensor& k_norm, float eps,
                               const AttentionBatch& batch, const RopeSpec& rope, Tensor& k_cache,
                               Tensor& v_cache, float scale, Tensor& out) {
    (void)q_gate, (void)q, (void)k, (void)v, (void)q_norm, (void)k_norm, (void)eps, (void)batch,
        (void)rope, (void)k_cache, (void)v_cache, (void)scale, (void)out;
  }
  // Gated DeltaNet (BackendFeature::kGatedDeltaNet; model/description.h LinearAttentionSpec),
  // after the input projections: qkv [T, conv_dim], z [T, value_dim], b and a [T, value_heads];
  // out [T, value_dim] (before out_proj). Each sequence's tokens run in order through its
  // states: conv_state [buffers, conv_dim, kernel - 1] (the conv inputs of its last kernel - 1
  // tokens, oldest first) and recurrent [buffers, value_heads, key_head_dim, value_head_dim]. A
  // step reads sequence s's states from buffer state.read[s] and writes them to state.write[s]
  // (another buffer: a step that fails and reruns reads what the first attempt read); a sequence
  // whose first token in the step is at position 0 starts from zeros.
  struct LinearShape {
    int64_t key_heads = 0, value_heads = 0, key_head_dim = 0, value_head_dim = 0, kernel = 0;
  };
  struct LinearWeights {
    const Tensor* conv1d = nullptr;   // [conv_dim, 1, kernel]
    const Tensor* a_log = nullptr;    // [value_heads]
    const Tensor* dt_bias = nullptr;  // [value_heads]
    const Tensor* norm = nullptr;     // [value_head_dim]
  };
  struct LinearState {
    Tensor read, write;  // [S] int32 buffer indices per sequence of the step (-1: padding)
    Tensor* conv = nullptr;
    Tensor* recurrent = nullptr;
  };
  virtual void gated_delta_net(const Tensor& qkv, const Tensor& z, const Tensor& b, const Tensor& a,
                               const LinearWeights& weights, const LinearShape& shape, float eps,
                               const AttentionBatch& batch, const LinearState& state, Tensor& out) {
    (void)qkv, (void)z, (void)b, (void)a, (void)weights, (void)shape, (void)eps, (void)batch,
        (void)state, (void)out;
  }
  // Whether the kernels take a model's latent / linear attention shapes (a backend whose kernels
  // have limits: an error naming them, checked when the model loads, never a failed launch).
  virtual Status supports_shape(const LatentShape& shape) const {
    (void)shape;
    return Status::ok();
  }
  virtual Status supports_shape(const LinearShape& shape) const {
    (void)shape;
    return Status::ok();
  }
  // out[r] = x[rows[r]].
  virtual void gather_rows(const Tensor& x, const Tensor& rows, Tensor& out) = 0;
  // Samples one token per logits row and its logprobs.
  virtual void sample(const Tensor& logits, const std::vector<SamplingRow>& rows,
                      std::vector<SampledToken>& out) = 0;
  // The same, but may return before `out` is filled: the next synchronize() fills it (the caller
  // keeps `out` alive until then; `rows` are read before this returns).
  virtual void sample_async(const Tensor& logits, const std::vector<SamplingRow>& rows,
                            std::vector<SampledToken>& out) {
    sample(logits, rows, out);
  }
  // Log-softmax logprob of `targets[r]` in logits row r, plus top-k alternatives.
  virtual void score_tokens(const Tensor& logits, const std::vector<int32_t>& targets, int top_k,
                            std::vector<SampledToken>& out) = 0;

  // The MoE kernels this backend offers (registered at construction, explicit list).
  virtual void register_kernels(moe::ExpertsKernelRegistry& registry) = 0;
};

struct CpuBackendOptions {
  int num_threads = 0;  // 0 = all cores
};
std::unique_ptr<Backend> make_cpu_backend(const CpuBackendOptions& options);

struct BackendOptions {
  Device device = Device::kCpu;
  int num_threads = 0;  // CPU threads (0 = all cores)
  int device_index = 0;
  // --batch-invariant: every row's result independent of the step's other rows (the CPU always
  // is; CUDA then runs one GEMM and one attention tiling for every step size, no split-K).
  bool batch_invariant = false;
};
// The backend for `options.device`; CUDA fails with a clear message when this build has none.
Result<std::unique_ptr<Backend>> make_backend(const BackendOptions& options);
Result<Device> parse_device(const std::string& text);  // "cpu" | "cuda"

}  // namespace sy::backend
