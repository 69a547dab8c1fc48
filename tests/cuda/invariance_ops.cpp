// --batch-invariant (BackendOptions::batch_invariant) on the device: a row's result does not
// depend on the rest of the step. matmul: a row computed alone, among 8 and among 300 rows gives
// the same bits (and matches the CPU); attention: a decode token alone and the same token in a
// mixed step (beside a prefill chunk of another sequence) give the same bits, with and without a
// sliding window; MoE (gpt-oss's MXFP4 experts on cuda-modular): a token's output and routes
// are the same bits in a step of 1 or 3 tokens (the few-token GEMVs' sizes by default) as among
// 16 and 40 (the register GEMM's by default; every size is the grouped GEMM's under
// --batch-invariant). The same checks run on the default backend as information only
// (it is allowed to differ; the line says whether it did).
#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <numeric>

#include "harness.h"
#include "moe/experts_kernel.h"
#include "moe/router.h"

namespace sy::harness {
namespace {

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Rows [begin, begin + count) of the full product, computed as a step of `count` rows.
std::vector<float> matmul_rows(Backend& backend, Buffers& buffers, const std::vector<float>& x, int64_t begin,
                               int64_t count, int64_t in, const Tensor& weight, int64_t out_features) {
  Tensor xs = buffers.f32(std::vector<float>(x.begin() + begin * in, x.begin() + (begin + count) * in), {count, in});
  Tensor out = buffers.alloc(DType::kF32, {count, out_features});
  buffers.poison(out);
  backend.matmul(xs, weight, nullptr, out);
  return to_host(backend, out);
}

void matmul_case(Harness& h, Case& c, Backend& dev, bool invariant, int64_t in, int64_t out_features) {
  const int64_t rows = 300;
  HostTensor w = host_random(h.cpu, DType::kBF16, {out_features, in}, c.rng.next(), 0.05f);
  const std::vector<float> x = random_floats(c.rng, rows * in, 1.0f);
  Buffers buffers(dev), cpu_buffers(h.cpu);
  Tensor weight = buffers.weight(w.view), cpu_weight = cpu_buffers.weight(w.view);
  const std::vector<float> all = matmul_rows(dev, buffers, x, 0, rows, in, weight, out_features);
  const std::vector<float> ref = matmul_rows(h.cpu, cpu_buffers, x, 0, rows, in, cpu_weight, out_features);
  // Compared per row, or as one block where a row is a handful of values (width 1: a row's own
  // scale is its one value, which cancellation can make arbitrarily small against bf16 rounding).
  c.check("300 rows vs cpu",
          compare(all, ref, out_features >= 8 ? out_features : rows * out_features), 1e-2);
  int64_t differing = 0, checked = 0;
  for (int64_t r : {int64_t{0}, int64_t{1}, int64_t{17}, int64_t{150}, int64_t{299}}) {
    for (int64_t count : {int64_t{1}, int64_t{8}}) {
      const int64_t begin = std::min(r, rows - count);
      const std::vector<float> part = matmul_rows(dev, buffers, x, begin, count, in, weight, out_features);
      const std::vector<float> same(all.begin() + begin * out_features, all.begin() + (begin + count) * out_features);
      ++checked;
      if (!bitwise_equal(part, same)) {
        ++differing;
        if (invariant) c.fail(fmt::format("rows [{}, {}) as a step of {} differ from the same rows among {}", begin,
                                          begin + count, count, rows));
      }
    }
  }
  c.info(fmt::format("{} of {} sub-steps differ bitwise from the full step{}", differing, checked,
                     invariant ? "" : " (default backend: information only)"));
}

// One decode token of sequence 0 (context `context`), alone and beside a prefill chunk of
// sequence 1, over the same cache.
void attention_case(Case& c, Backend& dev, bool invariant, int64_t window) {
  const int64_t heads = 8, kv_heads = 2, head_dim = 128, block = 16;
  const int64_t context = 700, other_history = 130, chunk = 77;
  const int64_t blocks0 = (context + block - 1) / block, blocks1 = (other_history + chunk + block - 1) / block;
  const int64_t stride = std::max(blocks0, blocks1), num_blocks = blocks0 + blocks1;
  std::vector<int32_t> tables(static_cast<size_t>(2 * stride), 0);
  std::vector<int32_t> pool(static_cast<size_t>(num_blocks));
  std::iota(pool.begin(), pool.end(), 0);
  c.rng.shuffle(pool);
  for (int64_t b = 0; b < blocks0; ++b) tables[static_cast<size_t>(b)] = pool[static_cast<size_t>(b)];
  for (int64_t b = 0; b < blocks1; ++b) tables[static_cast<size_t>(stride + b)] = pool[static_cast<size_t>(blocks0 + b)];
  auto slot = [&](int64_t s, int64_t p) {
    return tables[static_cast<size_t>(s * stride + p / block)] * static_cast<int32_t>(block) +
           static_cast<int32_t>(p % block);
  };
  Buffers buffers(dev);
  const int64_t slots = num_blocks * block, kv_row = kv_heads * head_dim;
  Tensor k_cache = buffers.alloc(dev.kv_cache_dtype(), {slots, kv_heads, head_dim});
  Tensor v_cache = buffers.alloc(dev.kv_cache_dtype(), {slots, kv_heads, head_dim});
  buffers.zero(k_cache);
  buffers.zero(v_cache);
  Tensor table = buffers.i32(tables, {2, stride});
  auto batch_of = [&](const std::vector<int32_t>& pos, const std::vector<int32_t>& seq, const std::vector<int32_t>& sl,
                      int64_t max_query_len) {
    backend::AttentionBatch b;
    const int64_t t = static_cast<int64_t>(pos.size());
    b.positions = buffers.i32(pos, {t});
    b.token_seq = buffers.i32(seq, {t});
    b.slot_mapping = buffers.i32(sl, {t});
    b.block_tables = table;
    b.block_size = static_cast<int>(block);
    b.max_query_len = max_query_len;
    b.max_context_len = *std::max_element(pos.begin(), pos.end()) + 1;
    b.sliding_window = window;
    return b;
  };
  // Every cached row (both sequences, the decode token's own and the chunk's too) written once.
  std::vector<int32_t> pos, seq, sl;
  for (int64_t p = 0; p < context; ++p) pos.push_back(static_cast<int32_t>(p)), seq.push_back(0), sl.push_back(slot(0, p));
  for (int64_t p = 0; p < other_history + chunk; ++p)
    pos.push_back(static_cast<int32_t>(p)), seq.push_back(1), sl.push_back(slot(1, p));
  const int64_t written = static_cast<int64_t>(pos.size());
  {
    backend::AttentionBatch b = batch_of(pos, seq, sl, written);
    Tensor k = buffers.f32(random_floats(c.rng, written * kv_row, 1.7f), {written, kv_heads, head_dim});
    Tensor v = buffers.f32(random_floats(c.rng, written * kv_row, 1.7f), {written, kv_heads, head_dim});
    dev.write_kv(k, v, k_cache, v_cache, b);
  }
  const std::vector<float> q_decode = random_floats(c.rng, heads * head_dim, 3.0f);
  const std::vector<float> q_chunk = random_floats(c.rng, chunk * heads * head_dim, 3.0f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  // Alone.
  std::vector<float> alone;
  {
    backend::AttentionBatch b = batch_of({static_cast<int32_t>(context - 1)}, {0}, {slot(0, context - 1)}, 1);
    Tensor q = buffers.f32(q_decode, {1, heads, head_dim});
    Tensor out = buffers.alloc(DType::kF32, {1, heads * head_dim});
    buffers.poison(out);
    dev.attention(q, k_cache, v_cache, b, scale, out);
    alone = to_host(dev, out);
  }
  // Mixed: the decode token first, then the other sequence's chunk (positions other_history..).
  std::vector<float> mixed;
  {
    std::vector<int32_t> mp = {static_cast<int32_t>(context - 1)}, ms = {0}, msl = {slot(0, context - 1)};
    for (int64_t i = 0; i < chunk; ++i)
      mp.push_back(static_cast<int32_t>(other_history + i)), ms.push_back(1), msl.push_back(slot(1, other_history + i));
    backend::AttentionBatch b = batch_of(mp, ms, msl, chunk);
    std::vector<float> q_all = q_decode;
    q_all.insert(q_all.end(), q_chunk.begin(), q_chunk.end());
    Tensor q = buffers.f32(q_all, {1 + chunk, heads, head_dim});
    Tensor out = buffers.alloc(DType::kF32, {1 + chunk, heads * head_dim});
    buffers.poison(out);
    dev.attention(q, k_cache, v_cache, b, scale, out);
    const std::vector<float> all = to_host(dev, out);
    mixed.assign(all.begin(), all.begin() + heads * head_dim);
  }
  const bool same = bitwise_equal(alone, mixed);
  c.check("alone vs mixed (close)", compare(alone, mixed, heads * head_dim), 1e-2);
  if (invariant && !same) c.fail("the decode token's output differs bitwise between its step alone and a mixed step");
  c.info(fmt::format("alone vs mixed: {}{}", same ? "bitwise equal" : "differ",
                     invariant ? "" : " (default backend: information only)"));
}

// gpt-oss's MoE layer (MXFP4 experts, expert biases, clamped SwiGLU, logit bias, softmax after
// top-k) on the backend's own cuda-modular: rows of a 40-token step recomputed as steps of 1, 3
// and 16 tokens.
void moe_case(Harness& h, Case& c, Backend& dev, bool invariant) {
  const int64_t H = 256, I = 128, E = 16, K = 4, rows = 40;
  moe::ExpertsKernelRegistry registry;
  dev.register_kernels(registry);
  auto kernel = registry.select(h.device_kernel("cuda-modular"), {dev.device(), true, false});
  if (!kernel) return c.fail(kernel.message());
  moe::RouterSpec spec;
  spec.num_experts = E;
  spec.top_k = K;
  spec.softmax_after_topk = true;
  spec.has_logit_bias = true;
  moe::ExpertSpec experts;
  experts.format = experts.stored = moe::ExpertFormat::kMxfp4Interleaved;
  experts.has_biases = true;
  experts.activation = moe::ExpertActivation::kClampedSwiGlu;
  experts.limit = 7.0f;
  if (Status st = (*kernel)->reserve(rows, spec, H, I); !st)
    return c.fail("reserve: " + st.message());
  auto bytes = [&](const std::vector<int64_t>& shape, int lo, int span) {
    HostTensor t(DType::kU8, shape);
    for (uint8_t& b : t.bytes) b = static_cast<uint8_t>(lo + static_cast<int>(c.rng.below(span)));
    return t;
  };
  // Block scales 2^-6..2^-4: weights ~0.01-0.4, as a checkpoint's.
  HostTensor gate_up = bytes({E, 2 * I, H / 32, 16}, 0, 256),
             down = bytes({E, H, I / 32, 16}, 0, 256);
  HostTensor gate_up_scales = bytes({E, 2 * I, H / 32}, 121, 3),
             down_scales = bytes({E, H, I / 32}, 122, 3);
  HostTensor router =
      host_random(h.cpu, DType::kBF16, {E, H}, c.rng.next(), 2.0f * std::sqrt(3.0f / H));
  HostTensor gate_up_bias = host_random(h.cpu, DType::kBF16, {E, 2 * I}, c.rng.next(), 0.5f);
  HostTensor down_bias = host_random(h.cpu, DType::kBF16, {E, H}, c.rng.next(), 0.5f);
  Buffers buffers(dev);
  moe::MoeLayerWeights w;
  w.router = buffers.weight(router.view);
  w.router_bias = buffers.f32(random_floats(c.rng, E, 1.5f), {E});
  w.gate_up = buffers.weight(gate_up.view);
  w.down = buffers.weight(down.view);
  w.gate_up_scales = buffers.weight(gate_up_scales.view);
  w.down_scales = buffers.weight(down_scales.view);
  w.gate_up_bias = buffers.weight(gate_up_bias.view);
  w.down_bias = buffers.weight(down_bias.view);
  const std::vector<float> x = random_floats(c.rng, rows * H, std::sqrt(3.0f));
  struct Step {
    std::vector<float> out;
    std::vector<int32_t> routes;
  };
  auto step = [&](int64_t begin, int64_t count, Step& got) {
    moe::MoeForwardArgs args;
    args.hidden = buffers.f32(
        std::vector<float>(x.begin() + begin * H, x.begin() + (begin + count) * H), {count, H});
    args.out = buffers.alloc(DType::kF32, {count, H});
    buffers.poison(args.out);
    args.routes.sink = buffers.alloc(DType::kI32, {count, 1, K});
    dev.fill_i32(args.routes.sink, moe::kRoutePoison);
    args.weights = &w;
    args.spec = spec;
    args.experts = experts;
    if (Status st = (*kernel)->forward(args); !st) return st;
    got.out = to_host(dev, args.out);
    got.routes = to_host_i32(dev, args.routes.sink);
    return Status::ok();
  };
  Step all;
  if (Status st = step(0, rows, all); !st) return c.fail(st.message());
  int64_t differing = 0, checked = 0;
  for (int64_t count : {int64_t{1}, int64_t{3}, int64_t{16}}) {
    for (int64_t r : {int64_t{0}, int64_t{5}, int64_t{21}, int64_t{39}}) {
      const int64_t begin = std::min(r, rows - count);
      Step part;
      if (Status st = step(begin, count, part); !st) return c.fail(st.message());
      const std::vector<float> same(all.out.begin() + begin * H,
                                    all.out.begin() + (begin + count) * H);
      const std::vector<int32_t> same_routes(all.routes.begin() + begin * K,
                                             all.routes.begin() + (begin + count) * K);
      c.check(fmt::format("rows [{}, {}) close", begin, begin + count), compare(part.out, same, H),
              1e-2);
      ++checked;
      if (!bitwise_equal(part.out, same) || part.routes != same_routes) {
        ++differing;
        if (invariant)
          c.fail(fmt::format(
              "rows [{}, {}) as a step of {} differ ({}) from the same rows among {}", begin,
              begin + count, count, part.routes != same_routes ? "routes" : "output bits", rows));
      }
    }
  }
  c.info(fmt::format("{} of {} sub-steps differ bitwise from the full step{}", differing, checked,
                     invariant ? "" : " (default backend: information only)"));
}

}  // namespace

void run_invariance_ops(Harness& h, Backend& invariant) {
  for (bool inv : {true, false}) {
    Backend& dev = inv ? invariant : h.device;
    const char* mode = inv ? "batch-invariant" : "default";
    // (out widths 1 and 10: a shared expert's gate and a router, which the invariant GEMM does not
    // take: the GEMV in chunks of 8 rows)
    for (auto [in, out] : std::vector<std::pair<int64_t, int64_t>>{
             {256, 512}, {2048, 768}, {72, 200}, {72, 1}, {256, 10}})
      h.run(fmt::format("invariance.matmul.{}", mode), fmt::format("in={} out={}", in, out),
            [&](Case& c) { matmul_case(h, c, dev, inv, in, out); });
    for (int64_t window : {int64_t{0}, int64_t{100}})
      h.run(fmt::format("invariance.attention.{}", mode), fmt::format("window={}", window),
            [&](Case& c) { attention_case(c, dev, inv, window); });
    h.run(fmt::format("invariance.moe.{}", mode), "gpt-oss MXFP4 experts H=256 I=128 E=16 K=4",
          [&](Case& c) { moe_case(h, c, dev, inv); });
  }
}

}  // namespace sy::harness
