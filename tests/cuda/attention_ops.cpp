// write_kv + paged attention on realistic layouts: several sequences, random non-contiguous
// block tables, block sizes 16 and 5; pure decode (with padding tokens, as the decoder pads a
// graph bucket), prefill from scratch, chunked prefill over cached context, and mixed steps.
// Each backend keeps its own cache dtype (CPU f32, CUDA bf16); both get the same K/V.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <vector>

#include "harness.h"

namespace sy::harness {
namespace {

constexpr double kAttentionTol = 1e-2;  // bf16 KV cache vs the CPU's f32 cache
constexpr double kCacheTol = 4e-3;      // a bf16 rounding of each value (2^-8 relative at most)
constexpr double kPrepTol = 1e-5;       // f32 norm + RoPE (same formulas; the norm sums in another order)
constexpr int64_t kWriteChunk = 1024;   // history is written in steps no larger than the limits

struct SeqSpec {
  int64_t context = 1;  // tokens in the cache after this step
  int64_t queries = 1;  // the last `queries` of them are this step's tokens
};

// The step as the decoder uploads it (model/decoder.cpp), plus the history to write first.
struct Layout {
  int block_size = 16;
  int64_t num_blocks = 0, seqs = 0, stride = 0;
  std::vector<int32_t> block_tables;                     // [seqs, stride]
  std::vector<int32_t> positions, token_seq, slot_mapping;  // the step's tokens
  std::vector<uint8_t> real;                             // 0: padding token
  std::vector<int32_t> history_slots, history_positions, history_seq;
  int64_t max_query_len = 0, max_context_len = 0;
  int64_t work = 0;  // sum over real tokens of their context (the reference's cost)
};

Layout make_layout(Rng& rng, std::vector<SeqSpec> specs, int block_size, int64_t padding_tokens, bool shuffle) {
  Layout l;
  l.block_size = block_size;
  if (shuffle) rng.shuffle(specs);
  const int64_t real_seqs = static_cast<int64_t>(specs.size());
  int64_t total_blocks = 0, max_blocks = 0;
  for (const SeqSpec& s : specs) {
    const int64_t blocks = (s.context + block_size - 1) / block_size;
    total_blocks += blocks;
    max_blocks = std::max(max_blocks, blocks);
  }
  l.num_blocks = total_blocks + rng.between(1, 8);  // some blocks stay unused
  std::vector<int32_t> pool(static_cast<size_t>(l.num_blocks));
  std::iota(pool.begin(), pool.end(), 0);
  rng.shuffle(pool);
  l.stride = max_blocks + rng.below(3);  // wider than needed: unused entries are 0, as the decoder pads
  int64_t tokens = 0;
  for (const SeqSpec& s : specs) tokens += s.queries;
  tokens += padding_tokens;
  // Padding tokens sit at position 0 of their own empty sequence (index = token index).
  l.seqs = padding_tokens ? std::max(real_seqs, tokens) : real_seqs;
  l.block_tables.assign(static_cast<size_t>(l.seqs * l.stride), 0);
  size_t next_block = 0;
  for (int64_t s = 0; s < real_seqs; ++s) {
    const int64_t blocks = (specs[static_cast<size_t>(s)].context + block_size - 1) / block_size;
    for (int64_t b = 0; b < blocks; ++b) l.block_tables[static_cast<size_t>(s * l.stride + b)] = pool[next_block++];
  }
  auto slot_of = [&](int64_t s, int64_t position) {
    return l.block_tables[static_cast<size_t>(s * l.stride + position / block_size)] * block_size +
           static_cast<int32_t>(position % block_size);
  };
  for (int64_t s = 0; s < real_seqs; ++s) {
    const SeqSpec& spec = specs[static_cast<size_t>(s)];
    const int64_t first_query = spec.context - spec.queries;
    for (int64_t p = 0; p < first_query; ++p) {
      l.history_slots.push_back(slot_of(s, p));
      l.history_positions.push_back(static_cast<int32_t>(p));
      l.history_seq.push_back(static_cast<int32_t>(s));
    }
    for (int64_t p = first_query; p < spec.context; ++p) {
      l.positions.push_back(static_cast<int32_t>(p));
      l.token_seq.push_back(static_cast<int32_t>(s));
      l.slot_mapping.push_back(slot_of(s, p));
      l.real.push_back(1);
      l.work += p + 1;
    }
    l.max_query_len = std::max(l.max_query_len, spec.queries);
  }
  for (int64_t i = 0; i < padding_tokens; ++i) {
    l.positions.push_back(0);
    l.token_seq.push_back(static_cast<int32_t>(l.positions.size() - 1));
    l.slot_mapping.push_back(-1);
    l.real.push_back(0);
  }
  for (int32_t p : l.positions) l.max_context_len = std::max<int64_t>(l.max_context_len, p + 1);
  return l;
}

enum class Kind { kDecode, kPrefill, kChunked, kMixed };

std::vector<SeqSpec> specs_for(Kind kind, Rng& rng, bool quick) {
  std::vector<SeqSpec> specs;
  switch (kind) {
    case Kind::kDecode: {
      const int64_t longest = quick ? 3000 : 5000;
      for (int64_t context : {int64_t{1}, longest, int64_t{16}, int64_t{17}, int64_t{80}}) specs.push_back({context, 1});
      const int64_t more = quick ? 1 : 7;
      for (int64_t i = 0; i < more; ++i) specs.push_back({rng.between(2, longest), 1});
      break;
    }
    case Kind::kPrefill:
      if (quick) {
        specs = {{rng.between(2, 40), 0}, {rng.between(100, 300), 0}};
      } else {
        specs = {{1, 0}, {rng.between(2, 80), 0}, {rng.between(200, 700), 0}};
      }
      for (SeqSpec& s : specs) s.queries = s.context;
      break;
    case Kind::kChunked: {
      const int64_t history = rng.between(100, quick ? 800 : 1500), chunk = rng.between(64, quick ? 128 : 200);
      specs = {{history + chunk, chunk}, {32 + 17, 17}, {rng.between(2, 500), 1}};
      break;
    }
    case Kind::kMixed: {
      for (int i = 0; i < 4; ++i) specs.push_back({rng.between(1, 3000), 1});
      const int64_t prompt = rng.between(50, 300);
      specs.push_back({prompt, prompt});
      for (int i = 0; i < 2; ++i) {
        const int64_t chunk = rng.between(2, 128);
        specs.push_back({rng.between(1, 1500) + chunk, chunk});
      }
      break;
    }
  }
  return specs;
}

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kDecode: return "decode";
    case Kind::kPrefill: return "prefill";
    case Kind::kChunked: return "chunked";
    case Kind::kMixed: return "mixed";
  }
  return "?";
}

