#include "engine/expert_load.h"

#include <utility>

namespace sy::engine {

ExpertLoadCounter::ExpertLoadCounter(std::vector<int> moe_layers, int64_t num_experts,
                                     int64_t num_hidden_layers, int64_t top_k)
    : moe_layers_(std::move(moe_layers)),
      num_experts_(num_experts),
      row_ints_(num_hidden_layers * top_k),
      top_k_(top_k),
      totals_(moe_layers_.size() * static_cast<size_t>(num_experts), 0) {
  thread_ = std::thread([this] { run(); });
}

ExpertLoadCounter::~ExpertLoadCounter() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_one();
  thread_.join();
}

void ExpertLoadCounter::add(std::vector<int32_t> routes, int64_t rows) {
  {
    std::lock_guard lock(mutex_);
    queue_.push_back({std::move(routes), rows});
  }
  wake_.notify_one();
}

std::vector<int32_t> ExpertLoadCounter::spare() {
  std::lock_guard lock(mutex_);
  if (spares_.empty()) return {};
  std::vector<int32_t> out = std::move(spares_.back());
  spares_.pop_back();
  return out;
}

std::vector<int64_t> ExpertLoadCounter::totals() {
  std::unique_lock lock(mutex_);
  idle_.wait(lock, [&] { return queue_.empty() && !busy_; });
  return totals_;
}

void ExpertLoadCounter::run() {
  std::unique_lock lock(mutex_);
  for (;;) {
    wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, nothing left
    Work work = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    lock.unlock();
    count(work.routes, work.rows);
    lock.lock();
    busy_ = false;
    work.routes.clear();
    if (spares_.size() < 4) spares_.push_back(std::move(work.routes));
    if (queue_.empty()) idle_.notify_all();
  }
}

// Counted into a local histogram first (the shared totals are touched once per step, under the
// lock); four interleaved histograms so repeated ids do not chain through one counter.
void ExpertLoadCounter::count(const std::vector<int32_t>& routes, int64_t rows) {
  const size_t cells = totals_.size();
  std::vector<int64_t>& local = local_;  // (only this thread touches it)
  local.assign(4 * cells, 0);
  const size_t experts = static_cast<size_t>(num_experts_);
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t* row = routes.data() + r * row_ints_;
    for (size_t m = 0; m < moe_layers_.size(); ++m) {
      const int32_t* ids = row + moe_layers_[m] * top_k_;
      int64_t* base = local.data() + m * experts;
      for (int64_t k = 0; k < top_k_; ++k)
        ++base[static_cast<size_t>(k & 3) * cells + static_cast<size_t>(ids[k])];
    }
  }
  std::lock_guard lock(mutex_);
  for (size_t i = 0; i < cells; ++i)
    totals_[i] += local[i] + local[cells + i] + local[2 * cells + i] + local[3 * cells + i];
}

}  // namespace sy::engine
