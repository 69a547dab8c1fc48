// gated_delta_net (Qwen3.5's linear attention) against the CPU's, which is verified against
// transformers: two steps in a row over the same state buffers (the second reads what the first
// wrote), with a sequence starting at position 0, one continuing from a stored state, one
// decoding a single token, tokens of two sequences interleaved, and a padding sequence (no state,
// as the decoder pads a graph bucket). Every state buffer is compared after each step (those no
// sequence writes must stay as they were), and every real token's output.
#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "harness.h"

namespace sy::harness {
namespace {

constexpr double kDeltaNetTol = 1e-4;  // f32 on both; the device sums the norms in another order

struct LinearConfig {
  int64_t key_heads, value_heads, key_head_dim, value_head_dim, kernel;
};

// One step's tokens: per sequence, its first position and count (position 0 = fresh); tokens of
// sequences 0 and 1 alternate where both have some, the others follow in order.
struct StepLayout {
  std::vector<int32_t> positions, token_seq, read, write;
  std::vector<uint8_t> real;
};

StepLayout make_step(const std::vector<std::pair<int64_t, int64_t>>& seqs,
                     const std::vector<int32_t>& read, const std::vector<int32_t>& write,
                     int64_t padding) {
  StepLayout l;
  l.read = read;
  l.write = write;
  std::vector<int64_t> next(seqs.size(), 0);
  auto emit = [&](size_t s) {
    l.positions.push_back(static_cast<int32_t>(seqs[s].first + next[s]++));
    l.token_seq.push_back(static_cast<int32_t>(s));
    l.real.push_back(1);
  };
  while (seqs.size() > 1 && (next[0] < seqs[0].second || next[1] < seqs[1].second))
    for (size_t s : {size_t{0}, size_t{1}})
      if (next[s] < seqs[s].second) emit(s);
  for (size_t s = seqs.size() > 1 ? 2 : 0; s < seqs.size(); ++s)
    while (next[s] < seqs[s].second) emit(s);
  for (int64_t i = 0; i < padding; ++i) {  // its own sequence, no state buffers
    l.positions.push_back(0);
    l.token_seq.push_back(static_cast<int32_t>(l.read.size()));
    l.read.push_back(-1);
    l.write.push_back(-1);
    l.real.push_back(0);
  }
  return l;
}

void delta_net_case(Harness& h, Case& c, const LinearConfig& lc, int64_t prompt) {
  const int64_t kh = lc.key_heads, vh = lc.value_heads, kd = lc.key_head_dim,
                vd = lc.value_head_dim;
  const int64_t key_dim = kh * kd, value_dim = vh * vd, conv_dim = 2 * key_dim + value_dim;
  const int64_t history = lc.kernel - 1, buffers = 8;
  Pair p(h);
  // Every buffer starts with the same random states on both sides (fresh sequences must not
  // read them; the others continue from them).
  Both conv = p.f32(random_floats(c.rng, buffers * conv_dim * std::max<int64_t>(history, 1), 1.0f),
                    {buffers, conv_dim, std::max<int64_t>(history, 1)});
  Both recurrent = p.f32(random_floats(c.rng, buffers * vh * kd * vd, 0.3f), {buffers, vh, kd, vd});
  HostTensor conv_w =
      host_random(h.cpu, DType::kBF16, {conv_dim, 1, lc.kernel}, c.rng.next(), 0.6f);
  HostTensor a_log = host_random(h.cpu, DType::kF32, {vh}, c.rng.next(), 1.0f);
  HostTensor dt_bias = host_random(h.cpu, DType::kF32, {vh}, c.rng.next(), 1.0f);
  HostTensor norm = host_random(h.cpu, DType::kF32, {vd}, c.rng.next(), 0.5f, 1.0f);
  Both w_conv = p.weight(conv_w.view), w_a_log = p.weight(a_log.view),
       w_dt_bias = p.weight(dt_bias.view), w_norm = p.weight(norm.view);
  const backend::Backend::LinearShape shape{kh, vh, kd, vd, lc.kernel};

  // Step 1: seq 0 fresh (the prompt), seq 1 continues from buffer 2 at position 50, seq 2 decodes
  // one token from buffer 4. Step 2: seq 0 continues (reading step 1's write buffer), seq 1
  // decodes, seq 2 is absent (its buffers must stay untouched), plus padding.
  const std::vector<StepLayout> steps = {
      make_step({{0, prompt}, {50, 9}, {700, 1}}, {0, 2, 4}, {1, 3, 5}, 0),
      make_step({{prompt, 3}, {59, 1}}, {1, 3}, {6, 2}, 2)};
  for (size_t step = 0; step < steps.size(); ++step) {
    const StepLayout& l = steps[step];
    const int64_t tokens = static_cast<int64_t>(l.positions.size()),
                  seqs = static_cast<int64_t>(l.read.size());
    Both positions = p.i32(l.positions, {tokens}), token_seq = p.i32(l.token_seq, {tokens});
    Both read = p.i32(l.read, {seqs}), write = p.i32(l.write, {seqs});
    Both qkv = p.f32(random_floats(c.rng, tokens * conv_dim, 1.5f), {tokens, conv_dim});
    Both z = p.f32(random_floats(c.rng, tokens * value_dim, 2.0f), {tokens, value_dim});
    Both b = p.f32(random_floats(c.rng, tokens * vh, 2.0f), {tokens, vh});
    Both a = p.f32(random_floats(c.rng, tokens * vh, 2.0f), {tokens, vh});
    Both out = p.output({tokens, value_dim});
    for (int which = 0; which < 2; ++which) {
      Backend& backend = which ? h.device : h.cpu;
      auto pick = [&](Both& both) -> Tensor& { return which ? both.dev : both.cpu; };
      backend::AttentionBatch batch;
      batch.positions = pick(positions);
      batch.token_seq = pick(token_seq);
      batch.max_query_len = tokens;
      const backend::Backend::LinearWeights weights{&pick(w_conv), &pick(w_a_log), &pick(w_dt_bias),
                                                    &pick(w_norm)};
      const backend::Backend::LinearState state{pick(read), pick(write), &pick(conv),
                                                &pick(recurrent)};
      backend.gated_delta_net(pick(qkv), pick(z), pick(b), pick(a), weights, shape, 1e-6f, batch,
                              state, pick(out));
    }
    const std::string at = fmt::format("step {} ", step + 1);
    c.check(at + "out",
            compare(to_host(h.device, out.dev), to_host(h.cpu, out.cpu), value_dim, &l.real),
            kDeltaNetTol);
    c.check(at + "conv states",
            compare(to_host(h.device, conv.dev), to_host(h.cpu, conv.cpu), conv_dim), kDeltaNetTol);
    c.check(at + "recurrent states",
            compare(to_host(h.device, recurrent.dev), to_host(h.cpu, recurrent.cpu), kd * vd),
            kDeltaNetTol);
  }
}

}  // namespace

void run_linear_ops(Harness& h) {
  // Qwen3.5's heads (128 x 128, kernel 4; fewer of them), the golden model's kind of odd widths,
  // a value head wider than its key head, and kernel 2 and 1 (no history).
  const std::vector<LinearConfig> configs = {{2, 4, 128, 128, 4},
                                             {2, 4, 16, 24, 4},
                                             {1, 3, 20, 12, 3},
                                             {3, 3, 8, 40, 2},
                                             {2, 2, 32, 32, 1}};
  for (const LinearConfig& lc : configs)
    // (300: a step longer than a block's pass over the tokens for the narrower heads.)
    for (int64_t prompt : {int64_t{1}, int64_t{37}, int64_t{300}})
      h.run("gated_delta_net",
            fmt::format("heads={}/{} dims={}/{} kernel={} prompt={}", lc.key_heads, lc.value_heads,
                        lc.key_head_dim, lc.value_head_dim, lc.kernel, prompt),
            [&](Case& c) { delta_net_case(h, c, lc, prompt); });
}

}  // namespace sy::harness
