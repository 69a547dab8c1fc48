// The engine: one thread runs schedule -> forward -> sample -> deliver. Continuous batching with
// caps on sequences and tokens per step, chunked prefill, prefix caching with routes, and
// preemption by recompute (which replays logged routes).
#include "engine/engine.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <future>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_map>

#include "dist/nccl_communicator.h"
#include "dist/shard_model.h"
#include "engine/expert_load.h"
#include "engine/kv_cache.h"
#include "engine/scheduler.h"
#include "engine/sequence.h"
#include "engine/step_plan.h"
#include "model/decoder.h"
#include "moe/router.h"

namespace sy::engine {
namespace {

using Clock = std::chrono::steady_clock;

// The KV cache's size at start-up, and for latent (MLA) layers what expanded per-head K/V would
// take per token: the compression the latent cache buys.
void log_kv_cache(const model::ModelConfig& c, int64_t tokens, size_t dtype_bytes, bool per_rank) {
  const int64_t per_token = c.kv_cache_values_per_token() * static_cast<int64_t>(dtype_bytes);
  std::string latent;
  int64_t expanded = 0;
  for (const model::LayerSpec& layer : c.layers)
    if (layer.attention.latent) {
      const model::LatentAttentionSpec& mla = c.latent_attention;
      expanded +=
          c.num_attention_heads * (mla.qk_nope_head_dim + mla.qk_rope_head_dim + mla.v_head_dim);
    } else if (!layer.attention.linear) {
      expanded += 2 * c.num_key_value_heads * c.head_dim;
    }
  expanded *= static_cast<int64_t>(dtype_bytes);
  if (c.latent_attention.kv_lora_rank > 0 && expanded > 0)
    latent = fmt::format(" (latent attention; expanded K/V would take {} bytes/token, {:.1f}x)",
                         expanded, static_cast<double>(expanded) / static_cast<double>(per_token));
  std::fprintf(stderr, "switchyard: KV cache: %lld tokens, %lld bytes/token%s, %.2f GB%s\n",
               static_cast<long long>(tokens), static_cast<long long>(per_token), latent.c_str(),
               static_cast<double>(tokens * per_token) / 1e9, per_rank ? " per rank" : "");
}

class EngineImpl final : public Engine {
 public:
  ~EngineImpl() override {
    shutdown(0);
    decoder_.reset();
    model_.reset();
    for (Tensor* t : {&gather_index_, &gathered_})
      if (t->data) backend_->free_buffer(*t);
  }