struct HeadConfig {
  int64_t heads, kv_heads, head_dim;
};

// gpt-oss/Mixtral options of attention(): a sliding window (0: none) and per-head sinks.
struct AttentionOptions {
  int64_t window = 0;
  bool sinks = false;
  std::string text() const {
    return (window ? fmt::format(" window={}", window) : std::string()) + (sinks ? " sinks" : "");
  }
};

struct Batches {
  backend::AttentionBatch cpu, dev;
  // The host copies the engine's decoder also passes (AttentionBatch::host_*; the device's MLA
  // splits prefill steps by sequence with them), shared so that copies of Batches keep them.
  std::shared_ptr<const std::vector<int32_t>> host_positions, host_seqs;
};

// Uploads one batch's index tensors to both backends (kept alive by `p`).
Batches upload_batch(Pair& p, const Layout& l, const std::vector<int32_t>& positions, const std::vector<int32_t>& seqs,
                     const std::vector<int32_t>& slots, int64_t max_query_len, int64_t max_context_len) {
  const int64_t t = static_cast<int64_t>(positions.size());
  Both pos = p.i32(positions, {t}), sq = p.i32(seqs, {t}), sl = p.i32(slots, {t});
  Both tables = p.i32(l.block_tables, {l.seqs, l.stride});
  Batches b;
  for (auto [batch, which] : {std::pair{&b.cpu, 0}, std::pair{&b.dev, 1}}) {
    batch->positions = which ? pos.dev : pos.cpu;
    batch->token_seq = which ? sq.dev : sq.cpu;
    batch->slot_mapping = which ? sl.dev : sl.cpu;
    batch->block_tables = which ? tables.dev : tables.cpu;
    batch->block_size = l.block_size;
    batch->max_query_len = max_query_len;
    batch->max_context_len = max_context_len;
  }
  b.host_positions = std::make_shared<const std::vector<int32_t>>(positions);
  b.host_seqs = std::make_shared<const std::vector<int32_t>>(seqs);
  for (backend::AttentionBatch* batch : {&b.cpu, &b.dev}) {
    batch->host_positions = b.host_positions.get();
    batch->host_token_seq = b.host_seqs.get();
  }
  return b;
}

// The earlier context of a layout, written into both backends' caches as earlier steps would
// have (chunks of at most kWriteChunk; random K/V, the same on both).
// The earlier context of a layout in steps of at most kWriteChunk tokens: body(batch, tokens).
template <typename Body>
void for_each_history_chunk(Pair& p, const Layout& l, Body&& body) {
  const int64_t history = static_cast<int64_t>(l.history_slots.size());
  for (int64_t begin = 0; begin < history; begin += kWriteChunk) {
    const int64_t n = std::min(kWriteChunk, history - begin);
    auto part = [&](const std::vector<int32_t>& v) {
      return std::vector<int32_t>(v.begin() + begin, v.begin() + begin + n);
    };
    Batches b =
        upload_batch(p, l, part(l.history_positions), part(l.history_seq), part(l.history_slots), n,
                     l.history_positions[static_cast<size_t>(begin + n - 1)] + 1);
    body(b, n);
  }
}

void write_history(Harness& h, Case& c, Pair& p, const Layout& l, int64_t kv_heads,
                   int64_t head_dim, Tensor& cpu_k, Tensor& cpu_v, Tensor& dev_k, Tensor& dev_v) {
  const int64_t kv_row = kv_heads * head_dim;
  for_each_history_chunk(p, l, [&](Batches& b, int64_t n) {
    Both k = p.f32(random_floats(c.rng, n * kv_row, 1.7f), {n, kv_heads, head_dim});
    Both v = p.f32(random_floats(c.rng, n * kv_row, 1.7f), {n, kv_heads, head_dim});
    h.cpu.write_kv(k.cpu, v.cpu, cpu_k, cpu_v, b.cpu);
    h.device.write_kv(k.dev, v.dev, dev_k, dev_v, b.dev);
  });
}

