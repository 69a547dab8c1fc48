#include "model/decoder.h"

#include <cmath>

#include "moe/router.h"

namespace sy::model {
namespace {

// Step-lifetime buffers, freed together.
class StepArena {
 public:
  explicit StepArena(backend::Backend& backend) : backend_(backend) {}
  ~StepArena() {
    for (Tensor& tensor : tensors_) backend_.free_buffer(tensor);
  }
  Tensor make(DType dtype, std::initializer_list<int64_t> shape) {
    tensors_.push_back(backend_.alloc(dtype, shape));
    return tensors_.back();
  }
  Tensor upload_i32(const std::vector<int32_t>& host) {
    Tensor tensor = make(DType::kI32, {static_cast<int64_t>(host.size())});
    if (!host.empty()) backend_.upload(host.data(), tensor);
    return tensor;
  }

 private:
  backend::Backend& backend_;
  std::vector<Tensor> tensors_;
};

}  // namespace

Decoder::Decoder(backend::Backend& backend, moe::ExpertsKernel& kernel, int block_size)
    : backend_(backend), kernel_(kernel), block_size_(block_size) {}

Decoder::~Decoder() {
  for (Tensor& tensor : k_cache_) backend_.free_buffer(tensor);
  for (Tensor& tensor : v_cache_) backend_.free_buffer(tensor);
  if (logits_.data) backend_.free_buffer(logits_);
}

void Decoder::allocate_kv_cache(const ModelConfig& config, int64_t num_blocks) {
  const int64_t slots = num_blocks * block_size_;
  // Zero-filled now, so the whole cache is resident from the start (as a GPU engine's would be):
  // memory use does not creep up later as the prefix cache reaches blocks never touched before.
  for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer) {
    for (auto* cache : {&k_cache_, &v_cache_}) {
      cache->push_back(backend_.alloc(DType::kF32, {slots, config.num_key_value_heads, config.head_dim}));
      backend_.fill_i32(cache->back(), 0);  // f32 zero has the same bits as i32 zero
    }
  }
}

