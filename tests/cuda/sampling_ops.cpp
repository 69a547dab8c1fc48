// sample and score_tokens. Greedy equals the CPU's argmax; logprobs and top-n lists match (ids
// equal except exact ties); sampled frequencies (one row drawn ~20k times through distinct draw
// indices) match the exact filtered distribution computed here in double, in the CPU's (vLLM's)
// order: penalties, bias, bans, temperature, min_p, top_k, top_p.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "harness.h"

namespace sy::harness {
namespace {

using backend::SampledToken;
using backend::SamplingRow;

constexpr double kLogprobAtol = 1e-4, kLogprobRtol = 1e-5;
constexpr int64_t kRowsPerCall = 4096;  // StepLimits::max_logits_rows in main

// The CPU sampler's logit adjustments (backend/cpu/cpu_sampler.cpp), replicated.
std::vector<float> adjusted_logits(const std::vector<float>& row, const SamplingRow& params) {
  std::vector<float> adjusted = row;
  const int64_t vocab = static_cast<int64_t>(row.size());
  if (params.repetition_penalty != 1.0f) {
    for (const std::vector<int32_t>* tokens : {params.prompt_tokens, params.output_tokens}) {
      if (!tokens) continue;
      for (int32_t id : *tokens) {
        float& value = adjusted[static_cast<size_t>(id)];
        if (value == row[static_cast<size_t>(id)])
          value = value > 0 ? value / params.repetition_penalty : value * params.repetition_penalty;
      }
    }
  }
  if ((params.frequency_penalty != 0.0f || params.presence_penalty != 0.0f) && params.output_tokens) {
    std::vector<int32_t> counts(static_cast<size_t>(vocab), 0);
    for (int32_t id : *params.output_tokens) ++counts[static_cast<size_t>(id)];
    for (int64_t id = 0; id < vocab; ++id)
      if (counts[static_cast<size_t>(id)])
        adjusted[static_cast<size_t>(id)] -=
            params.frequency_penalty * counts[static_cast<size_t>(id)] + params.presence_penalty;
  }
  if (params.logit_bias)
    for (auto [id, bias] : *params.logit_bias) adjusted[static_cast<size_t>(id)] += bias;
  for (int32_t id : params.banned_tokens) adjusted[static_cast<size_t>(id)] = -INFINITY;
  return adjusted;
}

int32_t argmax(const std::vector<float>& values) {
  int32_t best = 0;
  for (int32_t i = 1; i < static_cast<int32_t>(values.size()); ++i)
    if (values[static_cast<size_t>(i)] > values[static_cast<size_t>(best)]) best = i;
  return best;
}

// log-softmax of the raw row, in double.
std::vector<double> raw_logprobs(const std::vector<float>& row) {
  const double max_value = *std::max_element(row.begin(), row.end());
  double sum = 0;
  for (float x : row) sum += std::exp(static_cast<double>(x) - max_value);
  const double normaliser = max_value + std::log(sum);
  std::vector<double> out(row.size());
  for (size_t i = 0; i < row.size(); ++i) out[i] = static_cast<double>(row[i]) - normaliser;
  return out;
}

struct Expected {
  std::vector<double> probs;
  // How close any filter decision is to its threshold (relative): a tiny margin would let an
  // f32 device legitimately decide the other way, so such logits are drawn again.
  double margin = std::numeric_limits<double>::infinity();
  int64_t support = 0;
};

Expected expected_distribution(const std::vector<float>& row, const SamplingRow& params) {
  std::vector<float> adjusted = adjusted_logits(row, params);
  for (float& value : adjusted) value /= params.temperature;
  const size_t vocab = adjusted.size();
  Expected e;
  e.probs.assign(vocab, 0.0);
  const auto max_at = std::max_element(adjusted.begin(), adjusted.end());
  const float max_value = *max_at;
  if (!std::isfinite(max_value)) {
    e.probs[static_cast<size_t>(max_at - adjusted.begin())] = 1.0;
    e.support = 1;
    return e;
  }
  std::vector<double> weights(vocab);
  for (size_t i = 0; i < vocab; ++i) weights[i] = std::exp(static_cast<double>(adjusted[i] - max_value));
  std::vector<int32_t> candidates;
  for (size_t i = 0; i < vocab; ++i) {
    if (!(weights[i] > 0.0)) continue;
    if (params.min_p > 0.0f) e.margin = std::min(e.margin, std::abs(weights[i] - params.min_p) / params.min_p);
    if (params.min_p <= 0.0f || weights[i] >= params.min_p) candidates.push_back(static_cast<int32_t>(i));
  }
  std::stable_sort(candidates.begin(), candidates.end(), [&](int32_t a, int32_t b) {
    return adjusted[static_cast<size_t>(a)] > adjusted[static_cast<size_t>(b)];
  });
  if (params.top_k > 0 && static_cast<size_t>(params.top_k) < candidates.size()) {
    const float a = adjusted[static_cast<size_t>(candidates[static_cast<size_t>(params.top_k - 1)])];
    const float b = adjusted[static_cast<size_t>(candidates[static_cast<size_t>(params.top_k)])];
    if (a != b) e.margin = std::min(e.margin, (static_cast<double>(a) - b) / std::max(1.0, std::abs(static_cast<double>(a))));
    candidates.resize(static_cast<size_t>(params.top_k));
  }
  double total = 0;
  for (int32_t id : candidates) total += weights[static_cast<size_t>(id)];
  size_t cut = candidates.size();
  if (params.top_p < 1.0f) {
    const double target = params.top_p * total;
    double before = 0;
    cut = 0;
    for (size_t r = 0; r < candidates.size(); ++r) {
      if (r > 0) e.margin = std::min(e.margin, std::abs(before - target) / total);
      if (r == 0 || before < target) cut = r + 1;
      before += weights[static_cast<size_t>(candidates[r])];
    }
  }
  double kept = 0;
  for (size_t r = 0; r < cut; ++r) kept += weights[static_cast<size_t>(candidates[r])];
  for (size_t r = 0; r < cut; ++r) e.probs[static_cast<size_t>(candidates[r])] = weights[static_cast<size_t>(candidates[r])] / kept;
  e.support = static_cast<int64_t>(cut);
  return e;
}

std::vector<float> random_logits(Rng& rng, int64_t vocab, float scale) {
  std::vector<float> row(static_cast<size_t>(vocab));
  for (float& x : row) x = static_cast<float>(rng.normal() * scale);
  return row;
}

// Rows of `vocab` logits on both backends (for --reference-as-device too).
struct Logits {
  std::vector<float> host;  // [rows, vocab]
  Both t;
};

Logits upload_logits(Pair& p, std::vector<float> host, int64_t rows, int64_t vocab) {
  Logits l;
  l.host = std::move(host);
  l.t = p.f32(l.host, {rows, vocab});
  return l;
}

// Compares one row's top list; appends logprobs for a later check_close.
void compare_top(Case& c, int64_t row, const std::vector<std::pair<int32_t, float>>& dev,
                 const std::vector<std::pair<int32_t, float>>& cpu, const float* logits, std::vector<float>& dev_lp,
                 std::vector<float>& cpu_lp, int64_t& mismatches) {
  if (dev.size() != cpu.size()) {
    if (mismatches++ < 3) c.fail(fmt::format("row {}: {} top entries, the CPU has {}", row, dev.size(), cpu.size()));
    return;
  }
  for (size_t j = 0; j < dev.size(); ++j) {
    const int32_t a = dev[j].first, b = cpu[j].first;
    if (a != b && !(a >= 0 && logits[a] == logits[b])) {
      if (mismatches++ < 3)
        c.fail(fmt::format("row {} top #{}: id {} (logit {}), the CPU has id {} (logit {})", row, j, a,
                           a >= 0 ? logits[a] : NAN, b, logits[b]));
      continue;
    }
    dev_lp.push_back(dev[j].second);
    cpu_lp.push_back(cpu[j].second);
  }
}

// Compares sampled/scored tokens row by row: ids (exact), logprobs, top lists.
void compare_tokens(Case& c, const std::vector<SampledToken>& dev, const std::vector<SampledToken>& cpu,
                    const std::vector<float>& logits, int64_t vocab, bool ids_must_match) {
  if (!c.expect(dev.size() == cpu.size(), fmt::format("{} results, the CPU has {}", dev.size(), cpu.size()))) return;
  std::vector<float> dev_lp, cpu_lp, dev_top, cpu_top;
  int64_t wrong_ids = 0, top_mismatches = 0;
  for (size_t r = 0; r < dev.size(); ++r) {
    const float* row = logits.data() + r * static_cast<size_t>(vocab);
    const int32_t a = dev[r].token_id, b = cpu[r].token_id;
    if (a < 0 || a >= vocab) {
      if (wrong_ids++ < 3) c.fail(fmt::format("row {}: token id {} outside [0, {})", r, a, vocab));
      continue;
    }
    if (ids_must_match && a != b) {
      if (wrong_ids++ < 3)
        c.fail(fmt::format("row {}: token {} (logit {}), the CPU picked {} (logit {})", r, a, row[a], b, row[b]));
      continue;
    }
    dev_lp.push_back(dev[r].logprob);
    cpu_lp.push_back(cpu[r].logprob);
    compare_top(c, static_cast<int64_t>(r), dev[r].top, cpu[r].top, row, dev_top, cpu_top, top_mismatches);
  }
  if (wrong_ids > 3) c.fail(fmt::format("{} rows with a wrong token in all", wrong_ids));
  if (top_mismatches > 3) c.fail(fmt::format("{} top-list mismatches in all", top_mismatches));
  c.check_close("logprob", dev_lp, cpu_lp, kLogprobAtol, kLogprobRtol);
  if (!dev_top.empty()) c.check_close("top logprobs", dev_top, cpu_top, kLogprobAtol, kLogprobRtol);
}

void greedy_cases(Harness& h) {
  struct Shape {
    int64_t vocab, rows;
  };
  // The largest vocab first: a sampler that sizes its scratch on first use sees its largest need.
  const std::vector<Shape> shapes = {{151936, h.options.quick ? 16 : 64}, {1000, 33}, {50, 7}};
  for (const Shape& s : shapes) {
    h.run("sample.greedy", fmt::format("vocab={} rows={}", s.vocab, s.rows), [&](Case& c) {
      std::vector<float> host = random_floats(c.rng, s.rows * s.vocab, 6.0f);
      // An exact tie for the maximum: the lower id wins.
      float* tie_row = host.data() + (s.rows - 1) * s.vocab;
      const float top = *std::max_element(tie_row, tie_row + s.vocab) + 1.0f;
      tie_row[s.vocab / 5] = top;
      tie_row[s.vocab / 2] = top;
      Pair p(h);
      Logits l = upload_logits(p, std::move(host), s.rows, s.vocab);
      std::vector<SamplingRow> rows(static_cast<size_t>(s.rows));
      const int logprobs[] = {-1, 5, 20, 0, 1};
      for (size_t r = 0; r < rows.size(); ++r) {
        rows[r].temperature = 0.0f;
        rows[r].seed = c.rng.next();
        rows[r].logprobs = logprobs[r % 5];
      }
      std::vector<SampledToken> dev, cpu;
      h.device.sample(l.t.dev, rows, dev);
      h.cpu.sample(l.t.cpu, rows, cpu);
      compare_tokens(c, dev, cpu, l.host, s.vocab, true);
      if (!cpu.empty() && cpu.back().token_id != s.vocab / 5)
        c.fail(fmt::format("the CPU broke the tie with {}, expected the lower id {}", cpu.back().token_id, s.vocab / 5));
    });
  }
}

void score_cases(Harness& h) {
  struct Shape {
    int64_t vocab, rows;
    int top_k;
  };
  const std::vector<Shape> shapes = {
      {151936, 16, 20}, {201088, 9, 0}, {32000, 64, 1}, {1000, 100, 5}, {50, 7, 0}};
  for (const Shape& s : shapes) {
    h.run("score_tokens", fmt::format("vocab={} rows={} top={}", s.vocab, s.rows, s.top_k), [&](Case& c) {
      std::vector<float> host = random_floats(c.rng, s.rows * s.vocab, 6.0f);
      std::vector<int32_t> targets(static_cast<size_t>(s.rows));
      for (int64_t r = 0; r < s.rows; ++r) {
        const float* row = host.data() + r * s.vocab;
        if (r % 4 == 0) targets[r] = static_cast<int32_t>(std::max_element(row, row + s.vocab) - row);
        else if (r % 4 == 2) targets[r] = static_cast<int32_t>(std::min_element(row, row + s.vocab) - row);
        else targets[r] = static_cast<int32_t>(c.rng.below(s.vocab));
      }
      Pair p(h);
      Logits l = upload_logits(p, std::move(host), s.rows, s.vocab);
      std::vector<SampledToken> dev, cpu;
      h.device.score_tokens(l.t.dev, targets, s.top_k, dev);
      h.cpu.score_tokens(l.t.cpu, targets, s.top_k, cpu);
      for (size_t r = 0; r < std::min(dev.size(), targets.size()); ++r)
        if (dev[r].token_id != targets[r]) {
          c.fail(fmt::format("row {}: token_id {} is not the target {}", r, dev[r].token_id, targets[r]));
          break;
        }
      compare_tokens(c, dev, cpu, l.host, s.vocab, true);
    });
  }
}

// Per-row adjustment lists (an empty list: none).
struct RowAdjustments {
  std::vector<std::vector<int32_t>> prompt, output;
  std::vector<std::vector<std::pair<int32_t, float>>> bias;
  explicit RowAdjustments(int64_t rows)
      : prompt(static_cast<size_t>(rows)),
        output(static_cast<size_t>(rows)),
        bias(static_cast<size_t>(rows)) {}
};

// Points each row at its adjustment lists, then samples the rows of `host` on both backends.
void sample_both(Harness& h, const std::vector<float>& host, int64_t rows, int64_t vocab,
                 std::vector<SamplingRow>& params, RowAdjustments& adj,
                 std::vector<SampledToken>& dev, std::vector<SampledToken>& cpu) {
  for (size_t r = 0; r < params.size(); ++r) {
    params[r].prompt_tokens = adj.prompt[r].empty() ? nullptr : &adj.prompt[r];
    params[r].output_tokens = adj.output[r].empty() ? nullptr : &adj.output[r];
    params[r].logit_bias = adj.bias[r].empty() ? nullptr : &adj.bias[r];
  }
  Pair pair(h);
  Logits l = upload_logits(pair, host, rows, vocab);
  h.device.sample(l.t.dev, params, dev);
  h.cpu.sample(l.t.cpu, params, cpu);
}

// Greedy under penalties, bias and bans on a small vocabulary: each row's adjustment is built
// to move the argmax.
void penalty_cases(Harness& h) {
  h.run("sample.penalties", "greedy vocab=50 rows=10", [&](Case& c) {
    const int64_t vocab = 50, rows = 10;
    std::vector<float> host = random_logits(c.rng, rows * vocab, 2.0f);
    RowAdjustments adj(rows);
    auto &prompt = adj.prompt, &output = adj.output;
    auto& bias = adj.bias;
    std::vector<SamplingRow> params(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<float> row(host.begin() + r * vocab, host.begin() + (r + 1) * vocab);
      const int32_t top = argmax(row);
      SamplingRow& p = params[static_cast<size_t>(r)];
      p.temperature = 0.0f;
      p.logprobs = 3;
      switch (r) {
        case 0: p.repetition_penalty = 1.5f; prompt[r] = {top, 3, 3, 7}; break;
        case 1: p.presence_penalty = 5.0f; output[r] = {top, 9, 9}; break;
        case 2: p.frequency_penalty = 1.5f; output[r] = {top, top, top, 11}; break;
        case 3: bias[r] = {{static_cast<int32_t>((top + 7) % vocab), 20.0f}, {top, -0.5f}}; break;
        case 4: p.banned_tokens = {top}; break;
        case 5:  // everything banned: the CPU falls back to id 0
          for (int32_t id = 0; id < vocab; ++id) p.banned_tokens.push_back(id);
          break;
        case 6:
          p.repetition_penalty = 1.2f;
          p.presence_penalty = 0.5f;
          p.frequency_penalty = 0.3f;
          prompt[r] = {1, 2, top};
          output[r] = {top, top, 4, 5, 5};
          bias[r] = {{6, 1.0f}};
          p.banned_tokens = {8};
          break;
        case 7: p.repetition_penalty = 0.8f; prompt[r] = {(top + 1) % 50, (top + 2) % 50}; break;
        case 8:  // a negative logit is multiplied by the penalty
          host[r * vocab + 13] = -0.25f;
          p.repetition_penalty = 3.0f;
          output[r] = {13, top};
          break;
        default: break;
      }
    }
    std::vector<SampledToken> dev, cpu;
    sample_both(h, host, rows, vocab, params, adj, dev, cpu);
    compare_tokens(c, dev, cpu, host, vocab, true);
    // The host replica agrees with the CPU (else this harness's distribution cases are wrong).
    for (int64_t r = 0; r < rows && r < static_cast<int64_t>(cpu.size()); ++r) {
      std::vector<float> row(host.begin() + r * vocab, host.begin() + (r + 1) * vocab);
      const int32_t expected = argmax(adjusted_logits(row, params[static_cast<size_t>(r)]));
      if (cpu[r].token_id != expected)
        c.fail(fmt::format("harness: row {} replica argmax {} but the CPU picked {}", r, expected, cpu[r].token_id));
    }
  });
}

// Greedy rows without top logprobs are read by several blocks each (split_count in sampler.cu:
// 19 for 151,936 ids, 25 for 201,088), merged by the last to arrive. Adjustments on ids in late
// splits, a maximum tied across two splits, a row of -inf but a few, and rows of the one-block
// path in the same launch (top logprobs; a sampled row whose id is not compared).
void split_greedy_cases(Harness& h) {
  for (const int64_t vocab : {int64_t{201088}, int64_t{151936}}) {
    h.run("sample.greedy_split", fmt::format("vocab={} rows=8", vocab), [&](Case& c) {
      const int64_t rows = 8;
      std::vector<float> host = random_floats(c.rng, rows * vocab, 6.0f);
      auto at = [&](int64_t r, int64_t id) -> float& {
        return host[static_cast<size_t>(r * vocab + id)];
      };
      RowAdjustments adj(rows);
      auto& prompt = adj.prompt;
      auto& bias = adj.bias;
      std::vector<SamplingRow> params(static_cast<size_t>(rows));
      const int32_t last = static_cast<int32_t>(vocab - 3);
      for (int64_t r = 0; r < rows; ++r) {
        SamplingRow& p = params[static_cast<size_t>(r)];
        p.temperature = 0.0f;
        p.seed = c.rng.next();
        std::vector<float> row(host.begin() + r * vocab, host.begin() + (r + 1) * vocab);
        const int32_t top = argmax(row);
        switch (r) {
          case 1:
            bias[r] = {{last, 40.0f}};
            break;  // the last split's id wins
          case 2:   // the argmax banned, the runner-up penalised: a third id wins
            p.banned_tokens = {top};
            p.repetition_penalty = 4.0f;
            prompt[r] = {static_cast<int32_t>(vocab / 3), last};
            break;
          case 3: {  // a tie for the maximum in two splits: the lower id
            const float v = *std::max_element(row.begin(), row.end()) + 1.0f;
            at(r, vocab / 7) = v;
            at(r, vocab - 5) = v;
            break;
          }
          case 4:  // -inf but three ids
            for (int64_t id = 0; id < vocab; ++id) at(r, id) = -INFINITY;
            at(r, 5) = 1.0f, at(r, vocab / 2) = 2.0f, at(r, vocab - 1) = 1.5f;
            break;
          case 5:
            p.logprobs = 3;
            break;  // one block (top logprobs)
          case 6:   // one block, sampled: only its logprob and range are compared
            p.temperature = 0.8f;
            break;
          default:
            break;
        }
      }
      std::vector<SampledToken> dev, cpu;
      sample_both(h, host, rows, vocab, params, adj, dev, cpu);
      if (!c.expect(dev.size() == static_cast<size_t>(rows) && cpu.size() == dev.size(),
                    "result counts"))
        return;
      std::vector<float> dev_lp, cpu_lp;
      for (int64_t r = 0; r < rows; ++r) {
        const SampledToken &a = dev[static_cast<size_t>(r)], &b = cpu[static_cast<size_t>(r)];
        if (a.token_id < 0 || a.token_id >= vocab) {
          c.fail(fmt::format("row {}: token {} outside the vocabulary", r, a.token_id));
          continue;
        }
        if (r != 6 && a.token_id != b.token_id) {
          c.fail(fmt::format("row {}: token {}, the CPU picked {}", r, a.token_id, b.token_id));
          continue;
        }
        // A sampled row: its logprob is the raw logit's, whichever id was drawn.
        const float raw = at(r, a.token_id);
        dev_lp.push_back(a.logprob);
        cpu_lp.push_back(r == 6 ? raw - (at(r, b.token_id) - b.logprob) : b.logprob);
      }
      c.check_close("logprob", dev_lp, cpu_lp, kLogprobAtol, kLogprobRtol);
      // The replica's argmax is what the rows were built to pick.
      if (cpu.size() > 3 && cpu[3].token_id != static_cast<int32_t>(vocab / 7))
        c.fail(fmt::format("harness: the tie row picked {}, not {}", cpu[3].token_id, vocab / 7));
      if (cpu.size() > 1 && cpu[1].token_id != last)
        c.fail(fmt::format("harness: the bias row picked {}, not {}", cpu[1].token_id, last));
    });
  }
}

struct DistCase {
  std::string name;
  int64_t vocab;
  float temperature;
  int top_k;
  float top_p, min_p;
  bool coarse = false;     // logits on a 0.5 grid: exact ties, some at the top_p cut
  bool penalties = false;  // repetition/presence/frequency, bias, bans
};

void distribution_case(Harness& h, Case& c, const DistCase& d) {
  const int64_t vocab = d.vocab;
  const int64_t rows_per_call = std::min<int64_t>(kRowsPerCall, std::max<int64_t>(1, 16 * 1024 * 1024 / vocab));
  const int64_t wanted = h.options.quick ? 8192 : 20480;
  const int64_t calls = (wanted + rows_per_call - 1) / rows_per_call, draws = calls * rows_per_call;

  std::vector<int32_t> prompt, output;
  std::vector<std::pair<int32_t, float>> bias;
  SamplingRow params;
  params.temperature = d.temperature;
  params.top_k = d.top_k;
  params.top_p = d.top_p;
  params.min_p = d.min_p;
  params.seed = c.rng.next();
  params.logprobs = -1;
  // Logits whose filter decisions are clear of their thresholds.
  std::vector<float> row;
  Expected expected;
  int attempts = 0;
  for (; attempts < 200; ++attempts) {
    row = random_logits(c.rng, vocab, d.coarse ? 1.5f : 2.0f);
    if (d.coarse)
      for (float& x : row) x = std::round(x * 2.0f) / 2.0f;
    if (d.penalties) {
      const int32_t top = argmax(row);
      prompt.clear();
      output.clear();
      for (int i = 0; i < 20; ++i) prompt.push_back(static_cast<int32_t>(c.rng.below(vocab)));
      prompt.push_back(top);
      for (int i = 0; i < 30; ++i) output.push_back(static_cast<int32_t>(c.rng.below(std::min<int64_t>(vocab, 40))));
      output.push_back(top);
      bias = {{static_cast<int32_t>(c.rng.below(vocab)), 3.0f}, {static_cast<int32_t>(c.rng.below(vocab)), -100.0f},
              {static_cast<int32_t>(c.rng.below(vocab)), 1.5f}};
      params.repetition_penalty = 1.3f;
      params.presence_penalty = 0.4f;
      params.frequency_penalty = 0.2f;
      params.prompt_tokens = &prompt;
      params.output_tokens = &output;
      params.logit_bias = &bias;
      std::vector<float> sorted = row;
      std::sort(sorted.begin(), sorted.end(), std::greater<float>());
      params.banned_tokens = {0, static_cast<int32_t>(std::find(row.begin(), row.end(), sorted[1]) - row.begin())};
    }
    expected = expected_distribution(row, params);
    if (expected.margin > 1e-4) break;
  }
  if (expected.margin <= 1e-4) c.info(fmt::format("filter margin only {:.1e}", expected.margin));

  std::vector<float> replicated(static_cast<size_t>(rows_per_call * vocab));
  for (int64_t r = 0; r < rows_per_call; ++r) std::copy(row.begin(), row.end(), replicated.begin() + r * vocab);
  Pair p(h);
  Logits l = upload_logits(p, std::move(replicated), rows_per_call, vocab);
  const bool with_cpu = vocab <= 2000;  // agreement with the CPU's draws: a note, not a test
  std::vector<int64_t> counts(static_cast<size_t>(vocab), 0);
  std::vector<float> dev_lp, want_lp;
  const std::vector<double> logprobs = raw_logprobs(row);
  int64_t same_as_cpu = 0, out_of_range = 0;
  std::vector<SamplingRow> rows(static_cast<size_t>(rows_per_call), params);
  for (int64_t call = 0; call < calls; ++call) {
    for (int64_t r = 0; r < rows_per_call; ++r) rows[static_cast<size_t>(r)].draw_index = static_cast<uint64_t>(call * rows_per_call + r);
    std::vector<SampledToken> dev, cpu;
    h.device.sample(l.t.dev, rows, dev);
    if (!c.expect(static_cast<int64_t>(dev.size()) == rows_per_call,
                  fmt::format("{} results for {} rows", dev.size(), rows_per_call)))
      return;
    if (with_cpu) h.cpu.sample(l.t.cpu, rows, cpu);
    for (int64_t r = 0; r < rows_per_call; ++r) {
      const int32_t id = dev[static_cast<size_t>(r)].token_id;
      if (id < 0 || id >= vocab) {
        ++out_of_range;
        continue;
      }
      ++counts[static_cast<size_t>(id)];
      if (with_cpu && cpu[static_cast<size_t>(r)].token_id == id) ++same_as_cpu;
      if (dev_lp.size() < 4096) {
        dev_lp.push_back(dev[static_cast<size_t>(r)].logprob);
        want_lp.push_back(static_cast<float>(logprobs[static_cast<size_t>(id)]));
      }
    }
  }
  if (out_of_range) c.fail(fmt::format("{} draws returned an id outside [0, {})", out_of_range, vocab));
  // Per token with enough expected mass, a 5-sigma test; the rest pooled into one bin; nothing
  // outside the support.
  const double n = static_cast<double>(draws);
  double worst_z = 0, tail_p = 0, tv = 0;
  int64_t tail_count = 0, outside = 0, tested = 0, bad = 0;
  auto z_of = [&](double count, double prob) {
    const double sd = std::sqrt(n * prob * (1 - prob));
    return (std::abs(count - n * prob) - 1.0) / std::max(sd, 1e-12);
  };
  for (int64_t id = 0; id < vocab; ++id) {
    const double prob = expected.probs[static_cast<size_t>(id)], count = static_cast<double>(counts[static_cast<size_t>(id)]);
    tv += std::abs(count / n - prob) / 2;
    if (prob == 0.0) {
      if (count > 0 && outside++ < 3)
        c.fail(fmt::format("token {} drawn {} times but is outside the filtered support", id, counts[static_cast<size_t>(id)]));
      continue;
    }
    if (n * prob < 20) {
      tail_p += prob;
      tail_count += counts[static_cast<size_t>(id)];
      continue;
    }
    ++tested;
    const double z = z_of(count, prob);
    worst_z = std::max(worst_z, z);
    if (z > 5 && bad++ < 3)
      c.fail(fmt::format("token {}: {} draws, expected {:.1f} (p={:.4g}, {:.1f} sigma)", id, counts[static_cast<size_t>(id)],
                         n * prob, prob, z));
  }
  if (tail_p > 0 && n * tail_p >= 20) {
    const double z = z_of(static_cast<double>(tail_count), tail_p);
    worst_z = std::max(worst_z, z);
    if (z > 5) c.fail(fmt::format("rare tokens: {} draws, expected {:.1f} ({:.1f} sigma)", tail_count, n * tail_p, z));
  }
  if (outside > 3) c.fail(fmt::format("{} tokens outside the support were drawn", outside));
  c.check_close("logprob", dev_lp, want_lp, kLogprobAtol, kLogprobRtol);
  std::string note = fmt::format("{} draws, support {}, {} tokens tested, worst {:.1f} sigma, tv {:.3f}", draws,
                                 expected.support, tested, std::max(0.0, worst_z), tv);
  if (with_cpu) note += fmt::format(", same token as cpu {:.1f}%", 100.0 * same_as_cpu / n);
  c.info(note);
}

void distribution_cases(Harness& h) {
  std::vector<DistCase> cases = {
      {"plain", 1000, 1.0f, -1, 1.0f, 0.0f},
      {"temperature=0.7 top_k=20", 1000, 0.7f, 20, 1.0f, 0.0f},
      {"top_p=0.9", 1000, 1.0f, -1, 0.9f, 0.0f},
      {"temperature=1.3 min_p=0.05", 1000, 1.3f, -1, 1.0f, 0.05f},
      {"temperature=0.6 top_k=50 top_p=0.95 min_p=0.02", 2000, 0.6f, 50, 0.95f, 0.02f},
      {"ties top_p=0.6", 60, 1.0f, -1, 0.6f, 0.0f, true},
      {"penalties temperature=0.9 top_p=0.95", 300, 0.9f, -1, 0.95f, 0.0f, false, true},
      {"top_k=1", 500, 1.0f, 1, 1.0f, 0.0f},
      {"temperature=2 top_k=3 top_p=0.5", 1000, 2.0f, 3, 0.5f, 0.0f},
      {"temperature=0.5 top_p=0.7 min_p=0.1", 1000, 0.5f, -1, 0.7f, 0.1f},
      {"temperature=0.8 top_p=0.8", 8000, 0.8f, -1, 0.8f, 0.0f},
  };
  if (h.options.quick) cases = {cases[0], cases[1], cases[2], cases[4], cases[5], cases[6]};
  for (const DistCase& d : cases)
    h.run("sample.dist", fmt::format("{} vocab={}", d.name, d.vocab), [&](Case& c) { distribution_case(h, c, d); });
}

}  // namespace

// sample_async + record_mark/wait_mark (two slots) and download_columns_async, as the engine
// uses them with capture on: a download enqueued before a mark is on the host once wait_mark
// returns (only the columns asked for), while the sampling behind it
// may still run; the next synchronize() fills the samples, bitwise equal to sample()'s (which
// the other cases compare with the CPU's).
void async_cases(Harness& h) {
  const int64_t vocab = 151936, rows = h.options.quick ? 16 : 64, ints = 1 << 20;
  h.run("sample.async", fmt::format("vocab={} rows={} marked download={} ints", vocab, rows, ints),
        [&](Case& c) {
          Pair p(h);
          Logits l = upload_logits(p, random_floats(c.rng, rows * vocab, 6.0f), rows, vocab);
          std::vector<SamplingRow> params(static_cast<size_t>(rows));
          for (size_t r = 0; r < params.size(); ++r) {
            params[r].temperature = r % 2 ? 0.8f : 0.0f;
            params[r].top_p = 0.9f;
            params[r].seed = c.rng.next();
            params[r].logprobs = static_cast<int>(r % 3);
          }
          std::vector<int32_t> marked(static_cast<size_t>(ints));
          for (int32_t& v : marked) v = static_cast<int32_t>(c.rng.next() & 0x7fffffff);
          Tensor marked_dev = p.dev.i32(marked, {ints});
          auto* host = static_cast<int32_t*>(h.device.alloc_host(static_cast<size_t>(ints) * 4));
          if (!c.expect(host != nullptr, "alloc_host failed")) return;
          std::fill_n(host, ints, -1);
          std::vector<SampledToken> sync_out,
              async_out(static_cast<size_t>(rows), SampledToken{-7, NAN, {}});
          h.device.sample(l.t.dev, params, sync_out);
          // Columns [40, 100) of a [1024, 1024] int matrix first (mark slot 2), then all of it
          // (slot 5), then the sampling.
          const int64_t width = 1024, matrix_rows = ints / width, begin = 40, end = 100;
          auto* columns = static_cast<int32_t*>(h.device.alloc_host(static_cast<size_t>(ints) * 4));
          if (!c.expect(columns != nullptr, "alloc_host failed")) return;
          std::fill_n(columns, ints, -1);
          h.device.download_columns_async(marked_dev, columns, matrix_rows, width * 4, begin * 4,
                                          (end - begin) * 4);
          h.device.record_mark(2);
          h.device.download_async(marked_dev, host);
          h.device.record_mark(5);
          h.device.sample_async(l.t.dev, params, async_out);
          h.device.wait_mark(2);
          bool columns_ok = true;
          for (int64_t i = 0; i < ints; ++i) {
            const int64_t column = i % width;
            columns_ok &= columns[i] ==
                          (column >= begin && column < end ? marked[static_cast<size_t>(i)] : -1);
          }
          c.expect(columns_ok,
                   "download_columns_async copied other columns or missed some by wait_mark(2)");
          h.device.wait_mark(5);
          c.expect(std::equal(marked.begin(), marked.end(), host),
                   "the download before the mark is not on the host after wait_mark");
          h.device.synchronize();
          h.device.free_host(host);
          h.device.free_host(columns);
          bool same = async_out.size() == sync_out.size();
          for (size_t r = 0; same && r < sync_out.size(); ++r)
            same = async_out[r].token_id == sync_out[r].token_id &&
                   async_out[r].logprob == sync_out[r].logprob &&
                   async_out[r].top == sync_out[r].top;
          c.expect(same, "sample_async + synchronize differs from sample");
        });
}

void run_sampling_ops(Harness& h) {
  greedy_cases(h);
  async_cases(h);
  score_cases(h);
  penalty_cases(h);
  split_greedy_cases(h);
  distribution_cases(h);
}

}  // namespace sy::harness