// A case's layout: `kind`'s (decode with padding tokens, mixed shuffled) or, one_context > 0,
// one sequence of that context decoding one token, no padding: the step every split of the
// decode kernel serves (clustered on Hopper).
Layout case_layout(Harness& h, Case& c, Kind kind, int block_size, int64_t one_context = 0) {
  if (one_context > 0) return make_layout(c.rng, {{one_context, 1}}, block_size, 0, false);
  return make_layout(c.rng, specs_for(kind, c.rng, h.options.quick), block_size,
                     kind == Kind::kDecode ? 3 : 0, kind == Kind::kMixed);
}

void attention_case(Harness& h, Case& c, const HeadConfig& hc, Kind kind, int block_size,
                    const AttentionOptions& options = {}, int64_t one_context = 0) {
  const Layout l = case_layout(h, c, kind, block_size, one_context);
  const int64_t heads = hc.heads, kv_heads = hc.kv_heads, head_dim = hc.head_dim;
  const int64_t slots = l.num_blocks * block_size, kv_row = kv_heads * head_dim;
  Pair p(h);
  Tensor cpu_k = p.cpu.alloc(h.cpu.kv_cache_dtype(), {slots, kv_heads, head_dim});
  Tensor cpu_v = p.cpu.alloc(h.cpu.kv_cache_dtype(), {slots, kv_heads, head_dim});
  Tensor dev_k = p.dev.alloc(h.device.kv_cache_dtype(), {slots, kv_heads, head_dim});
  Tensor dev_v = p.dev.alloc(h.device.kv_cache_dtype(), {slots, kv_heads, head_dim});
  for (Tensor* t : {&cpu_k, &cpu_v}) p.cpu.zero(*t);
  for (Tensor* t : {&dev_k, &dev_v}) p.dev.zero(*t);

  // The earlier context, written as earlier steps would have (chunks of at most kWriteChunk).
  write_history(h, c, p, l, kv_heads, head_dim, cpu_k, cpu_v, dev_k, dev_v);

  // The step: write this step's K/V, then attend.
  const int64_t tokens = static_cast<int64_t>(l.positions.size());
  Batches b = upload_batch(p, l, l.positions, l.token_seq, l.slot_mapping, l.max_query_len, l.max_context_len);
  Both q = p.f32(random_floats(c.rng, tokens * heads * head_dim, 3.4f), {tokens, heads, head_dim});
  Both k = p.f32(random_floats(c.rng, tokens * kv_row, 1.7f), {tokens, kv_heads, head_dim});
  Both v = p.f32(random_floats(c.rng, tokens * kv_row, 1.7f), {tokens, kv_heads, head_dim});
  Both out = p.output({tokens, heads * head_dim});
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  // Sinks around the scores' own size (|q.k| * scale is a few units here), one very large: that
  // head's outputs shrink towards zero.
  std::vector<float> sink_values = random_floats(c.rng, heads, 4.0f);
  sink_values[0] = 30.0f;
  Both sinks = p.f32(sink_values, {heads});
  for (auto [batch, sink] : {std::pair{&b.cpu, &sinks.cpu}, std::pair{&b.dev, &sinks.dev}}) {
    batch->sliding_window = options.window;
    batch->sinks = options.sinks ? sink : nullptr;
  }
  h.cpu.write_kv(k.cpu, v.cpu, cpu_k, cpu_v, b.cpu);
  h.cpu.attention(q.cpu, cpu_k, cpu_v, b.cpu, scale, out.cpu);
  h.device.write_kv(k.dev, v.dev, dev_k, dev_v, b.dev);
  h.device.attention(q.dev, dev_k, dev_v, b.dev, scale, out.dev);

  // Padding tokens' outputs are nobody's business; every real token's must match.
  const Metrics m = compare(to_host(h.device, out.dev), to_host(h.cpu, out.cpu), heads * head_dim, &l.real);
  c.check("out", m, kAttentionTol);
  // The whole cache: every written slot equal (up to the cache dtype), padding never written.
  c.check("k_cache", compare(to_host(h.device, dev_k), to_host(h.cpu, cpu_k), kv_row), kCacheTol);
  c.check("v_cache", compare(to_host(h.device, dev_v), to_host(h.cpu, cpu_v), kv_row), kCacheTol);
  if (m.worst_row >= 0 && c.failed()) {
    const int32_t s = l.token_seq[static_cast<size_t>(m.worst_row)];
    c.info(fmt::format("worst token {} (seq {}, position {})", m.worst_row, s, l.positions[static_cast<size_t>(m.worst_row)]));
  }
  c.info(fmt::format("{} tokens, {} seqs, max_query_len {}, max_context_len {}, {} blocks", tokens, l.seqs,
                     l.max_query_len, l.max_context_len, l.num_blocks));
}

