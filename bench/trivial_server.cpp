// trivial_server: an OpenAI-style streaming server with no model behind it. Every completion
// streams N SSE tokens as fast as the socket takes them (or paced by --token-interval-ms), so a
// `switchyard bench` run against it measures the client's own ceiling. Loopback by default.
//   trivial_server --port 8100 [--threads 1] [--token-interval-ms 0] [--duration-s 0]
#include <csignal>
#include <cstdio>
#include <thread>

#include <CLI/CLI.hpp>

#include "loadgen/client.h"
#include "loadgen/stub_server.h"

int main(int argc, char** argv) {
  CLI::App app{"Minimal OpenAI-style streaming server for measuring load generators"};
  sy::loadgen::StubServerOptions options;
  options.port = 8100;
  double token_interval_ms = 0, duration_s = 0;
  app.add_option("--host", options.host, "Address to listen on")->capture_default_str();
  app.add_option("--port", options.port, "Port (0: any free one)")->capture_default_str();
  app.add_option("--threads", options.threads, "Server threads")->capture_default_str();
  app.add_option("--default-tokens", options.default_tokens, "Tokens when a request names none")->capture_default_str();
  app.add_option("--token-interval-ms", token_interval_ms, "Pause between tokens")->capture_default_str();
  app.add_flag("--split-events", options.split_events, "Write each SSE event in two HTTP chunks");
  app.add_option("--route-layers", options.route_layers, "L of returned routes")->capture_default_str();
  app.add_option("--route-top-k", options.route_top_k, "K of returned routes")->capture_default_str();
  app.add_option("--route-num-experts", options.route_num_experts, "Experts (ids below this)")->capture_default_str();
  app.add_option("--duration-s", duration_s, "Exit after this many seconds (0: on SIGINT/SIGTERM)")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  options.token_interval_s = token_interval_ms / 1000;

  const long fd_limit = sy::loadgen::raise_fd_limit();
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);  // server threads inherit the mask

  auto server = sy::loadgen::StubServer::start(options);
  if (!server) {
    std::fprintf(stderr, "trivial_server: %s\n", server.message().c_str());
    return 1;
  }
  std::printf("trivial_server listening on %s:%d (threads %d, fd limit %ld)\n", options.host.c_str(),
              (*server)->port(), options.threads, fd_limit);
  std::fflush(stdout);

  if (duration_s > 0) {
    timespec timeout{static_cast<time_t>(duration_s),
                     static_cast<long>((duration_s - static_cast<long>(duration_s)) * 1e9)};
    sigtimedwait(&signals, nullptr, &timeout);
  } else {
    int signal_number = 0;
    sigwait(&signals, &signal_number);
  }
  std::printf("trivial_server: served %ld requests, peak %d open connections\n",
              (*server)->requests_served(), (*server)->peak_open_connections());
  (*server)->stop();
  return 0;
}
