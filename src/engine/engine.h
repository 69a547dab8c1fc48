// Engine: the thread-safe front of the step loop (schedule -> forward -> sample -> deliver).
// The HTTP layer and `generate` submit requests here; events come back on the engine thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dist/communicator.h"
#include "dist/mpi_communicator.h"
#include "dist/sharding.h"
#include "moe/experts_kernel.h"
#include "tensor/tensor.h"
#include "moe/route_log.h"
#include "util/status.h"

namespace sy::engine {

using RequestId = uint64_t;

struct SamplingParams {
  float temperature = 1.0f;  // 0 = greedy
  float top_p = 1.0f;
  int top_k = -1;            // -1 = off
  float min_p = 0.0f;
  std::optional<uint64_t> seed;  // same request + seed -> same tokens, alone or batched
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;
  std::vector<std::pair<int32_t, float>> logit_bias;
  int max_tokens = 16;
  int min_tokens = 0;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  int logprobs = -1;         // -1 none; k >= 0: chosen token's logprob plus top-k alternatives
  int prompt_logprobs = -1;  // likewise, for every prompt position after the first
};

struct GenerationRequest {
  std::vector<int32_t> prompt_ids;
  SamplingParams sampling;
  // Forced routes for input positions 0 .. replay->rows-1 (rows <= prompt length). Validated by
  // submit: shape (rows, num_hidden_layers, top_k), ids < num_experts, no duplicate in a row.
  std::optional<moe::RouteArray> replay;
  bool return_routes = false;  // deliver the route log with the final event
  // Deliver each event's new route rows (Event::new_routes) instead of the whole log at the end.
  bool stream_routes = false;
  // Deliver the gating weights with the routes (RouteArray::weights). Needs a kernel that
  // captures them (ModelInfo::route_weights); such a request computes its whole prompt (no
  // prefix-cache hit), so every weight is the one its own forward pass multiplied by.
  bool return_route_weights = false;
};

struct TopLogprob {
  int32_t token_id;
  float logprob;
};
struct TokenLogprob {
  int32_t token_id;
  float logprob;
  std::vector<TopLogprob> top;  // descending
};

enum class FinishReason { kNone, kStop, kLength, kAbort, kError };

struct Event {
  RequestId request_id = 0;
  std::vector<int32_t> new_token_ids;     // tokens sampled since the previous event
  std::vector<TokenLogprob> new_logprobs;  // parallel to new_token_ids when logprobs >= 0
  // First event only, when prompt_logprobs >= 0: one entry per prompt position 1..P-1.
  std::vector<TokenLogprob> prompt_logprobs;
  int64_t cached_prompt_tokens = 0;  // first event: prompt tokens served by the prefix cache
  bool finished = false;
  FinishReason finish_reason = FinishReason::kNone;
  std::optional<int32_t> stop_token_id;  // the matched stop/eos token, if that ended it
  // Final event, when return_routes: rows 0 .. N-2 over all hidden layers (DESIGN.md). Shared
  // and immutable: the event reaches its consumer on the engine thread, and a copy of a long
  // request's routes there (2.4 MB for Qwen3-30B-A3B at 1.5k tokens) was capture's cost.
  std::shared_ptr<const moe::RouteArray> routes;
  // Every event, when stream_routes: the rows computed since the previous event (first_row set;
  // the final event's piece ends at N-2, so the pieces in order are the whole log).
  std::shared_ptr<const moe::RouteArray> new_routes;
  Status error;  // finish_reason == kError: e.g. a route-capture failure naming layer and kernel
};

// Returned by the callback: kStop ends the request now (a stop string matched); the engine then
// delivers the final event (finish_reason kStop, routes included) in the same step.
enum class Continuation { kContinue, kStop };
using EventCallback = std::function<Continuation(const Event&)>;

struct ModelInfo {
  std::string architecture;
  int64_t vocab_size = 0;
  int64_t max_model_len = 0;
  int64_t num_hidden_layers = 0;
  std::vector<int> moe_layers;
  int64_t num_experts = 0;
  int64_t top_k = 0;
  std::vector<int32_t> eos_token_ids;
  // Gating weights can be returned (capture on and every MoE kernel in use writes them); when
  // not, why not (a sentence for the 400).
  bool route_weights = false;
  std::string route_weights_unavailable;
};

struct EngineMetrics {
  int64_t running_requests = 0;
  int64_t waiting_requests = 0;
  int64_t kv_blocks_total = 0;
  int64_t kv_blocks_used = 0;
  int64_t kv_blocks_cached = 0;  // unreferenced but holding reusable prefix content
  int64_t kv_blocks_free = 0;
  int64_t prefix_cache_queries_tokens = 0;
  int64_t prefix_cache_hits_tokens = 0;
  int64_t prompt_tokens_total = 0;      // prompt tokens admitted
  int64_t prompt_tokens_computed = 0;   // prompt tokens that went through the forward pass
  int64_t generation_tokens_total = 0;
  int64_t preemptions_total = 0;
  int64_t state_snapshots_taken = 0;     // linear-attention states kept for prefix hits
  int64_t state_snapshots_restored = 0;  // prefix hits that resumed from one
  int64_t route_capture_errors_total = 0;
  // Route capture (all zero when capture is off).
  int64_t routes_captured_total = 0;  // rows logged from a forward pass (first computation)
  int64_t routes_replayed_total = 0;  // rows computed with forced routes (replay, recompute)
  int64_t routes_poisoned_total = 0;  // rows a kernel left unwritten (their requests failed)
  // Engine-thread time: every step (schedule to delivered events), and the part of it spent on
  // routes on the host after the device finished (copy and check, route log, expert load), so
  // capture's host cost reads as route_host_seconds_total / step_seconds_total.
  int64_t steps_total = 0;
  double step_seconds_total = 0;
  double route_host_seconds_total = 0;  // route_check + route_log
  double route_check_seconds_total = 0;  // the copy out of pinned memory and the check
  double route_log_seconds_total = 0;    // the route log, weights and expert load
  // Full blocks published into the prefix cache (token, forced and, when capturing, route rows:
  // its difference between capture on and off is the routes' share), capture or not.
  double prefix_publish_seconds_total = 0;
  // Tokens routed to each expert by every forward pass, [moe_layers.size() * num_experts].
  std::vector<int> moe_layers;
  int64_t num_experts = 0;
  std::vector<int64_t> expert_load_tokens;
};

struct EngineConfig {
  std::string model_dir;
  Device device = Device::kCpu;        // --device cpu|cuda
  // --random-weights CONFIG.json: seeded random weights built on the device from this config
  // (model_dir is then the config's folder, for the tokenizer); empty = load the checkpoint.
  std::string random_weights_config;
  uint64_t random_weights_seed = 0;
  bool cuda_graphs = true;             // record decode steps as graphs where the backend can
  // --batch-invariant: a request's tokens and routes never depend on what else is in the step
  // (the CPU always; CUDA runs one GEMM and attention tiling for every step and cuda-modular only).
  bool batch_invariant = false;
  std::string moe_kernel = "auto";
  bool capture_routes = false;        // serve --enable-return-routed-experts / generate --routes-out
  // Sequences and tokens per step (longer prompts are chunked); 0 = the backend's default
  // (StepDefaults: 1024 and 8192 on a GPU, fewer sequences for a model with linear-attention
  // state; 256 and 2048 on the CPU).
  int max_num_seqs = 0;
  int max_num_batched_tokens = 0;
  // Prompt positions scored for prompt_logprobs per step: each is a [vocab] f32 logits row
  // (151936 x 4 B = 0.6 MB for Qwen3), so such prompts are chunked to this many tokens a step.
  int max_prompt_logprob_rows = 256;
  int64_t kv_cache_tokens = 0;        // 0 = from memory (CPU: a quarter of it, at most 1 GiB)
  // --gpu-memory-utilization (0, 1]: the share of the GPU's whole memory this engine may hold
  // (weights, workspace, states, KV cache), as vLLM's flag; 0 = unset: 90% of what is free once
  // the weights are loaded. For an RL trainer sharing the GPU. No effect on the CPU.
  double gpu_memory_utilization = 0.0;
  int block_size_tokens = 16;
  int64_t max_model_len = 0;          // 0 = from config.json
  bool enable_prefix_caching = true;
  // Models with linear attention (Qwen3.5): state snapshots kept for prefix-cache hits, one per
  // cached prompt (the state after its last full block); 0 turns the prefix cache off for them.
  int state_snapshots = 16;
  int max_waiting_requests = 4096;    // beyond this submit fails with kResourceExhausted (429)
  int num_threads = 0;                // 0 = all cores
  bool show_progress = false;         // loading progress on a terminal
  bool require_replay = false;        // the run replays routes (generate --routes-in): guard on it
  // Extra MoE kernels to offer besides the backend's (tests use it for deliberately broken ones).
  std::function<void(moe::ExpertsKernelRegistry&)> register_extra_kernels;

