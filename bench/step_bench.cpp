// step_bench: one decoder's steps timed on any backend (the GPU's decode and prefill figures in
// BENCHMARKS.md): batch-B decode over a context of C tokens (each step = forward + greedy
// sampling + route check, as the engine runs it), capture on/off interleaved ABBA, and one long
// prefill step (one sequence's, or --prefill-seqs equal prompts together: a serving prefill
// step). Floors: decode = bytes the step must read (weights of the attention, router, the
// experts the captured routes actually chose, lm_head rows, KV of the context) / --bandwidth-gbs;
// prefill = its FLOPs / --matmul-tflops (both measured in the same run by scripts/gpu-check.sh).
//   step_bench --device cuda --random-weights CONFIG.json [--batches 1,8,64] [--context 1024]
//              [--steps 64] [--prefill 8192] [--prefill-seqs 1] [--kernel auto] [--batch-invariant]
//              [--bandwidth-gbs B] [--matmul-tflops F]
//              [--json-out FILE]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "bench_util.h"
#include "model/decoder.h"
#include "model/model.h"

namespace {

using Clock = std::chrono::steady_clock;
using sy::Status;

struct Args {
  std::string device = "cuda", random_weights, model_dir, kernel = "auto", json_out;
  std::vector<int> batches{1, 8, 64};
  int context = 1024, steps = 64, prefill = 8192, ab_pairs = 32;
  int prefill_seqs = 1;  // the prefill step's tokens split evenly over this many sequences
  double bandwidth_gbs = 0, matmul_tflops = 0;
  bool no_graphs = false;
  bool batch_invariant = false;  // BackendOptions::batch_invariant (cuda-modular only)
};

std::vector<int> parse_list(const std::string& text) {
  std::vector<int> values;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) values.push_back(std::stoi(item));
  return values;
}

[[noreturn]] void die(const std::string& message) {
  std::fprintf(stderr, "step_bench: %s\n", message.c_str());
  std::exit(1);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

struct Bench {
  Args args;
  std::unique_ptr<sy::backend::Backend> backend;
  sy::moe::ExpertsKernelRegistry registry;
  std::unique_ptr<sy::model::Model> model;
  std::unique_ptr<sy::model::Decoder> decoder;
  int block_size = 16, blocks_per_seq = 0;

  // A step of `count` tokens for each of sequences [0, seqs) starting at position `begin`;
  // sequence s owns blocks first_block + s * stride ... (+ stride).
  sy::model::StepInputs make_step(int seqs, int begin, int count, bool capture, int first_block = 0,
                                  int stride = 0) const {
    if (stride == 0) stride = blocks_per_seq;
    sy::model::StepInputs in;
    in.num_seqs = seqs;
    in.max_blocks_per_seq = stride;
    for (int s = 0; s < seqs; ++s) {
      for (int b = 0; b < stride; ++b) in.block_tables.push_back(first_block + s * stride + b);
      for (int p = begin; p < begin + count; ++p) {
        in.token_ids.push_back(static_cast<int32_t>((p * 7919 + s * 104729) % model->config().vocab_size));
        in.positions.push_back(p);
        in.token_seq.push_back(s);
        in.slot_mapping.push_back((first_block + s * stride + p / block_size) * block_size + p % block_size);
      }
      in.logits_rows.push_back(static_cast<int32_t>(in.token_ids.size() - 1));
      if (decoder->state_buffers() > 0) {  // linear-attention layers: sequence s's two buffers
        in.state_read.push_back(2 * s);
        in.state_write.push_back(2 * s + 1);
      }
    }
    in.capture_routes = capture;
    return in;
  }

  // forward + greedy sample + finish, in the engine's order (the routes collected while the
  // device samples): what one engine step costs. Returns seconds.
  double run(const sy::model::StepInputs& in, std::vector<int32_t>* routes = nullptr) {
    auto start = Clock::now();
    sy::model::StepOutputs out;
    Status status = decoder->forward(*model, in, out);
    std::vector<sy::backend::SamplingRow> rows(in.logits_rows.size());
    for (auto& row : rows) row.temperature = 0.0f;
    std::vector<sy::backend::SampledToken> sampled;
    if (status) backend->sample_async(out.logits, rows, sampled);
    if (status) status = decoder->collect_routes(*model, out);
    if (Status finished = decoder->finish_step(*model, out); status) status = finished;
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    if (!status) die(status.message());
    if (routes) *routes = out.routes;
    return seconds;
  }
};

}  // namespace

