// qwen3_moe: Qwen3MoeForCausalLM tensor names -> DecoderWeights. Experts as one tensor each
// (published checkpoints) or as fused 3-D tensors (gate_up_proj / down_proj).
#include <fmt/format.h>

#include "model/model.h"

namespace sy::model {
namespace {

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

Tensor view_of(const TensorInfo& info) {
  Tensor tensor;
  tensor.data = const_cast<uint8_t*>(info.data);
  tensor.dtype = info.dtype;
  tensor.rank = static_cast<int>(info.shape.size());
  for (size_t i = 0; i < info.shape.size(); ++i) tensor.shape[i] = info.shape[i];
  return tensor;
}

// Loads each tensor onto the backend, or (an in-place update: `place.into` holds the tensors
// an earlier load returned, in call order) copies it into the tensor loaded at the same call,
// or (place.check_only) only checks names and shapes against those tensors.
class Loader {
 public:
  Loader(const Checkpoint& checkpoint, backend::Backend& backend, std::vector<Tensor>& owned,
         const WeightPlacement& place)
      : checkpoint_(checkpoint), backend_(backend), owned_(owned), place_(place) {}

  bool has(const std::string& name) const { return checkpoint_.find(name) != nullptr; }

  Result<Tensor> get(const std::string& name, const std::vector<int64_t>& shape) {
    const TensorInfo* info = checkpoint_.find(name);
    if (!info) return Status::errorf("missing tensor '{}' (expected shape {})", name, shape_text(shape));
    if (info->shape != shape)
      return Status::errorf("tensor '{}' in {} has shape {}, expected {}", name, info->file,
                            shape_text(info->shape), shape_text(shape));
    if (place_.into) {
      SY_ASSIGN(Tensor* target, next_target(name));
      if (target->numel() != view_of(*info).numel())
        return Status::errorf("tensor '{}' has {} elements, the loaded model {}", name, view_of(*info).numel(),
                              target->numel());
      if (!place_.check_only)
        SY_TRY(backend_.load_weight_into(view_of(*info), *target).with_context(fmt::format("tensor '{}': ", name)));
      return *target;
    }
    auto loaded = backend_.load_weight(view_of(*info));
    if (!loaded) return loaded.status().with_context(fmt::format("tensor '{}': ", name));
    if (loaded->data != info->data) owned_.push_back(*loaded);
    if (place_.order) place_.order->push_back(*loaded);
    return *loaded;
  }

  // Equally shaped tensors stacked into one [names.size(), shape...] backend tensor.
  Result<Tensor> stacked(const std::vector<std::string>& names, const std::vector<int64_t>& shape) {
    std::vector<Tensor> parts;
    for (const std::string& name : names) {
      const TensorInfo* info = checkpoint_.find(name);
      if (!info) return Status::errorf("missing tensor '{}' (expected shape {})", name, shape_text(shape));
      if (info->shape != shape)
        return Status::errorf("tensor '{}' in {} has shape {}, expected {}", name, info->file,
                              shape_text(info->shape), shape_text(shape));
      if (!parts.empty() && info->dtype != parts.front().dtype)
        return Status::errorf("tensor '{}' in {} has dtype {}, but '{}' has {}", name, info->file,
                              dtype_name(info->dtype), names.front(), dtype_name(parts.front().dtype));
      parts.push_back(view_of(*info));
    }
    if (place_.into) {
      SY_ASSIGN(Tensor* target, next_target(names.front()));
      if (target->numel() != parts.front().numel() * static_cast<int64_t>(parts.size()))
        return Status::errorf("tensors '{}'...: {} x {} elements, the loaded model {}", names.front(), parts.size(),
                              parts.front().numel(), target->numel());
      if (!place_.check_only)
        SY_TRY(backend_.load_stacked_into(parts, *target).with_context(fmt::format("tensor '{}': ", names.front())));
      return *target;
    }
    auto loaded = backend_.load_stacked(parts);
    if (!loaded) return loaded.status().with_context(fmt::format("tensor '{}': ", names.front()));
    owned_.push_back(*loaded);
    if (place_.order) place_.order->push_back(*loaded);
    return *loaded;
  }

  // An update must load exactly as many tensors as the first load did.
  Status finish() const {
    if (place_.into && next_ != place_.into->size())
      return Status::errorf("the checkpoint maps onto {} tensors, the loaded model has {}", next_, place_.into->size());
    return Status::ok();
  }

 private:
  Result<Tensor*> next_target(const std::string& name) {
    if (next_ >= place_.into->size())
      return Status::errorf("tensor '{}': more tensors than the loaded model has ({})", name, place_.into->size());
    return &(*place_.into)[next_++];
  }

