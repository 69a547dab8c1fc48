// What the benchmark programs share for their JSON records: a shell command's output, and the
// commit the binaries were built from.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

namespace sy::bench {

// stdout of `command` (trailing newlines dropped); empty when it cannot run.
inline std::string command_output(const char* command) {
  std::string out;
  if (FILE* pipe = popen(command, "r")) {
    char buffer[256];
    while (fgets(buffer, sizeof buffer, pipe)) out += buffer;
    pclose(pipe);
  }
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

// The binaries' commit: SY_BUILD_COMMIT where set (scripts/gpu-check.sh sets it from
// gpu-carry/BUILD_COMMIT: the device's checkout can be older than the binaries), else this
// checkout's.
inline std::string build_commit() {
  if (const char* commit = std::getenv("SY_BUILD_COMMIT"); commit && *commit) return commit;
  return command_output("git rev-parse --short HEAD 2>/dev/null");
}

}  // namespace sy::bench
