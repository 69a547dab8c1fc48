#include "dist/shard_model.h"

#include <cstring>

#include <fmt/format.h>

namespace sy::dist {

namespace {

// Copies of slices of host tensors into backend buffers the shard owns.
class Slicer {
 public:
  explicit Slicer(backend::Backend& backend) : backend_(backend) {}

  // Rows [begin, begin + count) of dim 0, for each of `outer` blocks of `rows_per_block` rows
  // (outer = 1: a plain row slice; outer = experts: the same rows of every expert).
  Tensor rows(const Tensor& t, int64_t outer, int64_t rows_per_block, int64_t begin,
              int64_t count) {
    const int64_t row_bytes = static_cast<int64_t>(t.nbytes()) / (outer * rows_per_block);
    std::vector<uint8_t> host(static_cast<size_t>(outer * count * row_bytes));
    for (int64_t b = 0; b < outer; ++b)
      std::memcpy(host.data() + b * count * row_bytes,
                  static_cast<const uint8_t*>(t.data) + (b * rows_per_block + begin) * row_bytes,
                  static_cast<size_t>(count * row_bytes));
    std::vector<int64_t> shape(t.shape.begin(), t.shape.begin() + t.rank);
    if (outer == 1)
      shape[0] = count;
    else
      shape[1] = count;
    return place(t.dtype, shape, host);
  }
  // Columns [begin, begin + count) of the last dim.
  Tensor columns(const Tensor& t, int64_t begin, int64_t count) {
    const int64_t width = t.dim(-1), elem = static_cast<int64_t>(dtype_size(t.dtype));
    const int64_t lines = t.numel() / width;
    std::vector<uint8_t> host(static_cast<size_t>(lines * count * elem));
    for (int64_t r = 0; r < lines; ++r)
      std::memcpy(host.data() + r * count * elem,
                  static_cast<const uint8_t*>(t.data) + (r * width + begin) * elem,
                  static_cast<size_t>(count * elem));
    std::vector<int64_t> shape(t.shape.begin(), t.shape.begin() + t.rank);
    shape.back() = count;
    return place(t.dtype, shape, host);
  }
  // An expert's gate and up rows [begin, begin + count) of the stacked [E, 2I, H] layout.
  Tensor gate_up(const Tensor& t, int64_t begin, int64_t count) {
    const int64_t experts = t.dim(0), inter = t.dim(1) / 2,
                  row_bytes = static_cast<int64_t>(t.nbytes()) / (experts * 2 * inter);
    std::vector<uint8_t> host(static_cast<size_t>(experts * 2 * count * row_bytes));
    uint8_t* dst = host.data();
    for (int64_t e = 0; e < experts; ++e)
      for (int64_t half = 0; half < 2; ++half) {
        const int64_t from = e * 2 * inter + half * inter + begin;
        std::memcpy(dst, static_cast<const uint8_t*>(t.data) + from * row_bytes,
                    static_cast<size_t>(count * row_bytes));
        dst += count * row_bytes;
      }
    return place(t.dtype, {experts, 2 * count, t.dim(2)}, host);
  }
  std::vector<Tensor> take_owned() { return std::move(owned_); }

