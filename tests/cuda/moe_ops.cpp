// MoE kernels: cuda-modular and cuda-fused against cpu-modular on random weights. The router
// is scaled so routing is decisive, plus rows built to tie: exact ties (router row E-1 is a copy
// of row 0, so both backends compute equal logits and must both take the lower id), a group
// whose router rows are all equal (every expert ties) and near-ties at the k-th/(k+1)-th
// boundary (either choice is right; counted, not failed).
//   capture: routes equal the CPU's exactly on every row whose adjacent top-(k+1) gaps
//     (computed here in double) exceed 1e-3 relative; the poisoned sink's layer column is fully
//     written and nothing else in it; fused and modular write bitwise the same routes.
//   replay: forced rows come back unchanged; outputs match the CPU run with the same ids.
//   outputs: within bf16 tolerance on every row whose routes match the CPU's.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>

#include "harness.h"
#include "moe/router.h"

namespace sy::harness {
namespace {

constexpr double kMoeTol = 1e-2;
constexpr double kDecisiveGap = 1e-3;
constexpr int64_t kLayers = 3, kLayer = 1;  // the sink/source hold 3 layers; the kernel is layer 1
constexpr int64_t kFusedMaxTokens = 64;

struct MoeShape {
  int64_t hidden, inter, experts, top_k;
};

// kGptOss: logit bias, top-k on the logits; kDeepSeek: sigmoid, selection bias, 4 groups of
// which 2 kept by their two best; kGlm: sigmoid, selection bias, one group.
enum class SpecKind { kQwen, kMixtral, kSigmoid, kPlainSoftmax, kGptOss, kDeepSeek, kGlm };

const char* spec_name(SpecKind k) {
  switch (k) {
    case SpecKind::kQwen: return "softmax+renorm";
    case SpecKind::kMixtral: return "softmax-after-topk";
    case SpecKind::kSigmoid: return "sigmoid+renorm*2.5";
    case SpecKind::kPlainSoftmax: return "softmax";
    case SpecKind::kGptOss: return "logit-bias+softmax-after-topk, expert biases+clamped SwiGLU";
    case SpecKind::kDeepSeek: return "sigmoid+selection-bias+groups4/2+renorm*2.5";
    case SpecKind::kGlm: return "sigmoid+selection-bias+renorm*1.8";
  }
  return "?";
}

moe::RouterSpec make_spec(SpecKind k, const MoeShape& s) {
  moe::RouterSpec spec;
  spec.num_experts = s.experts;
  spec.top_k = s.top_k;
  switch (k) {
    case SpecKind::kQwen: spec.renormalize = true; break;
    case SpecKind::kMixtral: spec.softmax_after_topk = true; break;
    case SpecKind::kSigmoid:
      spec.scoring = moe::RouterScoring::kSigmoid;
      spec.renormalize = true;
      spec.routed_scaling_factor = 2.5f;
      break;
    case SpecKind::kPlainSoftmax: break;
    case SpecKind::kGptOss:
      spec.softmax_after_topk = true;
      spec.has_logit_bias = true;
      break;
    case SpecKind::kDeepSeek:
      spec.scoring = moe::RouterScoring::kSigmoid;
      spec.has_selection_bias = true;
      spec.num_groups = 4;
      spec.topk_groups = 2;
      spec.group_scoring = moe::GroupScoring::kTopTwoSum;
      spec.renormalize = true;
      spec.routed_scaling_factor = 2.5f;
      break;
    case SpecKind::kGlm:
      spec.scoring = moe::RouterScoring::kSigmoid;
      spec.has_selection_bias = true;
      spec.renormalize = true;
      spec.routed_scaling_factor = 1.8f;
      break;
  }
  return spec;
}

struct Group {
  MoeShape shape;
  SpecKind spec;
  std::vector<int64_t> tokens;
  bool mxfp4 = false;  // experts as gpt-oss publishes them (kMxfp4Interleaved), read packed
  bool fused = true;   // cuda-fused takes the shape (not: widths that are not multiples of 8)
  bool flat_router = false;  // every router row equal: every expert ties, the lowest K ids win
};

// One group's weights, on both backends (the CPU keeps views of the host tensors).
struct Weights {
  HostTensor router, gate_up, down;
  std::vector<float> router_f32;  // [E, H], for the host's double-precision logits
  std::vector<float> logit_bias, selection_bias;  // [E] each, or empty
  HostTensor gate_up_bias, down_bias;              // gpt-oss experts (kGptOss): [E, 2I], [E, H] bf16
  HostTensor gate_up_scales, down_scales;          // MXFP4 groups: U8 [E, 2I, H/32], [E, H, I/32]
  std::unique_ptr<Pair> pair;
  moe::MoeLayerWeights cpu, dev;
};

// One step's inputs and the CPU's answers.
struct StepData {
  int64_t tokens = 0;
  std::vector<float> x;  // [T, H]
  std::vector<uint8_t> decisive;
  int64_t near_tied = 0, exact_ties = 0;
  std::vector<uint8_t> forced;  // [T]
  std::vector<int32_t> source;  // [T, L, K]
  std::vector<float> capture_out, replay_out;
  std::vector<int32_t> capture_sink, replay_sink;
  std::vector<float> capture_combine;
  std::string error;  // the CPU reference failed
};

std::vector<double> logits_of(const Weights& w, const MoeShape& s, const float* x) {
  std::vector<double> logits(static_cast<size_t>(s.experts));
  for (int64_t e = 0; e < s.experts; ++e) {
    const float* row = w.router_f32.data() + e * s.hidden;
    double sum = 0;
    for (int64_t i = 0; i < s.hidden; ++i) sum += static_cast<double>(x[i]) * row[i];
    logits[static_cast<size_t>(e)] = sum;
  }
  return logits;
}

// Experts by (logit desc, id asc): the selection order of every scoring kind (all monotonic).
std::vector<int32_t> ranking(const std::vector<double>& logits) {
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  return order;
}

// The smallest non-zero relative gap between adjacent experts among the top k+1 selection
// scores (0 gaps are exact ties, which both backends break by the lower id); counts exact ties.
double selection_gap(const std::vector<double>& logits, SpecKind kind, int64_t top_k, bool& exact_tie) {
  const std::vector<int32_t> order = ranking(logits);
  double gap = std::numeric_limits<double>::infinity();
  exact_tie = false;
  for (int64_t j = 0; j < top_k && j + 1 < static_cast<int64_t>(order.size()); ++j) {
    const double a = logits[order[j]], b = logits[order[j + 1]];
    if (a == b) {
      exact_tie = true;
      continue;
    }
    double g;
    if (kind == SpecKind::kSigmoid) {
      const double sa = 1 / (1 + std::exp(-a)), sb = 1 / (1 + std::exp(-b));
      g = (sa - sb) / sa;
    } else if (kind == SpecKind::kMixtral) {
      g = (a - b) / std::max(1.0, std::abs(a));
    } else {
      g = a - b;  // softmax: the log of the probability ratio
    }
    gap = std::min(gap, g);
  }
  return gap;
}

// The extended routers' selection gap, in double as the CPU router defines the choice: biased
// logits, scores, + selection bias, dropped groups out; the smallest gap among the top k + 1
// kept choices and between the last kept group and the first dropped one.
double extended_selection_gap(std::vector<double> logits, const Weights& w, const moe::RouterSpec& spec,
                              bool& exact_tie) {
  const size_t E = logits.size(), K = static_cast<size_t>(spec.top_k);
  if (!w.logit_bias.empty())
    for (size_t e = 0; e < E; ++e) logits[e] += w.logit_bias[e];
  std::vector<double> choice = logits;
  if (!spec.softmax_after_topk) {
    if (spec.scoring == moe::RouterScoring::kSigmoid) {
      for (double& v : choice) v = 1.0 / (1.0 + std::exp(-v));
    } else {
      const double m = *std::max_element(choice.begin(), choice.end());
      double sum = 0;
      for (double& v : choice) sum += v = std::exp(v - m);
      for (double& v : choice) v /= sum;
    }
  }
  if (!w.selection_bias.empty())
    for (size_t e = 0; e < E; ++e) choice[e] += w.selection_bias[e];
  double gap = std::numeric_limits<double>::infinity();
  exact_tie = false;
  std::vector<uint8_t> kept(E, 1);
  if (spec.num_groups > 1) {
    const size_t groups = static_cast<size_t>(spec.num_groups), size = E / groups;
    std::vector<std::pair<double, size_t>> scored;
    for (size_t gi = 0; gi < groups; ++gi) {
      std::vector<double> member(choice.begin() + gi * size, choice.begin() + (gi + 1) * size);
      std::sort(member.begin(), member.end(), std::greater<>());
      scored.push_back({spec.group_scoring == moe::GroupScoring::kTopTwoSum ? member[0] + member[1] : member[0], gi});
    }
    std::stable_sort(scored.begin(), scored.end(), [](auto& a, auto& b) { return a.first > b.first; });
    const size_t keep = static_cast<size_t>(spec.topk_groups);
    gap = std::min(gap, scored[keep - 1].first - scored[keep].first);
    for (size_t j = keep; j < groups; ++j)
      for (size_t i = 0; i < size; ++i) kept[scored[j].second * size + i] = 0;
  }
  std::vector<int32_t> order;
  for (size_t e = 0; e < E; ++e)
    if (kept[e]) order.push_back(static_cast<int32_t>(e));
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return choice[a] > choice[b]; });
  for (size_t j = 0; j < K && j + 1 < order.size(); ++j) {
    const double a = choice[order[j]], b = choice[order[j + 1]];
    if (a == b) exact_tie = true;
    else gap = std::min(gap, a - b);
  }
  return gap;
}

