// The benchmark's result: vLLM's "Serving Benchmark Result" table on stdout and its result-file
// keys (mean_ttft_ms, p99_itl_ms, request_throughput, ...) in JSON, plus Switchyard's checks.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "loadgen/client.h"
#include "loadgen/stats.h"

namespace sy::loadgen {

struct ReportContext {
  std::string endpoint;
  std::string model;
  std::string base_url;
  std::string tokenizer;  // "" when none
  int num_prompts = 0;
  double request_rate = 0;  // inf allowed
  double burstiness = 1;
  int max_concurrency = 0;
  std::vector<double> percentiles;
  bool goodput = false;
  bool routed_experts = false;
  // Cross-check of the usage counts against the tokenizer (-1: no tokenizer).
  long long tokenizer_output_tokens = -1;
  int tokenizer_output_mismatch = 0;  // requests where usage and tokenizer disagree
};

std::string format_report(const ReportContext& context, const BenchmarkMetrics& metrics,
                          const RunResult& run);
// `detailed` adds the per-request arrays (ttfts, itls, output_lens, errors, ...).
nlohmann::ordered_json report_json(const ReportContext& context, const BenchmarkMetrics& metrics,
                           const RunResult& run, bool detailed);

}  // namespace sy::loadgen