// q/k norm + RoPE + cache write as one op (the device fuses it; the CPU composes rms_norm, rope
// and write_kv): q and k in place and both caches, with padding slots (-1) never written.
void qk_prep_case(Harness& h, Case& c, const HeadConfig& hc, int64_t tokens, bool norms, int64_t rotary = 0,
                  bool yarn = false) {
  const int64_t heads = hc.heads, kv_heads = hc.kv_heads, head_dim = hc.head_dim;
  const int block_size = 16;
  const int64_t slots = (tokens + 8) * 2, kv_row = kv_heads * head_dim;
  std::vector<int32_t> positions(static_cast<size_t>(tokens)), slot_mapping(static_cast<size_t>(tokens));
  std::vector<int32_t> free_slots(static_cast<size_t>(slots));
  std::iota(free_slots.begin(), free_slots.end(), 0);
  c.rng.shuffle(free_slots);
  for (int64_t t = 0; t < tokens; ++t) {
    positions[static_cast<size_t>(t)] = static_cast<int32_t>(c.rng.between(0, 40000));
    slot_mapping[static_cast<size_t>(t)] = c.rng.below(5) == 0 ? -1 : free_slots[static_cast<size_t>(t)];
  }
  positions.front() = 0;
  Pair p(h);
  Layout l;
  l.block_size = block_size;
  l.seqs = 1, l.stride = 1, l.block_tables = {0};
  Batches b = upload_batch(p, l, positions, std::vector<int32_t>(static_cast<size_t>(tokens), 0), slot_mapping,
                           tokens, *std::max_element(positions.begin(), positions.end()) + 1);
  Tensor cpu_k = p.cpu.alloc(h.cpu.kv_cache_dtype(), {slots, kv_heads, head_dim});
  Tensor cpu_v = p.cpu.alloc(h.cpu.kv_cache_dtype(), {slots, kv_heads, head_dim});
  Tensor dev_k = p.dev.alloc(h.device.kv_cache_dtype(), {slots, kv_heads, head_dim});
  Tensor dev_v = p.dev.alloc(h.device.kv_cache_dtype(), {slots, kv_heads, head_dim});
  for (Tensor* t : {&cpu_k, &cpu_v}) p.cpu.zero(*t);
  for (Tensor* t : {&dev_k, &dev_v}) p.dev.zero(*t);
  Both q = p.f32(random_floats(c.rng, tokens * heads * head_dim, 3.0f), {tokens, heads, head_dim});
  Both k = p.f32(random_floats(c.rng, tokens * kv_row, 3.0f), {tokens, kv_heads, head_dim});
  Both v = p.f32(random_floats(c.rng, tokens * kv_row, 1.7f), {tokens, kv_heads, head_dim});
  HostTensor qn = host_random(h.cpu, DType::kF32, {head_dim}, c.rng.next(), 0.5f, 1.0f);
  HostTensor kn = host_random(h.cpu, DType::kF32, {head_dim}, c.rng.next(), 0.5f, 1.0f);
  Both q_norm = p.weight(qn.view), k_norm = p.weight(kn.view);
  backend::RopeSpec spec{1e6, rotary ? rotary : head_dim};
  std::vector<float> inv_freq(static_cast<size_t>(head_dim / 2));
  for (size_t i = 0; i < inv_freq.size(); ++i)
    inv_freq[i] = static_cast<float>(std::pow(1e4, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim)) /
                                     (i >= inv_freq.size() / 2 ? 8.0 : 1.0));
  if (yarn) {
    spec.inv_freq = inv_freq.data();
    spec.attention_factor = 1.2079f;
  }
  h.cpu.qk_norm_rope_write_kv(q.cpu, k.cpu, v.cpu, norms ? &q_norm.cpu : nullptr, norms ? &k_norm.cpu : nullptr,
                              1e-6f, b.cpu, spec, cpu_k, cpu_v);
  h.device.qk_norm_rope_write_kv(q.dev, k.dev, v.dev, norms ? &q_norm.dev : nullptr, norms ? &k_norm.dev : nullptr,
                                 1e-6f, b.dev, spec, dev_k, dev_v);
  c.check("q", compare(to_host(h.device, q.dev), to_host(h.cpu, q.cpu), heads * head_dim), kPrepTol);
  c.check("k", compare(to_host(h.device, k.dev), to_host(h.cpu, k.cpu), kv_row), kPrepTol);
  c.check("k_cache", compare(to_host(h.device, dev_k), to_host(h.cpu, cpu_k), kv_row), kCacheTol);
  c.check("v_cache", compare(to_host(h.device, dev_v), to_host(h.cpu, cpu_v), kv_row), kCacheTol);
}

