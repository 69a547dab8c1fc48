#include "server/metrics.h"

#include <fmt/format.h>

#include <algorithm>

namespace sy::server {

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  size_t bucket = 0;
  while (bucket < bounds_.size() && value > bounds_[bucket]) ++bucket;
  ++counts_[bucket];
  sum_ += value;
  ++count_;
}

void Histogram::render(const std::string& name, const std::string& labels, std::string& out) const {
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    out += fmt::format("{}_bucket{{{},le=\"{}\"}} {}\n", name, labels, bounds_[i], cumulative);
  }
  cumulative += counts_.back();
  out += fmt::format("{}_bucket{{{},le=\"+Inf\"}} {}\n", name, labels, cumulative);
  out += fmt::format("{}_sum{{{}}} {}\n", name, labels, sum_);
  out += fmt::format("{}_count{{{}}} {}\n", name, labels, count_);
}

// vLLM's bucket boundaries, so dashboards built for it read ours the same way.
ServerMetrics::ServerMetrics()
    : ttft_({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,   0.75,
             1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}),
      tpot_({0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
             10.0, 20.0, 40.0, 80.0}),
      e2e_({0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
            30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}) {}

void ServerMetrics::record_choice(double ttft_s, double e2e_s, int64_t generated_tokens,
                                  const std::string& finish_reason) {
  std::lock_guard lock(mutex_);
  if (ttft_s >= 0) ttft_.observe(ttft_s);
  if (ttft_s >= 0 && generated_tokens > 1) {
    tpot_.observe((e2e_s - ttft_s) / static_cast<double>(generated_tokens - 1));
  }
  e2e_.observe(e2e_s);
  ++finished_by_reason_[finish_reason];
}

void ServerMetrics::record_http_status(int status) {
  std::lock_guard lock(mutex_);
  ++http_by_status_[status];
}

static void metric(std::string& out, const char* name, const char* type, const char* help,
                   const std::string& labels, double value) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n{}{{{}}} {}\n", name, help, name, type, name,
                     labels, value);
}

// Per MoE layer: tokens routed to each expert (counter family) and max/mean of those counts
// (1 = perfectly even; 0 before any token was routed).
static void render_expert_load(const std::string& labels, const engine::EngineMetrics& e,
                               std::string& out) {
  const size_t experts = static_cast<size_t>(e.num_experts);
  if (experts == 0 || e.expert_load_tokens.size() != e.moe_layers.size() * experts) return;
  out +=
      "# HELP switchyard:expert_load_tokens_total Tokens routed to each expert of each MoE layer "
      "by the forward pass (top_k per token).\n"
      "# TYPE switchyard:expert_load_tokens_total counter\n";
  std::string imbalance =
      "# HELP switchyard:expert_load_imbalance Max over mean of a MoE layer's expert load "
      "counts.\n"
      "# TYPE switchyard:expert_load_imbalance gauge\n";
  for (size_t m = 0; m < e.moe_layers.size(); ++m) {
    int64_t max_load = 0, sum = 0;
    for (size_t x = 0; x < experts; ++x) {
      const int64_t load = e.expert_load_tokens[m * experts + x];
      max_load = std::max(max_load, load);
      sum += load;
      out +=
          fmt::format("switchyard:expert_load_tokens_total{{{},layer=\"{}\",expert=\"{}\"}} {}\n",
                      labels, e.moe_layers[m], x, load);
    }
    const double mean = double(sum) / double(experts);
    imbalance += fmt::format("switchyard:expert_load_imbalance{{{},layer=\"{}\"}} {}\n", labels,
                             e.moe_layers[m], mean > 0 ? double(max_load) / mean : 0.0);
  }
  out += imbalance;
}