  const Checkpoint& checkpoint_;
  backend::Backend& backend_;
  std::vector<Tensor>& owned_;
  WeightPlacement place_;
  size_t next_ = 0;
};

}  // namespace

Result<DecoderWeights> load_qwen3_moe(const ModelConfig& c, const Checkpoint& checkpoint,
                                      backend::Backend& backend, std::vector<Tensor>& owned,
                                      const WeightPlacement& place) {
  Loader load(checkpoint, backend, owned, place);
  DecoderWeights w;
  const int64_t hidden = c.hidden_size, q_out = c.num_attention_heads * c.head_dim,
                kv_out = c.num_key_value_heads * c.head_dim;
  SY_ASSIGN(w.embed_tokens, load.get("model.embed_tokens.weight", {c.vocab_size, hidden}));
  SY_ASSIGN(w.final_norm, load.get("model.norm.weight", {hidden}));
  if (c.tie_word_embeddings && !load.has("lm_head.weight")) {
    w.lm_head = w.embed_tokens;
  } else {
    SY_ASSIGN(w.lm_head, load.get("lm_head.weight", {c.vocab_size, hidden}));
  }
  for (int layer = 0; layer < c.num_hidden_layers; ++layer) {
    const std::string p = fmt::format("model.layers.{}.", layer);
    LayerWeights lw;
    SY_ASSIGN(lw.input_norm, load.get(p + "input_layernorm.weight", {hidden}));
    SY_ASSIGN(lw.post_attention_norm, load.get(p + "post_attention_layernorm.weight", {hidden}));
    AttentionWeights& a = lw.attention;
    SY_ASSIGN(a.q_proj, load.get(p + "self_attn.q_proj.weight", {q_out, hidden}));
    SY_ASSIGN(a.k_proj, load.get(p + "self_attn.k_proj.weight", {kv_out, hidden}));
    SY_ASSIGN(a.v_proj, load.get(p + "self_attn.v_proj.weight", {kv_out, hidden}));
    SY_ASSIGN(a.o_proj, load.get(p + "self_attn.o_proj.weight", {hidden, q_out}));
    if (c.attention_bias) {
      SY_ASSIGN(a.q_bias, load.get(p + "self_attn.q_proj.bias", {q_out}));
      SY_ASSIGN(a.k_bias, load.get(p + "self_attn.k_proj.bias", {kv_out}));
      SY_ASSIGN(a.v_bias, load.get(p + "self_attn.v_proj.bias", {kv_out}));
      if (load.has(p + "self_attn.o_proj.bias")) {
        SY_ASSIGN(a.o_bias, load.get(p + "self_attn.o_proj.bias", {hidden}));
      }
    }
    SY_ASSIGN(a.q_norm, load.get(p + "self_attn.q_norm.weight", {c.head_dim}));
    SY_ASSIGN(a.k_norm, load.get(p + "self_attn.k_norm.weight", {c.head_dim}));
    lw.is_moe = c.is_moe_layer(layer);
    if (!lw.is_moe) {
      const int64_t inter = c.intermediate_size;
      SY_ASSIGN(lw.mlp.gate_proj, load.get(p + "mlp.gate_proj.weight", {inter, hidden}));
      SY_ASSIGN(lw.mlp.up_proj, load.get(p + "mlp.up_proj.weight", {inter, hidden}));
      SY_ASSIGN(lw.mlp.down_proj, load.get(p + "mlp.down_proj.weight", {hidden, inter}));
    } else {
      const int64_t inter = c.moe_intermediate_size, experts = c.num_experts;
      SY_ASSIGN(lw.moe.router, load.get(p + "mlp.gate.weight", {experts, hidden}));
      if (load.has(p + "mlp.experts.gate_up_proj")) {
        SY_ASSIGN(lw.moe.gate_up, load.get(p + "mlp.experts.gate_up_proj", {experts, 2 * inter, hidden}));
        SY_ASSIGN(lw.moe.down, load.get(p + "mlp.experts.down_proj", {experts, hidden, inter}));
      } else {
        // Published checkpoints: one tensor per expert and projection, stacked here.
        std::vector<std::string> gate_up_names, down_names;
        for (int64_t e = 0; e < experts; ++e) {
          const std::string ep = fmt::format("{}mlp.experts.{}.", p, e);
          gate_up_names.push_back(ep + "gate_proj.weight");
          gate_up_names.push_back(ep + "up_proj.weight");
          down_names.push_back(ep + "down_proj.weight");
        }
        SY_ASSIGN(Tensor gate_up, load.stacked(gate_up_names, {inter, hidden}));
        SY_ASSIGN(Tensor down, load.stacked(down_names, {hidden, inter}));
        // [E * 2, I, H] with gate, up alternating per expert == [E, 2I, H] gate rows then up rows.
        lw.moe.gate_up = gate_up.reshaped({experts, 2 * inter, hidden});
        lw.moe.down = down.reshaped({experts, hidden, inter});
      }
    }
    w.layers.push_back(std::move(lw));
  }
  SY_TRY(load.finish());
  return w;
}

}  // namespace sy::model