void build_step(Harness& h, const Group& g, Weights& w, int64_t tokens, const std::string& group_desc, StepData& d) {
  const MoeShape& s = g.shape;
  Rng rng(h.seed_for(fmt::format("moe data {} T={}", group_desc, tokens)));
  d.tokens = tokens;
  d.x = random_floats(rng, tokens * s.hidden, std::sqrt(3.0f));
  const float* w0 = w.router_f32.data();
  for (int64_t t = 0; t < tokens; ++t) {
    float* x = d.x.data() + t * s.hidden;
    // (One-token steps of the small groups tie too: cuda-fused ranks a lone token's experts
    // its own way, whose tie rule needs a case; the 128-expert group's one token stays decisive.)
    if ((tokens >= 2 && t % 8 == 5) || (tokens == 1 && s.experts < 64)) {
      // Experts 0 and E-1 (equal rows) clearly on top: an exact tie for first place.
      double norm2 = 0;
      for (int64_t i = 0; i < s.hidden; ++i) norm2 += static_cast<double>(w0[i]) * w0[i];
      for (int iteration = 0; iteration < 3; ++iteration) {
        const std::vector<double> l = logits_of(w, s, x);
        double others = -INFINITY;
        for (int64_t e = 1; e + 1 < s.experts; ++e) others = std::max(others, l[static_cast<size_t>(e)]);
        const double beta = (others + 3.0 - l[0]) / norm2;
        for (int64_t i = 0; i < s.hidden; ++i) x[i] = static_cast<float>(x[i] + beta * w0[i]);
      }
    } else if (t % 8 == 1) {
      // Near-tie at the selection boundary: move x along (w_a - w_b) until l_a - l_b ~ 1e-6.
      for (int iteration = 0; iteration < 3; ++iteration) {
        const std::vector<double> l = logits_of(w, s, x);
        const std::vector<int32_t> order = ranking(l);
        const int32_t a = order[static_cast<size_t>(s.top_k - 1)], b = order[static_cast<size_t>(s.top_k)];
        const float* wa = w.router_f32.data() + a * s.hidden;
        const float* wb = w.router_f32.data() + b * s.hidden;
        double norm2 = 0;
        for (int64_t i = 0; i < s.hidden; ++i) norm2 += (static_cast<double>(wa[i]) - wb[i]) * (static_cast<double>(wa[i]) - wb[i]);
        if (norm2 == 0) break;
        const double coef = (l[b] - l[a] + 1e-6) / norm2;
        for (int64_t i = 0; i < s.hidden; ++i) x[i] = static_cast<float>(x[i] + coef * (static_cast<double>(wa[i]) - wb[i]));
      }
    }
  }
  d.decisive.assign(static_cast<size_t>(tokens), 0);
  for (int64_t t = 0; t < tokens; ++t) {
    bool tie = false;
    const moe::RouterSpec spec = make_spec(g.spec, s);
    const double gap = spec.uses_extended_options()
                           ? extended_selection_gap(logits_of(w, s, d.x.data() + t * s.hidden), w, spec, tie)
                           : selection_gap(logits_of(w, s, d.x.data() + t * s.hidden), g.spec, s.top_k, tie);
    d.decisive[static_cast<size_t>(t)] = gap > kDecisiveGap;
    if (!(gap > kDecisiveGap)) ++d.near_tied;
    if (tie) ++d.exact_ties;
  }
  // Replay inputs: about half the rows forced (the first always, the last never), every layer's
  // column filled with valid distinct ids so a kernel reading the wrong column is caught.
  d.forced.assign(static_cast<size_t>(tokens), 0);
  for (int64_t t = 0; t < tokens; ++t) d.forced[static_cast<size_t>(t)] = static_cast<uint8_t>(rng.below(2));
  d.forced.front() = 1;
  if (tokens >= 2) d.forced.back() = 0;
  d.source.clear();
  for (int64_t t = 0; t < tokens * kLayers; ++t) {
    const std::vector<int32_t> ids = distinct_ids(rng, s.top_k, s.experts);
    d.source.insert(d.source.end(), ids.begin(), ids.end());
  }
}

