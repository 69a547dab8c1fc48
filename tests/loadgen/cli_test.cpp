// `switchyard bench` as a user runs it: against the stub server, writing a result file with
// vLLM's keys; bad input ends with a message, not a crash.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "loadgen/stub_server.h"

namespace sy::loadgen {
namespace {

std::string binary() {
  const char* path = std::getenv("SWITCHYARD_BIN");
  return path ? path : SY_BINARY_DIR "/switchyard";
}

// Runs a command, returns (exit status, stdout + stderr).
std::pair<int, std::string> run(const std::string& command) {
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  std::string output;
  char buffer[4096];
  while (pipe && fgets(buffer, sizeof buffer, pipe)) output += buffer;
  const int status = pipe ? pclose(pipe) : -1;
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

TEST(BenchCli, RunsAndWritesVllmKeys) {
  StubServerOptions options;
  options.route_layers = 2;
  options.route_top_k = 4;
  options.route_num_experts = 32;
  auto server = StubServer::start(options);
  ASSERT_TRUE(server) << server.message();
  const std::string result = SY_BINARY_DIR "/loadgen_cli_result.json";
  std::remove(result.c_str());
  const std::string url = "http://127.0.0.1:" + std::to_string((*server)->port());
  auto [status, output] = run(binary() + " bench --base-url " + url +
                              " --vocab-size 500 --input-len 20 --output-len 12 --range-ratio 0.5"
                              " --num-prompts 200 --max-concurrency 50 --routed-experts"
                              " --route-num-experts 32 --save-detailed --result-file " + result);
  ASSERT_EQ(status, 0) << output;
  EXPECT_NE(output.find("Serving Benchmark Result"), std::string::npos) << output;
  EXPECT_NE(output.find("Mean TPOT (ms):"), std::string::npos);
  EXPECT_NE(output.find("P99 ITL (ms):"), std::string::npos);
  std::ifstream file(result);
  ASSERT_TRUE(file) << output;
  const nlohmann::json report = nlohmann::json::parse(file);
  EXPECT_EQ(report["completed"], 200);
  EXPECT_EQ(report["failed"], 0);
  EXPECT_EQ(report["model_id"], "stub");  // from /v1/models
  EXPECT_EQ(report["max_concurrency"], 50);
  EXPECT_LE(report["max_concurrent_requests"].get<int>(), 50);
  EXPECT_EQ(report["routes_checked"], 200);
  EXPECT_EQ(report["routes_failed"], 0);
  EXPECT_EQ(report["route_layers"], 2);
  EXPECT_EQ(report["route_top_k"], 4);
  long long output_tokens = 0;
  for (int length : report["output_lens"]) {
    EXPECT_GE(length, 6);
    EXPECT_LE(length, 18);
    output_tokens += length;
  }
  EXPECT_EQ(report["total_output_tokens"], output_tokens);
  for (const char* key : {"request_throughput", "output_throughput", "total_token_throughput",
                          "mean_ttft_ms", "median_ttft_ms", "p90_ttft_ms", "p99_ttft_ms",
                          "mean_tpot_ms", "p99_tpot_ms", "mean_itl_ms", "p99_itl_ms",
                          "mean_e2el_ms", "p99_e2el_ms", "duration"}) {
    ASSERT_TRUE(report.contains(key)) << key;
    EXPECT_GT(report[key].get<double>(), 0) << key;
  }
  EXPECT_EQ(report["ttfts"].size(), 200u);
}

TEST(BenchCli, BadInputIsAMessage) {
  const std::string bench = binary() + " bench --base-url http://127.0.0.1:9 --vocab-size 100 ";
  auto [ratio_status, ratio] = run(bench + "--range-ratio 1.5");
  EXPECT_EQ(ratio_status, 1);
  EXPECT_NE(ratio.find("--range-ratio must be in [0, 1)"), std::string::npos) << ratio;
  auto [rate_status, rate] = run(bench + "--request-rate fast --model m");
  EXPECT_EQ(rate_status, 1);
  EXPECT_NE(rate.find("--request-rate"), std::string::npos) << rate;
  auto [chat_status, chat] = run(bench + "--endpoint chat --model m");
  EXPECT_EQ(chat_status, 1);
  EXPECT_NE(chat.find("--tokenizer"), std::string::npos) << chat;
  auto [down_status, down] = run(bench + "--model m --num-prompts 2");  // nothing listens on :9
  EXPECT_EQ(down_status, 1);
  EXPECT_NE(down.find("ready-check"), std::string::npos) << down;
  auto [url_status, url] = run(binary() + " bench --base-url https://x --vocab-size 10 --model m");
  EXPECT_EQ(url_status, 1);
  EXPECT_NE(url.find("https is not supported"), std::string::npos) << url;
}

}  // namespace
}  // namespace sy::loadgen
