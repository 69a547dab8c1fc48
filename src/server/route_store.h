// The routes of recently finished requests, kept for the routing inspector page (`serve --ui`):
// a bounded, thread-safe store keyed by the response id, oldest evicted first.
#pragma once

#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace sy::server {

struct StoredChoice {
  int64_t rows = 0;                // route rows 0 .. N-2, every hidden layer
  std::string routed_experts;      // base64 .npy, the wire format of `routed_experts`
  std::vector<int32_t> token_ids;  // prompt + generated: row i's input token is token_ids[i]
};

struct StoredRoutes {
  std::string id;  // the response id ("cmpl-...", "chatcmpl-...", or /generate's rid)
  int64_t created = 0;
  std::vector<StoredChoice> choices;
};

class RouteStore {
 public:
  // Keeps at most `max_requests` requests and `max_bytes` of their payload (routes and token ids).
  RouteStore(int64_t max_requests, int64_t max_bytes);

  // Replaces any entry with the same id. An entry larger than max_bytes is not kept.
  void put(StoredRoutes routes);
  std::optional<StoredRoutes> get(const std::string& id) const;
  // Ids of the entries held, newest first.
  std::vector<std::string> ids() const;
  int64_t max_requests() const { return max_requests_; }

 private:
  static int64_t bytes_of(const StoredRoutes& routes);
  const int64_t max_requests_;
  const int64_t max_bytes_;
  mutable std::mutex mutex_;
  std::deque<StoredRoutes> entries_;  // oldest first
  int64_t bytes_ = 0;
};

}  // namespace sy::server