struct Run {
  std::vector<float> out;
  std::vector<int32_t> sink;
  std::vector<float> combine;  // the gating-weight sink [T, kLayers, K] (capture, kernels that write it)
  Status status;
};

// The experts' spec of a group: gpt-oss's (biases, the clamped SwiGLU with a limit low enough
// that these activations reach it) where the weights carry biases, else Qwen3's.
moe::ExpertSpec expert_spec_of(const moe::MoeLayerWeights& weights) {
  moe::ExpertSpec spec;
  if (weights.gate_up.dtype == DType::kU8)
    spec.format = spec.stored = moe::ExpertFormat::kMxfp4Interleaved;
  if (weights.gate_up_bias.data) {
    spec.has_biases = true;
    spec.activation = moe::ExpertActivation::kClampedSwiGlu;
    spec.limit = 0.75f;
  }
  return spec;
}

// One forward of `kernel` on `backend` (the CPU reference or the device) over a fresh poisoned
// out (and sink).
Run forward(Backend& backend, Buffers& buffers, moe::ExpertsKernel& kernel, const moe::MoeLayerWeights& weights,
            const moe::RouterSpec& spec, const StepData& d, bool capture, bool replay) {
  const int64_t T = d.tokens, H = weights.router.dim(1), K = spec.top_k;
  Tensor x = buffers.f32(d.x, {T, H});
  Tensor out = buffers.alloc(DType::kF32, {T, H});
  buffers.poison(out);
  moe::MoeForwardArgs args;
  args.layer = static_cast<int>(kLayer);
  args.hidden = x;
  args.out = out;
  args.weights = &weights;
  args.spec = spec;
  args.experts = expert_spec_of(weights);
  Tensor sink;
  if (capture) {
    sink = buffers.alloc(DType::kI32, {T, kLayers, K});
    backend.fill_i32(sink, moe::kRoutePoison);  // as the decoder does before every step
    args.routes.sink = sink;
  }
  Tensor combine;
  if (capture && kernel.captures_weights()) {
    combine = buffers.alloc(DType::kI32, {T, kLayers, K});
    backend.fill_i32(combine, moe::kRouteWeightPoisonBits);
    combine.dtype = DType::kF32;
    args.routes.weights = combine;
  }
  if (replay) {
    args.routes.source = buffers.i32(d.source, {T, kLayers, K});
    args.routes.forced = buffers.u8(d.forced, {T});
  }
  Run run;
  run.status = kernel.forward(args);
  if (!run.status) return run;
  run.out = to_host(backend, out);
  if (capture) run.sink = to_host_i32(backend, sink);
  if (combine.data) run.combine = to_host(backend, combine);
  return run;
}

