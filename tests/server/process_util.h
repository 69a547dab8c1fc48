// Running external programs from tests: node (with the npm deps from scripts/setup.sh) and curl.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace sy::testing {

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

inline CommandResult run_command(const std::string& command) {
  CommandResult result;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (!pipe) return result;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) result.output.append(buffer, n);
  int status = ::pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

inline std::string shell_quote(const std::string& text) {
  std::string out = "'";
  for (char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// The node_modules folder that scripts/setup.sh fills; empty when it is missing.
inline std::string node_deps_dir() {
  std::string dir = std::string(SY_SOURCE_DIR) + "/deps/node_modules";
  return std::filesystem::exists(dir + "/openai/package.json") ? dir : "";
}

inline bool have_program(const std::string& name) {
  return run_command("command -v " + name + " >/dev/null").exit_code == 0;
}

}  // namespace sy::testing
