// The HTTP server: OpenAI / vLLM / SGLang-compatible endpoints over an Engine, on Boost.Beast.
// Asynchronous; a closed connection cancels its engine requests at once, streaming or not.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "util/status.h"

namespace sy::server {

struct ServerConfig {
  std::string host = "127.0.0.1";
  uint16_t port = 8000;  // 0 = any free port (tests); Server::port() says which
  std::string served_model_name = "switchyard";
  std::string model_dir;  // shown as `root` in /v1/models
  std::string api_key;    // empty = no authentication
  bool enable_return_routed_experts = false;
  // The default of a request's `return_routed_experts` when capture is on (capture itself runs
  // for every request either way, so the prefix cache keeps every block's routes).
  bool return_routed_experts_default = false;
  // --ui: the routing inspector page at /ui/ and its data endpoints under /ui/api/ (docs/api.md).
  bool ui = false;
  // With --ui and capture on: finished requests whose routes /ui/api/routes/{id} can still give,
  // newest kept, within a byte budget (base64 routes plus token ids).
  int64_t ui_route_store_requests = 64;
  int64_t ui_route_store_bytes = int64_t{256} << 20;
  int64_t max_request_bytes = int64_t{64} << 20;  // 413 beyond; a 32k-token replay fits
  int64_t max_header_bytes = 64 << 10;            // 431 beyond
  double shutdown_timeout_s = 30.0;
  int max_n = 128;  // per-request cap on `n` (times the number of prompts)
  // Used where a request leaves temperature, top_p, top_k, min_p or repetition_penalty out: the
  // model's generation_config.json, as vLLM does (`serve` loads it).
  engine::SamplingParams sampling_defaults;
  int io_threads = 2;
  bool handle_signals = false;  // SIGTERM/SIGINT start a graceful drain (the CLI sets this)
};

// Incremental detokenization for one choice: push() returns the text that became complete.
class TokenStream {
 public:
  virtual ~TokenStream() = default;
  virtual std::string push(int32_t token_id) = 0;
  virtual std::string flush() = 0;
};

// What the server needs from the tokenizer and chat template. `serve` adapts the model's own
// tokenizer.json and chat_template; tests inject a small fake.
class TextCodec {
 public:
  virtual ~TextCodec() = default;
  virtual Result<std::vector<int32_t>> encode(std::string_view text,
                                              bool add_special_tokens) const = 0;
  virtual std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const = 0;
  // The token's own string (as in vocab), for logprobs' `token` fields.
  virtual std::string token_text(int32_t id) const = 0;
  virtual std::unique_ptr<TokenStream> stream(bool skip_special_tokens) const = 0;
  virtual Result<std::string> render_chat(const nlohmann::ordered_json& messages,
                                          const nlohmann::ordered_json& tools, bool add_generation_prompt,
                                          const nlohmann::ordered_json& extra_kwargs) const = 0;
};

class Server {
 public:
  explicit Server(ServerConfig config);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds and starts the I/O threads. Until attach(), every route but /health answers 503.
  Status start();
  uint16_t port() const;
  // The engine and codec must outlive the server (or at least its stop()).
  void attach(engine::Engine& engine, const TextCodec& codec);
  // Graceful drain: /health and new requests get 503, in-flight requests finish (up to the
  // shutdown timeout, then they are cancelled), then the server stops. Any thread.
  void request_shutdown();
  // Blocks until the server has stopped (after request_shutdown or a signal).
  void wait();
  // Stops at once, cancelling whatever is in flight.
  void stop();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace sy::server
