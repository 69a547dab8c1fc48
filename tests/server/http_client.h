// A deliberately dumb blocking HTTP/1.1 client on POSIX sockets, so tests can send exactly the
// bytes they mean (malformed, huge, truncated) and hang up whenever they like.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace sy::testing {

inline int connect_to(uint16_t port, int timeout_s = 30) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  timeval tv{timeout_s, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(port);
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

inline bool send_all(int fd, const std::string& data) {
  size_t sent = 0;
  while (sent < data.size()) {
    ssize_t n = ::send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

inline std::string read_all(int fd) {
  std::string out;
  char buffer[65536];
  while (true) {
    ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
    if (n <= 0) break;
    out.append(buffer, static_cast<size_t>(n));
  }
  return out;
}

// Sends raw bytes and returns everything the server sent until it closed.
inline std::string raw_exchange(uint16_t port, const std::string& bytes) {
  int fd = connect_to(port);
  if (fd < 0) return "";
  send_all(fd, bytes);
  std::string out = read_all(fd);
  ::close(fd);
  return out;
}

struct HttpResponse {
  int status = 0;
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;
  nlohmann::json json() const { return nlohmann::json::parse(body, nullptr, false); }
  // The `data:` payloads of an SSE body, in order.
  std::vector<std::string> events() const {
    std::vector<std::string> out;
    size_t at = 0;
    while (at < body.size()) {
      size_t end = body.find("\n\n", at);
      if (end == std::string::npos) end = body.size();
      std::string event = body.substr(at, end - at);
      if (event.rfind("data: ", 0) == 0) out.push_back(event.substr(6));
      at = end + 2;
    }
    return out;
  }
};

inline HttpResponse parse_response(const std::string& raw) {
  HttpResponse response;
  size_t head_end = raw.find("\r\n\r\n");
  if (head_end == std::string::npos || raw.size() < 12) return response;
  // Skip interim 100 Continue responses.
  size_t start = 0;
  while (raw.compare(start, 12, "HTTP/1.1 100") == 0) {
    start = raw.find("\r\n\r\n", start) + 4;
    head_end = raw.find("\r\n\r\n", start);
  }
  response.status = std::stoi(raw.substr(start + 9, 3));
  size_t line = raw.find("\r\n", start) + 2;
  while (line < head_end) {
    size_t eol = raw.find("\r\n", line);
    std::string header = raw.substr(line, eol - line);
    size_t colon = header.find(':');
    if (colon != std::string::npos) {
      std::string name = header.substr(0, colon);
      std::transform(name.begin(), name.end(), name.begin(),
                     [](unsigned char c) { return std::tolower(c); });
      std::string value = header.substr(colon + 1);
      value.erase(0, value.find_first_not_of(' '));
      response.headers[name] = value;
    }
    line = eol + 2;
  }
  std::string body = raw.substr(head_end + 4);
  if (response.headers["transfer-encoding"] == "chunked") {
    std::string decoded;
    size_t at = 0;
    while (at < body.size()) {
      size_t eol = body.find("\r\n", at);
      if (eol == std::string::npos) break;
      size_t length = std::stoul(body.substr(at, eol - at), nullptr, 16);
      if (length == 0) break;
      decoded += body.substr(eol + 2, length);
      at = eol + 2 + length + 2;
    }
    body = decoded;
  }
  response.body = body;
  return response;
}

inline std::string build_request(const std::string& method, const std::string& path,
                                 const std::string& body, const std::string& extra_headers = "") {
  std::string request =
      method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n";
  if (!body.empty() || method == "POST") {
    request +=
        "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  }
  request += extra_headers + "\r\n" + body;
  return request;
}

inline HttpResponse http_call(uint16_t port, const std::string& method, const std::string& path,
                              const std::string& body = "", const std::string& extra_headers = "") {
  return parse_response(raw_exchange(port, build_request(method, path, body, extra_headers)));
}

inline HttpResponse post_json(uint16_t port, const std::string& path, const nlohmann::json& body,
                              const std::string& extra_headers = "") {
  return http_call(port, "POST", path, body.dump(), extra_headers);
}

}  // namespace sy::testing
