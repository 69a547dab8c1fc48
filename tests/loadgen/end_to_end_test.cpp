// The client against the in-process stub server over loopback: every request streams, chunk
// timings add up, usage counts arrive, caps and rates hold, routes are checked, 2,000 streams
// are held open at once.
#include <gtest/gtest.h>

#include <cmath>

#include "loadgen/client.h"
#include "loadgen/stats.h"
#include "loadgen/stub_server.h"

namespace sy::loadgen {
namespace {

std::vector<DatasetRequest> token_id_requests(int count, int input_len, int output_len) {
  RandomDatasetOptions options;
  options.num_prompts = count;
  options.input_len = input_len;
  options.output_len = output_len;
  options.text_prompts = false;
  TokenCodec codec;
  codec.vocab_size = 1000;
  auto dataset = make_random_dataset(options, codec);
  EXPECT_TRUE(dataset) << dataset.message();
  return dataset->requests;
}

std::unique_ptr<StubServer> start_stub(StubServerOptions options = {}) {
  auto server = StubServer::start(options);
  EXPECT_TRUE(server) << server.message();
  return std::move(server).value();
}

BenchConfig config_for(const StubServer& server, Endpoint endpoint = Endpoint::kCompletions) {
  BenchConfig config;
  config.base_url = "http://127.0.0.1:" + std::to_string(server.port());
  config.endpoint = endpoint;
  config.request.model = "stub";
  config.text_prompts = false;
  config.request_timeout_s = 60;
  return config;
}

void expect_consistent(const RunResult& run, const std::vector<DatasetRequest>& requests) {
  ASSERT_EQ(run.outputs.size(), requests.size());
  for (size_t i = 0; i < run.outputs.size(); ++i) {
    const RequestOutput& output = run.outputs[i];
    ASSERT_TRUE(output.success) << "request " << i << ": " << output.error;
    const int tokens = requests[i].expected_output_len;
    EXPECT_EQ(output.output_tokens, tokens) << i;             // usage.completion_tokens
    EXPECT_EQ(run.choice_chunks[i], tokens) << i;             // one chunk per token
    EXPECT_EQ(output.itl_s.size(), static_cast<size_t>(tokens - 1)) << i;
    EXPECT_EQ(output.prompt_tokens, requests[i].prompt_len) << i;
    double sum = output.ttft_s;
    for (double gap : output.itl_s) {
      EXPECT_GE(gap, 0);
      sum += gap;
    }
    EXPECT_NEAR(sum, output.latency_s, 1e-9) << i;  // E2EL = TTFT + sum of ITLs
    EXPECT_GT(output.ttft_s, 0);
    EXPECT_GE(output.start_time_s, 0);
    EXPECT_LE(output.start_time_s + output.latency_s, run.duration_s + 1e-6);
  }
  EXPECT_EQ(run.usage_missing, 0);
  EXPECT_EQ(run.prompt_len_mismatch, 0);
}

TEST(EndToEnd, ThreeHundredCompletionsAtInfiniteRate) {
  auto server = start_stub();
  const auto requests = token_id_requests(300, 32, 24);
  auto run = run_benchmark(config_for(*server), requests);
  ASSERT_TRUE(run) << run.message();
  expect_consistent(*run, requests);
  const BenchmarkMetrics metrics = compute_metrics(run->outputs, run->duration_s, {50, 99}, {});
  EXPECT_EQ(metrics.completed, 300);
  EXPECT_EQ(metrics.failed, 0);
  EXPECT_EQ(metrics.total_output_tokens, 300 * 24);
  EXPECT_EQ(metrics.total_input_tokens, 300 * 32);
  EXPECT_GT(metrics.max_concurrent_requests, 1);
  EXPECT_GE(run->peak_open_streams, metrics.max_concurrent_requests);
  EXPECT_GE(server->requests_served(), 301);  // + the ready check
}

TEST(EndToEnd, ChatAndGenerateEndpoints) {
  StubServerOptions options;
  options.split_events = true;  // every SSE event arrives in two HTTP chunks, cut mid-JSON
  auto server = start_stub(options);
  auto requests = token_id_requests(100, 16, 10);
  for (DatasetRequest& request : requests) request.prompt_text = "one two three";
  for (Endpoint endpoint : {Endpoint::kChat, Endpoint::kGenerate, Endpoint::kCompletions}) {
    BenchConfig config = config_for(*server, endpoint);
    config.text_prompts = endpoint == Endpoint::kChat;
    auto run = run_benchmark(config, requests);
    ASSERT_TRUE(run) << run.message();
    for (size_t i = 0; i < requests.size(); ++i) {
      ASSERT_TRUE(run->outputs[i].success) << endpoint_name(endpoint) << " " << run->outputs[i].error;
      EXPECT_EQ(run->outputs[i].output_tokens, requests[i].expected_output_len);
      EXPECT_EQ(run->choice_chunks[i], requests[i].expected_output_len);
      std::string expected_text;
      for (int t = 0; t < requests[i].expected_output_len; ++t) expected_text += " tok";
      EXPECT_EQ(run->outputs[i].generated_text, expected_text) << endpoint_name(endpoint);
    }
  }
}

TEST(EndToEnd, MaxConcurrencyCapsStreamsInFlight) {
  StubServerOptions options;
  options.token_interval_s = 0.002;
  auto server = start_stub(options);
  const auto requests = token_id_requests(64, 8, 10);
  BenchConfig config = config_for(*server);
  config.max_concurrency = 8;
  auto run = run_benchmark(config, requests);
  ASSERT_TRUE(run) << run.message();
  expect_consistent(*run, requests);
  EXPECT_EQ(run->peak_open_streams, 8);
  EXPECT_LE(compute_metrics(run->outputs, run->duration_s, {}, {}).max_concurrent_requests, 8);
}

TEST(EndToEnd, RequestRateSpreadsArrivals) {
  auto server = start_stub();
  const auto requests = token_id_requests(60, 8, 4);
  BenchConfig config = config_for(*server);
  config.request_rate = 100;  // the last request goes out at 60/100 = 0.6 s
  auto run = run_benchmark(config, requests);
  ASSERT_TRUE(run) << run.message();
  expect_consistent(*run, requests);
  double last_start = 0;
  for (const RequestOutput& output : run->outputs) last_start = std::max(last_start, output.start_time_s);
  EXPECT_NEAR(last_start, 0.6, 0.1);
  EXPECT_GE(run->duration_s, 0.6);
}

TEST(EndToEnd, RoutesAreCheckedAndBadOnesCounted) {
  StubServerOptions options;
  options.route_layers = 3;
  options.route_top_k = 2;
  options.route_num_experts = 16;
  options.corrupt_routes_every = 7;  // every 7th routed response has one row too few
  auto server = start_stub(options);
  const auto requests = token_id_requests(300, 20, 6);
  for (Endpoint endpoint : {Endpoint::kCompletions, Endpoint::kGenerate}) {
    BenchConfig config = config_for(*server, endpoint);
    config.request.routed_experts = true;
    config.route_expectation.num_experts = 16;
    auto run = run_benchmark(config, requests);
    ASSERT_TRUE(run) << run.message();
    EXPECT_EQ(run->routes.checked, 300);
    // This server's responses are counted across both runs and their ready checks; each run
    // sends 301 routed requests, and every 7th of all of them is corrupted.
    const long first = endpoint == Endpoint::kCompletions ? 2 : 303, last = first + 299;
    const long corrupted = last / 7 - (first - 1) / 7;
    EXPECT_EQ(run->routes.failed, corrupted) << endpoint_name(endpoint);
    ASSERT_TRUE(run->routes.layout.has_value());
    if (endpoint == Endpoint::kCompletions) {
      EXPECT_EQ(run->routes.layout->layers, 3);
      EXPECT_EQ(run->routes.layout->top_k, 2);
    } else {
      EXPECT_EQ(run->routes.layout->layers * run->routes.layout->top_k, 6);
    }
    ASSERT_FALSE(run->routes.first_errors.empty());
    EXPECT_NE(run->routes.first_errors[0].find("rows"), std::string::npos) << run->routes.first_errors[0];
  }
  // Routes asked for but never sent: every request fails the check, and says why.
  StubServerOptions silent;
  silent.send_routes = false;
  auto plain = start_stub(silent);
  BenchConfig config = config_for(*plain);
  config.request.routed_experts = true;
  auto run = run_benchmark(config, token_id_requests(10, 4, 4));
  ASSERT_TRUE(run) << run.message();
  EXPECT_EQ(run->routes.checked, 10);
  EXPECT_EQ(run->routes.failed, 10);
  ASSERT_FALSE(run->routes.first_errors.empty());
  EXPECT_NE(run->routes.first_errors[0].find("no routed_experts"), std::string::npos);
}

TEST(EndToEnd, TwoThousandConcurrentStreams) {
  StubServerOptions options;
  options.token_interval_s = 0.05;  // 20 tokens: every stream lives about a second
  auto server = start_stub(options);
  const auto requests = token_id_requests(2000, 4, 20);
  BenchConfig config = config_for(*server);
  config.ready_check = false;
  auto run = run_benchmark(config, requests);
  ASSERT_TRUE(run) << run.message();
  expect_consistent(*run, requests);
  EXPECT_EQ(run->peak_open_streams, 2000);
  EXPECT_EQ(compute_metrics(run->outputs, run->duration_s, {}, {}).max_concurrent_requests, 2000);
  EXPECT_GE(server->peak_open_connections(), 2000);
}

TEST(EndToEnd, FailuresAreReportedNotFatal) {
  auto server = start_stub();
  BenchConfig config = config_for(*server);
  config.base_url += "/nowhere";  // the stub answers 404 there
  auto refused = run_benchmark(config, token_id_requests(3, 4, 4));
  ASSERT_FALSE(refused);  // the ready check stops the run
  EXPECT_NE(refused.message().find("HTTP 404"), std::string::npos) << refused.message();

  config.ready_check = false;
  auto run = run_benchmark(config, token_id_requests(3, 4, 4));
  ASSERT_TRUE(run);
  for (const RequestOutput& output : run->outputs) {
    EXPECT_FALSE(output.success);
    EXPECT_NE(output.error.find("HTTP 404"), std::string::npos);
  }
  EXPECT_EQ(compute_metrics(run->outputs, run->duration_s, {}, {}).failed, 3);

  const int port = server->port();
  server->stop();
  BenchConfig closed = config_for(*server);
  closed.base_url = "http://127.0.0.1:" + std::to_string(port);
  closed.ready_check = false;
  auto nobody = run_benchmark(closed, token_id_requests(2, 4, 4));
  ASSERT_TRUE(nobody);
  EXPECT_FALSE(nobody->outputs[0].success);
  EXPECT_NE(nobody->outputs[0].error.find("connect"), std::string::npos) << nobody->outputs[0].error;
}

TEST(ParseBaseUrl, HostPortPrefix) {
  auto url = parse_base_url("http://127.0.0.1:8000/api/");
  ASSERT_TRUE(url);
  EXPECT_EQ(url->host, "127.0.0.1");
  EXPECT_EQ(url->port, "8000");
  EXPECT_EQ(url->path_prefix, "/api");
  EXPECT_EQ(parse_base_url("http://localhost")->port, "80");
  EXPECT_FALSE(parse_base_url("https://x:1"));
  EXPECT_FALSE(parse_base_url("127.0.0.1:8000"));
  EXPECT_FALSE(parse_base_url("http://h:99999"));
  EXPECT_FALSE(parse_base_url("http://:80"));
}

}  // namespace
}  // namespace sy::loadgen
