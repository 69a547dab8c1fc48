// The decoder description: what each layer of a model is, as data. An architecture adapter
// (model/architecture.h) builds it from config.json; the forward pass (model/decoder.cpp) and
// the backends read only this, never a model_type.
#pragma once

#include <cstdint>

namespace sy::model {

// Where a layer's q/k RMSNorm sits: none; per head over head_dim (Qwen3); over the whole
// projection before the heads are split (OLMoE: q_norm [heads * head_dim]).
enum class QkNorm { kNone, kPerHead, kWholeProjection };

// Multi-head latent attention (DeepSeek-V3): q from a low-rank path (q_a_proj -> RMSNorm ->
// q_b_proj) or q_proj; k and v from one compressed latent per token (kv_a_proj_with_mqa ->
// [kv_lora_rank | qk_rope_head_dim], the latent RMSNormed) expanded per head by kv_b_proj. RoPE
// on the last qk_rope_head_dim dims of q and on the shared k_pe only; `interleave` rotates the
// pairs (2i, 2i+1) (transformers' rope_interleave: de-interleave, then rotate-half), otherwise
// (i, i + d/2). The KV cache stores the normed latent and the roped k_pe per token.
struct LatentAttentionSpec {
  int64_t q_lora_rank = 0;  // 0: q_proj straight from the hidden state
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;
  bool interleave = true;
  int64_t cache_row() const { return kv_lora_rank + qk_rope_head_dim; }
};

// Gated DeltaNet linear attention (Qwen3.5's linear_attention layers): in_proj_qkv -> a causal
// depthwise conv1d of conv_kernel taps over [q | k | v] -> SiLU; q and k l2-normalised per key
// head, q scaled by 1/sqrt(key_head_dim); per value head a recurrent state S [key_head_dim,
// value_head_dim] decays by exp(g), g = -exp(A_log) * softplus(a + dt_bias), and takes the delta
// rule update S += k (beta (v - S^T k))^T, beta = sigmoid(b); the output S^T q goes through an
// RMSNorm gated by silu(z) and out_proj. Value head h reads key head h / (value_heads /
// key_heads). Each sequence keeps the conv inputs of its last conv_kernel - 1 tokens and S per
// layer (the decoder's state buffers), not a KV cache.
struct LinearAttentionSpec {
  int64_t num_key_heads = 0, num_value_heads = 0;
  int64_t key_head_dim = 0, value_head_dim = 0;
  int64_t conv_kernel = 0;
  int64_t key_dim() const { return num_key_heads * key_head_dim; }
  int64_t value_dim() const { return num_value_heads * value_head_dim; }
  int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }  // [q | k | v]
  int64_t conv_state_values() const { return conv_dim() * (conv_kernel - 1); }
  int64_t recurrent_state_values() const { return num_value_heads * key_head_dim * value_head_dim; }
};

struct AttentionSpec {
  bool qkv_bias = false;  // q/k/v projections have biases (an o_proj bias is loaded where present)
  QkNorm qk_norm = QkNorm::kNone;
  int64_t sliding_window = 0;  // 0: full causal attention; W: positions p with pos - p < W
  bool sinks =
      false;  // a learned per-head logit in the softmax denominator (gpt-oss: self_attn.sinks)
  bool latent = false;  // multi-head latent attention (ModelConfig::latent_attention)
  // Gated DeltaNet instead of softmax attention (ModelConfig::linear_attention): no KV cache.
  bool linear = false;
  // Qwen3.5's gated attention: q_proj emits per head the query then an output gate of head_dim;
  // the attention output is multiplied by sigmoid(gate) before o_proj. RoPE then rotates only
  // the first `rotary_dim` dims of each head (partial_rotary_factor; 0: all of them).
  bool output_gate = false;
  int64_t rotary_dim = 0;
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
