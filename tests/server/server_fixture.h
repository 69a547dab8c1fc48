// A Server on a free loopback port over a FakeEngine and FakeCodec, for the server tests.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <thread>

#include "fake_engine.h"
#include "http_client.h"
#include "server/server.h"

namespace sy::testing {

struct Fixture {
  explicit Fixture(server::ServerConfig config = {}, FakeEngineOptions options = {})
      : engine(options) {
    config.port = 0;
    config.served_model_name = "fake";
    server = std::make_unique<server::Server>(config);
    Status started = server->start();
    EXPECT_TRUE(started) << started.message();
    server->attach(engine, codec);
    port = server->port();
  }
  ~Fixture() {
    server->stop();
    engine.shutdown(0);
  }
  bool healthy() { return http_call(port, "GET", "/health").status == 200; }
  // Polls until the fake engine has no active request (or a second passes).
  bool engine_drains() {
    for (int i = 0; i < 200; ++i) {
      if (engine.active_count() == 0) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  }
  FakeEngine engine;
  FakeCodec codec;
  std::unique_ptr<server::Server> server;
  uint16_t port = 0;
};

}  // namespace sy::testing
