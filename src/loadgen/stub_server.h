// A minimal asynchronous OpenAI-style streaming server that answers /v1/completions,
// /v1/chat/completions and /generate with N SSE tokens as fast as it can (or paced), so that the
// load generator's own ceiling can be measured and its parsing tested without a model.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "util/status.h"

namespace sy::loadgen {

struct StubServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0: any free port
  int threads = 1;
  int default_tokens = 16;      // when the request names no max_tokens
  double token_interval_s = 0;  // pause between tokens (0: as fast as possible)
  bool split_events = false;    // write each SSE event as two HTTP chunks, cut mid-JSON
  // Routes for return_routed_experts: (N-1, layers, top_k), ids < num_experts.
  int route_layers = 4, route_top_k = 8, route_num_experts = 128;
  int corrupt_routes_every = 0;  // every k-th routed response has one row too few (0: never)
  bool send_routes = true;       // false: ignore return_routed_experts, like a server without it
};

class StubServer {
 public:
  static Result<std::unique_ptr<StubServer>> start(const StubServerOptions& options);
  ~StubServer();
  StubServer(const StubServer&) = delete;
  StubServer& operator=(const StubServer&) = delete;

  int port() const { return port_; }
  long requests_served() const {
    return requests_served_.load();
  }  // requests read and answered (or being answered)
  int peak_open_connections() const { return peak_open_.load(); }
  // Stops accepting, closes connections and joins the threads.
  void stop();

  struct Impl;

 private:
  StubServer() = default;
  std::unique_ptr<Impl> impl_;
  std::vector<std::thread> threads_;
  int port_ = 0;
  std::atomic<long> requests_served_{0};
  std::atomic<int> open_{0}, peak_open_{0};
  friend struct Impl;
};

}  // namespace sy::loadgen
