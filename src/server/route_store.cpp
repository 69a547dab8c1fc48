#include "server/route_store.h"

#include <algorithm>

namespace sy::server {

RouteStore::RouteStore(int64_t max_requests, int64_t max_bytes)
    : max_requests_(std::max<int64_t>(0, max_requests)),
      max_bytes_(std::max<int64_t>(0, max_bytes)) {}

int64_t RouteStore::bytes_of(const StoredRoutes& routes) {
  int64_t bytes = static_cast<int64_t>(routes.id.size());
  for (const StoredChoice& choice : routes.choices) {
    bytes += static_cast<int64_t>(choice.routed_experts.size() +
                                  choice.token_ids.size() * sizeof(int32_t));
  }
  return bytes;
}

void RouteStore::put(StoredRoutes routes) {
  const int64_t bytes = bytes_of(routes);
  std::lock_guard lock(mutex_);
  auto same = std::find_if(entries_.begin(), entries_.end(),
                           [&](const StoredRoutes& e) { return e.id == routes.id; });
  if (same != entries_.end()) {
    bytes_ -= bytes_of(*same);
    entries_.erase(same);
  }
  if (max_requests_ == 0 || bytes > max_bytes_) return;
  while (!entries_.empty() &&
         (static_cast<int64_t>(entries_.size()) >= max_requests_ || bytes_ + bytes > max_bytes_)) {
    bytes_ -= bytes_of(entries_.front());
    entries_.pop_front();
  }
  bytes_ += bytes;
  entries_.push_back(std::move(routes));
}

std::optional<StoredRoutes> RouteStore::get(const std::string& id) const {
  std::lock_guard lock(mutex_);
  for (const StoredRoutes& e : entries_) {
    if (e.id == id) return e;
  }
  return std::nullopt;
}

std::vector<std::string> RouteStore::ids() const {
  std::lock_guard lock(mutex_);
  std::vector<std::string> out;
  for (auto it = entries_.rbegin(); it != entries_.rend(); ++it) out.push_back(it->id);
  return out;
}

}  // namespace sy::server