 private:
  Tensor place(DType dtype, const std::vector<int64_t>& shape, const std::vector<uint8_t>& host) {
    Tensor out;
    switch (shape.size()) {
      case 1:
        out = backend_.alloc(dtype, {shape[0]});
        break;
      case 2:
        out = backend_.alloc(dtype, {shape[0], shape[1]});
        break;
      default:
        out = backend_.alloc(dtype, {shape[0], shape[1], shape[2]});
        break;
    }
    backend_.upload(host.data(), out);
    owned_.push_back(out);
    return out;
  }
  backend::Backend& backend_;
  std::vector<Tensor> owned_;
};

}  // namespace

Result<std::unique_ptr<model::Model>> shard_model(const model::Model& full,
                                                  const ParallelConfig& parallel, int rank,
                                                  backend::Backend& backend) {
  const model::ModelConfig& c = full.config();
  if (!c.experts.is_default())
    return Status::error(
        ErrorCode::kUnsupported,
        "tensor parallel: expert layouts other than stacked gate/up + down without biases "
        "(gpt-oss) are not sharded yet");
  // What cannot be sharded at all is named before any size is checked for divisibility.
  for (size_t layer = 0; layer < c.layers.size(); ++layer) {
    const model::AttentionSpec& spec = c.layers[layer].attention;
    if (spec.latent)
      return Status::error(ErrorCode::kUnsupported,
                           fmt::format("tensor parallel: layer {} uses multi-head latent attention "
                                       "(DeepSeek-V3), which is not sharded yet",
                                       layer));
    if (spec.linear || spec.output_gate)
      return Status::error(ErrorCode::kUnsupported,
                           fmt::format("tensor parallel: layer {} uses Qwen3.5's gated DeltaNet or "
                                       "gated attention, which is not sharded yet",
                                       layer));
    if (spec.qk_norm == model::QkNorm::kWholeProjection && parallel.tensor_parallel > 1)
      return Status::error(
          ErrorCode::kUnsupported,
          fmt::format("tensor parallel: layer {} normalises q/k over the whole projection "
                      "(OLMoE), which needs an all-reduce inside attention (not implemented)",
                      layer));
  }
  SY_ASSIGN(const RankShard shard, shard_for_rank(c, parallel, rank));
  model::ModelConfig sc = c;
  sc.num_attention_heads = shard.heads.count;
  sc.num_key_value_heads = shard.kv_heads.count;
  if (c.intermediate_size > 0) sc.intermediate_size = shard.mlp_columns.count;
  if (c.num_experts > 0) sc.moe_intermediate_size = shard.moe_columns.count;
  if (c.shared_expert_intermediate_size > 0) {
    if (c.shared_expert_intermediate_size % parallel.tensor_parallel != 0)
      return Status::error(
          ErrorCode::kInvalidArgument,
          fmt::format("--tensor-parallel {} does not divide shared_expert_intermediate_size ({})",
                      parallel.tensor_parallel, c.shared_expert_intermediate_size));
    sc.shared_expert_intermediate_size =
        c.shared_expert_intermediate_size / parallel.tensor_parallel;
  }

  const int n = parallel.tensor_parallel;
  const int64_t hd = c.head_dim;
  Slicer slice(backend);
  model::DecoderWeights w = full.weights();  // replicated tensors stay views of `full`
  for (size_t layer = 0; layer < w.layers.size(); ++layer) {
    model::LayerWeights& lw = w.layers[layer];
    model::AttentionWeights& a = lw.attention;
    const int64_t q0 = shard.heads.begin * hd, qn = shard.heads.count * hd;
    const int64_t k0 = shard.kv_heads.begin * hd, kn = shard.kv_heads.count * hd;
    a.q_proj = slice.rows(a.q_proj, 1, a.q_proj.dim(0), q0, qn);
    a.k_proj = slice.rows(a.k_proj, 1, a.k_proj.dim(0), k0, kn);
    a.v_proj = slice.rows(a.v_proj, 1, a.v_proj.dim(0), k0, kn);
    if (a.q_bias.data) a.q_bias = slice.rows(a.q_bias, 1, a.q_bias.dim(0), q0, qn);
    if (a.k_bias.data) a.k_bias = slice.rows(a.k_bias, 1, a.k_bias.dim(0), k0, kn);
    if (a.v_bias.data) a.v_bias = slice.rows(a.v_bias, 1, a.v_bias.dim(0), k0, kn);
    if (a.sinks.data)
      a.sinks = slice.rows(a.sinks, 1, a.sinks.dim(0), shard.heads.begin, shard.heads.count);
    a.o_proj = slice.columns(a.o_proj, q0, qn);
    if (rank != 0) a.o_bias = Tensor();  // added once, by rank 0, before the all-reduce
    if (!lw.is_moe) {
      const Range m = shard.mlp_columns;
      lw.mlp.gate_proj = slice.rows(lw.mlp.gate_proj, 1, lw.mlp.gate_proj.dim(0), m.begin, m.count);
      lw.mlp.up_proj = slice.rows(lw.mlp.up_proj, 1, lw.mlp.up_proj.dim(0), m.begin, m.count);
      lw.mlp.down_proj = slice.columns(lw.mlp.down_proj, m.begin, m.count);
      continue;
    }
    moe::MoeLayerWeights& moe = lw.moe;
    if (parallel.expert_parallel) {
      const Range e = shard.experts;
      moe.gate_up = slice.rows(moe.gate_up, 1, moe.gate_up.dim(0), e.begin, e.count);
      moe.down = slice.rows(moe.down, 1, moe.down.dim(0), e.begin, e.count);
      moe.first_expert = e.begin;
      moe.local_experts = e.count;
    } else {
      const Range m = shard.moe_columns;
      moe.gate_up = slice.gate_up(moe.gate_up, m.begin, m.count);
      moe.down = slice.columns(moe.down, m.begin, m.count);
    }
    if (c.layers[layer].shared_expert) {
      model::DenseMlpWeights& s = lw.shared_expert;
      const int64_t width = s.gate_proj.dim(0) / n, begin = rank * width;
      s.gate_proj = slice.rows(s.gate_proj, 1, s.gate_proj.dim(0), begin, width);
      s.up_proj = slice.rows(s.up_proj, 1, s.up_proj.dim(0), begin, width);
      s.down_proj = slice.columns(s.down_proj, begin, width);
    }
  }
  return model::Model::from_parts(std::move(sc), std::move(w), slice.take_owned(), backend,
                                  full.model_dir());
}

}  // namespace sy::dist