  // follower: a rank > 0 of a parallel run (no engine thread; follow() runs the plan).
  Status init(const EngineConfig& config, bool follower = false) {
    config_ = config;
    follower_ = follower;
    SY_ASSIGN(backend_, backend::make_backend(
                            {config.device, config.num_threads, config.world.local_rank, config.batch_invariant}));
    SY_TRY(join_group());
    backend_->register_kernels(registry_);
    if (config.register_extra_kernels) config.register_extra_kernels(registry_);
    moe::KernelNeeds needs{backend_->device(), config.capture_routes, config.require_replay};
    // Capture needs replay too: a sequence recomputed after preemption replays its logged routes
    // (DESIGN.md), else its KV would come from routes other than the ones it returns. Otherwise a
    // kernel that can replay is preferred so replay requests work; a named kernel is kept as is.
    const bool replay_required = config.require_replay || config.capture_routes;
    needs.replay = replay_required || config.moe_kernel == "auto";
    auto kernel = registry_.select(config.moe_kernel, needs);
    if (!kernel && needs.replay && !replay_required) {
      needs.replay = false;
      kernel = registry_.select(config.moe_kernel, needs);
    }
    if (!kernel && config.capture_routes && !config.require_replay)
      return kernel.status().with_context(
          "route capture needs a kernel that can also replay routes (a sequence recomputed after "
          "preemption replays its logged routes): ");
    if (!kernel) return kernel.status();
    if (config.batch_invariant && !(*kernel)->batch_invariant())
      return Status::errorf("--batch-invariant: MoE kernel {} is not batch-invariant (its work split follows the "
                            "step's size); use auto or a modular kernel",
                            (*kernel)->name());
    kernel_ = *kernel;
    model::KernelChoice kernels{kernel_, nullptr, 0};
    // auto: the backend's small-batch (monolithic) kernel for steps up to its crossover, if it
    // has every capability the large one was chosen for.
    // (Not under --batch-invariant: a request's rows must not change kernels with the step's size.)
    if (config.moe_kernel == "auto" && !backend_->small_batch_kernel().empty() && !config.batch_invariant) {
      moe::KernelNeeds small_needs{backend_->device(), config.capture_routes, kernel_->replays_routes()};
      auto small = registry_.select(backend_->small_batch_kernel(), small_needs);
      if (small) kernels = {kernel_, *small, backend_->small_batch_max_tokens()};
    }
    // Gating weights come back only where every MoE kernel in use writes them.
    for (moe::ExpertsKernel* k : {kernels.large, kernels.small}) {
      if (!k || k->captures_weights() || !weights_unavailable_.empty()) continue;
      weights_unavailable_ = fmt::format(
          "MoE kernel {} does not write gating weights (return_routed_experts_weights); kernels "
          "that do: {}",
          k->name(), weight_kernel_names());
    }
    if (!config.capture_routes)
      weights_unavailable_ =
          "gating weights are captured with the routes: start the server with "
          "--enable-return-routed-experts";
    capture_weights_ = weights_unavailable_.empty();
    if (config.gpu_memory_utilization > 0.0 && backend_->device() == Device::kCpu && !follower)
      std::fprintf(stderr,
                   "switchyard: --gpu-memory-utilization has no effect on the CPU "
                   "(--kv-cache-tokens sizes its cache)\n");
    memory_.free_before_load = backend_->free_memory_bytes();
    memory_.total = backend_->total_memory_bytes();
    // The guard runs before loading, so a refused kernel costs no load time.
    SY_ASSIGN(RankModel loaded, load_rank_model(config.random_weights_config.empty() ? config.model_dir : ""));
    full_model_ = std::move(loaded.full);
    model_ = std::move(loaded.model);
    memory_.free_now =
        backend_->free_memory_bytes();  // (nothing else is allocated before the KV cache)
    const model::ModelConfig& c = model_->config();
    if (config.batch_invariant && backend_->device() == Device::kCuda)
      for (auto [what, width] :
           {std::pair{"hidden_size", c.hidden_size},
            std::pair{"num_attention_heads * head_dim", c.num_attention_heads * c.head_dim},
            std::pair{"num_key_value_heads * head_dim", c.num_key_value_heads * c.head_dim},
            std::pair{"intermediate_size", c.intermediate_size},
            std::pair{"moe_intermediate_size", c.moe_intermediate_size},
            std::pair{"shared_expert_intermediate_size", c.shared_expert_intermediate_size},
            // out_proj's input (output widths that are not multiples of 8 go to a GEMV).
            std::pair{"linear attention value_dim", c.linear_attention.value_dim()},
            std::pair{"vocab_size", c.vocab_size}})
        if (width % 8 != 0)
          return Status::errorf("--batch-invariant on CUDA needs matrix widths that are multiples of 8; {} is {}",
                                what, width);
    config_at_start_ = c;  // shapes never change (weight updates must keep them)
    max_model_len_ = config.max_model_len > 0 ? config.max_model_len : c.max_position_embeddings;
    row_ints_ = c.num_hidden_layers * c.experts_per_token;
    // Linear-attention layers keep per-sequence state, not KV: two buffers per sequence (read,
    // write) and the prefix cache's snapshots of it, beside the KV cache and out of its budget.
    hybrid_ = c.has_linear_attention();
    int64_t linear_layers = 0;
    for (const model::LayerSpec& layer : c.layers) linear_layers += layer.attention.linear ? 1 : 0;
    const int64_t state_bytes_per_copy =
        linear_layers *
        (c.linear_attention.conv_state_values() + c.linear_attention.recurrent_state_values()) * 4;
    SY_TRY(resolve_step_limits(state_bytes_per_copy));
    const int64_t max_rows =
        std::min<int64_t>(config_.max_num_batched_tokens,
                          int64_t{config_.max_num_seqs} + config.max_prompt_logprob_rows);
    backend::StepLimits limits{
        config_.max_num_batched_tokens, config_.max_num_seqs,
        (max_model_len_ + config.block_size_tokens - 1) / config.block_size_tokens, max_rows};
    bool prefix_caching = config.enable_prefix_caching;
    const int snapshots = hybrid_ && prefix_caching ? std::max(config.state_snapshots, 0) : 0;
    if (hybrid_ && prefix_caching && snapshots == 0) {
      prefix_caching = false;
      std::fprintf(
          stderr,
          "switchyard: prefix caching is off for this model: a hit needs a snapshot of its "
          "linear-attention state, and --state-snapshots is 0\n");
    }
    int64_t state_bytes = 0;
    if (hybrid_) {
      state_bytes = (2 * int64_t{config_.max_num_seqs} + snapshots) * state_bytes_per_copy;
      std::fprintf(
          stderr,
          "switchyard: linear-attention state: %.1f MB ((2 x %d sequences + %d snapshots) x "
          "%lld layers)\n",
          static_cast<double>(state_bytes) / 1e6, config_.max_num_seqs, snapshots,
          static_cast<long long>(linear_layers));
    }
    int64_t kv_tokens = config.kv_cache_tokens;
    if (kv_tokens <= 0) {
      const int64_t per_token = c.kv_cache_values_per_token() *
                                static_cast<int64_t>(dtype_size(backend_->kv_cache_dtype()));
      int64_t budget = 0;
      if (backend_->device() == Device::kCpu) {
        // The CPU is the reference, not where rollouts run: 1 GiB (half a million tokens of the
        // tiny model), like the few GiB CPU engines default to. The cache is zero-filled at
        // start, so every GiB here costs a start-up's page faults (seconds under load);
        // --kv-cache-tokens sets more.
        budget = std::min<int64_t>(available_memory_bytes() / 4, int64_t{1} << 30);
      } else {
        // What the device has left after the weights (or the --gpu-memory-utilization share),
        // less room for the step workspace (the largest buffer is the logits, [rows, vocab] f32,
        // held twice), the kernels' scratch and the linear-attention states.
        const int64_t workspace = 2 * max_rows * c.vocab_size * 4 +
                                  int64_t{config_.max_num_batched_tokens} * c.hidden_size * 4 * 24 +
                                  (int64_t{2} << 30);
        SY_ASSIGN(budget, device_kv_budget(memory_, workspace + state_bytes,
                                           config.gpu_memory_utilization));
      }
      kv_tokens = std::clamp<int64_t>(budget / per_token, 4096, int64_t{4} << 20);
    }
    int64_t blocks =
        std::max<int64_t>(2, (kv_tokens + config.block_size_tokens - 1) / config.block_size_tokens);
    decoder_ = std::make_unique<model::Decoder>(*backend_, kernels, config.block_size_tokens);
    decoder_->set_graphs_enabled(config.cuda_graphs);
    decoder_->set_state_snapshots(snapshots);
    if (comm_) {
      // Rank 0's plan names KV slots: every rank holds the same number of blocks (the fewest).
      SY_ASSIGN(blocks, agree_on_min(blocks));
      decoder_->set_all_reduce([comm = comm_](Tensor& partial) {
        return comm->all_reduce_sum(partial.data, partial.numel(), partial.dtype);
      });
    }
    // (Rank 0 only: a parallel run's followers print nothing; the figures are per rank.)
    if (!follower_)
      log_kv_cache(c, blocks * config.block_size_tokens, dtype_size(backend_->kv_cache_dtype()),
                   comm_ != nullptr);
    SY_TRY(decoder_->allocate(c, blocks, limits));
    kv_ = std::make_unique<KvCache>(
        blocks, config.block_size_tokens,
        RoutePacking(c.num_hidden_layers, c.experts_per_token, c.num_experts, c.moe_layers()));
    scheduler_ = std::make_unique<Scheduler>(
        SchedulerConfig{config_.max_num_seqs, config_.max_num_batched_tokens,
                        config.max_prompt_logprob_rows, prefix_caching, config.capture_routes,
                        row_ints_, hybrid_, snapshots},
        *kv_);
    eos_ids_ = c.eos_token_ids;
    metrics_.moe_layers = c.moe_layers();
    metrics_.num_experts = c.num_experts;
    if (config.capture_routes) {
      metrics_.expert_load_tokens.assign(
          metrics_.moe_layers.size() * static_cast<size_t>(c.num_experts), 0);
      if (!follower_)
        load_counter_ = std::make_unique<ExpertLoadCounter>(
            metrics_.moe_layers, c.num_experts, c.num_hidden_layers, c.experts_per_token);
    }
    if (!follower_) thread_ = std::thread([this] { loop(); });
    return Status::ok();
  }

  // A follower's life: run each planned step's forward pass (the all-reduces meet rank 0's),
  // reload weights when told, return when rank 0 stops. A step that fails here failed the same
  // way on rank 0 (same inputs, same checks), which then reschedules: carry on.
  Status follow() {
    for (;;) {
      SY_ASSIGN(PlanMessage message, receive_plan(*comm_));
      switch (message.kind) {
        case PlanKind::kStop:
          return Status::ok();
        case PlanKind::kReloadWeights:
          (void)reload_rank_model(message.model_dir);  // rank 0 reports the verdict
          break;
        case PlanKind::kStep: {
          model::StepOutputs out;
          Status status = decoder_->forward(*model_, message.step, out);
          if (status) status = decoder_->finish_step(*model_, out);
          if (message.step.capture_routes && config_.check_routes_agree) {
            Status agree = dist::check_routes_agree(*comm_, out.routes, model_->config().num_hidden_layers,
                                                    model_->config().experts_per_token);
            if (status) status = agree;
          }
          if (!status)
            std::fprintf(stderr, "rank %d: step failed: %s\n", comm_->rank(), status.message().c_str());
          break;
        }
      }
    }
  }

  Result<RequestId> submit(GenerationRequest request, EventCallback on_event) override {
    SY_TRY(validate(request));
    auto seq = std::make_unique<Sequence>();
    seq->request = std::move(request);
    seq->on_event = std::move(on_event);
    seq->tokens = seq->request.prompt_ids;
    seq->prompt_len = static_cast<int64_t>(seq->tokens.size());
    if (seq->request.replay) {
      // The replay becomes the first rows of the route log: those positions are forced.
      const moe::RouteArray& replay = *seq->request.replay;
      seq->routes.assign(replay.ids.begin(), replay.ids.end());
      seq->route_rows = seq->user_forced_rows = replay.rows;
    }
    std::lock_guard lock(mutex_);
    if (stopping_) return Status::error(ErrorCode::kUnavailable, "engine is shutting down");
    if (static_cast<int64_t>(incoming_.size()) + waiting_count_.load() >= config_.max_waiting_requests)
      return Status::error(ErrorCode::kResourceExhausted,
                           fmt::format("request queue is full ({} waiting)", config_.max_waiting_requests));
    seq->id = next_id_++;
    seq->seed = seq->request.sampling.seed ? *seq->request.sampling.seed : seed_rng_();
    RequestId id = seq->id;
    incoming_.push_back(std::move(seq));
    wake_.notify_one();
    return id;
  }