// The weight sink: layer kLayer's column equals `ref` (within tol) on the rows in `rows`, and
// every other column still holds the poison.
void check_combine(Case& c, const char* who, const std::vector<float>& got, const std::vector<float>& ref,
                   const std::vector<uint8_t>& rows, int64_t T, int64_t K, double tol) {
  if (got.empty()) return c.fail(std::string(who) + ": no weights came back");
  int64_t untouched = 0, compared = 0;
  double worst = 0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t l = 0; l < kLayers; ++l)
      for (int64_t k = 0; k < K; ++k) {
        const size_t i = static_cast<size_t>((t * kLayers + l) * K + k);
        uint32_t bits;
        std::memcpy(&bits, &got[i], 4);
        if (l != kLayer) {
          untouched += bits == static_cast<uint32_t>(moe::kRouteWeightPoisonBits);
          continue;
        }
        if (!std::isfinite(got[i])) return c.fail(fmt::format("{}: weight [{}, {}] not written", who, t, k));
        if (!rows[static_cast<size_t>(t)]) continue;
        ++compared;
        worst = std::max(worst, std::abs(static_cast<double>(got[i]) - ref[i]) / std::max(1e-6, std::abs(static_cast<double>(ref[i]))));
      }
  c.expect(untouched == T * (kLayers - 1) * K, fmt::format("{}: the weight sink's other layers were written", who));
  c.expect(worst <= tol, fmt::format("{}: gating weights differ from the CPU's by {:.2e} relative (tol {:.0e})", who, worst, tol));
  c.info(fmt::format("{} weights compared on {} entries, worst relative {:.1e}", who, compared, worst));
}

const int32_t* route_row(const std::vector<int32_t>& sink, int64_t t, int64_t K) {
  return sink.data() + (t * kLayers + kLayer) * K;
}

// The sink after a capturing step: the layer's column fully written with valid distinct ids,
// the other columns untouched (still poison).
void check_sink(Case& c, const char* who, const std::vector<int32_t>& sink, int64_t T, int64_t K, int64_t E) {
  int64_t unwritten = 0, invalid = 0, repeated = 0, stray = 0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t layer = 0; layer < kLayers; ++layer) {
      const int32_t* row = sink.data() + (t * kLayers + layer) * K;
      for (int64_t k = 0; k < K; ++k) {
        if (layer != kLayer) {
          stray += row[k] != moe::kRoutePoison;
          continue;
        }
        if (row[k] == moe::kRoutePoison) ++unwritten;
        else if (row[k] < 0 || row[k] >= E) ++invalid;
        else
          for (int64_t j = 0; j < k; ++j) repeated += row[j] == row[k];
      }
    }
  if (unwritten) c.fail(fmt::format("{}: {} route entries of layer {} left as poison (kRoutePoison)", who, unwritten, kLayer));
  if (invalid) c.fail(fmt::format("{}: {} route entries outside [0, {})", who, invalid, E));
  if (repeated) c.fail(fmt::format("{}: {} repeated expert ids within a row", who, repeated));
  if (stray) c.fail(fmt::format("{}: {} entries written outside layer {}'s column", who, stray, kLayer));
}

// Routes of `dev` against the CPU's: exact on decisive rows, forced rows as given. Returns the
// rows whose routes equal the CPU's (the rows whose outputs are compared).
std::vector<uint8_t> check_routes(Case& c, const std::vector<int32_t>& dev, const std::vector<int32_t>& cpu,
                                  const StepData& d, int64_t K, bool replay) {
  const int64_t T = d.tokens;
  std::vector<uint8_t> equal(static_cast<size_t>(T), 0);
  int64_t decisive = 0, decisive_differ = 0, near_differ = 0, forced_rows = 0, forced_wrong = 0;
  for (int64_t t = 0; t < T; ++t) {
    const int32_t* a = route_row(dev, t, K);
    const int32_t* b = route_row(cpu, t, K);
    const bool same = std::equal(a, a + K, b);
    equal[static_cast<size_t>(t)] = same;
    if (replay && d.forced[static_cast<size_t>(t)]) {
      ++forced_rows;
      const int32_t* given = d.source.data() + (t * kLayers + kLayer) * K;
      if (!std::equal(a, a + K, given) && forced_wrong++ < 2)
        c.fail(fmt::format("forced row {}: routes {} not the given {}", t, fmt::join(a, a + K, ","),
                           fmt::join(given, given + K, ",")));
      continue;
    }
    if (d.decisive[static_cast<size_t>(t)]) {
      ++decisive;
      if (!same && decisive_differ++ < 2)
        c.fail(fmt::format("row {}: routes {}, the CPU has {} (a decisive row)", t, fmt::join(a, a + K, ","),
                           fmt::join(b, b + K, ",")));
    } else if (!same) {
      ++near_differ;
    }
  }
  if (decisive_differ > 2) c.fail(fmt::format("{} of {} decisive rows route differently", decisive_differ, decisive));
  if (forced_wrong > 2) c.fail(fmt::format("{} of {} forced rows changed", forced_wrong, forced_rows));
  std::string note = fmt::format("routes: {}/{} decisive equal", decisive - decisive_differ, decisive);
  if (replay) note += fmt::format(", {}/{} forced kept", forced_rows - forced_wrong, forced_rows);
  const int64_t near_rows = T - decisive - forced_rows;
  if (near_rows > 0) note += fmt::format(", {} near-tied ({} differ)", near_rows, near_differ);
  if (d.exact_ties) note += fmt::format(", exact ties in {} rows", d.exact_ties);
  c.info(note);
  return equal;
}

