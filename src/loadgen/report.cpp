#include "loadgen/report.h"

#include <cmath>
#include <ctime>

namespace sy::loadgen {

namespace {

std::string percentile_word(double p) {
  return p == std::floor(p) ? fmt::format("{}", static_cast<long long>(p)) : fmt::format("{}", p);
}

void line(std::string& out, const std::string& label, const std::string& value) {
  out += fmt::format("{:<40} {:<10}\n", label, value);
}
void line(std::string& out, const std::string& label, double value) {
  out += fmt::format("{:<40} {:<10.2f}\n", label, value);
}

void header(std::string& out, const std::string& title, char fill) {
  const size_t width = 50, padding = title.size() < width ? width - title.size() : 0;
  out += std::string(padding / 2, fill) + title + std::string(padding - padding / 2, fill) + "\n";
}

struct MetricName {
  const char* key;
  const char* label;
  const char* title;
  const Distribution BenchmarkMetrics::*distribution;
};
constexpr MetricName kMetrics[] = {
    {"ttft", "TTFT", "Time to First Token", &BenchmarkMetrics::ttft},
    {"tpot", "TPOT", "Time per Output Token (excl. 1st token)", &BenchmarkMetrics::tpot},
    {"itl", "ITL", "Inter-token Latency", &BenchmarkMetrics::itl},
    {"e2el", "E2EL", "End-to-end Latency", &BenchmarkMetrics::e2el},
};

}  // namespace

std::string format_report(const ReportContext& context, const BenchmarkMetrics& metrics,
                          const RunResult& run) {
  std::string out;
  header(out, " Serving Benchmark Result ", '=');
  line(out, "Successful requests:", std::to_string(metrics.completed));
  line(out, "Failed requests:", std::to_string(metrics.failed));
  if (context.max_concurrency > 0) {
    line(out, "Maximum request concurrency:", std::to_string(context.max_concurrency));
  }
  if (!std::isinf(context.request_rate)) line(out, "Request rate configured (RPS):", context.request_rate);
  line(out, "Benchmark duration (s):", run.duration_s);
  line(out, "Total input tokens:", std::to_string(metrics.total_input_tokens));
  line(out, "Total generated tokens:", std::to_string(metrics.total_output_tokens));
  line(out, "Request throughput (req/s):", metrics.request_throughput);
  if (context.goodput) line(out, "Request goodput (req/s):", metrics.request_goodput);
  line(out, "Output token throughput (tok/s):", metrics.output_throughput);
  line(out, "Peak output token throughput (tok/s):", metrics.max_output_tokens_per_s);
  line(out, "Peak concurrent requests:", static_cast<double>(metrics.max_concurrent_requests));
  line(out, "Total token throughput (tok/s):", metrics.total_token_throughput);
  for (const MetricName& name : kMetrics) {
    const Distribution& distribution = metrics.*name.distribution;
    header(out, name.title, '-');
    line(out, fmt::format("Mean {} (ms):", name.label), distribution.mean_ms);
    line(out, fmt::format("Median {} (ms):", name.label), distribution.median_ms);
    for (const auto& [p, value] : distribution.percentiles_ms) {
      line(out, fmt::format("P{} {} (ms):", percentile_word(p), name.label), value);
    }
  }
  header(out, "Switchyard checks", '-');
  line(out, "Peak open streams (client):", std::to_string(run.peak_open_streams));
  line(out, "Client CPU (% of one core):", run.duration_s > 0 ? 100 * run.client_cpu_s / run.duration_s : 0.0);
  line(out, "Requests without usage counts:", std::to_string(run.usage_missing));
  line(out, "Prompt length != usage.prompt_tokens:", std::to_string(run.prompt_len_mismatch));
  if (context.tokenizer_output_tokens >= 0) {
    line(out, "Output tokens by tokenizer:", std::to_string(context.tokenizer_output_tokens));
    line(out, "Requests where they disagree:", std::to_string(context.tokenizer_output_mismatch));
  }
  if (context.routed_experts) {
    line(out, "Routes checked:", std::to_string(run.routes.checked));
    line(out, "Routes failed:", std::to_string(run.routes.failed));
    if (run.routes.layout) {
      line(out, "Route layout (L, K):",
           fmt::format("{}, {}", run.routes.layout->layers, run.routes.layout->top_k));
    }
    for (const std::string& error : run.routes.first_errors) out += "  " + error + "\n";
  }
  out += std::string(50, '=') + "\n";
  return out;
}

nlohmann::ordered_json report_json(const ReportContext& context, const BenchmarkMetrics& metrics,
                           const RunResult& run, bool detailed) {
  using json = nlohmann::ordered_json;
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y%m%d-%H%M%S", std::localtime(&now));
  json result = {
      {"date", date},
      {"backend", "switchyard-bench"},
      {"endpoint_type", context.endpoint},
      {"base_url", context.base_url},
      {"model_id", context.model},
      {"tokenizer_id", context.tokenizer},
      {"num_prompts", context.num_prompts},
      {"request_rate", std::isinf(context.request_rate) ? json("inf") : json(context.request_rate)},
      {"burstiness", context.burstiness},
      {"max_concurrency", context.max_concurrency > 0 ? json(context.max_concurrency) : json()},
      {"duration", run.duration_s},
      {"completed", metrics.completed},
      {"failed", metrics.failed},
      {"total_input_tokens", metrics.total_input_tokens},
      {"total_output_tokens", metrics.total_output_tokens},
      {"request_throughput", metrics.request_throughput},
      {"request_goodput", context.goodput ? json(metrics.request_goodput) : json()},
      {"output_throughput", metrics.output_throughput},
      {"total_token_throughput", metrics.total_token_throughput},
      {"max_output_tokens_per_s", metrics.max_output_tokens_per_s},
      {"max_concurrent_requests", metrics.max_concurrent_requests},
      {"peak_open_streams", run.peak_open_streams},
      {"client_cpu_s", run.client_cpu_s},
      {"client_cpu_percent", run.duration_s > 0 ? 100 * run.client_cpu_s / run.duration_s : 0.0},
      {"usage_missing", run.usage_missing},
      {"prompt_len_mismatch", run.prompt_len_mismatch},
  };
  for (const MetricName& name : kMetrics) {
    const Distribution& distribution = metrics.*name.distribution;
    result[fmt::format("mean_{}_ms", name.key)] = distribution.mean_ms;
    result[fmt::format("median_{}_ms", name.key)] = distribution.median_ms;
    result[fmt::format("std_{}_ms", name.key)] = distribution.std_ms;
    for (const auto& [p, value] : distribution.percentiles_ms) {
      result[fmt::format("p{}_{}_ms", percentile_word(p), name.key)] = value;
    }
  }
  if (context.tokenizer_output_tokens >= 0) {
    result["tokenizer_output_tokens"] = context.tokenizer_output_tokens;
    result["tokenizer_output_mismatch"] = context.tokenizer_output_mismatch;
  }
  if (context.routed_experts) {
    result["routes_checked"] = run.routes.checked;
    result["routes_failed"] = run.routes.failed;
    result["route_errors"] = run.routes.first_errors;
    if (run.routes.layout) {
      result["route_layers"] = run.routes.layout->layers;
      result["route_top_k"] = run.routes.layout->top_k;
    }
  }
  if (detailed) {
    json input_lens = json::array(), ttfts = json::array(), itls = json::array(),
         latencies = json::array(), start_times = json::array(), errors = json::array(),
         texts = json::array();
    for (const RequestOutput& output : run.outputs) {
      input_lens.push_back(output.prompt_tokens);
      ttfts.push_back(output.ttft_s);
      itls.push_back(output.itl_s);
      latencies.push_back(output.latency_s);
      start_times.push_back(output.start_time_s);
      errors.push_back(output.error);
      texts.push_back(output.generated_text);
    }
    result["input_lens"] = input_lens;
    result["output_lens"] = metrics.output_lens;
    result["ttfts"] = ttfts;
    result["itls"] = itls;
    result["latencies"] = latencies;
    result["start_times"] = start_times;
    result["errors"] = errors;
    result["generated_texts"] = texts;
    result["choice_chunks"] = run.choice_chunks;
  }
  return result;
}

}  // namespace sy::loadgen