  void cancel(RequestId id) override {
    std::lock_guard lock(mutex_);
    cancelled_.push_back(id);
    wake_.notify_one();
  }

  EngineMetrics metrics() const override {
    EngineMetrics metrics;
    {
      std::lock_guard lock(metrics_mutex_);
      metrics = metrics_;
    }
    // Every step handed over so far, counted (the counter waits for its thread).
    if (load_counter_) metrics.expert_load_tokens = load_counter_->totals();
    return metrics;
  }

  ModelInfo model_info() const override {
    const model::ModelConfig& c = config_at_start_;
    ModelInfo info;
    info.architecture = c.architecture;
    info.vocab_size = c.vocab_size;
    info.max_model_len = max_model_len_;
    info.num_hidden_layers = c.num_hidden_layers;
    info.moe_layers = c.moe_layers();
    info.num_experts = c.num_experts;
    info.top_k = c.experts_per_token;
    info.eos_token_ids = eos_ids_;
    info.route_weights = capture_weights_;
    info.route_weights_unavailable = weights_unavailable_;
    return info;
  }

  Status update_weights_from_disk(const std::string& model_dir) override {
    return run_on_engine_thread([this, model_dir]() -> Status {
      if (comm_) {
        SY_TRY(send_reload_weights(*comm_, model_dir));
        SY_TRY(reload_rank_model(model_dir));
        backend_->clear_graphs();
        kv_->flush();
        return Status::ok();
      }
      // In place where the backend can (a GPU has no room for a second copy), else a new model.
      if (Status in_place = model_->reload_in_place(model_dir); in_place.code() != ErrorCode::kUnsupported) {
        SY_TRY(in_place);
      } else {
        auto fresh = model::Model::load(model_dir, *backend_);
        if (!fresh) return fresh.status();
        SY_TRY(model_->check_same_shapes(**fresh).with_context(model_dir + ": not the same shapes: "));
        model_ = std::move(fresh).value();
      }
      backend_->clear_graphs();  // recorded steps point at the old weights
      kv_->flush();
      return Status::ok();
    }, /*drain=*/true);
  }

  Status flush_cache() override {
    return run_on_engine_thread([this]() -> Status {
      kv_->flush();
      return Status::ok();
    }, /*drain=*/false);
  }

  void shutdown(int64_t timeout_ms) override {
    {
      std::lock_guard lock(mutex_);
      if (!thread_.joinable()) return;
      stopping_ = true;
      drain_deadline_ = Clock::now() + std::chrono::milliseconds(timeout_ms);
      wake_.notify_all();
    }
    thread_.join();
  }

 private:
  static model::LoadProgress progress_printer(bool show) {
    if (!show || !isatty(STDERR_FILENO)) return {};
    return [](size_t done, size_t total, uint64_t bytes, uint64_t total_bytes) {
      std::fprintf(stderr, "\rloading: %zu/%zu tensors, %.1f/%.1f MB", done, total, bytes / 1e6, total_bytes / 1e6);
      if (done == total) std::fprintf(stderr, "\n");
    };
  }

  // Joins the tensor-parallel group, if the config asks for one.
  Status join_group() {
    const int ranks = config_.parallel.tensor_parallel;
    if (ranks < 1) return Status::errorf("--tensor-parallel must be >= 1, got {}", ranks);
    if (!config_.communicator && config_.world.size != ranks)
      return Status::errorf(
          "--tensor-parallel {} but {} process(es) were started: they must match (mpirun -np {} "
          "switchyard ... --tensor-parallel {})",
          ranks, config_.world.size, ranks, ranks);
    if (ranks == 1) return Status::ok();
    comm_ = config_.communicator;
    if (!comm_) {
      auto made = backend_->device() == Device::kCpu
                      ? dist::make_mpi_communicator(config_.world)
                      : dist::make_nccl_communicator(config_.world, backend_->native_stream());
      if (!made) return made.status();
      owned_comm_ = std::move(made).value();
      comm_ = owned_comm_.get();
    }
    if (comm_->size() != ranks)
      return Status::errorf("--tensor-parallel {} in a group of {} ranks", ranks, comm_->size());
    return Status::ok();
  }

  // This rank's model: the whole checkpoint, or with tensor parallel its shard, cut from the
  // whole model loaded on the host (the CPU backend maps the checkpoint; replicated tensors of
  // the shard are views of it, so `full` lives as long as the shard).
  struct RankModel {
    std::unique_ptr<model::Model> full;
    std::unique_ptr<model::Model> model;
  };
  // model_dir empty: --random-weights.
  Result<RankModel> load_rank_model(const std::string& model_dir) {
    backend::Backend* host = backend_.get();
    if (comm_ && backend_->device() != Device::kCpu) {
      if (!host_backend_) {
        SY_ASSIGN(host_backend_, backend::make_backend({Device::kCpu, config_.num_threads, 0}));
      }
      host = host_backend_.get();
    }
    RankModel loaded;
    if (model_dir.empty()) {
      SY_ASSIGN(loaded.model, model::Model::random(config_.random_weights_config, *host, config_.random_weights_seed));
    } else {
      SY_ASSIGN(loaded.model, model::Model::load(model_dir, *host, progress_printer(config_.show_progress && !follower_)));
    }
    if (!comm_) return loaded;
    loaded.full = std::move(loaded.model);
    SY_ASSIGN(loaded.model, dist::shard_model(*loaded.full, config_.parallel, comm_->rank(), *backend_));
    return loaded;
  }

  // A weight update on every rank: each loads its new shard, then all learn whether every rank
  // did; only then does any rank swap (a rank that failed would otherwise leave a mix).
  Status reload_rank_model(const std::string& model_dir) {
    auto fresh = load_rank_model(model_dir);
    Status status = fresh.status();
    // The whole models carry the checkpoints' shapes (a shard is built from parts).
    if (status)
      status = full_model_->check_same_shapes(*fresh->full).with_context(model_dir + ": not the same shapes: ");
    std::vector<int32_t> failed(static_cast<size_t>(comm_->size()));
    const int32_t mine = status ? 0 : 1;
    SY_TRY(comm_->all_gather(&mine, failed.data(), 1, DType::kI32));
    if (!status) return status;
    for (int r = 0; r < comm_->size(); ++r)
      if (failed[r]) return Status::errorf("rank {} could not load {}; the old weights stay", r, model_dir);
    model_ = std::move(fresh->model);
    full_model_ = std::move(fresh->full);
    return Status::ok();
  }

  DeviceMemory memory_;  // the device's memory at start-up (the KV cache's budget)

  // The smallest of every rank's value (a parallel run's ranks must agree on sizes).
  Result<int64_t> agree_on_min(int64_t value) {
    std::vector<int32_t> all(static_cast<size_t>(comm_->size()));
    const int32_t mine = static_cast<int32_t>(std::min<int64_t>(value, INT32_MAX));
    SY_TRY(comm_->all_gather(&mine, all.data(), 1, DType::kI32));
    return *std::min_element(all.begin(), all.end());
  }