void device_case(Harness& h, Case& c, const Group& g, Weights& w, StepData& d, moe::ExpertsKernel& kernel,
                 moe::ExpertsKernel* modular, bool replay) {
  if (!d.error.empty()) {
    c.fail("cpu reference: " + d.error);
    return;
  }
  const MoeShape& s = g.shape;
  const moe::RouterSpec spec = make_spec(g.spec, s);
  if (replay && !kernel.replays_routes()) {
    c.fail(std::string(kernel.name()) + " says it cannot replay routes (replays_routes() is false)");
    return;
  }
  Buffers buffers(h.device);
  Run run = forward(h.device, buffers, kernel, w.dev, spec, d, true, replay);
  if (!run.status) {
    if (run.status.code() == ErrorCode::kUnsupported) c.skip(run.status.message());
    else c.fail(std::string(kernel.name()) + ": " + run.status.message());
    return;
  }
  check_sink(c, "sink", run.sink, d.tokens, s.top_k, s.experts);
  const std::vector<int32_t>& cpu_sink = replay ? d.replay_sink : d.capture_sink;
  const std::vector<uint8_t> rows = check_routes(c, run.sink, cpu_sink, d, s.top_k, replay);
  c.check("out", compare(run.out, replay ? d.replay_out : d.capture_out, s.hidden, &rows), kMoeTol);
  if (!replay) {
    if (!kernel.captures_weights()) c.fail(std::string(kernel.name()) + " does not write gating weights");
    else if (d.capture_combine.empty()) c.fail("cpu reference wrote no gating weights");
    else check_combine(c, "weights", run.combine, d.capture_combine, rows, d.tokens, s.top_k, 1e-4);
  }
  if (std::count(rows.begin(), rows.end(), 1) == 0) c.info("outputs not compared: no row routes as the CPU does");
  if (!replay) {
    // Capture off: same outputs, and the kernel must not need a sink.
    Run plain = forward(h.device, buffers, kernel, w.dev, spec, d, false, false);
    if (!plain.status) c.fail("without capture: " + plain.status.message());
    else c.check("out (capture off)", compare(plain.out, d.capture_out, s.hidden, &rows), kMoeTol);
  }
  if (!replay && !modular && d.tokens >= 256) {
    // A row's result does not depend on the rest of the step (what batch_invariant() promises):
    // the first 40 tokens as a step of their own (a smaller grouped GEMM tile) give the same
    // bits, routes and outputs, as in this step (on Hopper: the small mma.sync tile against the
    // wgmma kernel's). A kernel that does not promise it gets the comparison as information, and
    // so do MXFP4 experts on a backend that is not batch-invariant (cuda-modular's few-token and
    // small steps then take the GEMVs and the register GEMM).
    constexpr int64_t kHead = 40;
    StepData head;
    head.tokens = kHead;
    head.x.assign(d.x.begin(), d.x.begin() + kHead * s.hidden);
    Run alone = forward(h.device, buffers, kernel, w.dev, spec, head, true, false);
    if (!alone.status) {
      c.fail(fmt::format("the first {} tokens alone: {}", kHead, alone.status.message()));
    } else {
      const size_t values = static_cast<size_t>(kHead * s.hidden);
      int64_t differ = 0;
      double worst = 0;
      for (size_t i = 0; i < values; ++i)
        if (std::memcmp(&alone.out[i], &run.out[i], 4) != 0) {
          ++differ;
          worst = std::max(worst, std::abs(static_cast<double>(alone.out[i]) - run.out[i]));
        }
      const bool same_routes = std::equal(alone.sink.begin(), alone.sink.end(), run.sink.begin());
      const std::string what = fmt::format(
          "batch invariance: the first {} tokens alone against the same tokens in the "
          "{}-token step: {} of {} outputs differ (worst {:.2e}), routes {}",
          kHead, d.tokens, differ, values, worst, same_routes ? "equal" : "differ");
      // (Printed either way: a passing run's log shows what was compared.)
      if (!kernel.batch_invariant() || (g.mxfp4 && !h.device.batch_invariant()))
        c.info(what + " (not promised)");
      else if (c.expect(differ == 0 && same_routes, what))
        c.info(what);
    }
  }
  if (modular && modular != &kernel) {
    // Both device kernels route with the same device functions: bitwise the same routes.
    Run other = forward(h.device, buffers, *modular, w.dev, spec, d, true, replay);
    if (!other.status) {
      c.fail(std::string(modular->name()) + ": " + other.status.message());
    } else {
      int64_t differ = 0;
      for (int64_t t = 0; t < d.tokens; ++t)
        differ += !std::equal(route_row(run.sink, t, s.top_k), route_row(run.sink, t, s.top_k) + s.top_k,
                              route_row(other.sink, t, s.top_k));
      if (differ) c.fail(fmt::format("routes differ from {} on {} of {} rows", modular->name(), differ, d.tokens));
      if (!replay && run.combine != other.combine) {
        // Same device functions for the weights too: bitwise (NaN poison compares by value: use bits).
        bool same = run.combine.size() == other.combine.size() &&
                    std::memcmp(run.combine.data(), other.combine.data(), run.combine.size() * 4) == 0;
        if (!same) c.fail(fmt::format("gating weights differ from {}", modular->name()));
      }
    }
  }
}

