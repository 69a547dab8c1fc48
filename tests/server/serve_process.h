// `switchyard serve` as a child process for end-to-end tests: started on a free port, waited
// for until /health answers 200, stopped with SIGTERM (its exit status is the drain's verdict).
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "http_client.h"

namespace sy::testing {

inline std::string switchyard_binary() {
  if (const char* bin = std::getenv("SWITCHYARD_BIN")) return bin;
  return std::string(SY_BINARY_DIR) + "/switchyard";
}

class ServeProcess {
 public:
  ServeProcess() = default;
  ServeProcess(const ServeProcess&) = delete;
  ServeProcess& operator=(const ServeProcess&) = delete;
  ~ServeProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (out_fd_ >= 0) ::close(out_fd_);
  }

  // Starts `switchyard serve ARGS --port 0` and waits (up to `timeout_s`) until it is healthy.
  // Returns an error message, empty on success.
  std::string start(const std::vector<std::string>& args, int timeout_s = 120) {
    int pipe_fds[2];
    if (::pipe(pipe_fds) != 0) return "pipe failed";
    std::string binary = switchyard_binary();
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(pipe_fds[1], 1);
      ::dup2(pipe_fds[1], 2);
      ::close(pipe_fds[0]);
      ::close(pipe_fds[1]);
      std::vector<std::string> all = launcher;  // e.g. mpirun -np 2
      all.insert(all.end(), {binary, "serve", "--port", "0"});
      all.insert(all.end(), args.begin(), args.end());
      // SY_SERVE_ARGS (e.g. "--device cuda"): extra flags for every server a test starts, so
      // the GPU machine runs the same end-to-end tests on its backend.
      if (const char* extra = std::getenv("SY_SERVE_ARGS")) {
        std::string word;
        for (const char* c = extra;; ++c) {
          if (*c == ' ' || *c == '\0') {
            if (!word.empty()) all.push_back(word);
            word.clear();
            if (*c == '\0') break;
          } else {
            word += *c;
          }
        }
      }
      std::vector<char*> argv;
      for (std::string& a : all) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(all[0].c_str(), argv.data());
      ::_exit(127);
    }
    ::close(pipe_fds[1]);
    out_fd_ = pipe_fds[0];
    ::fcntl(out_fd_, F_SETFL, O_NONBLOCK);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
    while (std::chrono::steady_clock::now() < deadline) {
      drain_output(100);
      if (port_ == 0) {
        size_t at = output_.find("listening on http://");
        if (at != std::string::npos) {
          size_t colon = output_.find(':', at + 20);
          size_t end = output_.find_first_not_of("0123456789", colon + 1);
          if (colon != std::string::npos && end != std::string::npos) {
            port_ = static_cast<uint16_t>(std::stoi(output_.substr(colon + 1, end - colon - 1)));
          }
        }
      }
      if (port_ != 0 && http_call(port_, "GET", "/health").status == 200) return "";
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        drain_output(0);
        return "switchyard serve exited early (status " + std::to_string(status) + "):\n" + output_;
      }
    }
    return "switchyard serve did not become healthy in time:\n" + output_;
  }

  // SIGTERM, then the exit status (-1 if it had to be killed after `timeout_s`).
  int terminate(int timeout_s = 30) {
    if (pid_ <= 0) return -1;
    ::kill(pid_, SIGTERM);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
    while (std::chrono::steady_clock::now() < deadline) {
      drain_output(50);
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        drain_output(0);
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
    }
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
    return -1;
  }

  // Words before the binary (an absolute program path first): a launcher such as mpirun.
  std::vector<std::string> launcher;

  uint16_t port() const { return port_; }
  pid_t pid() const { return pid_; }
  const std::string& output() {
    drain_output(0);
    return output_;
  }

 private:
  void drain_output(int wait_ms) {
    if (out_fd_ < 0) return;
    pollfd p{out_fd_, POLLIN, 0};
    if (::poll(&p, 1, wait_ms) <= 0) return;
    char buffer[4096];
    ssize_t n;
    while ((n = ::read(out_fd_, buffer, sizeof buffer)) > 0)
      output_.append(buffer, static_cast<size_t>(n));
  }

  pid_t pid_ = -1;
  int out_fd_ = -1;
  uint16_t port_ = 0;
  std::string output_;
};

}  // namespace sy::testing
