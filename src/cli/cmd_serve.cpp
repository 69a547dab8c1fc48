// `switchyard serve`: the OpenAI / vLLM / SGLang-compatible HTTP server over the engine.
// Listens first (so /health answers 503 while the model loads), then loads, then serves until
// SIGTERM/SIGINT, which drains in-flight requests up to --shutdown-timeout and exits 0.
#include <cstdio>
#include <cstdlib>

#include "cli/commands.h"
#include "cli/common.h"
#include "engine/engine.h"
#include "engine/generation_defaults.h"
#include "server/model_codec.h"
#include "server/server.h"
#include "tokenizer/tokenizer.h"

#include "chat/chat_template.h"

namespace sy::cli {
namespace {

using ChatTemplate = chat::ChatTemplate;
using server::ModelCodec;

struct ServeOptions {
  server::ServerConfig server;
  engine::EngineConfig engine;
  DeviceOptions device;
  bool no_prefix_caching = false;
};

int run_serve(ServeOptions options) {
  if (Status applied = apply_device_options(options.device, options.engine); !applied) {
    std::fprintf(stderr, "switchyard serve: %s\n", applied.message().c_str());
    return 1;
  }
  server::ServerConfig& config = options.server;
  config.model_dir = options.engine.model_dir;
  config.handle_signals = true;
  if (config.api_key.empty()) {
    if (const char* key = std::getenv("SWITCHYARD_API_KEY")) config.api_key = key;
  }
  if (config.served_model_name.empty()) config.served_model_name = options.engine.model_dir;
  options.engine.capture_routes = config.enable_return_routed_experts;
  options.engine.enable_prefix_caching = !options.no_prefix_caching;
  // Ranks 1..N-1 serve no HTTP: they run the forward pass of the steps rank 0 plans.
  if (options.engine.world.rank > 0) return run_parallel_follower(options.engine, "serve");

  Result<engine::SamplingParams> defaults = engine::load_generation_defaults(options.engine.model_dir);
  if (!defaults) {
    std::fprintf(stderr, "switchyard serve: %s\n", defaults.message().c_str());
    return 1;
  }
  config.sampling_defaults = *defaults;

  server::Server server(config);
  if (Status started = server.start(); !started) {
    std::fprintf(stderr, "switchyard serve: %s\n", started.message().c_str());
    return 1;
  }
  std::printf("switchyard serve: listening on http://%s:%u (loading %s)\n", config.host.c_str(),
              static_cast<unsigned>(server.port()), options.engine.model_dir.c_str());
  std::fflush(stdout);

  auto tokenizer = tokenizer::Tokenizer::load(options.engine.model_dir);
  if (!tokenizer) {
    std::fprintf(stderr, "switchyard serve: tokenizer: %s\n", tokenizer.message().c_str());
    return 1;
  }
  std::optional<ChatTemplate> chat_template;
  std::string chat_template_error;
  if (auto loaded = chat::ChatTemplate::load(options.engine.model_dir)) {
    chat_template.emplace(std::move(loaded).value());
  } else {
    chat_template_error = loaded.message();  // a model without a template: chat requests get a 400
  }
  Result<std::unique_ptr<engine::Engine>> engine = engine::create_engine(options.engine);
  if (!engine) {
    std::fprintf(stderr, "switchyard serve: %s\n", engine.message().c_str());
    return 1;
  }
  ModelCodec codec(std::move(tokenizer).value(), std::move(chat_template), chat_template_error);
  server.attach(**engine, codec);
  engine::ModelInfo info = (*engine)->model_info();
  std::printf(
      "switchyard serve: ready: model %s (%s, %lld layers, %lld experts, top_k %lld), "
      "routes %s\n",
      config.served_model_name.c_str(), info.architecture.c_str(),
      static_cast<long long>(info.num_hidden_layers), static_cast<long long>(info.num_experts),
      static_cast<long long>(info.top_k), config.enable_return_routed_experts ? "captured" : "off");
  if (config.ui) {
    std::printf("switchyard serve: routing inspector at http://%s:%u/ui/\n", config.host.c_str(),
                static_cast<unsigned>(server.port()));
  }
  std::fflush(stdout);

  server.wait();  // returns after SIGTERM/SIGINT and the drain
  (*engine)->shutdown(static_cast<int64_t>(config.shutdown_timeout_s * 1000));
  std::printf("switchyard serve: stopped\n");
  return 0;
}

}  // namespace

void add_serve_command(CLI::App& app, int& exit_code, const dist::MpiWorld& world) {
  auto options = std::make_shared<ServeOptions>();
  options->device.world = world;
  auto* command = app.add_subcommand("serve", "OpenAI/vLLM/SGLang-compatible HTTP server");
  server::ServerConfig& s = options->server;
  engine::EngineConfig& e = options->engine;
  s.served_model_name.clear();
  command
      ->add_option("--model", e.model_dir, "model directory (config.json, safetensors, tokenizer)");
  add_device_options(command, options->device);
  command->add_option("--host", s.host, "address to listen on")->capture_default_str();
  command->add_option("--port", s.port, "port (0 = any free port; the chosen one is printed)")
      ->capture_default_str();
  command->add_option("--served-model-name", s.served_model_name,
                      "model name in the API (default: --model)");
  command->add_option("--api-key", s.api_key,
                      "require 'Authorization: Bearer KEY' (env SWITCHYARD_API_KEY)");
  command->add_flag("--enable-return-routed-experts", s.enable_return_routed_experts,
                    "capture every request's routed experts; requests may ask for them");
  command->add_flag(
      "--return-routed-experts-default", s.return_routed_experts_default,
      "with capture on, return routes to requests that leave return_routed_experts out "
      "(default: only to those that ask)");
  command->add_flag(
      "--ui", s.ui,
      "serve the routing inspector page at /ui/ (expert-load heatmap, routes viewer)");
  command
      ->add_option("--ui-route-store", s.ui_route_store_requests,
                   "with --ui and capture on: finished requests whose routes /ui/api/routes/ID "
                   "keeps (newest first, within 256 MiB; 0 = none)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20))
      ->capture_default_str();
  command->add_option("--moe-kernel", e.moe_kernel, "MoE kernel: auto or a name")
      ->capture_default_str();
  command->add_flag("--batch-invariant", e.batch_invariant,
                    "a request's tokens and routes do not depend on the rest of the step (CUDA: one GEMM and "
                    "attention tiling for every step size, cuda-modular only; the CPU always is)");
  command
      ->add_option("--max-num-seqs", e.max_num_seqs,
                   "sequences per step (0: 1024 on a GPU, fewer for linear-attention models, as "
                   "their state memory allows; 256 on the CPU)")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  command
      ->add_option(
          "--max-num-batched-tokens", e.max_num_batched_tokens,
          "tokens per step; longer prompts are chunked (0: 8192 on a GPU, 2048 on the CPU)")
      ->check(CLI::Range(0, 1 << 24))
      ->capture_default_str();
  command
      ->add_option("--max-prompt-logprob-rows", e.max_prompt_logprob_rows,
                   "prompt positions scored for prompt_logprobs per step (each holds a vocab-wide logits row)")
      ->check(CLI::Range(1, 65536))
      ->capture_default_str();
  command->add_option("--max-model-len", e.max_model_len, "context length (0 = config.json)")
      ->capture_default_str();
  command
      ->add_option("--kv-cache-tokens", e.kv_cache_tokens,
                   "KV cache size in tokens (0 = from memory; on the CPU at most 1 GiB)")
      ->capture_default_str();
  command
      ->add_option("--gpu-memory-utilization", e.gpu_memory_utilization,
                   "share of the GPU's memory the engine may hold, weights and KV cache included "
                   "(vLLM's flag; 0 = 90% of what is free after the weights)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  command->add_option("--block-size", e.block_size_tokens, "KV block size in tokens")
      ->capture_default_str();
  command->add_flag("--no-enable-prefix-caching,!--enable-prefix-caching",
                    options->no_prefix_caching,
                    "turn the prefix cache off (--enable-prefix-caching, vLLM's: on, the default)");
  // vLLM command-line flags for what is always so here: accepted, no effect.
  for (auto [name, what] :
       {std::pair{"--enable-chunked-prefill",
                  "vLLM's flag, accepted: chunked prefill is always on"},
        std::pair{"--disable-log-requests", "vLLM's flag, accepted: requests are never logged"},
        std::pair{"--disable-log-stats",
                  "vLLM's flag, accepted: stats are not logged (/metrics has them)"}})
    command->add_flag_callback(
        name, [] {}, what);
  command
      ->add_option("--state-snapshots", e.state_snapshots,
                   "models with linear attention (Qwen3.5): prompts whose state the prefix cache "
                   "keeps (the state after a prompt's last full block; 0 = no prefix cache)")
      ->check(CLI::Range(0, 1 << 16))
      ->capture_default_str();
  command->add_option("--max-waiting-requests", e.max_waiting_requests, "queue length before 429")
      ->capture_default_str();
  command->add_option("--threads", e.num_threads, "CPU threads for the engine (0 = all cores)")
      ->capture_default_str();
  command->add_option("--max-request-bytes", s.max_request_bytes, "request body limit (413 beyond)")
      ->capture_default_str();
  command->add_option("--max-header-bytes", s.max_header_bytes, "request header limit (431 beyond)")
      ->capture_default_str();
  command
      ->add_option("--shutdown-timeout", s.shutdown_timeout_s,
                   "seconds to finish in-flight requests after SIGTERM")
      ->capture_default_str();
  command->add_option("--max-n", s.max_n, "cap on choices per request (n x prompts)")
      ->capture_default_str();
  command->add_option("--io-threads", s.io_threads, "HTTP I/O threads")->capture_default_str();
  command->callback([options, &exit_code] { exit_code = run_serve(*options); });
}

}  // namespace sy::cli