  // --max-num-seqs and --max-num-batched-tokens 0 (their defaults) -> config_ (StepDefaults).
  Status resolve_step_limits(int64_t state_bytes_per_copy) {
    const StepDefaults defaults{backend_->device(),
                                memory_.available(config_.gpu_memory_utilization),
                                state_bytes_per_copy};
    if (config_.max_num_batched_tokens <= 0)
      config_.max_num_batched_tokens = defaults.max_num_batched_tokens();
    if (config_.max_num_seqs > 0) return Status::ok();
    int64_t seqs = defaults.max_num_seqs();
    if (comm_) {
      SY_ASSIGN(seqs, agree_on_min(seqs));
    }
    config_.max_num_seqs = static_cast<int>(seqs);
    if (!follower_)
      std::fprintf(stderr,
                   "switchyard: %d sequences and %d tokens a step at most (--max-num-seqs, "
                   "--max-num-batched-tokens)\n",
                   config_.max_num_seqs, config_.max_num_batched_tokens);
    return Status::ok();
  }

  std::string weight_kernel_names() const {
    std::string names;
    for (const std::string& name : registry_.names(backend_->device())) {
      auto kernel = registry_.select(name, {backend_->device(), false, false});
      if (kernel && (*kernel)->captures_weights()) names += (names.empty() ? "" : ", ") + name;
    }
    return names.empty() ? "none on this device" : names;
  }

  static int64_t available_memory_bytes() {
    long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : int64_t{4} << 30;
  }

  Status validate(const GenerationRequest& request) const {
    const model::ModelConfig& c = config_at_start_;
    const SamplingParams& s = request.sampling;
    const int64_t prompt = static_cast<int64_t>(request.prompt_ids.size());
    if (prompt == 0) return Status::error("prompt must contain at least one token");
    for (int32_t id : request.prompt_ids)
      if (id < 0 || id >= c.vocab_size)
        return Status::errorf("prompt token id {} is out of range [0, {})", id, c.vocab_size);
    if (s.max_tokens < 1) return Status::errorf("max_tokens must be >= 1, got {}", s.max_tokens);
    if (prompt + s.max_tokens > max_model_len_)
      return Status::errorf(
          "This model's maximum context length is {} tokens. However, you requested {} tokens ({} in "
          "the prompt, {} for the completion)",
          max_model_len_, prompt + s.max_tokens, prompt, s.max_tokens);
    for (int32_t id : s.stop_token_ids)
      if (id < 0 || id >= c.vocab_size) return Status::errorf("stop_token_ids entry {} is out of range", id);
    for (auto [id, bias] : s.logit_bias)
      if (id < 0 || id >= c.vocab_size) return Status::errorf("logit_bias token id {} is out of range", id);
    if ((request.return_routes || request.stream_routes) && !config_.capture_routes)
      return Status::error("routed experts were requested but capture is off (start the server with "
                           "--enable-return-routed-experts)");
    if (request.return_route_weights && !capture_weights_)
      return Status::error(ErrorCode::kUnsupported, weights_unavailable_);
    if (request.replay) {
      if (!kernel_->replays_routes())
        return Status::error(ErrorCode::kUnsupported,
                             fmt::format("MoE kernel {} cannot replay routes", kernel_->name()));
      const moe::RouteArray& r = *request.replay;
      if (r.layers != c.num_hidden_layers || r.top_k != c.experts_per_token)
        return Status::errorf("routed_experts_replay must have shape (n, {}, {}), got ({}, {}, {})",
                              c.num_hidden_layers, c.experts_per_token, r.rows, r.layers, r.top_k);
      if (r.rows < 0 || r.rows > prompt)
        return Status::errorf("routed_experts_replay has {} rows; at most the prompt's {} tokens", r.rows, prompt);
      if (static_cast<int64_t>(r.ids.size()) != r.rows * r.layers * r.top_k)
        return Status::error("routed_experts_replay data does not match its shape");
      const moe::RouterSpec spec = c.router_spec();
      const std::vector<int> moe_layers = c.moe_layers();
      for (int64_t row = 0; row < r.rows; ++row)
        for (int layer : moe_layers) {
          Status status = moe::validate_route_row(r.row_ptr(row) + layer * r.top_k, spec);
          if (!status)
            return Status::errorf("routed_experts_replay row {} layer {}: {}", row, layer, status.message());
        }
    }
    return Status::ok();
  }

  // Runs `work` on the engine thread between steps; with drain, once no sequence is in flight
  // (running, or preempted: those finish on the weights they started with).
  Status run_on_engine_thread(std::function<Status()> work, bool drain) {
    auto task = std::make_shared<std::packaged_task<Status()>>(std::move(work));
    auto result = task->get_future();
    {
      std::lock_guard lock(mutex_);
      if (!thread_.joinable() || stopping_) return Status::error(ErrorCode::kUnavailable, "engine is shutting down");
      tasks_.push_back({[task] { (*task)(); }, drain});
      wake_.notify_one();
    }
    return result.get();
  }

  // ---- engine thread ----

