// libFuzzer: the HTTP layer end to end — the real Server (Boost.Beast parser, routing, JSON and
// request parsing, base64 .npy replay decoding) on a loopback port over the test FakeEngine.
// Each input is sent on a fresh connection; the server must answer every
// error with an OpenAI-shaped body, never crash, and still answer /health afterwards.
//
// Input: byte 0 picks how the rest is sent (so mutations reach past the framing):
//   0  raw bytes: request line, headers, body, pipelined requests, whatever they are
//   1  a JSON body, POSTed with Content-Length to the endpoint byte 1 picks
//   2  the same body, sent chunked (Transfer-Encoding), chunk sizes from byte 1
//   3  a .npy file, base64-encoded as routed_experts_replay of a completion request
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>

#include "../tests/server/fake_engine.h"
#include "../tests/server/http_client.h"
#include "http_checks.h"
#include "server/server.h"
#include "util/base64.h"

namespace {

using sy::testing::FakeCodec;
using sy::testing::FakeEngine;

struct Harness {
  FakeEngine engine{sy::testing::FakeEngineOptions{.step_delay_ms = 0, .max_waiting_requests = 1000, .max_model_len = 512}};
  FakeCodec codec;
  std::unique_ptr<sy::server::Server> server;
  uint16_t port = 0;

  Harness() {
    sy::server::ServerConfig config;
    config.port = 0;
    config.served_model_name = "fake";
    config.enable_return_routed_experts = true;
    config.max_request_bytes = 1 << 20;
    config.max_header_bytes = 8 << 10;
    server = std::make_unique<sy::server::Server>(config);
    if (!server->start()) std::abort();
    server->attach(engine, codec);
    port = server->port();
  }
};

Harness& harness() {
  static Harness* h = new Harness();  // never destroyed: libFuzzer exits without unwinding
  return *h;
}

constexpr std::string_view kPaths[] = {"/v1/completions", "/v1/chat/completions", "/generate",
                                       "/tokenize",       "/detokenize",          "/abort_request",
                                       "/v1/models",      "/flush_cache"};

std::string request_from(const uint8_t* data, size_t size) {
  if (size == 0) return "";
  const uint8_t mode = data[0] % 4;
  const uint8_t selector = size > 1 ? data[1] : 0;
  const std::string rest(reinterpret_cast<const char*>(data) + (size > 1 ? 2 : 1),
                         size - (size > 1 ? 2 : 1));
  switch (mode) {
    case 0:
      return std::string(reinterpret_cast<const char*>(data) + 1, size - 1);
    case 1:
      return sy::fuzz::with_body(kPaths[selector % std::size(kPaths)], rest, false, 0);
    case 2:
      return sy::fuzz::with_body(kPaths[selector % std::size(kPaths)], rest, true, selector);
    default: {
      const std::string body =
          "{\"prompt\":[1,2,3,4,5,6],\"max_tokens\":2,\"return_routed_experts\":true,"
          "\"routed_experts_replay\":\"" +
          sy::base64_encode(rest) + "\"}";
      return sy::fuzz::with_body("/v1/completions", body, (selector & 1) != 0, selector);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Harness& h = harness();
  const std::string request = request_from(data, size);
  const int fd = sy::testing::connect_to(h.port, 10);
  if (fd < 0) std::abort();
  sy::testing::send_all(fd, request);
  // Raw bytes may leave a request open: half-close so the server sees the end of them (it takes
  // that as a disconnect and cancels what it started). The other modes end with Connection: close.
  if (size > 0 && data[0] % 4 == 0) ::shutdown(fd, SHUT_WR);
  const std::string reply = sy::testing::read_all(fd);
  ::close(fd);
  sy::fuzz::check_responses(reply);
  // The server keeps serving.
  if (sy::testing::http_call(h.port, "GET", "/health").status != 200) {
    std::fprintf(stderr, "/health failed after the input\n");
    std::abort();
  }
  return 0;
}
