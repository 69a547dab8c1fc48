// What the HTTP fuzz targets send (a POST with a JSON body) and check of a server's replies.
#pragma once

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace sy::fuzz {

// A POST of `body` to `path` that closes the connection after the reply; chunked
// (Transfer-Encoding) when asked, chunk sizes drawn from chunk_seed.
inline std::string with_body(std::string_view path, const std::string& body, bool chunked,
                             uint8_t chunk_seed) {
  std::string request =
      "POST " + std::string(path) +
      " HTTP/1.1\r\nHost: fuzz\r\nConnection: close\r\nContent-Type: application/json\r\n";
  if (!chunked)
    return request + "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  request += "Transfer-Encoding: chunked\r\n\r\n";
  size_t at = 0, size = 1 + chunk_seed % 17;
  while (at < body.size()) {
    const size_t n = std::min(size, body.size() - at);
    char head[32];
    std::snprintf(head, sizeof head, "%zx\r\n", n);
    request += head + body.substr(at, n) + "\r\n";
    at += n;
    size = 1 + (size * 7 + chunk_seed) % 29;
  }
  return request + "0\r\n\r\n";
}

// Every response in `raw` (keep-alive may pipeline several) is HTTP/1.1; an error with a JSON
// body has OpenAI's shape: {"error": {"message": non-empty string, "type", "param", "code"}}.
// A response cut short (a half-closed connection cancels its request) is not checked further.
// `no_server_errors`: a 5xx status is a finding too (a server over a real engine answers every
// request it can parse with a result or a 4xx naming what is wrong).
inline void check_responses(const std::string& raw, bool no_server_errors = false) {
  size_t at = 0;
  while (at < raw.size()) {
    if (raw.compare(at, 9, "HTTP/1.1 ") != 0 || raw.size() < at + 12) {
      std::fprintf(stderr, "not an HTTP/1.1 response at byte %zu\n", at);
      std::abort();
    }
    const int status = std::atoi(raw.substr(at + 9, 3).c_str());
    if (no_server_errors && status >= 500) {
      std::fprintf(stderr, "server error: %s\n", raw.substr(at, 2000).c_str());
      std::abort();
    }
    const size_t head_end = raw.find("\r\n\r\n", at);
    if (head_end == std::string::npos) return;
    if (status >= 100 && status < 200) {  // interim (100 Continue)
      at = head_end + 4;
      continue;
    }
    std::string head = raw.substr(at, head_end - at);
    for (char& c : head) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    const size_t length_at = head.find("\r\ncontent-length:");
    if (length_at == std::string::npos) return;  // chunked (a stream): its events are not checked
    const size_t length = std::strtoul(head.c_str() + length_at + 17, nullptr, 10);
    if (head_end + 4 + length > raw.size()) return;
    const std::string body = raw.substr(head_end + 4, length);
    if (status >= 400 && head.find("\r\ncontent-type: application/json") != std::string::npos) {
      const nlohmann::json error = nlohmann::json::parse(body, nullptr, false);
      const bool shaped = error.is_object() && error.contains("error") &&
                          error["error"].is_object() && error["error"].contains("message") &&
                          error["error"]["message"].is_string() &&
                          !error["error"]["message"].get<std::string>().empty() &&
                          error["error"].contains("type") && error["error"].contains("code");
      if (!shaped) {
        std::fprintf(stderr, "error %d without an OpenAI-shaped body: %s\n", status, body.c_str());
        std::abort();
      }
    }
    at = head_end + 4 + length;
  }
}

}  // namespace sy::fuzz
