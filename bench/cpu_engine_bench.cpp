// CPU prefill and decode tokens/s of the reference engine, against the decode floor: weight bytes
// touched per token / this machine's memory bandwidth (all cores reading a >= 1 GB buffer,
// measured here in the same run).
//   cpu_engine_bench MODEL_DIR [--prompt-tokens 256] [--decode-tokens 32] [--out FILE.json]
// MODEL_DIR is made with `switchyard make-model --preset qwen3-30b-a3b --layers 4` if missing.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_util.h"
#include "engine/engine.h"
#include "model/config.h"
#include "model/presets.h"

namespace {

using sy::bench::command_output;

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Best of several passes of all threads summing disjoint slices of a 2 GB buffer.
double read_bandwidth_gbs(int threads) {
  const size_t bytes = size_t{2} << 30;
  std::vector<uint64_t> buffer(bytes / 8);
  for (size_t i = 0; i < buffer.size(); i += 512) buffer[i] = i;  // touch every page
  std::fill(buffer.begin(), buffer.end(), 1);
  double best = 0.0;
  for (int pass = 0; pass < 5; ++pass) {
    std::vector<uint64_t> sums(static_cast<size_t>(threads));
    auto start = Clock::now();
    std::vector<std::thread> workers;
    for (int t = 0; t < threads; ++t)
      workers.emplace_back([&, t] {
        const size_t begin = buffer.size() * t / threads, end = buffer.size() * (t + 1) / threads;
        uint64_t a = 0, b = 0, c = 0, d = 0;
        for (size_t i = begin; i + 4 <= end; i += 4) {
          a += buffer[i];
          b += buffer[i + 1];
          c += buffer[i + 2];
          d += buffer[i + 3];
        }
        sums[t] = a + b + c + d;
      });
    for (auto& w : workers) w.join();
    double elapsed = seconds_since(start);
    uint64_t total = 0;
    for (uint64_t s : sums) total += s;
    if (total != buffer.size() / 4 * 4 && total == 0) std::abort();
    best = std::max(best, bytes / elapsed / 1e9);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s MODEL_DIR [--prompt-tokens N] [--decode-tokens N] [--out FILE]\n", argv[0]);
    return 2;
  }
  std::string model_dir = argv[1], out_path;
  int prompt_tokens = 256, decode_tokens = 32;
  for (int i = 2; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--prompt-tokens")) prompt_tokens = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--decode-tokens")) decode_tokens = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--out")) out_path = argv[i + 1];
  }
  if (!std::filesystem::exists(model_dir + "/config.json")) {
    std::fprintf(stderr, "making %s (qwen3-30b-a3b, 4 layers)\n", model_dir.c_str());
    auto config = sy::model::preset_config("qwen3_moe", "qwen3-30b-a3b", 4);
    sy::Status s = sy::model::write_random_checkpoint(*config, sy::model::preset_generation_config("qwen3-30b-a3b"),
                                                      model_dir, 0, isatty(STDERR_FILENO));
    if (!s) {
      std::fprintf(stderr, "%s\n", s.message().c_str());
      return 1;
    }
  }
  const int threads = static_cast<int>(std::thread::hardware_concurrency());
  const double bandwidth = read_bandwidth_gbs(threads);
  std::fprintf(stderr, "memory read bandwidth (%d threads): %.2f GB/s\n", threads, bandwidth);

  auto config = sy::model::load_model_config(model_dir);
  if (!config) {
    std::fprintf(stderr, "%s\n", config.message().c_str());
    return 1;
  }
  const auto& c = *config;
  // Weight bytes one decode token touches (BF16): attention and norms of every layer, the router
  // and top_k experts of each MoE layer (the dense MLP otherwise), the LM head, one embedding row.
  double bytes = 2.0 * c.vocab_size * c.hidden_size + 2.0 * c.hidden_size;
  for (int layer = 0; layer < c.num_hidden_layers; ++layer) {
    const double q = c.num_attention_heads * c.head_dim, kv = c.num_key_value_heads * c.head_dim;
    bytes += 2.0 * (c.hidden_size * (q + 2 * kv) + q * c.hidden_size + 2 * c.hidden_size + 2 * c.head_dim);
    if (c.is_moe_layer(layer))
      bytes += 2.0 * (c.num_experts * c.hidden_size + c.experts_per_token * 3.0 * c.hidden_size * c.moe_intermediate_size);
    else
      bytes += 2.0 * 3.0 * c.hidden_size * c.intermediate_size;
  }
  const double floor_tokens_per_s = bandwidth * 1e9 / bytes;

  sy::engine::EngineConfig engine_config;
  engine_config.model_dir = model_dir;
  engine_config.capture_routes = true;
  engine_config.max_num_batched_tokens = prompt_tokens;
  engine_config.kv_cache_tokens = prompt_tokens + decode_tokens + 64;
  engine_config.enable_prefix_caching = false;
  auto engine = sy::engine::create_engine(engine_config);
  if (!engine) {
    std::fprintf(stderr, "%s\n", engine.message().c_str());
    return 1;
  }
  auto measure = [&](int seed) {
    sy::engine::GenerationRequest request;
    for (int i = 0; i < prompt_tokens; ++i) request.prompt_ids.push_back((i * 7919 + seed * 104729) % 150000 + 10);
    request.sampling.temperature = 0.0f;
    request.sampling.max_tokens = decode_tokens + 1;
    request.sampling.ignore_eos = true;
    request.return_routes = true;
    std::vector<double> times;
    std::promise<void> done;
    auto start = Clock::now();
    auto id = (*engine)->submit(request, [&](const sy::engine::Event& event) {
      for (size_t i = 0; i < event.new_token_ids.size(); ++i) times.push_back(seconds_since(start));
      if (event.finished) done.set_value();
      return sy::engine::Continuation::kContinue;
    });
    if (!id) std::abort();
    done.get_future().wait();
    return times;
  };
  measure(0);  // warm-up
  std::vector<double> prefill_rates, decode_rates;
  for (int run = 1; run <= 3; ++run) {
    std::vector<double> times = measure(run);
    prefill_rates.push_back(prompt_tokens / times.front());
    decode_rates.push_back(decode_tokens / (times.back() - times.front()));
  }
  std::sort(prefill_rates.begin(), prefill_rates.end());
  std::sort(decode_rates.begin(), decode_rates.end());
  const double prefill = prefill_rates[1], decode = decode_rates[1];

  nlohmann::json result{
      {"benchmark", "cpu_engine"},
      {"date", command_output("date -u +%Y-%m-%dT%H:%M:%SZ")},
      {"commit", command_output("git rev-parse --short HEAD 2>/dev/null")},
      {"machine", command_output("lscpu | sed -n 's/^Model name: *//p' | head -1") + ", " + std::to_string(threads) +
                      " cores"},
      {"model", model_dir},
      {"prompt_tokens", prompt_tokens},
      {"decode_tokens", decode_tokens},
      {"memory_read_bandwidth_gbs", bandwidth},
      {"decode_weight_bytes_per_token", bytes},
      {"decode_floor_tokens_per_s", floor_tokens_per_s},
      {"prefill_tokens_per_s_median_of_3", prefill},
      {"decode_tokens_per_s_median_of_3", decode},
      {"decode_fraction_of_floor", decode / floor_tokens_per_s},
      {"routes_captured", true}};
  std::printf("%s\n", result.dump(2).c_str());
  if (!out_path.empty()) std::ofstream(out_path) << result.dump(2) << "\n";
  return 0;
}