// A one-token kernel with the residual adds and input norm fused (what the decoder asks for at
// batch 1: cuda-fused's, cuda-modular's): bitwise the same out, routes and new residual as the
// device's unfused sequence (add, add_rms_norm, forward on the normed row, add of the output); the
// unused `hidden` is poisoned to prove it unread. earlier_in_out: the earlier delta lives in the
// output buffer itself, as the decoder passes it after a dense layer (the previous feed-forward
// output, which this call overwrites).
void fused_input_norm_case(Harness& h, Case& c, const Group& g, Weights& w, const StepData& d,
                           moe::ExpertsKernel& kernel, bool earlier, bool earlier_in_out) {
  const MoeShape& s = g.shape;
  if (!kernel.fuses_input_norm(1)) return c.skip(std::string(kernel.name()) + " does not fuse the input norm");
  const moe::RouterSpec spec = make_spec(g.spec, s);
  Backend& dev = h.device;
  const std::vector<float> residual = random_floats(c.rng, s.hidden, 1.0f), d1 = random_floats(c.rng, s.hidden, 1.0f);
  const std::vector<float> d2 = random_floats(c.rng, s.hidden, 1.0f);
  (void)d;
  HostTensor norm_host = host_random(h.cpu, DType::kF32, {s.hidden}, c.rng.next(), 0.5f, 1.0f);
  Buffers buffers(dev);
  Tensor norm = buffers.weight(norm_host.view);
  auto run_one = [&](bool fused, std::vector<float>& out, std::vector<int32_t>& sink, std::vector<float>& res) {
    Tensor r = buffers.f32(residual, {1, s.hidden}), e = buffers.f32(d1, {1, s.hidden}), dl = buffers.f32(d2, {1, s.hidden});
    Tensor hidden = buffers.alloc(DType::kF32, {1, s.hidden}), o = buffers.alloc(DType::kF32, {1, s.hidden});
    buffers.poison(hidden);
    if (fused && earlier_in_out) o = buffers.f32(d1, {1, s.hidden});
    else buffers.poison(o);
    Tensor sk = buffers.alloc(DType::kI32, {1, kLayers, s.top_k});
    dev.fill_i32(sk, moe::kRoutePoison);
    moe::MoeForwardArgs args;
    args.layer = static_cast<int>(kLayer);
    args.hidden = hidden;
    args.out = o;
    args.weights = &w.dev;
    args.spec = spec;
    args.experts = expert_spec_of(w.dev);  // (MXFP4 experts: the kernel reads them packed)
    args.routes.sink = sk;
    if (fused) {
      args.input_norm = {&r, earlier ? (earlier_in_out ? &o : &e) : nullptr, &dl, &norm, 1e-6f};
    } else {
      if (earlier) dev.add_inplace(r, e);
      dev.add_rms_norm(r, dl, norm, 1e-6f, hidden);
    }
    const Status status = kernel.forward(args);
    if (!status) return status;
    if (!fused) dev.add_inplace(r, o);
    out = to_host(dev, o);
    sink = to_host_i32(dev, sk);
    res = to_host(dev, r);
    return Status::ok();
  };
  std::vector<float> out_f, out_u, res_f, res_u;
  std::vector<int32_t> sink_f, sink_u;
  if (Status st = run_one(true, out_f, sink_f, res_f); !st) return c.fail("fused: " + st.message());
  if (Status st = run_one(false, out_u, sink_u, res_u); !st) return c.fail("unfused: " + st.message());
  check_sink(c, "sink", sink_f, 1, s.top_k, s.experts);
  c.expect(sink_f == sink_u, "routes differ from the unfused sequence");
  c.check("out = unfused", compare(out_f, out_u, s.hidden), 0.0);
  c.check("residual = unfused", compare(res_f, res_u, s.hidden), 0.0);
}

}  // namespace

