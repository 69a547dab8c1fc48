// Graphs: a decode-shaped sequence of ops (embedding, norms, projections, RoPE, write_kv,
// attention, both MoE kernels with capture, dense MLP, logits) run inside run_graph(key, body)
// and eagerly, with different inputs uploaded between runs (other sequences, contexts and
// block tables): the recorded replays must equal eager execution on the same inputs.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "harness.h"
#include "moe/router.h"

namespace sy::harness {
namespace {

constexpr double kSameTol = 1e-6;  // replay vs eager: the same kernels on the same inputs

struct DecodeInputs {
  std::vector<int32_t> ids, positions, token_seq, slots, tables, logits_rows;
  int64_t max_context_len = 0;
};

struct Outputs {
  std::vector<float> logits, x, attn;
  std::vector<int32_t> sink;
};

void graph_case(Harness& h, Case& c) {
  Backend& dev = h.device;
  if (!dev.supports_graphs() && !h.options.reference_as_device) return c.skip("the device backend has no graphs");
  const int64_t T = 8, H = 256, heads = 4, kv_heads = 2, head_dim = 64, dense = 200, vocab = 1000;
  const int64_t E = 12, K = 3, I = 72, block_size = 16, stride = 64, max_context = 600;
  const float eps = 1e-6f;

  auto select = [&](const std::string& name) {
    auto k = h.device_kernels.select(h.device_kernel(name), {dev.device(), true, false});
    if (!k) throw std::runtime_error(k.message());
    return *k;
  };
  moe::ExpertsKernel* modular = select("cuda-modular");
  moe::ExpertsKernel* fused = select("cuda-fused");
  moe::RouterSpec spec;
  spec.num_experts = E;
  spec.top_k = K;
  spec.renormalize = true;
  for (moe::ExpertsKernel* k : {modular, fused}) {
    Status reserved = k->reserve(T, spec, H, I);
    if (!reserved) throw std::runtime_error(fmt::format("{}.reserve: {}", k->name(), reserved.message()));
  }

  // Weights (host tensors outlive the buffers: a CPU "device" keeps views).
  std::vector<HostTensor> host;
  Buffers b(dev);
  auto weight = [&](DType dtype, std::vector<int64_t> shape, float scale, float offset = 0.0f) {
    host.push_back(host_random(h.cpu, dtype, shape, c.rng.next(), scale, offset));
    return b.weight(host.back().view);
  };
  auto matrix = [&](int64_t out, int64_t in) { return weight(DType::kBF16, {out, in}, std::sqrt(3.0f / in)); };
  const Tensor embed = weight(DType::kBF16, {vocab, H}, 1.0f), wq = matrix(heads * head_dim, H),
               wk = matrix(kv_heads * head_dim, H), wv = matrix(kv_heads * head_dim, H),
               bq = weight(DType::kF32, {heads * head_dim}, 0.3f), wo = matrix(H, heads * head_dim),
               in_norm = weight(DType::kBF16, {H}, 0.3f, 1.0f), post_norm = weight(DType::kBF16, {H}, 0.3f, 1.0f),
               q_norm = weight(DType::kF32, {head_dim}, 0.3f, 1.0f), final_norm = weight(DType::kF32, {H}, 0.3f, 1.0f),
               gate = matrix(dense, H), up = matrix(dense, H), down = matrix(H, dense), lm_head = matrix(vocab, H);
  moe::MoeLayerWeights moe_w;
  moe_w.router = weight(DType::kBF16, {E, H}, 2.0f * std::sqrt(3.0f / H));
  moe_w.gate_up = weight(DType::kBF16, {E, 2 * I, H}, std::sqrt(3.0f / H));
  moe_w.down = weight(DType::kBF16, {E, H, I}, std::sqrt(3.0f / I));

  // Two decode steps' inputs over one block pool (disjoint blocks), each sequence with its
  // earlier context already in the cache.
  const int64_t blocks_per_step = T * ((max_context + block_size - 1) / block_size);
  const int64_t num_blocks = 2 * blocks_per_step + 3;
  std::vector<int32_t> pool(static_cast<size_t>(num_blocks));
  std::iota(pool.begin(), pool.end(), 0);
  c.rng.shuffle(pool);
  size_t next_block = 0;
  Tensor k_cache = b.alloc(dev.kv_cache_dtype(), {num_blocks * block_size, kv_heads, head_dim});
  Tensor v_cache = b.alloc(dev.kv_cache_dtype(), {num_blocks * block_size, kv_heads, head_dim});
  b.zero(k_cache);
  b.zero(v_cache);
  auto make_inputs = [&]() {
    DecodeInputs in;
    in.tables.assign(static_cast<size_t>(T * stride), 0);
    std::vector<int32_t> hist_slots, hist_positions, hist_seq;
    for (int64_t s = 0; s < T; ++s) {
      const int64_t context = s == 0 ? 1 : c.rng.between(2, max_context);
      for (int64_t blk = 0; blk < (context + block_size - 1) / block_size; ++blk)
        in.tables[static_cast<size_t>(s * stride + blk)] = pool[next_block++];
      auto slot = [&](int64_t p) {
        return in.tables[static_cast<size_t>(s * stride + p / block_size)] * static_cast<int32_t>(block_size) +
               static_cast<int32_t>(p % block_size);
      };
      for (int64_t p = 0; p + 1 < context; ++p) {
        hist_slots.push_back(slot(p));
        hist_positions.push_back(static_cast<int32_t>(p));
        hist_seq.push_back(static_cast<int32_t>(s));
      }
      in.ids.push_back(static_cast<int32_t>(c.rng.below(vocab)));
      in.positions.push_back(static_cast<int32_t>(context - 1));
      in.token_seq.push_back(static_cast<int32_t>(s));
      in.slots.push_back(slot(context - 1));
      in.logits_rows.push_back(static_cast<int32_t>(s));
      in.max_context_len = std::max(in.max_context_len, context);
    }
    // The history, written eagerly (chunks within the step limits).
    for (size_t begin = 0; begin < hist_slots.size(); begin += 1024) {
      const size_t end = std::min(hist_slots.size(), begin + 1024);
      const int64_t n = static_cast<int64_t>(end - begin);
      auto part = [&](const std::vector<int32_t>& v) { return std::vector<int32_t>(v.begin() + begin, v.begin() + end); };
      backend::AttentionBatch hb;
      hb.positions = b.i32(part(hist_positions), {n});
      hb.token_seq = b.i32(part(hist_seq), {n});
      hb.slot_mapping = b.i32(part(hist_slots), {n});
      hb.block_tables = b.i32(in.tables, {T, stride});
      hb.block_size = static_cast<int>(block_size);
      hb.max_query_len = n;
      hb.max_context_len = max_context;
      Tensor k = b.f32(random_floats(c.rng, n * kv_heads * head_dim, 1.7f), {n, kv_heads, head_dim});
      Tensor v = b.f32(random_floats(c.rng, n * kv_heads * head_dim, 1.7f), {n, kv_heads, head_dim});
      dev.write_kv(k, v, k_cache, v_cache, hb);
    }
    return in;
  };
  const DecodeInputs input_a = make_inputs(), input_b = make_inputs();

  // The step workspace: allocated once, stable addresses.
  Tensor ids = b.alloc(DType::kI32, {T}), positions = b.alloc(DType::kI32, {T}), token_seq = b.alloc(DType::kI32, {T}),
         slots = b.alloc(DType::kI32, {T}), tables = b.alloc(DType::kI32, {T, stride}),
         logits_rows = b.alloc(DType::kI32, {T});
  Tensor x = b.alloc(DType::kF32, {T, H}), normed = b.alloc(DType::kF32, {T, H}),
         q = b.alloc(DType::kF32, {T, heads, head_dim}), k = b.alloc(DType::kF32, {T, kv_heads, head_dim}),
         v = b.alloc(DType::kF32, {T, kv_heads, head_dim}), attn = b.alloc(DType::kF32, {T, heads * head_dim}),
         block_out = b.alloc(DType::kF32, {T, H}), moe_out = b.alloc(DType::kF32, {T, H}),
         g = b.alloc(DType::kF32, {T, dense}), u = b.alloc(DType::kF32, {T, dense}),
         picked = b.alloc(DType::kF32, {T, H}), picked_normed = b.alloc(DType::kF32, {T, H}),
         logits = b.alloc(DType::kF32, {T, vocab}), sink = b.alloc(DType::kI32, {T, 2, K});
  backend::AttentionBatch batch;
  batch.positions = positions;
  batch.token_seq = token_seq;
  batch.slot_mapping = slots;
  batch.block_tables = tables;
  batch.block_size = static_cast<int>(block_size);
  batch.max_query_len = 1;
  const backend::RopeSpec rope{1e6, head_dim};
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  Status moe_status = Status::ok();

  auto body = [&] {
    dev.embedding(embed, ids, x);
    dev.rms_norm(x, in_norm, eps, normed);
    dev.matmul(normed, wq, &bq, q);
    dev.matmul(normed, wk, nullptr, k);
    dev.matmul(normed, wv, nullptr, v);
    dev.rms_norm(q, q_norm, eps, q);
    dev.rope(q, batch, rope);
    dev.rope(k, batch, rope);
    dev.write_kv(k, v, k_cache, v_cache, batch);
    dev.attention(q, k_cache, v_cache, batch, scale, attn);
    dev.matmul(attn, wo, nullptr, block_out);
    dev.add_rms_norm(x, block_out, post_norm, eps, normed);
    dev.fill_i32(sink, moe::kRoutePoison);
    moe::MoeForwardArgs args;
    args.hidden = normed;
    args.weights = &moe_w;
    args.spec = spec;
    args.routes.sink = sink;
    for (int layer = 0; layer < 2; ++layer) {
      args.layer = layer;
      args.out = layer == 0 ? block_out : moe_out;
      Status status = (layer == 0 ? modular : fused)->forward(args);
      if (!status && moe_status) moe_status = status;
    }
    dev.add_inplace(x, block_out);
    dev.add_inplace(x, moe_out);
    dev.matmul(normed, gate, nullptr, g);
    dev.matmul(normed, up, nullptr, u);
    dev.silu_mul(g, u, g);
    dev.matmul(g, down, nullptr, block_out);
    dev.add_inplace(x, block_out);
    dev.gather_rows(x, logits_rows, picked);
    dev.rms_norm(picked, final_norm, eps, picked_normed);
    dev.matmul(picked_normed, lm_head, nullptr, logits);
  };
  // Graphs reference the workspace: dropped before the buffers are freed (also on a throw).
  struct ClearGraphs {
    Backend& backend;
    ~ClearGraphs() { backend.clear_graphs(); }
  } clear_graphs{dev};

  auto run = [&](const DecodeInputs& in, bool graph) {
    dev.upload(in.ids.data(), ids);
    dev.upload(in.positions.data(), positions);
    dev.upload(in.token_seq.data(), token_seq);
    dev.upload(in.slots.data(), slots);
    dev.upload(in.tables.data(), tables);
    dev.upload(in.logits_rows.data(), logits_rows);
    batch.max_context_len = in.max_context_len;  // a recorded decode step must not depend on it
    for (Tensor* t : {&x, &normed, &attn, &block_out, &moe_out, &logits}) b.poison(*t);
    if (graph) dev.run_graph(0x5eedull, body);
    else body();
    Outputs out;
    out.logits = to_host(dev, logits);
    out.x = to_host(dev, x);
    out.attn = to_host(dev, attn);
    out.sink = to_host_i32(dev, sink);
    return out;
  };
  auto same = [&](const char* what, const Outputs& graph, const Outputs& eager) {
    c.check(fmt::format("{} logits", what), compare(graph.logits, eager.logits, vocab), kSameTol);
    c.check(fmt::format("{} x", what), compare(graph.x, eager.x, H), kSameTol);
    c.check(fmt::format("{} attn", what), compare(graph.attn, eager.attn, heads * head_dim), kSameTol);
    if (graph.sink != eager.sink) c.fail(fmt::format("{}: routes differ from eager", what));
    for (int32_t id : graph.sink)
      if (id < 0 || id >= E) {
        c.fail(fmt::format("{}: route {} (poison left or invalid)", what, id));
        break;
      }
  };
  const Outputs eager_a = run(input_a, false);
  const Outputs graph_a = run(input_a, true);   // recorded
  const Outputs eager_b = run(input_b, false);
  const Outputs graph_b = run(input_b, true);   // replayed on new inputs
  const Outputs graph_a2 = run(input_a, true);  // and back
  if (!moe_status) c.fail("MoE forward in the body: " + moe_status.message());
  same("record (inputs A)", graph_a, eager_a);
  same("replay (inputs B)", graph_b, eager_b);
  same("replay (inputs A again)", graph_a2, eager_a);
  if (graph_b.logits == graph_a.logits) c.fail("the replay on inputs B returned the logits of inputs A");
  const bool bitwise = graph_a.logits == eager_a.logits && graph_b.logits == eager_b.logits &&
                       graph_a.x == eager_a.x && graph_b.x == eager_b.x;
  c.info(fmt::format("graph vs eager {}; max context A {} B {}", bitwise ? "bitwise equal" : "not bitwise equal",
                     input_a.max_context_len, input_b.max_context_len));
}

}  // namespace

void run_graph_ops(Harness& h) {
  h.run("graph", "decode T=8 H=256 heads=4/2 head_dim=64 moe E=12 K=3 (modular+fused)",
        [&](Case& c) { graph_case(h, c); });
}

}  // namespace sy::harness
