// Cost of routed-expert capture per forward step, the finest A/B there is: one decoder over one
// loaded model runs the same step again and again, with capture_routes switched on and off from
// one step to the next in A B B A order, so slow drift of a shared machine (the noise that
// dominates whole-run A/Bs) cancels. Capture on = the route buffer is allocated, poisoned, written
// by the MoE kernel, downloaded and checked; off = none of that. Two step shapes: a decode step
// (SEQS sequences, one token each, after a PROMPT-token context) and a prefill chunk of CHUNK
// tokens. A control run of the same schedule with capture off on both sides gives the method's
// own spread.
//   routes_step_bench MODEL_DIR [--moe-kernel cpu-fused|cpu-modular] [--steps 120] [--seqs 8]
//                     [--prompt 64] [--chunk 256] [--prefill-steps 24] [--out FILE.json]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "bench_util.h"
#include "model/decoder.h"
#include "model/model.h"
#include "moe/experts_kernel.h"

namespace {

using sy::bench::build_commit;
using sy::bench::command_output;

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Sequence s owns blocks [s * blocks_per_seq, (s + 1) * blocks_per_seq).
sy::model::StepInputs make_step(int seqs, int first_position, int tokens_per_seq,
                                int blocks_per_seq, int block_size, int64_t vocab) {
  sy::model::StepInputs in;
  in.num_seqs = seqs;
  in.max_blocks_per_seq = blocks_per_seq;
  for (int s = 0; s < seqs; ++s) {
    for (int b = 0; b < blocks_per_seq; ++b) in.block_tables.push_back(s * blocks_per_seq + b);
    for (int i = 0; i < tokens_per_seq; ++i) {
      const int p = first_position + i;
      in.token_ids.push_back(
          static_cast<int32_t>((p * 7919 + s * 104729) % std::min<int64_t>(vocab - 1, 150000) + 1));
      in.positions.push_back(p);
      in.token_seq.push_back(s);
      in.slot_mapping.push_back((s * blocks_per_seq + p / block_size) * block_size +
                                p % block_size);
    }
    in.logits_rows.push_back(static_cast<int32_t>(in.token_ids.size() - 1));
  }
  return in;
}

struct Series {
  std::vector<double> on, off, ratios;  // per-step seconds; on/off ratio of each A B (or B A) pair
};

// ABBA over `pairs` pairs; `control` runs capture off on both sides.
Series alternate(sy::model::Decoder& decoder, const sy::model::Model& model,
                 sy::model::StepInputs step, int pairs, bool control) {
  Series series;
  sy::model::StepOutputs out;
  auto time_step = [&](bool capture) {
    step.capture_routes = capture;
    auto start = Clock::now();
    sy::Status status = decoder.forward(model, step, out);
    if (status) status = decoder.finish_step(model, out);
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    if (!status) {
      std::fprintf(stderr, "forward: %s\n", status.message().c_str());
      std::exit(1);
    }
    if (capture && out.routes.size() != step.token_ids.size() *
                                            static_cast<size_t>(model.config().num_hidden_layers *
                                                                model.config().experts_per_token)) {
      std::fprintf(stderr, "captured %zu route ints for %zu tokens\n", out.routes.size(),
                   step.token_ids.size());
      std::exit(1);
    }
    return seconds;
  };
  time_step(false);  // warm-up
  time_step(true);
  for (int pair = 0; pair < pairs; ++pair) {
    double a, b;
    if (pair % 2 == 0) {
      a = time_step(!control);
      b = time_step(false);
    } else {
      b = time_step(false);
      a = time_step(!control);
    }
    series.on.push_back(a);
    series.off.push_back(b);
    series.ratios.push_back(a / b);  // time ratio: > 1 means the capture side is slower
  }
  return series;
}

nlohmann::ordered_json summary(const Series& test, const Series& control, int tokens) {
  std::vector<double> control_dev;
  for (double r : control.ratios) control_dev.push_back(std::abs(r - 1));
  const double median_ratio = median(test.ratios);
  return {{"tokens_per_step", tokens},
          {"pairs", test.ratios.size()},
          {"median_step_seconds_on", median(test.on)},
          {"median_step_seconds_off", median(test.off)},
          {"median_time_ratio_on_over_off", median_ratio},
          {"control_median_time_ratio", median(control.ratios)},
          {"control_median_abs_deviation", median(control_dev)},
          {"within_control_spread", std::abs(median_ratio - 1) <= median(control_dev)},
          {"under_1_percent", std::abs(median_ratio - 1) < 0.01},
          {"time_ratios", test.ratios},
          {"control_time_ratios", control.ratios}};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(
        stderr,
        "usage: %s MODEL_DIR [--moe-kernel K] [--steps N] [--seqs N] [--prompt N] [--chunk N] "
        "[--prefill-steps N] [--out FILE]\n",
        argv[0]);
    return 2;
  }
  std::string model_dir = argv[1], out_path, kernel_name = "cpu-fused";
  int steps = 120, seqs = 8, prompt = 64, chunk = 256, prefill_steps = 24;
  for (int i = 2; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--moe-kernel"))
      kernel_name = argv[i + 1];
    else if (!std::strcmp(argv[i], "--steps"))
      steps = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--seqs"))
      seqs = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--prompt"))
      prompt = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--chunk"))
      chunk = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--prefill-steps"))
      prefill_steps = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--out"))
      out_path = argv[i + 1];
    else {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  if (steps < 4 || seqs < 1 || prompt < 1 || chunk < 1 || prefill_steps < 4) {
    std::fprintf(stderr, "need --steps >= 4, --prefill-steps >= 4 and positive sizes\n");
    return 2;
  }
  auto backend = sy::backend::make_cpu_backend({0});
  sy::moe::ExpertsKernelRegistry registry;
  backend->register_kernels(registry);
  auto kernel = registry.select(kernel_name, {backend->device(), true, false});
  if (!kernel) {
    std::fprintf(stderr, "%s\n", kernel.message().c_str());
    return 1;
  }
  auto model = sy::model::Model::load(model_dir, *backend);
  if (!model) {
    std::fprintf(stderr, "%s\n", model.message().c_str());
    return 1;
  }
  const sy::model::ModelConfig& c = (*model)->config();
  const int block_size = 16;
  const int blocks_per_seq = (std::max(prompt + 1, chunk) + block_size - 1) / block_size;
  sy::model::Decoder decoder(*backend, {*kernel, nullptr, 0}, block_size);
  const int64_t max_tokens = std::max<int64_t>(int64_t{seqs} * prompt, chunk);
  if (sy::Status s = decoder.allocate(c, int64_t{seqs} * blocks_per_seq, {max_tokens, seqs, blocks_per_seq, max_tokens}); !s) {
    std::fprintf(stderr, "allocate: %s\n", s.message().c_str());
    return 1;
  }

  // Context for the decode steps: each sequence's prompt in the cache.
  {
    sy::model::StepInputs fill =
        make_step(seqs, 0, prompt, blocks_per_seq, block_size, c.vocab_size);
    sy::model::StepOutputs out;
    sy::Status s = decoder.forward(**model, fill, out);
    if (s) s = decoder.finish_step(**model, out);
    if (!s) {
      std::fprintf(stderr, "prefill: %s\n", s.message().c_str());
      return 1;
    }
  }
  const sy::model::StepInputs decode =
      make_step(seqs, prompt, 1, blocks_per_seq, block_size, c.vocab_size);
  const sy::model::StepInputs prefill =
      make_step(1, 0, chunk, blocks_per_seq, block_size, c.vocab_size);
  std::fprintf(stderr, "decode steps (%d tokens), %d pairs + control\n", seqs, steps / 2);
  Series decode_test = alternate(decoder, **model, decode, steps / 2, false);
  Series decode_control = alternate(decoder, **model, decode, steps / 2, true);
  std::fprintf(stderr, "prefill steps (%d tokens), %d pairs + control\n", chunk, prefill_steps / 2);
  Series prefill_test = alternate(decoder, **model, prefill, prefill_steps / 2, false);
  Series prefill_control = alternate(decoder, **model, prefill, prefill_steps / 2, true);

  nlohmann::ordered_json result{
      {"benchmark", "routes_step (per-step capture on/off A/B, bench/routes_step_bench)"},
      {"date", command_output("date -u +%Y-%m-%dT%H:%M:%SZ")},
      {"commit", build_commit()},
      {"machine", command_output("lscpu | sed -n 's/^Model name: *//p' | head -1") + ", " +
                      std::to_string(std::thread::hardware_concurrency()) + " cores"},
      {"model", model_dir},
      {"moe_kernel", kernel_name},
      {"order", "ABBA by step; control: the same schedule with capture off on both sides"},
      {"decode", summary(decode_test, decode_control, seqs)},
      {"prefill", summary(prefill_test, prefill_control, chunk)}};
  std::printf("%s\n", result.dump(1).c_str());
  if (!out_path.empty()) std::ofstream(out_path) << result.dump(1) << "\n";
  return 0;
}
