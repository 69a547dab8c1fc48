// Prometheus text for /metrics: the engine's gauges and counters under vLLM's metric names, plus
// the server's own latency histograms (TTFT, time per output token, end-to-end).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace sy::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double value);
  // Appends the _bucket/_sum/_count lines of `name` with label set `labels` (`k="v"`).
  void render(const std::string& name, const std::string& labels, std::string& out) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket, not cumulative; last = +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

class ServerMetrics {
 public:
  ServerMetrics();
  // One finished choice (an engine request).
  void record_choice(double ttft_s, double e2e_s, int64_t generated_tokens,
                     const std::string& finish_reason);
  void record_http_status(int status);
  std::string render(const std::string& model_name, const engine::EngineMetrics& engine) const;

 private:
  mutable std::mutex mutex_;
  Histogram ttft_;
  Histogram tpot_;
  Histogram e2e_;
  std::map<std::string, uint64_t> finished_by_reason_;
  std::map<int, uint64_t> http_by_status_;
};

}  // namespace sy::server