  void loop() {
    for (;;) {
      std::vector<std::unique_ptr<Sequence>> incoming;
      std::vector<RequestId> cancelled;
      std::vector<Task> tasks;
      bool stopping;
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] {
          return stopping_ || !incoming_.empty() || !cancelled_.empty() || !tasks_.empty() ||
                 scheduler_->has_work(paused_for_drain()) ||
                 (!pending_tasks_.empty() && !scheduler_->in_flight());
        });
        incoming.swap(incoming_);
        cancelled.swap(cancelled_);
        tasks.swap(tasks_);
        stopping = stopping_;
      }
      for (auto& seq : incoming) scheduler_->add(std::move(seq));
      for (RequestId id : cancelled) scheduler_->remove(id);  // no further events
      for (auto& task : tasks) pending_tasks_.push_back(std::move(task));
      run_ready_tasks();
      if (stopping) {
        if ((!scheduler_->has_running() && !scheduler_->has_waiting()) || Clock::now() >= drain_deadline_) break;
      }
      if (scheduler_->has_work(paused_for_drain())) step();
      publish_metrics();
    }
    for (auto& seq : scheduler_->remove_all()) finish(*seq, FinishReason::kAbort, Status::ok());
    if (comm_) {
      if (Status stop = send_stop(*comm_); !stop)
        std::fprintf(stderr, "engine: could not tell the other ranks to stop: %s\n", stop.message().c_str());
    }
    for (auto& task : pending_tasks_) task.run();
    std::lock_guard lock(mutex_);
    for (auto& task : tasks_) task.run();
    tasks_.clear();
  }

  // Admission pauses while a weight update waits for in-flight sequences to finish.
  bool paused_for_drain() const {
    for (const auto& task : pending_tasks_)
      if (task.drain) return true;
    return false;
  }
  void run_ready_tasks() {
    while (!pending_tasks_.empty()) {
      if (pending_tasks_.front().drain && scheduler_->in_flight()) return;
      Task task = std::move(pending_tasks_.front());
      pending_tasks_.pop_front();
      task.run();
    }
  }

  // What one forward pass over a batch produced, before any sequence is updated.
  struct LogitsUse {
    size_t item;
    int64_t position;
    bool sample;
    bool score;  // prompt_logprobs entry for this position
  };
  struct StepResult {
    std::vector<LogitsUse> logits_uses;
    std::vector<size_t> sample_items, score_uses;
    std::vector<backend::SampledToken> scored, sampled;
    std::vector<int32_t> routes;  // [step tokens, row_ints] when capturing
    std::vector<float> weights;   // likewise, when a sequence of the step asked for weights
    int64_t poisoned_rows = 0;
    double route_host_seconds = 0;  // collect_routes' copy and check
    bool routes_logged = false;     // log_routes ran (while the device finished the step)
  };

  using Scheduled = ScheduledChunk;

  // Engine-thread seconds of one step's host work that capture adds or changes (EngineMetrics).
  struct HostTimes {
    double route_check = 0;     // collect_routes: the copy out of pinned memory and the check
    double route_log = 0;       // log_routes: route log and weights (expert load: its thread)
    double prefix_publish = 0;  // scheduler computed(): full blocks into the prefix cache
  };

  void step() {
    const auto started = Clock::now();
    HostTimes times;
    step_body(times);
    std::lock_guard lock(metrics_mutex_);
    ++metrics_.steps_total;
    metrics_.step_seconds_total += std::chrono::duration<double>(Clock::now() - started).count();
    metrics_.route_host_seconds_total += times.route_check + times.route_log;
    metrics_.route_check_seconds_total += times.route_check;
    metrics_.route_log_seconds_total += times.route_log;
    metrics_.prefix_publish_seconds_total += times.prefix_publish;
  }

  void step_body(HostTimes& times) {
    std::vector<std::unique_ptr<Sequence>> rejected;
    std::vector<Scheduled> batch = scheduler_->schedule(paused_for_drain(), rejected);
    for (auto& seq : rejected)
      finish(*seq, FinishReason::kError,
             Status::error(ErrorCode::kResourceExhausted, "KV cache too small for this request"));
    if (batch.empty()) return;
    StepResult result;
    Status status = run_batch(batch, result, times);
    times.route_check += result.route_host_seconds;
    if (status) {
      apply_batch(batch, result, times);
      // The weights buffer goes back for the next step (the route rows went to the expert-load
      // counter, which hands them back): their pages stay mapped (a fresh multi-megabyte vector
      // per prefill step was page faults while the device waited).
      step_weights_ = std::move(result.weights);
      return;
    }
    if (batch.size() == 1) {
      fail_step(batch[0], status, result.poisoned_rows);
      return;
    }
    // One request's failure (a poisoned route, a replay the kernel cannot honour) must not fail
    // the others: run each alone to find which. Rerunning rewrites the same KV slots.
    for (const Scheduled& s : batch) {
      StepResult alone;
      std::vector<Scheduled> one = {s};
      Status solo = run_batch(one, alone, times);
      times.route_check += alone.route_host_seconds;
      if (solo) {
        apply_batch(one, alone, times);
      } else {
        fail_step(s, solo, alone.poisoned_rows);
      }
    }
  }

  void fail_step(const Scheduled& s, const Status& status, int64_t poisoned_rows) {
    if (status.code() == ErrorCode::kInternal) {  // a route no kernel wrote
      std::lock_guard lock(metrics_mutex_);
      ++metrics_.route_capture_errors_total;
      metrics_.routes_poisoned_total += poisoned_rows;
    }
    fail_running(s.seq, status);
  }

  // Builds the step's inputs, runs the model, scores and samples. Touches no sequence state but
  // the route log (and the prefix blocks it completes), and that only once the step's routes
  // passed their check: log_routes runs as soon as they are on the host, while the device
  // computes the logits and samples (the step cannot fail after that check).
  Status run_batch(const std::vector<Scheduled>& batch, StepResult& result, HostTimes& times) {
    const int64_t bs = kv_->block_size();
    model::StepInputs in;
    in.capture_routes = config_.capture_routes;
    for (const auto& s : batch)
      in.capture_weights |= capture_weights_ && s.seq->request.return_route_weights;
    in.num_seqs = static_cast<int>(batch.size());
    for (const auto& s : batch) in.max_blocks_per_seq = std::max<int>(in.max_blocks_per_seq, static_cast<int>(s.seq->blocks.size()));
    in.block_tables.assign(static_cast<size_t>(in.num_seqs * std::max(in.max_blocks_per_seq, 1)), 0);
    in.max_blocks_per_seq = std::max(in.max_blocks_per_seq, 1);
    bool any_forced = false;
    std::vector<LogitsUse>& logits_uses = result.logits_uses;
    for (size_t i = 0; i < batch.size(); ++i) {
      const Scheduled& s = batch[i];
      Sequence& seq = *s.seq;
      std::copy(seq.blocks.begin(), seq.blocks.end(), in.block_tables.begin() + i * in.max_blocks_per_seq);
      if (hybrid_) {
        in.state_read.push_back(seq.state_read_buffer());
        in.state_write.push_back(seq.state_write_buffer());
      }
      for (int64_t p = s.begin; p < s.begin + s.count; ++p) {
        const int32_t t = static_cast<int32_t>(in.token_ids.size());
        in.token_ids.push_back(seq.tokens[p]);
        in.positions.push_back(static_cast<int32_t>(p));
        in.token_seq.push_back(static_cast<int32_t>(i));
        in.slot_mapping.push_back(static_cast<int32_t>(seq.blocks[p / bs] * bs + p % bs));
        const bool forced = p < seq.route_rows && kernel_->replays_routes();
        in.forced.push_back(forced ? 1 : 0);
        any_forced |= forced;
        const bool last = p + 1 == static_cast<int64_t>(seq.tokens.size());
        const bool score = scores_position(seq, p);
        if (last || score) {
          in.logits_rows.push_back(t);
          logits_uses.push_back({i, p, last, score});
        }
      }
    }
    if (any_forced) {
      in.forced_routes.assign(in.token_ids.size() * static_cast<size_t>(row_ints_), 0);
      size_t t = 0;
      for (const auto& s : batch)
        for (int64_t p = s.begin; p < s.begin + s.count; ++p, ++t)
          if (in.forced[t])
            std::copy_n(s.seq->routes.begin() + p * row_ints_, row_ints_, in.forced_routes.begin() + t * row_ints_);
    } else {
      in.forced.clear();
    }

    model::StepOutputs out;
    if (load_counter_) out.routes = load_counter_->spare();  // an earlier step's capacity
    out.weights = std::move(step_weights_);
    for (const StateCopy& copy : scheduler_->state_copies())
      in.state_copies.emplace_back(copy.from, copy.to);
    if (comm_) SY_TRY(send_step(*comm_, in));
    Status status = decoder_->forward(*model_, in, out);

    // Prompt logprobs (score the next prompt token) and sampling (the last position), enqueued
    // behind the forward pass; the step's one synchronisation comes with their results.
    std::vector<backend::SamplingRow> rows;
    std::vector<size_t> sample_logit_rows;
    std::vector<int32_t> score_targets;
    int max_prompt_top = 0;
    for (size_t r = 0; r < logits_uses.size(); ++r) {
      const LogitsUse& use = logits_uses[r];
      Sequence& seq = *batch[use.item].seq;
      if (use.sample) {
        result.sample_items.push_back(use.item);
        sample_logit_rows.push_back(r);
        rows.push_back(sampling_row(seq));
      }
      if (use.score) {
        score_targets.push_back(seq.tokens[use.position + 1]);
        result.score_uses.push_back(r);
        max_prompt_top = std::max(max_prompt_top, seq.request.sampling.prompt_logprobs);
      }
    }
    if (status) {
      if (!score_targets.empty())
        backend_->score_tokens(gather_logits(out.logits, result.score_uses), score_targets, max_prompt_top, result.scored);
      if (!rows.empty())
        backend_->sample_async(gather_logits(out.logits, sample_logit_rows), rows, result.sampled);
      // (Not when the ranks compare their routes after the step: that check may still fail it.)
      const bool early = in.capture_routes && !(comm_ && config_.check_routes_agree);
      const Status routes =
          early ? collect_and_log_routes(batch, out, result, times) : Status::ok();
      status = decoder_->finish_step(*model_, out);  // waits for the device and the samples
      if (!routes) status = routes;
    }
    if (comm_ && in.capture_routes && config_.check_routes_agree) {
      // Every rank checks whatever its step gave (an empty log on a failed step: the sizes differ
      // or agree the same way on every rank, so no rank waits alone).
      Status agree = dist::check_routes_agree(*comm_, out.routes, model_->config().num_hidden_layers,
                                              model_->config().experts_per_token);
      if (status) status = agree;
    }
    if (!result.routes_logged) {
      result.routes = std::move(out.routes);
      result.weights = std::move(out.weights);
    }
    result.poisoned_rows = out.poisoned_rows;
    result.route_host_seconds = out.route_host_seconds;
    return status;
  }

  // Route log: positions computed for the first time get the rows the kernels wrote (checked).
  // A sequence's log grows by the step's new rows (from its route_rows on; earlier positions were
  // replayed from the log), filled piece by piece (layer ranges) as the decoder collects them;
  // route_rows moves only once every piece passed its check.
  struct LogGrowth {
    Sequence* seq;
    size_t first_t;     // the first new row's index in the step's routes
    int64_t from, end;  // positions whose rows are new
    size_t old_size;    // the log's size before the step
  };
  std::vector<LogGrowth> grow_route_logs(const std::vector<Scheduled>& batch) {
    std::vector<LogGrowth> growth;
    size_t t = 0;
    for (const auto& s : batch) {
      Sequence& seq = *s.seq;
      const int64_t end = s.begin + s.count, from = std::max(s.begin, seq.route_rows);
      if (from < end) {
        // Room for the prompt's rows and some decode rows at once (doubling after that).
        if (seq.routes.capacity() == 0)
          seq.routes.reserve(static_cast<size_t>(
              (seq.prompt_len + std::min<int64_t>(seq.request.sampling.max_tokens, 1024)) *
              row_ints_));
        growth.push_back(
            {&seq, t + static_cast<size_t>(from - s.begin), from, end, seq.routes.size()});
      }
      t += static_cast<size_t>(s.count);
    }
    return growth;
  }
  // Layers [layer_begin, layer_end) of the new rows into the logs.
  void fill_route_logs(const std::vector<LogGrowth>& growth, const std::vector<int32_t>& routes,
                       int64_t layer_begin, int64_t layer_end) {
    const int64_t top_k = model_->config().experts_per_token;
    const int64_t layers = model_->config().num_hidden_layers;
    const size_t row = static_cast<size_t>(row_ints_);
    for (const LogGrowth& g : growth) {
      std::vector<int32_t>& log = g.seq->routes;
      const int32_t* rows = routes.data() + g.first_t * row;
      const size_t count = static_cast<size_t>(g.end - g.from);
      if (layer_begin == 0 && layer_end == layers) {  // whole rows, contiguous
        log.insert(log.end(), rows, rows + count * row);
        continue;
      }
      if (log.size() == g.old_size) log.resize(g.old_size + count * row);
      const size_t column = static_cast<size_t>(layer_begin * top_k);
      const size_t width = static_cast<size_t>((layer_end - layer_begin) * top_k);
      int32_t* dst = log.data() + g.old_size;
      for (size_t r = 0; r < count; ++r)
        std::memcpy(dst + r * row + column, rows + r * row + column, width * sizeof(int32_t));
    }
  }
  // Every piece is in: route_rows, the gating weights, the counts, and the step's rows to the
  // expert-load counter.
  void finish_route_logs(const std::vector<Scheduled>& batch, const std::vector<LogGrowth>& growth,
                         StepResult& result) {
    result.routes_logged = true;
    int64_t captured = 0, replayed = 0;
    size_t t = 0;
    for (const auto& s : batch) {
      Sequence& seq = *s.seq;
      const int64_t end = s.begin + s.count;
      const size_t first_t = t;
      t += static_cast<size_t>(s.count);
      replayed += std::clamp(seq.route_rows, s.begin, end) - s.begin;
      if (seq.request.return_route_weights && !result.weights.empty() &&
          seq.weight_rows >= s.begin && seq.weight_rows < end) {
        auto rows_of = [&](int64_t p) {
          return static_cast<std::ptrdiff_t>((first_t + static_cast<size_t>(p - s.begin)) *
                                             static_cast<size_t>(row_ints_));
        };
        seq.route_weights.insert(seq.route_weights.end(),
                                 result.weights.begin() + rows_of(seq.weight_rows),
                                 result.weights.begin() + rows_of(end));
        seq.weight_rows = end;
      }
    }
    for (const LogGrowth& g : growth) {
      g.seq->route_rows = g.end;
      captured += g.end - g.from;
    }
    {
      std::lock_guard lock(metrics_mutex_);
      metrics_.routes_captured_total += captured;
      metrics_.routes_replayed_total += replayed;
    }
    if (load_counter_) load_counter_->add(std::move(result.routes), static_cast<int64_t>(t));
  }
  // The whole route log of a step whose routes were collected with it (not early).
  void log_routes(const std::vector<Scheduled>& batch, StepResult& result, HostTimes& times) {
    if (!config_.capture_routes) {
      result.routes_logged = true;
      return;
    }
    const auto started = Clock::now();
    const std::vector<LogGrowth> growth = grow_route_logs(batch);
    fill_route_logs(growth, result.routes, 0, model_->config().num_hidden_layers);
    finish_route_logs(batch, growth, result);
    times.route_log += std::chrono::duration<double>(Clock::now() - started).count();
  }
  // The early path: each piece of the step's routes checked (Decoder::collect_route_piece) and
  // logged as it reaches the host (a prefill's first layers while the device computes its last
  // ones, every step's last piece while it computes the logits and samples), then the full blocks
  // they complete published. A piece that fails its check undoes the logs' growth.
  Status collect_and_log_routes(const std::vector<Scheduled>& batch, model::StepOutputs& out,
                                StepResult& result, HostTimes& times) {
    double log_seconds = 0;
    auto timed = [&](auto work) {
      const auto started = Clock::now();
      work();
      log_seconds += std::chrono::duration<double>(Clock::now() - started).count();
    };
    std::vector<LogGrowth> growth;
    timed([&] { growth = grow_route_logs(batch); });
    for (int piece = 0; piece < decoder_->route_pieces(); ++piece) {
      if (Status checked = decoder_->collect_route_piece(*model_, out, piece); !checked) {
        for (const LogGrowth& g : growth) g.seq->routes.resize(g.old_size);
        times.route_log += log_seconds;
        return checked;
      }
      const std::pair<int64_t, int64_t> layers = decoder_->route_piece_layers(piece);
      timed([&] { fill_route_logs(growth, out.routes, layers.first, layers.second); });
    }
    result.routes = std::move(out.routes);
    result.weights = std::move(out.weights);
    timed([&] { finish_route_logs(batch, growth, result); });
    times.route_log += log_seconds;
    const auto publish_started = Clock::now();
    for (const auto& s : batch) scheduler_->publish(*s.seq, s.begin + s.count);
    times.prefix_publish += std::chrono::duration<double>(Clock::now() - publish_started).count();
    return Status::ok();
  }

  // Takes a successful step's results into its sequences and delivers their events; adds the
  // route log's and the prefix publish's seconds to `times`.
  void apply_batch(const std::vector<Scheduled>& batch, StepResult& result, HostTimes& times) {
    if (!result.routes_logged) log_routes(batch, result, times);
    scheduler_->state_copies_done();  // this step did them; computed() may queue the next step's
    const auto publish_started = Clock::now();
    for (const auto& s : batch) scheduler_->computed(*s.seq, s.begin + s.count);
    times.prefix_publish += std::chrono::duration<double>(Clock::now() - publish_started).count();
    {
      std::lock_guard lock(metrics_mutex_);
      for (const auto& s : batch) {
        int64_t prompt_part = std::max<int64_t>(0, std::min(s.begin + s.count, s.seq->prompt_len) - s.begin);
        metrics_.prompt_tokens_computed += prompt_part;
      }
    }
    const std::vector<LogitsUse>& logits_uses = result.logits_uses;
    for (size_t j = 0; j < result.scored.size(); ++j) {
      Sequence& seq = *batch[logits_uses[result.score_uses[j]].item].seq;
      const backend::SampledToken& scored = result.scored[j];
      TokenLogprob entry{scored.token_id, scored.logprob, {}};
      for (int k = 0; k < seq.request.sampling.prompt_logprobs && k < static_cast<int>(scored.top.size()); ++k)
        entry.top.push_back({scored.top[k].first, scored.top[k].second});
      seq.prompt_logprobs.push_back(std::move(entry));
      seq.prompt_scored = logits_uses[result.score_uses[j]].position + 1;
    }
    std::vector<Sequence*> finished;
    for (size_t j = 0; j < result.sampled.size(); ++j) {
      Sequence& seq = *batch[result.sample_items[j]].seq;
      const backend::SampledToken& token = result.sampled[j];
      seq.tokens.push_back(token.token_id);
      seq.output_ids.push_back(token.token_id);
      seq.new_tokens.push_back(token.token_id);
      if (seq.request.sampling.logprobs >= 0) {
        TokenLogprob entry{token.token_id, token.logprob, {}};
        for (auto [id, lp] : token.top) entry.top.push_back({id, lp});
        seq.new_logprobs.push_back(std::move(entry));
      }
      {
        std::lock_guard lock(metrics_mutex_);
        ++metrics_.generation_tokens_total;
      }
      FinishReason reason = finish_reason_after(seq, token.token_id);
      std::optional<int32_t> stop_token;
      if (reason == FinishReason::kStop) stop_token = token.token_id;
      Continuation next = deliver(seq, reason, stop_token);
      if (reason == FinishReason::kNone && next == Continuation::kStop) {
        reason = FinishReason::kStop;
        deliver(seq, reason, std::nullopt);
      }
      if (reason != FinishReason::kNone) finished.push_back(&seq);
    }
    for (Sequence* seq : finished) remove_running(seq);
  }

  // The step's logits rows that one consumer needs, compacted on the backend (never via the
  // host) into buffers allocated once, at the largest size a step can ask for.
  Tensor gather_logits(const Tensor& logits, const std::vector<size_t>& rows) {
    bool identity = true;
    for (size_t i = 0; i < rows.size(); ++i) identity &= rows[i] == i;
    if (identity) return logits.slice_rows(0, static_cast<int64_t>(rows.size()));
    if (!gathered_.data) {
      const int64_t max_rows = std::max<int64_t>(1, std::min<int64_t>(config_.max_num_batched_tokens,
          int64_t{config_.max_num_seqs} + config_.max_prompt_logprob_rows));
      gather_index_ = backend_->alloc(DType::kI32, {max_rows});
      gathered_ = backend_->alloc(DType::kF32, {max_rows, logits.dim(1)});
    }
    // Two consumers per step (scoring, sampling) each get their own half of the index buffer's
    // use in sequence; the backend orders the gather before the consumer that reads it.
    std::vector<int32_t> index(rows.begin(), rows.end());
    Tensor index_tensor = gather_index_.slice_rows(0, static_cast<int64_t>(index.size()));
    backend_->upload(index.data(), index_tensor);
    Tensor gathered = gathered_.slice_rows(0, static_cast<int64_t>(rows.size()));
    backend_->gather_rows(logits, index_tensor, gathered);
    return gathered;
  }

  backend::SamplingRow sampling_row(const Sequence& seq) {
    const SamplingParams& s = seq.request.sampling;
    backend::SamplingRow row;
    row.temperature = s.temperature;
    row.top_p = s.top_p;
    row.top_k = s.top_k;
    row.min_p = s.min_p;
    row.seed = seq.seed;
    row.draw_index = static_cast<uint64_t>(seq.output_len());
    row.presence_penalty = s.presence_penalty;
    row.frequency_penalty = s.frequency_penalty;
    row.repetition_penalty = s.repetition_penalty;
    row.logit_bias = &s.logit_bias;
    row.prompt_tokens = &seq.request.prompt_ids;
    // The sequence's own output list, appended to as tokens are sampled: no per-step copy.
    row.output_tokens = seq.output_ids.empty() ? nullptr : &seq.output_ids;
    if (seq.output_len() < s.min_tokens) {
      if (!s.ignore_eos) row.banned_tokens = eos_ids_;
      row.banned_tokens.insert(row.banned_tokens.end(), s.stop_token_ids.begin(), s.stop_token_ids.end());
    }
    row.logprobs = s.logprobs;
    return row;
  }

  FinishReason finish_reason_after(const Sequence& seq, int32_t token) const {
    const SamplingParams& s = seq.request.sampling;
    if (seq.output_len() >= s.min_tokens) {
      if (!s.ignore_eos && std::find(eos_ids_.begin(), eos_ids_.end(), token) != eos_ids_.end())
        return FinishReason::kStop;
      if (std::find(s.stop_token_ids.begin(), s.stop_token_ids.end(), token) != s.stop_token_ids.end())
        return FinishReason::kStop;
    }
    if (seq.output_len() >= s.max_tokens) return FinishReason::kLength;
    if (static_cast<int64_t>(seq.tokens.size()) >= max_model_len_) return FinishReason::kLength;
    return FinishReason::kNone;
  }

  Continuation deliver(Sequence& seq, FinishReason reason, std::optional<int32_t> stop_token) {
    Event event;
    event.request_id = seq.id;
    event.new_token_ids.swap(seq.new_tokens);
    event.new_logprobs.swap(seq.new_logprobs);
    if (!seq.first_event_sent) {
      event.prompt_logprobs.swap(seq.prompt_logprobs);
      event.cached_prompt_tokens = seq.cached_prompt_tokens;
      seq.first_event_sent = true;
      std::lock_guard lock(metrics_mutex_);
      metrics_.prompt_tokens_total += seq.prompt_len;
    }
    event.finished = reason != FinishReason::kNone;
    event.finish_reason = reason;
    event.stop_token_id = stop_token;
    // Only copies here; the server encodes on its own threads.
    const int64_t rows = static_cast<int64_t>(seq.tokens.size()) - 1;
    if (seq.request.stream_routes) {
      event.new_routes =
          std::make_shared<const moe::RouteArray>(route_array(seq, seq.routes_streamed, rows));
      seq.routes_streamed = rows;
    } else if (event.finished && seq.request.return_routes) {
      event.routes =
          std::make_shared<const moe::RouteArray>(route_array(seq, 0, rows, /*take_log=*/true));
    }
    return seq.on_event ? seq.on_event(event) : Continuation::kContinue;
  }

  // Rows [begin, end) of the route log (and of the weights, when the request asked for them).
  // take_log: the sequence's final event takes the whole log itself (no copy; nothing reads the
  // log of a finished sequence).
  moe::RouteArray route_array(Sequence& seq, int64_t begin, int64_t end,
                              bool take_log = false) const {
    moe::RouteArray routes;
    routes.first_row = begin;
    routes.rows = end - begin;
    routes.layers = model_->config().num_hidden_layers;
    routes.top_k = model_->config().experts_per_token;
    if (take_log && begin == 0 && static_cast<int64_t>(seq.routes.size()) >= end * row_ints_) {
      routes.ids = std::move(seq.routes);
      routes.ids.resize(static_cast<size_t>(end * row_ints_));
      seq.routes.clear();
      seq.route_rows = 0;
    } else {
      routes.ids.assign(seq.routes.begin() + begin * row_ints_,
                        seq.routes.begin() + end * row_ints_);
    }
    if (seq.request.return_route_weights) {
      // Every row of such a request was computed by it (no prefix hit); NaN would show a gap.
      routes.weights.assign(static_cast<size_t>(routes.rows * row_ints_), std::nanf(""));
      const int64_t known = std::min(end, seq.weight_rows);
      if (known > begin)
        std::copy(seq.route_weights.begin() + begin * row_ints_,
                  seq.route_weights.begin() + known * row_ints_, routes.weights.begin());
    }
    // Replayed rows are returned as given; dense layers' entries are 0 on the wire.
    const auto moe_layers = model_->config().moe_layers();
    for (int64_t row = 0; row < routes.rows; ++row)
      for (int64_t layer = 0; layer < routes.layers; ++layer)
        if (std::find(moe_layers.begin(), moe_layers.end(), layer) == moe_layers.end())
          std::fill_n(routes.ids.begin() + (row * routes.layers + layer) * routes.top_k, routes.top_k, 0);
    return routes;
  }

  // The final event of a sequence the scheduler no longer holds (its blocks are given back).
  void finish(Sequence& seq, FinishReason reason, const Status& error) {
    Event event;
    event.request_id = seq.id;
    event.new_token_ids.swap(seq.new_tokens);
    event.finished = true;
    event.finish_reason = reason;
    event.error = error;
    if (seq.on_event) seq.on_event(event);
  }

  void fail_running(Sequence* seq, const Status& error) {
    if (std::unique_ptr<Sequence> owned = scheduler_->remove(seq)) finish(*owned, FinishReason::kError, error);
  }

  void remove_running(Sequence* seq) { scheduler_->remove(seq); }

  void publish_metrics() {
    std::lock_guard lock(metrics_mutex_);
    metrics_.running_requests = scheduler_->running_count();
    metrics_.waiting_requests = scheduler_->waiting_count();
    waiting_count_ = scheduler_->waiting_count();
    const SchedulerStats& stats = scheduler_->stats();
    metrics_.preemptions_total = stats.preemptions_total;
    metrics_.prefix_cache_queries_tokens = stats.prefix_cache_queries_tokens;
    metrics_.prefix_cache_hits_tokens = stats.prefix_cache_hits_tokens;
    metrics_.state_snapshots_taken = stats.state_snapshots_taken;
    metrics_.state_snapshots_restored = stats.state_snapshots_restored;
    metrics_.kv_blocks_total = kv_->num_blocks();
    metrics_.kv_blocks_used = kv_->used();
    metrics_.kv_blocks_cached = kv_->cached();
    metrics_.kv_blocks_free = kv_->free_uncached();
  }

  struct Task {
    std::function<void()> run;
    bool drain = false;
  };

  EngineConfig config_;
  bool follower_ = false;
  std::unique_ptr<backend::Backend> backend_;
  std::unique_ptr<backend::Backend> host_backend_;  // tensor parallel on a device: the full model
  std::unique_ptr<dist::Communicator> owned_comm_;
  dist::Communicator* comm_ = nullptr;  // tensor parallel: the group (else null)
  std::unique_ptr<model::Model> full_model_;  // tensor parallel: what the shard views
  moe::ExpertsKernelRegistry registry_;
  moe::ExpertsKernel* kernel_ = nullptr;
  std::unique_ptr<model::Model> model_;
  model::ModelConfig config_at_start_;
  std::unique_ptr<model::Decoder> decoder_;
  std::unique_ptr<KvCache> kv_;
  int64_t max_model_len_ = 0;
  int64_t row_ints_ = 0;
  bool hybrid_ = false;  // linear-attention layers: per-sequence state slots and snapshots
  std::vector<int32_t> eos_ids_;
  bool capture_weights_ = false;
  std::string weights_unavailable_;

  // Engine-thread state.
  std::unique_ptr<Scheduler> scheduler_;
  std::atomic<int64_t> waiting_count_{0};  // published for submit's queue limit
  std::deque<Task> pending_tasks_;
  Tensor gather_index_, gathered_;  // gathered logits rows (allocated at first use)

  // Shared with submitters.
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::vector<std::unique_ptr<Sequence>> incoming_;
  std::vector<float> step_weights_;  // the last step's gating weights, reused (run_batch)
  std::unique_ptr<ExpertLoadCounter> load_counter_;  // with capture (not on followers)
  std::vector<RequestId> cancelled_;
  std::vector<Task> tasks_;
  bool stopping_ = false;
  Clock::time_point drain_deadline_;
  RequestId next_id_ = 1;
  std::mt19937_64 seed_rng_{std::random_device{}()};
  std::thread thread_;

  mutable std::mutex metrics_mutex_;
  EngineMetrics metrics_;
};

}  // namespace

