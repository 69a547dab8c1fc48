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
