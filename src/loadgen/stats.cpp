#include "loadgen/stats.h"

#include <algorithm>
#include <cmath>
#include <sstream>

namespace sy::loadgen {

double percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  // numpy: virtual index (n-1)*q, then _lerp(a, b, t), which for t >= 0.5 computes from the upper
  // end (b - (b-a)*(1-t)) so that results are monotone and exact at t = 1.
  const double virtual_index = static_cast<double>(values.size() - 1) * (p / 100.0);
  const double below = std::floor(virtual_index);
  const size_t lower = static_cast<size_t>(std::clamp(below, 0.0, double(values.size() - 1)));
  const size_t upper = std::min(lower + 1, values.size() - 1);
  const double t = virtual_index - below;
  const double a = values[lower], b = values[upper];
  const double difference = b - a;
  return t >= 0.5 ? b - difference * (1 - t) : a + difference * t;
}

double mean(const std::vector<double>& values) {
  if (values.empty()) return 0;
  double sum = 0;
  for (double value : values) sum += value;
  return sum / static_cast<double>(values.size());
}

double median(const std::vector<double>& values) {
  if (values.empty()) return 0;
  std::vector<double> sorted = values;
  std::sort(sorted.begin(), sorted.end());
  const size_t n = sorted.size();
  return n % 2 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
}

double stddev(const std::vector<double>& values) {
  if (values.empty()) return 0;
  const double average = mean(values);
  double squares = 0;
  for (double value : values) squares += (value - average) * (value - average);
  return std::sqrt(squares / static_cast<double>(values.size()));
}

Distribution summarize_seconds(const std::vector<double>& values_s,
                               const std::vector<double>& percentiles) {
  Distribution distribution;
  distribution.mean_ms = mean(values_s) * 1000;
  distribution.median_ms = median(values_s) * 1000;
  distribution.std_ms = stddev(values_s) * 1000;
  for (double p : percentiles) {
    distribution.percentiles_ms.emplace_back(p, percentile(values_s, p) * 1000);
  }
  return distribution;
}

Result<GoodputSlo> parse_goodput(const std::string& text) {
  GoodputSlo slo;
  std::string normalized = text;
  std::replace(normalized.begin(), normalized.end(), ',', ' ');
  std::istringstream pairs(normalized);
  std::string pair;
  while (pairs >> pair) {
    const size_t colon = pair.find(':');
    if (colon == std::string::npos) {
      return Status::errorf("--goodput: '{}' is not NAME:MILLISECONDS (names: ttft, tpot, e2el)",
                            pair);
    }
    const std::string name = pair.substr(0, colon);
    const std::string number = pair.substr(colon + 1);
    char* end = nullptr;
    const double value_ms = std::strtod(number.c_str(), &end);
    if (number.empty() || *end != '\0' || !std::isfinite(value_ms)) {
      return Status::errorf("--goodput: '{}' in '{}' is not a number of milliseconds", number,
                            pair);
    }
    if (value_ms < 0) {
      return Status::errorf("--goodput: {} must be >= 0 ms, got {}", name, value_ms);
    }
    if (name == "ttft") {
      slo.ttft_ms = value_ms;
    } else if (name == "tpot") {
      slo.tpot_ms = value_ms;
    } else if (name == "e2el") {
      slo.e2el_ms = value_ms;
    } else {
      return Status::errorf("--goodput: unknown metric '{}'; valid: ttft, tpot, e2el", name);
    }
  }
  return slo;
}

