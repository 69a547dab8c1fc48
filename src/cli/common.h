// Small helpers shared by the subcommands.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "engine/engine.h"
#include "util/status.h"

namespace sy::cli {

// --device, --random-weights, --random-seed, --no-cuda-graphs: shared by generate and serve.
struct DeviceOptions {
  std::string device = "cpu";
  std::string random_weights;
  uint64_t random_seed = 0;
  bool no_cuda_graphs = false;
};
void add_device_options(CLI::App* command, DeviceOptions& options);
// Fills the engine config; with --random-weights, an empty model_dir becomes the config's folder.
Status apply_device_options(const DeviceOptions& options, engine::EngineConfig& config);

// The Qwen3 tokenizer files installed by scripts/setup.sh (deps/ beside the build folder or the
// current folder); empty when not found. SWITCHYARD_TOKENIZER_DIR overrides.
std::string default_tokenizer_dir();

// Renders chat messages (a JSON array, or an object with "messages", "tools",
// "chat_template_kwargs") with the model's own chat template, add_generation_prompt true.
Result<std::string> render_chat_prompt(const std::string& model_dir, const std::string& messages_json);

}  // namespace sy::cli
