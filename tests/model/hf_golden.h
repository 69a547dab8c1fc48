// What the HF transformers golden tests share (hf_golden_test.cpp, long_golden_test.cpp): reading
// the fixtures, the device under test and its tolerances, one model run as single steps, and the
// route comparison with its near-tie rule.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "model/decoder.h"
#include "util/npy.h"

namespace sy::golden {

inline const std::string kGoldenRoot = std::string(SY_SOURCE_DIR) + "/tests/golden";

inline nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

inline std::vector<float> read_f32(const std::string& path, std::vector<int64_t>* shape = nullptr) {
  auto array = npy_read_file(path);
  EXPECT_TRUE(array.is_ok()) << array.message();
  if (!array) return {};
  EXPECT_EQ(array->dtype, DType::kF32) << path;
  if (shape) *shape = array->shape;
  std::vector<float> values(array->data.size() / 4);
  std::memcpy(values.data(), array->data.data(), array->data.size());
  return values;
}

inline std::vector<int64_t> read_ints(const std::string& path,
                                      std::vector<int64_t>* shape = nullptr) {
  auto array = npy_read_file(path);
  EXPECT_TRUE(array.is_ok()) << array.message();
  if (!array) return {};
  if (shape) *shape = array->shape;
  auto values = npy_to_int64(*array);
  EXPECT_TRUE(values.is_ok());
  return values.is_ok() ? *values : std::vector<int64_t>{};
}

inline std::vector<int32_t> ids_of(const nlohmann::json& list) {
  return list.get<std::vector<int32_t>>();
}

// The backend under test: SY_TEST_DEVICE=cuda runs these goldens on the GPU (scripts/gpu-check.sh);
// the default is the CPU reference.
inline Device test_device() {
  const char* env = std::getenv("SY_TEST_DEVICE");
  return env && std::string(env) == "cuda" ? Device::kCuda : Device::kCpu;
}
inline bool on_cuda() {
  return test_device() == Device::kCuda;
}
inline std::string kernel_name(const char* family, Device device = test_device()) {
  return std::string(device == Device::kCuda ? "cuda-" : "cpu-") + family;
}
// transformers' own bf16 error on a golden checkpoint: max |logits(bf16) - logits(float64)| over
// the rows before its first routing flip (tools/gpu/bf16_sensitivity.py on the GPU machine;
// tests/golden/bf16_sensitivity.json). 0 where not measured. An MXFP4 folder holds the same
// values as its bf16 sibling (tools/gpu/family_goldens.py writes both from one model), which
// transformers can load here: its figure stands for both.
// The largest of `field` over `checkpoint`'s prompts in bf16_sensitivity.json (0 where absent).
inline double bf16_measured(std::string checkpoint, const char* field) {
  static const nlohmann::json measured = read_json(kGoldenRoot + "/bf16_sensitivity.json");
  const std::string mxfp4 = "_mxfp4";
  if (checkpoint.size() > mxfp4.size() && checkpoint.compare(checkpoint.size() - mxfp4.size(), mxfp4.size(), mxfp4) == 0)
    checkpoint = checkpoint.substr(0, checkpoint.size() - mxfp4.size()) + "_bf16";
  if (!measured.contains(checkpoint)) return 0.0;
  double worst = 0.0;
  for (const auto& prompt : measured[checkpoint]["prompts"])
    if (prompt.contains(field) && prompt[field].is_number())
      worst = std::max(worst, prompt[field].get<double>());
  return worst;
}
inline double bf16_sensitivity(const std::string& checkpoint) {
  return bf16_measured(checkpoint, "max_before_flip");
}
// The largest bf16 error among the checkpoints CUDA's fixed tolerances below were set on
// (Qwen3-MoE, Mixtral, OLMoE, Qwen2-MoE: 0.025 to 0.039 in bf16_sensitivity.json).
constexpr double kBf16ErrorOfTheBaseModels = 0.04;
// How much more sensitive to bf16 rounding `checkpoint` is than those (at least 1): gpt-oss's
// tiny model (expert weights scaled until its SwiGLU clamp acts) moves 0.14 in transformers'
// own bf16 run, 3.5 times as far.
inline double bf16_scale(const std::string& checkpoint) {
  return std::max(1.0, bf16_sensitivity(checkpoint) / kBf16ErrorOfTheBaseModels);
}

// Logits tolerance against transformers' float64 reference: the CPU computes in f32; CUDA rounds
// GEMM activations, attention's Q and P, and the KV cache to bf16 (as transformers in bf16
// would): a relative error of ~2^-9 per rounding, seen as up to 0.063 on these logits (|logit|
// up to ~10) on the H200 (bench/results/gpu-check-2026-12-03.log). On CUDA, for a checkpoint
// more sensitive to bf16 than the base models: about as far from float64 as transformers' own
// bf16 run (bf16_sensitivity), with 25% room: that figure is one run's worst row over two
// prompts, and CUDA's two MoE kernels alone differ by ~6% on it (gpt-oss: cuda-modular 0.136,
// cuda-fused 0.144, transformers bf16 0.141; H100, bench/results/gpu-check-2026-12-05-9df2f8c-h100.log).
inline float logits_tolerance(const std::string& checkpoint = "") {
  if (!on_cuda()) return 1e-3f;
  return static_cast<float>(std::max(0.1, 1.25 * bf16_sensitivity(checkpoint)));
}
// The forced-routes test's tolerance: as logits_tolerance, but where bf16_sensitivity.json measured
// transformers' bf16 error with the fixture's forced routes (hybrid checkpoints: their bf16 routes
// flip within the first rows, so the rows before a flip are too few to stand for the model, while
// forced routes cannot flip), at least that with the same 25% room.
inline float forced_logits_tolerance(const std::string& checkpoint) {
  if (!on_cuda()) return 1e-3f;
  const double forced = bf16_measured(checkpoint, "forced_max_all");
  return std::max(logits_tolerance(checkpoint), static_cast<float>(1.25 * forced));
}
// Route rows whose k-th/(k+1)-th router logit gap is below this are near-ties (excluded,
// counted, printed): 1e-5 on the CPU; on CUDA, the same bf16 rounding moves router logits by a few
// 1e-2 (two rows with gaps 0.017 and 0.031 swapped there), so 0.05, scaled by bf16_scale.
inline float near_tie_gap(const std::string& checkpoint = "") {
  return on_cuda() ? static_cast<float>(0.05 * bf16_scale(checkpoint)) : 1e-5f;
}

inline float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float worst = 0.0f;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) return INFINITY;
    worst = std::max(worst, std::fabs(a[i] - b[i]));
  }
  return worst;
}