namespace {

// Peak concurrency over half-open intervals [start, start + latency): a departure at the same
// instant as an arrival is counted first.
int peak_concurrency(const std::vector<const RequestOutput*>& successes) {
  std::vector<std::pair<double, int>> events;
  events.reserve(successes.size() * 2);
  for (const RequestOutput* output : successes) {
    events.emplace_back(output->start_time_s, 1);
    events.emplace_back(output->start_time_s + output->latency_s, -1);
  }
  std::sort(events.begin(), events.end());
  int current = 0, peak = 0;
  for (const auto& [time, delta] : events) {
    current += delta;
    peak = std::max(peak, current);
  }
  return peak;
}

// The busiest one-second bucket of chunk arrivals (first chunk at start + ttft, then each ITL).
double peak_output_tokens_per_s(const std::vector<const RequestOutput*>& successes) {
  if (successes.empty()) return 0;
  double first_start = successes[0]->start_time_s, last_end = 0;
  for (const RequestOutput* output : successes) {
    first_start = std::min(first_start, output->start_time_s);
    last_end = std::max(last_end, output->start_time_s + output->latency_s);
  }
  const long long buckets = static_cast<long long>(std::ceil(last_end - first_start)) + 1;
  std::vector<double> tokens_per_second(static_cast<size_t>(std::max(buckets, 1LL)), 0.0);
  for (const RequestOutput* output : successes) {
    double token_time = output->start_time_s + output->ttft_s;
    auto add = [&](double time) {
      const long long bucket = static_cast<long long>(time - first_start);  // truncates like int()
      if (bucket >= 0 && bucket < buckets) tokens_per_second[static_cast<size_t>(bucket)] += 1;
    };
    add(token_time);
    for (double gap : output->itl_s) {
      token_time += gap;
      add(token_time);
    }
  }
  return *std::max_element(tokens_per_second.begin(), tokens_per_second.end());
}

}  // namespace

BenchmarkMetrics compute_metrics(const std::vector<RequestOutput>& outputs, double duration_s,
                                 const std::vector<double>& percentiles, const GoodputSlo& slo,
                                 TokenCounter counter) {
  BenchmarkMetrics metrics;
  std::vector<double> ttfts, tpots, all_tpots, itls, e2els;
  std::vector<const RequestOutput*> successes;
  for (const RequestOutput& output : outputs) {
    if (!output.success) {
      metrics.output_lens.push_back(0);
      ++metrics.failed;
      continue;
    }
    int output_len = output.output_tokens;
    if (output_len == 0) {
      output_len = counter ? counter(output.generated_text) : 1;
    }
    metrics.output_lens.push_back(output_len);
    metrics.total_input_tokens += output.prompt_tokens;
    metrics.total_output_tokens += output_len;
    double tpot = 0;  // a request of <= 1 token has TPOT 0 for goodput and is left out of TPOT
    if (output_len > 1) {
      tpot = (output.latency_s - output.ttft_s) / (output_len - 1);
      tpots.push_back(tpot);
    }
    all_tpots.push_back(tpot);
    itls.insert(itls.end(), output.itl_s.begin(), output.itl_s.end());
    ttfts.push_back(output.ttft_s);
    e2els.push_back(output.latency_s);
    successes.push_back(&output);
    ++metrics.completed;
  }

  int good = 0;
  if (slo.any()) {
    for (size_t i = 0; i < ttfts.size(); ++i) {
      const bool meets = (!slo.ttft_ms || ttfts[i] <= *slo.ttft_ms / 1000) &&
                         (!slo.tpot_ms || all_tpots[i] <= *slo.tpot_ms / 1000) &&
                         (!slo.e2el_ms || e2els[i] <= *slo.e2el_ms / 1000);
      good += meets;
    }
  }

  const double total_output = static_cast<double>(metrics.total_output_tokens);
  metrics.request_throughput = metrics.completed / duration_s;
  metrics.request_goodput = good / duration_s;
  metrics.output_throughput = total_output / duration_s;
  metrics.total_token_throughput = (metrics.total_input_tokens + total_output) / duration_s;
  metrics.ttft = summarize_seconds(ttfts, percentiles);
  metrics.tpot = summarize_seconds(tpots, percentiles);
  metrics.itl = summarize_seconds(itls, percentiles);
  metrics.e2el = summarize_seconds(e2els, percentiles);
  metrics.max_output_tokens_per_s = peak_output_tokens_per_s(successes);
  metrics.max_concurrent_requests = peak_concurrency(successes);
  return metrics;
}

}  // namespace sy::loadgen
