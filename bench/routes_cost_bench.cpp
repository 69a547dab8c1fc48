// Cost of routed-expert capture inside the engine, without the HTTP server's noise: in one process,
// over the same mmap'd weights, an engine with capture_routes on (every request asks for its
// routes) and one with it off run the same batch workload in turn, interleaved A B B A for PAIRS
// pairs (the ABBA order cancels a linear drift); every leg creates a fresh engine. `--control 1`
// makes both sides capture-off: the ratio then shows the method's own bias. Each run is CONCURRENCY
// requests of PROMPT random prompt tokens and DECODE generated tokens (ignore_eos, greedy)
// submitted at once; its figure is output tokens / wall time. Also times the server's wire encoding
// of one request's routes (select_routes + base64 .npy) against that request's generation time.
//   routes_cost_bench MODEL_DIR [--moe-kernel auto|cpu-modular|cpu-fused] [--pairs 8]
//                     [--concurrency 8] [--prompt 64] [--decode 48] [--control 0|1] [--out
//                     FILE.json] [--device cpu|cuda] [--random-weights CONFIG.json]
// (MODEL_DIR "-" with --random-weights: a seeded random model built on the device, as serve's.)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <future>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "bench_util.h"
#include "engine/engine.h"
#include "server/api.h"

namespace {

using sy::bench::build_commit;
using sy::bench::command_output;

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct Workload {
  int concurrency, prompt, decode;
  int64_t vocab;
};

struct RunResult {
  double seconds = 0;
  int64_t output_tokens = 0;
  int64_t route_rows = 0;  // delivered (capture side only)
  std::vector<std::shared_ptr<const sy::moe::RouteArray>> routes;  // the engine's own arrays
  // The engine's own timers over the timed run (EngineMetrics deltas): its step time and the
  // host work capture adds or changes.
  int64_t steps = 0;
  double step_seconds = 0, route_check_seconds = 0, route_log_seconds = 0, prefix_publish_seconds = 0;
};

// Submits the whole batch at once and waits for every final event. Prompts differ per run (seed)
// so the prefix cache, if any, cannot help one side.
RunResult run_batch(sy::engine::Engine& engine, const Workload& w, bool want_routes,
                    uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> token(
      10, static_cast<int32_t>(std::min<int64_t>(w.vocab, 150000) - 1));
  std::mutex mutex;
  int remaining = w.concurrency;
  std::promise<void> all_done;
  RunResult result;
  auto start = Clock::now();
  for (int r = 0; r < w.concurrency; ++r) {
    sy::engine::GenerationRequest request;
    for (int i = 0; i < w.prompt; ++i) request.prompt_ids.push_back(token(rng));
    request.sampling.temperature = 0.0f;
    request.sampling.max_tokens = w.decode;
    request.sampling.ignore_eos = true;
    request.return_routes = want_routes;
    auto id = engine.submit(std::move(request), [&](const sy::engine::Event& event) {
      std::lock_guard lock(mutex);
      result.output_tokens += static_cast<int64_t>(event.new_token_ids.size());
      if (event.finished) {
        if (event.finish_reason != sy::engine::FinishReason::kLength) {
          std::fprintf(stderr, "request ended with %d: %s\n", static_cast<int>(event.finish_reason),
                       event.error.message().c_str());
          std::abort();
        }
        if (event.routes) {
          result.route_rows += event.routes->rows;
          result.routes.push_back(event.routes);
        }
        if (--remaining == 0) all_done.set_value();
      }
      return sy::engine::Continuation::kContinue;
    });
    if (!id) {
      std::fprintf(stderr, "submit: %s\n", id.message().c_str());
      std::abort();
    }
  }
  all_done.get_future().wait();
  result.seconds = seconds_since(start);
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: %s MODEL_DIR [--moe-kernel K] [--pairs N] [--concurrency N] [--prompt N] "
                 "[--decode N] [--out FILE] [--device cpu|cuda] [--random-weights CONFIG]\n",
                 argv[0]);
    return 2;
  }
  std::string model_dir = argv[1], out_path, kernel = "auto", random_weights;
  sy::Device device = sy::Device::kCpu;
  int pairs = 8;
  bool control = false;  // --control 1: both sides capture off (measures the method's own bias)
  Workload w{8, 64, 48, 0};
  for (int i = 2; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--moe-kernel"))
      kernel = argv[i + 1];
    else if (!std::strcmp(argv[i], "--pairs"))
      pairs = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--concurrency"))
      w.concurrency = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--prompt"))
      w.prompt = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--decode"))
      w.decode = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--out"))
      out_path = argv[i + 1];
    else if (!std::strcmp(argv[i], "--control"))
      control = !std::strcmp(argv[i + 1], "1");
    else if (!std::strcmp(argv[i], "--random-weights"))
      random_weights = argv[i + 1];
    else if (!std::strcmp(argv[i], "--device")) {
      auto parsed = sy::backend::parse_device(argv[i + 1]);
      if (!parsed) {
        std::fprintf(stderr, "%s\n", parsed.message().c_str());
        return 2;
      }
      device = *parsed;
    } else {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  if (pairs < 2 || w.concurrency < 1 || w.prompt < 1 || w.decode < 2) {
    std::fprintf(stderr, "need --pairs >= 2, --concurrency >= 1, --prompt >= 1, --decode >= 2\n");
    return 2;
  }

  auto make = [&](bool capture) {
    sy::engine::EngineConfig config;
    if (random_weights.empty())
      config.model_dir = model_dir;
    else
      config.random_weights_config = random_weights;
    config.device = device;
    config.moe_kernel = kernel;
    config.capture_routes = capture;
    config.kv_cache_tokens = int64_t{w.concurrency} * (w.prompt + w.decode + 32);
    config.enable_prefix_caching = false;
    auto engine = sy::engine::create_engine(config);
    if (!engine) {
      std::fprintf(stderr, "%s\n", engine.message().c_str());
      std::exit(1);
    }
    return std::move(*engine);
  };
  sy::engine::ModelInfo info;
  {
    auto probe = make(false);
    info = probe->model_info();
    probe->shutdown(1000);
  }
  w.vocab = info.vocab_size;
  // Each leg gets a fresh engine (weights stay in the page cache), warmed by one short request,
  // so neither side keeps a placement of its buffers that the other never gets.
  auto timed_leg = [&](bool capture_side, uint32_t seed) {
    auto engine = make(control ? false : capture_side);
    Workload warm = w;
    warm.concurrency = 1;
    warm.decode = 4;
    run_batch(*engine, warm, capture_side && !control, seed + 5000);
    const sy::engine::EngineMetrics before = engine->metrics();
    RunResult r = run_batch(*engine, w, capture_side && !control, seed);
    engine->shutdown(1000);  // (the last step's counters land after its events)
    const sy::engine::EngineMetrics after = engine->metrics();
    r.steps = after.steps_total - before.steps_total;
    r.step_seconds = after.step_seconds_total - before.step_seconds_total;
    r.route_check_seconds = after.route_check_seconds_total - before.route_check_seconds_total;
    r.route_log_seconds = after.route_log_seconds_total - before.route_log_seconds_total;
    r.prefix_publish_seconds = after.prefix_publish_seconds_total - before.prefix_publish_seconds_total;
    return r;
  };
  std::vector<double> on_tps, off_tps;
  nlohmann::json host_times;  // per side and leg: the engine's timers (RunResult)
  int64_t rows_checked = 0, bad_ids = 0;
  std::vector<sy::moe::RouteArray> sample_routes;
  double encode_seconds = 0, encode_request_seconds = 0;
  int64_t encoded_bytes = 0;
  uint32_t seed = 100;
  for (int pair = 0; pair < pairs; ++pair) {
    for (int leg = 0; leg < 2; ++leg) {
      const bool capture_side = (pair % 2 == 0) == (leg == 0);  // A B, then B A
      RunResult r = timed_leg(capture_side, seed++);
      const double tps = r.output_tokens / r.seconds;
      std::fprintf(stderr,
                   "pair %d %s: %.2f output tok/s (%.2f s); engine %ld steps %.3f s: route check %.2f ms, "
                   "route log %.2f ms, prefix publish %.2f ms\n",
                   pair + 1, capture_side ? "on " : "off", tps, r.seconds, static_cast<long>(r.steps), r.step_seconds,
                   1e3 * r.route_check_seconds, 1e3 * r.route_log_seconds, 1e3 * r.prefix_publish_seconds);
      (capture_side ? on_tps : off_tps).push_back(tps);
      nlohmann::json& side = host_times[capture_side ? "on" : "off"];
      side["steps"].push_back(r.steps);
      side["step_seconds"].push_back(r.step_seconds);
      side["route_check_seconds"].push_back(r.route_check_seconds);
      side["route_log_seconds"].push_back(r.route_log_seconds);
      side["prefix_publish_seconds"].push_back(r.prefix_publish_seconds);
      if (!capture_side || control) continue;
      // Every delivered route: (prompt + decode - 1) rows, ids in range on MoE layers.
      for (const auto& shared : r.routes) {
        const sy::moe::RouteArray& routes = *shared;
        if (routes.rows != w.prompt + w.decode - 1 || routes.layers != info.num_hidden_layers ||
            routes.top_k != info.top_k) {
          std::fprintf(stderr, "route shape (%ld, %ld, %ld) is wrong\n",
                       static_cast<long>(routes.rows), static_cast<long>(routes.layers),
                       static_cast<long>(routes.top_k));
          return 1;
        }
        for (int layer : info.moe_layers)
          for (int64_t row = 0; row < routes.rows; ++row)
            for (int64_t k = 0; k < routes.top_k; ++k) {
              int32_t id = routes.at(row, layer, k);
              bad_ids += id < 0 || id >= info.num_experts;
            }
        rows_checked += routes.rows;
      }
      // The server's per-request wire work: select all rows/layers, .npy, base64.
      sy::server::RouteOptions options;
      auto start = Clock::now();
      for (const auto& routes : r.routes) {
        sy::moe::RouteArray selected = sy::server::select_routes(*routes, options, info);
        encoded_bytes += static_cast<int64_t>(
            sy::server::encode_routes_npy_base64(selected, info.num_experts).size());
      }
      encode_seconds += seconds_since(start);
      encode_request_seconds += r.seconds * static_cast<double>(r.routes.size());
    }
  }

  std::vector<double> ratios, same;
  for (int i = 0; i < pairs; ++i) ratios.push_back(on_tps[i] / off_tps[i]);
  for (int i = 0; i + 1 < pairs; ++i) {
    same.push_back(on_tps[i] / on_tps[i + 1]);
    same.push_back(off_tps[i] / off_tps[i + 1]);
  }
  std::vector<double> same_dev;
  for (double s : same) same_dev.push_back(std::abs(s - 1));
  const double median_ratio = median(ratios);
  const double same_median_dev = median(same_dev);
  const double same_max_dev = *std::max_element(same_dev.begin(), same_dev.end());
  const double encode_fraction = encode_seconds / encode_request_seconds;

  nlohmann::ordered_json result{
      {"benchmark", "routes_cost (in-process A/B, bench/routes_cost_bench)"},
      {"date", command_output("date -u +%Y-%m-%dT%H:%M:%SZ")},
      {"commit", build_commit()},
      {"machine", command_output("lscpu | sed -n 's/^Model name: *//p' | head -1") + ", " +
                      std::to_string(std::thread::hardware_concurrency()) + " cores"},
      {"model", random_weights.empty() ? model_dir : "random weights: " + random_weights},
      {"device", device == sy::Device::kCuda ? "cuda" : "cpu"},
      {"gpu", command_output("nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null")},
      {"moe_kernel", kernel},
      {"control_both_sides_off", control},
      {"concurrency", w.concurrency},
      {"prompt_tokens", w.prompt},
      {"decode_tokens", w.decode},
      {"pairs", pairs},
      {"order", "ABBA: pair 1 on,off; pair 2 off,on; ..."},
      {"on_output_tok_s", on_tps},
      {"off_output_tok_s", off_tps},
      {"pair_ratios_on_over_off", ratios},
      {"median_ratio", median_ratio},
      {"same_vs_same_ratios", same},
      {"same_vs_same_median_abs_deviation", same_median_dev},
      {"same_vs_same_max_abs_deviation", same_max_dev},
      {"within_median_spread", std::abs(median_ratio - 1) <= same_median_dev},
      {"under_1_percent", std::abs(median_ratio - 1) < 0.01},
      {"route_rows_checked", rows_checked},
      {"route_ids_out_of_range", bad_ids},
      {"wire_encode_seconds_total", encode_seconds},
      {"wire_encoded_bytes_total", encoded_bytes},
      {"wire_encode_fraction_of_request_time", encode_fraction},
      {"engine_host_times", host_times}};
  std::printf("%s\n", result.dump(1).c_str());
  if (!out_path.empty()) std::ofstream(out_path) << result.dump(1) << "\n";
  return bad_ids == 0 ? 0 : 1;
}
