// Expert load (tokens routed to each expert of each MoE layer), counted off the engine thread.
// A prefill step of Qwen3-30B-A3B holds ~800k route ids; counting them where the step loop runs
// was most of capture's host cost. The engine hands each step's route rows over (the vector
// moves, nothing is copied) and takes a spare vector back for the next step.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

namespace sy::engine {

class ExpertLoadCounter {
 public:
  // Rows are [num_hidden_layers * top_k] ids; `moe_layers` are the layers counted.
  ExpertLoadCounter(std::vector<int> moe_layers, int64_t num_experts, int64_t num_hidden_layers,
                    int64_t top_k);
  ~ExpertLoadCounter();
  ExpertLoadCounter(const ExpertLoadCounter&) = delete;
  ExpertLoadCounter& operator=(const ExpertLoadCounter&) = delete;

  // Counts the first `rows` rows of `routes` (ids already checked in range) on the counter's
  // thread; the vector comes back through spare().
  void add(std::vector<int32_t> routes, int64_t rows);
  // A vector to fill next (the capacity of an earlier step's), or an empty one.
  std::vector<int32_t> spare();
  // The totals, [moe_layers.size() * num_experts], after every step handed over so far is counted.
  std::vector<int64_t> totals();

 private:
  void run();
  void count(const std::vector<int32_t>& routes, int64_t rows);

  const std::vector<int> moe_layers_;
  const int64_t num_experts_, row_ints_, top_k_;
  std::mutex mutex_;
  std::condition_variable wake_, idle_;
  struct Work {
    std::vector<int32_t> routes;
    int64_t rows;
  };
  std::deque<Work> queue_;
  bool busy_ = false, stopping_ = false;
  std::vector<std::vector<int32_t>> spares_;
  std::vector<int64_t> totals_;  // written by the counter's thread under mutex_
  std::vector<int64_t> local_;   // the counter's thread's histograms, kept between steps
  std::thread thread_;
};

}  // namespace sy::engine
