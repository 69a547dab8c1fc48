// Per-row cost of CpuBackend::sample over a Qwen3-sized vocabulary (151,936), single thread, for
// the filter mixes RL rollouts use, against two references measured in the same run: one pass of
// exp over the row (what any exact sampler must do at least once; the floor), and a full sort of
// the vocabulary by logit (what the sampler did for every row before it sorted only what the
// filters need).
//   sampler_bench [--rows 64] [--out FILE.json]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <numeric>
#include <random>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "bench_util.h"

namespace {

using sy::bench::command_output;

using Clock = std::chrono::steady_clock;

}  // namespace

int main(int argc, char** argv) {
  int rows = 64;
  std::string out_path;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--rows"))
      rows = std::max(1, std::atoi(argv[i + 1]));
    else if (!std::strcmp(argv[i], "--out"))
      out_path = argv[i + 1];
  }
  const int64_t vocab = 151936;
  // LM-like logits: mostly small, a heavy head (a few tokens far above the rest).
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> host(static_cast<size_t>(rows * vocab));
  for (float& x : host) x = normal(rng);
  for (int r = 0; r < rows; ++r)
    for (int k = 0; k < 20; ++k)
      host[static_cast<size_t>(r * vocab + (r * 7919 + k * 104729) % vocab)] += 12.0f - k * 0.4f;

  auto backend = sy::backend::make_cpu_backend({1});
  sy::Tensor logits = backend->alloc(sy::DType::kF32, {rows, vocab});
  backend->upload(host.data(), logits);

  auto per_row_us = [&](auto&& body) {
    double best = 1e30;
    for (int pass = 0; pass < 3; ++pass) {
      auto start = Clock::now();
      body();
      best = std::min(
          best, std::chrono::duration<double, std::micro>(Clock::now() - start).count() / rows);
    }
    return best;
  };
  volatile double sink = 0;
  const double exp_pass = per_row_us([&] {
    for (int r = 0; r < rows; ++r) {
      const float* row = host.data() + r * vocab;
      const float max_value = *std::max_element(row, row + vocab);
      double sum = 0;
      for (int64_t i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(row[i] - max_value));
      sink = sink + sum;
    }
  });
  std::vector<int32_t> ids(static_cast<size_t>(vocab));
  const double full_sort = per_row_us([&] {
    for (int r = 0; r < rows; ++r) {
      const float* row = host.data() + r * vocab;
      std::iota(ids.begin(), ids.end(), 0);
      std::sort(ids.begin(), ids.end(), [row](int32_t a, int32_t b) {
        return row[a] > row[b] || (row[a] == row[b] && a < b);
      });
      sink = sink + ids[0];
    }
  });

  struct Case {
    const char* name;
    float temperature, top_p, min_p;
    int top_k;
  };
  const Case cases[] = {{"greedy", 0.0f, 1.0f, 0.0f, -1},
                        {"temperature 1", 1.0f, 1.0f, 0.0f, -1},
                        {"temperature 1, top_p 0.95", 1.0f, 0.95f, 0.0f, -1},
                        {"temperature 0.7, top_k 50", 0.7f, 1.0f, 0.0f, 50},
                        {"temperature 1, min_p 0.05", 1.0f, 1.0f, 0.05f, -1}};
  nlohmann::ordered_json measured = nlohmann::ordered_json::array();
  for (const Case& c : cases) {
    std::vector<sy::backend::SamplingRow> params(static_cast<size_t>(rows));
    for (int r = 0; r < rows; ++r) {
      params[r].temperature = c.temperature;
      params[r].top_p = c.top_p;
      params[r].min_p = c.min_p;
      params[r].top_k = c.top_k;
      params[r].seed = 42;
      params[r].draw_index = static_cast<uint64_t>(r);
    }
    std::vector<sy::backend::SampledToken> sampled;
    const double us = per_row_us([&] { backend->sample(logits, params, sampled); });
    std::fprintf(stderr, "%-28s %8.1f us/row (%.2f x the exp pass, %.2f x a full sort)\n", c.name,
                 us, us / exp_pass, us / full_sort);
    measured.push_back({{"case", c.name},
                        {"us_per_row", us},
                        {"over_exp_pass", us / exp_pass},
                        {"over_full_sort", us / full_sort}});
  }
  backend->free_buffer(logits);
  nlohmann::ordered_json result{
      {"benchmark", "sampler (bench/sampler_bench)"},
      {"date", command_output("date -u +%Y-%m-%dT%H:%M:%SZ")},
      {"commit", command_output("git rev-parse --short HEAD 2>/dev/null")},
      {"machine", command_output("lscpu | sed -n 's/^Model name: *//p' | head -1")},
      {"vocab", vocab},
      {"rows", rows},
      {"threads", 1},
      {"exp_pass_us_per_row", exp_pass},
      {"full_sort_us_per_row", full_sort},
      {"cases", measured}};
  std::printf("%s\n", result.dump(1).c_str());
  if (!out_path.empty()) std::ofstream(out_path) << result.dump(1) << "\n";
  return 0;
}
