// The load generator's client: one process, one thread, Boost.Beast/Asio coroutines; every
// request streams over its own keep-alive connection (reused when idle), arrivals follow the
// schedule, an optional semaphore caps concurrency, and each chunk is timestamped on arrival.
#pragma once

#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "loadgen/api.h"
#include "loadgen/dataset.h"
#include "loadgen/route_check.h"
#include "loadgen/stats.h"
#include "util/status.h"

namespace sy::loadgen {

struct BaseUrl {
  std::string host;
  std::string port;
  std::string path_prefix;  // "" or "/something" (no trailing slash)
};
// "http://HOST[:PORT][/PREFIX]"; https is refused (the tool drives servers on trusted networks).
Result<BaseUrl> parse_base_url(const std::string& url);

struct BenchConfig {
  std::string base_url = "http://127.0.0.1:8000";
  Endpoint endpoint = Endpoint::kCompletions;
  RequestOptions request;
  bool text_prompts = true;
  double request_rate = std::numeric_limits<double>::infinity();
  double burstiness = 1.0;
  int max_concurrency = 0;  // 0: no cap
  uint64_t seed = 0;
  double request_timeout_s = 600;
  bool progress = false;     // a progress bar on stderr
  bool ready_check = true;   // one request first; abort if it fails (vLLM does the same)
  RouteExpectation route_expectation;
};

struct RouteReport {
  int checked = 0;  // successful requests whose routes were checked
  int failed = 0;   // of those, missing or wrong
  std::vector<std::string> first_errors;  // up to 5, "request I: why"
  std::optional<RouteShape> layout;       // (L, K) of the first good payload; later ones must match
};

struct RunResult {
  std::vector<RequestOutput> outputs;  // in dataset order
  std::vector<int> choice_chunks;      // chunks carrying a choice, per request
  double duration_s = 0;
  int peak_open_streams = 0;  // requests in flight at once, counted by the client
  double client_cpu_s = 0;    // user + system CPU of this process during the run
  int usage_missing = 0;      // successful requests whose stream had no usage counts
  int prompt_len_mismatch = 0;  // usage.prompt_tokens != the dataset's (not checked for chat)
  RouteReport routes;
};

// Runs every request of `requests` against the server (after a single ready-check request when
// asked). Fails only when the run could not happen; failed requests are counted in the outputs.
Result<RunResult> run_benchmark(const BenchConfig& config,
                                const std::vector<DatasetRequest>& requests);

// The first model card of GET /v1/models: its id is vLLM's default for --model; Switchyard's card
// also gives the route layout (num_hidden_layers, top_k, num_experts).
struct ModelCard {
  std::string id;
  std::optional<int64_t> num_hidden_layers, top_k, num_experts;
};
Result<ModelCard> fetch_first_model(const std::string& base_url, double timeout_s);

// Raises the soft open-file limit to the hard one (thousands of streams need thousands of
// descriptors); returns the limit now in force.
long raise_fd_limit();

}  // namespace sy::loadgen
