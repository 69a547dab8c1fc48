// Serving-benchmark statistics with `vllm bench serve`'s definitions (vllm/benchmarks/serve.py,
// calculate_metrics): TTFT, TPOT, ITL, E2EL, throughputs, goodput, peak concurrency.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "util/status.h"

namespace sy::loadgen {

// What one request measured on the client. Times are seconds on one monotonic clock.
struct RequestOutput {
  bool success = false;
  std::string error;
  double start_time_s = 0;      // when the request was sent (after any concurrency wait)
  double ttft_s = 0;            // first chunk that carries a choice, minus start
  std::vector<double> itl_s;    // gaps between consecutive chunks that carry a choice
  double latency_s = 0;         // last chunk that carries a choice, minus start (E2EL)
  int prompt_tokens = 0;        // usage.prompt_tokens when the server sent it, else the dataset's
  int output_tokens = 0;        // usage.completion_tokens; 0 when the server sent none
  std::string generated_text;
};

// numpy's default ("linear") percentile, p in [0, 100]; 0 for an empty list, as vLLM's
// `np.percentile(values or 0, p)` gives.
double percentile(std::vector<double> values, double p);
double mean(const std::vector<double>& values);
double median(const std::vector<double>& values);
// Population standard deviation (numpy's default ddof=0).
double stddev(const std::vector<double>& values);

// Mean, median, std and the requested percentiles of one metric, in milliseconds.
struct Distribution {
  double mean_ms = 0;
  double median_ms = 0;
  double std_ms = 0;
  std::vector<std::pair<double, double>> percentiles_ms;  // (p, value)
};
Distribution summarize_seconds(const std::vector<double>& values_s,
                               const std::vector<double>& percentiles);

// Service-level objectives for goodput, in milliseconds (vLLM's --goodput ttft:X tpot:Y e2el:Z).
struct GoodputSlo {
  std::optional<double> ttft_ms;
  std::optional<double> tpot_ms;
  std::optional<double> e2el_ms;
  bool any() const { return ttft_ms || tpot_ms || e2el_ms; }
};
// Parses "ttft:100 tpot:50" / "ttft:100,e2el:2000"; names must be ttft, tpot or e2el.
Result<GoodputSlo> parse_goodput(const std::string& text);

struct BenchmarkMetrics {
  int completed = 0;
  int failed = 0;
  long long total_input_tokens = 0;
  long long total_output_tokens = 0;
  double request_throughput = 0;      // completed / duration
  double request_goodput = 0;         // requests meeting every SLO / duration
  double output_throughput = 0;       // output tokens / duration
  double total_token_throughput = 0;  // (input + output tokens) / duration
  Distribution ttft, tpot, itl, e2el;
  double max_output_tokens_per_s = 0;  // busiest one-second bucket of chunk arrivals
  int max_concurrent_requests = 0;     // sweep over [start, start + latency) of successes
  std::vector<int> output_lens;        // per request (0 for failures), as counted above
};

// Counts the tokens of generated text when the server sent no usage; empty counts 1 per
// request, as vLLM does without a tokenizer.
using TokenCounter = std::function<int(const std::string& text)>;

BenchmarkMetrics compute_metrics(const std::vector<RequestOutput>& outputs, double duration_s,
                                 const std::vector<double>& percentiles, const GoodputSlo& slo,
                                 TokenCounter counter = {});

}  // namespace sy::loadgen