  // Tensor / expert parallel (--tensor-parallel N, --expert-parallel): one process per rank,
  // started by mpirun (`world`); rank 0 runs the engine (scheduler, sampling, HTTP) and sends
  // each step's plan to the others, which run run_engine_follower. The group's collectives go
  // through `communicator` when set (tests: a LocalGroup rank), else one made for the backend
  // (MPI over host memory on the CPU, NCCL on CUDA).
  dist::ParallelConfig parallel;
  dist::MpiWorld world;
  dist::Communicator* communicator = nullptr;
  bool check_routes_agree = false;  // debug: every step, all ranks' routes must be equal
};

class Engine {
 public:
  virtual ~Engine() = default;
  // Validates and queues; the callback is invoked on the engine thread. Errors (prompt too long,
  // token id >= vocab, bad replay, capture/replay unsupported by the kernel) come back here.
  virtual Result<RequestId> submit(GenerationRequest request, EventCallback on_event) = 0;
  // Frees the request's blocks within one step; no further events are delivered.
  virtual void cancel(RequestId id) = 0;
  virtual EngineMetrics metrics() const = 0;
  virtual ModelInfo model_info() const = 0;
  // Loads new weights between steps (same architecture and shapes), pausing admission until the
  // sequences in flight (running or preempted) finish on the old weights, and flushing the
  // prefix cache including routes. On error the old weights stay in service.
  virtual Status update_weights_from_disk(const std::string& model_dir) = 0;
  virtual Status flush_cache() = 0;
  // Stops the engine thread after in-flight requests finish or `timeout_ms` passes.
  virtual void shutdown(int64_t timeout_ms) = 0;
};

// What --max-num-seqs and --max-num-batched-tokens 0 (their defaults) become: vLLM's OpenAI-server
// defaults on its large GPUs, 1,024 sequences and 8,192 tokens a step, on a device backend
// (session 34, H100, gpt-oss-20b 1024/512 x 500: 23,303 total tok/s at 256 sequences, 25,297 at
// 1,024); 256 and 2,048 on the CPU, the reference. A model with linear attention keeps two state
// copies of state_bytes_per_copy a sequence outside the KV cache: on a device its sequences are
// capped (a multiple of 8, at least 8) so that those take at most half of free_bytes, the memory
// left after the weights.
struct StepDefaults {
  Device device;
  int64_t free_bytes;
  int64_t state_bytes_per_copy;
  int max_num_seqs() const;
  int max_num_batched_tokens() const;
};

// The KV cache's bytes on a device. Memory: the device's whole memory, what was free before the
// weights were loaded and what is free now; reserved: the step workspace and per-sequence states
// still to be allocated. Without a utilization: 90% of what is free now less reserved. With one
// (vLLM's --gpu-memory-utilization): the engine's share of the whole memory less what it holds
// already (free before load - free now) and reserved, never more than is free; an error naming the
// flag where that leaves nothing for the cache.
struct DeviceMemory {
  int64_t total = 0;
  int64_t free_before_load = 0;
  int64_t free_now = 0;
  // What the engine holds already (the weights): free before load less free now.
  int64_t held() const { return free_before_load > free_now ? free_before_load - free_now : 0; }
  // What the engine may still take: what is free, or with a utilization at most its share of
  // total less held().
  int64_t available(double utilization) const;
};
Result<int64_t> device_kv_budget(const DeviceMemory& memory, int64_t reserved, double utilization);

// Loads the model and starts the engine thread (on rank 0 of a parallel run).
Result<std::unique_ptr<Engine>> create_engine(const EngineConfig& config);

// Ranks 1..N-1 of a parallel run: loads this rank's shard and runs the forward pass of every
// step rank 0's engine plans, until rank 0 shuts down (returns ok) or a step fails here.
Status run_engine_follower(const EngineConfig& config);

}  // namespace sy::engine
