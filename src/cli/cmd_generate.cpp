// `switchyard generate`: one request through the engine; prints the text and writes the routed
// experts of every input position as .npy (DESIGN.md wire dtype), or replays given routes.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <future>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common.h"
#include "engine/engine.h"
#include "engine/generation_defaults.h"
#include "tokenizer/tokenizer.h"
#include "util/npy.h"

namespace sy::cli {
namespace {

Result<std::vector<int32_t>> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) {
    try {
      size_t used = 0;
      long long value = std::stoll(item, &used);
      if (used != item.size() || value < 0 || value > INT32_MAX) throw std::invalid_argument(item);
      ids.push_back(static_cast<int32_t>(value));
    } catch (const std::exception&) {
      return Status::errorf("--prompt-ids: '{}' is not a token id", item);
    }
  }
  if (ids.empty()) return Status::error("--prompt-ids: no token ids given");
  return ids;
}

Result<moe::RouteArray> read_routes(const std::string& path) {
  SY_ASSIGN(NpyArray array, npy_read_file(path));
  if (array.shape.size() != 3)
    return Status::errorf("{}: routes must have shape (n, layers, top_k), got {} dimensions", path, array.shape.size());
  auto values = npy_to_int64(array);
  if (!values) return values.status().with_context(path + ": ");
  moe::RouteArray routes{array.shape[0], array.shape[1], array.shape[2], {}};
  routes.ids.reserve(values->size());
  for (int64_t v : *values) {
    if (v < 0 || v > INT32_MAX) return Status::errorf("{}: expert id {} out of range", path, v);
    routes.ids.push_back(static_cast<int32_t>(v));
  }
  return routes;
}

Status write_routes(const std::string& path, const moe::RouteArray& routes, int64_t num_experts) {
  std::vector<int64_t> shape{routes.rows, routes.layers, routes.top_k};
  if (num_experts <= 256) {
    std::vector<uint8_t> narrow(routes.ids.begin(), routes.ids.end());
    return npy_write_file(path, DType::kU8, shape, narrow.data());
  }
  std::vector<uint16_t> narrow(routes.ids.begin(), routes.ids.end());
  return npy_write_file(path, DType::kU16, shape, narrow.data());
}

const char* finish_reason_name(engine::FinishReason reason) {
  switch (reason) {
    case engine::FinishReason::kStop: return "stop";
    case engine::FinishReason::kLength: return "length";
    case engine::FinishReason::kAbort: return "abort";
    case engine::FinishReason::kError: return "error";
    default: return "none";
  }
}

struct Options {
  std::string model, prompt, prompt_ids, chat, routes_out, routes_in, moe_kernel = "auto";
  int max_tokens = 16;
  std::optional<float> temperature, top_p;
  std::optional<int> top_k;
  std::optional<uint64_t> seed;
  DeviceOptions device;
  bool json = false, ignore_eos = false, batch_invariant = false;
  int threads = 0;
};