// The decode attention with the q/k prep fused (qk_prep_attention): bitwise the device's own
// qk_norm_rope_write_kv then attention, on every real token's output and on both caches
// (padding slots never written), over the decode layouts attention_case uses.
void prep_attention_case(Harness& h, Case& c, const HeadConfig& hc, int block_size, bool norms,
                         int64_t one_context = 0, const AttentionOptions& options = {}) {
  const Layout l = case_layout(h, c, Kind::kDecode, block_size, one_context);
  const int64_t heads = hc.heads, kv_heads = hc.kv_heads, head_dim = hc.head_dim;
  const int64_t slots = l.num_blocks * block_size, kv_row = kv_heads * head_dim;
  Backend& dev = h.device;
  Buffers buffers(dev);
  Tensor caches[2][2];  // [unfused, fused][k, v]
  for (auto& pair : caches)
    for (Tensor& t : pair) {
      t = buffers.alloc(dev.kv_cache_dtype(), {slots, kv_heads, head_dim});
      buffers.zero(t);
    }
  const int64_t history = static_cast<int64_t>(l.history_slots.size());
  Pair p(h);
  for (int64_t begin = 0; begin < history; begin += kWriteChunk) {
    const int64_t n = std::min(kWriteChunk, history - begin);
    auto part = [&](const std::vector<int32_t>& v) {
      return std::vector<int32_t>(v.begin() + begin, v.begin() + begin + n);
    };
    Batches b = upload_batch(p, l, part(l.history_positions), part(l.history_seq), part(l.history_slots), n,
                             l.history_positions[static_cast<size_t>(begin + n - 1)] + 1);
    Tensor k = buffers.f32(random_floats(c.rng, n * kv_row, 1.7f), {n, kv_heads, head_dim});
    Tensor v = buffers.f32(random_floats(c.rng, n * kv_row, 1.7f), {n, kv_heads, head_dim});
    for (auto& pair : caches) dev.write_kv(k, v, pair[0], pair[1], b.dev);
  }
  const int64_t tokens = static_cast<int64_t>(l.positions.size());
  Batches b = upload_batch(p, l, l.positions, l.token_seq, l.slot_mapping, l.max_query_len, l.max_context_len);
  const std::vector<float> q_host = random_floats(c.rng, tokens * heads * head_dim, 3.0f);
  const std::vector<float> k_host = random_floats(c.rng, tokens * kv_row, 3.0f);
  Tensor v = buffers.f32(random_floats(c.rng, tokens * kv_row, 1.7f), {tokens, kv_heads, head_dim});
  HostTensor qn = host_random(h.cpu, DType::kF32, {head_dim}, c.rng.next(), 0.5f, 1.0f);
  HostTensor kn = host_random(h.cpu, DType::kF32, {head_dim}, c.rng.next(), 0.5f, 1.0f);
  Tensor q_norm = buffers.weight(qn.view), k_norm = buffers.weight(kn.view);
  const Tensor* qn_ptr = norms ? &q_norm : nullptr;
  const Tensor* kn_ptr = norms ? &k_norm : nullptr;
  const backend::RopeSpec spec{1e6, head_dim};
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  std::vector<float> sink_values = random_floats(c.rng, heads, 4.0f);
  sink_values[0] = 30.0f;
  Tensor sinks = buffers.f32(sink_values, {heads});
  b.dev.sliding_window = options.window;
  b.dev.sinks = options.sinks ? &sinks : nullptr;
  Tensor out[2];
  for (int fused = 0; fused < 2; ++fused) {
    Tensor q = buffers.f32(q_host, {tokens, heads, head_dim}), k = buffers.f32(k_host, {tokens, kv_heads, head_dim});
    out[fused] = buffers.alloc(DType::kF32, {tokens, heads * head_dim});
    buffers.poison(out[fused]);
    Tensor& kc = caches[fused][0];
    Tensor& vc = caches[fused][1];
    if (fused) {
      const bool did = dev.qk_prep_attention(q, k, v, qn_ptr, kn_ptr, 1e-6f, b.dev, spec, kc, vc, scale, out[1]);
      // (the CPU never fuses; the device leaves sliding-window layers to the two kernels: fused,
      // they were bitwise the same but ~20 µs a gpt-oss step slower on an H100, session 33)
      const bool expect = !h.options.reference_as_device && options.window == 0;
      if (!c.expect(did == expect, fmt::format("fused: {}, expected {}", did, expect)) || !did) return;
    } else {
      dev.qk_norm_rope_write_kv(q, k, v, qn_ptr, kn_ptr, 1e-6f, b.dev, spec, kc, vc);
      dev.attention(q, kc, vc, b.dev, scale, out[0]);
    }
  }
  c.check("out = unfused", compare(to_host(dev, out[1]), to_host(dev, out[0]), heads * head_dim, &l.real), 0.0);
  c.check("k_cache = unfused", compare(to_host(dev, caches[1][0]), to_host(dev, caches[0][0]), kv_row), 0.0);
  c.check("v_cache = unfused", compare(to_host(dev, caches[1][1]), to_host(dev, caches[0][1]), kv_row), 0.0);
  c.info(fmt::format("{} tokens, {} seqs, max_context_len {}", tokens, l.seqs, l.max_context_len));
}

