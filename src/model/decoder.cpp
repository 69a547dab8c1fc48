#include "model/decoder.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <string>

#include "model/rope.h"
#include "moe/router.h"

namespace sy::model {

// Every buffer a step touches, allocated once for the largest step (stable addresses: graphs
// record them). Step inputs travel as one packed int32 upload.
struct Decoder::Workspace {
  backend::Backend* backend = nullptr;
  backend::StepLimits limits;
  int64_t pack_ints = 0;
  int32_t* pack_host = nullptr;  // alloc_host
  int32_t* routes_host = nullptr;
  Tensor pack;  // [pack_ints] int32
  // The route sink and, right behind it, the gating-weight sink: a step of T (padded) tokens
  // uses ints [0, T*L*K) for ids and [T*L*K, 2*T*L*K) for f32 weights, so one asynchronous
  // copy brings both to the host.
  Tensor forced, forced_routes, route_out;
  Tensor x, normed, block_out, ffn_out, q, k, v, attn, gate, up, picked, picked_normed, logits;
  Tensor shared_out, shared_gate;  // MoE layers with a shared expert
  Tensor q_latent, kv_latent;      // latent attention: q_a_proj's and kv_a_proj's outputs
  // Linear attention's projections and output; gated attention's q_proj output.
  Tensor lin_qkv, lin_z, lin_b, lin_a, lin_out, q_gate;
  RopeTable rope;                  // YaRN's frequencies (host), empty for plain RoPE
  std::vector<Tensor*> owned() {
    return {&pack,    &forced,  &forced_routes, &route_out,  &x,           &normed,   &block_out,
            &ffn_out, &q,       &k,             &v,          &attn,        &gate,     &up,
            &picked,  &picked_normed, &logits,  &shared_out, &shared_gate, &q_latent, &kv_latent,
            &lin_qkv, &lin_z,   &lin_b,         &lin_a,      &lin_out,     &q_gate};
  }
  ~Workspace() {
    for (Tensor* t : owned())
      if (t->data) backend->free_buffer(*t);
    if (pack_host) backend->free_host(pack_host);
    if (routes_host) backend->free_host(routes_host);
  }
  // Views of the packed inputs for a step of (tokens, logits rows, seqs, block-table stride).
  struct Views {
    Tensor ids, positions, token_seq, slot_mapping, logits_rows, block_tables;
    Tensor state_read, state_write;  // [seqs]
    int64_t ints = 0;
  };
  Views views(int64_t tokens, int64_t rows, int64_t seqs, int64_t stride) const {
    Views v;
    int32_t* base = pack.ptr<int32_t>();
    auto take = [&](int64_t count) {
      Tensor t(base + v.ints, DType::kI32, {count}, pack.device);
      v.ints += count;
      return t;
    };
    v.ids = take(tokens);
    v.positions = take(tokens);
    v.token_seq = take(tokens);
    v.slot_mapping = take(tokens);
    v.logits_rows = take(rows);
    v.block_tables = take(seqs * stride).reshaped({seqs, stride});
    v.state_read = take(seqs);
    v.state_write = take(seqs);
    return v;
  }
};

namespace {

// Decode steps are recorded per padded batch size (and block-table width).
int64_t graph_bucket(int64_t tokens) {
  static constexpr int64_t kBuckets[] = {1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256};
  for (int64_t b : kBuckets)
    if (tokens <= b) return b;
  return 0;  // too large for a graph
}

int64_t pow2_at_least(int64_t value) {
  int64_t p = 1;
  while (p < value) p *= 2;
  return p;
}

}  // namespace

Decoder::Decoder(backend::Backend& backend, KernelChoice kernels, int block_size)
    : backend_(backend), kernels_(kernels), block_size_(block_size) {}

Decoder::~Decoder() {
  ws_.reset();
  for (Tensor& tensor : k_cache_) backend_.free_buffer(tensor);
  for (Tensor& tensor : v_cache_) backend_.free_buffer(tensor);
  for (auto* states : {&conv_state_, &recurrent_state_})
    for (Tensor& tensor : *states)
      if (tensor.data) backend_.free_buffer(tensor);
}

Status Decoder::allocate(const ModelConfig& c, int64_t num_blocks, const backend::StepLimits& limits) {
  if (limits.max_tokens <= 0 || limits.max_seqs <= 0 || limits.max_blocks_per_seq <= 0 ||
      limits.max_logits_rows <= 0)
    return Status::error("step limits must be positive");
  backend::StepLimits full = limits;
  full.vocab_size = c.vocab_size;
  full.num_heads = c.num_attention_heads;
  full.head_dim = c.head_dim;
  const LatentAttentionSpec& mla = c.latent_attention;
  bool latent = false;
  for (const LayerSpec& layer : c.layers) latent |= layer.attention.latent;
  if (latent) {
    full.latent_kv_lora = mla.kv_lora_rank;
    full.latent_rope = mla.qk_rope_head_dim;
    full.latent_nope = mla.qk_nope_head_dim;
    full.latent_v_dim = mla.v_head_dim;
  }
  full.max_context = limits.max_blocks_per_seq * block_size_;
  const LinearAttentionSpec& lin = c.linear_attention;
  const bool linear = c.has_linear_attention();
  if (linear) full.linear_conv_dim = lin.conv_dim();
  bool output_gate = false;
  for (const LayerSpec& layer : c.layers) output_gate |= layer.attention.output_gate;
  full.max_feature_dim =
      std::max({c.hidden_size, c.num_attention_heads * c.head_dim, c.intermediate_size,
                c.moe_intermediate_size, c.widest_dense_mlp(), mla.q_lora_rank, mla.cache_row(),
                c.num_attention_heads * mla.v_head_dim, lin.conv_dim(), lin.value_dim(),
                output_gate ? 2 * c.num_attention_heads * c.head_dim : 0});
  // What the description needs of the backend and the MoE kernels, refused before anything is
  // allocated with a message naming the missing piece.
  bool gated_shared = false;
  for (const LayerSpec& layer : c.layers) gated_shared |= layer.shared_expert_gate;
  SY_TRY(check_backend_features(c, backend_));
  SY_TRY(backend_.reserve(full));
  const moe::RouterSpec spec = c.router_spec();
  // The small-batch kernel is an optimisation (auto): one that does not implement this model's
  // router or experts (cuda-fused and MXFP4) leaves every step to the large one.
  if (kernels_.small && !c.moe_layers().empty() &&
      (!kernels_.small->supports(spec) || !kernels_.small->supports_experts(c.experts)))
    kernels_.small = nullptr, kernels_.small_max_tokens = 0;
  for (moe::ExpertsKernel* kernel : {kernels_.large, kernels_.small})
    if (kernel && !c.moe_layers().empty()) {
      SY_TRY(kernel->supports(spec));
      SY_TRY(kernel->supports_experts(c.experts));
      Status reserved =
          kernel->reserve(limits.max_tokens, spec, c.hidden_size, c.moe_intermediate_size);
      if (!reserved && reserved.code() == ErrorCode::kUnsupported && kernel == kernels_.small &&
          kernel != kernels_.large) {
        kernels_.small = nullptr, kernels_.small_max_tokens = 0;  // (shapes it does not take)
        continue;
      }
      SY_TRY(reserved.with_context(fmt::format("MoE kernel {}: ", kernel->name())));
    }

  const int64_t slots = num_blocks * block_size_;
  const DType kv_dtype = backend_.kv_cache_dtype();
  // Zero-filled now, so the whole cache is resident from the start: memory use does not creep
  // up later as the prefix cache reaches blocks never touched before.
  for (int64_t layer = 0; layer < c.num_hidden_layers; ++layer) {
    // A latent-attention layer caches one row of latent + k_pe per token in the backend's KV
    // dtype (k_cache_; its v_cache_ is a placeholder).
    const bool latent_layer = c.layers[static_cast<size_t>(layer)].attention.latent;
    const bool linear_layer = c.layers[static_cast<size_t>(layer)].attention.linear;
    for (auto* cache : {&k_cache_, &v_cache_}) {
      if (linear_layer)  // per-sequence state instead (below); placeholders keep the indexing
        cache->push_back(backend_.alloc(DType::kF32, {1, 1, 1}));
      else if (latent_layer)
        cache->push_back(cache == &k_cache_ ? backend_.alloc(kv_dtype, {slots, 1, mla.cache_row()})
                                            : backend_.alloc(DType::kF32, {1, 1, 1}));
      else
        cache->push_back(backend_.alloc(kv_dtype, {slots, c.num_key_value_heads, c.head_dim}));
      if (!cache->back().data) return Status::error(ErrorCode::kResourceExhausted, "out of memory for the KV cache");
      Tensor as_i32 = cache->back();
      as_i32.dtype = DType::kI32;
      as_i32.rank = 1;
      as_i32.shape = {static_cast<int64_t>(cache->back().nbytes() / 4), 0, 0, 0};
      backend_.fill_i32(as_i32, 0);
    }
  }

  // Linear-attention state: two buffers per sequence a step can hold (a step reads one and
  // writes the other) and the prefix cache's snapshots, allocated once and zero-filled.
  state_buffers_ = linear ? 2 * limits.max_seqs + state_snapshots_ : 0;
  for (int64_t layer = 0; layer < c.num_hidden_layers; ++layer) {
    const bool linear_layer = c.layers[static_cast<size_t>(layer)].attention.linear;
    conv_state_.push_back(
        linear_layer
            ? backend_.alloc(DType::kF32, {state_buffers_, lin.conv_dim(), lin.conv_kernel - 1})
            : Tensor());
    recurrent_state_.push_back(
        linear_layer ? backend_.alloc(DType::kF32, {state_buffers_, lin.num_value_heads,
                                                    lin.key_head_dim, lin.value_head_dim})
                     : Tensor());
    for (Tensor* state : {&conv_state_.back(), &recurrent_state_.back()}) {
      if (!linear_layer) continue;
      if (!state->data)
        return Status::error(ErrorCode::kResourceExhausted,
                             "out of memory for the linear-attention state");
      Tensor as_i32 = *state;
      as_i32.dtype = DType::kI32;
      as_i32.rank = 1;
      as_i32.shape = {static_cast<int64_t>(state->nbytes() / 4), 0, 0, 0};
      backend_.fill_i32(as_i32, 0);
    }
  }

  auto ws = std::make_unique<Workspace>();
  ws->backend = &backend_;
  ws->limits = limits;
  ws->rope = rope_table(c);
  const int64_t T = limits.max_tokens, R = limits.max_logits_rows;
  const int64_t L = c.num_hidden_layers, K = std::max<int64_t>(c.experts_per_token, 1);
  const int64_t hidden = c.hidden_size, heads = c.num_attention_heads, kv_heads = c.num_key_value_heads;
  ws->pack_ints = 4 * T + R + limits.max_seqs * (limits.max_blocks_per_seq + 2);
  ws->pack = backend_.alloc(DType::kI32, {ws->pack_ints});
  ws->pack_host = static_cast<int32_t*>(backend_.alloc_host(static_cast<size_t>(ws->pack_ints) * 4));
  ws->routes_host =
      static_cast<int32_t*>(backend_.alloc_host(static_cast<size_t>(2 * T * L * K) * 4));
  ws->forced = backend_.alloc(DType::kU8, {T});
  ws->forced_routes = backend_.alloc(DType::kI32, {T, L, K});
  ws->route_out = backend_.alloc(DType::kI32, {2 * T * L * K});
  ws->x = backend_.alloc(DType::kF32, {T, hidden});
  ws->normed = backend_.alloc(DType::kF32, {T, hidden});
  ws->block_out = backend_.alloc(DType::kF32, {T, hidden});
  ws->ffn_out = backend_.alloc(DType::kF32, {T, hidden});
  ws->q = backend_.alloc(DType::kF32, {T, heads, c.head_dim});
  ws->k = backend_.alloc(DType::kF32, {T, kv_heads, c.head_dim});
  ws->v = backend_.alloc(DType::kF32, {T, kv_heads, c.head_dim});
  ws->attn = backend_.alloc(DType::kF32, {T, heads * std::max(c.head_dim, mla.v_head_dim)});
  if (latent) {
    if (mla.q_lora_rank > 0) ws->q_latent = backend_.alloc(DType::kF32, {T, mla.q_lora_rank});
    ws->kv_latent = backend_.alloc(DType::kF32, {T, mla.cache_row()});
  }
  if (linear) {
    ws->lin_qkv = backend_.alloc(DType::kF32, {T, lin.conv_dim()});
    ws->lin_z = backend_.alloc(DType::kF32, {T, lin.value_dim()});
    ws->lin_b = backend_.alloc(DType::kF32, {T, lin.num_value_heads});
    ws->lin_a = backend_.alloc(DType::kF32, {T, lin.num_value_heads});
    ws->lin_out = backend_.alloc(DType::kF32, {T, lin.value_dim()});
  }
  if (output_gate) ws->q_gate = backend_.alloc(DType::kF32, {T, 2 * heads * c.head_dim});
  if (const int64_t widest = c.widest_dense_mlp(); widest > 0) {
    ws->gate = backend_.alloc(DType::kF32, {T, widest});
    ws->up = backend_.alloc(DType::kF32, {T, widest});
  }
  if (gated_shared || c.shared_expert_intermediate_size > 0) {
    ws->shared_out = backend_.alloc(DType::kF32, {T, hidden});
    ws->shared_gate = backend_.alloc(DType::kF32, {T, 1});
  }
  ws->picked = backend_.alloc(DType::kF32, {R, hidden});
  ws->picked_normed = backend_.alloc(DType::kF32, {R, hidden});
  ws->logits = backend_.alloc(DType::kF32, {R, c.vocab_size});
  for (Tensor* t : ws->owned())
    if (!t->data && t->rank > 0 && t->numel() > 0)
      return Status::error(ErrorCode::kResourceExhausted, "out of memory for the step workspace");
  if (!ws->pack_host || !ws->routes_host)
    return Status::error(ErrorCode::kResourceExhausted, "out of host memory for the step workspace");
  ws_ = std::move(ws);
  return Status::ok();
}

Status Decoder::forward(const Model& model, const StepInputs& in, StepOutputs& out) {
  if (!ws_) return Status::error(ErrorCode::kInternal, "decoder: forward before allocate");
  const ModelConfig& c = model.config();
  const DecoderWeights& wt = model.weights();
  Workspace& ws = *ws_;
  const int64_t tokens = static_cast<int64_t>(in.token_ids.size());
  const int64_t rows = static_cast<int64_t>(in.logits_rows.size());
  const int64_t seqs = in.num_seqs;
  const int64_t layers = c.num_hidden_layers, top_k = c.experts_per_token;
  const int64_t hidden = c.hidden_size, heads = c.num_attention_heads, kv_heads = c.num_key_value_heads;
  const int64_t head_dim = c.head_dim;
  if (tokens == 0 || tokens > ws.limits.max_tokens || rows > ws.limits.max_logits_rows ||
      seqs > ws.limits.max_seqs || in.max_blocks_per_seq > ws.limits.max_blocks_per_seq)
    return Status::error(ErrorCode::kInternal,
                         fmt::format("decoder: step of {} tokens, {} logits rows, {} sequences, {} "
                                     "blocks is outside the workspace's limits",
                                     tokens, rows, seqs, in.max_blocks_per_seq));

  if (state_buffers_ > 0) {
    bool valid = static_cast<int64_t>(in.state_read.size()) == seqs &&
                 static_cast<int64_t>(in.state_write.size()) == seqs;
    for (int64_t s = 0; valid && s < seqs; ++s)
      valid = in.state_read[s] >= 0 && in.state_read[s] < state_buffers_ &&
              in.state_write[s] >= 0 && in.state_write[s] < state_buffers_ &&
              in.state_read[s] != in.state_write[s];
    if (!valid)
      return Status::error(
          ErrorCode::kInternal,
          "decoder: a step of a model with linear attention needs a read and a distinct "
          "write state buffer per sequence");
  }
  for (const auto& [from, to] : in.state_copies)
    if (from < 0 || from >= state_buffers_ || to < 0 || to >= state_buffers_ || from == to)
      return Status::error(ErrorCode::kInternal,
                           fmt::format("decoder: state copy {} -> {} outside the {} state buffers",
                                       from, to, state_buffers_));
  // Before anything of the step (and outside its graph): stream order puts them after the
  // previous step's writes and before this step's reads.
  for (const auto& [from, to] : in.state_copies)
    for (size_t layer = 0; layer < conv_state_.size(); ++layer)
      for (std::vector<Tensor>* states : {&conv_state_, &recurrent_state_}) {
        Tensor& state = (*states)[layer];
        if (!state.data) continue;
        Tensor dst = state.slice_rows(to, 1);
        backend_.copy(state.slice_rows(from, 1), dst);
      }

  // A pure decode step (one token per sequence, every row's logits) on a graph-capable backend
  // is padded to its bucket and replayed from a recorded graph.
  bool decode = tokens == seqs && rows == tokens;
  for (int64_t i = 0; decode && i < rows; ++i) decode = in.logits_rows[i] == i && in.token_seq[i] == i;
  const int64_t bucket = graph_bucket(tokens);
  const bool graph = graphs_enabled_ && !all_reduce_ && backend_.supports_graphs() && decode && bucket > 0 &&
                     bucket <= ws.limits.max_tokens && bucket <= ws.limits.max_seqs &&
                     bucket <= ws.limits.max_logits_rows;
  const int64_t T = graph ? bucket : tokens;
  const int64_t S = graph ? bucket : seqs;
  const int64_t R = graph ? bucket : rows;
  const int64_t stride = graph ? std::min(pow2_at_least(in.max_blocks_per_seq), ws.limits.max_blocks_per_seq)
                               : std::max(in.max_blocks_per_seq, 1);

  // Pack and upload the inputs (padding rows: token 0 at position 0 of its own empty
  // sequence, KV slot -1 = not written).
  Workspace::Views v = ws.views(T, R, S, stride);
  int32_t* pack = ws.pack_host;
  int64_t at = 0;
  auto put = [&](const std::vector<int32_t>& src, int64_t count, auto pad) {
    for (int64_t i = 0; i < count; ++i) pack[at + i] = i < static_cast<int64_t>(src.size()) ? src[i] : pad(i);
    at += count;
  };
  put(in.token_ids, T, [](int64_t) { return 0; });
  put(in.positions, T, [](int64_t) { return 0; });
  put(in.token_seq, T, [](int64_t i) { return static_cast<int32_t>(i); });
  put(in.slot_mapping, T, [](int64_t) { return -1; });
  put(in.logits_rows, R, [](int64_t i) { return static_cast<int32_t>(i); });
  std::fill_n(pack + at, S * stride, 0);
  for (int64_t s = 0; s < seqs; ++s)
    std::copy_n(in.block_tables.begin() + s * in.max_blocks_per_seq, in.max_blocks_per_seq, pack + at + s * stride);
  at += S * stride;
  put(in.state_read, S, [](int64_t) { return -1; });  // padding sequences: no state
  put(in.state_write, S, [](int64_t) { return -1; });
  Tensor packed = ws.pack.slice_rows(0, at);
  backend_.upload(pack, packed);

  const bool forced = !in.forced.empty();
  if (forced) {
    std::vector<uint8_t> flags(in.forced);
    flags.resize(static_cast<size_t>(T), 0);
    Tensor f = ws.forced.slice_rows(0, T);
    backend_.upload(flags.data(), f);
    std::vector<int32_t> given(in.forced_routes);
    given.resize(static_cast<size_t>(T * layers * top_k), 0);
    Tensor g = ws.forced_routes.slice_rows(0, T);
    backend_.upload(given.data(), g);
  }
  const bool capture = in.capture_routes && top_k > 0;
  const bool capture_weights = capture && in.capture_weights;
  const int64_t route_ints = T * layers * top_k;
  moe::ExpertsKernel& kernel = kernels_.for_tokens(T);

  backend::AttentionBatch batch;
  batch.positions = v.positions;
  batch.token_seq = v.token_seq;
  batch.slot_mapping = v.slot_mapping;
  batch.block_tables = v.block_tables;
  batch.block_size = block_size_;
  batch.host_positions = &in.positions;
  batch.host_token_seq = &in.token_seq;
  {
    std::vector<int64_t> per_seq(static_cast<size_t>(std::max<int64_t>(seqs, 1)), 0);
    for (int64_t t = 0; t < tokens; ++t) {
      const int32_t s = in.token_seq[static_cast<size_t>(t)];
      if (s >= 0 && s < seqs) batch.max_query_len = std::max(batch.max_query_len, ++per_seq[static_cast<size_t>(s)]);
      batch.max_context_len = std::max<int64_t>(batch.max_context_len, in.positions[static_cast<size_t>(t)] + 1);
    }
  }

  // A large step's routes come to the host in pieces of layers (up to kMaxRoutePieces), each
  // copied and marked as soon as its last MoE layer is done, so the host checks and logs the
  // first layers' routes while the device computes the last ones (collect_route_piece). Small
  // steps (and graphs, and steps capturing gating weights) copy them in one piece after the last
  // layer.
  std::vector<std::pair<int64_t, int64_t>> pieces = {{0, layers}};
  if (capture && !graph && !capture_weights && tokens >= kRoutePieceMinTokens) {
    const std::vector<int> moe = c.moe_layers();
    const int64_t count = std::min<int64_t>(kMaxRoutePieces, static_cast<int64_t>(moe.size()));
    if (count > 1) {
      pieces.clear();
      int64_t begin = 0;
      for (int64_t p = 0; p + 1 < count; ++p) {
        const int64_t end =
            moe[static_cast<size_t>((p + 1) * static_cast<int64_t>(moe.size()) / count - 1)] + 1;
        pieces.push_back({begin, end});
        begin = end;
      }
      pieces.push_back({begin, layers});
    }
  }
  auto copy_piece = [&](size_t piece) {
    const auto [begin, end] = pieces[piece];
    if (pieces.size() == 1)
      backend_.download_async(
          ws.route_out.slice_rows(0, capture_weights ? 2 * route_ints : route_ints),
          ws.routes_host);
    else
      backend_.download_columns_async(ws.route_out, ws.routes_host, T, layers * top_k * 4,
                                      begin * top_k * 4, (end - begin) * top_k * 4);
    backend_.record_mark(static_cast<int>(piece));
  };

  Status layer_status = Status::ok();
  auto body = [&] {
    moe::RouteBuffers routes;
    if (capture) {
      Tensor ids = ws.route_out.slice_rows(0, route_ints);
      backend_.fill_i32(ids, moe::kRoutePoison);
      routes.sink = ids.reshaped({T, layers, top_k});
    }
    if (capture_weights) {
      Tensor bits = ws.route_out.slice_rows(route_ints, route_ints);
      backend_.fill_i32(bits, moe::kRouteWeightPoisonBits);
      routes.weights = bits.reshaped({T, layers, top_k});
      routes.weights.dtype = DType::kF32;
    }
    if (forced) {
      routes.forced = ws.forced.slice_rows(0, T);
      routes.source = ws.forced_routes.slice_rows(0, T);
    }
    Tensor x = ws.x.slice_rows(0, T), normed = ws.normed.slice_rows(0, T);
    Tensor block_out = ws.block_out.slice_rows(0, T), ffn_out = ws.ffn_out.slice_rows(0, T);
    Tensor q = ws.q.slice_rows(0, T), k = ws.k.slice_rows(0, T), vv = ws.v.slice_rows(0, T);
    Tensor attn = ws.attn.slice_rows(0, T);
    const backend::RopeSpec rope{c.rope_theta, c.rope_dim(),
                                 ws.rope.inv_freq.empty() ? nullptr : ws.rope.inv_freq.data(),
                                 ws.rope.attention_factor};
    const float scale = c.attention_scale > 0.0 ? static_cast<float>(c.attention_scale)
                                                : 1.0f / std::sqrt(static_cast<float>(head_dim));
    (void)hidden, (void)heads, (void)kv_heads;

    backend_.embedding(wt.embed_tokens, v.ids, x);
    // The residual stream x lags by `pending` (the last feed-forward output, not yet added)
    // where a backend or kernel fuses the residual add and norm into the op that consumes
    // them; the sums are the same f32 adds in the same order as add_rms_norm's.
    const bool fuse_moe_norm = kernel.fuses_input_norm(T) && !all_reduce_;
    // Tensor parallel: sums the ranks' partial outputs (the first failure is kept; every rank
    // still issues every collective, so none waits forever on a peer that stopped).
    auto reduce = [&](Tensor& partial) {
      if (!all_reduce_) return;
      Status status = all_reduce_(partial);
      if (!status && layer_status) layer_status = status.with_context("tensor-parallel all-reduce: ");
    };
    const Tensor* pending = nullptr;
    for (int64_t layer = 0; layer < layers; ++layer) {
      const LayerWeights& lw = wt.layers[static_cast<size_t>(layer)];
      const AttentionWeights& a = lw.attention;
      // Attention block: q, k, v of input_norm(x + pending).
      const LayerSpec& spec = c.layers[static_cast<size_t>(layer)];
      const AttentionSpec& attention = spec.attention;
      if (attention.linear) {
        // Gated DeltaNet: the four input projections of input_norm(x + pending), then the op
        // (conv, delta rule over the sequences' states, gated norm), then out_proj.
        if (pending)
          backend_.add_rms_norm(x, *pending, lw.input_norm, c.rms_norm_eps, normed);
        else
          backend_.rms_norm(x, lw.input_norm, c.rms_norm_eps, normed);
        pending = nullptr;
        const LinearAttentionWeights& la = lw.linear_attention;
        const LinearAttentionSpec& lin = c.linear_attention;
        Tensor lin_qkv = ws.lin_qkv.slice_rows(0, T), lin_z = ws.lin_z.slice_rows(0, T);
        Tensor lin_b = ws.lin_b.slice_rows(0, T), lin_a = ws.lin_a.slice_rows(0, T);
        Tensor lin_out = ws.lin_out.slice_rows(0, T);
        backend_.matmul_parts(normed, {{&la.in_proj_qkv, nullptr, &lin_qkv},
                                       {&la.in_proj_z, nullptr, &lin_z},
                                       {&la.in_proj_b, nullptr, &lin_b},
                                       {&la.in_proj_a, nullptr, &lin_a}});
        const backend::Backend::LinearShape shape{lin.num_key_heads, lin.num_value_heads,
                                                  lin.key_head_dim, lin.value_head_dim,
                                                  lin.conv_kernel};
        const backend::Backend::LinearWeights weights{&la.conv1d, &la.a_log, &la.dt_bias, &la.norm};
        const backend::Backend::LinearState state{v.state_read, v.state_write, &conv_state_[layer],
                                                  &recurrent_state_[layer]};
        backend_.gated_delta_net(lin_qkv, lin_z, lin_b, lin_a, weights, shape, c.rms_norm_eps,
                                 batch, state, lin_out);
        backend_.matmul(lin_out, la.out_proj, nullptr, block_out);
      } else if (attention.output_gate) {
        // Gated attention: q_proj emits query and output gate per head; the op splits them,
        // norms and (partially) ropes q and k, attends, and gates the output.
        if (pending)
          backend_.add_rms_norm(x, *pending, lw.input_norm, c.rms_norm_eps, normed);
        else
          backend_.rms_norm(x, lw.input_norm, c.rms_norm_eps, normed);
        pending = nullptr;
        Tensor q_gate = ws.q_gate.slice_rows(0, T);
        backend_.matmul_parts(normed, {{&a.q_proj, a.q_bias.data ? &a.q_bias : nullptr, &q_gate},
                                       {&a.k_proj, a.k_bias.data ? &a.k_bias : nullptr, &k},
                                       {&a.v_proj, a.v_bias.data ? &a.v_bias : nullptr, &vv}});
        backend::RopeSpec partial = rope;
        partial.head_dim = attention.rotary_dim > 0 ? attention.rotary_dim : head_dim;
        batch.sliding_window = 0;
        batch.sinks = nullptr;
        backend_.gated_attention(q_gate, q, k, vv, a.q_norm, a.k_norm, c.rms_norm_eps, batch,
                                 partial, k_cache_[layer], v_cache_[layer], scale, attn);
        backend_.matmul(attn, a.o_proj, a.o_bias.data ? &a.o_bias : nullptr, block_out);
      } else if (attention.latent) {
        // Multi-head latent attention: q (through the low-rank path where there is one) and the
        // compressed kv row of input_norm(x + pending); the backend op does the rest.
        if (pending)
          backend_.add_rms_norm(x, *pending, lw.input_norm, c.rms_norm_eps, normed);
        else
          backend_.rms_norm(x, lw.input_norm, c.rms_norm_eps, normed);
        pending = nullptr;
        const LatentAttentionSpec& mla = c.latent_attention;
        Tensor q_rows = q.reshaped({T, heads * head_dim});
        if (a.q_a_proj.data) {
          Tensor q_latent = ws.q_latent.slice_rows(0, T);
          backend_.matmul(normed, a.q_a_proj, nullptr, q_latent);
          backend_.rms_norm(q_latent, a.q_a_norm, c.rms_norm_eps, q_latent);
          backend_.matmul(q_latent, a.q_proj, nullptr, q_rows);
        } else {
          backend_.matmul(normed, a.q_proj, nullptr, q_rows);
        }
        Tensor kv_latent = ws.kv_latent.slice_rows(0, T);
        backend_.matmul(normed, a.kv_a_proj, nullptr, kv_latent);
        const backend::Backend::LatentShape shape{mla.kv_lora_rank, mla.qk_nope_head_dim,
                                                  mla.qk_rope_head_dim, mla.v_head_dim, mla.interleave};
        Tensor latent_out(attn.data, DType::kF32, {T, heads * mla.v_head_dim}, attn.device);
        backend_.latent_attention(q, kv_latent, a.kv_a_norm, c.rms_norm_eps, a.kv_b_proj, shape, batch, rope,
                                  k_cache_[layer], scale, latent_out);
        backend_.matmul(latent_out, a.o_proj, nullptr, block_out);
      } else {
        const std::vector<backend::Backend::MatmulPart> qkv = {
            {&a.q_proj, a.q_bias.data ? &a.q_bias : nullptr, &q},
            {&a.k_proj, a.k_bias.data ? &a.k_bias : nullptr, &k},
            {&a.v_proj, a.v_bias.data ? &a.v_bias : nullptr, &vv}};
        if (!backend_.norm_matmul_parts(x, pending, lw.input_norm, c.rms_norm_eps, qkv)) {
          if (pending)
            backend_.add_rms_norm(x, *pending, lw.input_norm, c.rms_norm_eps, normed);
          else
            backend_.rms_norm(x, lw.input_norm, c.rms_norm_eps, normed);
          pending = nullptr;
          backend_.matmul_parts(normed, qkv);
        }
        const bool per_head = attention.qk_norm == QkNorm::kPerHead;
        if (attention.qk_norm == QkNorm::kWholeProjection) {
          // One RMSNorm over each token's whole q (and k) row, before the heads are split.
          Tensor q_rows = q.reshaped({T, heads * head_dim}),
                 k_rows = k.reshaped({T, kv_heads * head_dim});
          backend_.rms_norm(q_rows, a.q_norm, c.rms_norm_eps, q_rows);
          backend_.rms_norm(k_rows, a.k_norm, c.rms_norm_eps, k_rows);
        }
        const Tensor* q_norm = per_head ? &a.q_norm : nullptr;
        const Tensor* k_norm = per_head ? &a.k_norm : nullptr;
        batch.sliding_window = attention.sliding_window;
        batch.sinks = attention.sinks ? &a.sinks : nullptr;
        if (!backend_.qk_prep_attention(q, k, vv, q_norm, k_norm, c.rms_norm_eps, batch, rope,
                                        k_cache_[layer], v_cache_[layer], scale, attn)) {
          backend_.qk_norm_rope_write_kv(q, k, vv, q_norm, k_norm, c.rms_norm_eps, batch, rope,
                                         k_cache_[layer], v_cache_[layer]);
          backend_.attention(q, k_cache_[layer], v_cache_[layer], batch, scale, attn);
        }
        backend_.matmul(attn, a.o_proj, a.o_bias.data ? &a.o_bias : nullptr, block_out);
      }
      reduce(block_out);
      // Feed-forward block on post_attention_norm(x + pending + block_out): dense MLP or MoE.
      moe::MoeForwardArgs args;
      // (A shared expert reads the normed input and adds into the output: not fused.)
      const bool fused_norm = lw.is_moe && fuse_moe_norm && !spec.shared_expert;
      if (fused_norm) {
        args.input_norm.residual = &x;
        args.input_norm.earlier_delta = pending;
        args.input_norm.delta = &block_out;
        args.input_norm.weight = &lw.post_attention_norm;
        args.input_norm.eps = c.rms_norm_eps;
      } else {
        if (pending)
          backend_.add2_rms_norm(x, *pending, block_out, lw.post_attention_norm, c.rms_norm_eps,
                                 normed);
        else
          backend_.add_rms_norm(x, block_out, lw.post_attention_norm, c.rms_norm_eps, normed);
      }
      pending = nullptr;
      if (lw.is_moe) {
        args.layer = static_cast<int>(layer);
        args.hidden = normed;
        args.out = ffn_out;
        args.weights = &lw.moe;
        args.spec = c.router_spec();
        args.experts = c.experts;
        args.routes = routes;
        Status status = lw.moe.local_experts >= 0 && !kernel.computes_expert_subset()
                            ? Status::error(ErrorCode::kUnsupported,
                                            "expert parallel needs a kernel that computes an expert subset "
                                            "(cpu-modular)")
                            : kernel.forward(args);
        if (!status && layer_status)
          layer_status = status.with_context(fmt::format("MoE layer {} (kernel {}): ", layer, kernel.name()));
        if (spec.shared_expert) {
          // The shared expert every token goes through, (sigmoid-gated and) added to the routed
          // sum.
          const DenseMlpWeights& shared = lw.shared_expert;
          const int64_t width = shared.gate_proj.dim(0);
          Tensor g = ws.gate.slice_rows(0, T), u = ws.up.slice_rows(0, T);
          g = Tensor(g.data, DType::kF32, {T, width}, g.device);
          u = Tensor(u.data, DType::kF32, {T, width}, u.device);
          Tensor shared_out = ws.shared_out.slice_rows(0, T);
          Tensor gate_logit = spec.shared_expert_gate ? ws.shared_gate.slice_rows(0, T) : Tensor();
          // gate, up and the sigmoid gate's logit read the same input: one launch where the
          // backend can (a decode step's GEMV), the same results as three matmuls.
          std::vector<backend::Backend::MatmulPart> parts = {{&shared.gate_proj, nullptr, &g},
                                                             {&shared.up_proj, nullptr, &u}};
          if (spec.shared_expert_gate)
            parts.push_back({&lw.shared_expert_gate, nullptr, &gate_logit});
          backend_.matmul_parts(normed, parts);
          backend_.add_shared_expert_down(g, u, shared.down_proj,
                                          spec.shared_expert_gate ? &gate_logit : nullptr,
                                          shared_out, ffn_out);
        }
      } else {
        Tensor g = ws.gate.slice_rows(0, T), u = ws.up.slice_rows(0, T);
        g = Tensor(g.data, DType::kF32, {T, c.intermediate_size}, g.device);
        u = Tensor(u.data, DType::kF32, {T, c.intermediate_size}, u.device);
        backend_.matmul_parts(normed,
                              {{&lw.mlp.gate_proj, nullptr, &g}, {&lw.mlp.up_proj, nullptr, &u}});
        backend_.silu_mul(g, u, g);
        backend_.matmul(g, lw.mlp.down_proj, nullptr, ffn_out);
      }
      reduce(ffn_out);
      pending = fused_norm ? nullptr : &ffn_out;  // a fused-norm kernel adds its output into x itself
      for (size_t piece = 0; piece + 1 < pieces.size(); ++piece)
        if (pieces[piece].second == layer + 1) copy_piece(piece);
    }
    if (pending) backend_.add_inplace(x, *pending);
  };
  // Logits for the requested rows only.
  auto logits_body = [&] {
    if (R == 0) return;
    Tensor x = ws.x.slice_rows(0, T);
    Tensor picked = ws.picked.slice_rows(0, R), picked_normed = ws.picked_normed.slice_rows(0, R);
    Tensor logits = ws.logits.slice_rows(0, R);
    backend_.gather_rows(x, v.logits_rows, picked);
    backend_.rms_norm(picked, wt.final_norm, c.rms_norm_eps, picked_normed);
    backend_.matmul(picked_normed, wt.lm_head, nullptr, logits);
  };
  // With capture, the step's one copy of routes (and weights, behind them) to the host is
  // enqueued right after the last layer, then a mark: the host checks and logs the routes
  // (collect_routes) while the device still computes the logits and samples.
  auto routes_out = [&] { copy_piece(pieces.size() - 1); };
  if (graph) {
    // The key names everything the recorded kernels' arguments depend on. With capture the
    // graph holds the layers only (the copy and the mark stay outside it).
    uint64_t key = static_cast<uint64_t>(T);
    key = key * 1000003u + static_cast<uint64_t>(stride);
    key = key * 8u + (capture_weights ? 4u : 0u) + (capture ? 2u : 0u) + (forced ? 1u : 0u);
    key = key * 2u + (&kernel == kernels_.small ? 1u : 0u);
    if (capture) {
      backend_.run_graph(key, body);
      routes_out();
      logits_body();
    } else {
      backend_.run_graph(key, [&] {
        body();
        logits_body();
      });
    }
  } else {
    body();
    if (capture) routes_out();
    logits_body();
  }
  SY_TRY(layer_status);

  out.logits = ws.logits.slice_rows(0, rows);
  out.routes.clear();
  out.weights.clear();
  out.poisoned_rows = 0;
  out.route_host_seconds = 0;
  step_tokens_ = tokens;
  step_padded_tokens_ = T;
  step_capture_ = capture;
  step_weights_ = capture_weights;
  step_kernel_ = &kernel;
  step_pieces_ = capture ? pieces : std::vector<std::pair<int64_t, int64_t>>{};
  step_pieces_collected_ = 0;
  step_poisoned_.assign(capture ? static_cast<size_t>(tokens) : 0, 0);
  return Status::ok();
}

Status Decoder::collect_route_piece(const Model& model, StepOutputs& out, int piece) {
  if (piece != step_pieces_collected_ || piece >= route_pieces())
    return Status::error(ErrorCode::kInternal,
                         "decoder: route pieces are collected once each, in order");
  backend_.wait_mark(piece);
  ++step_pieces_collected_;
  const auto started = std::chrono::steady_clock::now();
  const auto [begin, end] = step_pieces_[static_cast<size_t>(piece)];
  Status checked = check_routes(model, out, begin, end);
  out.route_host_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return checked;
}

Status Decoder::collect_routes(const Model& model, StepOutputs& out) {
  Status first = Status::ok();
  while (step_pieces_collected_ < route_pieces()) {
    Status piece = collect_route_piece(model, out, step_pieces_collected_);
    if (first && !piece) first = piece;
  }
  return first;
}

Status Decoder::finish_step(const Model& model, StepOutputs& out) {
  Status checked = collect_routes(model, out);  // (at once if collected already)
  backend_.synchronize();
  return checked;
}

// Layers [layer_begin, layer_end) of the step's routes (and weights) out of the pinned copy,
// every row checked. The whole range in one call (one piece) copies the rows as they are; a
// piece copies its columns of every row into out.routes (sized by the first piece).
Status Decoder::check_routes(const Model& model, StepOutputs& out, int64_t layer_begin,
                             int64_t layer_end) {
  const ModelConfig& c = model.config();
  const DecoderWeights& w = model.weights();
  const int64_t tokens = step_tokens_, layers = c.num_hidden_layers, top_k = c.experts_per_token;
  const size_t row_ints = static_cast<size_t>(layers * top_k);
  const size_t column = static_cast<size_t>(layer_begin * top_k);
  const size_t width = static_cast<size_t>((layer_end - layer_begin) * top_k);
  const bool whole = layer_begin == 0 && layer_end == layers;
  if (whole) {
    out.routes.assign(ws_->routes_host, ws_->routes_host + tokens * layers * top_k);
  } else {
    if (layer_begin == 0) out.routes.resize(static_cast<size_t>(tokens) * row_ints);
    for (int64_t t = 0; t < tokens; ++t)
      std::memcpy(out.routes.data() + t * row_ints + column,
                  ws_->routes_host + t * row_ints + column, width * sizeof(int32_t));
  }
  if (step_weights_) {  // (steps capturing weights come in one piece)
    const int32_t* bits = ws_->routes_host + step_padded_tokens_ * layers * top_k;
    out.weights.resize(static_cast<size_t>(tokens * layers * top_k));
    std::memcpy(out.weights.data(), bits, out.weights.size() * sizeof(float));
  }
  // Every row is checked (the count goes to /metrics); the error names the first. A prefill step
  // holds millions of ids (8,192 tokens x 48 layers x 8 on Qwen3-30B-A3B): dense layers' rows
  // are zeroed, then one flat pass over every id and weight of the range (vectorised: a compare
  // and an or per id) decides; only a step with a bad id walks the rows to count them and build
  // the message.
  const uint32_t experts = static_cast<uint32_t>(c.num_experts);
  for (int64_t layer = layer_begin; layer < layer_end; ++layer) {
    if (w.layers[static_cast<size_t>(layer)].is_moe) continue;
    for (int64_t t = 0; t < tokens; ++t) {
      const size_t at = static_cast<size_t>(t) * row_ints + static_cast<size_t>(layer * top_k);
      std::fill_n(out.routes.begin() + static_cast<std::ptrdiff_t>(at), top_k, 0);
      if (step_weights_)
        std::fill_n(out.weights.begin() + static_cast<std::ptrdiff_t>(at), top_k, 0.0f);
    }
  }
  uint32_t bad = 0;
  if (whole) {
    for (const int32_t id : out.routes)
      bad |= static_cast<uint32_t>(static_cast<uint32_t>(id) >= experts);  // poison -1 too
  } else {
    for (int64_t t = 0; t < tokens; ++t) {
      const int32_t* ids = out.routes.data() + t * row_ints + column;
      for (size_t i = 0; i < width; ++i)
        bad |= static_cast<uint32_t>(static_cast<uint32_t>(ids[i]) >= experts);
    }
  }
  if (step_weights_)
    for (const float weight : out.weights) bad |= static_cast<uint32_t>(!std::isfinite(weight));
  if (!bad) return Status::ok();

  Status first = Status::ok();
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t layer = layer_begin; layer < layer_end; ++layer) {
      const size_t at = static_cast<size_t>((t * layers + layer) * top_k);
      int32_t* row = out.routes.data() + at;
      if (!w.layers[static_cast<size_t>(layer)].is_moe) continue;  // zeroed above
      bool ok = true;
      for (int64_t j = 0; j < top_k; ++j) ok &= static_cast<uint32_t>(row[j]) < experts;  // poison -1 too
      if (step_weights_)
        for (int64_t j = 0; j < top_k; ++j) ok &= std::isfinite(out.weights[at + static_cast<size_t>(j)]);
      if (ok) continue;
      step_poisoned_[static_cast<size_t>(t)] = 1;
      if (!first) continue;
      for (int64_t j = 0; j < top_k; ++j) {
        std::string problem;
        if (row[j] == moe::kRoutePoison) {
          problem = fmt::format("did not write the route of step token {}", t);
        } else if (row[j] < 0 || row[j] >= c.num_experts) {
          problem = fmt::format("wrote expert id {} for step token {} (num_experts {})", row[j], t,
                                c.num_experts);
        } else if (step_weights_) {
          int32_t weight_bits;
          std::memcpy(&weight_bits, &out.weights[at + static_cast<size_t>(j)], sizeof weight_bits);
          if (weight_bits == moe::kRouteWeightPoisonBits)  // (a NaN: not finite)
            problem = fmt::format("did not write the gating weight of step token {}", t);
          else if (!std::isfinite(out.weights[at + static_cast<size_t>(j)]))
            problem = fmt::format("wrote a non-finite gating weight for step token {}", t);
        }
        if (problem.empty()) continue;
        first = Status::error(ErrorCode::kInternal, fmt::format("route capture failed: MoE layer {} (kernel {}) {}",
                                                                layer, step_kernel_->name(), problem));
        break;
      }
    }
  }
  // Rows poisoned in any piece so far, each once.
  out.poisoned_rows = std::count(step_poisoned_.begin(), step_poisoned_.end(), uint8_t{1});
  return first;
}

}  // namespace sy::model
