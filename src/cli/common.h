// Small helpers shared by the subcommands.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "engine/engine.h"
#include "util/status.h"

namespace sy::cli {

// --device, --random-weights, --random-seed, --no-cuda-graphs and the parallel flags
// (--tensor-parallel, --expert-parallel, --check-routes-agree): shared by generate and serve.
struct DeviceOptions {
  std::string device = "cpu";
  std::string random_weights;
  uint64_t random_seed = 0;
  bool no_cuda_graphs = false;
  int tensor_parallel = 1;
  bool expert_parallel = false;
  bool check_routes_agree = false;
  dist::MpiWorld world;  // from main (mpi_init)
};
void add_device_options(CLI::App* command, DeviceOptions& options);
// Fills the engine config; with --random-weights, an empty model_dir becomes the config's folder.
Status apply_device_options(const DeviceOptions& options, engine::EngineConfig& config);

// Ranks 1..N-1 of `mpirun -np N switchyard generate|serve --tensor-parallel N`: follow rank 0's
// engine until it stops (exit 0). A failure here ends the whole job (mpi_abort): rank 0 would
// otherwise wait on this rank forever.
int run_parallel_follower(const engine::EngineConfig& config, const char* command);

// The Qwen3 tokenizer files installed by scripts/setup.sh (deps/ beside the build folder or the
// current folder); empty when not found. SWITCHYARD_TOKENIZER_DIR overrides.
std::string default_tokenizer_dir();

// Renders chat messages (a JSON array, or an object with "messages", "tools",
// "chat_template_kwargs") with the model's own chat template, add_generation_prompt true.
Result<std::string> render_chat_prompt(const std::string& model_dir, const std::string& messages_json);

}  // namespace sy::cli