// Qwen3.5's gated attention: query and output gate interleaved per head in q_gate, q/k norms,
// partial rotary, the cache write, attention and the sigmoid gate, on the attention layouts
// (the CPU's op is verified against transformers; the device composes its own ops).
void gated_attention_case(Harness& h, Case& c, const HeadConfig& hc, Kind kind, int block_size) {
  const Layout l = case_layout(h, c, kind, block_size);
  const int64_t heads = hc.heads, kv_heads = hc.kv_heads, head_dim = hc.head_dim;
  const int64_t slots = l.num_blocks * block_size, kv_row = kv_heads * head_dim;
  Pair p(h);
  Tensor cpu_k = p.cpu.alloc(h.cpu.kv_cache_dtype(), {slots, kv_heads, head_dim});
  Tensor cpu_v = p.cpu.alloc(h.cpu.kv_cache_dtype(), {slots, kv_heads, head_dim});
  Tensor dev_k = p.dev.alloc(h.device.kv_cache_dtype(), {slots, kv_heads, head_dim});
  Tensor dev_v = p.dev.alloc(h.device.kv_cache_dtype(), {slots, kv_heads, head_dim});
  for (Tensor* t : {&cpu_k, &cpu_v}) p.cpu.zero(*t);
  for (Tensor* t : {&dev_k, &dev_v}) p.dev.zero(*t);
  write_history(h, c, p, l, kv_heads, head_dim, cpu_k, cpu_v, dev_k, dev_v);
  const int64_t tokens = static_cast<int64_t>(l.positions.size());
  Batches b = upload_batch(p, l, l.positions, l.token_seq, l.slot_mapping, l.max_query_len,
                           l.max_context_len);
  Both q_gate = p.f32(random_floats(c.rng, tokens * heads * 2 * head_dim, 3.0f),
                      {tokens, heads, 2 * head_dim});
  Both q = p.output({tokens, heads, head_dim});  // written by the op (the query part of q_gate)
  Both k = p.f32(random_floats(c.rng, tokens * kv_row, 3.0f), {tokens, kv_heads, head_dim});
  Both v = p.f32(random_floats(c.rng, tokens * kv_row, 1.7f), {tokens, kv_heads, head_dim});
  Both out = p.output({tokens, heads * head_dim});
  HostTensor qn = host_random(h.cpu, DType::kF32, {head_dim}, c.rng.next(), 0.5f, 1.0f);
  HostTensor kn = host_random(h.cpu, DType::kF32, {head_dim}, c.rng.next(), 0.5f, 1.0f);
  Both q_norm = p.weight(qn.view), k_norm = p.weight(kn.view);
  const backend::RopeSpec rope{1e7, head_dim / 4 * 2};  // Qwen3.5: partial_rotary_factor 0.25
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  h.cpu.gated_attention(q_gate.cpu, q.cpu, k.cpu, v.cpu, q_norm.cpu, k_norm.cpu, 1e-6f, b.cpu, rope,
                        cpu_k, cpu_v, scale, out.cpu);
  h.device.gated_attention(q_gate.dev, q.dev, k.dev, v.dev, q_norm.dev, k_norm.dev, 1e-6f, b.dev,
                           rope, dev_k, dev_v, scale, out.dev);
  c.check("out",
          compare(to_host(h.device, out.dev), to_host(h.cpu, out.cpu), heads * head_dim, &l.real),
          kAttentionTol);
  c.check("k_cache", compare(to_host(h.device, dev_k), to_host(h.cpu, cpu_k), kv_row), kCacheTol);
  c.check("v_cache", compare(to_host(h.device, dev_v), to_host(h.cpu, cpu_v), kv_row), kCacheTol);
  c.info(fmt::format("{} tokens, {} seqs, rotary {}", tokens, l.seqs, rope.head_dim));
}

// DeepSeek-V3's multi-head latent attention (the device absorbs the up-projections as the CPU
// does; the CPU's op is verified against transformers): earlier context written by the op itself
// in chunks, then the step. Checked: every real token's output, the roped q and the normed and
// roped latent rows (in place), and the whole cache (f32 on the CPU, bf16 on the device).
struct LatentConfig {
  int64_t heads, lora, nope, rope, v_dim;
  bool interleave, yarn;
};

void latent_attention_case(Harness& h, Case& c, const LatentConfig& lc, Kind kind, int block_size) {
  const Layout l = case_layout(h, c, kind, block_size);
  const int64_t heads = lc.heads, row = lc.lora + lc.rope, q_row = lc.nope + lc.rope;
  const int64_t slots = l.num_blocks * block_size;
  Pair p(h);
  Tensor cpu_cache = p.cpu.alloc(h.cpu.kv_cache_dtype(), {slots, 1, row});
  Tensor dev_cache = p.dev.alloc(h.device.kv_cache_dtype(), {slots, 1, row});
  p.cpu.zero(cpu_cache);
  p.dev.zero(dev_cache);
  HostTensor norm_host = host_random(h.cpu, DType::kF32, {lc.lora}, c.rng.next(), 0.5f, 1.0f);
  HostTensor kv_b_host = host_random(h.cpu, DType::kBF16, {heads * (lc.nope + lc.v_dim), lc.lora},
                                     c.rng.next(), std::sqrt(3.0f / static_cast<float>(lc.lora)));
  Both kv_norm = p.weight(norm_host.view), kv_b = p.weight(kv_b_host.view);
  backend::RopeSpec rope{1e4, lc.rope};
  std::vector<float> inv_freq(static_cast<size_t>(lc.rope / 2));
  for (size_t i = 0; i < inv_freq.size(); ++i)
    inv_freq[i] = static_cast<float>(
        std::pow(1e4, -2.0 * static_cast<double>(i) / static_cast<double>(lc.rope)) /
        (i >= inv_freq.size() / 2 ? 40.0 : 1.0));
  if (lc.yarn) {
    rope.inv_freq = inv_freq.data();
    rope.attention_factor = 1.37f;
  }
  const backend::Backend::LatentShape shape{lc.lora, lc.nope, lc.rope, lc.v_dim, lc.interleave};
  const float scale = 0.8f / std::sqrt(static_cast<float>(q_row));
  auto run_both = [&](Batches& b, Both& q, Both& latent, Both& out) {
    h.cpu.latent_attention(q.cpu, latent.cpu, kv_norm.cpu, 1e-6f, kv_b.cpu, shape, b.cpu, rope,
                           cpu_cache, scale, out.cpu);
    h.device.latent_attention(q.dev, latent.dev, kv_norm.dev, 1e-6f, kv_b.dev, shape, b.dev, rope,
                              dev_cache, scale, out.dev);
  };
  for_each_history_chunk(p, l, [&](Batches& b, int64_t n) {
    Both q = p.f32(random_floats(c.rng, n * heads * q_row, 2.0f), {n, heads, q_row});
    Both latent = p.f32(random_floats(c.rng, n * row, 2.0f), {n, row});
    Both out = p.output({n, heads * lc.v_dim});
    run_both(b, q, latent, out);
  });
  const int64_t tokens = static_cast<int64_t>(l.positions.size());
  Batches b = upload_batch(p, l, l.positions, l.token_seq, l.slot_mapping, l.max_query_len,
                           l.max_context_len);
  Both q = p.f32(random_floats(c.rng, tokens * heads * q_row, 2.0f), {tokens, heads, q_row});
  Both latent = p.f32(random_floats(c.rng, tokens * row, 2.0f), {tokens, row});
  Both out = p.output({tokens, heads * lc.v_dim});
  run_both(b, q, latent, out);
  c.check("out",
          compare(to_host(h.device, out.dev), to_host(h.cpu, out.cpu), heads * lc.v_dim, &l.real),
          kAttentionTol);
  c.check("q (roped)", compare(to_host(h.device, q.dev), to_host(h.cpu, q.cpu), heads * q_row),
          kPrepTol);
  c.check("latent (normed, roped)",
          compare(to_host(h.device, latent.dev), to_host(h.cpu, latent.cpu), row), kPrepTol);
  c.check("cache", compare(to_host(h.device, dev_cache), to_host(h.cpu, cpu_cache), row),
          kCacheTol);
  c.info(fmt::format("{} tokens, {} seqs, max_context_len {}", tokens, l.seqs, l.max_context_len));
}

}  // namespace

