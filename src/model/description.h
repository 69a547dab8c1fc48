// The decoder description: what each layer of a model is, as data. An architecture adapter
// (model/architecture.h) builds it from config.json; the forward pass (model/decoder.cpp) and
// the backends read only this, never a model_type.
#pragma once

#include <cstdint>

namespace sy::model {

// Where a layer's q/k RMSNorm sits: none; per head over head_dim (Qwen3); over the whole
// projection before the heads are split (OLMoE: q_norm [heads * head_dim]).
enum class QkNorm { kNone, kPerHead, kWholeProjection };

struct AttentionSpec {
  bool qkv_bias = false;  // q/k/v projections have biases (an o_proj bias is loaded where present)
  QkNorm qk_norm = QkNorm::kNone;
  int64_t sliding_window = 0;  // 0: full causal attention; W: positions p with pos - p < W
  bool sinks =
      false;  // a learned per-head logit in the softmax denominator (gpt-oss: self_attn.sinks)
};

// RoPE's frequencies: plain (theta^(-2i/d)) or YaRN (rope_scaling / rope_parameters of type
// yarn), whose inverse frequencies and cos/sin factor follow transformers'
// _compute_yarn_parameters (model/rope.h computes them).
enum class RopeKind { kDefault, kYarn };
struct RopeScaling {
  RopeKind kind = RopeKind::kDefault;
  double factor = 1.0;
  double beta_fast = 32.0, beta_slow = 1.0;
  int64_t original_max_position_embeddings = 0;
  bool truncate = true;           // round the correction range outwards (transformers' default)
  double attention_factor = 0.0;  // 0: from factor (and mscale / mscale_all_dim)
  double mscale = 0.0, mscale_all_dim = 0.0;
};

enum class MlpKind { kDense, kMoe };

struct LayerSpec {
  AttentionSpec attention;
  MlpKind mlp = MlpKind::kDense;
  // MoE layers: a dense SwiGLU expert every token goes through, added to the routed output,
  // optionally scaled by sigmoid(x . shared_expert_gate) (Qwen2-MoE).
  bool shared_expert = false;
  bool shared_expert_gate = false;
};

// Every supported family is pre-norm: x += attn(norm(x)); x += mlp(norm(x)); logits of norm(x).
enum class NormPlacement { kPreNorm };

}  // namespace sy::model