int run(Options o) {
  auto fail = [](const std::string& message) {
    std::fprintf(stderr, "generate: %s\n", message.c_str());
    return 1;
  };
  int inputs = !o.prompt.empty() + !o.prompt_ids.empty() + !o.chat.empty();
  if (inputs != 1) return fail("give exactly one of --prompt, --prompt-ids, --chat");

  engine::EngineConfig config;
  config.model_dir = o.model;
  if (Status applied = apply_device_options(o.device, config); !applied) return fail(applied.message());
  o.model = config.model_dir;
  config.moe_kernel = o.moe_kernel;
  config.batch_invariant = o.batch_invariant;
  config.capture_routes = !o.routes_out.empty();
  config.require_replay = !o.routes_in.empty();
  config.show_progress = true;
  config.num_threads = o.threads;
  config.enable_prefix_caching = false;
  if (config.world.rank > 0) return run_parallel_follower(config, "generate");

  engine::GenerationRequest request;
  std::optional<tokenizer::Tokenizer> tok;
  auto need_tokenizer = [&]() -> Status {
    if (tok) return Status::ok();
    auto loaded = tokenizer::Tokenizer::load(o.model);
    if (!loaded) return loaded.status();
    tok.emplace(std::move(loaded).value());
    return Status::ok();
  };
  if (!o.prompt_ids.empty()) {
    auto ids = parse_ids(o.prompt_ids);
    if (!ids) return fail(ids.message());
    request.prompt_ids = *ids;
  } else if (!o.prompt.empty()) {
    if (Status s = need_tokenizer(); !s) return fail(s.message());
    auto ids = tok->try_encode(o.prompt, true);
    if (!ids) return fail("--prompt: " + ids.message());
    request.prompt_ids = *ids;
  } else {
    if (Status s = need_tokenizer(); !s) return fail(s.message());
    auto prompt = render_chat_prompt(o.model, o.chat);
    if (!prompt) return fail("--chat: " + prompt.message());
    auto ids = tok->try_encode(*prompt, false);
    if (!ids) return fail("--chat: " + ids.message());
    request.prompt_ids = *ids;
  }
  if (!o.routes_in.empty()) {
    auto routes = read_routes(o.routes_in);
    if (!routes) return fail(routes.message());
    request.replay = std::move(routes).value();
  }

  // Sampling: the model's generation_config.json defaults (as vLLM), then the flags.
  auto defaults = engine::load_generation_defaults(o.model);
  if (!defaults) return fail(defaults.message());
  request.sampling = *defaults;
  request.sampling.max_tokens = o.max_tokens;
  if (o.temperature) request.sampling.temperature = *o.temperature;
  if (o.top_p) request.sampling.top_p = *o.top_p;
  if (o.top_k) request.sampling.top_k = *o.top_k;
  request.sampling.seed = o.seed;
  request.sampling.ignore_eos = o.ignore_eos;
  request.return_routes = config.capture_routes;
  // One request: a KV cache of its length, not one sized from the machine's memory (that many
  // gigabytes of pages cost seconds to fault in, on every rank of a parallel run).
  config.kv_cache_tokens = static_cast<int64_t>(request.prompt_ids.size()) + o.max_tokens + config.block_size_tokens;

  auto created = engine::create_engine(config);
  if (!created) return fail(created.message());
  std::unique_ptr<engine::Engine> engine = std::move(created).value();
  const engine::ModelInfo info = engine->model_info();

  std::vector<int32_t> completion;
  std::promise<engine::Event> final_event;
  auto submitted = engine->submit(request, [&](const engine::Event& event) {
    completion.insert(completion.end(), event.new_token_ids.begin(), event.new_token_ids.end());
    if (event.finished) final_event.set_value(event);
    return engine::Continuation::kContinue;
  });
  if (!submitted) return fail(submitted.message());
  engine::Event done = final_event.get_future().get();
  engine->shutdown(0);
  if (done.finish_reason == engine::FinishReason::kError) return fail(done.error.message());

  if (!o.routes_out.empty()) {
    if (!done.routes) return fail("no routes were captured");
    Status s = write_routes(o.routes_out, *done.routes, info.num_experts);
    if (!s) return fail(s.message());
  }
  std::string text;
  if (tok || need_tokenizer()) text = tok->decode(completion, true);
  if (o.json) {
    nlohmann::json out{{"prompt_token_ids", request.prompt_ids},
                       {"completion_token_ids", completion},
                       {"text", text},
                       {"finish_reason", finish_reason_name(done.finish_reason)}};
    if (done.routes) out["routes_shape"] = {done.routes->rows, done.routes->layers, done.routes->top_k};
    std::printf("%s\n", out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else {
    std::printf("%s\n", text.c_str());
    if (done.routes)
      std::fprintf(stderr, "routes: %s shape (%lld, %lld, %lld), %s\n", o.routes_out.c_str(),
                   static_cast<long long>(done.routes->rows), static_cast<long long>(done.routes->layers),
                   static_cast<long long>(done.routes->top_k), info.num_experts <= 256 ? "uint8" : "uint16");
  }
  return 0;
}

}  // namespace

void add_generate_command(CLI::App& app, int& exit_code, const dist::MpiWorld& world) {
  auto o = std::make_shared<Options>();
  o->device.world = world;
  auto* command = app.add_subcommand("generate", "Generate from one prompt; write or replay routed experts");
  command->add_option("--model", o->model, "Model folder (Hugging Face format)");
  add_device_options(command, o->device);
  command->add_option("--prompt", o->prompt, "Prompt text");
  command->add_option("--prompt-ids", o->prompt_ids, "Prompt token ids, comma-separated");
  command->add_option("--chat", o->chat, "Chat messages as JSON (rendered with the model's chat template)");
  command->add_option("--max-tokens", o->max_tokens, "Tokens to generate (default 16)");
  command->add_option("--temperature", o->temperature, "0 = greedy (default: generation_config.json, else 1)");
  command->add_option("--top-p", o->top_p, "Nucleus sampling mass");
  command->add_option("--top-k", o->top_k, "Top-k sampling (-1 = off)");
  command->add_option("--seed", o->seed, "Sampling seed");
  command->add_flag("--ignore-eos", o->ignore_eos, "Do not stop at EOS");
  command->add_option("--routes-out", o->routes_out, "Write routed experts (N-1, layers, top_k) as .npy");
  command->add_option("--routes-in", o->routes_in, "Replay routed experts from .npy (n, layers, top_k)");
  command->add_option("--moe-kernel", o->moe_kernel, "auto | cpu-modular | cpu-fused");
  command->add_option("--threads", o->threads, "CPU threads (0 = all cores)");
  command->add_flag("--batch-invariant", o->batch_invariant,
                    "results independent of the step's other rows (CUDA: one GEMM/attention tiling)");
  command->add_flag("--json", o->json, "Print one JSON object: token ids, text, finish reason");
  command->callback([o, &exit_code] { exit_code = run(*o); });
}

}  // namespace sy::cli