int64_t DeviceMemory::available(double utilization) const {
  if (utilization <= 0.0) return free_now;
  return std::min(static_cast<int64_t>(utilization * static_cast<double>(total)) - held(),
                  free_now);
}

Result<int64_t> device_kv_budget(const DeviceMemory& memory, int64_t reserved, double utilization) {
  if (utilization <= 0.0)
    return static_cast<int64_t>(0.9 * static_cast<double>(memory.free_now - reserved));
  const int64_t budget = memory.available(utilization) - reserved;
  if (budget <= 0) {
    const int64_t share = static_cast<int64_t>(utilization * static_cast<double>(memory.total));
    return Status::errorf(
        "--gpu-memory-utilization {}: {:.1f} GB of the device's {:.1f} GB leave no room for the KV "
        "cache after the weights ({:.1f} GB) and the step workspace ({:.1f} GB); {:.1f} GB are "
        "free. Raise it, or lower --max-num-seqs / --max-num-batched-tokens",
        utilization, static_cast<double>(share) / 1e9, static_cast<double>(memory.total) / 1e9,
        static_cast<double>(memory.held()) / 1e9, static_cast<double>(reserved) / 1e9,
        static_cast<double>(memory.free_now) / 1e9);
  }
  return budget;
}

int StepDefaults::max_num_seqs() const {
  if (device == Device::kCpu) return 256;
  if (state_bytes_per_copy <= 0) return 1024;
  const int64_t fit = std::max<int64_t>(free_bytes, 0) / 2 / (2 * state_bytes_per_copy);
  return static_cast<int>(std::clamp<int64_t>(fit / 8 * 8, 8, 1024));
}

int StepDefaults::max_num_batched_tokens() const {
  return device == Device::kCpu ? 2048 : 8192;
}

Result<std::unique_ptr<Engine>> create_engine(const EngineConfig& config) {
  auto engine = std::make_unique<EngineImpl>();
  SY_TRY(engine->init(config));
  return std::unique_ptr<Engine>(std::move(engine));
}

Status run_engine_follower(const EngineConfig& config) {
  auto engine = std::make_unique<EngineImpl>();
  SY_TRY(engine->init(config, /*follower=*/true));
  return engine->follow();
}

}  // namespace sy::engine