// One model on the backend under test with a chosen kernel, run as single full-sequence steps of
// at most `max_tokens` tokens.
struct Harness {
  std::unique_ptr<backend::Backend> backend;
  moe::ExpertsKernelRegistry registry;
  std::unique_ptr<model::Model> model;
  std::unique_ptr<model::Decoder> decoder;

  explicit Harness(const std::string& dir, const std::string& family = "modular",
                   int64_t max_tokens = 512, Device device = test_device()) {
    auto made = backend::make_backend({device, 2, 0});
    EXPECT_TRUE(made.is_ok()) << made.message();
    if (!made) return;
    backend = std::move(made).value();
    backend->register_kernels(registry);
    auto loaded = model::Model::load(dir, *backend);
    EXPECT_TRUE(loaded.is_ok()) << loaded.message();
    if (!loaded) return;  // model stays null: callers ASSERT on it
    model = std::move(loaded).value();
    auto kernel = registry.select(kernel_name(family.c_str(), device), {device, true, true});
    EXPECT_TRUE(kernel.is_ok()) << kernel.message();
    if (!kernel) return;
    decoder =
        std::make_unique<model::Decoder>(*backend, model::KernelChoice{*kernel, nullptr, 0}, 16);
    // KV blocks of 16 tokens for twice the longest step.
    const int64_t blocks = max_tokens / 8;
    Status allocated =
        decoder->allocate(model->config(), blocks, {max_tokens, 1, blocks, max_tokens});
    EXPECT_TRUE(allocated.is_ok()) << allocated.message();
  }

  // All positions' logits [n, vocab] and routes [n, L, K] of a fresh sequence; `forced` replays.
  Status run(const std::vector<int32_t>& tokens, std::vector<float>& logits,
             std::vector<int32_t>& routes, const std::vector<int32_t>* forced = nullptr) {
    model::StepInputs in;
    const int32_t n = static_cast<int32_t>(tokens.size());
    in.token_ids = tokens;
    for (int32_t p = 0; p < n; ++p) {
      in.positions.push_back(p);
      in.token_seq.push_back(0);
      in.slot_mapping.push_back(p);
      in.logits_rows.push_back(p);
    }
    in.num_seqs = 1;
    in.max_blocks_per_seq = (n + 15) / 16;
    for (int b = 0; b < in.max_blocks_per_seq; ++b) in.block_tables.push_back(b);
    in.capture_routes = true;
    if (decoder->state_buffers() > 0)
      in.state_read = {0}, in.state_write = {1};  // linear attention
    if (forced) {
      in.forced.assign(static_cast<size_t>(n), 1);
      in.forced_routes = *forced;
    }
    model::StepOutputs out;
    SY_TRY(decoder->forward(*model, in, out));
    SY_TRY(decoder->finish_step(*model, out));
    logits.resize(static_cast<size_t>(out.logits.numel()));
    backend->download(out.logits, logits.data());
    routes = out.routes;
    return Status::ok();
  }
};

// One route row, ours against transformers' top-k, by the rule every golden uses: a row whose
// k-th and (k+1)-th router logits are within near_tie_gap() is a near-tie (the choice itself
// could go either way) and is excluded; a row with a near-tie inside its top-k, or any row when
// `as_sets`, is compared as a set; every other row in order. With group-limited routing
// (DeepSeek-V3), `group_gap` is the row's margin between the last kept group's score and the
// next (p<i>_group_gap_l<L>.npy): a group score sums two choice scores, so a perturbation moves a
// difference of two group scores twice as far as one of two experts' scores, and a row whose
// group margin is below twice the gap is a near-tie too (another group swaps in whole).
struct RouteRowResult {
  bool excluded = false;
  bool flipped = false;  // excluded, and ours chose another set: the row's later layers differ
  bool as_set = false;
  bool equal = false;
  float kth_gap = 0.0f;    // k-th minus (k+1)-th router logit
  float inner_gap = 0.0f;  // smallest gap between neighbours inside the top-k
  float group_gap = INFINITY;  // the group choice's margin (group-limited routing)
};