Status Decoder::forward(const Model& model, const StepInputs& in, StepOutputs& out) {
  const ModelConfig& c = model.config();
  const DecoderWeights& w = model.weights();
  const int64_t tokens = static_cast<int64_t>(in.token_ids.size());
  const int64_t hidden = c.hidden_size, heads = c.num_attention_heads, kv_heads = c.num_key_value_heads;
  const int64_t head_dim = c.head_dim, layers = c.num_hidden_layers, top_k = c.experts_per_token;
  StepArena arena(backend_);

  backend::AttentionBatch batch;
  batch.positions = arena.upload_i32(in.positions);
  batch.token_seq = arena.upload_i32(in.token_seq);
  batch.slot_mapping = arena.upload_i32(in.slot_mapping);
  batch.block_tables = arena.upload_i32(in.block_tables);
  batch.block_tables = batch.block_tables.reshaped({in.num_seqs, in.max_blocks_per_seq});
  batch.block_size = block_size_;
  Tensor ids = arena.upload_i32(in.token_ids);

  moe::RouteBuffers routes;
  if (in.capture_routes && top_k > 0) {
    routes.sink = arena.make(DType::kI32, {tokens, layers, top_k});
    backend_.fill_i32(routes.sink, moe::kRoutePoison);
  }
  if (!in.forced.empty()) {
    routes.forced = arena.make(DType::kU8, {tokens});
    backend_.upload(in.forced.data(), routes.forced);
    routes.source = arena.upload_i32(in.forced_routes).reshaped({tokens, layers, top_k});
  }

  Tensor x = arena.make(DType::kF32, {tokens, hidden});
  Tensor normed = arena.make(DType::kF32, {tokens, hidden});
  Tensor q = arena.make(DType::kF32, {tokens, heads, head_dim});
  Tensor k = arena.make(DType::kF32, {tokens, kv_heads, head_dim});
  Tensor v = arena.make(DType::kF32, {tokens, kv_heads, head_dim});
  Tensor attn = arena.make(DType::kF32, {tokens, heads * head_dim});
  Tensor block_out = arena.make(DType::kF32, {tokens, hidden});
  const int64_t mlp_width = std::max(c.intermediate_size, int64_t{1});
  Tensor gate = arena.make(DType::kF32, {tokens, mlp_width});
  Tensor up = arena.make(DType::kF32, {tokens, mlp_width});
  const backend::RopeSpec rope{c.rope_theta, head_dim};
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));

  backend_.embedding(w.embed_tokens, ids, x);
  for (int64_t layer = 0; layer < layers; ++layer) {
    const LayerWeights& lw = w.layers[static_cast<size_t>(layer)];
    const AttentionWeights& a = lw.attention;
    // Attention block.
    backend_.rms_norm(x, lw.input_norm, c.rms_norm_eps, normed);
    backend_.matmul(normed, a.q_proj, a.q_bias.data ? &a.q_bias : nullptr, q);
    backend_.matmul(normed, a.k_proj, a.k_bias.data ? &a.k_bias : nullptr, k);
    backend_.matmul(normed, a.v_proj, a.v_bias.data ? &a.v_bias : nullptr, v);
    if (a.q_norm.data) backend_.rms_norm(q, a.q_norm, c.rms_norm_eps, q);
    if (a.k_norm.data) backend_.rms_norm(k, a.k_norm, c.rms_norm_eps, k);
    backend_.rope(q, batch, rope);
    backend_.rope(k, batch, rope);
    backend_.write_kv(k, v, k_cache_[layer], v_cache_[layer], batch);
    backend_.attention(q, k_cache_[layer], v_cache_[layer], batch, scale, attn);
    backend_.matmul(attn, a.o_proj, a.o_bias.data ? &a.o_bias : nullptr, block_out);
    backend_.add_inplace(x, block_out);
    // Feed-forward block: dense MLP or MoE.
    backend_.rms_norm(x, lw.post_attention_norm, c.rms_norm_eps, normed);
    if (lw.is_moe) {
      moe::MoeForwardArgs args;
      args.layer = static_cast<int>(layer);
      args.hidden = normed;
      args.out = block_out;
      args.weights = &lw.moe;
      args.spec = c.router_spec();
      args.routes = routes;
      SY_TRY(kernel_.forward(args).with_context(
          fmt::format("MoE layer {} (kernel {}): ", layer, kernel_.name())));
    } else {
      Tensor g = gate.reshaped({tokens, c.intermediate_size});
      Tensor u = up.reshaped({tokens, c.intermediate_size});
      backend_.matmul(normed, lw.mlp.gate_proj, nullptr, g);
      backend_.matmul(normed, lw.mlp.up_proj, nullptr, u);
      backend_.silu_mul(g, u, g);
      backend_.matmul(g, lw.mlp.down_proj, nullptr, block_out);
    }
    backend_.add_inplace(x, block_out);
  }

  // Logits for the requested rows only.
  const int64_t rows = static_cast<int64_t>(in.logits_rows.size());
  if (logits_.data && logits_.dim(0) < rows) backend_.free_buffer(logits_);
  if (!logits_.data) logits_ = backend_.alloc(DType::kF32, {std::max<int64_t>(rows, 1), c.vocab_size});
  out.logits = logits_.slice_rows(0, rows);
  if (rows > 0) {
    Tensor picked = arena.make(DType::kF32, {rows, hidden});
    Tensor picked_normed = arena.make(DType::kF32, {rows, hidden});
    Tensor row_index = arena.upload_i32(in.logits_rows);
    backend_.gather_rows(x, row_index, picked);
    backend_.rms_norm(picked, w.final_norm, c.rms_norm_eps, picked_normed);
    backend_.matmul(picked_normed, w.lm_head, nullptr, out.logits);
  }

  // The step's one copy of routes to the host, then the poison check (DESIGN.md).
  out.routes.clear();
  if (routes.sink.data) {
    out.routes.resize(static_cast<size_t>(tokens * layers * top_k));
    backend_.download(routes.sink, out.routes.data());
    for (int64_t layer = 0; layer < layers; ++layer) {
      const bool is_moe = w.layers[static_cast<size_t>(layer)].is_moe;
      for (int64_t t = 0; t < tokens; ++t) {
        int32_t* row = out.routes.data() + (t * layers + layer) * top_k;
        for (int64_t j = 0; j < top_k; ++j) {
          if (!is_moe) {
            row[j] = 0;
            continue;
          }
          if (row[j] == moe::kRoutePoison)
            return Status::error(ErrorCode::kInternal,
                                 fmt::format("route capture failed: MoE layer {} (kernel {}) did not "
                                             "write the route of step token {}",
                                             layer, kernel_.name(), t));
          if (row[j] < 0 || row[j] >= c.num_experts)
            return Status::error(ErrorCode::kInternal,
                                 fmt::format("route capture failed: MoE layer {} (kernel {}) wrote "
                                             "expert id {} for step token {} (num_experts {})",
                                             layer, kernel_.name(), row[j], t, c.num_experts));
        }
      }
    }
  }
  return Status::ok();
}

}  // namespace sy::model