void run_moe_ops(Harness& h) {
  std::vector<Group> groups;
  if (h.options.quick) {
    groups = {{{2048, 768, 128, 8}, SpecKind::kQwen, {1, 33}},
              {{200, 72, 12, 3}, SpecKind::kQwen, {1, 7, 300}},
              {{200, 72, 12, 3}, SpecKind::kMixtral, {33}}};
  } else {
    // The largest shape first: a kernel whose reserve() only grows (or only counts the first
    // call) still has room for every later group.
    groups = {{{2048, 768, 128, 8}, SpecKind::kQwen, {1, 2, 7, 33, 300}},
              {{328, 200, 64, 6}, SpecKind::kQwen, {17, 64, 100}},
              // (600 tokens: 1,800 pairs, over 96 a expert: the large tile of bf16 experts.)
              {{200, 72, 12, 3}, SpecKind::kQwen, {1, 2, 7, 33, 300, 600}},
              // The large tile at widths of whole k tiles and several M tiles an expert (4,000
              // pairs over 32 experts; on Hopper the wgmma kernel).
              {{1024, 384, 32, 4}, SpecKind::kQwen, {1000}},
              // The same for MXFP4 experts (3,200 pairs over 16 experts; k 640 and 320); 40 tokens:
              // the register GEMM (SY_MXFP4_GEMM=tile: the grouped GEMM's small tile).
              {{640, 320, 16, 4}, SpecKind::kGptOss, {40, 800}, true},
              {{200, 72, 12, 3}, SpecKind::kMixtral, {2, 33, 300}},
              {{200, 72, 12, 3}, SpecKind::kSigmoid, {2, 33, 300}},
              {{200, 72, 12, 3}, SpecKind::kPlainSoftmax, {7, 64}},
              {{200, 72, 12, 3}, SpecKind::kGptOss, {1, 2, 33, 300}},
              {{256, 96, 12, 3},
               SpecKind::kGptOss,
               {1, 2, 8, 9, 33, 64, 300, 600},
               true},  // the GEMV (T <= 8), the register GEMM (9..96 on 16-pair tiles, 97..384
                       // on 32), the medium and large tiles
              // The streamed MXFP4 GEMV over several k stages (19 and 5 blocks of 32: the last
              // stage partial) and a block whose second warp is past the rows (608 = 19 x 32);
              // 12 and 40 tokens: the register GEMM on those k, down's 608 rows leaving two of the
              // last block's four warps idle; 60 tokens (30 pairs an expert): its 32-pair tiles.
              {{608, 160, 8, 4}, SpecKind::kGptOss, {1, 3, 8, 12, 40, 60}, true},
              {{256, 64, 64, 6}, SpecKind::kDeepSeek, {1, 2, 33, 300}},
              {{200, 72, 16, 4}, SpecKind::kGlm, {1, 7, 64}},
              // Every expert tied (all router rows equal): a one-token step's ranking over all 128
              // (cuda-fused's candidates are then all of them, four to a lane).
              {{200, 72, 128, 8}, SpecKind::kQwen, {1, 2, 33}, false, true, true},
              // Expert widths that are not multiples of 8 (the golden models' 20): cuda-modular's
              // plain kernels; cuda-fused refuses them (the decoder then leaves it out).
              {{72, 20, 10, 3}, SpecKind::kQwen, {1, 7, 300}, false, false},
              {{72, 20, 12, 3}, SpecKind::kGlm, {2, 33}, false, false}};
  }
  const moe::KernelNeeds cpu_needs{Device::kCpu, true, true};
  const moe::KernelNeeds dev_needs{h.device.device(), true, false};  // replay: checked per case
  auto cpu_kernel = h.cpu_kernels.select("cpu-modular", cpu_needs);
  const std::string modular_name = h.device_kernel("cuda-modular"), fused_name = h.device_kernel("cuda-fused");
  auto dev_modular = h.device_kernels.select(modular_name, dev_needs);
  auto dev_fused = h.device_kernels.select(fused_name, dev_needs);

  for (const Group& g : groups) {
    const MoeShape& s = g.shape;
    const std::string group_desc = fmt::format(
        "H={} I={} E={} K={} {}{}{}", s.hidden, s.inter, s.experts, s.top_k, spec_name(g.spec),
        g.mxfp4 ? ", MXFP4 experts" : "", g.flat_router ? ", flat router" : "");
    const int64_t max_tokens = *std::max_element(g.tokens.begin(), g.tokens.end());
    const moe::RouterSpec spec = make_spec(g.spec, s);
    auto desc_of = [&](int64_t T) { return fmt::format("{} T={}", group_desc, T); };
    // Which cases of this group run (nothing is built for a group the filter leaves out).
    bool any = false;
    for (int64_t T : g.tokens)
      for (const char* mode : {"capture", "replay", "input-norm"}) {
        any |= h.selected(fmt::format("moe.cuda-modular.{}", mode), desc_of(T));
        if (T <= kFusedMaxTokens && g.fused)
          any |= h.selected(fmt::format("moe.cuda-fused.{}", mode), desc_of(T));
      }
    if (!any) continue;

    Weights w;
    std::string setup_error;
    auto ensure_weights = [&]() {
      if (w.pair || !setup_error.empty()) return;
      try {
        Rng rng(h.seed_for("moe weights " + group_desc));
        const float router_scale = 2.0f * std::sqrt(3.0f / static_cast<float>(s.hidden));  // logit std ~2
        w.router = host_random(h.cpu, DType::kBF16, {s.experts, s.hidden}, rng.next(), router_scale);
        uint16_t* router_bits = w.router.view.ptr<uint16_t>();
        std::copy(router_bits, router_bits + s.hidden, router_bits + (s.experts - 1) * s.hidden);  // exact ties
        if (g.flat_router)
          for (int64_t e = 1; e < s.experts; ++e)
            std::copy(router_bits, router_bits + s.hidden, router_bits + e * s.hidden);
        if (g.mxfp4) {
          // Every byte a valid pair of e2m1 codes; block scales 2^-6..2^-4 (weights ~0.01-0.4,
          // as bf16 ones of sqrt(3/H)), one block at 2^-127 (the e8m0 minimum: subnormal values)
          // and one at 2^-126.
          auto bytes = [&](const std::vector<int64_t>& shape, int lo, int span) {
            HostTensor t(DType::kU8, shape);
            for (uint8_t& b : t.bytes) b = static_cast<uint8_t>(lo + static_cast<int>(rng.below(span)));
            return t;
          };
          w.gate_up = bytes({s.experts, 2 * s.inter, s.hidden / 32, 16}, 0, 256);
          w.down = bytes({s.experts, s.hidden, s.inter / 32, 16}, 0, 256);
          w.gate_up_scales = bytes({s.experts, 2 * s.inter, s.hidden / 32}, 121, 3);
          w.down_scales = bytes({s.experts, s.hidden, s.inter / 32}, 122, 3);
          w.down_scales.bytes[5] = 0;
          w.gate_up_scales.bytes[7] =
              1;  // the other scale the fast decode leaves to the exact path
        } else {
          w.gate_up = host_random(h.cpu, DType::kBF16, {s.experts, 2 * s.inter, s.hidden}, rng.next(),
                                  std::sqrt(3.0f / static_cast<float>(s.hidden)));
          w.down = host_random(h.cpu, DType::kBF16, {s.experts, s.hidden, s.inter}, rng.next(),
                               std::sqrt(3.0f / static_cast<float>(s.inter)));
        }
        w.router_f32.resize(static_cast<size_t>(s.experts * s.hidden));
        for (size_t i = 0; i < w.router_f32.size(); ++i) w.router_f32[i] = bf16_to_f32(router_bits[i]);
        auto pair = std::make_unique<Pair>(h);
        Both router = pair->weight(w.router.view), gate_up = pair->weight(w.gate_up.view), down = pair->weight(w.down.view);
        w.cpu.router = router.cpu, w.cpu.gate_up = gate_up.cpu, w.cpu.down = down.cpu;
        w.dev.router = router.dev, w.dev.gate_up = gate_up.dev, w.dev.down = down.dev;
        if (g.mxfp4) {
          Both gus = pair->weight(w.gate_up_scales.view), ds = pair->weight(w.down_scales.view);
          w.cpu.gate_up_scales = gus.cpu, w.dev.gate_up_scales = gus.dev;
          w.cpu.down_scales = ds.cpu, w.dev.down_scales = ds.dev;
        }
        // Biases large enough to change choices: logit bias ~ the logits' spread, selection bias
        // ~ the spread of sigmoid scores near their top.
        if (spec.has_logit_bias) w.logit_bias = random_floats(rng, s.experts, 1.5f);
        if (spec.has_selection_bias) w.selection_bias = random_floats(rng, s.experts, 0.08f);
        if (g.spec == SpecKind::kGptOss) {
          w.gate_up_bias = host_random(h.cpu, DType::kBF16, {s.experts, 2 * s.inter}, rng.next(), 0.5f);
          w.down_bias = host_random(h.cpu, DType::kBF16, {s.experts, s.hidden}, rng.next(), 0.5f);
          Both gub = pair->weight(w.gate_up_bias.view), db = pair->weight(w.down_bias.view);
          w.cpu.gate_up_bias = gub.cpu, w.dev.gate_up_bias = gub.dev;
          w.cpu.down_bias = db.cpu, w.dev.down_bias = db.dev;
        }
        for (auto [values, field] : {std::pair{&w.logit_bias, &moe::MoeLayerWeights::router_bias},
                                     std::pair{&w.selection_bias, &moe::MoeLayerWeights::selection_bias}}) {
          if (values->empty()) continue;
          Both bias = pair->f32(*values, {s.experts});
          w.cpu.*field = bias.cpu;
          w.dev.*field = bias.dev;
        }
        w.pair = std::move(pair);
        for (moe::ExpertsKernel* k :
             {cpu_kernel ? *cpu_kernel : nullptr, dev_modular ? *dev_modular : nullptr,
              dev_fused && g.fused ? *dev_fused : nullptr}) {
          if (!k) continue;
          Status reserved = k->reserve(max_tokens, spec, s.hidden, s.inter);
          if (!reserved) setup_error += fmt::format("{}.reserve: {}; ", k->name(), reserved.message());
        }
      } catch (const std::exception& error) {
        setup_error = error.what();
      }
    };

    for (int64_t T : g.tokens) {
      StepData d;
      bool built = false;
      auto ensure_step = [&]() {
        ensure_weights();
        if (!setup_error.empty()) throw std::runtime_error("setup: " + setup_error);
        if (built) return;
        built = true;
        build_step(h, g, w, T, group_desc, d);
        if (!cpu_kernel) {
          d.error = cpu_kernel.message();
          return;
        }
        Buffers buffers(h.cpu);
        Run cap = forward(h.cpu, buffers, **cpu_kernel, w.cpu, spec, d, true, false);
        Run rep = forward(h.cpu, buffers, **cpu_kernel, w.cpu, spec, d, true, true);
        if (!cap.status || !rep.status) {
          d.error = (!cap.status ? cap.status : rep.status).message();
          return;
        }
        d.capture_out = std::move(cap.out);
        d.capture_sink = std::move(cap.sink);
        d.capture_combine = std::move(cap.combine);
        d.replay_out = std::move(rep.out);
        d.replay_sink = std::move(rep.sink);
      };
      for (bool replay : {false, true}) {
        const char* mode = replay ? "replay" : "capture";
        h.run(fmt::format("moe.cuda-modular.{}", mode), desc_of(T), [&](Case& c) {
          if (!dev_modular) return c.fail(dev_modular.message());
          ensure_step();
          device_case(h, c, g, w, d, **dev_modular, nullptr, replay);
        });
        if (T > kFusedMaxTokens || !g.fused) continue;
        h.run(fmt::format("moe.cuda-fused.{}", mode), desc_of(T), [&](Case& c) {
          if (!dev_fused) return c.fail(dev_fused.message());
          ensure_step();
          device_case(h, c, g, w, d, **dev_fused, dev_modular ? *dev_modular : nullptr, replay);
        });
      }
      // One-token steps with the input norm fused, each kernel that fuses it: cuda-modular on
      // every group (its route kernel norms the row, its combine adds the residual), cuda-fused
      // on the groups it takes (MXFP4 only with SY_FUSED_MXFP4=1).
      const char* fused_mxfp4 = std::getenv("SY_FUSED_MXFP4");
      const bool fused_takes = g.fused && (!g.mxfp4 || (fused_mxfp4 && fused_mxfp4[0] == '1'));
      if (T == 1 && !h.options.reference_as_device)
        for (auto* kernel : {&dev_modular, &dev_fused}) {
          if (kernel == &dev_fused && !fused_takes) continue;
          const std::string op =
              kernel == &dev_fused ? "moe.cuda-fused.input-norm" : "moe.cuda-modular.input-norm";
          for (int variant = 0; variant < 3; ++variant)
            h.run(op,
                  fmt::format("{}{}", desc_of(T),
                              variant == 0   ? ""
                              : variant == 1 ? " +earlier delta"
                                             : " +earlier delta in out"),
                  [&](Case& c) {
                    if (!*kernel) return c.fail(kernel->message());
                    ensure_step();
                    fused_input_norm_case(h, c, g, w, d, ***kernel, variant > 0, variant == 2);
                  });
        }
    }
  }
}

}  // namespace sy::harness