int main(int argc, char** argv) {
  Bench bench;
  Args& a = bench.args;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) die("missing value for " + flag);
      return argv[++i];
    };
    if (flag == "--device") a.device = next();
    else if (flag == "--random-weights") a.random_weights = next();
    else if (flag == "--model") a.model_dir = next();
    else if (flag == "--kernel") a.kernel = next();
    else if (flag == "--batches") a.batches = parse_list(next());
    else if (flag == "--context") a.context = std::stoi(next());
    else if (flag == "--steps") a.steps = std::stoi(next());
    else if (flag == "--prefill") a.prefill = std::stoi(next());
    else if (flag == "--prefill-seqs")
      a.prefill_seqs = std::stoi(next());
    else if (flag == "--ab-pairs") a.ab_pairs = std::stoi(next());
    else if (flag == "--bandwidth-gbs") a.bandwidth_gbs = std::stod(next());
    else if (flag == "--matmul-tflops") a.matmul_tflops = std::stod(next());
    else if (flag == "--json-out") a.json_out = next();
    else if (flag == "--no-graphs") a.no_graphs = true;
    else if (flag == "--batch-invariant") a.batch_invariant = true;
    else die("unknown flag " + flag);
  }
  auto device = sy::backend::parse_device(a.device);
  if (!device) die(device.message());
  auto made = sy::backend::make_backend({*device, 0, 0, a.batch_invariant});
  if (!made) die(made.message());
  bench.backend = std::move(made).value();
  bench.backend->register_kernels(bench.registry);
  auto large = bench.registry.select(a.kernel, {*device, true, true});
  if (!large) die(large.message());
  sy::model::KernelChoice kernels{*large, nullptr, 0};
  if (a.kernel == "auto" && !bench.backend->small_batch_kernel().empty() && !a.batch_invariant) {
    auto small = bench.registry.select(bench.backend->small_batch_kernel(), {*device, true, true});
    if (small) kernels = {*large, *small, bench.backend->small_batch_max_tokens()};
  }
  auto loaded = a.random_weights.empty() ? sy::model::Model::load(a.model_dir, *bench.backend)
                                         : sy::model::Model::random(a.random_weights, *bench.backend, 1);
  if (!loaded) die(loaded.message());
  bench.model = std::move(loaded).value();
  const sy::model::ModelConfig& c = bench.model->config();

  if (a.prefill_seqs < 1 || a.prefill % a.prefill_seqs != 0)
    die("--prefill-seqs must divide --prefill");
  const int prefill_len = a.prefill / a.prefill_seqs;  // each prefill sequence's tokens
  const int max_batch =
      std::max(a.batches.empty() ? 1 : *std::max_element(a.batches.begin(), a.batches.end()),
               a.prefill_seqs);
  const int longest = a.context + a.steps + 2 * a.ab_pairs + 8;
  bench.blocks_per_seq = (longest + bench.block_size - 1) / bench.block_size;
  const int prefill_blocks =
      (prefill_len + bench.block_size - 1) / bench.block_size;  // a sequence's
  const int64_t decode_blocks = int64_t{max_batch} * bench.blocks_per_seq;
  const int64_t max_tokens = std::max<int64_t>({a.prefill, 2048, max_batch});
  bench.decoder = std::make_unique<sy::model::Decoder>(*bench.backend, kernels, bench.block_size);
  bench.decoder->set_graphs_enabled(!a.no_graphs);
  if (Status s = bench.decoder->allocate(
          c, decode_blocks + int64_t{prefill_blocks} * a.prefill_seqs,
          {max_tokens, max_batch, std::max(bench.blocks_per_seq, prefill_blocks), max_tokens});
      !s)
    die(s.message());

  nlohmann::json records = nlohmann::json::array();
  // Bytes of weights every decode step reads regardless of routing, per layer and overall.
  const int64_t hidden = c.hidden_size, q_out = c.num_attention_heads * c.head_dim,
                kv_out = c.num_key_value_heads * c.head_dim;
  const int64_t attention_bytes = 2 * (hidden * q_out * 2 + hidden * kv_out * 2);
  const int64_t router_bytes = 2 * c.num_experts * hidden;
  // An expert's gate, up and down matrices: bf16, or MXFP4 as stored (half a byte a value and a
  // scale byte per 32), plus gpt-oss's bf16 biases.
  const int64_t expert_values = 3 * c.moe_intermediate_size * hidden;
  const int64_t expert_bytes =
      (c.experts.format == sy::moe::ExpertFormat::kMxfp4Interleaved ? expert_values / 2 + expert_values / 32
                                                                     : 2 * expert_values) +
      (c.experts.has_biases ? 2 * (2 * c.moe_intermediate_size + hidden) : 0);
  // K and V (bf16) a decode token reads at `position`: a sliding-window layer only its window;
  // a latent-attention layer its one cache row per position; a linear-attention layer no cache
  // but its conv and recurrent states (f32), read and written once a step.
  auto kv_bytes_at = [&](int64_t position) {
    double bytes = 0;
    for (const auto& layer : c.layers) {
      const int64_t window = layer.attention.sliding_window;
      const double positions =
          static_cast<double>(window > 0 ? std::min(position, window) : position);
      if (layer.attention.linear)
        bytes += 2.0 * 4 *
                 static_cast<double>(c.linear_attention.conv_state_values() +
                                     c.linear_attention.recurrent_state_values());
      else if (layer.attention.latent)
        bytes += 2.0 * static_cast<double>(c.latent_attention.cache_row()) * positions;
      else
        bytes += 2.0 * kv_out * 2 * positions;
    }
    return bytes;
  };
  // The weights a decode step reads besides its routed experts. Qwen3-MoE/gpt-oss-shaped models
  // (every layer MoE, plain attention): attention, routers, lm_head, as they always were counted.
  // Others (latent or linear attention, output gates, shared experts, dense layers): every
  // parameter but the embedding table and the routed experts, at 2 bytes (bf16).
  bool plain = c.moe_layers().size() == c.layers.size();
  for (const auto& layer : c.layers)
    plain &= !layer.attention.latent && !layer.attention.linear && !layer.attention.output_gate &&
             !layer.shared_expert;
  const double routed_values = static_cast<double>(c.moe_layers().size()) *
                               static_cast<double>(c.num_experts) * expert_values;
  const double dense_bytes =
      plain ? static_cast<double>(c.num_hidden_layers) * attention_bytes +
                  static_cast<double>(c.moe_layers().size()) * router_bytes +
                  2.0 * c.vocab_size * hidden
            : 2.0 * (static_cast<double>(bench.model->parameter_count()) -
                     static_cast<double>(c.vocab_size) * hidden - routed_values);

  // Capture overhead: `pairs` ABBA pairs of one step with capture on and off (`run_step(capture)`
  // gives its time); the ratio on/off of each pair.
  auto capture_ratios = [](int pairs, const auto& run_step) {
    std::vector<double> ratios;
    for (int pair = 0; pair < pairs; ++pair) {
      const bool on_first = pair % 2 == 0;
      const double first = run_step(on_first), second = run_step(!on_first);
      ratios.push_back(on_first ? first / second : second / first);
    }
    return ratios;
  };

  for (int batch : a.batches) {
    // Context: each sequence's first `context` tokens, prefilled in steps of <= max_tokens.
    const int per_step = std::max<int>(1, static_cast<int>(max_tokens / batch));
    for (int begin = 0; begin < a.context; begin += per_step) {
      const int count = std::min(per_step, a.context - begin);
      bench.run(bench.make_step(batch, begin, count, false));
    }
    int position = a.context;
    // Warm-up (records the graph of this batch size), then timed decode steps with capture on.
    for (int i = 0; i < 3; ++i) bench.run(bench.make_step(batch, position++, 1, true));
    std::vector<double> times;
    std::set<std::pair<int, int>> touched;  // (layer, expert) over the timed steps
    int64_t distinct_per_step = 0;
    for (int i = 0; i < a.steps; ++i) {
      std::vector<int32_t> routes;
      times.push_back(bench.run(bench.make_step(batch, position++, 1, true), &routes));
      std::set<std::pair<int, int>> step_touched;
      for (int64_t t = 0; t < batch; ++t)
        for (int layer : c.moe_layers())
          for (int64_t k = 0; k < c.experts_per_token; ++k)
            step_touched.insert({layer, routes[(t * c.num_hidden_layers + layer) * c.experts_per_token + k]});
      distinct_per_step += static_cast<int64_t>(step_touched.size());
    }
    const double step_s = median(times);
    const double experts = static_cast<double>(distinct_per_step) / a.steps;
    const double bytes =
        dense_bytes + experts * expert_bytes + static_cast<double>(batch) * kv_bytes_at(position);
    const double floor_s = a.bandwidth_gbs > 0 ? bytes / (a.bandwidth_gbs * 1e9) : 0.0;
    const double tok_s = batch / step_s;
    std::printf("decode batch %3d context %5d: %.3f ms/step, %.1f tok/s; %.1f experts/step, %.2f GB/step, "
                "floor %.3f ms -> %.1f%% of floor\n",
                batch, a.context, step_s * 1e3, tok_s, experts, bytes / 1e9, floor_s * 1e3,
                floor_s > 0 ? 100.0 * floor_s / step_s : 0.0);
    records.push_back({{"metric", batch == 1 ? "decode_b1_tok_s" : "decode_tok_s"}, {"batch", batch},
                       {"context", a.context}, {"value", tok_s}, {"step_ms", step_s * 1e3},
                       {"floor", floor_s > 0 ? batch / floor_s : 0.0}, {"fraction", floor_s > 0 ? floor_s / step_s : 0.0},
                       {"bytes_per_step", bytes}, {"experts_per_step", experts}});

    // Capture overhead of decode steps: median and spread of the pairs' ratios.
    const std::vector<double> ratios =
        capture_ratios(a.ab_pairs, [&](bool capture) { return bench.run(bench.make_step(batch, position++, 1, capture)); });
    if (ratios.empty()) continue;
    std::vector<double> sorted = ratios;
    std::sort(sorted.begin(), sorted.end());
    const double lo = sorted[sorted.size() / 10], hi = sorted[sorted.size() * 9 / 10];
    std::printf("  capture on/off step-time ratio: median %.4f (p10 %.4f, p90 %.4f) over %zu pairs\n",
                median(ratios), lo, hi, ratios.size());
    records.push_back({{"metric", "capture_overhead_frac"}, {"batch", batch}, {"value", median(ratios) - 1.0},
                       {"p10", lo - 1.0}, {"p90", hi - 1.0}, {"pairs", ratios.size()}});
  }

  if (a.prefill > 0) {
    // The prompts of `prefill_seqs` sequences, `prefill` tokens together, in one step.
    auto prefill_step = [&](bool capture) {
      return bench.run(bench.make_step(a.prefill_seqs, 0, prefill_len, capture,
                                       static_cast<int>(decode_blocks), prefill_blocks));
    };
    std::vector<double> times;
    for (int i = 0; i < 3; ++i) times.push_back(prefill_step(true));
    const double seconds = *std::min_element(times.begin() + 1, times.end());
    const double active = static_cast<double>(c.num_hidden_layers) * (attention_bytes / 2) +
                          static_cast<double>(c.moe_layers().size()) *
                              (router_bytes / 2 + c.experts_per_token * expert_bytes / 2.0);
    const double attention_flops = 2.0 * c.num_hidden_layers * c.num_attention_heads * c.head_dim *
                                   static_cast<double>(a.prefill) *
                                   prefill_len;  // causal: QK^T + PV, halved
    const double flops =
        2.0 * active * a.prefill + 2.0 * c.vocab_size * hidden * a.prefill_seqs + attention_flops;
    const double floor_s = a.matmul_tflops > 0 ? flops / (a.matmul_tflops * 1e12) : 0.0;
    std::printf(
        "prefill %d tokens (%d sequences): %.1f ms, %.0f tok/s, %.1f TFLOP/s; floor %.1f ms -> "
        "%.1f%% of the matmul rate\n",
        a.prefill, a.prefill_seqs, seconds * 1e3, a.prefill / seconds, flops / seconds / 1e12,
        floor_s * 1e3, floor_s > 0 ? 100.0 * floor_s / seconds : 0.0);
    records.push_back({{"metric", "prefill_tok_s"},
                       {"tokens", a.prefill},
                       {"sequences", a.prefill_seqs},
                       {"value", a.prefill / seconds},
                       {"ms", seconds * 1e3},
                       {"tflops", flops / seconds / 1e12},
                       {"floor", floor_s > 0 ? a.prefill / floor_s : 0.0},
                       {"fraction", floor_s > 0 ? floor_s / seconds : 0.0}});
    // Capture overhead of the long step (T * L * K ids copied down and checked on the host): a
    // quarter as many pairs as for decode.
    const std::vector<double> ratios = capture_ratios(a.ab_pairs / 4, prefill_step);
    if (!ratios.empty()) {
      std::printf("  prefill capture on/off step-time ratio: median %.4f over %zu pairs\n", median(ratios), ratios.size());
      records.push_back({{"metric", "prefill_capture_overhead_frac"}, {"tokens", a.prefill},
                         {"value", median(ratios) - 1.0}, {"pairs", ratios.size()}});
    }
  }
  if (!a.json_out.empty()) {
    std::string command;
    for (int i = 0; i < argc; ++i) command += std::string(i ? " " : "") + argv[i];
    // Provenance (BENCHMARKS.md: every figure carries date, commit and machine).
    nlohmann::json doc{
        {"model", c.architecture},
        {"layers", c.num_hidden_layers},
        {"command", command},
        {"date", sy::bench::command_output("date -u +%Y-%m-%dT%H:%M:%SZ")},
        {"commit", sy::bench::build_commit()},
        {"device", a.device},
        {"gpu", a.device == "cuda"
                    ? sy::bench::command_output(
                          "nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null")
                    : std::string()},
        {"bandwidth_gbs", a.bandwidth_gbs},
        {"matmul_tflops", a.matmul_tflops},
        {"records", records}};
    std::ofstream(a.json_out) << doc.dump(2) << "\n";
  }
  return 0;
}