void run_attention_ops(Harness& h) {
  // The golden model's MLA (3 heads, latent 24, 12 nope + 10 rope, v 14, YaRN) and
  // DeepSeek-V3/Moonlight's (latent 512, 128 nope + 64 rope, v 128; 16 heads here); 20 heads of
  // latent 64 + rope 32: the tensor-core decode kernel with a partial second group of heads (16 +
  // 4) and the expanded prefill in groups of 10.
  for (const LatentConfig& lc : std::vector<LatentConfig>{{3, 24, 12, 10, 14, true, true},
                                                          {16, 512, 128, 64, 128, true, false},
                                                          {5, 40, 8, 16, 24, false, false},
                                                          {20, 64, 16, 32, 24, false, true}})
    for (auto [kind, block_size] : std::vector<std::pair<Kind, int>>{
             {Kind::kDecode, 16}, {Kind::kPrefill, 16}, {Kind::kChunked, 5}, {Kind::kMixed, 16}})
      h.run(std::string("latent_attention.") + kind_name(kind),
            fmt::format("heads={} lora={} nope={} rope={} v={}{}{} block={}", lc.heads, lc.lora,
                        lc.nope, lc.rope, lc.v_dim, lc.interleave ? " interleaved" : "",
                        lc.yarn ? " yarn" : "", block_size),
            [&](Case& c) { latent_attention_case(h, c, lc, kind, block_size); });
  for (const HeadConfig& hc : std::vector<HeadConfig>{{16, 2, 256}, {4, 2, 20}, {6, 3, 12}})
    for (auto [kind, block_size] : std::vector<std::pair<Kind, int>>{
             {Kind::kDecode, 16}, {Kind::kPrefill, 16}, {Kind::kChunked, 5}, {Kind::kMixed, 16}})
      h.run(std::string("gated_attention.") + kind_name(kind),
            fmt::format("heads={}/{} head_dim={} block={}", hc.heads, hc.kv_heads, hc.head_dim,
                        block_size),
            [&](Case& c) { gated_attention_case(h, c, hc, kind, block_size); });
  for (const HeadConfig& hc : std::vector<HeadConfig>{{32, 4, 128}, {6, 2, 200}, {8, 8, 64}, {4, 1, 256}, {5, 5, 72}})
    for (int64_t tokens : {int64_t{1}, int64_t{7}, int64_t{300}})
      for (bool norms : {true, false})
        h.run("qk_norm_rope_write_kv",
              fmt::format("T={} heads={}/{} head_dim={}{}", tokens, hc.heads, hc.kv_heads, hc.head_dim,
                          norms ? " q/k norms" : ""),
              [&](Case& c) { qk_prep_case(h, c, hc, tokens, norms); });
  // YaRN frequencies and factor (gpt-oss), partial rotary (GLM: the composition on CUDA).
  for (const HeadConfig& hc : std::vector<HeadConfig>{{8, 8, 64}, {5, 1, 24}, {4, 2, 20}, {4, 2, 18}})
    for (auto [rotary, yarn] : std::vector<std::pair<int64_t, bool>>{{0, true}, {hc.head_dim / 4 * 2, false}})
      h.run("qk_norm_rope_write_kv",
            fmt::format("T=37 heads={}/{} head_dim={} q/k norms{}", hc.heads, hc.kv_heads, hc.head_dim,
                        yarn ? " yarn" : fmt::format(" rotary={}", rotary)),
            [&](Case& c) { qk_prep_case(h, c, hc, 37, true, rotary, yarn); });
  // The largest heads * head_dim first: a backend that sizes decode scratch on first use sees
  // its largest need first (the engine never changes it within a run).
  std::vector<HeadConfig> configs = {{32, 4, 128}, {6, 2, 200}, {8, 8, 64}};
  std::vector<std::pair<Kind, int>> kinds = {{Kind::kDecode, 16},  {Kind::kDecode, 5},  {Kind::kPrefill, 16},
                                             {Kind::kChunked, 16}, {Kind::kChunked, 5}, {Kind::kMixed, 16},
                                             {Kind::kMixed, 5}};
  if (h.options.quick) {
    configs = {{32, 4, 128}, {6, 2, 200}};
    kinds = {{Kind::kDecode, 16}, {Kind::kPrefill, 16}, {Kind::kChunked, 5}, {Kind::kMixed, 16}};
  }
  for (const HeadConfig& hc : std::vector<HeadConfig>{{32, 4, 128}, {6, 2, 200}, {8, 8, 64}, {4, 1, 256}, {5, 5, 72}})
    for (int block_size : {16, 5})
      for (bool norms : {true, false})
        h.run("qk_prep_attention",
              fmt::format("heads={}/{} head_dim={} block={}{}", hc.heads, hc.kv_heads, hc.head_dim, block_size,
                          norms ? " q/k norms" : ""),
              [&](Case& c) { prep_attention_case(h, c, hc, block_size, norms); });
  for (const HeadConfig& hc : configs)
    for (auto [kind, block_size] : kinds)
      h.run(std::string("attention.") + kind_name(kind),
            fmt::format("heads={}/{} head_dim={} block={}", hc.heads, hc.kv_heads, hc.head_dim, block_size),
            [&](Case& c) { attention_case(h, c, hc, kind, block_size); });
  // One token of one sequence: the decode kernel's widest split (16+ splits a kv head: clusters
  // of 16 on Hopper, one cluster up to 4,096 keys, a global merge of clusters beyond), with and
  // without the fused q/k prep, windows and sinks.
  for (const HeadConfig& hc : std::vector<HeadConfig>{{32, 4, 128}, {8, 8, 64}, {4, 1, 256}})
    for (int64_t context : {1, 17, 1025, 4096, 4097, 9000})
      h.run("attention.decode-one",
            fmt::format("heads={}/{} head_dim={} context={}", hc.heads, hc.kv_heads, hc.head_dim,
                        context),
            [&](Case& c) { attention_case(h, c, hc, Kind::kDecode, 16, {}, context); });
  for (const HeadConfig& hc : std::vector<HeadConfig>{{32, 4, 128}, {8, 8, 64}})
    for (const AttentionOptions& o :
         std::vector<AttentionOptions>{{24, true}, {200, false}, {0, true}})
      for (int64_t context : {300, 9000})
        h.run("attention.decode-one",
              fmt::format("heads={}/{} head_dim={} context={}{}", hc.heads, hc.kv_heads,
                          hc.head_dim, context, o.text()),
              [&](Case& c) { attention_case(h, c, hc, Kind::kDecode, 16, o, context); });
  for (const HeadConfig& hc : std::vector<HeadConfig>{{32, 4, 128}, {4, 1, 256}})
    for (int64_t context : {1025, 9000})
      h.run("qk_prep_attention",
            fmt::format("heads={}/{} head_dim={} one token, context={} q/k norms", hc.heads,
                        hc.kv_heads, hc.head_dim, context),
            [&](Case& c) { prep_attention_case(h, c, hc, 16, true, context); });
  // gpt-oss's sliding layers' options (window 128; a window inside one key tile; sinks), several
  // tokens and one long context: the device leaves them unfused (session 33's A/B), checked here.
  for (const HeadConfig& hc : std::vector<HeadConfig>{{8, 8, 64}, {32, 4, 128}})
    for (const AttentionOptions& o :
         std::vector<AttentionOptions>{{128, true}, {24, true}, {37, false}})
      for (int64_t context : {int64_t{0}, int64_t{4097}})
        h.run("qk_prep_attention",
              fmt::format("heads={}/{} head_dim={}{}{}", hc.heads, hc.kv_heads, hc.head_dim,
                          context ? fmt::format(" one token, context={}", context) : "", o.text()),
              [&](Case& c) { prep_attention_case(h, c, hc, 16, true, context, o); });
  // Sliding windows (shorter than a key tile, several tiles, past every context; gpt-oss's window
  // of 24 with sinks) and sinks, on the tensor-core kernel and on the plain one (head widths that
  // are not multiples of 8: the golden models' 18 and 12).
  const std::vector<AttentionOptions> options = {{37, false}, {200, true}, {0, true}, {100000, false}, {24, true}};
  for (const HeadConfig& hc : std::vector<HeadConfig>{{32, 4, 128}, {8, 8, 64}, {5, 1, 24}, {4, 2, 18}, {6, 3, 12}})
    for (const AttentionOptions& o : options)
      for (auto [kind, block_size] : std::vector<std::pair<Kind, int>>{
               {Kind::kDecode, 16}, {Kind::kPrefill, 16}, {Kind::kChunked, 5}, {Kind::kMixed, 16}})
        h.run(std::string("attention.") + kind_name(kind),
              fmt::format("heads={}/{} head_dim={} block={}{}", hc.heads, hc.kv_heads, hc.head_dim, block_size,
                          o.text()),
              [&](Case& c) { attention_case(h, c, hc, kind, block_size, o); });
}

}  // namespace sy::harness
