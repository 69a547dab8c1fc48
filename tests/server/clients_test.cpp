// Real clients against the HTTP layer (over the fake engine): the `openai` npm package and curl.
// The same node script runs against `switchyard serve` on a real model in serve_e2e_test.cpp.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <iostream>

#include "process_util.h"
#include "server_fixture.h"

namespace sy::server {
namespace {

using nlohmann::json;
using namespace sy::testing;

ServerConfig routes_on() {
  ServerConfig config;
  config.enable_return_routed_experts = true;
  return config;
}

TEST(Clients, OpenAiNodePackage) {
  std::string deps = node_deps_dir();
  ASSERT_FALSE(deps.empty()) << "deps/node_modules/openai is missing: run scripts/setup.sh";
  ASSERT_TRUE(have_program("node"))
      << "node is not on PATH (Node 20 is required; see scripts/setup.sh)";
  Fixture f(routes_on());
  std::string script = std::string(SY_SOURCE_DIR) + "/tests/server/openai_client.mjs";
  CommandResult r = run_command("node " + shell_quote(script) + " --base-url http://127.0.0.1:" +
                                std::to_string(f.port) + "/v1 --deps " + shell_quote(deps));
  std::cout << r.output;
  EXPECT_EQ(r.exit_code, 0) << r.output;
  size_t start = r.output.find("{\"model\"");
  ASSERT_NE(start, std::string::npos) << r.output;
  json summary =
      json::parse(r.output.substr(start, r.output.find('\n', start) - start), nullptr, false);
  ASSERT_TRUE(summary.is_object()) << r.output;
  EXPECT_EQ(summary["failures"].size(), 0u) << r.output;
  EXPECT_EQ(summary["model"]["num_experts"], 16);
  EXPECT_TRUE(f.healthy());
}

TEST(Clients, Curl) {
  ASSERT_TRUE(have_program("curl")) << "curl is not installed";
  Fixture f(routes_on());
  std::string base = "http://127.0.0.1:" + std::to_string(f.port);
  CommandResult health = run_command("curl -sS -o /dev/null -w '%{http_code}' " + base + "/health");
  EXPECT_EQ(health.output, "200");

  CommandResult completion = run_command(
      "curl -sS -H 'Content-Type: application/json' -d " +
      shell_quote(
          R"({"prompt": "hello", "max_tokens": 3, "temperature": 0, "return_routed_experts": true})") +
      " " + base + "/v1/completions");
  ASSERT_EQ(completion.exit_code, 0) << completion.output;
  json body = json::parse(completion.output, nullptr, false);
  ASSERT_TRUE(body.is_object()) << completion.output;
  EXPECT_EQ(body["choices"][0]["text"].get<std::string>().size(), 3u);
  EXPECT_TRUE(body["choices"][0]["routed_experts"].is_string());

  CommandResult stream = run_command(
      "curl -sS -N -H 'Content-Type: application/json' -d " +
      shell_quote(
          R"({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": true,
              "stream_routed_experts": true, "return_routed_experts_weights": true})") +
      " " + base + "/v1/chat/completions");
  EXPECT_NE(stream.output.find("\"chat.completion.chunk\""), std::string::npos) << stream.output;
  EXPECT_NE(stream.output.find("\"routed_experts_first_row\""), std::string::npos) << stream.output;
  EXPECT_NE(stream.output.find("\"routed_experts_weights\""), std::string::npos) << stream.output;
  EXPECT_NE(stream.output.find("data: [DONE]"), std::string::npos) << stream.output;

  // A 3 MB body: curl sends "Expect: 100-continue" and must not have to wait a second for it.
  std::string path = std::string(SY_BINARY_DIR) + "/server_curl_big_body.json";
  {
    std::ofstream out(path);
    out << json{{"prompt", "x"}, {"max_tokens", 2}, {"stop", std::string(3 << 20, 'z')}}.dump();
  }
  CommandResult big = run_command(
      "curl -sS -o /dev/null -w '%{http_code}' -H 'Content-Type: application/json' "
      "--data-binary @" +
      shell_quote(path) + " " + base + "/v1/completions");
  EXPECT_EQ(big.output, "200");
  // What curl relies on: headers with "Expect: 100-continue" are answered before any body is sent.
  int fd = connect_to(f.port, 5);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(send_all(fd,
                       "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n"
                       "Expect: 100-continue\r\n\r\n"));
  char interim[64] = {};
  ssize_t n = ::recv(fd, interim, sizeof interim - 1, 0);
  ::close(fd);
  EXPECT_GT(n, 0);
  EXPECT_EQ(std::string(interim).substr(0, 25), "HTTP/1.1 100 Continue\r\n\r\n");
  std::filesystem::remove(path);

  CommandResult bad = run_command(
      "curl -sS -w ' %{http_code}' -H 'Content-Type: application/json' -d '{\"prompt\": ' " + base +
      "/v1/completions");
  EXPECT_NE(bad.output.find(" 400"), std::string::npos) << bad.output;
  EXPECT_TRUE(f.healthy());
}

}  // namespace
}  // namespace sy::server