inline RouteRowResult compare_route_row(const float* router_row, int64_t experts,
                                        const int32_t* ours, const int64_t* theirs, int64_t top_k,
                                        bool as_sets, float tie_gap = near_tie_gap(),
                                        float group_gap = INFINITY) {
  RouteRowResult result;
  result.group_gap = group_gap;
  std::vector<float> sorted(router_row, router_row + experts);
  std::sort(sorted.begin(), sorted.end(), std::greater<>());
  result.kth_gap = top_k < experts ? sorted[top_k - 1] - sorted[top_k] : INFINITY;
  result.inner_gap = INFINITY;
  for (int64_t k = 0; k + 1 < top_k; ++k)
    result.inner_gap = std::min(result.inner_gap, sorted[k] - sorted[k + 1]);
  std::vector<int32_t> a(ours, ours + top_k);
  std::vector<int32_t> b(theirs, theirs + top_k);
  if (result.kth_gap < tie_gap || group_gap < 2 * tie_gap) {
    result.excluded = true;
    std::vector<int32_t> sa = a, sb = b;
    std::sort(sa.begin(), sa.end());
    std::sort(sb.begin(), sb.end());
    result.flipped = sa != sb;
    return result;
  }
  result.as_set = as_sets || result.inner_gap < tie_gap;
  if (result.as_set) {
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
  }
  result.equal = a == b;
  return result;
}

// Per row, whether an earlier layer's near-tie went the other way (compare_route_row's `flipped`):
// its hidden state then follows another expert, so its later layers are not compared with
// transformers' (on CUDA, where bf16 rounding moves router logits by a few 1e-2, this happens; on
// the CPU the near-tie gap is 1e-5 and it practically never does). Counted and printed.
// With `recurrent` (a model with linear-attention layers), a flip also perturbs every later row
// from the next layer on: their recurrent state carries it whole (in attention it is one cached
// row among many). Callers then call next_layer() between layers.
struct FlipTracker {
  std::vector<uint8_t> perturbed;
  int64_t skipped = 0;
  bool recurrent = false;
  size_t pending = SIZE_MAX;  // the earliest flipped row of the current layer
  explicit FlipTracker(size_t rows, bool recurrent_state = false)
      : perturbed(rows, 0), recurrent(recurrent_state) {}
  bool skip(size_t row) {
    skipped += perturbed[row];
    return perturbed[row] != 0;
  }
  void note(size_t row, const RouteRowResult& result) {
    perturbed[row] |= result.flipped ? 1 : 0;
    if (result.flipped) pending = std::min(pending, row);
  }
  void next_layer() {
    if (recurrent)
      for (size_t r = pending; r < perturbed.size(); ++r) perturbed[r] = 1;
    pending = SIZE_MAX;
  }
};

// The group margins of MoE layer `layer` per row (group-limited routers' goldens), or none.
inline std::vector<float> group_gaps(const std::string& prefix, int layer) {
  const std::string path = prefix + "group_gap_l" + std::to_string(layer) + ".npy";
  return std::filesystem::exists(path) ? read_f32(path) : std::vector<float>{};
}

// transformers' own routes as a replay source [rows, layers, top_k] (its top-k of every MoE layer,
// p<i>_topk_l<L>.npy; other layers 0): a run that replays them follows transformers' experts,
// so its logits differ from transformers' by rounding alone, whatever near-tie went which way.
inline std::vector<int32_t> transformers_routes(const std::string& prefix, const std::vector<int>& moe_layers,
                                                int64_t rows, int64_t layers, int64_t top_k) {
  std::vector<int32_t> routes(static_cast<size_t>(rows * layers * top_k), 0);
  for (int layer : moe_layers) {
    const std::vector<int64_t> topk = read_ints(prefix + "topk_l" + std::to_string(layer) + ".npy");
    EXPECT_EQ(static_cast<int64_t>(topk.size()), rows * top_k) << prefix << " layer " << layer;
    for (int64_t t = 0; t < rows && (t + 1) * top_k <= static_cast<int64_t>(topk.size()); ++t)
      for (int64_t k = 0; k < top_k; ++k)
        routes[static_cast<size_t>((t * layers + layer) * top_k + k)] = static_cast<int32_t>(topk[t * top_k + k]);
  }
  return routes;
}

template <typename Int>
std::string route_row_text(const Int* ids, int64_t top_k) {
  std::string text = "[";
  for (int64_t k = 0; k < top_k; ++k) {
    if (k) text += ' ';
    text += std::to_string(ids[k]);
  }
  return text + "]";
}

}  // namespace sy::golden