std::string ServerMetrics::render(const std::string& model_name,
                                  const engine::EngineMetrics& e) const {
  std::string labels = fmt::format("model_name=\"{}\"", model_name);
  std::string out;
  metric(out, "vllm:num_requests_running", "gauge", "Requests in the running batch.", labels,
         double(e.running_requests));
  metric(out, "vllm:num_requests_waiting", "gauge", "Requests waiting to be scheduled.", labels,
         double(e.waiting_requests));
  double usage = e.kv_blocks_total > 0 ? double(e.kv_blocks_used) / double(e.kv_blocks_total) : 0;
  metric(out, "vllm:kv_cache_usage_perc", "gauge", "Fraction of KV blocks in use (1 = full).",
         labels, usage);
  metric(out, "vllm:prefix_cache_queries_total", "counter",
         "Prompt tokens looked up in the prefix cache.", labels,
         double(e.prefix_cache_queries_tokens));
  metric(out, "vllm:prefix_cache_hits_total", "counter",
         "Prompt tokens served by the prefix cache.", labels, double(e.prefix_cache_hits_tokens));
  metric(out, "vllm:prompt_tokens_total", "counter", "Prompt tokens admitted.", labels,
         double(e.prompt_tokens_total));
  metric(out, "vllm:generation_tokens_total", "counter", "Tokens generated.", labels,
         double(e.generation_tokens_total));
  metric(out, "vllm:num_preemptions_total", "counter", "Preemptions (KV freed, recomputed later).",
         labels, double(e.preemptions_total));
  metric(out, "switchyard:prompt_tokens_computed_total", "counter",
         "Prompt tokens that went through the forward pass (admitted minus prefix-cache hits).",
         labels, double(e.prompt_tokens_computed));
  metric(out, "switchyard:kv_blocks_total", "gauge", "KV cache blocks.", labels,
         double(e.kv_blocks_total));
  metric(out, "switchyard:kv_blocks_used", "gauge", "KV blocks referenced by requests.", labels,
         double(e.kv_blocks_used));
  metric(out, "switchyard:kv_blocks_cached", "gauge",
         "Unreferenced KV blocks holding reusable prefix content (and its routes).", labels,
         double(e.kv_blocks_cached));
  metric(out, "switchyard:kv_blocks_free", "gauge", "Empty KV blocks.", labels,
         double(e.kv_blocks_free));
  metric(out, "switchyard:route_capture_errors_total", "counter",
         "Requests failed because a route was not written by any kernel.", labels,
         double(e.route_capture_errors_total));

  metric(out, "switchyard:engine_steps_total", "counter", "Steps the engine ran.", labels,
         double(e.steps_total));
  metric(out, "switchyard:engine_step_seconds_total", "counter",
         "Engine-thread time of every step, scheduling to delivered events.", labels, e.step_seconds_total);
  metric(out, "switchyard:route_host_seconds_total", "counter",
         "Engine-thread time spent on routes after the device finished (copy and check, route log, expert "
         "load): capture's host cost, against engine_step_seconds_total.",
         labels, e.route_host_seconds_total);
  metric(out, "switchyard:routes_captured_total", "counter",
         "Route rows logged from a forward pass (first computation of a position).", labels,
         double(e.routes_captured_total));
  metric(out, "switchyard:routes_replayed_total", "counter",
         "Route rows computed with forced routes (routed_experts_replay, recompute after "
         "preemption).",
         labels, double(e.routes_replayed_total));
  metric(out, "switchyard:routes_poisoned_total", "counter",
         "Route rows a kernel left unwritten (their requests failed with a 500).", labels,
         double(e.routes_poisoned_total));
  render_expert_load(labels, e, out);

  std::lock_guard lock(mutex_);
  out +=
      "# HELP vllm:request_success_total Finished requests by finish reason.\n"
      "# TYPE vllm:request_success_total counter\n";
  for (const auto& [reason, count] : finished_by_reason_) {
    out += fmt::format("vllm:request_success_total{{{},finished_reason=\"{}\"}} {}\n", labels,
                       reason, count);
  }
  out +=
      "# HELP vllm:time_to_first_token_seconds Time to first token.\n"
      "# TYPE vllm:time_to_first_token_seconds histogram\n";
  ttft_.render("vllm:time_to_first_token_seconds", labels, out);
  out +=
      "# HELP vllm:time_per_output_token_seconds Time per output token after the first.\n"
      "# TYPE vllm:time_per_output_token_seconds histogram\n";
  tpot_.render("vllm:time_per_output_token_seconds", labels, out);
  out +=
      "# HELP vllm:e2e_request_latency_seconds End-to-end request latency.\n"
      "# TYPE vllm:e2e_request_latency_seconds histogram\n";
  e2e_.render("vllm:e2e_request_latency_seconds", labels, out);
  out +=
      "# HELP switchyard:http_responses_total HTTP responses by status code.\n"
      "# TYPE switchyard:http_responses_total counter\n";
  for (const auto& [status, count] : http_by_status_) {
    out += fmt::format("switchyard:http_responses_total{{{},status=\"{}\"}} {}\n", labels, status,
                       count);
  }
  return out;
}

}  // namespace sy::server
