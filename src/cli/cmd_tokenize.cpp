// `switchyard tokenize --model DIR`: one JSON string per stdin line in, one JSON array of ids per
// line out; `--decode` the reverse. DIR needs only tokenizer.json (tokenizer_config.json optional).
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/commands.h"
#include "tokenizer/tokenizer.h"

namespace sy::cli {
namespace {

struct TokenizeOptions {
  std::string model_dir;
  bool decode = false;
  bool no_special_tokens = false;
  bool skip_special_tokens = false;
};

std::string excerpt(const std::string& line) { return line.size() > 60 ? line.substr(0, 60) + "..." : line; }

int run_tokenize(const TokenizeOptions& options) {
  auto loaded = tokenizer::Tokenizer::load(options.model_dir);
  if (!loaded) {
    std::fprintf(stderr, "switchyard tokenize: %s\n", loaded.message().c_str());
    return 1;
  }
  const tokenizer::Tokenizer& tok = *loaded;
  std::ios::sync_with_stdio(false);
  std::string line;
  size_t line_number = 0;
  while (std::getline(std::cin, line)) {
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const auto parsed = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (options.decode) {
      bool ok = parsed.is_array();
      std::vector<int32_t> ids;
      for (const auto& id : parsed) {
        if (!ok || !id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= tok.vocab_size()) {
          ok = false;
          break;
        }
        ids.push_back(id.get<int32_t>());
      }
      if (!ok) {
        std::fprintf(stderr, "switchyard tokenize: stdin line %zu: expected a JSON array of token ids in [0, %lld), got %s\n",
                     line_number, static_cast<long long>(tok.vocab_size()), excerpt(line).c_str());
        return 1;
      }
      std::cout << nlohmann::json(tok.decode(ids, options.skip_special_tokens))
                       .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
                << '\n';
    } else {
      if (!parsed.is_string()) {
        std::fprintf(stderr, "switchyard tokenize: stdin line %zu: expected a JSON string (valid UTF-8), got %s\n",
                     line_number, excerpt(line).c_str());
        return 1;
      }
      auto ids = tok.try_encode(parsed.get<std::string>(), !options.no_special_tokens);
      if (!ids) {
        std::fprintf(stderr, "switchyard tokenize: stdin line %zu: %s\n", line_number, ids.message().c_str());
        return 1;
      }
      std::cout << nlohmann::json(*ids).dump() << '\n';
    }
  }
  std::cout.flush();
  return 0;
}

}  // namespace

void add_tokenize_command(CLI::App& app, int& exit_code) {
  auto options = std::make_shared<TokenizeOptions>();
  auto* command = app.add_subcommand(
      "tokenize", "Encode JSON strings (one per stdin line) to JSON id arrays, or --decode the reverse");
  command->add_option("--model", options->model_dir, "Folder with tokenizer.json (and tokenizer_config.json)")
      ->required();
  command->add_flag("--decode", options->decode, "Read JSON arrays of ids, print JSON strings");
  command->add_flag("--no-special-tokens", options->no_special_tokens,
                    "Encode without the post-processor's special tokens (HF add_special_tokens=False)");
  command->add_flag("--skip-special-tokens", options->skip_special_tokens,
                    "Decode without special tokens (HF skip_special_tokens=True)");
  command->callback([options, &exit_code] { exit_code = run_tokenize(*options); });
}

}  // namespace sy::cli
